// The world-size-1 pass-through and the backend choice (see communicator.h).
#include "distributed/communicator.h"

#include "core/error.h"

namespace ska::dist {

namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
};

// One worker: every collective leaves its tensors as they are (average and sum of one value).
class SingleCommunicator : public Communicator {
 public:
  explicit SingleCommunicator(Device device) : device_(device) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  Device device() const override { return device_; }
  std::shared_ptr<Work> all_reduce_async(Tensor, ReduceOp) override {
    return std::make_shared<DoneWork>();
  }
  void broadcast(Tensor, int) override {}
  void all_gather(const Tensor& input, Tensor output) override { output.copy_(input.reshape(output.shape())); }
  void reduce_scatter(const Tensor& input, Tensor output, ReduceOp) override {
    output.copy_(input.reshape(output.shape()));
  }
  void barrier() override {}
  void set_label(const std::string&) override {}

 private:
  Device device_;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator(const World& world, Device device,
                                                const CommOptions& options) {
  if (world.world_size == 1) return std::make_unique<SingleCommunicator>(device);
  SKA_FAIL(DeviceError, "data parallelism over ", world.world_size, " workers needs the Gloo (CPU) ",
           "or NCCL (CUDA) backend, which this build lacks");
}

}  // namespace ska::dist
