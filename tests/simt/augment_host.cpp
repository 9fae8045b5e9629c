// The crop-and-flip kernel (cuda/kernels/augment.cu) built by the host compiler and run by
// tests/simt: launch_crop_flip on host memory.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernel file builds for the host
#include "cuda/kernels/augment.cu"
// clang-format on

#include "tests/simt/augment_host.h"

namespace ska::simt::augment {

template <typename T>
void crop_flip(const uint8_t* images, int64_t n, int64_t h, int64_t w, int64_t c,
               const int64_t* index, int64_t batch, int64_t ho, int64_t wo, const CropFlipParams& p,
               T* out) {
  // The crop offsets' ranges, as check_crop_flip_args sets them: padded size - output size.
  const cuda::CropFlipGeometry g{
      n, h, w, c, ho, wo, h + 2 * p.padding - ho, w + 2 * p.padding - wo, batch * c * ho * wo};
  cuda::launch_crop_flip(images, index, p, g, out, nullptr);
}

template void crop_flip<float>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                               int64_t, int64_t, int64_t, const CropFlipParams&, float*);
template void crop_flip<__nv_bfloat16>(const uint8_t*, int64_t, int64_t, int64_t, int64_t,
                                       const int64_t*, int64_t, int64_t, int64_t,
                                       const CropFlipParams&, __nv_bfloat16*);

}  // namespace ska::simt::augment
