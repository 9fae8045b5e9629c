// CPU kernels: CaiT's talking-heads softmax, mix(softmax(mix(scale * logits, w_pre)), w_post),
// row by row in the math dtype (f32, f64 for f64 logits; 16-bit logits widened and the results
// rounded once). The reference the CUDA kernels are tested against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"
#include "backend/talking_heads_geometry.h"

namespace ska::cpu {

namespace {

// One row (r, i) of a [R, h, Nq, Nk] tensor: element (g, j) at at(g, j).
struct Row {
  int64_t base, head_stride;
  int64_t at(int64_t g, int64_t j) const { return base + g * head_stride + j; }
};
Row row_of(const TalkingHeadsGeometry& geo, int64_t row) {
  const int64_t r = row / geo.queries, i = row % geo.queries;
  return {(r * geo.heads * geo.queries + i) * geo.keys, geo.queries * geo.keys};
}
int64_t lse_index(const TalkingHeadsGeometry& geo, int64_t row, int64_t g) {
  const int64_t r = row / geo.queries, i = row % geo.queries;
  return (r * geo.heads + g) * geo.queries + i;
}

// x [h, Nk] = scale * the row's logits; m [h, Nk] = mix(x, w_pre); p = softmax rows of m, with
// its log-sum-exps (computed here, or read from `lse_in` when given).
template <typename C>
void mixed_softmax(const TalkingHeadsGeometry& geo, const C* logits, int64_t row, C scale,
                   const C* w_pre, const C* lse_in, std::vector<C>& x, std::vector<C>& p,
                   std::vector<C>& lse_out) {
  const int64_t h = geo.heads, nk = geo.keys;
  const Row at = row_of(geo, row);
  for (int64_t g = 0; g < h; ++g)
    for (int64_t j = 0; j < nk; ++j) x[g * nk + j] = scale * logits[at.at(g, j)];
  for (int64_t g2 = 0; g2 < h; ++g2) {
    for (int64_t j = 0; j < nk; ++j) {
      C acc = 0;
      for (int64_t g = 0; g < h; ++g) acc += w_pre[g * h + g2] * x[g * nk + j];
      p[g2 * nk + j] = acc;
    }
    C l;
    if (lse_in != nullptr) {
      l = lse_in[lse_index(geo, row, g2)];
    } else {
      C mx = -std::numeric_limits<C>::infinity();
      for (int64_t j = 0; j < nk; ++j) mx = std::max(mx, p[g2 * nk + j]);
      C s = 0;
      for (int64_t j = 0; j < nk; ++j) s += std::exp(p[g2 * nk + j] - mx);
      l = mx + std::log(s);
    }
    lse_out[g2] = l;
    for (int64_t j = 0; j < nk; ++j) p[g2 * nk + j] = std::exp(p[g2 * nk + j] - l);
  }
}

template <typename C>
void forward_rows(const TalkingHeadsGeometry& geo, const C* logits, C scale, const C* w_pre,
                  const C* w_post, C* out, C* lse) {
  const int64_t h = geo.heads, nk = geo.keys;
  parallel_for(
      geo.rows(),
      [&](int64_t row) {
        std::vector<C> x(h * nk), p(h * nk), l(h);
        mixed_softmax(geo, logits, row, scale, w_pre, static_cast<const C*>(nullptr), x, p, l);
        const Row at = row_of(geo, row);
        for (int64_t g2 = 0; g2 < h; ++g2) lse[lse_index(geo, row, g2)] = l[g2];
        for (int64_t g3 = 0; g3 < h; ++g3) {
          for (int64_t j = 0; j < nk; ++j) {
            C acc = 0;
            for (int64_t g2 = 0; g2 < h; ++g2) acc += w_post[g2 * h + g3] * p[g2 * nk + j];
            out[at.at(g3, j)] = acc;
          }
        }
      },
      1);
}

// Per row: grad_logits, and the row's terms of grad_pre / grad_post into part_pre / part_post
// [rows, h, h] (summed over the rows in order afterwards).
template <typename C>
void backward_rows(const TalkingHeadsGeometry& geo, const C* grad_out, const C* logits, C scale,
                   const C* w_pre, const C* w_post, const C* lse, C* grad_logits, C* part_pre,
                   C* part_post) {
  const int64_t h = geo.heads, nk = geo.keys;
  parallel_for(
      geo.rows(),
      [&](int64_t row) {
        std::vector<C> x(h * nk), p(h * nk), l(h), dp(h * nk), dm(h * nk);
        mixed_softmax(geo, logits, row, scale, w_pre, lse, x, p, l);
        const Row at = row_of(geo, row);
        for (int64_t g2 = 0; g2 < h; ++g2) {
          for (int64_t j = 0; j < nk; ++j) {
            C acc = 0;
            for (int64_t g3 = 0; g3 < h; ++g3) acc += w_post[g2 * h + g3] * grad_out[at.at(g3, j)];
            dp[g2 * nk + j] = acc;
          }
          for (int64_t g3 = 0; g3 < h; ++g3) {
            C acc = 0;
            for (int64_t j = 0; j < nk; ++j) acc += p[g2 * nk + j] * grad_out[at.at(g3, j)];
            part_post[(row * h + g2) * h + g3] = acc;
          }
          C delta = 0;
          for (int64_t j = 0; j < nk; ++j) delta += dp[g2 * nk + j] * p[g2 * nk + j];
          for (int64_t j = 0; j < nk; ++j)
            dm[g2 * nk + j] = p[g2 * nk + j] * (dp[g2 * nk + j] - delta);
        }
        for (int64_t g = 0; g < h; ++g) {
          for (int64_t j = 0; j < nk; ++j) {
            C acc = 0;
            for (int64_t g2 = 0; g2 < h; ++g2) acc += w_pre[g * h + g2] * dm[g2 * nk + j];
            grad_logits[at.at(g, j)] = scale * acc;
          }
          for (int64_t g2 = 0; g2 < h; ++g2) {
            C acc = 0;
            for (int64_t j = 0; j < nk; ++j) acc += x[g * nk + j] * dm[g2 * nk + j];
            part_pre[(row * h + g) * h + g2] = acc;
          }
        }
      },
      1);
}

// out [h, h] = the sum over the rows of part [rows, h, h], in row order.
template <typename C>
void sum_rows(const std::vector<C>& part, int64_t rows, int64_t hh, C* out) {
  for (int64_t k = 0; k < hh; ++k) {
    C acc = 0;
    for (int64_t row = 0; row < rows; ++row) acc += part[row * hh + k];
    out[k] = acc;
  }
}

}  // namespace

void talking_heads_softmax_forward(const Tensor& logits, double scale, const Tensor& w_pre,
                                   const Tensor& w_post, const Tensor& out, const Tensor& lse) {
  const TalkingHeadsGeometry geo =
      talking_heads_geometry("talking_heads_softmax_forward", logits, w_pre, w_post, out, lse);
  if (is_16bit_float(logits.dtype())) {
    const Tensor result = f32_output(out);
    talking_heads_softmax_forward(widen_f32(logits), scale, w_pre, w_post, result, lse);
    return round_into(result, out);
  }
  if (logits.numel() == 0) return;
  dispatch_floating(logits.dtype(), "talking_heads_softmax_forward", [&](auto tag) {
    using C = decltype(tag);
    if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
      forward_rows<C>(geo, static_cast<const C*>(logits.data_ptr()), static_cast<C>(scale),
                      static_cast<const C*>(w_pre.data_ptr()),
                      static_cast<const C*>(w_post.data_ptr()), static_cast<C*>(out.data_ptr()),
                      static_cast<C*>(lse.data_ptr()));
    }
  });
}

