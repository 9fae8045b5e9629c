// Batch norm of x [N, C, *] on CUDA: per-channel statistics (Welford) and gradient sums reduced in
// two deterministic stages (blocks -> per-(channel, split) partials -> one thread per channel).
// Parameters in x's dtype, or f32 with a bf16/f16 x (the values read as f32 either way, so the
// mixed form computes what the f32 form computes on the widened x, rounded once at the store).
// The launches take raw operands (launch_train_stats, launch_apply, launch_grad_sums,
// launch_grad_x), so that tests/simt runs this file's own code on the host; the tensor entry
// points are left out there.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "backend/backend.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSplits = 64;
constexpr int64_t kMinPerSplit = kThreads * 8;  // elements per split before adding another

// x [N, C, S] flattened: channel ch's i-th element (i in [0, N * S)) lies at
// (i / S) * C * S + ch * S + i % S.
struct Layout {
  int64_t n, c, s;
  __host__ __device__ int64_t per_channel() const { return n * s; }
};

// A grid-stride walk over channel ch's elements i = first, first + step, ... (i in [0, N * S)):
// each element's offset without a 64-bit division an element (the quotient and remainder by S
// carried from step to step). S = 0 walks nothing.
struct ChannelWalk {
  int64_t q, r, dq, dr, s, cs, base;
  __device__ ChannelWalk(const Layout& lay, int64_t ch, int64_t first, int64_t step)
      : q(lay.s > 0 ? first / lay.s : 0),
        r(lay.s > 0 ? first % lay.s : 0),
        dq(lay.s > 0 ? step / lay.s : 0),
        dr(lay.s > 0 ? step % lay.s : 0),
        s(lay.s),
        cs(lay.c * lay.s),
        base(ch * lay.s) {}
  __device__ int64_t offset() const { return q * cs + base + r; }
  __device__ void next() {
    q += dq;
    r += dr;
    if (r >= s) {
      r -= s;
      ++q;
    }
  }
};

// A grid-stride walk over every element i = first, first + step, ... of x: its channel
// (i / S) % C, carried from step to step as ChannelWalk carries its quotient. An empty x walks
// nothing.
struct ElementWalk {
  int64_t r, ch, dr, dch, s, c;
  __device__ ElementWalk(const Layout& lay, int64_t first, int64_t step)
      : r(lay.s > 0 ? first % lay.s : 0),
        ch(lay.s > 0 && lay.c > 0 ? (first / lay.s) % lay.c : 0),
        dr(lay.s > 0 ? step % lay.s : 0),
        dch(lay.s > 0 && lay.c > 0 ? (step / lay.s) % lay.c : 0),
        s(lay.s),
        c(lay.c) {}
  __device__ void next() {
    r += dr;
    ch += dch;
    if (r >= s) {
      r -= s;
      ++ch;
    }
    if (ch >= c) ch -= c;  // ch + dch + 1 < 2C
  }
};

struct Welford {
  float n, mean, m2;
};

// Chan et al.'s merge of two partial (count, mean, M2) triples.
__device__ __forceinline__ Welford welford_merge(Welford a, Welford b) {
  const float n = a.n + b.n;
  if (n == 0.0f) return a;
  const float delta = b.mean - a.mean;
  const float fb = b.n / n;
  return {n, a.mean + delta * fb, a.m2 + b.m2 + delta * delta * a.n * fb};
}

