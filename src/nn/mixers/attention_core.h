// The attention core every attention mixer and family is built from: the three logit builders
// (q k^T, static keys, conv logits) and attend(), which normalises logits and applies them to v.
//
// The common shape of the computation, in every family (ViT, CaiT, Swin, CvT, MetaFormer):
//
//   q, v      the mixer's projections of the tokens, split into heads: [..., h, Nq, d] and
//             [..., h, Nk, d]
//   logits    [..., h, Nq, Nk] from one builder:
//               dot_logits(q, k)           k projected from the tokens        (mhsa, lsa, sra)
//               static_key_logits(q, K)    K a parameter [h, Nk, d]            (ska)
//               conv_logits(q, conv, H, W) a grouped 3x3 conv over the queries
//                                          laid out as an image: no k at all    (cska)
//   weights   attention_weights(logits, spec):
//               scale (fixed, or exp(temperature))  -> + bias (relative position bias, shift
//               masks) -> talking heads (pre) -> boolean mask (diagonal) -> normalise (softmax, or
//               gelu / relu / starrelu without normalisation) -> dropout -> talking heads (post)
//   out       attend(logits, v, spec) = weights @ v, [..., h, Nq, d]; the mixer merges the heads
//             and projects.
//
// What differs between families is only the layout, which they supply around these calls: the
// leading dims (batch, or batch and windows in Swin), a class token (CSKA's class row from static
// keys, CvT's class column), class attention (one query row), strided keys and values (CvT), keys
// on a finer grid whose values repeat (SKA-CaiT), and the parameter names. Where the logits are
// q k^T (mhsa, ska: every family but the cska mixers), attend_qk() runs the fused attention op
// (ops/attention.h), which never stores the weights; cska's conv logits go through attend().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"

