// CUDA kernels: copy, fill, unary (+ backward), binary, where. Twins of backend/cpu/pointwise.cpp;
// the scalar math is pointwise_math.h evaluated in f32 for f32, bf16 and f16. Dims are merged
// first (backend/elementwise.h): dense operands take 16-byte accesses, strided ones 32-bit
// offsets by magic-number division. launch_elementwise takes a body of raw operands, so that
// tests/simt runs this file's own code on the host; the tensor entry points are left out there.
#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "backend/elementwise.h"
#include "backend/pointwise_math.h"
#include "cuda/kernels/common.cuh"

namespace ska::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T> struct IsFloat16 : std::false_type {};
template <> struct IsFloat16<__half> : std::true_type {};
template <> struct IsFloat16<__nv_bfloat16> : std::true_type {};

// The CPU's convert<To>(from): the 16-bit floats go through float, everything else is a cast.
template <typename D, typename S>
__device__ __forceinline__ D convert(S v) {
  if constexpr (IsFloat16<D>::value) {
    if constexpr (IsFloat16<S>::value) {
      return from_float<D>(to_float(v));
    } else {
      return from_float<D>(static_cast<float>(v));
    }
  } else if constexpr (IsFloat16<S>::value) {
    return static_cast<D>(to_float(v));
  } else {
    return static_cast<D>(v);
  }
}

// Calls f(T{}) with T the CUDA element type of any dtype (copies, fills, where).
template <typename F>
void dispatch_all(DType dt, F&& f) {
  switch (dt) {
    case DType::kF32: f(float{}); return;
    case DType::kF64: f(double{}); return;
    case DType::kBF16: f(__nv_bfloat16{}); return;
    case DType::kF16: f(__half{}); return;
    case DType::kI32: f(int32_t{}); return;
    case DType::kI64: f(int64_t{}); return;
    case DType::kU8: f(uint8_t{}); return;
  }
}

template <BinaryOp OP>
constexpr bool kIsComparison = OP >= BinaryOp::kEq;

__device__ __forceinline__ int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

std::atomic<bool> g_fast_paths{true};

// ---- The launch machinery -------------------------------------------------------------------
// An elementwise kernel is a body over N operands (operand order as in its layout) with
//   kVec:                  elements per 16-byte access of its widest operand;
//   aligned():             whether every operand's pointer allows accesses of kVec elements;
//   at(off):               one element at per-operand element offsets (32- or 64-bit);
//   vec<V>(i):             V elements from linear index i of operands that are all dense.
// launch_elementwise() picks, from the coalesced layout: dense and aligned -> kVec elements per
// access; dense -> one element per access; offsets below 2^31 -> 32-bit magic-number offsets;
// otherwise (or with the fast paths off) 64-bit offsets over every dim of the views.

// kVec consecutive T, as one aligned access.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p, int64_t i) {
  return *reinterpret_cast<const Pack<T, V>*>(p + i);
}
template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, int64_t i, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p + i) = v;
}

constexpr int vec_for(size_t widest_bytes) { return static_cast<int>(16 / widest_bytes); }
inline bool aligned_to(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <int V, typename Body>
__global__ void dense_kernel(Body body, int64_t n) {
  const int64_t packs = n / V;
  for (int64_t p = first_index(); p < packs; p += grid_stride()) body.template vec<V>(p * V);
  const int64_t tail = packs * V + first_index();  // fewer than V elements
  if (tail < n) body.template vec<1>(tail);
}

template <size_t N, typename Calc, typename Index, typename Body>
__global__ void strided_kernel(Calc calc, Body body, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    Index off[N];
    calc.offsets(static_cast<Index>(i), off);
    body.at(off);
  }
}

