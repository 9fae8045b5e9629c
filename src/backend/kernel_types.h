// Enums and parameter structs shared by the op layer and every backend's kernels.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ska {

// Pointwise functions of one tensor. `a` and `b` are the op's scalar parameters.
enum class UnaryOp : uint8_t {
  kNeg,          // -x
  kAbs,          // |x|
  kExp,          // e^x
  kLog,          // ln x
  kSqrt,         // sqrt x
  kRsqrt,        // 1 / sqrt x
  kReciprocal,   // 1 / x
  kSigmoid,      // 1 / (1 + e^-x)
  kTanh,         // tanh x
  kRelu,         // max(x, 0)
  kGelu,         // x * Phi(x), erf form
  kGeluTanh,     // tanh approximation of GELU
  kQuickGelu,    // x * sigmoid(1.702 x)
  kSquaredRelu,  // relu(x)^2
  kSilu,         // x * sigmoid(x)
  kAffine,       // a * x + b (scalar add, sub, mul, div forms)
  kPow,          // x ^ a
};
const char* unary_op_name(UnaryOp op);

// Pointwise functions of two tensors; comparisons write u8 0/1.
enum class BinaryOp : uint8_t {
  kAdd, kSub, kMul, kDiv, kMaximum, kMinimum,
  kEq, kNe, kLt, kLe, kGt, kGe,
};
const char* binary_op_name(BinaryOp op);
inline bool binary_op_is_comparison(BinaryOp op) { return op >= BinaryOp::kEq; }

enum class ReduceOp : uint8_t { kSum, kMean, kMax, kMin };
const char* reduce_op_name(ReduceOp op);

// A dropout of a fused kernel's operand (scaled_residual's y): element i is kept where the Philox
// draw of counter offset + i / 4, word i % 4 (offset_base's value added where it is defined, as
// random_bernoulli takes it) is below keep_prob, exactly as dropout_forward draws, and then scaled
// by `scale` rounded to the operand's dtype; the kept elements are bits (bit i % 8 of byte i / 8),
// written by the forward kernel and read by the backward one. No dropout while bits is undefined.
struct DropoutDraw {
  uint64_t seed = 0, offset = 0;
  double keep_prob = 1.0, scale = 1.0;
  Tensor offset_base;
  Tensor bits;
  bool active() const { return bits.defined(); }
};

// c[b] = alpha * a[b] @ b[b] + beta * c[b] (+ bias on each row).
// a: [B, M, K], b: [B, K, N], c: [B, M, N] contiguous. a and b are views whose last two dims are
// row-major (stride[-1] == 1) or column-major (stride[-2] == 1); a batch stride of 0 broadcasts.
// bias: undefined or a contiguous [N] tensor.
struct GemmArgs {
  Tensor a, b, c, bias;
  float alpha = 1.0f;
  float beta = 0.0f;
  // Optional output: [M] contiguous of c's dtype, the sums of a's rows over k, unscaled (a linear
  // layer's bias gradient beside its weight gradient's product: on CUDA cuBLASLt's BGRADB
  // epilogue, in the same pass over a). One matrix (batch 1) and no bias.
  Tensor a_row_sums;
};

// Pairs the fused attention kernels exclude on top of the bias: weight 0, as a -inf logit would
// give, and a gradient of +0 for the pair's logit. kDiagonal: query i with key i, for i below
// both counts (LSA's and the static-key mixers' diagonal mask).
enum class AttentionMask : uint8_t { kNone, kDiagonal };

// NCHW convolution with weight [C_out, C_in / groups, kH, kW].
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

// The device-resident training augmentation (augment_crop_flip): torchvision RandomCrop(output
// size, padding, fill 0) when padding > 0, RandomHorizontalFlip(flip_p) when flip_p > 0, then per
// channel byte * scale[c] + shift[c]. Draws are keyed by (seed, epoch, dataset index).
struct CropFlipParams {
  static constexpr int kMaxChannels = 4;
  int64_t padding = 0;
  double flip_p = 0.0;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  float scale[kMaxChannels] = {};
  float shift[kMaxChannels] = {};
};

}  // namespace ska
