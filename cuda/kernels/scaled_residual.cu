// Residual sums with per-channel scales on CUDA, out = x * xs + (y * yk) * ys over [rows, C]
// (yk: drop path's per-sample factors): one pass forward, and one backward pass that writes both
// inputs' gradients and sums the scales' over the rows on the way (a deterministic two-stage
// column reduction, as layer norm's: per block of rows a partial per column, then the partials in
// order). Products and sums are rounded as the binary kernels round them (__fmul_rn / __fadd_rn:
// no contraction into an FMA), so out, gx and gy are the bits of the ops; the scales' gradients
// are those sums in another order. With a dropout of the branch (DropoutDraw), the forward pass
// is a thread per 8 elements drawing the mask as dropout_forward does (the same Philox counters,
// the bits written alike); the backward pass reads the bits.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/backend.h"
#include "backend/dropout_checks.h"
#include "core/random.h"
#include "cuda/kernels/common.cuh"
#include "cuda/runtime/runtime.h"

namespace ska::cuda {
namespace {

constexpr int kColTile = 32;      // columns per block (threadIdx.x)
constexpr int kRowLanes = 8;      // rows walked in parallel (threadIdx.y)
constexpr int kChunkRows = 64;    // rows per partial sum of the backward pass
constexpr int kMaxChunks = 1024;  // partials per column at most
constexpr int kMaxRowBlocks = 65535;

// v rounded to T and widened back: what a T tensor holding v gives the next kernel.
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  return to_float(from_float<T>(v));
}

// v * scale[c] rounded to T, or v itself without a scale.
template <typename T, typename TS>
__device__ __forceinline__ float scaled(float v, const TS* scale, int64_t c) {
  return scale ? rounded<T>(__fmul_rn(v, to_float(scale[c]))) : v;
}

// Row r's drop path factor (yk[r / rows_per_sample]) applied to v, rounded to TY as drop_path's
// mul writes it; v itself without factors.
template <typename TY>
__device__ __forceinline__ float kept(float v, const TY* yk, int64_t r, uint32_t rows_per_sample) {
  if (yk == nullptr) return v;
  const uint32_t sample = static_cast<uint32_t>(r) / rows_per_sample;  // rows < 2^32 (checked)
  return rounded<TY>(__fmul_rn(v, to_float(yk[sample])));
}

template <typename TX, typename TY, typename T>
__global__ void scaled_residual_forward_kernel(const TX* x, const T* xs, const TY* y, const T* ys,
                                               const TY* yk, uint32_t rows_per_sample, T* out,
                                               int64_t rows, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r = static_cast<int64_t>(blockIdx.y) * kRowLanes + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.y) * kRowLanes) {
    const int64_t i = r * cols + c;
    const float a = scaled<T>(to_float(x[i]), xs, c);
    const float b = scaled<T>(kept(to_float(y[i]), yk, r, rows_per_sample), ys, c);
    out[i] = from_float<T>(__fadd_rn(a, b));
  }
}

// The forward pass with a dropout of y: a thread per byte of `bits`, i.e. per 8 consecutive
// elements (Philox counters offset + 2j and offset + 2j + 1, as dropout_forward_kernel), each
// dropped value rounded to TY as dropout writes it, then the sum as above.
template <typename TX, typename TY, typename T>
__global__ void scaled_residual_dropout_forward_kernel(
    const TX* x, const T* xs, const TY* y, const T* ys, const TY* yk, uint32_t rows_per_sample,
    T* out, uint8_t* bits, int64_t n, int64_t cols, uint64_t seed, uint64_t offset,
    const int64_t* offset_base, float keep, float scale) {
  if (offset_base != nullptr) offset += static_cast<uint64_t>(*offset_base);
  const int64_t bytes = (n + 7) / 8;
  const float s = rounded<TY>(scale);
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < bytes;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PhiloxOut r0 = philox4x32_10(seed, offset + static_cast<uint64_t>(2 * j));
    const PhiloxOut r1 = philox4x32_10(seed, offset + static_cast<uint64_t>(2 * j + 1));
    int64_t r = (8 * j) / cols, c = (8 * j) % cols;
    uint32_t byte = 0;
#pragma unroll  // constant indices into the Philox words: registers, not a stack frame
    for (int k = 0; k < 8; ++k) {
      const int64_t i = 8 * j + k;
      if (i >= n) break;
      const bool kept_here = philox_uniform(k < 4 ? r0.w[k] : r1.w[k - 4]) < keep;
      byte |= static_cast<uint32_t>(kept_here) << k;
      const float yv = rounded<TY>(__fmul_rn(to_float(y[i]), kept_here ? s : 0.0f));
      const float a = scaled<T>(to_float(x[i]), xs, c);
      const float b = scaled<T>(kept(yv, yk, r, rows_per_sample), ys, c);
      out[i] = from_float<T>(__fadd_rn(a, b));
      if (++c == cols) {
        c = 0;
        ++r;
      }
    }
    bits[j] = static_cast<uint8_t>(byte);
  }
}

