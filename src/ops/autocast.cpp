// The autocast policy table and the input casts (see autocast.h). The table follows PyTorch's
// CUDA autocast lists for the ops this library has.
#include "ops/autocast.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"

namespace ska {

namespace {

thread_local AutocastState current_state;
thread_local const AutocastParamCasts* current_casts = nullptr;

struct PolicyEntry {
  const char* op;
  AutocastPolicy policy;
};

// The one place that says which op runs in which precision.
constexpr PolicyEntry kPolicyTable[] = {
    // Tensor-core work: the autocast dtype.
    {"linear", AutocastPolicy::kLowerPrecision},
    {"matmul", AutocastPolicy::kLowerPrecision},
    {"conv2d", AutocastPolicy::kLowerPrecision},
    {"conv_logits", AutocastPolicy::kLowerPrecision},
    {"scaled_dot_attention", AutocastPolicy::kLowerPrecision},
    {"qkv_attention", AutocastPolicy::kLowerPrecision},
    // Large reductions, exponentials and statistics: f32. (batch_norm is not here: as in
    // torch.autocast it runs in its input's dtype, with f32 parameters and statistics.)
    {"softmax", AutocastPolicy::kFloat32},
    {"log_softmax", AutocastPolicy::kFloat32},
    {"layer_norm", AutocastPolicy::kFloat32},
    {"cross_entropy", AutocastPolicy::kFloat32},
    {"sum", AutocastPolicy::kFloat32},
    {"mean", AutocastPolicy::kFloat32},
    {"exp", AutocastPolicy::kFloat32},
    {"log", AutocastPolicy::kFloat32},
    {"pow", AutocastPolicy::kFloat32},
    {"reciprocal", AutocastPolicy::kFloat32},
    {"rsqrt", AutocastPolicy::kFloat32},
    // Several tensor operands: the widest dtype among them (the binary ops read f32 with a
    // 16-bit operand themselves, so the residual x + f(x) makes no f32 copy of f(x)).
    {"add", AutocastPolicy::kPromoteInOp},
    {"sub", AutocastPolicy::kPromoteInOp},
    {"mul", AutocastPolicy::kPromoteInOp},
    {"div", AutocastPolicy::kPromoteInOp},
    {"maximum", AutocastPolicy::kPromoteInOp},
    {"minimum", AutocastPolicy::kPromoteInOp},
    {"eq", AutocastPolicy::kPromoteInOp},
    {"ne", AutocastPolicy::kPromoteInOp},
    {"lt", AutocastPolicy::kPromoteInOp},
    {"le", AutocastPolicy::kPromoteInOp},
    {"gt", AutocastPolicy::kPromoteInOp},
    {"ge", AutocastPolicy::kPromoteInOp},
    {"where", AutocastPolicy::kPromote},
    {"cat", AutocastPolicy::kPromote},
};

bool is_16bit(DType dt) { return dt == DType::kBF16 || dt == DType::kF16; }

// t in `target` for an op: the step's cast of a parameter where there is one, else Tensor::to.
Tensor cast_for_op(const Tensor& t, DType target) {
  if (current_casts != nullptr && target == current_casts->dtype()) {
    if (Tensor cast = current_casts->use(t); cast.defined()) return cast;
  }
  return t.to(target);
}

// Rank for promotion: f64 > f32 > the 16-bit floats; bf16 with f16 gives f32 (as PyTorch).
DType promoted(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::kF64 || b == DType::kF64) return DType::kF64;
  return DType::kF32;
}

}  // namespace

