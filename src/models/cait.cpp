// CaiT family (`family: cait`): talking-heads attention with MHSA / SKA / CSKA logits, LayerScale
// blocks, layer dropout, class attention, and the YAML builder. Reference: lucidrains' cait.py.
#include "models/cait.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/random.h"
#include "nn/summary.h"
#include "ops/ops.h"

namespace ska::models {

using nn::AttentionKind;

// --- attention ----------------------------------------------------------------------------------

CaitAttention::CaitAttention(const CaitAttentionOptions& o) : options_(o) {
  const int64_t inner = o.heads * o.head_dim;
  const int64_t context = o.grid.height * o.grid.width;
  SKA_CHECK(o.heads > 0 && o.head_dim > 0, ValueError,
            "CaitAttention: heads and head_dim must be positive, got ", o.heads, " and ",
            o.head_dim);
  SKA_CHECK(o.logits == AttentionKind::kMhsa || (!o.class_query && context > 0), ValueError,
            "CaitAttention: ", nn::attention_kind_name(o.logits),
            " logits need the patch grid and patch queries (class attention uses mhsa)");
  to_q_ = register_module("to_q", std::make_shared<nn::Linear>(o.dim, inner, false));
  if (o.logits == AttentionKind::kMhsa) {
    to_kv_ = register_module("to_kv", std::make_shared<nn::Linear>(o.dim, 2 * inner, false));
  } else if (o.logits == AttentionKind::kCska) {
    to_k_ = register_module("to_k", nn::make_conv_logits(inner, o.heads, context));
  } else {
    SKA_CHECK(o.key_grid_factor > 0, ValueError, "CaitAttention: key_grid_factor must be positive");
    fine_factor_ = o.key_grid_factor;
    const int64_t keys = context * fine_factor_ * fine_factor_;
    static_key_ =
        register_parameter("static_key", nn::init_static_keys({o.heads, keys, o.head_dim}));
  }
  if (o.logits != AttentionKind::kMhsa) {
    to_v_ = register_module("to_v", std::make_shared<nn::Linear>(o.dim, inner, false));
  }
  if (o.talking_heads) {
    mix_pre_ = register_parameter("mix_heads_pre_attn", nn::init_normal({o.heads, o.heads}, 0, 1));
    mix_post_ =
        register_parameter("mix_heads_post_attn", nn::init_normal({o.heads, o.heads}, 0, 1));
  }
  attend_ = register_module("attend", std::make_shared<nn::AttentionWeights>(o.activation));
  to_out_ = register_module("to_out", std::make_shared<nn::Linear>(inner, o.dim));
  drop_ =
      register_module("drop", std::make_shared<nn::Dropout>(o.dropout));  // so eval() reaches it
}

bool CaitAttention::reads_input_by_matmul_only() const {
  return !options_.class_query && nn::stacked_projections_enabled();
}

std::string CaitAttention::type_name() const {
  const std::string kind = options_.class_query ? "ClassAttention" : "TalkingHeadsAttention";
  return kind + "(" + nn::attention_kind_name(options_.logits) + ")";
}

Tensor CaitAttention::forward(const Tensor& x) {
  const CaitAttentionOptions& o = options_;
  SKA_CHECK(x.dim() == 3 && x.size(2) == o.dim, ShapeError, type_name(), ": expected [B, N, ",
            o.dim, "], got ", shape_str(x.shape()));
  if (o.class_query) return class_attention(x.narrow(1, 0, 1), x);
  // Patch attention projects q and k, v (or v) from the same tokens: one product where the
  // projections stack (nn::stacked_product), its heads split in one node.
  const int64_t inner = o.heads * o.head_dim;
  const bool dot = o.logits == AttentionKind::kMhsa;
  nn::Linear& second = dot ? *to_kv_ : *to_v_;
  if (const Tensor joined = nn::stacked_product(x, {to_q_.get(), &second}); joined.defined()) {
    const TensorList heads = nn::split_heads(
        joined,
        dot ? std::vector<int64_t>{inner, inner, inner} : std::vector<int64_t>{inner, inner},
        o.heads);
    return attend_heads(heads[0], dot ? heads[1] : Tensor(), heads.back());
  }
  const Tensor q = nn::split_heads((*to_q_)(x), o.heads);
  if (!dot) return attend_heads(q, Tensor(), nn::split_heads(second(x), o.heads));
  const TensorList kv = nn::split_heads(second(x), {inner, inner}, o.heads);
  return attend_heads(q, kv[0], kv[1]);
}

Tensor CaitAttention::class_attention(const Tensor& query, const Tensor& context) {
  const CaitAttentionOptions& o = options_;
  SKA_CHECK(o.class_query, ValueError, type_name(), ": class_attention needs class attention");
  SKA_CHECK(query.dim() == 3 && query.size(1) == 1 && query.size(2) == o.dim &&
                context.dim() == 3 && context.size(0) == query.size(0) && context.size(2) == o.dim,
            ShapeError, type_name(), ": expected a query token [B, 1, ", o.dim,
            "] and context [B, N, ", o.dim, "], got ", shape_str(query.shape()), " and ",
            shape_str(context.shape()));
  const int64_t inner = o.heads * o.head_dim;
  const TensorList kv = nn::split_heads((*to_kv_)(context), {inner, inner}, o.heads);
  return attend_heads(nn::split_heads((*to_q_)(query), o.heads), kv[0], kv[1]);
}

Tensor CaitAttention::attend_heads(const Tensor& q, Tensor k, Tensor v) {
  const CaitAttentionOptions& o = options_;
  Tensor logits;  // from a conv (cska), or k for q k^T
  if (o.logits != AttentionKind::kMhsa) {
    const int64_t tokens = v.size(2);
    SKA_CHECK(tokens == o.grid.height * o.grid.width, ShapeError, type_name(), ": ", tokens,
              " tokens for a ", o.grid.height, "x", o.grid.width, " patch grid");
    if (o.logits == AttentionKind::kCska) {
      logits = nn::conv_logits(q, *to_k_, o.grid.height, o.grid.width);
    } else {
      k = static_key_;
      v = fine_values(v);
    }
  }
  nn::AttentionSpec spec;
  if (o.logits == AttentionKind::kMhsa || o.scaled)
    spec.scale = 1.0 / std::sqrt(static_cast<double>(o.head_dim));
  attend_->configure(spec);
  spec.heads_pre = mix_pre_;  // undefined without talking heads
  spec.heads_post = mix_post_;
  const Tensor out = k.defined() ? nn::attend_qk(q, k, v, spec) : nn::attend(logits, v, spec);
  return (*drop_)((*to_out_)(nn::merge_heads(out)));
}

// Static keys on a grid f times finer than the tokens: the f x f keys inside a token's patch all
// use that token's value (v [B, h, gh*gw, d] -> [B, h, (gh f)*(gw f), d], row-major fine grid).
Tensor CaitAttention::fine_values(const Tensor& v) const {
  if (fine_factor_ == 1) return v;
  const int64_t f = fine_factor_, gh = options_.grid.height, gw = options_.grid.width;
  const int64_t b = v.size(0), h = v.size(1), d = v.size(3);
  return v.reshape({b, h, gh, 1, gw, 1, d})
      .expand({b, h, gh, f, gw, f, d})
      .reshape({b, h, gh * f * gw * f, d});
}

// --- blocks -------------------------------------------------------------------------------------

CaitBlock::CaitBlock(const CaitBlockOptions& o) : class_block_(o.attention.class_query) {
  const int64_t dim = o.attention.dim;
  norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(dim));
  attn_ = register_module("attn", std::make_shared<CaitAttention>(o.attention));
  ls1_ = register_module("ls1", std::make_shared<nn::Scale>(dim, o.layer_scale_init));
  norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(dim));
  nn::MlpOptions mlp;
  mlp.hidden = o.mlp_dim;
  mlp.activation = "gelu";
  mlp.drop = o.dropout;
  mlp_ = register_module("mlp", std::make_shared<nn::Mlp>(dim, mlp));
  ls2_ = register_module("ls2", std::make_shared<nn::Scale>(dim, o.layer_scale_init));
  // The attention reads norm1's output through two projections (to_q and to_kv / to_v), so it
  // stays f32 (its gradient sums in f32), unless they stack into one product (forward sets it).
  norm2_->autocast_output = mlp_->reads_input_by_matmul_only();
  attn_drop_ = attn_->take_output_dropout();
  mlp_drop_ = mlp_->take_output_dropout();
}

