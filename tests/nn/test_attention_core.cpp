// The attention core (nn/mixers/attention_core): attend() against a naive per-element composition
// for every normalisation, scale, mask, bias and talking-heads setting; the logit builders; f64
// gradients with the shared checker; the name tables and the mixer registry's errors.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "nn/mixers/attention_core.h"
#include "nn/mixers/attention_probe.h"
#include "nn/mixers/mixer.h"
#include "nn/summary.h"
#include "ops/autocast.h"
#include "ops/mac_counter.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::nn;

namespace {

constexpr int64_t kB = 2, kH = 2, kQ = 3, kK = 4, kD = 2;

// What attention_weights() should compute, spelled out one element at a time in doubles.
struct NaiveSpec {
  double scale = 1.0;
  bool diagonal = false;
  bool bias = false;
  bool talking_heads = false;
  Normalise normalise = Normalise::kSoftmax;
};

double act(Normalise kind, double x, double s, double b) {
  switch (kind) {
    case Normalise::kGelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Normalise::kRelu:
      return x > 0 ? x : 0.0;
    case Normalise::kStarRelu:
      return s * (x > 0 ? x * x : 0.0) + b;
    default:
      return x;
  }
}

// logits [B, h, Q, K], bias [Q, K], mixes [h, h] -> weights [B, h, Q, K] (flat, row-major).
std::vector<double> naive_weights(const std::vector<double>& logits,
                                  const std::vector<double>& bias, const std::vector<double>& pre,
                                  const std::vector<double>& post, double star_s, double star_b,
                                  const NaiveSpec& n) {
  auto at = [](int64_t b, int64_t h, int64_t i, int64_t j) {
    return static_cast<size_t>(((b * kH + h) * kQ + i) * kK + j);
  };
  std::vector<double> x(logits.size()), mixed(logits.size()), w(logits.size()), out(logits.size());
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kQ; ++i)
        for (int64_t j = 0; j < kK; ++j)
          x[at(b, h, i, j)] = logits[at(b, h, i, j)] * n.scale + (n.bias ? bias[i * kK + j] : 0.0);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t g = 0; g < kH; ++g)
      for (int64_t i = 0; i < kQ; ++i)
        for (int64_t j = 0; j < kK; ++j) {
          double sum = 0;
          for (int64_t h = 0; h < kH; ++h) sum += x[at(b, h, i, j)] * pre[h * kH + g];
          mixed[at(b, g, i, j)] = n.talking_heads ? sum : x[at(b, g, i, j)];
        }
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t i = 0; i < kQ; ++i) {
        double max = -INFINITY, total = 0;
        for (int64_t j = 0; j < kK; ++j)
          if (!(n.diagonal && i == j)) max = std::max(max, mixed[at(b, h, i, j)]);
        for (int64_t j = 0; j < kK; ++j) {
          const bool masked = n.diagonal && i == j;
          const double v = mixed[at(b, h, i, j)];
          if (n.normalise == Normalise::kSoftmax) {
            w[at(b, h, i, j)] = masked ? 0.0 : std::exp(v - max);
            total += w[at(b, h, i, j)];
          } else {
            w[at(b, h, i, j)] = masked ? 0.0 : act(n.normalise, v, star_s, star_b);
          }
        }
        if (n.normalise == Normalise::kSoftmax)
          for (int64_t j = 0; j < kK; ++j) w[at(b, h, i, j)] /= total;
      }
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t g = 0; g < kH; ++g)
      for (int64_t i = 0; i < kQ; ++i)
        for (int64_t j = 0; j < kK; ++j) {
          double sum = 0;
          for (int64_t h = 0; h < kH; ++h) sum += w[at(b, h, i, j)] * post[h * kH + g];
          out[at(b, g, i, j)] = n.talking_heads ? sum : w[at(b, g, i, j)];
        }
  return out;
}

// weights [B, h, Q, K] @ v [B, h, K, D], flat.
std::vector<double> naive_matmul(const std::vector<double>& w, const std::vector<double>& v) {
  std::vector<double> out(static_cast<size_t>(kB * kH * kQ * kD), 0.0);
  for (int64_t bh = 0; bh < kB * kH; ++bh)
    for (int64_t i = 0; i < kQ; ++i)
      for (int64_t e = 0; e < kD; ++e)
        for (int64_t j = 0; j < kK; ++j)
          out[(bh * kQ + i) * kD + e] += w[(bh * kQ + i) * kK + j] * v[(bh * kK + j) * kD + e];
  return out;
}

