// The run folder's logs: console lines, config.yaml, summary.csv, metrics.jsonl, TensorBoard
// events and curves.png (see run_output.h).
#include "train/run_output.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "core/checked_math.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/plot.h"
#include "io/tensorboard.h"

namespace ska::train {

namespace fs = std::filesystem;

namespace {

std::string fixed(double v, int digits) {
  std::ostringstream ss;
  ss.setf(std::ios::fixed);
  ss.precision(digits);
  ss << v;
  return ss.str();
}

std::string eval_text(const EvalResult& e, double best, int64_t best_epoch) {
  return "eval_loss " + fixed(e.loss, 4) + ", top-1 " + fixed(e.top1, 2) + "%, top-5 " +
         fixed(e.top5, 2) + "% (best " + fixed(best, 2) + "% at epoch " +
         std::to_string(best_epoch) + ")";
}

// metrics.jsonl key -> TensorBoard tag. Step records carry loss, lr and images_per_s; epoch
// records the rest. Records map key by key, so the event file holds exactly the jsonl's numbers.
const std::vector<std::pair<const char*, const char*>>& tb_tags(bool step_record) {
  static const std::vector<std::pair<const char*, const char*>> step = {
      {"loss", "train/loss"}, {"lr", "train/lr"}, {"images_per_s", "train/images_per_s"}};
  static const std::vector<std::pair<const char*, const char*>> epoch = {
      {"epoch", "epoch/epoch"},
      {"train_loss", "epoch/train_loss"},
      {"lr", "epoch/lr"},
      {"images_per_s", "epoch/images_per_s"},
      {"seconds", "epoch/seconds"},
      {"nonfinite_total", "train/nonfinite_total"},
      {"loss_scale", "train/loss_scale"},
      {"eval_loss", "eval/loss"},
      {"eval_top1", "eval/top1"},
      {"eval_top5", "eval/top5"},
      {"ema_eval_loss", "ema/loss"},
      {"ema_eval_top1", "ema/top1"},
      {"ema_eval_top5", "ema/top5"}};
  return step_record ? step : epoch;
}

std::vector<io::TbScalar> tb_scalars(const nlohmann::json& record) {
  std::vector<io::TbScalar> out;
  for (const auto& [key, tag] : tb_tags(record.at("kind") == "step")) {
    const auto it = record.find(key);
    if (it == record.end() || !it->is_number()) continue;  // absent, or null (NaN)
    out.push_back({tag, static_cast<float>(it->get<double>())});
  }
  return out;
}

// summary.csv's column `name` as numbers (NaN for empty cells); empty when there is no such column.
std::vector<double> csv_column(const std::vector<std::vector<std::string>>& rows,
                               const std::string& name) {
  std::vector<double> v;
  if (rows.empty()) return v;
  const auto& header = rows.front();
  const auto col = std::find(header.begin(), header.end(), name) - header.begin();
  if (col == static_cast<long>(header.size())) return v;
  for (size_t r = 1; r < rows.size(); ++r) {
    const std::string cell = col < static_cast<long>(rows[r].size()) ? rows[r][col] : "";
    v.push_back(cell.empty() ? NAN : std::strtod(cell.c_str(), nullptr));
  }
  return v;
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    if (!line.empty() && line.back() == ',') cells.emplace_back();
    rows.push_back(cells);
  }
  return rows;
}

// curves.png: train loss and eval top-1 (and the EMA's) per epoch, from summary.csv.
void write_curves(const std::string& run_dir) {
  const auto rows = read_csv((fs::path(run_dir) / "summary.csv").string());
  const std::vector<double> epoch = csv_column(rows, "epoch");
  io::PlotPanel loss{"train loss", "epoch", {{"train", epoch, csv_column(rows, "train_loss"), io::kPlotBlue}}};
  io::PlotPanel top1{"eval top-1 (%)", "epoch", {{"model", epoch, csv_column(rows, "eval_top1"), io::kPlotBlue}}};
  const std::vector<double> ema = csv_column(rows, "ema_eval_top1");
  if (!ema.empty()) top1.series.push_back({"EMA", epoch, ema, io::kPlotOrange});
  io::write_png((fs::path(run_dir) / "curves.png").string(),
                io::plot_panels({loss, top1}, kCurvesPanelWidth, kCurvesHeight));
}

}  // namespace

RunOutput::~RunOutput() = default;

RunOutput::RunOutput(std::string run_dir, bool enabled, bool has_ema,
                     std::function<void(const std::string&)> log)
    : run_dir_(std::move(run_dir)), enabled_(enabled), has_ema_(has_ema), log_(std::move(log)) {}

void RunOutput::line(const std::string& text) const {
  if (enabled_ && log_) log_(text);
}

void RunOutput::append(const std::string& file, const std::string& text) const {
  const std::string path = (fs::path(run_dir_) / file).string();
  std::ofstream out(path, std::ios::app);
  SKA_CHECK(out.good(), IOError, "cannot append to '", path, "'");
  out << text << "\n";
}

