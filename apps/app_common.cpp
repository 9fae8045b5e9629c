// The shared parts of the commands: config lookup and loading, the model/data sections, and the
// main() wrapper that maps errors to exit codes.
#include "app_common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "io/safetensors.h"
#include "io/weight_map.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"
#include "train/checkpoint.h"
#include "train/options.h"

namespace ska::apps {
namespace fs = std::filesystem;

namespace {

// The keys of `data:` that the evaluation transform reads (src/data/eval_transform.h).
const std::vector<std::string> kEvalDataKeys = {"mean", "std", "crop_pct", "interpolation"};

bool is_experiment(const ConfigNode& root) { return root.is_map() && root.has("model"); }

// The repository's configs/ folder above the running executable (build-x/apps/summary -> repo).
std::string configs_above_executable() {
  std::error_code error;
  fs::path dir = fs::read_symlink("/proc/self/exe", error);
  if (error) return "";
  for (dir = dir.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    if (fs::is_directory(dir / "configs" / "models")) return (dir / "configs").string();
  }
  return "";
}

}  // namespace

void add_config_options(CLI::App& app, ConfigOptions& options) {
  app.add_option("--config", options.config,
                 "model or experiment YAML: a path, or a name looked up as configs/<name>.yaml "
                 "then configs/models/<name>.yaml")
      ->required();
  app.add_option("--set", options.sets,
                 "override one config value, key.path=value (repeatable; applied in order)")
      ->take_all()
      ->allow_extra_args(false);
  app.add_flag("--print-config", options.print_config,
               "print the resolved config (includes and overrides applied) and continue");
}

std::vector<std::string> config_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SKA_CONFIG_DIR"); env && *env) dirs.push_back(env);
  dirs.push_back((fs::current_path() / "configs").string());
  if (std::string above = configs_above_executable(); !above.empty()) dirs.push_back(above);
#ifdef SKA_SOURCE_DIR
  dirs.push_back(std::string(SKA_SOURCE_DIR) + "/configs");
#endif
  std::vector<std::string> unique;  // the same folder reached twice is tried once
  for (const std::string& dir : dirs) {
    std::error_code error;
    const fs::path canonical = fs::weakly_canonical(dir, error);
    const std::string key = error ? dir : canonical.string();
    if (std::find(unique.begin(), unique.end(), key) == unique.end()) unique.push_back(key);
  }
  return unique;
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno == ERANGE) {
          return "'" + text + "' is not " + range;
        }
        if (value < lo || value > hi) return "value " + text + " is out of range; expected " + range;
        return "";
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator number_above(double lo, bool inclusive) {
  std::ostringstream bound;
  bound << (inclusive ? ">= " : "> ") << lo;
  const std::string range = "a number " + bound.str();
  return CLI::Validator(
      [lo, inclusive, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double value = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value)) {
          return "'" + text + "' is not " + range;
        }
        if (inclusive ? value < lo : value <= lo) {
          return "value " + text + " is out of range; expected " + range;
        }
        return "";
      },
      "NUMBER " + bound.str());
}

Device device_option(const std::string& text) {
  const Device device = Device::parse(text);
  if (device.is_cpu()) return device;
#ifndef SKA_WITH_CUDA
  SKA_FAIL(DeviceError, "--device ", text, ": this build has no CUDA support (configure with "
           "-DSKA_CUDA=ON, README: Building); use --device cpu");
#endif
  const int visible = cuda_device_count();
  SKA_CHECK(device.index < visible, DeviceError, "--device ", text, ": ",
            visible == 0 ? std::string("no CUDA device is visible (no driver, or "
                                       "CUDA_VISIBLE_DEVICES hides them all)")
                         : std::to_string(visible) + " CUDA device(s) are visible (cuda:0 to cuda:" +
                               std::to_string(visible - 1) + ")");
  return device;
}

void add_batch_option(CLI::App& app, int64_t& batch, const std::string& help) {
  app.add_option("--batch", batch, help)->check(integer_in(1, kMaxBatch));
}

namespace {

// The files a config name may be, in search order, each once (an absolute name is only itself).
std::vector<std::string> config_candidates(const std::string& name_or_path) {
  const bool has_suffix = fs::path(name_or_path).extension() == ".yaml" ||
                          fs::path(name_or_path).extension() == ".yml";
  const std::string file = has_suffix ? name_or_path : name_or_path + ".yaml";
  std::vector<std::string> candidates = {fs::path(name_or_path).lexically_normal().string()};
  auto add = [&candidates](const fs::path& path) {
    const std::string normal = path.lexically_normal().string();
    if (std::find(candidates.begin(), candidates.end(), normal) == candidates.end()) {
      candidates.push_back(normal);
    }
  };
  if (fs::path(file).is_absolute()) {
    add(file);
    return candidates;
  }
  for (const std::string& dir : config_search_dirs()) {
    add(fs::path(dir) / file);
    add(fs::path(dir) / "models" / file);
  }
  return candidates;
}

}  // namespace

