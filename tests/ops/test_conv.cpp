// conv2d: values against hand-computed cases and a direct-loop reference (dense, grouped,
// depthwise, stride, padding, dilation, 1x1), gradients by finite differences, errors, CUDA parity,
// and the channels-last layout against NCHW; grid_conv_logits (CSKA's logits) against conv2d.
#include <omp.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "backend/conv2d_rotated.h"
#include "backend/conv_logits_geometry.h"
#include "nn/mixers/attention_core.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::Tolerance;
using ska::test::tolerance_for;
using ska::test::uniform;
using ska::test::values;

namespace {

Conv2dParams make_params(int64_t stride, int64_t pad, int64_t dilation, int64_t groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

// The convolution by its definition, one output element at a time (f64).
Tensor loop_conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p) {
  const int64_t n = x.size(0), c_in = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t c_out = w.size(0), cg = w.size(1), kh = w.size(2), kw = w.size(3);
  const int64_t ho = (h + 2 * p.pad_h - p.dilation_h * (kh - 1) - 1) / p.stride_h + 1;
  const int64_t wo = (wd + 2 * p.pad_w - p.dilation_w * (kw - 1) - 1) / p.stride_w + 1;
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>();
  const std::vector<double> bv = bias.defined() ? bias.to_vector<double>() : std::vector<double>();
  std::vector<double> y(static_cast<size_t>(n * c_out * ho * wo), 0.0);
  const int64_t out_per_group = c_out / p.groups;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t co = 0; co < c_out; ++co)
      for (int64_t oh = 0; oh < ho; ++oh)
        for (int64_t ow = 0; ow < wo; ++ow) {
          double acc = bv.empty() ? 0.0 : bv[co];
          for (int64_t c = 0; c < cg; ++c) {
            const int64_t ci = (co / out_per_group) * cg + c;
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * p.stride_h - p.pad_h + i * p.dilation_h;
                const int64_t iw = ow * p.stride_w - p.pad_w + j * p.dilation_w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                acc += xv[((b * c_in + ci) * h + ih) * wd + iw] *
                       wv[((co * cg + c) * kh + i) * kw + j];
              }
          }
          y[((b * c_out + co) * ho + oh) * wo + ow] = acc;
        }
  return values(y, {n, c_out, ho, wo});
}

Tensor ramp(int64_t n, const Shape& shape) {  // 1, 2, ..., n
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<double>(i + 1);
  return values(v, shape);
}

// One convolution case: input and weight shapes and the params.
struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  const char* what;
};

std::vector<ConvCase> reference_cases() {
  Conv2dParams asym = make_params(1, 0, 1, 1);
  asym.stride_h = 2;
  asym.pad_w = 2;
  asym.dilation_h = 2;
  return {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, make_params(1, 1, 1, 1), "dense 3x3 pad 1"},
      {{1, 2, 9, 8}, {3, 2, 3, 2}, make_params(2, 0, 1, 1), "dense stride 2"},
      {{2, 2, 9, 9}, {2, 2, 3, 3}, make_params(1, 2, 2, 1), "dense dilation 2"},
      {{2, 4, 6, 5}, {6, 2, 3, 3}, make_params(1, 1, 1, 2), "groups 2"},
      {{1, 6, 8, 8}, {6, 2, 3, 3}, make_params(2, 1, 1, 3), "groups 3 stride 2"},
      {{2, 3, 8, 7}, {3, 1, 3, 3}, make_params(1, 1, 1, 3), "depthwise 3x3"},
      {{1, 4, 10, 10}, {4, 1, 7, 7}, make_params(1, 3, 1, 4), "depthwise 7x7"},
      {{1, 2, 9, 9}, {6, 1, 3, 3}, make_params(2, 2, 2, 2), "depthwise multiplier 3"},
      {{2, 3, 5, 4}, {5, 3, 1, 1}, make_params(1, 0, 1, 1), "1x1"},
      {{1, 2, 9, 8}, {2, 2, 3, 3}, asym, "asymmetric params"},
      {{1, 1, 3, 3}, {1, 1, 5, 5}, make_params(1, 2, 1, 1), "kernel larger than input"},
  };
}

// [N, C, H, W] `x` laid out channels-last (a contiguous [N, H, W, C] seen through a permute);
// differentiable.
Tensor channels_last(const Tensor& x) {
  return x.permute({0, 2, 3, 1}).contiguous().permute({0, 3, 1, 2});
}

}  // namespace

TEST_CASE("conv2d of one channel matches hand-computed values", "[cpu]") {
  const Tensor x = ramp(9, {1, 1, 3, 3});  // 1..9
  const Tensor w = values({1, 2, 3, 4}, {1, 1, 2, 2});
  CHECK(conv2d(x, w).to_vector<double>() == std::vector<double>{37, 47, 67, 77});
  CHECK(conv2d(x, w, values({1}, {1})).to_vector<double>() == std::vector<double>{38, 48, 68, 78});
  CHECK(conv2d(x.to(DType::kF32), w.to(DType::kF32)).to_vector<float>() ==
        std::vector<float>{37, 47, 67, 77});
  // Padding 1 with a 3x3 box filter on ones counts the taps inside the image.
  const Tensor ones = Tensor::ones({1, 1, 3, 3}, DType::kF64);
  CHECK(conv2d(ones, ones, Tensor(), 1, 1).to_vector<double>() ==
        std::vector<double>{4, 6, 4, 6, 9, 6, 4, 6, 4});
  // Stride 2 and dilation 2 on 1..16 with a 2x2 box filter.
  const Tensor x4 = ramp(16, {1, 1, 4, 4});
  const Tensor box = Tensor::ones({1, 1, 2, 2}, DType::kF64);
  CHECK(conv2d(x4, box, Tensor(), 2).to_vector<double>() == std::vector<double>{14, 22, 46, 54});
  CHECK(conv2d(x4, box, Tensor(), 1, 0, 2).to_vector<double>() ==
        std::vector<double>{24, 28, 40, 44});
}

