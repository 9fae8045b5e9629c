// Checkpoint files: the training-state container, atomic writes, checkpoint folders and pruning.
#include "train/checkpoint.h"

#include "io/atomic_file.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checked_math.h"
#include "core/error.h"

namespace ska::train {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

uint64_t fnv1a(const char* data, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// Bounds-checked reading of the state file; every failure names the file and what was expected.
class Reader {
 public:
  Reader(const std::string& bytes, const std::string& path) : bytes_(bytes), path_(path) {}
  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }
  std::string get_bytes(uint64_t n, const char* what) {
    need(n, what);
    std::string s = bytes_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  size_t pos() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }

 private:
  void need(uint64_t n, const char* what) {
    SKA_CHECK(n <= bytes_.size() - pos_, IOError, "training state '", path_, "' is truncated: ",
              what, " needs ", n, " bytes at offset ", pos_, ", the file has ", bytes_.size());
  }
  const std::string& bytes_;
  const std::string& path_;
  size_t pos_ = 0;
};

// The most a counter of the training state (epoch, step ...) may hold: far beyond any run, far
// below where products of counters overflow.
constexpr int64_t kMaxCounter = int64_t{1} << 48;
constexpr double kMaxNumber = 1e30;  // the largest lr or loss scale taken for real
// The fewest bytes one optimizer tensor takes: name, dtype and rank lengths and the data size.
constexpr uint64_t kMinTensorRecordBytes = 4 + 4 + 4 + 8;

[[noreturn]] void fail_field(const std::string& path, const char* key, const std::string& value,
                             const std::string& expected) {
  SKA_FAIL(IOError, "training state '", path, "': field '", key, "' is ", value, "; expected ",
           expected);
}

// An integer field of the header, checked to lie in [lo, kMaxCounter].
int64_t get_counter(const Json& h, const char* key, int64_t lo, const std::string& path) {
  const Json& value = h.at(key);
  const bool in_range =
      value.is_number_integer() &&
      (value.is_number_unsigned()
           ? value.get<uint64_t>() <= static_cast<uint64_t>(kMaxCounter) &&
                 value.get<uint64_t>() >= static_cast<uint64_t>(std::max<int64_t>(lo, 0))
           : value.get<int64_t>() >= lo && value.get<int64_t>() <= kMaxCounter);
  if (!in_range) {
    fail_field(path, key, value.dump(),
               detail::str_cat("an integer in [", lo, ", ", kMaxCounter, "]"));
  }
  return value.get<int64_t>();
}

// A number field of the header, checked to be finite and in [lo, hi].
double get_number(const Json& h, const char* key, double lo, double hi, const std::string& path) {
  const Json& value = h.at(key);
  if (!value.is_number()) fail_field(path, key, value.dump(), "a number");
  const double x = value.get<double>();
  if (!(std::isfinite(x) && x >= lo && x <= hi)) {
    fail_field(path, key, value.dump(), detail::str_cat("a finite number in [", lo, ", ", hi, "]"));
  }
  return x;
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SKA_CHECK(in.good(), IOError, "cannot open '", path, "' for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string read_pointer(const std::string& path) {
  std::ifstream in(path);
  std::string name;
  if (!(in >> name)) return "";
  return name;
}

// The `last` and `best` checkpoint names of a checkpoints folder: from pointers.json, the one
// record written atomically after each checkpoint (so the two can never disagree with each
// other); runs written before it have only the `last` and `best` files.
struct Pointers {
  std::string last, best;
};

Pointers read_pointers(const fs::path& root) {
  Pointers p;
  std::ifstream in(root / "pointers.json");
  if (in) {
    try {
      const nlohmann::json j = nlohmann::json::parse(in);
      p.last = j.value("last", "");
      p.best = j.value("best", "");
      return p;
    } catch (const nlohmann::json::exception&) {
      // Unreadable (written by something else): fall back to the pointer files.
    }
  }
  p.last = read_pointer((root / "last").string());
  p.best = read_pointer((root / "best").string());
  return p;
}

// pointers.json first (the record resume and pruning trust), then the plain files for people
// and older tools; a kill between them leaves the files stale until the next save or resume.
void write_pointers(const fs::path& root, const Pointers& p) {
  const nlohmann::json j = {{"last", p.last}, {"best", p.best}};
  io::write_file_atomic((root / "pointers.json").string(), j.dump() + "\n");
  io::write_file_atomic((root / "last").string(), p.last + "\n");
  if (!p.best.empty()) io::write_file_atomic((root / "best").string(), p.best + "\n");
}

// One optimizer tensor: its sizes are checked against each other and the bytes left before its
// storage is allocated.
std::pair<std::string, Tensor> read_tensor(Reader& r, const std::string& path) {
  const std::string name = r.get_bytes(r.get<uint32_t>("name length"), "tensor name");
  const std::string dtype_text = r.get_bytes(r.get<uint32_t>("dtype length"), "dtype");
  DType dtype = DType::kF32;
  try {
    dtype = safetensors_dtype_from_name(dtype_text);
  } catch (const IOError& e) {
    SKA_FAIL(IOError, "training state '", path, "': tensor '", name, "': ", e.what());
  }
  const uint32_t ndim = r.get<uint32_t>("rank");
  SKA_CHECK(ndim <= 8, IOError, "training state '", path, "': tensor '", name, "' has rank ",
            ndim, "; expected at most 8");
  Shape shape;
  for (uint32_t d = 0; d < ndim; ++d) shape.push_back(r.get<int64_t>("dimension"));
  const uint64_t nbytes = r.get<uint64_t>("tensor size");
  const int64_t expected = checked_nbytes<IOError>(
      shape, static_cast<int64_t>(dtype_size(dtype)), "training state '", path, "': tensor '", name,
      "'");
  SKA_CHECK(nbytes == static_cast<uint64_t>(expected), IOError, "training state '", path,
            "': tensor '", name, "' has ", nbytes, " bytes for shape ", shape_str(shape), " of ",
            dtype_text, "; expected ", expected);
  const std::string data = r.get_bytes(nbytes, "tensor data");
  Tensor t = Tensor::empty(shape, dtype);
  std::memcpy(t.data_ptr(), data.data(), data.size());
  return {name, t};
}

}  // namespace

void write_train_state(const std::string& path, const TrainState& s) {
  Json header;
  header["epoch"] = s.epoch;
  header["batch"] = s.batch;
  header["step"] = s.step;
  header["steps_per_epoch"] = s.steps_per_epoch;
  header["nonfinite_total"] = s.nonfinite_total;
  header["lr"] = s.lr;
  header["best_top1"] = s.best_top1;
  header["best_epoch"] = s.best_epoch;
  header["loss_scale"] = s.loss_scale;
  header["loss_scale_growth_tracker"] = s.loss_scale_growth_tracker;
  header["best_ema_top1"] = s.best_ema_top1;
  header["best_ema_epoch"] = s.best_ema_epoch;
  // A sum that is not a finite number (JSON would hold null) is left out: the epoch's mean then
  // covers the updates after a resume only, and the checkpoint still loads.
  const bool loss_kept =
      std::isfinite(s.epoch_loss_sum) && std::abs(s.epoch_loss_sum) <= kMaxNumber;
  header["epoch_loss_sum"] = loss_kept ? s.epoch_loss_sum : 0.0;
  header["epoch_loss_updates"] = loss_kept ? s.epoch_loss_updates : 0;
  header["info"] = s.info;
  Json rngs = Json::object();
  for (const auto& [name, r] : s.rngs) rngs[name] = {{"seed", r.seed}, {"offset", r.offset}};
  header["rngs"] = rngs;
  const std::string text = header.dump();

  std::string out(kTrainStateMagic, 8);
  put<uint32_t>(out, kTrainStateVersion);
  put<uint32_t>(out, 0);  // flags, reserved
  put<uint64_t>(out, text.size());
  out += text;
  put<uint64_t>(out, s.optimizer.size());
  for (const auto& [name, tensor] : s.optimizer) {
    const Tensor host = tensor.to(Device::cpu()).contiguous();
    const std::string dtype = safetensors_dtype_name(host.dtype());
    put<uint32_t>(out, static_cast<uint32_t>(name.size()));
    out += name;
    put<uint32_t>(out, static_cast<uint32_t>(dtype.size()));
    out += dtype;
    put<uint32_t>(out, static_cast<uint32_t>(host.dim()));
    for (int64_t d = 0; d < host.dim(); ++d) put<int64_t>(out, host.size(d));
    const uint64_t nbytes = static_cast<uint64_t>(host.numel()) * host.element_size();
    put<uint64_t>(out, nbytes);
    out.append(static_cast<const char*>(host.data_ptr()), static_cast<size_t>(nbytes));
  }
  put<uint64_t>(out, fnv1a(out.data(), out.size()));
  io::write_file_atomic(path, out);
}

TrainState read_train_state(const std::string& path) {
  const std::string bytes = read_whole_file(path);
  SKA_CHECK(bytes.size() >= 8 && std::memcmp(bytes.data(), kTrainStateMagic, 8) == 0, IOError,
            "'", path, "' is not a training-state file (bad magic number; expected \"",
            kTrainStateMagic, "\")");
  SKA_CHECK(bytes.size() >= 16, IOError, "training state '", path, "' is truncated (",
            bytes.size(), " bytes)");
  uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
  Reader r(bytes, path);
  r.get_bytes(8, "magic");
  const uint32_t version = r.get<uint32_t>("version");
  SKA_CHECK(version >= kTrainStateOldestVersion && version <= kTrainStateVersion, IOError,
            "training state '", path, "' has version ", version, "; this build reads versions ",
            kTrainStateOldestVersion, " to ", kTrainStateVersion);
  SKA_CHECK(bytes.size() >= 24 && stored == fnv1a(bytes.data(), bytes.size() - 8), IOError,
            "training state '", path, "' is corrupt or truncated (checksum mismatch, ",
            bytes.size(), " bytes)");
  r.get<uint32_t>("flags");
  const uint64_t header_len = r.get<uint64_t>("header length");
  TrainState s;
  try {
    const Json h = Json::parse(r.get_bytes(header_len, "header"));
    s.epoch = get_counter(h, "epoch", 0, path);
    s.batch = get_counter(h, "batch", 0, path);
    s.step = get_counter(h, "step", 0, path);
    s.steps_per_epoch = get_counter(h, "steps_per_epoch", 0, path);
    s.nonfinite_total = get_counter(h, "nonfinite_total", 0, path);
    s.lr = get_number(h, "lr", 0.0, kMaxNumber, path);
    s.best_top1 = get_number(h, "best_top1", -1.0, 100.0, path);
    s.best_epoch = get_counter(h, "best_epoch", -1, path);
    s.loss_scale = get_number(h, "loss_scale", 0.0, kMaxNumber, path);
    if (s.loss_scale == 0.0) fail_field(path, "loss_scale", "0", "a finite number > 0");
    if (version >= 2) {
      s.loss_scale_growth_tracker = get_counter(h, "loss_scale_growth_tracker", 0, path);
      s.best_ema_top1 = get_number(h, "best_ema_top1", -1.0, 100.0, path);
      s.best_ema_epoch = get_counter(h, "best_ema_epoch", -1, path);
    }
    if (h.contains("epoch_loss_updates")) {  // written since 2026-11-27; before, 0 (not kept)
      s.epoch_loss_sum = get_number(h, "epoch_loss_sum", -kMaxNumber, kMaxNumber, path);
      s.epoch_loss_updates = get_counter(h, "epoch_loss_updates", 0, path);
    }
    s.info = h.at("info").get<std::map<std::string, std::string>>();
    for (const auto& [name, v] : h.at("rngs").items()) {
      s.rngs[name] = RngState{v.at("seed").get<uint64_t>(), v.at("offset").get<uint64_t>()};
    }
  } catch (const nlohmann::json::exception& e) {
    SKA_CHECK(false, IOError, "training state '", path, "': malformed header: ", e.what());
  }
  const uint64_t count = r.get<uint64_t>("tensor count");
  const uint64_t room = r.left() < 8 ? 0 : (r.left() - 8) / kMinTensorRecordBytes;
  SKA_CHECK(count <= room, IOError, "training state '", path, "': field 'tensor count' is ", count,
            "; the ", r.left(), " bytes left hold at most ", room, " tensors");
  for (uint64_t i = 0; i < count; ++i) s.optimizer.emplace(read_tensor(r, path));
  SKA_CHECK(r.pos() + 8 == bytes.size(), IOError, "training state '", path, "' has ",
            bytes.size() - 8 - r.pos(), " unexpected bytes before its checksum");
  return s;
}

void save_checkpoint(const std::string& dir, const TensorMap& model, const TensorMap& ema,
                     const TrainState& state) {
  fs::create_directories(dir);
  fs::remove(fs::path(dir) / "checkpoint.json");  // rewriting: incomplete until the end
  save_safetensors((fs::path(dir) / "model.safetensors").string(), model);
  if (!ema.empty()) save_safetensors((fs::path(dir) / "ema.safetensors").string(), ema);
  write_train_state((fs::path(dir) / "train_state.bin").string(), state);
  Json marker = {{"format", "ska-checkpoint"},
                 {"version", kTrainStateVersion},
                 {"step", state.step},
                 {"epoch", state.epoch},
                 {"batch", state.batch},
                 {"ema", !ema.empty()}};
  io::write_file_atomic((fs::path(dir) / "checkpoint.json").string(), marker.dump(2) + "\n");
}

bool is_complete_checkpoint(const std::string& dir) {
  return fs::is_regular_file(fs::path(dir) / "checkpoint.json");
}

Checkpoint load_checkpoint(const std::string& dir) {
  SKA_CHECK(is_complete_checkpoint(dir), IOError, "'", dir,
            "' is not a complete checkpoint (no checkpoint.json marker)");
  Checkpoint c;
  c.dir = dir;
  c.model = load_safetensors((fs::path(dir) / "model.safetensors").string());
  const fs::path ema = fs::path(dir) / "ema.safetensors";
  if (fs::exists(ema)) c.ema = load_safetensors(ema.string());
  c.state = read_train_state((fs::path(dir) / "train_state.bin").string());
  return c;
}

std::string resolve_checkpoint(const std::string& path) {
  if (is_complete_checkpoint(path)) return path;
  const fs::path root = fs::is_directory(fs::path(path) / "checkpoints")
                            ? fs::path(path) / "checkpoints"
                            : fs::path(path);
  SKA_CHECK(fs::is_directory(root), IOError, "no checkpoint at '", path, "' (not a folder)");
  const std::string last = read_pointers(root).last;
  if (!last.empty() && is_complete_checkpoint((root / last).string())) return (root / last).string();
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.is_directory() && is_complete_checkpoint(e.path().string())) found.push_back(e.path().string());
  }
  SKA_CHECK(!found.empty(), IOError, "no complete checkpoint in '", root.string(), "'");
  std::sort(found.begin(), found.end());
  return found.back();
}

