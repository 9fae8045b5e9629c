// Differentiable collectives (see functional.h).
#include "distributed/functional.h"

#include "autograd/node.h"
#include "nn/layers.h"

namespace ska::dist {

Tensor all_reduce_sum(const Tensor& x, Communicator& comm) {
  Tensor out = x.detach().contiguous().clone();
  comm.all_reduce(out, ReduceOp::kSum);
  Communicator* c = &comm;
  autograd::record_op("all_reduce_sum", {x}, {out}, [c](const TensorList& grads) -> TensorList {
    Tensor g = grads[0].contiguous().clone();
    c->all_reduce(g, ReduceOp::kSum);
    return {g};
  });
  return out;
}

int enable_sync_batch_norm(nn::Module& model, Communicator& comm) {
  int count = 0;
  Communicator* c = &comm;
  for (const auto& [name, module] : model.named_modules()) {
    auto* bn = dynamic_cast<nn::BatchNorm2d*>(module);
    if (bn == nullptr) continue;
    bn->sum_across_workers = [c](const Tensor& t) { return all_reduce_sum(t, *c); };
    ++count;
  }
  return count;
}

}  // namespace ska::dist
