// The kernel profiler: per-call records (host times, or pending device event pairs), summed per
// kernel when it stops.
#include "backend/profiler.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "backend/device_runtime.h"
#include "core/error.h"

namespace ska::profiler {

namespace {

struct Pending {
  const char* name;
  std::string operands;
  void* start;
  void* stop;
};

std::mutex records_mutex;
// Host-timed calls, and device calls once resolved: per kernel, and per (kernel, operands).
std::map<std::string, KernelTime> totals;
std::map<std::pair<std::string, std::string>, KernelTime> by_operands;
std::vector<Pending> pending;  // device calls whose events are not read yet
std::string failure;           // a device error met while recording, for stop()
thread_local int depth = 0;    // kernel scopes open on this thread

void add_to(KernelTime& t, const char* name, const std::string& operands, double ms) {
  if (t.name.empty()) {
    t.name = name;
    t.family = family_of(name);
    t.operands = operands;
  }
  ++t.calls;
  t.ms += ms;
}

void add(const char* name, const std::string& operands, double ms) {
  add_to(totals[name], name, std::string(), ms);
  add_to(by_operands[{name, operands}], name, operands, ms);
}

std::vector<KernelTime> longest_first(std::vector<KernelTime> list) {
  std::sort(list.begin(), list.end(), [](const KernelTime& a, const KernelTime& b) {
    if (a.ms != b.ms) return a.ms > b.ms;
    return a.name != b.name ? a.name < b.name : a.operands < b.operands;
  });
  return list;
}

}  // namespace

void start() {
  const std::lock_guard<std::mutex> lock(records_mutex);
  totals.clear();
  by_operands.clear();
  pending.clear();
  failure.clear();
  detail::active.store(true, std::memory_order_relaxed);
}

std::vector<KernelTime> stop(std::vector<KernelTime>* calls_by_operands) {
  detail::active.store(false, std::memory_order_relaxed);
  const std::lock_guard<std::mutex> lock(records_mutex);
  SKA_CHECK(failure.empty(), DeviceError, "profiler: ", failure);
  for (const Pending& p : pending) add(p.name, p.operands, device_event_ms(p.start, p.stop));
  pending.clear();
  std::vector<KernelTime> out, calls;
  for (auto& entry : totals) out.push_back(std::move(entry.second));
  for (auto& entry : by_operands) calls.push_back(std::move(entry.second));
  totals.clear();
  by_operands.clear();
  if (calls_by_operands) *calls_by_operands = longest_first(std::move(calls));
  return longest_first(std::move(out));
}

double bf16_dense_peak_tflops(const std::string& device_name) {
  // First match wins, so a variant comes before its family's plain name. A pattern matches
  // whole words only ("A10" is not "A100", "L4" not "L40S").
  static const std::vector<std::pair<std::string, double>> peaks = {
      {"B200", 2250.0},     {"GH200", 989.4},     {"H200 NVL", 835.5}, {"H200", 989.4},
      {"H100 PCIe", 756.5}, {"H100 NVL", 835.5},  {"H100", 989.4},     {"H800 PCIe", 756.5},
      {"H800", 989.4},      {"A100", 312.0},      {"A800", 312.0},     {"A30", 165.0},
      {"A40", 149.7},       {"A10", 125.0},       {"L40S", 362.05},    {"L40", 181.05},
      {"L4", 121.0},        {"RTX 4090", 165.2},  {"RTX 3090", 71.0},
  };
  const auto boundary = [&](size_t at) {
    return at >= device_name.size() || device_name[at] == ' ' || device_name[at] == '-';
  };
  for (const auto& [pattern, tflops] : peaks) {
    for (size_t at = device_name.find(pattern); at != std::string::npos;
         at = device_name.find(pattern, at + 1)) {
      if ((at == 0 || boundary(at - 1)) && boundary(at + pattern.size())) return tflops;
    }
  }
  return 0.0;
}

std::string family_of(const std::string& kernel) {
  static const std::vector<std::pair<std::string, std::string>> prefixes = {
      {"gemm", "matmul"},
      {"conv2d", "convolution"},
      {"layer_norm", "normalisation"},
      {"batch_norm", "normalisation"},
      {"softmax", "softmax"},
      {"attention_", "attention"},
      {"unary", "elementwise"},
      {"binary", "elementwise"},
      {"where", "elementwise"},
      {"star_relu", "elementwise"},
      {"fill", "elementwise"},
      {"copy", "copy"},
      {"multi_cast", "copy"},
      {"roll", "copy"},
      {"reduce", "reduction"},
      {"argmax", "reduction"},
      {"topk", "reduction"},
      {"gather", "indexing"},
      {"index_", "indexing"},
      {"scatter", "indexing"},
      {"cross_entropy", "loss"},
      {"adam", "optimizer"},
      {"sgd", "optimizer"},
      {"multi_", "optimizer"},
      {"advance_counts", "optimizer"},
      {"record_update", "optimizer"},
      {"random", "random"},
      {"dropout", "random"},
      {"augment", "data"},
  };
  for (const auto& [prefix, family] : prefixes) {
    if (kernel.compare(0, prefix.size(), prefix) == 0) return family;
  }
  return "other";
}

KernelScope::KernelScope(const char* name, Device device, std::string operands)
    : name_(name), device_(device), operands_(std::move(operands)), outer_(depth++ == 0) {
  if (!outer_) return;
  if (device_.is_cuda()) {
    push_profile_range(name_);
    try {
      start_event_ = record_device_event(device_);
    } catch (...) {
      pop_profile_range();
      --depth;
      throw;
    }
  } else {
    start_ = std::chrono::steady_clock::now();
  }
}

KernelScope::~KernelScope() {
  --depth;
  if (!outer_) return;
  if (device_.is_cuda()) {
    pop_profile_range();
    if (start_event_ == nullptr) return;
    try {  // a destructor must not throw: stop() reports it
      void* stop_event = record_device_event(device_);
      const std::lock_guard<std::mutex> lock(records_mutex);
      pending.push_back({name_, operands_, start_event_, stop_event});
    } catch (const std::exception& e) {
      const std::lock_guard<std::mutex> lock(records_mutex);
      if (failure.empty()) failure = e.what();
    }
    return;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  const std::lock_guard<std::mutex> lock(records_mutex);
  add(name_, operands_, ms);
}

}  // namespace ska::profiler
