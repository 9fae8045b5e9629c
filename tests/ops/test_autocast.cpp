// Autocast: the policy table, what each class of op computes in, gradients through the casts to
// f32 master weights, the CPU's 16-bit kernels (f32 compute, one rounding), and a tiny CSKA-ViT
// under bf16 autocast against f32 on the CPU and on CUDA.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "autograd/node.h"
#include "config/config.h"
#include "models/model.h"
#include "ops/autocast.h"
#include "support/test_util.h"

using namespace ska;
using Catch::Matchers::Contains;
using ska::test::bitwise_equal;

namespace {

// Deterministic f32 data in [lo, hi).
Tensor f32_data(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return test::uniform(shape, seed, lo, hi, DType::kF32);
}

// A tiny CSKA-ViT (2 blocks, width 32) on 16x16 RGB images: linear, layer norm, softmax, GELU,
// cat, the static-key mixer and the class-token head.
nn::ModulePtr tiny_vit(uint64_t seed) {
  manual_seed(seed);
  Config cfg = Config::parse(
      "family: vit\nimage_size: 16\nin_channels: 3\nnum_classes: 10\npatch_size: 4\n"
      "dim: 32\ndepth: 2\nheads: 2\nhead_dim: 16\nmlp_dim: 64\ndropout: 0.0\n"
      "emb_dropout: 0.0\nmixer: {type: cska}\n");
  nn::ModulePtr model = models::build_model(cfg.root());
  cfg.check_unused();
  return model;
}

struct ForwardBackward {
  Tensor logits;                        // as produced (bf16 under autocast)
  std::map<std::string, Tensor> grads;  // by parameter name
};

// Cross-entropy of the model on (images, labels), forward under `autocast`, backward outside.
ForwardBackward run_model(nn::Module& model, const Tensor& images, const Tensor& labels,
                          const AutocastState& autocast) {
  for (const Tensor& p : model.parameters()) p.zero_grad();
  ForwardBackward r;
  Tensor loss;
  {
    AutocastGuard guard(autocast.dtype, autocast.enabled);
    r.logits = model(images);
    loss = cross_entropy(r.logits, labels);
  }
  loss.backward();
  for (const auto& [name, p] : model.named_parameters(true)) r.grads[name] = p.grad();
  return r;
}

AutocastState bf16_autocast() {
  AutocastState s;
  s.enabled = true;
  s.dtype = DType::kBF16;
  return s;
}

// Logits and every parameter gradient of the tiny ViT under bf16 autocast on `device`, against
// f32 on the CPU. Per-element bf16 tolerances for the logits; NMSE for the gradients, which sum
// 16-bit products over the batch and the tokens.
void check_tiny_vit_bf16(Device device) {
  const nn::ModulePtr reference = tiny_vit(3);
  const nn::ModulePtr model = tiny_vit(3);
  model->to(device);
  const Tensor images = f32_data({4, 3, 16, 16}, 11);
  const Tensor labels = Tensor::from_vector<int64_t>({1, 7, 3, 9}, {4}, DType::kI64);
  const ForwardBackward expected = run_model(*reference, images, labels, AutocastState());
  const ForwardBackward actual =
      run_model(*model, images.to(device), labels.to(device), bf16_autocast());

  REQUIRE(actual.logits.dtype() == DType::kBF16);  // the head is a linear layer
  test::require_close(actual.logits, expected.logits, test::tolerance_for(DType::kBF16), "logits");
  REQUIRE(expected.grads.size() == actual.grads.size());
  for (const auto& [name, g] : actual.grads) {
    INFO(name);
    REQUIRE(g.defined());
    REQUIRE(g.dtype() == DType::kF32);  // master weights stay f32, and so do their grads
    REQUIRE(g.device() == device);
    if (g.numel() > 1) {
      CHECK(test::nmse(g, expected.grads.at(name)) < 5e-4);  // 1e-5 to 1e-4 on the CPU
    } else {
      // A learnable temperature's grad sums every attention logit's (cancelling) contribution;
      // bf16 leaves ~1e-4 of absolute error on it (the largest grads here are ~0.1).
      test::require_close(g, expected.grads.at(name), {5e-4, 0.25}, "scalar grad");
    }
  }
}

}  // namespace

