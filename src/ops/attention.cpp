// The fused attention op: shape checks, broadcast views, the output laid out like q, and the
// backward node that sums the gradients of broadcast inputs.
#include "ops/attention.h"

#include <utility>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/mac_counter.h"
#include "ops/pointwise.h"
#include "ops/reduce.h"

namespace ska {

namespace {

constexpr const char* kOp = "scaled_dot_attention";

// t with its rows as the kernels read them: a unit stride in the last dim and rows apart.
Tensor rows_readable(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const bool unit = cols <= 1 || t.stride(-1) == 1;
  const bool apart = rows <= 1 || t.stride(-2) >= cols;
  return unit && apart ? t : t.contiguous();
}

// t with `rank` dims (size-1 dims in front), broadcast to `lead` + its last two dims.
Tensor broadcast_leading(const char* name, const Tensor& t, int64_t rank, const Shape& lead,
                         int64_t rows, int64_t cols) {
  Shape shape = t.shape();
  SKA_CHECK(t.dim() >= 2 && t.dim() <= rank, ShapeError, kOp, ": ", name, " ", t.str(),
            " needs 2 to ", rank, " dims (q has ", rank, ")");
  Shape want = lead;
  want.push_back(rows);
  want.push_back(cols);
  shape.insert(shape.begin(), static_cast<size_t>(rank - t.dim()), 1);
  for (size_t i = 0; i < shape.size(); ++i) {
    SKA_CHECK(shape[i] == want[i] || shape[i] == 1, ShapeError, kOp, ": ", name, " ", t.str(),
              " does not broadcast to ", shape_str(want));
  }
  return detail::broadcast_raw(t.reshape(shape), want);
}

}  // namespace

Tensor scaled_dot_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            const Tensor& bias, const Tensor& scale_factor,
                            const Tensor& bias_factor) {
  if (auto cast = autocast_inputs(kOp, {q, k, v, bias})) {
    return scaled_dot_attention((*cast)[0], (*cast)[1], (*cast)[2], scale, (*cast)[3],
                                scale_factor, bias_factor);
  }
  detail::check_floating(kOp, q);
  detail::check_same_device_dtype(kOp, q, k);
  detail::check_same_device_dtype(kOp, q, v);
  if (bias.defined()) detail::check_same_device_dtype(kOp, q, bias);
  const int64_t rank = q.dim();
  SKA_CHECK(rank >= 3 && rank <= 6, ShapeError, kOp, ": q ", q.str(), " needs 3 to 6 dims");
  const int64_t nq = q.size(-2), d = q.size(-1);
  SKA_CHECK(k.dim() >= 2 && v.dim() >= 2 && k.size(-1) == d && v.size(-2) == k.size(-2), ShapeError,
            kOp, ": q ", q.str(), ", k ", k.str(), " and v ", v.str(),
            " do not fit: q and k need the same last dim, k and v the same number of keys");
  const int64_t nk = k.size(-2), dv = v.size(-1);
  const Shape lead(q.shape().begin(), q.shape().end() - 2);
  const DType factor_dtype = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  const auto needs_cast = [&](const Tensor& f) {
    return f.defined() && f.is_floating() && f.dtype() != factor_dtype;
  };
  if (needs_cast(scale_factor) || needs_cast(bias_factor)) {
    const auto cast = [&](const Tensor& f) { return needs_cast(f) ? f.to(factor_dtype) : f; };
    return scaled_dot_attention(q, k, v, scale, bias, cast(scale_factor), cast(bias_factor));
  }
  using Named = std::pair<const char*, const Tensor*>;
  for (const auto& [name, f] :
       {Named{"scale_factor", &scale_factor}, Named{"bias_factor", &bias_factor}}) {
    if (!f->defined()) continue;
    SKA_CHECK(f->numel() == 1 && f->dtype() == factor_dtype && f->device() == q.device(),
              ValueError, kOp, ": ", name, " must be one ", dtype_name(factor_dtype),
              " element on ", q.device(), " (for ", q.str(), "), got ", f->str());
  }
  SKA_CHECK(!bias_factor.defined() || bias.defined(), ValueError, kOp,
            ": a bias_factor needs a bias");
  const Tensor factor = scale_factor.defined() ? scale_factor.detach().contiguous() : Tensor();
  const Tensor bfactor = bias_factor.defined() ? bias_factor.detach().contiguous() : Tensor();

  const Tensor qv = rows_readable(q.detach());
  const Tensor kv = rows_readable(broadcast_leading("k", k.detach(), rank, lead, nk, d));
  const Tensor vv = rows_readable(broadcast_leading("v", v.detach(), rank, lead, nk, dv));
  const Tensor bv =
      bias.defined() ? broadcast_leading("bias", bias.detach(), rank, lead, nq, nk) : Tensor();
  Shape out_shape = lead;
  out_shape.push_back(nq);
  out_shape.push_back(dv);
  Shape lse_shape = lead;
  lse_shape.push_back(nq);
  const Tensor out = detail::empty_like_layout(out_shape, qv, q.dtype());
  const Tensor lse =
      Tensor::empty(lse_shape, q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32, q.device());
  SKA_KERNEL(q.device(), attention_forward)(qv, kv, vv, bv, scale, factor, bfactor, out, lse);
  MacCounter::add(shape_numel(lead) * nq * nk * (d + dv));

  const bool need_bias = bias.defined() && bias.requires_grad();
  const bool need_factor = scale_factor.defined() && scale_factor.requires_grad();
  const bool need_bfactor = bias_factor.defined() && bias_factor.requires_grad();
  const Shape k_shape = k.shape(), v_shape = v.shape();
  const Shape bias_shape = bias.defined() ? bias.shape() : Shape();
  const Tensor saved_out = out.detach();
  autograd::record_op(kOp, {q, k, v, bias, scale_factor, bias_factor}, {out},
                      [=](const TensorList& g) {
    const Tensor go = rows_readable(g[0]);
    const Device dev = qv.device();
    const DType dt = qv.dtype();
    Shape gk_shape = lead, gv_shape = lead, gb_shape = lead;
    gk_shape.insert(gk_shape.end(), {nk, d});
    gv_shape.insert(gv_shape.end(), {nk, dv});
    gb_shape.insert(gb_shape.end(), {nq, nk});
    const Tensor gq = Tensor::empty(qv.shape(), dt, dev);
    const Tensor gk = Tensor::empty(gk_shape, dt, dev);
    const Tensor gv = Tensor::empty(gv_shape, dt, dev);
    const Tensor gb = need_bias || need_bfactor ? Tensor::empty(gb_shape, dt, dev) : Tensor();
    SKA_KERNEL(dev, attention_backward)(qv, kv, vv, bv, saved_out, lse, go, scale, factor, bfactor,
                                        gq, gk, gv, gb);
    // The logits are linear in the factor f: dL/df = sum(dL/dz * z) / f = sum(dL/dq * q) / f
    // (products and sum in q's dtype, f32 accumulation).
    Tensor gf;
    if (need_factor) {
      gf = div(sum(mul(gq, qv)).to(factor_dtype), factor).reshape(scale_factor.shape());
    }
    // Likewise dL/dbias_factor = sum(dL/dbias * bias) / bias_factor.
    Tensor gbf;
    if (need_bfactor) {
      gbf = div(sum(mul(gb, bv)).to(factor_dtype), bfactor).reshape(bias_factor.shape());
    }
    return TensorList{gq, sum_to_shape(gk, k_shape), sum_to_shape(gv, v_shape),
                      need_bias ? sum_to_shape(gb, bias_shape) : Tensor(), gf, gbf};
  });
  return out;
}

Tensor softmax_attend(const Tensor& logits, const Tensor& v, const Tensor& factor) {
  SKA_CHECK(logits.dim() >= 3 && logits.dim() <= 6, ShapeError, "softmax_attend: logits ",
            logits.str(), " need 3 to 6 dims");
  // Queries and keys of head dim 0: the fused op's q k^T term vanishes, z = factor * logits.
  Shape q_shape = logits.shape();
  q_shape.back() = 0;
  const Tensor q = Tensor::empty(q_shape, logits.dtype(), logits.device());
  const Tensor k = Tensor::empty({logits.size(-1), 0}, logits.dtype(), logits.device());
  return scaled_dot_attention(q, k, v, 1.0, logits, Tensor(), factor);
}

}  // namespace ska