// The LayerScales multiply, and the branches' closing dropouts drop, in the residual sums' own
// pass (add_layer_norm's with the norm after it, else scaled_residual's).
ResidualNorm CaitBlock::residual_mlp(const Tensor& x, const Tensor& attended, ChainedBlock* next) {
  const double attn_drop = is_training() ? attn_drop_ : 0.0;
  const double mlp_drop = is_training() ? mlp_drop_ : 0.0;
  const nn::ScaledOperand branch1 = scaled_branch(*ls1_, attended);
  const ResidualNorm mixed =
      norm2_->forward_residual(x, branch1.value, Tensor(), branch1.scale, Tensor(), attn_drop);
  const nn::ScaledOperand branch2 = scaled_branch(*ls2_, (*mlp_)(mixed.normed));
  if (next != nullptr) {
    return next->first_norm().forward_residual(mixed.sum, branch2.value, Tensor(), branch2.scale,
                                               Tensor(), mlp_drop);
  }
  return {nn::residual_sum(mixed.sum, branch2.value, mlp_drop, Tensor(), branch2.scale), Tensor()};
}

nn::LayerNorm& CaitBlock::first_norm() {
  if (!class_block_) norm1_->autocast_output = attn_->reads_input_by_matmul_only();
  return *norm1_;
}