TEST_CASE("autocast policy table", "[cpu][autocast]") {
  CHECK(autocast_policy("linear") == AutocastPolicy::kLowerPrecision);
  CHECK(autocast_policy("matmul") == AutocastPolicy::kLowerPrecision);
  CHECK(autocast_policy("conv2d") == AutocastPolicy::kLowerPrecision);
  for (const char* op : {"softmax", "log_softmax", "layer_norm", "cross_entropy", "sum", "mean",
                         "exp", "log", "pow", "rsqrt", "reciprocal"}) {
    INFO(op);
    CHECK(autocast_policy(op) == AutocastPolicy::kFloat32);
  }
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "gt"}) {
    INFO(op);
    CHECK(autocast_policy(op) == AutocastPolicy::kPromoteInOp);
  }
  for (const char* op : {"where", "cat"}) {
    INFO(op);
    CHECK(autocast_policy(op) == AutocastPolicy::kPromote);
  }
  for (const char* op : {"gelu", "relu", "affine", "amax", "view", "batch_norm"}) {
    INFO(op);
    CHECK_FALSE(autocast_policy(op).has_value());
  }
}

TEST_CASE("autocast guards nest, restore and accept only bf16 and f16", "[cpu][autocast]") {
  REQUIRE_FALSE(autocast_state().enabled);
  REQUIRE_THROWS_WITH(AutocastGuard(DType::kF32), Contains("bf16 or f16") && Contains("f32"));
  const Tensor x = f32_data({2, 4}, 1), w = f32_data({3, 4}, 2);
  {
    AutocastGuard outer(DType::kF16);
    CHECK(linear(x, w).dtype() == DType::kF16);
    {
      AutocastGuard off(DType::kBF16, false);
      CHECK(linear(x, w).dtype() == DType::kF32);
    }
    {
      AutocastGuard inner(DType::kBF16);
      CHECK(linear(x, w).dtype() == DType::kBF16);
    }
    CHECK(autocast_state().dtype == DType::kF16);
  }
  CHECK_FALSE(autocast_state().enabled);
  CHECK(linear(x, w).dtype() == DType::kF32);
}

TEST_CASE("GEMM-type ops run in the autocast dtype, grads reach f32 weights as f32",
          "[cpu][autocast]") {
  const Tensor x = f32_data({5, 8}, 3);
  const Tensor w = f32_data({6, 8}, 4).set_requires_grad();
  const Tensor b = f32_data({6}, 5).set_requires_grad();
  Tensor y;
  {
    AutocastGuard autocast(DType::kBF16);
    y = linear(x, w, b);
  }
  REQUIRE(y.dtype() == DType::kBF16);
  // Exactly the linear layer of the bf16-rounded operands.
  CHECK(bitwise_equal(
      y, linear(x.to(DType::kBF16), w.detach().to(DType::kBF16), b.detach().to(DType::kBF16))));
  test::require_close(y, linear(x, w.detach(), b.detach()), test::tolerance_for(DType::kBF16));

  // d/dW sum(y * c) = c^T x through the cast, delivered in f32.
  const Tensor c = f32_data({5, 6}, 6);
  sum(mul(y.to(DType::kF32), c)).backward();
  REQUIRE(w.grad().dtype() == DType::kF32);
  REQUIRE(b.grad().dtype() == DType::kF32);
  test::require_close(w.grad(), matmul(c.transpose(0, 1), x), test::tolerance_for(DType::kBF16));
  test::require_close(b.grad(), sum(c, {0}), test::tolerance_for(DType::kBF16));

  // matmul and conv2d, in f16.
  const Tensor a = f32_data({2, 3, 4}, 7), m = f32_data({4, 5}, 8);
  const Tensor img = f32_data({1, 2, 6, 6}, 9), k = f32_data({3, 2, 3, 3}, 10);
  AutocastGuard autocast(DType::kF16);
  const Tensor p = matmul(a, m);
  const Tensor q = conv2d(img, k, Tensor(), 1, 1);
  REQUIRE(p.dtype() == DType::kF16);
  REQUIRE(q.dtype() == DType::kF16);
  CHECK(bitwise_equal(p, matmul(a.to(DType::kF16), m.to(DType::kF16))));
  {
    AutocastGuard off(DType::kF16, false);
    test::require_close(p, matmul(a, m), test::tolerance_for(DType::kF16));
    test::require_close(q, conv2d(img, k, Tensor(), 1, 1), {5e-3, 5e-3});
  }
}

