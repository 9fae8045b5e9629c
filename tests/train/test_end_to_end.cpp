// End to end on the real Fashion-MNIST files: a tiny CSKA-ViT trained for a few hundred steps
// must reach a real accuracy, and the run folder must hold what the trainer promises.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "data/datasets/factory.h"
#include "train/trainer.h"
#include "train_test_util.h"

using namespace ska;
using namespace ska::train;
namespace fs = std::filesystem;

TEST_CASE("training a tiny CSKA-ViT on Fashion-MNIST reaches > 70% test accuracy",
          "[cpu][train][slow]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // 25600 training images, batch 64: 400 updates per epoch, 2 epochs; 1000 test images.
  Config config = Config::parse(test::tiny_experiment_yaml(25600, 1000, 64, 2, 0.0));
  config.set("data.augment.crop_padding=0");  // few epochs: augmentation only slows convergence
  const std::string run = test::train_scratch_dir("e2e");
  TrainerSetup setup;
  setup.run_dir = run;
  std::vector<std::string> lines;
  setup.log = [&](const std::string& line) { lines.push_back(line); };
  Trainer trainer(config, setup);
  const TrainResult r = trainer.fit();
  INFO("final top-1 " << r.final_eval.top1 << "%, " << r.train_seconds << " s, "
                      << r.images_per_s << " img/s");
  REQUIRE(r.steps == 800);
  REQUIRE(r.final_eval.count == 1000);
  REQUIRE(r.final_eval.top1 > 70.0);
  REQUIRE(r.final_eval.top5 > r.final_eval.top1);
  REQUIRE(r.best_top1 >= r.final_eval.top1);

  // The run folder: config, one summary row per epoch, JSON metrics, checkpoints.
  REQUIRE(fs::exists(run + "/config.yaml"));
  std::ifstream csv(run + "/summary.csv");
  std::string header, row;
  std::getline(csv, header);
  REQUIRE(header == "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr");
  int rows = 0;
  while (std::getline(csv, row)) ++rows;
  REQUIRE(rows == 2);
  std::ifstream jsonl(run + "/metrics.jsonl");
  int epochs = 0, steps = 0;
  while (std::getline(jsonl, row)) {
    epochs += row.find("\"kind\":\"epoch\"") != std::string::npos;
    steps += row.find("\"kind\":\"step\"") != std::string::npos;
  }
  REQUIRE(epochs == 2);
  REQUIRE(steps == 160);  // log_every 5
  REQUIRE(is_complete_checkpoint(resolve_checkpoint(run)));
  REQUIRE(fs::exists(run + "/checkpoints/best"));
}

TEST_CASE("trainer config errors name the key", "[cpu][train]") {
  using Catch::Matchers::Contains;
  Config bad = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  bad.set("train.acumulate=2");
  TrainerSetup setup;
  setup.run_dir = test::train_scratch_dir("bad");
  REQUIRE_THROWS_WITH(Trainer(bad, setup), Contains("train.acumulate") && Contains("accumulate"));
  Config range = Config::parse(test::tiny_experiment_yaml(64, 10, 8, 1, 0.0));
  range.set("train.accumulate=0");
  REQUIRE_THROWS_WITH(Trainer(range, setup), Contains("train.accumulate"));
}

TEST_CASE("every experiment config in configs/ reads with the trainer's readers", "[cpu][train]") {
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(std::string(SKA_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    INFO(entry.path().string());
    const Config config = Config::load(entry.path().string());
    const ConfigNode root = config.root();
    const ConfigNode model = root["model"];
    REQUIRE(model.is_map());
    REQUIRE(model.has("family"));
    const int64_t size = model.get<int64_t>("image_size"), channels = model.get<int64_t>("in_channels");
    const int64_t classes = model.get<int64_t>("num_classes");
    const TrainOptions train = TrainOptions::from_config(root["train"]);
    const DataOptions data = DataOptions::from_config(root["data"], size, channels, classes);
    REQUIRE(data::dataset_num_classes(data.dataset) == classes);
    const optim::OptimizerOptions opt = optim::OptimizerOptions::from_config(root["optim"]);
    optim::ScheduleOptions::from_config(root["sched"], opt.lr, train.epochs);
    CheckpointOptions::from_config(root["checkpoint"]);
    ++checked;
  }
  REQUIRE(checked >= 2);
}
