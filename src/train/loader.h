// The input pipeline for in-memory datasets: a deterministic (seed, epoch) shuffle, sharding by
// rank, worker threads that augment and normalise batches ahead of the consumer, exact resume.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/tensor.h"
#include "data/datasets/dataset.h"
#include "data/transforms/transform.h"

namespace ska::train {

// The order of `n` indices in epoch `epoch`: a Fisher-Yates shuffle driven by Philox words keyed
// by (seed, epoch), so it is the same on every machine and every run.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// The indices rank `rank` of `world_size` reads from `order` (PyTorch's DistributedSampler):
// order[rank], order[rank + world], ...; with drop_last the tail that does not divide evenly is
// dropped, otherwise the order is padded from its start so every rank gets the same count.
std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, int rank, int world_size,
                                   bool drop_last);

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;     // false: dataset order (evaluation)
  bool drop_last = true;   // drop the last partial batch (training)
  int workers = 2;         // 0: batches are built on the consumer's thread
  int prefetch = 4;        // batches produced ahead of the consumer (per loader)
  uint64_t seed = 0;       // shuffle and augmentation
  int rank = 0, world_size = 1;
  std::vector<double> mean, std;  // per channel, applied after the transform
  std::shared_ptr<const data::Transform> transform;  // per sample; null: none
};

// One batch: images f32 [B, C, H, W] (normalised), labels i64 [B], both on the CPU.
struct Batch {
  Tensor images;
  Tensor labels;
  int64_t index = 0;  // the batch's position in the epoch
};

class DataLoader {
 public:
  // `dataset` must outlive the loader. Images must all have the dataset's one size.
  DataLoader(const data::InMemoryDataset& dataset, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int64_t batches_per_epoch() const;
  int64_t samples_per_epoch() const { return static_cast<int64_t>(shard_size_); }
  const LoaderOptions& options() const { return options_; }

  // Starts epoch `epoch` at batch `start_batch` (a resumed run starts where it stopped); the
  // batches are those the uninterrupted epoch would give from that position on.
  void start_epoch(int64_t epoch, int64_t start_batch = 0);
  // The next batch of the current epoch; false at its end. Rethrows a worker's exception.
  bool next(Batch& out);

  // Builds batch `b` of the current epoch directly (what the workers run).
  Batch make_batch(int64_t b) const;

 private:
  void stop_workers();
  void worker_loop();

  const data::InMemoryDataset& dataset_;
  LoaderOptions options_;
  size_t shard_size_ = 0;
  int64_t epoch_ = 0;
  std::vector<int64_t> indices_;  // this rank's indices for the current epoch

  // Worker state (guarded by mu_).
  std::mutex mu_;
  std::condition_variable produced_, consumed_;
  std::vector<std::thread> threads_;
  std::map<int64_t, Batch> ready_;
  int64_t next_to_make_ = 0;     // the next batch a worker claims
  int64_t next_to_return_ = 0;   // the next batch next() returns
  int64_t end_batch_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

}  // namespace ska::train
