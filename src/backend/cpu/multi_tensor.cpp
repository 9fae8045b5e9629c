// CPU kernels: the multi-tensor updates (gradient statistics and scaling, Adam, LAMB, SGD, the
// weight average) and casts over lists of tensors. Twins of cuda/kernels/multi_tensor.cu; per
// element the same math as the single-tensor kernels of optim.cpp, in the tensors' dtype (f32 or
// f64), and multi_cast as copy converts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/skip_flag.h"
#include "backend/multi_cast_checks.h"

namespace ska::cpu {

namespace {

// Every list holds contiguous tensors of the first one's floating dtype; `others` have the
// first list's length and sizes.
void check_lists(const char* who, const TensorList& first,
                 std::initializer_list<const TensorList*> others) {
  for (const Tensor& t : first) {
    SKA_CHECK(t.is_contiguous() && t.dtype() == first.front().dtype() && t.is_floating(),
              DTypeError, who, ": tensors must be contiguous, floating and of one dtype; got ",
              t.str(), " after ", first.front().str());
  }
  for (const TensorList* list : others) {
    SKA_CHECK(list->size() == first.size(), ShapeError, who, ": lists of ", first.size(), " and ",
              list->size(), " tensors");
    for (size_t i = 0; i < first.size(); ++i) {
      const Tensor& t = (*list)[i];
      SKA_CHECK(t.is_contiguous() && t.dtype() == first[i].dtype() && t.numel() == first[i].numel(),
                ShapeError, who, ": tensor ", i, " is ", t.str(),
                ", expected the size and dtype of ", first[i].str());
    }
  }
}

// The sums multi_grad_stats adds up: of the squares and of 0 * every element (NaN exactly when
// an element is inf or NaN).
struct ChunkSums {
  double squares = 0.0, poison = 0.0;
};

// x[i] *= scale (unless scale is 1), and the sums of x's elements in a fixed order whatever the
// thread count: chunks of kStatsChunk elements, each summed in kStatsLanes interleaved f64 lanes
// (lane j takes the elements j, j + kStatsLanes, ...; the compiler keeps them in vector
// registers), the lanes then added in order, and the chunks in order.
constexpr int64_t kStatsChunk = 16384;
constexpr int kStatsLanes = 8;

template <typename T>
ChunkSums scale_and_sum_squares(T* x, int64_t n, T scale) {
  const int64_t chunks = (n + kStatsChunk - 1) / kStatsChunk;
  std::vector<ChunkSums> per_chunk(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static) if (n > 4 * kStatsChunk)
  for (int64_t c = 0; c < chunks; ++c) {
    T* xc = x + c * kStatsChunk;
    const int64_t len = std::min(kStatsChunk, n - c * kStatsChunk);
    if (scale != T(1)) {
      for (int64_t i = 0; i < len; ++i) xc[i] *= scale;
    }
    double sq[kStatsLanes] = {}, po[kStatsLanes] = {};
    const int64_t whole = len / kStatsLanes * kStatsLanes;
    for (int64_t i = 0; i < whole; i += kStatsLanes) {
      for (int j = 0; j < kStatsLanes; ++j) {
        const double v = static_cast<double>(xc[i + j]);
        sq[j] += v * v;
        po[j] += v * 0.0;
      }
    }
    for (int64_t i = whole; i < len; ++i) {
      const double v = static_cast<double>(xc[i]);
      sq[i - whole] += v * v;
      po[i - whole] += v * 0.0;
    }
    ChunkSums& sums = per_chunk[static_cast<size_t>(c)];
    for (int j = 0; j < kStatsLanes; ++j) {
      sums.squares += sq[j];
      sums.poison += po[j];
    }
  }
  ChunkSums total;
  for (const ChunkSums& sums : per_chunk) {
    total.squares += sums.squares;
    total.poison += sums.poison;
  }
  return total;
}

// The sum of the squares of x's elements, in scale_and_sum_squares's order (scale 1 writes
// nothing).
template <typename T>
double sum_squares(const T* x, int64_t n) {
  return scale_and_sum_squares(const_cast<T*>(x), n, T(1)).squares;
}

}  // namespace

void multi_grad_stats(const TensorList& tensors, double scale, const Tensor& out) {
  SKA_CHECK(out.dtype() == DType::kF32 && out.numel() == 2 && out.is_contiguous(), DTypeError,
            "multi_grad_stats: out must be 2 contiguous f32 values, got ", out.str());
  double squares = 0.0, poison = 0.0;
  if (!tensors.empty()) {
    check_lists("multi_grad_stats", tensors, {});
    dispatch_floating(tensors.front().dtype(), "multi_grad_stats", [&](auto tag) {
      using T = decltype(tag);
      for (const Tensor& t : tensors) {
        const ChunkSums sums = scale_and_sum_squares(t.data<T>(), t.numel(), static_cast<T>(scale));
        squares += sums.squares;
        poison += sums.poison;
      }
    });
  }
  float* o = out.data<float>();
  o[0] = static_cast<float>(squares);
  o[1] = static_cast<float>(poison);
}

void multi_scale(const TensorList& tensors, const Tensor& factor) {
  if (tensors.empty()) return;
  check_lists("multi_scale", tensors, {});
  SKA_CHECK(factor.numel() == 1 && factor.dtype() == DType::kF32, DTypeError,
            "multi_scale: factor must be one f32 element, got ", factor.str());
  const float f = *static_cast<const float*>(factor.data_ptr());
  dispatch_floating(tensors.front().dtype(), "multi_scale", [&](auto tag) {
    using T = decltype(tag);
    const T s = static_cast<T>(f);
    for (const Tensor& t : tensors) {
      T* x = t.data<T>();
      parallel_for(t.numel(), [&](int64_t i) { x[i] *= s; });
    }
  });
}

void multi_adam_step(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                     const TensorList& exp_avg_sqs, const TensorList& steps, const Tensor& skip,
                     const Tensor& lr, double beta1, double beta2, double eps, double l2_decay,
                     double decoupled_decay) {
  if (params.empty() || read_skip(skip, "multi_adam_step")) return;
  check_lists("multi_adam_step", params, {&grads, &exp_avgs, &exp_avg_sqs});
  SKA_CHECK(steps.size() == params.size(), ShapeError, "multi_adam_step: ", steps.size(),
            " step counts for ", params.size(), " parameters");
  for (size_t i = 0; i < params.size(); ++i) {
    adam_step(params[i], grads[i], Tensor(), exp_avgs[i], exp_avg_sqs[i], Tensor(), steps[i],
              Tensor(), lr, beta1, beta2, eps, l2_decay, decoupled_decay);
  }
}

void multi_lamb_step(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                     const TensorList& exp_avg_sqs, const TensorList& steps, const Tensor& skip,
                     const Tensor& grad_divisor, const Tensor& lr, double beta1, double beta2,
                     double eps, double weight_decay, bool adapt, bool trust_clip) {
  if (params.empty() || read_skip(skip, "multi_lamb_step")) return;
  check_lists("multi_lamb_step", params, {&grads, &exp_avgs, &exp_avg_sqs});
  SKA_CHECK(steps.size() == params.size(), ShapeError, "multi_lamb_step: ", steps.size(),
            " step counts for ", params.size(), " parameters");
  const double lr_value = read_lr(lr, "multi_lamb_step");
  dispatch_floating(params.front().dtype(), "multi_lamb_step", [&](auto tag) {
    using T = decltype(tag);
    for (size_t k = 0; k < params.size(); ++k) {
      const Tensor update = Tensor::empty(params[k].shape(), params[k].dtype());
      adam_step(params[k], grads[k], grad_divisor, exp_avgs[k], exp_avg_sqs[k], update, steps[k],
                Tensor(), Tensor(), beta1, beta2, eps, 0.0, weight_decay);
      T* p = params[k].data<T>();
      const T* u = update.data<T>();
      const int64_t n = params[k].numel();
      T trust = T(1);
      if (adapt) {
        const double w_norm = std::sqrt(sum_squares<T>(p, n));
        const double u_norm = std::sqrt(sum_squares(u, n));
        if (w_norm > 0 && u_norm > 0) trust = static_cast<T>(w_norm / u_norm);
        if (trust_clip) trust = std::min(trust, T(1));
      }
      const T step = static_cast<T>(lr_value);
      parallel_for(n, [&](int64_t i) { p[i] -= (u[i] * trust) * step; });
    }
  });
}

void multi_sgd_step(const TensorList& params, const TensorList& grads,
                    const TensorList& momentum_bufs, const Tensor& skip, const Tensor& lr,
                    double momentum, double weight_decay, bool nesterov) {
  if (params.empty() || read_skip(skip, "multi_sgd_step")) return;
  if (momentum_bufs.empty()) {
    check_lists("multi_sgd_step", params, {&grads});
  } else {
    check_lists("multi_sgd_step", params, {&grads, &momentum_bufs});
  }
  for (size_t i = 0; i < params.size(); ++i) {
    sgd_step(params[i], grads[i], momentum_bufs.empty() ? Tensor() : momentum_bufs[i], Tensor(), lr,
             momentum, weight_decay, nesterov);
  }
}

void multi_ema_update(const TensorList& ema, const TensorList& values, double decay,
                      const Tensor& skip) {
  if (ema.empty() || read_skip(skip, "multi_ema_update")) return;
  check_lists("multi_ema_update", ema, {&values});
  dispatch_floating(ema.front().dtype(), "multi_ema_update", [&](auto tag) {
    using T = decltype(tag);
    const T keep = static_cast<T>(decay), take = static_cast<T>(1.0 - decay);
    for (size_t k = 0; k < ema.size(); ++k) {
      T* e = ema[k].data<T>();
      const T* v = values[k].data<T>();
      parallel_for(ema[k].numel(), [&](int64_t i) { e[i] = e[i] * keep + v[i] * take; });
    }
  });
}

void multi_cast(const TensorList& src, const TensorList& dst) {
  check_multi_cast("multi_cast", src, dst);
  for (size_t i = 0; i < src.size(); ++i) copy(src[i], dst[i].view(src[i].shape()));
}

}  // namespace ska::cpu
