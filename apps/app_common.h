// What every command shares: finding and loading the config (`--config`, `--set`,
// `--print-config`), the model section of a config, strict validation, and the main() wrapper
// that turns library errors into a one-line message and exit code 2.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/device.h"
#include "models/model.h"

namespace ska::apps {

// Exit codes: 0 success, 1 command-line usage error (CLI11), 2 a library error (bad config,
// unreadable file, shape mismatch ...).
constexpr int kExitUsage = 1;
constexpr int kExitError = 2;

struct ConfigOptions {
  std::string config;                // a path, or a bare name looked up in the config folders
  std::vector<std::string> sets;     // "key.path=value" overrides, in order
  bool print_config = false;
  bool print_config_to_stderr = false;  // keeps stdout clean for machine-read output (--json)
};

// Adds --config (required), --set (repeatable) and --print-config to `app`.
void add_config_options(CLI::App& app, ConfigOptions& options);

// The folders a bare config name is looked up in, in order: $SKA_CONFIG_DIR, <cwd>/configs, the
// configs/ folder of the repository holding this executable (found by walking up from it), and
// the source tree it was built from.
std::vector<std::string> config_search_dirs();

// `name_or_path` itself when it is an existing file; otherwise <dir>/<name>.yaml, then
// <dir>/models/<name>.yaml for each search dir (".yaml" is added when missing). ConfigError
// listing the places tried when none exists.
std::string resolve_config_path(const std::string& name_or_path);

// The largest --batch the commands accept: keeps a typo from asking for terabytes of input.
constexpr int64_t kMaxBatch = int64_t{1} << 16;

// A CLI11 check that the value is an integer in [lo, hi]; the usage error reads
// "--batch: value 0 is out of range; expected an integer in [1, 65536]".
CLI::Validator integer_in(int64_t lo, int64_t hi);
// The same for a number above `lo` (or at least `lo` with `inclusive`), without an upper bound:
// "--seconds: value 0 is out of range; expected a number > 0".
CLI::Validator number_above(double lo, bool inclusive = false);

// Adds --batch (an integer in [1, kMaxBatch]) with `help` to `app`.
void add_batch_option(CLI::App& app, int64_t& batch, const std::string& help);

// The device of a --device option ("cpu", "cuda", "cuda:N"), checked to exist here: a CUDA
// device in a build without CUDA, or past the visible ones, is a DeviceError naming the option
// and what there is, before any work starts.
Device device_option(const std::string& text);

// Loads the config named by the options and applies the overrides in order.
Config load_config(const ConfigOptions& options);

// Visits every key and element under `node`, so check_unused() counts them as read (a section
// this command does not use).
void mark_read(const ConfigNode& node);

// The model map of a config: its `model:` section for an experiment config, else the root (a
// configs/models/*.yaml file). The trainer's other sections (train, optim, and sched, checkpoint
// and distributed unless in `own`, those the command reads itself) are read as the trainer reads
// them, so that check_unused() reports a typo or a bad value in any of them, and a key outside
// the trainer's sections (a misspelt section) too.
ConfigNode model_section(const Config& config, const std::vector<std::string>& own = {});
// The `data:` map (of the experiment, or inside a model file); null when absent.
ConfigNode data_section(const Config& config);

// The model's input facts as build_model reads them (image_size, in_channels, num_classes).
models::ModelInput model_input(const ConfigNode& model);

// Loads the safetensors file `weights` into `model`, through the weight map file `map_path` when
// it is not empty. Errors name the file: DTypeError when only dtypes are at fault (I32 stored
// for an F32 parameter), ValueError "<weights>: the weights do not fit the model: ..." for any
// other mismatch; a malformed map's ConfigError names the map.
void load_weights(nn::Module& model, const std::string& weights, const std::string& map_path = "");

// The weights file of `--checkpoint`: a .safetensors file itself, or for a checkpoint folder (or a
// run folder: its last checkpoint) its model.safetensors (ema.safetensors with `ema`). IOError
// when the folder has no such file; ValueError for `ema` with a plain weights file.
std::string resolve_weights_file(const std::string& checkpoint, bool ema = false);

// Makes OpenMP's idle threads yield the CPU soon: when the user set neither OMP_WAIT_POLICY nor
// GOMP_SPINCOUNT, sets GOMP_SPINCOUNT=10000 and re-executes this program (libgomp reads them
// once, when it loads). libgomp's default spins for about a millisecond at every barrier; on a
// busy or shared machine those spinning threads take the cores from the ones doing the work:
// CPU training ran 6.5x slower under load for that alone (see README, Benchmarks). Call first
// in main(), before any thread starts; returns only when no re-execution happened.
void limit_openmp_spinning(char** argv);

// Parses the command line into `app`, then runs `body`. CLI11 parse errors print usage and exit
// as CLI11 does (--help: exit code 0, bad usage: 1); ska::Error (and any std::exception) becomes one line
// "<app name>: error: <message>" on stderr (multi-line reports indented below it) and exit code 2.
int run_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

}  // namespace ska::apps
