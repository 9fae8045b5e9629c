// CPU kernel: residual sums with per-channel scales, out = x * xs + y * ys. The reference the CUDA
// kernel is tested against, composed of the CPU's own binary, copy and reduce kernels exactly as
// mul, mul and add (and their backward passes) call them, so that the fused op gives the unfused
// ops' bits here, the scales' gradients included.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/dropout_checks.h"

namespace ska::cpu {

namespace {

// The [C] scale seen with t's shape (stride 0 but in the last dim), as mul broadcasts it.
Tensor broadcast_scale(const Tensor& scale, const Tensor& t) {
  Shape strides(t.shape().size(), 0);
  strides.back() = scale.stride(0);
  return Tensor::make_view(scale.storage(), t.shape(), strides, scale.offset(), scale.dtype());
}

// t * scale in `dtype` (contiguous), or t itself without a scale.
Tensor scaled(const Tensor& t, const Tensor& scale, DType dtype) {
  if (!scale.defined()) return t;
  Tensor out = Tensor::empty(t.shape(), dtype, t.device());
  binary(BinaryOp::kMul, t, broadcast_scale(scale, t), out);
  return out;
}

// y * yk (drop path's per-sample factors, broadcast over every dim but the first) in y's dtype,
// or y itself without factors.
Tensor kept(const Tensor& y, const Tensor& yk) {
  if (!yk.defined()) return y;
  Shape strides(y.shape().size(), 0);
  strides[0] = yk.stride(0);
  const Tensor factors =
      Tensor::make_view(yk.storage(), y.shape(), strides, yk.offset(), yk.dtype());
  Tensor out = Tensor::empty(y.shape(), y.dtype(), y.device());
  binary(BinaryOp::kMul, y, factors, out);
  return out;
}

// dst = src rounded to dst's dtype; nothing when they are one tensor.
void write(const Tensor& src, const Tensor& dst) {
  if (dst.defined() && !src.same_storage(dst)) copy(src, dst);
}

// The sum over every dim but the last of g * t (products rounded to g's dtype, as mul writes
// them), into `out` [C], as sum_to_shape reduces a broadcast gradient.
void scale_grad(const Tensor& g, const Tensor& t, const Tensor& out) {
  if (!out.defined()) return;
  Tensor product = Tensor::empty(g.shape(), g.dtype(), g.device());
  binary(BinaryOp::kMul, g, t, product);
  std::vector<int64_t> dims;
  Shape kept(g.shape().size(), 1);
  for (int64_t d = 0; d + 1 < g.dim(); ++d) dims.push_back(d);
  kept.back() = g.size(-1);
  Tensor sum = Tensor::empty(kept, g.dtype(), g.device());
  if (dims.empty()) {
    copy(product, sum);
  } else {
    reduce(ReduceOp::kSum, product, dims, sum);
  }
  copy(sum.reshape({g.size(-1)}), out);
}

// y through drop's mask (dropout_backward computes what dropout_forward wrote, from the bits).
Tensor dropped(const Tensor& y, const DropoutDraw& drop) {
  if (!drop.active() || !y.defined()) return y;
  Tensor out = Tensor::empty(y.shape(), y.dtype(), y.device());
  dropout_backward(y.contiguous(), drop.bits, drop.scale, out);
  return out;
}

}  // namespace

void scaled_residual_forward(const Tensor& x, const Tensor& xs, const Tensor& y, const Tensor& ys,
                             const Tensor& yk, const DropoutDraw& drop, const Tensor& out) {
  Tensor branch = y;
  if (drop.active()) {
    check_dropout_draw("scaled_residual_forward", drop, y);
    branch = Tensor::empty(y.shape(), y.dtype(), y.device());
    dropout_forward(y.contiguous(), drop.seed, drop.offset, drop.keep_prob, drop.scale,
                    drop.offset_base, branch, drop.bits);
  }
  binary(BinaryOp::kAdd, scaled(x, xs, out.dtype()), scaled(kept(branch, yk), ys, out.dtype()),
         out);
}

void scaled_residual_backward(const Tensor& g, const Tensor& x, const Tensor& xs, const Tensor& y,
                              const Tensor& ys, const Tensor& yk, const DropoutDraw& drop,
                              const Tensor& gx, const Tensor& gy, const Tensor& gxs,
                              const Tensor& gys) {
  if (drop.active()) check_dropout_draw("scaled_residual_backward", drop, g);
  if (gx.defined()) write(scaled(g, xs, g.dtype()), gx);
  if (gy.defined()) {
    // The gradient reaching the dropped branch (drop path's output, in y's dtype), then its mul's,
    // then dropout's.
    const Tensor reaching = Tensor::empty(gy.shape(), gy.dtype(), gy.device());
    if (yk.defined()) {
      const Tensor before_keep = Tensor::empty(gy.shape(), gy.dtype(), gy.device());
      copy(scaled(g, ys, g.dtype()), before_keep);
      write(kept(before_keep, yk), reaching);
    } else {
      write(scaled(g, ys, g.dtype()), reaching);
    }
    if (drop.active()) {
      dropout_backward(reaching, drop.bits, drop.scale, gy);
    } else {
      write(reaching, gy);
    }
  }
  scale_grad(g, x, gxs);
  if (gys.defined()) scale_grad(g, kept(dropped(y, drop), yk), gys);
}

}  // namespace ska::cpu
