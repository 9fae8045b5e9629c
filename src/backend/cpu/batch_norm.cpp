// backend/cpu/batch_norm: implementation pending (see the kernel contract in backend/kernels.inc).
