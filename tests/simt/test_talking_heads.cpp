// CaiT's talking-heads softmax kernels' own code (cuda/kernels/talking_heads.cu), run on the host
// by tests/simt: the weights, the log-sum-exps and every gradient (the logits', the two head
// mixes') against the op's math in f64 (backend/kernels.inc: out = mix(softmax(mix(scale *
// logits, w_pre)), w_post), mix(x, w)[g'] = sum_g w[g, g'] x[g]), that f64 backward against
// central differences, and the same bits whatever order a block's threads run in and whether or
// not the mixes' gradients are wanted. Shapes: CaiT-S's patch attention (8 heads, 64 keys) and
// padded heads, keys past a lane's first column and fewer keys than lanes, and more rows than the
// backward's grid holds (its warps stride over rows).
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/simt/talking_heads_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::TalkingHeadsGeometry;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;

struct Case {
  std::string name;
  TalkingHeadsGeometry geo;  // outer, heads, queries, keys
};

std::vector<Case> cases() {
  return {
      {"CaiT-S patch attention: 8 heads, 64 keys", {2, 8, 64, 64}},
      {"3 heads (padded to 4), 100 keys", {3, 3, 5, 100}},
      {"1 head (padded to 2), 7 keys", {2, 1, 3, 7}},
      {"6 heads, 128 keys, rows ending mid-block", {1, 6, 9, 128}},
      {"2 heads, 33 keys, more rows than the backward's warps", {45, 2, 100, 33}},
  };
}

// The op's math in f64 on the kernels' inputs (16-bit logits as their values).
struct Reference {
  std::vector<double> out, lse, grad_logits, grad_pre, grad_post;
};

size_t at(const TalkingHeadsGeometry& geo, int64_t r, int64_t g, int64_t i, int64_t j) {
  return static_cast<size_t>(((r * geo.heads + g) * geo.queries + i) * geo.keys + j);
}

// The forward of one row (r, i): x = scale * logits, p = softmax(mix(x, pre)) and its lse, and
// the weights out = mix(p, post), each [h][Nk].
struct RowForward {
  std::vector<std::vector<double>> x, p, out;
  std::vector<double> lse;
};
RowForward row_forward(const TalkingHeadsGeometry& geo, const std::vector<double>& logits,
                       int64_t r, int64_t i, double scale, const std::vector<double>& pre,
                       const std::vector<double>& post) {
  const int64_t h = geo.heads, nk = geo.keys;
  RowForward f;
  f.x.assign(h, std::vector<double>(nk));
  f.p = f.out = f.x;
  f.lse.assign(h, 0.0);
  for (int64_t g = 0; g < h; ++g)
    for (int64_t j = 0; j < nk; ++j) f.x[g][j] = scale * logits[at(geo, r, g, i, j)];
  for (int64_t g2 = 0; g2 < h; ++g2) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < nk; ++j) {
      double m = 0.0;
      for (int64_t g = 0; g < h; ++g) m += pre[g * h + g2] * f.x[g][j];
      f.p[g2][j] = m;
      mx = std::max(mx, m);
    }
    double s = 0.0;
    for (int64_t j = 0; j < nk; ++j) s += std::exp(f.p[g2][j] - mx);
    f.lse[g2] = mx + std::log(s);
    for (int64_t j = 0; j < nk; ++j) f.p[g2][j] = std::exp(f.p[g2][j] - f.lse[g2]);
  }
  for (int64_t g3 = 0; g3 < h; ++g3) {
    for (int64_t j = 0; j < nk; ++j) {
      double o = 0.0;
      for (int64_t g2 = 0; g2 < h; ++g2) o += post[g2 * h + g3] * f.p[g2][j];
      f.out[g3][j] = o;
    }
  }
  return f;
}