struct Inputs {
  Tensor logits = test::uniform({kB, kH, kQ, kK}, 1, -2.0, 2.0);
  Tensor v = test::uniform({kB, kH, kK, kD}, 2);
  Tensor bias = test::uniform({kQ, kK}, 3);
  Tensor pre = test::uniform({kH, kH}, 4);
  Tensor post = test::uniform({kH, kH}, 5);
  Tensor temperature = test::values({std::log(0.7)}, {1});
  Tensor star_s = test::values({0.8}, {1});
  Tensor star_b = test::values({-0.1}, {1});
};

// The spec a NaiveSpec describes; `learnable` puts the scale in spec.temperature instead.
AttentionSpec make_spec(const Inputs& in, const NaiveSpec& n, bool learnable) {
  AttentionSpec spec;
  if (learnable) {
    spec.temperature = in.temperature;
  } else {
    spec.scale = n.scale;
  }
  spec.exclude_diagonal = n.diagonal;
  if (n.bias) spec.bias = in.bias;
  if (n.talking_heads) {
    spec.heads_pre = in.pre;
    spec.heads_post = in.post;
  }
  spec.normalise = n.normalise;
  spec.starrelu_scale = in.star_s;
  spec.starrelu_bias = in.star_b;
  return spec;
}

// Every combination of normalisation, scale (fixed / learnable), diagonal mask, bias and talking
// heads.
template <typename F>
void for_each_spec(F&& f) {
  for (const std::string& name : normalise_names()) {
    for (bool learnable : {false, true})
      for (bool diagonal : {false, true})
        for (bool bias : {false, true})
          for (bool talking : {false, true}) {
            NaiveSpec n;
            n.normalise = normalise_kind(name);
            n.scale = learnable ? 0.7 : 0.5;
            n.diagonal = diagonal;
            n.bias = bias;
            n.talking_heads = talking;
            INFO(name << (learnable ? " learnable" : " fixed") << (diagonal ? " diagonal" : "")
                      << (bias ? " bias" : "") << (talking ? " talking-heads" : ""));
            f(n, learnable);
          }
  }
}

}  // namespace

TEST_CASE("attend matches a naive composition for every normalisation and mask",
          "[cpu][nn][attention]") {
  const Inputs in;
  for_each_spec([&](const NaiveSpec& n, bool learnable) {
    const AttentionSpec spec = make_spec(in, n, learnable);
    const std::vector<double> weights =
        naive_weights(in.logits.to_vector<double>(), in.bias.to_vector<double>(),
                      in.pre.to_vector<double>(), in.post.to_vector<double>(), 0.8, -0.1, n);
    const Tensor expected_weights = test::values(weights, {kB, kH, kQ, kK});
    test::require_close(attention_weights(in.logits, spec), expected_weights,
                        test::tolerance_for(DType::kF64), "weights");
    const Tensor expected =
        test::values(naive_matmul(weights, in.v.to_vector<double>()), {kB, kH, kQ, kD});
    test::require_close(attend(in.logits, in.v, spec), expected, test::tolerance_for(DType::kF64),
                        "attend");
  });
}

TEST_CASE("attend gradients (f64 central differences)", "[cpu][nn][attention]") {
  for_each_spec([&](const NaiveSpec& n, bool learnable) {
    Inputs in;
    // Every tensor the spec uses, checked; the others stay out (they would get no gradient).
    std::vector<Tensor Inputs::*> used = {&Inputs::logits, &Inputs::v};
    if (n.bias) used.push_back(&Inputs::bias);
    if (n.talking_heads) used.insert(used.end(), {&Inputs::pre, &Inputs::post});
    if (learnable) used.push_back(&Inputs::temperature);
    if (n.normalise == Normalise::kStarRelu)
      used.insert(used.end(), {&Inputs::star_s, &Inputs::star_b});
    TensorList inputs;
    for (Tensor Inputs::*member : used) inputs.push_back((in.*member).set_requires_grad(true));
    test::check_gradients(
        [&](const TensorList& x) {
          Inputs bound = in;
          for (size_t i = 0; i < used.size(); ++i) bound.*used[i] = x[i];
          return attend(bound.logits, bound.v, make_spec(bound, n, learnable));
        },
        inputs);
  });
}

