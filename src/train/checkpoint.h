// Checkpoints that resume exactly: model (and EMA) weights as safetensors, a training-state file
// (magic + version + checksum: optimizer state, counters, RNG states, schedule inputs) and a
// `checkpoint.json` marker written last. Every file goes to a temporary name, is fsync'd and
// renamed, so a kill at any moment leaves the last complete checkpoint intact.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace ska::train {

constexpr char kTrainStateMagic[9] = "SKATRAIN";
// Version 2 added the loss scaler's growth tracker and the EMA's best top-1; version 1 files are
// still read (no loss scaling or EMA evaluation then: scale 1, tracker 0, no EMA best).
constexpr uint32_t kTrainStateVersion = 2;
constexpr uint32_t kTrainStateOldestVersion = 1;

// A (seed, offset) Philox generator state.
struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Everything besides the weights that a resumed run needs to continue bit for bit.
struct TrainState {
  int64_t epoch = 0;             // the epoch in progress
  int64_t batch = 0;             // batches of `epoch` already consumed (0: epoch not started)
  int64_t step = 0;              // optimizer updates so far
  int64_t steps_per_epoch = 0;   // schedule input: optimizer updates per epoch
  int64_t nonfinite_total = 0;   // skipped steps so far
  double lr = 0.0;               // the last lr set (informational; recomputed from the schedule)
  double best_top1 = -1.0;       // best evaluation top-1 so far (-1: none yet)
  int64_t best_epoch = -1;
  double best_ema_top1 = -1.0;   // the same for the EMA weights (train.ema_decay > 0)
  int64_t best_ema_epoch = -1;
  double loss_scale = 1.0;       // fp16 dynamic loss scale (optim/loss_scaler.h); 1 without
  int64_t loss_scale_growth_tracker = 0;  // finite updates since the scale last changed
  // The epoch in progress's applied updates and their losses' sum so far (a run resumed mid-epoch
  // logs the whole epoch's mean train loss, not the mean since the resume).
  double epoch_loss_sum = 0.0;
  int64_t epoch_loss_updates = 0;
  std::map<std::string, RngState> rngs;           // "host", "cuda:0", "trainer"
  std::map<std::string, Tensor> optimizer;        // Optimizer::state_dict()
  std::map<std::string, std::string> info;        // free-form (config name, optimizer name)
};

// Writes / reads the training-state file. IOError naming the file for unreadable, truncated,
// corrupt (checksum) or foreign files and unsupported versions, and naming the field for counters
// outside [0, 2^48] (-1 allowed for best epochs), a non-finite or negative lr, loss scale or best
// top-1, and tensor counts, dtypes and sizes that the file's bytes cannot hold (checked before
// anything is allocated).
void write_train_state(const std::string& path, const TrainState& state);
TrainState read_train_state(const std::string& path);


// The files of one checkpoint folder.
struct Checkpoint {
  std::string dir;
  TensorMap model;
  TensorMap ema;  // empty when the run has no EMA
  TrainState state;
};

// Writes model.safetensors, ema.safetensors (when `ema` is not empty), train_state.bin, then the
// checkpoint.json marker, into `dir` (created).
void save_checkpoint(const std::string& dir, const TensorMap& model, const TensorMap& ema,
                     const TrainState& state);
// Reads a checkpoint folder; IOError when the marker is missing (an incomplete checkpoint) or a
// file is unreadable or corrupt, naming the file.
Checkpoint load_checkpoint(const std::string& dir);
bool is_complete_checkpoint(const std::string& dir);

// A checkpoint folder from `path`: a checkpoint folder itself, or a run folder (its `last`
// checkpoint, or failing that its newest complete one). IOError when none is found.
std::string resolve_checkpoint(const std::string& path);

// The checkpoints of one run: <run>/checkpoints/step-NNNNNNNN, with `last` and `best` pointer
// files; keeps the `keep` newest plus the best.
class CheckpointManager {
 public:
  CheckpointManager(std::string run_dir, int keep);
  // Saves the checkpoint of `state.step`; updates `last` (and `best` when is_best); prunes.
  std::string save(const TensorMap& model, const TensorMap& ema, const TrainState& state,
                   bool is_best);
  std::string root() const { return root_; }
  // Complete checkpoint folders, oldest first.
  std::vector<std::string> list() const;

 private:
  void prune();
  std::string root_;
  int keep_;
};

}  // namespace ska::train