Reference reference(const TalkingHeadsGeometry& geo, const std::vector<double>& logits,
                    double scale, const std::vector<double>& pre, const std::vector<double>& post,
                    const std::vector<double>& grad_out) {
  const int64_t h = geo.heads, nk = geo.keys;
  Reference ref;
  ref.out.assign(logits.size(), 0.0);
  ref.grad_logits.assign(logits.size(), 0.0);
  ref.lse.assign(static_cast<size_t>(geo.outer * h * geo.queries), 0.0);
  ref.grad_pre.assign(static_cast<size_t>(h * h), 0.0);
  ref.grad_post = ref.grad_pre;
  for (int64_t r = 0; r < geo.outer; ++r) {
    for (int64_t i = 0; i < geo.queries; ++i) {
      const RowForward f = row_forward(geo, logits, r, i, scale, pre, post);
      std::vector<std::vector<double>> dm(h, std::vector<double>(nk));
      for (int64_t g2 = 0; g2 < h; ++g2) {
        ref.lse[(r * h + g2) * geo.queries + i] = f.lse[g2];
        for (int64_t j = 0; j < nk; ++j) ref.out[at(geo, r, g2, i, j)] = f.out[g2][j];
        std::vector<double> dp(nk);
        double delta = 0.0;
        for (int64_t j = 0; j < nk; ++j) {
          for (int64_t g3 = 0; g3 < h; ++g3) {
            const double go = grad_out[at(geo, r, g3, i, j)];
            dp[j] += post[g2 * h + g3] * go;
            ref.grad_post[g2 * h + g3] += f.p[g2][j] * go;
          }
          delta += dp[j] * f.p[g2][j];
        }
        for (int64_t j = 0; j < nk; ++j) dm[g2][j] = f.p[g2][j] * (dp[j] - delta);
      }
      for (int64_t g = 0; g < h; ++g) {
        for (int64_t j = 0; j < nk; ++j) {
          double acc = 0.0;
          for (int64_t g2 = 0; g2 < h; ++g2) {
            acc += pre[g * h + g2] * dm[g2][j];
            ref.grad_pre[g * h + g2] += f.x[g][j] * dm[g2][j];
          }
          ref.grad_logits[at(geo, r, g, i, j)] = scale * acc;
        }
      }
    }
  }
  return ref;
}

// sum(out * grad_out) in f64: the loss whose gradients the backward pass gives.
double loss(const TalkingHeadsGeometry& geo, const std::vector<double>& logits, double scale,
            const std::vector<double>& pre, const std::vector<double>& post,
            const std::vector<double>& grad_out) {
  double l = 0.0;
  for (int64_t r = 0; r < geo.outer; ++r) {
    for (int64_t i = 0; i < geo.queries; ++i) {
      const RowForward f = row_forward(geo, logits, r, i, scale, pre, post);
      for (int64_t g = 0; g < geo.heads; ++g)
        for (int64_t j = 0; j < geo.keys; ++j) l += f.out[g][j] * grad_out[at(geo, r, g, i, j)];
    }
  }
  return l;
}

template <typename T>
struct Inputs {
  TalkingHeadsGeometry geo;
  float scale = 0.0f;
  std::vector<T> logits, grad_out;
  std::vector<float> pre, post;
};

template <typename T>
Inputs<T> make_inputs(const TalkingHeadsGeometry& geo, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs<T> in;
  in.geo = geo;
  in.scale = 1.0f / std::sqrt(48.0f);  // CaiT-S: head width 48
  const size_t n = static_cast<size_t>(geo.outer * geo.heads * geo.queries * geo.keys);
  for (size_t e = 0; e < n; ++e) {
    in.logits.push_back(round_to<T>(12.0f * normal(rng)));  // weights far from uniform
    in.grad_out.push_back(round_to<T>(normal(rng)));
  }
  for (int64_t g = 0; g < geo.heads; ++g) {
    for (int64_t g2 = 0; g2 < geo.heads; ++g2) {  // near the identity, the heads mixed
      in.pre.push_back((g == g2 ? 1.0f : 0.0f) + 0.4f * normal(rng));
      in.post.push_back((g == g2 ? 1.0f : 0.0f) + 0.4f * normal(rng));
    }
  }
  return in;
}

template <typename T>
std::vector<double> values_of(const std::vector<T>& v) {
  std::vector<double> out;
  for (const T& e : v) out.push_back(value(e));
  return out;
}

template <typename T>
struct Run {
  std::vector<T> out, grad_logits;
  std::vector<float> lse, grad_pre, grad_post;
};

// The forward, then the backward from in.grad_out with the mixes' gradients where `pre` / `post`.
template <typename T>
Run<T> run(const Inputs<T>& in, bool pre, bool post) {
  const TalkingHeadsGeometry& geo = in.geo;
  const size_t n = in.logits.size(), hh = static_cast<size_t>(geo.heads * geo.heads);
  Run<T> r;
  r.out.assign(n, round_to<T>(NAN));
  r.grad_logits = r.out;
  r.lse.assign(static_cast<size_t>(geo.outer * geo.heads * geo.queries), NAN);
  r.grad_pre.assign(hh, NAN);
  r.grad_post.assign(hh, NAN);
  ska::simt::talking_heads::forward(geo, in.logits.data(), in.scale, in.pre.data(), in.post.data(),
                                    r.out.data(), r.lse.data());
  ska::simt::talking_heads::backward(geo, in.grad_out.data(), in.logits.data(), in.scale,
                                     in.pre.data(), in.post.data(), r.lse.data(),
                                     r.grad_logits.data(), pre ? r.grad_pre.data() : nullptr,
                                     post ? r.grad_post.data() : nullptr);
  return r;
}