TEST_CASE("logit builders: q k^T, static keys, conv logits", "[cpu][nn][attention]") {
  const Tensor q = test::uniform({kB, kH, 6, kD}, 7);  // a 2x3 query grid
  const Tensor keys = test::uniform({kH, kK, kD}, 8);
  SECTION("static keys are q k^T with one key tensor for the batch") {
    const Tensor batch_keys = keys.unsqueeze(0).expand({kB, kH, kK, kD});
    test::require_close(static_key_logits(q, keys), dot_logits(q, batch_keys),
                        test::tolerance_for(DType::kF64));
    REQUIRE_THROWS_AS(static_key_logits(q, test::uniform({kH + 1, kK, kD}, 9)), ShapeError);
  }
  SECTION("a conv with only its centre tap is a static key per head, plus the conv bias") {
    std::shared_ptr<Conv2d> conv = make_conv_logits(kH * kD, kH, kK);
    conv->to(DType::kF64);
    CHECK(conv->weight.shape() == Shape{kH * kK, kD, 3, 3});
    std::vector<double> w(static_cast<size_t>(conv->weight.numel()), 0.0);
    const std::vector<double> k = keys.to_vector<double>();  // [h, K, d]
    for (int64_t h = 0; h < kH; ++h)
      for (int64_t key = 0; key < kK; ++key)
        for (int64_t c = 0; c < kD; ++c)  // channel c of the head's group; tap (1, 1)
          w[static_cast<size_t>(((h * kK + key) * kD + c) * 9 + 4)] = k[(h * kK + key) * kD + c];
    {
      NoGradGuard no_grad;
      conv->weight.copy_(test::values(w, conv->weight.shape()));
    }
    const Tensor bias = conv->bias.reshape({1, kH, 1, kK});
    test::require_close(conv_logits(q, *conv, 2, 3), add(static_key_logits(q, keys), bias),
                        test::tolerance_for(DType::kF64));
    REQUIRE_THROWS_AS(conv_logits(q, *conv, 3, 3), ShapeError);
  }
  SECTION("gradients through every builder") {
    std::shared_ptr<Conv2d> conv = make_conv_logits(kH * kD, kH, kK);
    conv->to(DType::kF64);
    TensorList inputs = {q.clone().set_requires_grad(true), keys.clone().set_requires_grad(true),
                         conv->weight, conv->bias};
    test::check_gradients(
        [&](const TensorList& x) {
          return add(static_key_logits(x[0], x[1]), conv_logits(x[0], *conv, 2, 3));
        },
        inputs);
  }
}

namespace {

// conv_logits(q, conv) and the gradients of sum(logits * w) for q, the weight and the bias; checks
// that the form asked for computed them (`product`: the form applies, so that kGemm runs as a
// matrix product and kDirect as the grid_conv_logits op).
TensorList conv_logits_and_grads(const Tensor& q_in, Conv2d& conv, int64_t h, int64_t w,
                                 ConvLogitsForm form, bool product = true) {
  ConvLogitsFormGuard guard(form);
  const Tensor q = q_in.clone().set_requires_grad(true);
  conv.weight.zero_grad();
  if (conv.bias.defined()) conv.bias.zero_grad();
  const Tensor logits = conv_logits(q, conv, h, w);
  const bool as_product = form == ConvLogitsForm::kGemm && product;
  const bool as_direct = form == ConvLogitsForm::kDirect && product;
  // With a bias, the neighbourhoods come as rows with the bias's column of ones.
  const char* im2col = conv.bias.defined() ? "grid_neighbourhood_rows" : "grid_neighbourhoods";
  CHECK(test::graph_has(logits, im2col) == as_product);
  if (as_product || as_direct) CHECK_FALSE(test::graph_has(logits, "add"));  // bias in the op
  CHECK(test::graph_has(logits, "conv_logits") == as_direct);
  CHECK(test::graph_has(logits, "conv2d") == !(as_product || as_direct));
  const Tensor weights = test::uniform(logits.shape(), 99, -1.0, 1.0, logits.dtype());
  sum(logits * weights).backward();
  TensorList out = {logits.detach(), q.grad(), conv.weight.grad()};
  if (conv.bias.defined()) out.push_back(conv.bias.grad());
  return out;
}

}  // namespace

