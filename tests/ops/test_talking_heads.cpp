// talking_heads_softmax (CaiT's mix, softmax, mix in one op) against the ops it replaces
// (nn::mix_heads and softmax): values and every gradient in f64 to rounding, in f32 and bf16 within
// the dtype's tolerances, finite differences, the errors; CUDA against the CPU twin; and CaiT's
// fixtures with the fused weights against the unfused ones.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/mixers/attention_core.h"
#include "ops/autocast.h"
#include "ops/mac_counter.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::uniform;

namespace {

struct Leaves {
  Tensor logits, pre, post;
};
Leaves leaves(const Shape& shape, DType dt, Device device, uint64_t seed = 3) {
  const int64_t h = shape[1];
  const auto leaf = [&](const Shape& s, uint64_t k, double lo, double hi, DType d) {
    return uniform(s, seed * 10 + k, lo, hi).to(d).to(device).set_requires_grad();
  };
  const DType wd = dt == DType::kF64 ? DType::kF64 : DType::kF32;
  return {leaf(shape, 1, -3, 3, dt), leaf({h, h}, 2, -1, 1, wd), leaf({h, h}, 3, -1, 1, wd)};
}

// The weights and the three gradients of sum(weights * w), fused or through the ops.
std::vector<Tensor> run(const Leaves& l, double scale, bool fused) {
  Tensor weights;
  if (fused) {
    weights = talking_heads_softmax(l.logits, scale, l.pre, l.post);
  } else {
    // In the math dtype throughout (f64 for f64, f32 otherwise), rounded at the end.
    const DType math = l.logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
    const Tensor mixed = nn::mix_heads(mul(l.logits.to(math), scale), l.pre.to(math));
    weights = nn::mix_heads(softmax(mixed), l.post.to(math)).to(l.logits.dtype());
  }
  const Tensor w = uniform(weights.shape(), 9, -1, 1).to(weights.dtype()).to(weights.device());
  sum(mul(weights, w)).backward();
  return {weights.detach(), l.logits.grad(), l.pre.grad(), l.post.grad()};
}

const char* const kNames[] = {"weights", "grad logits", "grad w_pre", "grad w_post"};

}  // namespace

TEST_CASE("talking_heads_softmax equals mix, softmax, mix: values and gradients", "[cpu]") {
  // Patch attention (queries = keys), class attention (one query), one head, odd key counts.
  for (const Shape& shape :
       {Shape{2, 4, 9, 9}, Shape{3, 8, 1, 65}, Shape{2, 1, 3, 5}, Shape{1, 3, 7, 33}}) {
    for (const double scale : {1.0, 0.125}) {
      INFO(shape_str(shape) << ", scale " << scale);
      const std::vector<Tensor> f = run(leaves(shape, DType::kF64, Device::cpu()), scale, true);
      const std::vector<Tensor> u = run(leaves(shape, DType::kF64, Device::cpu()), scale, false);
      for (size_t i = 0; i < f.size(); ++i) {
        INFO(kNames[i]);
        CHECK(f[i].dtype() == DType::kF64);
        ska::test::require_close(f[i], u[i], {1e-12, 1e-12}, kNames[i]);
      }
      // f32, and bf16 logits with f32 mixes (under autocast the logits come from a bf16 matmul).
      for (const DType dt : {DType::kF32, DType::kBF16}) {
        INFO(dtype_name(dt));
        const std::vector<Tensor> fl = run(leaves(shape, dt, Device::cpu()), scale, true);
        CHECK(fl[0].dtype() == dt);
        CHECK(fl[1].dtype() == dt);
        CHECK(fl[2].dtype() == DType::kF32);
        const ska::test::Tolerance tol = ska::test::tolerance_for(dt);
        for (size_t i = 0; i < fl.size(); ++i) {
          INFO(kNames[i]);
          ska::test::require_close(fl[i], f[i], tol, kNames[i]);
        }
      }
    }
  }
}

TEST_CASE("talking_heads_softmax gradients match finite differences", "[cpu]") {
  const Leaves l = leaves({2, 3, 4, 5}, DType::kF64, Device::cpu(), 5);
  ska::test::check_gradients(
      [](const TensorList& in) { return talking_heads_softmax(in[0], 0.7, in[1], in[2]); },
      {l.logits, l.pre, l.post});
}

TEST_CASE("talking_heads_softmax counts its mixes as matmuls and names bad operands", "[cpu]") {
  const Leaves l = leaves({2, 4, 3, 5}, DType::kF32, Device::cpu());
  {
    MacCounter fused;
    talking_heads_softmax(l.logits, 1.0, l.pre, l.post);
    MacCounter plain;
    nn::mix_heads(nn::mix_heads(l.logits, l.pre), l.post);
    CHECK(fused.total() == 2 * 2 * 4 * 4 * 3 * 5 + plain.total());  // the outer counter nests
    CHECK(plain.total() == 2 * 2 * 4 * 4 * 3 * 5);
  }
  CHECK_THROWS_AS(talking_heads_softmax(l.logits.reshape({8, 3, 5}), 1.0, l.pre, l.post),
                  ShapeError);
  CHECK_THROWS_WITH(talking_heads_softmax(l.logits, 1.0, l.pre.narrow(0, 0, 3), l.post),
                    Catch::Contains("head mixes") && Catch::Contains("[4, 4]"));
  const Tensor lse = Tensor::empty({2, 4, 2});
  CHECK_THROWS_WITH(
      cpu::talking_heads_softmax_forward(l.logits.detach(), 1.0, l.pre.detach(), l.post.detach(),
                                         Tensor::empty({2, 4, 3, 5}), lse),
      Catch::Contains("lse must be"));
  CHECK(talking_heads_softmax_fits(l.logits));
  CHECK_FALSE(talking_heads_softmax_fits(l.logits.reshape({8, 3, 5})));
}

TEST_CASE("talking_heads_softmax on CUDA: the CPU twin's values and gradients", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // CaiT-S's patch and class attention on 32x32 images (8 heads, 64 and 65 keys), fewer heads
  // (padded to 2 and 4), 128 keys, an empty batch.
  for (const Shape& shape : {Shape{3, 8, 64, 64}, Shape{5, 8, 1, 65}, Shape{2, 3, 17, 33},
                             Shape{2, 2, 5, 128}, Shape{1, 1, 4, 7}, Shape{0, 8, 4, 4}}) {
    for (const DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO(shape_str(shape) << ", " << dtype_name(dt));
      const std::vector<Tensor> c = run(leaves(shape, dt, Device::cpu()), 0.125, true);
      const std::vector<Tensor> g = run(leaves(shape, dt, Device::cuda(0)), 0.125, true);
      const ska::test::Tolerance tol = ska::test::tolerance_for(dt);
      for (size_t i = 0; i < c.size(); ++i) {
        INFO(kNames[i]);
        ska::test::require_close(g[i].to(Device::cpu()), c[i], tol, kNames[i]);
      }
      // The same bits on a second run (no atomics).
      const std::vector<Tensor> again = run(leaves(shape, dt, Device::cuda(0)), 0.125, true);
      for (size_t i = 0; i < c.size(); ++i) CHECK(ska::test::bitwise_equal(again[i], g[i]));
    }
  }
  const Leaves wide = leaves({1, 9, 2, 4}, DType::kF32, Device::cuda(0));
  CHECK_FALSE(talking_heads_softmax_fits(wide.logits));
  CHECK_THROWS_AS(talking_heads_softmax(wide.logits, 1.0, wide.pre, wide.post), ShapeError);
}
