// The device-resident training set on the CPU (the kernels' CPU twins): augment_crop_flip against
// a by-hand crop, flip and normalisation; DeviceResidentLoader against the host DataLoader, bit for
// bit, with determinism and resume; data.device_resident validation.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "data/transforms/augment_factory.h"
#include "data/transforms/basic_transforms.h"
#include "data/pipeline/batch_source.h"
#include "data/pipeline/device_resident.h"
#include "data/pipeline/loader.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
using namespace ska::data;

namespace {

// N images H x W x C with pseudo-random bytes (Philox), labels index % 7.
data::InMemoryDataset random_dataset(int64_t n, int64_t h, int64_t w, int64_t c) {
  Tensor images = Tensor::empty({n, h, w, c}, DType::kU8);
  Tensor labels = Tensor::empty({n}, DType::kI64);
  uint8_t* p = images.data<uint8_t>();
  for (int64_t i = 0; i < images.numel(); ++i) {
    p[i] = static_cast<uint8_t>(philox4x32_10(99, static_cast<uint64_t>(i)).w[0] & 0xFF);
  }
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = i % 7;
  return data::InMemoryDataset("random", images, labels, 7);
}

CropFlipParams crop_flip_params(int64_t padding, double flip_p, uint64_t seed, uint64_t epoch,
                                const std::vector<double>& mean, const std::vector<double>& std) {
  CropFlipParams p;
  p.padding = padding;
  p.flip_p = flip_p;
  p.seed = seed;
  p.epoch = epoch;
  for (size_t k = 0; k < mean.size(); ++k) {
    p.scale[k] = static_cast<float>(1.0 / (255.0 * std[k]));
    p.shift[k] = static_cast<float>(-mean[k] / std[k]);
  }
  return p;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

const std::vector<double> kMean{0.4914, 0.4822, 0.4465};
const std::vector<double> kStd{0.2023, 0.1994, 0.2010};

}  // namespace

TEST_CASE("augment_crop_flip equals a by-hand padded crop, flip and normalisation",
          "[cpu][train][device_resident]") {
  const int64_t n = 6, h = 5, w = 5, c = 3, padding = 2;
  const data::InMemoryDataset ds = random_dataset(n, h, w, c);
  const std::vector<int64_t> picks{4, 0, 4, 2, 5, 1, 3};
  const Tensor index =
      Tensor::from_vector(picks, {static_cast<int64_t>(picks.size())}, DType::kI64);
  const CropFlipParams p = crop_flip_params(padding, 0.5, 1234, 3, kMean, kStd);
  Tensor out = Tensor::empty({index.numel(), c, h, w}, DType::kF32);
  cpu::augment_crop_flip(ds.images(), index, p, out);

  std::set<int64_t> tops;
  int flips = 0;
  const uint8_t* px = ds.images().data<uint8_t>();
  for (size_t i = 0; i < picks.size(); ++i) {
    // The host pipeline's draws: RandomCrop's top then left, then the flip's uniform.
    data::SampleRng rng(1234, data::SampleRng::stream_of(3, static_cast<uint64_t>(picks[i])));
    const int top = rng.randint(0, 2 * padding), left = rng.randint(0, 2 * padding);
    const bool flip = rng.uniform() < 0.5;
    tops.insert(top);
    flips += flip;
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t y = 0; y < h; ++y) {
        for (int64_t x = 0; x < w; ++x) {
          // Padded coordinates (top + y, left + x') with x' mirrored when flipped.
          const int64_t sy = top + y - padding, sx = left + (flip ? w - 1 - x : x) - padding;
          const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
          const float byte = inside ? px[((picks[i] * h + sy) * w + sx) * c + k] : 0.0f;
          const float expected = byte * p.scale[k] + p.shift[k];
          const float got = out.data<float>()[((static_cast<int64_t>(i) * c + k) * h + y) * w + x];
          INFO("sample " << i << " channel " << k << " y " << y << " x " << x);
          REQUIRE(got == expected);
        }
      }
    }
  }
  // The draws vary: the comparison above saw crops at several offsets, flipped and not.
  REQUIRE(tops.size() >= 2);
  REQUIRE(flips >= 1);
  REQUIRE(flips < static_cast<int>(picks.size()));
  // The same index twice in a batch is augmented identically (randomness keyed by the index).
  const int64_t plane = c * h * w;
  REQUIRE(std::memcmp(out.data<float>(), out.data<float>() + 2 * plane, plane * sizeof(float)) ==
          0);

  // One value by hand: sample 1 (dataset index 0), channel 0, with the crop and flip undone.
  data::SampleRng rng(1234, data::SampleRng::stream_of(3, 0));
  const int top = rng.randint(0, 4), left = rng.randint(0, 4);
  const bool flip = rng.uniform() < 0.5;
  const int64_t y = padding - top + 1, x = padding - left + 2;  // source pixel (1, 2)
  const int64_t ox = flip ? w - 1 - x : x;
  if (y >= 0 && y < h && ox >= 0 && ox < w) {
    const double byte = px[(1 * w + 2) * c + 0];
    CHECK(out.data<float>()[(plane + y * w + ox)] ==
          Approx((byte / 255.0 - kMean[0]) / kStd[0]).epsilon(1e-6));
  }
}

