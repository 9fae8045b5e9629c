// The training loop, evaluation, run-folder files and exact resume.
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "data/datasets/factory.h"
#include "data/eval_transform.h"
#include "models/model.h"
#include "ops/loss.h"
#include "ops/pointwise.h"
#include "optim/grad_utils.h"

namespace ska::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string fixed(double v, int digits) {
  std::ostringstream ss;
  ss.setf(std::ios::fixed);
  ss.precision(digits);
  ss << v;
  return ss.str();
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  SKA_CHECK(out.good(), IOError, "cannot append to '", path, "'");
  out << line << "\n";
}

// Top-1 and top-5 hits of one row of logits.
void count_hits(const float* row, int64_t classes, int64_t label, int64_t& top1, int64_t& top5) {
  const float target = row[label];
  int64_t above = 0;  // classes ranked before the label (ties go to the lower index, as topk)
  for (int64_t c = 0; c < classes; ++c) {
    if (row[c] > target || (row[c] == target && c < label)) ++above;
  }
  top1 += above < 1;
  top5 += above < 5;
}

}  // namespace

TrainOptions TrainOptions::from_config(const ConfigNode& t) {
  TrainOptions o;
  o.epochs = t.get_int_in("epochs", o.epochs, 1, 1 << 20);
  o.seed = static_cast<uint64_t>(t.get_int_in("seed", 42, 0, INT64_MAX));
  o.accumulate = t.get_int_in("accumulate", 1, 1, 1 << 16);
  o.clip_grad = t.get_double_in("clip_grad", 0.0, 0.0, 1e30);
  o.label_smoothing = t.get_double_in("label_smoothing", 0.0, 0.0, 0.999);
  o.max_nonfinite_steps = t.get_int_in("max_nonfinite_steps", 10, 1, 1 << 30);
  o.log_every = t.get_int_in("log_every", 50, 1, 1 << 30);
  o.eval_every = t.get_int_in("eval_every", 1, 1, 1 << 20);
  o.max_steps = t.get_int_in("max_steps", 0, 0, INT64_MAX);
  o.ema_decay = t.get_double_in("ema_decay", 0.0, 0.0, 0.999999);
  o.precision = t.get_choice("precision", "fp32", {"fp32", "bf16", "fp16"});
  return o;
}

AutocastState TrainOptions::autocast() const {
  AutocastState s;
  s.enabled = precision != "fp32";
  s.dtype = precision == "fp16" ? DType::kF16 : DType::kBF16;
  return s;
}

DataOptions DataOptions::from_config(const ConfigNode& d, int64_t image_size, int64_t channels,
                                     int64_t num_classes) {
  DataOptions o;
  const data::DatasetSpec spec = data::read_dataset_spec(d);
  o.dataset = spec.name;
  o.root = spec.root;
  o.batch_size = d.get_int_in("batch_size", o.batch_size, 1, 1 << 20);
  o.eval_batch_size = d.get_int_in("eval_batch_size", o.eval_batch_size, 1, 1 << 20);
  o.workers = static_cast<int>(d.get_int_in("workers", 2, 0, 256));
  o.train_subset = d.get_int_in("train_subset", 0, 0, INT64_MAX);
  o.eval_subset = d.get_int_in("eval_subset", 0, 0, INT64_MAX);
  const data::EvalTransform norm = data::read_eval_transform(d, image_size, channels);
  o.mean = norm.mean;
  o.std = norm.std;
  o.eval = norm;
  o.augment = data::read_train_augment(d, image_size, channels, num_classes, o.mean);
  o.device_resident = DeviceResidentOptions::from_config(d, o.augment, image_size);
  return o;
}

CheckpointOptions CheckpointOptions::from_config(const ConfigNode& c) {
  CheckpointOptions o;
  o.keep = static_cast<int>(c.get_int_in("keep", o.keep, 1, 1000));
  o.every_epochs = c.get_int_in("every_epochs", 1, 0, 1 << 20);
  o.every_steps = c.get_int_in("every_steps", 0, 0, INT64_MAX);
  return o;
}