namespace ska::nn {

// The attention mixers every family can host, named by how their logits are formed: mhsa (q k^T
// with projected keys), ska (static keys), cska (a conv over the queries).
enum class AttentionKind { kMhsa, kSka, kCska };
const std::vector<std::string>& attention_kind_names();  // mhsa, ska, cska
AttentionKind attention_kind(const std::string& name);   // ValueError listing the known names
const std::string& attention_kind_name(AttentionKind kind);

// [B, N, h*d] -> [B, h, N, d] (channels grouped by head, as '(h d)').
Tensor split_heads(const Tensor& x, int64_t heads);
// x [B, N, w_0 + w_1 + ...] (a stacked projection: q and k, v say) -> the heads of each piece,
// [B, h, N, w_i / h] views of x: split then split_heads, as one autograd node whose backward
// copies each piece's gradient, in whatever layout it comes, into its columns of one gradient
// laid out as x (split then split_heads would copy a gradient not laid out token-major to
// undo the head split, then again to join the pieces).
TensorList split_heads(const Tensor& x, const std::vector<int64_t>& widths, int64_t heads);
// [B, h, N, d] -> [B, N, h*d].
Tensor merge_heads(const Tensor& x);

// q [..., Nq, d], k [..., Nk, d] (leading dims broadcast) -> logits [..., Nq, Nk].
Tensor dot_logits(const Tensor& q, const Tensor& k);
// q [B, h, Nq, d] against static keys [h, Nk, d] (shared by the batch) -> [B, h, Nq, Nk].
Tensor static_key_logits(const Tensor& q, const Tensor& keys);
// q [B, h, H*W, d] (row-major positions) laid out as an image [B, h*d, H, W] with channels grouped
// by head -> conv -> [B, h*K, H, W]; output channel head * K + key at a position is that query's
// logit over the key -> [B, h, H*W, K].
// Computed as `conv` runs it, or (ConvLogitsForm::kGemm) as one matrix product per head over the
// queries' neighbourhoods: the same numbers up to the order of the sums.
// `place`, where given, is where the caller wants the logits (a view of the rows of the tensor
// it puts together by cat(pieces, dim, out): that shape, the dtype the logits come in (q's, or
// autocast's for f32 q), a unit last-dim stride); the direct form writes them there and returns
// it, the others return a tensor of their own.
Tensor conv_logits(const Tensor& q, Conv2d& conv, int64_t height, int64_t width,
                   const Tensor& place = Tensor());
// How conv_logits computes (`train.conv_logits`, `benchmark --conv-logits`): kConv through the
// convolution (cuDNN on CUDA); kGemm as im2col + batched GEMM (cuBLAS on CUDA), which steps
// around cuDNN's slow backward-data kernels for grouped convolutions with many outputs per group;
// kDirect: the grid_conv_logits op (ops/conv.h), on CUDA this project's tensor-core kernels
// (cuda/kernels/conv_logits.cu: no image, no neighbourhood matrix) where they take the call
// (bf16/f16, head dims multiples of 16 up to 128), the convolution elsewhere; on the CPU its
// reference loops. kAuto on CUDA under cudnn_benchmark() (core/precision.h): the first call of
// each shape, dtype and grad mode times the forms (time_conv_logits: the direct one where it
// applies) and keeps the fastest, as cuDNN's timed algorithms; elsewhere (the CPU, cuDNN's
// heuristics, inside a CUDA Graph capture) kConv, so that CPU runs stay bit for bit repeatable.
// A convolution the product does not express (dilated, strided) stays a convolution.
// Process-wide; default kAuto (measured on an H200, 2026-11-28, bf16 training steps:
// CSKAFormer-S18 at batch 128 runs 2.2x faster with the logits as a GEMM than as cuDNN's
// convolution, 1.19x faster than by the direct kernels; CSKA-ViT-S at 512 1.11x faster by the
// direct kernels than as a convolution, 1.4x faster than as a GEMM).
enum class ConvLogitsForm { kConv, kGemm, kAuto, kDirect };
ConvLogitsForm conv_logits_form();
void set_conv_logits_form(ConvLogitsForm form);
// The best of `reps` timed calls (after one warm-up call) of each form of conv_logits(q, conv, H,
// W), in milliseconds with the device synchronised around each call: forward and backward (a
// gradient of ones) when grad mode is on, else forward alone. Runs on detached operands: the
// caller's graph and the parameters' gradients are untouched. ValueError for a convolution the
// product does not express.
struct ConvLogitsTiming {
  double conv_ms, gemm_ms;
  double direct_ms;  // infinity where the direct form does not take the call
};
ConvLogitsTiming time_conv_logits(const Tensor& q, const Conv2d& conv, int64_t height,
                                  int64_t width, int reps = 3);
// What kAuto chose so far in this process, a line per shape ("conv logits [...] -> 784 keys on
// cuda:0 (forward + backward): conv 84.2 ms, gemm 3.1 ms: gemm"), for logs.
std::vector<std::string> conv_logits_auto_choices();
// Sets the form for a scope (tests, benchmarks).
class ConvLogitsFormGuard {
 public:
  explicit ConvLogitsFormGuard(ConvLogitsForm form) : saved_(conv_logits_form()) {
    set_conv_logits_form(form);
  }
  ~ConvLogitsFormGuard() { set_conv_logits_form(saved_); }
  ConvLogitsFormGuard(const ConvLogitsFormGuard&) = delete;
  ConvLogitsFormGuard& operator=(const ConvLogitsFormGuard&) = delete;

