// The NCCL backend for CUDA tensors: collectives on a stream of their own, ordered with the
// caller's stream by events, and a watchdog thread that aborts the communicator on a timeout or
// an asynchronous NCCL error. Compiled only with SKA_CUDA (cuda/CMakeLists.txt).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "core/device.h"
#include "core/error.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"
#include "distributed/backends.h"

namespace ska::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kWatchdogPeriod = std::chrono::milliseconds(100);
constexpr auto kInProgressPoll = std::chrono::microseconds(100);
constexpr const char* kUniqueIdKey = "ska/nccl/unique_id";
constexpr const char* kGpuKeyPrefix = "ska/nccl/gpu/";  // + rank: "<uuid> cuda:<index> on <host>"

// This worker's GPU as kGpuKeyPrefix's value: its UUID (what NCCL tells GPUs apart by), then
// where it sits for a person to read.
std::string gpu_identity(int device) {
  cudaDeviceProp prop{};
  SKA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  std::ostringstream out;
  for (const char byte : prop.uuid.bytes) {
    char hex[3];
    std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned>(static_cast<unsigned char>(byte)));
    out << hex;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  out << " cuda:" << device << " on " << (host[0] ? host : "?");
  return out.str();
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF64: return ncclFloat64;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
  }
  SKA_FAIL(DTypeError, "NCCL has no type for ", dtype);
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclAvg; }

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A collective enqueued on the communication stream: its completion event and the tensors that
// must stay allocated until it completes.
struct Pending {
  cudaEvent_t done = nullptr;
  std::vector<Tensor> keep;
  std::string what;
  Clock::time_point start;
  ~Pending() {
    if (done) cudaEventDestroy(done);
  }
};

// The first failure of a communicator, shared with its works (which may outlive it).
struct Failure {
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string message;

