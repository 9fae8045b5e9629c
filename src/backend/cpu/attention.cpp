// CPU kernel: fused attention, out = softmax(scale * q k^T + bias) v. The work is cut into blocks
// of up to kQueryBlock query rows of one leading index; each block's scores live only in a
// per-thread scratch of kQueryBlock x Nk values (small enough for the cache), computed by one
// BLAS call, normalised in place and multiplied by v by a second. The backward pass recomputes
// the weights from the saved log-sum-exp instead of reading them back, so no [Nq, Nk] tensor is
// stored between the passes. 16-bit inputs run on f32 copies (widen.h), as a reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/vec_math.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

namespace {

constexpr int64_t kQueryBlock = 64;

// One operand's rows: the element offset of leading index g, the row stride (BLAS's leading
// dimension) and the stride along the last dim (1 for the BLAS operands; any for the bias).
struct RowView {
  const Tensor* t;
  int64_t ld;
};

// The offset of leading index g (row-major over the leading dims `lead`) in view t.
int64_t lead_offset(int64_t g, const Shape& lead, const Tensor& t) {
  int64_t offset = 0;
  for (int64_t i = static_cast<int64_t>(lead.size()) - 1; i >= 0; --i) {
    offset += (g % lead[i]) * t.stride(i);
    g /= lead[i];
  }
  return offset;
}

// The leading dimension BLAS reads rows of t with; ValueError unless the last dim is unit-strided
// and rows do not overlap.
int64_t leading_dim(const char* kernel, const char* name, const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const bool unit = cols <= 1 || t.stride(-1) == 1;
  const bool apart = rows <= 1 || t.stride(-2) >= cols;
  SKA_CHECK(unit && apart, ValueError, kernel, ": ", name,
            " needs a unit stride in its last dim and non-overlapping rows, got strides ",
            shape_str(t.strides()));
  return rows <= 1 ? std::max<int64_t>(cols, 1) : t.stride(-2);
}

struct Geometry {
  Shape lead;  // the leading dims L
  int64_t groups = 1, nq = 0, nk = 0, d = 0, dv = 0;
};

Geometry check_geometry(const char* kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& bias, const Tensor& out) {
  const int64_t rank = q.dim();
  SKA_CHECK(rank >= 3 && rank <= 6 && k.dim() == rank && v.dim() == rank && out.dim() == rank,
            ShapeError, kernel, ": q, k, v and out need the same rank (3 to 6), got ", q.str(),
            ", ", k.str(), ", ", v.str(), ", ", out.str());
  Geometry g;
  g.lead = Shape(q.shape().begin(), q.shape().end() - 2);
  g.groups = shape_numel(g.lead);
  g.nq = q.size(-2);
  g.d = q.size(-1);
  g.nk = k.size(-2);
  g.dv = v.size(-1);
  SKA_CHECK(g.d >= 0, ShapeError, kernel, ": q and k need a head dim of at least 0, got ", q.str());
  const auto lead_of = [](const Tensor& t) {
    return Shape(t.shape().begin(), t.shape().end() - 2);
  };
  SKA_CHECK(lead_of(k) == g.lead && lead_of(v) == g.lead && lead_of(out) == g.lead &&
                k.size(-1) == g.d && v.size(-2) == g.nk && out.size(-2) == g.nq &&
                out.size(-1) == g.dv,
            ShapeError, kernel, ": shapes do not match: q ", q.str(), ", k ", k.str(), ", v ",
            v.str(), ", out ", out.str());
  if (bias.defined()) {
    Shape want = g.lead;
    want.push_back(g.nq);
    want.push_back(g.nk);
    SKA_CHECK(bias.shape() == want, ShapeError, kernel, ": bias ", bias.str(), " is not ",
              shape_str(want));
  }
  return g;
}

// row += the bias's row (elements `stride` apart).
template <typename T>
void add_bias_row(T* row, const T* bias_row, int64_t stride, int64_t n) {
  for (int64_t j = 0; j < n; ++j) row[j] += bias_row[j * stride];
}

// -inf at the pairs of query i that `mask` excludes.
template <typename T>
void exclude_pairs(T* row, AttentionMask mask, int64_t i, int64_t n) {
  if (mask == AttentionMask::kDiagonal && i < n) row[i] = -std::numeric_limits<T>::infinity();
}

// z = scale * q k^T + bias (already in `row`), then the row's softmax in place; returns the
// log-sum-exp. A row without a finite maximum turns NaN, as softmax's does.
template <typename T>
T softmax_row(T* row, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    const float max_z = vm::lane_max(row, n);
    const float total = vm::lane_sum(n, [&](int64_t j) {
      const float e = vm::exp_f32(row[j] - max_z);
      row[j] = e;
      return e;
    });
    const float inv = 1.0f / total;
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    return max_z + std::log(total);
  } else {
    T max_z = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < n; ++j) max_z = std::fmax(max_z, row[j]);
    T total = 0;
    for (int64_t j = 0; j < n; ++j) {
      row[j] = std::exp(row[j] - max_z);
      total += row[j];
    }
    for (int64_t j = 0; j < n; ++j) row[j] /= total;
    return max_z + std::log(total);
  }
}

