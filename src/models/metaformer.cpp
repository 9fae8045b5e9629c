// The `metaformer` family: config parsing, stem/downsampling, MetaFormer block, MLP head, the
// model; every Linear and Conv2d starts trunc_normal(.02) with zero biases, as in the reference.
#include "models/metaformer.h"

#include <algorithm>
#include <cstdint>

#include "models/stage_mixers.h"
#include "ops/ops.h"

namespace ska::models {

namespace {

constexpr int64_t kStemKernel = 7, kStemStride = 4, kStemPadding = 2;
constexpr int64_t kDownKernel = 3, kDownStride = 2, kDownPadding = 1;

int64_t conv_output_size(int64_t size, int64_t kernel, int64_t stride, int64_t padding) {
  return (size + 2 * padding - kernel) / stride + 1;
}

void check_positive(const ConfigNode& cfg, const std::string& key,
                    const std::vector<int64_t>& values) {
  for (int64_t v : values) {
    if (v <= 0) cfg.fail(key, "every entry must be positive, got " + std::to_string(v));
  }
}

// A learnable per-channel scale of the residual (init 1.0), registered under `name`.
nn::ModulePtr make_res_scale(nn::Module& block, const std::string& name, int64_t dim) {
  return block.register_module(name, std::make_shared<nn::Scale>(dim, 1.0));
}

}  // namespace

MixerArgs metaformer_mixer_args(int64_t dim, TokenGrid grid) {
  MixerArgs args;
  args.dim = dim;
  args.grid = grid;
  args.init = nn::Init::kTruncNormal;  // the reference re-initialises every layer, mixers too
  args.flavour = nn::MixerFlavour::kMetaFormer;
  return args;
}

MetaFormerConfig MetaFormerConfig::from_config(const ConfigNode& cfg) {
  MetaFormerConfig c;
  c.depths = cfg.get<std::vector<int64_t>>("depths", c.depths);
  c.dims = cfg.get<std::vector<int64_t>>("dims", c.dims);
  check_positive(cfg, "depths", c.depths);
  check_positive(cfg, "dims", c.dims);
  if (c.depths.empty() || c.depths.size() != c.dims.size()) {
    cfg.fail("dims", "needs one width per stage (" + std::to_string(c.depths.size()) + " depths, " +
                         std::to_string(c.dims.size()) + " dims)");
  }
  if (!cfg.has("mixers") && !cfg.has("mixer"))
    cfg.fail("mixers", "required key missing (one token mixer per stage)");
  c.mixers = read_stage_mixer_nodes(cfg, c.depths.size());
  c.mlp_ratio = cfg.get_double_in("mlp_ratio", c.mlp_ratio, 0.01, 64.0);
  c.mlp_activation = cfg.get_choice("mlp_activation", c.mlp_activation, nn::Activation::names());
  c.drop_path_rate = cfg.get_double_in("drop_path_rate", c.drop_path_rate, 0.0, 1.0);
  c.res_scale_stages = cfg.get<std::vector<int64_t>>("res_scale_stages", c.res_scale_stages);
  for (int64_t s : c.res_scale_stages) {
    if (s < 0 || s >= static_cast<int64_t>(c.depths.size())) {
      cfg.fail("res_scale_stages", "stage " + std::to_string(s) + " does not exist (0.." +
                                       std::to_string(c.depths.size() - 1) + ")");
    }
  }
  c.norm_eps = cfg.get_double_in("norm_eps", c.norm_eps, 0.0, 1.0);
  c.head_mlp_ratio = cfg.get_double_in("head_mlp_ratio", c.head_mlp_ratio, 0.01, 64.0);
  c.head_activation = cfg.get_choice("head_activation", c.head_activation, nn::Activation::names());
  c.head_norm_eps = cfg.get_double_in("head_norm_eps", c.head_norm_eps, 0.0, 1.0);
  c.head_dropout = cfg.get_double_in("head_dropout", c.head_dropout, 0.0, 1.0);
  return c;
}

Downsampling::Downsampling(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                           bool is_stem, double norm_eps)
    : is_stem_(is_stem) {
  if (!is_stem)
    pre_norm_ = register_module("pre_norm", std::make_shared<nn::LayerNorm>(in, norm_eps, false));
  nn::Conv2dOptions options;
  options.stride = stride;
  options.padding = padding;
  options.init = nn::Init::kTruncNormal;
  conv_ = register_module("conv", std::make_shared<nn::Conv2d>(in, out, kernel, options));
  if (is_stem)
    post_norm_ =
        register_module("post_norm", std::make_shared<nn::LayerNorm>(out, norm_eps, false));
}

Tensor Downsampling::forward(const Tensor& x) {
  if (is_stem_) return (*post_norm_)((*conv_)(x).permute({0, 2, 3, 1}));
  const Tensor image = (*pre_norm_)(x).permute({0, 3, 1, 2});
  return (*conv_)(image).permute({0, 2, 3, 1}).contiguous();
}

MetaFormerBlock::MetaFormerBlock(const MixerArgs& args, nn::ModulePtr token_mixer,
                                 const MetaFormerConfig& c, double drop_path, bool res_scale)
    : grid_(args.grid) {
  const int64_t dim = args.dim;
  const nn::ModulePtr identity = std::make_shared<nn::Identity>();
  norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(dim, c.norm_eps, false));
  // The mixer drew its Linear and Conv2d weights as MixerArgs.init says (trunc_normal here).
  token_mixer_ = register_module("token_mixer", std::move(token_mixer));
  drop_path1_ = register_module("drop_path1", std::make_shared<nn::DropPath>(drop_path));
  res_scale1_ = res_scale ? make_res_scale(*this, "res_scale1", dim) : identity;
  norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(dim, c.norm_eps, false));
  nn::MlpOptions mlp;
  mlp.hidden = static_cast<int64_t>(c.mlp_ratio * dim);
  mlp.activation = c.mlp_activation;
  mlp.bias = false;
  mlp.init = nn::Init::kTruncNormal;
  mlp_ = register_module("mlp", std::make_shared<nn::Mlp>(dim, mlp));
  drop_path2_ = register_module("drop_path2", std::make_shared<nn::DropPath>(drop_path));
  res_scale2_ = res_scale ? make_res_scale(*this, "res_scale2", dim) : identity;
  norm1_->autocast_output = token_mixer_->reads_input_by_matmul_only();
  norm2_->autocast_output = mlp_->reads_input_by_matmul_only();
}

