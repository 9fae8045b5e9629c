// The row and column reductions' own code (cuda/kernels/reduce.cu), run on the host by tests/simt:
// sum, mean, max and min over the leading dims (a bias gradient: [B * N, C] over its rows) and
// over the trailing dims, each to the bit against the host's float arithmetic in the kernels'
// order (their plans, lanes, trees and partials), sums and means against f64 within the error of
// that order's additions, max and min exactly, NaN through every op, columns past the last left
// untouched, and the same bits whatever order a block's threads run in. Shapes: ViT-S's bias
// gradients at batch 512 (16-byte loads, chunks of rows, partials), MetaFormer's narrow ones, a
// misaligned view (element loads), few rows, few columns, long rows split over blocks.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/simt/reduce_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::ReduceOp;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace rd = ska::simt::reduce;

constexpr ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin};

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

// The kernels' combine and identity, in host floats.
float identity(ReduceOp op) {
  return op == ReduceOp::kMax ? -INFINITY : op == ReduceOp::kMin ? INFINITY : 0.0f;
}
float combine(ReduceOp op, float a, float b) {
  if (op == ReduceOp::kSum || op == ReduceOp::kMean) return a + b;
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return op == ReduceOp::kMax ? (a > b ? a : b) : (a < b ? a : b);
}
float finish(ReduceOp op, float acc, float count) {
  return op == ReduceOp::kMean ? acc / count : acc;
}

// Calls f(std::integral_constant<ReduceOp, op>{}).
template <typename F>
void visit(ReduceOp op, F&& f) {
  switch (op) {
    case ReduceOp::kSum:
      return f(std::integral_constant<ReduceOp, ReduceOp::kSum>{});
    case ReduceOp::kMean:
      return f(std::integral_constant<ReduceOp, ReduceOp::kMean>{});
    case ReduceOp::kMax:
      return f(std::integral_constant<ReduceOp, ReduceOp::kMax>{});
    case ReduceOp::kMin:
      return f(std::integral_constant<ReduceOp, ReduceOp::kMin>{});
  }
}

// One column pass in the kernel's order: chunk k's lane y folds rows r0 + y, r0 + y + lanes, ...
// in turn, then lane y takes lane y + s for s = lanes / 2, ..., 1. at(r, c): the element.
std::vector<float> column_pass(ReduceOp op, const rd::ColumnPass& p, int64_t rows, int64_t cols,
                               const std::function<float(int64_t, int64_t)>& at) {
  std::vector<float> out(static_cast<size_t>(p.chunks * cols));
  std::vector<float> lane(static_cast<size_t>(p.lanes));
  for (int64_t k = 0; k < p.chunks; ++k) {
    const int64_t r0 = k * p.chunk_rows, r1 = std::min(rows, r0 + p.chunk_rows);
    for (int64_t c = 0; c < cols; ++c) {
      for (int y = 0; y < p.lanes; ++y) {
        float acc = identity(op);
        for (int64_t r = r0 + y; r < r1; r += p.lanes) acc = combine(op, acc, at(r, c));
        lane[static_cast<size_t>(y)] = acc;
      }
      for (int s = p.lanes / 2; s > 0; s /= 2) {
        for (int y = 0; y < s; ++y) lane[y] = combine(op, lane[y], lane[y + s]);
      }
      out[static_cast<size_t>(k * cols + c)] = lane[0];
    }
  }
  return out;
}

// The column reduction's results (before the rounding to Out) in the kernels' order.
std::vector<float> expected_columns(ReduceOp op, const rd::ColumnPlan& plan,
                                    const std::vector<float>& x, int64_t rows, int64_t cols) {
  const float count = static_cast<float>(rows);
  std::vector<float> first = column_pass(op, plan.first, rows, cols, [&](int64_t r, int64_t c) {
    return x[static_cast<size_t>(r * cols + c)];
  });
  if (plan.first.chunks > 1) {
    first = column_pass(op, plan.second, plan.first.chunks, cols, [&](int64_t r, int64_t c) {
      return first[static_cast<size_t>(r * cols + c)];
    });
  }
  for (float& v : first) v = finish(op, v, count);
  return first;
}

