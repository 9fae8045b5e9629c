// Matrix products: torch.matmul semantics over the batched GEMM kernel, and the fully connected
// layer (weight read transposed in place, bias fused into the GEMM).
#include "ops/linear.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "ops/autocast.h"
#include "ops/detail.h"
#include "ops/mac_counter.h"
#include "ops/reduce.h"

namespace ska {

namespace {

enum class GemmLayout { kRowMajor, kColMajor, kNone };

// How BLAS can read the last two dims without a copy: row-major or column-major with a leading
// dimension that does not overlap rows (size-1 dims may carry any stride).
GemmLayout gemm_layout(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  if ((cols <= 1 || t.stride(-1) == 1) && (rows <= 1 || t.stride(-2) >= cols)) {
    return GemmLayout::kRowMajor;
  }
  if ((rows <= 1 || t.stride(-2) == 1) && (cols <= 1 || t.stride(-1) >= rows)) {
    return GemmLayout::kColMajor;
  }
  return GemmLayout::kNone;
}

Tensor detached_gemm_layout(const Tensor& t) {
  return gemm_layout(t) == GemmLayout::kNone ? t.detach().contiguous() : t.detach();
}

// The [batch, rows, cols] kernel view of v (which has a GEMM layout), with the strides of size-1
// dims made canonical so that every backend sees stride[-1] == 1 or stride[-2] == 1.
Tensor gemm_kernel_view(const Tensor& v, int64_t batch, int64_t batch_stride) {
  const int64_t rows = v.size(-2), cols = v.size(-1);
  const Shape strides =
      gemm_layout(v) == GemmLayout::kRowMajor
          ? Shape{batch_stride, rows <= 1 ? std::max<int64_t>(cols, 1) : v.stride(-2), 1}
          : Shape{batch_stride, 1, cols <= 1 ? std::max<int64_t>(rows, 1) : v.stride(-1)};
  return Tensor::make_view(v.storage(), {batch, rows, cols}, strides, v.offset(), v.dtype());
}

// The single stride that walks dims [0, ndims) of t in order, if one exists (size-1 dims are
// free; a fully broadcast run has stride 0).
bool collapsed_stride(const Tensor& t, int64_t ndims, int64_t& stride) {
  stride = 0;
  int64_t expected = -1;
  for (int64_t d = ndims - 1; d >= 0; --d) {
    if (t.shape()[d] == 1) continue;
    if (expected >= 0 && t.strides()[d] != expected) return false;
    if (expected < 0) stride = t.strides()[d];
    expected = t.strides()[d] * t.shape()[d];
  }
  return true;
}

// batch + [rows, cols]: the shape of a batch of matrices.
Shape batch_of_matrices(const Shape& batch, int64_t rows, int64_t cols) {
  Shape shape = batch;
  shape.push_back(rows);
  shape.push_back(cols);
  return shape;
}

// A history-free [B, rows, cols] view of t broadcast to batch + [rows, cols], copying only when
// the layout or the broadcast batch dims cannot be expressed as one strided view.
Tensor batched_gemm_operand(const Tensor& t, const Shape& batch) {
  const Shape full = batch_of_matrices(batch, t.size(-2), t.size(-1));
  Tensor v = detail::broadcast_raw(detached_gemm_layout(t), full);
  int64_t batch_stride = 0;
  if (!collapsed_stride(v, static_cast<int64_t>(batch.size()), batch_stride)) {
    v = v.contiguous();
    batch_stride = v.size(-2) * v.size(-1);
  }
  return gemm_kernel_view(v, shape_numel(batch), batch_stride);
}

// Whether batched_gemm_operand(t, batch) copies t: its last two dims have no GEMM layout, or its
// batch dims fold into no single stride.
bool needs_packing(const Tensor& t, const Shape& batch) {
  if (gemm_layout(t) == GemmLayout::kNone) return true;
  const Shape full = batch_of_matrices(batch, t.size(-2), t.size(-1));
  int64_t batch_stride = 0;
  return !collapsed_stride(detail::broadcast_raw(t.detach(), full),
                           static_cast<int64_t>(batch.size()), batch_stride);
}

// What a backward product reads of operand t, which the forward's GEMM read as `packed` (from
// batched_gemm_operand for `batch`): the packed tensor with the batch dims restored where packing
// copied t, else t itself (history-free either way; the backward pass records no graph).
Tensor backward_operand(const Tensor& t, const Tensor& packed, const Shape& batch) {
  if (packed.same_storage(t)) return t.detach();
  const Shape full = batch_of_matrices(batch, t.size(-2), t.size(-1));
  return packed.reshape(full);
}

// The batch dims over which the operand with batch dims `operand` (left-padded to batch's rank)
// broadcasts while the product has more than one: its gradient sums over them.
std::vector<size_t> broadcast_batch_dims(const Shape& batch, const Shape& operand) {
  std::vector<size_t> dims;
  const size_t lead = batch.size() - operand.size();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i] > 1 && (i < lead || operand[i - lead] == 1)) dims.push_back(i);
  }
  return dims;
}

