// The elementwise kernels (cuda/kernels/pointwise.cu) on host memory, run by tests/simt
// (tests/simt/pointwise_host.cpp builds the kernel file for the host), launched as copy, fill,
// unary, unary_backward, binary and where launch them: operands of one shape, each with its own
// strides in elements (0 for a broadcast dim), through launch_elementwise's choice of 16-byte
// packs, single elements, 32-bit or 64-bit offsets; `fast` false takes the reference path
// (train.elementwise: reference, 64-bit offsets over every dim).
#pragma once

#include <cstdint>
#include <vector>

namespace ska::simt::pointwise {

using Dims = std::vector<int64_t>;

// out = a + b (A and B: one floating dtype, or f32 with a 16-bit one; O the wider).
template <typename A, typename B, typename O>
void add(const Dims& shape, O* out, const Dims& so, const A* a, const Dims& sa, const B* b,
         const Dims& sb, bool fast);

// out = 1 where a < b, else 0.
template <typename T>
void less(const Dims& shape, uint8_t* out, const Dims& so, const T* a, const Dims& sa, const T* b,
          const Dims& sb, bool fast);

// y = gelu(x), and dx = g * gelu'(x) (dense operands, as unary_backward takes them).
template <typename T>
void gelu(const Dims& shape, T* y, const Dims& sy, const T* x, const Dims& sx, bool fast);
template <typename T>
void gelu_backward(int64_t n, T* dx, const T* g, const T* x, bool fast);

// d = s converted (the CPU's convert: 16-bit floats through float).
template <typename S, typename D>
void copy(const Dims& shape, D* d, const Dims& sd, const S* s, const Dims& ss, bool fast);

template <typename T>
void fill(const Dims& shape, T* d, const Dims& sd, double value, bool fast);

// out = c ? a : b.
template <typename T>
void where(const Dims& shape, T* out, const Dims& so, const uint8_t* c, const Dims& sc, const T* a,
           const Dims& sa, const T* b, const Dims& sb, bool fast);

}  // namespace ska::simt::pointwise
