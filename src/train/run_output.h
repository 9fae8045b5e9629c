// What a run writes besides checkpoints: console/log lines, the resolved config.yaml,
// summary.csv (one row per epoch) and metrics.jsonl (step and epoch records). In a data-parallel
// job only rank 0 enables it; the others stay silent.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "train/evaluate.h"

namespace ska::train {

// One finished epoch, as logged.
struct EpochRecord {
  int64_t epoch = 0, epochs = 0, step = 0;
  double train_loss = 0.0, lr = 0.0, images_per_s = 0.0, seconds = 0.0;
  int64_t nonfinite_total = 0;
  double loss_scale = 0.0;  // fp16 only (0: not logged)
  bool evaluated = false;
  EvalResult eval, ema_eval;
  double best_top1 = -1.0, best_ema_top1 = -1.0;
  int64_t best_epoch = -1, best_ema_epoch = -1;
};

class RunOutput {
 public:
  // `enabled` false: every call does nothing (the non-zero ranks). `log` receives finished lines.
  RunOutput(std::string run_dir, bool enabled, bool has_ema,
            std::function<void(const std::string&)> log);

  bool enabled() const { return enabled_; }
  void line(const std::string& text) const;
  // config.yaml, and summary.csv's header unless the file exists (a resumed run appends).
  void start(const std::string& config_text) const;
  void step(int64_t epoch, int64_t step, double loss, double lr, double images_per_s) const;
  void epoch(const EpochRecord& r) const;

 private:
  void append(const std::string& file, const std::string& text) const;

  std::string run_dir_;
  bool enabled_;
  bool has_ema_;
  std::function<void(const std::string&)> log_;
};

}  // namespace ska::train
