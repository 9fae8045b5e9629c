// Pre-norm residual blocks as a chain of fused residual adds and norms.
#include "models/block_chain.h"

#include "core/error.h"
#include "nn/summary.h"

namespace ska::models {

Tensor ChainedBlock::forward(const Tensor& x) {
  return forward_chained({x, first_norm()(x)}, nullptr).sum;
}

namespace {

bool chains() { return nn::fused_residual_norm_enabled() && !nn::SummaryRecorder::active(); }

}  // namespace

Tensor run_block_chain(nn::Sequential& blocks, const Tensor& x) {
  if (!chains() || blocks.size() == 0) return blocks(x);
  std::vector<ChainedBlock*> chain;
  for (size_t i = 0; i < blocks.size(); ++i) {
    auto* b = dynamic_cast<ChainedBlock*>(&blocks.at(i));
    SKA_CHECK(b != nullptr, ValueError, "run_block_chain: block ", i, " (",
              blocks.at(i).type_name(), ") is not a ChainedBlock");
    chain.push_back(b);
  }
  return run_block_chain(chain, x);
}

Tensor run_block_chain(const std::vector<ChainedBlock*>& blocks, const Tensor& x) {
  if (blocks.empty()) return x;
  if (!chains()) {
    Tensor y = x;
    for (ChainedBlock* b : blocks) y = (*b)(y);
    return y;
  }
  ResidualNorm state{x, blocks[0]->first_norm()(x)};
  for (size_t i = 0; i < blocks.size(); ++i) {
    state = blocks[i]->forward_chained(state, i + 1 < blocks.size() ? blocks[i + 1] : nullptr);
  }
  return state.sum;
}

}  // namespace ska::models
