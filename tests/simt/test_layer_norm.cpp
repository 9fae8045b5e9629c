// The fused residual add + layer norm's forward kernels' own code (cuda/kernels/layer_norm.cu),
// run on the host by tests/simt: the sum (x + dropout(branch) * LayerScale) to the bit against
// the host's float arithmetic in the kernels' order, the dropout mask against the Philox draws,
// the statistics and the normed row against f64, and the held-row kernel against the loop
// kernel bit for bit. CaiT's blocks run this with its LayerScale and dropout by default
// (train.residual_norm: fused).
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/simt/layer_norm_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::as_float;
using ska::simt::kept;
using ska::simt::round_to;
using ska::simt::same_bits;

struct Case {
  std::string name;
  int64_t rows, cols;
  bool scale, dropout;
};

template <typename T, typename TR, typename TY>
struct Run {
  std::vector<T> sum;
  std::vector<TY> normed;
  std::vector<float> mean, rstd;
  std::vector<uint8_t> bits;
};

template <typename T, typename TR, typename TY>
struct Inputs {
  Case c;
  std::vector<T> x, ys;
  std::vector<TR> y;
  std::vector<float> w, b;
  ska::simt::Dropout drop;

  Run<T, TR, TY> run(bool held) const {
    Run<T, TR, TY> r;
    const size_t n = static_cast<size_t>(c.rows * c.cols);
    r.sum.assign(n, round_to<T>(NAN));
    r.normed.assign(n, round_to<TY>(NAN));
    r.mean.assign(c.rows, NAN);
    r.rstd.assign(c.rows, NAN);
    ska::simt::Dropout d = drop;
    if (c.dropout) {
      r.bits.assign(n / 8, 0xa5);
      d.bits = r.bits.data();
    }
    ska::simt::layer_norm::add_layer_norm_forward(
        x.data(), y.data(), d, c.scale ? ys.data() : nullptr, w.data(), b.data(), r.sum.data(),
        r.normed.data(), r.mean.data(), r.rstd.data(), c.rows, c.cols, 1e-5f, held);
    return r;
  }
};

template <typename T, typename TR, typename TY>
Inputs<T, TR, TY> make_inputs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs<T, TR, TY> in;
  in.c = c;
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  for (size_t i = 0; i < n; ++i) {
    in.x.push_back(round_to<T>(3.0f + normal(rng)));  // off zero mean: the variance's second pass
    in.y.push_back(round_to<TR>(normal(rng)));
  }
  for (int64_t j = 0; j < c.cols; ++j) {
    in.ys.push_back(round_to<T>(0.1f * normal(rng)));  // LayerScale's gamma, CaiT's init 0.1
    in.w.push_back(1.0f + 0.2f * normal(rng));
    in.b.push_back(0.2f * normal(rng));
  }
  in.drop.seed = 1234;
  in.drop.offset = 40;
  in.drop.keep = 0.9f;
  in.drop.scale = 1.0f / 0.9f;
  return in;
}

template <typename T, typename TR, typename TY>
void check(const Inputs<T, TR, TY>& in, const Run<T, TR, TY>& r, const std::string& what) {
  const Case& c = in.c;
  INFO(c.name << ": " << what);
  const double eps_ty = std::is_same_v<TY, float> ? 1e-6 : 0x1p-8;
  int64_t sums_off = 0, bits_off = 0, normed_off = 0, stats_off = 0;
  for (int64_t row = 0; row < c.rows; ++row) {
    std::vector<double> s(c.cols);
    for (int64_t j = 0; j < c.cols; ++j) {
      const int64_t i = row * c.cols + j;
      // As dropout writes it (rounded to TR), times the scale rounded to T, plus x rounded to T.
      float branch = as_float(in.y[i]);
      if (c.dropout) {
        const float scale = as_float(round_to<TR>(in.drop.scale));
        branch = as_float(round_to<TR>(branch * (kept(in.drop, i) ? scale : 0.0f)));
        bits_off += ((r.bits[i / 8] >> (i % 8)) & 1) != kept(in.drop, i);
      }
      if (c.scale) branch = as_float(round_to<T>(branch * as_float(in.ys[j])));
      const T want = round_to<T>(as_float(in.x[i]) + branch);
      sums_off += !same_bits(std::vector<T>{want}, std::vector<T>{r.sum[i]});
      s[j] = as_float(r.sum[i]);
    }
    double mu = 0.0, var = 0.0;
    for (double v : s) mu += v;
    mu /= static_cast<double>(c.cols);
    for (double v : s) var += (v - mu) * (v - mu);
    const double rstd = 1.0 / std::sqrt(var / static_cast<double>(c.cols) + 1e-5);
    stats_off += std::abs(r.mean[row] - mu) > 1e-5 * (1.0 + std::abs(mu));
    stats_off += std::abs(r.rstd[row] - rstd) > 1e-5 * rstd;
    for (int64_t j = 0; j < c.cols; ++j) {
      const double e = (s[j] - mu) * rstd * in.w[j] + in.b[j];
      const double a = as_float(r.normed[row * c.cols + j]);
      normed_off += !(std::abs(a - e) <= eps_ty * std::abs(e) + 1e-4 * (1.0 + std::abs(in.w[j])));
    }
  }
  CHECK(sums_off == 0);
  CHECK(bits_off == 0);
  CHECK(stats_off == 0);
  CHECK(normed_off == 0);
}

