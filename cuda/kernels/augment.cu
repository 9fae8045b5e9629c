// CUDA kernel: the device-resident training batch (gather, RandomCrop with zero padding, flip,
// normalisation), the twin of backend/cpu/augment.cpp. One thread per output element; each thread
// recomputes its sample's one Philox block (cheaper than a second pass), and the multiply and the
// add are rounded separately (__fmul_rn, __fadd_rn) so the values equal the CPU's bit for bit.
// launch_crop_flip takes raw operands, so that tests/simt runs the kernel's own code on the host;
// the tensor entry point is left out there.
#include <cstdint>

#include "backend/backend.h"
#include "backend/crop_flip_draw.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;

struct CropFlipGeometry {
  int64_t n, h, w, c;  // the dataset [N, H, W, C]
  int64_t ho, wo;      // the output crop
  int64_t range_y, range_x;
  int64_t numel;  // B * C * Ho * Wo
};

template <typename T>
__global__ void crop_flip_kernel(const uint8_t* __restrict__ images,
                                 const int64_t* __restrict__ index, CropFlipParams p,
                                 CropFlipGeometry g, T* __restrict__ out) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < g.numel;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t x = e % g.wo;
    const int64_t y = (e / g.wo) % g.ho;
    const int64_t k = (e / (g.wo * g.ho)) % g.c;
    const int64_t i = e / (g.wo * g.ho * g.c);
    const int64_t sample = index[i];
    if (sample < 0 || sample >= g.n) {  // no host-side check (it would stall the stream)
      out[e] = from_float<T>(0.0f);
      continue;
    }
    const CropFlipDraw d = crop_flip_draw(p, static_cast<uint64_t>(sample), g.range_y, g.range_x);
    const int64_t sy = d.top + y - p.padding;
    const int64_t sx = d.left + (d.flip ? g.wo - 1 - x : x) - p.padding;
    const bool inside = sy >= 0 && sy < g.h && sx >= 0 && sx < g.w;
    const float byte =
        inside ? static_cast<float>(images[((sample * g.h + sy) * g.w + sx) * g.c + k]) : 0.0f;
    out[e] = from_float<T>(__fadd_rn(__fmul_rn(byte, p.scale[k]), p.shift[k]));
  }
}

// out [B, C, Ho, Wo] from the dataset's images [N, H, W, C] at index [B] (T: f32 or bf16).
template <typename T>
void launch_crop_flip(const uint8_t* images, const int64_t* index, const CropFlipParams& p,
                      const CropFlipGeometry& g, T* out, cudaStream_t stream) {
  launch_kernel(crop_flip_kernel<T>, dim3(grid_for(g.numel, kThreads)), dim3(kThreads), 0, stream,
                images, index, p, g, out);
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
void augment_crop_flip(const Tensor& images, const Tensor& index, const CropFlipParams& p,
                       const Tensor& out) {
  int64_t range_y = 0, range_x = 0;
  check_crop_flip_args(images, index, p, out, &range_y, &range_x);
  const int device = device_index(out);
  SKA_CHECK(images.device() == out.device() && index.device() == out.device(), DeviceError,
            "augment_crop_flip: images (", images.device(), "), index (", index.device(),
            ") and out (", out.device(), ") must be on one device");
  const CropFlipGeometry g{images.size(0), images.size(1), images.size(2),
                           images.size(3), out.size(2),    out.size(3),
                           range_y,        range_x,        out.numel()};
  if (g.numel == 0) return;
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const auto* src = static_cast<const uint8_t*>(images.data_ptr());
  const auto* ip = static_cast<const int64_t*>(index.data_ptr());
  if (out.dtype() == DType::kF32) {
    launch_crop_flip(src, ip, p, g, static_cast<float*>(out.data_ptr()), stream);
  } else {
    launch_crop_flip(src, ip, p, g, static_cast<__nv_bfloat16*>(out.data_ptr()), stream);
  }
}
#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
