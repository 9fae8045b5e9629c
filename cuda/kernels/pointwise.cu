// kernels/pointwise.cu: implementation pending (see src/backend/kernels.inc).
