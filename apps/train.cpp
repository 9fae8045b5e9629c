// train: trains a model from an experiment config, writing a run folder with the resolved config,
// summary.csv, metrics.jsonl, train.log and checkpoints; --resume continues a run exactly.
// Data-parallel: --nproc-per-node N starts N workers here; under srun, mpirun or torchrun every
// process is one worker (the world comes from the environment).
// Usage: train --config quickstart [--set k=v ...] [--resume DIR|auto] [--device cpu|cuda]
//              [--output DIR] [--runs DIR] [--nproc-per-node N [--nnodes M --node-rank R
//              --master-addr HOST --master-port P]]
#include <cstdint>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "app_common.h"
#include "distributed/communicator.h"
#include "distributed/launcher.h"
#include "distributed/optimizer_sharding.h"
#include "distributed/world.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;

struct TrainCommand {
  ska::apps::ConfigOptions config;
  std::string resume;
  std::string device = "cpu";
  std::string output;
  std::string runs = "runs";
  // The launcher (a process that starts the workers and trains nothing itself).
  int nproc_per_node = 1;
  int nnodes = 1, node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port (one node)
  std::vector<std::string> argv;
};

// The command line the workers run: this one without the launcher's options.
std::vector<std::string> worker_argv(const std::vector<std::string>& argv) {
  static const std::vector<std::string> kLauncherOptions = {
      "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port"};
  std::vector<std::string> out = {"/proc/self/exe"};
  for (size_t i = 1; i < argv.size(); ++i) {
    bool dropped = false;
    for (const std::string& option : kLauncherOptions) {
      if (argv[i] == option) {  // "--option value"
        ++i;
        dropped = true;
        break;
      }
      if (argv[i].rfind(option + "=", 0) == 0) {  // "--option=value"
        dropped = true;
        break;
      }
    }
    if (!dropped) out.push_back(argv[i]);
  }
  return out;
}


std::string format_duration(double s) {
  const int64_t total = static_cast<int64_t>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(total / 60),
                static_cast<long long>(total % 60));
  return buf;
}

// The run folder a checkpoint or run path belongs to (<run>/checkpoints/step-N -> <run>).
std::string run_dir_of(const std::string& resume) {
  fs::path p = fs::absolute(resume).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "RUN/checkpoints/step-8/", as a shell completes it
  if (fs::is_directory(p / "checkpoints")) return p.string();
  if (p.parent_path().filename() == "checkpoints") return p.parent_path().parent_path().string();
  if (p.filename() == "checkpoints") return p.parent_path().string();
  return p.string();
}

bool has_checkpoint(const std::string& run_dir) {
  try {
    ska::train::resolve_checkpoint(run_dir);
    return true;
  } catch (const ska::IOError&) {
    return false;
  }
}

// What in `dir` says a run has used it (a checkpoint, or the logs every start writes); empty for
// a folder no run has written to (absent, empty, or made by a job scheduler).
std::string run_traces(const std::string& dir) {
  if (has_checkpoint(dir)) return "a checkpoint";
  for (const char* name : {"summary.csv", "metrics.jsonl", "checkpoints"}) {
    if (fs::exists(fs::path(dir) / name)) return std::string("its ") + name;
  }
  return "";
}

// Removes a run folder this command made, when the run failed before it began: the lock is
// released first, the log announces it.
void discard_run_folder(ska::train::TrainerSetup& setup) {
  setup.log("train: the run failed before it began; removed its new folder " + setup.run_dir);
  setup.lock.reset();
  std::error_code ignored;
  fs::remove_all(setup.run_dir, ignored);
}

// The signal the launcher of --nproc-per-node forwarded to its workers (0: none).
int g_launcher_signal = 0;

// 0, or 128 + the signal that stopped the run early (as a shell reports a command it ended).
int exit_code_of(const ska::train::TrainResult& r) {
  return r.stop_signal == 0 ? 0 : 128 + r.stop_signal;
}

