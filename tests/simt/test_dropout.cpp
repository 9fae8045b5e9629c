// The dropout kernels with a bit mask (cuda/kernels/random.cu), their own code run on the host by
// tests/simt: dropout, GELU + dropout (the MLPs' `train.gelu_dropout: fused`) and x + dropout(y)
// (the residual sums' `train.dropout_add: fused`), forward and backward. The mask against the
// Philox draws (element i: counter offset + i / 4, word i % 4; a captured step's offset base
// added), its last byte's unused bits clear, the values to the bit against the host's float
// arithmetic in the kernels' order of roundings, nothing past the last element written, 16-byte
// and element accesses alike, and the same bits whatever order a block's threads run in.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/pointwise_math.h"
#include "tests/simt/random_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::as_float;
using ska::simt::Buffer;
using ska::simt::Dropout;
using ska::simt::kept;
using ska::simt::random_buffer;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace dr = ska::simt::dropout;

struct Case {
  std::string name;
  int64_t n;
  bool misalign, graph;  // element accesses; the counter offset read from a captured step's base
};

std::vector<Case> cases() {
  return {
      {"ViT-S's MLP at batch 2: 2 x 65 x 512", 2 * 65 * 512, false, false},
      {"a tail of 3 past the last byte, a captured step's offset base", 8 * 1000 + 3, false, true},
      {"fewer elements than a byte: 5", 5, false, false},
      {"one element off a 16-byte boundary: element accesses", 4099, true, true},
  };
}

Dropout draw(const Case& c, const int64_t* base) {
  Dropout d;
  d.seed = 1234;
  d.offset = 96;
  d.offset_base = c.graph ? base : nullptr;
  d.keep = 0.9f;
  d.scale = 1.0f / 0.9f;
  return d;
}

// The mask's bytes as the draws give them (the last byte's bits past n clear).
std::vector<uint8_t> expected_bits(const Dropout& d, int64_t n) {
  std::vector<uint8_t> bits(static_cast<size_t>((n + 7) / 8), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (kept(d, i)) bits[static_cast<size_t>(i / 8)] |= static_cast<uint8_t>(1u << (i % 8));
  }
  return bits;
}

bool bit(const std::vector<uint8_t>& bits, int64_t i) {
  return (bits[static_cast<size_t>(i / 8)] >> (i % 8)) & 1;
}

float gelu(float v) { return ska::pm::unary_forward<ska::UnaryOp::kGelu, float>(v, 0.0f, 0.0f); }
float gelu_derivative(float v) {
  return ska::pm::unary_derivative<ska::UnaryOp::kGelu, float>(v, 0.0f, 0.0f);
}

template <typename T>
void check_dropout(const Case& c, bool with_gelu) {
  const int64_t base = 37;
  Dropout d = draw(c, &base);
  const Buffer<T> x = random_buffer<T>(c.n, c.misalign, 41);
  const Buffer<T> g = random_buffer<T>(c.n, c.misalign, 42);
  const float s = as_float(round_to<T>(d.scale));

  std::vector<uint8_t> bits(static_cast<size_t>((c.n + 7) / 8), 0xff);
  d.bits = bits.data();
  Buffer<T> out(c.n, c.misalign);
  dr::forward<T>(x.data, out.data, c.n, d, with_gelu);
  CHECK(out.untouched_after());
  CHECK(bits == expected_bits(d, c.n));
  std::vector<T> want(static_cast<size_t>(c.n)), want_grad(static_cast<size_t>(c.n));
  for (int64_t i = 0; i < c.n; ++i) {
    // The activation's output rounded to T, as its own kernel would store it, then the mask.
    const float a =
        with_gelu ? as_float(round_to<T>(gelu(as_float(x.data[i])))) : as_float(x.data[i]);
    want[static_cast<size_t>(i)] = round_to<T>(a * (kept(d, i) ? s : 0.0f));
    const float dropped = as_float(round_to<T>(as_float(g.data[i]) * (bit(bits, i) ? s : 0.0f)));
    want_grad[static_cast<size_t>(i)] =
        round_to<T>(with_gelu ? dropped * gelu_derivative(as_float(x.data[i])) : dropped);
  }
  CHECK(same_bits(out.values(), want));

  Buffer<T> grad_x(c.n, c.misalign);
  dr::backward<T>(g.data, bits.data(), grad_x.data, c.n, d.scale, with_gelu ? x.data : nullptr);
  CHECK(grad_x.untouched_after());
  CHECK(same_bits(grad_x.values(), want_grad));

  ska::simt::in_other_orders(43, [&](const char* order) {
    INFO(order);
    std::vector<uint8_t> bits2(bits.size(), 0xff);
    Dropout d2 = d;
    d2.bits = bits2.data();
    Buffer<T> out2(c.n, c.misalign), grad2(c.n, c.misalign);
    dr::forward<T>(x.data, out2.data, c.n, d2, with_gelu);
    dr::backward<T>(g.data, bits.data(), grad2.data, c.n, d.scale, with_gelu ? x.data : nullptr);
    CHECK(bits2 == bits);
    CHECK(same_bits(out2.values(), out.values()));
    CHECK(same_bits(grad2.values(), grad_x.values()));
  });
}

