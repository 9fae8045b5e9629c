// Kernel-level CUDA tests of the cases op-level parity does not reach: softmax rows past the
// warp and shared-memory limits, ViT-sized layer norm, conv algorithm-cache reuse, edge indices.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <utility>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "core/precision.h"
#include "support/test_util.h"

#ifdef SKA_WITH_CUDA

using namespace ska;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;

namespace {

const Device kGpu = Device::cuda(0);

Tensor gpu_f32(const Tensor& host) { return host.to(kGpu, DType::kF32); }
Tensor host_f64(const std::vector<double>& v, const Shape& s) {
  return Tensor::from_vector(v, s, DType::kF64);
}

// softmax(scale * x + mask) per row, in double; mask rows repeat with period `mask_rows`.
std::vector<double> softmax_ref(const std::vector<double>& x, const std::vector<double>& mask,
                                int64_t rows, int64_t cols, int64_t mask_rows, double scale,
                                bool log) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, sum = 0;
    auto z = [&](int64_t c) { return scale * x[r * cols + c] + mask[(r % mask_rows) * cols + c]; };
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, z(c));
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(z(c) - mx);
    for (int64_t c = 0; c < cols; ++c) {
      y[r * cols + c] = log ? z(c) - mx - std::log(sum) : std::exp(z(c) - mx) / sum;
    }
  }
  return y;
}

void check_long_softmax(int64_t cols, bool log) {
  const int64_t rows = 6, mask_rows = 2;
  const double scale = 0.5;
  const Tensor x = uniform({3, mask_rows, cols}, 11, -4, 4);
  const Tensor mask = uniform({mask_rows, cols}, 12, -2, 2);
  const std::vector<double> ref = softmax_ref(x.to_vector<double>(), mask.to_vector<double>(), rows,
                                              cols, mask_rows, scale, log);
  // The mask as a broadcast view over the batch dim (stride 0), as the op layer passes it.
  const Tensor mask_gpu = gpu_f32(mask).unsqueeze(0).expand({3, mask_rows, cols});
  const Tensor y = Tensor::empty({3, mask_rows, cols}, DType::kF32, kGpu);
  cuda::softmax_forward(gpu_f32(x), mask_gpu, scale, log, y);
  require_close(y, host_f64(ref, {3, mask_rows, cols}), tolerance_for(DType::kF32), "softmax y");

  // Backward against the analytic formula in double.
  const Tensor gy = uniform({3, mask_rows, cols}, 13);
  const std::vector<double> g = gy.to_vector<double>();
  std::vector<double> gx(ref.size());
  for (int64_t r = 0; r < rows; ++r) {
    double red = 0;
    for (int64_t c = 0; c < cols; ++c)
      red += log ? g[r * cols + c] : g[r * cols + c] * ref[r * cols + c];
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      gx[i] = scale * (log ? g[i] - std::exp(ref[i]) * red : ref[i] * (g[i] - red));
    }
  }
  const Tensor gx_gpu = Tensor::empty({3, mask_rows, cols}, DType::kF32, kGpu);
  cuda::softmax_backward(y, gpu_f32(gy), scale, log, gx_gpu);
  require_close(gx_gpu, host_f64(gx, {3, mask_rows, cols}), tolerance_for(DType::kF32),
                "softmax grad_x");
}

}  // namespace

TEST_CASE("cuda softmax: long rows, cached and uncached, with a broadcast mask", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (const int64_t cols : {1000, 1025, 3136, 20000}) {  // warp, block + smem, block + global
    for (const bool log : {false, true}) {
      INFO("cols " << cols << " log " << log);
      check_long_softmax(cols, log);
    }
  }
}

