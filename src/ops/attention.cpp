// The fused attention ops: shape checks, broadcast views, the output laid out like q, and the
// backward nodes: scaled_dot_attention's sums the gradients of broadcast inputs, qkv_attention's
// writes the packed projection's gradient in place.
#include "ops/attention.h"

#include <utility>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "backend/talking_heads_geometry.h"
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
Tensor broadcast_leading(const char* op, const char* name, const Tensor& t, int64_t rank,
                         const Shape& lead, int64_t rows, int64_t cols) {
  Shape shape = t.shape();
  SKA_CHECK(t.dim() >= 2 && t.dim() <= rank, ShapeError, op, ": ", name, " ", t.str(),
            " needs 2 to ", rank, " dims (q has ", rank, ")");
  Shape want = lead;
  want.push_back(rows);
  want.push_back(cols);
  shape.insert(shape.begin(), static_cast<size_t>(rank - t.dim()), 1);
  for (size_t i = 0; i < shape.size(); ++i) {
    SKA_CHECK(shape[i] == want[i] || shape[i] == 1, ShapeError, op, ": ", name, " ", t.str(),
              " does not broadcast to ", shape_str(want));
  }
  return detail::broadcast_raw(t.reshape(shape), want);
}

// The dtype of the scale and bias factors for q: f32, f64 for f64 q.
DType factor_dtype_of(const Tensor& q) {
  return q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
}

// Whether `f` is a floating factor the op must first cast to `want`.
bool needs_cast(const Tensor& f, DType want) {
  return f.defined() && f.is_floating() && f.dtype() != want;
}

// ValueError unless each defined factor is one element of `want` on q's device.
void check_factors(const char* op, const Tensor& q, DType want, const Tensor& scale_factor,
                   const Tensor& bias_factor) {
  using Named = std::pair<const char*, const Tensor*>;
  for (const auto& [name, f] :
       {Named{"scale_factor", &scale_factor}, Named{"bias_factor", &bias_factor}}) {
    if (!f->defined()) continue;
    SKA_CHECK(f->numel() == 1 && f->dtype() == want && f->device() == q.device(), ValueError, op,
              ": ", name, " must be one ", dtype_name(want), " element on ", q.device(), " (for ",
              q.str(), "), got ", f->str());
  }
}

// Whether t is broadcast along some dim (a zero stride over more than one element).
bool broadcast_somewhere(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  }
  return false;
}

// The tensor whose dims' order the output takes: q, or v where q has head dim 0 (softmax_attend:
// the logits given; q's strides then carry no order) and v is not broadcast, so that heads split
// from a token-major projection come back token-major and merge without a copy.
const Tensor& output_layout(const Tensor& qv, const Tensor& vv) {
  return qv.size(-1) == 0 && !broadcast_somewhere(vv) ? vv : qv;
}

// An input's gradient of `shape`: in the input's order of dims where it is not broadcast (heads
// split from a token-major projection get a token-major gradient, which goes back through the
// split as a view), contiguous where it is (the op sums it after).
Tensor empty_grad_like(const Shape& shape, const Tensor& input) {
  if (broadcast_somewhere(input)) return Tensor::empty(shape, input.dtype(), input.device());
  return detail::empty_like_layout(shape, input, input.dtype());
}

// The gradient of the op's input `input_nr` (of `input_shape`) as the kernel writes it
// ([L..., rows, cols] of `shape`): where they agree (no broadcast to sum after), in the tensor
// the input's node offers (the piece of a head split the projection's gradient is put together
// in: no copy there), else empty_grad_like's.
Tensor grad_tensor(size_t input_nr, const Shape& input_shape, const Shape& shape,
                   const Tensor& input) {
  if (input_shape == shape) {
    const Tensor d = autograd::grad_destination(
        input_nr, shape, input.dtype(), input.device(),
        [](const Tensor& t) { return t.size(-1) <= 1 || t.stride(-1) == 1; });
    if (d.defined()) return d;
  }
  return empty_grad_like(shape, input);
}

