// The data loader: permutation, sharding, reading or decoding samples, per-sample transforms and
// the worker queue; and the subset view used for folder datasets.
#include "data/pipeline/loader.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/random.h"

namespace ska::data {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  const uint64_t key = seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    // 64 random bits per swap; the modulo bias is below 2^-40 for any realistic n.
    const PhiloxOut r = philox4x32_10(key, static_cast<uint64_t>(i));
    const uint64_t bits = (static_cast<uint64_t>(r.w[0]) << 32) | r.w[1];
    const int64_t j = static_cast<int64_t>(bits % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> shard_indices(const std::vector<int64_t>& order, int rank, int world_size,
                                   bool drop_last, bool pad) {
  SKA_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, ValueError,
            "shard_indices: rank ", rank, " is outside [0, ", world_size, ")");
  const size_t n = order.size(), world = static_cast<size_t>(world_size);
  const size_t r = static_cast<size_t>(rank);
  size_t per_rank = drop_last ? n / world : (n + world - 1) / world;
  if (!drop_last && !pad) per_rank = n / world + (r < n % world ? 1 : 0);
  std::vector<int64_t> out;
  out.reserve(per_rank);
  for (size_t i = 0; i < per_rank; ++i) {
    const size_t pos = i * world + r;
    out.push_back(order[n == 0 ? 0 : pos % n]);
  }
  return out;
}

DataLoader::DataLoader(const Dataset& dataset, LoaderOptions options)
    : dataset_(dataset),
      memory_(dynamic_cast<const InMemoryDataset*>(&dataset)),
      options_(std::move(options)) {
  SKA_CHECK(options_.batch_size > 0, ValueError, "DataLoader: batch_size must be positive, got ",
            options_.batch_size);
  SKA_CHECK(options_.workers >= 0 && options_.prefetch >= 1 && options_.image_size >= 0,
            ValueError, "DataLoader: workers and image_size must be >= 0 and prefetch >= 1");
  // Every worker needs a batch to work on, or the extra ones would idle.
  ahead_ = std::max<int64_t>(options_.prefetch, options_.workers);
  if (options_.eval_transform) {
    const EvalTransform& t = *options_.eval_transform;
    SKA_CHECK(static_cast<int64_t>(t.mean.size()) == t.channels &&
                  static_cast<int64_t>(t.std.size()) == t.channels,
              ValueError, "DataLoader: the eval transform's mean/std need ", t.channels, " values");
  } else if (memory_ != nullptr) {
    const int64_t channels = memory_->images().size(3);
    SKA_CHECK(static_cast<int64_t>(options_.mean.size()) == channels &&
                  static_cast<int64_t>(options_.std.size()) == channels,
              ValueError, "DataLoader: mean/std need ", channels,
              " values (the dataset's channels)");
  } else {
    SKA_CHECK(options_.image_size > 0, ValueError, "DataLoader: ", dataset_.name(),
              " is decoded per sample (images of any size), so the loader needs the image_size "
              "its transform crops to, or an eval transform");
    SKA_CHECK(!options_.mean.empty() && options_.mean.size() == options_.std.size(), ValueError,
              "DataLoader: mean/std need one value per channel, got ", options_.mean.size(),
              " and ", options_.std.size());
  }
  const std::vector<int64_t> dummy(static_cast<size_t>(dataset_.size()));
  shard_size_ = shard_indices(dummy, options_.rank, options_.world_size, options_.drop_last,
                              options_.pad_shards).size();
}

DataLoader::~DataLoader() { stop_workers(); }

int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = static_cast<int64_t>(shard_size_), b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

void DataLoader::start_epoch(int64_t epoch, int64_t start_batch) {
  stop_workers();
  SKA_CHECK(start_batch >= 0 && start_batch <= batches_per_epoch(), ValueError,
            "DataLoader: start batch ", start_batch, " is outside [0, ", batches_per_epoch(), "]");
  epoch_ = epoch;
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = epoch_permutation(dataset_.size(), options_.seed, epoch);
  } else {
    order.resize(static_cast<size_t>(dataset_.size()));
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  }
  indices_ = shard_indices(order, options_.rank, options_.world_size, options_.drop_last,
                           options_.pad_shards);
  next_to_make_ = next_to_return_ = start_batch;
  end_batch_ = batches_per_epoch();
  ready_.clear();
  error_ = nullptr;
  stopping_ = false;
  for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  consumed_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

void DataLoader::worker_loop() {
  for (;;) {
    int64_t b = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      consumed_.wait(lock, [&] {
        return stopping_ || next_to_make_ >= end_batch_ ||
               next_to_make_ < next_to_return_ + ahead_;
      });
      if (stopping_ || next_to_make_ >= end_batch_) return;
      b = next_to_make_++;
    }
    try {
      Batch batch = make_batch(b);
      std::lock_guard<std::mutex> lock(mu_);
      ready_.emplace(b, std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    produced_.notify_all();
  }
}

bool DataLoader::next(Batch& out) {
  if (next_to_return_ >= end_batch_) return false;
  if (threads_.empty()) {
    out = make_batch(next_to_return_++);
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  produced_.wait(lock, [&] { return error_ || ready_.count(next_to_return_) > 0; });
  if (error_) std::rethrow_exception(error_);
  auto it = ready_.find(next_to_return_);
  out = std::move(it->second);
  ready_.erase(it);
  ++next_to_return_;
  lock.unlock();
  consumed_.notify_all();
  return true;
}

namespace {

// A copy of `h` x `w` x `c` uint8 pixels (row-major HWC) as an Image.
data::Image image_of(const uint8_t* pixels, int64_t h, int64_t w, int64_t c) {
  Image image;
  image.height = static_cast<int>(h);
  image.width = static_cast<int>(w);
  image.channels = static_cast<int>(c);
  image.pixels.assign(pixels, pixels + h * w * c);
  return image;
}

}  // namespace

data::Image DataLoader::read_image(int64_t index, int64_t* label) const {
  if (memory_ != nullptr) {
    const Tensor& all = memory_->images();
    const int64_t h = all.size(1), w = all.size(2), c = all.size(3);
    *label = memory_->labels().data<int64_t>()[index];
    return image_of(all.data<uint8_t>() + index * h * w * c, h, w, c);
  }
  const Sample sample = dataset_.get(index);  // decodes; IOError naming the file
  return image_of_sample(sample, index, label);
}

data::Image DataLoader::read_image_window(int64_t index, const WindowFirst& transform,
                                          SampleRng& rng, int64_t* label) const {
  const Sample sample = dataset_.get_window(
      index, [&](int height, int width) { return transform.draw_window(height, width, rng); });
  return image_of_sample(sample, index, label);
}

data::Image DataLoader::image_of_sample(const Sample& sample, int64_t index, int64_t* label) const {
  SKA_CHECK(sample.image.dtype() == DType::kU8 && sample.image.dim() == 3, ValueError,
            "DataLoader: ", dataset_.name(), " sample ", index,
            " is not a uint8 [H, W, C] image");
  const Tensor pixels = sample.image.contiguous();
  *label = sample.label;
  return image_of(pixels.data<uint8_t>(), pixels.size(0), pixels.size(1), pixels.size(2));
}

Batch DataLoader::make_batch(int64_t b) const {
  const int64_t first = b * options_.batch_size;
  const int64_t count =
      std::min<int64_t>(options_.batch_size, static_cast<int64_t>(indices_.size()) - first);
  const EvalTransform* eval = options_.eval_transform.get();
  Batch batch;
  batch.index = b;
  batch.labels = Tensor::empty({count}, DType::kI64);
  if (eval != nullptr) {
    batch.images = Tensor::empty({count, eval->channels, eval->image_size, eval->image_size},
                                 DType::kF32);
  }
  std::vector<Image> images(eval != nullptr ? 0 : static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = indices_[static_cast<size_t>(first + i)];
    Image image;
    if (eval != nullptr) {  // preprocessed at once: a decoded full-size image is not kept
      image = read_image(index, batch.labels.data<int64_t>() + i);
      const Tensor chw = preprocess_pixels(image.pixels.data(), image.height, image.width,
                                                 image.channels, *eval);
      std::memcpy(batch.images.data<float>() + i * chw.numel(), chw.data<float>(),
                  static_cast<size_t>(chw.numel()) * sizeof(float));
      continue;
    }
    if (options_.transform) {
      SampleRng rng(options_.seed, SampleRng::stream_of(static_cast<uint64_t>(epoch_),
                                                                    static_cast<uint64_t>(index)));
      const WindowFirst* windowed = memory_ == nullptr && options_.decode_windows
                                        ? options_.transform->window_first()
                                        : nullptr;
      if (windowed != nullptr) {
        image = read_image_window(index, *windowed, rng, batch.labels.data<int64_t>() + i);
        windowed->apply_to_window(image, rng);
      } else {
        image = read_image(index, batch.labels.data<int64_t>() + i);
        options_.transform->apply(image, rng);
      }
    } else {
      image = read_image(index, batch.labels.data<int64_t>() + i);
    }
    const int64_t size = options_.image_size;
    SKA_CHECK(size == 0 || (image.height == size && image.width == size), ValueError,
              "DataLoader: ", dataset_.name(), " sample ", index, " is ", image.height, "x",
              image.width, " after the per-sample transform; batches need ", size, "x", size,
              " images (datasets of varying image sizes need a crop to that size: "
              "data.augment.random_resized_crop: true)");
    images[static_cast<size_t>(i)] = std::move(image);
  }
  if (eval == nullptr) {
    batch.images = to_normalized_batch(images, options_.mean, options_.std);
  }
  return batch;
}

SubsetDataset::SubsetDataset(std::unique_ptr<Dataset> base, std::vector<int64_t> indices)
    : base_(std::move(base)), indices_(std::move(indices)) {
  for (int64_t i : indices_) {
    SKA_CHECK(i >= 0 && i < base_->size(), ValueError, "subset of ", base_->name(), ": index ", i,
              " is outside [0, ", base_->size(), ")");
  }
}

int64_t SubsetDataset::base_index(int64_t index) const {
  SKA_CHECK(index >= 0 && index < size(), ValueError, "subset of ", base_->name(),
            ": sample index ", index, " is outside [0, ", size(), ")");
  return indices_[static_cast<size_t>(index)];
}

std::vector<int64_t> spread_indices(int64_t n, int64_t count) {
  if (count <= 0 || count >= n) count = n;
  std::vector<int64_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<size_t>(i)] = i * n / count;
  return out;
}

}  // namespace ska::data
