// 2-D convolution on CUDA through cuDNN's legacy convolution API, NCHW or channels-last (NHWC, as
// the operands come: the kernel contract's two layouts): RAII descriptors per call, and each
// direction's algorithm chosen once per (shapes, params, dtype, layout) and cached, by the
// heuristics or, under cudnn_benchmark(), by timing the candidates on the first call.
// Channels-last calls describe the filter as NHWC too ([C_out, kH, kW, C_in / groups], cuDNN's
// fast NHWC kernels want both alike): for depthwise convolutions (one input channel per group)
// that is the stored weight's memory as it is; otherwise the weight is copied in that order
// (and the weight gradient computed so and copied back), a small tensor next to activations.
// A channels-last shape cuDNN has no NHWC algorithm for runs on NCHW copies (choose_nhwc_algo).
// The backward-input pass of a stride-1 NCHW convolution may run as the forward convolution of
// the rotated filter (backend/conv2d_rotated.h) where cuDNN's timing finds that faster
// (rotated_form): its backward-data kernels for grouped convolutions with many outputs per
// group (CSKA's logit convolution) took 253 of 466 ms of a CSKAFormer-S18 step on an H200,
// against 34 ms for all the step's forward convolutions together.
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "backend/backend.h"
#include "backend/conv2d_rotated.h"
#include "backend/device_runtime.h"
#include "core/precision.h"
#include "cuda/kernels/conv2d_depthwise.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/runtime.h"

namespace ska::cuda {
namespace {

// Heuristic candidates needing more scratch than this are passed over when a leaner one exists.
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;
constexpr int kMaxAlgos = 16;

enum class ConvDir : int64_t { kForward, kBackwardData, kBackwardFilter };

cudnnDataType_t cudnn_dtype(DType dt, const char* kernel) {
  switch (dt) {
    case DType::kF32:
      return CUDNN_DATA_FLOAT;
    case DType::kBF16:
      return CUDNN_DATA_BFLOAT16;
    case DType::kF16:
      return CUDNN_DATA_HALF;
    default:
      SKA_FAIL(DTypeError, "cuda kernel '", kernel, "' supports f32, bf16 and f16, got ",
               dtype_name(dt));
  }
}

// common.cuh's device_index is CUDA-only; this file is host C++.
int device_of(const Tensor& t) {
  SKA_CHECK(t.device().is_cuda(), DeviceError, "cuda conv2d called with a tensor on ", t.device());
  return t.device().index;
}

int to_int(int64_t v, const char* what) {
  SKA_CHECK(v >= 0 && v <= INT_MAX, ShapeError, "conv2d: ", what, " ", v, " exceeds cuDNN's int");
  return static_cast<int>(v);
}

cudnnTensorFormat_t format_of(bool nhwc) { return nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW; }

// s is always the logical [N, C, H, W] shape; `nhwc` says how it is laid out.
struct TensorDesc {
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(const Shape& s, cudnnDataType_t dt, bool nhwc) {
    SKA_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d));
    SKA_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d, format_of(nhwc), dt, to_int(s[0], "dim"),
                                               to_int(s[1], "dim"), to_int(s[2], "dim"),
                                               to_int(s[3], "dim")));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(d); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

// s is the logical [C_out, C_in / groups, kH, kW] shape.
struct FilterDesc {
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(const Shape& s, cudnnDataType_t dt, bool nhwc) {
    SKA_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d));
    SKA_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d, dt, format_of(nhwc), to_int(s[0], "dim"),
                                               to_int(s[1], "dim"), to_int(s[2], "dim"),
                                               to_int(s[3], "dim")));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(d); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

// Cross-correlation (PyTorch's convolution) with f32 accumulation for every data type; tensor
// cores allowed (for f32 data TF32, PyTorch's default, unless core/precision.h's policy says no:
// then query_algo asks for FMA math).
struct ConvDesc {
  cudnnConvolutionDescriptor_t d = nullptr;
  explicit ConvDesc(const Conv2dParams& p) {
    SKA_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d));
    SKA_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        d, to_int(p.pad_h, "padding"), to_int(p.pad_w, "padding"), to_int(p.stride_h, "stride"),
        to_int(p.stride_w, "stride"), to_int(p.dilation_h, "dilation"),
        to_int(p.dilation_w, "dilation"), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    SKA_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, to_int(p.groups, "groups")));
    SKA_CUDNN_CHECK(cudnnSetConvolutionMathType(d, CUDNN_TENSOR_OP_MATH));
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(d); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

