// The `cvt` family: per-stage conv token embedding + LayerNorm, pre-norm blocks of conv-projection
// attention (mhsa / ska / cska) and a QuickGELU MLP, cls token in the last stage only, cls head.
#include "models/cvt.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "models/block_chain.h"
#include "models/stage_mixers.h"
#include "ops/autocast.h"
#include "ops/ops.h"

namespace ska::models {
namespace {

int64_t conv_out(int64_t size, int64_t kernel, int64_t stride, int64_t padding) {
  return (size + 2 * padding - kernel) / stride + 1;
}

// `dw_bn`: depthwise 3x3 conv (no bias) + BatchNorm on a grid [B, C, H, W] -> tokens [B, T, C].
class DwBnProjection : public nn::Module {
 public:
  DwBnProjection(int64_t dim, int64_t stride) {
    nn::Conv2dOptions o;
    o.stride = stride;
    o.padding = 1;
    o.groups = dim;
    o.bias = false;
    conv_ = register_module("conv", std::make_shared<nn::Conv2d>(dim, dim, 3, o));
    bn_ = register_module("bn", std::make_shared<nn::BatchNorm2d>(dim));
  }
  Tensor forward(const Tensor& grid) override {
    return (*bn_)((*conv_)(grid)).flatten(2).transpose(1, 2);
  }
  std::string type_name() const override { return "DwBnProjection"; }

