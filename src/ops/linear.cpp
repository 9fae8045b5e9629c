// ops/linear: implementation pending (see the kernel contract in backend/kernels.inc).