TEST_CASE(
    "conv logits as one matrix product per head, and by grid_conv_logits, equal the "
    "convolution",
    "[cpu][nn][attention]") {
  // q [B, h, H*W, d] as split_heads leaves it (a strided view), on a 4x5 grid.
  const int64_t heads = 3, d = 4, keys = 7, gh = 4, gw = 5;
  const Tensor q_in = split_heads(test::uniform({2, gh * gw, heads * d}, 21), heads);
  const char* names[] = {"logits", "q grad", "weight grad", "bias grad"};
  const ConvLogitsForm form = GENERATE(ConvLogitsForm::kGemm, ConvLogitsForm::kDirect);
  CAPTURE(form == ConvLogitsForm::kGemm ? "gemm" : "direct");
  for (int64_t k : {3, 5}) {
    for (bool bias : {true, false}) {
      DYNAMIC_SECTION(k << "x" << k << (bias ? " with" : " without") << " bias") {
        Conv2dOptions o;
        o.padding = k / 2;
        o.groups = heads;
        o.bias = bias;
        Conv2d conv(heads * d, heads * keys, k, o);
        conv.to(DType::kF64);
        const TensorList by_conv = conv_logits_and_grads(q_in, conv, gh, gw, ConvLogitsForm::kConv);
        const TensorList by_gemm = conv_logits_and_grads(q_in, conv, gh, gw, form);
        REQUIRE(by_gemm.size() == by_conv.size());
        for (size_t i = 0; i < by_conv.size(); ++i) {
          test::require_close(by_gemm[i], by_conv[i], test::tolerance_for(DType::kF64), names[i]);
        }
        if (form == ConvLogitsForm::kDirect) continue;  // test_conv.cpp checks the op's gradients
        ConvLogitsFormGuard gemm(form);
        TensorList inputs = {q_in.clone().set_requires_grad(true), conv.weight};
        if (bias) inputs.push_back(conv.bias);
        test::check_gradients([&](const TensorList& x) { return conv_logits(x[0], conv, gh, gw); },
                              inputs);
      }
    }
  }
  SECTION("f32, and bf16 autocast, agree with the convolution") {
    std::shared_ptr<Conv2d> conv = make_conv_logits(heads * d, heads, keys);
    const Tensor q32 = q_in.to(DType::kF32);
    const TensorList by_conv = conv_logits_and_grads(q32, *conv, gh, gw, ConvLogitsForm::kConv);
    const TensorList by_gemm = conv_logits_and_grads(q32, *conv, gh, gw, form);
    for (size_t i = 0; i < by_conv.size(); ++i) {
      test::require_close(by_gemm[i], by_conv[i], test::tolerance_for(DType::kF32), names[i]);
    }
    AutocastGuard autocast(DType::kBF16);
    const Tensor logits_gemm = [&] {
      ConvLogitsFormGuard gemm(form);
      return conv_logits(q32, *conv, gh, gw);
    }();
    const Tensor logits_conv = conv_logits(q32, *conv, gh, gw);
    CHECK(logits_gemm.dtype() == DType::kBF16);
    CHECK(logits_conv.dtype() == DType::kBF16);
    test::require_close(logits_gemm, logits_conv, test::tolerance_for(DType::kBF16));
  }
  SECTION("the convolution runs as its module (summary's layer row); the other form's MACs match") {
    std::shared_ptr<Conv2d> conv = make_conv_logits(heads * d, heads, keys);
    conv->to(DType::kF64);
    const int64_t macs = 2 * heads * keys * gh * gw * d * 9;  // batch 2
    for (const ConvLogitsForm f : {ConvLogitsForm::kConv, form}) {
      ConvLogitsFormGuard guard(f);
      SummaryRecorder recorder(*conv);
      MacCounter counter;
      conv_logits(q_in, *conv, gh, gw);
      CHECK(counter.total() == macs);
      if (f == ConvLogitsForm::kConv) {
        REQUIRE(recorder.rows().size() == 1);
        CHECK(recorder.rows()[0].type == "Conv2d");
        CHECK(recorder.rows()[0].macs == macs);
      } else {
        CHECK(recorder.rows().empty());  // the other form has no module of its own
      }
    }
  }
  SECTION("1x1 filters, and a dilated convolution (which stays a convolution)") {
    Conv2dOptions o;
    o.groups = heads;
    Conv2d conv(heads * d, heads * keys, 1, o);  // padding 0 = k/2: the product applies
    conv.to(DType::kF64);
    Conv2dOptions dilated = o;
    dilated.padding = 2;
    dilated.dilation = 2;
    Conv2d conv_dilated(heads * d, heads * keys, 3, dilated);  // keeps the grid; not a product
    conv_dilated.to(DType::kF64);
    for (Conv2d* c : {&conv, &conv_dilated}) {
      const TensorList by_conv = conv_logits_and_grads(q_in, *c, gh, gw, ConvLogitsForm::kConv);
      const TensorList by_gemm = conv_logits_and_grads(q_in, *c, gh, gw, form, c == &conv);
      for (size_t i = 0; i < by_conv.size(); ++i) {
        test::require_close(by_gemm[i], by_conv[i], test::tolerance_for(DType::kF64), names[i]);
      }
    }
  }
}

