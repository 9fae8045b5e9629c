// The indexing kernels' own code (cuda/kernels/index.cu), run on the host by tests/simt:
// index_select (Swin's relative position bias gathered from its table, and a bf16 middle dim),
// gather along the last dim, and the deterministic index_add by output element and by column
// (the bias table's gradient), out-of-range indices included (0 for a copy, dropped from a sum).
// Every element against the index it names, the sums to the bit in index order (f32 sums
// rounded once for bf16 by output, after each add by column), and the same bits in other
// thread orders.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "tests/simt/index_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace ix = ska::simt::index;

TEST_CASE("simt: index_select and gather: every element from the index it names",
          "[cpu][simt][index]") {
  std::mt19937 rng(111);
  // Swin-T's 7x7 windows: a [169, 3] table read at 49 x 49 indices, two of them out of range.
  std::vector<float> table(169 * 3);
  for (float& v : table) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  std::vector<int64_t> index(2401);
  for (size_t i = 0; i < index.size(); ++i)
    index[i] = static_cast<int64_t>((i * 37 + i / 49) % 169);
  index[5] = -1;
  index[77] = 169;
  std::vector<float> out = ska::simt::unwritten<float>(2401 * 3);
  ix::index_select<float>(table.data(), 169, {2401, 3}, 0, index.data(), out.data());
  std::vector<float> want(out.size());
  for (size_t i = 0; i < index.size(); ++i) {
    for (int h = 0; h < 3; ++h) {
      const bool ok = index[i] >= 0 && index[i] < 169;
      want[i * 3 + h] = ok ? table[static_cast<size_t>(index[i]) * 3 + h] : 0.0f;
    }
  }
  CHECK(same_bits(out, want));
  ska::simt::in_other_orders(112, [&](const char* order) {
    INFO(order);
    std::vector<float> again = ska::simt::unwritten<float>(out.size());
    ix::index_select<float>(table.data(), 169, {2401, 3}, 0, index.data(), again.data());
    CHECK(same_bits(again, out));
  });

  // A middle dim of 2-byte elements: x [4, 10, 5] at 7 indices along dim 1.
  std::vector<uint16_t> x(4 * 10 * 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i * 131 + 7);
  const std::vector<int64_t> mid{9, 0, 3, 3, 12, 5, -4};
  std::vector<uint16_t> got(4 * 7 * 5, 0xffff), expected(got.size());
  ix::index_select<uint16_t>(x.data(), 10, {4, 7, 5}, 1, mid.data(), got.data());
  for (int a = 0; a < 4; ++a) {
    for (int k = 0; k < 7; ++k) {
      for (int c = 0; c < 5; ++c) {
        const bool ok = mid[k] >= 0 && mid[k] < 10;
        expected[(a * 7 + k) * 5 + c] = ok ? x[(a * 10 + mid[k]) * 5 + c] : 0;
      }
    }
  }
  CHECK(got == expected);

  // gather along the last dim: out [3, 4] = x [3, 6] at per-element indices.
  std::vector<float> gx(18);
  for (size_t i = 0; i < gx.size(); ++i) gx[i] = static_cast<float>(i) + 0.5f;
  const std::vector<int64_t> gi{5, 0, 2, 2, 1, 1, 6, 3, 4, 0, -1, 5};
  std::vector<float> g_out = ska::simt::unwritten<float>(12), g_want(12);
  ix::gather<float>(gx.data(), {3, 6}, {3, 4}, 1, gi.data(), g_out.data());
  for (int r = 0; r < 3; ++r) {
    for (int j = 0; j < 4; ++j) {
      const int64_t k = gi[r * 4 + j];
      g_want[r * 4 + j] = k >= 0 && k < 6 ? gx[r * 6 + k] : 0.0f;
    }
  }
  CHECK(same_bits(g_out, g_want));
}

template <typename T>
void check_index_add() {
  std::mt19937 rng(113);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t outer = 2, n = 50, rows = 10, inner = 3;
  std::vector<T> src(static_cast<size_t>(outer * n * inner)),
      base(static_cast<size_t>(outer * rows * inner));
  for (T& v : src) v = round_to<T>(normal(rng));
  for (T& v : base) v = round_to<T>(normal(rng));
  std::vector<int64_t> index(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) index[static_cast<size_t>(i)] = (i * 7 + i / 3) % rows;
  index[4] = -2;
  index[9] = rows;
  CHECK(ix::by_output_fits(rows, outer * rows * inner, n));
  for (const bool by_output : {true, false}) {
    INFO((by_output ? "by output element" : "by column"));
    std::vector<T> out = base;
    ix::index_add<T>(src.data(), index.data(), n, outer, rows, inner, out.data(), by_output);
    std::vector<T> want = base;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < rows; ++k) {
        for (int64_t j = 0; j < inner; ++j) {
          const size_t e = static_cast<size_t>((o * rows + k) * inner + j);
          float acc = static_cast<float>(value(base[e]));
          for (int64_t i = 0; i < n; ++i) {
            if (index[static_cast<size_t>(i)] != k) continue;
            acc += static_cast<float>(value(src[static_cast<size_t>((o * n + i) * inner + j)]));
            if (!by_output) acc = static_cast<float>(value(round_to<T>(acc)));  // per add
          }
          want[e] = round_to<T>(acc);
        }
      }
    }
    CHECK(same_bits(out, want));
    ska::simt::in_other_orders(114, [&](const char* order) {
      INFO(order);
      std::vector<T> again = base;
      ix::index_add<T>(src.data(), index.data(), n, outer, rows, inner, again.data(), by_output);
      CHECK(same_bits(again, out));
    });
  }
}

TEST_CASE("simt: index_add by output element and by column, in index order, to the bit",
          "[cpu][simt][index]") {
  check_index_add<float>();
  check_index_add<bf16>();
}

}  // namespace
