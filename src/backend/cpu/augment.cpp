// CPU kernel: the device-resident training batch (gather, RandomCrop with zero padding, flip,
// normalisation). The twin of cuda/kernels/augment.cu; compiled without FMA contraction
// (src/CMakeLists.txt) so that the multiply and the add round separately, as on CUDA.
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/loops.h"
#include "backend/crop_flip_draw.h"
#include "core/dtype.h"
#include "core/error.h"

namespace ska {

void check_crop_flip_args(const Tensor& images, const Tensor& index, const CropFlipParams& p,
                          const Tensor& out, int64_t* range_y, int64_t* range_x) {
  SKA_CHECK(images.dtype() == DType::kU8 && images.dim() == 4 && images.is_contiguous(), ValueError,
            "augment_crop_flip: images must be contiguous u8 [N, H, W, C], got ", images.str());
  SKA_CHECK(index.dtype() == DType::kI64 && index.dim() == 1 && index.is_contiguous(), ValueError,
            "augment_crop_flip: index must be contiguous i64 [B], got ", index.str());
  SKA_CHECK(out.dim() == 4 && out.is_contiguous() && out.size(0) == index.numel() &&
                out.size(1) == images.size(3),
            ShapeError, "augment_crop_flip: out must be contiguous [", index.numel(), ", ",
            images.size(3), ", Ho, Wo], got ", out.str());
  SKA_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16, DTypeError,
            "augment_crop_flip: out must be f32 or bf16, got ", dtype_name(out.dtype()));
  SKA_CHECK(images.size(3) <= CropFlipParams::kMaxChannels, ValueError,
            "augment_crop_flip: at most ", CropFlipParams::kMaxChannels, " channels, got ",
            images.size(3));
  SKA_CHECK(p.padding >= 0 && p.flip_p >= 0.0 && p.flip_p <= 1.0, ValueError,
            "augment_crop_flip: padding ", p.padding, " must be >= 0 and flip_p ", p.flip_p,
            " in [0, 1]");
  *range_y = images.size(1) + 2 * p.padding - out.size(2);
  *range_x = images.size(2) + 2 * p.padding - out.size(3);
  const bool fits = p.padding > 0 ? *range_y >= 0 && *range_x >= 0 : *range_y == 0 && *range_x == 0;
  SKA_CHECK(fits, ShapeError, "augment_crop_flip: a ", out.size(2), "x", out.size(3),
            " crop does not fit ", images.size(1), "x", images.size(2), " images with padding ",
            p.padding, " (without padding the sizes must be equal)");
}

namespace cpu {

void augment_crop_flip(const Tensor& images, const Tensor& index, const CropFlipParams& p,
                       const Tensor& out) {
  int64_t range_y = 0, range_x = 0;
  check_crop_flip_args(images, index, p, out, &range_y, &range_x);
  const int64_t n = images.size(0), h = images.size(1), w = images.size(2), c = images.size(3);
  const int64_t ho = out.size(2), wo = out.size(3), batch = index.numel();
  const int64_t* ip = index.data<int64_t>();
  for (int64_t i = 0; i < batch; ++i) {
    SKA_CHECK(ip[i] >= 0 && ip[i] < n, ValueError, "augment_crop_flip: index ", ip[i],
              " (batch position ", i, ") is outside the dataset's [0, ", n, ")");
  }
  const uint8_t* src = images.data<uint8_t>();
  float* out_f32 = out.dtype() == DType::kF32 ? out.data<float>() : nullptr;
  BFloat16* out_bf16 = out.dtype() == DType::kBF16 ? out.data<BFloat16>() : nullptr;
  parallel_for(
      batch,
      [&](int64_t i) {
        const CropFlipDraw d = crop_flip_draw(p, static_cast<uint64_t>(ip[i]), range_y, range_x);
        const uint8_t* sample = src + ip[i] * h * w * c;
        for (int64_t k = 0; k < c; ++k) {
          const int64_t plane = (i * c + k) * ho * wo;
          for (int64_t y = 0; y < ho; ++y) {
            const int64_t sy = d.top + y - p.padding;
            for (int64_t x = 0; x < wo; ++x) {
              const int64_t sx = d.left + (d.flip ? wo - 1 - x : x) - p.padding;
              const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
              const float byte = inside ? static_cast<float>(sample[(sy * w + sx) * c + k]) : 0.0f;
              const float scaled = byte * p.scale[k];
              const float v = scaled + p.shift[k];
              if (out_f32) {
                out_f32[plane + y * wo + x] = v;
              } else {
                out_bf16[plane + y * wo + x] = BFloat16(v);
              }
            }
          }
        }
      },
      8);
}

}  // namespace cpu
}  // namespace ska