template <size_t N, typename Body>
void launch_elementwise(const Shape& shape, const std::array<Shape, N>& strides, const Body& body,
                        cudaStream_t stream) {
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  if (!g_fast_paths.load(std::memory_order_relaxed)) {
    ElementwiseLayout<N> views{shape, strides};  // every dim as it is
    if (views.shape.empty()) {                    // a 0-dim tensor
      views.shape = {1};
      for (auto& st : views.strides) st = {1};
    }
    launch_kernel(strided_kernel<N, OffsetCalc64<N>, int64_t, Body>, dim3(grid_for(n, kThreads)),
                  dim3(kThreads), 0, stream, offset_calc64<N>(views), body, n);
    return;
  }
  const ElementwiseLayout<N> l = coalesce_layout<N>(shape, strides);
  if (layout_is_dense(l)) {
    constexpr int kVec = Body::kVec;
    if (kVec > 1 && body.aligned()) {
      launch_kernel(dense_kernel<kVec, Body>, dim3(grid_for((n + kVec - 1) / kVec, kThreads)),
                    dim3(kThreads), 0, stream, body, n);
    } else {
      launch_kernel(dense_kernel<1, Body>, dim3(grid_for(n, kThreads)), dim3(kThreads), 0, stream,
                    body, n);
    }
  } else if (layout_fits_int32(l)) {
    launch_kernel(strided_kernel<N, OffsetCalc32<N>, uint32_t, Body>, dim3(grid_for(n, kThreads)),
                  dim3(kThreads), 0, stream, offset_calc32<N>(l), body, n);
  } else {
    launch_kernel(strided_kernel<N, OffsetCalc64<N>, int64_t, Body>, dim3(grid_for(n, kThreads)),
                  dim3(kThreads), 0, stream, offset_calc64<N>(l), body, n);
  }
}

// ---- Bodies: operand 0 is always the output -------------------------------------------------

template <typename S, typename D>
struct CopyBody {
  static constexpr int kVec = vec_for(sizeof(S) > sizeof(D) ? sizeof(S) : sizeof(D));
  D* d;
  const S* s;
  bool aligned() const {
    return aligned_to(d, kVec * sizeof(D)) && aligned_to(s, kVec * sizeof(S));
  }
  template <typename I>
  __device__ void at(const I (&off)[2]) const {
    d[off[0]] = convert<D>(s[off[1]]);
  }
  template <int V>
  __device__ void vec(int64_t i) const {
    const Pack<S, V> in = load_pack<V>(s, i);
    Pack<D, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = convert<D>(in.v[j]);
    store_pack<V>(d, i, out);
  }
};

template <typename T>
struct FillBody {
  static constexpr int kVec = vec_for(sizeof(T));
  T* d;
  double value;
  bool aligned() const { return aligned_to(d, kVec * sizeof(T)); }
  template <typename I>
  __device__ void at(const I (&off)[1]) const {
    d[off[0]] = convert<T>(value);
  }
  template <int V>
  __device__ void vec(int64_t i) const {
    Pack<T, V> out;
    const T v = convert<T>(value);
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = v;
    store_pack<V>(d, i, out);
  }
};

template <UnaryOp OP, typename T>
struct UnaryBody {
  static constexpr int kVec = vec_for(sizeof(T));
  T* y;
  const T* x;
  float a, b;
  bool aligned() const { return aligned_to(y, 16) && aligned_to(x, 16); }
  template <typename I>
  __device__ void at(const I (&off)[2]) const {
    y[off[0]] = from_float<T>(pm::unary_forward<OP, float>(to_float(x[off[1]]), a, b));
  }
  template <int V>
  __device__ void vec(int64_t i) const {
    const Pack<T, V> in = load_pack<V>(x, i);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      out.v[j] = from_float<T>(pm::unary_forward<OP, float>(to_float(in.v[j]), a, b));
    }
    store_pack<V>(y, i, out);
  }
};

template <UnaryOp OP, typename T>
struct UnaryBackwardBody {
  static constexpr int kVec = vec_for(sizeof(T));
  T* dx;
  const T* g;
  const T* x;
  float a, b;
  bool aligned() const { return aligned_to(dx, 16) && aligned_to(g, 16) && aligned_to(x, 16); }
  __device__ float one(float gv, float xv) const {
    return gv * pm::unary_derivative<OP, float>(xv, a, b);
  }
  template <typename I>
  __device__ void at(const I (&off)[3]) const {
    dx[off[0]] = from_float<T>(one(to_float(g[off[1]]), to_float(x[off[2]])));
  }
  template <int V>
  __device__ void vec(int64_t i) const {
    const Pack<T, V> gi = load_pack<V>(g, i), xi = load_pack<V>(x, i);
    Pack<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.v[j] = from_float<T>(one(to_float(gi.v[j]), to_float(xi.v[j])));
    store_pack<V>(dx, i, out);
  }
};