// How many of `got` lie outside tol of `want`: rel of the element's own size (the output's
// rounding) plus abs of the largest magnitude of `want` (the f32 arithmetic's).
template <typename E>
int64_t off(const std::vector<E>& got, const std::vector<double>& want, double rel, double abs) {
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int64_t bad = 0;
  for (size_t e = 0; e < want.size(); ++e) {
    const double g = value(got[e]);
    bad += !(std::abs(g - want[e]) <= rel * std::abs(want[e]) + abs * (1.0 + scale));
  }
  return bad;
}

template <typename T>
void check_case(const Case& c) {
  INFO(c.name);
  const Inputs<T> in = make_inputs<T>(c.geo, 31);
  const Reference ref = reference(
      c.geo, values_of(in.logits), in.scale, std::vector<double>(in.pre.begin(), in.pre.end()),
      std::vector<double>(in.post.begin(), in.post.end()), values_of(in.grad_out));
  const Run<T> r = run(in, true, true);
  const double rounding = std::is_same_v<T, float>  ? 0.0
                          : std::is_same_v<T, bf16> ? 0x1p-8
                                                    : 0x1p-11;
  CHECK(off(r.out, ref.out, rounding, 2e-6) == 0);
  CHECK(off(r.lse, ref.lse, 0.0, 2e-6) == 0);
  CHECK(off(r.grad_logits, ref.grad_logits, rounding, 2e-6) == 0);
  CHECK(off(r.grad_pre, ref.grad_pre, 0.0, 2e-6) == 0);
  CHECK(off(r.grad_post, ref.grad_post, 0.0, 2e-6) == 0);

  // The mixes' gradients do not change the logits' bits, and each is written alone.
  const Run<T> none = run(in, false, false), post_only = run(in, false, true);
  CHECK(same_bits(none.grad_logits, r.grad_logits));
  CHECK(same_bits(post_only.grad_post, r.grad_post));
  CHECK(std::all_of(none.grad_pre.begin(), none.grad_pre.end(),
                    [](float v) { return std::isnan(v); }));

  // No order of a block's threads changes a bit (the mixes' sums are in a fixed order).
  ska::simt::in_other_orders(5, [&](const char* order) {
    INFO(order);
    const Run<T> again = run(in, true, true);
    CHECK(same_bits(again.out, r.out));
    CHECK(same_bits(again.lse, r.lse));
    CHECK(same_bits(again.grad_logits, r.grad_logits));
    CHECK(same_bits(again.grad_pre, r.grad_pre));
    CHECK(same_bits(again.grad_post, r.grad_post));
  });
}

TEST_CASE("simt: talking-heads softmax against its f64 math (f32)", "[cpu][simt]") {
  for (const Case& c : cases()) check_case<float>(c);
}

TEST_CASE("simt: talking-heads softmax against its f64 math (bf16)", "[cpu][simt]") {
  for (const Case& c : cases()) check_case<bf16>(c);
}

TEST_CASE("simt: talking-heads softmax against its f64 math (f16)", "[cpu][simt]") {
  const std::vector<Case> all = cases();
  for (const Case& c : {all[1], all[2]}) check_case<__half>(c);
}

// The f64 reference's backward against central differences of its forward.
TEST_CASE("simt: the talking-heads reference's gradients match central differences",
          "[cpu][simt]") {
  const TalkingHeadsGeometry geo{2, 3, 2, 5};
  const Inputs<float> in = make_inputs<float>(geo, 37);
  std::vector<double> logits = values_of(in.logits), grad_out = values_of(in.grad_out);
  std::vector<double> pre(in.pre.begin(), in.pre.end()), post(in.post.begin(), in.post.end());
  for (double& l : logits) l /= 4.0;  // smooth enough for differences of step 1e-5
  const double scale = in.scale;
  const Reference ref = reference(geo, logits, scale, pre, post, grad_out);
  const double h = 1e-5;
  const auto central = [&](std::vector<double>& v, size_t e) {
    const double keep = v[e];
    v[e] = keep + h;
    const double up = loss(geo, logits, scale, pre, post, grad_out);
    v[e] = keep - h;
    const double down = loss(geo, logits, scale, pre, post, grad_out);
    v[e] = keep;
    return (up - down) / (2 * h);
  };
  for (size_t e = 0; e < logits.size(); ++e)
    CHECK(central(logits, e) == Approx(ref.grad_logits[e]).margin(1e-7));
  for (size_t e = 0; e < pre.size(); ++e) {
    CHECK(central(pre, e) == Approx(ref.grad_pre[e]).margin(1e-7));
    CHECK(central(post, e) == Approx(ref.grad_post[e]).margin(1e-7));
  }
}

}  // namespace
