// SRA token mixer (PVT, seed 004): multi-head attention whose keys and values come from a
// spatially reduced copy of the tokens; and its registration as `sra`.
#include "nn/mixers/sra.h"

#include <cmath>
#include <cstdint>

#include "nn/mixers/attention_core.h"
#include "ops/ops.h"

namespace ska::nn {

Sra::Sra(const SraOptions& o) : options_(o) {
  const int64_t c = o.dim, a = o.heads * o.head_dim;
  SKA_CHECK(c > 0 && a > 0 && o.sr > 0 && o.grid.height > 0 && o.grid.width > 0, ValueError,
            "sra: needs a width, heads, head_dim, sr >= 1 and a token grid");
  SKA_CHECK(o.sr <= o.grid.height && o.sr <= o.grid.width, ValueError, "sra: sr ", o.sr,
            " exceeds the ", o.grid.height, "x", o.grid.width, " token grid");
  q_ = register_module("q", std::make_shared<Linear>(c, a, o.qkv_bias, o.init));
  kv_ = register_module("kv", std::make_shared<Linear>(c, 2 * a, o.qkv_bias, o.init));
  if (o.sr > 1) {
    Conv2dOptions conv;
    conv.stride = o.sr;
    conv.init = o.init;
    sr_ = register_module("sr", std::make_shared<Conv2d>(c, c, o.sr, conv));
    norm_ = register_module("norm", std::make_shared<LayerNorm>(c, 1e-5));
  }
  proj_ = register_module("proj", std::make_shared<Linear>(a, c, true, o.init));
}

// The key/value tokens: [cls,] LayerNorm(Conv2d(grid)) flattened row-major; x itself if sr = 1.
Tensor Sra::reduce_context(const Tensor& x) {
  if (!sr_) return x;
  const TokenGrid& g = options_.grid;
  const int64_t b = x.size(0), c = x.size(2), first = g.cls_token ? 1 : 0;
  const Tensor image =
      x.narrow(1, first, g.height * g.width).transpose(1, 2).reshape({b, c, g.height, g.width});
  const Tensor reduced = (*sr_)(image);
  Tensor tokens = reduced.reshape({b, c, reduced.size(2) * reduced.size(3)}).transpose(1, 2);
  if (first) tokens = cat({x.narrow(1, 0, 1), tokens}, 1);
  return (*norm_)(tokens);
}

Tensor Sra::forward(const Tensor& x) {
  const int64_t h = options_.heads, d = options_.head_dim;
  SKA_CHECK(x.dim() == 3 && x.size(1) == options_.grid.tokens() && x.size(2) == options_.dim,
            ShapeError, "sra: expected [B, ", options_.grid.tokens(), ", ", options_.dim, "], got ",
            shape_str(x.shape()));
  const int64_t b = x.size(0), n = x.size(1);
  const Tensor q = (*q_)(x).reshape({b, n, h, d}).permute({0, 2, 1, 3});
  const Tensor kv = (*kv_)(reduce_context(x));
  const int64_t m = kv.size(1);
  const TensorList kv_heads =
      unbind(kv.reshape({b, m, 2, h, d}).permute({2, 0, 3, 1, 4}), 0);  // 2 x [B, h, M, d]
  AttentionSpec spec;
  spec.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const Tensor out = merge_heads(attend(dot_logits(q, kv_heads[0]), kv_heads[1], spec));
  return (*proj_)(out);
}

namespace {

// heads and head_dim (YAML, else the family's hints): either may be given; the other is derived
// so that heads * head_dim = C (with neither, head_dim = min(32, C)).
void read_heads(const ConfigNode& cfg, const MixerArgs& args, SraOptions& o) {
  const int64_t dim = args.dim;
  o.heads = cfg.get_int_in("heads", args.heads, 0, dim);
  o.head_dim = cfg.get_int_in("head_dim", args.head_dim, 0, 1 << 16);
  if (o.heads == 0 && o.head_dim == 0) o.head_dim = std::min<int64_t>(32, dim);
  const std::string key = o.heads == 0 ? "head_dim" : "heads";
  const int64_t given = o.heads == 0 ? o.head_dim : o.heads;
  if (o.heads == 0 || o.head_dim == 0) {
    if (dim % given != 0) cfg.fail(key, "must divide the width " + std::to_string(dim));
    (o.heads == 0 ? o.heads : o.head_dim) = dim / given;
  }
}

}  // namespace

void register_sra_mixer(Registry<MixerBuilder>& r) {
  r.add("sra", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    SraOptions o;
    o.dim = args.dim;
    o.grid = args.grid;
    o.init = args.init;
    read_heads(cfg, args, o);
    const int64_t side = std::max<int64_t>(1, std::min(args.grid.height, args.grid.width));
    o.sr = cfg.get_int_in("sr", std::min<int64_t>(2, side), 1, side);
    o.qkv_bias = cfg.get<bool>("qkv_bias", true);
    return std::make_shared<Sra>(o);
  });
}

}  // namespace ska::nn
