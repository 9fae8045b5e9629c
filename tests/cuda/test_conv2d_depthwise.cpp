// The direct depthwise convolution kernels (cuda/kernels/conv2d_depthwise.cu): on the CPU, their
// own per-thread code (conv2d_depthwise.cuh) run block by block as the kernels run it, against an
// f64 reference; on a GPU, the kernels against the CPU twin and cuDNN, forced and timed.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/device_runtime.h"
#include "core/dtype.h"
#include "core/random.h"
#include "cuda/kernels/conv2d_depthwise.cuh"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;
namespace dw = ska::cuda::depthwise;

namespace {

// The host side of the kernels' element access: Vec elements converted to and from f32.
struct HostIo {
  static float to_f32(float v) { return v; }
  static float to_f32(BFloat16 v) { return v; }
  template <int Vec, typename T>
  static void load(const T* p, float* out) {
    for (int k = 0; k < Vec; ++k) out[k] = static_cast<float>(p[k]);
  }
  template <int Vec, typename T>
  static void store(T* p, const float* in) {
    for (int k = 0; k < Vec; ++k) p[k] = T(in[k]);
  }
};

const float kUnwritten = std::numeric_limits<float>::quiet_NaN();

// Deterministic values in [-1, 1), rounded to T.
template <typename T>
std::vector<T> values(size_t n, uint64_t seed) {
  std::vector<T> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& e : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    e = T(static_cast<float>(static_cast<double>(s >> 11) / 4503599627370496.0 - 1.0));
  }
  return v;
}

template <typename T>
std::vector<double> widen(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  return out;
}

// Calls f(out, in, tap) for every output element, input element and filter tap that meet in the
// convolution: offsets into [N, Ho, Wo, C], [N, H, W, C] and [C, 1, K, K].
template <typename F>
void for_each_product(const dw::Geometry& g, int k, F&& f) {
  for (int n = 0; n < g.n; ++n)
    for (int oh = 0; oh < g.ho; ++oh)
      for (int ow = 0; ow < g.wo; ++ow)
        for (int c = 0; c < g.c; ++c)
          for (int i = 0; i < k; ++i)
            for (int j = 0; j < k; ++j) {
              const int ih = oh - g.pad_h + i, iw = ow - g.pad_w + j;
              if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
              f(((static_cast<size_t>(n) * g.ho + oh) * g.wo + ow) * g.c + c,
                ((static_cast<size_t>(n) * g.h + ih) * g.w + iw) * g.c + c,
                (static_cast<size_t>(c) * k + i) * k + j);
            }
}

// The sums of a * b products into `sum` at the index `at` picks, in f64, and of their magnitudes
// into `mag` (for the f32 accumulation's tolerance).
struct Sums {
  std::vector<double> sum, mag;
  explicit Sums(size_t n) : sum(n, 0.0), mag(n, 0.0) {}
  void add(size_t at, double t) {
    sum[at] += t;
    mag[at] += std::fabs(t);
  }
};

// The forward kernel (flip false) or the input-gradient launch (flip true), block by block:
// every block stages its taps (all threads), then each thread computes its strips; at most
// `cap` blocks along the strips (the launches' kForwardBlocks, or fewer to make each walk more).
template <int K, typename T>
std::vector<float> emulate_correlation(const std::vector<T>& in, const std::vector<T>& w,
                                       const std::vector<T>* bias, const dw::Geometry& g, bool flip,
                                       int64_t cap) {
  constexpr int kVec = 16 / sizeof(T);
  const dw::Layout l = dw::make_layout(g, kVec, dw::kForwardStrip);
  std::vector<T> out(static_cast<size_t>(g.n) * g.ho * g.wo * g.c, T(kUnwritten));
  std::vector<float> taps(K * K * dw::kTileChannels, kUnwritten);
  const int64_t blocks = dw::forward_blocks(l, cap);
  const int threads = l.channel_threads * l.strip_threads;
  REQUIRE(threads <= dw::kThreads);
  for (int by = 0; by < l.channel_tiles; ++by) {
    for (int64_t bx = 0; bx < blocks; ++bx) {
      const int count = K * K * l.channel_threads * kVec;
      REQUIRE(count <= static_cast<int>(taps.size()));
      for (int tid = 0; tid < threads; ++tid)
        for (int e = tid; e < count; e += threads)
          taps[e] = dw::staged_tap<K, T, HostIo>(w.data(), g, l, by, flip, e);
      for (int ty = 0; ty < l.strip_threads; ++ty)
        for (int tx = 0; tx < l.channel_threads; ++tx)
          dw::forward_thread<K, kVec, T, HostIo>(in.data(), taps.data(),
                                                 bias ? bias->data() : nullptr, g, l, blocks, bx,
                                                 by, tx, ty, out.data());
    }
  }
  std::vector<float> result(out.size());
  for (size_t i = 0; i < out.size(); ++i) result[i] = static_cast<float>(out[i]);
  return result;
}

