// The CUDA runtime of the emulated device (tests/emu/device.h): the calls cuda/ makes, answered on
// the host. Memory is host memory (device allocations start as 0xff bytes, NaN in every float
// type, so that a read of what no kernel wrote shows); streams are synchronous; events hold the
// host time of their record; a stream under capture records its work into a graph (a stream
// waiting on an event recorded under it joins it, and leaves it at its end), and a synchronisation
// of a captured stream invalidates the capture, as on a device. SKA_EMU_DEVICES sets how many
// devices it reports (device_count below).
// clang-format off
#include "tests/simt/simt.h"  // first: it defines __shared__ before the toolkit's headers
// clang-format on

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/emu/device.h"

namespace ska::emu {
struct Capture;
}

// The runtime's opaque types, defined here for the emulation.
struct CUstream_st {
  std::shared_ptr<ska::emu::Capture> capture;  // while capturing
  // A forked stream's work since its last event record: unjoined, if the capture ended now. (A
  // device also asks that a stream of the capture waited on that event; not checked here.)
  bool unjoined = false;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point time;
  std::shared_ptr<ska::emu::Capture> capture;  // recorded under capture
};
struct CUgraph_st {
  std::shared_ptr<std::vector<std::function<void()>>> work;
};
struct CUgraphExec_st {
  std::shared_ptr<std::vector<std::function<void()>>> work;
};

namespace ska::emu {

// One capture (cudaStreamBeginCapture to cudaStreamEndCapture): the work it records, the stream
// it began on and the streams forked into it by waiting on an event recorded under it.
struct Capture {
  std::shared_ptr<std::vector<std::function<void()>>> work =
      std::make_shared<std::vector<std::function<void()>>>();
  CUstream_st* origin = nullptr;
  std::thread::id thread;  // the one that began it
  std::vector<CUstream_st*> forked;
  bool invalidated = false;  // a synchronisation under it: it ends without a graph
  bool ended = false;
};

namespace {

constexpr int kSms = 132;
constexpr size_t kSharedPerBlock = 227 * 1024, kSharedPerSm = 228 * 1024;
constexpr size_t kGlobalBytes = size_t{80} << 30;

// The device thread: runs submitted work in order; never destroyed (work may come until exit).
class DeviceThread {
 public:
  DeviceThread() : thread_([this] { loop(); }) { thread_.detach(); }

  void run(const std::function<void()>& work) {
    if (std::this_thread::get_id() == id_.load()) return work();  // work submitting work (a graph)
    std::packaged_task<void()> task(work);
    std::future<void> done = task.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    done.get();
  }

 private:
  void loop() {
    id_.store(std::this_thread::get_id());
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  std::atomic<std::thread::id> id_;
  std::thread thread_;
};

DeviceThread& device_thread() {
  static DeviceThread* t = new DeviceThread();
  return *t;
}

std::mutex g_streams_mu;  // guards the streams' capture state and the captures
CUstream_st g_default_stream;
std::vector<std::shared_ptr<Capture>> g_captures;  // those not ended
thread_local int t_device = 0;                     // cudaSetDevice's

// SKA_EMU_DEVICES (1 to 8, default 1): how many devices the emulation reports. They share the
// one device thread and the host's memory; a data-parallel worker computes on one of them.
int device_count() {
  static const int count = [] {
    const char* env = std::getenv("SKA_EMU_DEVICES");
    if (env == nullptr || *env == '\0') return 1;
    const int n = std::atoi(env);
    if (n < 1 || n > 8 || std::to_string(n) != env) {
      std::fprintf(stderr, "emulated device: SKA_EMU_DEVICES=%s is not a count of 1 to 8\n", env);
      std::exit(2);
    }
    return n;
  }();
  return count;
}
thread_local cudaError_t t_last_error = cudaSuccess;

CUstream_st* resolve(cudaStream_t s) {
  const auto raw = reinterpret_cast<uintptr_t>(s);
  if (raw == 0 || raw == 1 || raw == 2) return &g_default_stream;  // default, legacy, per-thread
  return s;
}

cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

void submit_for_simt(cudaStream_t stream, std::function<void()> work) {
  const cudaError_t e = submit(stream, std::move(work));
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("emulated device: a launch on a stream whose capture ") +
                             "was invalidated (" + cudaGetErrorString(e) + ")");
  }
}
const bool g_installed = (simt::set_submitter(submit_for_simt), true);

}  // namespace

cudaError_t submit(cudaStream_t stream, std::function<void()> work) {
  CUstream_st* s = resolve(stream);
  {
    std::lock_guard<std::mutex> lock(g_streams_mu);
    if (s->capture) {
      if (s->capture->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
      s->capture->work->push_back(std::move(work));
      s->unjoined = s != s->capture->origin;
      return cudaSuccess;
    }
  }
  device_thread().run(work);
  return cudaSuccess;
}

}  // namespace ska::emu

using ska::emu::fail;
using ska::emu::resolve;

extern "C" {

// --- Errors ---
cudaError_t cudaGetLastError() {
  const cudaError_t e = ska::emu::t_last_error;
  ska::emu::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return ska::emu::t_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
      return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched:
      return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined:
      return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorIllegalState:
      return "cudaErrorIllegalState";
    default:
      return "cudaError (emulated device)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "the capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    default:
      return "an error of the emulated device";
  }
}

