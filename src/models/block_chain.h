// Pre-norm residual blocks run as a chain whose residual adds are fused with the norms after
// them: each block's last add with the next block's first norm (nn::LayerNorm::forward_residual,
// add_layer_norm), where the blocks run one by one otherwise. The same values either way.
#pragma once

#include <vector>

#include "nn/layers.h"
#include "nn/module.h"

namespace ska::models {

// A block `x -> ... -> x' + branch` whose first op is first_norm()(x). Its forward is the chain of
// one: forward_chained({x, first_norm()(x)}, nullptr).
class ChainedBlock : public nn::Module {
 public:
  Tensor forward(const Tensor& x) override;
  virtual nn::LayerNorm& first_norm() = 0;
  // The block on in.sum = x with in.normed = first_norm()(x) already computed: its output and
  // next's first norm of it (one op), or, without a next block, the output alone (normed
  // undefined).
  virtual ResidualNorm forward_chained(const ResidualNorm& in, ChainedBlock* next) = 0;
};

// Runs `blocks` (every one a ChainedBlock) on x: as a chain where nn::fused_residual_norm_enabled()
// (and no model summary records the modules one by one), else through blocks' own forward.
Tensor run_block_chain(nn::Sequential& blocks, const Tensor& x);
// The same for blocks listed in the order they run (CaiT's layers that layer dropout keeps).
Tensor run_block_chain(const std::vector<ChainedBlock*>& blocks, const Tensor& x);

}  // namespace ska::models
