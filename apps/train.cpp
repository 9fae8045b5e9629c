// train: trains a model from an experiment config, writing a run folder with the resolved config,
// summary.csv, metrics.jsonl, train.log and checkpoints; --resume continues a run exactly.
// Usage: train --config quickstart [--set k=v ...] [--resume DIR|auto] [--device cpu|cuda]
//              [--output DIR] [--runs DIR]
#include <cstdint>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "app_common.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;

struct TrainCommand {
  ska::apps::ConfigOptions config;
  std::string resume;
  std::string device = "cpu";
  std::string output;
  std::string runs = "runs";
};

std::string format_duration(double s) {
  const int64_t total = static_cast<int64_t>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(total / 60),
                static_cast<long long>(total % 60));
  return buf;
}

// The run folder a checkpoint or run path belongs to (<run>/checkpoints/step-N -> <run>).
std::string run_dir_of(const std::string& resume) {
  const fs::path p = fs::absolute(resume);
  if (fs::is_directory(p / "checkpoints")) return p.string();
  if (p.parent_path().filename() == "checkpoints") return p.parent_path().parent_path().string();
  if (p.filename() == "checkpoints") return p.parent_path().string();
  return p.string();
}

int run_train(TrainCommand cmd) {
  using namespace ska;
  const ska::Config config = apps::load_config(cmd.config);
  const std::string name = fs::path(apps::resolve_config_path(cmd.config.config)).stem().string();

  train::TrainerSetup setup;
  setup.device = Device::parse(cmd.device);
  std::string resume = cmd.resume;
  if (resume == "auto") {
    resume = train::find_latest_run(cmd.output.empty() ? cmd.runs : fs::path(cmd.output).parent_path().string(), name);
    if (!cmd.output.empty() && fs::is_directory(fs::path(cmd.output) / "checkpoints")) resume = cmd.output;
  }
  setup.resume = resume;
  if (!cmd.output.empty()) {
    setup.run_dir = cmd.output;
  } else if (!resume.empty()) {
    setup.run_dir = run_dir_of(resume);
  } else {
    setup.run_dir = train::make_run_dir(cmd.runs, name);
  }
  fs::create_directories(setup.run_dir);

  auto console = std::make_shared<spdlog::sinks::stdout_sink_mt>();
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
      (fs::path(setup.run_dir) / "train.log").string());
  console->set_pattern("%v");
  file->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
  spdlog::logger logger("train", {console, file});
  logger.flush_on(spdlog::level::info);
  const bool tty = isatty(fileno(stdout));
  bool progress_shown = false;
  setup.log = [&](const std::string& line) {
    if (progress_shown) std::cout << "\r\033[K" << std::flush;
    progress_shown = false;
    logger.info(line);
  };
  setup.progress = [&](const train::Progress& p) {
    if (!tty) return;
    std::printf("\r\033[Kepoch %lld/%lld [%lld/%lld] %.1f img/s, ETA %s, loss %.4f, lr %.3g",
                static_cast<long long>(p.epoch), static_cast<long long>(p.epochs),
                static_cast<long long>(p.batch), static_cast<long long>(p.batches), p.images_per_s,
                format_duration(p.eta_s).c_str(), p.loss, p.lr);
    std::fflush(stdout);
    progress_shown = true;
  };
  if (resume.empty() && !cmd.resume.empty()) setup.log("resume auto: no earlier run of '" + name + "'; starting fresh");

  setup.log("run dir: " + setup.run_dir);
  train::Trainer trainer(config, setup);
  setup.log("model: " + std::to_string(trainer.model().num_parameters()) +
            " trainable parameters; " + std::to_string(trainer.steps_per_epoch()) +
            " updates per epoch; device " + setup.device.str());
  const train::TrainResult r = trainer.fit();
  char line[512];
  if (r.final_eval.count == 0) {  // stopped by train.max_steps before an epoch ended
    std::snprintf(line, sizeof(line),
                  "train: stopped after %lld steps (train.max_steps) before any evaluation, %.1f s, "
                  "%.1f img/s; evaluate with `validate --checkpoint %s` (run dir: %s)",
                  static_cast<long long>(r.steps), r.train_seconds, r.images_per_s,
                  r.last_checkpoint.c_str(), setup.run_dir.c_str());
    setup.log(line);
    return 0;
  }
  std::snprintf(line, sizeof(line),
                "train: final top-1 %.2f%% top-5 %.2f%% loss %.4f (best top-1 %.2f%% at epoch %lld), "
                "%lld steps, %.1f s, %.1f img/s (run dir: %s)",
                r.final_eval.top1, r.final_eval.top5, r.final_eval.loss, r.best_top1,
                static_cast<long long>(r.best_epoch), static_cast<long long>(r.steps),
                r.train_seconds, r.images_per_s, setup.run_dir.c_str());
  setup.log(line);
  if (r.final_ema_eval.count > 0) {
    std::snprintf(line, sizeof(line),
                  "train: EMA final top-1 %.2f%% top-5 %.2f%% loss %.4f (best top-1 %.2f%% at "
                  "epoch %lld)",
                  r.final_ema_eval.top1, r.final_ema_eval.top5, r.final_ema_eval.loss,
                  r.best_ema_top1, static_cast<long long>(r.best_ema_epoch));
    setup.log(line);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trains a model from an experiment config", "train"};
  TrainCommand cmd;
  ska::apps::add_config_options(app, cmd.config);
  app.add_option("--resume", cmd.resume,
                 "continue from a checkpoint or run folder, or 'auto' (the newest run of this config)");
  app.add_option("--device", cmd.device, "cpu, cuda or cuda:N");
  app.add_option("--output", cmd.output, "the run folder (default: <runs>/<config>-<time>)");
  app.add_option("--runs", cmd.runs, "where new run folders are made (default: runs)");
  return ska::apps::run_main(app, argc, argv, [&] { return run_train(cmd); });
}
