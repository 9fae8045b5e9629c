// A run folder has one writer and consistent pointers: a second `train` on the same folder fails
// at once naming the holder, a killed holder does not block the resume, and the `last` / `best`
// pointers are one atomic record that pruning respects and a resume repairs; a run that fails
// while it is set up leaves no folder behind.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "apps/app_test_util.h"
#include "train/checkpoint.h"
#include "train/run_lock.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

TrainState state_at(int64_t step) {
  TrainState s;
  s.step = step;
  s.steps_per_epoch = 10;
  return s;
}

}  // namespace

TEST_CASE("a run folder has one writer, a dead holder's lock does not block",
          "[cpu][train][hardening]") {
  const std::string run = test::train_scratch_dir("lock");
  {
    RunFolderLock first(run);
    REQUIRE_THAT(read_text(first.path()), Contains("pid " + std::to_string(::getpid())));
    REQUIRE_THROWS_WITH(RunFolderLock(run),
                        Contains("run folder '" + run + "' is in use by host") &&
                            Contains("pid " + std::to_string(::getpid())) &&
                            Contains("another train is writing it"));
  }
  RunFolderLock again(run);  // released by the destructor

  // A holder killed with SIGKILL: the kernel drops its lock.
  const std::string other = test::train_scratch_dir("lock_dead");
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    try {
      RunFolderLock held(other);
      ::raise(SIGKILL);
    } catch (...) {
    }
    ::_exit(3);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE_THAT(read_text(other + "/.lock"), Contains("pid " + std::to_string(pid)));
  REQUIRE_NOTHROW(RunFolderLock(other));
}

