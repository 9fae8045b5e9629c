// kernels/cross_entropy.cu: implementation pending (see src/backend/kernels.inc).