TEST_CASE("a step's parameter casts made up front serve the ops as their own casts would",
          "[cpu][autocast]") {
  const Tensor x = f32_data({5, 8}, 41);
  const Tensor w = f32_data({6, 8}, 42).set_requires_grad();
  const Tensor b = f32_data({6}, 43).set_requires_grad();
  const Tensor k = f32_data({3, 2, 3, 3}, 44).set_requires_grad();
  const Tensor img = f32_data({1, 2, 6, 6}, 45);
  const Tensor c = f32_data({5, 6}, 46), d = f32_data({1, 3, 6, 6}, 47);
  // Two linear layers sharing w (two uses: two cast nodes, as without), a convolution, and w
  // read through a view (not one of the casts: cast by the op).
  const auto loss_of = [&](bool up_front, int64_t* served) {
    Tensor loss;
    AutocastGuard autocast(DType::kF16);
    std::optional<AutocastParamCasts> casts;
    if (up_front) casts.emplace(TensorList{w, b, k, x.to(DType::kBF16)});
    const Tensor y = add(linear(x, w, b), linear(x, w));
    const Tensor q = conv2d(img, k, Tensor(), 1, 1);
    const Tensor t = matmul(x, w.transpose(0, 1));
    loss = add(add(sum(mul(y.to(DType::kF32), c)), sum(mul(q.to(DType::kF32), d))),
               sum(t.to(DType::kF32)));
    if (casts) {
      CHECK(casts->dtype() == DType::kF16);
      CHECK(casts->size() == 3);  // the f32 tensors only
      *served = casts->uses();
    }
    return loss;
  };
  int64_t served = 0;
  const Tensor with = loss_of(true, &served);
  CHECK(served == 4);  // w twice, b, k; not the view of w
  const TensorList grads = [&] {
    with.backward();
    TensorList g = {w.grad(), b.grad(), k.grad()};
    for (const Tensor& p : {w, b, k}) p.zero_grad();
    return g;
  }();
  const Tensor without = loss_of(false, nullptr);
  CHECK(bitwise_equal(with, without));
  without.backward();
  CHECK(bitwise_equal(grads[0], w.grad()));
  CHECK(bitwise_equal(grads[1], b.grad()));
  CHECK(bitwise_equal(grads[2], k.grad()));
  REQUIRE(w.grad().dtype() == DType::kF32);

  // Outside the scope, and with autocast in another dtype, the ops cast for themselves.
  {
    AutocastGuard autocast(DType::kBF16);
    std::optional<AutocastParamCasts> casts(std::in_place, TensorList{w});
    {
      AutocastGuard other(DType::kF16);
      CHECK(linear(x, w).dtype() == DType::kF16);
    }
    {
      AutocastParamCasts inner(TensorList{b});  // nested: the inner scope is consulted
      linear(x, w, b);
      CHECK(inner.uses() == 1);
    }
    linear(x, w);
    CHECK(casts->uses() == 1);
    casts.reset();
    CHECK(linear(x, w).dtype() == DType::kBF16);
  }
  CHECK_THROWS_WITH(AutocastParamCasts(TensorList{w}), Contains("autocast is off"));
}

