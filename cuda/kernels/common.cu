// Host-side helpers of the CUDA kernels declared in common.cuh.
#include "cuda/kernels/common.cuh"

namespace ska::cuda {

StridedIndexer make_indexer(const Tensor& t) {
  SKA_CHECK(t.dim() <= kMaxDims, ShapeError, "cuda kernels support views of up to ", kMaxDims,
            " dims, got ", t.str());
  StridedIndexer ix{};
  ix.ndim = static_cast<int>(t.dim());
  for (int d = 0; d < ix.ndim; ++d) {
    ix.sizes[d] = t.shape()[static_cast<size_t>(d)];
    ix.strides[d] = t.strides()[static_cast<size_t>(d)];
  }
  return ix;
}

}  // namespace ska::cuda
