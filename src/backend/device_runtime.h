// Host-side runtime services that only a device backend provides: copies between the host and a
// device, and synchronisation. Built from cuda/runtime/ with CUDA; without it they throw.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ska {

// dst = src for contiguous tensors of one dtype on different devices (host<->device or
// device<->device). Asynchronous on the current stream when the host side is pinned.
void copy_between_devices(const Tensor& src, const Tensor& dst);
// Waits for all work queued on `device` (no-op for the CPU).
void synchronize(Device device);
// Whether the work queued on the current stream of CUDA `device` is being captured into a CUDA
// Graph (where nothing may synchronise); false for the CPU and without CUDA.
bool capturing(Device device);

// For the kernel profiler (profiler.h). An event recorded on the current stream of the CUDA
// `device`; the milliseconds between two of them, waiting for the later one (both are released).
// Without CUDA these throw DeviceError.
void* record_device_event(Device device);
double device_event_ms(void* start, void* stop);
// The name the driver gives CUDA device `index` ("NVIDIA H100 80GB HBM3"); DeviceError without
// CUDA.
std::string cuda_device_name(int index);
// The compute capability of CUDA device `index` as major * 10 + minor (90 for an H100), for
// choosing kernels; DeviceError without CUDA.
int cuda_compute_capability(int index);
// An NVTX range around a span of host code, as Nsight shows it; no-ops without CUDA.
void push_profile_range(const char* name);
void pop_profile_range();
// cudaProfilerStart / cudaProfilerStop: the span of work that `ncu --profile-from-start off` and
// `nsys profile --capture-range=cudaProfilerApi` record (scripts/gpu_kernels.sh). DeviceError
// without CUDA.
void start_device_profiler_capture();
void stop_device_profiler_capture();

// The elementwise CUDA kernels (copy, fill, unary, binary, where) take fast paths: dims merged,
// offsets in 32 bits by magic-number division, 16-byte loads and stores where every operand is
// dense and aligned. Switched off, they index every dim of every view in 64 bits, the reference
// the fast paths are tested against bit for bit. Returns the previous setting; for tests and
// benchmarks. Without CUDA it only records the setting.
bool set_cuda_elementwise_fast_paths(bool enabled);

// The fused attention kernels run bf16 and f16 problems with head dims that are multiples of 16
// (up to 128) on the tensor cores (WMMA, f32 accumulation, P and dS rounded to the input dtype)
// on devices of compute capability 8.0 and newer. Switched off, every problem takes the scalar
// f32 kernels, the reference the tensor-core path is tested against. Default on; returns the
// previous setting; for tests and benchmarks. Without CUDA it only records the setting.
bool set_cuda_attention_tensor_cores(bool enabled);
// Which tensor-core kernels those problems take: on (the default), the mma.sync kernels that keep
// the softmax in registers between the two products (cuda/kernels/attention_mma.cu); off, the
// WMMA kernels (train.attention: wmma). Returns the previous setting; for tests, benchmarks and
// KernelChoices. Without CUDA it only records the setting.
bool set_cuda_attention_mma(bool enabled);
// With the mma.sync kernels, the backward pass of a problem of at most 80 queries and 80 keys
// with head dims up to 64 (ViT-S and CaiT-S on 32x32 images, Swin's 7x7 windows) in one block
// per leading index that loads every operand once and computes dK, dV and dQ, instead of a dK/dV
// kernel and a dQ kernel whose blocks each walk the other side tile by tile. On by default
// (CSKA-ViT-S's bf16 training step 1.12x faster on an H200; train.attention_backward: split
// turns it off). Returns the previous setting.
bool set_cuda_attention_one_block_backward(bool enabled);
// With the mma.sync kernels, the backward pass of those problems in one block per leading index
// that computes each weight once (train.attention_backward: one_pass): P and dS from the query
// side, shared through shared memory for dK and dV (five products instead of the one-block
// kernel's seven). Takes precedence over the one-block backward; off by default (not yet timed
// on a GPU). Returns the previous setting.
bool set_cuda_attention_one_pass_backward(bool enabled);
// The one-block backward at head dim 64 held to 136 registers a thread, so that three of its
// blocks fit on an SM instead of two (train.attention_registers: capped; the same bits, no
// spills by ptxas; off by default: not yet timed on a GPU). Returns the previous setting.
bool set_cuda_attention_register_cap(bool enabled);
// The one-block backward and forward as persistent kernels (train.attention_schedule:
// persistent): as many blocks as fit on the GPU at once, each walking leading indices in turn
// and staging the next one's operands into a second set of shared tiles while it computes the
// current one, so that the loads' latency hides behind the products. The same bits as the
// one-block kernels; takes precedence over the register cap; off by default (not yet timed on a
// GPU). Returns the previous setting.
bool set_cuda_attention_persistent(bool enabled);
// With the mma.sync kernels, the forward pass of a problem whose longer side has 65 to 80 rows
// (ViT-S's 65 tokens) in one block per leading index with every key in one 80-wide tile, instead
// of two blocks per index each walking two 64-wide key tiles (the second holding one key). The
// same kernel otherwise. On by default (train.attention_forward: tiled turns it off). Returns
// the previous setting.
bool set_cuda_attention_one_block_forward(bool enabled);

// How the tensor-core attention kernels fill their shared tiles: on (the default), asynchronous
// 16-byte copies (cp.async on sm_80 and newer), all of a thread's in flight before it waits, and
// the mma.sync kernels' fragments by ldmatrix; off, a load into registers and a store per 16
// bytes, each waiting for global memory, and the fragments by 16- and 32-bit shared loads. The
// same data either way, so the same bits. Returns the previous setting; `benchmark
// --attention-loads sync` compares. Without CUDA it only records the setting.
bool set_cuda_attention_async_loads(bool enabled);

