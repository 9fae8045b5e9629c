// What a run writes besides checkpoints: console/log lines, the resolved config.yaml,
// summary.csv (one row per epoch), metrics.jsonl (step and epoch records), the same scalars as
// TensorBoard events, and curves.png at the end. In a data-parallel job only rank 0 enables it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "train/evaluate.h"

namespace ska::io {
class TbWriter;
}

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

// curves.png: two panels side by side, each kCurvesPanelWidth x kCurvesHeight pixels.
constexpr int kCurvesPanelWidth = 480, kCurvesHeight = 320;

// Where fit() starts: a fresh run, or a resume from a checkpoint taken at update `step` with
// `epoch` the epoch then in progress (or the next one, at an epoch's end).
struct RunStart {
  bool resumed = false;
  int64_t epoch = 0, step = 0;
};

class RunOutput {
 public:
  // `enabled` false: every call does nothing (the non-zero ranks). `log` receives finished lines.
  RunOutput(std::string run_dir, bool enabled, bool has_ema,
            std::function<void(const std::string&)> log);
  ~RunOutput();

  bool enabled() const { return enabled_; }
  void line(const std::string& text) const;
  // config.yaml, summary.csv's header, and a new TensorBoard event file (one per start:
  // TensorBoard reads every file of the folder, and drops a tag's points past a step that comes
  // again). A resumed run keeps summary.csv and metrics.jsonl up to its checkpoint and drops
  // what the run wrote after it (an epoch evaluated, then killed before its checkpoint, runs
  // again: one row per epoch); a fresh one starts them anew.
  void start(const std::string& config_text, const RunStart& at) const;
  // Each record goes to metrics.jsonl and, as the same numbers, to the event file (tags in
  // run_output.cpp: train/loss, train/lr, eval/top1, ema/top1, ...).
  void step(int64_t epoch, int64_t step, double loss, double lr, double images_per_s) const;
  void epoch(const EpochRecord& r) const;
  // The end of fit(): curves.png (train loss and eval top-1 per epoch, from the whole of
  // summary.csv, so a resumed run's picture covers every epoch) and the event file closed.
  void finish();

 private:
  void append(const std::string& file, const std::string& text) const;

  std::string run_dir_;
  bool enabled_;
  bool has_ema_;
  std::function<void(const std::string&)> log_;
  mutable std::unique_ptr<io::TbWriter> events_;  // made by start(), once the folder exists
};

}  // namespace ska::train