ResidualNorm CaitBlock::forward_chained(const ResidualNorm& in, ChainedBlock* next) {
  SKA_CHECK(!class_block_, ValueError, "CaitBlock: a class-attention block does not chain");
  return residual_mlp(in.sum, (*attn_)(in.normed), next);
}

Tensor CaitBlock::forward(const Tensor& x) {
  if (!class_block_) return ChainedBlock::forward(x);
  // One split node: its backward concatenates the two gradients (two narrows would each
  // zero-fill an x-sized gradient and add them up).
  const TensorList parts = split(x, {1, x.size(1) - 1}, 1);
  return cat({class_update(parts[0], parts[1]), parts[1]}, 1);
}

Tensor CaitBlock::class_update(const Tensor& cls, const Tensor& patches) {
  SKA_CHECK(class_block_, ValueError, "CaitBlock: class_update needs a class-attention block");
  SKA_CHECK(cls.dim() == 3 && cls.size(1) == 1 && patches.dim() == 3 &&
                patches.size(0) == cls.size(0) && patches.size(2) == cls.size(2),
            ShapeError, "CaitBlock: expected the class token [B, 1, C] and patches [B, N, C], got ",
            shape_str(cls.shape()), " and ", shape_str(patches.shape()));
  // The query reads the normalised class token itself: a narrow of the context would give it
  // a context-sized zero gradient to add up.
  const Tensor query = (*norm1_)(cls);
  const Tensor attended = nn::record_call(attn_.get(), [&] {
    return attn_->class_attention(query, cat({query, patches}, 1));
  });
  return residual_mlp(cls, attended, nullptr).sum;
}

nn::ScaledOperand CaitBlock::scaled_branch(nn::Module& ls, const Tensor& branch) {
  nn::ScaledOperand scaled = nn::scaled_operand(ls, branch);
  if (!kept_.defined() || !is_training()) return scaled;
  // The LayerScale times the flag: kept blocks multiply by the LayerScale's own bits.
  if (scaled.scale.defined()) {
    scaled.scale = mul(scaled.scale, kept_.to(scaled.scale.dtype()));
  } else {
    scaled.value = mul(scaled.value, kept_.to(scaled.value.dtype()));
  }
  return scaled;
}

void CaitLayerStack::append(std::shared_ptr<CaitBlock> block) {
  blocks_.push_back(register_module(std::to_string(blocks_.size()), std::move(block)));
}

std::vector<bool> kept_layers(const std::vector<double>& u, double layer_dropout) {
  const int64_t n = static_cast<int64_t>(u.size()) - 1;
  SKA_CHECK(n >= 0, ValueError, "kept_layers: needs n + 1 draws for n layers");
  std::vector<bool> kept(static_cast<size_t>(n));
  bool any = false;
  for (int64_t i = 0; i < n; ++i) any |= (kept[i] = u[i] >= layer_dropout);
  // All dropped: keep one at random so the stack never becomes the identity.
  if (!any && n > 0) kept[std::min<int64_t>(n - 1, static_cast<int64_t>(u[n] * n))] = true;
  return kept;
}