// Everything one convolution call needs; shapes are checked against each other first.
struct Conv {
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  Conv(const Shape& xs, const Shape& ws, const Shape& ys, const Conv2dParams& p, DType dt,
       bool nhwc, const char* kernel)
      : x(xs, cudnn_dtype(dt, kernel), nhwc),
        y(ys, cudnn_dtype(dt, kernel), nhwc),
        w(ws, cudnn_dtype(dt, kernel), nhwc),
        conv(p) {}
};

int64_t out_size(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation) {
  return (in + 2 * pad - dilation * (k - 1) - 1) / stride + 1;
}

void check_shapes(const Shape& xs, const Shape& ws, const Shape& ys, const Conv2dParams& p,
                  const char* kernel) {
  SKA_CHECK(xs.size() == 4 && ws.size() == 4 && ys.size() == 4, ShapeError, kernel,
            ": x, w and y must be 4-D, got ", shape_str(xs), ", ", shape_str(ws), ", ",
            shape_str(ys));
  SKA_CHECK(p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 &&
                p.dilation_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0,
            ValueError, kernel, ": invalid convolution parameters");
  const bool ok = xs[0] == ys[0] && ws[0] == ys[1] && xs[1] == ws[1] * p.groups &&
                  ws[0] % p.groups == 0 &&
                  ys[2] == out_size(xs[2], ws[2], p.stride_h, p.pad_h, p.dilation_h) &&
                  ys[3] == out_size(xs[3], ws[3], p.stride_w, p.pad_w, p.dilation_w);
  SKA_CHECK(ok, ShapeError, kernel, ": inconsistent shapes x ", shape_str(xs), ", w ",
            shape_str(ws), ", y ", shape_str(ys), " for groups ", p.groups);
  for (const Shape* s : {&xs, &ws, &ys}) {
    SKA_CHECK(shape_numel(*s) <= INT_MAX, ShapeError, kernel, ": tensor ", shape_str(*s),
              " has more elements than cuDNN's legacy API supports");
  }
}

struct AlgoChoice {
  int algo;
  cudnnMathType_t math;
  size_t workspace;
  float time_ms = -1.0f;  // cuDNN's timing of the algorithm when it was timed, else -1
};

using AlgoKey = std::array<int64_t, 22>;

// f32 data without TF32 (core/precision.h): only CUDA-core (FMA) algorithms.
bool fma_only(DType dt) { return dt == DType::kF32 && !tf32_policy().conv; }

AlgoKey algo_key(ConvDir dir, int device, DType dt, bool nhwc, const Shape& xs, const Shape& ws,
                 const Conv2dParams& p, bool timed) {
  return {static_cast<int64_t>(dir),
          device,
          static_cast<int64_t>(dt),
          fma_only(dt),
          timed,
          cudnn_deterministic(),
          nhwc,
          xs[0],
          xs[1],
          xs[2],
          xs[3],
          ws[0],
          ws[1],
          ws[2],
          ws[3],
          p.stride_h,
          p.stride_w,
          p.pad_h,
          p.pad_w,
          p.dilation_h,
          p.dilation_w,
          p.groups};
}

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::map<AlgoKey, AlgoChoice>& algo_cache() {
  static std::map<AlgoKey, AlgoChoice> cache;
  return cache;
}

// The first algorithm of cuDNN's ranking (heuristic, or by measured time when timed) that
// succeeded, preferring one within the workspace cap. With `fma` only algorithms without
// tensor-op math qualify; under cudnn_deterministic() only deterministic ones.
template <typename Perf>
AlgoChoice pick_algo(const Perf* perf, int count, bool fma, const char* kernel) {
  const bool deterministic = cudnn_deterministic();
  const Perf* fallback = nullptr;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (fma && perf[i].mathType != CUDNN_FMA_MATH) continue;
    if (deterministic && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    if (perf[i].memory <= kMaxWorkspaceBytes) {
      return {static_cast<int>(perf[i].algo), perf[i].mathType, 0, perf[i].time};
    }
    if (!fallback) fallback = &perf[i];
  }
  SKA_CHECK(fallback != nullptr, CudaError, kernel, ": cuDNN has no ",
            deterministic ? "deterministic algorithm (train.cudnn_deterministic)" : "algorithm",
            " for this convolution");
  return {static_cast<int>(fallback->algo), fallback->mathType, 0, fallback->time};
}

