// backend/cpu/layer_norm: implementation pending (see the kernel contract in backend/kernels.inc).
