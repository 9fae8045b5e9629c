// Batch norm's kernels (cuda/kernels/batch_norm.cu) on host memory, run by tests/simt
// (tests/simt/batch_norm_host.cpp builds the kernel file for the host), launched as
// batch_norm_forward / _backward launch them in training on a GPU of `sms` multiprocessors:
// x [n, c, s] contiguous, the parameters f32 (P) with x f32 or bf16 (T), statistics f32.
#pragma once

#include <cstdint>
#include <vector>

namespace ska::simt::batch_norm {

// The batch's mean and rstd, the running statistics updated, y normed (w, b null: none).
template <typename T>
void forward(const T* x, const float* w, const float* b, int64_t n, int64_t c, int64_t s, float eps,
             float momentum, float* running_mean, float* running_var, T* y, float* save_mean,
             float* save_rstd, int64_t sms);

// grad_x (training: through the batch's statistics), grad_w and grad_b (null: not wanted).
template <typename T>
void backward(const T* gy, const T* x, const float* w, const float* save_mean,
              const float* save_rstd, int64_t n, int64_t c, int64_t s, T* gx, float* gw, float* gb,
              int64_t sms);

// The splits a channel's statistics and sums take.
int splits(int64_t n, int64_t c, int64_t s, int64_t sms);

// The kernels' grid-stride walks over x [n, c, s], `count` steps from `first` by `step`: channel
// ch's element offsets (ChannelWalk), and every element's channel (ElementWalk).
std::vector<int64_t> channel_offsets(int64_t n, int64_t c, int64_t s, int64_t ch, int64_t first,
                                     int64_t step, int count);
std::vector<int64_t> element_channels(int64_t n, int64_t c, int64_t s, int64_t first, int64_t step,
                                      int count);

}  // namespace ska::simt::batch_norm