TEST_CASE("conv2d with groups and depthwise matches hand-computed values", "[cpu]") {
  // Depthwise: channel 0 (1..9) with [[1, 2], [3, 4]], channel 1 (10..18) with a box filter.
  const Tensor x = ramp(18, {1, 2, 3, 3});
  const Tensor w = values({1, 2, 3, 4, 1, 1, 1, 1}, {2, 1, 2, 2});
  const Tensor y = conv2d(x, w, values({0, 100}, {2}), 1, 0, 1, 2);
  CHECK(y.shape() == Shape{1, 2, 2, 2});
  CHECK(y.to_vector<double>() == std::vector<double>{37, 47, 67, 77, 148, 152, 160, 164});
  // Groups 2, 1x1: out0 = c0 + 2 c1, out1 = c2 - c3 (channels of x: 1..4 repeated per pixel).
  const Tensor x4 = values({1, 1, 2, 2, 3, 3, 4, 4}, {1, 4, 1, 2});
  const Tensor w4 = values({1, 2, 1, -1}, {2, 2, 1, 1});
  CHECK(conv2d(x4, w4, Tensor(), 1, 0, 1, 2).to_vector<double>() ==
        std::vector<double>{5, 5, -1, -1});
}

TEST_CASE("conv2d matches the direct-loop reference", "[cpu]") {
  for (const ConvCase& c : reference_cases()) {
    INFO(c.what);
    const Tensor x = uniform(c.x, 1), w = uniform(c.w, 2), b = uniform({c.w[0]}, 3);
    const Tensor expected = loop_conv2d(x, w, b, c.p);
    require_close(conv2d(x, w, b, c.p), expected, tolerance_for(DType::kF64), c.what);
    require_close(conv2d(x, w, Tensor(), c.p), loop_conv2d(x, w, Tensor(), c.p),
                  tolerance_for(DType::kF64), c.what);
    require_close(conv2d(x.to(DType::kF32), w.to(DType::kF32), b.to(DType::kF32), c.p), expected,
                  tolerance_for(DType::kF32), c.what);
  }
  // A strided (non-contiguous) input is packed first.
  const Tensor xt = uniform({1, 2, 6, 5}, 4).transpose(2, 3);
  const Tensor w = uniform({3, 2, 3, 3}, 5);
  require_close(conv2d(xt, w), loop_conv2d(xt.contiguous(), w, Tensor(), make_params(1, 0, 1, 1)),
                tolerance_for(DType::kF64), "transposed input");
}

TEST_CASE("conv2d gradients match finite differences", "[cpu]") {
  for (const ConvCase& c : reference_cases()) {
    INFO(c.what);
    // Small inputs so that the finite differences stay fast.
    Shape xs = c.x;
    xs[0] = 1;
    const Tensor x = uniform(xs, 11).set_requires_grad();
    const Tensor w = uniform(c.w, 12).set_requires_grad();
    const Tensor b = uniform({c.w[0]}, 13).set_requires_grad();
    const Conv2dParams p = c.p;
    check_gradients([p](const TensorList& in) { return conv2d(in[0], in[1], in[2], p); },
                    {x, w, b});
    // The channels-last kernels, batch of 2.
    Shape x2 = c.x;
    x2[0] = 2;
    check_gradients(
        [p](const TensorList& in) { return conv2d(channels_last(in[0]), in[1], in[2], p); },
        {uniform(x2, 14).set_requires_grad(), w, b});
  }
  // Batch of 2, grad of the weight only (input needs none), and of the input only.
  const Conv2dParams p = make_params(1, 1, 1, 2);
  check_gradients([p](const TensorList& in) { return conv2d(in[0], in[1], Tensor(), p); },
                  {uniform({2, 4, 4, 4}, 14), uniform({2, 2, 3, 3}, 15).set_requires_grad()});
  check_gradients([p](const TensorList& in) { return conv2d(in[0], in[1], Tensor(), p); },
                  {uniform({2, 4, 4, 4}, 16).set_requires_grad(), uniform({2, 2, 3, 3}, 17)});
  const Conv2dParams dw = make_params(2, 1, 1, 3);
  check_gradients([dw](const TensorList& in) { return conv2d(in[0], in[1], Tensor(), dw); },
                  {uniform({2, 3, 5, 5}, 18).set_requires_grad(),
                   uniform({3, 1, 3, 3}, 19).set_requires_grad()});
}

