// runtime/device_copy.cpp: implementation pending (see src/backend/kernels.inc).