// t [batch..., rows, cols] (a raw view) as [other batch dims..., F * rows, cols], the batch dims
// `folded` (F their sizes' product) moved into the rows, where those dims and the rows walk one
// stride in order and the result has a GEMM layout; undefined otherwise (a folded dim broadcast,
// or laid out apart from the rows). No copy, no history.
Tensor fold_into_rows(const Tensor& t, const std::vector<size_t>& folded) {
  const size_t rank = static_cast<size_t>(t.dim()), rows_dim = rank - 2;
  int64_t rows = t.shape()[rows_dim], stride = t.strides()[rows_dim];
  int64_t expected = rows == 1 ? -1 : stride * rows;  // -1: any stride continues the run
  for (auto it = folded.rbegin(); it != folded.rend(); ++it) {
    const int64_t size = t.shape()[*it], s = t.strides()[*it];
    if (size == 1) continue;
    if (s == 0 || (expected >= 0 && s != expected)) return Tensor();
    if (expected < 0) stride = s;  // the rows so far are one: this dim's stride is the run's
    expected = s * size;
    rows *= size;
  }
  Shape shape, strides;
  for (size_t i = 0; i < rows_dim; ++i) {
    if (std::find(folded.begin(), folded.end(), i) != folded.end()) continue;
    shape.push_back(t.shape()[i]);
    strides.push_back(t.strides()[i]);
  }
  shape.push_back(rows);
  strides.push_back(stride);
  shape.push_back(t.shape()[rank - 1]);
  strides.push_back(t.strides()[rank - 1]);
  const Tensor v = Tensor::make_view(t.storage(), shape, strides, t.offset(), t.dtype());
  return gemm_layout(v) == GemmLayout::kNone ? Tensor() : v;
}

// The gradient of b in a @ b where b broadcasts over the batch dims `folded`: the sum over them
// of a^T g, as one product per remaining batch entry with those dims folded into the contraction
// (no per-sample products to sum after); undefined where a or g does not fold (fold_into_rows).
Tensor folded_grad_b(const Tensor& a, const Tensor& g, const Shape& batch,
                     const std::vector<size_t>& folded, const Shape& b_shape) {
  const Tensor af = fold_into_rows(
      detail::broadcast_raw(a.detach(), batch_of_matrices(batch, a.size(-2), a.size(-1))), folded);
  const Tensor gf = fold_into_rows(
      detail::broadcast_raw(g.detach(), batch_of_matrices(batch, g.size(-2), g.size(-1))), folded);
  if (!af.defined() || !gf.defined()) return Tensor();
  return matmul(af.transpose(-1, -2), gf).reshape(b_shape);
}

// A history-free [1, rows, cols] view for the single-GEMM paths.
Tensor single_gemm_operand(const Tensor& t) {
  const Tensor v = detached_gemm_layout(t);
  return gemm_kernel_view(v, 1, v.size(-2) * v.size(-1));
}

void check_matmul_operands(const Tensor& a, const Tensor& b) {
  detail::check_same_device_dtype("matmul", a, b);
  detail::check_floating("matmul", a);
  SKA_CHECK(a.dim() >= 1 && b.dim() >= 1, ShapeError, "matmul: operands must be at least 1-d, got ",
            shape_str(a.shape()), " and ", shape_str(b.shape()));
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  SKA_CHECK(ka == kb, ShapeError, "matmul: shapes ", shape_str(a.shape()), " and ",
            shape_str(b.shape()), " cannot be multiplied (", ka, " != ", kb, ")");
}

