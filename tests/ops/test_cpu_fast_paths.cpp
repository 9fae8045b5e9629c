// The CPU fast paths against references: the vectorised depthwise convolution (wide, odd, strided,
// dilated, cropped shapes and channel multipliers above its batch of 8), dense convolutions and
// GEMMs split over threads, and the f32 layer-norm backward.
#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "support/test_util.h"

using namespace ska;
using ska::test::check_gradients;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;

namespace {

Conv2dParams conv_params(int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w,
                         int64_t dilation, int64_t groups) {
  Conv2dParams p;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.pad_h = pad_h;
  p.pad_w = pad_w;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

// The convolution by its definition, one output element at a time (f64).
std::vector<double> loop_conv2d(const Tensor& x, const Tensor& w, const Tensor& b,
                                const Conv2dParams& p, const Shape& y_shape) {
  const std::vector<double> xv = x.to_vector<double>(), wv = w.to_vector<double>(),
                            bv = b.to_vector<double>();
  const int64_t c_in = x.size(1), h = x.size(2), wd = x.size(3);
  const int64_t cg = w.size(1), kh = w.size(2), kw = w.size(3), per_group = w.size(0) / p.groups;
  std::vector<double> y;
  for (int64_t n = 0; n < y_shape[0]; ++n)
    for (int64_t co = 0; co < y_shape[1]; ++co)
      for (int64_t oh = 0; oh < y_shape[2]; ++oh)
        for (int64_t ow = 0; ow < y_shape[3]; ++ow) {
          double acc = bv[co];
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * p.stride_h - p.pad_h + i * p.dilation_h;
                const int64_t iw = ow * p.stride_w - p.pad_w + j * p.dilation_w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                const int64_t ci = (co / per_group) * cg + c;
                acc += xv[((n * c_in + ci) * h + ih) * wd + iw] *
                       wv[((co * cg + c) * kh + i) * kw + j];
              }
          y.push_back(acc);
        }
  return y;
}

struct FastConvCase {
  Shape x, w;
  Conv2dParams p;
  const char* what;
};

std::vector<FastConvCase> depthwise_cases() {
  return {
      // Rows of 37 and 19 outputs: full vector blocks plus an overlapping last block.
      {{2, 3, 11, 37}, {3, 1, 7, 7}, conv_params(1, 1, 3, 3, 1, 3), "7x7 pad 3, rows of 37"},
      {{1, 2, 9, 21}, {2, 1, 3, 3}, conv_params(1, 1, 1, 1, 2, 2), "3x3 dilation 2, rows of 19"},
      // Multiplier 10: the input gradient sums its outputs in a batch of 8, then one of 2.
      {{1, 2, 8, 13}, {20, 1, 3, 3}, conv_params(1, 1, 2, 2, 1, 2), "multiplier 10"},
      {{1, 3, 10, 19}, {3, 1, 5, 5}, conv_params(2, 2, 2, 2, 1, 3), "5x5 stride 2"},
      // pad_w 5 > kw - 1: the padded output gradient of the input gradient is cropped.
      {{1, 2, 7, 12},
       {2, 1, 3, 5},
       conv_params(2, 1, 1, 5, 1, 2),
       "3x5, stride (2, 1), pad (1, 5)"},
  };
}

std::vector<FastConvCase> dense_cases() {
  return {
      {{2, 3, 19, 23}, {24, 3, 7, 7}, conv_params(4, 4, 2, 2, 1, 1), "stem-like 7x7 stride 4"},
      {{2, 16, 15, 17}, {40, 16, 3, 3}, conv_params(2, 2, 1, 1, 1, 1), "3x3 stride 2"},
      {{1, 8, 9, 11}, {12, 4, 3, 3}, conv_params(1, 1, 2, 2, 2, 2), "groups 2, dilation 2"},
  };
}

Shape conv_out_shape(const FastConvCase& c) {
  auto out = [](int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d) {
    return (in + 2 * pad - d * (k - 1) - 1) / s + 1;
  };
  return {c.x[0], c.w[0], out(c.x[2], c.w[2], c.p.stride_h, c.p.pad_h, c.p.dilation_h),
          out(c.x[3], c.w[3], c.p.stride_w, c.p.pad_w, c.p.dilation_w)};
}

// conv2d in `dtype` forward and backward from grad_y: the output, then the gradients of x, w, b.
TensorList conv_with_grads(const FastConvCase& c, DType dtype, const Tensor& x64, const Tensor& w64,
                           const Tensor& b64, const Tensor& gy64) {
  const Tensor x = x64.to(dtype).detach().set_requires_grad(),
               w = w64.to(dtype).detach().set_requires_grad(),
               b = b64.to(dtype).detach().set_requires_grad();
  const Tensor y = conv2d(x, w, b, c.p);
  y.backward(gy64.to(dtype));
  return {y, x.grad(), w.grad(), b.grad()};
}

void check_conv_case(const FastConvCase& c) {
  INFO(c.what);
  const Tensor x = uniform(c.x, 31), w = uniform(c.w, 32), b = uniform({c.w[0]}, 33);
  const Shape y_shape = conv_out_shape(c);
  const Tensor gy = uniform(y_shape, 34);
  const Tensor expected = ska::test::values(loop_conv2d(x, w, b, c.p, y_shape), y_shape);
  const TensorList f64 = conv_with_grads(c, DType::kF64, x, w, b, gy);
  require_close(f64[0], expected, tolerance_for(DType::kF64), "f64 output vs loops");
  const TensorList f32 = conv_with_grads(c, DType::kF32, x, w, b, gy);
  const char* names[] = {"f32 output", "f32 grad x", "f32 grad w", "f32 grad b"};
  for (size_t i = 0; i < f32.size(); ++i) {
    require_close(f32[i], f64[i], tolerance_for(DType::kF32), names[i]);
  }
}

// C = A B by loops (f64), A [m, k], B [k, n].
std::vector<double> loop_matmul(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  const std::vector<double> av = ac.to_vector<double>(), bv = bc.to_vector<double>();
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  std::vector<double> c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += av[i * k + l] * bv[l * n + j];
  return c;
}

}  // namespace

