// Tests of the `cvt` family: parameter counts of the CIFAR configs (reference table), golden logits and
// gradients against scripts/golden_models/cvt.py, conv-attention gradient checks, CUDA parity.
#include <catch2/catch.hpp>

#include "models/cvt.h"
#include "models/swin_cvt_golden.h"

using namespace ska;
using namespace ska::test;

TEST_CASE("cvt configs reproduce the reference parameter counts", "[cpu][slow][models][cvt]") {
  // 100 classes: + 90 * (width + 1); one input channel: - 2 * 7 * 7 * 64 in the first embedding.
  require_param_count("cvt_13", 19616330, 19616330 + 90 * 385 - 6272);
  require_param_count("ska_cvt_13", 19694000, 19694000 + 90 * 403 - 6272);
  require_param_count("cska_cvt_13", 18074030, 18074030 + 90 * 385 - 6272);
}

TEST_CASE("cvt models match the PyTorch reference", "[cpu][models][cvt][golden]") {
  for (const char* name : {"cvt_mhsa", "cvt_ska", "cvt_cska", "cvt_cska_static"})
    require_golden_model(name);
}

TEST_CASE("conv attention gradients", "[cpu][models][cvt]") {
  for (const char* kind : {"mhsa", "ska", "cska"}) {
    for (bool cls : {false, true}) {
      for (const char* cls_key : {"query", "static"}) {
        if (std::string(cls_key) == "static" && (!cls || std::string(kind) != "cska")) continue;
        INFO(kind << (cls ? " with cls, cls_key " : " without cls") << cls_key);
        models::ConvAttentionOptions o;
        o.kind = nn::attention_kind(kind);
        o.dim = 4;
        o.heads = 2;
        o.grid_h = 3;
        o.grid_w = 4;
        o.cls_token = cls;
        o.cls_key = cls_key;
        auto attn = std::make_shared<models::ConvAttention>(o);
        attn->to(DType::kF64);
        attn->eval();  // BatchNorm on running statistics: a pure function of its input
        TensorList inputs = {uniform({2, 12 + (cls ? 1 : 0), 4}, 11).set_requires_grad()};
        for (const auto& [name, p] : attn->named_parameters(true))
          if (name.find(".bn.") == std::string::npos) inputs.push_back(p);
        check_gradients([&](const TensorList& in) { return (*attn)(in[0]); }, inputs);
      }
    }
  }
}

TEST_CASE("cvt conv attention has one logit per key", "[cpu][models][cvt]") {
  models::ConvAttentionOptions o;
  o.kind = nn::AttentionKind::kCska;
  o.dim = 6;
  o.heads = 3;
  o.grid_h = o.grid_w = 4;
  o.cls_token = true;
  models::ConvAttention attn(o);
  CHECK(attn.grid_keys() == 4);  // the stride-2 grid of a 4x4 grid
  CHECK(attn(uniform({2, 17, 6}, 3, -1, 1, DType::kF32)).shape() == Shape{2, 17, 6});
}

TEST_CASE("cvt models on CUDA match the CPU", "[cuda][models][cvt]") {
  for (const char* name : {"cvt_mhsa", "cvt_ska", "cvt_cska"}) {
    INFO(name);
    require_model_cuda_parity(name);
  }
}