CheckpointManager::CheckpointManager(std::string run_dir, int keep)
    : root_((fs::path(run_dir) / "checkpoints").string()), keep_(std::max(keep, 1)) {
  fs::create_directories(root_);
  // A resumed run: make the pointer files agree with the record again.
  const Pointers p = read_pointers(root_);
  if (fs::exists(fs::path(root_) / "pointers.json") && !p.last.empty()) write_pointers(root_, p);
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && name.rfind("step-", 0) == 0 && is_complete_checkpoint(e.path().string())) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string CheckpointManager::save(const TensorMap& model, const TensorMap& ema,
                                    const TrainState& state, bool is_best) {
  const std::string name = step_dir_name(state.step);
  const std::string dir = (fs::path(root_) / name).string();
  save_checkpoint(dir, model, ema, state);
  Pointers p = read_pointers(root_);
  p.last = name;
  if (is_best) p.best = name;
  write_pointers(root_, p);
  prune();
  return dir;
}

void CheckpointManager::prune() {
  const std::vector<std::string> all = list();
  const Pointers pointers = read_pointers(root_);
  const std::string& best = pointers.best;
  const std::string& last = pointers.last;
  const size_t n = all.size();
  for (size_t i = 0; i + static_cast<size_t>(keep_) < n; ++i) {
    const std::string name = fs::path(all[i]).filename().string();
    if (name == best || name == last) continue;
    // Drop the marker first: a half-removed folder is never taken for a checkpoint.
    fs::remove(fs::path(all[i]) / "checkpoint.json");
    fs::remove_all(all[i]);
  }
  // Leftovers of interrupted writes (folders without a marker) older than the newest one.
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && !is_complete_checkpoint(e.path().string()) && !all.empty() &&
        name < fs::path(all.back()).filename().string()) {
      fs::remove_all(e.path());
    }
  }
}

}  // namespace ska::train
