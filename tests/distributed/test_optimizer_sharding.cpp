// The sharded optimizer state's pieces that need no peers: the split of a model's parameters
// over workers (balanced, deterministic) and the packing that carries tensors through a
// collective. Training with it is tested in tests/train/test_data_parallel.cpp.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "config/config.h"
#include "distributed/optimizer_sharding.h"
#include "models/model.h"

using namespace ska;
using Catch::Matchers::Contains;

namespace {

// A worker of a world that is never contacted: the split needs only the rank and the size.
class NoPeers : public dist::Communicator {
 public:
  NoPeers(int rank, int world) : rank_(rank), world_(world) {}
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string backend() const override { return "none"; }
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<dist::Work> all_reduce_async(Tensor, dist::ReduceOp) override { fail(); }
  void broadcast(Tensor, int) override { fail(); }
  void all_gather(const Tensor&, Tensor) override { fail(); }
  void reduce_scatter(const Tensor&, Tensor, dist::ReduceOp) override { fail(); }
  void barrier() override { fail(); }
  void set_label(const std::string&) override {}

 private:
  [[noreturn]] static void fail() { SKA_FAIL(ValueError, "no peers in this test"); }
  int rank_, world_;
};

}  // namespace

TEST_CASE("the optimizer state of CAFormer-B36 splits evenly over 8 workers",
          "[cpu][distributed]") {
  Config config = Config::load(std::string(SKA_SOURCE_DIR) + "/configs/models/caformer_b36.yaml");
  const nn::ModulePtr model = models::build_model(config.root());
  const optim::NamedTensors params = model->named_parameters(true);
  int64_t total = 0;
  for (const auto& [name, p] : params) total += p.numel();
  REQUIRE(total == 98753614);
  NoPeers rank0(0, 8), rank5(5, 8);
  dist::OptimizerSharding a(params, rank0), b(params, rank5);
  const std::vector<int64_t>& split = a.owned_numel();
  REQUIRE(split == b.owned_numel());  // every worker computes the same split
  int64_t largest = 0, owned_by_5 = 0;
  for (int64_t n : split) largest = std::max(largest, n);
  for (const auto& [name, p] : params) {
    REQUIRE(a.owner(name) == b.owner(name));
    if (b.owns(name)) owned_by_5 += p.numel();
  }
  REQUIRE(owned_by_5 == split[5]);
  // AdamW / LAMB keep two f32 moments per element: 790 MB unsharded; the largest share is
  // within 1% of an eighth (measured: 12.50%, 98.8 MB per worker).
  const double share = static_cast<double>(largest) / static_cast<double>(total);
  INFO("largest share " << 100.0 * share << "%, " << 8.0 * largest / 1e6 << " MB of moments");
  REQUIRE(share < 0.125 * 1.01);
  REQUIRE_THROWS_WITH(a.owner("no.such.param"), Contains("no.such.param"));
}

TEST_CASE("tensors packed for a collective come back exactly, bad bytes are errors",
          "[cpu][distributed]") {
  std::map<std::string, Tensor> m;
  m["w.exp_avg"] = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2});
  m["w.step"] = Tensor::from_vector<int64_t>({7}, {});
  m["b.exp_avg_sq"] = Tensor::from_vector<double>({1e-300, 2.0}, {2});
  const std::string bytes = dist::pack_tensors(m);
  const std::map<std::string, Tensor> back = dist::unpack_tensors(bytes);
  REQUIRE(back.size() == 3);
  REQUIRE(back.at("w.exp_avg").shape() == Shape{2, 2});
  REQUIRE(back.at("w.exp_avg").to_vector<float>() == m["w.exp_avg"].to_vector<float>());
  REQUIRE(back.at("w.step").dtype() == DType::kI64);
  REQUIRE(back.at("w.step").to_vector<int64_t>()[0] == 7);
  REQUIRE(back.at("b.exp_avg_sq").to_vector<double>()[0] == 1e-300);
  REQUIRE(dist::unpack_tensors(dist::pack_tensors({})).empty());
  REQUIRE_THROWS_WITH(dist::unpack_tensors(bytes.substr(0, bytes.size() - 3)),
                      Contains("truncated"));
}
