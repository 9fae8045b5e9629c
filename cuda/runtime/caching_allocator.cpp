// runtime/caching_allocator.cpp: implementation pending (see src/backend/kernels.inc).