TEST_CASE("conv logits auto: the convolution on the CPU, and timing touches no graph or gradient",
          "[cpu][nn][attention]") {
  const int64_t heads = 2, d = 3, keys = 5, gh = 3, gw = 4;
  const Tensor q_in = split_heads(test::uniform({2, gh * gw, heads * d}, 31), heads);
  std::shared_ptr<Conv2d> conv = make_conv_logits(heads * d, heads, keys);
  conv->to(DType::kF64);
  // On the CPU auto never times (runs stay repeatable): the convolution, the same numbers.
  const TensorList by_auto =
      conv_logits_and_grads(q_in, *conv, gh, gw, ConvLogitsForm::kAuto, /*product=*/false);
  const TensorList by_conv = conv_logits_and_grads(q_in, *conv, gh, gw, ConvLogitsForm::kConv);
  for (size_t i = 0; i < by_conv.size(); ++i) CHECK(test::bitwise_equal(by_auto[i], by_conv[i]));
  for (const std::string& line : conv_logits_auto_choices()) {
    CHECK(line.find("cpu") == std::string::npos);
  }
  // The timing itself, with and without backward: both forms timed, on detached operands.
  conv->weight.zero_grad();
  conv->bias.zero_grad();
  const Tensor q = q_in.clone().set_requires_grad(true);
  const Tensor y = add(q, 0.0);  // a graph the timing must leave alone
  for (const bool grad : {true, false}) {
    INFO("grad mode " << grad);
    std::optional<NoGradGuard> no_grad;
    if (!grad) no_grad.emplace();
    MacCounter macs;  // a model's MACs, counted around a call that times, count none of it
    const ConvLogitsTiming t = time_conv_logits(y, *conv, gh, gw, 2);
    CHECK(macs.total() == 0);
    CHECK(t.conv_ms > 0.0);
    CHECK(t.gemm_ms > 0.0);
    CHECK(t.conv_ms < 1e4);
    CHECK(t.gemm_ms < 1e4);
    CHECK(t.direct_ms > 0.0);  // the CPU's reference loops take every call
    CHECK(t.direct_ms < 1e4);
  }
  CHECK_FALSE(conv->weight.grad().defined());
  CHECK_FALSE(conv->bias.grad().defined());
  CHECK_FALSE(q.grad().defined());
  sum(y).backward();  // the caller's graph still works, and only it reaches q
  test::require_close(q.grad(), Tensor::ones(q.shape(), DType::kF64),
                      test::tolerance_for(DType::kF64));
  Conv2dOptions dilated;
  dilated.padding = 2;
  dilated.dilation = 2;
  dilated.groups = heads;
  Conv2d conv_dilated(heads * d, heads * keys, 3, dilated);
  REQUIRE_THROWS_AS(time_conv_logits(q_in.to(DType::kF32), conv_dilated, gh, gw), ValueError);
}

