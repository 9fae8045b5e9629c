// Cross-entropy of logits [N, C] on CUDA, one block per row: log-sum-exp (max pass, then exp-sum
// pass) and the label-smoothed loss, class-index or soft targets; f32 math throughout.
// launch_forward and launch_backward take raw operands, so that tests/simt runs this file's own
// code on the host; the tensor entry points are left out there.
#include <climits>
#include <cstdint>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

// The target of every row: class indices (i64 [N]) or soft probabilities (T [N, C]). Class
// indices are not checked on the host (that would stall the stream every step); the kernels never
// read out of bounds: an index outside [0, C) gives a NaN loss and a zero gradient for its row.
template <typename T>
struct Target {
  const int64_t* index;  // null for soft targets
  const T* prob;         // null for class indices
  float smoothing;
};

// loss = sum_c q_c * (lse - x_c), q = (1 - eps) * target + eps / C. For soft targets that do not
// sum to one this is still -sum_c q_c * log_softmax_c.
template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, Target<T> t, int64_t rows,
                                             int64_t cols, float* loss, float* lse_out) {
  const float eps = t.smoothing, inv_c = 1.0f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * cols;
    const T* p = t.prob ? t.prob + row * cols : nullptr;
    float mx = -INFINITY, sum_x = 0.0f, sum_p = 0.0f, sum_px = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = to_float(x[c]);
      mx = fmaxf(mx, v);
      sum_x += v;
      if (p) {
        const float pv = to_float(p[c]);
        sum_p += pv;
        sum_px += pv * v;
      }
    }
    mx = block_max(mx);
    sum_x = block_sum(sum_x);
    if (p) {  // block-uniform branch
      sum_p = block_sum(sum_p);
      sum_px = block_sum(sum_px);
    }
    float sum_e = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum_e += expf(to_float(x[c]) - mx);
    sum_e = block_sum(sum_e);
    if (threadIdx.x != 0) continue;
    const float lse = mx + logf(sum_e);
    float l = 0.0f;
    if (p) {
      const float sum_q = (1.0f - eps) * sum_p + eps;
      const float sum_qx = (1.0f - eps) * sum_px + eps * inv_c * sum_x;
      l = lse * sum_q - sum_qx;
    } else {
      const int64_t k = t.index[row];
      // An invalid class index poisons its row's loss with NaN rather than stopping the stream
      // for a host-side check: the trainer's non-finite-loss detection reports it.
      l = k >= 0 && k < cols ? (1.0f - eps) * (lse - to_float(x[k])) + eps * (lse - sum_x * inv_c)
                             : __int_as_float(0x7fc00000);
    }
    loss[row] = l;
    lse_out[row] = lse;
  }
}

// grad = grad_loss * (softmax * sum(q) - q); sum(q) is 1 for class indices.
template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const float* lse, Target<T> t,
                                              const float* grad_loss, int64_t rows, int64_t cols,
                                              T* grad) {
  const float eps = t.smoothing, uniform = eps / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * cols;
    const T* p = t.prob ? t.prob + row * cols : nullptr;
    T* gx = grad + row * cols;
    float sum_q = 1.0f;
    int64_t k = -1;
    if (p) {
      float sum_p = 0.0f;
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum_p += to_float(p[c]);
      sum_q = (1.0f - eps) * block_sum(sum_p) + eps;
    } else {
      k = t.index[row];
      if (k < 0 || k >= cols) sum_q = 0.0f;  // ignored row: zero gradient
    }
    const float g = grad_loss[row], m = lse[row];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      float q;
      if (p) {
        q = (1.0f - eps) * to_float(p[c]) + uniform;
      } else {
        q = sum_q == 0.0f ? 0.0f : uniform + (c == k ? 1.0f - eps : 0.0f);
      }
      gx[c] = from_float<T>(g * (expf(to_float(x[c]) - m) * sum_q - q));
    }
  }
}

int threads_for(int64_t cols) { return cols >= 4096 ? 512 : (cols >= 512 ? 256 : 128); }
unsigned int row_blocks(int64_t rows) {
  return static_cast<unsigned int>(rows < INT_MAX ? rows : INT_MAX);
}