TEST_CASE("augment_crop_flip: flip only, bf16 output, padding fill and bad arguments",
          "[cpu][train][device_resident]") {
  const data::InMemoryDataset ds = random_dataset(4, 3, 4, 1);
  const Tensor index = Tensor::from_vector(std::vector<int64_t>{0, 1, 2, 3}, {4}, DType::kI64);
  const std::vector<double> mean{0.5}, std{0.25};

  // No padding: no crop draws; the flip takes the first word.
  const CropFlipParams p = crop_flip_params(0, 0.5, 8, 1, mean, std);
  Tensor out = Tensor::empty({4, 1, 3, 4}, DType::kF32);
  cpu::augment_crop_flip(ds.images(), index, p, out);
  int flips = 0;
  for (int64_t i = 0; i < 4; ++i) {
    data::SampleRng rng(8, data::SampleRng::stream_of(1, static_cast<uint64_t>(i)));
    const bool flip = rng.uniform() < 0.5;
    flips += flip;
    for (int64_t y = 0; y < 3; ++y) {
      for (int64_t x = 0; x < 4; ++x) {
        const uint8_t byte = ds.images().data<uint8_t>()[(i * 3 + y) * 4 + (flip ? 3 - x : x)];
        REQUIRE(out.data<float>()[(i * 3 + y) * 4 + x] == byte * p.scale[0] + p.shift[0]);
      }
    }
  }
  REQUIRE(flips > 0);
  REQUIRE(flips < 4);

  // bf16: the f32 values rounded once.
  Tensor half = Tensor::empty({4, 1, 3, 4}, DType::kBF16);
  cpu::augment_crop_flip(ds.images(), index, p, half);
  REQUIRE(same_bytes(half, out.to(DType::kBF16)));

  // Padding 3 around a 3x4 image with a 3x4 crop: pixels outside the image are the fill 0,
  // normalised to shift; somewhere in 4 samples at least one crop reaches into the padding.
  const CropFlipParams padded = crop_flip_params(3, 0.0, 8, 1, mean, std);
  cpu::augment_crop_flip(ds.images(), index, padded, out);
  int fills = 0;
  for (float v : out.to_vector<float>()) fills += v == padded.shift[0];
  REQUIRE(fills > 0);

  const Tensor bad_index = Tensor::from_vector(std::vector<int64_t>{0, 4}, {2}, DType::kI64);
  Tensor two = Tensor::empty({2, 1, 3, 4}, DType::kF32);
  REQUIRE_THROWS_WITH(cpu::augment_crop_flip(ds.images(), bad_index, p, two),
                      Catch::Contains("index 4") && Catch::Contains("[0, 4)"));
  Tensor wrong = Tensor::empty({4, 1, 2, 2}, DType::kF32);
  REQUIRE_THROWS_WITH(cpu::augment_crop_flip(ds.images(), index, p, wrong),
                      Catch::Contains("does not fit"));
  Tensor f64 = Tensor::empty({4, 1, 3, 4}, DType::kF64);
  REQUIRE_THROWS_AS(cpu::augment_crop_flip(ds.images(), index, p, f64), DTypeError);
}

