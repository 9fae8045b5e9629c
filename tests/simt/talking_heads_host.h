// CaiT's talking-heads softmax kernels (cuda/kernels/talking_heads.cu) on host memory, run by
// tests/simt (tests/simt/talking_heads_host.cpp builds the kernel file for the host), launched as
// talking_heads_softmax_forward / _backward launch them: logits [R, h, Nq, Nk] contiguous (T:
// f32, bf16 or f16), the mixes w_pre / w_post [h, h] f32, lse [R, h, Nq] f32. The backward pass
// writes grad_logits and, where not null, grad_pre and grad_post.
#pragma once

#include <cstdint>

#include "backend/talking_heads_geometry.h"

namespace ska::simt::talking_heads {

template <typename T>
void forward(const TalkingHeadsGeometry& geo, const T* logits, float scale, const float* w_pre,
             const float* w_post, T* out, float* lse);

template <typename T>
void backward(const TalkingHeadsGeometry& geo, const T* grad_out, const T* logits, float scale,
              const float* w_pre, const float* w_post, const float* lse, T* grad_logits,
              float* grad_pre, float* grad_post);

}  // namespace ska::simt::talking_heads