// Layer norm's backward pass on CUDA for rows of at most 768 columns (every zoo model's): on, one
// kernel that reads grad_y and x once, keeps each row in registers and sums the parameter
// gradients per block on the way (grad_x the same bits as the two-kernel path; the default); off,
// a grad_x kernel and a two-stage column reduction that read them again. Returns the previous
// setting; `benchmark --norm-backward fused`. Without CUDA it only records the setting.
bool set_cuda_layer_norm_fused_backward(bool enabled);

// Layer norm's forward pass on CUDA (layer_norm and add_layer_norm) for rows of at most 1024
// columns: on, kernels that load each lane's columns of the row into registers in one burst and
// read the row once; off (the default until measured on a GPU), kernels that walk the row three
// times, each load waiting for the last. The same operations in the same order, so the same bits.
// Returns the previous setting; `benchmark --norm-forward held`. Without CUDA it only records the
// setting.
bool set_cuda_layer_norm_held_forward(bool enabled);

// CSKA's direct conv logits' filter gradient (train.conv_logits_grad_w: per_row) with a block per
// filter row (three taps) instead of one per tap, for 3x3 filters at head dims up to 64: the
// gradient's rows staged and each A fragment loaded once for three products. The same partial
// sums, bit for bit; off by default (not yet timed on a GPU). Returns the previous setting.
bool set_cuda_conv_logits_grad_w_rows(bool enabled);

// How the CUDA backend computes the backward-input pass of a stride-1 convolution
// (backend/conv2d_rotated.h). kTimed, the default: under cudnn_benchmark, the first call of each
// shape has cuDNN time its backward-data kernels against its forward kernels on the rotated
// filter and keeps the faster form (by a fifth at least); without timing, backward-data.
// kBackwardData and kRotatedForward force one form, for tests and benchmarks. Returns the
// previous setting. Without CUDA it only records the setting.
enum class ConvInputGrad { kTimed, kBackwardData, kRotatedForward };
ConvInputGrad set_cuda_conv_input_grad(ConvInputGrad mode);

// How the CUDA backend runs a channels-last depthwise convolution with stride 1 and a 3x3, 5x5 or
// 7x7 filter (MetaFormer's separable convolutions, CvT's projections;
// cuda/kernels/conv2d_depthwise.h lists what qualifies), each pass on its own: kCudnn,
// kDirect (this project's kernels), or kTimed (the default): under cudnn_benchmark, the first
// call of each shape and pass times both and keeps the faster, cuDNN otherwise (CAFormer-S18's
// bf16 training step 1.7x faster than on cuDNN alone on an H200). Returns the previous setting;
// `train.depthwise_conv`, `benchmark --depthwise-conv`. Without CUDA it only records the setting.
enum class DepthwiseConv { kCudnn, kDirect, kTimed };
DepthwiseConv set_cuda_depthwise_conv(DepthwiseConv mode);
// What kTimed chose so far in this process, a line per shape and pass with both timings
// ("depthwise conv forward [N, C, H, W] k7 bf16: direct 0.120 ms, cudnn 1.900 ms: direct");
// `benchmark` prints them. Empty without CUDA.
std::vector<std::string> cuda_depthwise_conv_choices();

// How the CUDA backend picks cuBLASLt's algorithm for each GEMM problem (shape, layouts,
// dtypes, epilogue): kHeuristic (cuBLASLt's first answer, as PyTorch takes it; the default until
// measured) or kTimed (under cudnn_benchmark and outside a graph capture, the first call of each
// problem times up to 8 of the heuristic's answers, 3 runs each on scratch outputs, and keeps
// the fastest; a capture takes the algorithm timed before it). Algorithms may sum in other
// orders: the same problem gives the same bits within a process, not across choices. Returns
// the previous setting; `train.gemm_algorithm`, `benchmark --gemm-algorithm`. Without CUDA it
// only records the setting.
enum class GemmAlgorithm { kHeuristic, kTimed };
GemmAlgorithm set_cuda_gemm_algorithm(GemmAlgorithm mode);
// What kTimed chose so far in this process, a line per problem with the chosen and the
// heuristic's timings ("gemm bf16 [33280, 512] x [512, 1536] bias: algorithm 3 of 8, 0.101 ms;
// the heuristic's 0.118 ms"); `benchmark` prints them. Empty without CUDA.
std::vector<std::string> cuda_gemm_choices();

// A CUDA Graph: the device work that `fn` queues on the current stream of CUDA `device`,
// captured once (fn runs once, its kernels are recorded, not executed) and then launched as one
// unit by replay(). Allocations made during the capture come from a private pool of the caching
// allocator that no other work is given until the graph is destroyed, so the tensors fn creates
// (the outputs it hands out included) keep their memory, and every replay rewrites them in place
// from the current contents of the tensors it read. fn must be graph-safe: the same shapes, no
// host round trip (a synchronisation, a copy from pageable host memory, reading a value), random
// numbers drawn on the device (a replay repeats the captured seeds and offsets). A capture that
// fails throws the error that stopped it; DeviceError without CUDA. Not copyable.
class DeviceGraph {
 public:
  DeviceGraph(Device device, const std::function<void()>& fn);
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;
  // Queues the captured work on the stream it was captured on.
  void replay();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace ska
