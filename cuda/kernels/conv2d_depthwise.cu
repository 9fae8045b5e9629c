// CUDA kernels: channels-last depthwise convolution (stride 1, K = 3, 5, 7) computed directly,
// forward, input gradient (the forward kernel on the flipped filter) and weight gradient (partials
// per slice of strips, added in a fixed order). The arithmetic is conv2d_depthwise.cuh's; cuDNN
// serves every other convolution (conv2d.cpp decides).
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "backend/device_runtime.h"
#include "core/precision.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/conv2d_depthwise.cuh"
#include "cuda/kernels/conv2d_depthwise.h"

namespace ska::cuda {
namespace {

namespace dw = depthwise;

// Vec elements as one 16-byte access, converted to and from f32.
struct DeviceIo {
  template <typename T>
  static __device__ __forceinline__ float to_f32(T v) {
    return to_float(v);
  }
  template <int Vec, typename T>
  static __device__ __forceinline__ void load(const T* p, float* out) {
    static_assert(Vec * sizeof(T) == 16, "one 16-byte access");
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int k = 0; k < Vec; ++k) out[k] = to_float(e[k]);
  }
  template <int Vec, typename T>
  static __device__ __forceinline__ void store(T* p, const float* in) {
    static_assert(Vec * sizeof(T) == 16, "one 16-byte access");
    alignas(16) T e[Vec];
#pragma unroll
    for (int k = 0; k < Vec; ++k) e[k] = from_float<T>(in[k]);
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(e);
  }
};

template <int K, int Vec, typename T>
__global__ void __launch_bounds__(dw::kThreads)
    depthwise_forward_kernel(const T* x, const T* w, const T* bias, T* y, dw::Geometry g,
                             dw::Layout l, bool flip) {
  __shared__ float taps[K * K * dw::kTileChannels];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const int count = K * K * l.channel_threads * Vec;
  for (int e = tid; e < count; e += blockDim.x * blockDim.y)
    taps[e] = dw::staged_tap<K, T, DeviceIo>(w, g, l, blockIdx.y, flip, e);
  __syncthreads();
  dw::forward_thread<K, Vec, T, DeviceIo>(x, taps, bias, g, l, gridDim.x, blockIdx.x, blockIdx.y,
                                          threadIdx.x, threadIdx.y, y);
}

template <int K, int Vec, typename T>
__global__ void __launch_bounds__(dw::kThreads)
    depthwise_weight_grad_kernel(const T* x, const T* dy, float* partial, dw::Geometry g,
                                 dw::Layout l, int slices) {
  __shared__ float red[dw::kThreads * Vec];
  float acc[K][Vec];
  dw::weight_grad_thread<K, Vec, T, DeviceIo>(x, dy, g, l, slices, blockIdx.x, blockIdx.y,
                                              blockIdx.z, threadIdx.x, threadIdx.y, acc);
  const int width = l.channel_threads * Vec;
#pragma unroll
  for (int j = 0; j < K; ++j) {
#pragma unroll
    for (int v = 0; v < Vec; ++v) red[threadIdx.y * width + threadIdx.x * Vec + v] = acc[j][v];
    __syncthreads();
    if (threadIdx.y == 0) {
      dw::weight_grad_block_sum<K, Vec>(red, g, l, blockIdx.x, blockIdx.y, blockIdx.z, j,
                                        threadIdx.x, partial);
    }
    __syncthreads();
  }
}

template <typename T>
__global__ void depthwise_weight_grad_total_kernel(const float* partial, int64_t elements,
                                                   int slices, T* grad_w) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < elements;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    grad_w[e] = from_float<T>(dw::weight_grad_total(partial, elements, slices, e));
}

// Calls f(T{}, std::integral_constant<int, K>{}) for the call's element type and filter size.
template <typename F>
void dispatch_depthwise(DType dt, int64_t k, const char* kernel, F&& f) {
  dispatch_floating(dt, kernel, [&](auto tag) {
    switch (k) {
      case 3:
        f(tag, std::integral_constant<int, 3>{});
        return;
      case 5:
        f(tag, std::integral_constant<int, 5>{});
        return;
      case 7:
        f(tag, std::integral_constant<int, 7>{});
        return;
      default:
        SKA_FAIL(ValueError, kernel, ": filters of 3, 5 or 7 taps a side, got ", k);
    }
  });
}