TEST_CASE("DeviceResidentLoader on the CPU gives the host loader's batches bit for bit",
          "[cpu][train][device_resident]") {
  const data::InMemoryDataset ds = random_dataset(50, 8, 8, 3);
  LoaderOptions lo;
  lo.batch_size = 8;
  lo.workers = 0;
  lo.seed = 21;
  lo.mean = kMean;
  lo.std = kStd;
  std::vector<std::unique_ptr<data::Transform>> steps;
  steps.push_back(std::make_unique<data::RandomCrop>(8, 2));
  steps.push_back(std::make_unique<data::RandomHorizontalFlip>(0.5));
  lo.transform = std::make_shared<data::Compose>(std::move(steps));

  for (int rank = 0; rank < 2; ++rank) {
    lo.rank = rank;
    lo.world_size = 2;
    DataLoader host(ds, lo);
    DeviceResidentLoaderOptions o;
    o.batch_size = lo.batch_size;
    o.seed = lo.seed;
    o.rank = rank;
    o.world_size = 2;
    o.mean = kMean;
    o.std = kStd;
    o.crop_padding = 2;
    o.hflip = 0.5;
    DeviceResidentLoader resident(ds, o, Device::cpu());
    REQUIRE(resident.batches_per_epoch() == host.batches_per_epoch());
    REQUIRE(resident.batches_per_epoch() == 3);  // 25 samples per rank, batches of 8
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      host.start_epoch(epoch);
      resident.start_epoch(epoch, 0);
      Batch a, b;
      int64_t count = 0;
      while (host.next(a)) {
        REQUIRE(resident.next(b));
        INFO("rank " << rank << " epoch " << epoch << " batch " << a.index);
        REQUIRE(b.index == a.index);
        REQUIRE(same_bytes(b.images, a.images));
        REQUIRE(same_bytes(b.labels, a.labels));
        ++count;
      }
      REQUIRE_FALSE(resident.next(b));
      REQUIRE(count == 3);
    }
  }
}

TEST_CASE("DeviceResidentLoader is deterministic and resumes at batch k",
          "[cpu][train][device_resident]") {
  const data::InMemoryDataset ds = random_dataset(40, 6, 6, 1);
  DeviceResidentLoaderOptions o;
  o.batch_size = 5;
  o.seed = 3;
  o.mean = {0.3};
  o.std = {0.2};
  o.crop_padding = 1;
  o.hflip = 0.5;
  o.dtype = DType::kBF16;
  auto epoch_batches = [&](int64_t epoch, int64_t start) {
    DeviceResidentLoader loader(ds, o, Device::cpu());
    loader.start_epoch(epoch, start);
    std::vector<Batch> out;
    Batch b;
    while (loader.next(b)) out.push_back(b);
    return out;
  };
  const std::vector<Batch> full = epoch_batches(2, 0);
  REQUIRE(full.size() == 8);
  REQUIRE(full[0].images.dtype() == DType::kBF16);
  const std::vector<Batch> again = epoch_batches(2, 0);
  const std::vector<Batch> resumed = epoch_batches(2, 5);
  REQUIRE(resumed.size() == 3);
  for (size_t i = 0; i < full.size(); ++i) {
    REQUIRE(same_bytes(full[i].images, again[i].images));
    if (i >= 5) {
      REQUIRE(resumed[i - 5].index == static_cast<int64_t>(i));
      REQUIRE(same_bytes(full[i].images, resumed[i - 5].images));
      REQUIRE(same_bytes(full[i].labels, resumed[i - 5].labels));
    }
  }
  // Another epoch shuffles and augments differently.
  const std::vector<Batch> next_epoch = epoch_batches(3, 0);
  REQUIRE_FALSE(same_bytes(full[0].images, next_epoch[0].images));
}

