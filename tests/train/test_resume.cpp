// Exact resume: k steps + checkpoint + a rebuilt trainer + k steps gives bit-identical weights to
// 2k steps straight; and a training process killed with SIGKILL while it writes checkpoints
// leaves a last good checkpoint that loads and resumes; a stop request (a signal) checkpoints
// where it lands and the resumed run is bit-identical.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
namespace fs = std::filesystem;
using ska::test::train_until;

namespace {

// summary.csv's rows after the header.
std::vector<std::string> summary_rows(const std::string& run_dir) {
  std::ifstream in(fs::path(run_dir) / "summary.csv");
  std::vector<std::string> rows;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) rows.push_back(line);
  return rows;
}

std::vector<std::string> csv_fields(const std::string& row) {
  std::vector<std::string> out;
  std::stringstream s(row);
  for (std::string f; std::getline(s, f, ',');) out.push_back(f);
  return out;
}

}  // namespace

TEST_CASE("resume after k steps is bit-identical to 2k steps straight", "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // 512 images / batch 32 = 16 updates per epoch; k = 11 stops mid-epoch, 2k crosses an epoch
  // boundary (with its evaluation). Dropout, crop and flip exercise every random stream.
  std::string yaml = test::tiny_experiment_yaml(512, 200, 32, 3, 0.1);
  const int64_t k = 11;
  const std::string straight_dir = test::train_scratch_dir("straight");
  const auto straight = train_until(yaml, 2 * k, straight_dir, "");

  const std::string split_dir = test::train_scratch_dir("split");
  train_until(yaml, k, split_dir, "");
  // A different process state: reseed every generator before the rebuild.
  manual_seed(12345);
  default_generator(Device::cpu()).advance(999);
  const auto resumed = train_until(yaml, 2 * k, split_dir, split_dir);

  std::string diff;
  INFO("first differing tensor: " << diff);
  REQUIRE(test::bitwise_equal(straight, resumed, &diff));
  // The optimizer state matches too.
  const Checkpoint a = load_checkpoint(resolve_checkpoint(straight_dir));
  const Checkpoint b = load_checkpoint(resolve_checkpoint(split_dir));
  REQUIRE(a.state.step == 2 * k);
  REQUIRE(b.state.step == 2 * k);
  REQUIRE(test::bitwise_equal(a.state.optimizer, b.state.optimizer, &diff));
  REQUIRE(test::bitwise_equal(a.ema, b.ema, &diff));
  REQUIRE(a.state.rngs.at("cpu").offset == b.state.rngs.at("cpu").offset);
}

TEST_CASE("a run killed with SIGKILL while writing checkpoints resumes from the last good one",
          "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const std::string dir = test::train_scratch_dir("sigkill");
  const std::string yaml = test::tiny_experiment_yaml(512, 100, 32, 1000, 0.0);
  const std::string config_path = dir + "/tiny.yaml";
  std::ofstream(config_path) << yaml;
  const std::string run = dir + "/run";

  // Three rounds: start (or resume) the `train` command checkpointing after every update, let
  // it write a few checkpoints, then SIGKILL it at a varying moment.
  int64_t previous_step = 0;
  for (int round = 0; round < 3; ++round) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int null_fd = ::open("/dev/null", O_WRONLY);
      ::dup2(null_fd, 1);
      ::dup2(null_fd, 2);
      std::vector<std::string> args = {SKA_TRAIN_EXE, "--config", config_path, "--output", run,
                                       "--set", "checkpoint.every_steps=1", "--set",
                                       "checkpoint.keep=3", "--set", "data.workers=1"};
      if (round > 0) {
        args.push_back("--resume");
        args.push_back(run);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // Wait until this round has written at least 3 new checkpoints (or give up after 60 s).
    const auto t0 = std::chrono::steady_clock::now();
    int64_t seen = previous_step;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
      try {
        seen = load_checkpoint(resolve_checkpoint(run)).state.step;
      } catch (const Error&) {
      }
      if (seen >= previous_step + 3) break;
      int status = 0;
      REQUIRE(::waitpid(pid, &status, WNOHANG) == 0);  // the child must still be running
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(7 * round + 3));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    const Checkpoint c = load_checkpoint(resolve_checkpoint(run));
    INFO("round " << round);
    REQUIRE(c.state.step >= previous_step + 3);
    previous_step = c.state.step;
  }

  // The last good checkpoint loads and training continues from it.
  const std::string last = resolve_checkpoint(run);
  const Checkpoint c = load_checkpoint(last);
  Config config = Config::parse(yaml);
  config.set("train.max_steps=" + std::to_string(c.state.step + 2));
  TrainerSetup setup;
  setup.run_dir = run;
  setup.resume = run;
  Trainer trainer(config, setup);
  REQUIRE(trainer.state().step == c.state.step);
  const TrainResult r = trainer.fit();
  REQUIRE(r.steps == c.state.step + 2);
}