// Whether element i of a dropout mask's bits is set.
__device__ __forceinline__ bool bit_set(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1;
}

// Block (column tile, chunk of rows): gx and gy for its elements, and per column the partial sums
// of g * x and g * y over the chunk (products rounded to T, as mul writes them; the 8 row lanes
// added in order), into part_x / part_y [chunks, cols].
// With a dropout of y (bits non-null), gy goes through its mask last, and y is dropped again
// where g * y is summed.
template <typename TX, typename TY, typename T>
__global__ void scaled_residual_backward_kernel(const T* g, const TX* x, const T* xs, const TY* y,
                                                const T* ys, const TY* yk, uint32_t rows_per_sample,
                                                const uint8_t* bits, float drop_scale, TX* gx,
                                                TY* gy, int64_t rows, int64_t cols,
                                                int64_t chunk_rows, float* part_x, float* part_y) {
  const float s = rounded<TY>(drop_scale);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  float ax = 0.0f, ay = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kRowLanes) {
      const int64_t i = r * cols + c;
      const float gv = to_float(g[i]);
      if (gx) gx[i] = from_float<TX>(xs ? __fmul_rn(gv, to_float(xs[c])) : gv);
      if (gy) {  // through the scale's mul (rounded to y's dtype), drop path's, then dropout's
        const float reaching = ys ? __fmul_rn(gv, to_float(ys[c])) : gv;
        float v = yk ? kept(rounded<TY>(reaching), yk, r, rows_per_sample) : reaching;
        if (bits) v = __fmul_rn(rounded<TY>(v), bit_set(bits, i) ? s : 0.0f);
        gy[i] = from_float<TY>(v);
      }
      if (part_x) ax = __fadd_rn(ax, rounded<T>(__fmul_rn(gv, to_float(x[i]))));
      if (part_y) {
        float dropped = to_float(y[i]);
        if (bits) dropped = rounded<TY>(__fmul_rn(dropped, bit_set(bits, i) ? s : 0.0f));
        const float yv = kept(dropped, yk, r, rows_per_sample);
        ay = __fadd_rn(ay, rounded<T>(__fmul_rn(gv, yv)));
      }
    }
  }
  if (part_x == nullptr && part_y == nullptr) return;  // the same for the whole block
  store_column_partials<kColTile, kRowLanes>(ax, ay, c, cols, part_x, part_y);
}

struct Geometry {
  int64_t rows, cols;
  uint32_t rows_per_sample;  // of yk's samples (1 without yk)
};

dim3 column_grid(const char* kernel, int64_t cols, int64_t row_blocks) {
  const int64_t tiles = (cols + kColTile - 1) / kColTile;
  SKA_CHECK(tiles <= INT_MAX, ShapeError, kernel, ": too many columns (", cols, ")");
  return dim3(static_cast<unsigned int>(tiles), static_cast<unsigned int>(row_blocks));
}

// A launch's operands (null: absent), as the entry points check them; rows, cols > 0.
template <typename TX, typename TY, typename T>
struct Operands {
  Geometry geo;
  const TX* x;
  const T* xs;
  const TY* y;
  const T* ys;
  const TY* yk;
};

// scaled_residual_forward's launch once its operands are checked.
template <typename TX, typename TY, typename T>
void launch_forward(const Operands<TX, TY, T>& a, const BranchDrop& drop, T* out,
                    cudaStream_t stream) {
  const Geometry& geo = a.geo;
  if (drop.bits != nullptr) {
    const int64_t n = geo.rows * geo.cols;
    launch_kernel(scaled_residual_dropout_forward_kernel<TX, TY, T>, grid_for((n + 7) / 8, 256),
                  256, 0, stream, a.x, a.xs, a.y, a.ys, a.yk, geo.rows_per_sample, out, drop.bits,
                  n, geo.cols, drop.seed, drop.offset, drop.offset_base, drop.keep, drop.scale);
    return;
  }
  const int64_t row_blocks =
      std::min<int64_t>((geo.rows + kRowLanes - 1) / kRowLanes, kMaxRowBlocks);
  launch_kernel(scaled_residual_forward_kernel<TX, TY, T>,
                column_grid("scaled_residual_forward", geo.cols, row_blocks),
                dim3(kColTile, kRowLanes), 0, stream, a.x, a.xs, a.y, a.ys, a.yk,
                geo.rows_per_sample, out, geo.rows, geo.cols);
}

// The backward pass's chunks of rows: its partial sums per column.
int64_t backward_chunks(const Geometry& geo) {
  return std::min<int64_t>((geo.rows + kChunkRows - 1) / kChunkRows, kMaxChunks);
}

