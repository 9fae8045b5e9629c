// Automatic mixed precision, as torch.autocast: while an AutocastGuard is active on a thread, ops
// cast their floating inputs by a per-op policy kept in one table (autocast.cpp).
#pragma once

#include <optional>

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

}  // namespace ska
