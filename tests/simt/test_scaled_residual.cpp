// The residual sums with per-channel scales' own code (cuda/kernels/scaled_residual.cu), run on
// the host by tests/simt: out = x * xs + (dropout(y) * yk) * ys and the backward pass's gx and gy
// to the bit against the host's float arithmetic in the order of the ops they fuse (dropout,
// drop path's mul, the scales' muls, the add; each product rounded to its op's dtype), the
// dropout mask against the Philox draws (a graph's offset base included), the scales' gradients
// against f64 sums, and the same bits whatever order a block's threads run in. CaiT's blocks
// (LayerScale and dropout, an f32 stream with a bf16 branch), MetaFormer's (res_scale and drop
// path), rows ending mid-tile and mid-byte, and more rows than the backward's partials hold.
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

#include "tests/simt/scaled_residual_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::as_float;
using ska::simt::Dropout;
using ska::simt::kept;
using ska::simt::round_to;
using ska::simt::same_bits;

// v as a T tensor holding it gives it back.
template <typename T>
float rounded(float v) {
  return as_float(round_to<T>(v));
}

struct Case {
  std::string name;
  int64_t batch, rows, cols;
  bool xs, ys, yk, dropout;
};

std::vector<Case> cases() {
  return {
      {"CaiT-S block: LayerScale and dropout, 384 channels", 2, 2 * 65, 384, false, true, false,
       true},
      {"MetaFormer block: res_scale, LayerScale, drop path, 72 channels", 4, 4 * 49, 72, true, true,
       true, false},
      {"everything, 41 channels (the mask ends mid-byte)", 7, 7, 41, true, true, true, true},
      {"a plain sum with dropout, 3 channels", 5, 5 * 6, 3, false, false, false, true},
      {"LayerScale and drop path, more rows than 1024 partials of 64", 2, 70000, 5, false, true,
       true, false},
  };
}

template <typename TX, typename TY, typename T>
struct Inputs {
  Case c;
  std::vector<TX> x;
  std::vector<TY> y, yk;
  std::vector<T> xs, ys, g;
  int64_t offset_base = 6;
  Dropout drop;  // bits set per run
};

template <typename TX, typename TY, typename T>
Inputs<TX, TY, T> make_inputs(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs<TX, TY, T> in;
  in.c = c;
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  for (size_t i = 0; i < n; ++i) {
    in.x.push_back(round_to<TX>(normal(rng)));
    in.y.push_back(round_to<TY>(normal(rng)));
    in.g.push_back(round_to<T>(normal(rng)));
  }
  for (int64_t j = 0; j < c.cols; ++j) {
    in.xs.push_back(round_to<T>(1.0f + 0.3f * normal(rng)));  // res_scale, init 1
    in.ys.push_back(round_to<T>(0.1f * normal(rng)));         // LayerScale, CaiT's init 0.1
  }
  for (int64_t b = 0; b < c.batch; ++b)  // drop path: 0 or 1 / keep
    in.yk.push_back(round_to<TY>(b % 3 == 1 ? 0.0f : 1.0f / 0.9f));
  in.drop.seed = 4321;
  in.drop.offset = 40;
  in.drop.keep = 0.9f;
  in.drop.scale = 1.0f / 0.9f;
  return in;
}

template <typename TX, typename TY, typename T>
struct Run {
  std::vector<T> out, gxs, gys;
  std::vector<TX> gx;
  std::vector<TY> gy;
  std::vector<uint8_t> bits;
};

// The forward, then the backward from in.g: every gradient, or (`sums` false) gx and gy alone,
// without x and y.
template <typename TX, typename TY, typename T>
Run<TX, TY, T> run(const Inputs<TX, TY, T>& in, bool sums) {
  const Case& c = in.c;
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  Run<TX, TY, T> r;
  r.out.assign(n, round_to<T>(NAN));
  r.gx.assign(n, round_to<TX>(NAN));
  r.gy.assign(n, round_to<TY>(NAN));
  r.gxs.assign(c.cols, round_to<T>(NAN));
  r.gys = r.gxs;
  Dropout d = in.drop;
  if (c.dropout) {
    r.bits.assign((n + 7) / 8, 0xa5);
    d.bits = r.bits.data();
    d.offset_base = &in.offset_base;
  }
  const T* xs = c.xs ? in.xs.data() : nullptr;
  const T* ys = c.ys ? in.ys.data() : nullptr;
  const TY* yk = c.yk ? in.yk.data() : nullptr;
  ska::simt::scaled_residual::forward(c.rows, c.cols, c.batch, in.x.data(), xs, in.y.data(), ys, yk,
                                      d, r.out.data());
  ska::simt::scaled_residual::backward(
      c.rows, c.cols, c.batch, in.g.data(), sums ? in.x.data() : nullptr, xs,
      sums ? in.y.data() : nullptr, ys, yk, d, r.gx.data(), r.gy.data(),
      sums && xs ? r.gxs.data() : nullptr, sums && ys ? r.gys.data() : nullptr);
  return r;
}