namespace {

// An in-memory split shaped for the model (see load_training_dataset).
std::unique_ptr<data::InMemoryDataset> shape_for_model(const data::InMemoryDataset* mem,
                                                       const DataOptions& options,
                                                       int64_t image_size, int64_t channels,
                                                       int64_t subset) {
  Tensor images = mem->images(), labels = mem->labels();
  if (subset > 0 && subset < images.size(0)) {
    images = images.narrow(0, 0, subset).contiguous();
    labels = labels.narrow(0, 0, subset).contiguous();
  }
  if (images.size(1) != image_size || images.size(3) != channels) {
    images = data::pad_and_replicate(images, image_size, channels);
  }
  SKA_CHECK(images.size(1) == image_size && images.size(2) == image_size, ValueError,
            options.dataset, " images are ", images.size(1), "x", images.size(2),
            "; the model takes ", image_size, "x", image_size);
  return std::make_unique<data::InMemoryDataset>(mem->name(), images, labels, mem->num_classes());
}

}  // namespace

std::unique_ptr<data::InMemoryDataset> load_training_dataset(const DataOptions& options,
                                                             const std::string& split,
                                                             int64_t image_size, int64_t channels,
                                                             int64_t subset) {
  std::unique_ptr<data::Dataset> loaded = data::load_dataset(options.dataset, options.root, split);
  const auto* mem = dynamic_cast<const data::InMemoryDataset*>(loaded.get());
  SKA_CHECK(mem != nullptr, ValueError, "load_training_dataset reads in-memory datasets only; '",
            options.dataset, "' is a folder dataset (use load_dataset_split)");
  return shape_for_model(mem, options, image_size, channels, subset);
}

std::unique_ptr<data::Dataset> load_dataset_split(const DataOptions& options,
                                                  const std::string& split, int64_t image_size,
                                                  int64_t channels, int64_t subset) {
  std::unique_ptr<data::Dataset> loaded = data::load_dataset(options.dataset, options.root, split);
  if (const auto* mem = dynamic_cast<const data::InMemoryDataset*>(loaded.get())) {
    return shape_for_model(mem, options, image_size, channels, subset);
  }
  if (subset <= 0 || subset >= loaded->size()) return loaded;
  std::vector<int64_t> keep = spread_indices(loaded->size(), subset);
  return std::make_unique<SubsetDataset>(std::move(loaded), std::move(keep));
}

LoaderOptions train_loader_options(const DataOptions& options, const data::Dataset& dataset,
                                   uint64_t seed) {
  LoaderOptions lo;
  lo.batch_size = options.batch_size;
  lo.workers = options.workers;
  lo.seed = seed;
  lo.mean = options.mean;
  lo.std = options.std;
  lo.transform = options.augment.transform;
  lo.image_size = options.eval.image_size;
  if (dynamic_cast<const data::InMemoryDataset*>(&dataset) == nullptr) {
    const auto& steps = options.augment.steps;
    SKA_CHECK(std::find(steps.begin(), steps.end(), "RandomResizedCrop") != steps.end(),
              ConfigError, "data.augment.random_resized_crop: ", dataset.name(),
              " images vary in size, so training needs random_resized_crop: true (it crops every "
              "image to the model's ", lo.image_size, "x", lo.image_size, ")");
  }
  return lo;
}

LoaderOptions eval_loader_options(const DataOptions& options, const data::Dataset& dataset) {
  LoaderOptions lo;
  lo.batch_size = options.eval_batch_size;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.workers = options.workers;
  lo.mean = options.mean;
  lo.std = options.std;
  if (dynamic_cast<const data::InMemoryDataset*>(&dataset) == nullptr) {
    lo.eval_transform = std::make_shared<data::EvalTransform>(options.eval);
  }
  return lo;
}