// The operands of the call being planned, for timing algorithms on them: `a` and `b` are read,
// `out` is overwritten (the call that follows writes it again). Forward: x, w -> y; backward
// data: dy, w -> dx; backward filter: x, dy -> dw.
struct ConvData {
  const void* a;
  const void* b;
  void* out;
};

// Scratch for timing the heuristic candidates: the largest workspace among them within the cap,
// or less when the device cannot spare it (down to none: then only algorithms without scratch
// are timed).
template <typename Perf>
Tensor timing_workspace(int device, const Perf* perf, int count, size_t* bytes) {
  *bytes = 0;
  for (int i = 0; i < count; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxWorkspaceBytes) {
      *bytes = std::max(*bytes, perf[i].memory);
    }
  }
  for (; *bytes > 0; *bytes /= 2) {
    try {
      return workspace(device, *bytes);
    } catch (const OutOfMemoryError&) {  // algorithms with less scratch are still timed
    }
  }
  return Tensor();
}

// Ranks the algorithms (heuristics, then with `timed` cuDNN's own timing of each on the call's
// operands) and returns the pick with its workspace size; the conv descriptor gets its math type.
AlgoChoice query_algo(ConvDir dir, cudnnHandle_t h, const Conv& c, bool fma, int device,
                      const ConvData* timed, const char* kernel) {
  AlgoChoice a{};
  int n = 0;
  size_t ws_bytes = 0;
  if (fma) SKA_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, CUDNN_FMA_MATH));
  if (dir == ConvDir::kForward) {
    cudnnConvolutionFwdAlgoPerf_t perf[kMaxAlgos];
    SKA_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, c.x.d, c.w.d, c.conv.d, c.y.d,
                                                           kMaxAlgos, &n, perf));
    if (timed) {
      const Tensor ws = timing_workspace(device, perf, n, &ws_bytes);
      SKA_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(
          h, c.x.d, timed->a, c.w.d, timed->b, c.conv.d, c.y.d, timed->out, kMaxAlgos, &n, perf,
          ws.defined() ? ws.data_ptr() : nullptr, ws_bytes));
    }
    a = pick_algo(perf, n, fma, kernel);
    SKA_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, a.math));
    SKA_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
        h, c.x.d, c.w.d, c.conv.d, c.y.d, static_cast<cudnnConvolutionFwdAlgo_t>(a.algo),
        &a.workspace));
  } else if (dir == ConvDir::kBackwardData) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[kMaxAlgos];
    SKA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w.d, c.y.d, c.conv.d, c.x.d,
                                                                kMaxAlgos, &n, perf));
    if (timed) {
      const Tensor ws = timing_workspace(device, perf, n, &ws_bytes);
      SKA_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(
          h, c.w.d, timed->b, c.y.d, timed->a, c.conv.d, c.x.d, timed->out, kMaxAlgos, &n, perf,
          ws.defined() ? ws.data_ptr() : nullptr, ws_bytes));
    }
    a = pick_algo(perf, n, fma, kernel);
    SKA_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, a.math));
    SKA_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, c.w.d, c.y.d, c.conv.d, c.x.d, static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo),
        &a.workspace));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[kMaxAlgos];
    SKA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x.d, c.y.d, c.conv.d, c.w.d,
                                                                  kMaxAlgos, &n, perf));
    if (timed) {
      const Tensor ws = timing_workspace(device, perf, n, &ws_bytes);
      SKA_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(
          h, c.x.d, timed->a, c.y.d, timed->b, c.conv.d, c.w.d, timed->out, kMaxAlgos, &n, perf,
          ws.defined() ? ws.data_ptr() : nullptr, ws_bytes));
    }
    a = pick_algo(perf, n, fma, kernel);
    SKA_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, a.math));
    SKA_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, c.x.d, c.y.d, c.conv.d, c.w.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
        &a.workspace));
  }
  if (!timed) a.time_ms = -1.0f;  // the heuristics' entries carry no time
  return a;
}

