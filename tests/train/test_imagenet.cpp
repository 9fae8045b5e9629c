// ImageNet in the trainer: the streaming loader on a tiny class-per-folder set of JPEGs of
// different sizes (shapes, determinism, workers, resume, the eval transform, a corrupt file),
// a tiny model trained and resumed from it, and every configs/imagenet_*.yaml validated.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "data/datasets/factory.h"
#include "data/datasets/image_decode.h"
#include "data/datasets/image_folder.h"
#include "data/eval_transform.h"
#include "data/pipeline/loader.h"
#include "data/transforms/augment_factory.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
using namespace ska::data;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

const std::vector<double> kMean = {0.485, 0.456, 0.406}, kStd = {0.229, 0.224, 0.225};

// Loads configs/<name>, checks every key the way the trainer does (options of every section, the
// model built, no key left unread) and returns the options.
struct CheckedConfig {
  DataOptions data;
  TrainOptions train;
  optim::OptimizerOptions optim;
  optim::ScheduleOptions sched;
  double drop_path = 0.0, head_dropout = 0.0;
};

CheckedConfig check_experiment_config(const std::string& path) {
  Config config = Config::load(path);
  // A narrower, shallower model reads exactly the same keys as the real one, in a fraction of the
  // time; the real models' parameter counts are tested in tests/models.
  config.set("model.depths=[1, 1, 1, 1]");
  config.set("model.dims=[32, 64, 96, 128]");
  const ConfigNode root = config.root();
  const ConfigNode model = root["model"];
  CheckedConfig c;
  c.train = TrainOptions::from_config(root["train"]);
  c.data = DataOptions::from_config(root["data"], model.get<int64_t>("image_size"),
                                    model.get<int64_t>("in_channels"),
                                    model.get<int64_t>("num_classes"));
  c.optim = optim::OptimizerOptions::from_config(root["optim"]);
  c.sched = optim::ScheduleOptions::from_config(root["sched"], c.optim.lr, c.train.epochs);
  CheckpointOptions::from_config(root["checkpoint"]);
  c.drop_path = model.get<double>("drop_path_rate");
  c.head_dropout = model.get<double>("head_dropout");
  models::build_model(model);
  config.check_unused();
  return c;
}

}  // namespace

TEST_CASE("every configs/imagenet_*.yaml validates and carries the MetaFormer recipe",
          "[cpu][train]") {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(std::string(SKA_SOURCE_DIR) + "/configs")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("imagenet_", 0) == 0 && entry.path().extension() == ".yaml")
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  // Table 2 (6 + ConvFormer), Table 4 (4 ablations besides the softmax row), Table 5 (7 layouts).
  REQUIRE(names.size() == 18);
  for (const std::string& name : names) {
    INFO(name);
    const CheckedConfig c =
        check_experiment_config(std::string(SKA_SOURCE_DIR) + "/configs/" + name);
    const bool b36 = name.find("_b36") != std::string::npos;
    const bool convformer = name.find("convformer") != std::string::npos;
    const bool table5 = name.find("table5") != std::string::npos;
    CHECK(c.data.dataset == "imagenet");
    // Global batch 4096 = 8 GPUs x 128 x accumulate 4.
    CHECK(c.data.batch_size * c.train.accumulate * 8 == 4096);
    CHECK(c.data.batch_size == 128);
    CHECK(c.train.epochs == (table5 ? 160 : 300));
    CHECK(c.sched.cooldown_epochs == 10);
    CHECK(c.sched.name == "cosine");
    CHECK(!c.sched.per_step);
    CHECK(c.sched.warmup_epochs == 20);
    CHECK(c.sched.warmup_lr == Approx(1e-6));
    CHECK(c.sched.min_lr == Approx(1e-5));
    CHECK(c.optim.name == (convformer ? "adamw" : "lamb"));
    CHECK(c.optim.lr == Approx(convformer ? 4e-3 : 8e-3));
    CHECK(c.optim.weight_decay == Approx(0.05));
    CHECK(c.train.label_smoothing == Approx(0.1));
    CHECK(c.train.precision == Precision::kBF16);
    CHECK(c.drop_path == Approx(b36 ? 0.6 : 0.15));
    CHECK(c.head_dropout == Approx(b36 ? 0.5 : 0.0));
    CHECK(c.data.eval.image_size == 224);
    CHECK(c.data.eval.crop_pct == 1.0);
    CHECK(c.data.eval.interpolation == data::Interpolation::kBicubic);
    CHECK(c.data.augment.steps ==
          std::vector<std::string>{"RandomResizedCrop", "RandomHorizontalFlip", "TimmRandAugment"});
    REQUIRE(c.data.augment.erasing);
    CHECK(c.data.augment.erasing->options().probability == Approx(0.25));
    REQUIRE(c.data.augment.mixup);
    CHECK(c.data.augment.mixup->options().mixup_alpha == Approx(0.8));
    CHECK(c.data.augment.mixup->options().cutmix_alpha == Approx(1.0));
    CHECK(c.data.augment.mixup->options().label_smoothing == Approx(0.1));
  }
}

