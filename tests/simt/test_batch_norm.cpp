// Batch norm's kernels' own code (cuda/kernels/batch_norm.cu), run on the host by tests/simt, in
// training as CvT's convolutional projections run it: the batch's statistics by Welford partials
// (each thread's elements, the warp's shuffle-down merges, the block's warps in order, the
// splits in order), the running statistics, the normed output, and the backward's sums and
// input gradient. Each to the bit against the host's float arithmetic in the kernels' order,
// the statistics and gradients against f64, and the same bits whatever order a block's threads
// run in. f32 and bf16 activations with f32 parameters; one split a channel and several.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/simt/batch_norm_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace bn = ska::simt::batch_norm;

constexpr int kThreads = 256;

struct Welford {
  float n, mean, m2;
};

Welford merge(Welford a, Welford b) {
  const float n = a.n + b.n;
  if (n == 0.0f) return a;
  const float delta = b.mean - a.mean;
  const float fb = b.n / n;
  return {n, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * a.n * fb};
}

// A block's 256 threads' Welford triples merged as welford_block merges them: each warp by
// shuffle-down steps (a lane past the warp's end gives its own), then the warps in order.
Welford block_merge(const std::vector<Welford>& t) {
  std::vector<Welford> warps;
  for (int w = 0; w < kThreads / 32; ++w) {
    std::array<Welford, 32> v{};
    for (int l = 0; l < 32; ++l) v[l] = t[static_cast<size_t>(32 * w + l)];
    for (int o = 16; o > 0; o >>= 1) {
      std::array<Welford, 32> next{};
      for (int l = 0; l < 32; ++l) next[l] = merge(v[l], l + o < 32 ? v[l + o] : v[l]);
      v = next;
    }
    warps.push_back(v[0]);
  }
  Welford w = warps[0];
  for (size_t i = 1; i < warps.size(); ++i) w = merge(w, warps[i]);
  return w;
}

struct Case {
  std::string name;
  int64_t n, c, s, sms;
};

std::vector<Case> cases() {
  return {
      {"CvT's projection at batch 4: [4, 64, 16 x 16], one split a channel", 4, 64, 256, 132},
      {"[16, 8, 32 x 32]: several splits a channel", 16, 8, 1024, 132},
      {"[3, 5, 7 x 3]: a block mostly idle", 3, 5, 21, 132},
      {"[8, 2, 2048] on 4 SMs", 8, 2, 2048, 4},
      {"[64, 5, 7 x 3]: a row of 21 not dividing the 256-thread step", 64, 5, 21, 132},
  };
}