// The cached choice for this key, or a fresh query: timed on `data` under cudnn_benchmark()
// (except during a graph capture, where timing would synchronise), ranked by the heuristics
// otherwise. A capture under cudnn_benchmark() takes the algorithm timed for the problem before
// it (the eager warm-up steps), so that the graph runs what those steps ran (the same bits; the
// heuristics' first choice for some grouped 16-bit convolutions cannot be captured: cuDNN
// 9.19's backward-filter pass of CSKA-Swin's logit convolution on an H200); the heuristics' only
// for a problem never timed. The conv descriptor gets the choice's math type.
AlgoChoice choose_algo(ConvDir dir, int device, DType dt, bool nhwc, const Shape& xs,
                       const Shape& ws, const Conv2dParams& p, cudnnHandle_t h, const Conv& c,
                       const ConvData& data, const char* kernel) {
  const bool capture = capturing(Device::cuda(device));
  const bool timed = cudnn_benchmark() && !capture;
  const AlgoKey key = algo_key(dir, device, dt, nhwc, xs, ws, p, timed);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto it = algo_cache().end();
    if (capture && cudnn_benchmark()) {
      it = algo_cache().find(algo_key(dir, device, dt, nhwc, xs, ws, p, true));
    }
    if (it == algo_cache().end()) it = algo_cache().find(key);
    if (it != algo_cache().end()) {
      SKA_CUDNN_CHECK(cudnnSetConvolutionMathType(c.conv.d, it->second.math));
      return it->second;
    }
  }
  const AlgoChoice a = query_algo(dir, h, c, fma_only(dt), device, timed ? &data : nullptr, kernel);
  std::lock_guard<std::mutex> lock(cache_mutex());
  algo_cache().emplace(key, a);
  return a;
}

std::set<AlgoKey>& nhwc_unsupported() {
  static std::set<AlgoKey> keys;
  return keys;
}

// choose_algo for a call that may run channels-last: nullopt when cuDNN has no NHWC algorithm
// for it (remembered per shape); the call then runs on NCHW copies instead.
std::optional<AlgoChoice> choose_nhwc_algo(ConvDir dir, int device, DType dt, bool nhwc,
                                           const Shape& xs, const Shape& ws, const Conv2dParams& p,
                                           cudnnHandle_t h, const Conv& c, const ConvData& data,
                                           const char* kernel) {
  if (!nhwc) return choose_algo(dir, device, dt, false, xs, ws, p, h, c, data, kernel);
  const AlgoKey key = algo_key(dir, device, dt, true, xs, ws, p, false);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    if (nhwc_unsupported().count(key) != 0) return std::nullopt;
  }
  try {
    return choose_algo(dir, device, dt, true, xs, ws, p, h, c, data, kernel);
  } catch (const CudaError&) {  // no NHWC algorithm, or the format refused for this shape
    std::lock_guard<std::mutex> lock(cache_mutex());
    nhwc_unsupported().insert(key);
    return std::nullopt;
  }
}

// Scratch for the algorithm; the returned tensor keeps it alive (stream-ordered reuse after).
Tensor scratch(int device, size_t bytes, void** ptr) {
  if (bytes == 0) {
    *ptr = nullptr;
    return Tensor();
  }
  Tensor t = workspace(device, bytes);
  *ptr = t.data_ptr();
  return t;
}

// Checks the dtypes and the layouts and returns whether the call runs channels-last: the
// activation-side operands `xy` (x, y or their gradients) all contiguous, or all channels-last;
// the weight-side `w` always contiguous.
bool check_operands(std::initializer_list<const Tensor*> xy, const Tensor& w, DType dt,
                    const char* kernel) {
  bool contiguous = true;
  for (const Tensor* t : xy) contiguous = contiguous && t->is_contiguous();
  for (const Tensor* t : xy) {
    SKA_CHECK(t->dtype() == dt, DTypeError, kernel, ": mixed dtypes (", t->dtype(), " and ", dt,
              ")");
    SKA_CHECK(contiguous || t->is_channels_last(), ValueError, kernel,
              ": x, y and their gradients must be all contiguous or all channels-last, got ",
              t->str(), " with strides ", shape_str(t->strides()));
  }
  SKA_CHECK(w.dtype() == dt, DTypeError, kernel, ": mixed dtypes (", w.dtype(), " and ", dt, ")");
  SKA_CHECK(w.is_contiguous(), ValueError, kernel, ": the weight must be contiguous");
  return !contiguous;
}

