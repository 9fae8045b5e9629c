// The `swin` family: patch merging by unfold + Linear, pre-norm blocks alternating regular and
// shifted window attention (mhsa / ska / cska keys), mean-pool head. Swin-T for CIFAR as the
// paper's authors ran it.
#include "models/swin.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "models/block_chain.h"
#include "models/stage_mixers.h"
#include "ops/ops.h"

namespace ska::models {
namespace {

// The additive masks of a window cyclically shifted by s: tokens that wrapped around from the
// other image edge must not attend to the rest (last window row / last window column).
Tensor upper_lower_mask(int64_t w, int64_t s) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<float> m(w * w * w * w, 0.f);
  const int64_t split = (w - s) * w;  // first flat index of the wrapped rows
  for (int64_t i = 0; i < w * w; ++i)
    for (int64_t j = 0; j < w * w; ++j)
      if ((i >= split) != (j >= split)) m[i * w * w + j] = -inf;
  return Tensor::from_vector(m, {w * w, w * w});
}

Tensor left_right_mask(int64_t w, int64_t s) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<float> m(w * w * w * w, 0.f);
  for (int64_t i = 0; i < w * w; ++i)
    for (int64_t j = 0; j < w * w; ++j)
      if ((i % w >= w - s) != (j % w >= w - s)) m[i * w * w + j] = -inf;
  return Tensor::from_vector(m, {w * w, w * w});
}

// Flat index into the (2w-1)^2 table for every (query, key) pair of a window.
Tensor relative_position_index(int64_t w) {
  std::vector<int64_t> index;
  for (int64_t i = 0; i < w * w; ++i)
    for (int64_t j = 0; j < w * w; ++j) {
      const int64_t dy = j / w - i / w + w - 1, dx = j % w - i % w + w - 1;
      index.push_back(dy * (2 * w - 1) + dx);
    }
  return Tensor::from_vector(index, {w * w * w * w});
}

// [nw, 1, 1] u8 marking the windows of the last window row (rows) or last column (!rows).
Tensor edge_windows(int64_t nw_h, int64_t nw_w, bool rows) {
  std::vector<uint8_t> sel(nw_h * nw_w, 0);
  for (int64_t i = 0; i < nw_h * nw_w; ++i)
    sel[i] = rows ? (i / nw_w == nw_h - 1) : (i % nw_w == nw_w - 1);
  return Tensor::from_vector(sel, {nw_h * nw_w, 1, 1});
}

}  // namespace

WindowAttention::WindowAttention(const WindowAttentionOptions& options) : o_(options) {
  const int64_t w = o_.window, inner = o_.heads * o_.head_dim;
  SKA_CHECK(o_.grid_h % w == 0 && o_.grid_w % w == 0, ShapeError, "WindowAttention: grid ",
            o_.grid_h, "x", o_.grid_w, " is not a multiple of the window ", w);
  n_windows_ = (o_.grid_h / w) * (o_.grid_w / w);
  if (o_.kind == nn::AttentionKind::kMhsa) {
    to_qkv_ = register_module("to_qkv", std::make_shared<nn::Linear>(o_.dim, 3 * inner, false));
  } else {
    to_qv_ = register_module("to_qv", std::make_shared<nn::Linear>(o_.dim, 2 * inner, false));
  }
  if (o_.kind == nn::AttentionKind::kSka)
    keys_ = register_parameter("keys",
                               nn::init_static_keys({o_.heads, n_windows_, w * w, o_.head_dim}));
  if (o_.kind == nn::AttentionKind::kCska) {
    // One d -> d conv per (head, window): its own weights for every window position.
    const int64_t groups = o_.heads * n_windows_;
    nn::Conv2dOptions conv;
    conv.padding = 1;
    conv.groups = groups;
    to_k_ = register_module(
        "to_k", std::make_shared<nn::Conv2d>(groups * o_.head_dim, groups * o_.head_dim, 3, conv));
  }
  pos_embedding_ =
      register_parameter("pos_embedding", nn::init_normal({2 * w - 1, 2 * w - 1}, 0.0, 1.0));
  if (o_.shifted) {
    upper_lower_mask_ = register_parameter("upper_lower_mask", upper_lower_mask(w, w / 2), false);
    left_right_mask_ = register_parameter("left_right_mask", left_right_mask(w, w / 2), false);
  }
  to_out_ = register_module("to_out", std::make_shared<nn::Linear>(inner, o_.dim));
  relative_index_ = relative_position_index(w);
  last_row_ = edge_windows(o_.grid_h / w, o_.grid_w / w, true);
  last_col_ = edge_windows(o_.grid_h / w, o_.grid_w / w, false);
}