constexpr size_t widest(size_t a, size_t b, size_t c) {
  return a > b ? (a > c ? a : c) : (b > c ? b : c);
}

// A and B differ only for mixed precision (one f32, one 16-bit): each is read in its own dtype.
template <BinaryOp OP, typename A, typename B, typename O>
struct BinaryBody {
  static constexpr int kVec = vec_for(widest(sizeof(A), sizeof(B), sizeof(O)));
  O* out;
  const A* a;
  const B* b;
  bool aligned() const {
    return aligned_to(out, kVec * sizeof(O)) && aligned_to(a, kVec * sizeof(A)) &&
           aligned_to(b, kVec * sizeof(B));
  }
  __device__ O one(A av, B bv) const {
    const float va = to_float(av), vb = to_float(bv);
    if constexpr (kIsComparison<OP>) {
      return pm::compare<OP, float>(va, vb) ? 1 : 0;
    } else {
      return from_float<O>(pm::binary_forward<OP, float>(va, vb));
    }
  }
  template <typename I>
  __device__ void at(const I (&off)[3]) const {
    out[off[0]] = one(a[off[1]], b[off[2]]);
  }
  template <int V>
  __device__ void vec(int64_t i) const {
    const Pack<A, V> ai = load_pack<V>(a, i);
    const Pack<B, V> bi = load_pack<V>(b, i);
    Pack<O, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = one(ai.v[j], bi.v[j]);
    store_pack<V>(out, i, o);
  }
};

template <typename T>
struct WhereBody {
  static constexpr int kVec = vec_for(sizeof(T));
  T* out;
  const uint8_t* c;
  const T* a;
  const T* b;
  bool aligned() const {
    return aligned_to(out, 16) && aligned_to(c, kVec) && aligned_to(a, 16) && aligned_to(b, 16);
  }
  template <typename I>
  __device__ void at(const I (&off)[4]) const {
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
  template <int V>
  __device__ void vec(int64_t i) const {
    const Pack<uint8_t, V> ci = load_pack<V>(c, i);
    const Pack<T, V> ai = load_pack<V>(a, i), bi = load_pack<V>(b, i);
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = ci.v[j] ? ai.v[j] : bi.v[j];
    store_pack<V>(out, i, o);
  }
};

}  // namespace

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// The device and stream a kernel on `t` launches with; keeps the device current meanwhile.
struct LaunchOn {
  explicit LaunchOn(const Tensor& t)
      : guard(device_index(t)), stream(current_stream(device_index(t))) {}
  DeviceGuard guard;
  cudaStream_t stream;
};

}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  SKA_CHECK(src.shape() == dst.shape(), ShapeError, "copy: source ", shape_str(src.shape()),
            " and destination ", shape_str(dst.shape()), " differ");
  const int64_t n = dst.numel();
  if (n == 0) return;
  LaunchOn on(dst);
  if (src.is_contiguous() && dst.is_contiguous() && src.dtype() == dst.dtype()) {
    SKA_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(),
                                   static_cast<size_t>(n) * dst.element_size(),
                                   cudaMemcpyDeviceToDevice, on.stream));
    return;
  }
  dispatch_all(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_all(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      const CopyBody<S, D> body{static_cast<D*>(dst.data_ptr()),
                                static_cast<const S*>(src.data_ptr())};
      launch_elementwise<2>(dst.shape(), {dst.strides(), src.strides()}, body, on.stream);
    });
  });
}

void fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  LaunchOn on(dst);
  dispatch_all(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const FillBody<T> body{static_cast<T*>(dst.data_ptr()), value};
    launch_elementwise<1>(dst.shape(), {dst.strides()}, body, on.stream);
  });
}

