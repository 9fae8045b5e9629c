// kernels/reduce.cu: implementation pending (see src/backend/kernels.inc).
