// CUDA kernels: copy, fill, unary (+ backward), binary, where. Twins of backend/cpu/pointwise.cpp;
// the scalar math is pointwise_math.h evaluated in f32 for f32, bf16 and f16.
#include <cstdint>
#include <type_traits>

#include "backend/backend.h"
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
// Element offset of linear index i in a view: i itself when the view is contiguous.
__device__ __forceinline__ int64_t at(const StridedIndexer& ix, bool contiguous, int64_t i) {
  return contiguous ? i : ix.offset(i);
}

// The device and stream a kernel on `t` launches with; keeps the device current meanwhile.
struct LaunchOn {
  explicit LaunchOn(const Tensor& t)
      : guard(device_index(t)), stream(current_stream(device_index(t))) {}
  DeviceGuard guard;
  cudaStream_t stream;
};

template <typename S, typename D>
__global__ void copy_kernel(const S* __restrict__ s, StridedIndexer si, bool s_contig,
                            D* __restrict__ d, StridedIndexer di, bool d_contig, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    d[at(di, d_contig, i)] = convert<D>(s[at(si, s_contig, i)]);
  }
}

template <typename T>
__global__ void fill_kernel(T* d, StridedIndexer di, bool d_contig, double value, int64_t n) {
  const T v = convert<T>(value);
  for (int64_t i = first_index(); i < n; i += grid_stride()) d[at(di, d_contig, i)] = v;
}

template <UnaryOp OP, typename T>
__global__ void unary_kernel(const T* __restrict__ x, StridedIndexer xi, bool x_contig,
                             T* __restrict__ y, StridedIndexer yi, bool y_contig, float a, float b,
                             int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = to_float(x[at(xi, x_contig, i)]);
    y[at(yi, y_contig, i)] = from_float<T>(pm::unary_forward<OP, float>(v, a, b));
  }
}

template <UnaryOp OP, typename T>
__global__ void unary_backward_kernel(const T* __restrict__ g, const T* __restrict__ x,
                                      T* __restrict__ dx, float a, float b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float d = pm::unary_derivative<OP, float>(to_float(x[i]), a, b);
    dx[i] = from_float<T>(to_float(g[i]) * d);
  }
}

template <BinaryOp OP, typename T, typename O>
__global__ void binary_kernel(const T* __restrict__ a, StridedIndexer ai, const T* __restrict__ b,
                              StridedIndexer bi, O* __restrict__ out, StridedIndexer oi,
                              bool all_contig, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float va = to_float(a[at(ai, all_contig, i)]);
    const float vb = to_float(b[at(bi, all_contig, i)]);
    if constexpr (kIsComparison<OP>) {
      out[at(oi, all_contig, i)] = pm::compare<OP, float>(va, vb) ? 1 : 0;
    } else {
      out[at(oi, all_contig, i)] = from_float<T>(pm::binary_forward<OP, float>(va, vb));
    }
  }
}

template <typename T>
__global__ void where_kernel(const uint8_t* __restrict__ c, StridedIndexer ci,
                             const T* __restrict__ a, StridedIndexer ai, const T* __restrict__ b,
                             StridedIndexer bi, T* __restrict__ out, StridedIndexer oi,
                             bool all_contig, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    out[at(oi, all_contig, i)] =
        c[at(ci, all_contig, i)] ? a[at(ai, all_contig, i)] : b[at(bi, all_contig, i)];
  }
}

}  // namespace

void copy(const Tensor& src, const Tensor& dst) {
  SKA_CHECK(src.shape() == dst.shape(), ShapeError, "copy: source ", shape_str(src.shape()),
            " and destination ", shape_str(dst.shape()), " differ");
  const int64_t n = dst.numel();
  if (n == 0) return;
  LaunchOn on(dst);
  const bool s_contig = src.is_contiguous(), d_contig = dst.is_contiguous();
  if (s_contig && d_contig && src.dtype() == dst.dtype()) {
    SKA_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(),
                                   static_cast<size_t>(n) * dst.element_size(),
                                   cudaMemcpyDeviceToDevice, on.stream));
    return;
  }
  const StridedIndexer si = make_indexer(src), di = make_indexer(dst);
  dispatch_all(src.dtype(), [&](auto s_tag) {
    using S = decltype(s_tag);
    dispatch_all(dst.dtype(), [&](auto d_tag) {
      using D = decltype(d_tag);
      copy_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, on.stream>>>(
          static_cast<const S*>(src.data_ptr()), si, s_contig, static_cast<D*>(dst.data_ptr()),
          di, d_contig, n);
      SKA_CUDA_CHECK_LAUNCH();
    });
  });
}