namespace {

// Layer norm of [rows, cols] forward and backward against a double reference, with or without
// a weight, on the path set_cuda_layer_norm_fused_backward selects.
void check_layer_norm(int64_t rows, int64_t cols, bool with_weight) {
  const Tensor x = uniform({rows, cols}, 21, -3, 5);
  const Tensor w = uniform({cols}, 22, 0.5, 1.5), b = uniform({cols}, 23);
  const Tensor gy = uniform({rows, cols}, 24);
  const std::vector<double> xv = x.to_vector<double>(), bv = b.to_vector<double>(),
                            gv = gy.to_vector<double>();
  const std::vector<double> wv =
      with_weight ? w.to_vector<double>() : std::vector<double>(static_cast<size_t>(cols), 1.0);
  std::vector<double> y(rows * cols), gx(rows * cols), gw(cols, 0.0), gb(cols, 0.0), mu(rows),
      rs(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, v = 0, a = 0, s = 0;
    for (int64_t c = 0; c < cols; ++c) m += xv[r * cols + c] / cols;
    for (int64_t c = 0; c < cols; ++c) v += (xv[r * cols + c] - m) * (xv[r * cols + c] - m) / cols;
    mu[r] = m;
    rs[r] = 1.0 / std::sqrt(v + 1e-5);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const double xh = (xv[i] - m) * rs[r];
      y[i] = xh * wv[c] + bv[c];
      gw[c] += gv[i] * xh;
      gb[c] += gv[i];
      a += gv[i] * wv[c] * xh / cols;
      s += gv[i] * wv[c] / cols;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      gx[i] = rs[r] * (gv[i] * wv[c] - s - (xv[i] - m) * rs[r] * a);
    }
  }
  const Tensor xg = gpu_f32(x), wg = with_weight ? gpu_f32(w) : Tensor();
  const Tensor yg = Tensor::empty({rows, cols}, DType::kF32, kGpu);
  const Tensor mg = Tensor::empty({rows}, DType::kF32, kGpu),
               rg = Tensor::empty({rows}, DType::kF32, kGpu);
  cuda::layer_norm_forward(xg, wg, gpu_f32(b), 1e-5, yg, mg, rg);
  const auto tol = tolerance_for(DType::kF32);
  require_close(yg, host_f64(y, {rows, cols}), tol, "layer_norm y");
  require_close(mg, host_f64(mu, {rows}), tol, "layer_norm mean");
  require_close(rg, host_f64(rs, {rows}), tol, "layer_norm rstd");
  const Tensor gxg = Tensor::empty({rows, cols}, DType::kF32, kGpu);
  const Tensor gwg = Tensor::empty({cols}, DType::kF32, kGpu),
               gbg = Tensor::empty({cols}, DType::kF32, kGpu);
  cuda::layer_norm_backward(gpu_f32(gy), xg, wg, mg, rg, gxg, gwg, gbg);
  require_close(gxg, host_f64(gx, {rows, cols}), tol, "layer_norm grad_x");
  // Sums over thousands of rows: compare by normalised error.
  CHECK(ska::test::nmse(gwg, host_f64(gw, {cols})) < 1e-9);
  CHECK(ska::test::nmse(gbg, host_f64(gb, {cols})) < 1e-9);
  // Deterministic: the same inputs give bitwise the same parameter gradients, also when only
  // some of the gradients are wanted.
  const Tensor gw2 = Tensor::empty({cols}, DType::kF32, kGpu);
  cuda::layer_norm_backward(gpu_f32(gy), xg, wg, mg, rg, Tensor(), gw2, Tensor());
  CHECK(gw2.to_vector<float>() == gwg.to_vector<float>());
  const Tensor gb2 = Tensor::empty({cols}, DType::kF32, kGpu);
  cuda::layer_norm_backward(gpu_f32(gy), xg, wg, mg, rg, Tensor(), Tensor(), gb2);
  CHECK(gb2.to_vector<float>() == gbg.to_vector<float>());
  const Tensor gx2 = Tensor::empty({rows, cols}, DType::kF32, kGpu);
  cuda::layer_norm_backward(gpu_f32(gy), xg, wg, mg, rg, gx2, Tensor(), Tensor());
  CHECK(gx2.to_vector<float>() == gxg.to_vector<float>());
}

// The layer norm backward's fused path while alive.
struct FusedNormBackward {
  bool previous = set_cuda_layer_norm_fused_backward(true);
  ~FusedNormBackward() { set_cuda_layer_norm_fused_backward(previous); }
};

}  // namespace

TEST_CASE("cuda layer norm: C = 768 over 3136 rows, forward and backward", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_layer_norm(3136, 768, true);
}

TEST_CASE("cuda layer norm: the fused backward, every column count up to 768 and past it",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const FusedNormBackward fused;
  // 64 to 768: each register width of the kernel, with tails (100, 500, 700); 1000 takes the
  // two-kernel path; 70,000 rows: more than kMaxChunks blocks of kChunkRows.
  for (const int64_t cols : {64, 100, 256, 384, 500, 512, 700, 768, 1000}) {
    for (const bool with_weight : {true, false}) {
      INFO("cols " << cols << (with_weight ? "" : ", no weight"));
      check_layer_norm(cols == 100 ? 70000 : 1000, cols, with_weight);
    }
  }
}

