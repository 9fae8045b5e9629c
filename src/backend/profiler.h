// The kernel profiler behind `benchmark --profile`: while it runs, every kernel call made through
// SKA_KERNEL is timed (host clock on the CPU, CUDA events on the kernel's stream) and marked with
// an NVTX range of the kernel's name, so that Nsight Systems / Nsight Compute can be pointed at
// one op. Off, a kernel call costs one relaxed atomic load more.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/kernel_types.h"
#include "core/allocator.h"
#include "core/device.h"
#include "core/tensor.h"

namespace ska::profiler {

namespace detail {
inline std::atomic<bool> active{false};
}  // namespace detail

inline bool active() { return detail::active.load(std::memory_order_relaxed); }

// Starts timing (clearing what an earlier run recorded).
void start();

// One kernel's totals over the profiled span (or those of its calls on one set of operands).
struct KernelTime {
  std::string name;
  std::string family;    // family_of(name)
  std::string operands;  // the tensor arguments' shapes and dtypes, in `calls_by_operands`
  int64_t calls = 0;
  double ms = 0.0;
  double bytes = 0.0;  // Traffic::bytes of the calls, summed
  double flops = 0.0;  // Traffic::flops of the calls, summed
};

// What a kernel call moves and computes, from its tensor arguments alone. bytes: every tensor
// argument's distinct elements (a dim of stride 0 counted once; the tensors of a TensorList
// too) times their size, as if each operand were read or written once: a lower bound on the
// call's memory traffic, so bytes / time is the bandwidth the call reached at least. flops: 2 x
// the multiply-adds of the call where it is a product (gemm, the convolutions, the fused
// attention and CSKA's logits; for a backward pass the products of its gradients), else 0.
struct Traffic {
  double bytes = 0.0;
  double flops = 0.0;
};
// `tensors`: the call's tensor arguments in order (a GemmArgs as a, b, c, bias, a_row_sums;
// undefined ones included, a TensorList's elements appended).
Traffic traffic_of(const std::string& kernel, const std::vector<const Tensor*>& tensors);
// Stops timing, waits for the device's outstanding events and returns one entry per kernel,
// the longest first. A kernel called from inside another's call is counted in the outer one.
// With `calls_by_operands`, also one entry per kernel and operand signature (operands_of), the
// longest first: which copy, which convolution.
std::vector<KernelTime> stop(std::vector<KernelTime>* calls_by_operands = nullptr);

// The tensor arguments of a kernel call as "[512, 8, 65, 64] bf16, [64] f32 ...", a view that is
// not contiguous marked "(strided)", an undefined tensor "-" (a GEMM's as a, b, c and any bias);
// other arguments are left out.
template <typename... Args>
std::string operands_of(const Args&... args);

// The op family of a kernel: matmul, convolution, normalisation, softmax, attention,
// elementwise, copy, reduction, indexing, loss, optimizer, random, data (else "other").
std::string family_of(const std::string& kernel);

// The dense (no sparsity) bf16 tensor-core peak, with f32 accumulation, of a GPU named as the
// driver names it ("NVIDIA H100 80GB HBM3" -> 989.4), in TFLOP/s, from NVIDIA's data sheets; 0
// for a name not in the table. What `benchmark` reports model FLOP utilisation (MFU) against.
double bf16_dense_peak_tflops(const std::string& device_name);

namespace detail {
inline void gather(std::vector<const Tensor*>& out, const Tensor& t) { out.push_back(&t); }
inline void gather(std::vector<const Tensor*>& out, const TensorList& list) {
  for (const Tensor& t : list) out.push_back(&t);
}
inline void gather(std::vector<const Tensor*>& out, const GemmArgs& g) {
  for (const Tensor* t : {&g.a, &g.b, &g.c, &g.bias, &g.a_row_sums}) out.push_back(t);
}
template <typename T>
void gather(std::vector<const Tensor*>&, const T&) {}

inline void describe(std::string& out, const Tensor& t) {
  if (!out.empty()) out += ", ";
  if (!t.defined()) {
    out += "-";
    return;
  }
  out += shape_str(t.shape());
  out += " ";
  out += dtype_name(t.dtype());
  if (!t.is_contiguous()) out += " (strided)";
}
inline void describe(std::string& out, const GemmArgs& g) {  // c = alpha a b + beta c + bias
  describe(out, g.a);
  describe(out, g.b);
  describe(out, g.c);
  if (g.bias.defined()) describe(out, g.bias);
}
template <typename T>
void describe(std::string&, const T&) {}
}  // namespace detail

template <typename... Args>
std::string operands_of(const Args&... args) {
  std::string out;
  (detail::describe(out, args), ...);
  return out;
}

// traffic_of on a call's arguments.
template <typename... Args>
Traffic traffic_of_call(const char* kernel, const Args&... args) {
  std::vector<const Tensor*> tensors;
  (detail::gather(tensors, args), ...);
  return traffic_of(kernel, tensors);
}

// Times one kernel call (see SKA_KERNEL); only constructed while the profiler is active.
class KernelScope {
 public:
  KernelScope(const char* name, Device device, std::string operands = {}, Traffic traffic = {});
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  const char* name_;
  Device device_;
  std::string operands_;
  Traffic traffic_;
  bool outer_;  // false inside another kernel's scope
  std::chrono::steady_clock::time_point start_;
  void* start_event_ = nullptr;
};

// A kernel entry point that times itself while the profiler is active.
template <typename Fn>
struct TimedKernel {
  const char* name;
  Device device;
  Fn fn;

  template <typename... Args>
  decltype(auto) operator()(Args&&... args) const {
    const HostKernelScratch scratch(device.is_cpu());
    if (!active()) return fn(std::forward<Args>(args)...);
    const KernelScope scope(name, device, operands_of(args...), traffic_of_call(name, args...));
    return fn(std::forward<Args>(args)...);
  }
};

template <typename Fn>
TimedKernel<Fn> timed(const char* name, Device device, Fn fn) {
  return TimedKernel<Fn>{name, device, fn};
}

}  // namespace ska::profiler
