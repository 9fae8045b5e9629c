// Softmax's kernels (cuda/kernels/softmax.cu) on host memory, run by tests/simt
// (tests/simt/softmax_host.cpp builds the kernel file for the host), launched as
// softmax_forward / softmax_backward launch them: rows of `cols` contiguous elements, a warp a row
// up to 1024 columns, a block a row beyond.
#pragma once

#include <cstdint>

namespace ska::simt::softmax {

// y = softmax(scale * x + mask) (log: log_softmax); mask null, or broadcast over rows: row r's
// mask starts at mask + (r % mask_rows) * cols.
template <typename T>
void forward(const T* x, const T* mask, int64_t mask_rows, T* y, int64_t rows, int cols,
             float scale, bool log);

// grad_x from y and grad_y, times scale.
template <typename T>
void backward(const T* y, const T* gy, T* gx, int64_t rows, int cols, float scale, bool log);

}  // namespace ska::simt::softmax