AutocastState autocast_state() { return current_state; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : saved_(current_state) {
  SKA_CHECK(!enabled || is_16bit(dtype), ValueError, "autocast: dtype must be bf16 or f16, got ",
            dtype_name(dtype));
  current_state.enabled = enabled;
  if (enabled) current_state.dtype = dtype;
}

AutocastGuard::~AutocastGuard() { current_state = saved_; }

std::optional<AutocastPolicy> autocast_policy(const char* op) {
  for (const PolicyEntry& e : kPolicyTable) {
    if (std::strcmp(e.op, op) == 0) return e.policy;
  }
  return std::nullopt;
}

std::optional<TensorList> autocast_inputs(const char* op, const TensorList& inputs) {
  if (!current_state.enabled) return std::nullopt;
  const std::optional<AutocastPolicy> policy = autocast_policy(op);
  if (!policy) return std::nullopt;
  const bool promotes = *policy == AutocastPolicy::kPromote ||
                        *policy == AutocastPolicy::kPromoteInOp;
  bool any_floating = false;
  DType widest = DType::kBF16;
  int narrow_kinds = 0;  // how many of bf16 and f16 occur
  for (const Tensor& t : inputs) {
    if (!t.defined() || !t.is_floating()) continue;
    if (t.dtype() == DType::kF64 && !promotes) return std::nullopt;
    widest = any_floating ? promoted(widest, t.dtype()) : t.dtype();
    any_floating = true;
  }
  if (!any_floating) return std::nullopt;
  for (DType d : {DType::kBF16, DType::kF16}) {
    for (const Tensor& t : inputs) {
      if (t.defined() && t.dtype() == d) {
        ++narrow_kinds;
        break;
      }
    }
  }
  // f32 with one 16-bit dtype: the op reads both as they are.
  if (*policy == AutocastPolicy::kPromoteInOp && widest == DType::kF32 && narrow_kinds == 1) {
    return std::nullopt;
  }
  TensorList cast = inputs;
  bool changed = false;
  for (Tensor& t : cast) {
    if (!t.defined() || !t.is_floating()) continue;
    DType target = t.dtype();
    switch (*policy) {
      case AutocastPolicy::kLowerPrecision:
        target = current_state.dtype;
        break;
      case AutocastPolicy::kFloat32:
        target = is_16bit(t.dtype()) ? DType::kF32 : t.dtype();
        break;
      case AutocastPolicy::kPromote:
      case AutocastPolicy::kPromoteInOp:
        target = widest;
        break;
    }
    if (target == t.dtype()) continue;
    t = cast_for_op(t, target);
    changed = true;
  }
  if (!changed) return std::nullopt;
  return cast;
}

AutocastParamCasts::AutocastParamCasts(const TensorList& params)
    : dtype_(current_state.dtype), saved_(current_casts) {
  SKA_CHECK(current_state.enabled, ValueError,
            "AutocastParamCasts: autocast is off on this thread; the casts would never be used");
  // The f32 tensors, each once, grouped by device: one multi_cast call per device.
  std::vector<std::pair<Device, TensorList>> by_device;
  for (const Tensor& p : params) {
    if (!p.defined() || p.dtype() != DType::kF32 || p.numel() == 0 ||
        !casts_.emplace(p.impl_ptr().get(), Cast{p, Tensor()}).second) {
      continue;
    }
    auto group = std::find_if(by_device.begin(), by_device.end(),
                              [&](const auto& g) { return g.first == p.device(); });
    if (group == by_device.end()) group = by_device.insert(by_device.end(), {p.device(), {}});
    group->second.push_back(p);
  }
  // Each cast in an allocation of its own, freed when the last node reading it has run its
  // backward, as a cast made per use is (one buffer would live until the first layer's).
  for (auto& [device, sources] : by_device) {
    TensorList src, dst;
    for (const Tensor& p : sources) {
      const Tensor cast = Tensor::empty(p.shape(), dtype_, device);
      casts_[p.impl_ptr().get()].cast = cast;
      src.push_back(p.detach().contiguous());
      dst.push_back(cast);
    }
    SKA_KERNEL(device, multi_cast)(src, dst);
  }
  current_casts = this;
}

AutocastParamCasts::~AutocastParamCasts() {
  assert(current_casts == this && "AutocastParamCasts scopes end in the reverse order");
  current_casts = saved_;
}

Tensor AutocastParamCasts::value(const Tensor& t) const {
  const auto it = casts_.find(t.impl_ptr().get());
  if (it == casts_.end()) return Tensor();
  ++uses_;
  return it->second.cast;
}

Tensor AutocastParamCasts::use(const Tensor& t) const {
  const Tensor c = value(t);
  if (!c.defined()) return c;
  const Tensor out = Tensor::make_view(c.storage(), c.shape(), c.strides(), c.offset(), c.dtype());
  autograd::record_op("to", {t}, {out}, [dev = t.device(), dt = t.dtype()](const TensorList& g) {
    return TensorList{g[0].to(dev, dt)};
  });
  return out;
}

Tensor autocast_value(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t.detach();
  if (current_casts != nullptr && dtype == current_casts->dtype()) {
    if (Tensor cast = current_casts->value(t); cast.defined()) return cast;
  }
  return t.detach().to(dtype);
}

}  // namespace ska