TEST_CASE("two train commands on one --output: the second fails at once naming the first",
          "[cpu][train][hardening][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const std::string dir = test::train_scratch_dir("two_writers");
  const std::string config = dir + "/tiny.yaml";
  std::ofstream(config) << test::tiny_experiment_yaml(512, 100, 32, 1000, 0.0);
  const std::string run = dir + "/run";
  const auto start = [&](const std::string& log) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::freopen(log.c_str(), "w", stdout);
      std::freopen(log.c_str(), "a", stderr);
      ::execl(SKA_TRAIN_EXE, SKA_TRAIN_EXE, "--config", config.c_str(), "--output", run.c_str(),
              "--resume", "auto", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  };
  const pid_t first = start(dir + "/first.log");
  // Wait until the first one holds the lock (it writes its PID into the lock file).
  const auto t0 = std::chrono::steady_clock::now();
  while (read_text(run + "/.lock").find(std::to_string(first)) == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pid_t second = start(dir + "/second.log");
  int status = 0;
  // It must fail at once; a second writer that hangs (or trains) is killed after 60 s.
  const auto t1 = std::chrono::steady_clock::now();
  while (::waitpid(second, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() - t1 > std::chrono::seconds(60)) {
      ::kill(second, SIGKILL);
      ::waitpid(second, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(first, SIGKILL);
  ::waitpid(first, nullptr, 0);
  std::ifstream in(dir + "/second.log");
  const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  INFO(log);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 2);
  REQUIRE_THAT(log, Contains("is in use by host") && Contains("pid " + std::to_string(first)));
  // The second one wrote nothing: the first one's log is intact.
  std::ifstream first_log(run + "/train.log");
  const std::string written((std::istreambuf_iterator<char>(first_log)),
                            std::istreambuf_iterator<char>());
  REQUIRE_THAT(written, Contains("run dir: " + run) && !Contains("in use"));
}

TEST_CASE("checkpoint pointers: one record, pruning keeps the best, a resume repairs the files",
          "[cpu][train][hardening]") {
  const std::string run = test::train_scratch_dir("pointers");
  const TensorMap model = {{"w", Tensor::from_vector<float>({1, 2}, {2})}};
  const fs::path root = fs::path(run) / "checkpoints";
  {
    CheckpointManager manager(run, 1);
    manager.save(model, {}, state_at(1), /*is_best=*/true);
    manager.save(model, {}, state_at(2), false);
    // A kill between the record and the plain files, in the order the old writer used: the
    // `best` file points to a checkpoint that is not the best. The record is what counts.
    std::ofstream(root / "best") << "step-00000002\n";
    for (int64_t step = 3; step <= 5; ++step) manager.save(model, {}, state_at(step), false);
  }
  REQUIRE(fs::exists(root / "step-00000001"));        // the best survives keep: 1
  REQUIRE(!fs::exists(root / "step-00000002"));
  REQUIRE(!fs::exists(root / "step-00000004"));
  REQUIRE(fs::exists(root / "step-00000005"));
  REQUIRE(read_text((root / "best").string()) == "step-00000001");  // rewritten by each save
  REQUIRE_THAT(read_text((root / "pointers.json").string()),
               Contains("\"best\":\"step-00000001\"") && Contains("\"last\":\"step-00000005\""));

  // Stale plain files after a kill: resolve trusts the record, and a resumed manager repairs them.
  std::ofstream(root / "last") << "step-00000001\n";
  std::ofstream(root / "best") << "step-00000005\n";
  REQUIRE(fs::path(resolve_checkpoint(run)).filename() == "step-00000005");
  CheckpointManager resumed(run, 1);
  REQUIRE(read_text((root / "last").string()) == "step-00000005");
  REQUIRE(read_text((root / "best").string()) == "step-00000001");
}

TEST_CASE("a run that fails before it begins leaves no folder behind, an existing one stays",
          "[cpu][train][hardening]") {
  const std::string dir = test::train_scratch_dir("failed_start");
  const std::string config = dir + "/tiny.yaml";
  std::ofstream(config) << test::tiny_experiment_yaml(64, 20, 16, 1, 0.0);
  const std::string runs = dir + "/runs";
  const auto train = [&](const std::string& args) {
    return test::run_command(SKA_TRAIN_EXE, "--config " + config + " " + args);
  };
  const auto entries = [](const std::string& folder) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(folder)) n += e.exists() ? 1 : 0;
    return n;
  };
  fs::create_directories(runs);
  // A config typo and a missing dataset: both fail while the run is set up.
  const test::RunResult typo = train("--runs " + runs + " --set train.epochz=2");
  INFO(typo.out << typo.err);
  REQUIRE(typo.exit_code == 2);
  REQUIRE_THAT(typo.err, Contains("train.epochz") && Contains("did you mean 'epochs'"));
  REQUIRE_THAT(typo.out, Contains("removed its new folder"));
  const test::RunResult no_data = train("--runs " + runs + " --set data.root=" + dir + "/none");
  INFO(no_data.out << no_data.err);
  REQUIRE(no_data.exit_code == 2);
  REQUIRE(entries(runs) == 0);

  // --output naming a new folder: removed the same way.
  const test::RunResult fresh = train("--output " + dir + "/new --set train.epochz=2");
  REQUIRE(fresh.exit_code == 2);
  REQUIRE_FALSE(fs::exists(dir + "/new"));

  // --output naming a folder that was there: kept with what it held.
  fs::create_directories(dir + "/mine");
  std::ofstream(dir + "/mine/notes.txt") << "keep\n";
  const test::RunResult existing = train("--output " + dir + "/mine --set train.epochz=2");
  REQUIRE(existing.exit_code == 2);
  REQUIRE_THAT(existing.out, !Contains("removed"));
  REQUIRE(read_text(dir + "/mine/notes.txt") == "keep");
}

TEST_CASE("train --output on a folder that holds a run refuses, unless it resumes that run",
          "[cpu][train][hardening][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  const std::string dir = test::train_scratch_dir("output_taken");
  const std::string config = dir + "/tiny.yaml";
  std::ofstream(config) << test::tiny_experiment_yaml(128, 50, 32, 1, 0.0);
  const std::string run = dir + "/run";
  const auto train = [&](const std::string& args) {
    return test::run_command(SKA_TRAIN_EXE, "--config " + config + " --output " + run + " " + args);
  };
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const test::RunResult first = train("");
  INFO(first.out << first.err);
  REQUIRE(first.exit_code == 0);
  const std::string checkpoint = resolve_checkpoint(run);
  const std::string weights = bytes(checkpoint + "/model.safetensors");
  const std::string summary = bytes(run + "/summary.csv");
  REQUIRE_FALSE(weights.empty());

  // Another run into it (a different seed, say): refused, and nothing of the first one changes.
  const test::RunResult again = train("--set train.seed=9");
  INFO(again.out << again.err);
  REQUIRE(again.exit_code == 2);
  REQUIRE_THAT(again.err,
               Contains("already holds a run (a checkpoint)") && Contains("--resume " + run));
  REQUIRE(bytes(checkpoint + "/model.safetensors") == weights);
  REQUIRE(bytes(run + "/summary.csv") == summary);
  REQUIRE(resolve_checkpoint(run) == checkpoint);

  // Resuming it with another model: an error naming the checkpoint, and the run is untouched.
  const test::RunResult other = train("--resume " + run + " --set model.dim=48");
  INFO(other.out << other.err);
  REQUIRE(other.exit_code == 2);
  REQUIRE_THAT(other.err, Contains("checkpoint '" + checkpoint) &&
                              Contains("its weights do not fit this run"));
  REQUIRE(bytes(checkpoint + "/model.safetensors") == weights);
  REQUIRE(bytes(run + "/summary.csv") == summary);

  // Resuming it is what --output on a used folder is for (the run has finished: nothing to do),
  // from the run folder or from its checkpoint, as a shell completes it (a trailing slash).
  for (const std::string& from : {run, checkpoint + "/"}) {
    const test::RunResult resumed = train("--resume " + from);
    INFO(from << "\n" << resumed.out << resumed.err);
    REQUIRE(resumed.exit_code == 0);
    REQUIRE(bytes(run + "/summary.csv") == summary);
  }

  // A folder whose run left logs but no checkpoint: refused too; --resume auto starts it anew,
  // and the new run's logs replace the old ones (one row per epoch).
  const std::string bare = dir + "/bare";
  fs::create_directories(bare);
  std::ofstream(bare + "/summary.csv") << "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n"
                                       << "0,9.0,9.0,1.0,5.0,0.1\n";
  const test::RunResult refused =
      test::run_command(SKA_TRAIN_EXE, "--config " + config + " --output " + bare);
  REQUIRE(refused.exit_code == 2);
  REQUIRE_THAT(refused.err, Contains("already holds a run (its summary.csv)"));
  const test::RunResult anew = test::run_command(
      SKA_TRAIN_EXE, "--config " + config + " --output " + bare + " --resume auto");
  INFO(anew.out << anew.err);
  REQUIRE(anew.exit_code == 0);
  std::ifstream rows(bare + "/summary.csv");
  std::string line;
  int n = 0;
  while (std::getline(rows, line)) n += line.rfind("0,9.0", 0) == 0 ? 100 : 1;
  CHECK(n == 2);  // the header and this run's epoch 0
}
