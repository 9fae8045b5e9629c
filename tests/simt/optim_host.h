// The single-tensor optimizer kernels (cuda/kernels/optim.cu) on host memory, run by tests/simt
// (tests/simt/optim_host.cpp builds the kernel file for the host), launched as adam_step,
// sgd_step, advance_counts and record_update launch them: the update count, the learning rate,
// the skip flag and the loss read through pointers, as the kernels read device memory.
#pragma once

#include <cstdint>
#include <vector>

#include "tests/simt/multi_tensor_host.h"

namespace ska::simt::optim {

// adam_step on one tensor (a: the multi-tensor kernels' hyperparameters), in place.
template <typename T>
void adam(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& m, std::vector<T>& v,
          const int64_t* step, const uint8_t* skip, const double* lr, const multi_tensor::Adam& a);

// sgd_step; buf empty without momentum.
template <typename T>
void sgd(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& buf, const uint8_t* skip,
         const double* lr, float momentum, float weight_decay, bool nesterov);

void advance_counts(std::vector<int64_t>& counts, const uint8_t* skip);

// stats: {loss sum, updates, skipped, skipped in a row, most in a row}.
void record_update(float (&stats)[5], const float* loss, const uint8_t* skip);

}  // namespace ska::simt::optim
