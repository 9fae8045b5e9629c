// Attention probes: the recorded weights equal attention computed directly from each mixer's q
// and k (mhsa), static keys (ska) or conv logits (cska); recording changes no number (it takes
// the unfused path, which the fused op matches to f32 precision); the maps
// of one query over the key grid for every attention family of the zoo (ViT, CaiT, Swin windows,
// CvT, MetaFormer stages).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>

#include "io/weight_map_fixtures.h"
#include "models/model.h"
#include "models/metaformer.h"
#include "nn/mixers/attention_core.h"
#include "nn/mixers/attention_probe.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;

namespace {

const test::Tolerance kExact{1e-6, 1e-5};

// A mixer of the MetaFormer flavour (no class token, fixed scale) from `mixer: <yaml>`.
nn::ModulePtr make_mixer(const std::string& yaml, int64_t dim, const models::TokenGrid& grid) {
  Config cfg = Config::parse("mixer: " + yaml);
  const models::MixerArgs args = models::metaformer_mixer_args(dim, grid);
  nn::ModulePtr mixer = models::build_mixer(cfg.root(), "mixer", args);
  cfg.check_unused();
  return mixer;
}

// The weights the one attention call of `mixer(x)` recorded; requires exactly one call and
// that recording left the output unchanged: bit for bit against the unfused path it takes, and
// to f32 precision against the fused op the mixer takes without a recorder.
Tensor recorded_weights(nn::Module& mixer, const Tensor& x) {
  nn::set_fused_attention(false);
  const Tensor unfused = mixer(x);
  nn::set_fused_attention(true);
  const Tensor plain = mixer(x);
  nn::AttentionRecorder recorder;
  const Tensor recorded = mixer(x);
  test::require_close(recorded, unfused, {0, 0}, "output with a recorder");
  test::require_close(recorded, plain, test::tolerance_for(DType::kF32), "fused output");
  REQUIRE(recorder.records().size() == 1);
  return recorder.records()[0].weights;
}

// Every row of weights [..., Nk] sums to 1.
void require_rows_sum_to_one(const Tensor& weights) {
  const Tensor sums = sum(weights, {-1});
  test::require_close(sums, Tensor::ones(sums.shape()), kExact, "row sums");
}

double total_of(const Tensor& t) {
  double total = 0;
  for (float v : t.to(DType::kF32).contiguous().to_vector<float>()) total += v;
  return total;
}

Tensor param(const nn::Module& m, const std::string& name) { return m.state_dict().at(name); }

// [B, N, h*d] -> [B, h, N, d], written out here rather than calling the core's split_heads.
Tensor heads_of(const Tensor& x, int64_t heads) {
  return x.reshape({x.size(0), x.size(1), heads, x.size(2) / heads}).permute({0, 2, 1, 3});
}

constexpr int64_t kHeads = 2, kHeadDim = 4, kDim = 8;
const models::TokenGrid kGrid{3, 3, false};
const double kScale = 1.0 / std::sqrt(static_cast<double>(kHeadDim));

}  // namespace

TEST_CASE("attention probe: recorded mhsa weights are softmax(q k^T / sqrt(d))", "[cpu][nn]") {
  nn::ModulePtr mixer = make_mixer("{type: mhsa, heads: 2, head_dim: 4}", kDim, kGrid);
  mixer->eval();
  const Tensor x = test::uniform({2, 9, kDim}, 3, -1, 1, DType::kF32);
  const Tensor weights = recorded_weights(*mixer, x);
  const Tensor qkv = linear(x, param(*mixer, "qkv.weight"));
  const Tensor q = heads_of(qkv.narrow(2, 0, kDim), kHeads);
  const Tensor k = heads_of(qkv.narrow(2, kDim, kDim), kHeads);
  const Tensor expected = softmax(mul(matmul(q, k.transpose(2, 3)), kScale));
  test::require_close(weights, expected, kExact, "mhsa weights");
  require_rows_sum_to_one(weights);
}

TEST_CASE("attention probe: recorded ska weights are the static-key logits softmaxed",
          "[cpu][nn]") {
  nn::ModulePtr mixer = make_mixer("{type: ska, heads: 2, head_dim: 4}", kDim, kGrid);
  mixer->eval();
  const Tensor x = test::uniform({2, 9, kDim}, 4, -1, 1, DType::kF32);
  const Tensor weights = recorded_weights(*mixer, x);
  const Tensor q = heads_of(x, kHeads);    // the MetaFormer flavour's queries are the tokens
  const Tensor keys = param(*mixer, "k");  // [h, N, d]
  const Tensor expected = softmax(mul(matmul(q, keys.transpose(1, 2)), kScale));
  test::require_close(weights, expected, kExact, "ska weights");
  require_rows_sum_to_one(weights);
}

