// The training loop: epochs of micro-steps and updates, evaluation, checkpoints and exact resume,
// for one worker or each worker of a data-parallel job (see trainer.h).
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "core/checked_math.h"
#include "core/error.h"
#include "core/precision.h"
#include "distributed/functional.h"
#include "distributed/optimizer_sharding.h"  // broadcast_bytes
#include "models/model.h"
#include "ops/pointwise.h"

namespace ska::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// train.cuda_graph: eager updates before the step is captured (cuDNN and cuBLASLt choices made,
// optimizer state allocated, constants placed on the device).
constexpr int64_t kEagerUpdatesBeforeCapture = 3;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Every worker must build the same model: one that does not (a config or --set that differs
// between ranks) would meet the others in collectives of other sizes, which Gloo and NCCL cannot
// report sensibly. Rank 0's tensor names, shapes and dtypes go to every worker; all learn whether
// any differs and fail alike, naming the first difference each sees.
void check_same_model(const nn::Module& model, dist::Communicator& comm) {
  std::vector<std::string> lines;
  for (const auto& [name, t] : model.state_dict())
    lines.push_back(name + " " + shape_str(t.shape()) + " " + dtype_name(t.dtype()));
  std::string mine;
  for (const std::string& line : lines) mine += line + "\n";
  const std::string root = dist::broadcast_bytes(comm, comm.rank() == 0 ? mine : std::string(), 0);
  Tensor differs = Tensor::from_vector<int64_t>({root == mine ? 0 : 1}, {1}).to(comm.device());
  comm.all_reduce(differs);
  const int64_t workers = differs.to_vector<int64_t>()[0];
  if (workers == 0) return;
  std::string first = "this worker's matches rank 0's";
  if (root != mine) {
    std::istringstream theirs(root);
    std::string line;
    size_t i = 0;
    while (std::getline(theirs, line) && i < lines.size() && line == lines[i]) ++i;
    first = i < lines.size() ? "here '" + lines[i] + "'" : "here fewer tensors";
    if (!line.empty() && line != (i < lines.size() ? lines[i] : ""))
      first += ", on rank 0 '" + line + "'";
  }
  SKA_FAIL(ConfigError, workers, " of the ", comm.world_size(),
           " workers build a different model from rank 0's (", first,
           "): every worker must run the same config and --set options");
}

}  // namespace

std::string make_run_dir(const std::string& parent, const std::string& config_name) {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string dir = (fs::path(parent) / (config_name + "-" + stamp)).string();
  for (int i = 1; fs::exists(dir); ++i) {
    dir = (fs::path(parent) / (config_name + "-" + stamp + "-" + std::to_string(i))).string();
  }
  fs::create_directories(dir);
  return dir;
}

std::string find_latest_run(const std::string& parent, const std::string& config_name) {
  if (!fs::is_directory(parent)) return "";
  std::vector<std::string> runs;
  for (const auto& e : fs::directory_iterator(parent)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.rfind(config_name + "-", 0) != 0) continue;
    try {
      resolve_checkpoint(e.path().string());
      runs.push_back(e.path().string());
    } catch (const IOError&) {
    }
  }
  std::sort(runs.begin(), runs.end());
  return runs.empty() ? "" : runs.back();
}

