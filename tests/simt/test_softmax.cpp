// Softmax's kernels' own code (cuda/kernels/softmax.cu), run on the host by tests/simt: softmax
// and log_softmax with a scale and a mask broadcast over rows, forward and backward, a warp a row
// (65 and 64 keys as ViT-S's and CaiT-S's attention weights, 1,000 columns) and a block a row
// (3,000 columns cached in shared memory, 12,000 not). Each output to the bit against the host's
// float arithmetic in the kernels' order (lanes, butterflies, block sums), against f64 within f32
// rounding, and the same bits whatever order a block's threads run in.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/simt/softmax_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace sm = ska::simt::softmax;

const auto kAdd = [](float a, float b) { return a + b; };

struct Case {
  std::string name;
  int64_t rows;
  int cols;
  float scale;
  int64_t mask_rows;  // 0: no mask
};

std::vector<Case> cases() {
  return {
      {"ViT-S's attention weights, 65 keys, scaled, a mask over 65 query rows", 2 * 8 * 65, 65,
       0.125f, 65},
      {"CaiT-S's talking heads, 64 keys", 2 * 8 * 64, 64, 1.0f, 0},
      {"1,000 columns (32 a lane)", 20, 1000, 0.5f, 4},
      {"3,000 columns, a block a row, cached", 6, 3000, 1.0f, 2},
      {"12,000 columns, a block a row, not cached", 3, 12000, 2.0f, 0},
  };
}

int per_lane_for(int cols) {
  int k = 1;
  while (k * 32 < cols) k *= 2;
  return k;
}
int block_threads_for(int cols) { return cols <= 4096 ? 512 : 1024; }

float softmax_out(float z, float mx, float inv_sum, float log_sum, bool log) {
  return log ? z - mx - log_sum : std::exp(z - mx) * inv_sum;
}
float softmax_grad(float y, float g, float red, float scale, bool log) {
  return scale * (log ? g - std::exp(y) * red : y * (g - red));
}

// The forward in the kernels' order: z[c] the row's logits.
std::vector<float> forward_row(const std::vector<float>& z, bool log) {
  const int cols = static_cast<int>(z.size());
  float mx = -INFINITY;
  for (float v : z) mx = std::max(mx, v);
  float sum;
  if (cols <= 1024) {
    std::vector<float> lanes(32, 0.0f);
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < per_lane_for(cols); ++i) {
        const int c = l + 32 * i;
        if (c < cols) lanes[l] += std::exp(z[c] - mx);
      }
    }
    sum = ska::simt::warp_butterfly(lanes, kAdd);
  } else {
    const int threads = block_threads_for(cols);
    std::vector<float> t(static_cast<size_t>(threads), 0.0f);
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c % threads)] += std::exp(z[c] - mx);
    sum = ska::simt::block_sum(t);
  }
  const float inv_sum = 1.0f / sum, log_sum = std::log(sum);
  std::vector<float> y(z.size());
  for (int c = 0; c < cols; ++c) y[c] = softmax_out(z[c], mx, inv_sum, log_sum, log);
  return y;
}

// The backward's reduction (sum of g * y, or of g) in the kernels' order; the warp form adds the
// zero products of the lanes' columns past the row too, as the kernel does.
float backward_red(const std::vector<float>& y, const std::vector<float>& g, bool log) {
  const int cols = static_cast<int>(y.size());
  if (cols <= 1024) {
    std::vector<float> lanes(32, 0.0f);
    for (int l = 0; l < 32; ++l) {
      for (int i = 0; i < per_lane_for(cols); ++i) {
        const int c = l + 32 * i;
        const float gv = c < cols ? g[c] : 0.0f, yv = c < cols ? y[c] : 0.0f;
        lanes[l] += log ? gv : gv * yv;
      }
    }
    return ska::simt::warp_butterfly(lanes, kAdd);
  }
  const int threads = block_threads_for(cols);
  std::vector<float> t(static_cast<size_t>(threads), 0.0f);
  for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c % threads)] += log ? g[c] : g[c] * y[c];
  return ska::simt::block_sum(t);
}