// The product of one row per batch entry (a [..., 1, K]) with a b shared over the batch dims
// `folded` as one GEMM per remaining batch entry, those dims folded into its rows: M = their
// sizes' product instead of M = 1 (CSKA's class row against its static keys: one product per
// head over the batch, where the batched form packed a copy of the keys per sample). The output
// is laid out with the remaining batch dims outermost (contiguous as [remaining, folded, 1, N]);
// undefined where a's rows do not fold (fold_into_rows).
Tensor matmul_rows_folded(const Tensor& a, const Tensor& b, const Shape& batch,
                          const std::vector<size_t>& folded) {
  const int64_t k = a.size(-1), n = b.size(-1);
  const Shape out_shape = batch_of_matrices(batch, 1, n);
  const Tensor af = fold_into_rows(
      detail::broadcast_raw(detached_gemm_layout(a), batch_of_matrices(batch, 1, k)), folded);
  if (!af.defined()) return Tensor();
  // b without the folded dims (broadcast there), and the batch dims left.
  const Tensor bv = detail::broadcast_raw(detached_gemm_layout(b), batch_of_matrices(batch, k, n));
  Shape kept, b_shape, b_strides, order_hint(out_shape.size(), 0);
  const int64_t rank = static_cast<int64_t>(out_shape.size());
  int64_t position = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (std::find(folded.begin(), folded.end(), i) != folded.end()) continue;
    kept.push_back(batch[i]);
    b_shape.push_back(batch[i]);
    b_strides.push_back(bv.strides()[i]);
    order_hint[i] = rank - position++;
  }
  for (const size_t i : folded) order_hint[i] = rank - position++;
  order_hint[static_cast<size_t>(rank) - 2] = rank - position++;
  order_hint[static_cast<size_t>(rank) - 1] = 0;
  for (int64_t d = rank - 2; d < rank; ++d) {
    b_shape.push_back(bv.shape()[static_cast<size_t>(d)]);
    b_strides.push_back(bv.strides()[static_cast<size_t>(d)]);
  }
  const Tensor bk = Tensor::make_view(bv.storage(), b_shape, b_strides, bv.offset(), bv.dtype());
  Tensor out = detail::empty_in_stride_order(out_shape, order_hint, a.dtype(), a.device(),
                                             /*last_innermost=*/true);
  const int64_t groups = shape_numel(kept), rows = af.size(-2);
  GemmArgs args;
  args.a = batched_gemm_operand(af, kept);
  args.b = batched_gemm_operand(bk, kept);
  args.c = Tensor::make_view(out.storage(), {groups, rows, n},
                             contiguous_strides({groups, rows, n}), out.offset(), out.dtype());
  SKA_KERNEL(a.device(), gemm)(args);
  return out;
}

