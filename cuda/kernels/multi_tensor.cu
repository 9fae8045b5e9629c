// CUDA kernels: the multi-tensor updates (gradient statistics and scaling, Adam, LAMB, SGD, the
// weight average) and casts. A list of tensors is cut into chunks of kChunk elements, one block per
// chunk, and a table of up to kMaxTensors tensors travels as the kernel's argument, so a model's
// ~150 parameters take a handful of launches instead of several each. Twins of
// backend/cpu/multi_tensor.cpp; f32 math for f32, bf16 and f16 tensors.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/multi_cast_checks.h"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/optim_math.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 16384;  // elements per block
constexpr int kMaxTensors = 32;    // per launch: the table stays well under the 4 KB of arguments

// Up to kMaxTensors tensors of `Depth` lists (param, grad, moments ...), each with an optional
// pointer of its own (`aux`: Adam's update count), and where each one's blocks start.
template <int Depth>
struct Table {
  void* ptr[Depth][kMaxTensors];
  const void* aux[kMaxTensors];
  int64_t numel[kMaxTensors];
  int block_start[kMaxTensors + 1];
  int count;
};

// The tensor a block works on, and the [begin, end) of its chunk.
template <int Depth>
__device__ __forceinline__ int block_tensor(const Table<Depth>& t, int64_t* begin, int64_t* end) {
  int i = 0;
  while (i + 1 < t.count && static_cast<int>(blockIdx.x) >= t.block_start[i + 1]) ++i;
  *begin = static_cast<int64_t>(static_cast<int>(blockIdx.x) - t.block_start[i]) * kChunk;
  *end = min(*begin + kChunk, t.numel[i]);
  return i;
}

// The tensors a launch goes over, as the kernels take them: each tensor's Depth pointers (the
// i-th tensors of the lists: param, grad, moments ...), its optional pointer of its own (aux) and
// its element count.
template <int Depth>
struct Entry {
  void* ptr[Depth];
  const void* aux;
  int64_t numel;
};
template <int Depth>
using Entries = std::vector<Entry<Depth>>;

// Calls launch(table, blocks, first_block) for consecutive groups of the entries (empty tensors
// are left out); first_block numbers the blocks across launches.
template <int Depth, typename Launch>
void for_each_table(const Entries<Depth>& entries, Launch&& launch) {
  Table<Depth> t{};
  int blocks = 0;
  int64_t first_block = 0;
  const auto flush = [&] {
    if (t.count == 0) return;
    t.block_start[t.count] = blocks;
    launch(t, blocks, first_block);
    first_block += blocks;
    t = Table<Depth>{};
    blocks = 0;
  };
  for (const Entry<Depth>& e : entries) {
    const int64_t n = e.numel;
    if (n == 0) continue;
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    SKA_CHECK(chunks < (int64_t{1} << 30), ShapeError, "multi-tensor kernel: tensor of ", n,
              " elements is too large");
    if (t.count == kMaxTensors || blocks + chunks >= (int64_t{1} << 30)) flush();
    for (int d = 0; d < Depth; ++d) t.ptr[d][t.count] = e.ptr[d];
    t.aux[t.count] = e.aux;
    t.numel[t.count] = n;
    t.block_start[t.count] = blocks;
    blocks += static_cast<int>(chunks);
    ++t.count;
  }
  flush();
}

template <int Depth>
int64_t total_chunks(const Entries<Depth>& entries) {
  int64_t total = 0;
  for (const Entry<Depth>& e : entries) total += (e.numel + kChunk - 1) / kChunk;
  return total;
}

// --- gradient statistics ---

template <typename T>
__global__ void grad_stats_kernel(Table<1> t, float scale, bool rescale, float* partials,
                                  int64_t first_block) {
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  T* x = static_cast<T*>(t.ptr[0][i]);
  float squares = 0.0f, poison = 0.0f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    float v = to_float(x[j]);
    if (rescale) {
      const T scaled = from_float<T>(v * scale);
      x[j] = scaled;
      v = to_float(scaled);
    }
    squares += v * v;
    poison += v * 0.0f;
  }
  squares = block_sum(squares);
  poison = block_sum(poison);
  if (threadIdx.x == 0) {
    partials[2 * (first_block + blockIdx.x)] = squares;
    partials[2 * (first_block + blockIdx.x) + 1] = poison;
  }
}

