// backend/cpu/softmax: implementation pending (see the kernel contract in backend/kernels.inc).