namespace {

// The smallest f32 value v with v >= a / b (b > 0): for every f32 u, u >= a / b exactly when
// u >= v. Checked in f64, where v * b is exact for the small integers b here.
float f32_at_or_above(double a, double b) {
  float v = static_cast<float>(a / b);
  while (static_cast<double>(v) * b < a) v = std::nextafter(v, std::numeric_limits<float>::max());
  while (static_cast<double>(std::nextafter(v, -std::numeric_limits<float>::max())) * b >= a) {
    v = std::nextafter(v, -std::numeric_limits<float>::max());
  }
  return v;
}

}  // namespace

LayerKeepRule::LayerKeepRule(int64_t layers, double layer_dropout, Device device)
    : layers_(layers) {
  SKA_CHECK(layers > 0, ValueError, "LayerKeepRule: needs at least one layer");
  threshold_ = Tensor::full({1}, f32_at_or_above(layer_dropout, 1.0), DType::kF32, device);
  std::vector<float> lower(static_cast<size_t>(layers)), upper(static_cast<size_t>(layers));
  const double n = static_cast<double>(layers);
  for (int64_t i = 0; i < layers; ++i) {
    // floor(u n) = i exactly when i / n <= u < (i + 1) / n; the last layer takes u n >= n - 1.
    lower[static_cast<size_t>(i)] = f32_at_or_above(static_cast<double>(i), n);
    upper[static_cast<size_t>(i)] = i + 1 < layers ? f32_at_or_above(static_cast<double>(i + 1), n)
                                                   : std::numeric_limits<float>::infinity();
  }
  lower_ = Tensor::from_vector(lower, {layers}, DType::kF32).to(device);
  upper_ = Tensor::from_vector(upper, {layers}, DType::kF32).to(device);
}

Tensor LayerKeepRule::kept(const Tensor& u) const {
  SKA_CHECK(u.dim() == 1 && u.size(0) == layers_ + 1 && u.dtype() == DType::kF32 &&
                u.device() == threshold_.device(),
            ValueError, "LayerKeepRule: expected f32 [", layers_ + 1, "] on ", threshold_.device(),
            ", got ", u.str());
  NoGradGuard no_grad;
  const int64_t n = layers_;
  const Tensor drawn = ge(u.narrow(0, 0, n), threshold_).to(DType::kF32);
  const Tensor none = rsub(1.0, amax(drawn));  // 1 when every layer drew out
  const Tensor last = u.narrow(0, n, 1);
  const Tensor pick = mul(ge(last, lower_).to(DType::kF32), lt(last, upper_).to(DType::kF32));
  return maximum(drawn, mul(pick, none));
}

std::string CaitLayerStack::host_draws() const {
  if (layer_dropout_ <= 0.0 || blocks_.empty() || kept_.defined()) return "";
  return "layer dropout (model.layer_dropout: " + ::ska::detail::str_cat(layer_dropout_) +
         ") picks the layers that run with host random numbers at every training step";
}

std::vector<std::pair<std::string, Tensor>> CaitLayerStack::draw_on_device(Device device) {
  if (layer_dropout_ <= 0.0 || blocks_.empty()) return {};
  const int64_t n = static_cast<int64_t>(blocks_.size());
  kept_ = Tensor::ones({n}, DType::kF32, device);
  dropped_ = Tensor::zeros({n}, DType::kU8, device);
  rule_ = LayerKeepRule(n, layer_dropout_, device);
  std::vector<std::pair<std::string, Tensor>> gates;
  for (int64_t i = 0; i < n; ++i) {
    const auto& block = blocks_[static_cast<size_t>(i)];
    block->set_kept(kept_.narrow(0, i, 1));
    const Tensor flag = dropped_.narrow(0, i, 1);
    for (const auto& [name, param] : block->named_parameters(true)) {
      gates.emplace_back(std::to_string(i) + "." + name, flag);
    }
  }
  return gates;
}

void CaitLayerStack::draw_kept_on_device() {
  NoGradGuard no_grad;
  const Tensor kept = rule_.kept(rand({kept_.numel() + 1}, DType::kF32, kept_.device()));
  kept_.copy_(kept);
  dropped_.copy_(rsub(1.0, kept));
}