template <typename T>
void check(const Case& cs) {
  const int64_t n = cs.n, c = cs.c, s = cs.s, m = n * s;
  const size_t total = static_cast<size_t>(n * c * s);
  std::mt19937 rng(91);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> x(total), gy(total);
  for (size_t i = 0; i < total; ++i) {
    x[i] = round_to<T>(2.0f + 1.5f * normal(rng));  // off zero mean
    gy[i] = round_to<T>(normal(rng));
  }
  std::vector<float> w(c), b(c), rm(c), rv(c);
  for (int64_t k = 0; k < c; ++k) {
    w[k] = 1.0f + 0.1f * normal(rng);
    b[k] = 0.1f * normal(rng);
    rm[k] = 0.5f;
    rv[k] = 2.0f;
  }
  const float eps = 1e-5f, momentum = 0.1f;
  const auto at = [&](int64_t ch, int64_t i) {
    return static_cast<float>(value(x[static_cast<size_t>((i / s) * c * s + ch * s + i % s)]));
  };

  std::vector<float> mean(c, NAN), rstd(c, NAN), rm_got = rm, rv_got = rv;
  std::vector<T> y = ska::simt::unwritten<T>(total);
  bn::forward<T>(x.data(), w.data(), b.data(), n, c, s, eps, momentum, rm_got.data(), rv_got.data(),
                 y.data(), mean.data(), rstd.data(), cs.sms);

  const int splits = bn::splits(n, c, s, cs.sms);
  std::vector<float> want_mean(c), want_rstd(c), want_rm(c), want_rv(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    std::vector<Welford> parts;
    for (int sp = 0; sp < splits; ++sp) {
      std::vector<Welford> t(kThreads, Welford{0.0f, 0.0f, 0.0f});
      for (int th = 0; th < kThreads; ++th) {
        for (int64_t i = int64_t{sp} * kThreads + th; i < m; i += int64_t{splits} * kThreads) {
          Welford& q = t[static_cast<size_t>(th)];
          const float v = at(ch, i);
          q.n += 1.0f;
          const float d = v - q.mean;
          q.mean += d / q.n;
          q.m2 += d * (v - q.mean);
        }
      }
      parts.push_back(block_merge(t));
    }
    Welford q = parts[0];
    for (int k = 1; k < splits; ++k) q = merge(q, parts[static_cast<size_t>(k)]);
    const float var = q.n > 0.0f ? q.m2 / q.n : 0.0f;
    want_mean[ch] = q.mean;
    want_rstd[ch] = 1.0f / std::sqrt(var + eps);
    want_rm[ch] = (1.0f - momentum) * rm[ch] + momentum * q.mean;
    const float unbiased = q.n > 1.0f ? q.m2 / (q.n - 1.0f) : var;
    want_rv[ch] = (1.0f - momentum) * rv[ch] + momentum * unbiased;
    // f64.
    double sum = 0.0, sq = 0.0;
    for (int64_t i = 0; i < m; ++i) sum += at(ch, i);
    const double mu = sum / m;
    for (int64_t i = 0; i < m; ++i) sq += (at(ch, i) - mu) * (at(ch, i) - mu);
    CHECK(std::abs(mean[ch] - mu) <= 1e-5 * (std::abs(mu) + 1.0));
    CHECK(std::abs(rstd[ch] - 1.0 / std::sqrt(sq / m + eps)) <= 1e-4 * rstd[ch]);
  }
  CHECK(same_bits(mean, want_mean));
  CHECK(same_bits(rstd, want_rstd));
  CHECK(same_bits(rm_got, want_rm));
  CHECK(same_bits(rv_got, want_rv));
  std::vector<T> want_y(total);
  for (size_t i = 0; i < total; ++i) {
    const int64_t ch = (static_cast<int64_t>(i) / s) % c;
    float v = (static_cast<float>(value(x[i])) - mean[ch]) * rstd[ch];
    v *= w[ch];
    v += b[ch];
    want_y[i] = round_to<T>(v);
  }
  CHECK(same_bits(y, want_y));

  std::vector<T> gx = ska::simt::unwritten<T>(total);
  std::vector<float> gw(c, NAN), gb(c, NAN);
  bn::backward<T>(gy.data(), x.data(), w.data(), mean.data(), rstd.data(), n, c, s, gx.data(),
                  gw.data(), gb.data(), cs.sms);
  std::vector<float> want_sg(c), want_sgx(c);
  for (int64_t ch = 0; ch < c; ++ch) {
    float sg = 0.0f, sgx = 0.0f;
    for (int sp = 0; sp < splits; ++sp) {
      std::vector<float> tg(kThreads, 0.0f), tgx(kThreads, 0.0f);
      for (int th = 0; th < kThreads; ++th) {
        for (int64_t i = int64_t{sp} * kThreads + th; i < m; i += int64_t{splits} * kThreads) {
          const size_t e = static_cast<size_t>((i / s) * c * s + ch * s + i % s);
          const float g = static_cast<float>(value(gy[e]));
          tg[th] += g;
          tgx[th] += g * (static_cast<float>(value(x[e])) - mean[ch]) * rstd[ch];
        }
      }
      sg += ska::simt::block_sum(tg);
      sgx += ska::simt::block_sum(tgx);
    }
    want_sg[ch] = sg;
    want_sgx[ch] = sgx;
  }
  CHECK(same_bits(gb, want_sg));
  CHECK(same_bits(gw, want_sgx));
  std::vector<T> want_gx(total);
  const float inv_m = 1.0f / static_cast<float>(m);
  int64_t far = 0;
  for (size_t i = 0; i < total; ++i) {
    const int64_t ch = (static_cast<int64_t>(i) / s) % c;
    const float scale = rstd[ch] * w[ch];
    float g = static_cast<float>(value(gy[i]));
    const float xhat = (static_cast<float>(value(x[i])) - mean[ch]) * rstd[ch];
    g -= (want_sg[ch] + xhat * want_sgx[ch]) * inv_m;
    want_gx[i] = round_to<T>(g * scale);
    // f64, from the same statistics.
    const double exact =
        (value(gy[i]) -
         (static_cast<double>(want_sg[ch]) + static_cast<double>(xhat) * want_sgx[ch]) / m) *
        scale;
    far += !(std::abs(value(gx[i]) - exact) <=
             (std::is_same_v<T, bf16> ? 0x1p-7 : 1e-5) * (std::abs(exact) + 1e-2));
  }
  CHECK(same_bits(gx, want_gx));
  CHECK(far == 0);

  ska::simt::in_other_orders(92, [&](const char* order) {
    INFO(order);
    std::vector<float> mean2(c), rstd2(c), rm2 = rm, rv2 = rv, gw2(c), gb2(c);
    std::vector<T> y2 = ska::simt::unwritten<T>(total), gx2 = ska::simt::unwritten<T>(total);
    bn::forward<T>(x.data(), w.data(), b.data(), n, c, s, eps, momentum, rm2.data(), rv2.data(),
                   y2.data(), mean2.data(), rstd2.data(), cs.sms);
    bn::backward<T>(gy.data(), x.data(), w.data(), mean2.data(), rstd2.data(), n, c, s, gx2.data(),
                    gw2.data(), gb2.data(), cs.sms);
    CHECK(same_bits(mean2, mean));
    CHECK(same_bits(rstd2, rstd));
    CHECK(same_bits(y2, y));
    CHECK(same_bits(gx2, gx));
    CHECK(same_bits(gw2, gw));
  });
}