TEST_CASE("a stop request writes a checkpoint there and the resumed run is bit-identical",
          "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // 512 images / batch 32 = 16 updates per epoch; 40 updates straight against the same run
  // stopped once mid-epoch (asked after update 11) and once at an epoch's end (asked after the
  // evaluation of epoch 1, update 32), resumed each time.
  const std::string yaml = test::tiny_experiment_yaml(512, 200, 32, 3, 0.1);
  const int64_t total = 40;
  const std::string straight_dir = test::train_scratch_dir("stop_straight");
  const auto straight = train_until(yaml, total, straight_dir, "");

  const std::string dir = test::train_scratch_dir("stop_split");
  const auto run = [&](int64_t ask_at, const std::string& resume) {
    Config config = Config::parse(yaml);
    config.set("train.max_steps=" + std::to_string(total));
    config.set("train.ema_decay=0.9");
    TrainerSetup setup;
    setup.run_dir = dir;
    setup.resume = resume;
    int64_t asked = 0;  // calls so far: one per update, plus one at each epoch's end
    setup.stop_signal = [&] { return ++asked >= ask_at ? SIGTERM : 0; };
    Trainer trainer(config, setup);
    const int64_t start = trainer.state().step;
    TrainResult r = trainer.fit();
    return std::make_pair(r, start);
  };
  const auto [first, start0] = run(11, "");
  REQUIRE(first.stop_signal == SIGTERM);
  REQUIRE(start0 == 0);
  REQUIRE(first.steps == 11);
  Checkpoint c = load_checkpoint(resolve_checkpoint(dir));
  REQUIRE(c.state.step == 11);
  REQUIRE(c.state.epoch == 0);
  REQUIRE(c.state.batch == 11);
  // Resumed at update 11: asked after updates 12-15 (calls 1-4), at the end of epoch 0 (5),
  // after 17-31 (6-20), not after 32 (an epoch's last update), at the end of epoch 1 (21).
  const auto [second, start1] = run(21, dir);
  REQUIRE(start1 == 11);
  REQUIRE(second.stop_signal == SIGTERM);
  REQUIRE(second.steps == 32);
  REQUIRE(second.final_eval.count == 200);  // epoch 1 was evaluated before the stop
  c = load_checkpoint(resolve_checkpoint(dir));
  REQUIRE(c.state.step == 32);
  REQUIRE(c.state.epoch == 2);
  REQUIRE(c.state.batch == 0);
  const auto [third, start2] = run(1000, dir);
  REQUIRE(third.stop_signal == 0);
  REQUIRE(third.steps == total);

  const auto resumed = load_checkpoint(resolve_checkpoint(dir)).model;
  std::string diff;
  INFO("first differing tensor: " << diff);
  REQUIRE(test::bitwise_equal(straight, resumed, &diff));
  // The logs too: one summary.csv row per epoch, the same numbers (epoch 0's train loss covers
  // its updates before the stop at 11 as well; the f32 window sums are grouped differently, so
  // its last digit may differ).
  const auto straight_rows = summary_rows(straight_dir);
  const auto split_rows = summary_rows(dir);
  REQUIRE(split_rows.size() == straight_rows.size());
  REQUIRE(split_rows.size() >= 2);
  for (size_t i = 0; i < split_rows.size(); ++i) {
    INFO("row " << i << ": " << straight_rows[i] << " | " << split_rows[i]);
    const auto a = csv_fields(straight_rows[i]), b = csv_fields(split_rows[i]);
    REQUIRE(a.size() == b.size());
    CHECK(a[0] == b[0]);                                              // epoch
    CHECK(std::stod(a[1]) == Approx(std::stod(b[1])).epsilon(2e-6));  // train_loss
    for (size_t k = 2; k < a.size(); ++k) CHECK(a[k] == b[k]);        // eval, lr, EMA
  }
}

