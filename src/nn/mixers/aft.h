// Attention Free Transformer token mixers (Zhai et al. 2021, eqs. 2-8): aft_full, aft_simple,
// aft_local, aft_conv. Y_t = sigmoid(Q_t) * sum exp(K_t' + w_tt') V_t' / sum exp(K_t' + w_tt').
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nn/layers.h"
#include "nn/mixers/mixer.h"

namespace ska::nn {

enum class AftKind {
  kFull,    // w = u v^T over all token pairs (eq. 7)
  kSimple,  // w = 0 (eq. 5)
  kLocal,   // w = u v^T inside a 2-D window of the grid, 0 outside (eq. 4)
  kConv,    // per-head 2-D kernels over the grid, reparameterised (eqs. 6, 8)
};

struct AftOptions {
  AftKind kind = AftKind::kFull;
  int64_t dim = 0;           // C
  TokenGrid grid;            // sizes the position tables (full, local) and the conv grid
  int64_t factor_dim = 128;  // d' of w = u v^T (full, local)
  int64_t window = 4;        // local: w kept where |row - row'| < s and |col - col'| < s
  int64_t heads = 1;         // conv: K has one channel per head (paper: dim(K) tied to heads)
  int64_t kernel = 7;        // conv: odd kernel size of the per-head position biases
  bool qkv_bias = true;
  Init init = Init::kTorchDefault;
};

// x [B, N, C] with N = grid.tokens() (class token first when present) -> [B, N, C].
// Q, K, V are Linear(C, C) (K: Linear(C, heads) for conv) and `proj` is an output Linear(C, C),
// the paper's "output dimension matches the input" projection as in its reference blocks.
class Aft : public Module {
 public:
  explicit Aft(const AftOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override;

  // The position biases w [T, T] of full / local (0 outside the window for local).
  Tensor pair_biases() const;
  // The reparameterised per-head kernels w [h, k, k] of conv (eq. 8).
  Tensor conv_kernels() const;

 private:
  Tensor mix_with_pair_biases(const Tensor& k, const Tensor& v) const;
  Tensor mix_simple(const Tensor& k, const Tensor& v) const;
  Tensor mix_conv(const Tensor& k, const Tensor& v) const;
  Tensor outside_window_mask(Device device) const;

  AftOptions options_;
  std::shared_ptr<Linear> to_q_, to_k_, to_v_, proj_;
  Tensor pos_u_, pos_v_;                      // full, local: [T, d']
  Tensor pos_kernel_, pos_gain_, pos_shift_;  // conv: [h, k, k], gamma [h], beta [h]
};

}  // namespace ska::nn