namespace {

const int kSizes[][2] = {{20, 28}, {40, 24}, {24, 24}, {32, 20}, {18, 36}};

// A JPEG of h x w whose colours depend on the class, with a gradient and seeded noise.
void write_image(const std::string& path, int h, int w, int label, int seed) {
  std::vector<uint8_t> rgb(static_cast<size_t>(h) * w * 3);
  uint32_t state = static_cast<uint32_t>(seed) * 2654435761u + 1;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      state = state * 1664525u + 1013904223u;  // a small LCG: the noise only has to be seeded
      const int noise = static_cast<int>((state >> 16) % 24);
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>((x * y + 40 * label) % 256);
      p[1] = static_cast<uint8_t>((200 - 70 * label + 5 * y) % 256);
      p[2] = static_cast<uint8_t>((30 + 90 * label + 4 * x + noise) % 256);
    }
  }
  const std::vector<uint8_t> file = data::encode_jpeg_rgb(rgb.data(), h, w, 95);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  REQUIRE(out.good());
}

// root/train/{n01,n02,n03}/ with 16 images and root/val/ with 6, sizes cycling through kSizes.
std::string make_tiny_imagenet(const std::string& dir) {
  const std::string root = dir + "/imagenet";
  const int train_counts[3] = {6, 6, 4}, val_counts[3] = {2, 2, 2};
  int seed = 0;
  for (const std::string split : {"train", "val"}) {
    for (int label = 0; label < 3; ++label) {
      const std::string folder = root + "/" + split + "/n0" + std::to_string(label + 1);
      fs::create_directories(folder);
      const int count = (split == "train" ? train_counts : val_counts)[label];
      for (int i = 0; i < count; ++i, ++seed) {
        const int* size = kSizes[seed % 5];
        write_image(folder + "/img" + std::to_string(i) + ".JPEG", size[0], size[1], label, seed);
      }
    }
  }
  return root;
}

LoaderOptions streaming_options(int workers, std::shared_ptr<const data::Transform> transform) {
  LoaderOptions o;
  o.batch_size = 4;
  o.workers = workers;
  o.seed = 5;
  o.image_size = 16;
  o.mean = kMean;
  o.std = kStd;
  o.transform = std::move(transform);
  return o;
}

std::shared_ptr<const data::Transform> rrc_flip() {
  const Config c = Config::parse("augment: {random_resized_crop: true, hflip: 0.5}");
  return data::read_train_augment(c.root(), 16, 3, 3, kMean).transform;
}

struct EpochData {
  std::vector<std::vector<float>> images;
  std::vector<int64_t> labels;
};

EpochData run_epoch(DataLoader& loader, int64_t epoch, int64_t start = 0) {
  loader.start_epoch(epoch, start);
  EpochData out;
  Batch b;
  while (loader.next(b)) {
    REQUIRE(b.images.shape() == Shape{4, 3, 16, 16});
    REQUIRE(b.labels.shape() == Shape{4});
    out.images.push_back(b.images.to_vector<float>());
    for (int64_t y : b.labels.to_vector<int64_t>()) out.labels.push_back(y);
  }
  return out;
}

