// backend/cpu/index: implementation pending (see the kernel contract in backend/kernels.inc).