int launch_workers(const TrainCommand& cmd) {
  // What every worker would find out on its own, said once before any starts.
  const ska::Device device = ska::apps::device_option(cmd.device);
  if (device.is_cuda() && cmd.device == "cuda") {
    const int visible = ska::cuda_device_count();
    SKA_CHECK(cmd.nproc_per_node <= visible, ska::DeviceError, "--nproc-per-node ",
              cmd.nproc_per_node, " with --device cuda starts one worker per GPU, but ", visible,
              " CUDA device(s) are visible");
  }
  // N workers each running as many OpenMP threads as there are cores oversubscribe the CPU many
  // times over (spinning barriers make that far slower than N-fold); share the cores instead,
  // unless the user chose (torchrun sets 1).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const unsigned per_worker = std::max(1u, cores / static_cast<unsigned>(cmd.nproc_per_node));
    ::setenv("OMP_NUM_THREADS", std::to_string(per_worker).c_str(), 1);
  }
  ska::dist::LaunchOptions o;
  o.nproc_per_node = cmd.nproc_per_node;
  o.nnodes = cmd.nnodes;
  o.node_rank = cmd.node_rank;
  o.master_addr = cmd.master_addr;
  o.master_port = cmd.master_port;
  return ska::dist::launch_local_workers(worker_argv(cmd.argv), o, &g_launcher_signal);
}

// The device of this worker: cuda means the GPU of its local rank.
ska::Device worker_device(const std::string& text, const ska::dist::World& world) {
  const ska::Device d = ska::apps::device_option(text);
  if (d.is_cuda() && world.distributed() && text == "cuda") return ska::Device::cuda(world.local_rank);
  return d;
}

