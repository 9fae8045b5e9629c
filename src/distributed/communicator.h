// Collectives across the workers of a data-parallel job: all-reduce, broadcast, all-gather,
// reduce-scatter and barrier over tensors, with three backends behind one interface: Gloo (CPU
// tensors, TCP), NCCL (CUDA tensors, its own stream ordered with the compute stream by events)
// and a world-size-1 pass-through.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/device.h"
#include "core/tensor.h"
#include "distributed/world.h"

namespace ska::dist {

enum class ReduceOp { kSum, kAverage };

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Gloo: blocks until the collective has completed and rethrows its error. NCCL: makes the
  // calling thread's current stream wait for it (no host synchronisation); errors surface from
  // the watchdog. Calling wait() twice is harmless.
  virtual void wait() = 0;
};

struct CommOptions {
  // A collective not complete after this long fails the worker with CommError naming the
  // collective, the label (set_label) and the peer waited for. distributed.timeout_s.
  double timeout_s = 600.0;
  // One worker too goes through Gloo (CPU) or NCCL (CUDA), with a rendezvous on a free local
  // port: the whole data-parallel path at world size 1, to test it and measure its overhead
  // (distributed.force_backend).
  bool force_backend = false;
};

// A collective failed: a timeout, a peer that died or closed its connection, an NCCL error.
class CommError : public Error {
  using Error::Error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend() const = 0;  // "gloo", "nccl" or "single"
  virtual Device device() const = 0;        // where the tensors it takes must live

  // Every collective takes contiguous tensors on device(), in f32, f64, i64 or bf16 (bf16: NCCL
  // natively; Gloo sums in f32 and rounds once). Every rank must issue the same collectives in
  // the same order with the same shapes. Collectives of one communicator run in issue order.

  // In place: `tensor` becomes the sum (or average) over ranks.
  virtual std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) = 0;
  void all_reduce(Tensor tensor, ReduceOp op = ReduceOp::kSum) {
    all_reduce_async(std::move(tensor), op)->wait();
  }
  // In place: every rank's `tensor` becomes rank `root`'s.
  virtual void broadcast(Tensor tensor, int root) = 0;
  // `output` (numel = world_size x input's) receives every rank's `input`, in rank order.
  virtual void all_gather(const Tensor& input, Tensor output) = 0;
  // `input` (numel = world_size x output's) is reduced over ranks; rank r keeps chunk r.
  virtual void reduce_scatter(const Tensor& input, Tensor output, ReduceOp op) = 0;
  virtual void barrier() = 0;

  // What the caller is doing ("step 1200"), named in timeout and failure messages.
  virtual void set_label(const std::string& label) = 0;
};

// The communicator for `world` on `device`: a pass-through for world size 1; otherwise Gloo for
// the CPU and NCCL for CUDA, after a rendezvous at world.master_addr:master_port (rank 0 serves
// a TCP store there). CommError when the rendezvous fails within options.timeout_s; DeviceError
// when the build lacks the backend.
// A master_addr of "file:///shared/folder" meets through files in that folder instead (store.h).
// Threads: Gloo runs its collectives on one thread of the communicator (plus Gloo's socket loop);
// NCCL has a watchdog thread; rank 0 also serves the store on a thread. Fork before creating a
// communicator, never after. Gloo ignores SIGPIPE (unless the program handles it), so that a dead
// peer is a CommError rather than a silent death. One communicator per master_port at a time.
std::unique_ptr<Communicator> make_communicator(const World& world, Device device,
                                                const CommOptions& options = {});

}  // namespace ska::dist