TEST_CASE("split_heads of a stacked projection: views of each piece's heads, one copy each back",
          "[cpu][nn][attention]") {
  // x [B, N, 3 * 6] as q, k, v of 2 heads of 3: each piece equals split then split_heads, as
  // views of x; the gradients match finite differences; a backward pass whose gradients come
  // head-major ([B, h, N, d] contiguous, as matrix products write them) copies each once into x's
  // layout, where split + split_heads copied each to undo the head split and again to join.
  const int64_t batch = 2, n = 4, heads = 2, d = 3, w = heads * d;
  const Tensor x = test::uniform({batch, n, 3 * w}, 41).set_requires_grad();
  const TensorList pieces = split_heads(x, {w, w, w}, heads);
  const TensorList parts = split(x.detach(), {w, w, w}, -1);
  REQUIRE(pieces.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(pieces[i].shape() == Shape{batch, heads, n, d});
    CHECK(pieces[i].same_storage(x));
    test::require_close(pieces[i], split_heads(parts[i], heads), {0.0, 0.0}, "piece");
  }
  test::check_gradients(
      [&](const TensorList& in) {
        const TensorList p = split_heads(in[0], {w, 2 * w}, heads);
        return add(sum(mul(p[0], p[0])), sum(mul(p[1], p[1])));
      },
      {x});
  x.zero_grad();
  const TensorList again = split_heads(x, {w, w, w}, heads);
  // Head-major gradients: products of contiguous tensors, as attention's matmuls give them.
  const Tensor r = test::uniform({batch, heads, n, d}, 42);
  const Tensor rt = r.transpose(-1, -2);
  const Tensor y = stack({matmul(again[0], rt), matmul(again[1], rt), matmul(again[2], rt)}, 0);
  const Tensor c = test::uniform(y.shape(), 43);
  const std::vector<profiler::KernelTime> calls = test::kernels_of([&] { y.backward(c); });
  CHECK(test::calls_of(calls, "copy") == 3);  // one a piece
  for (const profiler::KernelTime& k : calls) {
    if (k.name == "copy") CHECK(k.operands == "[2, 2, 4, 3] f64, [2, 2, 4, 3] f64 (strided)");
  }
  REQUIRE_THROWS_WITH(split_heads(x, {w, w, w - 1}, heads),
                      Catch::Contains("not a positive multiple"));
  REQUIRE_THROWS_WITH(split_heads(x, {w, w}, heads), Catch::Contains("add up to 12"));
}

namespace {

// The gradients of `inputs` from f's output against `weights`, and the copy kernels the
// backward pass runs; with `offers` false, under NoDestinationsGuard (each piece's gradient in a
// tensor of its own, copied into its place after).
struct Backward {
  TensorList grads;
  std::vector<std::string> copies;
};
Backward backward_of(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                     const Tensor& weights, bool offers) {
  TensorList leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.detach().clone().set_requires_grad());
  const Tensor y = f(leaves);
  Backward b;
  for (const profiler::KernelTime& k : test::kernels_of([&] {
         std::optional<autograd::NoDestinationsGuard> off;
         if (!offers) off.emplace();
         y.backward(weights);
       })) {
    for (int64_t i = 0; k.name == "copy" && i < k.calls; ++i) b.copies.push_back(k.operands);
  }
  for (const Tensor& t : leaves) b.grads.push_back(t.grad());
  return b;
}

}  // namespace

TEST_CASE("gradient destinations: the fused attention writes a head split's pieces in place",
          "[cpu][nn][attention]") {
  // q, k, v as split_heads' pieces of one projection [B, N, 3 * h * d]: the attention's backward
  // writes their gradients where the projection's gradient has them, so nothing is copied; the
  // gradient is bit for bit the one the copies give.
  const int64_t batch = 2, n = 5, heads = 2, d = 4, w = heads * d;
  const auto f = [&](const TensorList& in) {
    const TensorList p = split_heads(in[0], {w, w, w}, heads);
    return scaled_dot_attention(p[0], p[1], p[2], 0.5);
  };
  const Tensor x = test::uniform({batch, n, 3 * w}, 51);
  const Tensor c = test::uniform({batch, heads, n, d}, 52);
  const Backward in_place = backward_of(f, {x}, c, true);
  const Backward copied = backward_of(f, {x}, c, false);
  CHECK(in_place.copies.empty());
  CHECK(copied.copies.size() == 3);  // one a piece
  CHECK(test::bitwise_equal(in_place.grads[0], copied.grads[0]));
  test::check_gradients(f, {x.clone().set_requires_grad()});
}

