// The world-size-1 pass-through, the backend choice (see communicator.h) and the helpers the
// backends share (backends.h).
#include "distributed/communicator.h"

#include "distributed/launcher.h"

#include <chrono>
#include <cstdio>
#include <thread>

#include "core/error.h"
#include "distributed/backends.h"

namespace ska::dist {

namespace detail {

std::string format_bytes(size_t bytes) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000.0 && unit < 4) {
    value /= 1000.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 || value >= 100 ? "%.0f %s" : "%.1f %s", value,
                kUnits[unit]);
  return text;
}

std::string describe_collective(const std::string& name, size_t bytes, const std::string& label) {
  return name + " of " + format_bytes(bytes) + (label.empty() ? "" : " at " + label);
}

std::string name_ranks(const std::vector<int>& ranks, const std::string& otherwise) {
  if (ranks.empty()) return otherwise;
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

void check_collective_tensor(const char* collective, const Tensor& t, Device device, bool reduce) {
  SKA_CHECK(t.defined(), ValueError, collective, ": undefined tensor");
  SKA_CHECK(t.device() == device, DeviceError, collective, ": a tensor on ", t.device(),
            " given to a communicator of ", device);
  SKA_CHECK(t.is_contiguous(), ValueError, collective, ": the tensor must be contiguous (",
            t.str(), ")");
  DType dt = t.dtype();
  SKA_CHECK(!reduce || dt == DType::kF32 || dt == DType::kF64 || dt == DType::kI64 ||
                dt == DType::kBF16,
            DTypeError, collective, " reduces f32, f64, i64 or bf16, not ", dt);
}

namespace {

// After a timeout, how long to wait for the other ranks' failure reports.
constexpr auto kSuspectGrace = std::chrono::milliseconds(1500);

std::string failure_key(int rank) { return "ska/failed/" + std::to_string(rank); }

}  // namespace

void report_failure(Store& store, int rank, const std::string& message) {
  try {
    store.set(failure_key(rank), Bytes(message.begin(), message.end()));
  } catch (...) {  // the message still reaches this rank's caller
  }
}

std::string reported_failure(Store& store, int rank) {
  try {
    if (!store.check({failure_key(rank)})) return "";
    Bytes text = store.get(failure_key(rank));
    return std::string(text.begin(), text.end());
  } catch (...) {
    return "";
  }
}

std::vector<int> silent_ranks(Store& store, int rank, int world_size) {
  auto deadline = std::chrono::steady_clock::now() + kSuspectGrace;
  std::vector<int> silent;
  try {
    do {
      silent.clear();
      for (int p = 0; p < world_size; ++p) {
        if (p != rank && !store.check({failure_key(p)})) silent.push_back(p);
      }
      if (silent.size() <= 1) break;  // nobody, or the one everybody waits for
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
  } catch (...) {
    return {};
  }
  // Nobody else reported in a larger world: the store cannot tell who is stuck.
  if (world_size > 2 && silent.size() == static_cast<size_t>(world_size - 1)) return {};
  return silent;
}

#ifndef SKA_WITH_CUDA
std::unique_ptr<Communicator> make_nccl_communicator(const World&, Device device,
                                                     std::shared_ptr<Store>, const CommOptions&) {
  SKA_FAIL(DeviceError, "a communicator on ", device, " needs NCCL; this build has no CUDA ",
           "(configure with -DSKA_CUDA=ON)");
}
#endif

}  // namespace detail

namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
};

// One worker: every collective leaves its tensors as they are (average and sum of one value).
class SingleCommunicator : public Communicator {
 public:
  explicit SingleCommunicator(Device device) : device_(device) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  Device device() const override { return device_; }
  std::shared_ptr<Work> all_reduce_async(Tensor, ReduceOp) override {
    return std::make_shared<DoneWork>();
  }
  void broadcast(Tensor, int) override {}
  void all_gather(const Tensor& input, Tensor output) override {
    output.copy_(input.reshape(output.shape()));
  }
  void reduce_scatter(const Tensor& input, Tensor output, ReduceOp) override {
    output.copy_(input.reshape(output.shape()));
  }
  void barrier() override {}
  void set_label(const std::string&) override {}

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator(const World& world, Device device,
                                                const CommOptions& options) {
  if (world.world_size == 1 && !options.force_backend) {
    return std::make_unique<SingleCommunicator>(device);
  }
  World w = world;
  if (w.world_size == 1 && w.source == "single") {  // nobody to meet: any free local port
    w.master_addr = "127.0.0.1";
    w.master_port = find_free_port();
  }
#ifndef SKA_WITH_CUDA
  // Before the rendezvous: the other ranks would otherwise wait out the timeout for this one.
  if (device.is_cuda()) return detail::make_nccl_communicator(w, device, nullptr, options);
#endif
  std::shared_ptr<Store> store = make_store(w, options.timeout_s);
  if (device.is_cuda()) return detail::make_nccl_communicator(w, device, store, options);
  return detail::make_gloo_communicator(w, std::move(store), options);
}

}  // namespace ska::dist
