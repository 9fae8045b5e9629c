// Counting multiply-accumulates of the GEMM and convolution ops, for `summary` and benchmarks.
// Convention (fvcore's, which the paper's FLOPs column used): one multiply-add counts as one MAC;
// only matmul / linear / conv2d are counted (norms, softmax and pointwise ops are not).
#pragma once

#include <cstdint>

namespace ska {

// While a MacCounter lives on this thread, the counted ops add their MACs to it.
class MacCounter {
 public:
  MacCounter();
  ~MacCounter();
  MacCounter(const MacCounter&) = delete;
  MacCounter& operator=(const MacCounter&) = delete;
  int64_t total() const { return total_; }

  // Called by the ops: adds `macs` to every active counter on this thread (they nest).
  static void add(int64_t macs);

 private:
  int64_t total_ = 0;
  MacCounter* outer_;
};

// While alive, the counted ops add nothing to this thread's counters: for work that is not part
// of the computation being counted (nn::time_conv_logits timing both forms of an op).
class MacCountingPause {
 public:
  MacCountingPause();
  ~MacCountingPause();
  MacCountingPause(const MacCountingPause&) = delete;
  MacCountingPause& operator=(const MacCountingPause&) = delete;

 private:
  MacCounter* saved_;
};

}  // namespace ska