// a [..., M, K] @ b [..., K, N] with both operands at least 2-d; records the op.
Tensor matmul_batched(const Tensor& a, const Tensor& b) {
  const Shape batch = broadcast_shapes(Shape(a.shape().begin(), a.shape().end() - 2),
                                       Shape(b.shape().begin(), b.shape().end() - 2), "matmul");
  const int64_t m = a.size(-2), n = b.size(-1);
  const Shape a_shape = a.shape(), b_shape = b.shape();
  const std::vector<size_t> b_folded =
      broadcast_batch_dims(batch, Shape(b_shape.begin(), b_shape.end() - 2));
  Tensor out = m == 1 && !b_folded.empty() ? matmul_rows_folded(a, b, batch, b_folded) : Tensor();
  const bool folded = out.defined();
  GemmArgs args;
  if (!folded) {
    out = Tensor::empty(batch_of_matrices(batch, m, n), a.dtype(), a.device());
    args.a = batched_gemm_operand(a, batch);
    args.b = batched_gemm_operand(b, batch);
    args.c = Tensor::make_view(out.storage(), {shape_numel(batch), m, n},
                               contiguous_strides({shape_numel(batch), m, n}), 0, out.dtype());
    SKA_KERNEL(a.device(), gemm)(args);
  }
  MacCounter::add(shape_numel(batch) * m * n * a.size(-1));
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  // Each backward product reads the other operand. Where the forward's GEMM needed a packed copy
  // of an operand (batch dims that fold into no single stride: a head-split view [B, h, N, d]),
  // the backward reads that copy, not the view, which it would copy again.
  const Tensor a_read = !need_b  ? Tensor()
                        : folded ? a.detach()
                                 : backward_operand(a, args.a, batch);
  const Tensor b_read = !need_a  ? Tensor()
                        : folded ? b.detach()
                                 : backward_operand(b, args.b, batch);
  autograd::record_op("matmul", {a, b}, {out}, [=](const TensorList& g) {
    // Both products read the output's gradient: where the GEMM would have to pack it (a
    // head-split view [B, h, N, d] of a merged gradient), packed once for the two.
    const Tensor grad = need_a && need_b && needs_packing(g[0], batch) ? g[0].contiguous() : g[0];
    // b broadcast over batch dims (shared keys against a batch of queries): those dims summed
    // inside one product where they fold into the rows of a and of the gradient.
    Tensor grad_b;
    if (need_b && !b_folded.empty()) grad_b = folded_grad_b(a_read, grad, batch, b_folded, b_shape);
    if (need_b && !grad_b.defined()) {
      grad_b = sum_to_shape(matmul(a_read.transpose(-1, -2), grad), b_shape);
    }
    return TensorList{
        need_a ? sum_to_shape(matmul(grad, b_read.transpose(-1, -2)), a_shape) : Tensor(), grad_b};
  });
  return out;
}

// True when a [..., M, K] (K contiguous) can be viewed as [B * M, K] without a copy.
bool rows_fold_into_matrix(const Tensor& a) {
  int64_t stride = 0;
  return (a.size(-1) <= 1 || a.stride(-1) == 1) && collapsed_stride(a, a.dim() - 1, stride);
}

std::atomic<bool> g_linear_f32_grads{false};

// a [M, K] @ b [K, N] into a new [M, N] tensor of `dtype` (a's, or f32 for 16-bit a and b), no
// history; with `row_sums`, also a's row sums over K into a new [M] tensor of `dtype`, by the
// same kernel call (a linear layer's bias gradient beside its weight gradient).
Tensor gemm_into(const Tensor& a, const Tensor& b, DType dtype, Tensor* row_sums = nullptr) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  Tensor c = Tensor::empty({m, n}, dtype, a.device());
  GemmArgs args;
  args.a = single_gemm_operand(a);
  args.b = single_gemm_operand(b);
  args.c = Tensor::make_view(c.storage(), {1, m, n}, {m * n, n, 1}, 0, dtype);
  if (row_sums != nullptr) {
    *row_sums = Tensor::empty({m}, dtype, a.device());
    args.a_row_sums = *row_sums;
  }
  SKA_KERNEL(a.device(), gemm)(args);
  MacCounter::add(m * n * k);
  return c;
}

// The sums of g [rows, n]'s columns in f32 (a 16-bit g's not rounded), no history.
Tensor column_sums_f32(const Tensor& g) {
  const Tensor out = Tensor::empty({1, g.size(1)}, DType::kF32, g.device());
  SKA_KERNEL(g.device(), reduce)(ReduceOp::kSum, g, std::vector<int64_t>{0}, out);
  return out.view({g.size(1)});
}

void check_linear_operands(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_same_device_dtype("linear", x, weight);
  detail::check_floating("linear", x);
  detail::check_dim("linear", weight, 2, "weight");
  SKA_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), ShapeError, "linear: input ",
            shape_str(x.shape()), " does not match weight ", shape_str(weight.shape()),
            " (expected last dim ", weight.size(1), ")");
  if (!bias.defined()) return;
  detail::check_same_device_dtype("linear", x, bias);
  SKA_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), ShapeError, "linear: bias ",
            shape_str(bias.shape()), " does not match weight ", shape_str(weight.shape()));
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto cast = autocast_inputs("matmul", {a, b})) return matmul((*cast)[0], (*cast)[1]);
  check_matmul_operands(a, b);
  if (a.dim() == 1 || b.dim() == 1) {  // promote to matrices, then drop the added dims
    const Tensor c = matmul(a.dim() == 1 ? a.unsqueeze(0) : a, b.dim() == 1 ? b.unsqueeze(1) : b);
    const Tensor without_n = b.dim() == 1 ? c.squeeze(-1) : c;
    return a.dim() == 1 ? without_n.squeeze(b.dim() == 1 ? -1 : -2) : without_n;
  }
  if (a.dim() > 2 && b.dim() == 2 && a.size(-1) > 0 && rows_fold_into_matrix(a)) {
    // One large GEMM instead of a batch of small ones; also gives weight-style backward for b.
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(b.size(1));
    return matmul_batched(a.reshape({-1, a.size(-1)}), b).reshape(out_shape);
  }
  return matmul_batched(a, b);
}