TEST_CASE("depthwise conv2d fast path matches loops in f64 and f64 in f32", "[cpu]") {
  for (const FastConvCase& c : depthwise_cases()) check_conv_case(c);
}

TEST_CASE("depthwise conv2d fast path gradients match finite differences", "[cpu]") {
  for (const FastConvCase& c : depthwise_cases()) {
    INFO(c.what);
    Shape xs = c.x;
    xs[0] = 1;
    const Conv2dParams p = c.p;
    check_gradients([p](const TensorList& in) { return conv2d(in[0], in[1], in[2], p); },
                    {uniform(xs, 41).set_requires_grad(), uniform(c.w, 42).set_requires_grad(),
                     uniform({c.w[0]}, 43).set_requires_grad()});
  }
}

TEST_CASE("dense conv2d with split GEMMs matches loops in f64 and f64 in f32", "[cpu]") {
  for (const FastConvCase& c : dense_cases()) check_conv_case(c);
}

TEST_CASE("GEMMs split over threads match loops (rows, columns, transposes, bias)", "[cpu]") {
  // 300 x 250 x 200 multiply-adds is split into parts on any machine with 2+ threads; m > n
  // splits rows, m < n columns.
  for (const auto& [m, k, n] :
       std::vector<std::array<int64_t, 3>>{{300, 250, 200}, {90, 250, 700}}) {
    INFO("m " << m << " k " << k << " n " << n);
    const Tensor a = uniform({m, k}, 51), bt = uniform({n, k}, 52), bias = uniform({n}, 53);
    const Tensor b = bt.transpose(0, 1);
    std::vector<double> expected = loop_matmul(a, b);
    require_close(matmul(a, b.contiguous()), ska::test::values(expected, {m, n}),
                  tolerance_for(DType::kF64), "a @ b");
    require_close(matmul(a.transpose(0, 1).contiguous().transpose(0, 1), b),
                  ska::test::values(expected, {m, n}), tolerance_for(DType::kF64),
                  "a column-major @ b column-major");
    const std::vector<double> bv = bias.to_vector<double>();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) expected[i * n + j] += bv[j];
    require_close(linear(a, bt, bias), ska::test::values(expected, {m, n}),
                  tolerance_for(DType::kF64), "linear with bias");
    require_close(linear(a.to(DType::kF32), bt.to(DType::kF32), bias.to(DType::kF32)),
                  ska::test::values(expected, {m, n}), tolerance_for(DType::kF32),
                  "f32 linear with bias");
  }
}

TEST_CASE("f32 layer norm backward matches f64", "[cpu]") {
  struct Case {
    int64_t rows, width;
    bool affine;
  };
  // 300 rows: three chunks of the weight and bias sums; 37: no vector multiple.
  for (const Case& c : {Case{300, 64, true}, Case{37, 37, false}, Case{5, 512, true}}) {
    INFO("rows " << c.rows << " width " << c.width << " affine " << c.affine);
    const Tensor x = uniform({c.rows, c.width}, 61, -2.0, 3.0);
    const Tensor w = uniform({c.width}, 62, 0.5, 1.5), b = uniform({c.width}, 63);
    const Tensor gy = uniform({c.rows, c.width}, 64);
    TensorList grads[2];
    const DType dtypes[2] = {DType::kF64, DType::kF32};
    for (int d = 0; d < 2; ++d) {
      const Tensor xd = x.to(dtypes[d]).detach().set_requires_grad();
      const Tensor wd = c.affine ? w.to(dtypes[d]).detach().set_requires_grad() : Tensor();
      const Tensor bd = c.affine ? b.to(dtypes[d]).detach().set_requires_grad() : Tensor();
      layer_norm(xd, wd, bd, 1e-5).backward(gy.to(dtypes[d]));
      grads[d] = {xd.grad(), wd.defined() ? wd.grad() : Tensor(),
                  bd.defined() ? bd.grad() : Tensor()};
    }
    require_close(grads[1][0], grads[0][0], tolerance_for(DType::kF32), "grad x");
    if (c.affine) {
      require_close(grads[1][1], grads[0][1], tolerance_for(DType::kF32), "grad weight");
      require_close(grads[1][2], grads[0][2], tolerance_for(DType::kF32), "grad bias");
    }
  }
}

