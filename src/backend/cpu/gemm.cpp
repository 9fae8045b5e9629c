// backend/cpu/gemm: implementation pending (see the kernel contract in backend/kernels.inc).