TEST_CASE("conv2d rejects inconsistent shapes and params", "[cpu]") {
  const Tensor x = uniform({1, 4, 5, 5}, 1);
  // Channels not divisible by groups.
  CHECK_THROWS_AS(conv2d(x, uniform({3, 2, 3, 3}, 2), Tensor(), 1, 0, 1, 2), ShapeError);
  CHECK_THROWS_WITH(conv2d(x, uniform({3, 2, 3, 3}, 2), Tensor(), 1, 0, 1, 2),
                    Catch::Contains("conv2d") && Catch::Contains("groups = 2") &&
                        Catch::Contains("[3, 2, 3, 3]"));
  // Weight expects other input channels.
  CHECK_THROWS_WITH(conv2d(x, uniform({2, 3, 3, 3}, 3)),
                    Catch::Contains("[2, 3, 3, 3]") && Catch::Contains("[1, 4, 5, 5]"));
  // Weight and input ranks.
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 3}, 4)), ShapeError);
  CHECK_THROWS_AS(conv2d(uniform({4, 5, 5}, 5), uniform({2, 4, 3, 3}, 6)), ShapeError);
  // Kernel larger than the padded input: output size <= 0.
  CHECK_THROWS_WITH(conv2d(x, uniform({2, 4, 7, 7}, 7)),
                    Catch::Contains("output size") && Catch::Contains("[2, 4, 7, 7]"));
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 3, 3}, 8), Tensor(), 1, 0, 3), ShapeError);
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 6, 6}, 8), Tensor(), 2), ShapeError);  // span -1
  // Bias, params, dtypes.
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 3, 3}, 9), uniform({3}, 10)), ShapeError);
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 3, 3}, 9), Tensor(), 0), ValueError);
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 3, 3}, 9), Tensor(), 1, -1), ValueError);
  CHECK_THROWS_AS(conv2d(x, uniform({2, 4, 3, 3}, 9), Tensor(), 1, 0, 1, 0), ValueError);
  CHECK_THROWS_AS(conv2d(x.to(DType::kF32), uniform({2, 4, 3, 3}, 9)), DTypeError);
}

TEST_CASE("conv2d of a channels-last input: channels-last output, NCHW values and gradients",
          "[cpu]") {
  for (DType dt : {DType::kF64, DType::kF32, DType::kBF16}) {
    for (const ConvCase& c : reference_cases()) {
      INFO(c.what << " " << dtype_name(dt));
      const Tensor x = uniform(c.x, 41).to(dt).set_requires_grad();
      const Tensor w = uniform(c.w, 42).to(dt).set_requires_grad();
      const Tensor b = uniform({c.w[0]}, 43).to(dt).set_requires_grad();
      const Tensor x_cl = channels_last(x.detach()).set_requires_grad();
      REQUIRE(x_cl.is_channels_last());
      if (x_cl.is_contiguous()) continue;  // one channel: both layouts are the same memory
      const Tensor y = conv2d(x, w, b, c.p);
      const Tensor w2 = w.detach().clone().set_requires_grad();
      const Tensor b2 = b.detach().clone().set_requires_grad();
      const Tensor y_cl = conv2d(x_cl, w2, b2, c.p);
      CHECK(y_cl.is_channels_last());
      // Dense and grouped convolutions run their own channels-last kernels (the same products
      // summed in another order); depthwise ones the NCHW kernels on copies: the same bits.
      const bool depthwise = c.w[1] == 1 && c.p.groups == c.x[1];
      const Tolerance tol = depthwise ? Tolerance{0.0, 0.0} : tolerance_for(dt);
      require_close(y_cl, y, tol, "output");
      // A fixed, non-uniform output gradient, reaching y as NCHW and y_cl as channels-last.
      const Tensor g = uniform(y.shape(), 44).to(dt);
      sum(mul(y, g)).backward();
      sum(mul(y_cl.permute({0, 2, 3, 1}), g.permute({0, 2, 3, 1}))).backward();
      require_close(x_cl.grad(), x.grad(), tol, "input gradient");
      require_close(w2.grad(), w.grad(), tol, "weight gradient");
      require_close(b2.grad(), b.grad(), tolerance_for(dt), "bias gradient");
    }
  }
}

namespace {

// Convolutions whose kernels gather several small samples per GEMM (NCHW: blocks of whole
// samples, a partial one last; channels-last: blocks of about 2^18 / K output pixels, K =
// C_in / groups x kh x kw, not aligned to samples) and spread the blocks over threads, as CSKA's
// logit convolutions and the MetaFormers' downsampling layers have them.
std::vector<ConvCase> blocked_cases() {
  return {
      {{10, 128, 8, 8}, {130, 64, 3, 3}, make_params(1, 1, 1, 2), "CSKA logits, groups 2"},
      {{3, 96, 14, 14}, {160, 96, 3, 3}, make_params(2, 1, 1, 1), "downsampling stride 2"},
      {{5, 32, 9, 9}, {48, 32, 1, 1}, make_params(1, 0, 1, 1), "1x1 (no im2col)"},
      {{4, 64, 7, 7}, {64, 16, 3, 3}, make_params(1, 2, 2, 4), "groups 4 dilation 2"},
  };
}

// conv2d forward and both gradients for x laid out as given, f64.
struct ConvResult {
  Tensor y, grad_x, grad_w, grad_b;
};

ConvResult run_conv(const ConvCase& c, bool cl) {
  Tensor x0 = uniform(c.x, 61);
  const Tensor x = (cl ? channels_last(x0) : x0).set_requires_grad();
  const Tensor w = uniform(c.w, 62).set_requires_grad();
  const Tensor b = uniform({c.w[0]}, 63).set_requires_grad();
  const Tensor y = conv2d(x, w, b, c.p);
  sum(mul(y, uniform(y.shape(), 64))).backward();
  return {y, x.grad(), w.grad(), b.grad()};
}

}  // namespace

TEST_CASE("conv2d kernels over blocks of samples or pixels match the definition", "[cpu]") {
  for (const ConvCase& c : blocked_cases()) {
    INFO(c.what);
    const ConvResult cl = run_conv(c, true);
    CHECK(cl.y.is_channels_last());
    const ConvResult ref = run_conv(c, false);
    const Tensor x = uniform(c.x, 61), w = uniform(c.w, 62), b = uniform({c.w[0]}, 63);
    const Tensor expected = loop_conv2d(x, w, b, c.p);
    require_close(ref.y, expected, tolerance_for(DType::kF64), "NCHW output");
    require_close(cl.y, expected, tolerance_for(DType::kF64), "output");
    // The two layouts' kernels are written independently; finite differences check both on
    // smaller cases ("conv2d gradients match finite differences").
    require_close(cl.grad_x, ref.grad_x, tolerance_for(DType::kF64), "input gradient");
    require_close(cl.grad_w, ref.grad_w, tolerance_for(DType::kF64), "weight gradient");
    require_close(cl.grad_b, ref.grad_b, tolerance_for(DType::kF64), "bias gradient");
  }
}