// A tiny CSKA-ViT (16x16 input, 4x4 patches) on the tiny folder with the ImageNet augmentation.
std::string tiny_imagenet_yaml(const std::string& root) {
  const std::string model =
      "model: {family: vit, image_size: 16, in_channels: 3, num_classes: 3, patch_size: 4,\n"
      "        dim: 16, depth: 1, heads: 2, head_dim: 8, mlp_dim: 32, dropout: 0.1,\n"
      "        emb_dropout: 0.0, mixer: {type: cska}}\n";
  return model + "data:\n  dataset: imagenet\n  root: " + root + "\n" +
         "  batch_size: 4\n  eval_batch_size: 4\n  workers: 2\n"
         "  mean: [0.485, 0.456, 0.406]\n  std: [0.229, 0.224, 0.225]\n"
         "  crop_pct: 0.875\n  interpolation: bicubic\n"
         "  augment: {random_resized_crop: true, hflip: 0.5, randaugment: rand-m9-mstd0.5-inc1,\n"
         "            random_erasing: 0.25}\n"
         "  mixup: {mixup_alpha: 0.8, cutmix_alpha: 1.0}\n"
         "optim: {name: lamb, lr: 1.0e-3, weight_decay: 0.05}\n"
         "sched: {name: cosine, warmup_epochs: 1, warmup_lr: 1.0e-6, min_lr: 1.0e-5}\n"
         "train: {epochs: 2, seed: 3, label_smoothing: 0.1, log_every: 1}\n"
         "checkpoint: {keep: 2}\n";
}

}  // namespace

TEST_CASE("streaming loader on an image folder: shapes, determinism, workers and resume",
          "[cpu][train]") {
  const std::string root = make_tiny_imagenet(test::train_scratch_dir("imagenet_loader"));
  const data::ImageFolderDataset ds = data::read_imagenet(root, data::Split::kTrain);
  REQUIRE(ds.size() == 16);
  DataLoader serial(ds, streaming_options(0, rrc_flip()));
  DataLoader threaded(ds, streaming_options(3, rrc_flip()));
  REQUIRE(serial.batches_per_epoch() == 4);
  const EpochData e0 = run_epoch(serial, 0);
  REQUIRE(e0.images.size() == 4);
  // Every sample once per epoch, with its folder's label.
  std::vector<int64_t> sorted = e0.labels;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted == std::vector<int64_t>{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2});
  // Workers decode and augment exactly as the consumer's thread does; epochs repeat exactly.
  const EpochData t0 = run_epoch(threaded, 0);
  REQUIRE(t0.images == e0.images);
  REQUIRE(t0.labels == e0.labels);
  REQUIRE(run_epoch(threaded, 0).images == e0.images);
  const EpochData e1 = run_epoch(threaded, 1);
  REQUIRE(e1.labels != e0.labels);  // another shuffle (fixed seeds: checked to differ)
  for (size_t b = 0; b < 4; ++b) REQUIRE(e1.images[b] != e0.images[b]);
  // Another seed crops differently even in dataset order.
  LoaderOptions other = streaming_options(0, rrc_flip());
  other.seed = 6;
  DataLoader reseeded(ds, other);
  REQUIRE(run_epoch(reseeded, 0).images != e0.images);
  // Resuming mid-epoch gives the batches the full epoch gave from there on.
  const EpochData tail = run_epoch(threaded, 1, 2);
  REQUIRE(tail.images.size() == 2);
  REQUIRE(tail.images[0] == e1.images[2]);
  REQUIRE(tail.images[1] == e1.images[3]);

  // Images of varying size need a crop to image_size; without one the batch names the sample.
  DataLoader uncropped(ds, streaming_options(0, nullptr));
  uncropped.start_epoch(0);
  Batch b;
  REQUIRE_THROWS_WITH(uncropped.next(b), Contains("imagenet sample") &&
                                             Contains("batches need 16x16") &&
                                             Contains("random_resized_crop"));
  LoaderOptions no_size = streaming_options(0, rrc_flip());
  no_size.image_size = 0;
  REQUIRE_THROWS_WITH(DataLoader(ds, no_size), Contains("decoded per sample"));
}