// scaled_residual_backward's launches once its operands are checked (rows, cols > 0): gx, gy,
// gxs and gys where not null, the scales' gradients through `part` (2 * backward_chunks * cols
// floats; null when neither is wanted).
template <typename TX, typename TY, typename T>
void launch_backward(const Operands<TX, TY, T>& a, const BranchDrop& drop, const T* g, TX* gx,
                     TY* gy, T* gxs, T* gys, float* part, cudaStream_t stream) {
  const Geometry& geo = a.geo;
  const int64_t chunks = backward_chunks(geo);
  const int64_t chunk_rows = (geo.rows + chunks - 1) / chunks;
  float* part_x = gxs != nullptr ? part : nullptr;
  float* part_y = gys != nullptr ? part + chunks * geo.cols : nullptr;
  launch_kernel(scaled_residual_backward_kernel<TX, TY, T>,
                column_grid("scaled_residual_backward", geo.cols, chunks),
                dim3(kColTile, kRowLanes), 0, stream, g, a.x, a.xs, a.y, a.ys, a.yk,
                geo.rows_per_sample, static_cast<const uint8_t*>(drop.bits), drop.scale, gx, gy,
                geo.rows, geo.cols, chunk_rows, part_x, part_y);
  if (gxs != nullptr || gys != nullptr) {
    launch_column_sums<T>(part_x, part_y, chunks, geo.cols, gxs, gys, stream);
  }
}

}  // namespace

// The tensor-level entry points (tests/simt runs launch_forward and launch_backward on raw host
// operands).
#if !defined(SKA_SIMT_KERNELS_ONLY)
namespace {

// Calls f(TX{}, TY{}, T{}) for out's dtype T and x's and y's dtypes: T, or (T f32) bf16/f16.
// Only those combinations are instantiated.
template <typename F>
void dispatch_residual(DType out, DType x, DType y, const char* kernel, F&& f) {
  dispatch_floating(out, kernel, [&](auto t) {
    using T = decltype(t);
    const auto of = [&](DType d, auto&& then) {
      if (d == out) return then(T{});
      if constexpr (std::is_same_v<T, float>) {
        if (d == DType::kBF16) return then(__nv_bfloat16{});
        if (d == DType::kF16) return then(__half{});
      }
      SKA_FAIL(DTypeError, kernel, ": an input of ", dtype_name(d), " with a ", dtype_name(out),
               " result; expected the result's dtype, or bf16/f16 with f32");
    };
    of(x, [&](auto tx) { of(y, [&](auto ty) { f(tx, ty, t); }); });
  });
}

// x and y may be undefined (the backward pass without their scales' gradients): like gives the
// shape then.
Geometry check(const char* kernel, const Tensor& x, const Tensor& xs, const Tensor& y,
               const Tensor& ys, const Tensor& yk, const Tensor& like) {
  const auto fits = [&](const Tensor& t) {
    return !t.defined() || (t.shape() == like.shape() && t.is_contiguous());
  };
  const auto text = [](const Tensor& t) { return t.defined() ? t.str() : std::string("(none)"); };
  SKA_CHECK(like.dim() >= 1 && like.is_contiguous() && fits(x) && fits(y), ShapeError, kernel,
            ": x ", text(x), ", y ", text(y), " and ", like.str(),
            " must be contiguous, of one shape");
  const int64_t cols = like.size(-1);
  for (const Tensor* s : {&xs, &ys}) {
    if (!s->defined()) continue;
    SKA_CHECK(
        s->dim() == 1 && s->size(0) == cols && s->is_contiguous() && s->dtype() == like.dtype(),
        ShapeError, kernel, ": a scale must be a contiguous [", cols, "] ",
        dtype_name(like.dtype()), " tensor, got ", s->str());
  }
  const int64_t rows = cols == 0 ? 0 : like.numel() / cols;
  int64_t rows_per_sample = 1;
  if (yk.defined()) {
    const int64_t batch = like.size(0);
    SKA_CHECK(yk.dim() == 1 && yk.size(0) == batch && yk.is_contiguous() &&
                  (!y.defined() || yk.dtype() == y.dtype()) &&
                  (rows == 0 || (batch > 0 && rows % batch == 0)),
              ShapeError, kernel, ": drop path's factors must be a contiguous [", batch,
              "] tensor of y's dtype (one per sample of ", like.str(), "), got ", yk.str());
    SKA_CHECK(rows < (int64_t{1} << 32), ShapeError, kernel, ": ", rows,
              " rows with drop path factors: too many for the kernels' 32-bit sample index");
    rows_per_sample = batch > 0 ? std::max<int64_t>(rows / batch, 1) : 1;  // an empty batch
  }
  return {rows, cols, static_cast<uint32_t>(rows_per_sample)};
}

template <typename TX, typename TY, typename T>
Operands<TX, TY, T> operands(const Geometry& geo, const Tensor& x, const Tensor& xs,
                             const Tensor& y, const Tensor& ys, const Tensor& yk) {
  return {geo,
          data_or_null<TX>(x),
          data_or_null<T>(xs),
          data_or_null<TY>(y),
          data_or_null<T>(ys),
          data_or_null<TY>(yk)};
}

}  // namespace