float warp_reduce(ReduceOp op, const std::vector<float>& v) {
  return ska::simt::warp_butterfly(v, [op](float a, float b) { return combine(op, a, b); });
}

// A warp's fold of len elements (lane l: l, l + 32, ...) and its butterfly.
float warp_row(ReduceOp op, int64_t len, const std::function<float(int64_t)>& at) {
  std::vector<float> v(32, identity(op));
  for (int l = 0; l < 32; ++l) {
    for (int64_t j = l; j < len; j += 32) v[l] = combine(op, v[l], at(j));
  }
  return warp_reduce(op, v);
}

// The row reduction's results in the kernels' order: a warp a row up to 1024 elements, else a
// block of 512 threads (16 warps, then warp 0 over their results) a piece of `chunks`, the
// pieces' partials then reduced by a warp a row.
std::vector<float> expected_rows(ReduceOp op, const std::vector<float>& x, int64_t rows,
                                 int64_t len, int64_t chunks) {
  const float count = static_cast<float>(len);
  std::vector<float> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* p = x.data() + r * len;
    float acc;
    if (len <= 1024) {
      acc = warp_row(op, len, [&](int64_t j) { return p[j]; });
    } else {
      const int64_t chunk_len = (len + chunks - 1) / chunks;
      std::vector<float> partial(static_cast<size_t>(chunks));
      for (int64_t k = 0; k < chunks; ++k) {
        const int64_t end = std::min(len, (k + 1) * chunk_len);
        std::vector<float> warps(32, identity(op));
        for (int w = 0; w < 16; ++w) {
          std::vector<float> v(32, identity(op));
          for (int l = 0; l < 32; ++l) {
            for (int64_t j = k * chunk_len + 32 * w + l; j < end; j += 512) {
              v[l] = combine(op, v[l], p[j]);
            }
          }
          warps[w] = warp_reduce(op, v);
        }
        partial[static_cast<size_t>(k)] = warp_reduce(op, warps);
      }
      acc = chunks == 1 ? partial[0] : warp_row(op, chunks, [&](int64_t k) { return partial[k]; });
    }
    out[static_cast<size_t>(r)] = finish(op, acc, count);
  }
  return out;
}

// The relative rounding of Out.
template <typename Out>
double out_eps() {
  if constexpr (std::is_same_v<Out, bf16>) return std::ldexp(1.0, -8);
  if constexpr (std::is_same_v<Out, __half>) return std::ldexp(1.0, -11);
  return std::ldexp(1.0, -24);
}

// Checks got against f64: sums and means within `chain` f32 additions' error of the sum of
// magnitudes and Out's rounding; max and min exactly; NaN where an element is. element(i, j): the
// j-th of the n elements reduced into output i.
template <typename Out>
void check_against_f64(ReduceOp op, const std::vector<Out>& got, int64_t outs, int64_t n,
                       double chain, const std::function<float(int64_t, int64_t)>& element) {
  int64_t bad = 0;
  for (int64_t i = 0; i < outs; ++i) {
    double sum = 0.0, magnitude = 0.0;
    float best = identity(op);
    bool nan = false;
    for (int64_t j = 0; j < n; ++j) {
      const float v = element(i, j);
      nan = nan || std::isnan(v);
      sum += v;
      magnitude += std::abs(v);
      best = combine(op, best, v);
    }
    const double g = value(got[static_cast<size_t>(i)]);
    if (nan) {
      bad += !std::isnan(g);
      continue;
    }
    if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
      bad += g != static_cast<double>(best);
      continue;
    }
    const double scale = op == ReduceOp::kMean ? 1.0 / static_cast<double>(n) : 1.0;
    const double want = sum * scale;
    const double bound = (chain + 2.0) * std::ldexp(1.0, -24) * magnitude * scale +
                         out_eps<Out>() * std::abs(want) + 1e-30;
    if (!(std::abs(g - want) <= bound)) {
      if (bad < 5) UNSCOPED_INFO("output " << i << ": " << g << " against " << want);
      ++bad;
    }
  }
  CHECK(bad == 0);
}