template <typename TX, typename TY>
void check_dropout_add(const Case& c) {
  const int64_t base = 11;
  Dropout d = draw(c, &base);
  const Buffer<TX> x = random_buffer<TX>(c.n, c.misalign, 51);
  const Buffer<TY> y = random_buffer<TY>(c.n, c.misalign, 52);
  const Buffer<TX> g = random_buffer<TX>(c.n, c.misalign, 53);
  const float s = as_float(round_to<TY>(d.scale));

  std::vector<uint8_t> bits(static_cast<size_t>((c.n + 7) / 8), 0xff);
  d.bits = bits.data();
  Buffer<TX> out(c.n, c.misalign);
  dr::add_forward<TX, TY>(x.data, y.data, out.data, c.n, d);
  CHECK(out.untouched_after());
  CHECK(bits == expected_bits(d, c.n));
  std::vector<TX> want(static_cast<size_t>(c.n));
  std::vector<TY> want_grad(static_cast<size_t>(c.n));
  for (int64_t i = 0; i < c.n; ++i) {
    // dropout(y) as its own tensor (TY), then the add in f32 rounded to TX.
    const float dropped = as_float(round_to<TY>(as_float(y.data[i]) * (kept(d, i) ? s : 0.0f)));
    want[static_cast<size_t>(i)] = round_to<TX>(as_float(x.data[i]) + dropped);
    // The sum's gradient rounded to y's dtype, then through the mask.
    want_grad[static_cast<size_t>(i)] =
        round_to<TY>(as_float(round_to<TY>(as_float(g.data[i]))) * (bit(bits, i) ? s : 0.0f));
  }
  CHECK(same_bits(out.values(), want));

  Buffer<TY> grad_y(c.n, c.misalign);
  dr::add_backward<TX, TY>(g.data, bits.data(), grad_y.data, c.n, d.scale);
  CHECK(grad_y.untouched_after());
  CHECK(same_bits(grad_y.values(), want_grad));

  ska::simt::in_other_orders(54, [&](const char* order) {
    INFO(order);
    std::vector<uint8_t> bits2(bits.size(), 0xff);
    Dropout d2 = d;
    d2.bits = bits2.data();
    Buffer<TX> out2(c.n, c.misalign);
    dr::add_forward<TX, TY>(x.data, y.data, out2.data, c.n, d2);
    CHECK(bits2 == bits);
    CHECK(same_bits(out2.values(), out.values()));
  });
}

TEST_CASE("simt: dropout: the mask against the draws, values and gradients to the bit",
          "[cpu][simt][dropout]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    SECTION(c.name + ", f32") { check_dropout<float>(c, false); }
    SECTION(c.name + ", bf16") { check_dropout<bf16>(c, false); }
    SECTION(c.name + ", GELU then dropout, f32") { check_dropout<float>(c, true); }
    SECTION(c.name + ", GELU then dropout, bf16") { check_dropout<bf16>(c, true); }
  }
}

TEST_CASE("simt: dropout_add: x + dropout(y), the mask against the draws, to the bit",
          "[cpu][simt][dropout]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    SECTION(c.name + ", f32") { check_dropout_add<float, float>(c); }
    SECTION(c.name + ", an f32 stream with a bf16 branch") { check_dropout_add<float, bf16>(c); }
    SECTION(c.name + ", bf16") { check_dropout_add<bf16, bf16>(c); }
  }
}

}  // namespace