void unary(UnaryOp op, const Tensor& x, const Tensor& out, double a, double b) {
  if (x.numel() == 0) return;
  LaunchOn on(out);
  dispatch_floating(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_unary_op(op, [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      const UnaryBody<kOp, T> body{static_cast<T*>(out.data_ptr()),
                                   static_cast<const T*>(x.data_ptr()), static_cast<float>(a),
                                   static_cast<float>(b)};
      launch_elementwise<2>(out.shape(), {out.strides(), x.strides()}, body, on.stream);
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& x, const Tensor& grad_x,
                    double a, double b) {
  SKA_CHECK(grad_out.is_contiguous() && x.is_contiguous() && grad_x.is_contiguous(), ValueError,
            "cuda unary_backward: operands must be contiguous");
  if (x.numel() == 0) return;
  LaunchOn on(grad_x);
  dispatch_floating(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_unary_op(op, [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      const UnaryBackwardBody<kOp, T> body{
          static_cast<T*>(grad_x.data_ptr()), static_cast<const T*>(grad_out.data_ptr()),
          static_cast<const T*>(x.data_ptr()), static_cast<float>(a), static_cast<float>(b)};
      launch_elementwise<3>(x.shape(), {grad_x.strides(), grad_out.strides(), x.strides()}, body,
                            on.stream);
    });
  });
}

// Calls f(A{}, B{}) with the element types of a binary op's operands: one floating dtype, or
// f32 with bf16/f16 either way round.
template <typename F>
void dispatch_binary_operands(DType a, DType b, F&& f) {
  if (a == b) {
    dispatch_floating(a, "binary", [&](auto t) { f(t, t); });
    return;
  }
  const auto is_16bit = [](DType d) { return d == DType::kBF16 || d == DType::kF16; };
  SKA_CHECK((a == DType::kF32 && is_16bit(b)) || (b == DType::kF32 && is_16bit(a)), DTypeError,
            "cuda binary: operands of dtypes ", dtype_name(a), " and ", dtype_name(b),
            " (mixed only as f32 with bf16 or f16)");
  if (a == DType::kF32) {
    dispatch_floating(b, "binary", [&](auto t) { f(float{}, t); });
  } else {
    dispatch_floating(a, "binary", [&](auto t) { f(t, float{}); });
  }
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(a.shape() == out.shape() && b.shape() == out.shape(), ShapeError,
            "cuda binary: operands ", shape_str(a.shape()), " and ", shape_str(b.shape()),
            " must be views with the output's shape ", shape_str(out.shape()));
  if (out.numel() == 0) return;
  LaunchOn on(out);
  dispatch_binary_operands(a.dtype(), b.dtype(), [&](auto a_tag, auto b_tag) {
    using A = decltype(a_tag);
    using B = decltype(b_tag);
    // The wider operand's type (they differ only as f32 with a 16-bit type).
    using W = std::conditional_t<sizeof(A) >= sizeof(B), A, B>;
    const DType wide = sizeof(A) >= sizeof(B) ? a.dtype() : b.dtype();
    pm::visit_binary_op(op, [&](auto op_c) {
      constexpr BinaryOp kOp = decltype(op_c)::value;
      using O = std::conditional_t<kIsComparison<kOp>, uint8_t, W>;
      SKA_CHECK(out.dtype() == (kIsComparison<kOp> ? DType::kU8 : wide), DTypeError,
                "cuda binary ", binary_op_name(op), ": output dtype ", dtype_name(out.dtype()),
                " is wrong");
      const BinaryBody<kOp, A, B, O> body{static_cast<O*>(out.data_ptr()),
                                          static_cast<const A*>(a.data_ptr()),
                                          static_cast<const B*>(b.data_ptr())};
      launch_elementwise<3>(out.shape(), {out.strides(), a.strides(), b.strides()}, body,
                            on.stream);
    });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(cond.dtype() == DType::kU8, DTypeError, "where: condition must be u8, got ",
            dtype_name(cond.dtype()));
  SKA_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), DTypeError,
            "cuda where: operands must have the output's dtype ", dtype_name(out.dtype()));
  if (out.numel() == 0) return;
  LaunchOn on(out);
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const WhereBody<T> body{static_cast<T*>(out.data_ptr()),
                            static_cast<const uint8_t*>(cond.data_ptr()),
                            static_cast<const T*>(a.data_ptr()),
                            static_cast<const T*>(b.data_ptr())};
    launch_elementwise<4>(out.shape(), {out.strides(), cond.strides(), a.strides(), b.strides()},
                          body, on.stream);
  });
}

bool elementwise_fast_paths() { return g_fast_paths.load(std::memory_order_relaxed); }

#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda

#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace ska {

bool set_cuda_elementwise_fast_paths(bool enabled) {
  return cuda::g_fast_paths.exchange(enabled);
}

}  // namespace ska
#endif