std::string WindowAttention::type_name() const {
  const std::string kind = o_.kind == nn::AttentionKind::kMhsa  ? ""
                           : o_.kind == nn::AttentionKind::kSka ? "SKA-"
                                                                : "CSKA-";
  return kind + (o_.shifted ? "ShiftedWindowAttention" : "WindowAttention");
}

Tensor WindowAttention::to_windows(const Tensor& t) const {
  const int64_t b = t.size(0), w = o_.window, d = o_.head_dim;
  return t.reshape({b, o_.grid_h / w, w, o_.grid_w / w, w, o_.heads, d})
      .permute({0, 5, 1, 3, 2, 4, 6})
      .reshape({b, o_.heads, n_windows_, w * w, d});
}

Tensor WindowAttention::from_windows(const Tensor& t) const {
  const int64_t b = t.size(0), w = o_.window, d = o_.head_dim;
  return t.reshape({b, o_.heads, o_.grid_h / w, o_.grid_w / w, w, w, d})
      .permute({0, 2, 4, 3, 5, 1, 6})
      .reshape({b, o_.grid_h, o_.grid_w, o_.heads * d});
}

Tensor WindowAttention::conv_keys(const Tensor& q) {
  const int64_t b = q.size(0), w = o_.window, d = o_.head_dim;
  // Each window's queries as a w x w image with channels (head, window, d).
  Tensor image = q.transpose(-1, -2).reshape({b, o_.heads * n_windows_ * d, w, w});
  Tensor k = (*to_k_)(image).reshape({b, o_.heads, n_windows_, d, w * w});
  return k.transpose(-1, -2);
}

void WindowAttention::place_constants(Device device) {
  if (relative_index_.device() == device) return;
  relative_index_ = relative_index_.to(device);
  last_row_ = last_row_.to(device);
  last_col_ = last_col_.to(device);
}

Tensor WindowAttention::window_bias(const Tensor& like) {
  const int64_t ww = o_.window * o_.window;
  Tensor bias = index_select(pos_embedding_.reshape({-1}), 0, relative_index_).reshape({ww, ww});
  if (!o_.shifted) return bias;
  // where() rather than a product: 0 * -inf would be NaN for the windows a mask skips.
  Tensor zero = Tensor::zeros({1}, like.dtype(), like.device());
  bias = bias + where(last_row_, upper_lower_mask_, zero);
  return bias + where(last_col_, left_right_mask_, zero);
}

Tensor WindowAttention::forward(const Tensor& input) {
  SKA_CHECK(input.dim() == 4 && input.size(1) == o_.grid_h && input.size(2) == o_.grid_w,
            ShapeError, "WindowAttention expects [B, ", o_.grid_h, ", ", o_.grid_w, ", C], got ",
            input.str());
  place_constants(input.device());
  const int64_t s = o_.window / 2;
  Tensor x = o_.shifted ? roll(input, {-s, -s}, {1, 2}) : input;
  Tensor q, k, v;
  if (to_qkv_) {
    TensorList qkv = chunk((*to_qkv_)(x), 3, -1);
    q = to_windows(qkv[0]), k = to_windows(qkv[1]), v = to_windows(qkv[2]);
  } else {
    TensorList qv = chunk((*to_qv_)(x), 2, -1);
    q = to_windows(qv[0]), v = to_windows(qv[1]);
    k = to_k_ ? conv_keys(q) : keys_;  // static keys broadcast over the batch
  }
  nn::AttentionSpec spec;  // q, k, v: [B, h, nw, w*w, d]; the bias broadcasts over B and h
  spec.scale = o_.scale ? 1.0 / std::sqrt(static_cast<double>(o_.head_dim)) : 1.0;
  spec.bias = window_bias(q);
  spec.windows = {o_.grid_h, o_.grid_w, o_.window, o_.shifted ? s : 0};
  Tensor out = (*to_out_)(from_windows(nn::attend_qk(q, k, v, spec)));
  return o_.shifted ? roll(out, {s, s}, {1, 2}) : out;
}

