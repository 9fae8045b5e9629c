// kernels/common.cu: implementation pending (see src/backend/kernels.inc).