// --- Devices ---
cudaError_t cudaGetDeviceCount(int* count) {
  *count = ska::emu::device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= ska::emu::device_count()) return fail(cudaErrorInvalidDevice);
  ska::emu::t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = ska::emu::t_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= ska::emu::device_count()) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof *prop);
  std::strncpy(prop->name, "emulated device (tests/emu, sm_90 limits)", sizeof prop->name - 1);
  prop->uuid.bytes[0] = static_cast<char>(device + 1);  // each device its own, as NCCL asks
  prop->totalGlobalMem = ska::emu::kGlobalBytes;
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = ska::emu::kSharedPerBlock;
  prop->sharedMemPerMultiprocessor = ska::emu::kSharedPerSm;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->multiProcessorCount = ska::emu::kSms;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device < 0 || device >= ska::emu::device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = ska::emu::kSms;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(ska::emu::kSharedPerBlock);
      break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      *value = static_cast<int>(ska::emu::kSharedPerSm);
      break;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      break;
    case cudaDevAttrWarpSize:
      *value = 32;
      break;
    default:
      return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  // As on a device in thread-local capture mode (device_graph.cpp's): not allowed in a thread
  // that is capturing, and its captures are lost; other threads may.
  bool capturing = false;
  for (const auto& c : ska::emu::g_captures) {
    if (c->thread != std::this_thread::get_id()) continue;
    c->invalidated = true;
    capturing = true;
  }
  return capturing ? fail(cudaErrorStreamCaptureUnsupported) : cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize &&
      (value < 0 || static_cast<size_t>(value) > ska::emu::kSharedPerBlock)) {
    return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void*, int threads,
                                                          size_t shared) {
  if (threads <= 0 || threads > 1024 || shared > ska::emu::kSharedPerBlock) {
    return fail(cudaErrorInvalidValue);
  }
  int n = 2048 / threads;
  if (shared > 0) n = std::min<int>(n, static_cast<int>(ska::emu::kSharedPerSm / (shared + 1024)));
  *blocks = std::min(n, 32);
  return cudaSuccess;
}
cudaError_t cudaProfilerStart() { return cudaSuccess; }
cudaError_t cudaProfilerStop() { return cudaSuccess; }

// --- Memory ---
cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (size > ska::emu::kGlobalBytes) return fail(cudaErrorMemoryAllocation);
  void* p = std::aligned_alloc(256, (std::max<size_t>(size, 1) + 255) / 256 * 256);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, size);
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(size, 1) + 255) / 256 * 256);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  *ptr = p;
  return cudaSuccess;
}
cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  return ska::emu::submit(s, [=] { std::memmove(dst, src, n); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}
cudaError_t cudaMemcpyPeerAsync(void* dst, int, const void* src, int, size_t n, cudaStream_t s) {
  return ska::emu::submit(s, [=] { std::memmove(dst, src, n); });
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t n, cudaStream_t s) {
  return ska::emu::submit(s, [=] { std::memset(dst, value, n); });
}

// --- Streams ---
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = new CUstream_st();
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s == &ska::emu::g_default_stream) return cudaSuccess;
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  if (s->capture) {
    if (s->capture->origin == s) return fail(cudaErrorStreamCaptureUnsupported);
    std::vector<CUstream_st*>& forked = s->capture->forked;
    forked.erase(std::find(forked.begin(), forked.end(), s));
  }
  delete s;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  if (s->capture) {  // as on a device: not allowed, and the capture is lost
    s->capture->invalidated = true;
    return fail(cudaErrorStreamCaptureUnsupported);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  if (e->capture && !e->capture->ended && !s->capture) {  // joins the event's capture (a fork)
    s->capture = e->capture;
    s->unjoined = false;
    e->capture->forked.push_back(s);
  }
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  if (s->capture) return fail(cudaErrorIllegalState);
  s->capture = std::make_shared<ska::emu::Capture>();
  s->capture->origin = s;
  s->capture->thread = std::this_thread::get_id();
  ska::emu::g_captures.push_back(s->capture);
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  *graph = nullptr;
  if (!s->capture) return fail(cudaErrorIllegalState);
  const std::shared_ptr<ska::emu::Capture> c = s->capture;
  if (c->origin != s) return fail(cudaErrorStreamCaptureUnmatched);
  // The capture ends for every stream in it, the forked ones too.
  bool unjoined = false;
  for (CUstream_st* f : c->forked) {
    unjoined = unjoined || f->unjoined;
    f->capture.reset();
    f->unjoined = false;
  }
  s->capture.reset();
  c->ended = true;
  auto& captures = ska::emu::g_captures;
  captures.erase(std::find(captures.begin(), captures.end(), c));
  if (c->invalidated) return fail(cudaErrorStreamCaptureInvalidated);
  if (unjoined) return fail(cudaErrorStreamCaptureUnjoined);
  *graph = new CUgraph_st{c->work};
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  *status = !s->capture               ? cudaStreamCaptureStatusNone
            : s->capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                      : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }

// --- Graphs ---
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return fail(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  const auto work = exec->work;
  return ska::emu::submit(s, [work] {
    for (const std::function<void()>& w : *work) w();
  });
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

// --- Events ---
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = new CUevent_st();
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  std::lock_guard<std::mutex> lock(ska::emu::g_streams_mu);
  if (s->capture) {
    e->capture = s->capture;
    s->unjoined = false;  // its work so far is before the event
    return cudaSuccess;
  }
  e->capture.reset();
  e->time = std::chrono::steady_clock::now();  // all earlier work has run
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

}  // extern "C"