TEST_CASE("cuda layer norm: the fused backward gives the two kernels' grad_x bits", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // An f32 x with a bf16 gradient (autocast's layer norm feeding a bf16 matmul), ViT-S's shape.
  const int64_t rows = 4160, cols = 512;
  const Tensor x = gpu_f32(uniform({rows, cols}, 31, -3, 5));
  const Tensor w = gpu_f32(uniform({cols}, 32, 0.5, 1.5)), b = gpu_f32(uniform({cols}, 33));
  const Tensor gy = uniform({rows, cols}, 34).to(kGpu, DType::kBF16);
  const Tensor y = Tensor::empty({rows, cols}, DType::kBF16, kGpu);
  const Tensor m = Tensor::empty({rows}, DType::kF32, kGpu);
  const Tensor r = Tensor::empty({rows}, DType::kF32, kGpu);
  cuda::layer_norm_forward(x, w, b, 1e-6, y, m, r);
  Tensor gx[2], gw[2], gb[2];
  for (int fused = 0; fused < 2; ++fused) {
    const bool previous = set_cuda_layer_norm_fused_backward(fused == 1);
    gx[fused] = Tensor::empty({rows, cols}, DType::kF32, kGpu);
    gw[fused] = Tensor::empty({cols}, DType::kF32, kGpu);
    gb[fused] = Tensor::empty({cols}, DType::kF32, kGpu);
    cuda::layer_norm_backward(gy, x, w, m, r, gx[fused], gw[fused], gb[fused]);
    set_cuda_layer_norm_fused_backward(previous);
  }
  CHECK(gx[1].to_vector<float>() == gx[0].to_vector<float>());
  // The parameter gradients sum in another order: equal to f32 rounding.
  require_close(gw[1], gw[0].to(Device::cpu(), DType::kF64), tolerance_for(DType::kF32), "grad_w");
  require_close(gb[1], gb[0].to(Device::cpu(), DType::kF64), tolerance_for(DType::kF32), "grad_b");
}