uint64_t rank_seed(uint64_t seed, int rank) {
  if (rank == 0) return seed;
  uint64_t x = seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64's finaliser
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Trainer::Trainer(const Config& config, TrainerSetup setup) : setup_(std::move(setup)) {
  dist_ = DistributedOptions::from_config(config.root()["distributed"]);
  if (setup_.comm == nullptr) {
    dist::CommOptions comm_options;
    comm_options.timeout_s = dist_.timeout_s;
    comm_options.force_backend = dist_.force_backend;
    own_comm_ = dist::make_communicator(dist::World{}, setup_.device, comm_options);
    setup_.comm = own_comm_.get();
  }
  comm_ = setup_.comm;
  const int rank = comm_->rank(), world = comm_->world_size();
  const bool parallel = comm_->backend() != "single";
  // Rank 0 writes the run folder; nothing else may (fails at once when another train does).
  if (rank == 0 && !setup_.lock) setup_.lock = std::make_shared<RunFolderLock>(setup_.run_dir);
  const ConfigNode root = config.root();
  const ConfigNode model_cfg = root["model"];
  SKA_CHECK(model_cfg.is_map(), ConfigError, "model: required section missing (an experiment "
            "config has model, data, optim, sched, train and checkpoint sections)");
  const int64_t image_size = model_cfg.get<int64_t>("image_size", 224);
  const int64_t channels = model_cfg.get<int64_t>("in_channels", 3);
  const int64_t classes = model_cfg.get<int64_t>("num_classes", 1000);
  train_ = TrainOptions::from_config(root["train"]);
  data_ = DataOptions::from_config(root["data"], image_size, channels, classes);
  ckpt_ = CheckpointOptions::from_config(root["checkpoint"]);
  const optim::OptimizerOptions optim_options = optim::OptimizerOptions::from_config(root["optim"]);
  const optim::ScheduleOptions sched_options =
      optim::ScheduleOptions::from_config(root["sched"], optim_options.lr, train_.epochs);

  // Model initialisation draws from the default generators, the same on every worker; each
  // worker then draws its own dropout from rank_seed.
  manual_seed(train_.seed);
  rng_.manual_seed(train_.seed ^ 0x5EEDull);
  model_ = models::build_model(model_cfg);
  if (train_.ema_decay > 0) {
    // A second instance to evaluate the EMA weights in, built without moving the random streams.
    Generator& host = default_generator(Device::cpu());
    const uint64_t seed = host.seed(), offset = host.offset();
    ema_model_ = models::build_model(model_cfg);
    host.set_state(seed, offset);
  }
  config.check_unused();
  config_text_ = config.dump();
  output_ = std::make_unique<RunOutput>(setup_.run_dir, rank == 0, train_.ema_decay > 0,
                                        setup_.log);

  train_set_ = load_dataset_split(data_, "train", image_size, channels, data_.train_subset);
  SKA_CHECK(train_set_->num_classes() == classes, ConfigError, "model.num_classes: ", classes,
            " does not match ", data_.dataset, "'s ", train_set_->num_classes(), " classes");
  eval_set_ = load_dataset_split(data_, "test", image_size, channels, data_.eval_subset);
  train_loader_ = std::make_unique<data::DataLoader>(
      *train_set_, train_loader_options(data_, *train_set_, train_.seed, rank, world));
  eval_loader_ = std::make_unique<data::DataLoader>(
      *eval_set_, eval_loader_options(data_, *eval_set_, rank, world));
  train_batches_ =
      data::make_batch_source(*train_loader_, *train_set_, data_.device_resident, setup_.device);
  steps_per_epoch_ = train_loader_->batches_per_epoch() / train_.accumulate;
  SKA_CHECK(steps_per_epoch_ > 0, ConfigError, "data.batch_size: ", data_.batch_size, " x ",
            train_.accumulate, " (train.accumulate)", (world > 1 ? " x " + std::to_string(world) +
            " workers" : std::string()), " is larger than the ", train_set_->size(),
            " training images");

  model_->to(setup_.device);
  model_->train();
  // Every worker starts from rank 0's weights (they are equal already; this makes it certain).
  if (parallel) {
    check_same_model(*model_, *comm_);
    for (const auto& [name, t] : model_->state_dict()) comm_->broadcast(t, 0);
  }
  seed_rank_generators();
  if (dist_.sync_bn && parallel) {
    const int n = dist::enable_sync_batch_norm(*model_, *comm_);
    log("distributed.sync_bn: " + std::to_string(n) + " batch-norm layers use every worker's batch");
  }
  optimizer_ = optim::make_optimizer(optim_options, model_->named_parameters(true));
  schedule_ = std::make_unique<optim::LrSchedule>(sched_options);
  if (train_.ema_decay > 0) {
    ema_ = std::make_unique<optim::ModelEma>(*model_, train_.ema_decay);
    ema_model_->to(setup_.device);
  }
  if (train_.precision == Precision::kFP16) scaler_ = std::make_unique<optim::LossScaler>();
  if (dist_.shard_optimizer && parallel) {
    sharding_ = std::make_unique<dist::OptimizerSharding>(model_->named_parameters(true), *comm_);
    const std::vector<int64_t>& split = sharding_->owned_numel();
    const int64_t total = std::accumulate(split.begin(), split.end(), int64_t{0});
    const int64_t largest = *std::max_element(split.begin(), split.end());
    char line[256];
    std::snprintf(line, sizeof(line),
                  "distributed.shard_optimizer: each worker keeps the optimizer state of its share "
                  "of the %lld parameters (largest share %lld, %.1f%%)",
                  static_cast<long long>(total), static_cast<long long>(largest),
                  100.0 * static_cast<double>(largest) / static_cast<double>(std::max<int64_t>(total, 1)));
    log(line);
  }
  step_ = std::make_unique<TrainStep>(*model_, *optimizer_, scaler_.get(), ema_.get(), *comm_,
                                      train_, dist_, sharding_.get());
  stats_ = std::make_unique<UpdateStats>(setup_.device);
  train_.kernels.apply();
  const std::string kernels =
      train_.kernels.describe({setup_.device.is_cuda(), true, train_.autocast().enabled});
  if (!kernels.empty()) log("kernels (train.KEY: value):" + kernels);
  if (train_.cuda_graph != "off") {
    std::string moved;
    const std::string obstacle = prepare_capture(
        *model_, *optimizer_, setup_.device, comm_->world_size(), comm_->backend(), train_, &moved);
    if (!moved.empty()) {
      log("train.cuda_graph: what the model drew on the host is drawn on the device, so that "
          "the step can be captured (" +
          moved + ")");
    }
    SKA_CHECK(obstacle.empty() || train_.cuda_graph == "auto", ValueError,
              "train.cuda_graph: on, but ", obstacle, " (auto falls back to eager steps)");
    graph_wanted_ = obstacle.empty();
    log(graph_wanted_ ? "train.cuda_graph: the training step is captured after " +
                            std::to_string(kEagerUpdatesBeforeCapture) +
                            " eager updates and replayed for every full batch"
                      : "train.cuda_graph: auto: eager steps (" + obstacle + ")");
  }
  if (train_.precision != Precision::kFP32) {
    const std::string p = precision_name(train_.precision);
    log("train.precision " + p + ": autocast to " + p + " with f32 master weights" +
        (scaler_ ? " and dynamic loss scaling" : "") +
        (setup_.device.is_cpu() ? " (emulated on the CPU: f32 compute with 16-bit rounding, "
                                  "slower than fp32)"
                                : ""));
  }
  if (parallel) {
    log("data parallel: " + std::to_string(world) + " workers (" + comm_->backend() +
        "), global batch " + std::to_string(global_batch()) + " = " + std::to_string(world) +
        " x " + std::to_string(data_.batch_size) + " (data.batch_size) x " +
        std::to_string(train_.accumulate) + " (train.accumulate)");
  }

  checkpoints_ = std::make_unique<CheckpointManager>(setup_.run_dir, ckpt_.keep);
  state_.steps_per_epoch = steps_per_epoch_;
  state_.info["optimizer"] = optimizer_->name();
  if (!setup_.resume.empty()) {
    const std::string dir = resolve_checkpoint(setup_.resume);
    restore(load_checkpoint(dir));
    log("resumed from " + dir + " at epoch " + std::to_string(state_.epoch) + ", batch " +
        std::to_string(state_.batch) + ", step " + std::to_string(state_.step));
  }
  state_.info["precision"] = precision_name(train_.precision);
  state_.info["world_size"] = std::to_string(world);
  output_->start(config_text_, RunStart{!setup_.resume.empty(), state_.epoch, state_.step});
}

Trainer::~Trainer() = default;

int64_t Trainer::global_batch() const {
  return static_cast<int64_t>(comm_->world_size()) * data_.batch_size * train_.accumulate;
}

void Trainer::seed_rank_generators() {
  const int rank = comm_->rank();
  if (rank == 0) return;
  const auto mix = [rank](Generator& g) { g.set_state(rank_seed(g.seed(), rank), g.offset()); };
  mix(default_generator(Device::cpu()));
  if (setup_.device.is_cuda()) mix(default_generator(setup_.device));
}

void Trainer::restore(const Checkpoint& c) {
  // A checkpoint of another model or optimizer: the error names the checkpoint.
  const auto loading = [&c](const char* what, const auto& load) {
    try {
      load();
    } catch (const Error& e) {
      SKA_FAIL(ValueError, "checkpoint '", c.dir, "': its ", what, " do not fit this run (was ",
               "it written with another config?): ", e.what());
    }
  };
  loading("weights", [&] { model_->load_state_dict(c.model); });
  loading("optimizer state", [&] {
    optimizer_->load_state_dict(sharding_ ? sharding_->local_state(c.state.optimizer)
                                          : c.state.optimizer);
  });
  if (ema_) {
    SKA_CHECK(!c.ema.empty(), IOError, "checkpoint '", c.dir, "' has no EMA weights but ",
              "train.ema_decay is set");
    ema_->load_state_dict(c.ema);
  }
  const auto world_it = c.state.info.find("world_size");
  const std::optional<int64_t> saved_world_value =
      world_it == c.state.info.end() ? std::optional<int64_t>(1)
                                     : parse_decimal(world_it->second, 1 << 20);
  SKA_CHECK(saved_world_value.has_value() && *saved_world_value >= 1, IOError, "checkpoint '",
            c.dir, "': world_size '", world_it->second, "' is not a number of workers");
  const int saved_world = static_cast<int>(*saved_world_value);
  const int world = comm_->world_size();
  // Updates per epoch depend on the number of workers; a different world size resumes at the
  // same update count with the epoch's data order changed.
  if (saved_world == world) {
    SKA_CHECK(c.state.steps_per_epoch == steps_per_epoch_, ValueError, "checkpoint '", c.dir,
              "' was written with ", c.state.steps_per_epoch,
              " updates per epoch; this config gives ", steps_per_epoch_,
              " (batch size, accumulation or dataset changed)");
  }
  if (scaler_) {
    const auto it = c.state.info.find("precision");
    if (it != c.state.info.end() && it->second == "fp16") {
      scaler_->load(c.state.loss_scale, c.state.loss_scale_growth_tracker);
    } else {
      log("checkpoint '" + c.dir + "' was not trained in fp16; the loss scale starts at " +
          std::to_string(scaler_->scale_value()));
    }
  }
  state_ = c.state;
  state_.optimizer.clear();
  if (saved_world != world) {
    // Keep the epoch; restart it from its first batch with this world's shards and updates.
    log("checkpoint '" + c.dir + "' was written by " + std::to_string(saved_world) +
        " workers, this job has " + std::to_string(world) + ": weights, optimizer and schedule "
        "are restored; the data order of epoch " + std::to_string(state_.epoch) +
        " changes and it restarts from its first batch");
    state_.batch = 0;
    state_.steps_per_epoch = steps_per_epoch_;
  }
  for (const auto& [name, r] : state_.rngs) {
    if (name == "trainer") {
      rng_.set_state(r.seed, r.offset);
    } else if (name == "cpu") {
      default_generator(Device::cpu()).set_state(r.seed, r.offset);
    } else if (setup_.device.is_cuda()) {  // rank 0's device stream, for this worker's device
      default_generator(setup_.device).set_state(r.seed, r.offset);
    }
  }
  seed_rank_generators();  // the saved states are rank 0's; the offsets are the same on all
  last_saved_step_ = state_.step;
}

void Trainer::capture_rngs() {
  state_.rngs.clear();
  const Generator& host = default_generator(Device::cpu());
  state_.rngs["cpu"] = RngState{host.seed(), host.offset()};
  if (setup_.device.is_cuda()) {
    const Generator& g = default_generator(setup_.device);
    state_.rngs[setup_.device.str()] = RngState{g.seed(), g.offset()};
  }
  state_.rngs["trainer"] = RngState{rng_.seed(), rng_.offset()};
}

TensorMap Trainer::ema_tensors() const { return ema_ ? ema_->state_dict() : TensorMap{}; }

void Trainer::sync_buffers(nn::Module& model) {
  // Batch-norm statistics are each worker's own (local batch statistics); evaluation and the
  // checkpoint use rank 0's, as PyTorch's DDP broadcasts them.
  if (comm_->backend() == "single") return;
  for (const auto& [name, t] : model.named_buffers()) comm_->broadcast(t, 0);
}

EvalResult Trainer::evaluate_model(nn::Module& model) {
  sync_buffers(model);
  return evaluate_sums(model, *eval_loader_, setup_.device, train_.eval_precision())
      .all_reduced(*comm_)
      .result();
}

void Trainer::save(bool is_best) {
  read_update_stats();  // the skipped-update count goes into the checkpoint
  last_saved_step_ = state_.step;
  // A sharded optimizer state is first gathered on rank 0 (every worker takes part).
  TensorMap optimizer_state = sharding_ ? sharding_->gather_state(*optimizer_) : TensorMap{};
  if (comm_->rank() != 0) return;  // rank 0 writes; the others decided the same and go on
  capture_rngs();
  if (sharding_ && !logged_state_bytes_) {  // what sharding saves, measured once
    const auto bytes = [](const TensorMap& m) {
      int64_t n = 0;
      for (const auto& [key, t] : m) n += t.numel() * static_cast<int64_t>(t.element_size());
      return n;
    };
    char line[256];
    std::snprintf(line, sizeof(line),
                  "optimizer state: %.2f MB on rank 0, %.2f MB in all (%d workers)",
                  bytes(optimizer_->state_dict()) / 1e6, bytes(optimizer_state) / 1e6,
                  comm_->world_size());
    log(line);
    logged_state_bytes_ = true;
  }
  state_.optimizer = sharding_ ? std::move(optimizer_state) : optimizer_->state_dict();
  state_.loss_scale = scaler_ ? scaler_->scale_value() : 1.0;
  state_.loss_scale_growth_tracker = scaler_ ? scaler_->growth_tracker() : 0;
  state_.epoch_loss_sum = epoch_loss_.loss_sum;
  state_.epoch_loss_updates = epoch_loss_.applied;
  const std::string dir = checkpoints_->save(model_->state_dict(), ema_tensors(), state_, is_best);
  state_.optimizer.clear();
  log("checkpoint " + dir);
}

int Trainer::agreed_stop_signal(bool every_worker_here) {
  if (!setup_.stop_signal) return 0;
  if (comm_->backend() == "single") return setup_.stop_signal();
  if (!every_worker_here) return 0;
  // Every worker's request, in rank order; the first one counts (the same answer on every rank).
  const Tensor mine = Tensor::full({1}, static_cast<double>(setup_.stop_signal()), DType::kF32,
                                   comm_->device());
  Tensor all = Tensor::zeros({comm_->world_size()}, DType::kF32, comm_->device());
  comm_->all_gather(mine, all);
  const Tensor host = all.to(Device::cpu());
  const float* requests = host.data<float>();
  for (int r = 0; r < comm_->world_size(); ++r) {
    if (requests[r] != 0.0f) return static_cast<int>(requests[r]);
  }
  return 0;
}

bool Trainer::stop_if_asked(bool every_worker_here, TrainResult& result) {
  const int sig = agreed_stop_signal(every_worker_here);
  if (sig == 0) return false;
  if (state_.step != last_saved_step_) save(false);
  comm_->barrier();  // no worker exits while rank 0 still writes
  log("stopped at epoch " + std::to_string(state_.epoch) + ", batch " +
      std::to_string(state_.batch) + " of " + std::to_string(steps_per_epoch_ * train_.accumulate) +
      " (update " + std::to_string(state_.step) + "); --resume continues from here");
  result.stop_signal = sig;
  return true;
}

void Trainer::update(const Tensor& micro_loss_sum) {
  const int64_t update_in_epoch = state_.batch / train_.accumulate;
  const double lr = schedule_->lr(state_.epoch, update_in_epoch, steps_per_epoch_);
  stats_->record(step_->apply_update(micro_loss_sum, lr));
  // A skipped update still counts as a step (timm's num_updates): the schedule, the logging and
  // checkpoint cadence never wait for the device's decision.
  state_.lr = lr;
  ++state_.step;
}

bool Trainer::replay_update(const Tensor& images, const Tensor& target) {
  if (!graph_wanted_) return false;
  if (!graphed_ && eager_updates_ < kEagerUpdatesBeforeCapture) {
    ++eager_updates_;  // algorithm choices, optimizer state and constants settle first
    return false;
  }
  // As update() computes it, once this batch is counted.
  const int64_t update_in_epoch = (state_.batch + 1) / train_.accumulate;
  const double lr = schedule_->lr(state_.epoch, update_in_epoch, steps_per_epoch_);
  if (!graphed_) {
    graphed_ = capture_step(train_.cuda_graph, *step_, *optimizer_, *stats_,
                            default_generator(setup_.device), images, target, lr,
                            [this](const std::string& line) { log(line); });
    if (!graphed_) {  // auto, and the capture failed: this batch and the rest run eagerly
      graph_wanted_ = false;
      return false;
    }
    log("train.cuda_graph: captured the training step at update " +
        std::to_string(state_.step + 1) + " (images " + shape_str(images.shape()) + ")");
  }
  if (!graphed_->fits(images, target)) return false;  // a smaller last batch: eager
  graphed_->run(images, target, lr);
  state_.lr = lr;
  ++state_.step;
  return true;
}

void Trainer::read_update_stats() {
  const UpdateStats::Window w = stats_->read();
  for (LossSums* sums : {&epoch_loss_, &window_loss_}) {
    sums->loss_sum += w.loss_sum;
    sums->applied += w.applied;
  }
  const int64_t first = stats_read_step_ + 1;
  stats_read_step_ = state_.step;
  if (w.skipped == 0) return;
  state_.nonfinite_total += w.skipped;
  log("warning: " + std::to_string(w.skipped) + " of the updates " + std::to_string(first) +
      "-" + std::to_string(state_.step) +
      " skipped for a non-finite loss or gradients (longest run so far " +
      std::to_string(w.longest_skip_run) + " in a row" +
      (scaler_ ? "; loss scale now " + std::to_string(scaler_->scale_value()) : "") + ")");
  SKA_CHECK(w.longest_skip_run < train_.max_nonfinite_steps, ValueError,
            "training diverged: ", w.longest_skip_run,
            " consecutive updates with non-finite loss or gradients (train.max_nonfinite_steps = ",
            train_.max_nonfinite_steps, "); try a lower optim.lr or train.clip_grad");
}

void Trainer::train_epoch(int64_t epoch, TrainResult& result, bool& stop) {
  const int64_t batches = steps_per_epoch_ * train_.accumulate;
  const int64_t epochs = schedule_->total_epochs();
  const int world = comm_->world_size(), rank = comm_->rank();
  train_batches_->start_epoch(epoch, state_.batch);
  model_->train();
  const auto t0 = Clock::now();
  // Resumed inside this epoch: its updates before the checkpoint count towards its mean loss.
  epoch_loss_ =
      state_.batch > 0 ? LossSums{state_.epoch_loss_sum, state_.epoch_loss_updates} : LossSums{};
  window_loss_ = LossSums{};
  stats_read_step_ = state_.step;
  Tensor pending_loss;  // the update's micro-batch losses, on the device
  int64_t images = 0;
  data::Batch batch;
  while (state_.batch < batches && train_batches_->next(batch)) {
    comm_->set_label("epoch " + std::to_string(epoch) + ", step " + std::to_string(state_.step));
    // Batch-level augmentation (erasing, mixup/cutmix), keyed by the micro-batch's global index
    // and the worker (one worker keys exactly as a single process).
    const uint64_t micro =
        static_cast<uint64_t>(epoch * train_loader_->batches_per_epoch() + batch.index) * world +
        rank;
    const Tensor soft = data_.augment.apply_batch(batch.images, batch.labels, train_.seed, micro);
    const Tensor target = (soft.defined() ? soft : batch.labels).to(setup_.device);
    const bool last = (state_.batch + 1) % train_.accumulate == 0;
    const Tensor device_images = batch.images.to(setup_.device);
    const bool replayed = replay_update(device_images, target);  // train.cuda_graph
    if (!replayed) {
      const Tensor loss = step_->micro_step(device_images, target, last);
      pending_loss = pending_loss.defined() ? add(pending_loss, loss) : loss;
    }
    images += batch.labels.numel() * world;
    ++state_.batch;
    if (!last) continue;
    if (!replayed) update(pending_loss);
    pending_loss = Tensor();
    if (state_.step % train_.log_every == 0) {  // the loop's one read of the device's values
      read_update_stats();
      if (window_loss_.applied > 0) {
        output_->step(epoch, state_.step, window_loss_.mean(), state_.lr,
                      images / std::max(seconds_since(t0), 1e-9));
      }
      window_loss_ = LossSums{};
    }
    const double elapsed = seconds_since(t0);
    if (setup_.progress && rank == 0) {
      Progress p;
      p.epoch = epoch;
      p.epochs = epochs;
      p.batch = state_.batch;
      p.batches = batches;
      p.images_per_s = images / std::max(elapsed, 1e-9);
      p.eta_s = elapsed / std::max<double>(images, 1) *
                static_cast<double>(batches - state_.batch) * data_.batch_size * world;
      p.loss = epoch_loss_.mean();  // as of the last read (train.log_every)
      p.lr = state_.lr;
      setup_.progress(p);
    }
    // A stop request (the epoch's last update leaves it to the epoch's end, after evaluation).
    if (state_.batch < batches && stop_if_asked(state_.step % train_.log_every == 0, result)) {
      stop = true;
      break;
    }
    const bool at_max = train_.max_steps > 0 && state_.step >= train_.max_steps;
    const bool periodic = ckpt_.every_steps > 0 && state_.step % ckpt_.every_steps == 0 &&
                          state_.step != last_saved_step_;
    if (at_max || (periodic && state_.batch < batches)) save(false);
    if (at_max) {
      stop = true;
      break;
    }
  }
  read_update_stats();
  const double elapsed = seconds_since(t0);
  result.train_seconds += elapsed;
  result.images_per_s = images / std::max(elapsed, 1e-9);
  if (stop) return;
  finish_epoch(epoch, epoch_loss_.mean(), elapsed, result);
}

void Trainer::finish_epoch(int64_t epoch, double train_loss, double seconds,
                           TrainResult& result) {
  // The epoch is complete: evaluate, record, checkpoint. Every worker takes the same decisions
  // (the evaluation is all-reduced), so they all reach the same collectives.
  const int64_t epochs = schedule_->total_epochs();
  state_.epoch = epoch + 1;
  state_.batch = 0;
  const bool last_epoch = state_.epoch >= epochs;
  EpochRecord r;
  r.epoch = epoch;
  r.epochs = epochs;
  r.train_loss = train_loss;
  r.images_per_s = result.images_per_s;
  r.seconds = seconds;
  bool is_best = false;
  if (last_epoch || state_.epoch % train_.eval_every == 0) {
    const auto te = Clock::now();
    r.eval = evaluate_model(*model_);
    if (ema_) {
      ema_model_->load_state_dict(ema_->state_dict());
      r.ema_eval = evaluate_model(*ema_model_);
    }
    result.train_seconds += seconds_since(te);
    r.evaluated = true;
    result.final_eval = r.eval;
    result.final_ema_eval = r.ema_eval;
    if (r.eval.top1 > state_.best_top1) {
      state_.best_top1 = r.eval.top1;
      state_.best_epoch = epoch;
      is_best = true;
    }
    if (ema_ && r.ema_eval.top1 > state_.best_ema_top1) {
      state_.best_ema_top1 = r.ema_eval.top1;
      state_.best_ema_epoch = epoch;
    }
  }
  r.step = state_.step;
  r.lr = state_.lr;
  r.nonfinite_total = state_.nonfinite_total;
  r.loss_scale = scaler_ ? scaler_->scale_value() : 0.0;
  r.best_top1 = state_.best_top1;
  r.best_epoch = state_.best_epoch;
  r.best_ema_top1 = state_.best_ema_top1;
  r.best_ema_epoch = state_.best_ema_epoch;
  output_->epoch(r);
  ++result.epochs_done;
  const bool periodic = ckpt_.every_epochs > 0 && state_.epoch % ckpt_.every_epochs == 0;
  if (last_epoch || periodic || is_best) {
    sync_buffers(*model_);
    save(is_best);
  }
}

bool Trainer::finished() const {
  return state_.epoch >= schedule_->total_epochs() ||
         (train_.max_steps > 0 && state_.step >= train_.max_steps);
}

TrainResult Trainer::fit() {
  TrainResult result;
  const int64_t epochs = schedule_->total_epochs();
  bool stop = train_.max_steps > 0 && state_.step >= train_.max_steps;
  while (!stop && state_.epoch < epochs) {
    train_epoch(state_.epoch, result, stop);
    if (stop || state_.epoch >= epochs) break;
    // A request that came during the evaluation: the epoch's checkpoint may already hold it all.
    stop = stop_if_asked(true, result);
  }
  result.best_top1 = state_.best_top1;
  result.best_epoch = state_.best_epoch;
  result.best_ema_top1 = state_.best_ema_top1;
  result.best_ema_epoch = state_.best_ema_epoch;
  result.steps = state_.step;
  result.stopped_at_max_steps = result.stop_signal == 0 && state_.epoch < epochs &&
                                train_.max_steps > 0 && state_.step >= train_.max_steps;
  if (comm_->rank() == 0) {
    const std::vector<std::string> saved = checkpoints_->list();
    if (!saved.empty()) result.last_checkpoint = saved.back();
  }
  output_->finish();
  return result;
}

}  // namespace ska::train
