// The input pipeline: a deterministic (seed, epoch) shuffle, sharding by rank, worker threads that
// read (in-memory) or decode (folder datasets), augment and normalise batches ahead, exact resume.
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
#include "data/eval_transform.h"
#include "data/transforms/transform.h"

namespace ska::data {

// The order of `n` indices in epoch `epoch`: a Fisher-Yates shuffle driven by Philox words keyed
// by (seed, epoch), so it is the same on every machine and every run.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// The indices rank `rank` of `world_size` reads from `order` (PyTorch's DistributedSampler):
// order[rank], order[rank + world], ...; with drop_last the tail that does not divide evenly is
// dropped, otherwise the order is padded from its start so every rank gets the same count, or,
// with pad false, the first n % world ranks get one index more (every index exactly once: exact
// distributed evaluation).
std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, int rank, int world_size,
                                   bool drop_last, bool pad = true);

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;     // false: dataset order (evaluation)
  bool drop_last = true;   // drop the last partial batch (training)
  int workers = 2;         // 0: batches are built on the consumer's thread
  int prefetch = 4;        // batches produced ahead of the consumer (at least `workers`)
  uint64_t seed = 0;       // shuffle and augmentation
  int rank = 0, world_size = 1;
  bool pad_shards = true;  // without drop_last: pad shards to equal size (false: uneven shards)
  std::vector<double> mean, std;  // per channel, applied after the transform
  std::shared_ptr<const Transform> transform;  // per sample; null: none
  // The side every image must have after `transform` (0: no check). Datasets decoded per sample
  // (images of any size) need it, or `eval_transform`.
  int64_t image_size = 0;
  // Evaluation preprocessing (resize the shorter side to image_size / crop_pct, centre crop,
  // normalise with its own mean/std), used instead of `transform`, `mean` and `std`. Null: off.
  std::shared_ptr<const EvalTransform> eval_transform;
  // When `transform` starts by drawing a window from the image's size (RandomResizedCrop), decode
  // only that window (Dataset::get_window: JPEG files skip the rest). The same pixels either way;
  // false decodes every image whole (benchmark_loader compares the two).
  bool decode_windows = true;
};

// One batch: images f32 [B, C, H, W] (normalised), labels i64 [B], both on the CPU.
struct Batch {
  Tensor images;
  Tensor labels;
  int64_t index = 0;  // the batch's position in the epoch
};

class DataLoader {
 public:
  // `dataset` must outlive the loader. An InMemoryDataset is read from its tensors; any other
  // dataset is decoded with get(index) (or get_window, see decode_windows) in the workers, then
  // transformed to options.image_size (or preprocessed by options.eval_transform). A sample depends
  // only on (seed, epoch, index).
  DataLoader(const Dataset& dataset, LoaderOptions options);
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
  Image read_image(int64_t index, int64_t* label) const;  // as stored, before transforms
  // The window `transform` draws (with `rng`) of the image, decoded alone where the format allows.
  Image read_image_window(int64_t index, const WindowFirst& transform, SampleRng& rng,
                          int64_t* label) const;
  Image image_of_sample(const Sample& sample, int64_t index, int64_t* label) const;

  const Dataset& dataset_;
  const InMemoryDataset* memory_ = nullptr;  // the fast path when the dataset is in memory
  int64_t ahead_ = 4;  // batches made ahead of the consumer: max(prefetch, workers)
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

// The samples `indices` of another dataset, in that order (folder datasets with
// data.train_subset / data.eval_subset).
class SubsetDataset : public Dataset {
 public:
  // ValueError naming the base dataset when an index is outside it.
  SubsetDataset(std::unique_ptr<Dataset> base, std::vector<int64_t> indices);
  const std::string& name() const override { return base_->name(); }
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  int64_t num_classes() const override { return base_->num_classes(); }
  int64_t label(int64_t index) const override { return base_->label(base_index(index)); }
  Sample get(int64_t index) const override { return base_->get(base_index(index)); }
  Sample get_window(int64_t index, const WindowChooser& choose) const override {
    return base_->get_window(base_index(index), choose);
  }

 private:
  int64_t base_index(int64_t index) const;

  std::unique_ptr<Dataset> base_;
  std::vector<int64_t> indices_;
};

// `count` indices spread evenly over [0, n): floor(i * n / count); all of them when count is 0
// or >= n. Folder datasets are sorted by class, so a subset keeps the classes' proportions.
std::vector<int64_t> spread_indices(int64_t n, int64_t count);

}  // namespace ska::data