// The forward kernel on prepared views (qv, kv, vv rows readable, all with q's leading dims;
// bv broadcast): the output laid out like output_layout(qv, vv) and each row's log-sum-exp.
// Counts the MACs.
struct Forward {
  Tensor out, lse;
};
Forward run_forward(const Tensor& qv, const Tensor& kv, const Tensor& vv, const Tensor& bv,
                    AttentionMask mask, double scale, const Tensor& factor, const Tensor& bfactor) {
  const Shape lead(qv.shape().begin(), qv.shape().end() - 2);
  const int64_t nq = qv.size(-2), nk = kv.size(-2);
  Shape out_shape = lead, lse_shape = lead;
  out_shape.insert(out_shape.end(), {nq, vv.size(-1)});
  lse_shape.push_back(nq);
  Forward f;
  f.out = detail::empty_like_layout(out_shape, output_layout(qv, vv), qv.dtype());
  f.lse = Tensor::empty(lse_shape, factor_dtype_of(qv), qv.device());
  SKA_KERNEL(qv.device(), attention_forward)
  (qv, kv, vv, bv, mask, scale, factor, bfactor, f.out, f.lse);
  MacCounter::add(shape_numel(lead) * nq * nk * (qv.size(-1) + vv.size(-1)));
  return f;
}

// The logits are linear in the scale factor f: dL/df = sum(dL/dz * z) / f = sum(dL/dq * q) / f,
// the products and their sum in f32 (f64 for f64 q) by one kernel that reads the two views where
// they lie (dL/dq may be a view into the packed qkv gradient); likewise for the bias factor with
// the bias.
Tensor factor_grad(const Tensor& grad, const Tensor& value, const Tensor& factor,
                   const Shape& shape) {
  const DType sum_dtype = grad.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  if (grad.shape() != value.shape() || grad.dtype() != value.dtype() ||
      factor.dtype() != sum_dtype) {
    return div(sum(mul(grad, value)).to(factor.dtype()), factor).reshape(shape);
  }
  const Tensor total = Tensor::empty({1}, sum_dtype, grad.device());
  SKA_KERNEL(grad.device(), dot)(grad, value, total);
  return div(total, factor).reshape(shape);
}

// The bias gradient's tensor: laid out like the bias where the bias is a dense tensor in some
// order of its dims (a permuted view, as CSKA's logits from their matrix product: the gradient
// then goes back through the permutation without a copy), or the first columns of one whose
// rows are padded (empty_aligned_rows, as CSKA-ViT's logits: the gradient's rows then start 16
// bytes apart too, for the conv logits' backward kernels to stage); contiguous where it
// broadcasts (the op sums it after).
Tensor empty_bias_grad(const Shape& shape, const Tensor& bv) {
  if (bv.is_non_overlapping_and_dense()) {
    return detail::empty_like_layout(shape, bv, bv.dtype(), /*last_innermost=*/false);
  }
  if (bv.shape() == shape && dense_with_padded_rows(bv.shape(), bv.strides())) {
    Shape wide = shape;
    wide.back() = bv.stride(-2);
    return detail::empty_in_stride_order(wide, bv.strides(), bv.dtype(), bv.device(),
                                         /*last_innermost=*/false)
        .narrow(bv.dim() - 1, 0, shape.back());
  }
  return Tensor::empty(shape, bv.dtype(), bv.device());
}

}  // namespace