TEST_CASE("conv2d results are the same bits for any number of threads", "[cpu]") {
  const int threads = omp_get_max_threads();
  for (const ConvCase& c : blocked_cases()) {
    INFO(c.what);
    for (bool cl : {false, true}) {
      INFO((cl ? "channels-last" : "NCHW"));
      omp_set_num_threads(1);
      const ConvResult one = run_conv(c, cl);
      omp_set_num_threads(3);
      const ConvResult three = run_conv(c, cl);
      omp_set_num_threads(threads);
      CHECK(three.y.to_vector<double>() == one.y.to_vector<double>());
      CHECK(three.grad_x.to_vector<double>() == one.grad_x.to_vector<double>());
      CHECK(three.grad_w.to_vector<double>() == one.grad_w.to_vector<double>());
    }
  }
}

namespace {

using BackwardInput = void (*)(const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&);
using BackwardWeight = void (*)(const Tensor&, const Tensor&, const Conv2dParams&, const Tensor&);

// The backward kernels get uninitialised outputs: filled with NaN first, every element must come
// out equal to the gradients computed through the op (both layouts).
void check_backward_overwrites(Device device, BackwardInput input, BackwardWeight weight) {
  for (const ConvCase& c : reference_cases()) {
    for (bool cl : {false, true}) {
      INFO(c.what << (cl ? " channels-last" : ""));
      Tensor x0 = uniform(c.x, 51).to(DType::kF32).to(device);
      const Tensor x = (cl ? channels_last(x0) : x0).set_requires_grad();
      const Tensor w = uniform(c.w, 52).to(DType::kF32).to(device).set_requires_grad();
      if (cl && x.is_contiguous()) continue;
      const Tensor y = conv2d(x, w, Tensor(), c.p);
      const Tensor g = cl ? channels_last(uniform(y.shape(), 53).to(DType::kF32).to(device))
                          : uniform(y.shape(), 53).to(DType::kF32).to(device);
      y.backward(g);
      const Tensor nan = Tensor::full(c.x, std::nan(""), DType::kF32, device);
      const Tensor gx = cl ? channels_last(nan) : nan;
      const Tensor gw = Tensor::full(c.w, std::nan(""), DType::kF32, device);
      input(g, w.detach(), c.p, gx);
      weight(g, x.detach(), c.p, gw);
      require_close(gx, x.grad(), tolerance_for(DType::kF32), "grad_x");
      require_close(gw, w.grad(), tolerance_for(DType::kF32), "grad_w");
    }
  }
}

}  // namespace

TEST_CASE("conv2d backward kernels write every element of their outputs", "[cpu]") {
  check_backward_overwrites(Device::cpu(), &cpu::conv2d_backward_input,
                            &cpu::conv2d_backward_weight);
}

TEST_CASE("cuda conv2d backward kernels write every element of their outputs", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
#ifdef SKA_WITH_CUDA
  check_backward_overwrites(Device::cuda(0), &cuda::conv2d_backward_input,
                            &cuda::conv2d_backward_weight);
#endif
}

TEST_CASE("conv2d kernels reject operands of mixed layouts", "[cpu]") {
  const Tensor x = channels_last(uniform({2, 3, 5, 5}, 45));
  const Tensor w = uniform({4, 3, 3, 3}, 46);
  const Tensor y = Tensor::empty({2, 4, 5, 5}, DType::kF64);  // NCHW: does not match x
  const Conv2dParams p = make_params(1, 1, 1, 1);
  REQUIRE_THROWS_WITH(cpu::conv2d_forward(x, w, Tensor(), p, y),
                      Catch::Contains("conv2d_forward") &&
                          Catch::Contains("all contiguous or all channels-last") &&
                          Catch::Contains("[2, 4, 5, 5]"));
}

TEST_CASE("CUDA conv2d matches the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const ConvCase& c : reference_cases()) {
      INFO(c.what);
      const Tensor x = uniform(c.x, 21).set_requires_grad();
      const Tensor w = uniform(c.w, 22).set_requires_grad();
      const Tensor b = uniform({c.w[0]}, 23).set_requires_grad();
      const Conv2dParams p = c.p;
      ska::test::check_cuda_parity(
          [p](const TensorList& in) { return conv2d(in[0], in[1], in[2], p); }, {x, w, b}, dt);
      ska::test::check_cuda_parity(
          [p](const TensorList& in) { return conv2d(in[0], in[1], Tensor(), p); }, {x, w}, dt);
    }
    // Larger channel counts, as in a ConvNeXt stage: depthwise 7x7 and a strided downsample.
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return conv2d(in[0], in[1], in[2], 1, 3, 1, 64); },
        {uniform({2, 64, 14, 14}, 24).set_requires_grad(),
         uniform({64, 1, 7, 7}, 25).set_requires_grad(), uniform({64}, 26).set_requires_grad()},
        dt);
    ska::test::check_cuda_parity(
        [](const TensorList& in) { return conv2d(in[0], in[1], in[2], 2, 0); },
        {uniform({2, 32, 16, 16}, 27).set_requires_grad(),
         uniform({48, 32, 2, 2}, 28).set_requires_grad(), uniform({48}, 29).set_requires_grad()},
        dt);
  }
}