  // true when this call recorded the first failure.
  bool record(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    if (failed.load()) return false;
    message = text;
    failed.store(true);
    return true;
  }
  void throw_if_failed() {
    if (!failed.load()) return;
    std::lock_guard<std::mutex> lock(mutex);
    SKA_FAIL(CommError, message);
  }
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<Failure> failure, std::shared_ptr<Pending> pending, int device)
      : failure_(std::move(failure)), pending_(std::move(pending)), device_(device) {}
  // The caller's current stream waits for the collective; the host does not.
  void wait() override {
    failure_->throw_if_failed();
    cuda::DeviceGuard guard(device_);
    SKA_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(device_), pending_->done, 0));
  }

 private:
  std::shared_ptr<Failure> failure_;
  std::shared_ptr<Pending> pending_;
  int device_;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(const World& world, Device device, std::shared_ptr<Store> store,
                   const CommOptions& options)
      : world_(world), device_(device), store_(std::move(store)), options_(options) {
    SKA_CHECK(device.is_cuda(), DeviceError, "NCCL takes CUDA tensors, not ", device);
    const int devices = cuda_device_count();
    SKA_CHECK(device.index < devices, DeviceError, "NCCL: rank ", world.rank, " (local rank ",
              world.local_rank, ") computes on ", device, ", but this machine has ", devices,
              " CUDA device(s): start one worker per GPU at most (--nproc-per-node)");
    SKA_CUDA_CHECK(cudaSetDevice(device.index));  // the device this worker computes on, too
    init_comm();
    stream_ = cuda::create_stream(device.index);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    watchdog_cv_.notify_all();
    watchdog_.join();  // returns once every pending collective completed, or after an abort
    if (!aborted_) {
      // Flushes what is left, then frees; errors at shutdown have no one to report to.
      if (ncclCommFinalize(comm_) == ncclInProgress) poll_until_ready("destroy", timeout_s_point());
      ncclCommDestroy(comm_);
    }
  }

  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return device_; }

  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override {
    check_collective_tensor("all_reduce", tensor, device_, true);
    size_t bytes = tensor.numel() * tensor.element_size();
    auto pending = enqueue("all_reduce", bytes, {tensor}, [&] {
      return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(),
                           nccl_type(tensor.dtype()), nccl_op(op), comm_, stream_);
    });
    return work(std::move(pending));
  }

  void broadcast(Tensor tensor, int root) override {
    check_collective_tensor("broadcast", tensor, device_, false);
    SKA_CHECK(root >= 0 && root < world_.world_size, ValueError, "broadcast: root ", root,
              " is outside the world of ", world_.world_size);
    size_t bytes = tensor.numel() * tensor.element_size();
    work(enqueue("broadcast", bytes, {tensor}, [&] {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), bytes, ncclUint8, root, comm_,
                           stream_);
    }))->wait();
  }

  void all_gather(const Tensor& input, Tensor output) override {
    check_collective_tensor("all_gather", input, device_, false);
    check_collective_tensor("all_gather", output, device_, false);
    check_chunks("all_gather", output, input);
    size_t bytes = input.numel() * input.element_size();
    work(enqueue("all_gather", bytes, {input, output}, [&] {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), bytes, ncclUint8, comm_, stream_);
    }))->wait();
  }

  void reduce_scatter(const Tensor& input, Tensor output, ReduceOp op) override {
    check_collective_tensor("reduce_scatter", input, device_, true);
    check_collective_tensor("reduce_scatter", output, device_, true);
    check_chunks("reduce_scatter", input, output);
    size_t bytes = input.numel() * input.element_size();
    work(enqueue("reduce_scatter", bytes, {input, output}, [&] {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                               nccl_type(output.dtype()), nccl_op(op), comm_, stream_);
    }))->wait();
  }

  // NCCL has no barrier: a one-element all-reduce the host waits for.
  void barrier() override {
    Tensor token = Tensor::zeros({1}, DType::kF32, device_);
    auto pending = enqueue("barrier", 0, {token}, [&] {
      return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm_,
                           stream_);
    });
    while (true) {
      failure_->throw_if_failed();
      cudaError_t state = cudaEventQuery(pending->done);
      if (state == cudaSuccess) return;
      if (state != cudaErrorNotReady) SKA_CUDA_CHECK(state);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void set_label(const std::string& label) override {
    std::lock_guard<std::mutex> lock(mutex_);
    label_ = label;
  }

 private:
  std::shared_ptr<Work> work(std::shared_ptr<Pending> pending) {
    return std::make_shared<NcclWork>(failure_, std::move(pending), device_.index);
  }

  // Rank 0 makes the unique id and publishes it; everybody joins with a non-blocking config, so
  // that a rank that never arrives is a timeout here rather than a hang.
  void init_comm() {
    // Each rank's GPU, read back only to explain a failed join (NCCL refuses two ranks on one).
    const std::string gpu = gpu_identity(device_.index);
    store_->set(kGpuKeyPrefix + std::to_string(world_.rank), Bytes(gpu.begin(), gpu.end()));
    ncclUniqueId id;
    if (world_.rank == 0) {
      SKA_NCCL_CHECK(ncclGetUniqueId(&id));
      store_->set(kUniqueIdKey, Bytes(id.internal, id.internal + sizeof(id.internal)));
    } else {
      Bytes bytes = store_->get(kUniqueIdKey);
      SKA_CHECK(bytes.size() == sizeof(id.internal), CommError, "the NCCL unique id in the store ",
                store_->address(), " has ", bytes.size(), " bytes, not ", sizeof(id.internal));
      std::copy(bytes.begin(), bytes.end(), id.internal);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result =
        ncclCommInitRankConfig(&comm_, world_.world_size, id, world_.rank, &config);
    if (result == ncclInProgress) {
      result = poll_until_ready("ncclCommInitRank", timeout_s_point());
    }
    if (result != ncclSuccess) {
      if (comm_) ncclCommAbort(comm_);
      SKA_FAIL(CommError, "rank ", world_.rank, " could not join the NCCL communicator of ",
               world_.world_size, " ranks: ", nccl_text(result), shared_gpu(gpu));
    }
  }

  // After a failed join: "; rank R computes on the same GPU (...)" where another rank that has
  // published its GPU uses this one's, which NCCL does not allow; "" otherwise, and when the
  // store cannot answer (NCCL's own error is the one to report). Reads only the keys already
  // set, without waiting.
  std::string shared_gpu(const std::string& gpu) const {
    const std::string uuid = gpu.substr(0, gpu.find(' '));
    try {
      for (int r = 0; r < world_.world_size; ++r) {
        const std::string key = kGpuKeyPrefix + std::to_string(r);
        if (r == world_.rank || !store_->check({key})) continue;
        const Bytes other = store_->get(key);
        const std::string theirs(other.begin(), other.end());
        if (theirs.substr(0, theirs.find(' ')) != uuid) continue;
        std::ostringstream out;
        out << "; rank " << r << " computes on the same GPU (" << gpu
            << "): NCCL takes one GPU per rank, so start at most as many workers on a machine "
               "as it has GPUs (--nproc-per-node, LOCAL_RANK)";
        return out.str();
      }
    } catch (const std::exception&) {
    }
    return "";
  }

  Clock::time_point timeout_s_point() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(options_.timeout_s));
  }

  // A non-blocking communicator answers ncclInProgress until its last call is through.
  ncclResult_t poll_until_ready(const char* what, Clock::time_point deadline) {
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return ncclSystemError;
      if (state != ncclInProgress) break;
      if (Clock::now() > deadline) return ncclInProgress;
      std::this_thread::sleep_for(kInProgressPoll);
    }
    return state;
  }

  std::string nccl_text(ncclResult_t result) const {
    if (result == ncclInProgress) {
      std::ostringstream os;
      os << "timed out after " << options_.timeout_s << " s";
      return os.str();
    }
    std::string text = ncclGetErrorString(result);
    const char* last = ncclGetLastError(comm_);
    if (last && *last) text += std::string(" (") + last + ")";
    return text;
  }

  void check_chunks(const char* name, const Tensor& big, const Tensor& small) const {
    SKA_CHECK(big.dtype() == small.dtype(), DTypeError, name, ": ", big.dtype(), " and ",
              small.dtype(), " tensors");
    SKA_CHECK(big.numel() == small.numel() * world_.world_size, ShapeError, name, ": ", big.str(),
              " is not ", world_.world_size, " chunks of ", small.str());
  }

  // Orders the communication stream after the caller's current stream, issues `call` on it and
  // records the completion event the watchdog and the work wait for.
  template <typename Call>
  std::shared_ptr<Pending> enqueue(const char* name, size_t bytes, std::vector<Tensor> keep,
                                   const Call& call) {
    failure_->throw_if_failed();
    auto pending = std::make_shared<Pending>();
    pending->keep = std::move(keep);
    pending->start = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending->what = describe_collective(name, bytes, label_);
    }
    cuda::DeviceGuard guard(device_.index);
    cudaEvent_t ready;
    SKA_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    SKA_CUDA_CHECK(cudaEventRecord(ready, cuda::current_stream(device_.index)));
    SKA_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    SKA_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait is through
    ncclResult_t result;
    std::string error;
    {
      // Never at the same time as the watchdog's abort, which frees the communicator.
      std::lock_guard<std::mutex> lock(nccl_mutex_);
      failure_->throw_if_failed();
      result = call();
      if (result == ncclInProgress) result = poll_until_ready(name, timeout_s_point());
      if (result != ncclSuccess) error = pending->what + " failed: " + nccl_text(result);
    }
    if (!error.empty()) fail(error);
    failure_->throw_if_failed();
    SKA_CUDA_CHECK(cudaEventCreateWithFlags(&pending->done, cudaEventDisableTiming));
    SKA_CUDA_CHECK(cudaEventRecord(pending->done, stream_));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.push_back(pending);
    }
    return pending;
  }

  // Records the first failure, tells the other ranks, and aborts the communicator so that its
  // kernels stop and every later call fails at once.
  // The message goes to stderr too: the caller may be blocked on a stream that waits for it.
  void fail(const std::string& message) {
    if (!failure_->record(message)) return;
    std::fprintf(stderr, "ska: rank %d: %s\n", world_.rank, message.c_str());
    report_failure(*store_, world_.rank, message);
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }

  // The watchdog: retires completed collectives (releasing their tensors) and fails the
  // communicator on a timeout or an asynchronous NCCL error.
  void watch() {
    cudaSetDevice(device_.index);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        watchdog_cv_.wait_for(lock, kWatchdogPeriod);
        if (stopping_ && (pending_.empty() || aborted_.load())) return;
      }
      std::string problem = retire_completed();
      if (problem.empty()) problem = async_error();
      if (!problem.empty()) fail(problem);
    }
  }

  // Drops the completed collectives at the front; describes a failed or timed-out one.
  std::string retire_completed() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!pending_.empty()) {
      Pending& oldest = *pending_.front();
      cudaError_t state = cudaEventQuery(oldest.done);
      if (state == cudaSuccess || (state != cudaErrorNotReady && aborted_.load())) {
        pending_.pop_front();
        continue;
      }
      if (state != cudaErrorNotReady) {
        return oldest.what + " failed: CUDA error " + cudaGetErrorName(state);
      }
      double waited = seconds_between(oldest.start, Clock::now());
      if (waited < options_.timeout_s || aborted_.load()) return "";
      std::string what = oldest.what;
      std::ostringstream os;
      os << what << " timed out after " << options_.timeout_s << " s";
      std::string head = os.str();
      lock.unlock();  // the store round trips must not hold up the callers
      report_failure(*store_, world_.rank, head);
      return head + " waiting for " +
             name_ranks(silent_ranks(*store_, world_.rank, world_.world_size), "its peers");
    }
    return "";
  }

  std::string async_error() {
    std::string text;
    {
      std::lock_guard<std::mutex> lock(nccl_mutex_);
      ncclResult_t state = ncclSuccess;
      if (aborted_.load()) return "";
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclSystemError;
      if (state == ncclSuccess || state == ncclInProgress) return "";
      text = nccl_text(state);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    std::string what = pending_.empty() ? "a collective" : pending_.front()->what;
    return what + " failed: NCCL " + text;
  }

  World world_;
  Device device_;
  std::shared_ptr<Store> store_;
  CommOptions options_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;

  std::mutex mutex_;  // guards pending_, label_, stopping_
  std::mutex nccl_mutex_;  // serialises NCCL calls with the abort; never held with mutex_
  std::condition_variable watchdog_cv_;
  std::deque<std::shared_ptr<Pending>> pending_;
  std::string label_;
  std::shared_ptr<Failure> failure_ = std::make_shared<Failure>();
  std::atomic<bool> aborted_{false};
  bool stopping_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const World& world, Device device,
                                                     std::shared_ptr<Store> store,
                                                     const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(world, device, std::move(store), options);
}

}  // namespace ska::dist::detail