// The weight-gradient kernel block by block (each thread's sums, then the ordered block sum per
// tap) and the kernel that adds the slices' partials.
template <int K, typename T>
std::vector<float> emulate_weight_grad(const std::vector<T>& x, const std::vector<T>& dy,
                                       const dw::Geometry& g) {
  constexpr int kVec = 16 / sizeof(T);
  const dw::Layout l = dw::make_layout(g, kVec, dw::kWeightStrip);
  const int slices = dw::weight_grad_slices(l, K);
  const int64_t elements = static_cast<int64_t>(g.c) * K * K;
  std::vector<float> partial(slices * elements, kUnwritten);
  const int threads = l.channel_threads * l.strip_threads;
  std::vector<float> red(dw::kThreads * kVec, kUnwritten);
  struct Acc {
    float v[K][kVec];
  };
  std::vector<Acc> acc(threads);
  for (int i = 0; i < K; ++i)
    for (int by = 0; by < l.channel_tiles; ++by)
      for (int bx = 0; bx < slices; ++bx) {
        for (int ty = 0; ty < l.strip_threads; ++ty)
          for (int tx = 0; tx < l.channel_threads; ++tx)
            dw::weight_grad_thread<K, kVec, T, HostIo>(x.data(), dy.data(), g, l, slices, bx, by, i,
                                                       tx, ty, acc[ty * l.channel_threads + tx].v);
        const int width = l.channel_threads * kVec;
        for (int j = 0; j < K; ++j) {
          for (int ty = 0; ty < l.strip_threads; ++ty)
            for (int tx = 0; tx < l.channel_threads; ++tx)
              for (int v = 0; v < kVec; ++v)
                red[ty * width + tx * kVec + v] = acc[ty * l.channel_threads + tx].v[j][v];
          for (int tx = 0; tx < l.channel_threads; ++tx)
            dw::weight_grad_block_sum<K, kVec>(red.data(), g, l, bx, by, i, j, tx, partial.data());
        }
      }
  size_t unwritten = 0;
  for (const float p : partial) unwritten += std::isnan(p) ? 1 : 0;
  REQUIRE(unwritten == 0);  // every partial written
  std::vector<float> grad(elements);
  for (int64_t e = 0; e < elements; ++e) {
    grad[e] = static_cast<float>(T(dw::weight_grad_total(partial.data(), elements, slices, e)));
  }
  return grad;
}

// |got - ref| within `rounding` of |ref| (the output's own rounding) plus 1e-5 of the sum of the
// terms' magnitudes (f32 accumulation); every element written.
void require_near(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::vector<double>& mag, double rounding) {
  REQUIRE(got.size() == ref.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rounding * std::fabs(ref[i]) + 1e-5 * mag[i] + 1e-12;
    if (!(std::fabs(got[i] - ref[i]) <= tol)) {
      if (bad++ < 5) FAIL_CHECK("element " << i << ": " << got[i] << " against " << ref[i]);
    }
  }
  CHECK(bad == 0);
}

struct Case {
  int n, c, h, w, pad;
};