TEST_CASE("CUDA conv2d channels-last (cuDNN NHWC) matches the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const ConvCase& c : reference_cases()) {
      INFO(c.what);
      const Tensor x = uniform(c.x, 31).set_requires_grad();
      const Tensor w = uniform(c.w, 32).set_requires_grad();
      const Tensor b = uniform({c.w[0]}, 33).set_requires_grad();
      const Conv2dParams p = c.p;
      // Consumed as NCHW (the output gradient is converted) and as the [N, H, W, C] it is.
      ska::test::check_cuda_parity(
          [p](const TensorList& in) { return conv2d(channels_last(in[0]), in[1], in[2], p); },
          {x, w, b}, dt);
      ska::test::check_cuda_parity(
          [p](const TensorList& in) {
            const Tensor y = conv2d(channels_last(in[0]), in[1], Tensor(), p);
            if (in[0].size(1) > 1) REQUIRE(y.is_channels_last());
            return y.permute({0, 2, 3, 1});
          },
          {x, w}, dt);
    }
    // CAFormer-S18's shapes: the depthwise 7x7 of the first stage, a downsampling conv.
    ska::test::check_cuda_parity(
        [](const TensorList& in) {
          return conv2d(channels_last(in[0]), in[1], in[2], 1, 3, 1, 128).permute({0, 2, 3, 1});
        },
        {uniform({2, 128, 14, 14}, 34).set_requires_grad(),
         uniform({128, 1, 7, 7}, 35).set_requires_grad(), uniform({128}, 36).set_requires_grad()},
        dt);
    ska::test::check_cuda_parity(
        [](const TensorList& in) {
          return conv2d(channels_last(in[0]), in[1], in[2], 2, 1).permute({0, 2, 3, 1});
        },
        {uniform({2, 64, 16, 16}, 37).set_requires_grad(),
         uniform({128, 64, 3, 3}, 38).set_requires_grad(), uniform({128}, 39).set_requires_grad()},
        dt);
  }
}

TEST_CASE("conv2d: a stride-1 backward-input pass equals the forward pass of the rotated filter",
          "[cpu]") {
  // The identity the CUDA backend relies on when it runs backward-data as a forward convolution
  // (backend/conv2d_rotated.h), on the CPU kernels in f64: dense, grouped with more outputs than
  // inputs per group (CSKA's logit convolution), depthwise, non-square, padding 0 to k - 1.
  struct Case {
    Shape x, w;
    int64_t pad_h, pad_w, groups;
  };
  for (const Case& c : {Case{{2, 4, 7, 6}, {6, 4, 3, 3}, 1, 1, 1},
                        Case{{2, 6, 5, 5}, {3 * 9, 2, 3, 3}, 1, 1, 3},
                        Case{{1, 8, 9, 9}, {8, 1, 7, 7}, 3, 3, 8},
                        Case{{2, 4, 6, 8}, {4, 2, 3, 5}, 0, 2, 2},
                        Case{{1, 3, 5, 5}, {5, 3, 1, 1}, 0, 0, 1},
                        Case{{1, 2, 6, 6}, {4, 2, 3, 3}, 2, 0, 1}}) {
    INFO("x " << shape_str(c.x) << ", w " << shape_str(c.w) << ", padding " << c.pad_h << "x"
              << c.pad_w << ", groups " << c.groups);
    Conv2dParams p;
    p.pad_h = c.pad_h;
    p.pad_w = c.pad_w;
    p.groups = c.groups;
    REQUIRE(conv2d_rotatable(c.w, p));
    const int64_t ho = c.x[2] + 2 * c.pad_h - c.w[2] + 1, wo = c.x[3] + 2 * c.pad_w - c.w[3] + 1;
    const Tensor gy = uniform({c.x[0], c.w[0], ho, wo}, 501, -1, 1, DType::kF64);
    const Tensor w = uniform(c.w, 502, -1, 1, DType::kF64);
    const Tensor expected = Tensor::empty(c.x, DType::kF64);
    cpu::conv2d_backward_input(gy, w, p, expected);
    const Tensor rotated = conv2d_rotated_filter(w, c.groups);
    CHECK(rotated.shape() == Shape{c.x[1], c.w[0] / c.groups, c.w[2], c.w[3]});
    CHECK(rotated.is_contiguous());
    const Tensor actual = Tensor::empty(c.x, DType::kF64);
    cpu::conv2d_forward(gy, rotated, Tensor(), conv2d_rotated_params(c.w, p), actual);
    require_close(actual, expected, {1e-12, 1e-12}, "forward of the rotated filter");
  }
  Conv2dParams strided;
  strided.stride_h = 2;
  CHECK_FALSE(conv2d_rotatable({4, 4, 3, 3}, strided));
  Conv2dParams dilated;
  dilated.dilation_w = 2;
  CHECK_FALSE(conv2d_rotatable({4, 4, 3, 3}, dilated));
  Conv2dParams wide;
  wide.pad_h = 3;
  CHECK_FALSE(conv2d_rotatable({4, 4, 3, 3}, wide));
  REQUIRE_THROWS_WITH(conv2d_rotated_params({4, 4, 3, 3}, wide), Catch::Contains("padding 3x0"));
}

