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
  Traffic traffic;
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

void add_to(KernelTime& t, const char* name, const std::string& operands, const Traffic& traffic,
            double ms) {
  if (t.name.empty()) {
    t.name = name;
    t.family = family_of(name);
    t.operands = operands;
  }
  ++t.calls;
  t.ms += ms;
  t.bytes += traffic.bytes;
  t.flops += traffic.flops;
}

void add(const char* name, const std::string& operands, const Traffic& traffic, double ms) {
  add_to(totals[name], name, std::string(), traffic, ms);
  add_to(by_operands[{name, operands}], name, operands, traffic, ms);
}

// The distinct elements of t (a dim of stride 0 once) times their size.
double distinct_bytes(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0.0;
  double elements = 1.0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) != 0) elements *= static_cast<double>(t.size(d));
  }
  return elements * static_cast<double>(t.element_size());
}

double numel(const Tensor* t) { return t->defined() ? static_cast<double>(t->numel()) : 0.0; }

// 2 x the multiply-adds of a product kernel (traffic_of), from its tensors in argument order.
double flops_of(const std::string& kernel, const std::vector<const Tensor*>& t) {
  // The multiply-adds per output of a convolution: a filter's taps over its input channels.
  const auto per_output = [](const Tensor* w) {
    return w->defined() && w->dim() == 4 && w->size(0) > 0 ? numel(w) / w->size(0) : 0.0;
  };
  const auto last = [](const Tensor* x, int64_t from_end) {
    return x->defined() && x->dim() >= from_end ? static_cast<double>(x->size(-from_end)) : 0.0;
  };
  if (kernel == "gemm" && t.size() == 5) return 2.0 * numel(t[2]) * last(t[0], 1);  // c, a's k
  if (kernel == "conv2d_forward" && t.size() == 4) return 2.0 * numel(t[3]) * per_output(t[1]);
  if (kernel == "conv2d_backward_input" && t.size() == 3) {
    return 2.0 * numel(t[0]) * per_output(t[1]);
  }
  if (kernel == "conv2d_backward_weight" && t.size() == 3) {
    return 2.0 * numel(t[0]) * per_output(t[2]);
  }
  // q [L.., Nq, d], v [L.., Nk, dv], out [L.., Nq, dv]: S = q k^T and O = P v forward; backward
  // S again, dP = dO v^T, dV = P^T dO, dQ = dS k and dK = dS^T q (d = 0: the logits are given).
  const bool forward = kernel == "attention_forward" && t.size() == 8;
  if (forward || (kernel == "attention_backward" && t.size() == 13)) {
    const double d = last(t[0], 1), dv = last(t[2], 1), keys = last(t[2], 2);
    const double queries = dv > 0.0 ? numel(t[forward ? 6 : 4]) / dv : 0.0;
    return 2.0 * queries * keys * (forward ? d + dv : 3.0 * d + 2.0 * dv);
  }
  // CSKA's logits [B, h, HW, K] from q [B, h, HW, d] and w [h, k*k, K, d]: k*k*d multiply-adds
  // a logit; backward as many for grad_q and again for grad_w, each where it is wanted.
  if (kernel == "conv_logits_forward" && t.size() == 4 && t[1]->dim() == 4) {
    return 2.0 * numel(t[3]) * static_cast<double>(t[1]->size(1) * t[1]->size(3));
  }
  if (kernel == "conv_logits_backward" && t.size() == 6 && t[2]->dim() == 4) {
    const double taps = static_cast<double>(t[2]->size(1) * t[2]->size(3));
    const double wanted = (t[3]->defined() ? 1.0 : 0.0) + (t[4]->defined() ? 1.0 : 0.0);
    return 2.0 * numel(t[0]) * taps * wanted;
  }
  return 0.0;
}

std::vector<KernelTime> longest_first(std::vector<KernelTime> list) {
  std::sort(list.begin(), list.end(), [](const KernelTime& a, const KernelTime& b) {
    if (a.ms != b.ms) return a.ms > b.ms;
    return a.name != b.name ? a.name < b.name : a.operands < b.operands;
  });
  return list;
}

}  // namespace

Traffic traffic_of(const std::string& kernel, const std::vector<const Tensor*>& tensors) {
  Traffic t;
  for (const Tensor* x : tensors) t.bytes += distinct_bytes(*x);
  t.flops = flops_of(kernel, tensors);
  return t;
}

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
  for (const Pending& p : pending) {
    add(p.name, p.operands, p.traffic, device_event_ms(p.start, p.stop));
  }
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

KernelScope::KernelScope(const char* name, Device device, std::string operands, Traffic traffic)
    : name_(name),
      device_(device),
      operands_(std::move(operands)),
      traffic_(traffic),
      outer_(depth++ == 0) {
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
      pending.push_back({name_, operands_, traffic_, start_event_, stop_event});
    } catch (const std::exception& e) {
      const std::lock_guard<std::mutex> lock(records_mutex);
      if (failure.empty()) failure = e.what();
    }
    return;
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  const std::lock_guard<std::mutex> lock(records_mutex);
  add(name_, operands_, traffic_, ms);
}

}  // namespace ska::profiler
