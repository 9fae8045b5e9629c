// CPU kernel: cross-entropy fused with log-softmax, for class-index or soft targets with label
// smoothing. Rows are spread over OpenMP threads; sums accumulate in double.
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

namespace ska::cpu {

namespace {

// The smoothed target of one row: q_j = (1 - eps) * t_j + eps / C, with t one-hot at `cls` (class
// targets, soft == nullptr) or the soft row.
template <typename T>
struct TargetRow {
  int64_t cls;
  const T* soft;
  double smoothing;
  int64_t classes;

  double at(int64_t j) const {
    const double t = soft ? static_cast<double>(soft[j]) : (j == cls ? 1.0 : 0.0);
    return (1.0 - smoothing) * t + smoothing / static_cast<double>(classes);
  }
};

// Throws ValueError for a class index outside [0, classes), before any parallel work.
void check_class_indices(const Tensor& target, int64_t classes) {
  const int64_t* t = target.data<int64_t>();
  for (int64_t n = 0; n < target.numel(); ++n) {
    SKA_CHECK(t[n] >= 0 && t[n] < classes, ValueError, "cross_entropy: target class ", t[n],
              " at row ", n, " is out of range for ", classes, " classes");
  }
}

template <typename T>
TargetRow<T> target_row(const Tensor& target, int64_t n, double smoothing, int64_t classes) {
  if (target.dtype() == DType::kI64) return {target.data<int64_t>()[n], nullptr, smoothing, classes};
  return {-1, target.data<T>() + n * classes, smoothing, classes};
}

template <typename T>
double log_sum_exp(const T* x, int64_t len) {
  double max_x = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < len; ++j) max_x = std::fmax(max_x, static_cast<double>(x[j]));
  if (std::isinf(max_x)) return max_x;  // all -inf (or a +inf): nothing finite to shift by
  double total = 0.0;
  for (int64_t j = 0; j < len; ++j) total += std::exp(static_cast<double>(x[j]) - max_x);
  return max_x + std::log(total);
}

}  // namespace

// loss_n = sum_j q_j * (lse_n - x_nj) = -sum_j q_j * log_softmax(x_n)_j.
void cross_entropy_forward(const Tensor& logits, const Tensor& target, double smoothing,
                           const Tensor& loss, const Tensor& lse) {
  dispatch_floating(logits.dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
    if (target.dtype() == DType::kI64) check_class_indices(target, classes);
    const T* xp = logits.data<T>();
    T* loss_p = loss.data<T>();
    T* lse_p = lse.data<T>();
    parallel_for(rows, [&](int64_t n) {
      const T* x = xp + n * classes;
      const TargetRow<T> q = target_row<T>(target, n, smoothing, classes);
      const double row_lse = log_sum_exp(x, classes);
      double total = 0.0;
      for (int64_t j = 0; j < classes; ++j) {
        const double qj = q.at(j);
        if (qj != 0.0) total += qj * (row_lse - static_cast<double>(x[j]));
      }
      loss_p[n] = static_cast<T>(total);
      lse_p[n] = static_cast<T>(row_lse);
    }, 64);
  });
}

// d loss_n / d x_nj = sum(q_n) * softmax(x_n)_j - q_nj; sum(q_n) is 1 unless soft targets do not
// sum to 1, which this handles exactly.
void cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& target,
                            double smoothing, const Tensor& grad_loss, const Tensor& grad_logits) {
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t rows = logits.shape()[0], classes = logits.shape()[1];
    const T* xp = logits.data<T>();
    const T* lse_p = lse.data<T>();
    const T* gp = grad_loss.data<T>();
    T* out_p = grad_logits.data<T>();
    parallel_for(rows, [&](int64_t n) {
      const T* x = xp + n * classes;
      T* out = out_p + n * classes;
      const TargetRow<T> q = target_row<T>(target, n, smoothing, classes);
      double q_total = 0.0;
      for (int64_t j = 0; j < classes; ++j) q_total += q.at(j);
      const double g = static_cast<double>(gp[n]), row_lse = static_cast<double>(lse_p[n]);
      for (int64_t j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(x[j]) - row_lse);
        out[j] = static_cast<T>(g * (q_total * p - q.at(j)));
      }
    }, 64);
  });
}

}  // namespace ska::cpu