 private:
  std::shared_ptr<nn::Conv2d> conv_;
  std::shared_ptr<nn::BatchNorm2d> bn_;
};

std::shared_ptr<nn::Linear> trunc_normal_linear(int64_t in, int64_t out) {
  return std::make_shared<nn::Linear>(in, out, true, nn::Init::kTruncNormal);
}

}  // namespace

ConvAttention::ConvAttention(const ConvAttentionOptions& options) : o_(options) {
  SKA_CHECK(o_.dim % o_.heads == 0, ValueError, "ConvAttention: width ", o_.dim,
            " is not divisible by ", o_.heads, " heads");
  const int64_t d = o_.dim / o_.heads;
  kv_h_ = conv_out(o_.grid_h, 3, o_.kv_stride, 1);
  kv_w_ = conv_out(o_.grid_w, 3, o_.kv_stride, 1);
  const bool projected_keys = o_.kind == nn::AttentionKind::kMhsa;
  conv_proj_q_ = register_module("conv_proj_q", std::make_shared<DwBnProjection>(o_.dim, 1));
  if (projected_keys)
    conv_proj_k_ =
        register_module("conv_proj_k", std::make_shared<DwBnProjection>(o_.dim, o_.kv_stride));
  conv_proj_v_ =
      register_module("conv_proj_v", std::make_shared<DwBnProjection>(o_.dim, o_.kv_stride));
  proj_q_ = register_module("proj_q", trunc_normal_linear(o_.dim, o_.dim));
  if (projected_keys) proj_k_ = register_module("proj_k", trunc_normal_linear(o_.dim, o_.dim));
  proj_v_ = register_module("proj_v", trunc_normal_linear(o_.dim, o_.dim));
  const int64_t cls = o_.cls_token ? 1 : 0;
  if (o_.kind == nn::AttentionKind::kSka)
    keys_ = register_parameter("keys", nn::init_static_keys({o_.heads, grid_keys() + cls, d}));
  if (o_.kind == nn::AttentionKind::kCska) {
    to_logits_ = register_module("to_logits", nn::make_conv_logits(o_.dim, o_.heads, grid_keys()));
    if (o_.cls_token) {
      cls_query_keys_ =
          register_parameter("cls_query_keys", nn::init_static_keys({o_.heads, grid_keys(), d}));
      if (o_.cls_key == "static")
        cls_key_ = register_parameter("cls_key", nn::init_static_keys({o_.heads, 1, d}));
    }
  }
  proj_ = register_module("proj", trunc_normal_linear(o_.dim, o_.dim));
}

std::string ConvAttention::type_name() const {
  return o_.kind == nn::AttentionKind::kMhsa  ? "ConvAttention"
         : o_.kind == nn::AttentionKind::kSka ? "SKA-ConvAttention"
                                              : "CSKA-ConvAttention";
}

Tensor ConvAttention::with_cls(const Tensor& cls, const Tensor& tokens) const {
  if (!o_.cls_token) return tokens;
  // Under autocast the projected tokens come in 16 bits (batch norm runs in its input's dtype)
  // and the class token in f32; cat would promote the tokens to f32 for the linear layer that
  // reads the result to cast back. The class token joins them in 16 bits instead: the same
  // values for that layer (it rounds the class token as it would), the same gradients, and no
  // copy of the tokens either way.
  const AutocastState autocast = autocast_state();
  if (autocast.enabled && tokens.dtype() == autocast.dtype && cls.dtype() == DType::kF32) {
    return cat({cls.to(autocast.dtype), tokens}, 1);
  }
  return cat({cls, tokens}, 1);
}

// q [B, h, N, d] -> [B, h, N, keys]: the spatial queries' logits over the strided grid from the
// conv; with a class token the keys are [cls, grid] and the rows [cls query, patch queries].
Tensor ConvAttention::conv_logits(const Tensor& q) {
  const int64_t spatial = o_.grid_h * o_.grid_w;
  if (!o_.cls_token) return nn::conv_logits(q, *to_logits_, o_.grid_h, o_.grid_w);
  const TensorList parts = split(q, {1, spatial}, 2);  // one node for both (see forward)
  const Tensor &cls_q = parts[0], &patch_q = parts[1];
  const Tensor grid_logits = nn::conv_logits(patch_q, *to_logits_, o_.grid_h, o_.grid_w);
  const Tensor cls_column =
      cls_key_.defined() ? nn::static_key_logits(q, cls_key_) : nn::dot_logits(q, cls_q);
  const Tensor cls_row = nn::static_key_logits(cls_q, cls_query_keys_);
  return cat({cls_column, cat({cls_row, grid_logits}, 2)}, 3);
}

Tensor ConvAttention::forward(const Tensor& x) {
  const int64_t b = x.size(0), n = x.size(1), spatial = o_.grid_h * o_.grid_w;
  const int64_t cls = o_.cls_token ? 1 : 0;
  SKA_CHECK(x.dim() == 3 && n == spatial + cls && x.size(2) == o_.dim, ShapeError,
            "ConvAttention expects [B, ", spatial + cls, ", ", o_.dim, "], got ", x.str());
  // With a class token one split node (its backward concatenates the two gradients, where two
  // narrows would each zero-fill an x-sized gradient and add them up).
  const TensorList parts = cls ? split(x, {1, spatial}, 1) : TensorList{Tensor(), x};
  const Tensor& cls_tok = parts[0];
  const Tensor grid = parts[1].transpose(1, 2).reshape({b, o_.dim, o_.grid_h, o_.grid_w});
  // q on the full grid, k and v on the strided one (the class token joins each unchanged).
  const Tensor q = nn::split_heads((*proj_q_)(with_cls(cls_tok, (*conv_proj_q_)(grid))), o_.heads);
  const Tensor v = nn::split_heads((*proj_v_)(with_cls(cls_tok, (*conv_proj_v_)(grid))), o_.heads);
  nn::AttentionSpec spec;
  spec.scale = o_.scale ? 1.0 / std::sqrt(static_cast<double>(o_.dim)) : 1.0;  // CvT: full width
  Tensor out;
  if (o_.kind == nn::AttentionKind::kMhsa) {
    const Tensor k =
        nn::split_heads((*proj_k_)(with_cls(cls_tok, (*conv_proj_k_)(grid))), o_.heads);
    out = nn::attend_qk(q, k, v, spec);
  } else if (o_.kind == nn::AttentionKind::kSka) {
    out = nn::attend_qk(q, keys_, v, spec);  // static keys broadcast over the batch
  } else {
    out = nn::attend(conv_logits(q), v, spec);
  }
  return (*proj_)(nn::merge_heads(out));
}

namespace {

class CvtBlock : public ChainedBlock {
 public:
  CvtBlock(const ConvAttentionOptions& attn, int64_t mlp_hidden, double drop_path) {
    norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(attn.dim, 1e-5));
    attn_ = register_module("attn", std::make_shared<ConvAttention>(attn));
    drop_path_ = register_module("drop_path", std::make_shared<nn::DropPath>(drop_path));
    norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(attn.dim, 1e-5));
    nn::MlpOptions mlp;
    mlp.hidden = mlp_hidden;
    mlp.activation = "quick_gelu";
    mlp.init = nn::Init::kTruncNormal;
    mlp_ = register_module("mlp", std::make_shared<nn::Mlp>(attn.dim, mlp));
    norm2_->autocast_output = mlp_->reads_input_by_matmul_only();  // norm1 feeds convolutions
  }
  nn::LayerNorm& first_norm() override { return *norm1_; }
  // The drop paths multiply in the residual sums' own pass (scaled_residual).
  ResidualNorm forward_chained(const ResidualNorm& in, ChainedBlock* next) override {
    const nn::DroppedOperand attended = nn::dropped_operand(*drop_path_, (*attn_)(in.normed));
    const ResidualNorm y =
        norm2_->forward_residual(in.sum, attended.value, Tensor(), Tensor(), attended.keep);
    const nn::DroppedOperand branch = nn::dropped_operand(*drop_path_, (*mlp_)(y.normed));
    if (next != nullptr) {
      return next->first_norm().forward_residual(y.sum, branch.value, Tensor(), Tensor(),
                                                 branch.keep);
    }
    return {scaled_residual(y.sum, Tensor(), branch.value, Tensor(), branch.keep), Tensor()};
  }
  std::string type_name() const override { return "CvtBlock"; }