__device__ __forceinline__ Welford welford_block(Welford w) {
  __shared__ Welford partial[32];
  for (int o = 16; o > 0; o >>= 1) {
    const Welford other{__shfl_down_sync(0xffffffffu, w.n, o),
                        __shfl_down_sync(0xffffffffu, w.mean, o),
                        __shfl_down_sync(0xffffffffu, w.m2, o)};
    w = welford_merge(w, other);
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = w;
  __syncthreads();
  if (threadIdx.x == 0) {  // few warps: merge them in order on one thread
    for (int i = 1; i < static_cast<int>(blockDim.x >> 5); ++i) w = welford_merge(w, partial[i]);
  }
  return w;  // valid on thread 0
}

// Stage 1 of the statistics: block (channel, split) -> part[channel * splits + split].
template <typename T>
__global__ void bn_stats_partials(const T* x, Layout lay, Welford* part) {
  const int64_t ch = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  Welford w{0.0f, 0.0f, 0.0f};
  const int64_t first = split * blockDim.x + threadIdx.x, step = splits * blockDim.x;
  ChannelWalk at(lay, ch, first, step);
  for (int64_t i = first; i < lay.per_channel(); i += step, at.next()) {
    const float v = to_float(x[at.offset()]);
    w.n += 1.0f;
    const float d = v - w.mean;
    w.mean += d / w.n;
    w.m2 += d * (v - w.mean);
  }
  w = welford_block(w);
  if (threadIdx.x == 0) part[ch * splits + split] = w;
}

// Stage 2: per channel, merge the splits; save mean / rstd and update the running statistics
// as PyTorch does: r = (1 - momentum) * r + momentum * batch value, unbiased variance.
__global__ void bn_stats_final(const Welford* part, int64_t channels, int splits, float eps,
                               float momentum, float* save_mean, float* save_rstd,
                               float* running_mean, float* running_var) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    Welford w = part[c * splits];
    for (int k = 1; k < splits; ++k) w = welford_merge(w, part[c * splits + k]);
    const float var = w.n > 0.0f ? w.m2 / w.n : 0.0f;
    save_mean[c] = w.mean;
    save_rstd[c] = 1.0f / sqrtf(var + eps);
    if (running_mean) running_mean[c] = (1.0f - momentum) * running_mean[c] + momentum * w.mean;
    if (running_var) {
      const float unbiased = w.n > 1.0f ? w.m2 / (w.n - 1.0f) : var;
      running_var[c] = (1.0f - momentum) * running_var[c] + momentum * unbiased;
    }
  }
}

// Eval: the statistics used are the running ones.
__global__ void bn_eval_stats(const float* running_mean, const float* running_var, int64_t channels,
                              float eps, float* save_mean, float* save_rstd) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    save_mean[c] = running_mean[c];
    save_rstd[c] = 1.0f / sqrtf(running_var[c] + eps);
  }
}

template <typename T, typename P>
__global__ void bn_apply(const T* x, const P* w, const P* b, const float* mean, const float* rstd,
                         Layout lay, T* y) {
  const int64_t total = lay.n * lay.c * lay.s;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  ElementWalk walk(lay, first, step);
  for (int64_t i = first; i < total; i += step, walk.next()) {
    const int64_t c = walk.ch;
    float v = (to_float(x[i]) - mean[c]) * rstd[c];
    if (w) v *= to_float(w[c]);
    if (b) v += to_float(b[c]);
    y[i] = from_float<T>(v);
  }
}

// Stage 1 of the backward sums: sum(grad_y) and sum(grad_y * xhat) per (channel, split).
template <typename T>
__global__ void bn_grad_partials(const T* gy, const T* x, const float* mean, const float* rstd,
                                 Layout lay, float2* part) {
  const int64_t ch = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const float mu = mean[ch], rs = rstd[ch];
  float sg = 0.0f, sgx = 0.0f;
  const int64_t first = split * blockDim.x + threadIdx.x, step = splits * blockDim.x;
  ChannelWalk walk(lay, ch, first, step);
  for (int64_t i = first; i < lay.per_channel(); i += step, walk.next()) {
    const int64_t at = walk.offset();
    const float g = to_float(gy[at]);
    sg += g;
    sgx += g * (to_float(x[at]) - mu) * rs;
  }
  sg = block_sum(sg);
  sgx = block_sum(sgx);
  if (threadIdx.x == 0) part[ch * splits + split] = make_float2(sg, sgx);
}

// Stage 2: per channel, sums over the splits in order -> sums[c], grad_bias, grad_weight.
template <typename P>
__global__ void bn_grad_final(const float2* part, int64_t channels, int splits, float2* sums, P* gw,
                              P* gb) {
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < channels;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sg = 0.0f, sgx = 0.0f;
    for (int k = 0; k < splits; ++k) {
      sg += part[c * splits + k].x;
      sgx += part[c * splits + k].y;
    }
    sums[c] = make_float2(sg, sgx);
    if (gb) gb[c] = from_float<P>(sg);
    if (gw) gw[c] = from_float<P>(sgx);
  }
}

