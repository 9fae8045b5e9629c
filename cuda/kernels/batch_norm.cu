// kernels/batch_norm.cu: implementation pending (see src/backend/kernels.inc).
