// Golden tests: small blocks built from our ops compared with PyTorch's float64 results (outputs
// and gradients) from tests/fixtures/golden, written by scripts/make_golden_fixtures.py.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

#include "io/safetensors.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::Tolerance;
using ska::test::tolerance_for;

namespace {

// Sizes and constants shared with scripts/make_golden_fixtures.py.
constexpr int64_t kHeads = 2;
constexpr double kLayerNormEps = 1e-5;
constexpr double kChannelsLayerNormEps = 1e-6;
constexpr double kLabelSmoothing = 0.1;
// bf16 keeps 8 bits of mantissa: element-wise bounds are too tight for a chain of ops, so bf16
// results are compared by their normalised mean squared error against the f64 reference.
constexpr double kBF16MaxNmse = 1e-3;

// Tensors of a block by short name ("x", "ln.weight", "target").
using Params = TensorMap;
using Block = std::function<Tensor(const Params&)>;

Tensor mlp_block(const Params& p) {
  const Tensor& x = p.at("x");
  Tensor h = layer_norm(x, p.at("ln.weight"), p.at("ln.bias"), kLayerNormEps);
  h = gelu(linear(h, p.at("fc1.weight"), p.at("fc1.bias")));
  return add(x, linear(h, p.at("fc2.weight"), p.at("fc2.bias")));
}

// x + proj(softmax(q k^T d^-0.5) v), with q, k, v from one qkv Linear on layer_norm(x).
Tensor attention_block(const Params& p) {
  const Tensor& x = p.at("x");
  const int64_t batch = x.size(0), tokens = x.size(1), width = x.size(2);
  const int64_t head_width = width / kHeads;
  const Tensor h = layer_norm(x, p.at("ln.weight"), p.at("ln.bias"), kLayerNormEps);
  const Tensor qkv = linear(h, p.at("qkv.weight"), p.at("qkv.bias"))
                         .reshape({batch, tokens, 3, kHeads, head_width})
                         .permute({2, 0, 3, 1, 4});  // [3, batch, heads, tokens, head_width]
  const Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
  const Tensor attn = softmax(matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(head_width));
  const Tensor o = matmul(attn, v).transpose(1, 2).reshape({batch, tokens, width});
  return add(x, linear(o, p.at("proj.weight"), p.at("proj.bias")));
}

// h = conv3x3 s2 p1 (x); gelu(layer_norm_channels_first(h)) + depthwise_conv3x3 p1 (h).
Tensor conv_block(const Params& p) {
  const Tensor h = conv2d(p.at("x"), p.at("conv.weight"), p.at("conv.bias"), 2, 1);
  const Tensor main =
      gelu(layer_norm_channels_first(h, p.at("ln.weight"), p.at("ln.bias"), kChannelsLayerNormEps));
  const Tensor branch = conv2d(h, p.at("dw.weight"), p.at("dw.bias"), 1, 1, 1, h.size(1));
  return add(main, branch);
}

Tensor cross_entropy_head(const Params& p) {
  const Tensor logits = linear(p.at("x"), p.at("head.weight"), p.at("head.bias"));
  return cross_entropy(logits, p.at("target"), kLabelSmoothing);
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

TensorMap load_fixture(const std::string& name) {
  return load_safetensors(std::string(SKA_TEST_FIXTURES) + "/golden/" + name + ".safetensors");
}

// The block's tensors on `device`: input.* and param.* converted to `dtype` as leaves that
// require grad, const.* (class targets) as they are.
Params make_leaves(const TensorMap& fixture, DType dtype, Device device) {
  Params p;
  for (const auto& [key, tensor] : fixture) {
    for (const char* prefix : {"input.", "param."}) {
      if (starts_with(key, prefix)) {
        p[key.substr(std::string(prefix).size())] =
            tensor.to(device, dtype).detach().set_requires_grad(true);
      }
    }
    if (starts_with(key, "const.")) p[key.substr(6)] = tensor.to(device);
  }
  return p;
}

// actual (any dtype/device) against the f64 reference: element-wise for f64/f32, NMSE for bf16.
void compare(const Tensor& actual, const Tensor& expected, DType dtype, const std::string& what) {
  INFO(what << " (" << dtype_name(dtype) << ")");
  if (dtype == DType::kBF16) {
    const double error = test::nmse(actual, expected);
    INFO("nmse " << error);
    CHECK(error < kBF16MaxNmse);
  } else {
    test::require_close(actual, expected, tolerance_for(dtype), what);
  }
}

// Runs `block` on the fixture's tensors in `dtype` on `device`, back-propagates
// sum(output * grad_weight) and compares the output and every leaf's gradient with the fixture.
void check_golden(const std::string& fixture_name, const Block& block, DType dtype, Device device) {
  INFO("fixture " << fixture_name << " on " << device.str());
  const TensorMap fixture = load_fixture(fixture_name);
  const Params p = make_leaves(fixture, dtype, device);
  const Tensor out = block(p);
  const Tensor grad_weight = fixture.at("grad_weight").to(device, out.dtype());
  sum(mul(out, grad_weight)).backward();

  compare(out, fixture.at("output"), dtype, "output");
  int checked = 0;
  for (const auto& [key, expected] : fixture) {
    if (!starts_with(key, "grad.")) continue;
    const Tensor& leaf = p.at(key.substr(5));
    REQUIRE(leaf.grad().defined());
    compare(leaf.grad(), expected, dtype, key);
    ++checked;
  }
  CHECK(checked >= 3);  // the input and at least a weight and a bias
}

struct GoldenCase {
  const char* fixture;
  Block block;
};

const GoldenCase kGoldenCases[] = {
    {"mlp_block", mlp_block},
    {"attention_block", attention_block},
    {"conv_block", conv_block},
    {"cross_entropy_head", cross_entropy_head},
};

void check_all_golden(DType dtype, Device device) {
  for (const GoldenCase& c : kGoldenCases) {
    SECTION(c.fixture) { check_golden(c.fixture, c.block, dtype, device); }
  }
}

}  // namespace

TEST_CASE("golden blocks match PyTorch in f64", "[cpu][golden]") {
  check_all_golden(DType::kF64, Device::cpu());
}

TEST_CASE("golden blocks match PyTorch in f32", "[cpu][golden]") {
  check_all_golden(DType::kF32, Device::cpu());
}

TEST_CASE("golden blocks match PyTorch on CUDA in f32", "[cuda][golden]") {
  if (!test::cuda_available_or_skip()) return;
  check_all_golden(DType::kF32, Device::cuda());
}

TEST_CASE("golden blocks match PyTorch on CUDA in bf16", "[cuda][golden]") {
  if (!test::cuda_available_or_skip()) return;
  check_all_golden(DType::kBF16, Device::cuda());
}