 private:
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<ConvAttention> attn_;
  std::shared_ptr<nn::DropPath> drop_path_;
  std::shared_ptr<nn::Mlp> mlp_;
};

// Conv2d(k, s, p, bias) then LayerNorm over the tokens: image [B, C_in, H, W] -> [B, HW, C].
class ConvEmbed : public nn::Module {
 public:
  ConvEmbed(int64_t in, int64_t dim, int64_t kernel, int64_t stride, int64_t padding) {
    nn::Conv2dOptions o;
    o.stride = stride;
    o.padding = padding;
    proj_ = register_module("proj", std::make_shared<nn::Conv2d>(in, dim, kernel, o));
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(dim, 1e-5));
  }
  Tensor forward(const Tensor& image) override {
    return (*norm_)((*proj_)(image).flatten(2).transpose(1, 2));
  }
  std::string type_name() const override { return "ConvEmbed"; }

 private:
  std::shared_ptr<nn::Conv2d> proj_;
  std::shared_ptr<nn::LayerNorm> norm_;
};

struct CvtStageOptions {
  int64_t in_dim = 0, kernel = 3, stride = 2, padding = 1, depth = 1, mlp_ratio = 4;
  double drop_path = 0.0;  // the rate of the stage's last block (linear ramp from 0)
  ConvAttentionOptions attn;
};

// image [B, C_in, H, W] -> tokens [B, N, C] (cls first in a cls stage).
class CvtStage : public nn::Module {
 public:
  explicit CvtStage(const CvtStageOptions& o) : o_(o) {
    const int64_t dim = o.attn.dim;
    embed_ = register_module(
        "embed", std::make_shared<ConvEmbed>(o.in_dim, dim, o.kernel, o.stride, o.padding));
    if (o.attn.cls_token)
      cls_token_ = register_parameter("cls_token", nn::init_trunc_normal({1, 1, dim}, 0.02));
    blocks_ = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int64_t i = 0; i < o.depth; ++i) {
      const double rate = o.depth > 1 ? o.drop_path * i / (o.depth - 1) : 0.0;
      blocks_->append(std::to_string(i),
                      std::make_shared<CvtBlock>(o.attn, o.mlp_ratio * dim, rate));
    }
  }
  Tensor forward(const Tensor& image) override {
    Tensor x = (*embed_)(image);
    if (cls_token_.defined()) x = cat({cls_token_.expand({x.size(0), 1, o_.attn.dim}), x}, 1);
    return run_block_chain(*blocks_, x);
  }
  // The spatial tokens of this stage's output as an image [B, C, H, W].
  Tensor to_image(const Tensor& tokens) const {
    const int64_t cls = cls_token_.defined() ? 1 : 0;
    return tokens.narrow(1, cls, o_.attn.grid_h * o_.attn.grid_w)
        .transpose(1, 2)
        .reshape({tokens.size(0), o_.attn.dim, o_.attn.grid_h, o_.attn.grid_w});
  }
  std::string type_name() const override { return "CvtStage"; }

 private:
  CvtStageOptions o_;
  std::shared_ptr<ConvEmbed> embed_;
  std::shared_ptr<nn::Sequential> blocks_;
  Tensor cls_token_;
};

