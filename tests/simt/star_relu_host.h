// StarReLU's kernels (cuda/kernels/star_relu.cu) on host memory, run by tests/simt
// (tests/simt/star_relu_host.cpp builds the kernel file for the host), launched as
// star_relu_forward / _backward launch them on a GPU of `sms` multiprocessors: y = scale *
// relu(x)^2 + bias over n elements, and its backward. X: x's dtype; P: the parameters'; Y and G:
// y's and grad_y's (X, or the wider of X and P).
#pragma once

#include <cstdint>

namespace ska::simt::star_relu {

template <typename X, typename P, typename Y>
void forward(const X* x, const P* scale, const P* bias, Y* y, int64_t n);

// grad_scale, grad_bias: null where not wanted.
template <typename X, typename P, typename G>
void backward(const G* gy, const X* x, const P* scale, X* gx, P* grad_scale, P* grad_bias,
              int64_t n, int64_t sms);

// The backward's blocks and each one's elements.
int64_t backward_blocks(int64_t n, int64_t sms);
int64_t backward_chunk(int64_t n, int64_t blocks);

}  // namespace ska::simt::star_relu