template <typename T>
std::vector<T> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = round_to<T>(normal(rng) * (1.0f + (i % 7)));
  return v;
}

template <typename E>
std::vector<float> as_floats(const std::vector<E>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = static_cast<float>(value(v[i]));
  return f;
}

// Bytes a kernel must not write (past the outputs), all ones.
template <typename E>
bool untouched_from(const std::vector<E>& v, size_t from) {
  const auto* b = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = from * sizeof(E); i < v.size() * sizeof(E); ++i) {
    if (b[i] != 0xff) return false;
  }
  return true;
}

struct ColumnCase {
  std::string name;
  int64_t rows, cols, sms;
  bool misalign;  // x one element past a 16-byte boundary: element loads
  bool all_ops;   // else the sum alone (the full-size shapes)
};

std::vector<ColumnCase> column_cases() {
  return {
      {"ViT-S's bias gradients at batch 512: [33280, 512] on 132 SMs", 33280, 512, 132, false,
       false},
      {"[4160, 1536] (an MLP's hidden bias) on 132 SMs", 4160, 1536, 132, false, true},
      {"MetaFormer's stage-1 channels [12544, 64] on 132 SMs", 12544, 64, 132, false, true},
      {"a misaligned view [3000, 64]: element loads", 3000, 64, 132, true, true},
      {"few rows [2, 33]", 2, 33, 132, false, true},
      {"few columns [65, 3]", 65, 3, 132, false, true},
      {"many rows, few columns [100000, 5]", 100000, 5, 132, false, true},
      {"24 columns of 16-bit pairs, rows not a multiple of the lanes [777, 24]", 777, 24, 132,
       false, true},
      {"one SM: [5000, 40]", 5000, 40, 1, false, true},
  };
}

template <typename T, typename Out>
void check_columns(const ColumnCase& c, uint32_t seed) {
  const size_t n = static_cast<size_t>(c.rows * c.cols);
  // At a 16-byte boundary, or one element past it.
  ska::simt::Buffer<T> xb(static_cast<int64_t>(n), c.misalign);
  T* x = xb.data;
  const std::vector<T> values = random_values<T>(n, seed);
  std::memcpy(static_cast<void*>(x), values.data(), n * sizeof(T));
  std::vector<float> xf = as_floats(values);
  const rd::ColumnPlan plan = rd::column_plan(c.rows, c.cols, sizeof(T), !c.misalign, c.sms);
  const double chain = static_cast<double>(plan.first.chunk_rows / plan.first.lanes + 1) +
                       std::log2(plan.first.lanes) +
                       (plan.first.chunks > 1 ? plan.first.chunks / plan.second.lanes + 1.0 +
                                                    std::log2(plan.second.lanes)
                                              : 0.0);
  for (ReduceOp op : kOps) {
    if (!c.all_ops && op != ReduceOp::kSum) continue;
    INFO(op_name(op));
    visit(op, [&](auto op_c) {
      constexpr ReduceOp kOp = decltype(op_c)::value;
      std::vector<Out> got = ska::simt::unwritten<Out>(static_cast<size_t>(c.cols) + 3);
      rd::columns<kOp>(static_cast<const T*>(x), got.data(), c.rows, c.cols, c.sms);
      CHECK(untouched_from(got, static_cast<size_t>(c.cols)));
      got.resize(static_cast<size_t>(c.cols));
      std::vector<Out> want(static_cast<size_t>(c.cols));
      const std::vector<float> order = expected_columns(op, plan, xf, c.rows, c.cols);
      for (size_t i = 0; i < want.size(); ++i) want[i] = round_to<Out>(order[i]);
      CHECK(same_bits(got, want));
      check_against_f64(op, got, c.cols, c.rows, chain, [&](int64_t col, int64_t r) {
        return xf[static_cast<size_t>(r * c.cols + col)];
      });
      ska::simt::in_other_orders(seed, [&](const char* thread_order) {
        INFO(thread_order);
        std::vector<Out> again = ska::simt::unwritten<Out>(static_cast<size_t>(c.cols));
        rd::columns<kOp>(static_cast<const T*>(x), again.data(), c.rows, c.cols, c.sms);
        CHECK(same_bits(again, got));
      });
    });
  }
}

