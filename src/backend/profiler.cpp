// The kernel profiler: per-call records (host times, or pending device event pairs), summed per
// kernel when it stops.
#include "backend/profiler.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "backend/device_runtime.h"
#include "core/error.h"

namespace ska::profiler {

namespace {

struct Pending {
  const char* name;
  void* start;
  void* stop;
};

std::mutex records_mutex;
std::map<std::string, KernelTime> totals;  // host-timed calls, and device calls once resolved
std::vector<Pending> pending;              // device calls whose events are not read yet
std::string failure;                       // a device error met while recording, for stop()
thread_local int depth = 0;                // kernel scopes open on this thread

void add(const char* name, double ms) {
  KernelTime& t = totals[name];
  if (t.name.empty()) {
    t.name = name;
    t.family = family_of(name);
  }
  ++t.calls;
  t.ms += ms;
}

}  // namespace

void start() {
  const std::lock_guard<std::mutex> lock(records_mutex);
  totals.clear();
  pending.clear();
  failure.clear();
  detail::active.store(true, std::memory_order_relaxed);
}

std::vector<KernelTime> stop() {
  detail::active.store(false, std::memory_order_relaxed);
  const std::lock_guard<std::mutex> lock(records_mutex);
  SKA_CHECK(failure.empty(), DeviceError, "profiler: ", failure);
  for (const Pending& p : pending) add(p.name, device_event_ms(p.start, p.stop));
  pending.clear();
  std::vector<KernelTime> out;
  for (auto& entry : totals) out.push_back(std::move(entry.second));
  totals.clear();
  std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) {
    return a.ms != b.ms ? a.ms > b.ms : a.name < b.name;
  });
  return out;
}

std::string family_of(const std::string& kernel) {
  static const std::vector<std::pair<std::string, std::string>> prefixes = {
      {"gemm", "matmul"},
      {"conv2d", "convolution"},
      {"layer_norm", "normalisation"},
      {"batch_norm", "normalisation"},
      {"softmax", "softmax"},
      {"unary", "elementwise"},
      {"binary", "elementwise"},
      {"where", "elementwise"},
      {"fill", "elementwise"},
      {"copy", "copy"},
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
      {"augment", "data"},
  };
  for (const auto& [prefix, family] : prefixes) {
    if (kernel.compare(0, prefix.size(), prefix) == 0) return family;
  }
  return "other";
}

KernelScope::KernelScope(const char* name, Device device)
    : name_(name), device_(device), outer_(depth++ == 0) {
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
      pending.push_back({name_, start_event_, stop_event});
    } catch (const std::exception& e) {
      const std::lock_guard<std::mutex> lock(records_mutex);
      if (failure.empty()) failure = e.what();
    }
    return;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  const std::lock_guard<std::mutex> lock(records_mutex);
  add(name_, ms);
}

}  // namespace ska::profiler