template <typename T>
double eps_of() {
  return std::is_same_v<T, bf16> ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
}

template <typename T>
void check(const Case& c, bool log) {
  std::mt19937 rng(71);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const size_t n = static_cast<size_t>(c.rows) * c.cols;
  std::vector<T> x(n), g(n), mask(static_cast<size_t>(std::max<int64_t>(c.mask_rows, 1)) * c.cols);
  for (T& v : x) v = round_to<T>(normal(rng));
  for (T& v : g) v = round_to<T>(normal(rng));
  for (size_t i = 0; i < mask.size(); ++i) mask[i] = round_to<T>(i % 5 == 0 ? -1e4f : 0.0f);
  const T* m = c.mask_rows > 0 ? mask.data() : nullptr;

  std::vector<T> y = ska::simt::unwritten<T>(n), gx = ska::simt::unwritten<T>(n);
  sm::forward<T>(x.data(), m, c.mask_rows, y.data(), c.rows, c.cols, c.scale, log);
  const float gscale = 0.5f;
  sm::backward<T>(y.data(), g.data(), gx.data(), c.rows, c.cols, gscale, log);

  std::vector<T> want_y(n), want_gx(n);
  int64_t far = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<float> z(static_cast<size_t>(c.cols)), yr(z.size()), gr(z.size());
    for (int k = 0; k < c.cols; ++k) {
      const size_t i = static_cast<size_t>(r) * c.cols + k;
      z[k] = c.scale * static_cast<float>(value(x[i]));
      if (m != nullptr) z[k] += static_cast<float>(value(m[(r % c.mask_rows) * c.cols + k]));
    }
    const std::vector<float> out = forward_row(z, log);
    // f64: the softmax of the same logits.
    double mx = -INFINITY, sum = 0.0;
    for (float v : z) mx = std::max<double>(mx, v);
    for (float v : z) sum += std::exp(v - mx);
    for (int k = 0; k < c.cols; ++k) {
      const size_t i = static_cast<size_t>(r) * c.cols + k;
      want_y[i] = round_to<T>(out[k]);
      const double lse = std::log(sum);
      const double exact = log ? z[k] - mx - lse : std::exp(z[k] - mx) / sum;
      // A few f32 roundings: of the differences for log; for softmax exp's, the division's and
      // the rounding of z - max, which exp turns into a relative error of |z - max| ulps. Then
      // T's.
      const double terms =
          log ? std::abs(z[k]) + std::abs(mx) + lse : std::abs(exact) * (1.0 + std::abs(z[k] - mx));
      far += !(std::abs(value(y[i]) - exact) <=
               8 * std::ldexp(1.0, -24) * terms + eps_of<T>() * std::abs(exact) + 1e-30);
      yr[k] = static_cast<float>(value(y[i]));
      gr[k] = static_cast<float>(value(g[i]));
    }
    const float red = backward_red(yr, gr, log);
    for (int k = 0; k < c.cols; ++k) {
      want_gx[static_cast<size_t>(r) * c.cols + k] =
          round_to<T>(softmax_grad(yr[k], gr[k], red, gscale, log));
    }
  }
  CHECK(same_bits(y, want_y));
  CHECK(far == 0);
  CHECK(same_bits(gx, want_gx));

  ska::simt::in_other_orders(72, [&](const char* order) {
    INFO(order);
    std::vector<T> y2 = ska::simt::unwritten<T>(n), gx2 = ska::simt::unwritten<T>(n);
    sm::forward<T>(x.data(), m, c.mask_rows, y2.data(), c.rows, c.cols, c.scale, log);
    sm::backward<T>(y.data(), g.data(), gx2.data(), c.rows, c.cols, gscale, log);
    CHECK(same_bits(y2, y));
    CHECK(same_bits(gx2, gx));
  });
}

TEST_CASE("simt: softmax: forward and backward to the bit, warps and blocks",
          "[cpu][simt][softmax]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    SECTION(c.name + ", f32") { check<float>(c, false); }
    SECTION(c.name + ", bf16") { check<bf16>(c, false); }
    SECTION(c.name + ", log_softmax, f32") { check<float>(c, true); }
  }
}

}  // namespace
