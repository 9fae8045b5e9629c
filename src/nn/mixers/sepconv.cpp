// The `sepconv` token mixer: pwconv1 (C -> rC) -> StarReLU -> depthwise conv -> pwconv2 (rC -> C).
// Works channels-last on the token grid; only the depthwise conv sees [B, C, H, W] (a view).
#include "nn/mixers/sepconv.h"

#include <cstdint>

#include "ops/ops.h"

namespace ska::nn {

SepConvOptions SepConvOptions::from_config(const ConfigNode& cfg) {
  SepConvOptions o;
  o.expansion_ratio = cfg.get_double_in("expansion_ratio", o.expansion_ratio, 0.01, 64.0);
  o.kernel_size = cfg.get_int_in("kernel_size", o.kernel_size, 1, 31);
  if (o.kernel_size % 2 == 0) cfg.fail("kernel_size", "must be odd so the grid keeps its size");
  o.activation = cfg.get_choice("activation", o.activation, Activation::names());
  o.bias = cfg.get<bool>("bias", o.bias);
  return o;
}

SepConv::SepConv(int64_t dim, const TokenGrid& grid, const SepConvOptions& o)
    : grid_(grid), hidden_(static_cast<int64_t>(o.expansion_ratio * dim)) {
  SKA_CHECK(!grid.cls_token && grid.height > 0 && grid.width > 0, ValueError,
            "SepConv needs a spatial token grid without class token");
  pwconv1_ = register_module("pwconv1", std::make_shared<Linear>(dim, hidden_, o.bias, o.init));
  act1_ = register_module("act1", std::make_shared<Activation>(o.activation));
  act1_->autocast_output = true;  // read by the depthwise convolution alone
  Conv2dOptions depthwise;
  depthwise.padding = o.kernel_size / 2;
  depthwise.groups = hidden_;
  depthwise.bias = o.bias;
  depthwise.init = o.init;
  dwconv_ = register_module("dwconv",
                            std::make_shared<Conv2d>(hidden_, hidden_, o.kernel_size, depthwise));
  pwconv2_ = register_module("pwconv2", std::make_shared<Linear>(hidden_, dim, o.bias, o.init));
}

Tensor SepConv::forward(const Tensor& x) {
  SKA_CHECK(x.dim() == 3 && x.size(1) == grid_.tokens(), ShapeError, "SepConv: expected [B, ",
            grid_.tokens(), ", C] tokens for a ", grid_.height, "x", grid_.width, " grid, got ",
            x.str());
  const int64_t batch = x.size(0), tokens = x.size(1);
  const Tensor h = (*act1_)((*pwconv1_)(x));
  const Tensor image = h.view({batch, grid_.height, grid_.width, hidden_}).permute({0, 3, 1, 2});
  const Tensor mixed = (*dwconv_)(image).permute({0, 2, 3, 1}).reshape({batch, tokens, hidden_});
  return (*pwconv2_)(mixed);
}

void register_sepconv_mixer(Registry<MixerBuilder>& r) {
  r.add("sepconv", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    SepConvOptions options = SepConvOptions::from_config(cfg);
    options.init = args.init;
    return std::make_shared<SepConv>(args.dim, args.grid, options);
  });
}

}  // namespace ska::nn
