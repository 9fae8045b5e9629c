// kernels/conv2d.cpp: implementation pending (see src/backend/kernels.inc).