TEST_CASE("attention probe: recorded cska weights are the conv logits softmaxed", "[cpu][nn]") {
  nn::ModulePtr mixer = make_mixer("{type: cska, heads: 2, head_dim: 4}", kDim, kGrid);
  mixer->eval();
  const Tensor x = test::uniform({2, 9, kDim}, 5, -1, 1, DType::kF32);
  const Tensor weights = recorded_weights(*mixer, x);
  const Tensor q = heads_of(linear(x, param(*mixer, "qv.weight")).narrow(2, 0, kDim), kHeads);
  // Queries as a 3x3 image with channels (head, d); a grouped 3x3 conv gives head * 9 + key.
  const Tensor image = q.permute({0, 1, 3, 2}).reshape({2, kDim, 3, 3});
  const Tensor conv = conv2d(image, param(*mixer, "to_k.weight"), param(*mixer, "to_k.bias"), 1, 1,
                             1, kHeads);  // [2, h * 9, 3, 3]
  const Tensor logits = conv.reshape({2, kHeads, 9, 9}).permute({0, 1, 3, 2});
  test::require_close(weights, softmax(mul(logits, kScale)), kExact, "cska weights");
  require_rows_sum_to_one(weights);
}

TEST_CASE("attention probe: token layouts and queries", "[cpu][nn]") {
  CHECK(nn::infer_token_layout(65, "q").cls);
  CHECK(nn::infer_token_layout(64, "q").height == 8);
  CHECK(nn::infer_token_layout(1, "q").height == 0);
  REQUIRE_THROWS_WITH(nn::infer_token_layout(7, "keys"),
                      Catch::Matchers::Contains("7 keys form neither a square grid"));
  // weights [1, 1, 1 + 4, 1 + 4]: row r puts its weight on key r.
  nn::AttentionRecord record;
  std::vector<float> eye(25, 0.0f);
  for (size_t i = 0; i < 5; ++i) eye[i * 6] = 1.0f;
  record.weights = Tensor::from_vector(eye, {1, 1, 5, 5});
  nn::AttentionQuery q;
  q.y = 0.9, q.x = 0.1;  // bottom left of a 2x2 grid: token 2, row 3
  const nn::AttentionMap map = nn::attention_map(record, q);
  CHECK(map.query_row == 3);
  CHECK(map.grid.to_vector<float>() == std::vector<float>{0, 0, 1, 0});
  q.cls = true;
  CHECK(nn::attention_map(record, q).cls.to_vector<float>() == std::vector<float>{1});
}

TEST_CASE("attention probe: maps of every attention family of the zoo", "[cpu][nn]") {
  struct Case {
    std::string name, yaml;
    size_t layers;
  };
  const std::vector<Case> cases = {
      {"vit mhsa", test::with_mixer(test::kSmallVit, "mhsa"), 2},
      {"vit ska", test::with_mixer(test::kSmallVit, "ska"), 2},
      {"vit cska", test::with_mixer(test::kSmallVit, "cska"), 2},
      {"cait mhsa", test::with_mixer(test::kSmallCait, "mhsa") + "talking_heads: false\n", 4},
      {"cait ska", test::with_mixer(test::kSmallCait, "ska") + "talking_heads: false\n", 4},
      {"cait cska", test::with_mixer(test::kSmallCait, "cska") + "talking_heads: false\n", 4},
      {"swin mhsa", test::with_mixer(test::kSmallSwin, "mhsa"), 6},
      {"swin ska", test::with_mixer(test::kSmallSwin, "ska"), 6},
      {"swin cska", test::with_mixer(test::kSmallSwin, "cska"), 6},
      {"cvt mhsa", test::with_mixer(test::kSmallCvt, "mhsa"), 4},
      {"cvt ska", test::with_mixer(test::kSmallCvt, "ska"), 4},
      {"cvt cska", test::with_mixer(test::kSmallCvt, "cska"), 4},
      {"metaformer", test::kSmallMetaFormer, 3}};  // stages cska, ska, mhsa
  for (const Case& c : cases) {
    INFO(c.name);
    Config config = Config::parse(c.yaml);
    nn::ModulePtr model = models::build_model(config.root());
    model->eval();
    const int64_t size = config.root().get<int64_t>("image_size");
    const Tensor x = test::uniform({1, 3, size, size}, 9, -1, 1, DType::kF32);
    nn::AttentionRecorder recorder;
    (*model)(x);
    REQUIRE(recorder.records().size() == c.layers);
    for (const nn::AttentionRecord& record : recorder.records()) {
      INFO(record.weights.str());
      // Every query position: the map holds one softmax row (grid plus class key).
      for (double y : {0.1, 0.6}) {
        for (double xq : {0.3, 0.9}) {
          nn::AttentionQuery q;
          q.y = y, q.x = xq;
          q.cls = record.weights.size(-2) == 1 && nn::has_class_query(record);  // class attention
          const nn::AttentionMap map = nn::attention_map(record, q);
          const double total = total_of(map.grid) + total_of(map.cls);  // all heads
          REQUIRE(total == Approx(static_cast<double>(map.grid.size(0))).epsilon(1e-5));
          if (record.windows.window > 0) {  // the query's own token lies in its window
            const int64_t r = static_cast<int64_t>(y * map.keys.height);
            const int64_t col = static_cast<int64_t>(xq * map.keys.width);
            REQUIRE(total_of(map.grid.select(1, r).select(1, col)) > 0);
          }
        }
      }
    }
  }
}