namespace {

// grid_conv_logits' definition through conv2d: q laid out as an image [B, h*d, H, W], the filters
// [h, k*k, K, d] back to conv2d's [h*K, d, k, k], one group per head, the output read as logits.
Tensor logits_by_conv2d(const Tensor& q, const Tensor& w, const Tensor& bias, int64_t height,
                        int64_t width) {
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(3), keys = w.size(2);
  const int64_t k = static_cast<int64_t>(std::lround(std::sqrt(static_cast<double>(w.size(1)))));
  const Tensor image = q.transpose(-1, -2).reshape({batch, heads * d, height, width});
  const Tensor filters = w.permute({0, 2, 3, 1}).reshape({heads * keys, d, k, k});
  const Tensor y = conv2d(image, filters, bias.defined() ? bias.reshape({heads * keys}) : Tensor(),
                          1, k / 2, 1, heads);
  return y.reshape({batch, heads, keys, height * width}).transpose(2, 3);
}

}  // namespace

TEST_CASE("grid_conv_logits equals the grouped convolution, values and gradients", "[cpu]") {
  struct Case {
    int64_t batch, heads, height, width, keys, d, k;
    bool bias;
  };
  for (const Case& c : {Case{2, 3, 4, 5, 7, 4, 3, true}, Case{1, 2, 3, 3, 9, 5, 3, false},
                        Case{2, 1, 5, 4, 6, 3, 5, true}, Case{1, 2, 2, 6, 4, 2, 1, true},
                        Case{2, 2, 3, 2, 5, 3, 7, false}}) {
    INFO(c.batch << " x " << c.heads << " heads of " << c.d << " on " << c.height << "x" << c.width
                 << ", " << c.keys << " keys, " << c.k << "x" << c.k);
    const int64_t positions = c.height * c.width;
    // q as a head split of a projection leaves it: strided.
    const Tensor proj = uniform({c.batch, positions, 2 * c.heads * c.d}, 31);
    const Tensor q = proj.narrow(2, c.heads * c.d, c.heads * c.d)
                         .reshape({c.batch, positions, c.heads, c.d})
                         .permute({0, 2, 1, 3});
    REQUIRE_FALSE(q.is_contiguous());
    const Tensor w = uniform({c.heads, c.k * c.k, c.keys, c.d}, 32);
    const Tensor bias = c.bias ? uniform({c.heads, c.keys}, 33) : Tensor();
    require_close(grid_conv_logits(q, w, bias, c.height, c.width),
                  logits_by_conv2d(q, w, bias, c.height, c.width), tolerance_for(DType::kF64));
    // Gradients: against conv2d's, and against central differences.
    const auto grads = [&](bool by_conv) {
      const Tensor qg = q.clone().set_requires_grad(true), wg = w.clone().set_requires_grad(true);
      const Tensor bg = c.bias ? bias.clone().set_requires_grad(true) : Tensor();
      const Tensor y = by_conv ? logits_by_conv2d(qg, wg, bg, c.height, c.width)
                               : grid_conv_logits(qg, wg, bg, c.height, c.width);
      sum(y * uniform(y.shape(), 34)).backward();
      return TensorList{qg.grad(), wg.grad(), c.bias ? bg.grad() : Tensor()};
    };
    const TensorList ours = grads(false), reference = grads(true);
    for (size_t i = 0; i < 3; ++i) {
      if (!reference[i].defined()) continue;
      require_close(ours[i], reference[i], tolerance_for(DType::kF64),
                    "gradient " + std::to_string(i));
    }
    TensorList inputs = {q.clone().set_requires_grad(true), w.clone().set_requires_grad(true)};
    if (c.bias) inputs.push_back(bias.clone().set_requires_grad(true));
    check_gradients(
        [&](const TensorList& x) {
          return grid_conv_logits(x[0], x[1], c.bias ? x[2] : Tensor(), c.height, c.width);
        },
        inputs);
  }
}

TEST_CASE("grid_conv_logits with strided operands, an empty batch, and the CUDA bounds", "[cpu]") {
  const int64_t heads = 2, height = 3, width = 4, keys = 5, d = 3;
  // q with a non-unit last-dim stride (the op copies it) and a gradient arriving through a
  // transpose (non-unit last-dim stride too), against conv2d.
  const Tensor q_t = uniform({2, heads, d, height * width}, 71);
  const Tensor w = uniform({heads, 9, keys, d}, 72);
  const Tensor bias = uniform({heads, keys}, 73);
  const Tensor weights = uniform({2, heads, keys, height * width}, 74);
  const auto grads = [&](bool by_conv) {
    const Tensor qg = q_t.clone().set_requires_grad(true), wg = w.clone().set_requires_grad(true);
    const Tensor bg = bias.clone().set_requires_grad(true);
    const Tensor q = qg.transpose(-1, -2);
    REQUIRE(q.stride(-1) != 1);
    const Tensor y = by_conv ? logits_by_conv2d(q, wg, bg, height, width)
                             : grid_conv_logits(q, wg, bg, height, width);
    sum(y.transpose(-1, -2) * weights).backward();
    return TensorList{y.detach(), qg.grad(), wg.grad(), bg.grad()};
  };
  const TensorList ours = grads(false), reference = grads(true);
  for (size_t i = 0; i < ours.size(); ++i) {
    require_close(ours[i], reference[i], tolerance_for(DType::kF64), "result " + std::to_string(i));
  }
  {  // frozen queries and filters, a trained bias: its gradient alone
    const Tensor bg = bias.clone().set_requires_grad(true);
    const Tensor y = grid_conv_logits(q_t.transpose(-1, -2), w, bg, height, width);
    sum(y.transpose(-1, -2) * weights).backward();
    require_close(bg.grad(), reference[3], tolerance_for(DType::kF64), "bias gradient alone");
  }
  // An empty batch: empty logits, an empty q gradient, zero filter and bias gradients.
  const Tensor q0 = uniform({0, heads, height * width, d}, 75).set_requires_grad(true);
  const Tensor w0 = w.clone().set_requires_grad(true), b0 = bias.clone().set_requires_grad(true);
  const Tensor y0 = grid_conv_logits(q0, w0, b0, height, width);
  CHECK(y0.shape() == Shape({0, heads, height * width, keys}));
  sum(y0).backward();
  CHECK(q0.grad().shape() == q0.shape());
  CHECK(amax(abs(w0.grad())).item() == 0.0);
  CHECK(amax(abs(b0.grad())).item() == 0.0);
  // What the CUDA kernels take: head dims that are multiples of 16 up to 128, odd filters, and
  // grids narrow enough for their shared tiles (the mixers take the convolution otherwise).
  CHECK(conv_logits_direct_fits(16, 28, 3));  // CSKAFormer-S18's stage 2
  CHECK(conv_logits_direct_fits(64, 8, 3));   // CSKA-ViT-S
  CHECK(conv_logits_direct_fits(128, 14, 5));
  CHECK_FALSE(conv_logits_direct_fits(24, 8, 3));
  CHECK_FALSE(conv_logits_direct_fits(144, 8, 3));
  CHECK_FALSE(conv_logits_direct_fits(64, 8, 4));
  CHECK_FALSE(conv_logits_direct_fits(16, 400, 3));
}