EvalResult evaluate(nn::Module& model, DataLoader& loader, Device device,
                    const AutocastState& autocast) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  AutocastGuard autocast_guard(autocast.dtype, autocast.enabled);
  EvalResult r;
  double loss_sum = 0.0;
  int64_t top1 = 0, top5 = 0;
  loader.start_epoch(0);
  Batch batch;
  while (loader.next(batch)) {
    const Tensor logits = model(batch.images.to(device));
    const Tensor labels = batch.labels.to(device);
    const int64_t n = batch.labels.numel();
    loss_sum += cross_entropy(logits, labels).item() * static_cast<double>(n);
    const Tensor host = logits.to(Device::cpu()).to(DType::kF32).contiguous();
    const int64_t classes = host.size(1);
    const int64_t* y = batch.labels.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) count_hits(host.data<float>() + i * classes, classes, y[i], top1, top5);
    r.count += n;
  }
  model.train(was_training);
  if (r.count > 0) {
    r.loss = loss_sum / static_cast<double>(r.count);
    r.top1 = 100.0 * static_cast<double>(top1) / static_cast<double>(r.count);
    r.top5 = 100.0 * static_cast<double>(top5) / static_cast<double>(r.count);
  }
  return r;
}

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

Trainer::Trainer(const Config& config, TrainerSetup setup) : setup_(std::move(setup)) {
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

  manual_seed(train_.seed);  // model initialisation and dropout draw from the default generators
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

  train_set_ = load_dataset_split(data_, "train", image_size, channels, data_.train_subset);
  SKA_CHECK(train_set_->num_classes() == classes, ConfigError, "model.num_classes: ", classes,
            " does not match ", data_.dataset, "'s ", train_set_->num_classes(), " classes");
  eval_set_ = load_dataset_split(data_, "test", image_size, channels, data_.eval_subset);
  train_loader_ = std::make_unique<DataLoader>(
      *train_set_, train_loader_options(data_, *train_set_, train_.seed));
  eval_loader_ = std::make_unique<DataLoader>(*eval_set_, eval_loader_options(data_, *eval_set_));
  train_batches_ =
      make_batch_source(*train_loader_, *train_set_, data_.device_resident, setup_.device);
  steps_per_epoch_ = train_loader_->batches_per_epoch() / train_.accumulate;
  SKA_CHECK(steps_per_epoch_ > 0, ConfigError, "data.batch_size: ", data_.batch_size, " x ",
            train_.accumulate, " (train.accumulate) is larger than the ",
            train_loader_->samples_per_epoch(), " training images");

  model_->to(setup_.device);
  model_->train();
  params_ = model_->parameters(true);
  optimizer_ = optim::make_optimizer(optim_options, model_->named_parameters(true));
  schedule_ = std::make_unique<optim::LrSchedule>(sched_options);
  if (train_.ema_decay > 0) {
    ema_ = std::make_unique<optim::ModelEma>(*model_, train_.ema_decay);
    ema_model_->to(setup_.device);
  }
  autocast_state_ = train_.autocast();
  if (train_.precision == "fp16") scaler_ = std::make_unique<optim::LossScaler>();
  if (train_.precision != "fp32") {
    log("train.precision " + train_.precision + ": autocast to " + train_.precision +
        " with f32 master weights" + (scaler_ ? " and dynamic loss scaling" : "") +
        (setup_.device.is_cpu() ? " (emulated on the CPU: f32 compute with 16-bit rounding, "
                                  "slower than fp32)"
                                : ""));
  }

  fs::create_directories(setup_.run_dir);
  checkpoints_ = std::make_unique<CheckpointManager>(setup_.run_dir, ckpt_.keep);
  state_.steps_per_epoch = steps_per_epoch_;
  state_.info["optimizer"] = optimizer_->name();
  if (!setup_.resume.empty()) {
    const std::string dir = resolve_checkpoint(setup_.resume);
    restore(load_checkpoint(dir));
    log("resumed from " + dir + " at epoch " + std::to_string(state_.epoch) + ", batch " +
        std::to_string(state_.batch) + ", step " + std::to_string(state_.step));
  }
  state_.info["precision"] = train_.precision;
  std::ofstream(fs::path(setup_.run_dir) / "config.yaml") << config_text_;
  const fs::path csv = fs::path(setup_.run_dir) / "summary.csv";
  if (!fs::exists(csv)) {
    append_line(csv.string(), std::string("epoch,train_loss,eval_loss,eval_top1,eval_top5,lr") +
                                  (ema_ ? ",ema_eval_loss,ema_eval_top1,ema_eval_top5" : ""));
  }
}