// The geometry of a call with input `in` ([N, C, H, W], channels-last) and output `out`.
dw::Geometry geometry(const Tensor& in, const Tensor& out, int64_t pad_h, int64_t pad_w) {
  dw::Geometry g;
  g.n = static_cast<int>(in.size(0));
  g.c = static_cast<int>(in.size(1));
  g.h = static_cast<int>(in.size(2));
  g.w = static_cast<int>(in.size(3));
  g.ho = static_cast<int>(out.size(2));
  g.wo = static_cast<int>(out.size(3));
  g.pad_h = static_cast<int>(pad_h);
  g.pad_w = static_cast<int>(pad_w);
  return g;
}

int vec_of(DType dt) { return dt == DType::kF32 ? 4 : 8; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Forward (flip false) or input gradient (flip true, pads K - 1 - pad): out = in (*) taps.
void launch_correlation(const Tensor& in, const Tensor& w, const Tensor& bias, int64_t pad_h,
                        int64_t pad_w, bool flip, const Tensor& out, const char* kernel) {
  if (out.numel() == 0) return;
  const int device = device_index(in);
  DeviceGuard guard(device);
  const dw::Geometry g = geometry(in, out, pad_h, pad_w);
  const int vec = vec_of(in.dtype());
  const dw::Layout l = dw::make_layout(g, vec, dw::kForwardStrip);
  const int64_t blocks = dw::forward_blocks(l);
  SKA_CHECK(l.channel_tiles <= 65535, ShapeError, kernel, ": too many channels (", g.c, ")");
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(l.channel_tiles));
  const dim3 block(static_cast<unsigned>(l.channel_threads),
                   static_cast<unsigned>(l.strip_threads));
  const cudaStream_t stream = current_stream(device);
  dispatch_depthwise(in.dtype(), w.size(2), kernel, [&](auto tag, auto k) {
    using T = decltype(tag);
    constexpr int kK = decltype(k)::value;
    constexpr int kVec = 16 / sizeof(T);
    launch_kernel(depthwise_forward_kernel<kK, kVec, T>, dim3(grid), dim3(block), 0, stream,
                  static_cast<const T*>(in.data_ptr()), static_cast<const T*>(w.data_ptr()),
                  bias.defined() ? static_cast<const T*>(bias.data_ptr()) : nullptr,
                  static_cast<T*>(out.data_ptr()), g, l, flip);
  });
}

std::atomic<DepthwiseConv> g_mode{DepthwiseConv::kTimed};

// (pass, device, dtype, N, C, H, W, K, pad_h, pad_w) -> direct kernels faster.
using ChoiceKey = std::array<int64_t, 10>;
std::mutex g_choice_mutex;
std::map<ChoiceKey, bool>& choices() {
  static std::map<ChoiceKey, bool> m;
  return m;
}
std::vector<std::string>& choice_lines() {
  static std::vector<std::string> lines;
  return lines;
}

}  // namespace

bool depthwise_direct_chosen(int pass, const Tensor& a, const Tensor& b, const Tensor& w,
                             const Conv2dParams& p, const std::function<void()>& direct,
                             const std::function<void()>& cudnn) {
  const DepthwiseConv mode = g_mode.load();
  if (mode == DepthwiseConv::kCudnn || !depthwise_direct_supported(a, b, w, p)) return false;
  if (mode == DepthwiseConv::kDirect) return true;
  const int device = device_index(a);
  // The input side of the call: x for the forward and weight passes, grad_x for the input pass.
  const Tensor& in = pass == 0 || pass == 2 ? a : b;
  const ChoiceKey key{pass,       device,     static_cast<int64_t>(a.dtype()),
                      in.size(0), in.size(1), in.size(2),
                      in.size(3), w.size(2),  p.pad_h,
                      p.pad_w};
  {
    std::lock_guard<std::mutex> lock(g_choice_mutex);
    const auto it = choices().find(key);
    if (it != choices().end()) return it->second;
  }
  if (!cudnn_benchmark() || capturing(Device::cuda(device))) return false;
  DeviceGuard guard(device);
  direct();
  cudnn();
  const float direct_ms = time_ms(device, direct, 3);
  const float cudnn_ms = time_ms(device, cudnn, 3);
  const bool faster = direct_ms < cudnn_ms;
  static const char* const kPass[] = {"forward", "input gradient", "weight gradient"};
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(3);
  line << "depthwise conv " << kPass[pass] << " " << shape_str(in.shape()) << " k" << w.size(2)
       << " " << dtype_name(a.dtype()) << ": direct " << direct_ms << " ms, cudnn " << cudnn_ms
       << " ms: " << (faster ? "direct" : "cudnn");
  std::lock_guard<std::mutex> lock(g_choice_mutex);
  if (choices().emplace(key, faster).second) choice_lines().push_back(line.str());
  return faster;
}