class CvtModel : public nn::Module {
 public:
  CvtModel(const std::vector<CvtStageOptions>& stages, int64_t image_size, int64_t num_classes)
      : image_size_(image_size) {
    auto list = register_module("stages", std::make_shared<nn::Sequential>());
    for (size_t i = 0; i < stages.size(); ++i) {
      stages_.push_back(std::make_shared<CvtStage>(stages[i]));
      list->append(std::to_string(i), stages_.back());
    }
    const int64_t width = stages.back().attn.dim;
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(width, 1e-5));
    head_ = register_module("head", std::make_shared<nn::Linear>(width, num_classes));
    head_->weight.copy_(nn::init_trunc_normal(head_->weight.shape(), 0.02));  // as CvT's head
  }
  Tensor forward(const Tensor& image) override {  // [B, C, H, W] -> [B, classes]
    SKA_CHECK(image.dim() == 4 && image.size(2) == image_size_ && image.size(3) == image_size_,
              ShapeError, "CvT expects [B, C, ", image_size_, ", ", image_size_, "], got ",
              image.str());
    Tensor x = image, tokens;
    for (size_t i = 0; i < stages_.size(); ++i) {
      tokens = (*stages_[i])(x);
      if (i + 1 < stages_.size()) x = stages_[i]->to_image(tokens);
    }
    return (*head_)((*norm_)(tokens.select(1, 0)));  // the cls token
  }
  std::string type_name() const override { return "CvT"; }

 private:
  int64_t image_size_;
  std::vector<std::shared_ptr<CvtStage>> stages_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Linear> head_;
};

template <typename T>
std::vector<T> read_per_stage(const ConfigNode& cfg, const std::string& key,
                              std::vector<T> fallback, size_t stages, T lo, T hi) {
  std::vector<T> v = cfg.get<std::vector<T>>(key, fallback);
  if (stages && v.size() != stages)
    cfg.fail(key, "expected " + std::to_string(stages) + " values, one per stage");
  for (T x : v)
    if (x < lo || x > hi)
      cfg.fail(key, "value " + std::to_string(x) + " is out of range; expected " +
                        std::to_string(lo) + ".." + std::to_string(hi));
  return v;
}

}  // namespace

nn::ModulePtr build_cvt(const ConfigNode& cfg, const ModelInput& input) {
  const auto dims = read_per_stage<int64_t>(cfg, "dims", {64, 192, 384}, 0, 1, 1 << 16);
  const size_t n = dims.size();
  const auto heads = read_per_stage<int64_t>(cfg, "heads", {1, 3, 6}, n, 1, 1024);
  const auto depths = read_per_stage<int64_t>(cfg, "depths", {1, 2, 10}, n, 1, 1024);
  const auto kernels = read_per_stage<int64_t>(cfg, "kernels", {7, 3, 3}, n, 1, 31);
  const auto strides = read_per_stage<int64_t>(cfg, "strides", {4, 2, 2}, n, 1, 16);
  const auto paddings = read_per_stage<int64_t>(cfg, "paddings", {2, 1, 1}, n, 0, 15);
  const auto drop_path =
      read_per_stage<double>(cfg, "drop_path_rates", std::vector<double>(n, 0.0), n, 0.0, 1.0);
  const int64_t mlp_ratio = cfg.get_int_in("mlp_ratio", 4, 1, 64);
  const int64_t kv_stride = cfg.get_int_in("kv_stride", 2, 1, 16);
  const std::vector<StageMixer> mixers =
      read_stage_mixers(cfg, n, nn::attention_kind_names(), "mhsa");

  std::vector<CvtStageOptions> stages(n);
  int64_t grid = input.image_size, in_dim = input.in_channels;
  for (size_t i = 0; i < n; ++i) {
    grid = conv_out(grid, kernels[i], strides[i], paddings[i]);
    if (grid < 1) cfg.fail("kernels", "stage " + std::to_string(i) + " leaves no tokens");
    if (dims[i] % heads[i] != 0)
      cfg.fail("heads", "stage " + std::to_string(i) + ": width " + std::to_string(dims[i]) +
                            " is not divisible by " + std::to_string(heads[i]) + " heads");
    CvtStageOptions& s = stages[i];
    s.in_dim = in_dim;
    s.kernel = kernels[i], s.stride = strides[i], s.padding = paddings[i];
    s.depth = depths[i], s.mlp_ratio = mlp_ratio, s.drop_path = drop_path[i];
    ConvAttentionOptions& a = s.attn;
    a.kind = nn::attention_kind(mixers[i].type);
    a.dim = dims[i], a.heads = heads[i], a.grid_h = a.grid_w = grid;
    a.cls_token = i + 1 == n;  // CvT-13: class token in the last stage only
    a.kv_stride = kv_stride;
    a.scale = mixers[i].options.get<bool>("scale", true);
    if (a.kind == nn::AttentionKind::kCska && a.cls_token)
      a.cls_key = mixers[i].options.get_choice("cls_key", "query", {"query", "static"});
    in_dim = dims[i];
  }
  return std::make_shared<CvtModel>(stages, input.image_size, input.num_classes);
}

void register_cvt_family(Registry<FamilyBuilder>& r) { r.add("cvt", build_cvt); }

}  // namespace ska::models