// The weights of a row again: p = exp(z - lse), from z = scale * q k^T + bias in `row`.
template <typename T>
void weights_row(T* row, int64_t n, T lse) {
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t j = 0; j < n; ++j) row[j] = vm::exp_f32(row[j] - lse);
  } else {
    for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - lse);
  }
}

template <typename T>
const T* data(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <typename T>
T* mutable_data(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

int as_int(int64_t v) { return static_cast<int>(v); }

template <typename T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                   AttentionMask mask, double scale, const Tensor& out, const Tensor& lse,
                   const Geometry& geo) {
  const int64_t ldq = leading_dim("attention_forward", "q", q);
  const int64_t ldk = leading_dim("attention_forward", "k", k);
  const int64_t ldv = leading_dim("attention_forward", "v", v);
  const int64_t ldo = leading_dim("attention_forward", "out", out);
  const int64_t blocks = (geo.nq + kQueryBlock - 1) / kQueryBlock;
  const int64_t tasks = geo.groups * blocks;
  const int64_t bias_rs = bias.defined() ? bias.stride(-2) : 0;
  const int64_t bias_cs = bias.defined() ? bias.stride(-1) : 0;
#pragma omp parallel if (tasks > 1 && geo.groups * geo.nq * geo.nk * (geo.d + geo.dv) > (1 << 16))
  {
    std::vector<T> scores(static_cast<size_t>(kQueryBlock * geo.nk));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t g = t / blocks, i0 = (t % blocks) * kQueryBlock;
      const int64_t rows = std::min(kQueryBlock, geo.nq - i0);
      const T* qp = data<T>(q) + lead_offset(g, geo.lead, q) + i0 * ldq;
      const T* kp = data<T>(k) + lead_offset(g, geo.lead, k);
      const T* vp = data<T>(v) + lead_offset(g, geo.lead, v);
      T* op = mutable_data<T>(out) + lead_offset(g, geo.lead, out) + i0 * ldo;
      T* lp = mutable_data<T>(lse) + g * geo.nq + i0;
      const T* bp =
          bias.defined() ? data<T>(bias) + lead_offset(g, geo.lead, bias) + i0 * bias_rs : nullptr;
      T* s = scores.data();
      if (geo.d == 0) {  // no q k^T term: the logits are the bias
        std::fill(s, s + rows * geo.nk, T(0));
      } else {
        blas_gemm(CblasNoTrans, CblasTrans, as_int(rows), as_int(geo.nk), as_int(geo.d),
                  static_cast<T>(scale), qp, as_int(ldq), kp, as_int(ldk), T(0), s, as_int(geo.nk));
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* row = s + r * geo.nk;
        if (bp != nullptr) add_bias_row(row, bp + r * bias_rs, bias_cs, geo.nk);
        exclude_pairs(row, mask, i0 + r, geo.nk);
        lp[r] = softmax_row<T>(row, geo.nk);
      }
      blas_gemm(CblasNoTrans, CblasNoTrans, as_int(rows), as_int(geo.dv), as_int(geo.nk), T(1), s,
                as_int(geo.nk), vp, as_int(ldv), T(0), op, as_int(ldo));
    }
  }
}

