// The `vit` family: ViT for small datasets (SPT embedding, pre-norm blocks, class-token head).
#include "models/vit.h"

#include <cstdint>

#include "nn/init.h"
#include "ops/ops.h"

namespace ska::models {

namespace {

// x moved by one pixel along `dim` (+1: towards higher indices), zero-filled: F.pad with a
// (1, -1) / (-1, 1) pair.
Tensor shift_one_pixel(const Tensor& x, int64_t dim, int64_t direction) {
  const int64_t size = x.size(dim);
  std::vector<int64_t> pads(static_cast<size_t>(2 * (x.dim() - dim)), 0);
  pads[static_cast<size_t>(2 * (x.dim() - 1 - dim) + (direction > 0 ? 0 : 1))] = 1;
  return pad(x, pads).narrow(dim, direction > 0 ? 0 : 1, size);
}

}  // namespace

ShiftedPatchEmbedding::ShiftedPatchEmbedding(int64_t in_channels, int64_t patch_size, int64_t dim)
    : patch_size_(patch_size) {
  const int64_t patch_features = 5 * in_channels * patch_size * patch_size;
  norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(patch_features, 1e-5));
  proj_ = register_module("proj", std::make_shared<nn::Linear>(patch_features, dim));
}

Tensor ShiftedPatchEmbedding::forward(const Tensor& images) {
  const int64_t batch = images.size(0), channels = 5 * images.size(1);
  const int64_t p = patch_size_, rows = images.size(2) / p, cols = images.size(3) / p;
  SKA_CHECK(images.size(2) % p == 0 && images.size(3) % p == 0, ShapeError, "SPT: image ",
            shape_str(images.shape()), " is not a multiple of the patch size ", p);
  const Tensor stacked = cat({images, shift_one_pixel(images, 3, 1), shift_one_pixel(images, 3, -1),
                              shift_one_pixel(images, 2, 1), shift_one_pixel(images, 2, -1)},
                             1);
  // 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'
  const Tensor patches = stacked.reshape({batch, channels, rows, p, cols, p})
                             .permute({0, 2, 4, 3, 5, 1})
                             .reshape({batch, rows * cols, p * p * channels});
  return (*proj_)((*norm_)(patches));
}

VitBlock::VitBlock(int64_t dim, nn::ModulePtr mixer, int64_t mlp_dim, double dropout) {
  norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(dim, 1e-5));
  mixer_ = register_module("mixer", std::move(mixer));
  norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(dim, 1e-5));
  nn::MlpOptions mlp;
  mlp.hidden = mlp_dim;
  mlp.activation = "gelu";
  mlp.drop = dropout;
  mlp_ = register_module("mlp", std::make_shared<nn::Mlp>(dim, mlp));
  norm1_->autocast_output = mixer_->reads_input_by_matmul_only();
  norm2_->autocast_output = mlp_->reads_input_by_matmul_only();
  // The dropouts that end the two branches are applied in the residual sums, in one pass with
  // them where nothing else stands between (nn::residual_sum).
  mixer_drop_ = mixer_->take_output_dropout();
  mlp_drop_ = mlp_->take_output_dropout();
}

ResidualNorm VitBlock::forward_chained(const ResidualNorm& in, ChainedBlock* next) {
  const double mixer_drop = is_training() ? mixer_drop_ : 0.0;
  const double mlp_drop = is_training() ? mlp_drop_ : 0.0;
  const auto residual = [](nn::LayerNorm& norm, const Tensor& x, const Tensor& branch, double p) {
    return norm.forward_residual(x, branch, Tensor(), Tensor(), Tensor(), p);
  };
  if (class_token_output && next == nullptr) {
    const ResidualNorm cls =
        residual(*norm2_, in.sum.narrow(1, 0, 1), mixer_->first_token(in.normed), mixer_drop);
    return {nn::residual_sum(cls.sum, (*mlp_)(cls.normed), mlp_drop), Tensor()};
  }
  const ResidualNorm mixed = residual(*norm2_, in.sum, (*mixer_)(in.normed), mixer_drop);
  const Tensor branch = (*mlp_)(mixed.normed);
  if (next != nullptr) return residual(next->first_norm(), mixed.sum, branch, mlp_drop);
  return {nn::residual_sum(mixed.sum, branch, mlp_drop), Tensor()};
}

