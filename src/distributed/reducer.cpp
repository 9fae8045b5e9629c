// Bucketed, overlapped gradient all-reduce (see reducer.h).
#include "distributed/reducer.h"

#include "core/error.h"

namespace ska::dist {

GradReducer::GradReducer(const TensorList& params, Communicator& comm,
                         const ReducerOptions& options)
    : params_(params), comm_(comm), options_(options), alive_(std::make_shared<bool>(true)) {
  SKA_CHECK(options.bucket_mb > 0, ValueError, "distributed.bucket_mb must be positive, got ",
            options.bucket_mb);
  SKA_CHECK(options.reduce_dtype == DType::kF32 || options.reduce_dtype == DType::kBF16,
            DTypeError, "distributed.reduce_dtype must be f32 or bf16, got ",
            dtype_name(options.reduce_dtype));
  const double cap = options.bucket_mb * 1024.0 * 1024.0;
  const double element = static_cast<double>(dtype_size(options.reduce_dtype));
  bucket_of_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  // Reverse registration order: the last layers' gradients are final first.
  Bucket current;
  int64_t numel = 0;
  const auto close = [&] {
    if (current.params.empty()) return;
    current.flat = Tensor::zeros({numel}, options.reduce_dtype, comm.device());
    buckets_.push_back(std::move(current));
    current = Bucket();
    numel = 0;
  };
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    SKA_CHECK(p.device() == comm.device(), DeviceError, "data parallelism: parameter ", k,
              " is on ", p.device(), " but the communicator works on ", comm.device());
    bucket_of_[k] = buckets_.size();
    current.params.push_back(k);
    current.offsets.push_back(numel);
    numel += p.numel();
    if (static_cast<double>(numel) * element >= cap) close();
  }
  close();
  const std::weak_ptr<bool> alive = alive_;
  for (size_t k = 0; k < params_.size(); ++k) {
    params_[k].register_grad_ready_hook([this, alive, k](const Tensor& grad) {
      if (alive.lock()) on_grad_ready(k, grad);
    });
  }
}

GradReducer::~GradReducer() {
  alive_.reset();
  // Collectives still reading the buckets must finish before the buffers go.
  for (Bucket& b : buckets_) {
    if (!b.work) continue;
    try {
      b.work->wait();
    } catch (const Error&) {
    }
  }
}

void GradReducer::prepare(bool sync) {
  syncing_ = sync;
  if (!sync) return;
  std::fill(ready_.begin(), ready_.end(), false);
  for (Bucket& b : buckets_) {
    b.pending = static_cast<int64_t>(b.params.size());
    b.work.reset();
  }
  next_launch_ = 0;
}

void GradReducer::on_grad_ready(size_t param, const Tensor& grad) {
  if (!syncing_ || ready_[param]) return;
  ready_[param] = true;
  Bucket& b = buckets_[bucket_of_[param]];
  size_t slot = 0;
  while (b.params[slot] != param) ++slot;
  b.flat.narrow(0, b.offsets[slot], grad.numel()).copy_(grad.reshape({grad.numel()}));
  if (--b.pending == 0) launch_ready_buckets();
}

void GradReducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    launch(buckets_[next_launch_]);
    ++next_launch_;
  }
}

void GradReducer::launch(Bucket& b) {
  b.work = comm_.all_reduce_async(b.flat, ReduceOp::kAverage);
}

void GradReducer::finish() {
  SKA_CHECK(syncing_, ValueError, "GradReducer::finish called after prepare(false)");
  // Gradients no hook delivered: accumulated in earlier micro-steps only, or none at all.
  for (size_t i = next_launch_; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const size_t k = b.params[slot];
      if (ready_[k]) continue;
      const Tensor grad = params_[k].grad();
      Tensor dst = b.flat.narrow(0, b.offsets[slot], params_[k].numel());
      if (grad.defined()) {
        dst.copy_(grad.reshape({grad.numel()}));
      } else {
        dst.fill_(0.0);
      }
      ready_[k] = true;
    }
    b.pending = 0;
  }
  launch_ready_buckets();
  for (Bucket& b : buckets_) {
    b.work->wait();
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const Tensor& p = params_[b.params[slot]];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;  // unused on this rank: stays without a gradient
      grad.copy_(b.flat.narrow(0, b.offsets[slot], p.numel()).view(grad.shape()));
    }
  }
  syncing_ = false;
}

}  // namespace ska::dist