template <typename T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                    AttentionMask mask, const Tensor& out, const Tensor& lse,
                    const Tensor& grad_out, double scale, double bias_factor, const Tensor& grad_q,
                    const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_bias,
                    const Geometry& geo) {
  const int64_t ldq = leading_dim("attention_backward", "q", q);
  const int64_t ldk = leading_dim("attention_backward", "k", k);
  const int64_t ldv = leading_dim("attention_backward", "v", v);
  const int64_t ldo = leading_dim("attention_backward", "out", out);
  const int64_t ldg = leading_dim("attention_backward", "grad_out", grad_out);
  const int64_t ldgq = leading_dim("attention_backward", "grad_q", grad_q);
  const int64_t ldgk = leading_dim("attention_backward", "grad_k", grad_k);
  const int64_t ldgv = leading_dim("attention_backward", "grad_v", grad_v);
  const int64_t bias_rs = bias.defined() ? bias.stride(-2) : 0;
  const int64_t bias_cs = bias.defined() ? bias.stride(-1) : 0;
  const int64_t gb_rs = grad_bias.defined() ? grad_bias.stride(-2) : 0;
  const int64_t gb_cs = grad_bias.defined() ? grad_bias.stride(-1) : 0;
  const T s = static_cast<T>(scale), bf = static_cast<T>(bias_factor);
  // One leading index per task: its dk and dv sum over every query block, so the blocks of one
  // index run in order on one thread and the sums come out the same on every run.
#pragma omp parallel if (geo.groups > 1 && \
                         geo.groups * geo.nq * geo.nk * (geo.d + geo.dv) > (1 << 15))
  {
    std::vector<T> weights(static_cast<size_t>(kQueryBlock * geo.nk));
    std::vector<T> grads(static_cast<size_t>(kQueryBlock * geo.nk));
#pragma omp for schedule(static)
    for (int64_t g = 0; g < geo.groups; ++g) {
      const T* qg = data<T>(q) + lead_offset(g, geo.lead, q);
      const T* kg = data<T>(k) + lead_offset(g, geo.lead, k);
      const T* vg = data<T>(v) + lead_offset(g, geo.lead, v);
      const T* og = data<T>(out) + lead_offset(g, geo.lead, out);
      const T* gog = data<T>(grad_out) + lead_offset(g, geo.lead, grad_out);
      const T* lg = data<T>(lse) + g * geo.nq;
      const T* bg = bias.defined() ? data<T>(bias) + lead_offset(g, geo.lead, bias) : nullptr;
      T* dq = mutable_data<T>(grad_q) + lead_offset(g, geo.lead, grad_q);
      T* dk = mutable_data<T>(grad_k) + lead_offset(g, geo.lead, grad_k);
      T* dv = mutable_data<T>(grad_v) + lead_offset(g, geo.lead, grad_v);
      T* dz_out = grad_bias.defined()
                      ? mutable_data<T>(grad_bias) + lead_offset(g, geo.lead, grad_bias)
                      : nullptr;
      for (int64_t j = 0; j < geo.nk; ++j) {
        std::fill(dk + j * ldgk, dk + j * ldgk + geo.d, T(0));
        std::fill(dv + j * ldgv, dv + j * ldgv + geo.dv, T(0));
      }
      for (int64_t i0 = 0; i0 < geo.nq; i0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, geo.nq - i0);
        const T* qb = qg + i0 * ldq;
        const T* gob = gog + i0 * ldg;
        T* p = weights.data();
        T* dp = grads.data();
        if (geo.d == 0) {
          std::fill(p, p + rows * geo.nk, T(0));
        } else {
          blas_gemm(CblasNoTrans, CblasTrans, as_int(rows), as_int(geo.nk), as_int(geo.d), s, qb,
                    as_int(ldq), kg, as_int(ldk), T(0), p, as_int(geo.nk));
        }
        for (int64_t r = 0; r < rows; ++r) {
          T* row = p + r * geo.nk;
          if (bg != nullptr) add_bias_row(row, bg + (i0 + r) * bias_rs, bias_cs, geo.nk);
          exclude_pairs(row, mask, i0 + r, geo.nk);
          weights_row<T>(row, geo.nk, lg[i0 + r]);
          // An excluded pair's weight is 0 even in a row with no live key (lse NaN), as in the
          // CUDA kernels, which never compute it: such a row's NaN stays out of dV.
          if (mask == AttentionMask::kDiagonal && i0 + r < geo.nk) row[i0 + r] = T(0);
        }
        // dv += p^T dO; dp = dO v^T.
        blas_gemm(CblasTrans, CblasNoTrans, as_int(geo.nk), as_int(geo.dv), as_int(rows), T(1), p,
                  as_int(geo.nk), gob, as_int(ldg), T(1), dv, as_int(ldgv));
        blas_gemm(CblasNoTrans, CblasTrans, as_int(rows), as_int(geo.nk), as_int(geo.dv), T(1), gob,
                  as_int(ldg), vg, as_int(ldv), T(0), dp, as_int(geo.nk));
        // dz = p * (dp - sum(dO * out)), in dp.
        for (int64_t r = 0; r < rows; ++r) {
          const T* o_row = og + (i0 + r) * ldo;
          const T* go_row = gob + r * ldg;
          T dot = 0;
          for (int64_t c = 0; c < geo.dv; ++c) dot += go_row[c] * o_row[c];
          T* pr = p + r * geo.nk;
          T* dr = dp + r * geo.nk;
          for (int64_t j = 0; j < geo.nk; ++j) dr[j] = pr[j] * (dr[j] - dot);
          if (mask == AttentionMask::kDiagonal && i0 + r < geo.nk) dr[i0 + r] = T(0);
          if (dz_out != nullptr) {
            T* out_row = dz_out + (i0 + r) * gb_rs;
            // z = ... + f bias: dL/dbias = f dL/dz.
            for (int64_t j = 0; j < geo.nk; ++j) out_row[j * gb_cs] = bf * dr[j];
          }
        }
        // dq = scale dz k; dk += scale dz^T q.
        if (geo.d == 0) continue;
        blas_gemm(CblasNoTrans, CblasNoTrans, as_int(rows), as_int(geo.d), as_int(geo.nk), s, dp,
                  as_int(geo.nk), kg, as_int(ldk), T(0), dq + i0 * ldgq, as_int(ldgq));
        blas_gemm(CblasTrans, CblasNoTrans, as_int(geo.nk), as_int(geo.d), as_int(rows), s, dp,
                  as_int(geo.nk), qb, as_int(ldq), T(1), dk, as_int(ldgk));
      }
    }
  }
}