TEST_CASE("cuda add_layer_norm: the bits of the add, layer norm and cast kernels", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  using ska::test::bitwise_equal;
  // ViT-S's shape (65 tokens of 384) and a width past the fused backward's 768 columns; an f32
  // stream with a bf16 branch and output (autocast), f32 / bf16 throughout, and autocast's bf16
  // stream with f32 parameters (normalised as its f32 copy, with a bf16 or an f32 output). Each
  // without and with the branch's dropout inside (the bits of dropout, add, layer norm; and of
  // the cast and dropout's backward for the branch's gradient), 1000 columns taking a part group
  // of the draws, 96 a row of less than one group. Where the parameters have x's dtype, also with a
  // scale of the branch (CaiT's LayerScale: the bits of scaled_residual's kernels); and an f32
  // stream with a bf16 branch normalised into f32 (CaiT's norm1 read by two projections).
  struct Case {
    int64_t rows, cols;
    DType x, y, out, param;
  };
  for (const Case& c : {Case{4160, 384, DType::kF32, DType::kBF16, DType::kBF16, DType::kF32},
                        Case{4160, 384, DType::kF32, DType::kF32, DType::kF32, DType::kF32},
                        Case{4160, 384, DType::kF32, DType::kBF16, DType::kF32, DType::kF32},
                        Case{300, 1000, DType::kF32, DType::kF16, DType::kF16, DType::kF32},
                        Case{300, 96, DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16},
                        Case{4160, 384, DType::kBF16, DType::kBF16, DType::kBF16, DType::kF32},
                        Case{300, 1000, DType::kF16, DType::kF16, DType::kF32, DType::kF32}}) {
    for (const auto& [with_drop, scaled] : {std::pair{false, false}, std::pair{true, false},
                                            std::pair{false, true}, std::pair{true, true}}) {
      if (scaled && c.param != c.x) continue;  // a scale needs parameters of x's dtype
      INFO(c.rows << "x" << c.cols << " " << dtype_name(c.x) << " + " << dtype_name(c.y) << " -> "
                  << dtype_name(c.out) << ", parameters " << dtype_name(c.param) << ", dropout "
                  << with_drop << ", branch scale " << scaled);
      const Shape shape{c.rows, c.cols};
      const Tensor x = uniform(shape, 51, -3, 5).to(kGpu, c.x);
      const Tensor y = uniform(shape, 52, -2, 2).to(kGpu, c.y);
      const Tensor w = uniform({c.cols}, 53, 0.5, 1.5).to(kGpu, c.param);
      const Tensor b = uniform({c.cols}, 54).to(kGpu, c.param);
      const Tensor ys = scaled ? uniform({c.cols}, 57, -0.5, 0.5).to(kGpu, c.x) : Tensor();
      const auto stats = [&] { return Tensor::empty({c.rows}, DType::kF32, kGpu); };
      const auto mask = [&] { return Tensor::empty({(x.numel() + 7) / 8}, DType::kU8, kGpu); };
      // p = 0.3 from counter 17 plus a capture's offset base of 5.
      DropoutDraw drop;
      if (with_drop) {
        drop.seed = 1234;
        drop.offset = 17;
        drop.keep_prob = 0.7;
        drop.scale = 1.0 / 0.7;
        drop.offset_base = Tensor::full({1}, 5.0, DType::kI64).to(kGpu);
        drop.bits = mask();
      }
      // Unfused: dropout, binary add or scaled_residual's sum, layer norm (of the sum's f32 copy
      // for f32 parameters).
      Tensor branch = y;
      const Tensor bits0 = with_drop ? mask() : Tensor();
      if (with_drop) {
        branch = Tensor::empty(shape, c.y, kGpu);
        cuda::dropout_forward(y, drop.seed, drop.offset, drop.keep_prob, drop.scale,
                              drop.offset_base, branch, bits0);
      }
      const Tensor sum0 = Tensor::empty(shape, c.x, kGpu);
      const Tensor out0 = Tensor::empty(shape, c.out, kGpu);
      const Tensor m0 = stats(), r0 = stats();
      if (scaled) {
        cuda::scaled_residual_forward(x, Tensor(), branch, ys, Tensor(), DropoutDraw(), sum0);
      } else {
        cuda::binary(BinaryOp::kAdd, x, branch, sum0);
      }
      const Tensor norm_in = sum0.to(c.param == c.x ? c.x : DType::kF32);
      cuda::layer_norm_forward(norm_in, w, b, 1e-5, out0, m0, r0);
      // The fused forward on the loop kernels, then on the held-row ones (and layer_norm's held
      // kernel against its loop kernel's output above): the same bits.
      Tensor sum1 = Tensor::empty(shape, c.x, kGpu);
      Tensor out1 = Tensor::empty(shape, c.out, kGpu);
      Tensor m1 = stats(), r1 = stats();
      for (const bool held : {false, true}) {
        INFO("held-row forward " << held);
        // NaNs and a zero mask first: whatever a pass leaves unwritten shows.
        Tensor out_norm = Tensor::empty(shape, c.out, kGpu);
        Tensor m_norm = stats(), r_norm = stats();
        for (Tensor* t : {&sum1, &out1, &m1, &r1, &out_norm, &m_norm, &r_norm}) {
          t->fill_(std::nan(""));
        }
        if (with_drop) drop.bits.fill_(0.0);
        const bool previous = set_cuda_layer_norm_held_forward(held);
        cuda::add_layer_norm_forward(x, y, drop, ys, w, b, 1e-5, sum1, out1, m1, r1);
        cuda::layer_norm_forward(norm_in, w, b, 1e-5, out_norm, m_norm, r_norm);
        set_cuda_layer_norm_held_forward(previous);
        CHECK(bitwise_equal(sum1, sum0));
        CHECK(bitwise_equal(out1, out0));
        CHECK(bitwise_equal(m1, m0));
        CHECK(bitwise_equal(r1, r0));
        if (c.param == c.x) {  // layer_norm's own kernels take parameters of x's dtype
          CHECK(bitwise_equal(out_norm, out0));
          CHECK(bitwise_equal(m_norm, m0));
          CHECK(bitwise_equal(r_norm, r0));
        }
        if (with_drop) {
          CHECK(bitwise_equal(drop.bits, bits0));
          const double kept = mean(drop.bits.to(Device::cpu(), DType::kF32)).item() / 255.0;
          CHECK(kept > 0.2);  // not all zeros (a byte of 8 kept elements is 255)
        }
      }
      // Backward on both layer-norm backward paths: layer_norm_backward, add, cast (or
      // scaled_residual's branch gradient), dropout.
      const Tensor gy = uniform(shape, 55).to(kGpu, c.out);
      const Tensor gs = uniform(shape, 56).to(kGpu, c.x);
      for (const bool fused_backward : {false, true}) {
        INFO("fused layer norm backward " << fused_backward);
        const bool previous = set_cuda_layer_norm_fused_backward(fused_backward);
        const Tensor norm_grad = Tensor::empty(shape, norm_in.dtype(), kGpu);
        const Tensor gx0 = Tensor::empty(shape, c.x, kGpu);
        const Tensor gw0 = Tensor::empty({c.cols}, c.param, kGpu);
        const Tensor gb0 = Tensor::empty({c.cols}, c.param, kGpu);
        cuda::layer_norm_backward(gy, norm_in, w, m0, r0, norm_grad, gw0, gb0);
        cuda::binary(BinaryOp::kAdd, norm_grad.to(c.x), gs, gx0);
        Tensor branch0;  // y's gradient: add's cast to y's dtype, then dropout's backward
        if (scaled) {
          DropoutDraw drop0;
          if (with_drop) {
            drop0 = drop;
            drop0.bits = bits0;
          }
          branch0 = Tensor::empty(shape, c.y, kGpu);
          cuda::scaled_residual_backward(gx0, Tensor(), Tensor(), Tensor(), ys, Tensor(), drop0,
                                         Tensor(), branch0, Tensor(), Tensor());
        } else if (with_drop) {
          branch0 = Tensor::empty(shape, c.y, kGpu);
          cuda::dropout_backward(gx0.to(c.y), bits0, drop.scale, branch0);
        } else if (c.y != c.x) {
          branch0 = gx0.to(c.y);
        }
        const Tensor gx1 = Tensor::empty(shape, c.x, kGpu);
        const Tensor branch1 = branch0.defined() ? Tensor::empty(shape, c.y, kGpu) : Tensor();
        const Tensor gw1 = Tensor::empty({c.cols}, c.param, kGpu);
        const Tensor gb1 = Tensor::empty({c.cols}, c.param, kGpu);
        // With a scale, also its gradient: scaled_residual's gys on the same gradient, the same
        // sums in the same order.
        const Tensor gys0 = scaled ? Tensor::empty({c.cols}, c.x, kGpu) : Tensor();
        const Tensor gys1 = scaled ? Tensor::empty({c.cols}, c.x, kGpu) : Tensor();
        if (scaled) {
          DropoutDraw drop0;
          if (with_drop) {
            drop0 = drop;
            drop0.bits = bits0;
          }
          cuda::scaled_residual_backward(gx0, Tensor(), Tensor(), y, ys, Tensor(), drop0, Tensor(),
                                         Tensor(), Tensor(), gys0);
        }
        cuda::add_layer_norm_backward(gy, gs, sum1, w, m1, r1, drop, y, ys, gx1, branch1, gw1, gb1,
                                      gys1);
        set_cuda_layer_norm_fused_backward(previous);
        CHECK(bitwise_equal(gx1, gx0));
        if (branch0.defined()) CHECK(bitwise_equal(branch1, branch0));
        if (scaled) CHECK(bitwise_equal(gys1, gys0));
        CHECK(bitwise_equal(gw1, gw0));
        CHECK(bitwise_equal(gb1, gb0));
      }
    }
  }
}

