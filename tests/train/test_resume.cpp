// Exact resume: k steps + checkpoint + a rebuilt trainer + k steps gives bit-identical weights to
// 2k steps straight; and a training process killed with SIGKILL while it writes checkpoints
// leaves a last good checkpoint that loads and resumes.
#include <cstdint>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/random.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
namespace fs = std::filesystem;
using ska::test::train_until;

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