// One block: the partial sums in a fixed order (thread k takes every kThreads-th pair, then the
// block's tree), so the result has the same bits on every run.
__global__ void finish_stats_kernel(const float* __restrict__ partials, int64_t n,
                                    float* __restrict__ out) {
  float squares = 0.0f, poison = 0.0f;
  for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
    squares += partials[2 * k];
    poison += partials[2 * k + 1];
  }
  squares = block_sum(squares);
  poison = block_sum(poison);
  if (threadIdx.x == 0) {
    out[0] = squares;
    out[1] = poison;
  }
}

template <typename T>
__global__ void scale_kernel(Table<1> t, const float* __restrict__ factor) {
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  T* x = static_cast<T*>(t.ptr[0][i]);
  const float f = *factor;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    x[j] = from_float<T>(to_float(x[j]) * f);
  }
}

// --- optimizer updates ---

// As adam_step_kernel of optim.cu (no divisor, no update output); aux holds each tensor's count.
template <typename T>
__global__ void multi_adam_kernel(Table<4> t, const uint8_t* __restrict__ skip, AdamScalars s) {
  if (skip != nullptr && *skip != 0) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  T* p = static_cast<T*>(t.ptr[0][i]);
  const T* g = static_cast<const T*>(t.ptr[1][i]);
  T* m = static_cast<T*>(t.ptr[2][i]);
  T* v = static_cast<T*>(t.ptr[3][i]);
  const AdamCorrections c = adam_corrections(s, *static_cast<const int64_t*>(t.aux[i]));
  const float lr = static_cast<float>(*s.lr);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float pj = to_float(p[j]);
    p[j] = from_float<T>(pj - lr * adam_direction(pj, g, m, v, j, 1.0f, s, c));
  }
}

// LAMB, first pass: Adam's update of every element into ptr[4] (aux: each tensor's count) and,
// with `adapt`, each block's sums of p^2 (before the update) and u^2 into partials.
template <typename T>
__global__ void lamb_update_kernel(Table<5> t, const uint8_t* __restrict__ skip,
                                   const float* __restrict__ divisor, AdamScalars s, bool adapt,
                                   float* __restrict__ partials, int64_t first_block) {
  if (skip != nullptr && *skip != 0) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const T* p = static_cast<const T*>(t.ptr[0][i]);
  const T* g = static_cast<const T*>(t.ptr[1][i]);
  T* m = static_cast<T*>(t.ptr[2][i]);
  T* v = static_cast<T*>(t.ptr[3][i]);
  T* u = static_cast<T*>(t.ptr[4][i]);
  const AdamCorrections c = adam_corrections(s, *static_cast<const int64_t*>(t.aux[i]));
  const float scale = divisor != nullptr ? 1.0f / *divisor : 1.0f;
  float w_squares = 0.0f, u_squares = 0.0f;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float pj = to_float(p[j]);
    const T uj = from_float<T>(adam_direction(pj, g, m, v, j, scale, s, c));
    u[j] = uj;
    w_squares += pj * pj;
    u_squares += to_float(uj) * to_float(uj);
  }
  if (!adapt) return;
  w_squares = block_sum(w_squares);
  u_squares = block_sum(u_squares);
  if (threadIdx.x == 0) {
    partials[2 * (first_block + blockIdx.x)] = w_squares;
    partials[2 * (first_block + blockIdx.x) + 1] = u_squares;
  }
}

// LAMB, second pass over the same blocks: each block adds up its tensor's partial sums (in a
// fixed order, so every block of a tensor gets the same trust ratio) and applies
// p -= lr * (trust * u).
template <typename T>
__global__ void lamb_apply_kernel(Table<2> t, const uint8_t* __restrict__ skip,
                                  const double* __restrict__ lr_ptr, bool adapt, bool trust_clip,
                                  const float* __restrict__ partials, int64_t first_block) {
  if (skip != nullptr && *skip != 0) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  T* p = static_cast<T*>(t.ptr[0][i]);
  const T* u = static_cast<const T*>(t.ptr[1][i]);
  float trust = 1.0f;
  if (adapt) {
    const int64_t from = first_block + t.block_start[i], to = first_block + t.block_start[i + 1];
    float w_squares = 0.0f, u_squares = 0.0f;
    for (int64_t k = from + threadIdx.x; k < to; k += blockDim.x) {
      w_squares += partials[2 * k];
      u_squares += partials[2 * k + 1];
    }
    const float w_norm = sqrtf(block_sum(w_squares));
    const float u_norm = sqrtf(block_sum(u_squares));
    if (w_norm > 0.0f && u_norm > 0.0f) trust = w_norm / u_norm;
    if (trust_clip) trust = fminf(trust, 1.0f);
  }
  const float lr = static_cast<float>(*lr_ptr);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    p[j] = from_float<T>(to_float(p[j]) - lr * (trust * to_float(u[j])));
  }
}