namespace {

// Direct NCHW cross-correlation in double.
std::vector<double> conv_ref(const Tensor& x, const Tensor& w, const Conv2dParams& p, Shape* ys) {
  const Shape& xs = x.shape();
  const Shape& ws = w.shape();
  const int64_t n = xs[0], ci = xs[1], h = xs[2], wd = xs[3], co = ws[0], kh = ws[2], kw = ws[3];
  const int64_t ho = (h + 2 * p.pad_h - p.dilation_h * (kh - 1) - 1) / p.stride_h + 1;
  const int64_t wo = (wd + 2 * p.pad_w - p.dilation_w * (kw - 1) - 1) / p.stride_w + 1;
  const int64_t cig = ci / p.groups, cog = co / p.groups;
  *ys = {n, co, ho, wo};
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  std::vector<double> y(n * co * ho * wo, 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < co; ++o)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < cig; ++c)
            for (int64_t u = 0; u < kh; ++u)
              for (int64_t v = 0; v < kw; ++v) {
                const int64_t hi = i * p.stride_h - p.pad_h + u * p.dilation_h;
                const int64_t wi = j * p.stride_w - p.pad_w + v * p.dilation_w;
                if (hi < 0 || hi >= h || wi < 0 || wi >= wd) continue;
                const int64_t cx = (o / cog) * cig + c;
                acc +=
                    xv[((b * ci + cx) * h + hi) * wd + wi] * wv[((o * cig + c) * kh + u) * kw + v];
              }
          y[((b * co + o) * ho + i) * wo + j] = acc;
        }
  return y;
}

void check_conv(const Shape& xs, const Shape& ws, const Conv2dParams& p, uint64_t seed) {
  const Tensor x = uniform(xs, seed), w = uniform(ws, seed + 1), b = uniform({ws[0]}, seed + 2);
  Shape ys;
  std::vector<double> ref = conv_ref(x, w, p, &ys);
  const std::vector<double> bv = b.to_vector<double>();
  const int64_t plane = ys[2] * ys[3];
  for (size_t i = 0; i < ref.size(); ++i) ref[i] += bv[(i / plane) % ys[1]];
  const Tensor y = Tensor::empty(ys, DType::kF32, kGpu);
  cuda::conv2d_forward(gpu_f32(x), gpu_f32(w), gpu_f32(b), p, y);
  // TF32 tensor cores: 10-bit mantissa products.
  CHECK(ska::test::nmse(y, host_f64(ref, ys)) < 1e-5);
}

}  // namespace

TEST_CASE("cuda conv2d: algorithm cache reused across shapes and groups", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Conv2dParams dense;
  dense.pad_h = dense.pad_w = 1;
  Conv2dParams strided_groups;
  strided_groups.stride_h = strided_groups.stride_w = 2;
  strided_groups.groups = 2;
  Conv2dParams depthwise;
  depthwise.pad_h = depthwise.pad_w = 3;
  depthwise.groups = 8;
  for (int pass = 0; pass < 2; ++pass) {  // the second pass hits the cached algorithms
    INFO("pass " << pass);
    check_conv({2, 4, 9, 9}, {6, 4, 3, 3}, dense, 31);
    check_conv({1, 4, 12, 10}, {6, 2, 2, 2}, strided_groups, 41);
    check_conv({2, 8, 14, 14}, {8, 1, 7, 7}, depthwise, 51);
    check_conv({3, 4, 5, 5}, {6, 4, 3, 3}, dense, 61);  // same params, new shape: a new key
  }
}

