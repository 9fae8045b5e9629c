// ops/loss: implementation pending (see the kernel contract in backend/kernels.inc).
