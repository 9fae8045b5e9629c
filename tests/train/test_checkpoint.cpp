// Checkpoint files: training-state round trip, clear errors for corrupt files, the marker and
// the keep/best policy of CheckpointManager.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "train/checkpoint.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

TrainState sample_state() {
  TrainState s;
  s.epoch = 3;
  s.batch = 17;
  s.step = 1234;
  s.steps_per_epoch = 400;
  s.nonfinite_total = 2;
  s.lr = 1.25e-4;
  s.best_top1 = 87.5;
  s.best_epoch = 2;
  s.rngs["cpu"] = RngState{42, 987654321};
  s.rngs["trainer"] = RngState{7, 3};
  s.optimizer["w.exp_avg"] = Tensor::from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f}, {2, 2});
  s.optimizer["w.step"] = Tensor::from_vector<int64_t>({1234}, {});
  s.optimizer["b.exp_avg_sq"] = Tensor::from_vector<double>({1e-300, 2.0}, {2});
  s.info["optimizer"] = "adamw";
  return s;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

}  // namespace

TEST_CASE("training state round trip", "[cpu][train]") {
  const std::string dir = test::train_scratch_dir("state");
  const std::string path = dir + "/train_state.bin";
  const TrainState s = sample_state();
  write_train_state(path, s);
  const TrainState r = read_train_state(path);
  REQUIRE(r.epoch == 3);
  REQUIRE(r.batch == 17);
  REQUIRE(r.step == 1234);
  REQUIRE(r.steps_per_epoch == 400);
  REQUIRE(r.nonfinite_total == 2);
  REQUIRE(r.lr == 1.25e-4);
  REQUIRE(r.best_top1 == 87.5);
  REQUIRE(r.best_epoch == 2);
  REQUIRE(r.loss_scale == 1.0);
  REQUIRE(r.rngs.at("cpu").seed == 42);
  REQUIRE(r.rngs.at("cpu").offset == 987654321);
  REQUIRE(r.info.at("optimizer") == "adamw");
  std::string diff;
  REQUIRE(test::bitwise_equal(s.optimizer, r.optimizer, &diff));
  REQUIRE(read_bytes(path).substr(0, 8) == "SKATRAIN");
  // No temporary files are left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  REQUIRE(files == 1);
}

TEST_CASE("corrupt training-state files fail with the file named", "[cpu][train]") {
  const std::string dir = test::train_scratch_dir("corrupt");
  const std::string path = dir + "/train_state.bin";
  write_train_state(path, sample_state());
  const std::string good = read_bytes(path);

  write_bytes(path, good.substr(0, good.size() / 2));
  REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("truncated"));
  write_bytes(path, good.substr(0, 12));
  REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("truncated"));
  write_bytes(path, "this is not a checkpoint at all, just some text");
  REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("magic"));
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  write_bytes(path, flipped);
  REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("checksum"));
  std::string future = good;
  future[8] = 9;  // version 9
  write_bytes(path, future);
  REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("version 9"));
  REQUIRE_THROWS_WITH(read_train_state(dir + "/missing.bin"), Contains("missing.bin"));
}

TEST_CASE("checkpoint folders: marker written last, keep policy, best kept", "[cpu][train]") {
  const std::string run = test::train_scratch_dir("manager");
  const TensorMap model = {{"w", Tensor::from_vector<float>({1, 2, 3}, {3})}};
  CheckpointManager manager(run, 2);
  TrainState s = sample_state();
  for (int64_t step : {10, 20, 30, 40}) {
    s.step = step;
    manager.save(model, {}, s, /*is_best=*/step == 20);
  }
  const auto kept = manager.list();
  REQUIRE(kept.size() == 3);  // the 2 newest + best
  REQUIRE(fs::path(kept[0]).filename() == "step-00000020");
  REQUIRE(fs::path(kept[2]).filename() == "step-00000040");
  REQUIRE(resolve_checkpoint(run) == kept[2]);

  const Checkpoint c = load_checkpoint(kept[2]);
  REQUIRE(c.state.step == 40);
  REQUIRE(c.ema.empty());
  std::string diff;
  REQUIRE(test::bitwise_equal(c.model, model, &diff));

  // A checkpoint whose marker is missing (killed mid-write) is skipped for the previous one.
  fs::remove(fs::path(kept[2]) / "checkpoint.json");
  REQUIRE_THROWS_WITH(load_checkpoint(kept[2]), Contains("no checkpoint.json marker"));
  REQUIRE(resolve_checkpoint(run) == kept[1]);
  // A corrupt state file inside a complete-looking checkpoint names the file.
  write_bytes((fs::path(kept[1]) / "train_state.bin").string(), "garbage");
  REQUIRE_THROWS_WITH(load_checkpoint(kept[1]), Contains("train_state.bin"));
  REQUIRE_THROWS_WITH(resolve_checkpoint(run + "/nowhere"), Contains("nowhere"));
}
