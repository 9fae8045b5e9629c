// GPU input pipeline: augment_crop_flip on CUDA against its CPU twin (bit-exact), the
// device-resident loader against its CPU run, CopyStream uploads, and the pinned prefetcher
// against the host loader (same bytes, no cudaMalloc or cudaHostAlloc in the steady state).
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/copy_stream.h"
#include "core/allocator.h"
#include "data/transforms/basic_transforms.h"
#include "support/test_util.h"
#include "data/pipeline/device_prefetcher.h"
#include "data/pipeline/device_resident.h"
#include "data/pipeline/loader.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

#ifdef SKA_WITH_CUDA

using namespace ska;
using namespace ska::train;
using namespace ska::data;

namespace {

const Device kGpu = Device::cuda(0);
const std::vector<double> kMean{0.4914, 0.4822, 0.4465};
const std::vector<double> kStd{0.2023, 0.1994, 0.2010};

data::InMemoryDataset random_dataset(int64_t n, int64_t h, int64_t w, int64_t c) {
  Tensor images = Tensor::empty({n, h, w, c}, DType::kU8);
  Tensor labels = Tensor::empty({n}, DType::kI64);
  uint8_t* p = images.data<uint8_t>();
  for (int64_t i = 0; i < images.numel(); ++i) {
    p[i] = static_cast<uint8_t>(philox4x32_10(5, static_cast<uint64_t>(i)).w[1] & 0xFF);
  }
  for (int64_t i = 0; i < n; ++i) labels.data<int64_t>()[i] = i % 10;
  return data::InMemoryDataset("random", images, labels, 10);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

CropFlipParams params(int64_t padding, double flip_p, int64_t channels) {
  CropFlipParams p;
  p.padding = padding;
  p.flip_p = flip_p;
  p.seed = 77;
  p.epoch = 4;
  for (int64_t k = 0; k < channels; ++k) {
    p.scale[k] = static_cast<float>(1.0 / (255.0 * kStd[k]));
    p.shift[k] = static_cast<float>(-kMean[k] / kStd[k]);
  }
  return p;
}

}  // namespace

TEST_CASE("cuda augment_crop_flip equals the CPU twin bit for bit", "[cuda][device_resident]") {
  if (!test::cuda_available_or_skip()) return;
  const data::InMemoryDataset ds = random_dataset(300, 32, 32, 3);
  const Tensor index = Tensor::from_vector(epoch_permutation(300, 9, 0), {300}, DType::kI64);
  const Tensor images_gpu = ds.images().to(kGpu), index_gpu = index.to(kGpu);
  for (const auto& [padding, flip] :
       std::vector<std::pair<int64_t, double>>{{4, 0.5}, {0, 0.5}, {2, 0.0}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      INFO("padding " << padding << " flip " << flip << " " << dtype_name(dt));
      const CropFlipParams p = params(padding, flip, 3);
      Tensor cpu_out = Tensor::empty({300, 3, 32, 32}, dt);
      Tensor gpu_out = Tensor::empty({300, 3, 32, 32}, dt, kGpu);
      cpu::augment_crop_flip(ds.images(), index, p, cpu_out);
      cuda::augment_crop_flip(images_gpu, index_gpu, p, gpu_out);
      REQUIRE(same_bytes(gpu_out, cpu_out));
    }
  }
  // A smaller crop than the padded image (range > 2 * padding) and one channel.
  const data::InMemoryDataset grey = random_dataset(20, 9, 7, 1);
  const Tensor idx = Tensor::arange(20, DType::kI64);
  const CropFlipParams p = params(3, 0.5, 1);
  Tensor cpu_out = Tensor::empty({20, 1, 8, 6}, DType::kF32);
  Tensor gpu_out = Tensor::empty({20, 1, 8, 6}, DType::kF32, kGpu);
  cpu::augment_crop_flip(grey.images(), idx, p, cpu_out);
  cuda::augment_crop_flip(grey.images().to(kGpu), idx.to(kGpu), p, gpu_out);
  REQUIRE(same_bytes(gpu_out, cpu_out));
  // An out-of-range index gives a zero sample on CUDA (no host check in the step).
  const Tensor bad = Tensor::from_vector(std::vector<int64_t>{1, 20}, {2}, DType::kI64).to(kGpu);
  Tensor two = Tensor::full({2, 1, 8, 6}, 7.0, DType::kF32, kGpu);
  cuda::augment_crop_flip(grey.images().to(kGpu), bad, p, two);
  const std::vector<float> v = two.to_vector<float>();
  for (size_t i = 48; i < 96; ++i) REQUIRE(v[i] == 0.0f);
  REQUIRE(std::memcmp(v.data(), cpu_out.data<float>() + 48, 48 * sizeof(float)) == 0);
}

TEST_CASE("cuda DeviceResidentLoader gives the CPU run's batches, also when resumed",
          "[cuda][device_resident]") {
  if (!test::cuda_available_or_skip()) return;
  const data::InMemoryDataset ds = random_dataset(200, 32, 32, 3);
  DeviceResidentLoaderOptions o;
  o.batch_size = 32;
  o.seed = 11;
  o.mean = kMean;
  o.std = kStd;
  o.crop_padding = 4;
  o.hflip = 0.5;
  DeviceResidentLoader on_cpu(ds, o, Device::cpu()), on_gpu(ds, o, kGpu);
  for (int64_t start : {0, 4}) {
    on_cpu.start_epoch(1, start);
    on_gpu.start_epoch(1, start);
    Batch a, b;
    int64_t count = 0;
    while (on_cpu.next(a)) {
      REQUIRE(on_gpu.next(b));
      REQUIRE(b.images.device() == kGpu);
      REQUIRE(b.index == a.index);
      REQUIRE(same_bytes(b.images, a.images));
      REQUIRE(same_bytes(b.labels, a.labels));
      ++count;
    }
    REQUIRE_FALSE(on_gpu.next(b));
    REQUIRE(count == 6 - start);
  }
}

TEST_CASE("cuda CopyStream uploads pinned tensors behind the compute stream",
          "[cuda][device_resident]") {
  if (!test::cuda_available_or_skip()) return;
  CopyStream copies(kGpu);
  Tensor host = Tensor::empty_pinned({1 << 20}, DType::kF32);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = static_cast<float>(i % 1000);
  Tensor dst = Tensor::zeros({1 << 20}, DType::kF32, kGpu);  // queued on the compute stream
  copies.upload(1, {host}, {dst});
  copies.stream_wait(1);
  // Work on the compute stream after the wait sees the upload.
  const Tensor copy = dst.clone();
  REQUIRE(same_bytes(copy, host));
  copies.host_wait(1);
  REQUIRE_THROWS_AS(copies.upload(2, {host}, {dst}), ValueError);
  REQUIRE_THROWS_AS(copies.upload(0, {host}, {Tensor::zeros({3}, DType::kF32, kGpu)}), ValueError);
}

TEST_CASE("cuda DevicePrefetcher hands out the host loader's batches without new allocations",
          "[cuda][device_resident]") {
  if (!test::cuda_available_or_skip()) return;
  const data::InMemoryDataset ds = random_dataset(320, 32, 32, 3);
  LoaderOptions lo;
  lo.batch_size = 32;
  lo.workers = 2;
  lo.seed = 5;
  lo.mean = kMean;
  lo.std = kStd;
  std::vector<std::unique_ptr<data::Transform>> steps;
  steps.push_back(std::make_unique<data::RandomCrop>(32, 4));
  steps.push_back(std::make_unique<data::RandomHorizontalFlip>(0.5));
  lo.transform = std::make_shared<data::Compose>(std::move(steps));
  DataLoader reference(ds, lo), feeding(ds, lo);
  DevicePrefetcher prefetcher(feeding, kGpu);

  auto run_epoch = [&](int64_t epoch, int64_t start, int64_t stop_after) {
    reference.start_epoch(epoch, start);
    prefetcher.start_epoch(epoch, start);
    Batch a, b;
    int64_t count = 0;
    while (count < stop_after && reference.next(a)) {
      REQUIRE(prefetcher.next(b));
      REQUIRE(b.images.device() == kGpu);
      REQUIRE(b.labels.device() == kGpu);
      REQUIRE(b.index == a.index);
      // A kernel on the compute stream reads the batch: it must see the finished upload.
      REQUIRE(same_bytes(b.images.clone(), a.images));
      REQUIRE(same_bytes(b.labels, a.labels));
      ++count;
    }
    return count;
  };
  REQUIRE(run_epoch(0, 0, 100) == 10);
  REQUIRE(run_epoch(1, 0, 3) == 3);    // stopped early: a prefetched batch is pending
  REQUIRE(run_epoch(1, 3, 100) == 7);  // resumed at batch 3
  // The steady state allocates from the caches only.
  const int64_t device_allocs = allocator_for(kGpu).stats().num_system_allocs;
  const int64_t pinned_allocs = pinned_host_allocator().stats().num_system_allocs;
  REQUIRE(run_epoch(2, 0, 100) == 10);
  CHECK(allocator_for(kGpu).stats().num_system_allocs == device_allocs);
  CHECK(pinned_host_allocator().stats().num_system_allocs == pinned_allocs);
}

TEST_CASE("cuda training from the device-resident set matches the pinned host pipeline",
          "[cuda][device_resident][train]") {
  if (!test::cuda_available_or_skip()) return;
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // The same 20 updates, batches from the host loader (pinned uploads) and from the GPU copy.
  auto train = [](bool resident) {
    Config config = Config::parse(test::tiny_experiment_yaml(640, 100, 32, 1, 0.0));
    config.set(std::string("data.device_resident=") + (resident ? "true" : "false"));
    config.set("train.max_steps=20");
    TrainerSetup setup;
    setup.run_dir = test::train_scratch_dir(resident ? "resident" : "pinned");
    setup.device = kGpu;
    Trainer trainer(config, setup);
    const TrainResult r = trainer.fit();
    REQUIRE(r.steps == 20);
    return trainer.model().state_dict();
  };
  const auto pinned = train(false);
  const auto resident = train(true);
  REQUIRE(pinned.size() == resident.size());
  for (const auto& [name, t] : pinned) {
    test::require_close(resident.at(name), t, test::tolerance_for(DType::kF32), name);
  }
}

#endif  // SKA_WITH_CUDA