TEST_CASE("f32 relu and squared relu fast paths match f64, gradients included", "[cpu]") {
  // 40001 values (threads split them; a remainder after the vector loops), zeros included.
  std::vector<double> xv = uniform({40001}, 71, -2.0, 2.0).to_vector<double>();
  for (size_t i = 0; i < xv.size(); i += 7) xv[i] = 0.0;
  const Tensor x = ska::test::values(xv, {40001});
  const Tensor gy = uniform({40001}, 72);
  for (const auto& op : std::vector<Tensor (*)(const Tensor&)>{&relu, &squared_relu}) {
    TensorList results[2];
    const DType dtypes[2] = {DType::kF64, DType::kF32};
    for (int d = 0; d < 2; ++d) {
      const Tensor xd = x.to(dtypes[d]).detach().set_requires_grad();
      const Tensor y = op(xd);
      y.backward(gy.to(dtypes[d]));
      results[d] = {y, xd.grad()};
    }
    require_close(results[1][0], results[0][0], tolerance_for(DType::kF32), "output");
    require_close(results[1][1], results[0][1], tolerance_for(DType::kF32), "grad x");
  }
}

TEST_CASE("strided copies (coalesced rows, tiled transposes) equal an element-by-element copy",
          "[cpu]") {
  // Each case: a permutation of a contiguous tensor (and a broadcast), copied into a contiguous
  // one, in f64 -> f64, f32 -> f64 and f64 -> f32; the expected values come from index arithmetic.
  struct Case {
    Shape shape;
    std::vector<int64_t> perm;
  };
  const std::vector<Case> cases = {
      {{64, 100}, {1, 0}},               // a 2-D transpose with a partial tile
      {{3, 37, 41}, {0, 2, 1}},          // batched, both sides off the tile size
      {{2, 5, 33, 7}, {0, 2, 1, 3}},     // head split: rows of 7 contiguous on both sides
      {{2, 4, 50, 16}, {0, 1, 3, 2}},    // k^T of attention
      {{4, 16, 50, 3}, {3, 0, 2, 1}},    // unit source stride on an inner dim
      {{1, 9, 1, 40}, {3, 2, 1, 0}},     // size-1 dims
      {{5, 6}, {0, 1}},                  // already contiguous
  };
  for (const Case& c : cases) {
    const Tensor base = uniform(c.shape, 31);  // f64, contiguous
    const Tensor view = base.permute(c.perm);
    for (const auto& [from, to] : std::vector<std::pair<DType, DType>>{
             {DType::kF64, DType::kF64}, {DType::kF32, DType::kF64}, {DType::kF64, DType::kF32}}) {
      INFO("shape " << shape_str(c.shape) << ", " << dtype_name(from) << " -> " << dtype_name(to));
      const Tensor src = from == DType::kF64 ? view : base.to(from).permute(c.perm);
      Tensor dst = Tensor::empty(view.shape(), to);
      dst.copy_(src);
      // Expected: walk the view's logical indices through the base's strides.
      const std::vector<double> b = base.to(from).to(DType::kF64).to_vector<double>();
      const std::vector<double> got = dst.to(DType::kF64).to_vector<double>();
      const Shape& vs = view.shape();
      const Shape& st = view.strides();
      std::vector<int64_t> index(vs.size(), 0);
      bool equal = true;
      for (int64_t i = 0; i < view.numel() && equal; ++i) {
        int64_t offset = 0;
        for (size_t k = 0; k < vs.size(); ++k) offset += index[k] * st[k];
        const double expected = to == DType::kF32 ? static_cast<double>(static_cast<float>(b[offset]))
                                                  : b[offset];
        equal = got[static_cast<size_t>(i)] == expected;
        for (size_t k = vs.size(); k-- > 0;) {
          if (++index[k] < vs[k]) break;
          index[k] = 0;
        }
      }
      CHECK(equal);
    }
  }
  // A broadcast source (stride 0) into a transposed destination.
  const Tensor row = uniform({1, 70}, 32);
  Tensor out = Tensor::empty({70, 40}, DType::kF64).permute({1, 0});
  out.copy_(row.expand({40, 70}));
  const std::vector<double> r = row.to_vector<double>();
  const Tensor back = out.contiguous();
  CHECK(back.select(0, 39).to_vector<double>() == r);
  CHECK(back.select(0, 0).to_vector<double>() == r);
}