namespace {

// Forwards to a folder dataset, counting whole and window reads.
class CountingDataset : public data::Dataset {
 public:
  explicit CountingDataset(const data::ImageFolderDataset& base) : base_(base) {}
  const std::string& name() const override { return base_.name(); }
  int64_t size() const override { return base_.size(); }
  int64_t num_classes() const override { return base_.num_classes(); }
  int64_t label(int64_t index) const override { return base_.label(index); }
  data::Sample get(int64_t index) const override {
    ++wholes;
    return base_.get(index);
  }
  data::Sample get_window(int64_t index, const data::WindowChooser& choose) const override {
    ++windows;
    return base_.get_window(index, choose);
  }
  mutable std::atomic<int> wholes{0}, windows{0};

 private:
  const data::ImageFolderDataset& base_;
};

}  // namespace

TEST_CASE("streaming loader: decoding only RandomResizedCrop's window gives the same batches",
          "[cpu][train]") {
  const std::string root = make_tiny_imagenet(test::train_scratch_dir("imagenet_windows"));
  const data::ImageFolderDataset folder = data::read_imagenet(root, data::Split::kTrain);
  // Read through a subset (data.train_subset), which must pass window reads on.
  auto counting = std::make_unique<CountingDataset>(folder);
  const CountingDataset& counts = *counting;
  std::vector<int64_t> all(static_cast<size_t>(folder.size()));
  std::iota(all.begin(), all.end(), 0);
  const data::SubsetDataset ds(std::move(counting), all);
  const Config c = Config::parse(
      "augment: {random_resized_crop: true, hflip: 0.5, randaugment: rand-m9-mstd0.5-inc1}");
  const auto timm = data::read_train_augment(c.root(), 16, 3, 3, kMean).transform;
  REQUIRE(timm->window_first() != nullptr);
  LoaderOptions windows = streaming_options(2, timm), whole = streaming_options(2, timm);
  REQUIRE(windows.decode_windows);
  whole.decode_windows = false;
  DataLoader a(ds, windows), b(ds, whole);
  for (int64_t epoch : {0, 3}) {
    const EpochData from_windows = run_epoch(a, epoch), from_whole = run_epoch(b, epoch);
    REQUIRE(from_windows.labels == from_whole.labels);
    REQUIRE(from_windows.images == from_whole.images);
  }
  CHECK(counts.windows == 2 * 16);  // two epochs of 16 images each way
  CHECK(counts.wholes == 2 * 16);
}

TEST_CASE("streaming evaluation: dataset order, the eval transform, the last partial batch",
          "[cpu][train]") {
  const std::string root = make_tiny_imagenet(test::train_scratch_dir("imagenet_eval"));
  const data::ImageFolderDataset ds = data::read_imagenet(root, data::Split::kTest);
  REQUIRE(ds.size() == 6);
  const Config cfg = Config::parse(
      "data: {crop_pct: 0.875, mean: [0.485, 0.456, 0.406], "
      "std: [0.229, 0.224, 0.225]}");
  LoaderOptions o = streaming_options(2, rrc_flip());  // the eval transform replaces it
  o.batch_size = 4;
  o.shuffle = false;
  o.drop_last = false;
  o.eval_transform =
      std::make_shared<data::EvalTransform>(data::read_eval_transform(cfg.root()["data"], 16, 3));
  DataLoader loader(ds, o);
  REQUIRE(loader.batches_per_epoch() == 2);
  loader.start_epoch(3);
  Batch first, last, none;
  REQUIRE(loader.next(first));
  REQUIRE(loader.next(last));
  REQUIRE_FALSE(loader.next(none));
  REQUIRE(first.images.shape() == Shape{4, 3, 16, 16});
  REQUIRE(last.images.shape() == Shape{2, 3, 16, 16});
  REQUIRE(first.labels.to_vector<int64_t>() == std::vector<int64_t>{0, 0, 1, 1});
  REQUIRE(last.labels.to_vector<int64_t>() == std::vector<int64_t>{2, 2});
  // Each image is exactly the eval preprocessing (shorter side to 18, centre 16x16) of the file.
  for (int64_t i : {0, 5}) {
    const data::Sample s = ds.get(i);
    const Tensor want = data::preprocess_pixels(s.image.data<uint8_t>(), s.image.size(0),
                                                s.image.size(1), 3, *o.eval_transform);
    const Tensor got = (i < 4 ? first : last).images.select(0, i % 4).contiguous();
    REQUIRE(got.to_vector<float>() == want.to_vector<float>());
  }
  // Subsets of folder datasets are spread over the class-sorted split (the first 3 would all be
  // class 0).
  REQUIRE(spread_indices(16, 3) == std::vector<int64_t>{0, 5, 10});
  REQUIRE(spread_indices(16, 0).size() == 16);
  DataOptions data_options;
  data_options.dataset = "imagenet";
  data_options.root = root;
  const auto subset = load_dataset_split(data_options, "train", 16, 3, 3);
  REQUIRE(subset->size() == 3);
  REQUIRE(std::vector<int64_t>{subset->label(0), subset->label(1), subset->label(2)} ==
          std::vector<int64_t>{0, 0, 1});
  REQUIRE_THROWS_AS(subset->get(3), ValueError);
}

