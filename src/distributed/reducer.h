// Gradient synchronisation for data parallelism, overlapped with backward: parameters grouped
// into buckets of about `bucket_mb` in reverse order of registration (roughly the order backward
// finishes them, as PyTorch's DDP does); each bucket is all-reduced as soon as its last gradient
// is final, while backward goes on, and the averaged gradients land back in `.grad`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "distributed/communicator.h"

namespace ska::dist {

struct ReducerOptions {
  double bucket_mb = 25.0;            // distributed.bucket_mb
  DType reduce_dtype = DType::kF32;   // distributed.reduce_dtype: f32 or bf16 on the wire
};

class GradReducer {
 public:
  // `params` (leaves that require grad, all on comm.device()) get grad-ready hooks; the reducer
  // must outlive every backward pass over them. `comm` must outlive the reducer.
  GradReducer(const TensorList& params, Communicator& comm, const ReducerOptions& options);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Before a micro-step's backward: `sync` true on the last micro-step of an update (its
  // buckets are all-reduced as gradients become final); false while gradients accumulate
  // locally (no communication).
  void prepare(bool sync);
  // After the backward of a synchronising micro-step: launches the buckets no hook completed
  // (parameters without a gradient this step contribute zeros), waits for every bucket and
  // writes the averaged gradients into `.grad`. Rethrows a collective's CommError.
  void finish();

  int64_t num_buckets() const { return static_cast<int64_t>(buckets_.size()); }
  // Parameter indices (into the constructor's list) of bucket `b`, in launch order.
  const std::vector<size_t>& bucket_params(int64_t b) const { return buckets_[b].params; }

 private:
  struct Bucket {
    std::vector<size_t> params;   // indices into params_
    std::vector<int64_t> offsets; // each parameter's first element in `flat`
    int64_t pending = 0;          // gradients not final yet in this step
    Tensor flat;                  // reduce_dtype [numel], on the device
    std::shared_ptr<Work> work;
  };
  void on_grad_ready(size_t param, const Tensor& grad);
  void launch_ready_buckets();
  void launch(Bucket& bucket);

  TensorList params_;
  Communicator& comm_;
  ReducerOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;   // parameter index -> bucket
  std::vector<bool> ready_;         // parameter index -> grad final this step
  size_t next_launch_ = 0;          // buckets launch strictly in order, the same on every rank
  bool syncing_ = false;
  std::shared_ptr<bool> alive_;     // hooks outlive the reducer; they check this first
};

}  // namespace ska::dist