TEST_CASE("linear's f32 weight gradients under autocast: the f32 sums of the 16-bit products",
          "[cpu][autocast]") {
  struct Restore {
    ~Restore() { set_linear_f32_grads(false); }
  } restore;
  const Tensor x = f32_data({2, 5, 8}, 51).set_requires_grad();
  const Tensor w = f32_data({6, 8}, 52).set_requires_grad();
  const Tensor b = f32_data({6}, 53).set_requires_grad();
  const Tensor c = f32_data({2, 5, 6}, 54, -4.0, 4.0);
  struct Result {
    Tensor y, gx, gw, gb;
    std::string w_edge;  // the node the linear node hands w's gradient to
  };
  const auto run = [&](bool f32, bool up_front) {
    set_linear_f32_grads(f32);
    for (const Tensor& p : {x, w, b}) p.zero_grad();
    Result r;
    {
      AutocastGuard autocast(DType::kBF16);
      std::optional<AutocastParamCasts> casts;
      if (up_front) casts.emplace(TensorList{w, b});
      r.y = linear(x, w, b);
      if (casts) CHECK(casts->uses() == 2);
    }
    r.w_edge = r.y.grad_fn()->next_edges[1].fn->name();
    sum(mul(r.y.to(DType::kF32), c)).backward();
    r.gx = x.grad();
    r.gw = w.grad();
    r.gb = b.grad();
    return r;
  };
  const Result cast = run(false, false), f32 = run(true, false), cached = run(true, true);
  CHECK(cast.w_edge == "to");
  CHECK(f32.w_edge == "AccumulateGrad");  // no cast node between the weight and the linear
  // The forward pass and the input's gradient: the same bits.
  CHECK(bitwise_equal(f32.y, cast.y));
  CHECK(bitwise_equal(f32.gx, cast.gx));
  // The weight's and bias's: the f32 product and column sums of the bf16 gradient (c rounded)
  // and input, not rounded; the autocast path's are those rounded to bf16 once.
  const Tensor g16 = c.to(DType::kBF16).to(DType::kF32).reshape({10, 6});
  const Tensor x16 = x.detach().to(DType::kBF16).to(DType::kF32).reshape({10, 8});
  CHECK(bitwise_equal(f32.gw, matmul(g16.transpose(0, 1), x16)));
  CHECK(bitwise_equal(f32.gb, sum(g16, {0})));
  CHECK(bitwise_equal(cast.gw, f32.gw.to(DType::kBF16).to(DType::kF32)));
  CHECK(bitwise_equal(cast.gb, f32.gb.to(DType::kBF16).to(DType::kF32)));
  CHECK_FALSE(bitwise_equal(cast.gw, f32.gw));
  // Closer to the exact gradient of the rounded operands (f64).
  const Tensor exact = matmul(g16.to(DType::kF64).transpose(0, 1), x16.to(DType::kF64));
  const auto error = [&](const Tensor& t) {
    return amax(abs(sub(t.to(DType::kF64), exact))).item();
  };
  CHECK(error(f32.gw) < error(cast.gw));
  // The step's casts serve it with the same bits.
  CHECK(bitwise_equal(cached.y, f32.y));
  CHECK(bitwise_equal(cached.gw, f32.gw));
  CHECK(bitwise_equal(cached.gb, f32.gb));

  // No bias, an input that needs no gradient, a weight that needs none: the same values as the
  // autocast path; an f64 input, or autocast off, takes the ordinary path.
  set_linear_f32_grads(true);
  const Tensor xd = x.detach(), wd = w.detach();
  AutocastGuard autocast(DType::kBF16);
  const Tensor y = linear(xd, w);
  CHECK(y.grad_fn()->next_edges[1].fn->name() == "AccumulateGrad");
  CHECK(bitwise_equal(linear(xd, wd, b), linear(xd.to(DType::kBF16), wd.to(DType::kBF16),
                                                b.detach().to(DType::kBF16))));
  CHECK(linear(x.detach().to(DType::kF64), w.detach().to(DType::kF64)).dtype() == DType::kF64);
  AutocastGuard off(DType::kBF16, false);
  CHECK(linear(xd, w).dtype() == DType::kF32);
}