TEST_CASE(
    "simt: batch norm: the grid-stride walks carry offsets and channels as divisions give them",
    "[cpu][simt][batch_norm]") {
  // Steps that are and are not multiples of the spatial size, wider than a channel's row or the
  // whole tensor, a spatial size of 1: every step's offset (channel ch's element i lies at
  // (i / S) * C * S + ch * S + i % S) and channel ((i / S) % C), 200 steps each.
  struct Walk {
    int64_t n, c, s, first, step;
  };
  for (const Walk& w : std::vector<Walk>{{64, 5, 21, 3, 256},
                                         {64, 5, 21, 20, 2048},
                                         {8, 3, 7, 0, 1},
                                         {4, 6, 1, 2, 13},
                                         {16, 384, 4, 255, 131072},
                                         {512, 64, 256, 1000, 135168}}) {
    INFO(w.n << " x " << w.c << " x " << w.s << ", from " << w.first << " by " << w.step);
    const int count = 200;
    const int64_t ch = w.c - 1;
    const std::vector<int64_t> offsets =
        bn::channel_offsets(w.n, w.c, w.s, ch, w.first, w.step, count);
    const std::vector<int64_t> channels =
        bn::element_channels(w.n, w.c, w.s, w.first, w.step, count);
    for (int k = 0; k < count; ++k) {
      const int64_t i = w.first + k * w.step;
      CHECK(offsets[k] == (i / w.s) * w.c * w.s + ch * w.s + i % w.s);
      CHECK(channels[k] == (i / w.s) % w.c);
    }
  }
}

TEST_CASE("simt: batch norm: training statistics, output and gradients to the bit",
          "[cpu][simt][batch_norm]") {
  CHECK(bn::splits(4, 64, 256, 132) == 1);
  CHECK(bn::splits(16, 8, 1024, 132) > 1);
  for (const Case& c : cases()) {
    INFO(c.name);
    SECTION(c.name + ", f32") { check<float>(c); }
    SECTION(c.name + ", bf16") { check<bf16>(c); }
  }
}

}  // namespace