template <typename T>
__global__ void multi_sgd_kernel(Table<3> t, bool has_momentum, const uint8_t* __restrict__ skip,
                                 const double* __restrict__ lr_ptr, float momentum,
                                 float weight_decay, bool nesterov) {
  if (skip != nullptr && *skip != 0) return;
  const float lr = static_cast<float>(*lr_ptr);
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  T* p = static_cast<T*>(t.ptr[0][i]);
  const T* g = static_cast<const T*>(t.ptr[1][i]);
  T* buf = has_momentum ? static_cast<T*>(t.ptr[2][i]) : nullptr;
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    sgd_element(p, g, buf, j, lr, momentum, weight_decay, nesterov);
  }
}

template <typename T>
__global__ void multi_ema_kernel(Table<2> t, const uint8_t* __restrict__ skip, float keep,
                                 float take) {
  if (skip != nullptr && *skip != 0) return;
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  T* e = static_cast<T*>(t.ptr[0][i]);
  const T* v = static_cast<const T*>(t.ptr[1][i]);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    // Rounded as the CPU twin rounds (no fused multiply-add).
    const float a = to_float(from_float<T>(__fmul_rn(to_float(e[j]), keep)));
    const float b = to_float(from_float<T>(__fmul_rn(to_float(v[j]), take)));
    e[j] = from_float<T>(__fadd_rn(a, b));
  }
}

// --- casts ---

// dst = src in D, as copy converts (through f32, rounded to nearest even).
template <typename S, typename D>
__global__ void multi_cast_kernel(Table<2> t) {
  int64_t begin, end;
  const int i = block_tensor(t, &begin, &end);
  const S* s = static_cast<const S*>(t.ptr[0][i]);
  D* d = static_cast<D*>(t.ptr[1][i]);
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
    d[j] = from_float<D>(to_float(s[j]));
}

// --- launches on raw operands (tests/simt runs these on host memory) ---

// multi_grad_stats: the entries scaled where `rescale`, their sums into out (2 floats) through
// `partials` (2 * total_chunks floats).
template <typename T>
void launch_grad_stats(const Entries<1>& e, float scale, bool rescale, float* partials, float* out,
                       cudaStream_t stream) {
  for_each_table<1>(e, [&](const Table<1>& t, int blocks, int64_t first) {
    launch_kernel(grad_stats_kernel<T>, blocks, kThreads, 0, stream, t, scale, rescale, partials,
                  first);
  });
  launch_kernel(finish_stats_kernel, 1, kThreads, 0, stream, static_cast<const float*>(partials),
                total_chunks(e), out);
}

template <typename T>
void launch_scale(const Entries<1>& e, const float* factor, cudaStream_t stream) {
  for_each_table<1>(e, [&](const Table<1>& t, int blocks, int64_t) {
    launch_kernel(scale_kernel<T>, blocks, kThreads, 0, stream, t, factor);
  });
}

// Entries of (param, grad, exp_avg, exp_avg_sq), aux the update count.
template <typename T>
void launch_adam(const Entries<4>& e, const uint8_t* skip, const AdamScalars& s,
                 cudaStream_t stream) {
  for_each_table<4>(e, [&](const Table<4>& t, int blocks, int64_t) {
    launch_kernel(multi_adam_kernel<T>, blocks, kThreads, 0, stream, t, skip, s);
  });
}