MixerArgs vit_mixer_args(int64_t dim, TokenGrid grid) {
  MixerArgs args;
  args.dim = dim;
  args.grid = grid;
  args.init = nn::Init::kTorchDefault;
  args.flavour = nn::MixerFlavour::kVit;
  return args;
}

Vit::Vit(const ModelInput& input, const VitOptions& o,
         const std::function<nn::ModulePtr(int64_t, const MixerArgs&)>& make_mixer,
         const MixerArgs& mixer_args) {
  const int64_t side = input.image_size / o.patch_size;
  patch_embed_ = register_module("patch_embed", std::make_shared<ShiftedPatchEmbedding>(
                                                    input.in_channels, o.patch_size, o.dim));
  cls_token = register_parameter("cls_token", nn::init_normal({1, 1, o.dim}, 0.0, 1.0));
  pos_embed =
      register_parameter("pos_embed", nn::init_normal({1, side * side + 1, o.dim}, 0.0, 1.0));
  emb_drop_ = register_module("emb_drop", std::make_shared<nn::Dropout>(o.emb_dropout));
  MixerArgs args = vit_mixer_args(o.dim, TokenGrid{side, side, true});
  args.heads = mixer_args.heads;
  args.head_dim = mixer_args.head_dim;
  args.proj_drop = mixer_args.proj_drop;
  blocks_ = register_module("blocks", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < o.depth; ++i) {
    blocks_->append(std::to_string(i),
                    std::make_shared<VitBlock>(o.dim, make_mixer(i, args), o.mlp_dim, o.dropout));
  }
  // Only the class token of the last block's output reaches the head.
  if (o.depth > 0)
    static_cast<VitBlock&>(blocks_->at(blocks_->size() - 1)).class_token_output = true;
  norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(o.dim, 1e-5));
  head_ = register_module("head", std::make_shared<nn::Linear>(o.dim, input.num_classes));
}

Tensor Vit::forward(const Tensor& images) {
  const Tensor patches = (*patch_embed_)(images);
  const int64_t batch = patches.size(0);
  const Tensor cls = cls_token.expand({batch, 1, cls_token.size(2)});
  const Tensor tokens = (*emb_drop_)(add(cat({cls, patches}, 1), pos_embed));
  const Tensor features = run_block_chain(*blocks_, tokens);
  return (*head_)((*norm_)(features.select(1, 0)));
}

namespace {

nn::ModulePtr build_vit(const ConfigNode& cfg, const ModelInput& input) {
  VitOptions o;
  o.patch_size = cfg.get_int_in("patch_size", 4, 1, input.image_size);
  if (input.image_size % o.patch_size != 0) {
    cfg.fail("patch_size", "image_size " + std::to_string(input.image_size) +
                               " is not a multiple of the patch size " +
                               std::to_string(o.patch_size));
  }
  o.dim = cfg.get_int_in("dim", 512, 1, 1 << 16);
  o.depth = cfg.get_int_in("depth", 6, 1, 1024);
  o.mlp_dim = cfg.get_int_in("mlp_dim", 512, 1, 1 << 20);
  o.dropout = cfg.get_double_in("dropout", 0.1, 0.0, 1.0);
  o.emb_dropout = cfg.get_double_in("emb_dropout", 0.1, 0.0, 1.0);
  MixerArgs hints;
  hints.heads = cfg.get_int_in("heads", 0, 0, 1 << 16);  // 0: the mixer's own default
  hints.head_dim = cfg.get_int_in("head_dim", 0, 0, 1 << 16);
  hints.proj_drop = o.dropout;
  return std::make_shared<Vit>(
      input, o,
      [&](int64_t, const MixerArgs& args) { return build_mixer(cfg, "mixer", args, "lsa"); },
      hints);
}

}  // namespace

void register_vit_family(Registry<FamilyBuilder>& r) { r.add("vit", build_vit); }

}  // namespace ska::models
