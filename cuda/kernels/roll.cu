// torch.roll on CUDA in one launch: each thread writes one output element (or one 16-byte pack of
// them) read from its cyclically shifted source. The bits are copied, so any dtype. The plan
// (plan_roll) and the launch (launch_roll) take raw operands, so that tests/simt runs this file's
// own code on the host; the tensor entry point is left out there.
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
void launch(const void* x, void* out, const RollIndexer& r, int64_t n, cudaStream_t s) {
  const E* src = static_cast<const E*>(x);
  E* dst = static_cast<E*>(out);
  if (n <= INT32_MAX / 2) {  // i + the grid's stride stays within 32 bits
    launch_kernel(roll_kernel<E, int32_t>, dim3(grid_for(n)), dim3(256), 0, s, src, dst, r,
                  static_cast<int32_t>(n));
  } else {
    launch_kernel(roll_kernel<E, int64_t>, dim3(grid_for(n)), dim3(256), 0, s, src, dst, r, n);
  }
}

// How roll moves a view of `ndim` dims (sizes, x's strides in elements of esize bytes, shifts in
// [0, size)) into a contiguous out: the indexer, the elements moved and their size. Rows of 16
// bytes that do not move inside themselves (the last dim unshifted and dense in x, every other
// stride a whole number of packs, both buffers aligned) move as 16-byte packs.
struct RollPlan {
  RollIndexer r;
  int64_t n;
  size_t esize;
};
RollPlan plan_roll(int ndim, const int64_t* sizes, const int64_t* strides, const int64_t* shifts,
                   size_t esize, bool aligned) {
  RollPlan p{};
  p.r.ndim = ndim;
  p.n = 1;
  for (int d = 0; d < ndim; ++d) {
    p.r.sizes[d] = sizes[d];
    p.r.strides[d] = strides[d];
    p.r.shifts[d] = shifts[d];
    p.n *= sizes[d];
  }
  if (p.r.ndim == 0) {  // one element
    p.r.ndim = 1;
    p.r.sizes[0] = 1;
    p.r.strides[0] = 1;
    p.r.shifts[0] = 0;
  }
  p.esize = esize;
  const int last = p.r.ndim - 1;
  const int64_t per_pack = static_cast<int64_t>(16 / esize);
  bool packs = esize < 16 && p.r.shifts[last] == 0 && p.r.strides[last] == 1 &&
               p.r.sizes[last] % per_pack == 0 && aligned;
  for (int d = 0; packs && d < last; ++d) packs = p.r.strides[d] % per_pack == 0;
  if (packs) {
    p.r.sizes[last] /= per_pack;
    for (int d = 0; d < last; ++d) p.r.strides[d] /= per_pack;
    p.n /= per_pack;
    p.esize = 16;
  }
  return p;
}

// out = x rolled by the plan.
void launch_roll(const void* x, void* out, const RollPlan& p, cudaStream_t s) {
  switch (p.esize) {
    case 1:
      launch<uint8_t>(x, out, p.r, p.n, s);
      break;
    case 2:
      launch<uint16_t>(x, out, p.r, p.n, s);
      break;
    case 4:
      launch<uint32_t>(x, out, p.r, p.n, s);
      break;
    case 8:
      launch<uint2>(x, out, p.r, p.n, s);
      break;
    case 16:
      launch<uint4>(x, out, p.r, p.n, s);
      break;
    default:
      SKA_FAIL(DTypeError, "roll: elements of ", p.esize, " bytes");
  }
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
void roll(const Tensor& x, const std::vector<int64_t>& shifts, const Tensor& out) {
  check_roll("roll", x, shifts, out);
  SKA_CHECK(x.dim() <= kMaxDims, ShapeError, "roll: at most ", kMaxDims, " dims, got ", x.str());
  if (x.numel() == 0) return;
  const int device = device_index(x);
  DeviceGuard guard(device);
  const RollPlan plan =
      plan_roll(static_cast<int>(x.dim()), x.shape().data(), x.strides().data(), shifts.data(),
                x.element_size(), aligned_to(x.data_ptr(), 16) && aligned_to(out.data_ptr(), 16));
  launch_roll(x.data_ptr(), out.data_ptr(), plan, current_stream(device));
}
#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