template <typename T, typename TR, typename TY>
void check_case(const Case& c) {
  const Inputs<T, TR, TY> in = make_inputs<T, TR, TY>(c, 17);
  const Run<T, TR, TY> loop = in.run(false), held = in.run(true);
  check(in, loop, "loop kernel");
  check(in, held, "held-row kernel");
  INFO(c.name << ": held-row against loop kernel");
  CHECK(same_bits(held.sum, loop.sum));
  CHECK(same_bits(held.normed, loop.normed));
  CHECK(same_bits(held.mean, loop.mean));
  CHECK(same_bits(held.rstd, loop.rstd));
  CHECK(same_bits(held.bits, loop.bits));
}

// CaiT-S's and ViT-S's rows (512 channels), CaiT-S's 384, rows ending mid-warp, and the widest
// the held-row kernel takes; the dropout needs rows of a multiple of 8.
std::vector<Case> cases() {
  return {
      {"512 channels, LayerScale and dropout", 7, 512, true, true},
      {"384 channels, LayerScale and dropout", 5, 384, true, true},
      {"512 channels, LayerScale", 3, 512, true, false},
      {"200 channels, dropout", 9, 200, false, true},
      {"100 channels", 4, 100, false, false},
      {"1000 channels, LayerScale and dropout", 3, 1000, true, true},
  };
}

TEST_CASE("simt: add_layer_norm forward with LayerScale and dropout (f32 stream, bf16 branch)",
          "[cpu][simt]") {
  for (const Case& c : cases()) check_case<float, bf16, bf16>(c);
}

// The plain layer norm's forward kernels give add_layer_norm's normed rows, mean and rstd for a
// branch of zeros (x + 0 is x: the same sums in the same order), loop and held-row alike.
template <typename TY>
void check_plain_forward(const Case& c) {
  Inputs<float, float, TY> in = make_inputs<float, float, TY>(c, 31);
  std::fill(in.y.begin(), in.y.end(), 0.0f);
  in.c.scale = in.c.dropout = false;
  for (const bool held : {false, true}) {
    INFO(c.name << (held ? ", held row" : ", loop"));
    const Run<float, float, TY> added = in.run(held);
    const size_t n = static_cast<size_t>(c.rows * c.cols);
    std::vector<TY> y(n, round_to<TY>(NAN));
    std::vector<float> mean(c.rows, NAN), rstd(c.rows, NAN);
    ska::simt::layer_norm::layer_norm_forward(in.x.data(), in.w.data(), in.b.data(), y.data(),
                                              mean.data(), rstd.data(), c.rows, c.cols, 1e-5f,
                                              held);
    CHECK(same_bits(y, added.normed));
    CHECK(same_bits(mean, added.mean));
    CHECK(same_bits(rstd, added.rstd));
  }
}

TEST_CASE("simt: layer_norm forward (no residual) equals add_layer_norm with a zero branch",
          "[cpu][simt]") {
  for (const Case& c : cases()) {
    check_plain_forward<float>(c);
    check_plain_forward<bf16>(c);
  }
}

TEST_CASE("simt: add_layer_norm forward with LayerScale and dropout (f32)", "[cpu][simt]") {
  for (const Case& c : cases()) check_case<float, float, float>(c);
}

TEST_CASE("simt: add_layer_norm forward with LayerScale and dropout (bf16)", "[cpu][simt]") {
  for (const Case& c : cases()) check_case<bf16, bf16, bf16>(c);
}