template <int K, typename T>
void check_case(const Case& cs, double rounding) {
  dw::Geometry g{cs.n,   cs.h,  cs.w, cs.c, cs.h + 2 * cs.pad - K + 1, cs.w + 2 * cs.pad - K + 1,
                 cs.pad, cs.pad};
  INFO("K " << K << ", N " << g.n << ", C " << g.c << ", " << g.h << "x" << g.w << ", pad "
            << cs.pad << ", " << sizeof(T) * 8 << "-bit");
  REQUIRE(g.ho > 0);
  REQUIRE(g.wo > 0);
  const size_t in_size = static_cast<size_t>(g.n) * g.h * g.w * g.c;
  const size_t out_size = static_cast<size_t>(g.n) * g.ho * g.wo * g.c;
  const std::vector<T> x = values<T>(in_size, 1), w = values<T>(g.c * K * K, 2),
                       bias = values<T>(g.c, 3), dy = values<T>(out_size, 4);
  const std::vector<double> xd = widen(x), wd = widen(w), bd = widen(bias), dyd = widen(dy);

  // Forward with bias.
  Sums y(out_size);
  for (size_t o = 0; o < out_size; ++o) y.add(o, bd[o % g.c]);
  for_each_product(g, K, [&](size_t o, size_t in, size_t tap) { y.add(o, xd[in] * wd[tap]); });
  for (const int64_t cap : {int64_t{dw::kForwardBlocks}, int64_t{3}}) {
    INFO("at most " << cap << " blocks along the strips");
    require_near(emulate_correlation<K>(x, w, &bias, g, false, cap), y.sum, y.mag, rounding);
  }

  // Input gradient: dx[n, ih, iw, c] = the sum over taps of dy[n, ih + pad - i, iw + pad - j, c]
  // * w[c, i, j], through the flipped launch.
  const dw::Geometry gi{g.n, g.ho, g.wo, g.c, g.h, g.w, K - 1 - g.pad_h, K - 1 - g.pad_w};
  Sums dx(in_size);
  for_each_product(g, K, [&](size_t o, size_t in, size_t tap) { dx.add(in, dyd[o] * wd[tap]); });
  for (const int64_t cap : {int64_t{dw::kForwardBlocks}, int64_t{3}}) {
    INFO("input gradient, at most " << cap << " blocks along the strips");
    require_near(emulate_correlation<K, T>(dy, w, nullptr, gi, true, cap), dx.sum, dx.mag,
                 rounding);
  }

  // Weight gradient.
  Sums dwt(static_cast<size_t>(g.c) * K * K);
  for_each_product(g, K, [&](size_t o, size_t in, size_t tap) { dwt.add(tap, dyd[o] * xd[in]); });
  require_near(emulate_weight_grad<K>(x, dy, g), dwt.sum, dwt.mag, rounding);
}

}  // namespace

TEST_CASE("depthwise kernels' thread code, run block by block on the host: f32", "[cpu]") {
  // Strips with tails (W not a multiple of 8 or 4), pads 0 to K - 1, one and several channel
  // tiles (32 groups of 4 channels a tile), an image whose rows outnumber the weight-gradient
  // threads (each takes several strips).
  check_case<3, float>({2, 8, 5, 9, 1}, 0.0);
  check_case<3, float>({1, 4, 3, 3, 2}, 0.0);
  check_case<5, float>({2, 12, 7, 6, 0}, 0.0);
  check_case<7, float>({2, 136, 9, 11, 3}, 0.0);
  check_case<7, float>({1, 16, 8, 8, 6}, 0.0);
  check_case<7, float>({2, 128, 56, 56, 3}, 0.0);
}

TEST_CASE("depthwise kernels' thread code, run block by block on the host: bf16", "[cpu]") {
  // 16 groups of 8 channels a tile; bf16 outputs round to 8 bits.
  const double rounding = std::ldexp(1.0, -8);
  check_case<3, BFloat16>({2, 8, 5, 9, 1}, rounding);
  check_case<5, BFloat16>({1, 16, 6, 13, 4}, rounding);
  check_case<7, BFloat16>({2, 136, 9, 11, 3}, rounding);
  check_case<7, BFloat16>({2, 64, 28, 28, 3}, rounding);
}

TEST_CASE("depthwise weight-gradient slices depend on the shape alone", "[cpu]") {
  const dw::Geometry g{128, 56, 56, 128, 56, 56, 3, 3};  // CAFormer-S18's first stage, batch 128
  const dw::Layout l = dw::make_layout(g, 8, dw::kWeightStrip);
  CHECK(l.channel_threads == 16);
  CHECK(l.strip_threads == 16);
  CHECK(l.channel_tiles == 1);
  CHECK(l.strips == 128 * 56 * 14);
  const int slices = dw::weight_grad_slices(l, 7);
  CHECK(slices == (dw::kWeightBlocks + 6) / 7);
  // f32 at 56x56 with 128 channels (the host test's largest case): more strips than threads, so
  // each thread walks several.
  const dw::Geometry f32_case{2, 56, 56, 128, 56, 56, 3, 3};
  const dw::Layout lf = dw::make_layout(f32_case, 4, dw::kWeightStrip);
  CHECK(lf.strips > static_cast<int64_t>(dw::weight_grad_slices(lf, 7)) * lf.strip_threads);
  // CAFormer-S18's first stage at batch 128: the forward blocks walk several rows of strips.
  const dw::Layout lf16 = dw::make_layout(g, 8, dw::kForwardStrip);
  CHECK(dw::forward_blocks(lf16) == dw::kForwardBlocks);
  CHECK(lf16.strips > 2 * dw::forward_blocks(lf16) * lf16.strip_threads);
  // Never more slices than rows of threads can fill.
  const dw::Geometry tiny{1, 3, 3, 8, 3, 3, 1, 1};
  CHECK(dw::weight_grad_slices(dw::make_layout(tiny, 8, dw::kWeightStrip), 3) == 1);
}

