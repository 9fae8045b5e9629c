// Checkpoint files: training-state round trip, clear errors for corrupt files, the marker and
// the keep/best policy of CheckpointManager.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

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

namespace {

uint64_t test_fnv1a(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// A training-state file as an attacker writes it: `good` with its JSON header edited by `edit`
// and the tensor section replaced by `tensors` (when not empty), the checksum recomputed.
std::string forge_state(const std::string& good, const std::function<void(std::string&)>& edit,
                        const std::string& tensors = "") {
  uint64_t header_len = 0;
  std::memcpy(&header_len, good.data() + 16, 8);
  std::string header = good.substr(24, header_len);
  edit(header);
  std::string rest = tensors.empty() ? good.substr(24 + header_len, good.size() - 32 - header_len)
                                     : tensors;
  std::string out = good.substr(0, 16);
  const uint64_t len = header.size();
  out.append(reinterpret_cast<const char*>(&len), 8);
  out += header + rest;
  const uint64_t sum = test_fnv1a(out);
  out.append(reinterpret_cast<const char*>(&sum), 8);
  return out;
}

void replace_in(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
}

template <typename T>
std::string raw(T value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
}

}  // namespace

TEST_CASE("training-state fields are range-checked, naming the file and the field",
          "[cpu][train][hardening]") {
  const std::string dir = test::train_scratch_dir("ranges");
  const std::string path = dir + "/train_state.bin";
  write_train_state(path, sample_state());
  const std::string good = read_bytes(path);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\"step\":1234", "\"step\":-95"},
      {"\"epoch\":3", "\"epoch\":-1"},
      {"\"batch\":17", "\"batch\":4611686018427387904"},
      {"\"steps_per_epoch\":400", "\"steps_per_epoch\":-400"},
      {"\"lr\":0.000125", "\"lr\":null"},  // how a NaN or infinite lr is written
      {"\"lr\":0.000125", "\"lr\":-0.5"},
      {"\"best_top1\":87.5", "\"best_top1\":1e300"},
      {"\"loss_scale\":1.0", "\"loss_scale\":0.0"},
      {"\"step\":1234", "\"step\":12.5"},
  };
  for (const auto& [from, to] : cases) {
    INFO(to);
    write_bytes(path, forge_state(good, [&](std::string& h) { replace_in(h, from, to); }));
    const std::string field = to.substr(1, to.find('"', 1) - 1);
    REQUIRE_THROWS_AS(read_train_state(path), IOError);
    REQUIRE_THROWS_WITH(read_train_state(path),
                        Contains(path) && Contains("field '" + field + "'") &&
                            Contains("expected"));
  }
  write_bytes(path, forge_state(good, [](std::string&) {}));
  REQUIRE(read_train_state(path).step == 1234);  // the forging itself is sound
}

TEST_CASE("training-state sizes are checked before anything is allocated",
          "[cpu][train][hardening]") {
  const std::string dir = test::train_scratch_dir("sizes");
  const std::string path = dir + "/train_state.bin";
  write_train_state(path, sample_state());
  const std::string good = read_bytes(path);
  auto keep = [](std::string&) {};
  auto tensor = [](const std::string& dtype, std::vector<int64_t> dims, uint64_t nbytes) {
    std::string t = raw<uint32_t>(1) + "w" + raw<uint32_t>(dtype.size()) + dtype +
                    raw<uint32_t>(static_cast<uint32_t>(dims.size()));
    for (int64_t d : dims) t += raw<int64_t>(d);
    return t + raw<uint64_t>(nbytes);
  };

  SECTION("a huge tensor count") {
    write_bytes(path, forge_state(good, keep, raw<uint64_t>(uint64_t{1} << 60)));
    REQUIRE_THROWS_AS(read_train_state(path), IOError);
    REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("'tensor count'"));
  }
  SECTION("a tensor of 2^40 floats with no data") {
    write_bytes(path, forge_state(good, keep,
                                  raw<uint64_t>(1) + tensor("F32", {1 << 20, 1 << 20}, 4ull << 40)));
    REQUIRE_THROWS_AS(read_train_state(path), IOError);
    REQUIRE_THROWS_WITH(read_train_state(path), Contains(path) && Contains("tensor data"));
  }
  SECTION("dims whose product overflows 64 bits") {
    write_bytes(path, forge_state(good, keep,
                                  raw<uint64_t>(1) + tensor("F32", {1ll << 40, 1ll << 40}, 0)));
    REQUIRE_THROWS_AS(read_train_state(path), IOError);
    REQUIRE_THROWS_WITH(read_train_state(path),
                        Contains(path) && Contains("tensor 'w'") && Contains("64-bit"));
  }
  SECTION("an unknown dtype names the file") {
    write_bytes(path, forge_state(good, keep, raw<uint64_t>(1) + tensor("X32", {2}, 8)));
    REQUIRE_THROWS_AS(read_train_state(path), IOError);
    REQUIRE_THROWS_WITH(read_train_state(path),
                        Contains(path) && Contains("tensor 'w'") && Contains("'X32'"));
  }
}
