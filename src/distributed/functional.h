// Collectives inside the autograd graph, for layers whose forward pass spans the workers
// (synchronised batch norm): the sum over workers, whose gradient is again the sum over workers.
#pragma once

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "nn/module.h"

namespace ska::dist {

// The element-wise sum of `x` over every worker of `comm` (a new tensor; `x` is unchanged).
// Differentiable: every worker's output depends on every worker's input, so the gradient of
// the input is the sum of the output gradients over workers. Every worker must call it in the
// same order, in forward and (when it needs gradients) in backward.
Tensor all_reduce_sum(const Tensor& x, Communicator& comm);

// distributed.sync_bn: makes every BatchNorm2d of `model` normalise with the statistics of all
// workers' batches (through `comm`, which must outlive the model's training). Returns how many.
int enable_sync_batch_norm(nn::Module& model, Communicator& comm);

}  // namespace ska::dist