// Entries of (param, grad, exp_avg, exp_avg_sq, update), aux the update count; `partials`:
// 2 * total_chunks floats where `adapt`. Both passes cut the lists alike (by the parameters'
// sizes): the same blocks, numbered alike.
template <typename T>
void launch_lamb(const Entries<5>& e, const uint8_t* skip, const float* divisor, const double* lr,
                 const AdamScalars& s, bool adapt, bool trust_clip, float* partials,
                 cudaStream_t stream) {
  for_each_table<5>(e, [&](const Table<5>& t, int blocks, int64_t first) {
    launch_kernel(lamb_update_kernel<T>, blocks, kThreads, 0, stream, t, skip, divisor, s, adapt,
                  partials, first);
  });
  Entries<2> apply(e.size());
  for (size_t i = 0; i < e.size(); ++i)
    apply[i] = {{e[i].ptr[0], e[i].ptr[4]}, nullptr, e[i].numel};
  for_each_table<2>(apply, [&](const Table<2>& t, int blocks, int64_t first) {
    launch_kernel(lamb_apply_kernel<T>, blocks, kThreads, 0, stream, t, skip, lr, adapt, trust_clip,
                  static_cast<const float*>(partials), first);
  });
}

// Entries of (param, grad, momentum buffer; without momentum the grad again, never read).
template <typename T>
void launch_sgd(const Entries<3>& e, bool has_momentum, const uint8_t* skip, const double* lr,
                float momentum, float weight_decay, bool nesterov, cudaStream_t stream) {
  for_each_table<3>(e, [&](const Table<3>& t, int blocks, int64_t) {
    launch_kernel(multi_sgd_kernel<T>, blocks, kThreads, 0, stream, t, has_momentum, skip, lr,
                  momentum, weight_decay, nesterov);
  });
}

// Entries of (ema, value).
template <typename T>
void launch_ema(const Entries<2>& e, const uint8_t* skip, float keep, float take,
                cudaStream_t stream) {
  for_each_table<2>(e, [&](const Table<2>& t, int blocks, int64_t) {
    launch_kernel(multi_ema_kernel<T>, blocks, kThreads, 0, stream, t, skip, keep, take);
  });
}

// Entries of (src, dst).
template <typename S, typename D>
void launch_cast(const Entries<2>& e, cudaStream_t stream) {
  for_each_table<2>(e, [&](const Table<2>& t, int blocks, int64_t) {
    launch_kernel(multi_cast_kernel<S, D>, blocks, kThreads, 0, stream, t);
  });
}

}  // namespace

// The tensor-level entry points (tests/simt runs the launches above on raw host operands).
#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// Every list holds contiguous tensors of the first list's first dtype on its device; `others`
// have the first list's length and sizes.
void check_lists(const char* who, const TensorList& first,
                 std::initializer_list<const TensorList*> others) {
  for (const Tensor& t : first) {
    SKA_CHECK(t.is_contiguous() && t.dtype() == first.front().dtype() &&
                  t.device() == first.front().device(),
              DTypeError, "cuda ", who,
              ": tensors must be contiguous, of one dtype and device; got ", t.str(), " after ",
              first.front().str());
  }
  for (const TensorList* list : others) {
    SKA_CHECK(list->size() == first.size(), ShapeError, "cuda ", who, ": lists of ", first.size(),
              " and ", list->size(), " tensors");
    for (size_t i = 0; i < first.size(); ++i) {
      const Tensor& t = (*list)[i];
      SKA_CHECK(t.is_contiguous() && t.dtype() == first[i].dtype() &&
                    t.device() == first[i].device() && t.numel() == first[i].numel(),
                ShapeError, "cuda ", who, ": tensor ", i, " is ", t.str(),
                ", expected the size, dtype and device of ", first[i].str());
    }
  }
}

// One update count per parameter: an i64 element on the parameter's device.
void check_step_counts(const char* who, const TensorList& params, const TensorList& steps) {
  SKA_CHECK(steps.size() == params.size(), ShapeError, "cuda ", who, ": ", steps.size(),
            " step counts for ", params.size(), " parameters");
  for (size_t i = 0; i < steps.size(); ++i) {
    SKA_CHECK(steps[i].numel() == 1 && steps[i].dtype() == DType::kI64 &&
                  steps[i].device() == params[i].device(),
              DTypeError, "cuda ", who, ": step count ", i, " must be one i64 element on ",
              params[i].device(), ", got ", steps[i].str());
  }
}

