// Module bookkeeping (names, counts, state dicts, modes, moves), initialisers, basic layers and
// MAC counting.
#include <catch2/catch.hpp>
#include <cmath>

#include "nn/layers.h"
#include "nn/summary.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::nn;

namespace {

class Block : public Module {
 public:
  Block() {
    norm = register_module("norm", std::make_shared<LayerNorm>(4));
    fc = register_module("fc", std::make_shared<Linear>(4, 3));
    mask = register_parameter("mask", Tensor::ones({2, 2}), /*trainable=*/false);
    bn = register_module("bn", std::make_shared<BatchNorm2d>(3));
  }
  Tensor forward(const Tensor& x) override { return (*fc)((*norm)(x)); }
  std::string type_name() const override { return "Block"; }
  std::shared_ptr<LayerNorm> norm;
  std::shared_ptr<Linear> fc;
  std::shared_ptr<BatchNorm2d> bn;
  Tensor mask;
};

}  // namespace

TEST_CASE("modules name parameters hierarchically and count them", "[cpu]") {
  Block b;
  std::vector<std::string> names;
  for (const auto& [n, t] : b.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"mask", "norm.weight", "norm.bias", "fc.weight",
                                          "fc.bias", "bn.weight", "bn.bias"});
  CHECK(b.num_parameters(true) == 4 + 4 + 12 + 3 + 3 + 3);
  CHECK(b.num_parameters(false) == b.num_parameters(true) + 4);  // the non-trainable mask
  const auto sd = b.state_dict();
  CHECK(sd.count("bn.running_var") == 1);
  CHECK(sd.count("bn.num_batches_tracked") == 1);
  CHECK(sd.size() == 7 + 3);
}

TEST_CASE("load_state_dict copies values and reports every problem at once", "[cpu]") {
  Block a, b;
  b.load_state_dict(a.state_dict());
  CHECK(b.fc->weight.to_vector<float>() == a.fc->weight.to_vector<float>());
  auto sd = a.state_dict();
  sd.erase("fc.bias");
  sd.erase("norm.weight");
  sd["extra.weight"] = Tensor::zeros({1});
  sd["fc.weight"] = Tensor::zeros({3, 5});
  try {
    b.load_state_dict(sd);
    FAIL("expected an error");
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("fc.weight (expected [3, 4], got [3, 5])"));
    CHECK_THAT(msg, Catch::Contains("missing (2)"));
    CHECK_THAT(msg, Catch::Contains("fc.bias"));
    CHECK_THAT(msg, Catch::Contains("norm.weight"));
    CHECK_THAT(msg, Catch::Contains("unexpected (1)"));
    CHECK_THAT(msg, Catch::Contains("extra.weight"));
  }
  sd.erase("fc.weight");
  CHECK_NOTHROW(b.load_state_dict(sd, /*strict=*/false));
}

TEST_CASE("train/eval reaches every child, moves keep handles valid", "[cpu]") {
  Block b;
  b.eval();
  CHECK_FALSE(b.bn->is_training());
  b.train();
  CHECK(b.fc->is_training());
  Tensor w = b.fc->weight;
  b.to(DType::kF64);
  CHECK(w.dtype() == DType::kF64);  // the same handle sees the move
  CHECK(b.fc->weight.requires_grad());
  CHECK(b.bn->num_batches_tracked.dtype() == DType::kI64);
}

TEST_CASE("initialisers follow PyTorch and timm", "[cpu]") {
  manual_seed(1);
  const std::vector<float> u = init_torch_default({200, 100}, 100).to_vector<float>();
  double lo = 1, hi = -1;
  for (float v : u) {
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
  }
  CHECK(lo >= -0.1);
  CHECK(hi <= 0.1);
  CHECK(hi > 0.099);
  const std::vector<float> t = init_trunc_normal({100000}, 0.02).to_vector<float>();
  double m2 = 0;
  for (float v : t) m2 += static_cast<double>(v) * v;
  CHECK(std::sqrt(m2 / t.size()) == Approx(0.02).epsilon(0.02));
  manual_seed(1);
  CHECK(init_torch_default({200, 100}, 100).to_vector<float>() == u);  // reproducible from a seed
}

TEST_CASE("basic layers compute what their ops compute", "[cpu]") {
  Linear fc(3, 2);
  const Tensor x = ska::test::uniform({4, 3}, 1, -1, 1, DType::kF32);
  ska::test::require_close(fc(x), linear(x, fc.weight, fc.bias), ska::test::tolerance_for(DType::kF32));
  Conv2d conv(2, 4, 3, {1, 1, 1, 2, true, Init::kTruncNormal});
  CHECK(conv.weight.shape() == Shape{4, 1, 3, 3});
  CHECK(conv.bias.to_vector<float>() == std::vector<float>(4, 0.0f));
  Activation star("starrelu");
  CHECK(star.num_parameters() == 2);
  CHECK(star(Tensor::full({2}, 2.0)).to_vector<float>() == std::vector<float>{4.0f, 4.0f});
  CHECK_THROWS_AS(Activation("gleu"), ValueError);
  Mlp mlp(8, {32, 0, "gelu", false});
  CHECK(mlp.num_parameters() == 8 * 32 * 2);
  CHECK(mlp(Tensor::zeros({2, 5, 8})).shape() == Shape{2, 5, 8});
}

TEST_CASE("summary records each module call with its output shape and MACs", "[cpu]") {
  Block b;
  NoGradGuard no_grad;
  SummaryRecorder rec(b);
  b(Tensor::zeros({2, 5, 4}));
  REQUIRE(rec.rows().size() == 3);
  CHECK(rec.rows()[0].name == "");
  CHECK(rec.rows()[0].macs == 2 * 5 * 4 * 3);
  CHECK(rec.rows()[2].name == "fc");
  CHECK(rec.rows()[2].output == Shape{2, 5, 3});
  CHECK(rec.rows()[2].depth == 1);
  MacCounter conv_macs;
  conv2d(Tensor::zeros({1, 2, 8, 8}), Tensor::zeros({4, 1, 3, 3}), Tensor(), 2, 1, 1, 2);
  CHECK(conv_macs.total() == 4 * 4 * 4 * 1 * 3 * 3);
}
