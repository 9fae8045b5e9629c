// Cross-entropy's kernels' own code (cuda/kernels/cross_entropy.cu), run on the host by
// tests/simt: class indices with and without label smoothing, soft targets (mixup's two-hot
// rows), an index outside the classes (a NaN loss and a zero gradient for its row, no read out of
// bounds), over 10, 100, 1,000 and 5,000 classes (blocks of 128, 256 and 512 threads), f32 and
// bf16 logits. The loss, the log-sum-exp and the gradient to the bit against the host's float
// arithmetic in the kernels' order (each thread's columns, block sums), the loss against f64, and
// the same bits whatever order a block's threads run in.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/simt/cross_entropy_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::as_float;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace ce = ska::simt::cross_entropy;

// Each thread's fold of its columns c = t, t + threads, ..., then block_sum (or the maximum).
std::vector<float> per_thread(int threads, int64_t cols, const std::function<float(int64_t)>& v) {
  std::vector<float> t(static_cast<size_t>(threads), 0.0f);
  for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c % threads)] += v(c);
  return t;
}

struct Expected {
  std::vector<float> loss, lse;
};

template <typename T>
Expected expected_forward(const std::vector<T>& x, const std::vector<int64_t>& index,
                          const std::vector<T>& prob, float eps, int64_t rows, int64_t cols) {
  const int threads = ce::threads_for(cols);
  const float inv_c = 1.0f / static_cast<float>(cols);
  Expected e;
  for (int64_t r = 0; r < rows; ++r) {
    const auto at = [&](int64_t c) { return as_float(x[static_cast<size_t>(r * cols + c)]); };
    const auto pat = [&](int64_t c) { return as_float(prob[static_cast<size_t>(r * cols + c)]); };
    float mx = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, at(c));
    const float sum_x = ska::simt::block_sum(per_thread(threads, cols, at));
    const float sum_e = ska::simt::block_sum(
        per_thread(threads, cols, [&](int64_t c) { return std::exp(at(c) - mx); }));
    const float lse = mx + std::log(sum_e);
    float l;
    if (!prob.empty()) {
      const float sum_p = ska::simt::block_sum(per_thread(threads, cols, pat));
      const float sum_px = ska::simt::block_sum(
          per_thread(threads, cols, [&](int64_t c) { return pat(c) * at(c); }));
      const float sum_q = (1.0f - eps) * sum_p + eps;
      const float sum_qx = (1.0f - eps) * sum_px + eps * inv_c * sum_x;
      l = lse * sum_q - sum_qx;
    } else {
      const int64_t k = index[static_cast<size_t>(r)];
      l = k >= 0 && k < cols ? (1.0f - eps) * (lse - at(k)) + eps * (lse - sum_x * inv_c) : NAN;
    }
    e.loss.push_back(l);
    e.lse.push_back(lse);
  }
  return e;
}

struct Case {
  std::string name;
  int64_t rows, cols;
  float smoothing;
  bool soft;
};

std::vector<Case> cases() {
  return {
      {"CIFAR-10: 10 classes, smoothing 0.1", 64, 10, 0.1f, false},
      {"CIFAR-100: 100 classes, no smoothing", 8, 100, 0.0f, false},
      {"ImageNet: 1,000 classes, soft targets (mixup), smoothing 0.1", 4, 1000, 0.1f, true},
      {"5,000 classes: blocks of 512", 3, 5000, 0.1f, false},
  };
}

