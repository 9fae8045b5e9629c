// The run folder's TensorBoard events and curves.png, from a short (interrupted and resumed)
// training run: the events hold exactly metrics.jsonl's numbers, the picture its curves.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "data/datasets/image_folder.h"
#include "io/plot.h"
#include "io/tensorboard.h"
#include "train/run_output.h"
#include "train_test_util.h"

using namespace ska;
namespace fs = std::filesystem;

namespace {

// metrics.jsonl key -> TensorBoard tag, as documented in README's run-folder table.
const std::map<std::string, std::string> kStepTags = {
    {"loss", "train/loss"}, {"lr", "train/lr"}, {"images_per_s", "train/images_per_s"}};
const std::map<std::string, std::string> kEpochTags = {{"epoch", "epoch/epoch"},
                                                       {"train_loss", "epoch/train_loss"},
                                                       {"lr", "epoch/lr"},
                                                       {"images_per_s", "epoch/images_per_s"},
                                                       {"seconds", "epoch/seconds"},
                                                       {"nonfinite_total", "train/nonfinite_total"},
                                                       {"eval_loss", "eval/loss"},
                                                       {"eval_top1", "eval/top1"},
                                                       {"eval_top5", "eval/top5"},
                                                       {"ema_eval_loss", "ema/loss"},
                                                       {"ema_eval_top1", "ema/top1"},
                                                       {"ema_eval_top5", "ema/top5"}};

std::vector<io::TbEvent> all_events(const std::string& run, int* files) {
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(run)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      paths.push_back(e.path());
  }
  std::sort(paths.begin(), paths.end());
  *files = static_cast<int>(paths.size());
  std::vector<io::TbEvent> events;
  for (const auto& p : paths) {
    const auto ev = io::read_tb_events(p);
    REQUIRE(!ev.empty());
    CHECK(ev.front().file_version == "brain.Event:2");
    events.insert(events.end(), ev.begin() + 1, ev.end());
  }
  return events;
}

}  // namespace

TEST_CASE("the run folder's event files and curves.png match metrics.jsonl and summary.csv",
          "[cpu][train][tensorboard][png]") {
  if (!test::fashion_mnist_available()) {
    WARN("skipped: /usr/share/datasets/fashion-mnist is not installed (dataset-fashion-mnist)");
    return;
  }
  // 256 images, batch 32: 8 updates per epoch, 2 epochs; stopped after 10 updates, then resumed.
  const std::string yaml = test::tiny_experiment_yaml(256, 100, 32, 2, 0.0);
  const std::string run = test::train_scratch_dir("run_output");
  test::train_until(yaml, 10, run, "");
  test::train_until(yaml, 1000, run, run);

  int files = 0;
  const std::vector<io::TbEvent> events = all_events(run, &files);
  REQUIRE(files == 2);  // one per start
  std::ifstream jsonl(run + "/metrics.jsonl");
  size_t i = 0;
  int epochs = 0;
  for (std::string line; std::getline(jsonl, line); ++i) {
    const nlohmann::json j = nlohmann::json::parse(line);
    INFO("metrics.jsonl record " << i << ": " << line);
    REQUIRE(i < events.size());
    const bool step = j["kind"] == "step";
    epochs += !step;
    CHECK(events[i].step == j["step"].get<int64_t>());
    std::map<std::string, float> got;
    for (const auto& s : events[i].scalars) got[s.tag] = s.value;
    size_t expected = 0;
    for (const auto& [key, tag] : step ? kStepTags : kEpochTags) {
      if (!j.contains(key)) continue;
      ++expected;
      REQUIRE(got.count(tag));
      CHECK(got[tag] == static_cast<float>(j[key].get<double>()));
    }
    CHECK(got.size() == expected);
  }
  CHECK(i == events.size());
  REQUIRE(epochs == 2);

  // curves.png: both epochs (across the resume) at the places summary.csv's numbers give, read
  // back with libpng.
  const Tensor m = data::decode_image_rgb(run + "/curves.png");
  REQUIRE(m.shape() == Shape{train::kCurvesHeight, 2 * train::kCurvesPanelWidth, 3});
  std::ifstream csv(run + "/summary.csv");
  std::string line;
  std::getline(csv, line);
  std::vector<double> ep, loss, top1, ema;
  while (std::getline(csv, line)) {
    double v[9];
    REQUIRE(std::sscanf(line.c_str(), "%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf,%lf", &v[0], &v[1], &v[2],
                        &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]) == 9);
    ep.push_back(v[0]), loss.push_back(v[1]), top1.push_back(v[3]), ema.push_back(v[7]);
  }
  REQUIRE(ep.size() == 2);
  std::vector<io::PlotFrame> frames;
  io::plot_panels({{"", "", {{"", ep, loss, io::kPlotBlue}}},
                   {"", "", {{"", ep, top1, io::kPlotBlue}, {"", ep, ema, io::kPlotOrange}}}},
                  train::kCurvesPanelWidth, train::kCurvesHeight, &frames);
  const auto blue_at = [&](int x, int y) {
    const uint8_t* p = m.data<uint8_t>() + (static_cast<int64_t>(y) * m.size(1) + x) * 3;
    return p[0] == io::kPlotBlue.r && p[1] == io::kPlotBlue.g && p[2] == io::kPlotBlue.b;
  };
  for (size_t e = 0; e < ep.size(); ++e) {
    INFO("epoch " << ep[e]);
    CHECK(blue_at(frames[0].px(ep[e]), frames[0].py(loss[e])));
    CHECK(blue_at(frames[1].px(ep[e]), frames[1].py(top1[e])));
  }
  fs::remove_all(run);
}
