// kernels/index.cu: implementation pending (see src/backend/kernels.inc).