TEST_CASE("simt: column reductions: the kernels' order to the bit, f64 bounds, thread orders",
          "[cpu][simt][reduce]") {
  for (const ColumnCase& c : column_cases()) {
    INFO(c.name);
    SECTION(c.name + " bf16") { check_columns<bf16, bf16>(c, 11); }
    SECTION(c.name + " bf16 into f32") { check_columns<bf16, float>(c, 12); }
    if (c.all_ops) {
      SECTION(c.name + " f32") { check_columns<float, float>(c, 13); }
      SECTION(c.name + " f16") { check_columns<__half, __half>(c, 14); }
    }
  }
}

TEST_CASE("simt: column reductions: the plans load 16 bytes a thread and fill the GPU",
          "[cpu][simt][reduce]") {
  // ViT-S's bias gradients at batch 512, bf16: 8 columns a load, two tiles of 256 columns, and
  // enough chunks of rows for four blocks an SM of 132, each lane loading 16 rows.
  const rd::ColumnPlan vit = rd::column_plan(33280, 512, 2, true, 132);
  CHECK(vit.first.vec == 8);
  CHECK(vit.first.col_threads == 32);
  CHECK(vit.first.lanes == 8);
  CHECK(vit.first.tiles == 2);
  CHECK(vit.first.tiles * vit.first.chunks >= 4 * 132 - vit.first.tiles);
  CHECK(vit.first.chunk_rows / vit.first.lanes <= 16);
  // Its partials: 4 f32 columns a load, 32 lanes over the chunks.
  CHECK(vit.second.vec == 4);
  CHECK(vit.second.chunks == 1);
  CHECK(vit.second.col_threads * vit.second.lanes == 1024);
  CHECK(vit.second.chunk_rows == vit.first.chunks);
  // Narrow columns give their lanes to rows: 64 bf16 columns are 8 loads of 8 across.
  const rd::ColumnPlan narrow = rd::column_plan(12544, 64, 2, true, 132);
  CHECK(narrow.first.col_threads == 8);
  CHECK(narrow.first.lanes == 32);
  // No 16-byte loads off a 16-byte boundary or for columns they would straddle.
  CHECK(rd::column_plan(3000, 64, 2, false, 132).first.vec == 1);
  CHECK(rd::column_plan(3000, 60, 2, true, 132).first.vec == 1);
  CHECK(rd::column_plan(3000, 60, 4, true, 132).first.vec == 4);
  // Chunks of at least 64 rows: a short column is one pass.
  CHECK(rd::column_plan(100, 512, 2, true, 132).first.chunks == 1);
}

TEST_CASE("simt: column reductions: NaN propagates through every op, chunked or not",
          "[cpu][simt][reduce]") {
  for (const int64_t rows : {int64_t{200}, int64_t{20000}}) {
    const int64_t cols = 16;
    std::vector<float> x = as_floats(random_values<float>(static_cast<size_t>(rows * cols), 5));
    x[static_cast<size_t>((rows - 7) * cols + 3)] = NAN;
    for (ReduceOp op : kOps) {
      INFO(rows << " rows, " << op_name(op));
      visit(op, [&](auto op_c) {
        constexpr ReduceOp kOp = decltype(op_c)::value;
        std::vector<float> got(static_cast<size_t>(cols));
        rd::columns<kOp>(x.data(), got.data(), rows, cols, 132);
        for (int64_t c = 0; c < cols; ++c) CHECK(std::isnan(got[c]) == (c == 3));
      });
    }
  }
}