// grad_x. Training (sums given): w * rstd * (g - mean(g) - xhat * mean(g * xhat)), since the
// batch statistics depend on x; eval: g * w * rstd.
template <typename T, typename P>
__global__ void bn_grad_x(const T* gy, const T* x, const P* w, const float* mean, const float* rstd,
                          const float2* sums, Layout lay, T* gx) {
  const int64_t total = lay.n * lay.c * lay.s;
  const float inv_m = 1.0f / static_cast<float>(lay.per_channel());
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  ElementWalk walk(lay, first, step);
  for (int64_t i = first; i < total; i += step, walk.next()) {
    const int64_t c = walk.ch;
    const float scale = rstd[c] * (w ? to_float(w[c]) : 1.0f);
    float g = to_float(gy[i]);
    if (sums) {
      const float xhat = (to_float(x[i]) - mean[c]) * rstd[c];
      g -= (sums[c].x + xhat * sums[c].y) * inv_m;
    }
    gx[i] = from_float<T>(g * scale);
  }
}

// Splits per channel on a GPU of `sms` multiprocessors: enough blocks to fill it, each with at
// least kMinPerSplit elements.
int splits_for(const Layout& lay, int64_t sms) {
  const int64_t want = (4 * sms + lay.c - 1) / lay.c;
  const int64_t most = (lay.per_channel() + kMinPerSplit - 1) / kMinPerSplit;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, kMaxSplits})));
}

unsigned int channel_grid(int64_t channels) {
  SKA_CHECK(channels <= INT_MAX, ShapeError, "batch_norm: too many channels (", channels, ")");
  return static_cast<unsigned int>(channels);
}

// The batch's statistics into save_mean / save_rstd and the running ones (either null: not
// updated), through `splits` partials a channel in `part` (lay.c * splits of them).
template <typename T>
void launch_train_stats(const T* x, const Layout& lay, int splits, Welford* part, float eps,
                        float momentum, float* save_mean, float* save_rstd, float* running_mean,
                        float* running_var, cudaStream_t s) {
  launch_kernel(bn_stats_partials<T>, dim3(channel_grid(lay.c), splits), dim3(kThreads), 0, s, x,
                lay, part);
  launch_kernel(bn_stats_final, dim3(grid_for(lay.c)), dim3(256), 0, s,
                static_cast<const Welford*>(part), lay.c, splits, eps, momentum, save_mean,
                save_rstd, running_mean, running_var);
}

// y = (x - mean) * rstd * w + b (w, b null: none).
template <typename T, typename P>
void launch_apply(const T* x, const P* w, const P* b, const float* mean, const float* rstd,
                  const Layout& lay, T* y, cudaStream_t s) {
  launch_kernel(bn_apply<T, P>, dim3(grid_for(lay.n * lay.c * lay.s)), dim3(256), 0, s, x, w, b,
                mean, rstd, lay, y);
}

// The per-channel sums of grad_y and grad_y * xhat into sums [lay.c] (and grad_bias, grad_weight
// where not null), through `splits` partials a channel in part.
template <typename T, typename P>
void launch_grad_sums(const T* gy, const T* x, const float* mean, const float* rstd,
                      const Layout& lay, int splits, float2* part, float2* sums, P* gw, P* gb,
                      cudaStream_t s) {
  launch_kernel(bn_grad_partials<T>, dim3(channel_grid(lay.c), splits), dim3(kThreads), 0, s, gy, x,
                mean, rstd, lay, part);
  launch_kernel(bn_grad_final<P>, dim3(grid_for(lay.c)), dim3(256), 0, s,
                static_cast<const float2*>(part), lay.c, splits, sums, gw, gb);
}