std::string resolve_config_path(const std::string& name_or_path) {
  if (fs::is_regular_file(name_or_path)) return name_or_path;
  const std::vector<std::string> candidates = config_candidates(name_or_path);
  std::string tried;
  for (const std::string& candidate : candidates) {
    if (candidate != candidates.front() && fs::is_regular_file(candidate)) return candidate;
    tried += (tried.empty() ? "" : ", ") + candidate;
  }
  SKA_FAIL(ConfigError, "config '", name_or_path, "' not found (tried: ", tried,
           "; set SKA_CONFIG_DIR to the configs folder to look elsewhere)");
}

Config load_config(const ConfigOptions& options) {
  Config config = Config::load(resolve_config_path(options.config));
  for (const std::string& assignment : options.sets) config.set(assignment);
  if (options.print_config) {
    (options.print_config_to_stderr ? std::cerr : std::cout) << config.dump() << std::flush;
  }
  return config;
}

void load_weights(nn::Module& model, const std::string& weights, const std::string& map_path) {
  TensorMap tensors = load_safetensors(weights);
  try {
    if (!map_path.empty()) {
      tensors = import_weights(load_weight_map(map_path), tensors, model.state_dict());
    }
    model.load_state_dict(tensors, /*strict=*/true);
  } catch (const ConfigError&) {
    throw;  // a malformed map names its own file
  } catch (const DTypeError& e) {
    SKA_FAIL(DTypeError, weights, ": tensors stored in a dtype the model does not convert from: ",
             e.what());
  } catch (const Error& e) {
    SKA_FAIL(ValueError, weights, ": the weights do not fit the model: ", e.what());
  }
}

std::string resolve_weights_file(const std::string& checkpoint, bool ema) {
  if (!fs::is_directory(checkpoint)) {
    SKA_CHECK(!ema, ValueError, "--ema needs a checkpoint folder, not a weights file");
    return checkpoint;
  }
  const std::string dir = train::resolve_checkpoint(checkpoint);
  const fs::path weights = fs::path(dir) / (ema ? "ema.safetensors" : "model.safetensors");
  SKA_CHECK(fs::exists(weights), IOError, "checkpoint '", dir, "' has no ",
            weights.filename().string(), (ema ? " (trained without EMA)" : ""));
  return weights.string();
}

void mark_read(const ConfigNode& node) {
  if (node.is_map()) {
    for (const std::string& key : node.keys()) mark_read(node[key]);
  } else if (node.is_list()) {
    for (size_t i = 0; i < node.size(); ++i) mark_read(node.at(i));
  }
}

ConfigNode model_section(const Config& config, const std::vector<std::string>& own) {
  const ConfigNode root = config.root();
  if (!is_experiment(root)) return root;
  // The trainer's sections this command does not use are read as the trainer reads them, so that
  // a typo or a bad value inside one is an error here too; a key outside the trainer's sections
  // (a misspelt section, `trian:`) stays unread and check_unused() reports it.
  const train::TrainOptions train_options = train::TrainOptions::from_config(root["train"]);
  const optim::OptimizerOptions optim_options = optim::OptimizerOptions::from_config(root["optim"]);
  if (std::find(own.begin(), own.end(), "sched") == own.end())
    optim::ScheduleOptions::from_config(root["sched"], optim_options.lr, train_options.epochs);
  if (std::find(own.begin(), own.end(), "checkpoint") == own.end())
    train::CheckpointOptions::from_config(root["checkpoint"]);
  if (std::find(own.begin(), own.end(), "distributed") == own.end())
    train::DistributedOptions::from_config(root["distributed"]);
  return root["model"];
}

ConfigNode data_section(const Config& config) {
  const ConfigNode root = config.root();
  if (!is_experiment(root)) return root["data"];
  const ConfigNode data = root["data"];
  if (data.is_map()) {
    for (const std::string& key : data.keys()) {
      const bool ours = std::find(kEvalDataKeys.begin(), kEvalDataKeys.end(), key) !=
                        kEvalDataKeys.end();
      if (!ours) mark_read(data[key]);  // the trainer's keys (dataset, augmentation ...)
    }
  }
  return data;
}

models::ModelInput model_input(const ConfigNode& model) {
  models::ModelInput input;
  input.image_size = model.get<int64_t>("image_size", input.image_size);
  input.in_channels = model.get<int64_t>("in_channels", input.in_channels);
  input.num_classes = model.get<int64_t>("num_classes", input.num_classes);
  return input;
}

void limit_openmp_spinning(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  ::setenv("GOMP_SPINCOUNT", "10000", 0);
  ::execv("/proc/self/exe", argv);  // returns only on failure: then run with libgomp's default
}

int run_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help, or the usage error and a hint
    return code == 0 ? 0 : kExitUsage;
  }
  try {
    return body();
  } catch (const std::exception& e) {
    std::string message = e.what();
    for (size_t pos = message.find('\n'); pos != std::string::npos;
         pos = message.find('\n', pos + 1)) {
      message.insert(pos + 1, "  ");  // keep multi-line reports readable under the first line
    }
    std::cerr << app.get_name() << ": error: " << message << std::endl;
    return kExitError;
  }
}

}  // namespace ska::apps