int run_train(TrainCommand cmd) {
  using namespace ska;
  const dist::World world = dist::world_from_environment();
  SKA_CHECK(cmd.node_rank == 0 || cmd.nnodes > 1, ValueError, "--node-rank ", cmd.node_rank,
            " needs --nnodes, the job's node count (with --nproc-per-node and --master-addr)");
  if (cmd.nproc_per_node > 1 || cmd.nnodes > 1) {
    SKA_CHECK(!world.distributed(), ValueError, "--nproc-per-node starts the workers itself, but "
              "this process already is worker ", world.rank, " of ", world.world_size, " (",
              world.source, "); drop --nproc-per-node under srun, mpirun or torchrun");
    return launch_workers(cmd);
  }
  // Before any thread starts: SIGINT, SIGTERM and SIGUSR1 will stop the run after a checkpoint
  // (once training begins; until then they end the process as usual).
  train::watch_stop_signals(world.rank == 0);
  const ska::Config config = apps::load_config(cmd.config);
  const std::string name = fs::path(apps::resolve_config_path(cmd.config.config)).stem().string();

  train::TrainerSetup setup;
  setup.device = worker_device(cmd.device, world);
  dist::CommOptions comm_options;
  const train::DistributedOptions distributed =
      train::DistributedOptions::from_config(config.root()["distributed"]);
  comm_options.timeout_s = distributed.timeout_s;
  comm_options.force_backend = distributed.force_backend;
  const std::unique_ptr<dist::Communicator> comm =
      dist::make_communicator(world, setup.device, comm_options);
  setup.comm = comm.get();
  const bool main_rank = world.rank == 0;
  // Rank 0 chooses the run folder and what to resume; every worker uses its choice.
  std::string resume = cmd.resume;
  bool fresh_folder = false;  // the run folder is this command's own, made just now
  if (main_rank) {
    if (resume == "auto") {
      // With --output: that folder when it holds a complete checkpoint (a requeued job), else a
      // fresh start; without: the newest run of this config under --runs.
      resume = cmd.output.empty() ? train::find_latest_run(cmd.runs, name)
                                  : (has_checkpoint(cmd.output) ? cmd.output : "");
    }
    if (!resume.empty()) train::resolve_checkpoint(resume);  // fails before creating anything
    if (!cmd.output.empty()) {
      // A run folder is never written over by another run: continuing it takes --resume (auto:
      // from its checkpoint, or anew when it has none, a requeued job that died before its first).
      const std::string traces = run_traces(cmd.output);
      const bool continues = resume.empty() ? cmd.resume == "auto"
                                            : fs::weakly_canonical(run_dir_of(resume)) ==
                                                  fs::weakly_canonical(fs::absolute(cmd.output));
      SKA_CHECK(traces.empty() || continues, ValueError, "--output '", cmd.output,
                "' already holds a run (", traces, "); continue it with --resume ", cmd.output,
                " (or --resume auto), or choose another folder");
      setup.run_dir = cmd.output;
      fresh_folder = !fs::exists(setup.run_dir);
    } else if (!resume.empty()) {
      setup.run_dir = run_dir_of(resume);
    } else {
      setup.run_dir = train::make_run_dir(cmd.runs, name);
      fresh_folder = true;
    }
    setup.lock = std::make_shared<train::RunFolderLock>(setup.run_dir);  // creates it
  }
  if (world.distributed()) {
    setup.run_dir = dist::broadcast_bytes(*comm, setup.run_dir, 0);
    resume = dist::broadcast_bytes(*comm, resume, 0);
  }
  setup.resume = resume;
  setup.stop_signal = train::stop_signal_received;
  if (!main_rank) {  // the other workers train silently; their errors still reach stderr
    train::Trainer trainer(config, setup);
    train::defer_stop_signals();
    return exit_code_of(trainer.fit());
  }

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
    // The loss is the epoch's mean as of the last read of the device (train.log_every).
    char loss[32] = "-";
    if (std::isfinite(p.loss)) std::snprintf(loss, sizeof(loss), "%.4f", p.loss);
    std::printf("\r\033[Kepoch %lld/%lld [%lld/%lld] %.1f img/s, ETA %s, loss %s, lr %.3g",
                static_cast<long long>(p.epoch), static_cast<long long>(p.epochs),
                static_cast<long long>(p.batch), static_cast<long long>(p.batches), p.images_per_s,
                format_duration(p.eta_s).c_str(), loss, p.lr);
    std::fflush(stdout);
    progress_shown = true;
  };
  if (resume.empty() && !cmd.resume.empty()) setup.log("resume auto: no earlier run of '" + name + "'; starting fresh");

  setup.log("run dir: " + setup.run_dir);
  std::unique_ptr<train::Trainer> built;
  try {
    built = std::make_unique<train::Trainer>(config, setup);
  } catch (const std::exception&) {
    // A config, data or model error before any training: a folder made for this run holds
    // nothing but its log, so it goes rather than cluttering --runs (the error is on stderr).
    if (fresh_folder) discard_run_folder(setup);
    throw;
  }
  train::Trainer& trainer = *built;
  setup.log("model: " + std::to_string(trainer.model().num_parameters()) +
            " trainable parameters; " + std::to_string(trainer.steps_per_epoch()) +
            " updates per epoch of global batch " + std::to_string(trainer.global_batch()) +
            "; device " + setup.device.str() +
            (world.distributed() ? " (" + std::to_string(world.world_size) + " workers)" : ""));
  if (trainer.finished()) {  // a resumed run with nothing left to do
    const train::TrainState& st = trainer.state();
    char done[512];
    std::snprintf(done, sizeof(done),
                  "train: this run had already finished (epoch %lld, step %lld; best top-1 "
                  "%.2f%% at epoch %lld); nothing to train (run dir: %s)",
                  static_cast<long long>(st.epoch), static_cast<long long>(st.step),
                  st.best_top1, static_cast<long long>(st.best_epoch), setup.run_dir.c_str());
    setup.log(done);
    return 0;
  }
  train::defer_stop_signals();  // from here a signal stops the run with a checkpoint
  const train::TrainResult r = trainer.fit();
  char line[512];
  if (r.stop_signal != 0) {
    std::snprintf(line, sizeof(line),
                  "train: stopped by %s after %lld steps; continue with --resume %s (or "
                  "--resume auto)",
                  train::stop_signal_name(r.stop_signal), static_cast<long long>(r.steps),
                  setup.run_dir.c_str());
    setup.log(line);
    return exit_code_of(r);
  }
  if (r.final_eval.count == 0) {  // stopped by train.max_steps before an epoch ended
    std::snprintf(line, sizeof(line),
                  "train: stopped after %lld steps (train.max_steps) before any evaluation, %.1f s, "
                  "%.1f img/s; evaluate with `validate --checkpoint %s` (run dir: %s)",
                  static_cast<long long>(r.steps), r.train_seconds, r.images_per_s,
                  r.last_checkpoint.c_str(), setup.run_dir.c_str());
    setup.log(line);
    return 0;
  }
  std::snprintf(
      line, sizeof(line),
      "train: %s top-1 %.2f%% top-5 %.2f%% loss %.4f (best top-1 %.2f%% at epoch %lld), "
      "%lld steps%s, %.1f s, %.1f img/s (run dir: %s)",
      r.stopped_at_max_steps ? "last evaluation" : "final", r.final_eval.top1, r.final_eval.top5,
      r.final_eval.loss, r.best_top1, static_cast<long long>(r.best_epoch),
      static_cast<long long>(r.steps),
      r.stopped_at_max_steps ? " (stopped at train.max_steps, before the last epoch)" : "",
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
  ska::apps::limit_openmp_spinning(argv);
  // A worker's errors name its rank. A launch environment that cannot be read (RANK outside
  // WORLD_SIZE, a port that is not one) is an error like any other, not an abort.
  ska::dist::World world;
  try {
    world = ska::dist::world_from_environment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: error: %s\n", e.what());
    return 2;
  }
  const std::string name =
      world.distributed() ? "train [rank " + std::to_string(world.rank) + "]" : "train";
  CLI::App app{"Trains a model from an experiment config", name};
  TrainCommand cmd;
  cmd.argv.assign(argv, argv + argc);
  ska::apps::add_config_options(app, cmd.config);
  app.add_option("--resume", cmd.resume,
                 "continue from a checkpoint or run folder, or 'auto' (the newest run of this config)");
  app.add_option("--device", cmd.device, "cpu, cuda or cuda:N");
  app.add_option("--output", cmd.output, "the run folder (default: <runs>/<config>-<time>)");
  app.add_option("--runs", cmd.runs, "where new run folders are made (default: runs)");
  app.add_option("--nproc-per-node", cmd.nproc_per_node,
                 "start N data-parallel workers on this node (one per GPU with --device cuda)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--nnodes", cmd.nnodes, "nodes of the job (with --nproc-per-node)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--node-rank", cmd.node_rank, "this node's index in [0, nnodes)");
  app.add_option("--master-addr", cmd.master_addr, "the host of rank 0 (several nodes)");
  app.add_option("--master-port", cmd.master_port,
                 "the rendezvous port on the master (default: a free port on one node)");
  const int code = ska::apps::run_main(app, argc, argv, [&] { return run_train(cmd); });
  // Stopped cleanly by Ctrl-C or SIGTERM: end by that signal, so that a calling script stops
  // too. SIGUSR1 (the time-limit warning) ends with the code 138 train.sbatch looks for.
  const int sig = g_launcher_signal != 0 ? g_launcher_signal : ska::train::stop_signal_received();
  if ((sig == SIGINT || sig == SIGTERM) && code == 128 + sig) {
    std::fflush(nullptr);
    ska::train::end_by_signal(sig);
  }
  return code;
}