// The lists' i-th tensors as entries, aux[i]'s data where aux is given.
template <int Depth>
Entries<Depth> entries_of(const std::vector<const TensorList*>& lists,
                          const TensorList* aux = nullptr) {
  const TensorList& lead = *lists.front();
  Entries<Depth> e(lead.size());
  for (size_t i = 0; i < lead.size(); ++i) {
    for (int d = 0; d < Depth; ++d) e[i].ptr[d] = (*lists[d])[i].data_ptr();
    e[i].aux = aux != nullptr ? (*aux)[i].data_ptr() : nullptr;
    e[i].numel = lead[i].numel();
  }
  return e;
}

}  // namespace

void multi_grad_stats(const TensorList& tensors, double scale, const Tensor& out) {
  SKA_CHECK(out.dtype() == DType::kF32 && out.numel() == 2 && out.is_contiguous(), DTypeError,
            "cuda multi_grad_stats: out must be 2 contiguous f32 values, got ", out.str());
  DeviceGuard guard(device_index(out));
  const cudaStream_t stream = current_stream(device_index(out));
  const Entries<1> entries = tensors.empty() ? Entries<1>() : entries_of<1>({&tensors});
  const int64_t chunks = total_chunks(entries);
  if (chunks == 0) {
    Tensor(out).fill_(0.0);
    return;
  }
  check_lists("multi_grad_stats", tensors, {});
  SKA_CHECK(tensors.front().device() == out.device(), DeviceError,
            "cuda multi_grad_stats: tensors on ", tensors.front().device(), ", out on ",
            out.device());
  const Tensor partials = Tensor::empty({2 * chunks}, DType::kF32, out.device());
  float* partial_data = static_cast<float*>(partials.data_ptr());
  dispatch_floating(tensors.front().dtype(), "multi_grad_stats", [&](auto tag) {
    launch_grad_stats<decltype(tag)>(entries, static_cast<float>(scale), scale != 1.0, partial_data,
                                     static_cast<float*>(out.data_ptr()), stream);
  });
}

void multi_scale(const TensorList& tensors, const Tensor& factor) {
  if (tensors.empty()) return;
  check_lists("multi_scale", tensors, {});
  SKA_CHECK(factor.numel() == 1 && factor.dtype() == DType::kF32 &&
                factor.device() == tensors.front().device(),
            DTypeError, "cuda multi_scale: factor must be one f32 element on ",
            tensors.front().device(), ", got ", factor.str());
  DeviceGuard guard(device_index(factor));
  const cudaStream_t stream = current_stream(device_index(factor));
  const float* f = static_cast<const float*>(factor.data_ptr());
  dispatch_floating(tensors.front().dtype(), "multi_scale", [&](auto tag) {
    launch_scale<decltype(tag)>(entries_of<1>({&tensors}), f, stream);
  });
}

void multi_adam_step(const TensorList& params, const TensorList& grads, const TensorList& exp_avgs,
                     const TensorList& exp_avg_sqs, const TensorList& steps, const Tensor& skip,
                     const Tensor& lr, double beta1, double beta2, double eps, double l2_decay,
                     double decoupled_decay) {
  if (params.empty()) return;
  check_lists("multi_adam_step", params, {&grads, &exp_avgs, &exp_avg_sqs});
  check_step_counts("multi_adam_step", params, steps);
  DeviceGuard guard(device_index(params.front()));
  const cudaStream_t stream = current_stream(device_index(params.front()));
  const uint8_t* flag = skip_pointer(skip, params.front(), "multi_adam_step");
  const AdamScalars s = adam_scalars(lr_pointer(lr, params.front(), "multi_adam_step"), beta1,
                                     beta2, eps, l2_decay, decoupled_decay);
  dispatch_floating(params.front().dtype(), "multi_adam_step", [&](auto tag) {
    launch_adam<decltype(tag)>(entries_of<4>({&params, &grads, &exp_avgs, &exp_avg_sqs}, &steps),
                               flag, s, stream);
  });
}