TEST_CASE("gradient destinations chain through splits and slices, and add what more consumers give",
          "[cpu][nn][attention]") {
  // CSKA's layout: q and v the heads of one projection; q's first row against static keys (a
  // matrix product, copied into place), its other rows' conv logits (written in place through
  // the split, into the projection's gradient); v read by the fused attention (in place) and by
  // a second consumer, whose gradient is added to it. A third piece is unused (zeros).
  const int64_t batch = 2, heads = 2, d = 4, gh = 3, gw = 3, tokens = 1 + gh * gw, w = heads * d;
  const Tensor keys = test::uniform({heads, tokens, d}, 61);
  const Tensor filters = test::uniform({heads, 9, tokens, d}, 62, -0.3, 0.3);
  const Tensor mix = test::uniform({batch, heads, tokens, d}, 63);
  const auto f = [&](const TensorList& in) {
    const TensorList p = split_heads(in[0], {w, w, w}, heads);
    const TensorList rows = split(p[0], {1, gh * gw}, 2);
    const Tensor logits = cat(
        {matmul(rows[0], keys.transpose(-1, -2)), grid_conv_logits(rows[1], filters, {}, gh, gw)},
        2);
    return add(softmax_attend(logits, p[1]), mul(p[1], mix));
  };
  const Tensor x = test::uniform({batch, tokens, 3 * w}, 64);
  const Tensor c = test::uniform({batch, heads, tokens, d}, 65);
  const Backward in_place = backward_of(f, {x}, c, true);
  const Backward copied = backward_of(f, {x}, c, false);
  CHECK(test::bitwise_equal(in_place.grads[0], copied.grads[0]));
  // Copied in place: v's (the sum of its two gradients) and the class row's (the product's).
  // Without: those, the conv logits' rows into the split's gradient, and that gradient into the
  // projection's. (The unused piece is zero-filled in place either way.)
  const std::string v_copy = "[2, 2, 10, 4] f64, [2, 2, 10, 4] f64 (strided)";
  const std::string row_copy = "[2, 2, 1, 4] f64 (strided), [2, 2, 1, 4] f64 (strided)";
  std::vector<std::string> copies = in_place.copies;
  std::sort(copies.begin(), copies.end());
  CHECK(copies == std::vector<std::string>{row_copy, v_copy});
  CHECK(copied.copies.size() == 4);
  test::check_gradients(f, {x.clone().set_requires_grad()});
  SECTION("a slice's zeros around its piece, also in place") {
    const auto first = [&](const TensorList& in) {
      const TensorList p = split_heads(in[0], {w, w, w}, heads);
      return softmax_attend(
          matmul(p[0].narrow(2, 0, 1), keys.narrow(1, 1, gh * gw).transpose(-1, -2)),
          p[2].narrow(2, 1, gh * gw));
    };
    const Tensor c1 = test::uniform({batch, heads, 1, d}, 66);
    const Backward sliced = backward_of(first, {x}, c1, true);
    const Backward sliced_copied = backward_of(first, {x}, c1, false);
    CHECK(test::bitwise_equal(sliced.grads[0], sliced_copied.grads[0]));
    // The class row's gradient copied into its place; v's rows written in place.
    CHECK(sliced.copies == std::vector<std::string>{row_copy});
    CHECK(sliced_copied.copies.size() == 4);
    test::check_gradients(first, {x.clone().set_requires_grad()});
  }
}

TEST_CASE("attention names fail with the list of known names", "[cpu][nn][attention]") {
  CHECK(attention_kind("cska") == AttentionKind::kCska);
  CHECK(attention_kind_name(AttentionKind::kSka) == "ska");
  REQUIRE_THROWS_WITH(attention_kind("skaa"), Catch::Contains("mhsa, ska, cska"));
  REQUIRE_THROWS_WITH(normalise_kind("tanh"), Catch::Contains("softmax, gelu, relu, starrelu"));
  Config cfg = Config::parse("mixer: cskaa\n");
  REQUIRE_THROWS_WITH(build_mixer(cfg.root(), "mixer", MixerArgs{8, TokenGrid{2, 2, false}}),
                      Catch::Contains("did you mean 'cska'") && Catch::Contains("sepconv"));
}

