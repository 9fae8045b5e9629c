// backend/cpu/cross_entropy: implementation pending (see the kernel contract in backend/kernels.inc).
