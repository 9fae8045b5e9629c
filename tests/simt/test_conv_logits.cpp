// CSKA's direct conv-logit kernels' own code (cuda/kernels/conv_logits.cu), run on the host by
// tests/simt: the forward, grad_q, grad_w and the bias gradient against an f64 reference, and the
// forms that promise the same bits (grad_w by filter rows and by taps, ldmatrix and 16/32-bit
// fragment loads, threads in any order) compared bit for bit.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/device_runtime.h"
#include "tests/simt/conv_logits_host.h"
#include "tests/simt/values.h"

namespace {

using ska::ConvLogitsGeometry;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::untouched;
using ska::simt::unwritten;
using ska::simt::value;
using ska::simt::conv_logits::Strides;

// One problem, in the layouts CSKA's mixers give the kernels: q as the heads of a
// [B, tokens, q_width] projection (q_width = heads d, or twice that with `wide`: a projection
// whose other half the kernels must not read), the logits and their gradient [B, heads, tokens,
// row] with rows of `row` >= keys; with `class_row`, token 0 is the class token, which the
// kernels skip: q starts at token 1 and the logits at row 1, as CSKA-ViT's mixer writes the grid
// rows below the class row. With `interleaved` the logits and their gradient are laid out
// [B, tokens, heads, row] (the heads of each position side by side). grad_q goes into a buffer
// shaped like the projection.
struct Problem {
  std::string name;
  ConvLogitsGeometry geo;  // batch, heads, height, width, keys, d, kernel
  bool bias = true;
  int64_t row = 0;  // 0: keys
  bool class_row = false, wide = false, interleaved = false;
};

template <typename T>
struct Data {
  Problem p;
  std::vector<T> q, w, bias, grad;  // q and grad: whole buffers, NaN where not live
  int64_t positions() const { return p.geo.height * p.geo.width; }
  int64_t tokens() const { return positions() + (p.class_row ? 1 : 0); }
  int64_t row() const { return p.row > 0 ? p.row : p.geo.keys; }
  int64_t q_width() const { return (p.wide ? 2 : 1) * p.geo.heads * p.geo.d; }
  int64_t q_offset() const { return p.class_row ? q_width() : 0; }
  int64_t logit_offset() const { return p.class_row ? logit_strides().p : 0; }
  Strides q_strides() const { return {tokens() * q_width(), p.geo.d, q_width()}; }
  Strides logit_strides() const {
    if (p.interleaved) return {tokens() * p.geo.heads * row(), row(), p.geo.heads * row()};
    return {p.geo.heads * tokens() * row(), tokens() * row(), row()};
  }
  size_t q_count() const { return static_cast<size_t>(p.geo.batch * tokens() * q_width()); }
  size_t logit_count() const {
    return static_cast<size_t>(p.geo.batch * p.geo.heads * tokens() * row());
  }
  // Whether element i of the q (or grad_q) buffer, or of the logits (or their gradient), is
  // one the kernels read or write.
  bool q_live(size_t i) const {
    const int64_t col = static_cast<int64_t>(i) % q_width();
    const int64_t token = static_cast<int64_t>(i) / q_width() % tokens();
    return col < p.geo.heads * p.geo.d && token >= (p.class_row ? 1 : 0);
  }
  bool logit_live(size_t i) const {
    const int64_t col = static_cast<int64_t>(i) % row();
    const int64_t token = static_cast<int64_t>(i) / logit_strides().p % tokens();
    return col < p.geo.keys && token >= (p.class_row ? 1 : 0);
  }
};

template <typename T>
Data<T> make_data(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const T nan = round_to<T>(NAN);
  auto fill = [&](size_t n, auto live) {
    std::vector<T> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = live(i) ? round_to<T>(normal(rng)) : nan;
    return x;
  };
  auto all = [](size_t) { return true; };
  Data<T> x;
  x.p = p;
  const ConvLogitsGeometry& g = p.geo;
  x.q = fill(x.q_count(), [&](size_t i) { return x.q_live(i); });
  x.w = fill(static_cast<size_t>(g.heads) * g.kernel * g.kernel * g.keys * g.d, all);
  if (p.bias) x.bias = fill(static_cast<size_t>(g.heads) * g.keys, all);
  x.grad = fill(x.logit_count(), [&](size_t i) { return x.logit_live(i); });
  return x;
}

template <typename T>
struct Results {
  std::vector<T> logits, grad_q, grad_w, grad_bias;
};

struct Forms {
  bool async_loads = true, grad_w_rows = false;
  ska::simt::Schedule schedule = ska::simt::Schedule::kForward;
};

template <typename T>
Results<T> run(const Data<T>& x, const Forms& f) {
  const ConvLogitsGeometry& g = x.p.geo;
  ska::simt::conv_logits::set_async_loads(f.async_loads);
  ska::set_cuda_conv_logits_grad_w_rows(f.grad_w_rows);
  ska::simt::set_schedule(f.schedule, 77);
  Results<T> r;
  const T* q = x.q.data() + x.q_offset();
  r.logits = unwritten<T>(x.logit_count());
  ska::simt::conv_logits::forward(g, q, x.q_strides(), x.w.data(),
                                  x.p.bias ? x.bias.data() : nullptr,
                                  r.logits.data() + x.logit_offset(), x.logit_strides());
  r.grad_q = unwritten<T>(x.q_count());  // shaped like the projection
  r.grad_w = unwritten<T>(x.w.size());
  if (x.p.bias) r.grad_bias = unwritten<T>(x.bias.size());
  ska::simt::conv_logits::backward(g, x.grad.data() + x.logit_offset(), x.logit_strides(), q,
                                   x.q_strides(), x.w.data(), r.grad_q.data() + x.q_offset(),
                                   x.q_strides(), r.grad_w.data(),
                                   x.p.bias ? r.grad_bias.data() : nullptr);
  ska::set_cuda_conv_logits_grad_w_rows(false);
  ska::simt::conv_logits::set_async_loads(true);
  ska::simt::set_schedule(ska::simt::Schedule::kForward);
  return r;
}

struct Reference {
  std::vector<double> logits, grad_q, grad_w, grad_bias;
};

template <typename T>
Reference reference(const Data<T>& x) {
  const ConvLogitsGeometry& g = x.p.geo;
  const int64_t P = x.positions(), K = g.keys, d = g.d, k = g.kernel, r = k / 2;
  const Strides qs = x.q_strides(), ls = x.logit_strides();
  const int64_t q0 = x.q_offset(), l0 = x.logit_offset();
  Reference ref;  // over the whole buffers (0 where not live)
  ref.logits.assign(x.logit_count(), 0.0);
  ref.grad_q.assign(x.q_count(), 0.0);
  ref.grad_w.assign(x.w.size(), 0.0);
  ref.grad_bias.assign(x.bias.size(), 0.0);
  for (int64_t b = 0; b < g.batch; ++b) {
    for (int64_t h = 0; h < g.heads; ++h) {
      for (int64_t p = 0; p < P; ++p) {
        const int64_t y = p / g.width, xx = p % g.width;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t l = l0 + b * ls.b + h * ls.h + p * ls.p + j;
          double sum = x.p.bias ? value(x.bias[h * K + j]) : 0.0;
          const double dl = value(x.grad[l]);
          if (x.p.bias) ref.grad_bias[h * K + j] += dl;
          for (int64_t dy = 0; dy < k; ++dy) {
            for (int64_t dx = 0; dx < k; ++dx) {
              const int64_t ny = y + dy - r, nx = xx + dx - r;
              if (ny < 0 || ny >= g.height || nx < 0 || nx >= g.width) continue;
              const int64_t n = ny * g.width + nx, tap = dy * k + dx;
              for (int64_t c = 0; c < d; ++c) {
                const int64_t qi = q0 + b * qs.b + h * qs.h + n * qs.p + c;
                const int64_t wi = ((h * k * k + tap) * K + j) * d + c;
                sum += value(x.q[qi]) * value(x.w[wi]);
                ref.grad_q[qi] += dl * value(x.w[wi]);
                ref.grad_w[wi] += dl * value(x.q[qi]);
              }
            }
          }
          ref.logits[l] = sum;
        }
      }
    }
  }
  return ref;
}