TEST_CASE("grid_conv_logits in f32 and bf16 on the CPU", "[cpu]") {
  const Tensor q = uniform({2, 2, 12, 16}, 41, -1.0, 1.0, DType::kF32);
  const Tensor w = uniform({2, 9, 11, 16}, 42, -0.3, 0.3, DType::kF32);
  const Tensor bias = uniform({2, 11}, 43, -1.0, 1.0, DType::kF32);
  const Tensor reference = logits_by_conv2d(q, w, bias, 3, 4);
  require_close(grid_conv_logits(q, w, bias, 3, 4), reference, tolerance_for(DType::kF32));
  const Tensor low =
      grid_conv_logits(q.to(DType::kBF16), w.to(DType::kBF16), bias.to(DType::kBF16), 3, 4);
  CHECK(low.dtype() == DType::kBF16);
  require_close(low, reference, tolerance_for(DType::kBF16));
}

TEST_CASE("grid_conv_logits writes q's gradient into the projection's heads, in f64 and bf16",
          "[cpu]") {
  // q as CSKA takes it: the first piece of split_heads on one projection [B, H*W, 2 h d]. The
  // backward writes q's gradient where the projection's gradient holds it (no copy of q's
  // shape), bit for bit what a gradient of its own copied in gives.
  const int64_t batch = 2, heads = 2, height = 3, width = 4, keys = 5, d = 4, w_ = heads * d;
  const DType dtype = GENERATE(DType::kF64, DType::kBF16);
  CAPTURE(dtype_name(dtype));
  const Tensor proj = uniform({batch, height * width, 2 * w_}, 91).to(dtype);
  const Tensor w = uniform({heads, 9, keys, d}, 92, -0.3, 0.3).to(dtype);
  const Tensor weights = uniform({batch, heads, height * width, keys}, 93).to(dtype);
  const auto run = [&](bool offers) {
    const Tensor p = proj.clone().set_requires_grad(true);
    const Tensor y = grid_conv_logits(nn::split_heads(p, {w_, w_}, heads)[0], w, {}, height, width);
    std::optional<autograd::NoDestinationsGuard> off;
    if (!offers) off.emplace();
    int64_t copies = 0;
    for (const auto& k : test::kernels_of([&] { y.backward(weights); })) {
      if (k.name == "copy" && k.operands.find("[2, 2, 12, 4]") != std::string::npos) {
        copies += k.calls;
      }
    }
    return std::make_pair(p.grad(), copies);
  };
  const auto [in_place, none] = run(true);
  const auto [copied, one] = run(false);
  CHECK(none == 0);
  CHECK(one == 1);
  CHECK(test::bitwise_equal(in_place, copied));
  // The layouts the kernels write: contiguous (any head dim), or a unit last-dim stride with
  // even other strides and offset (the CUDA kernel's 32-bit stores of two 16-bit values).
  const Tensor buffer = Tensor::empty({batch, height * width, 2 * w_ + 2}, dtype);
  const auto heads_at = [&](int64_t column, int64_t width_of_piece) {
    return nn::split_heads(buffer.narrow(2, column, width_of_piece), heads);
  };
  CHECK(conv_logits_grad_q_layout(Tensor::empty({batch, heads, height * width, 3}, dtype)));
  CHECK(conv_logits_grad_q_layout(heads_at(0, w_)));
  CHECK(conv_logits_grad_q_layout(heads_at(2, w_)));
  CHECK_FALSE(conv_logits_grad_q_layout(heads_at(1, w_)));  // an odd offset
  const Tensor odd = Tensor::empty({batch, height * width, 2 * w_ + 1}, dtype);
  CHECK_FALSE(conv_logits_grad_q_layout(nn::split_heads(odd.narrow(2, 0, w_), heads)));
  CHECK_FALSE(conv_logits_grad_q_layout(heads_at(0, w_).transpose(-1, -2)));
}