TEST_CASE("a corrupt JPEG stops the streaming loader with an error naming the file",
          "[cpu][train]") {
  const std::string root = make_tiny_imagenet(test::train_scratch_dir("imagenet_corrupt"));
  const std::string broken = root + "/train/n02/img3.JPEG";
  std::ofstream(broken, std::ios::binary | std::ios::trunc) << "\xff\xd8\xff not really a JPEG";
  const data::ImageFolderDataset ds = data::read_imagenet(root, data::Split::kTrain);
  DataLoader loader(ds, streaming_options(2, rrc_flip()));
  loader.start_epoch(0);
  Batch b;
  REQUIRE_THROWS_WITH(
      [&] {
        while (loader.next(b)) {
        }
      }(),
      Contains(broken) && Contains("cannot decode"));
}

TEST_CASE("the trainer trains, evaluates and resumes exactly from an ImageNet-style folder",
          "[cpu][train]") {
  const std::string root = make_tiny_imagenet(test::train_scratch_dir("imagenet_trainer"));
  const std::string yaml = tiny_imagenet_yaml(root);
  // 16 images / batch 4 = 4 updates per epoch; 3 stops mid-epoch 0, 6 crosses the evaluation.
  TrainResult straight, first, resumed;
  const auto a =
      test::train_until(yaml, 6, test::train_scratch_dir("imagenet_straight"), "", &straight);
  REQUIRE(straight.steps == 6);
  REQUIRE(straight.epochs_done == 1);
  REQUIRE(straight.final_eval.count == 6);  // the whole val split, last partial batch included
  REQUIRE(std::isfinite(straight.final_eval.loss));
  REQUIRE(straight.final_eval.loss > 0.0);

  const std::string split_dir = test::train_scratch_dir("imagenet_split");
  test::train_until(yaml, 3, split_dir, "", &first);
  REQUIRE(first.steps == 3);
  const auto b = test::train_until(yaml, 6, split_dir, split_dir, &resumed);
  REQUIRE(resumed.steps == 6);
  std::string diff;
  const bool identical = test::bitwise_equal(a, b, &diff);
  INFO("first differing tensor: " << diff);
  REQUIRE(identical);

  // Folders of varying image sizes cannot train without a crop to the model's size.
  Config no_crop = Config::parse(yaml);
  no_crop.set("data.augment={hflip: 0.5}");
  TrainerSetup setup;
  setup.run_dir = test::train_scratch_dir("imagenet_nocrop");
  REQUIRE_THROWS_WITH(Trainer(no_crop, setup),
                      Contains("data.augment.random_resized_crop") && Contains("vary in size"));
  Config classes = Config::parse(yaml);
  classes.set("model.num_classes=4");
  REQUIRE_THROWS_WITH(Trainer(classes, setup),
                      Contains("model.num_classes: 4 does not match imagenet's 3 classes"));
}