void talking_heads_softmax_backward(const Tensor& grad_out, const Tensor& logits, double scale,
                                    const Tensor& w_pre, const Tensor& w_post, const Tensor& lse,
                                    const Tensor& grad_logits, const Tensor& grad_pre,
                                    const Tensor& grad_post) {
  const char* kKernel = "talking_heads_softmax_backward";
  const TalkingHeadsGeometry geo = talking_heads_backward_geometry(
      kKernel, grad_out, logits, w_pre, w_post, lse, grad_logits, grad_pre, grad_post);
  if (is_16bit_float(logits.dtype())) {
    const Tensor result = f32_output(grad_logits);
    talking_heads_softmax_backward(widen_f32(grad_out), widen_f32(logits), scale, w_pre, w_post,
                                   lse, result, grad_pre, grad_post);
    return round_into(result, grad_logits);
  }
  dispatch_floating(logits.dtype(), kKernel, [&](auto tag) {
    using C = decltype(tag);
    if constexpr (std::is_same_v<C, float> || std::is_same_v<C, double>) {
      const int64_t rows = geo.rows(), hh = geo.heads * geo.heads;
      std::vector<C> part_pre(static_cast<size_t>(rows * hh)),
          part_post(static_cast<size_t>(rows * hh));
      if (logits.numel() > 0) {
        backward_rows<C>(
            geo, static_cast<const C*>(grad_out.data_ptr()),
            static_cast<const C*>(logits.data_ptr()), static_cast<C>(scale),
            static_cast<const C*>(w_pre.data_ptr()), static_cast<const C*>(w_post.data_ptr()),
            static_cast<const C*>(lse.data_ptr()), static_cast<C*>(grad_logits.data_ptr()),
            part_pre.data(), part_post.data());
      }
      if (grad_pre.defined()) sum_rows(part_pre, rows, hh, static_cast<C*>(grad_pre.data_ptr()));
      if (grad_post.defined()) sum_rows(part_post, rows, hh, static_cast<C*>(grad_post.data_ptr()));
    }
  });
}

}  // namespace ska::cpu