template <typename T>
void check(const Case& c) {
  std::mt19937 rng(81);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  std::vector<T> x(n), prob;
  for (T& v : x) v = round_to<T>(normal(rng));
  std::vector<int64_t> index;
  if (c.soft) {  // two-hot rows: lambda and 1 - lambda
    prob.assign(n, round_to<T>(0.0f));
    for (int64_t r = 0; r < c.rows; ++r) {
      prob[static_cast<size_t>(r * c.cols + (r * 7) % c.cols)] = round_to<T>(0.75f);
      prob[static_cast<size_t>(r * c.cols + (r * 7 + 3) % c.cols)] = round_to<T>(0.25f);
    }
  } else {
    for (int64_t r = 0; r < c.rows; ++r) index.push_back((r * 13 + 5) % c.cols);
    index[1] = -1;      // outside the classes: NaN loss, zero gradient
    index[2] = c.cols;  // likewise
  }
  const int64_t* ip = c.soft ? nullptr : index.data();
  const T* pp = c.soft ? prob.data() : nullptr;
  std::vector<float> loss(static_cast<size_t>(c.rows), -1.0f), lse = loss;
  ce::forward<T>(x.data(), ip, pp, c.smoothing, c.rows, c.cols, loss.data(), lse.data());
  const Expected e = expected_forward(x, index, prob, c.smoothing, c.rows, c.cols);
  CHECK(same_bits(lse, e.lse));
  for (int64_t r = 0; r < c.rows; ++r) {
    const float got = loss[static_cast<size_t>(r)], want = e.loss[static_cast<size_t>(r)];
    CHECK((std::isnan(want) ? std::isnan(got)
                            : same_bits(std::vector<float>{got}, std::vector<float>{want})));
    if (std::isnan(want)) continue;
    // f64: sum_c q_c * (lse - x_c) with q the smoothed target.
    double mx = -INFINITY, sum = 0.0, exact = 0.0;
    for (int64_t k = 0; k < c.cols; ++k) mx = std::max<double>(mx, as_float(x[r * c.cols + k]));
    for (int64_t k = 0; k < c.cols; ++k) sum += std::exp(as_float(x[r * c.cols + k]) - mx);
    const double l = mx + std::log(sum);
    for (int64_t k = 0; k < c.cols; ++k) {
      const double target = c.soft ? as_float(prob[r * c.cols + k]) : (k == index[r] ? 1.0 : 0.0);
      const double q = (1.0 - c.smoothing) * target + c.smoothing / c.cols;
      exact += q * (l - as_float(x[r * c.cols + k]));
    }
    CHECK(std::abs(got - exact) <= 1e-5 * (std::abs(exact) + l));
  }

  std::vector<float> grad_loss(static_cast<size_t>(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) grad_loss[static_cast<size_t>(r)] = 1.0f / (r + 1);
  std::vector<T> grad = ska::simt::unwritten<T>(n), want(n);
  ce::backward<T>(x.data(), lse.data(), ip, pp, c.smoothing, grad_loss.data(), c.rows, c.cols,
                  grad.data());
  const int threads = ce::threads_for(c.cols);
  const float uniform = c.smoothing / static_cast<float>(c.cols);
  for (int64_t r = 0; r < c.rows; ++r) {
    float sum_q = 1.0f;
    const int64_t k = c.soft ? -1 : index[static_cast<size_t>(r)];
    if (c.soft) {
      sum_q = (1.0f - c.smoothing) *
                  ska::simt::block_sum(per_thread(
                      threads, c.cols, [&](int64_t j) { return as_float(prob[r * c.cols + j]); })) +
              c.smoothing;
    } else if (k < 0 || k >= c.cols) {
      sum_q = 0.0f;
    }
    for (int64_t j = 0; j < c.cols; ++j) {
      const float q = c.soft
                          ? (1.0f - c.smoothing) * as_float(prob[r * c.cols + j]) + uniform
                          : (sum_q == 0.0f ? 0.0f : uniform + (j == k ? 1.0f - c.smoothing : 0.0f));
      want[static_cast<size_t>(r * c.cols + j)] =
          round_to<T>(grad_loss[r] * (std::exp(as_float(x[r * c.cols + j]) - lse[r]) * sum_q - q));
    }
  }
  CHECK(same_bits(grad, want));
  if (!c.soft) {  // the rows outside the classes: a zero gradient
    for (int64_t j = 0; j < c.cols; ++j)
      CHECK(as_float(grad[static_cast<size_t>(c.cols + j)]) == 0.0f);
  }

  ska::simt::in_other_orders(82, [&](const char* order) {
    INFO(order);
    std::vector<float> loss2(loss.size()), lse2(lse.size());
    std::vector<T> grad2 = ska::simt::unwritten<T>(n);
    ce::forward<T>(x.data(), ip, pp, c.smoothing, c.rows, c.cols, loss2.data(), lse2.data());
    ce::backward<T>(x.data(), lse.data(), ip, pp, c.smoothing, grad_loss.data(), c.rows, c.cols,
                    grad2.data());
    CHECK(same_bits(loss2, loss));
    CHECK(same_bits(lse2, lse));
    CHECK(same_bits(grad2, grad));
  });
}

TEST_CASE("simt: cross-entropy: loss, log-sum-exp and gradient to the bit",
          "[cpu][simt][cross_entropy]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    SECTION(c.name + ", f32") { check<float>(c); }
    SECTION(c.name + ", bf16") { check<bf16>(c); }
  }
}

}  // namespace
