// The multi-tensor optimizer kernels (cuda/kernels/multi_tensor.cu) on host memory, run by
// tests/simt (tests/simt/multi_tensor_host.cpp builds the kernel file for the host), launched as
// the multi_* entry points launch them. A list of tensors is a vector of vectors, the i-th
// vectors of lists that go together of one size; T is f32, bf16 or f16 (f32 math); the learning
// rate, the update counts and the skip flag are read through pointers, as the kernels read
// device memory.
#pragma once

#include <cstdint>
#include <vector>

namespace ska::simt::multi_tensor {

template <typename T>
using List = std::vector<std::vector<T>>;

struct Adam {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, l2_decay = 0.0, decoupled_decay = 0.0;
};

// multi_adam_step: steps[i] is tensor i's update count (after its increment).
template <typename T>
void adam(List<T>& p, const List<T>& g, List<T>& m, List<T>& v, const std::vector<int64_t>& steps,
          const uint8_t* skip, const double* lr, const Adam& a);

// multi_lamb_step (a.l2_decay unused; a.decoupled_decay is the weight decay); divisor null for 1.
template <typename T>
void lamb(List<T>& p, const List<T>& g, List<T>& m, List<T>& v, const std::vector<int64_t>& steps,
          const uint8_t* skip, const float* divisor, const double* lr, const Adam& a, bool adapt,
          bool trust_clip);

// multi_sgd_step; bufs empty without momentum.
template <typename T>
void sgd(List<T>& p, const List<T>& g, List<T>& bufs, const uint8_t* skip, const double* lr,
         float momentum, float weight_decay, bool nesterov);

// multi_ema_update.
template <typename T>
void ema(List<T>& e, const List<T>& values, const uint8_t* skip, double decay);

// multi_grad_stats: x scaled in place where scale != 1, out = {sum of squares, sum of 0 * x}.
template <typename T>
void grad_stats(List<T>& x, double scale, float (&out)[2]);

// multi_cast.
template <typename S, typename D>
void cast(const List<S>& src, List<D>& dst);

}  // namespace ska::simt::multi_tensor