void scaled_residual_forward(const Tensor& x, const Tensor& xs, const Tensor& y, const Tensor& ys,
                             const Tensor& yk, const DropoutDraw& drop, const Tensor& out) {
  const char* kKernel = "scaled_residual_forward";
  const Geometry geo = check(kKernel, x, xs, y, ys, yk, out);
  if (drop.active()) check_dropout_draw(kKernel, drop, y);
  if (geo.rows == 0 || geo.cols == 0) return;
  const int device = device_index(x);
  DeviceGuard guard(device);
  dispatch_residual(out.dtype(), x.dtype(), y.dtype(), kKernel, [&](auto tx, auto ty, auto t) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    using T = decltype(t);
    launch_forward(operands<TX, TY, T>(geo, x, xs, y, ys, yk), kernel_drop(drop),
                   static_cast<T*>(out.data_ptr()), current_stream(device));
  });
}

void scaled_residual_backward(const Tensor& g, const Tensor& x, const Tensor& xs, const Tensor& y,
                              const Tensor& ys, const Tensor& yk, const DropoutDraw& drop,
                              const Tensor& gx, const Tensor& gy, const Tensor& gxs,
                              const Tensor& gys) {
  const char* kKernel = "scaled_residual_backward";
  const Geometry geo = check(kKernel, x, xs, y, ys, yk, g);
  if (drop.active()) check_dropout_bits(kKernel, drop.bits, g);
  // x and y are read only for their scales' gradients; gx and gy give their dtypes otherwise.
  const DType x_dtype = x.defined() ? x.dtype() : gx.defined() ? gx.dtype() : g.dtype();
  const DType y_dtype = y.defined() ? y.dtype() : gy.defined() ? gy.dtype() : g.dtype();
  SKA_CHECK(
      (!gx.defined() || (gx.is_contiguous() && gx.shape() == g.shape() && gx.dtype() == x_dtype)) &&
          (!gy.defined() ||
           (gy.is_contiguous() && gy.shape() == g.shape() && gy.dtype() == y_dtype)) &&
          (!yk.defined() || yk.dtype() == y_dtype),
      ValueError, kKernel,
      ": gx and gy must be contiguous, of g's shape and of x's and y's dtypes");
  SKA_CHECK((!gxs.defined() || (xs.defined() && x.defined())) &&
                (!gys.defined() || (ys.defined() && y.defined())),
            ValueError, kKernel, ": a scale's gradient without the scale or its operand");
  for (const Tensor* s : {&gxs, &gys}) {
    SKA_CHECK(
        !s->defined() || (s->is_contiguous() && s->numel() == geo.cols && s->dtype() == g.dtype()),
        ValueError, kKernel, ": a scale's gradient must be a contiguous [", geo.cols, "] ",
        dtype_name(g.dtype()), " tensor");
  }
  const int device = device_index(g);
  DeviceGuard guard(device);
  const cudaStream_t s = current_stream(device);
  if (geo.rows == 0 || geo.cols == 0) {  // no rows: the scales' gradients are zero
    for (const Tensor* t : {&gxs, &gys}) {
      if (t->defined() && t->numel() > 0)
        SKA_CUDA_CHECK(cudaMemsetAsync(t->data_ptr(), 0, t->numel() * t->element_size(), s));
    }
    return;
  }
  const bool sums = gxs.defined() || gys.defined();
  const Tensor ws =
      sums ? workspace(device, 2 * backward_chunks(geo) * geo.cols * sizeof(float)) : Tensor();
  dispatch_residual(g.dtype(), x_dtype, y_dtype, kKernel, [&](auto tx, auto ty, auto t) {
    using TX = decltype(tx);
    using TY = decltype(ty);
    using T = decltype(t);
    launch_backward(operands<TX, TY, T>(geo, x, xs, y, ys, yk), kernel_drop(drop),
                    static_cast<const T*>(g.data_ptr()), mutable_or_null<TX>(gx),
                    mutable_or_null<TY>(gy), mutable_or_null<T>(gxs), mutable_or_null<T>(gys),
                    sums ? static_cast<float*>(ws.data_ptr()) : nullptr, s);
  });
}
#endif  // !defined(SKA_SIMT_KERNELS_ONLY)

}  // namespace ska::cuda