Tensor scaled_dot_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            const Tensor& bias, const Tensor& scale_factor,
                            const Tensor& bias_factor, AttentionMask mask) {
  if (auto cast = autocast_inputs(kOp, {q, k, v, bias})) {
    return scaled_dot_attention((*cast)[0], (*cast)[1], (*cast)[2], scale, (*cast)[3], scale_factor,
                                bias_factor, mask);
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
  const DType factor_dtype = factor_dtype_of(q);
  if (needs_cast(scale_factor, factor_dtype) || needs_cast(bias_factor, factor_dtype)) {
    const auto cast = [&](const Tensor& f) {
      return needs_cast(f, factor_dtype) ? f.to(factor_dtype) : f;
    };
    return scaled_dot_attention(q, k, v, scale, bias, cast(scale_factor), cast(bias_factor), mask);
  }
  check_factors(kOp, q, factor_dtype, scale_factor, bias_factor);
  SKA_CHECK(!bias_factor.defined() || bias.defined(), ValueError, kOp,
            ": a bias_factor needs a bias");
  const Tensor factor = scale_factor.defined() ? scale_factor.detach().contiguous() : Tensor();
  const Tensor bfactor = bias_factor.defined() ? bias_factor.detach().contiguous() : Tensor();

  const Tensor qv = rows_readable(q.detach());
  const Tensor kv = rows_readable(broadcast_leading(kOp, "k", k.detach(), rank, lead, nk, d));
  const Tensor vv = rows_readable(broadcast_leading(kOp, "v", v.detach(), rank, lead, nk, dv));
  const Tensor bv =
      bias.defined() ? broadcast_leading(kOp, "bias", bias.detach(), rank, lead, nq, nk) : Tensor();
  const Forward fwd = run_forward(qv, kv, vv, bv, mask, scale, factor, bfactor);

  const bool need_bias = bias.defined() && bias.requires_grad();
  const bool need_factor = scale_factor.defined() && scale_factor.requires_grad();
  const bool need_bfactor = bias_factor.defined() && bias_factor.requires_grad();
  const Shape k_shape = k.shape(), v_shape = v.shape();
  const Shape bias_shape = bias.defined() ? bias.shape() : Shape();
  const Shape factor_shape = need_factor ? scale_factor.shape() : Shape();
  const Shape bfactor_shape = need_bfactor ? bias_factor.shape() : Shape();
  const Tensor saved_out = fwd.out.detach(), lse = fwd.lse;
  autograd::record_op(kOp, {q, k, v, bias, scale_factor, bias_factor}, {fwd.out},
                      [=](const TensorList& g) {
    const Tensor go = rows_readable(g[0]);
    const Device dev = qv.device();
    Shape gk_shape = lead, gv_shape = lead, gb_shape = lead;
    gk_shape.insert(gk_shape.end(), {nk, d});
    gv_shape.insert(gv_shape.end(), {nk, dv});
    gb_shape.insert(gb_shape.end(), {nq, nk});
    const Tensor gq = grad_tensor(0, qv.shape(), qv.shape(), qv);
    const Tensor gk = grad_tensor(1, k_shape, gk_shape, kv);
    const Tensor gv = grad_tensor(2, v_shape, gv_shape, vv);
    const Tensor gb = need_bias || need_bfactor ? empty_bias_grad(gb_shape, bv) : Tensor();
    SKA_KERNEL(dev, attention_backward)
    (qv, kv, vv, bv, mask, saved_out, lse, go, scale, factor, bfactor, gq, gk, gv, gb);
    return TensorList{gq,
                      sum_to_shape(gk, k_shape),
                      sum_to_shape(gv, v_shape),
                      need_bias ? sum_to_shape(gb, bias_shape) : Tensor(),
                      need_factor ? factor_grad(gq, qv, factor, factor_shape) : Tensor(),
                      need_bfactor ? factor_grad(gb, bv, bfactor, bfactor_shape) : Tensor()};
  });
  return fwd.out;
}

Tensor qkv_attention(const Tensor& qkv, int64_t heads, double scale, const Tensor& bias,
                     const Tensor& scale_factor, AttentionMask mask) {
  constexpr const char* kQkv = "qkv_attention";
  if (auto cast = autocast_inputs(kQkv, {qkv, bias})) {
    return qkv_attention((*cast)[0], heads, scale, (*cast)[1], scale_factor, mask);
  }
  detail::check_floating(kQkv, qkv);
  if (bias.defined()) detail::check_same_device_dtype(kQkv, qkv, bias);
  SKA_CHECK(qkv.dim() == 3 && heads > 0 && qkv.size(2) % (3 * heads) == 0, ShapeError, kQkv,
            ": qkv ", qkv.str(), " must be [B, N, 3 * heads * head_dim] for ", heads, " heads");
  const DType factor_dtype = factor_dtype_of(qkv);
  if (needs_cast(scale_factor, factor_dtype)) {
    return qkv_attention(qkv, heads, scale, bias, scale_factor.to(factor_dtype), mask);
  }
  check_factors(kQkv, qkv, factor_dtype, scale_factor, Tensor());
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), d = qkv.size(2) / (3 * heads);
  const Shape packed_shape = {batch, tokens, 3, heads, d};
  // Part i (0: q, 1: k, 2: v) of a packed [B, N, 3, h, d] tensor as [B, h, N, d].
  const auto part = [](const Tensor& packed, int64_t i) {
    return packed.select(2, i).permute({0, 2, 1, 3});
  };
  const Tensor packed = qkv.detach().contiguous().view(packed_shape);
  const Tensor qv = part(packed, 0), kv = part(packed, 1), vv = part(packed, 2);
  const Shape lead = {batch, heads};
  const Tensor bv = bias.defined()
                        ? broadcast_leading(kQkv, "bias", bias.detach(), 4, lead, tokens, tokens)
                        : Tensor();
  const Tensor factor = scale_factor.defined() ? scale_factor.detach().contiguous() : Tensor();
  const Forward fwd = run_forward(qv, kv, vv, bv, mask, scale, factor, Tensor());

  const bool need_bias = bias.defined() && bias.requires_grad();
  const bool need_factor = scale_factor.defined() && scale_factor.requires_grad();
  const Shape qkv_shape = qkv.shape();
  const Shape bias_shape = bias.defined() ? bias.shape() : Shape();
  const Shape factor_shape = need_factor ? scale_factor.shape() : Shape();
  const Tensor saved_out = fwd.out.detach(), lse = fwd.lse;
  autograd::record_op(kQkv, {qkv, bias, scale_factor}, {fwd.out}, [=](const TensorList& g) {
    const Tensor go = rows_readable(g[0]);
    const Device dev = qv.device();
    const DType dt = qv.dtype();
    // The kernels write the three gradients straight into their places in dL/dqkv.
    const Tensor grad = Tensor::empty(packed_shape, dt, dev);
    const Tensor gq = part(grad, 0);
    const Tensor gb = need_bias ? empty_bias_grad({batch, heads, tokens, tokens}, bv) : Tensor();
    SKA_KERNEL(dev, attention_backward)
    (qv, kv, vv, bv, mask, saved_out, lse, go, scale, factor, Tensor(), gq, part(grad, 1),
     part(grad, 2), gb);
    return TensorList{grad.view(qkv_shape), need_bias ? sum_to_shape(gb, bias_shape) : Tensor(),
                      need_factor ? factor_grad(gq, qv, factor, factor_shape) : Tensor()};
  });
  return fwd.out;
}

