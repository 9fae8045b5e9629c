// torch.roll on CUDA in one launch: each thread writes one output element (or one 16-byte pack of
// them) read from its cyclically shifted source. The bits are copied, so any dtype.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/roll_checks.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

struct RollIndexer {
  int ndim;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];  // x's, in elements of the kernel's element type
  int64_t shifts[kMaxDims];
};

// I: the index type (32 bits where the element count allows), E: the element moved.
template <typename E, typename I>
__global__ void roll_kernel(const E* __restrict__ x, E* __restrict__ out, RollIndexer r, I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(gridDim.x) * blockDim.x) {
    I rest = i;
    int64_t offset = 0;
    for (int d = r.ndim - 1; d >= 0; --d) {
      const I size = static_cast<I>(r.sizes[d]);
      const I c = rest % size;
      rest /= size;
      const I shift = static_cast<I>(r.shifts[d]);
      offset += static_cast<int64_t>(c >= shift ? c - shift : c + (size - shift)) * r.strides[d];
    }
    out[i] = x[offset];
  }
}

template <typename E>
void launch(const Tensor& x, const RollIndexer& r, int64_t n, const Tensor& out, cudaStream_t s) {
  const E* src = static_cast<const E*>(x.data_ptr());
  E* dst = static_cast<E*>(out.data_ptr());
  if (n <= INT32_MAX / 2) {  // i + the grid's stride stays within 32 bits
    roll_kernel<E, int32_t><<<grid_for(n), 256, 0, s>>>(src, dst, r, static_cast<int32_t>(n));
  } else {
    roll_kernel<E, int64_t><<<grid_for(n), 256, 0, s>>>(src, dst, r, n);
  }
  SKA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void roll(const Tensor& x, const std::vector<int64_t>& shifts, const Tensor& out) {
  check_roll("roll", x, shifts, out);
  SKA_CHECK(x.dim() <= kMaxDims, ShapeError, "roll: at most ", kMaxDims, " dims, got ", x.str());
  if (x.numel() == 0) return;
  const int device = device_index(x);
  DeviceGuard guard(device);
  RollIndexer r{};
  r.ndim = static_cast<int>(x.dim());
  for (int d = 0; d < r.ndim; ++d) {
    r.sizes[d] = x.shape()[static_cast<size_t>(d)];
    r.strides[d] = x.strides()[static_cast<size_t>(d)];
    r.shifts[d] = shifts[static_cast<size_t>(d)];
  }
  if (r.ndim == 0) {  // one element
    r.ndim = 1;
    r.sizes[0] = 1;
    r.strides[0] = 1;
    r.shifts[0] = 0;
  }
  int64_t n = x.numel();
  size_t esize = x.element_size();
  // Rows of 16 bytes that do not move inside themselves (the last dim unshifted and dense in x,
  // every other stride a whole number of packs, both buffers aligned) move as 16-byte packs.
  const int last = r.ndim - 1;
  const int64_t per_pack = static_cast<int64_t>(16 / esize);
  bool packs = esize < 16 && r.shifts[last] == 0 && r.strides[last] == 1 &&
               r.sizes[last] % per_pack == 0 && aligned_to(x.data_ptr(), 16) &&
               aligned_to(out.data_ptr(), 16);
  for (int d = 0; packs && d < last; ++d) packs = r.strides[d] % per_pack == 0;
  if (packs) {
    r.sizes[last] /= per_pack;
    for (int d = 0; d < last; ++d) r.strides[d] /= per_pack;
    n /= per_pack;
    esize = 16;
  }
  const cudaStream_t s = current_stream(device);
  switch (esize) {
    case 1:
      launch<uint8_t>(x, r, n, out, s);
      break;
    case 2:
      launch<uint16_t>(x, r, n, out, s);
      break;
    case 4:
      launch<uint32_t>(x, r, n, out, s);
      break;
    case 8:
      launch<uint2>(x, r, n, out, s);
      break;
    case 16:
      launch<uint4>(x, r, n, out, s);
      break;
    default:
      SKA_FAIL(DTypeError, "roll: elements of ", esize, " bytes");
  }
}

}  // namespace ska::cuda