// The [C_out, C_in / groups, kH, kW] weight `w` as cuDNN's NHWC filter format lays it out
// ([C_out, kH, kW, C_in / groups] in memory), seen with w's logical shape: `w` itself when it has
// one input channel per group (the same memory), else a new tensor, holding w's values when
// `fill`.
Tensor nhwc_filter(const Tensor& w, bool fill) {
  if (w.size(1) == 1) return w;
  const Shape& s = w.shape();
  const Tensor t =
      Tensor::empty({s[0], s[2], s[3], s[1]}, w.dtype(), w.device()).permute({0, 3, 1, 2});
  if (fill) copy(w, t);
  return t;
}

// y += bias broadcast over [N, C_out, H, W], through the contract's elementwise add (in place is
// safe: each element is read and written by the same thread). A channels-last y is added to as
// the contiguous [N, H, W, C_out] it is.
void add_bias(const Tensor& bias, const Tensor& y, bool nhwc) {
  SKA_CHECK(bias.numel() == y.size(1) && bias.is_contiguous() && bias.dtype() == y.dtype(),
            ShapeError, "conv2d_forward: bias must be contiguous [", y.size(1), "] of y's dtype");
  const Tensor out = nhwc ? y.permute({0, 2, 3, 1}) : y;
  const Shape bias_strides = nhwc ? Shape{0, 0, 0, 1} : Shape{0, 1, 0, 0};
  const Tensor b =
      Tensor::make_view(bias.storage(), out.shape(), bias_strides, bias.offset(), bias.dtype());
  binary(BinaryOp::kAdd, out, b, out);
}

std::atomic<ConvInputGrad> g_input_grad{ConvInputGrad::kTimed};

std::map<AlgoKey, bool>& rotated_cache() {
  static std::map<AlgoKey, bool> cache;
  return cache;
}

// Whether conv2d_backward_input runs (NCHW) as the forward convolution of the rotated filter
// (backend/conv2d_rotated.h), per set_cuda_conv_input_grad: under kTimed, on the first timed call
// of a shape, cuDNN times its best backward-data algorithm and its best forward algorithm on the
// rotated problem, and the forward form is kept when it takes under 0.8 of the time (the
// rotation is two small kernels more); the decision is kept per shape. Without timing (or
// inside a graph capture, before a timed call decided) backward-data runs.
bool rotated_form(int device, const Tensor& grad_y, const Tensor& w, const Conv2dParams& p,
                  const Tensor& grad_x, cudnnHandle_t h, const char* kernel) {
  const ConvInputGrad mode = g_input_grad.load();
  if (mode == ConvInputGrad::kBackwardData || !conv2d_rotatable(w.shape(), p)) return false;
  if (mode == ConvInputGrad::kRotatedForward) return true;
  const DType dt = grad_y.dtype();
  const AlgoKey key =
      algo_key(ConvDir::kBackwardData, device, dt, false, grad_x.shape(), w.shape(), p, true);
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = rotated_cache().find(key);
    if (it != rotated_cache().end()) return it->second;
  }
  if (!cudnn_benchmark() || capturing(Device::cuda(device))) return false;
  const Conv c(grad_x.shape(), w.shape(), grad_y.shape(), p, dt, false, kernel);
  const AlgoChoice data =
      choose_algo(ConvDir::kBackwardData, device, dt, false, grad_x.shape(), w.shape(), p, h, c,
                  {grad_y.data_ptr(), w.data_ptr(), grad_x.data_ptr()}, kernel);
  bool rotated = false;
  try {  // the forward form is an option: where it fails to plan, backward-data serves
    const Tensor filter = conv2d_rotated_filter(w, p.groups);
    const Conv2dParams rp = conv2d_rotated_params(w.shape(), p);
    const Conv rc(grad_y.shape(), filter.shape(), grad_x.shape(), rp, dt, false, kernel);
    const AlgoChoice forward =
        choose_algo(ConvDir::kForward, device, dt, false, grad_y.shape(), filter.shape(), rp, h,
                    rc, {grad_y.data_ptr(), filter.data_ptr(), grad_x.data_ptr()}, kernel);
    rotated =
        data.time_ms > 0.0f && forward.time_ms >= 0.0f && forward.time_ms < 0.8f * data.time_ms;
  } catch (const CudaError&) {
  }
  std::lock_guard<std::mutex> lock(cache_mutex());
  rotated_cache().emplace(key, rotated);
  return rotated;
}