// The value of the optional one-element scale factor (1 when undefined): f32, or f64 for f64 q.
// Checks an optional one-element factor: f32, or f64 for f64 q.
void check_factor(const char* kernel, const char* name, const Tensor& factor, const Tensor& q) {
  if (!factor.defined()) return;
  const DType want = q.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  SKA_CHECK(factor.numel() == 1 && factor.dtype() == want, ValueError, kernel, ": ", name,
            " must be one ", dtype_name(want), " element, got ", factor.str());
}

// The value of the optional scale factor (1 when undefined).
double factor_value(const Tensor& factor) {
  if (!factor.defined()) return 1.0;
  return factor.dtype() == DType::kF64
             ? *static_cast<const double*>(factor.data_ptr())
             : static_cast<double>(*static_cast<const float*>(factor.data_ptr()));
}

// t * factor (one element, t's dtype) into `out` (contiguous, t's shape; may be t itself).
void scale_by(const Tensor& t, const Tensor& factor, const Tensor& out) {
  const Tensor f = Tensor::make_view(factor.storage(), t.shape(), Shape(t.shape().size(), 0),
                                     factor.offset(), factor.dtype());
  binary(BinaryOp::kMul, t, f, out);
}

}  // namespace

// 16-bit operands run on f32 copies (one rounding of each result); a bias factor multiplies a
// copy of the bias, and the bias gradient, at the f32 (or f64) level.
void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                       AttentionMask mask, double scale, const Tensor& scale_factor,
                       const Tensor& bias_factor, const Tensor& out, const Tensor& lse) {
  const Geometry geo = check_geometry("attention_forward", q, k, v, bias, out);
  check_factor("attention_forward", "scale_factor", scale_factor, q);
  check_factor("attention_forward", "bias_factor", bias_factor, q);
  SKA_CHECK(!bias_factor.defined() || bias.defined(), ValueError,
            "attention_forward: a bias_factor without a bias");
  if (out.numel() == 0 && lse.numel() == 0) return;
  if (is_16bit_float(q.dtype())) {  // f32 math on widened copies, one rounding of out
    const Tensor wide_out = f32_output(out);
    attention_forward(widen_f32(q), widen_f32(k), widen_f32(v), widen_f32(bias), mask, scale,
                      scale_factor, bias_factor, wide_out, lse);
    round_into(wide_out, out);
    return;
  }
  scale *= factor_value(scale_factor);
  Tensor b = bias;
  if (bias_factor.defined()) {
    b = Tensor::empty(bias.shape(), bias.dtype(), bias.device());
    scale_by(bias, bias_factor, b);
  }
  use_single_threaded_blas();
  dispatch_floating(q.dtype(), "attention_forward", [&](auto tag) {
    using T = decltype(tag);
    SKA_CHECK(lse.dtype() == q.dtype() && lse.is_contiguous() && lse.numel() == geo.groups * geo.nq,
              ValueError, "attention_forward: lse must be contiguous ", dtype_name(q.dtype()),
              " with ", geo.groups * geo.nq, " elements, got ", lse.str());
    if (geo.nk == 0) {  // nothing to attend to: zero output, lse -inf
      fill(out, 0.0);
      fill(lse, -std::numeric_limits<double>::infinity());
      return;
    }
    forward_typed<T>(q, k, v, b, mask, scale, out, lse, geo);
  });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                        AttentionMask mask, const Tensor& out, const Tensor& lse,
                        const Tensor& grad_out, double scale, const Tensor& scale_factor,
                        const Tensor& bias_factor, const Tensor& grad_q, const Tensor& grad_k,
                        const Tensor& grad_v, const Tensor& grad_bias) {
  const Geometry geo = check_geometry("attention_backward", q, k, v, bias, out);
  check_factor("attention_backward", "scale_factor", scale_factor, q);
  check_factor("attention_backward", "bias_factor", bias_factor, q);
  SKA_CHECK(!bias_factor.defined() || bias.defined(), ValueError,
            "attention_backward: a bias_factor without a bias");
  if (is_16bit_float(q.dtype())) {
    const Tensor gq = f32_output(grad_q), gk = f32_output(grad_k), gv = f32_output(grad_v);
    const Tensor gb = grad_bias.defined() ? f32_output(grad_bias) : Tensor();
    attention_backward(widen_f32(q), widen_f32(k), widen_f32(v), widen_f32(bias), mask,
                       widen_f32(out), lse, widen_f32(grad_out), scale, scale_factor, bias_factor,
                       gq, gk, gv, gb);
    round_into(gq, grad_q);
    round_into(gk, grad_k);
    round_into(gv, grad_v);
    if (gb.defined()) round_into(gb, grad_bias);
    return;
  }
  for (const Tensor* t : {&grad_q, &grad_k, &grad_v}) {
    SKA_CHECK(t->defined() && t->dtype() == q.dtype(), ValueError,
              "attention_backward: grad_q, grad_k and grad_v must be ", dtype_name(q.dtype()),
              " views, got ", t->defined() ? t->str() : "an undefined tensor");
  }
  if (grad_bias.defined()) {
    Shape b_shape = geo.lead;
    b_shape.insert(b_shape.end(), {geo.nq, geo.nk});
    SKA_CHECK(grad_bias.dtype() == q.dtype() && grad_bias.shape() == b_shape &&
                  (grad_bias.numel() == 0 ||
                   dense_with_padded_rows(grad_bias.shape(), grad_bias.strides())),
              ValueError, "attention_backward: grad_bias must be a ", dtype_name(q.dtype()), " ",
              shape_str(b_shape),
              " tensor, contiguous or permuted, rows padded or not (no element twice), got ",
              grad_bias.str());
  }
  Shape k_shape = geo.lead, v_shape = geo.lead;
  k_shape.insert(k_shape.end(), {geo.nk, geo.d});
  v_shape.insert(v_shape.end(), {geo.nk, geo.dv});
  SKA_CHECK(grad_q.shape() == q.shape() && grad_k.shape() == k_shape && grad_v.shape() == v_shape,
            ShapeError, "attention_backward: gradient shapes ", grad_q.str(), ", ", grad_k.str(),
            ", ", grad_v.str(), " do not match q ", q.str(), " k ", k.str(), " v ", v.str());
  if (grad_q.numel() + grad_k.numel() + grad_v.numel() == 0 && !grad_bias.defined()) return;
  if (geo.nk == 0) {  // the output did not depend on q
    fill(grad_q, 0.0);
    return;
  }
  scale *= factor_value(scale_factor);
  Tensor b = bias;
  if (bias_factor.defined()) {
    b = Tensor::empty(bias.shape(), bias.dtype(), bias.device());
    scale_by(bias, bias_factor, b);
  }
  use_single_threaded_blas();
  dispatch_floating(q.dtype(), "attention_backward", [&](auto tag) {
    using T = decltype(tag);
    backward_typed<T>(q, k, v, b, mask, out, lse, grad_out, scale, factor_value(bias_factor),
                      grad_q, grad_k, grad_v, grad_bias, geo);
  });
}

}  // namespace ska::cpu
