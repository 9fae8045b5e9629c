// kernels/random.cu: implementation pending (see src/backend/kernels.inc).
