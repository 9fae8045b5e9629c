// The elementwise kernels' own code (cuda/kernels/pointwise.cu), run on the host by tests/simt:
// add (one dtype, and f32 with bf16), a comparison into u8, GELU and its backward, casts both
// ways, fill and where, each over dense operands (16-byte packs, and single elements off a
// 16-byte boundary, with a tail past the last pack), a transposed operand, a broadcast row and a
// permuted 4-D view (32-bit magic-number offsets). Every output element to the bit against the
// host's float arithmetic of pointwise_math.h at the element's offsets, the fast paths to the bit
// against the reference path (train.elementwise: reference: 64-bit offsets over every dim),
// nothing written outside the output's elements, and the same bits in other thread orders.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/pointwise_math.h"
#include "tests/simt/pointwise_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::as_float;
using ska::simt::Buffer;
using ska::simt::round_to;
using ska::simt::value;
namespace pw = ska::simt::pointwise;
using Dims = pw::Dims;

// Operands of one shape: the output's strides and two inputs' (the where condition takes the
// second input's).
struct Layout {
  std::string name;
  Dims shape, so, sa, sb;
  bool misalign;  // every operand one element past a 16-byte boundary
};

Dims contiguous(const Dims& shape) {
  Dims s(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) s[d - 1] = s[d] * shape[d];
  return s;
}

std::vector<Layout> layouts() {
  const Dims dense{520, 512}, tail{1003}, t{96, 64}, row{33, 40}, perm{4, 1, 6, 10};
  return {
      {"dense [520, 512]: 16-byte packs", dense, contiguous(dense), contiguous(dense),
       contiguous(dense), false},
      {"dense [520, 512] off a 16-byte boundary: single elements", dense, contiguous(dense),
       contiguous(dense), contiguous(dense), true},
      {"dense 1003: a tail past the last pack", tail, {1}, {1}, {1}, false},
      {"[96, 64] with a transposed input", t, contiguous(t), {1, 96}, contiguous(t), false},
      {"[33, 40] with a broadcast row", row, contiguous(row), contiguous(row), {0, 1}, false},
      {"a permuted 4-D view [4, 1, 6, 10]",
       perm,
       {60, 60, 10, 1},
       {1, 99, 40, 4},
       {60, 7, 1, 6},
       false},
  };
}

// The multi-indices of `shape` in row-major order: f(offset of each of the strides).
void for_each_offset(const Dims& shape, const std::vector<Dims>& strides,
                     const std::function<void(const std::vector<int64_t>&)>& f) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<int64_t> idx(shape.size(), 0), off(strides.size());
  for (int64_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < strides.size(); ++k) {
      off[k] = 0;
      for (size_t d = 0; d < shape.size(); ++d) off[k] += idx[d] * strides[k][d];
    }
    f(off);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
}

// Elements an operand of these strides spans.
int64_t span(const Dims& shape, const Dims& strides) {
  int64_t last = 0;
  for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return last + 1;
}

template <typename T>
Buffer<T> input(const Layout& l, const Dims& strides, uint32_t seed) {
  return ska::simt::random_buffer<T>(span(l.shape, strides), l.misalign, seed);
}

template <typename E>
std::vector<E> bits_of(const Buffer<E>& b) {
  return std::vector<E>(b.data, b.data + b.n + 16);
}
template <typename E>
bool same(const std::vector<E>& a, const std::vector<E>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(E)) == 0;
}

// Runs op(out, fast) into a fresh output buffer (all ones) with the fast paths and with the
// reference path, and checks both against `want` at the output's offsets, the fast paths'
// bits against the reference's everywhere (so nothing else was written), and the bits in other
// thread orders.
template <typename O>
void check_op(const Layout& l, const std::function<void(O*, bool)>& op,
              const std::function<O(const std::vector<int64_t>&)>& want,
              const std::vector<Dims>& strides) {
  Buffer<O> fast(span(l.shape, l.so), l.misalign), slow(span(l.shape, l.so), l.misalign);
  const std::vector<O> untouched = bits_of(fast);
  op(fast.data, true);
  op(slow.data, false);
  std::vector<O> expected = untouched;
  for_each_offset(l.shape, strides, [&](const std::vector<int64_t>& off) {
    expected[static_cast<size_t>(off[0])] = want(off);
  });
  CHECK(same(bits_of(fast), expected));
  CHECK(same(bits_of(slow), expected));
  ska::simt::in_other_orders(61, [&](const char* order) {
    INFO(order);
    Buffer<O> again(span(l.shape, l.so), l.misalign);
    op(again.data, true);
    CHECK(same(bits_of(again), expected));
  });
}