void set_linear_f32_grads(bool enabled) { g_linear_f32_grads = enabled; }
bool linear_f32_grads_enabled() { return g_linear_f32_grads; }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  // Under autocast with train.linear_grads: f32, an f32 weight and bias are read through their
  // casts but recorded as they are: the backward writes their gradients in f32 itself.
  const AutocastState autocast = autocast_state();
  const bool f32_grads = g_linear_f32_grads && autocast.enabled && weight.dtype() == DType::kF32 &&
                         (!bias.defined() || bias.dtype() == DType::kF32) &&
                         x.dtype() != DType::kF64;
  if (!f32_grads) {
    if (auto cast = autocast_inputs("linear", {x, weight, bias})) {
      return linear((*cast)[0], (*cast)[1], (*cast)[2]);
    }
  }
  const Tensor xc =
      f32_grads && x.is_floating() && x.dtype() != autocast.dtype ? x.to(autocast.dtype) : x;
  const Tensor w = f32_grads ? autocast_value(weight, autocast.dtype) : weight.detach();
  const Tensor b = !bias.defined() ? Tensor()
                   : f32_grads     ? autocast_value(bias, autocast.dtype)
                                   : bias.detach();
  check_linear_operands(xc, w, b);
  const int64_t in = w.size(1), out_features = w.size(0);
  Shape out_shape(xc.shape().begin(), xc.shape().end() - 1);
  const int64_t rows = shape_numel(out_shape);
  out_shape.push_back(out_features);
  const Tensor x2 = xc.detach().reshape({rows, in});
  Tensor y = Tensor::empty(out_shape, xc.dtype(), xc.device());
  GemmArgs args;
  args.a = single_gemm_operand(x2);
  args.b = single_gemm_operand(w.transpose(0, 1));
  args.c = Tensor::make_view(y.storage(), {1, rows, out_features},
                             {rows * out_features, out_features, 1}, 0, y.dtype());
  if (b.defined()) args.bias = b.contiguous();
  SKA_KERNEL(xc.device(), gemm)(args);
  MacCounter::add(rows * out_features * in);
  const bool need_x = xc.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  if (f32_grads) {
    const Shape x_shape = xc.shape();
    const Tensor x_saved = need_w ? x2 : Tensor();  // only the weight's gradient reads it
    const Tensor w_saved = need_x ? w : Tensor();   // only the input's
    autograd::record_op("linear", {xc, weight, bias}, {y}, [=](const TensorList& g) {
      const Tensor g2 = g[0].reshape({rows, out_features});
      const Tensor gx = need_x ? matmul(g2, w_saved).reshape(x_shape) : Tensor();
      // Both parameters' gradients from one kernel call where both are wanted: the bias's is
      // the row sums of the weight-gradient product's first operand, g2^T.
      Tensor gb;
      const Tensor gw =
          need_w ? gemm_into(g2.transpose(0, 1), x_saved, DType::kF32, need_b ? &gb : nullptr)
                 : Tensor();
      if (need_b && !need_w) gb = column_sums_f32(g2);
      return TensorList{gx, gw, gb};
    });
    return y;
  }
  autograd::record_op("linear", {x, weight, bias}, {y}, [=](const TensorList& g) {
    const Tensor g2 = g[0].reshape({rows, out_features});
    return TensorList{need_x ? matmul(g2, weight).reshape(x.shape()) : Tensor(),
                      need_w ? matmul(g2.transpose(0, 1), x.reshape({rows, in})) : Tensor(),
                      need_b ? sum(g2, {0}) : Tensor()};
  });
  return y;
}

}  // namespace ska