void MetaFormerBlock::check_input(const Tensor& x) const {
  SKA_CHECK(x.dim() == 4 && x.size(1) == grid_.height && x.size(2) == grid_.width, ShapeError,
            "MetaFormerBlock: expected [B, ", grid_.height, ", ", grid_.width, ", C], got ",
            x.str());
}

ResidualNorm MetaFormerBlock::forward_chained(const ResidualNorm& in, ChainedBlock* next) {
  const Tensor& x = in.sum;
  check_input(x);
  const Shape tokens_shape{x.size(0), grid_.tokens(), x.size(3)};
  // The res_scales and drop paths multiply in the residual sums' own pass (scaled_residual).
  const nn::ScaledOperand kept1 = nn::scaled_operand(*res_scale1_, x.reshape(tokens_shape));
  const nn::DroppedOperand branch1 =
      nn::dropped_operand(*drop_path1_, (*token_mixer_)(in.normed.reshape(tokens_shape)));
  const ResidualNorm mixed =
      norm2_->forward_residual(kept1.value, branch1.value, kept1.scale, Tensor(), branch1.keep);
  const nn::ScaledOperand kept2 = nn::scaled_operand(*res_scale2_, mixed.sum);
  const nn::DroppedOperand branch = nn::dropped_operand(*drop_path2_, (*mlp_)(mixed.normed));
  if (next == nullptr) {
    const Tensor sum =
        scaled_residual(kept2.value, kept2.scale, branch.value, Tensor(), branch.keep);
    return {sum.view(x.shape()), Tensor()};
  }
  const ResidualNorm out = next->first_norm().forward_residual(kept2.value, branch.value,
                                                               kept2.scale, Tensor(), branch.keep);
  return {out.sum.view(x.shape()), out.normed.view(x.shape())};
}