TEST_CASE("cuda conv2d: timed algorithms (cudnn_benchmark), reused or heuristic inside a capture",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  struct Restore {
    bool was = cudnn_benchmark();
    ~Restore() { set_cudnn_benchmark(was); }
  } restore;
  set_cudnn_benchmark(true);
  Conv2dParams stem;  // CAFormer's stem: 7x7, stride 4, padding 2
  stem.stride_h = stem.stride_w = 4;
  stem.pad_h = stem.pad_w = 2;
  Conv2dParams down;  // its downsampling: 3x3, stride 2, padding 1
  down.stride_h = down.stride_w = 2;
  down.pad_h = down.pad_w = 1;
  for (int pass = 0; pass < 2; ++pass) {  // timed, then the cached choice
    INFO("pass " << pass);
    check_conv({2, 3, 64, 64}, {16, 3, 7, 7}, stem, 81);
    check_conv({2, 16, 16, 16}, {32, 16, 3, 3}, down, 91);
    // Backward data and filter too, in each dtype.
    for (DType dt : {DType::kF32, DType::kBF16}) {
      ska::test::check_cuda_parity(
          [down](const TensorList& in) { return conv2d(in[0], in[1], in[2], down); },
          {uniform({2, 16, 16, 16}, 92).set_requires_grad(),
           uniform({32, 16, 3, 3}, 93).set_requires_grad(),
           uniform({32}, 94).set_requires_grad()},
          dt);
    }
  }
  // A shape first met while a CUDA Graph is captured: timing would synchronise and break the
  // capture, so the heuristics choose; the replay computes the convolution.
  const Tensor x = uniform({2, 8, 10, 10}, 101), w = uniform({8, 8, 3, 3}, 102);
  const Tensor gx = gpu_f32(x), gw = gpu_f32(w);
  Tensor y;
  {
    DeviceGraph graph(kGpu, [&] { y = conv2d(gx, gw, Tensor(), 1, 1); });
    graph.replay();
    synchronize(kGpu);
    CHECK(ska::test::nmse(y, conv2d(x, w, Tensor(), 1, 1)) < 1e-5);
  }
  // A problem timed by eager calls first (a training step's warm-up), then captured, its three
  // passes: the capture takes the timed algorithms (the heuristics' backward-filter choice for
  // this kind of problem failed to capture on an H200), and the replay computes what the eager
  // calls did (within bf16 rounding: a timed algorithm may sum in any order). CSKA's logit
  // convolution: grouped by head, 49 outputs per group, bf16.
  Conv2dParams logits;
  logits.pad_h = logits.pad_w = 1;
  logits.groups = 2;
  const Tensor q = uniform({4, 32, 8, 8}, 103).to(kGpu, DType::kBF16);
  const Tensor k = uniform({98, 16, 3, 3}, 104).to(kGpu, DType::kBF16);
  const Tensor gy = uniform({4, 98, 8, 8}, 105).to(kGpu, DType::kBF16);
  const auto passes = [&] {
    TensorList out = {Tensor::empty({4, 98, 8, 8}, DType::kBF16, kGpu),
                      Tensor::empty(q.shape(), DType::kBF16, kGpu),
                      Tensor::empty(k.shape(), DType::kBF16, kGpu)};
    cuda::conv2d_forward(q, k, Tensor(), logits, out[0]);
    cuda::conv2d_backward_input(gy, k, logits, out[1]);
    cuda::conv2d_backward_weight(gy, q, logits, out[2]);
    return out;
  };
  const TensorList eager = passes();
  TensorList captured;
  DeviceGraph graph(kGpu, [&] { captured = passes(); });
  graph.replay();
  synchronize(kGpu);
  for (size_t i = 0; i < eager.size(); ++i) {
    INFO("pass " << i);
    require_close(captured[i], eager[i], tolerance_for(DType::kBF16), "replay vs eager");
  }
}

TEST_CASE("cuda conv2d: deterministic algorithms repeat their gradients bit for bit",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  struct Restore {
    bool benchmark = cudnn_benchmark(), deterministic = cudnn_deterministic();
    ~Restore() {
      set_cudnn_benchmark(benchmark);
      set_cudnn_deterministic(deterministic);
    }
  } restore;
  set_cudnn_deterministic(true);
  Conv2dParams down;  // CAFormer's downsampling: 3x3, stride 2, padding 1
  down.stride_h = down.stride_w = 2;
  down.pad_h = down.pad_w = 1;
  for (const bool timed : {false, true}) {
    set_cudnn_benchmark(timed);
    for (DType dt : {DType::kF32, DType::kBF16}) {
      INFO((timed ? "timed, " : "heuristics, ") << dtype_name(dt));
      const auto conv = [down](const TensorList& in) { return conv2d(in[0], in[1], in[2], down); };
      const TensorList inputs = {uniform({4, 32, 28, 28}, 111).set_requires_grad(),
                                 uniform({64, 32, 3, 3}, 112).set_requires_grad(),
                                 uniform({64}, 113).set_requires_grad()};
      ska::test::check_cuda_parity(conv, inputs, dt);
      // Two backward passes on the device: the same bits.
      std::vector<std::vector<float>> grads[2];
      for (auto& g : grads) {
        TensorList xs;
        for (const Tensor& x : inputs) xs.push_back(x.detach().to(kGpu, dt).set_requires_grad());
        sum(conv(xs)).backward();
        for (const Tensor& x : xs) g.push_back(x.grad().to_vector<float>());
      }
      CHECK(grads[0] == grads[1]);
    }
  }
}