TEST_CASE("a resume drops the log records written after its checkpoint: one row per epoch",
          "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // Two epochs of 8 updates, checkpoints after each. Then the second checkpoint goes, as if the
  // run had been killed after epoch 1's evaluation and log lines but before its checkpoint: the
  // resume from step 8 runs epoch 1 again and must not log it twice.
  const std::string yaml = test::tiny_experiment_yaml(256, 100, 32, 2, 0.0);
  const std::string dir = test::train_scratch_dir("resume_logs");
  train_until(yaml, 1000, dir, "");  // max_steps beyond the 2 epochs: the run ends by itself
  const std::vector<std::string> before = summary_rows(dir);
  REQUIRE(before.size() == 2);
  fs::remove_all(fs::path(dir) / "checkpoints" / "step-00000016");
  REQUIRE(load_checkpoint(resolve_checkpoint(dir)).state.step == 8);
  train_until(yaml, 1000, dir, dir);
  const std::vector<std::string> after = summary_rows(dir);
  CHECK(after == before);  // epoch 1 once, with the same numbers (no dropout: the same run)
  int64_t epoch_records = 0, last_step = -1;
  bool steps_increase = true;
  std::ifstream metrics(fs::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("kind") == "epoch") {
      ++epoch_records;
    } else {
      steps_increase = steps_increase && j.at("step").get<int64_t>() > last_step;
      last_step = j.at("step").get<int64_t>();
    }
  }
  CHECK(epoch_records == 2);
  CHECK(steps_increase);
}

TEST_CASE("train on SIGTERM: a checkpoint, then it ends by SIGTERM, and an ignored SIGINT stays so",
          "[cpu][train][hardening][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const std::string dir = test::train_scratch_dir("sigterm");
  const std::string config_path = dir + "/tiny.yaml";
  std::ofstream(config_path) << test::tiny_experiment_yaml(512, 100, 32, 1000, 0.0);
  const std::string run = dir + "/run", log = dir + "/train.log";
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGINT, SIG_IGN);  // as a shell starts a background job
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(SKA_TRAIN_EXE, SKA_TRAIN_EXE, "--config", config_path.c_str(), "--output",
            run.c_str(), "--set", "checkpoint.every_steps=2", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  REQUIRE(test::wait_for_checkpoint_step(run, 4) >= 4);
  ::kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int status = 0;
  REQUIRE(::waitpid(pid, &status, WNOHANG) == 0);  // still training
  ::kill(pid, SIGTERM);
  const std::optional<int> ended = test::wait_status(pid, 60);
  if (!ended) FAIL("train did not stop within 60 s of SIGTERM");
  status = *ended;
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(text);
  // It ends by the signal (after the checkpoint), so that a shell script running it stops too.
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGTERM);
  const Checkpoint c = load_checkpoint(resolve_checkpoint(run));
  REQUIRE(c.state.step >= 4);
  REQUIRE(text.find("stopped at epoch " + std::to_string(c.state.epoch) + ", batch " +
                    std::to_string(c.state.batch)) != std::string::npos);
  REQUIRE(text.find("train: stopped by SIGTERM after " + std::to_string(c.state.step) +
                    " steps") != std::string::npos);
}