// The backward: the forward of `c` first (its sum, statistics and mask), then the fused backward
// from random gradients of the normed output and of the sum.
template <typename TR, typename TY>
void check_backward(const Case& c) {
  using T = float;
  const Inputs<T, TR, TY> in = make_inputs<T, TR, TY>(c, 23);
  const Run<T, TR, TY> fwd = in.run(false);
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<TY> gy(n);
  std::vector<T> gsum(n);
  for (size_t i = 0; i < n; ++i) {
    gy[i] = round_to<TY>(normal(rng));
    gsum[i] = round_to<T>(normal(rng));
  }
  constexpr bool kLow = !std::is_same_v<TR, T>;  // a 16-bit branch of the f32 stream
  std::vector<T> gx(n, NAN), gscale(c.cols, NAN);
  std::vector<TR> gbranch(n, round_to<TR>(NAN));
  std::vector<float> gw(c.cols, NAN), gb(c.cols, NAN);
  ska::simt::Dropout drop = in.drop;
  if (c.dropout) drop.bits = const_cast<uint8_t*>(fwd.bits.data());
  ska::simt::layer_norm::add_layer_norm_backward<T, TY, std::conditional_t<kLow, TR, bf16>>(
      gy.data(), gsum.data(), fwd.sum.data(), in.w.data(), fwd.mean.data(), fwd.rstd.data(), drop,
      in.y.data(), kLow, c.scale ? in.ys.data() : nullptr, gx.data(), gbranch.data(), gw.data(),
      gb.data(), c.scale ? gscale.data() : nullptr, c.rows, c.cols);

  INFO(c.name << ": fused backward");
  const double eps = 1e-5;  // f32 sums' error, relative to the sum of |terms|
  int64_t gx_off = 0, branch_off = 0;
  std::vector<double> w_sum(c.cols, 0.0), w_terms(c.cols, 0.0), b_sum(c.cols, 0.0),
      b_terms(c.cols, 0.0), s_sum(c.cols, 0.0), s_terms(c.cols, 0.0);
  for (int64_t row = 0; row < c.rows; ++row) {
    const double mu = fwd.mean[row], rs = fwd.rstd[row];
    double mgw = 0.0, mgwx = 0.0, terms = 0.0;
    for (int64_t j = 0; j < c.cols; ++j) {
      const int64_t i = row * c.cols + j;
      const double g = as_float(gy[i]) * double(in.w[j]);
      const double xhat = (as_float(fwd.sum[i]) - mu) * rs;
      mgw += g;
      mgwx += g * xhat;
      terms += std::abs(g) * (1.0 + std::abs(xhat));
    }
    mgw /= static_cast<double>(c.cols);
    mgwx /= static_cast<double>(c.cols);
    for (int64_t j = 0; j < c.cols; ++j) {
      const int64_t i = row * c.cols + j;
      const double gyv = as_float(gy[i]);
      const double xhat = (as_float(fwd.sum[i]) - mu) * rs;
      const double e = rs * (gyv * in.w[j] - mgw - xhat * mgwx) + as_float(gsum[i]);
      const double bound = eps * rs * (terms / c.cols + std::abs(gyv * in.w[j]) * 4.0) +
                           1e-6 * std::abs(e) + 1e-6 * std::abs(double(as_float(gsum[i])));
      gx_off += !(std::abs(double(gx[i]) - e) <= bound);
      w_sum[j] += gyv * xhat;
      w_terms[j] += std::abs(gyv * xhat);
      b_sum[j] += gyv;
      b_terms[j] += std::abs(gyv);
      // The branch's gradient from the grad_x stored, as the kernel forms it: times the scale
      // (rounded to T), cast to the branch's dtype, through the mask.
      float v = gx[i];
      if (c.scale) v = v * in.ys[j];
      if (kLow) v = as_float(round_to<TR>(v));
      const bool keep = !c.dropout || ((fwd.bits[i / 8] >> (i % 8)) & 1);
      if (c.dropout) v = v * (keep ? as_float(round_to<TR>(in.drop.scale)) : 0.0f);
      branch_off += !same_bits(std::vector<TR>{round_to<TR>(v)}, std::vector<TR>{gbranch[i]});
      // The LayerScale's gradient: grad_x times the branch as the sum read it (dropped).
      float dropped = as_float(in.y[i]);
      if (c.dropout) {
        dropped =
            as_float(round_to<TR>(dropped * (keep ? as_float(round_to<TR>(in.drop.scale)) : 0.0f)));
      }
      s_sum[j] += double(gx[i] * dropped);
      s_terms[j] += std::abs(double(gx[i]) * dropped);
    }
  }
  CHECK(gx_off == 0);
  CHECK(branch_off == 0);
  int64_t params_off = 0;
  for (int64_t j = 0; j < c.cols; ++j) {
    params_off += !(std::abs(gw[j] - w_sum[j]) <= eps * w_terms[j] + 1e-6);
    params_off += !(std::abs(gb[j] - b_sum[j]) <= eps * b_terms[j] + 1e-6);
    if (c.scale) params_off += !(std::abs(gscale[j] - s_sum[j]) <= eps * s_terms[j] + 1e-6);
  }
  CHECK(params_off == 0);
}

TEST_CASE("simt: add_layer_norm fused backward with LayerScale and dropout", "[cpu][simt]") {
  for (const Case& c : cases()) {
    if (c.cols > 768) continue;     // the fused kernel's widest rows
    check_backward<bf16, bf16>(c);  // autocast: a bf16 branch and normed output, f32 stream
    check_backward<float, float>(c);
  }
  // 47 blocks of 64 rows: the parameter gradients' partials summed by more than one lane each.
  check_backward<bf16, bf16>(
      {"3000 rows of 64 channels, LayerScale and dropout", 3000, 64, true, true});
}

}  // namespace
