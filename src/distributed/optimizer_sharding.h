// ZeRO stage 1 (distributed.shard_optimizer): the optimizer state is split across the workers.
// Every parameter has one owner (whole tensors, balanced by size, as PyTorch's
// ZeroRedundancyOptimizer); after the gradient all-reduce each worker updates only what it owns,
// holding only that state, and then every worker receives every parameter from its owner.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"
#include "optim/optimizer.h"

namespace ska::dist {

class OptimizerSharding {
 public:
  // `params`: the optimizer's parameters (all on comm.device()). `comm` must outlive this.
  OptimizerSharding(const optim::NamedTensors& params, Communicator& comm);

  int owner(const std::string& param) const;  // ValueError for an unknown name
  bool owns(const std::string& param) const { return owner(param) == comm_.rank(); }
  // Numbers of elements each worker owns (the balance of the split).
  const std::vector<int64_t>& owned_numel() const { return owned_numel_; }

  // Before Optimizer::step(): hands the optimizer the global gradient norm (LAMB clips by it)
  // and drops the gradients of the parameters other workers update, so the step skips them and
  // creates no state for them.
  void before_step(optim::Optimizer& optimizer);
  // After the step: every worker's parameters are broadcast from their owner (one collective per
  // worker over its parameters flattened), so all workers hold the same weights again.
  void after_step();

  // The whole optimizer state on rank 0 (each worker's share sent to it); an empty map on the
  // other workers. Every worker must call it, at the same point.
  std::map<std::string, Tensor> gather_state(const optim::Optimizer& optimizer);
  // The part of a whole optimizer state (a checkpoint's) that this worker keeps.
  std::map<std::string, Tensor> local_state(const std::map<std::string, Tensor>& full) const;

 private:
  Communicator& comm_;
  optim::NamedTensors params_;
  std::map<std::string, int> owner_;
  std::vector<std::vector<size_t>> by_owner_;  // parameter indices of each worker
  std::vector<int64_t> owned_numel_;
};

// The bytes of `tensors` (names, dtypes, shapes, data) and back: how a worker's tensors travel
// through a collective that moves flat buffers. IOError for malformed bytes.
std::string pack_tensors(const std::map<std::string, Tensor>& tensors);
std::map<std::string, Tensor> unpack_tensors(const std::string& bytes);
// Rank `root`'s bytes on every worker.
std::string broadcast_bytes(Communicator& comm, const std::string& bytes, int root);

}  // namespace ska::dist