TEST_CASE("autocast's cast keeps a token grid channels-last, so its convolution runs so",
          "[cpu][autocast]") {
  // MetaFormer's sepconv: an f32 activation [B, H*W, C] seen as [B, C, H, W] through a permute,
  // then a depthwise convolution under bf16 autocast.
  const int64_t b = 2, h = 5, w = 6, c = 8;
  const Tensor tokens = f32_data({b, h * w, c}, 31).set_requires_grad();
  const Tensor k = f32_data({c, 1, 3, 3}, 32).set_requires_grad();
  const Tensor grid = tokens.view({b, h, w, c}).permute({0, 3, 1, 2});
  REQUIRE(grid.is_channels_last());
  REQUIRE_FALSE(grid.is_contiguous());
  // The cast alone: the same layout and values, rounded once.
  const Tensor cast = grid.to(DType::kBF16);
  CHECK(cast.is_channels_last());
  CHECK(cast.strides() == grid.strides());
  CHECK(bitwise_equal(cast.contiguous(), grid.contiguous().to(DType::kBF16)));
  // A contiguous tensor, or a copy to another layout's needs, stays contiguous.
  CHECK(grid.contiguous().to(DType::kBF16).is_contiguous());
  CHECK(tokens.to(DType::kBF16).is_contiguous());
  Tensor y;
  {
    AutocastGuard autocast(DType::kBF16);
    y = conv2d(grid, k, Tensor(), 1, 1, 1, c);
  }
  REQUIRE(y.dtype() == DType::kBF16);
  CHECK(y.is_channels_last());  // the convolution ran channels-last
  // Back to tokens: a view, no copy.
  const Tensor back = y.permute({0, 2, 3, 1}).reshape({b, h * w, c});
  CHECK(back.same_storage(y));
  // Values and gradients: the NCHW convolution of the same bf16-rounded operands.
  const Tensor ref = conv2d(grid.detach().contiguous().to(DType::kBF16),
                            k.detach().to(DType::kBF16), Tensor(), 1, 1, 1, c);
  CHECK(bitwise_equal(y.contiguous(), ref));
  const Tensor weights = f32_data({b, h * w, c}, 33);
  sum(mul(back.to(DType::kF32), weights)).backward();
  REQUIRE(tokens.grad().dtype() == DType::kF32);
  REQUIRE(tokens.grad().is_contiguous());
  const Tensor t2 = tokens.detach().set_requires_grad();
  const Tensor k2 = k.detach().set_requires_grad();
  sum(mul(conv2d(t2.view({b, h, w, c}).permute({0, 3, 1, 2}).contiguous().to(DType::kBF16),
                 k2.to(DType::kBF16), Tensor(), 1, 1, 1, c)
              .permute({0, 2, 3, 1})
              .reshape({b, h * w, c})
              .to(DType::kF32),
          weights))
      .backward();
  CHECK(bitwise_equal(tokens.grad(), t2.grad()));
  CHECK(bitwise_equal(k.grad(), k2.grad()));
}

TEST_CASE("precision-sensitive ops run in f32 under autocast", "[cpu][autocast]") {
  const Tensor x16 = f32_data({3, 7}, 12, -3.0, 3.0).to(DType::kBF16);
  const Tensor x32 = x16.to(DType::kF32);  // the same values
  const Tensor gamma = f32_data({7}, 13, 0.5, 1.5), beta = f32_data({7}, 14);
  const Tensor labels = Tensor::from_vector<int64_t>({0, 6, 3}, {3}, DType::kI64);
  // Without autocast, mixing a bf16 input with f32 parameters is an error.
  REQUIRE_THROWS_AS(layer_norm(x16, gamma, beta, 1e-5), DTypeError);

  AutocastGuard autocast(DType::kBF16);
  const struct {
    const char* what;
    Tensor actual, expected;
  } cases[] = {
      {"softmax", softmax(x16, 0.5), softmax(x32, 0.5)},
      {"log_softmax", log_softmax(x16), log_softmax(x32)},
      {"layer_norm", layer_norm(x16, gamma, beta, 1e-5), layer_norm(x32, gamma, beta, 1e-5)},
      {"cross_entropy", cross_entropy(x16, labels), cross_entropy(x32, labels)},
      {"sum", sum(x16, {1}), sum(x32, {1})},
      {"mean", mean(x16), mean(x32)},
      {"exp", exp(x16), exp(x32)},
      {"pow", pow(x16, 2.0), pow(x32, 2.0)},
  };
  for (const auto& c : cases) {
    INFO(c.what);
    CHECK(c.actual.dtype() == DType::kF32);
    CHECK(bitwise_equal(c.actual, c.expected));
  }
  // Ops without a policy keep their input's dtype.
  CHECK(gelu(x16).dtype() == DType::kBF16);
  CHECK(mul(x16, 2.0).dtype() == DType::kBF16);
  CHECK(amax(x16).dtype() == DType::kBF16);
}

