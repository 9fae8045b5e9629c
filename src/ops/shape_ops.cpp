// ops/shape_ops: implementation pending (see the kernel contract in backend/kernels.inc).