TEST_CASE("diagonal masks are built once per shape and device", "[cpu][nn]") {
  const Tensor a = diagonal_mask(3, 4, Device::cpu());
  const Tensor b = diagonal_mask(3, 4, Device::cpu());
  CHECK(a.data_ptr() == b.data_ptr());  // the same constant, not a new host copy per forward
  CHECK(a.to_vector<uint8_t>() == std::vector<uint8_t>{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0});
  const Tensor c = diagonal_mask(4, 3, Device::cpu());
  CHECK(c.data_ptr() != a.data_ptr());
  CHECK(c.to_vector<uint8_t>() == std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0});
}

TEST_CASE("attention's first token alone equals the whole forward's first token",
          "[cpu][nn][attention]") {
  // A ViT's last block reads only the class token of its mixer's output: Attention, SKA and CSKA
  // compute it from the class token's query alone (CSKA: its static-key row, no conv logits).
  // LSA (learnable temperature, diagonal mask), plain attention, SKA (softmax and gelu), CSKA
  // (its own class temperature, a shared one, relu, and the authors' row order, which takes the
  // whole forward), values and every gradient (input and parameters) in f64, and under bf16
  // autocast within its tolerance; with an attention probe the whole forward runs (full maps
  // recorded).
  MixerArgs args;
  args.dim = 32;
  args.grid = TokenGrid{3, 3, true};
  args.flavour = MixerFlavour::kVit;
  args.heads = 2;
  args.head_dim = 16;
  for (const char* type :
       {"{type: lsa}", "{type: mhsa}", "{type: ska}", "{type: ska, activation: gelu}",
        "{type: cska}", "{type: cska, scale: true}", "{type: cska, scale: true, cls_scale: false}",
        "{type: cska, activation: relu, diagonal_mask: false}",
        "{type: cska, authors_row_order: true}"}) {
    INFO(type);
    const Config cfg = Config::parse(std::string("mixer: ") + type + "\n");
    const ModulePtr mixer = build_mixer_from_node(cfg.root()["mixer"], args);
    mixer->to(DType::kF64);
    const Tensor x = ska::test::uniform({2, 10, 32}, 41).set_requires_grad();
    const Tensor w = ska::test::uniform({2, 1, 32}, 42);
    const auto run = [&](bool first_only) {
      for (const auto& named : mixer->named_parameters(true)) named.second.zero_grad();
      x.zero_grad();
      const Tensor y = first_only ? mixer->first_token(x) : (*mixer)(x).narrow(1, 0, 1);
      sum(mul(y, w)).backward();
      std::vector<Tensor> r = {y.detach(), x.grad()};
      for (const auto& [name, p] : mixer->named_parameters(true)) r.push_back(p.grad());
      return r;
    };
    const std::vector<Tensor> whole = run(false), first = run(true);
    {  // the shortcut ran: CSKA's class row alone reads no conv logits
      const Tensor y = mixer->first_token(x);
      const bool whole_forward = std::string(type).find("authors_row_order") != std::string::npos;
      if (std::string(type).find("cska") != std::string::npos) {
        CHECK(ska::test::graph_has(y, "conv2d") == whole_forward);
        CHECK(ska::test::graph_has(y, "with_zero_grads") == !whole_forward);
      }
    }
    REQUIRE(first[0].shape() == Shape{2, 1, 32});
    for (size_t i = 0; i < whole.size(); ++i) {
      INFO("result " << i << " (the output, dL/dx, then the parameters' gradients)");
      ska::test::require_close(first[i], whole[i], ska::test::Tolerance{1e-12, 1e-12}, "first");
    }
    {
      const AutocastGuard autocast(DType::kBF16);
      mixer->to(DType::kF32);
      const Tensor x32 = x.detach().to(DType::kF32);
      ska::test::require_close(mixer->first_token(x32).to(DType::kF64),
                               (*mixer)(x32).narrow(1, 0, 1).to(DType::kF64),
                               ska::test::tolerance_for(DType::kBF16), "bf16 autocast");
    }
    mixer->to(DType::kF64);
    AttentionRecorder probe;
    mixer->first_token(x.detach());
    REQUIRE(probe.records().size() == 1);
    CHECK(probe.records()[0].weights.size(-2) == 10);  // the whole map: every query's row
  }
}