TEST_CASE("element-wise ops promote to the widest input dtype under autocast", "[cpu][autocast]") {
  const Tensor a16 = f32_data({2, 5}, 15).to(DType::kBF16);
  const Tensor h16 = f32_data({2, 5}, 16).to(DType::kF16);
  const Tensor b32 = f32_data({5}, 17);
  // f32 with one 16-bit dtype is read as it is, with or without autocast; other mixes are not.
  CHECK(bitwise_equal(add(a16, b32), add(a16.to(DType::kF32), b32)));
  CHECK_THROWS_WITH(add(a16, h16), Catch::Contains("different dtypes") &&
                                       Catch::Contains("bf16") && Catch::Contains("f16"));
  CHECK_THROWS_AS(add(b32, b32.to(DType::kF64)), DTypeError);

  AutocastGuard autocast(DType::kBF16);
  const Tensor s = add(a16, b32);
  CHECK(s.dtype() == DType::kF32);
  CHECK(bitwise_equal(s, add(a16.to(DType::kF32), b32)));
  // No f32 copy of the bf16 operand first: the add's node takes the two operands as they are.
  const Tensor p16 = a16.detach().set_requires_grad(), p32 = b32.detach().set_requires_grad();
  const Tensor r = add(p16, p32);
  REQUIRE(r.grad_fn());
  CHECK(r.grad_fn()->name() == "add");
  for (const autograd::Edge& e : r.grad_fn()->next_edges) {
    REQUIRE(e.fn);
    CHECK(e.fn->name() == "AccumulateGrad");
  }
  // Every binary op and its gradients agree bit for bit with the cast-first form.
  for (int k = 0; k < 6; ++k) {
    INFO("op " << k);
    const auto f = [k](const Tensor& x, const Tensor& y) {
      switch (k) {
        case 0: return add(x, y);
        case 1: return sub(x, y);
        case 2: return mul(x, y);
        case 3: return div(x, y);
        case 4: return maximum(x, y);
        default: return minimum(x, y);
      }
    };
    const Tensor x16 = a16.detach().set_requires_grad(), y32 = b32.detach().set_requires_grad();
    const Tensor xw = a16.detach().set_requires_grad(), yw = b32.detach().set_requires_grad();
    const Tensor w = f32_data({2, 5}, 18);
    sum(mul(f(x16, y32), w)).backward();
    {
      const AutocastGuard off(DType::kBF16, false);
      sum(mul(f(xw.to(DType::kF32), yw), w)).backward();
    }
    CHECK(bitwise_equal(x16.grad(), xw.grad()));
    CHECK(bitwise_equal(y32.grad(), yw.grad()));
    CHECK(bitwise_equal(f(a16, b32), f(a16.to(DType::kF32), b32)));
  }
  CHECK(mul(a16, h16).dtype() == DType::kF32);   // bf16 with f16: f32, as PyTorch
  CHECK(sub(a16, a16).dtype() == DType::kBF16);  // one dtype: unchanged
  CHECK(cat({a16, b32.unsqueeze(0)}, 0).dtype() == DType::kF32);
  CHECK(where(gt(a16, b32), a16, b32).dtype() == DType::kF32);
  CHECK(gt(a16, b32).dtype() == DType::kU8);

  // The grad of each operand comes back in that operand's dtype.
  const Tensor p = a16.detach().set_requires_grad(), q = b32.detach().set_requires_grad();
  const Tensor out = sum(mul(p, q));
  out.backward();
  REQUIRE(p.grad().dtype() == DType::kBF16);
  REQUIRE(q.grad().dtype() == DType::kF32);
  test::require_close(p.grad(), b32.expand({2, 5}), test::tolerance_for(DType::kBF16));
  test::require_close(q.grad(), sum(a16.to(DType::kF32), {0}), test::tolerance_for(DType::kF32));
}

TEST_CASE("autocast leaves f64 alone, so gradient checks are unaffected", "[cpu][autocast]") {
  const Tensor x = test::uniform({3, 4}, 18), w = test::uniform({2, 4}, 19);
  AutocastGuard autocast(DType::kBF16);
  CHECK(linear(x, w).dtype() == DType::kF64);
  CHECK(softmax(x).dtype() == DType::kF64);
  CHECK(add(x, x).dtype() == DType::kF64);
  test::check_gradients([](const TensorList& in) { return softmax(linear(in[0], in[1])); },
                        {x.detach().set_requires_grad(), w.detach().set_requires_grad()});
}