template <typename TX, typename TY, typename T>
void check(const Inputs<TX, TY, T>& in, const Run<TX, TY, T>& r, bool sums) {
  const Case& c = in.c;
  Dropout drawn = in.drop;  // as the runs draw it
  drawn.offset_base = &in.offset_base;
  const float drop_scale = rounded<TY>(in.drop.scale);  // as dropout multiplies a TY tensor
  const int64_t per_sample = c.rows / c.batch;
  int64_t bits_off = 0, out_off = 0, gx_off = 0, gy_off = 0;
  std::vector<double> gxs(c.cols, 0.0), gys(c.cols, 0.0), gxs_abs(c.cols, 0.0),
      gys_abs(c.cols, 0.0);
  for (int64_t row = 0; row < c.rows; ++row) {
    const float factor = as_float(in.yk[row / per_sample]);
    for (int64_t j = 0; j < c.cols; ++j) {
      const int64_t i = row * c.cols + j;
      const bool keep = !c.dropout || kept(drawn, i);
      if (c.dropout) bits_off += ((r.bits[i / 8] >> (i % 8)) & 1) != keep;
      // Forward: dropout, drop path, the scales, the sum; each op's result in its dtype.
      float branch = as_float(in.y[i]);
      if (c.dropout) branch = rounded<TY>(branch * (keep ? drop_scale : 0.0f));
      if (c.yk) branch = rounded<TY>(branch * factor);
      const float scaled_branch = c.ys ? rounded<T>(branch * as_float(in.ys[j])) : branch;
      const float stream =
          c.xs ? rounded<T>(as_float(in.x[i]) * as_float(in.xs[j])) : as_float(in.x[i]);
      out_off +=
          !same_bits(std::vector<T>{round_to<T>(stream + scaled_branch)}, std::vector<T>{r.out[i]});
      // Backward: each op's backward in reverse order.
      const float g = as_float(in.g[i]);
      const TX gx = round_to<TX>(c.xs ? g * as_float(in.xs[j]) : g);
      float gy = c.ys ? g * as_float(in.ys[j]) : g;
      if (c.yk) gy = rounded<TY>(rounded<TY>(gy) * factor);
      if (c.dropout) gy = rounded<TY>(gy) * (keep ? drop_scale : 0.0f);
      gx_off += !same_bits(std::vector<TX>{gx}, std::vector<TX>{r.gx[i]});
      gy_off += !same_bits(std::vector<TY>{round_to<TY>(gy)}, std::vector<TY>{r.gy[i]});
      const double tx = rounded<T>(g * as_float(in.x[i])), ty = rounded<T>(g * branch);
      gxs[j] += tx;
      gys[j] += ty;
      gxs_abs[j] += std::abs(tx);
      gys_abs[j] += std::abs(ty);
    }
  }
  CHECK(bits_off == 0);
  CHECK(out_off == 0);
  CHECK(gx_off == 0);
  CHECK(gy_off == 0);
  if (!sums) return;
  // The scales' gradients: f32 sums of the rounded products in the kernels' order, then rounded
  // to T.
  const double rounding = std::is_same_v<T, float>  ? 0.0
                          : std::is_same_v<T, bf16> ? 0x1p-8
                                                    : 0x1p-11;
  int64_t gxs_off = 0, gys_off = 0;
  for (int64_t j = 0; j < c.cols; ++j) {
    const auto near = [&](T got, double want, double abs) {
      return std::abs(as_float(got) - want) <= rounding * std::abs(want) + 1e-6 * abs + 1e-30;
    };
    if (c.xs) gxs_off += !near(r.gxs[j], gxs[j], gxs_abs[j]);
    if (c.ys) gys_off += !near(r.gys[j], gys[j], gys_abs[j]);
  }
  CHECK(gxs_off == 0);
  CHECK(gys_off == 0);
}

template <typename TX, typename TY, typename T>
void check_case(const Case& c) {
  INFO(c.name);
  const Inputs<TX, TY, T> in = make_inputs<TX, TY, T>(c, 41);
  const Run<TX, TY, T> r = run(in, true);
  check(in, r, true);
  // Without the scales' gradients x and y are not read, and gx and gy keep their bits.
  const Run<TX, TY, T> plain = run(in, false);
  check(in, plain, false);
  CHECK(same_bits(plain.gx, r.gx));
  CHECK(same_bits(plain.gy, r.gy));
  ska::simt::in_other_orders(9, [&](const char* order) {
    INFO(order);
    const Run<TX, TY, T> again = run(in, true);
    CHECK(same_bits(again.out, r.out));
    CHECK(same_bits(again.bits, r.bits));
    CHECK(same_bits(again.gx, r.gx));
    CHECK(same_bits(again.gy, r.gy));
    CHECK(same_bits(again.gxs, r.gxs));
    CHECK(same_bits(again.gys, r.gys));
  });
}

TEST_CASE("simt: scaled_residual forward and backward (f32 stream, bf16 branch)", "[cpu][simt]") {
  for (const Case& c : cases()) check_case<float, bf16, float>(c);
}

TEST_CASE("simt: scaled_residual forward and backward (f32)", "[cpu][simt]") {
  for (const Case& c : cases()) check_case<float, float, float>(c);
}

TEST_CASE("simt: scaled_residual forward and backward (bf16, f16)", "[cpu][simt]") {
  const std::vector<Case> all = cases();
  for (const Case& c : {all[0], all[1], all[2]}) {
    check_case<bf16, bf16, bf16>(c);
    check_case<__half, __half, __half>(c);
  }
}

}  // namespace