#ifdef SKA_WITH_CUDA

#include "backend/backend.h"
#include "core/precision.h"
#include "cuda/kernels/conv2d_depthwise.h"

namespace {

const Device kGpu = Device::cuda(0);

// [N, C, H, W] `x` laid out channels-last.
Tensor channels_last(const Tensor& x) {
  return x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

struct ModeGuard {
  DepthwiseConv saved;
  bool benchmark = cudnn_benchmark();
  explicit ModeGuard(DepthwiseConv mode) : saved(set_cuda_depthwise_conv(mode)) {}
  ~ModeGuard() {
    set_cuda_depthwise_conv(saved);
    set_cudnn_benchmark(benchmark);
  }
};

}  // namespace

TEST_CASE("cuda depthwise conv: direct kernels against the CPU, forced and timed", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  struct Shape4 {
    Shape x, w;
    int64_t pad;
  };
  for (const DepthwiseConv mode : {DepthwiseConv::kDirect, DepthwiseConv::kTimed}) {
    ModeGuard guard(mode);
    set_cudnn_benchmark(true);
    for (const Shape4& s :
         {Shape4{{2, 16, 9, 11}, {16, 1, 3, 3}, 1}, Shape4{{2, 64, 14, 14}, {64, 1, 7, 7}, 3},
          Shape4{{1, 136, 9, 7}, {136, 1, 5, 5}, 4}, Shape4{{2, 24, 9, 13}, {24, 1, 7, 7}, 0}}) {
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        INFO("mode " << static_cast<int>(mode) << ", x " << shape_str(s.x) << ", w "
                     << shape_str(s.w) << ", pad " << s.pad << ", " << dtype_name(dt));
        const int64_t pad = s.pad, c = s.x[1];
        // The direct kernels qualify for these operands.
        const Tensor xg = channels_last(ska::test::uniform(s.x, 5).to(kGpu, dt));
        const Tensor wg = ska::test::uniform(s.w, 6).to(kGpu, dt);
        Conv2dParams p;
        p.pad_h = p.pad_w = pad;
        p.groups = c;
        const Tensor yg = channels_last(Tensor::empty(
            {s.x[0], c, s.x[2] + 2 * pad - s.w[2] + 1, s.x[3] + 2 * pad - s.w[3] + 1}, dt, kGpu));
        REQUIRE(cuda::depthwise_direct_supported(xg, yg, wg, p));
        ska::test::check_cuda_parity(
            [pad, c](const TensorList& in) {
              return conv2d(channels_last(in[0]), in[1], in[2], 1, pad, 1, c);
            },
            {ska::test::uniform(s.x, 7).set_requires_grad(),
             ska::test::uniform(s.w, 8).set_requires_grad(),
             ska::test::uniform({c}, 9).set_requires_grad()},
            dt);
      }
    }
  }
}

TEST_CASE("cuda depthwise conv: direct kernels repeat their results bit for bit", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  ModeGuard guard(DepthwiseConv::kDirect);
  const int64_t c = 128;
  std::vector<std::vector<float>> runs[2];
  for (auto& r : runs) {
    const Tensor x = channels_last(ska::test::uniform({4, c, 28, 28}, 11))
                         .to(kGpu, DType::kBF16)
                         .set_requires_grad();
    const Tensor w =
        ska::test::uniform({c, 1, 7, 7}, 12).to(kGpu, DType::kBF16).set_requires_grad();
    const Tensor y = conv2d(x, w, Tensor(), 1, 3, 1, c);
    sum(y * y).backward();
    r = {y.to_vector<float>(), x.grad().to_vector<float>(), w.grad().to_vector<float>()};
  }
  CHECK(runs[0] == runs[1]);
}

#endif  // SKA_WITH_CUDA