TEST_CASE("backward inside an autocast scope gives the same grads as outside", "[cpu][autocast]") {
  const Tensor x = f32_data({4, 8}, 20);
  const Tensor w = f32_data({8, 8}, 21).set_requires_grad();
  const Tensor b = f32_data({8}, 27).set_requires_grad();
  // The bias grad is a sum over rows of a bf16 grad: in bf16 as the forward chose, not in f32.
  auto grads = [&](bool backward_inside) {
    w.zero_grad();
    b.zero_grad();
    AutocastGuard autocast(DType::kBF16);
    const Tensor loss = mean(softmax(linear(gelu(linear(x, w, b)), w, b)));
    if (backward_inside) {
      loss.backward();
    } else {
      AutocastGuard off(DType::kBF16, false);
      loss.backward();
    }
    return TensorList{w.grad(), b.grad()};
  };
  const TensorList outside = grads(false), inside = grads(true);
  REQUIRE(inside[0].dtype() == DType::kF32);
  CHECK(bitwise_equal(inside[0], outside[0]));
  CHECK(bitwise_equal(inside[1], outside[1]));
}

TEST_CASE("CPU 16-bit kernels equal the f32 kernel rounded once", "[cpu][autocast]") {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    const Tensor a = f32_data({3, 4, 6}, 22).to(dt), b = f32_data({6, 5}, 23).to(dt);
    const Tensor img = f32_data({2, 4, 5, 5}, 24).to(dt), k = f32_data({4, 1, 3, 3}, 25).to(dt);
    const Tensor bias = f32_data({4}, 26).to(dt);
    auto wide = [](const Tensor& t) { return t.to(DType::kF32); };
    CHECK(bitwise_equal(matmul(a, b), matmul(wide(a), wide(b)).to(dt)));
    CHECK(bitwise_equal(matmul(a.transpose(1, 2), a),
                        matmul(wide(a).transpose(1, 2), wide(a)).to(dt)));
    CHECK(bitwise_equal(conv2d(img, k, bias, 1, 1, 1, 4),
                        conv2d(wide(img), wide(k), wide(bias), 1, 1, 1, 4).to(dt)));
    CHECK(bitwise_equal(gelu(a), gelu(wide(a)).to(dt)));
    CHECK(bitwise_equal(add(a, b.narrow(1, 0, 1).reshape({6})),
                        add(wide(a), wide(b).narrow(1, 0, 1).reshape({6})).to(dt)));
    CHECK(bitwise_equal(amax(a, {2}), amax(wide(a), {2}).to(dt)));
    CHECK(bitwise_equal(argmax(a, 1), argmax(wide(a), 1)));
    // Gradients through 16-bit kernels (conv input/weight, pointwise backward, reductions).
    const Tensor x = img.detach().set_requires_grad(), kk = k.detach().set_requires_grad();
    sum(gelu(conv2d(x, kk, Tensor(), 1, 1, 1, 4)).to(DType::kF32)).backward();
    const Tensor xr = wide(img).set_requires_grad(), kr = wide(k).set_requires_grad();
    sum(gelu(conv2d(xr, kr, Tensor(), 1, 1, 1, 4))).backward();
    REQUIRE(x.grad().dtype() == dt);
    test::require_close(x.grad(), xr.grad(), test::tolerance_for(dt), "conv input grad");
    test::require_close(kk.grad(), kr.grad(), {0.1, 2e-2}, "conv weight grad (sums 50 products)");
  }
}

TEST_CASE("a tiny CSKA-ViT under bf16 autocast matches f32 on the CPU", "[cpu][autocast]") {
  check_tiny_vit_bf16(Device::cpu());
}

TEST_CASE("a tiny CSKA-ViT under bf16 autocast on CUDA matches f32 on the CPU",
          "[cuda][autocast]") {
  if (!test::cuda_available_or_skip()) return;
  check_tiny_vit_bf16(Device::cuda(0));
}