bool depthwise_direct_supported(const Tensor& a, const Tensor& b, const Tensor& w,
                                const Conv2dParams& p) {
  const DType dt = a.dtype();
  if (dt != DType::kF32 && dt != DType::kBF16 && dt != DType::kF16) return false;
  if (b.dtype() != dt || w.dtype() != dt || a.dim() != 4 || b.dim() != 4 || w.dim() != 4)
    return false;
  const int64_t c = a.size(1), k = w.size(2);
  if (w.size(0) != c || w.size(1) != 1 || w.size(3) != k || p.groups != c || b.size(1) != c)
    return false;
  if (k != 3 && k != 5 && k != 7) return false;
  if (p.stride_h != 1 || p.stride_w != 1 || p.dilation_h != 1 || p.dilation_w != 1) return false;
  if (p.pad_h < 0 || p.pad_w < 0 || p.pad_h >= k || p.pad_w >= k) return false;
  if (c % vec_of(dt) != 0) return false;
  if (!a.is_channels_last() || !b.is_channels_last() || !w.is_contiguous()) return false;
  if (!aligned16(a.data_ptr()) || !aligned16(b.data_ptr())) return false;
  return a.numel() <= INT_MAX && b.numel() <= INT_MAX;
}

void depthwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                       const Tensor& y) {
  SKA_CHECK(!bias.defined() ||
                (bias.dtype() == x.dtype() && bias.is_contiguous() && bias.numel() == x.size(1)),
            DTypeError, "conv2d_forward (depthwise): bias must be a contiguous [", x.size(1),
            "] of x's dtype ", dtype_name(x.dtype()));
  launch_correlation(x, w, bias, p.pad_h, p.pad_w, false, y, "conv2d_forward (depthwise)");
}

void depthwise_backward_input(const Tensor& grad_y, const Tensor& w, const Conv2dParams& p,
                              const Tensor& grad_x) {
  const int64_t k = w.size(2);
  launch_correlation(grad_y, w, Tensor(), k - 1 - p.pad_h, k - 1 - p.pad_w, true, grad_x,
                     "conv2d_backward_input (depthwise)");
}

void depthwise_backward_weight(const Tensor& grad_y, const Tensor& x, const Conv2dParams& p,
                               const Tensor& grad_w) {
  constexpr const char* kKernel = "conv2d_backward_weight (depthwise)";
  const int device = device_index(x);
  DeviceGuard guard(device);
  const cudaStream_t stream = current_stream(device);
  const int64_t elements = grad_w.numel();
  if (elements == 0) return;
  const dw::Geometry g = geometry(x, grad_y, p.pad_h, p.pad_w);
  const int vec = vec_of(x.dtype());
  const int64_t k = grad_w.size(2);
  const dw::Layout l = dw::make_layout(g, vec, dw::kWeightStrip);
  const int slices = dw::weight_grad_slices(l, static_cast<int>(k));
  SKA_CHECK(l.channel_tiles <= 65535, ShapeError, kKernel, ": too many channels (", g.c, ")");
  const Tensor partial = Tensor::empty({slices, elements}, DType::kF32, x.device());
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(l.channel_tiles),
                  static_cast<unsigned>(k));
  const dim3 block(static_cast<unsigned>(l.channel_threads),
                   static_cast<unsigned>(l.strip_threads));
  dispatch_depthwise(x.dtype(), k, kKernel, [&](auto tag, auto kt) {
    using T = decltype(tag);
    constexpr int kK = decltype(kt)::value;
    constexpr int kVec = 16 / sizeof(T);
    launch_kernel(depthwise_weight_grad_kernel<kK, kVec, T>, dim3(grid), dim3(block), 0, stream,
                  static_cast<const T*>(x.data_ptr()), static_cast<const T*>(grad_y.data_ptr()),
                  partial.data<float>(), g, l, slices);
    launch_kernel(depthwise_weight_grad_total_kernel<T>, dim3(grid_for(elements)), dim3(256), 0,
                  stream, partial.data<float>(), elements, slices,
                  static_cast<T*>(grad_w.data_ptr()));
  });
}

}  // namespace ska::cuda

namespace ska {

DepthwiseConv set_cuda_depthwise_conv(DepthwiseConv mode) { return cuda::g_mode.exchange(mode); }

std::vector<std::string> cuda_depthwise_conv_choices() {
  std::lock_guard<std::mutex> lock(cuda::g_choice_mutex);
  return cuda::choice_lines();
}

}  // namespace ska