 private:
  ConvLogitsForm saved_;
};

// Static keys [h, Nk, d] (or any shape): randn, as in every reference.
Tensor init_static_keys(const Shape& shape);
// The conv of conv_logits: width (h*d) -> heads * keys channels, 3x3, padding 1, groups = heads,
// with bias.
std::shared_ptr<Conv2d> make_conv_logits(int64_t width, int64_t heads, int64_t keys,
                                         Init init = Init::kTorchDefault);

// How logits become weights: softmax over the keys, or (Table 4 ablations) an elementwise
// activation with no normalisation.
enum class Normalise { kSoftmax, kGelu, kRelu, kStarRelu };
const std::vector<std::string>& normalise_names();  // softmax, gelu, relu, starrelu
Normalise normalise_kind(const std::string& name);  // ValueError listing the known names

// The most negative finite value of a floating dtype (torch's -finfo(dtype).max).
double lowest_finite(DType dtype);
// u8 [rows, cols], 1 where row == col: a token may not attend to its own key (LSA). Built once per
// shape and device (nn/constants.h); read-only.
Tensor diagonal_mask(int64_t rows, int64_t cols, Device device);

// Where windowed attention's windows lie (Swin): weights [..., h, windows, w*w, w*w] over a
// grid_h x grid_w token grid rolled by -shift before partitioning. Read only by attention probes
// (attention_probe.h); window 0 means plain attention.
struct AttentionWindows {
  int64_t grid_h = 0, grid_w = 0;
  int64_t window = 0;
  int64_t shift = 0;
};

// Everything between the logits and the weights. Tensors may be undefined (step skipped);
// those that require grad receive gradients.
struct AttentionSpec {
  double scale = 1.0;  // logits * scale
  Tensor temperature;  // [1]: logits * exp(temperature) instead of scale (LSA's learnable tau)
  Tensor bias;         // added after scaling, broadcast to the logits (relative position bias;
                       // -inf entries exclude pairs, as Swin's shift masks)
  bool exclude_diagonal = false;  // query i and key i get weight 0 (LSA's diagonal mask)
  Normalise normalise = Normalise::kSoftmax;
  Tensor starrelu_scale, starrelu_bias;  // kStarRelu: s * relu(x)^2 + b, both [1]
  Tensor heads_pre, heads_post;          // talking heads [h, h] mixing dim -3, before / after
                                         // the normalisation
  Dropout* dropout = nullptr;            // on the weights (attention dropout), if given
  AttentionWindows windows;              // for attention probes only; no effect on the numbers
};

// logits [..., h, Nq, Nk] -> weights of the same shape. An AttentionRecorder alive on this
// thread (attention_probe.h) receives the weights, which are returned unchanged.
Tensor attention_weights(const Tensor& logits, const AttentionSpec& spec);
// attention_weights(logits, spec) @ v: v [..., h, Nk, d] -> [..., h, Nq, d].
Tensor attend(const Tensor& logits, const Tensor& v, const AttentionSpec& spec);
// Whether attend(logits, v, spec) runs the fused op (softmax_attend), which reads the logits in
// the autocast dtype under autocast: a caller assembling them may then round its pieces first.
bool attend_fuses(const Tensor& logits, const Tensor& v, const AttentionSpec& spec);
// attend(dot_logits(q, k), v, spec), through the fused op (ops/attention.h: the weights are never
// stored) when the spec allows it: softmax normalisation, no talking heads, no attention dropout
// in training, no AttentionRecorder on this thread, fused attention enabled, and on CUDA head
// dims up to 128 (the kernels' limit), and two keys or more under a diagonal mask. A learnable
// temperature is then a factor the kernels read on the device, and the diagonal mask the
// kernels' own (AttentionMask::kDiagonal: no bias tensor read for it). k's leading dims
// broadcast to q's (static keys).
Tensor attend_qk(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionSpec& spec);
// attend_qk on the heads of one packed projection qkv [B, N, 3 * heads * d] (q, k, v side by
// side, as Linear(dim, 3 * heads * d) writes them): the same numbers, but where the fused op runs
// it is qkv_attention (ops/attention.h), whose backward pass writes dL/dqkv in place instead of
// copying three head-split gradients into it. -> [B, heads, N, d], laid out for merge_heads.
Tensor attend_qkv(const Tensor& qkv, int64_t heads, const AttentionSpec& spec);
// Whether attend_qk may take the fused op (default true): a process-wide switch for comparisons
// (`benchmark --attention unfused`) and for hunting a numerical difference.
bool fused_attention_enabled();
void set_fused_attention(bool enabled);
// out[.., g, i, j] = sum_h x[.., h, i, j] * mix[h, g]: the talking-heads mix over dim -3.
Tensor mix_heads(const Tensor& x, const Tensor& mix);
// Whether attention_weights computes softmax weights between two talking-heads mixes (CaiT) as
// one op, talking_heads_softmax (ops/attention.h), where it takes the call: no mask, bias or
// temperature, no attention dropout in training, fused attention enabled. Default false until the
// CUDA kernels are timed (`train.talking_heads`, `benchmark --talking-heads`).
bool fused_talking_heads_enabled();
void set_fused_talking_heads(bool enabled);

}  // namespace ska::nn