// grad_x: training with the sums, eval (sums null) without.
template <typename T, typename P>
void launch_grad_x(const T* gy, const T* x, const P* w, const float* mean, const float* rstd,
                   const float2* sums, const Layout& lay, T* gx, cudaStream_t s) {
  launch_kernel(bn_grad_x<T, P>, dim3(grid_for(lay.n * lay.c * lay.s)), dim3(256), 0, s, gy, x, w,
                mean, rstd, sums, lay, gx);
}

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

Layout layout_of(const Tensor& x) {
  SKA_CHECK(x.dim() >= 2, ShapeError, "batch_norm: x must be [N, C, ...], got ",
            shape_str(x.shape()));
  Layout lay{x.shape()[0], x.shape()[1], 1};
  for (int64_t d = 2; d < x.dim(); ++d) lay.s *= x.shape()[d];
  return lay;
}

void check_channel_tensor(const Tensor& t, int64_t c, DType dtype, const char* what) {
  if (!t.defined()) return;
  SKA_CHECK(t.dtype() == dtype, DTypeError, "batch_norm: ", what, " must be ", dtype, ", got ",
            t.dtype());
  SKA_CHECK(t.numel() == c && t.is_contiguous(), ShapeError, "batch_norm: ", what,
            " must be contiguous with ", c, " elements");
}

// The parameters' (and their gradients') dtype: x's, or f32 with a bf16/f16 x (autocast's mixed
// batch norm: 16-bit activations, f32 weights).
DType param_dtype(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const Tensor& p = weight.defined() ? weight : bias;
  const bool low = x.dtype() == DType::kBF16 || x.dtype() == DType::kF16;
  return p.defined() && low && p.dtype() == DType::kF32 ? DType::kF32 : x.dtype();
}

// Runs f(T tag, P tag) for x's dtype T and the parameters' dtype P.
template <typename F>
void dispatch_with_params(DType x_dtype, DType p_dtype, const char* kernel, F&& f) {
  dispatch_floating(x_dtype, kernel, [&](auto tag) {
    using T = decltype(tag);
    if (p_dtype == DType::kF32 && x_dtype != DType::kF32) {
      f(tag, float{});
    } else {
      f(tag, T{});
    }
  });
}

template <typename T>
void train_stats(const Tensor& x, const Layout& lay, const Tensor& running_mean,
                 const Tensor& running_var, double momentum, double eps, const Tensor& save_mean,
                 const Tensor& save_rstd, int device, cudaStream_t s) {
  const int splits = splits_for(lay, sm_count(device));
  const Tensor ws = workspace(device, lay.c * splits * sizeof(Welford));
  launch_train_stats(static_cast<const T*>(x.data_ptr()), lay, splits,
                     static_cast<Welford*>(ws.data_ptr()), static_cast<float>(eps),
                     static_cast<float>(momentum), static_cast<float*>(save_mean.data_ptr()),
                     static_cast<float*>(save_rstd.data_ptr()),
                     mutable_or_null<float>(running_mean), mutable_or_null<float>(running_var), s);
}

}  // namespace

