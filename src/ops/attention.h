// Fused scaled dot-product attention, as torch's F.scaled_dot_product_attention with an additive
// mask: softmax(scale * q k^T + bias) v in one op whose weights are never stored (the backward
// pass recomputes them from each row's log-sum-exp).
#pragma once

#include "backend/kernel_types.h"
#include "core/tensor.h"

namespace ska {

// q [..., Nq, d], k [..., Nk, d], v [..., Nk, dv] -> [..., Nq, dv]. The leading dims of k, v and
// bias broadcast (right-aligned) to q's, which the output keeps: static keys [h, Nk, d] serve a
// batch of queries [B, h, Nq, d]. bias: undefined, or broadcast to [..., Nq, Nk] and added after
// scaling; -inf excludes a pair (a row with every pair excluded gives NaN, as softmax does).
// Gradients reach q, k, v and bias. 3 to 6 dims. Under autocast a GEMM-type op (lower
// precision); the math inside runs in f32. The output is laid out in memory like q, so that
// merging heads after splitting them is a view. MACs counted: Nq * Nk * (d + dv) per leading
// index, the two products of the unfused form. scale_factor: undefined, or a one-element tensor
// (f32; f64 for f64 q) multiplying scale, read on the device and differentiable: a learnable
// temperature (exp of LSA's parameter) without scaling q in a separate op. It must not be zero
// (its gradient is sum(dL/dq * q) / scale_factor); autocast leaves it in f32. bias_factor
// likewise multiplies the bias (a bias is then required), gradient sum(dL/dbias * bias) / factor.
// The head dim may be 0 (q [..., Nq, 0], k [..., Nk, 0]): no q k^T term (softmax_attend).
// mask: pairs excluded without a bias to read (AttentionMask::kDiagonal: query i and key i, as
// an -inf bias there would; their logits' gradient is 0). The bias's gradient is laid out like
// the bias where that is a dense (possibly permuted) tensor, so that it flows back through the
// permutation without a copy.
Tensor scaled_dot_attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                            const Tensor& bias = Tensor(), const Tensor& scale_factor = Tensor(),
                            const Tensor& bias_factor = Tensor(),
                            AttentionMask mask = AttentionMask::kNone);

// Self-attention from one packed projection, as a ViT block forms it: qkv [B, N, 3 * h * d] holds
// q, k and v side by side, each h heads of d (Linear(dim, 3 * h * d) writes them so), and the
// result is scaled_dot_attention(q, k, v, scale, bias, scale_factor) on the head-split parts,
// [B, h, N, d] laid out as [B, N, h, d] (merge_heads is a view). Its backward pass writes
// dL/dqkv in qkv's own layout, as the unpacked form does on split_heads(qkv, {w, w, w}, heads)'s
// pieces (gradient destinations, autograd/node.h); on other views of qkv (chunk, then a head
// split) that form writes three gradients and copies them into one. bias broadcasts to
// [B, h, N, N]. Under autocast a GEMM-type op.
Tensor qkv_attention(const Tensor& qkv, int64_t heads, double scale, const Tensor& bias = Tensor(),
                     const Tensor& scale_factor = Tensor(),
                     AttentionMask mask = AttentionMask::kNone);

// softmax(factor * logits) v, the weights never stored: attention from logits formed otherwise
// (CSKA's convolution), with the fused op's kernels (a head dim of 0, the logits as the bias).
// logits [..., Nq, Nk] (may hold -inf), v [..., Nk, dv] broadcasting over the leading dims;
// factor: undefined or a one-element tensor (a learnable temperature), differentiable. mask as
// scaled_dot_attention's (the excluded logits are not read, and their gradient is 0).
Tensor softmax_attend(const Tensor& logits, const Tensor& v, const Tensor& factor = Tensor(),
                      AttentionMask mask = AttentionMask::kNone);

// CaiT's talking-heads attention weights, mix(softmax(mix(scale * logits, w_pre)), w_post), with
// mix(x, w)[g'] = sum_g w[g, g'] x[g] over the heads (dim 1) of logits [R, h, Nq, Nk] (what
// nn::mix_heads gives), in one kernel each way: the scaled and mixed logits and the softmax are
// computed in f32 (f64 for f64 logits) and never stored (the backward pass recomputes them from
// the logits and each row's log-sum-exp); the weights come back in the logits' dtype.
// Differentiable in logits, w_pre and w_post ([h, h]; cast to f32, f64 for f64 logits). The two
// mixes count as the matmuls they replace (MacCounter). On CUDA up to 8 heads and 128 keys
// (talking_heads_softmax_fits).
Tensor talking_heads_softmax(const Tensor& logits, double scale, const Tensor& w_pre,
                             const Tensor& w_post);
// Whether talking_heads_softmax takes these logits ([R, h, Nq, Nk]) on their device.
bool talking_heads_softmax_fits(const Tensor& logits);

}  // namespace ska