// Every live element within the rounding of one f32 sum to T (half a unit in the last place:
// 2^-8 of the value in bf16, 2^-11 in f16; the kernels round nothing before) of the f64
// reference, plus 1e-4 of the reference's RMS for the f32 sums' own error; every other element
// of the buffer (row padding, the class row, the projection's other columns) left as it was.
// A neighbour or a key missed in one element fails it.
template <typename T, typename Live>
void require_near(const std::vector<T>& actual, const std::vector<double>& expected,
                  const std::string& what, Live live) {
  INFO(what);
  REQUIRE(actual.size() == expected.size());
  const double eps = std::is_same_v<T, __nv_bfloat16> ? 0x1p-8 : 0x1p-11;
  double norm = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (live(i)) norm += expected[i] * expected[i], ++n;
  }
  const double rms = std::sqrt(norm / std::max<int64_t>(n, 1));
  int64_t others_written = 0, outside = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!live(i)) {
      others_written += !untouched(actual[i]);
      continue;
    }
    const double a = value(actual[i]), e = expected[i];
    REQUIRE(std::isfinite(a));
    if (std::abs(a - e) > eps * std::abs(e) + 1e-4 * rms) {
      if (outside++ == 0) UNSCOPED_INFO("first at " << i << ": " << a << " against " << e);
    }
  }
  CHECK(others_written == 0);
  CHECK(outside == 0);
}

template <typename T>
void require_reference(const Data<T>& x, const Results<T>& r, const Reference& ref,
                       const std::string& what) {
  INFO(x.p.name << ": " << what);
  auto all = [](size_t) { return true; };
  require_near(r.logits, ref.logits, "logits", [&](size_t i) { return x.logit_live(i); });
  require_near(r.grad_q, ref.grad_q, "grad_q", [&](size_t i) { return x.q_live(i); });
  require_near(r.grad_w, ref.grad_w, "grad_w", all);
  if (x.p.bias) require_near(r.grad_bias, ref.grad_bias, "grad_bias", all);
}