namespace {

// Pre-norm residual block on [B, H, W, C]: window attention, then an MLP (4C, GELU).
class SwinBlock : public ChainedBlock {
 public:
  SwinBlock(const WindowAttentionOptions& attn, int64_t mlp_hidden) {
    norm1_ = register_module("norm1", std::make_shared<nn::LayerNorm>(attn.dim));
    attn_ = register_module("attn", std::make_shared<WindowAttention>(attn));
    norm2_ = register_module("norm2", std::make_shared<nn::LayerNorm>(attn.dim));
    nn::MlpOptions mlp;
    mlp.hidden = mlp_hidden;
    mlp.activation = "gelu";
    mlp_ = register_module("mlp", std::make_shared<nn::Mlp>(attn.dim, mlp));
    norm1_->autocast_output = attn_->reads_input_by_matmul_only();
    norm2_->autocast_output = mlp_->reads_input_by_matmul_only();
  }
  nn::LayerNorm& first_norm() override { return *norm1_; }
  ResidualNorm forward_chained(const ResidualNorm& in, ChainedBlock* next) override {
    const ResidualNorm y = norm2_->forward_residual(in.sum, (*attn_)(in.normed));
    const Tensor branch = (*mlp_)(y.normed);
    if (next != nullptr) return next->first_norm().forward_residual(y.sum, branch);
    return {y.sum + branch, Tensor()};
  }
  std::string type_name() const override { return "SwinBlock"; }

 private:
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<WindowAttention> attn_;
  std::shared_ptr<nn::Mlp> mlp_;
};

struct SwinStageOptions {
  int64_t in_dim = 0, dim = 0, depth = 2, factor = 2, mlp_ratio = 4;
  WindowAttentionOptions attn;  // grid = the stage's grid after merging
};

// Patch merging (nn.Unfold's (c, ki, kj) order, then Linear) and the blocks, channels last.
class SwinStage : public nn::Module {
 public:
  explicit SwinStage(const SwinStageOptions& o) : factor_(o.factor) {
    patch_merge_ = register_module(
        "patch_merge", std::make_shared<nn::Linear>(o.in_dim * o.factor * o.factor, o.dim));
    auto blocks = register_module("blocks", std::make_shared<nn::Sequential>());
    for (int64_t i = 0; i < o.depth; ++i) {
      WindowAttentionOptions attn = o.attn;
      attn.shifted = i % 2 == 1;
      blocks->append(std::to_string(i), std::make_shared<SwinBlock>(attn, o.mlp_ratio * o.dim));
    }
    blocks_ = blocks;
  }
  Tensor forward(const Tensor& x) override {  // [B, H, W, C_in] -> [B, H/f, W/f, C]
    const int64_t b = x.size(0), h = x.size(1) / factor_, w = x.size(2) / factor_, c = x.size(3);
    Tensor patches = x.reshape({b, h, factor_, w, factor_, c})
                         .permute({0, 1, 3, 5, 2, 4})
                         .reshape({b, h, w, c * factor_ * factor_});
    return run_block_chain(*blocks_, (*patch_merge_)(patches));
  }
  std::string type_name() const override { return "SwinStage"; }

