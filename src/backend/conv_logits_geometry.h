// The geometry of CSKA's convolutional logits (conv_logits_forward / conv_logits_backward in
// backend/kernels.inc), shared by the CPU twin, the CUDA kernels and the op layer: the operands'
// checks, which problems the CUDA kernels take, and how grad_w's sum over the batch is split.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace ska {

struct ConvLogitsGeometry {
  int64_t batch, heads, height, width, keys, d, kernel;
};

// Whether t's offset and its strides but the last (of the dims longer than one) are even: with a
// unit last-dim stride, a pair of 16-bit elements at an even column is then one aligned 32-bit
// store, as the CUDA kernels write them.
inline bool conv_logits_even_layout(const Tensor& t) {
  if (t.offset() % 2 != 0) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) % 2 != 0) return false;
  }
  return true;
}

// Whether the kernels write grad_q [B, h, H*W, d] in t's layout: contiguous, or a view with a
// unit last-dim stride and an even layout (conv_logits_even_layout), as the heads of a
// projection's gradient are. A view whose elements overlap is the caller's error.
inline bool conv_logits_grad_q_layout(const Tensor& t) {
  if (t.is_contiguous()) return true;
  return t.dim() == 4 && (t.size(3) <= 1 || t.stride(3) == 1) && conv_logits_even_layout(t);
}

// Checks the operands of a conv_logits kernel and returns their geometry: q [B, h, H*W, d] (any
// strides but a unit last-dim stride), w [h, k*k, K, d] contiguous (k odd), bias [h, K]
// contiguous or undefined, one floating dtype on one device. `out` is the logits (forward) or
// their gradient (backward): [B, h, H*W, K] with a unit last-dim stride (the logits written
// through their strides: a view of a larger tensor's rows). grad_q ([B, h, H*W, d]) laid out as
// conv_logits_grad_q_layout takes, grad_w (w's shape) and grad_bias ([h, K]) contiguous, each or
// undefined. ShapeError / DTypeError / DeviceError naming `kernel` and the operand otherwise.
inline ConvLogitsGeometry conv_logits_geometry(const char* kernel, const Tensor& q, const Tensor& w,
                                               const Tensor& bias, int64_t height, int64_t width,
                                               const Tensor& out, const Tensor& grad_q = Tensor(),
                                               const Tensor& grad_w = Tensor(),
                                               const Tensor& grad_bias = Tensor()) {
  SKA_CHECK(q.defined() && w.defined() && out.defined(), ValueError, kernel,
            ": q, w and the logits are required");
  SKA_CHECK(q.dim() == 4 && height >= 1 && width >= 1 && q.size(2) == height * width, ShapeError,
            kernel, ": q must be [B, h, ", height, "*", width, ", d], got ", shape_str(q.shape()));
  ConvLogitsGeometry geo{q.size(0), q.size(1), height, width, 0, q.size(3), 0};
  int64_t k = 1;
  while (w.dim() == 4 && k * k < w.size(1)) k += 2;
  SKA_CHECK(w.dim() == 4 && w.size(0) == geo.heads && k * k == w.size(1) && w.size(3) == geo.d &&
                w.is_contiguous(),
            ShapeError, kernel, ": w must be a contiguous [", geo.heads, ", k*k (k odd), K, ",
            geo.d, "], got ", shape_str(w.shape()));
  geo.kernel = k;
  geo.keys = w.size(2);
  const Shape logits{geo.batch, geo.heads, height * width, geo.keys};
  SKA_CHECK(!bias.defined() || bias.shape() == Shape({geo.heads, geo.keys}), ShapeError, kernel,
            ": bias must be [", geo.heads, ", ", geo.keys, "], got ", shape_str(bias.shape()));
  SKA_CHECK(out.shape() == logits, ShapeError, kernel, ": the logits must be ", shape_str(logits),
            ", got ", shape_str(out.shape()));
  const auto unit_columns = [](const Tensor& t) {
    return t.size(-1) <= 1 || t.stride(-1) == 1 || t.numel() == 0;  // an empty view reads nothing
  };
  SKA_CHECK(unit_columns(q) && unit_columns(out) && (!bias.defined() || bias.is_contiguous()),
            ShapeError, kernel,
            ": q and the logits (or their gradient) need a unit last-dim stride, the bias "
            "contiguous");
  SKA_CHECK(!grad_q.defined() || conv_logits_grad_q_layout(grad_q), ShapeError, kernel,
            ": grad_q must be contiguous, or a view with a unit last-dim stride and even strides "
            "and offset");
  for (const Tensor* t : {&grad_w, &grad_bias}) {
    SKA_CHECK(!t->defined() || t->is_contiguous(), ShapeError, kernel,
              ": grad_w and grad_bias must be contiguous");
  }
  SKA_CHECK(!grad_q.defined() || grad_q.shape() == q.shape(), ShapeError, kernel,
            ": grad_q must be ", shape_str(q.shape()), ", got ", shape_str(grad_q.shape()));
  SKA_CHECK(!grad_w.defined() || grad_w.shape() == w.shape(), ShapeError, kernel,
            ": grad_w must be ", shape_str(w.shape()), ", got ", shape_str(grad_w.shape()));
  SKA_CHECK(!grad_bias.defined() || grad_bias.shape() == Shape({geo.heads, geo.keys}), ShapeError,
            kernel, ": grad_bias must be [", geo.heads, ", ", geo.keys, "], got ",
            shape_str(grad_bias.shape()));
  for (const Tensor* t : {&w, &bias, &out, &grad_q, &grad_w, &grad_bias}) {
    if (!t->defined()) continue;
    SKA_CHECK(t->dtype() == q.dtype(), DTypeError, kernel, ": every operand must be ",
              dtype_name(q.dtype()), " as q is, got ", dtype_name(t->dtype()));
    SKA_CHECK(t->device() == q.device(), DeviceError, kernel, ": every operand must be on ",
              q.device(), ", got ", t->device());
  }
  SKA_CHECK(q.is_floating(), DTypeError, kernel, ": q must be floating, got ",
            dtype_name(q.dtype()));
  return geo;
}

