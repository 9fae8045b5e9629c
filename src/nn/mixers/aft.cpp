// AFT token mixers: Q/K/V projections, the position-biased exp(K) weighting of V computed with
// shifted exponents (no overflow), sigmoid(Q) gating, output projection; and their registration.
#include "nn/mixers/aft.h"

#include <cstdint>
#include <string>
#include <vector>

#include "nn/constants.h"
#include "ops/ops.h"

namespace ska::nn {

namespace {

const char* aft_name(AftKind kind) {
  switch (kind) {
    case AftKind::kSimple:
      return "aft_simple";
    case AftKind::kLocal:
      return "aft_local";
    case AftKind::kConv:
      return "aft_conv";
    default:
      return "aft_full";
  }
}

// std of eq. 8 is taken as sqrt(var + eps) so a constant kernel cannot divide by zero.
constexpr double kKernelStdEps = 1e-5;

}  // namespace

Aft::Aft(const AftOptions& o) : options_(o) {
  const int64_t c = o.dim, t = o.grid.tokens();
  SKA_CHECK(c > 0 && t > 0, ValueError, aft_name(o.kind), ": needs a width and a token grid");
  to_q_ = register_module("to_q", std::make_shared<Linear>(c, c, o.qkv_bias, o.init));
  const int64_t k_width = o.kind == AftKind::kConv ? o.heads : c;
  to_k_ = register_module("to_k", std::make_shared<Linear>(c, k_width, o.qkv_bias, o.init));
  to_v_ = register_module("to_v", std::make_shared<Linear>(c, c, o.qkv_bias, o.init));
  proj_ = register_module("proj", std::make_shared<Linear>(c, c, true, o.init));
  if (o.kind == AftKind::kFull || o.kind == AftKind::kLocal) {
    // The paper's N(0, 10^-2) read as variance 1e-2 (std 0.1).
    pos_u_ = register_parameter("pos_u", init_normal({t, o.factor_dim}, 0.0, 0.1));
    pos_v_ = register_parameter("pos_v", init_normal({t, o.factor_dim}, 0.0, 0.1));
  } else if (o.kind == AftKind::kConv) {
    SKA_CHECK(o.heads > 0 && c % o.heads == 0, ValueError, "aft_conv: heads ", o.heads,
              " must divide the width ", c);
    SKA_CHECK(o.kernel > 0 && o.kernel % 2 == 1, ValueError, "aft_conv: kernel ", o.kernel,
              " must be odd");
    pos_kernel_ =
        register_parameter("pos_kernel", init_normal({o.heads, o.kernel, o.kernel}, 0, 1));
    // gamma = beta = 0: w starts at 0 and the mixer at aft_simple.
    pos_gain_ = register_parameter("pos_gain", Tensor::zeros({o.heads}));
    pos_shift_ = register_parameter("pos_shift", Tensor::zeros({o.heads}));
  }
}

std::string Aft::type_name() const { return aft_name(options_.kind); }

Tensor Aft::forward(const Tensor& x) {
  SKA_CHECK(x.dim() == 3 && x.size(1) == options_.grid.tokens() && x.size(2) == options_.dim,
            ShapeError, type_name(), ": expected [B, ", options_.grid.tokens(), ", ", options_.dim,
            "], got ", shape_str(x.shape()));
  const Tensor k = (*to_k_)(x), v = (*to_v_)(x);
  Tensor mixed;
  switch (options_.kind) {
    case AftKind::kSimple:
      mixed = mix_simple(k, v);
      break;
    case AftKind::kConv:
      mixed = mix_conv(k, v);
      break;
    default:
      mixed = mix_with_pair_biases(k, v);
      break;
  }
  return (*proj_)(mul(sigmoid((*to_q_)(x)), mixed));
}

// 1 where local's w is dropped: spatial pairs at least `window` apart along a grid axis. The
// class token has no position, so its pairs keep their biases.
Tensor Aft::outside_window_mask(Device device) const {
  const TokenGrid& g = options_.grid;
  const int64_t t = g.tokens(), first = g.cls_token ? 1 : 0;
  const std::string key = "aft_outside_window " + std::to_string(g.height) + "x" +
                          std::to_string(g.width) + (g.cls_token ? "+cls" : "") + " window " +
                          std::to_string(options_.window);
  return device_constant(key, device, [&] {
    std::vector<uint8_t> mask(t * t, 0);
    for (int64_t i = first; i < t; ++i) {
      for (int64_t j = first; j < t; ++j) {
        const int64_t dr = (i - first) / g.width - (j - first) / g.width;
        const int64_t dc = (i - first) % g.width - (j - first) % g.width;
        mask[i * t + j] = std::abs(dr) >= options_.window || std::abs(dc) >= options_.window;
      }
    }
    return Tensor::from_vector(mask, {t, t});
  });
}

Tensor Aft::pair_biases() const {
  SKA_CHECK(pos_u_.defined(), ValueError, type_name(), " has no pair biases");
  const Tensor w = matmul(pos_u_, pos_v_.transpose(0, 1));
  if (options_.kind != AftKind::kLocal) return w;
  return masked_fill(w, outside_window_mask(w.device()), 0.0);
}

// sum_t' exp(K_t' + w_tt') V_t' / sum_t' exp(K_t' + w_tt'), with exp(K + w) split as
// exp(w - max_t' w) exp(K - max_t' K): the shifts cancel in the ratio and keep exp <= 1.
Tensor Aft::mix_with_pair_biases(const Tensor& k, const Tensor& v) const {
  const Tensor w = pair_biases();
  const Tensor exp_w = exp(sub(w, amax(w, {1}, true).detach()));  // [T, T]
  const Tensor exp_k = exp(sub(k, amax(k, {1}, true).detach()));  // [B, T, C]
  return div(matmul(exp_w, mul(exp_k, v)), matmul(exp_w, exp_k));
}

// w = 0: softmax over the tokens of each K channel, then a weighted sum of V (eq. 5).
Tensor Aft::mix_simple(const Tensor& k, const Tensor& v) const {
  const Tensor weights = softmax(k.transpose(1, 2)).transpose(1, 2);  // [B, T, C]
  return sum(mul(weights, v), {1}, true);
}

// eq. 8 per head: gamma * (w - mean) / std + beta over the k x k kernel.
Tensor Aft::conv_kernels() const {
  SKA_CHECK(pos_kernel_.defined(), ValueError, type_name(), " has no conv kernels");
  const int64_t h = options_.heads;
  const Tensor centred = sub(pos_kernel_, mean(pos_kernel_, {1, 2}, true));
  const Tensor std = sqrt(add(mean(mul(centred, centred), {1, 2}, true), kKernelStdEps));
  return add(mul(pos_gain_.reshape({h, 1, 1}), div(centred, std)), pos_shift_.reshape({h, 1, 1}));
}

// eq. 6 in 2-D: the global sums plus depthwise convs with exp(w) - 1 (w = 0 outside the kernel,
// so every token stays connected). The class token takes the global sums only.
Tensor Aft::mix_conv(const Tensor& k, const Tensor& v) const {
  const TokenGrid& g = options_.grid;
  const int64_t b = k.size(0), t = k.size(1), h = options_.heads, d = options_.dim / h;
  const int64_t ks = options_.kernel, first = g.cls_token ? 1 : 0, n = g.height * g.width;
  const Tensor exp_k = exp(sub(k, amax(k, {1}, true).detach()));           // [B, T, h]
  const Tensor exp_kv = mul(exp_k.unsqueeze(3), v.reshape({b, t, h, d}));  // [B, T, h, d]
  const Tensor kernel = sub(exp(conv_kernels()), 1.0).unsqueeze(1);        // [h, 1, k, k]
  const Tensor channel_kernel =
      kernel.unsqueeze(1).expand({h, d, 1, ks, ks}).reshape({h * d, 1, ks, ks});
  auto local = [&](const Tensor& tokens, const Tensor& weight) {  // [B, T, ch] -> [B, T, ch]
    const int64_t ch = tokens.size(2);
    const Tensor image =
        tokens.narrow(1, first, n).transpose(1, 2).reshape({b, ch, g.height, g.width});
    Tensor out = conv2d(image, weight, Tensor(), 1, ks / 2, 1, ch).reshape({b, ch, n});
    out = out.transpose(1, 2);
    return first ? cat({Tensor::zeros({b, 1, ch}, out.dtype(), out.device()), out}, 1) : out;
  };
  const Tensor flat_kv = exp_kv.reshape({b, t, h * d});
  const Tensor num = add(local(flat_kv, channel_kernel), sum(flat_kv, {1}, true));
  const Tensor den = add(local(exp_k, kernel), sum(exp_k, {1}, true));  // [B, T, h]
  return div(num.reshape({b, t, h, d}), den.unsqueeze(3)).reshape({b, t, h * d});
}

namespace {

MixerBuilder aft_builder(AftKind kind) {
  return [kind](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    AftOptions o;
    o.kind = kind;
    o.dim = args.dim;
    o.grid = args.grid;
    o.init = args.init;
    o.qkv_bias = cfg.get<bool>("qkv_bias", true);
    if (kind == AftKind::kFull || kind == AftKind::kLocal) {
      o.factor_dim = cfg.get_int_in("factor_dim", o.factor_dim, 1, 1 << 16);
    }
    if (kind == AftKind::kLocal) o.window = cfg.get_int_in("window", o.window, 0, 1 << 16);
    if (kind == AftKind::kConv) {
      const int64_t default_heads =
          args.heads > 0 ? args.heads : (args.dim % 32 == 0 ? args.dim / 32 : 1);
      o.heads = cfg.get_int_in("heads", default_heads, 1, args.dim);
      if (args.dim % o.heads != 0)
        cfg.fail("heads", "must divide the width " + std::to_string(args.dim));
      o.kernel = cfg.get_int_in("kernel", o.kernel, 1, 255);
      if (o.kernel % 2 == 0) cfg.fail("kernel", "must be odd");
    }
    return std::make_shared<Aft>(o);
  };
}

}  // namespace

void register_aft_mixers(Registry<MixerBuilder>& r) {
  r.add("aft_full", aft_builder(AftKind::kFull));
  r.add("aft_simple", aft_builder(AftKind::kSimple));
  r.add("aft_local", aft_builder(AftKind::kLocal));
  r.add("aft_conv", aft_builder(AftKind::kConv));
}

}  // namespace ska::nn