// The cuDNN path of each pass, after conv2d_* has checked the call and handled empty operands.
void cudnn_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                   const Tensor& y, bool nhwc, int device, const char* kKernel) {
  const Tensor filter = nhwc ? nhwc_filter(w, true) : w;
  const Conv c(x.shape(), w.shape(), y.shape(), p, x.dtype(), nhwc, kKernel);
  const cudnnHandle_t h = cudnn_handle(device);
  const std::optional<AlgoChoice> plan =
      choose_nhwc_algo(ConvDir::kForward, device, x.dtype(), nhwc, x.shape(), w.shape(), p, h, c,
                       {x.data_ptr(), filter.data_ptr(), y.data_ptr()}, kKernel);
  if (!plan) {  // channels-last without an NHWC algorithm: on NCHW copies
    const Tensor out = Tensor::empty(y.shape(), y.dtype(), y.device());
    conv2d_forward(x.contiguous(), w, bias, p, out);
    return copy(out, y);
  }
  const AlgoChoice a = *plan;
  void* ws = nullptr;
  const Tensor ws_hold = scratch(device, a.workspace, &ws);
  const float one = 1.0f, zero = 0.0f;  // f32 scaling factors for f32/bf16/f16 data
  SKA_CUDNN_CHECK(cudnnConvolutionForward(h, &one, c.x.d, x.data_ptr(), c.w.d, filter.data_ptr(),
                                          c.conv.d, static_cast<cudnnConvolutionFwdAlgo_t>(a.algo),
                                          ws, a.workspace, &zero, c.y.d, y.data_ptr()));
  if (bias.defined()) add_bias(bias, y, nhwc);
}

void cudnn_backward_input(const Tensor& grad_y, const Tensor& w, const Conv2dParams& p,
                          const Tensor& grad_x, bool nhwc, int device, const char* kKernel) {
  const cudnnHandle_t h = cudnn_handle(device);
  if (!nhwc && rotated_form(device, grad_y, w, p, grad_x, h, kKernel)) {
    return conv2d_forward(grad_y, conv2d_rotated_filter(w, p.groups), Tensor(),
                          conv2d_rotated_params(w.shape(), p), grad_x);
  }
  const Tensor filter = nhwc ? nhwc_filter(w, true) : w;
  const Conv c(grad_x.shape(), w.shape(), grad_y.shape(), p, grad_y.dtype(), nhwc, kKernel);
  const std::optional<AlgoChoice> plan = choose_nhwc_algo(
      ConvDir::kBackwardData, device, grad_y.dtype(), nhwc, grad_x.shape(), w.shape(), p, h, c,
      {grad_y.data_ptr(), filter.data_ptr(), grad_x.data_ptr()}, kKernel);
  if (!plan) {  // channels-last without an NHWC algorithm: on NCHW copies
    const Tensor out = Tensor::empty(grad_x.shape(), grad_x.dtype(), grad_x.device());
    conv2d_backward_input(grad_y.contiguous(), w, p, out);
    return copy(out, grad_x);
  }
  const AlgoChoice a = *plan;
  void* ws = nullptr;
  const Tensor ws_hold = scratch(device, a.workspace, &ws);
  const float one = 1.0f, zero = 0.0f;
  SKA_CUDNN_CHECK(cudnnConvolutionBackwardData(h, &one, c.w.d, filter.data_ptr(), c.y.d,
                                               grad_y.data_ptr(), c.conv.d,
                                               static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo),
                                               ws, a.workspace, &zero, c.x.d, grad_x.data_ptr()));
}