void multi_lamb_step(const TensorList& params, const TensorList& grads,
                     const TensorList& exp_avgs, const TensorList& exp_avg_sqs,
                     const TensorList& steps, const Tensor& skip, const Tensor& grad_divisor,
                     const Tensor& lr, double beta1, double beta2, double eps,
                     double weight_decay, bool adapt, bool trust_clip) {
  if (params.empty()) return;
  check_lists("multi_lamb_step", params, {&grads, &exp_avgs, &exp_avg_sqs});
  check_step_counts("multi_lamb_step", params, steps);
  const Device device = params.front().device();
  const float* divisor = nullptr;
  if (grad_divisor.defined()) {
    SKA_CHECK(grad_divisor.numel() == 1 && grad_divisor.dtype() == DType::kF32 &&
                  grad_divisor.device() == device,
              DTypeError, "cuda multi_lamb_step: grad_divisor must be one f32 element on ", device,
              ", got ", grad_divisor.str());
    divisor = static_cast<const float*>(grad_divisor.data_ptr());
  }
  DeviceGuard guard(device_index(params.front()));
  const cudaStream_t stream = current_stream(device_index(params.front()));
  const uint8_t* flag = skip_pointer(skip, params.front(), "multi_lamb_step");
  const double* lr_ptr = lr_pointer(lr, params.front(), "multi_lamb_step");
  const AdamScalars s = adam_scalars(nullptr, beta1, beta2, eps, 0.0, weight_decay);
  // The updates in one buffer, a slice per parameter; the partial sums, two per block.
  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  const Tensor flat = Tensor::empty({total}, params.front().dtype(), device);
  TensorList updates;
  int64_t offset = 0;
  for (const Tensor& p : params) {
    updates.push_back(flat.narrow(0, offset, p.numel()));
    offset += p.numel();
  }
  const Entries<5> entries =
      entries_of<5>({&params, &grads, &exp_avgs, &exp_avg_sqs, &updates}, &steps);
  const int64_t chunks = total_chunks(entries);
  const Tensor partials =
      adapt && chunks > 0 ? Tensor::empty({2 * chunks}, DType::kF32, device) : Tensor();
  float* partial_data = partials.defined() ? static_cast<float*>(partials.data_ptr()) : nullptr;
  dispatch_floating(params.front().dtype(), "multi_lamb_step", [&](auto tag) {
    launch_lamb<decltype(tag)>(entries, flag, divisor, lr_ptr, s, adapt, trust_clip, partial_data,
                               stream);
  });
}

void multi_sgd_step(const TensorList& params, const TensorList& grads,
                    const TensorList& momentum_bufs, const Tensor& skip, const Tensor& lr,
                    double momentum, double weight_decay, bool nesterov) {
  if (params.empty()) return;
  const bool has_momentum = !momentum_bufs.empty();
  if (has_momentum) {
    check_lists("multi_sgd_step", params, {&grads, &momentum_bufs});
  } else {
    check_lists("multi_sgd_step", params, {&grads});
  }
  DeviceGuard guard(device_index(params.front()));
  const cudaStream_t stream = current_stream(device_index(params.front()));
  const uint8_t* flag = skip_pointer(skip, params.front(), "multi_sgd_step");
  const double* lr_ptr = lr_pointer(lr, params.front(), "multi_sgd_step");
  // Without momentum the third list is the grads again (never read).
  const TensorList& third = has_momentum ? momentum_bufs : grads;
  dispatch_floating(params.front().dtype(), "multi_sgd_step", [&](auto tag) {
    launch_sgd<decltype(tag)>(entries_of<3>({&params, &grads, &third}), has_momentum, flag, lr_ptr,
                              static_cast<float>(momentum), static_cast<float>(weight_decay),
                              nesterov, stream);
  });
}

void multi_ema_update(const TensorList& ema, const TensorList& values, double decay,
                      const Tensor& skip) {
  if (ema.empty()) return;
  check_lists("multi_ema_update", ema, {&values});
  DeviceGuard guard(device_index(ema.front()));
  const cudaStream_t stream = current_stream(device_index(ema.front()));
  const uint8_t* flag = skip_pointer(skip, ema.front(), "multi_ema_update");
  dispatch_floating(ema.front().dtype(), "multi_ema_update", [&](auto tag) {
    launch_ema<decltype(tag)>(entries_of<2>({&ema, &values}), flag, static_cast<float>(decay),
                              static_cast<float>(1.0 - decay), stream);
  });
}

void multi_cast(const TensorList& src, const TensorList& dst) {
  check_multi_cast("cuda multi_cast", src, dst);
  if (src.empty()) return;
  DeviceGuard guard(device_index(src.front()));
  const cudaStream_t stream = current_stream(device_index(src.front()));
  dispatch_floating(src.front().dtype(), "multi_cast", [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_floating(dst.front().dtype(), "multi_cast", [&](auto d_tag) {
      launch_cast<S, decltype(d_tag)>(entries_of<2>({&src, &dst}), stream);
    });
  });
}

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