std::vector<CaitBlock*> CaitLayerStack::running_blocks(Device input) {
  SKA_CHECK(!kept_.defined() || input == kept_.device(), DeviceError,
            "CaitLayerStack: its layer dropout draws on ", kept_.device(),
            " (draw_on_device), but the input is on ", input);
  if (kept_.defined() && is_training()) draw_kept_on_device();  // the blocks read kept_
  std::vector<bool> kept(blocks_.size(), true);
  if (!kept_.defined() && is_training() && layer_dropout_ > 0.0 && !blocks_.empty()) {
    const int64_t n = static_cast<int64_t>(blocks_.size());
    kept = kept_layers(rand({n + 1}, DType::kF64).to_vector<double>(), layer_dropout_);
  }
  std::vector<CaitBlock*> running;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    if (kept[i]) running.push_back(blocks_[i].get());
  }
  return running;
}

Tensor CaitLayerStack::forward(const Tensor& x) {
  if (!blocks_.empty() && blocks_.front()->class_block()) {
    SKA_CHECK(x.dim() == 3 && x.size(1) >= 1, ShapeError,
              "CaitLayerStack: expected [B, 1 + N, C] tokens, class token first, got ",
              shape_str(x.shape()));
    const TensorList parts = split(x, {1, x.size(1) - 1}, 1);
    return cat({forward_class(parts[0], parts[1]), parts[1]}, 1);
  }
  // Patch layers: one chain of fused sums and norms.
  const std::vector<CaitBlock*> running = running_blocks(x.device());
  return run_block_chain(std::vector<ChainedBlock*>(running.begin(), running.end()), x);
}

Tensor CaitLayerStack::forward_class(const Tensor& cls, const Tensor& patches) {
  Tensor y = cls;
  for (CaitBlock* block : running_blocks(cls.device())) {
    y = nn::record_call(block, [&] { return block->class_update(y, patches); });
  }
  return y;
}

// --- model --------------------------------------------------------------------------------------

Cait::Cait(const CaitOptions& o) : options_(o) {
  const int64_t grid = o.input.image_size / o.patch_size;
  SKA_CHECK(grid * o.patch_size == o.input.image_size, ValueError, "CaiT: image_size ",
            o.input.image_size, " is not a multiple of patch_size ", o.patch_size);
  const int64_t patch_dim = o.input.in_channels * o.patch_size * o.patch_size;
  patch_embed_ = register_module("patch_embed", std::make_shared<nn::Linear>(patch_dim, o.dim));
  pos_embed_ = register_parameter("pos_embed", nn::init_normal({1, grid * grid, o.dim}, 0, 1));
  cls_token_ = register_parameter("cls_token", nn::init_normal({1, 1, o.dim}, 0, 1));
  emb_drop_ = register_module("emb_drop", std::make_shared<nn::Dropout>(o.emb_dropout));

  CaitBlockOptions block;
  block.mlp_dim = o.mlp_dim;
  block.dropout = o.dropout;
  block.layer_scale_init = o.layer_scale_init;
  block.attention = o.patch_attention;
  block.attention.dim = o.dim;
  block.attention.dropout = o.dropout;
  block.attention.grid = TokenGrid{grid, grid, false};
  block.attention.class_query = false;
  patch_layers_ =
      register_module("patch_layers", std::make_shared<CaitLayerStack>(o.layer_dropout));
  for (int64_t i = 0; i < o.depth; ++i) patch_layers_->append(std::make_shared<CaitBlock>(block));

  // Class attention keeps plain q k^T logits in every variant (as the authors' SKA/CSKA CaiT).
  block.attention.logits = AttentionKind::kMhsa;
  block.attention.scaled = true;
  block.attention.activation = "softmax";
  block.attention.key_grid_factor = 1;
  block.attention.class_query = true;
  block.attention.grid = TokenGrid{grid, grid, true};
  class_layers_ =
      register_module("class_layers", std::make_shared<CaitLayerStack>(o.layer_dropout));
  for (int64_t i = 0; i < o.cls_depth; ++i)
    class_layers_->append(std::make_shared<CaitBlock>(block));

  head_norm_ = register_module("head_norm", std::make_shared<nn::LayerNorm>(o.dim));
  head_ = register_module("head", std::make_shared<nn::Linear>(o.dim, o.input.num_classes));
}

// [B, C, H, W] -> [B, (H/p)(W/p), p*p*C] with features in (p1 p2 c) order (lucidrains).
Tensor Cait::patchify(const Tensor& images) const {
  const int64_t p = options_.patch_size, b = images.size(0), c = images.size(1);
  const int64_t gh = images.size(2) / p, gw = images.size(3) / p;
  return images.reshape({b, c, gh, p, gw, p})
      .permute({0, 2, 4, 3, 5, 1})
      .reshape({b, gh * gw, p * p * c});
}