TEST_CASE("cuda conv2d: backward-input as the forward pass of the rotated filter", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  struct Restore {
    bool benchmark = cudnn_benchmark();
    ConvInputGrad mode = set_cuda_conv_input_grad(ConvInputGrad::kTimed);
    ~Restore() {
      set_cudnn_benchmark(benchmark);
      set_cuda_conv_input_grad(mode);
    }
  } restore;
  // CSKA's logit convolution (groups = heads, 32 channels in, one per key out), a dense one and
  // a non-square one; each form forced, then timed (the faster kept).
  Conv2dParams cska;
  cska.pad_h = cska.pad_w = 1;
  cska.groups = 4;
  Conv2dParams dense;
  dense.pad_h = dense.pad_w = 1;
  Conv2dParams wide;
  wide.pad_w = 2;
  wide.groups = 2;
  struct Case {
    Shape x, w;
    Conv2dParams p;
  };
  for (const ConvInputGrad mode : {ConvInputGrad::kRotatedForward, ConvInputGrad::kBackwardData,
                                   ConvInputGrad::kTimed}) {
    set_cuda_conv_input_grad(mode);
    set_cudnn_benchmark(mode == ConvInputGrad::kTimed);
    for (const Case& c : {Case{{2, 128, 8, 8}, {4 * 64, 32, 3, 3}, cska},
                          Case{{2, 16, 9, 9}, {24, 16, 3, 3}, dense},
                          Case{{2, 8, 6, 10}, {6, 4, 3, 5}, wide}}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        INFO("mode " << static_cast<int>(mode) << ", w " << shape_str(c.w) << ", "
                     << dtype_name(dt));
        const Conv2dParams p = c.p;
        ska::test::check_cuda_parity(
            [p](const TensorList& in) { return conv2d(in[0], in[1], Tensor(), p); },
            {uniform(c.x, 121).set_requires_grad(), uniform(c.w, 122).set_requires_grad()}, dt);
      }
    }
  }
}

TEST_CASE("cuda batch norm: running statistics and eval mode", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const int64_t n = 4, c = 3, s = 50;
  const Tensor x = uniform({n, c, 5, 10}, 71, 1, 3);
  const std::vector<double> xv = x.to_vector<double>();
  std::vector<double> mean(c, 0), var(c, 0);
  for (int64_t k = 0; k < c; ++k) {
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) mean[k] += xv[(b * c + k) * s + i] / (n * s);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t i = 0; i < s; ++i) {
        const double d = xv[(b * c + k) * s + i] - mean[k];
        var[k] += d * d / (n * s);
      }
  }
  const Tensor rm = Tensor::zeros({c}, DType::kF32, kGpu),
               rv = Tensor::ones({c}, DType::kF32, kGpu);
  const Tensor y = Tensor::empty(x.shape(), DType::kF32, kGpu);
  const Tensor sm = Tensor::empty({c}, DType::kF32, kGpu),
               sr = Tensor::empty({c}, DType::kF32, kGpu);
  cuda::batch_norm_forward(gpu_f32(x), Tensor(), Tensor(), rm, rv, true, 0.1, 1e-5, y, sm, sr);
  std::vector<double> rm_ref(c), rv_ref(c), rs_ref(c);
  for (int64_t k = 0; k < c; ++k) {
    rm_ref[k] = 0.1 * mean[k];
    rv_ref[k] = 0.9 + 0.1 * var[k] * (n * s) / (n * s - 1);
    rs_ref[k] = 1.0 / std::sqrt(var[k] + 1e-5);
  }
  const auto tol = tolerance_for(DType::kF32);
  require_close(sm, host_f64(mean, {c}), tol, "save_mean");
  require_close(sr, host_f64(rs_ref, {c}), tol, "save_rstd");
  require_close(rm, host_f64(rm_ref, {c}), tol, "running_mean");
  require_close(rv, host_f64(rv_ref, {c}), tol, "running_var");
  // Eval uses (and does not change) the running statistics.
  cuda::batch_norm_forward(gpu_f32(x), Tensor(), Tensor(), rm, rv, false, 0.1, 1e-5, y, sm, sr);
  require_close(rm, host_f64(rm_ref, {c}), tol, "running_mean after eval");
  std::vector<double> y_ref(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    const int64_t k = (static_cast<int64_t>(i) / s) % c;
    y_ref[i] = (xv[i] - rm_ref[k]) / std::sqrt(rv_ref[k] + 1e-5);
  }
  require_close(y, host_f64(y_ref, x.shape()), tol, "eval y");
}