TEST_CASE("simt: elementwise: every path to the bit at every element", "[cpu][simt][pointwise]") {
  for (const Layout& l : layouts()) {
    INFO(l.name);
    const std::vector<Dims> three{l.so, l.sa, l.sb}, two{l.so, l.sa};
    SECTION(l.name + ": add, f32") {
      const Buffer<float> a = input<float>(l, l.sa, 1), b = input<float>(l, l.sb, 2);
      check_op<float>(
          l,
          [&](float* o, bool fast) { pw::add(l.shape, o, l.so, a.data, l.sa, b.data, l.sb, fast); },
          [&](const std::vector<int64_t>& off) {
            return ska::pm::binary_forward<ska::BinaryOp::kAdd, float>(a.data[off[1]],
                                                                       b.data[off[2]]);
          },
          three);
    }
    SECTION(l.name + ": add, bf16") {
      const Buffer<bf16> a = input<bf16>(l, l.sa, 3), b = input<bf16>(l, l.sb, 4);
      check_op<bf16>(
          l,
          [&](bf16* o, bool fast) { pw::add(l.shape, o, l.so, a.data, l.sa, b.data, l.sb, fast); },
          [&](const std::vector<int64_t>& off) {
            return round_to<bf16>(as_float(a.data[off[1]]) + as_float(b.data[off[2]]));
          },
          three);
    }
    SECTION(l.name + ": add, f32 and bf16") {
      const Buffer<float> a = input<float>(l, l.sa, 5);
      const Buffer<bf16> b = input<bf16>(l, l.sb, 6);
      check_op<float>(
          l,
          [&](float* o, bool fast) { pw::add(l.shape, o, l.so, a.data, l.sa, b.data, l.sb, fast); },
          [&](const std::vector<int64_t>& off) {
            return a.data[off[1]] + as_float(b.data[off[2]]);
          },
          three);
    }
    SECTION(l.name + ": a < b into u8") {
      const Buffer<float> a = input<float>(l, l.sa, 7), b = input<float>(l, l.sb, 8);
      check_op<uint8_t>(
          l,
          [&](uint8_t* o, bool fast) {
            pw::less(l.shape, o, l.so, a.data, l.sa, b.data, l.sb, fast);
          },
          [&](const std::vector<int64_t>& off) {
            return static_cast<uint8_t>(a.data[off[1]] < b.data[off[2]] ? 1 : 0);
          },
          three);
    }
    SECTION(l.name + ": gelu, bf16") {
      const Buffer<bf16> x = input<bf16>(l, l.sa, 9);
      check_op<bf16>(
          l, [&](bf16* o, bool fast) { pw::gelu(l.shape, o, l.so, x.data, l.sa, fast); },
          [&](const std::vector<int64_t>& off) {
            return round_to<bf16>(ska::pm::unary_forward<ska::UnaryOp::kGelu, float>(
                as_float(x.data[off[1]]), 0.f, 0.f));
          },
          two);
    }
    SECTION(l.name + ": casts f32 -> bf16 -> f32") {
      const Buffer<float> s = input<float>(l, l.sa, 10);
      check_op<bf16>(
          l, [&](bf16* o, bool fast) { pw::copy(l.shape, o, l.so, s.data, l.sa, fast); },
          [&](const std::vector<int64_t>& off) { return round_to<bf16>(s.data[off[1]]); }, two);
      const Buffer<bf16> h = input<bf16>(l, l.sa, 11);
      check_op<float>(
          l, [&](float* o, bool fast) { pw::copy(l.shape, o, l.so, h.data, l.sa, fast); },
          [&](const std::vector<int64_t>& off) { return as_float(h.data[off[1]]); }, two);
    }
    SECTION(l.name + ": fill, bf16") {
      check_op<bf16>(
          l, [&](bf16* o, bool fast) { pw::fill(l.shape, o, l.so, 0.1, fast); },
          [&](const std::vector<int64_t>&) { return round_to<bf16>(static_cast<float>(0.1)); },
          {l.so});
    }
    SECTION(l.name + ": where") {
      const Buffer<float> a = input<float>(l, l.sa, 12), b = input<float>(l, l.sb, 13);
      Buffer<uint8_t> c(span(l.shape, l.sb), l.misalign);
      for (int64_t i = 0; i < c.n; ++i) c.data[i] = static_cast<uint8_t>((i * 7 + i / 5) % 3 == 0);
      check_op<float>(
          l,
          [&](float* o, bool fast) {
            pw::where(l.shape, o, l.so, c.data, l.sb, a.data, l.sa, b.data, l.sb, fast);
          },
          [&](const std::vector<int64_t>& off) {
            return c.data[off[2]] ? a.data[off[1]] : b.data[off[2]];
          },
          three);
    }
  }
}

TEST_CASE("simt: elementwise: GELU's backward to the bit, packs and single elements",
          "[cpu][simt][pointwise]") {
  for (const bool misalign : {false, true}) {
    const int64_t n = 4099;
    INFO((misalign ? "single elements" : "16-byte packs"));
    const Buffer<bf16> g = ska::simt::random_buffer<bf16>(n, misalign, 14);
    const Buffer<bf16> x = ska::simt::random_buffer<bf16>(n, misalign, 15);
    for (const bool fast : {true, false}) {
      Buffer<bf16> dx(n, misalign);
      pw::gelu_backward(n, dx.data, g.data, x.data, fast);
      CHECK(dx.untouched_after());
      std::vector<bf16> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        want[static_cast<size_t>(i)] = round_to<bf16>(
            as_float(g.data[i]) *
            ska::pm::unary_derivative<ska::UnaryOp::kGelu, float>(as_float(x.data[i]), 0.f, 0.f));
      }
      CHECK(ska::simt::same_bits(dx.values(), want));
    }
  }
}

}  // namespace
