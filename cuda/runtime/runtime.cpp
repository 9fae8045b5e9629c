// runtime/runtime.cpp: implementation pending (see src/backend/kernels.inc).