Trainer::~Trainer() = default;

void Trainer::log(const std::string& line) const {
  if (setup_.log) setup_.log(line);
}

void Trainer::restore(const Checkpoint& c) {
  model_->load_state_dict(c.model);
  optimizer_->load_state_dict(c.state.optimizer);
  if (ema_) {
    SKA_CHECK(!c.ema.empty(), IOError, "checkpoint '", c.dir, "' has no EMA weights but ",
              "train.ema_decay is set");
    ema_->load_state_dict(c.ema);
  }
  SKA_CHECK(c.state.steps_per_epoch == steps_per_epoch_, ValueError, "checkpoint '", c.dir,
            "' was written with ", c.state.steps_per_epoch, " updates per epoch; this config gives ",
            steps_per_epoch_, " (batch size, accumulation or dataset changed)");
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
  for (const auto& [name, r] : state_.rngs) {
    if (name == "trainer") {
      rng_.set_state(r.seed, r.offset);
    } else {
      default_generator(Device::parse(name)).set_state(r.seed, r.offset);
    }
  }
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

EvalResult Trainer::evaluate_ema() {
  ema_model_->load_state_dict(ema_->state_dict());
  return evaluate(*ema_model_, *eval_loader_, setup_.device, autocast_state_);
}

void Trainer::save(bool is_best) {
  capture_rngs();
  state_.optimizer = optimizer_->state_dict();
  state_.loss_scale = scaler_ ? scaler_->scale_value() : 1.0;
  state_.loss_scale_growth_tracker = scaler_ ? scaler_->growth_tracker() : 0;
  const std::string dir = checkpoints_->save(model_->state_dict(), ema_tensors(), state_, is_best);
  state_.optimizer.clear();
  last_saved_step_ = state_.step;
  log("checkpoint " + dir);
}

bool Trainer::update(double micro_loss_sum) {
  bool nonfinite = !std::isfinite(micro_loss_sum);
  if (!nonfinite) {
    // fp16: the grads are unscaled in the same sweep as the check (one host read either way).
    const Tensor flag =
        scaler_ ? scaler_->unscale_and_check(params_) : optim::grads_nonfinite(params_);
    nonfinite = flag.item() != 0.0;
  }
  if (!nonfinite && train_.clip_grad > 0) {
    nonfinite = !std::isfinite(optim::clip_grad_norm(params_, train_.clip_grad).item());
  }
  if (scaler_) scaler_->update(nonfinite);
  if (nonfinite) {
    optimizer_->zero_grad();
    ++state_.nonfinite_total;
    ++consecutive_nonfinite_;
    log("warning: non-finite loss or gradients at step " + std::to_string(state_.step) +
        "; update skipped (" + std::to_string(consecutive_nonfinite_) + " in a row" +
        (scaler_ ? "; loss scale now " + std::to_string(scaler_->scale_value()) : "") + ")");
    SKA_CHECK(consecutive_nonfinite_ < train_.max_nonfinite_steps, ValueError,
              "training diverged: ", consecutive_nonfinite_,
              " consecutive updates with non-finite loss or gradients (train.max_nonfinite_steps = ",
              train_.max_nonfinite_steps, "); try a lower optim.lr or train.clip_grad");
    return false;
  }
  consecutive_nonfinite_ = 0;
  const int64_t update_in_epoch = state_.batch / train_.accumulate;
  state_.lr = schedule_->lr(state_.epoch, update_in_epoch, steps_per_epoch_);
  optimizer_->set_lr(state_.lr);
  optimizer_->step();
  optimizer_->zero_grad();
  if (ema_) ema_->update(*model_);
  ++state_.step;
  return true;
}

void Trainer::train_epoch(int64_t epoch, TrainResult& result, bool& stop) {
  const int64_t batches = steps_per_epoch_ * train_.accumulate;
  const int64_t epochs = schedule_->total_epochs();
  train_batches_->start_epoch(epoch, state_.batch);
  model_->train();
  const auto t0 = Clock::now();
  double loss_sum = 0.0, pending_loss = 0.0;
  int64_t loss_count = 0, images = 0, window_steps = 0;
  double window_loss = 0.0;
  Batch batch;
  while (state_.batch < batches && train_batches_->next(batch)) {
    // Batch-level augmentation (erasing, mixup/cutmix), keyed by the micro-batch's global index.
    const uint64_t micro = static_cast<uint64_t>(epoch * train_loader_->batches_per_epoch() + batch.index);
    const Tensor soft = data_.augment.apply_batch(batch.images, batch.labels, train_.seed, micro);
    const Tensor target = (soft.defined() ? soft : batch.labels).to(setup_.device);
    // Forward and loss under autocast (train.precision); backward and the update run outside.
    std::optional<AutocastGuard> autocast(std::in_place, autocast_state_.dtype,
                                          autocast_state_.enabled);
    const Tensor logits = (*model_)(batch.images.to(setup_.device));
    // Mixup's targets already carry its label smoothing.
    const Tensor loss = cross_entropy(logits, target, soft.defined() ? 0.0 : train_.label_smoothing);
    autocast.reset();
    const double loss_value = loss.item();
    pending_loss += loss_value;
    const Tensor objective =
        train_.accumulate > 1 ? mul(loss, 1.0 / static_cast<double>(train_.accumulate)) : loss;
    (scaler_ ? scaler_->scale(objective) : objective).backward();
    images += batch.labels.numel();
    ++state_.batch;
    if (state_.batch % train_.accumulate != 0) continue;
    if (update(pending_loss)) {
      const double mean_loss = pending_loss / static_cast<double>(train_.accumulate);
      loss_sum += mean_loss;
      window_loss += mean_loss;
      ++loss_count;
      ++window_steps;
      if (state_.step % train_.log_every == 0) {
        nlohmann::json j = {{"kind", "step"}, {"epoch", epoch}, {"step", state_.step},
                            {"loss", window_loss / window_steps}, {"lr", state_.lr},
                            {"images_per_s", images / std::max(seconds_since(t0), 1e-9)}};
        append_line((fs::path(setup_.run_dir) / "metrics.jsonl").string(), j.dump());
        window_loss = 0.0;
        window_steps = 0;
      }
    }
    pending_loss = 0.0;
    const double elapsed = seconds_since(t0);
    if (setup_.progress) {
      Progress p;
      p.epoch = epoch;
      p.epochs = epochs;
      p.batch = state_.batch;
      p.batches = batches;
      p.images_per_s = images / std::max(elapsed, 1e-9);
      p.eta_s = elapsed / std::max<double>(images, 1) *
                static_cast<double>(batches - state_.batch) * data_.batch_size;
      p.loss = loss_count ? loss_sum / loss_count : loss_value;
      p.lr = state_.lr;
      setup_.progress(p);
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
  const double elapsed = seconds_since(t0);
  result.train_seconds += elapsed;
  result.images_per_s = images / std::max(elapsed, 1e-9);
  if (stop) return;

  // The epoch is complete: evaluate, record, checkpoint.
  const double train_loss = loss_count ? loss_sum / loss_count : NAN;
  state_.epoch = epoch + 1;
  state_.batch = 0;
  const bool last_epoch = state_.epoch >= epochs;
  EvalResult ev, ema_ev;
  bool evaluated = false, is_best = false;
  if (last_epoch || state_.epoch % train_.eval_every == 0) {
    const auto te = Clock::now();
    ev = evaluate(*model_, *eval_loader_, setup_.device, autocast_state_);
    if (ema_) ema_ev = evaluate_ema();
    result.train_seconds += seconds_since(te);
    evaluated = true;
    result.final_eval = ev;
    result.final_ema_eval = ema_ev;
    if (ev.top1 > state_.best_top1) {
      state_.best_top1 = ev.top1;
      state_.best_epoch = epoch;
      is_best = true;
    }
    if (ema_ && ema_ev.top1 > state_.best_ema_top1) {
      state_.best_ema_top1 = ema_ev.top1;
      state_.best_ema_epoch = epoch;
    }
  }
  std::ostringstream line;
  line << "epoch " << epoch << "/" << epochs << ": train_loss " << fixed(train_loss, 4) << ", lr "
       << state_.lr << ", " << fixed(result.images_per_s, 1) << " img/s, " << fixed(elapsed, 1)
       << " s";
  if (evaluated) {
    line << " | eval_loss " << fixed(ev.loss, 4) << ", top-1 " << fixed(ev.top1, 2) << "%, top-5 "
         << fixed(ev.top5, 2) << "% (best " << fixed(state_.best_top1, 2) << "% at epoch "
         << state_.best_epoch << ")";
    if (ema_) {
      line << " | EMA eval_loss " << fixed(ema_ev.loss, 4) << ", top-1 " << fixed(ema_ev.top1, 2)
           << "%, top-5 " << fixed(ema_ev.top5, 2) << "% (best " << fixed(state_.best_ema_top1, 2)
           << "% at epoch " << state_.best_ema_epoch << ")";
    }
  }
  log(line.str());
  const auto eval_columns = [&](const EvalResult& e) {
    return evaluated ? fixed(e.loss, 6) + "," + fixed(e.top1, 4) + "," + fixed(e.top5, 4)
                     : std::string(",,");
  };
  append_line((fs::path(setup_.run_dir) / "summary.csv").string(),
              std::to_string(epoch) + "," + fixed(train_loss, 6) + "," + eval_columns(ev) + "," +
                  std::to_string(state_.lr) + (ema_ ? "," + eval_columns(ema_ev) : ""));
  nlohmann::json j = {{"kind", "epoch"}, {"epoch", epoch}, {"step", state_.step},
                      {"train_loss", train_loss}, {"lr", state_.lr},
                      {"images_per_s", result.images_per_s}, {"seconds", elapsed},
                      {"nonfinite_total", state_.nonfinite_total}};
  if (scaler_) j["loss_scale"] = scaler_->scale_value();
  if (evaluated) {
    j["eval_loss"] = ev.loss;
    j["eval_top1"] = ev.top1;
    j["eval_top5"] = ev.top5;
    if (ema_) {
      j["ema_eval_loss"] = ema_ev.loss;
      j["ema_eval_top1"] = ema_ev.top1;
      j["ema_eval_top5"] = ema_ev.top5;
    }
  }
  append_line((fs::path(setup_.run_dir) / "metrics.jsonl").string(), j.dump());
  ++result.epochs_done;
  const bool periodic = ckpt_.every_epochs > 0 && state_.epoch % ckpt_.every_epochs == 0;
  if (last_epoch || periodic || is_best) save(is_best);
}

TrainResult Trainer::fit() {
  TrainResult result;
  const int64_t epochs = schedule_->total_epochs();
  bool stop = train_.max_steps > 0 && state_.step >= train_.max_steps;
  while (!stop && state_.epoch < epochs) train_epoch(state_.epoch, result, stop);
  result.best_top1 = state_.best_top1;
  result.best_epoch = state_.best_epoch;
  result.best_ema_top1 = state_.best_ema_top1;
  result.best_ema_epoch = state_.best_ema_epoch;
  result.steps = state_.step;
  const std::vector<std::string> saved = checkpoints_->list();
  if (!saved.empty()) result.last_checkpoint = saved.back();
  return result;
}

}  // namespace ska::train