struct RowCase {
  std::string name;
  int64_t rows, len, sms;
  int64_t max_blocks = int64_t{1} << 20;  // the grid's cap, as on the GPU unless smaller
};

template <typename T, typename Out>
void check_rows(const RowCase& c, uint32_t seed) {
  const size_t n = static_cast<size_t>(c.rows * c.len);
  const std::vector<T> x = random_values<T>(n, seed);
  const std::vector<float> xf = as_floats(x);
  const int64_t chunks = rd::row_chunks(c.rows, c.len, c.sms);
  const double chain =
      c.len <= 1024
          ? static_cast<double>(c.len / 32 + 6)
          : static_cast<double>(c.len / chunks / 512 + 11 + (chunks > 1 ? chunks / 32 + 6 : 0));
  for (ReduceOp op : kOps) {
    INFO(op_name(op));
    visit(op, [&](auto op_c) {
      constexpr ReduceOp kOp = decltype(op_c)::value;
      std::vector<Out> got = ska::simt::unwritten<Out>(static_cast<size_t>(c.rows) + 2);
      rd::rows<kOp>(x.data(), got.data(), c.rows, c.len, c.sms, c.max_blocks);
      CHECK(untouched_from(got, static_cast<size_t>(c.rows)));
      got.resize(static_cast<size_t>(c.rows));
      const std::vector<float> order = expected_rows(op, xf, c.rows, c.len, chunks);
      std::vector<Out> want(order.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = round_to<Out>(order[i]);
      CHECK(same_bits(got, want));
      check_against_f64(op, got, c.rows, c.len, chain, [&](int64_t r, int64_t j) {
        return xf[static_cast<size_t>(r * c.len + j)];
      });
      ska::simt::in_other_orders(seed, [&](const char* thread_order) {
        INFO(thread_order);
        std::vector<Out> again = ska::simt::unwritten<Out>(static_cast<size_t>(c.rows));
        rd::rows<kOp>(x.data(), again.data(), c.rows, c.len, c.sms, c.max_blocks);
        CHECK(same_bits(again, got));
      });
    });
  }
}

TEST_CASE("simt: row reductions: warps, blocks and rows split over blocks, to the bit",
          "[cpu][simt][reduce]") {
  const std::vector<RowCase> cases = {
      {"a warp a row: [2080, 65]", 2080, 65, 132},
      {"a warp a row, 1024 long: [40, 1024]", 40, 1024, 132},
      {"a block a row: [300, 3000]", 300, 3000, 132},
      {"two long rows split over blocks: [2, 100000]", 2, 100000, 132},
      {"one long row on 4 SMs: [1, 50000]", 1, 50000, 4},
      // Grids smaller than the rows (on the GPU past 2^20 blocks): the kernels stride, a block
      // reusing its shared partials row after row.
      {"a warp a row, 3 blocks striding: [2080, 65]", 2080, 65, 132, 3},
      {"a block a row, 7 blocks striding: [300, 3000]", 300, 3000, 132, 7},
      {"two long rows split, 5 blocks striding: [2, 100000]", 2, 100000, 132, 5},
  };
  // The long rows are split, the others not.
  CHECK(rd::row_chunks(2, 100000, 132) > 1);
  CHECK(rd::row_chunks(1, 50000, 4) > 1);
  CHECK(rd::row_chunks(300, 3000, 132) == 1);
  for (const RowCase& c : cases) {
    INFO(c.name);
    SECTION(c.name + " f32") { check_rows<float, float>(c, 21); }
    SECTION(c.name + " bf16") { check_rows<bf16, bf16>(c, 22); }
    SECTION(c.name + " bf16 into f32") { check_rows<bf16, float>(c, 23); }
  }
}

}  // namespace