Tensor Cait::forward(const Tensor& images) {
  const ModelInput& in = options_.input;
  SKA_CHECK(images.dim() == 4 && images.size(1) == in.in_channels &&
                images.size(2) == in.image_size && images.size(3) == in.image_size,
            ShapeError, "CaiT: expected images [B, ", in.in_channels, ", ", in.image_size, ", ",
            in.image_size, "], got ", shape_str(images.shape()));
  Tensor x = add((*patch_embed_)(patchify(images)), pos_embed_);
  x = (*patch_layers_)((*emb_drop_)(x));
  // The class layers update the class token alone, reading the patches (CaitLayerStack).
  const Tensor first = cls_token_.expand({x.size(0), 1, options_.dim});
  const Tensor cls =
      nn::record_call(class_layers_.get(), [&] { return class_layers_->forward_class(first, x); });
  return (*head_)((*head_norm_)(cls.contiguous().squeeze(1)));
}

// --- config -------------------------------------------------------------------------------------

namespace {

// `mixer: ska` or `mixer: {type: ska, scale: true, activation: softmax, key_grid_factor: 2}`; the
// attention kinds (mhsa, ska, cska) are nn::attention_kind_names().
void read_patch_mixer(const ConfigNode& cfg, CaitAttentionOptions& a) {
  const std::vector<std::string>& kinds = nn::attention_kind_names();
  ConfigNode options;  // null for the string form: every option takes its default
  std::string type = "mhsa";
  if (cfg.has("mixer") && cfg["mixer"].is_map()) {
    options = cfg["mixer"];
    type = options.get_choice("type", "mhsa", kinds);
  } else {
    type = cfg.get_choice("mixer", "mhsa", kinds);
  }
  a.logits = nn::attention_kind(type);
  if (a.logits == AttentionKind::kMhsa) return;
  // CSKA's conv logits are unscaled in the authors' CaiT; SKA's static-key logits are scaled.
  a.scaled = options.get<bool>("scale", a.logits == AttentionKind::kSka);
  a.activation = options.get_choice("activation", "softmax", nn::normalise_names());
  if (a.logits == AttentionKind::kSka) {
    a.key_grid_factor = options.get_int_in("key_grid_factor", 1, 1, 64);
  }
}

}  // namespace

CaitOptions read_cait_options(const ConfigNode& cfg, const ModelInput& input) {
  CaitOptions o;
  o.input = input;
  o.patch_size = cfg.get_int_in("patch_size", o.patch_size, 1, input.image_size);
  if (input.image_size % o.patch_size != 0) {
    cfg.fail("patch_size", "image_size " + std::to_string(input.image_size) +
                               " is not a multiple of patch_size " + std::to_string(o.patch_size));
  }
  o.dim = cfg.get_int_in("dim", o.dim, 1, 1 << 16);
  o.depth = cfg.get_int_in("depth", o.depth, 0, 1024);
  o.cls_depth = cfg.get_int_in("cls_depth", o.cls_depth, 0, 1024);
  o.mlp_dim = cfg.get_int_in("mlp_dim", o.mlp_dim, 1, 1 << 18);
  o.dropout = cfg.get_double_in("dropout", o.dropout, 0.0, 0.99);
  o.emb_dropout = cfg.get_double_in("emb_dropout", o.emb_dropout, 0.0, 0.99);
  o.layer_dropout = cfg.get_double_in("layer_dropout", o.layer_dropout, 0.0, 0.99);
  o.layer_scale_init = cfg.get_double_in("layer_scale_init", o.layer_scale_init, 0.0, 10.0);
  CaitAttentionOptions& a = o.patch_attention;
  a.heads = cfg.get_int_in("heads", a.heads, 1, 1024);
  a.head_dim = cfg.get_int_in("head_dim", a.head_dim, 1, 4096);
  a.talking_heads = cfg.get<bool>("talking_heads", true);
  read_patch_mixer(cfg, a);
  return o;
}

void register_cait_family(Registry<FamilyBuilder>& r) {
  r.add("cait", [](const ConfigNode& cfg, const ModelInput& input) -> nn::ModulePtr {
    return std::make_shared<Cait>(read_cait_options(cfg, input));
  });
}

}  // namespace ska::models