TEST_CASE("cuda cross entropy and index kernels: out-of-range indices", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Tensor logits = gpu_f32(uniform({2, 5}, 81));
  const Tensor loss = Tensor::empty({2}, DType::kF32, kGpu);
  const Tensor lse = Tensor::empty({2}, DType::kF32, kGpu);
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{3, -100}, {2}).to(kGpu);
  cuda::cross_entropy_forward(logits, bad, 0.1, loss, lse);  // no host sync: row 1 becomes NaN
  const std::vector<float> bad_loss = loss.to_vector<float>();
  CHECK(std::isfinite(bad_loss[0]));
  CHECK(std::isnan(bad_loss[1]));
  const Tensor target = Tensor::from_vector(std::vector<int64_t>{3, 4}, {2}).to(kGpu);
  cuda::cross_entropy_forward(logits, target, 0.1, loss, lse);
  const Tensor gl = Tensor::ones({2}, DType::kF32, kGpu);
  const Tensor grad = Tensor::empty({2, 5}, DType::kF32, kGpu);
  cuda::cross_entropy_backward(logits, lse, target, 0.1, gl, grad);
  const std::vector<float> g = grad.to_vector<float>();
  for (int r = 0; r < 2; ++r) {  // softmax - smoothed one-hot sums to zero on every row
    double sum = 0;
    for (int c = 0; c < 5; ++c) sum += g[r * 5 + c];
    CHECK(std::abs(sum) < 1e-6);
  }

  // index_add drops index 7; index_select writes zeros for it.
  const Tensor out = Tensor::zeros({3, 2}, DType::kF32, kGpu);
  const Tensor src = Tensor::ones({4, 2}, DType::kF32, kGpu);
  const Tensor index = Tensor::from_vector(std::vector<int64_t>{0, 2, 7, 0}, {4}).to(kGpu);
  cuda::index_add(src, 0, index, out);
  CHECK(out.to_vector<float>() == std::vector<float>{2, 2, 0, 0, 1, 1});
  const Tensor sel = Tensor::empty({4, 2}, DType::kF32, kGpu);
  cuda::index_select(out, 0, index, sel);
  CHECK(sel.to_vector<float>() == std::vector<float>{2, 2, 1, 1, 0, 0, 2, 2});
}

TEST_CASE("cuda index_add sums repeated indices in index order, as the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // A relative position bias's gradient (Swin: 169 table entries, 49 x 49 lookups) and, past the
  // by-output kernel's row limit, a wider table summed by column; both deterministic.
  struct Case {
    Shape out;
    int64_t dim, n;
  };
  for (const Case& c : {Case{{169}, 0, 2401}, Case{{2, 13, 3}, 1, 40}, Case{{1500, 3}, 0, 5000}}) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO(shape_str(c.out) << " along " << c.dim << ", " << c.n << " indices, " << dtype_name(dt));
      Shape src_shape = c.out;
      src_shape[static_cast<size_t>(c.dim)] = c.n;
      const int64_t rows = c.out[static_cast<size_t>(c.dim)];
      std::vector<int64_t> idx(static_cast<size_t>(c.n));
      for (int64_t i = 0; i < c.n; ++i) idx[static_cast<size_t>(i)] = (i * 7919 + i / 3) % rows;
      const Tensor index = Tensor::from_vector(idx, {c.n});
      const Tensor src = uniform(src_shape, 31, -1.0, 1.0, DType::kF32).to(dt);
      const Tensor start = uniform(c.out, 32, -1.0, 1.0, DType::kF32).to(dt);
      const Tensor want = start.clone();
      cpu::index_add(src, c.dim, index, want);
      std::vector<std::vector<float>> runs;
      for (int run = 0; run < 2; ++run) {
        const Tensor got = start.to(kGpu);
        cuda::index_add(src.to(kGpu), c.dim, index.to(kGpu), got);
        runs.push_back(got.to(Device::cpu(), DType::kF32).to_vector<float>());
        // The CPU's bits, but for a 16-bit table past the by-output kernel (rounded per add).
        if (dt == DType::kF32 || rows <= 1024) {
          CHECK(ska::test::bitwise_equal(got.to(Device::cpu()), want));
        } else {
          require_close(got, want, {0.05, 0.02}, "index_add by column");
        }
      }
      CHECK(runs[0] == runs[1]);
    }
  }
}

#endif  // SKA_WITH_CUDA
