// `pooling` and `identity` token mixers. The average pool is a depthwise convolution with a
// constant all-ones kernel divided by the number of in-image taps (so borders are not diluted).
#include "nn/mixers/pooling.h"

#include <cstdint>

#include "autograd/grad_mode.h"
#include "ops/ops.h"

namespace ska::nn {

Pooling::Pooling(const TokenGrid& grid, int64_t pool_size) : grid_(grid), pool_size_(pool_size) {
  SKA_CHECK(!grid.cls_token && grid.height > 0 && grid.width > 0, ValueError,
            "Pooling needs a spatial token grid without class token");
  SKA_CHECK(pool_size > 0 && pool_size % 2 == 1, ValueError, "Pooling: pool_size ", pool_size,
            " must be odd and positive");
}

Tensor Pooling::forward(const Tensor& x) {
  SKA_CHECK(x.dim() == 3 && x.size(1) == grid_.tokens(), ShapeError, "Pooling: expected [B, ",
            grid_.tokens(), ", C] tokens for a ", grid_.height, "x", grid_.width, " grid, got ",
            x.str());
  const int64_t batch = x.size(0), tokens = x.size(1), channels = x.size(2);
  const int64_t pad = pool_size_ / 2, k = pool_size_;
  Tensor taps_inside;  // [1, 1, H, W]: how many window taps fall inside the image
  {
    NoGradGuard no_grad;
    const Tensor ones_image =
        Tensor::ones({1, 1, grid_.height, grid_.width}, x.dtype(), x.device());
    taps_inside =
        conv2d(ones_image, Tensor::ones({1, 1, k, k}, x.dtype(), x.device()), Tensor(), 1, pad);
  }
  const Tensor window_sum_kernel = Tensor::ones({channels, 1, k, k}, x.dtype(), x.device());
  const Tensor image =
      x.reshape({batch, grid_.height, grid_.width, channels}).permute({0, 3, 1, 2});
  const Tensor window_sum = conv2d(image, window_sum_kernel, Tensor(), 1, pad, 1, channels);
  const Tensor pooled =
      div(window_sum, taps_inside).permute({0, 2, 3, 1}).reshape({batch, tokens, channels});
  return sub(pooled, x);
}

void register_pooling_mixers(Registry<MixerBuilder>& r) {
  r.add("pooling", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    const int64_t pool_size = cfg.get_int_in("pool_size", 3, 1, 31);
    if (pool_size % 2 == 0) cfg.fail("pool_size", "must be odd so the grid keeps its size");
    return std::make_shared<Pooling>(args.grid, pool_size);
  });
  r.add("identity", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    return std::make_shared<Identity>();
  });
}

}  // namespace ska::nn