void RunOutput::start(const std::string& config_text, const RunStart& at) const {
  if (!enabled_) return;
  std::ofstream(fs::path(run_dir_) / "config.yaml") << config_text;
  events_ = std::make_unique<io::TbWriter>(run_dir_);
  const std::string header = std::string("epoch,train_loss,eval_loss,eval_top1,eval_top5,lr") +
                             (has_ema_ ? ",ema_eval_loss,ema_eval_top1,ema_eval_top5" : "");
  const fs::path summary = fs::path(run_dir_) / "summary.csv";
  const fs::path metrics = fs::path(run_dir_) / "metrics.jsonl";
  if (!at.resumed) {
    io::write_file_atomic(summary.string(), header + "\n");
    fs::remove(metrics);
    return;
  }
  // Keep the rows of epochs before the checkpoint's and the records up to its update.
  int64_t dropped = 0;
  std::string kept_summary = header + "\n";
  if (fs::exists(summary)) {
    std::ifstream in(summary);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      const size_t comma = line.find(',');
      const std::optional<int64_t> epoch = parse_decimal(line.substr(0, comma), int64_t{1} << 48);
      if (epoch && *epoch < at.epoch) {
        kept_summary += line + "\n";
      } else {
        ++dropped;
      }
    }
  }
  std::string kept_metrics;
  if (fs::exists(metrics)) {
    std::ifstream in(metrics);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool before = j.is_object() && j.value("step", int64_t{-1}) >= 0 &&
                          j.value("step", int64_t{-1}) <= at.step &&
                          (j.value("kind", "") != "epoch" || j.value("epoch", at.epoch) < at.epoch);
      if (before) {
        kept_metrics += line + "\n";
      } else {
        ++dropped;  // after the checkpoint, or a line cut short by a kill
      }
    }
  }
  io::write_file_atomic(summary.string(), kept_summary);
  io::write_file_atomic(metrics.string(), kept_metrics);
  if (dropped > 0) {
    line("resume: dropped " + std::to_string(dropped) +
         " summary.csv rows and metrics.jsonl records written after the checkpoint (update " +
         std::to_string(at.step) + ")");
  }
}

void RunOutput::step(int64_t epoch, int64_t step, double loss, double lr,
                     double images_per_s) const {
  if (!enabled_) return;
  const nlohmann::json j = {{"kind", "step"}, {"epoch", epoch},  {"step", step},
                            {"loss", loss},   {"lr", lr},        {"images_per_s", images_per_s}};
  append("metrics.jsonl", j.dump());
  if (events_) events_->write(step, tb_scalars(j));
}

void RunOutput::epoch(const EpochRecord& r) const {
  if (!enabled_) return;
  std::ostringstream text;
  text << "epoch " << r.epoch << "/" << r.epochs << ": train_loss " << fixed(r.train_loss, 4)
       << ", lr " << r.lr << ", " << fixed(r.images_per_s, 1) << " img/s, "
       << fixed(r.seconds, 1) << " s";
  if (r.evaluated) {
    text << " | " << eval_text(r.eval, r.best_top1, r.best_epoch);
    if (has_ema_) text << " | EMA " << eval_text(r.ema_eval, r.best_ema_top1, r.best_ema_epoch);
  }
  line(text.str());

  const auto columns = [&](const EvalResult& e) {
    return r.evaluated ? fixed(e.loss, 6) + "," + fixed(e.top1, 4) + "," + fixed(e.top5, 4)
                       : std::string(",,");
  };
  append("summary.csv", std::to_string(r.epoch) + "," + fixed(r.train_loss, 6) + "," +
                            columns(r.eval) + "," + std::to_string(r.lr) +
                            (has_ema_ ? "," + columns(r.ema_eval) : ""));
  nlohmann::json j = {{"kind", "epoch"},          {"epoch", r.epoch},  {"epochs", r.epochs},
                      {"step", r.step},           {"train_loss", r.train_loss},
                      {"lr", r.lr},               {"images_per_s", r.images_per_s},
                      {"seconds", r.seconds},     {"nonfinite_total", r.nonfinite_total}};
  if (r.loss_scale > 0) j["loss_scale"] = r.loss_scale;
  if (r.evaluated) {
    j["eval_loss"] = r.eval.loss;
    j["eval_top1"] = r.eval.top1;
    j["eval_top5"] = r.eval.top5;
    if (has_ema_) {
      j["ema_eval_loss"] = r.ema_eval.loss;
      j["ema_eval_top1"] = r.ema_eval.top1;
      j["ema_eval_top5"] = r.ema_eval.top5;
    }
  }
  append("metrics.jsonl", j.dump());
  if (events_) events_->write(r.step, tb_scalars(j));
}

void RunOutput::finish() {
  if (!enabled_) return;
  events_.reset();
  write_curves(run_dir_);
}

}  // namespace ska::train