void batch_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                        const Tensor& running_mean, const Tensor& running_var, bool training,
                        double momentum, double eps, const Tensor& y, const Tensor& save_mean,
                        const Tensor& save_rstd) {
  const int device = device_index(x);
  DeviceGuard guard(device);
  const Layout lay = layout_of(x);
  SKA_CHECK(x.is_contiguous() && y.is_contiguous(), ValueError,
            "batch_norm_forward: x and y must be contiguous");
  const DType p_dtype = param_dtype(x, weight, bias);
  check_channel_tensor(weight, lay.c, p_dtype, "weight");
  check_channel_tensor(bias, lay.c, p_dtype, "bias");
  check_channel_tensor(running_mean, lay.c, DType::kF32, "running_mean");
  check_channel_tensor(running_var, lay.c, DType::kF32, "running_var");
  check_channel_tensor(save_mean, lay.c, DType::kF32, "save_mean");
  check_channel_tensor(save_rstd, lay.c, DType::kF32, "save_rstd");
  SKA_CHECK(training || (running_mean.defined() && running_var.defined()), ValueError,
            "batch_norm_forward: eval mode needs running_mean and running_var");
  if (lay.c == 0) return;
  dispatch_with_params(x.dtype(), p_dtype, "batch_norm_forward", [&](auto tag, auto param_tag) {
    using T = decltype(tag);
    using P = decltype(param_tag);
    const cudaStream_t s = current_stream(device);
    if (training) {
      SKA_CHECK(lay.per_channel() > 0, ValueError, "batch_norm_forward: empty batch in training");
      train_stats<T>(x, lay, running_mean, running_var, momentum, eps, save_mean, save_rstd, device,
                     s);
    } else {
      launch_kernel(bn_eval_stats, dim3(grid_for(lay.c)), dim3(256), 0, s,
                    static_cast<const float*>(running_mean.data_ptr()),
                    static_cast<const float*>(running_var.data_ptr()), lay.c,
                    static_cast<float>(eps), static_cast<float*>(save_mean.data_ptr()),
                    static_cast<float*>(save_rstd.data_ptr()));
    }
    if (x.numel() == 0) return;
    launch_apply(static_cast<const T*>(x.data_ptr()), data_or_null<P>(weight),
                 data_or_null<P>(bias), static_cast<const float*>(save_mean.data_ptr()),
                 static_cast<const float*>(save_rstd.data_ptr()), lay,
                 static_cast<T*>(y.data_ptr()), s);
  });
}

void batch_norm_backward(const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                         const Tensor& save_mean, const Tensor& save_rstd, bool training,
                         const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias) {
  const int device = device_index(x);
  DeviceGuard guard(device);
  const Layout lay = layout_of(x);
  SKA_CHECK(x.is_contiguous() && grad_y.is_contiguous(), ValueError,
            "batch_norm_backward: x and grad_y must be contiguous");
  const DType p_dtype = param_dtype(x, weight.defined() ? weight : grad_weight, grad_bias);
  check_channel_tensor(weight, lay.c, p_dtype, "weight");
  check_channel_tensor(grad_weight, lay.c, p_dtype, "grad_weight");
  check_channel_tensor(grad_bias, lay.c, p_dtype, "grad_bias");
  SKA_CHECK(grad_y.dtype() == x.dtype() && (!grad_x.defined() || grad_x.dtype() == x.dtype()),
            DTypeError, "batch_norm_backward: grad_y and grad_x must be x's dtype ", x.dtype());
  check_channel_tensor(save_mean, lay.c, DType::kF32, "save_mean");
  check_channel_tensor(save_rstd, lay.c, DType::kF32, "save_rstd");
  if (lay.c == 0) return;
  const bool param_grads = grad_weight.defined() || grad_bias.defined();
  dispatch_with_params(x.dtype(), p_dtype, "batch_norm_backward", [&](auto tag, auto param_tag) {
    using T = decltype(tag);
    using P = decltype(param_tag);
    const cudaStream_t s = current_stream(device);
    const float* mean = static_cast<const float*>(save_mean.data_ptr());
    const float* rstd = static_cast<const float*>(save_rstd.data_ptr());
    // The per-channel sums feed grad_weight / grad_bias and, in training, grad_x.
    Tensor sums_ws;
    float2* sums = nullptr;
    if (param_grads || training) {
      const int splits = splits_for(lay, sm_count(device));
      sums_ws = workspace(device, lay.c * (splits + 1) * sizeof(float2));
      sums = static_cast<float2*>(sums_ws.data_ptr());
      launch_grad_sums(static_cast<const T*>(grad_y.data_ptr()),
                       static_cast<const T*>(x.data_ptr()), mean, rstd, lay, splits, sums + lay.c,
                       sums, mutable_or_null<P>(grad_weight), mutable_or_null<P>(grad_bias), s);
    }
    if (!grad_x.defined() || x.numel() == 0) return;
    SKA_CHECK(grad_x.is_contiguous(), ValueError, "batch_norm_backward: grad_x not contiguous");
    launch_grad_x(static_cast<const T*>(grad_y.data_ptr()), static_cast<const T*>(x.data_ptr()),
                  data_or_null<P>(weight), mean, rstd, training ? sums : nullptr, lay,
                  static_cast<T*>(grad_x.data_ptr()), s);
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