void cudnn_backward_weight(const Tensor& grad_y, const Tensor& x, const Conv2dParams& p,
                           const Tensor& grad_w, bool nhwc, int device, const char* kKernel) {
  const cudnnHandle_t h = cudnn_handle(device);
  // Channels-last: computed in the NHWC filter layout, then copied into grad_w's.
  const Tensor filter_grad = nhwc ? nhwc_filter(grad_w, false) : grad_w;
  const Conv c(x.shape(), grad_w.shape(), grad_y.shape(), p, grad_y.dtype(), nhwc, kKernel);
  const std::optional<AlgoChoice> plan = choose_nhwc_algo(
      ConvDir::kBackwardFilter, device, grad_y.dtype(), nhwc, x.shape(), grad_w.shape(), p, h, c,
      {x.data_ptr(), grad_y.data_ptr(), filter_grad.data_ptr()}, kKernel);
  if (!plan) {  // channels-last without an NHWC algorithm: on NCHW copies
    return conv2d_backward_weight(grad_y.contiguous(), x.contiguous(), p, grad_w);
  }
  const AlgoChoice a = *plan;
  void* ws = nullptr;
  const Tensor ws_hold = scratch(device, a.workspace, &ws);
  const float one = 1.0f, zero = 0.0f;
  SKA_CUDNN_CHECK(
      cudnnConvolutionBackwardFilter(h, &one, c.x.d, x.data_ptr(), c.y.d, grad_y.data_ptr(),
                                     c.conv.d, static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
                                     ws, a.workspace, &zero, c.w.d, filter_grad.data_ptr()));
  if (!filter_grad.same_storage(grad_w)) copy(filter_grad, grad_w);
}

}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                    const Tensor& y) {
  constexpr const char* kKernel = "conv2d_forward";
  const int device = device_of(x);
  DeviceGuard guard(device);
  check_shapes(x.shape(), w.shape(), y.shape(), p, kKernel);
  const bool nhwc = check_operands({&x, &y}, w, x.dtype(), kKernel);
  if (y.numel() == 0) return;
  if (nhwc && x.numel() > 0 &&
      depthwise_direct_chosen(
          0, x, y, w, p, [&] { depthwise_forward(x, w, bias, p, y); },
          [&] { cudnn_forward(x, w, bias, p, y, nhwc, device, kKernel); })) {
    return depthwise_forward(x, w, bias, p, y);
  }
  cudnn_forward(x, w, bias, p, y, nhwc, device, kKernel);
}

void conv2d_backward_input(const Tensor& grad_y, const Tensor& w, const Conv2dParams& p,
                           const Tensor& grad_x) {
  constexpr const char* kKernel = "conv2d_backward_input";
  const int device = device_of(grad_y);
  DeviceGuard guard(device);
  check_shapes(grad_x.shape(), w.shape(), grad_y.shape(), p, kKernel);
  const bool nhwc = check_operands({&grad_y, &grad_x}, w, grad_y.dtype(), kKernel);
  if (grad_x.numel() == 0) return;
  if (grad_y.numel() == 0 || w.numel() == 0) {  // nothing flows back
    SKA_CUDA_CHECK(cudaMemsetAsync(grad_x.data_ptr(), 0, grad_x.numel() * grad_x.element_size(),
                                   current_stream(device)));
    return;
  }
  if (nhwc && depthwise_direct_chosen(
                  1, grad_y, grad_x, w, p, [&] { depthwise_backward_input(grad_y, w, p, grad_x); },
                  [&] { cudnn_backward_input(grad_y, w, p, grad_x, nhwc, device, kKernel); })) {
    return depthwise_backward_input(grad_y, w, p, grad_x);
  }
  cudnn_backward_input(grad_y, w, p, grad_x, nhwc, device, kKernel);
}

void conv2d_backward_weight(const Tensor& grad_y, const Tensor& x, const Conv2dParams& p,
                            const Tensor& grad_w) {
  constexpr const char* kKernel = "conv2d_backward_weight";
  const int device = device_of(grad_y);
  DeviceGuard guard(device);
  check_shapes(x.shape(), grad_w.shape(), grad_y.shape(), p, kKernel);
  const bool nhwc = check_operands({&grad_y, &x}, grad_w, grad_y.dtype(), kKernel);
  if (grad_w.numel() == 0) return;
  if (grad_y.numel() == 0 || x.numel() == 0) {  // empty batch: zero gradient
    SKA_CUDA_CHECK(cudaMemsetAsync(grad_w.data_ptr(), 0, grad_w.numel() * grad_w.element_size(),
                                   current_stream(device)));
    return;
  }
  if (nhwc && depthwise_direct_chosen(
                  2, x, grad_y, grad_w, p, [&] { depthwise_backward_weight(grad_y, x, p, grad_w); },
                  [&] { cudnn_backward_weight(grad_y, x, p, grad_w, nhwc, device, kKernel); })) {
    return depthwise_backward_weight(grad_y, x, p, grad_w);
  }
  cudnn_backward_weight(grad_y, x, p, grad_w, nhwc, device, kKernel);
}

}  // namespace ska::cuda

namespace ska {

ConvInputGrad set_cuda_conv_input_grad(ConvInputGrad mode) {
  return cuda::g_input_grad.exchange(mode);
}

}  // namespace ska