void fill(const Tensor& dst, double value) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  LaunchOn on(dst);
  const StridedIndexer di = make_indexer(dst);
  const bool contig = dst.is_contiguous();
  dispatch_all(dst.dtype(), [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<grid_for(n, kThreads), kThreads, 0, on.stream>>>(
        static_cast<T*>(dst.data_ptr()), di, contig, value, n);
    SKA_CUDA_CHECK_LAUNCH();
  });
}

void unary(UnaryOp op, const Tensor& x, const Tensor& out, double a, double b) {
  const int64_t n = x.numel();
  if (n == 0) return;
  LaunchOn on(out);
  const StridedIndexer xi = make_indexer(x), yi = make_indexer(out);
  const bool x_contig = x.is_contiguous(), y_contig = out.is_contiguous();
  dispatch_floating(x.dtype(), "unary", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_unary_op(op, [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      unary_kernel<kOp, T><<<grid_for(n, kThreads), kThreads, 0, on.stream>>>(
          static_cast<const T*>(x.data_ptr()), xi, x_contig, static_cast<T*>(out.data_ptr()), yi,
          y_contig, static_cast<float>(a), static_cast<float>(b), n);
      SKA_CUDA_CHECK_LAUNCH();
    });
  });
}

void unary_backward(UnaryOp op, const Tensor& grad_out, const Tensor& x, const Tensor& grad_x,
                    double a, double b) {
  SKA_CHECK(grad_out.is_contiguous() && x.is_contiguous() && grad_x.is_contiguous(), ValueError,
            "cuda unary_backward: operands must be contiguous");
  const int64_t n = x.numel();
  if (n == 0) return;
  LaunchOn on(grad_x);
  dispatch_floating(x.dtype(), "unary_backward", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_unary_op(op, [&](auto op_c) {
      constexpr UnaryOp kOp = decltype(op_c)::value;
      unary_backward_kernel<kOp, T><<<grid_for(n, kThreads), kThreads, 0, on.stream>>>(
          static_cast<const T*>(grad_out.data_ptr()), static_cast<const T*>(x.data_ptr()),
          static_cast<T*>(grad_x.data_ptr()), static_cast<float>(a), static_cast<float>(b), n);
      SKA_CUDA_CHECK_LAUNCH();
    });
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(a.dtype() == b.dtype(), DTypeError, "cuda binary: operand dtypes differ (",
            dtype_name(a.dtype()), " vs ", dtype_name(b.dtype()), ")");
  SKA_CHECK(a.shape() == out.shape() && b.shape() == out.shape(), ShapeError,
            "cuda binary: operands ", shape_str(a.shape()), " and ", shape_str(b.shape()),
            " must be views with the output's shape ", shape_str(out.shape()));
  const int64_t n = out.numel();
  if (n == 0) return;
  LaunchOn on(out);
  const StridedIndexer ai = make_indexer(a), bi = make_indexer(b), oi = make_indexer(out);
  const bool all_contig = a.is_contiguous() && b.is_contiguous() && out.is_contiguous();
  dispatch_floating(a.dtype(), "binary", [&](auto tag) {
    using T = decltype(tag);
    pm::visit_binary_op(op, [&](auto op_c) {
      constexpr BinaryOp kOp = decltype(op_c)::value;
      using O = std::conditional_t<kIsComparison<kOp>, uint8_t, T>;
      SKA_CHECK(out.dtype() == (kIsComparison<kOp> ? DType::kU8 : a.dtype()),
                DTypeError, "cuda binary ", binary_op_name(op), ": output dtype ",
                dtype_name(out.dtype()), " is wrong");
      binary_kernel<kOp, T, O><<<grid_for(n, kThreads), kThreads, 0, on.stream>>>(
          static_cast<const T*>(a.data_ptr()), ai, static_cast<const T*>(b.data_ptr()), bi,
          static_cast<O*>(out.data_ptr()), oi, all_contig, n);
      SKA_CUDA_CHECK_LAUNCH();
    });
  });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  SKA_CHECK(cond.dtype() == DType::kU8, DTypeError, "where: condition must be u8, got ",
            dtype_name(cond.dtype()));
  SKA_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype(), DTypeError,
            "cuda where: operands must have the output's dtype ", dtype_name(out.dtype()));
  const int64_t n = out.numel();
  if (n == 0) return;
  LaunchOn on(out);
  const StridedIndexer ci = make_indexer(cond), ai = make_indexer(a), bi = make_indexer(b),
                       oi = make_indexer(out);
  const bool all_contig =
      cond.is_contiguous() && a.is_contiguous() && b.is_contiguous() && out.is_contiguous();
  dispatch_all(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    where_kernel<T><<<grid_for(n, kThreads), kThreads, 0, on.stream>>>(
        static_cast<const uint8_t*>(cond.data_ptr()), ci, static_cast<const T*>(a.data_ptr()), ai,
        static_cast<const T*>(b.data_ptr()), bi, static_cast<T*>(out.data_ptr()), oi, all_contig,
        n);
    SKA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ska::cuda
