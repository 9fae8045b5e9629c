// The run folder's logs: console lines, config.yaml, summary.csv, metrics.jsonl (see
// run_output.h).
#include "train/run_output.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

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

}  // namespace

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

void RunOutput::start(const std::string& config_text) const {
  if (!enabled_) return;
  std::ofstream(fs::path(run_dir_) / "config.yaml") << config_text;
  if (!fs::exists(fs::path(run_dir_) / "summary.csv")) {
    append("summary.csv", std::string("epoch,train_loss,eval_loss,eval_top1,eval_top5,lr") +
                              (has_ema_ ? ",ema_eval_loss,ema_eval_top1,ema_eval_top5" : ""));
  }
}

void RunOutput::step(int64_t epoch, int64_t step, double loss, double lr,
                     double images_per_s) const {
  if (!enabled_) return;
  const nlohmann::json j = {{"kind", "step"}, {"epoch", epoch},  {"step", step},
                            {"loss", loss},   {"lr", lr},        {"images_per_s", images_per_s}};
  append("metrics.jsonl", j.dump());
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
  nlohmann::json j = {{"kind", "epoch"},          {"epoch", r.epoch},
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
}

}  // namespace ska::train
