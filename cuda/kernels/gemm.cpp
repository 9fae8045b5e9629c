// kernels/gemm.cpp: implementation pending (see src/backend/kernels.inc).