template <typename T>
void require_same_bits(const Results<T>& a, const Results<T>& b, const std::string& what) {
  INFO(what);
  CHECK(same_bits(a.logits, b.logits));
  CHECK(same_bits(a.grad_q, b.grad_q));
  CHECK(same_bits(a.grad_w, b.grad_w));
  CHECK(same_bits(a.grad_bias, b.grad_bias));
}

// CSKA-ViT-S's logits as its mixer gives them (8x8 grids below a class row, q from a projection
// twice as wide, 65 keys of head dim 64 in rows of 72; ten images: two row chunks for grad_w,
// two images a forward and grad_q block), CSKAFormer-like grids of several key chunks, windows,
// a 5x9 grid without a bias in [B, tokens, heads, row] logits and a 5x5 filter at head dim 128.
std::vector<Problem> problems() {
  return {
      {"cska-vit-s 8x8 65 keys d64 rows of 72 below a class row",
       {10, 2, 8, 8, 65, 64, 3},
       true,
       72,
       true,
       true},
      {"14x14 196 keys d16", {1, 2, 14, 14, 196, 16, 3}, true, 0},
      {"7x7 49 keys d32 from a wide projection", {2, 2, 7, 7, 49, 32, 3}, true, 0, false, true},
      {"5x9 45 keys d48 without a bias, heads interleaved below a class row",
       {3, 2, 5, 9, 45, 48, 3},
       false,
       48,
       true,
       false,
       true},
      {"6x6 36 keys d128 5x5 filter", {2, 1, 6, 6, 36, 128, 5}, true, 40},
  };
}

TEST_CASE("simt: direct conv logits against an f64 reference (bf16)", "[cpu][simt]") {
  for (const Problem& p : problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 21);
    require_reference(x, run(x, Forms{}), reference(x), "grad_w per tap");
    Forms rows;
    rows.grad_w_rows = true;
    require_reference(x, run(x, rows), reference(x), "grad_w per row");
  }
}

TEST_CASE("simt: direct conv logits against an f64 reference (f16)", "[cpu][simt]") {
  for (const Problem& p : {problems()[0], problems()[2]}) {
    const Data<__half> x = make_data<__half>(p, 23);
    require_reference(x, run(x, Forms{}), reference(x), "f16");
  }
}

TEST_CASE("simt: conv logits grad_w by filter rows gives the per-tap blocks' bits", "[cpu][simt]") {
  for (const Problem& p : problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 25);
    for (bool async : {true, false}) {
      Forms taps, rows;
      taps.async_loads = rows.async_loads = async;
      rows.grad_w_rows = true;
      require_same_bits(run(x, rows), run(x, taps), p.name + (async ? ": ldmatrix" : ": sync"));
    }
  }
}

TEST_CASE("simt: conv logits by 16- and 32-bit loads give the ldmatrix fragments' bits",
          "[cpu][simt]") {
  for (const Problem& p : problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 27);
    Forms async, sync;
    sync.async_loads = false;
    require_same_bits(run(x, sync), run(x, async), p.name);
  }
}

TEST_CASE("simt: conv logits give the same bits whatever order a block's threads run in",
          "[cpu][simt]") {
  for (const Problem& p : {problems()[0], problems()[1], problems()[4]}) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 29);
    for (bool rows : {false, true}) {
      Forms base;
      base.grad_w_rows = rows;
      const Results<__nv_bfloat16> want = run(x, base);
      for (auto s : {ska::simt::Schedule::kReverse, ska::simt::Schedule::kShuffled,
                     ska::simt::Schedule::kWarpsAhead}) {
        Forms f = base;
        f.schedule = s;
        const char* order = s == ska::simt::Schedule::kReverse    ? ": reversed"
                            : s == ska::simt::Schedule::kShuffled ? ": shuffled"
                                                                  : ": warps ahead";
        require_same_bits(run(x, f), want,
                          p.name + (rows ? ", grad_w per row" : ", grad_w per tap") + order);
      }
    }
  }
}

TEST_CASE("simt: the conv-logit kernels' ldmatrix loads are free of bank conflicts",
          "[cpu][simt]") {
  // Every 8 x 8 matrix in one shared-memory wavefront (simt::Counts), the forward's and grad_q's
  // neighbour rows included where some lanes' neighbours are off the grid (their zero rows are
  // in the bank groups their rows would have been in).
  for (const Problem& p : problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 3);
    for (bool rows : {false, true}) {
      Forms f;
      f.grad_w_rows = rows;
      const ska::simt::Counts before = ska::simt::counts();
      run(x, f);
      const ska::simt::Counts after = ska::simt::counts();
      INFO(p.name << (rows ? ": grad_w per row" : ": grad_w per tap"));
      CHECK(after.ldmatrix_matrices > before.ldmatrix_matrices);
      CHECK(after.ldmatrix_wavefronts - before.ldmatrix_wavefronts ==
            after.ldmatrix_matrices - before.ldmatrix_matrices);
    }
  }
}

}  // namespace