Tensor MetaFormerBlock::forward(const Tensor& x) {
  check_input(x);  // before norm1 reads it
  return ChainedBlock::forward(x);
}

MlpHead::MlpHead(int64_t dim, int64_t num_classes, const MetaFormerConfig& c) {
  const int64_t hidden = static_cast<int64_t>(c.head_mlp_ratio * dim);
  fc1_ = register_module("fc1",
                         std::make_shared<nn::Linear>(dim, hidden, true, nn::Init::kTruncNormal));
  act_ = register_module("act", std::make_shared<nn::Activation>(c.head_activation));
  norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(hidden, c.head_norm_eps, true));
  head_dropout_ = register_module("head_dropout", std::make_shared<nn::Dropout>(c.head_dropout));
  fc2_ = register_module(
      "fc2", std::make_shared<nn::Linear>(hidden, num_classes, true, nn::Init::kTruncNormal));
}

Tensor MlpHead::forward(const Tensor& x) {
  return (*fc2_)((*head_dropout_)((*norm_)((*act_)((*fc1_)(x)))));
}

MetaFormer::MetaFormer(const MetaFormerConfig& c, const ModelInput& input) : input_(input) {
  downsample_layers_ = register_module("downsample_layers", std::make_shared<nn::Sequential>());
  stages_ = register_module("stages", std::make_shared<nn::Sequential>());
  int64_t total_blocks = 0;
  for (int64_t d : c.depths) total_blocks += d;
  int64_t side = input.image_size, in = input.in_channels, block_index = 0;
  for (size_t s = 0; s < c.depths.size(); ++s) {
    const bool stem = s == 0;
    const int64_t kernel = stem ? kStemKernel : kDownKernel,
                  stride = stem ? kStemStride : kDownStride,
                  padding = stem ? kStemPadding : kDownPadding;
    side = conv_output_size(side, kernel, stride, padding);
    SKA_CHECK(side >= 1, ValueError, "metaformer: image_size ", input.image_size,
              " is too small for ", c.depths.size(), " stages (stage ", s, " has no tokens)");
    downsample_layers_->append(
        std::to_string(s),
        std::make_shared<Downsampling>(in, c.dims[s], kernel, stride, padding, stem, c.norm_eps));
    const MixerArgs args = metaformer_mixer_args(c.dims[s], TokenGrid{side, side, false});
    const bool res_scale = std::find(c.res_scale_stages.begin(), c.res_scale_stages.end(),
                                     static_cast<int64_t>(s)) != c.res_scale_stages.end();
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t j = 0; j < c.depths[s]; ++j, ++block_index) {
      // Stochastic depth grows linearly from 0 at the first block to drop_path_rate at the last.
      const double drop_path =
          total_blocks > 1 ? c.drop_path_rate * block_index / (total_blocks - 1) : 0.0;
      stage->append(std::to_string(j),
                    std::make_shared<MetaFormerBlock>(
                        args, build_mixer_from_node(c.mixers[s], args), c, drop_path, res_scale));
    }
    stages_->append(std::to_string(s), stage);
    in = c.dims[s];
  }
  norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(in, 1e-6, true));
  head_ = register_module("head", std::make_shared<MlpHead>(in, input.num_classes, c));
}

Tensor MetaFormer::forward(const Tensor& x) {
  SKA_CHECK(x.dim() == 4 && x.size(1) == input_.in_channels && x.size(2) == input_.image_size &&
                x.size(3) == input_.image_size,
            ShapeError, "MetaFormer: expected images [B, ", input_.in_channels, ", ",
            input_.image_size, ", ", input_.image_size, "], got ", x.str());
  Tensor h = x;
  for (size_t s = 0; s < stages_->size(); ++s) {
    h = downsample_layers_->at(s)(h);
    h = run_block_chain(static_cast<nn::Sequential&>(stages_->at(s)), h);
  }
  return (*head_)((*norm_)(mean(h, {1, 2})));
}

void register_metaformer_family(Registry<FamilyBuilder>& r) {
  r.add("metaformer", [](const ConfigNode& cfg, const ModelInput& input) -> nn::ModulePtr {
    return std::make_shared<MetaFormer>(MetaFormerConfig::from_config(cfg), input);
  });
}

}  // namespace ska::models