TEST_CASE("data.device_resident is validated against data.augment, the device and the dataset",
          "[cpu][train][device_resident]") {
  auto options = [](const std::string& yaml) {
    const Config config = Config::parse(yaml);
    const ConfigNode data = config.root()["data"];
    const data::TrainAugment augment = data::read_train_augment(data, 32, 3, 10, kMean);
    return DeviceResidentOptions::from_config(data, augment, 32);
  };
  const DeviceResidentOptions off = options("data: {augment: {randaugment: torchvision}}\n");
  REQUIRE_FALSE(off.enabled);
  const DeviceResidentOptions on =
      options("data: {device_resident: true, augment: {crop_padding: 4, hflip: 0.5}}\n");
  REQUIRE(on.enabled);
  REQUIRE(on.crop_padding == 4);
  REQUIRE(on.hflip == 0.5);
  REQUIRE_THROWS_WITH(
      options("data: {device_resident: true, augment: {randaugment: torchvision, hflip: 0.5}}\n"),
      Catch::Contains("data.device_resident") && Catch::Contains("data.augment.randaugment") &&
          Catch::Contains("no CUDA kernels"));
  REQUIRE_THROWS_WITH(
      options("data: {device_resident: true, augment: {random_resized_crop: true}}\n"),
      Catch::Contains("data.device_resident") &&
          Catch::Contains("data.augment.random_resized_crop"));
  REQUIRE_THROWS_AS(options("data: {device_resident: yes please}\n"), ConfigError);

  // On the CPU, or with a dataset that is not in memory, the option is refused.
  const data::InMemoryDataset ds = random_dataset(16, 4, 4, 3);
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.workers = 0;
  lo.mean = kMean;
  lo.std = kStd;
  DataLoader loader(ds, lo);
  REQUIRE_THROWS_WITH(make_batch_source(loader, ds, on, Device::cpu()),
                      Catch::Contains("data.device_resident") && Catch::Contains("CUDA device"));
  struct FolderLike : data::Dataset {
    std::string name_ = "imagenet";
    const std::string& name() const override { return name_; }
    int64_t size() const override { return 16; }
    int64_t num_classes() const override { return 10; }
    int64_t label(int64_t) const override { return 0; }
    data::Sample get(int64_t) const override { return {}; }
  } folder;
  REQUIRE_THROWS_WITH(make_batch_source(loader, folder, on, Device::cuda(0)),
                      Catch::Contains("in-memory") && Catch::Contains("imagenet"));
  // Off on the CPU: the host loader's batches as they are.
  const auto source = make_batch_source(loader, ds, off, Device::cpu());
  source->start_epoch(0, 0);
  Batch b;
  REQUIRE(source->next(b));
  REQUIRE(b.images.device().is_cpu());
  REQUIRE(b.images.shape() == Shape{4, 3, 4, 4});
}

TEST_CASE("the trainer refuses data.device_resident on the CPU and with RandAugment",
          "[cpu][train][device_resident]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  TrainerSetup setup;
  setup.run_dir = test::train_scratch_dir("resident");
  Config on_cpu = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  on_cpu.set("data.device_resident=true");
  REQUIRE_THROWS_WITH(Trainer(on_cpu, setup), Catch::Contains("data.device_resident") &&
                                                  Catch::Contains("needs a CUDA device"));
  Config with_ra = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  with_ra.set("data.device_resident=true");
  with_ra.set("data.augment.randaugment=torchvision");
  REQUIRE_THROWS_WITH(Trainer(with_ra, setup), Catch::Contains("data.device_resident") &&
                                                   Catch::Contains("data.augment.randaugment"));
}
