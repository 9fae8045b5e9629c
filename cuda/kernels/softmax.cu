// kernels/softmax.cu: implementation pending (see src/backend/kernels.inc).