 private:
  int64_t factor_;
  std::shared_ptr<nn::Linear> patch_merge_;
  std::shared_ptr<nn::Sequential> blocks_;
};

class SwinModel : public nn::Module {
 public:
  SwinModel(const std::vector<SwinStageOptions>& stages, int64_t image_size, int64_t num_classes)
      : image_size_(image_size) {
    auto list = register_module("stages", std::make_shared<nn::Sequential>());
    for (size_t i = 0; i < stages.size(); ++i)
      list->append(std::to_string(i), std::make_shared<SwinStage>(stages[i]));
    stages_ = list;
    const int64_t width = stages.back().dim;
    head_norm_ = register_module("head_norm", std::make_shared<nn::LayerNorm>(width));
    head_ = register_module("head", std::make_shared<nn::Linear>(width, num_classes));
  }
  Tensor forward(const Tensor& image) override {  // [B, C, H, W] -> [B, classes]
    SKA_CHECK(image.dim() == 4 && image.size(2) == image_size_ && image.size(3) == image_size_,
              ShapeError, "Swin expects [B, C, ", image_size_, ", ", image_size_, "], got ",
              image.str());
    Tensor x = (*stages_)(image.permute({0, 2, 3, 1}));
    return (*head_)((*head_norm_)(mean(x, {1, 2})));
  }
  std::string type_name() const override { return "Swin"; }

 private:
  int64_t image_size_;
  std::shared_ptr<nn::Sequential> stages_;
  std::shared_ptr<nn::LayerNorm> head_norm_;
  std::shared_ptr<nn::Linear> head_;
};

std::vector<int64_t> read_stage_list(const ConfigNode& cfg, const std::string& key,
                                     std::vector<int64_t> fallback, size_t stages, int64_t lo,
                                     int64_t hi) {
  std::vector<int64_t> v = cfg.get<std::vector<int64_t>>(key, fallback);
  if (stages && v.size() != stages)
    cfg.fail(key, "expected " + std::to_string(stages) + " values, one per stage");
  for (int64_t x : v)
    if (x < lo || x > hi)
      cfg.fail(key, "value " + std::to_string(x) + " is out of range; expected " +
                        std::to_string(lo) + ".." + std::to_string(hi));
  return v;
}

}  // namespace

nn::ModulePtr build_swin(const ConfigNode& cfg, const ModelInput& input) {
  const int64_t hidden = cfg.get_int_in("hidden_dim", 96, 1, 1 << 16);
  const std::vector<int64_t> depths = read_stage_list(cfg, "depths", {2, 2, 6, 2}, 0, 1, 1024);
  const size_t n = depths.size();
  const std::vector<int64_t> heads = read_stage_list(cfg, "heads", {3, 6, 12, 24}, n, 1, 1024);
  const std::vector<int64_t> factors =
      read_stage_list(cfg, "downscaling_factors", {2, 2, 2, 1}, n, 1, 64);
  const int64_t head_dim = cfg.get_int_in("head_dim", 32, 1, 4096);
  const int64_t window = cfg.get_int_in("window_size", 4, 2, 256);
  const int64_t mlp_ratio = cfg.get_int_in("mlp_ratio", 4, 1, 64);
  const std::vector<StageMixer> mixers =
      read_stage_mixers(cfg, n, nn::attention_kind_names(), "mhsa");

  std::vector<SwinStageOptions> stages(n);
  int64_t grid = input.image_size, in_dim = input.in_channels;
  for (size_t i = 0; i < n; ++i) {
    if (grid % factors[i] != 0 || (grid / factors[i]) % window != 0)
      cfg.fail("downscaling_factors", "stage " + std::to_string(i) + ": a " + std::to_string(grid) +
                                          " grid downscaled by " + std::to_string(factors[i]) +
                                          " is not a multiple of window_size " +
                                          std::to_string(window));
    grid /= factors[i];
    SwinStageOptions& s = stages[i];
    s.in_dim = in_dim;
    s.dim = hidden << i;
    s.depth = depths[i];
    s.factor = factors[i];
    s.mlp_ratio = mlp_ratio;
    s.attn.kind = nn::attention_kind(mixers[i].type);
    s.attn.scale = mixers[i].options.get<bool>("scale", true);
    s.attn.dim = s.dim;
    s.attn.heads = heads[i];
    s.attn.head_dim = head_dim;
    s.attn.window = window;
    s.attn.grid_h = s.attn.grid_w = grid;
    in_dim = s.dim;
  }
  return std::make_shared<SwinModel>(stages, input.image_size, input.num_classes);
}

void register_swin_family(Registry<FamilyBuilder>& r) { r.add("swin", build_swin); }

}  // namespace ska::models
