// Cross-entropy's kernels (cuda/kernels/cross_entropy.cu) on host memory, run by tests/simt
// (tests/simt/cross_entropy_host.cpp builds the kernel file for the host), launched as
// cross_entropy_forward / _backward launch them: a block a row of logits [rows, cols], class
// indices (index, prob null) or soft targets (prob [rows, cols], index null), label smoothing.
#pragma once

#include <cstdint>

namespace ska::simt::cross_entropy {

template <typename T>
void forward(const T* logits, const int64_t* index, const T* prob, float smoothing, int64_t rows,
             int64_t cols, float* loss, float* lse);

template <typename T>
void backward(const T* logits, const float* lse, const int64_t* index, const T* prob,
              float smoothing, const float* grad_loss, int64_t rows, int64_t cols, T* grad);

// The threads of a row's block.
int threads_for(int64_t cols);

}  // namespace ska::simt::cross_entropy