// loss [rows] and lse [rows] (f32) of logits [rows, cols] against t.
template <typename T>
void launch_forward(const T* logits, const Target<T>& t, int64_t rows, int64_t cols, float* loss,
                    float* lse, cudaStream_t stream) {
  launch_kernel(cross_entropy_forward_kernel<T>, dim3(row_blocks(rows)), dim3(threads_for(cols)), 0,
                stream, logits, t, rows, cols, loss, lse);
}

// grad [rows, cols] from the forward's lse and grad_loss [rows].
template <typename T>
void launch_backward(const T* logits, const float* lse, const Target<T>& t, const float* grad_loss,
                     int64_t rows, int64_t cols, T* grad, cudaStream_t stream) {
  launch_kernel(cross_entropy_backward_kernel<T>, dim3(row_blocks(rows)), dim3(threads_for(cols)),
                0, stream, logits, lse, t, grad_loss, rows, cols, grad);
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// Validates shapes and dtypes; returns N and C.
void check_args(const Tensor& logits, const Tensor& target, const char* kernel, int64_t* rows,
                int64_t* cols) {
  SKA_CHECK(logits.dim() == 2 && logits.is_contiguous(), ShapeError, kernel,
            ": logits must be contiguous [N, C], got ", shape_str(logits.shape()));
  *rows = logits.shape()[0];
  *cols = logits.shape()[1];
  SKA_CHECK(target.is_contiguous(), ValueError, kernel, ": target must be contiguous");
  if (target.dtype() == DType::kI64) {
    SKA_CHECK(target.numel() == *rows, ShapeError, kernel, ": class targets need ", *rows,
              " elements, got ", shape_str(target.shape()));
  } else {
    SKA_CHECK(target.dtype() == logits.dtype() && target.shape() == logits.shape(), ShapeError,
              kernel, ": soft targets must match logits (", shape_str(logits.shape()), " ",
              logits.dtype(), "), got ", shape_str(target.shape()), " ", target.dtype());
  }
}

template <typename T>
Target<T> target_of(const Tensor& target, double smoothing) {
  Target<T> t{};
  if (target.dtype() == DType::kI64) {
    t.index = static_cast<const int64_t*>(target.data_ptr());
  } else {
    t.prob = static_cast<const T*>(target.data_ptr());
  }
  t.smoothing = static_cast<float>(smoothing);
  return t;
}

void check_f32_rows(const Tensor& t, int64_t rows, const char* kernel, const char* what) {
  SKA_CHECK(t.dtype() == DType::kF32 && t.numel() == rows && t.is_contiguous(), ValueError, kernel,
            ": ", what, " must be contiguous f32 [", rows, "]");
}

}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& target, double smoothing,
                           const Tensor& loss, const Tensor& lse) {
  const int device = device_index(logits);
  DeviceGuard guard(device);
  int64_t rows, cols;
  check_args(logits, target, "cross_entropy_forward", &rows, &cols);
  check_f32_rows(loss, rows, "cross_entropy_forward", "loss");
  check_f32_rows(lse, rows, "cross_entropy_forward", "lse");
  if (rows == 0) return;
  SKA_CHECK(cols > 0, ShapeError, "cross_entropy_forward: no classes");
  dispatch_floating(logits.dtype(), "cross_entropy_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_forward(static_cast<const T*>(logits.data_ptr()), target_of<T>(target, smoothing), rows,
                   cols, static_cast<float*>(loss.data_ptr()), static_cast<float*>(lse.data_ptr()),
                   current_stream(device));
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& lse, const Tensor& target,
                            double smoothing, const Tensor& grad_loss, const Tensor& grad_logits) {
  const int device = device_index(logits);
  DeviceGuard guard(device);
  int64_t rows, cols;
  check_args(logits, target, "cross_entropy_backward", &rows, &cols);
  check_f32_rows(lse, rows, "cross_entropy_backward", "lse");
  check_f32_rows(grad_loss, rows, "cross_entropy_backward", "grad_loss");
  SKA_CHECK(grad_logits.is_contiguous() && grad_logits.shape() == logits.shape(), ValueError,
            "cross_entropy_backward: grad_logits must be contiguous with logits' shape");
  if (rows == 0 || cols == 0) return;
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_backward(static_cast<const T*>(logits.data_ptr()),
                    static_cast<const float*>(lse.data_ptr()), target_of<T>(target, smoothing),
                    static_cast<const float*>(grad_loss.data_ptr()), rows, cols,
                    static_cast<T*>(grad_logits.data_ptr()), current_stream(device));
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