Tensor softmax_attend(const Tensor& logits, const Tensor& v, const Tensor& factor,
                      AttentionMask mask) {
  SKA_CHECK(logits.dim() >= 3 && logits.dim() <= 6, ShapeError, "softmax_attend: logits ",
            logits.str(), " need 3 to 6 dims");
  // Queries and keys of head dim 0: the fused op's q k^T term vanishes, z = factor * logits.
  Shape q_shape = logits.shape();
  q_shape.back() = 0;
  const Tensor q = Tensor::empty(q_shape, logits.dtype(), logits.device());
  const Tensor k = Tensor::empty({logits.size(-1), 0}, logits.dtype(), logits.device());
  return scaled_dot_attention(q, k, v, 1.0, logits, Tensor(), factor, mask);
}

bool talking_heads_softmax_fits(const Tensor& logits) {
  if (logits.dim() != 4 || !logits.is_floating()) return false;
  if (!logits.device().is_cuda()) return true;
  return logits.dtype() != DType::kF64 && logits.size(1) >= 1 && logits.size(1) <= 8 &&
         logits.size(3) <= 128;
}

Tensor talking_heads_softmax(const Tensor& logits, double scale, const Tensor& w_pre,
                             const Tensor& w_post) {
  const char* kName = "talking_heads_softmax";
  detail::check_floating(kName, logits);
  SKA_CHECK(logits.dim() == 4, ShapeError, kName,
            ": logits must be [R, heads, queries, keys], got ", shape_str(logits.shape()));
  const DType math = talking_heads_math_dtype(logits.dtype());
  const Tensor pre = w_pre.to(math), post = w_post.to(math);
  const Tensor lc = logits.detach().contiguous();
  const int64_t outer = logits.size(0), heads = logits.size(1), queries = logits.size(2);
  Tensor out = Tensor::empty(logits.shape(), logits.dtype(), logits.device());
  const Tensor lse = Tensor::empty({outer, heads, queries}, math, logits.device());
  const Tensor pre_d = pre.detach().contiguous(), post_d = post.detach().contiguous();
  SKA_KERNEL(logits.device(), talking_heads_softmax_forward)(lc, scale, pre_d, post_d, out, lse);
  MacCounter::add(2 * outer * heads * heads * queries * logits.size(3));
  const bool need_pre = pre.requires_grad(), need_post = post.requires_grad();
  const DType out_dtype = logits.dtype();
  autograd::record_op(kName, {logits, pre, post}, {out}, [=](const TensorList& grad) {
    const Tensor gc = grad[0].to(out_dtype).contiguous();
    Tensor grad_logits = Tensor::empty(lc.shape(), lc.dtype(), lc.device());
    const Tensor grad_pre = need_pre ? Tensor::empty(pre_d.shape(), math, lc.device()) : Tensor();
    const Tensor grad_post =
        need_post ? Tensor::empty(post_d.shape(), math, lc.device()) : Tensor();
    SKA_KERNEL(lc.device(), talking_heads_softmax_backward)
    (gc, lc, scale, pre_d, post_d, lse, grad_logits, grad_pre, grad_post);
    return TensorList{grad_logits, grad_pre, grad_post};
  });
  return out;
}

}  // namespace ska