// The keys a block of the CUDA kernels owns (forward, grad_w) or walks at a time (grad_q).
constexpr int64_t kConvLogitsKeys = 80;

// How many taps' filters the CUDA forward and grad_q kernels stage at once, 80 keys of d
// channels each (rows padded to d + 8), into one of two buffers (the next group's in flight while
// the current one is multiplied): as many as fit in 18 KiB, at least one, at most k*k (head dim
// 16: 4 of a 3x3 filter's 9; 64: one).
inline int64_t conv_logits_tap_group(int64_t d, int64_t k) {
  const int64_t per_tap = kConvLogitsKeys * 2 * (d + 8);
  return std::clamp<int64_t>(18 * 1024 / per_tap, 1, std::max<int64_t>(k * k, 1));
}

// Whether the CUDA kernels take head dim d on a grid `width` wide with a k x k filter: d a
// multiple of 16 up to 128, and the forward and grad_q kernels' shared tiles (64 positions with a
// halo of (k/2) * (width + 1) rows on either side, two buffers of a group of taps' filters for
// 80 keys and 384 bytes of zero rows, each piece 128-byte aligned) within 96 KiB.
inline bool conv_logits_direct_fits(int64_t d, int64_t width, int64_t k) {
  if (d < 16 || d > 128 || d % 16 != 0 || k < 1 || k % 2 == 0) return false;
  const int64_t span = 64 + 2 * ((k / 2) * width + k / 2), padded = 2 * (d + 8);
  const int64_t group = conv_logits_tap_group(d, k) * kConvLogitsKeys * padded;
  const int64_t filters = 2 * ((group + 127) / 128 * 128);
  const int64_t forward = span * padded + 128 + filters + 384;
  const int64_t grad_q = span * 2 * (kConvLogitsKeys + 8) + 128 + filters + 384;
  return std::max(forward, grad_q) <= 96 * 1024;
}

// grad_w sums over the batch's B * H * W positions: the CUDA kernel splits them into `chunks`
// chunks of `chunk_rows` (a multiple of 64) whose f32 partial sums, heads * k*k * K * d each, are
// added in order after. At most 256 chunks, at most about 8M partial values in all, and chunks
// of at least 512 positions.
struct ConvLogitsChunks {
  int64_t chunks, chunk_rows;
};
inline ConvLogitsChunks conv_logits_chunks(const ConvLogitsGeometry& geo) {
  const int64_t rows = geo.batch * geo.height * geo.width;
  const int64_t per_chunk =
      std::max<int64_t>(geo.heads * geo.kernel * geo.kernel * geo.keys * geo.d, 1);
  int64_t chunks = std::min<int64_t>((rows + 511) / 512, (int64_t{8} << 20) / per_chunk);
  chunks = std::clamp<int64_t>(chunks, 1, 256);
  const int64_t chunk_rows = std::max<int64_t>(((rows + chunks - 1) / chunks + 63) / 64 * 64, 64);
  return {std::max<int64_t>((rows + chunk_rows - 1) / chunk_rows, 1), chunk_rows};
}

}  // namespace ska
