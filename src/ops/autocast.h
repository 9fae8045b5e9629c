// Automatic mixed precision, as torch.autocast: while an AutocastGuard is active on a thread, ops
// cast their floating inputs by a per-op policy kept in one table (autocast.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>

#include "core/tensor.h"

namespace ska {

enum class AutocastPolicy {
  kLowerPrecision,  // GEMM-type ops: f32/bf16/f16 inputs cast to the autocast dtype
  kFloat32,         // precision-sensitive ops: bf16/f16 inputs cast to f32
  kPromote,         // element-wise ops of several tensors: all cast to the widest input dtype
  kPromoteInOp,     // binary arithmetic and comparisons: as kPromote, except that f32 with
                    // bf16/f16 is left to the op, which reads each in its own dtype (no copy)
};

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::kBF16;  // kBF16 or kF16
};

// This thread's state (each thread starts disabled). The backward pass runs with autocast off.
AutocastState autocast_state();

// Enables (or, with enabled = false, disables) autocast for a scope and restores the previous
// state when it ends; guards nest. ValueError for a dtype other than bf16 / f16.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState saved_;
};

// The policy of op `op` (its name in error messages: "linear", "softmax", "add", ...), or nullopt
// for ops that run in their inputs' dtype (views, activations, scalar ops, amax, ...).
std::optional<AutocastPolicy> autocast_policy(const char* op);

// The inputs op `op` runs on under this thread's autocast state: floating inputs cast with
// Tensor::to (differentiable: the gradient is cast back) as the op's policy says. f64 inputs are
// never cast, and an op with an f64 input runs as called; integer and undefined inputs pass
// through. nullopt when autocast is off or nothing needs a cast, so an op re-enters itself with
// the result at most once:
//   if (auto cast = autocast_inputs("linear", {x, w, b})) return linear((*cast)[0], ...);
std::optional<TensorList> autocast_inputs(const char* op, const TensorList& inputs);

// t cast to `dtype` without history: the step's cast of t where an AutocastParamCasts made one
// (counted as a use), else a new one. For an op that records the f32 tensor itself and casts
// its gradient in its own backward (linear with train.linear_grads: f32).
Tensor autocast_value(const Tensor& t, DType dtype);

// A step's casts of the parameters, made up front (`train.weight_casts: per_step`): casts every
// f32 tensor of `params` to this thread's autocast dtype with one multi_cast call per device (a
// launch per 32 tensors on CUDA, instead of one per tensor and use), and while it lives on this
// thread, autocast_inputs hands an op that would cast one of them a view of its cast. Each use
// records its own cast node (the gradient cast back to f32, as Tensor::to records), so the values,
// the gradients and the graph are those of the casts made per use. Parameters the step does not
// cast are cast for nothing (f32 parameters of norms, which autocast runs in f32, are few and
// small). Requires autocast to be on; scopes nest (the inner one alone is consulted) and end in
// the reverse order, on the thread that made them.
class AutocastParamCasts {
 public:
  explicit AutocastParamCasts(const TensorList& params);
  ~AutocastParamCasts();
  AutocastParamCasts(const AutocastParamCasts&) = delete;
  AutocastParamCasts& operator=(const AutocastParamCasts&) = delete;

  DType dtype() const { return dtype_; }
  size_t size() const { return casts_.size(); }
  // A new view of the cast of `t` with its cast node recorded, or undefined when `t` is not one
  // of the tensors cast here (a view of a parameter is not).
  Tensor use(const Tensor& t) const;
  // The cast of `t` itself, no history (counted as a use); undefined when there is none.
  Tensor value(const Tensor& t) const;
  // How many times use() or value() served a cast.
  int64_t uses() const { return uses_; }

 private:
  struct Cast {
    Tensor source;  // held, so that its address names it for as long as the entry lives
    Tensor cast;
  };
  DType dtype_;
  std::unordered_map<const TensorImpl*, Cast> casts_;
  const AutocastParamCasts* saved_;
  mutable int64_t uses_ = 0;
};

}  // namespace ska
