// runtime/check.cpp: implementation pending (see src/backend/kernels.inc).
