// Helpers shared by the trainer tests: scratch folders, tiny experiment configs on the real
// Fashion-MNIST files, what a few training steps leave, and bitwise comparison of state dicts.
#pragma once

#include <cstdint>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "config/config.h"
#include "core/tensor.h"
#include "nn/module.h"
#include "optim/ema.h"
#include "optim/optimizer.h"
#include "support/test_util.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace ska::test {

// A fresh, empty folder under the system temp dir, unique per call, removed at exit.
inline std::string train_scratch_dir(const std::string& tag) {
  static int counter = 0;
  const auto dir = std::filesystem::temp_directory_path() /
                   ("ska_train_" + tag + "_" + std::to_string(::getpid()) + "_" +
                    std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  remove_at_exit(dir.string());
  return dir.string();
}

inline bool fashion_mnist_available() {
  return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

// A small CSKA-ViT experiment on a Fashion-MNIST subset (28x28 grey, 7x7 patches -> 4x4 tokens).
inline std::string tiny_experiment_yaml(int64_t train_subset, int64_t eval_subset,
                                        int64_t batch_size, int64_t epochs, double dropout) {
  return "model:\n"
         "  family: vit\n  image_size: 28\n  in_channels: 1\n  num_classes: 10\n"
         "  patch_size: 7\n  dim: 32\n  depth: 1\n  heads: 2\n  head_dim: 16\n  mlp_dim: 64\n"
         "  dropout: " + std::to_string(dropout) + "\n  emb_dropout: " + std::to_string(dropout) +
         "\n  mixer: {type: cska}\n"
         "data:\n  dataset: fashion_mnist\n  batch_size: " + std::to_string(batch_size) +
         "\n  eval_batch_size: 100\n  workers: 2\n  augment: {crop_padding: 2, hflip: 0.5}\n"
         "  train_subset: " + std::to_string(train_subset) +
         "\n  eval_subset: " + std::to_string(eval_subset) + "\n"
         "optim: {name: adamw, lr: 3.0e-3, weight_decay: 0.01}\n"
         "sched: {name: cosine, per_step: true}\n"
         "train: {epochs: " + std::to_string(epochs) + ", seed: 7, clip_grad: 1.0, log_every: 5}\n"
         "checkpoint: {keep: 2}\n";
}

// True when both maps have the same names, shapes, dtypes and bytes.
inline bool bitwise_equal(const std::map<std::string, Tensor>& a,
                          const std::map<std::string, Tensor>& b, std::string* first_diff) {
  if (a.size() != b.size()) {
    *first_diff = "different key counts";
    return false;
  }
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      *first_diff = name + " missing";
      return false;
    }
    const Tensor x = t.to(Device::cpu()).contiguous(), y = it->second.to(Device::cpu()).contiguous();
    if (x.shape() != y.shape() || x.dtype() != y.dtype() ||
        std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) != 0) {
      *first_diff = name;
      return false;
    }
  }
  return true;
}

// What a few training steps leave: host copies of the weights, the optimizer state and the EMA,
// and the statistics read back.
struct TrainedState {
  std::map<std::string, Tensor> weights, optimizer, ema;
  train::UpdateStats::Window stats;
};

inline TrainedState trained_state(const nn::Module& model, const optim::Optimizer& optimizer,
                                  const optim::ModelEma& ema, train::UpdateStats& stats) {
  const auto copies = [](const std::map<std::string, Tensor>& state) {
    std::map<std::string, Tensor> out;
    for (const auto& [name, t] : state) out[name] = t.to(Device::cpu()).clone();
    return out;
  };
  return {copies(model.state_dict()), copies(optimizer.state_dict()), copies(ema.state_dict()),
          stats.read()};
}

// Trains from `yaml` (with an EMA of decay 0.9) up to `max_steps` updates in `run_dir`, resuming
// from `resume` when it is not empty; returns the weights and, when `result` is given, the result.
inline std::map<std::string, Tensor> train_until(const std::string& yaml, int64_t max_steps,
                                                 const std::string& run_dir,
                                                 const std::string& resume,
                                                 train::TrainResult* result = nullptr) {
  Config config = Config::parse(yaml);
  config.set("train.max_steps=" + std::to_string(max_steps));
  config.set("train.ema_decay=0.9");
  train::TrainerSetup setup;
  setup.run_dir = run_dir;
  setup.resume = resume;
  train::Trainer trainer(config, setup);
  const train::TrainResult r = trainer.fit();
  if (result) *result = r;
  return trainer.model().state_dict();
}

// Waits for the child `pid` up to `limit_s` seconds: its wait status (waitpid's), or nullopt when
// it was still running (then it is killed and reaped).
inline std::optional<int> wait_status(pid_t pid, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// Polls `run_dir` until its last complete checkpoint has reached `step` (or `limit_s` passed);
// returns the step reached (0 when none).
inline int64_t wait_for_checkpoint_step(const std::string& run_dir, int64_t step,
                                        double limit_s = 120.0) {
  const auto t0 = std::chrono::steady_clock::now();
  int64_t reached = 0;
  while (reached < step &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    try {
      reached = train::load_checkpoint(train::resolve_checkpoint(run_dir)).state.step;
    } catch (const Error&) {  // none yet, or one being written
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return reached;
}

}  // namespace ska::test
