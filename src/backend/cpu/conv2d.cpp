// backend/cpu/conv2d: implementation pending (see the kernel contract in backend/kernels.inc).