TEST_CASE("grid_conv_logits writes the logits into the rows a cat puts together, in f64 and bf16",
          "[cpu]") {
  // CSKA's logits: a class row (here a leaf) above the spatial queries' conv logits, as one
  // tensor made before its pieces. The conv logits are written into its rows (through their
  // strides: 13 keys, an odd row stride), cat copies the class row alone, and the values and
  // gradients are bit for bit those of the logits made apart and put together by copies.
  const int64_t batch = 2, heads = 2, height = 3, width = 4, keys = 13, d = 4;
  const int64_t positions = height * width;
  const DType dtype = GENERATE(DType::kF64, DType::kBF16);
  CAPTURE(dtype_name(dtype));
  const Tensor q0 = uniform({batch, heads, positions, d}, 95).to(dtype);
  const Tensor w0 = uniform({heads, 9, keys, d}, 96, -0.3, 0.3).to(dtype);
  const Tensor b0 = uniform({heads, keys}, 97).to(dtype);
  const Tensor cls0 = uniform({batch, heads, 1, keys}, 98).to(dtype);
  const Tensor weights = uniform({batch, heads, 1 + positions, keys}, 99).to(dtype);
  const auto all_nan = [](const Tensor& t) {
    const std::vector<double> v = t.to(DType::kF64).to_vector<double>();
    return std::all_of(v.begin(), v.end(), [](double x) { return std::isnan(x); });
  };
  struct Run {
    Tensor logits;
    TensorList grads;
    int64_t copies = 0;  // forward copies of the conv logits' shape
  };
  const auto run = [&](bool in_place) {
    TensorList leaves = {q0.clone(), w0.clone(), b0.clone(), cls0.clone()};
    for (Tensor& t : leaves) t.set_requires_grad();
    Run r;
    for (const auto& k : test::kernels_of([&] {
           if (in_place) {
             const Tensor all = Tensor::full({batch, heads, 1 + positions, keys}, NAN, dtype);
             const Tensor rows = all.narrow(2, 1, positions);
             const Tensor y =
                 grid_conv_logits(leaves[0], leaves[1], leaves[2], height, width, rows);
             CHECK(y.same_storage(all));
             // Nothing outside the view is written.
             CHECK(all_nan(all.narrow(2, 0, 1)));
             r.logits = cat({leaves[3], y}, 2, all);
           } else {
             r.logits = cat(
                 {leaves[3], grid_conv_logits(leaves[0], leaves[1], leaves[2], height, width)}, 2);
           }
         })) {
      if (k.name == "copy" && k.operands.find("[2, 2, 12, 13]") != std::string::npos) {
        r.copies += k.calls;
      }
    }
    r.logits.backward(weights);
    for (const Tensor& t : leaves) r.grads.push_back(t.grad());
    return r;
  };
  const Run in_place = run(true), copied = run(false);
  CHECK(in_place.copies == 0);
  CHECK(copied.copies == 1);
  CHECK(test::bitwise_equal(in_place.logits, copied.logits));
  for (size_t i = 0; i < in_place.grads.size(); ++i) {
    CAPTURE(i);
    CHECK(test::bitwise_equal(in_place.grads[i], copied.grads[i]));
  }
  // Columns of a wider tensor (an even key count, an odd row stride); the logits' dtype and
  // shape are checked, and a tensor that requires grad is refused.
  const Tensor wide = Tensor::full({batch, heads, positions, keys + 1}, NAN, dtype);
  grid_conv_logits(q0, w0, b0, height, width, wide.narrow(3, 0, keys));
  CHECK(test::bitwise_equal(wide.narrow(3, 0, keys), grid_conv_logits(q0, w0, b0, height, width)));
  CHECK(all_nan(wide.narrow(3, keys, 1)));
  CHECK_THROWS_WITH(grid_conv_logits(q0, w0, b0, height, width, wide.narrow(3, 1, keys - 1)),
                    Catch::Contains("the logits must be [2, 2, 12, 13]"));
  CHECK_THROWS_AS(grid_conv_logits(q0, w0, b0, height, width,
                                   Tensor::empty({batch, heads, positions, keys}, DType::kF32)),
                  DTypeError);
  CHECK_THROWS_WITH(
      grid_conv_logits(q0, w0, b0, height, width,
                       Tensor::empty({batch, heads, positions, keys}, dtype).set_requires_grad()),
      Catch::Contains("must be a fresh tensor"));
}

TEST_CASE("grid_conv_logits rejects operands that do not fit, naming them", "[cpu]") {
  const Tensor q = uniform({2, 3, 12, 4}, 51);
  const Tensor w = uniform({3, 9, 5, 4}, 52);
  const auto message = [&](const Tensor& qq, const Tensor& ww, const Tensor& b, int64_t h,
                           int64_t wd) -> std::string {
    try {
      grid_conv_logits(qq, ww, b, h, wd);
    } catch (const ShapeError& e) {
      return e.what();
    } catch (const DTypeError& e) {
      return std::string("dtype: ") + e.what();
    }
    return "no error";
  };
  CHECK_THAT(message(q, w, Tensor(), 4, 4), Catch::Contains("q must be [B, h, 4*4, d]"));
  CHECK_THAT(message(q, uniform({3, 4, 5, 4}, 53), Tensor(), 3, 4), Catch::Contains("k*k (k odd)"));
  CHECK_THAT(message(q, uniform({2, 9, 5, 4}, 53), Tensor(), 3, 4), Catch::Contains("w must be"));
  CHECK_THAT(message(q, uniform({3, 9, 5, 3}, 53), Tensor(), 3, 4), Catch::Contains("w must be"));
  CHECK_THAT(message(q, w, uniform({3, 4}, 54), 3, 4), Catch::Contains("bias must be [3, 5]"));
  CHECK_THAT(message(q, w.to(DType::kF32), Tensor(), 3, 4), Catch::Contains("dtype"));
  // An empty batch gives empty logits.
  CHECK(grid_conv_logits(uniform({0, 3, 12, 4}, 55), w, Tensor(), 3, 4).shape() ==
        Shape({0, 3, 12, 5}));
}
