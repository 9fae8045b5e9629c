// The elementwise iteration space both backends share: dim coalescing, the 32-bit magic-number
// divider and the offset calculators, checked against plain division and strided offsets.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "backend/elementwise.h"
#include "support/test_util.h"

using namespace ska;

namespace {

// Offset of linear index i (row-major over shape) in a view with these strides.
int64_t naive_offset(const Shape& shape, const Shape& strides, int64_t i) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

// Strides of a random view of `shape`: a contiguous tensor of permuted dims, with some dims
// broadcast (stride 0) and some stepped (every second element of a larger tensor).
Shape random_strides(const Shape& shape, std::mt19937& rng) {
  std::vector<size_t> order(shape.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = d;
  std::shuffle(order.begin(), order.end(), rng);
  Shape strides(shape.size());
  int64_t step = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 2 : 1;
  for (size_t k = order.size(); k-- > 0;) {
    const size_t d = order[k];
    const int kind = std::uniform_int_distribution<int>(0, 5)(rng);
    strides[d] = kind == 0 ? 0 : step;
    if (kind != 0) step *= shape[d] + (kind == 1 ? 1 : 0);  // kind 1 pads the dim
  }
  return strides;
}

}  // namespace

TEST_CASE("FastDivmod divides like the hardware for every divisor class", "[cpu]") {
  std::mt19937 rng(7);
  std::vector<uint32_t> divisors = {1, 2, 3, 5, 6, 7, 9, 10, 12, 14, 49, 56, 64, 65, 96, 196, 197,
                                    384, 785, 3136, 65535, 65536, 65537, 1000003,
                                    (1u << 30) - 1, 1u << 30, (1u << 30) + 1, (1u << 31) - 1};
  for (int i = 0; i < 200; ++i) {
    divisors.push_back(std::uniform_int_distribution<uint32_t>(1, (1u << 31) - 1)(rng));
  }
  std::uniform_int_distribution<uint32_t> any(0, (1u << 31) - 1);
  for (uint32_t d : divisors) {
    const FastDivmod fd(d);
    std::vector<uint32_t> dividends = {0, 1, d - 1, d, (1u << 31) - 1, (1u << 31) - 2};
    if (d < (1u << 30)) dividends.insert(dividends.end(), {d + 1, 2 * d - 1, 2 * d, 2 * d + 1});
    const uint32_t top_multiple = ((1u << 31) - 1) / d * d;
    dividends.insert(dividends.end(), {top_multiple, top_multiple - 1});
    for (int i = 0; i < 2000; ++i) dividends.push_back(any(rng));
    for (uint32_t n : dividends) {
      if (n >= (1u << 31)) continue;
      INFO("n = " << n << ", d = " << d);
      REQUIRE(fd.div(n) == n / d);
    }
  }
  // Small divisors over every dividend of a range, where off-by-one errors would show first.
  for (uint32_t d = 1; d <= 64; ++d) {
    const FastDivmod fd(d);
    for (uint32_t n = 0; n < 20000; ++n) REQUIRE(fd.div(n) == n / d);
  }
  CHECK_THROWS_WITH(FastDivmod(0), Catch::Contains("divisor 0"));
  CHECK_THROWS_WITH(FastDivmod(1u << 31), Catch::Contains("outside [1, 2^31)"));
}

TEST_CASE("coalesce_layout merges dims every operand steps through as one", "[cpu]") {
  // Contiguous: one dim.
  auto l = coalesce_layout<2>({2, 3, 4}, {Shape{12, 4, 1}, Shape{12, 4, 1}});
  CHECK(l.shape == Shape{24});
  CHECK(l.strides[0] == Shape{1});
  CHECK(layout_is_dense(l));
  // A bias broadcast over [B, N, C]: [B * N, C] with the bias's strides (0, 1).
  l = coalesce_layout<2>({4, 5, 6}, {Shape{30, 6, 1}, Shape{0, 0, 1}});
  CHECK(l.shape == Shape{20, 6});
  CHECK(l.strides[1] == Shape{0, 1});
  CHECK_FALSE(layout_is_dense(l));
  // A head split [B, N, h, d] -> [B, h, N, d]: d merges with nothing, the output's h and N cannot.
  const Shape bnhd = contiguous_strides({2, 7, 3, 8});
  l = coalesce_layout<2>({2, 3, 7, 8},
                         {Shape{bnhd[0], bnhd[2], bnhd[1], bnhd[3]}, contiguous_strides({2, 3, 7, 8})});
  CHECK(l.shape == Shape{2, 3, 7, 8});
  // Size-1 dims go; one element is {1}; an empty view keeps its 0.
  l = coalesce_layout<2>({1, 5, 1}, {Shape{99, 2, 77}, Shape{5, 1, 1}});
  CHECK(l.shape == Shape{5});
  CHECK(l.strides[0] == Shape{2});
  l = coalesce_layout<2>({1, 1}, {Shape{3, 1}, Shape{1, 1}});
  CHECK(l.shape == Shape{1});
  CHECK(layout_is_dense(l));
  l = coalesce_layout<2>({3, 0, 2}, {Shape{0, 2, 1}, Shape{0, 2, 1}});
  CHECK(shape_numel(l.shape) == 0);
  // 32-bit offsets: the last offset must stay below 2^31.
  CHECK(layout_fits_int32(coalesce_layout<1>({2, 1024}, {Shape{(1 << 30) - 1024, 1}})));
  CHECK_FALSE(layout_fits_int32(coalesce_layout<1>({3, 1024}, {Shape{1 << 30, 1}})));
  CHECK_FALSE(layout_fits_int32(coalesce_layout<1>({int64_t{1} << 31}, {Shape{1}})));
  CHECK_FALSE(layout_fits_int32(coalesce_layout<1>({4, 3}, {Shape{-3, 1}})));
}

TEST_CASE("offset calculators give every operand's strided offsets", "[cpu]") {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int ndim = std::uniform_int_distribution<int>(0, 7)(rng);
    Shape shape(static_cast<size_t>(ndim));
    for (auto& s : shape) s = std::uniform_int_distribution<int>(1, 6)(rng);
    const std::array<Shape, 3> strides = {random_strides(shape, rng), random_strides(shape, rng),
                                          contiguous_strides(shape)};
    const ElementwiseLayout<3> l = coalesce_layout<3>(shape, strides);
    REQUIRE(shape_numel(l.shape) == shape_numel(shape));
    REQUIRE(l.shape.size() <= std::max<size_t>(1, shape.size()));
    const OffsetCalc32<3> c32 = offset_calc32(l);
    const OffsetCalc64<3> c64 = offset_calc64(l);
    for (int64_t i = 0; i < shape_numel(shape); ++i) {
      uint32_t o32[3];
      int64_t o64[3];
      c32.offsets(static_cast<uint32_t>(i), o32);
      c64.offsets(i, o64);
      for (size_t k = 0; k < 3; ++k) {
        const int64_t want = shape.empty() ? 0 : naive_offset(shape, strides[k], i);
        INFO("shape " << shape_str(shape) << ", operand " << k << " strides "
                      << shape_str(strides[k]) << ", index " << i);
        REQUIRE(int64_t{o32[k]} == want);
        REQUIRE(o64[k] == want);
      }
    }
  }
  // Negative strides (64-bit only) and views of more than 8 dims that do not merge.
  const auto flipped = coalesce_layout<1>({3, 4}, {Shape{-4, 1}});
  const OffsetCalc64<1> c = offset_calc64(flipped);
  int64_t off[1];
  c.offsets(5, off);
  CHECK(off[0] == -3);
  CHECK_THROWS_WITH(offset_calc32(flipped), Catch::Contains("past 2^31"));
  Shape nine(9, 2), reversed(9);
  for (size_t d = 0; d < 9; ++d) reversed[d] = int64_t{1} << d;
  CHECK_THROWS_WITH(offset_calc64(coalesce_layout<1>(nine, {reversed})),
                    Catch::Contains("up to 8 dims") && Catch::Contains("[2, 2, 2, 2, 2, 2, 2, 2, 2]"));
}
