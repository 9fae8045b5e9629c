// Pre-norm residual blocks as a chain of fused residual adds and norms.
#include "models/block_chain.h"

#include "core/error.h"
#include "nn/summary.h"

namespace ska::models {

Tensor ChainedBlock::forward(const Tensor& x) {
  return forward_chained({x, first_norm()(x)}, nullptr).sum;
}

Tensor run_block_chain(nn::Sequential& blocks, const Tensor& x) {
  if (!nn::fused_residual_norm_enabled() || blocks.size() == 0 || nn::SummaryRecorder::active()) {
    return blocks(x);
  }
  const auto block = [&](size_t i) {
    auto* b = dynamic_cast<ChainedBlock*>(&blocks.at(i));
    SKA_CHECK(b != nullptr, ValueError, "run_block_chain: block ", i, " (",
              blocks.at(i).type_name(), ") is not a ChainedBlock");
    return b;
  };
  ResidualNorm state{x, block(0)->first_norm()(x)};
  for (size_t i = 0; i < blocks.size(); ++i) {
    state = block(i)->forward_chained(state, i + 1 < blocks.size() ? block(i + 1) : nullptr);
  }
  return state.sum;
}

}  // namespace ska::models
