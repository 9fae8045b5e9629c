// Spatial-Reduction Attention (PVT): queries from every token; keys and values from the grid
// downsampled by a strided Conv2d + LayerNorm, so attention costs N * N / sr^2.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "nn/layers.h"
#include "nn/mixers/mixer.h"

namespace ska::nn {

struct SraOptions {
  int64_t dim = 0;  // C
  TokenGrid grid;
  int64_t heads = 1;
  int64_t head_dim = 0;  // A = heads * head_dim
  int64_t sr = 1;        // reduction ratio: kernel and stride of the conv; 1 = plain MHSA
  bool qkv_bias = true;
  Init init = Init::kTorchDefault;
};

// x [B, N, C] (class token first when the grid has one) -> [B, N, C]. Parameters as PVT's:
// q Linear(C, A), kv Linear(C, 2A), sr Conv2d(C, C, sr, stride sr) + norm LayerNorm(C, 1e-5)
// when sr > 1, proj Linear(A, C). A class token skips the reduction and stays a key/value.
class Sra : public Module {
 public:
  explicit Sra(const SraOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "SRA"; }

 private:
  Tensor reduce_context(const Tensor& x);

  SraOptions options_;
  std::shared_ptr<Linear> q_, kv_, proj_;
  std::shared_ptr<Conv2d> sr_;
  std::shared_ptr<LayerNorm> norm_;
};

}  // namespace ska::nn
