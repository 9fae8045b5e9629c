// The captured training step (see graph_step.h).
#include "train/graph_step.h"

#include "backend/device_runtime.h"

namespace ska::train {

std::string cuda_graph_obstacle(Device device, int world_size, const std::string& comm_backend,
                                const TrainOptions& train, const std::string& model_host_draws) {
  if (!device.is_cuda()) return "it needs a CUDA device";
  if (world_size > 1) return "data parallelism is not captured yet (one worker only)";
  if (comm_backend != "single") {
    return "the step's gradients go through " + comm_backend +
           " (distributed.force_backend), which is not captured";
  }
  if (train.accumulate > 1) return "train.accumulate > 1 is not captured yet";
  if (train.precision == Precision::kFP16) {
    return "fp16 reads its loss scale on the host every step (use bf16)";
  }
  if (!model_host_draws.empty()) {
    return "the model draws on the host in training, which every replay would repeat as "
           "captured (" +
           model_host_draws + ")";
  }
  return "";
}

std::string move_draws_to_device(nn::Module& model, optim::Optimizer& optimizer, Device device) {
  const std::string draws = nn::host_draws_in_training(model);
  if (!draws.empty()) optimizer.set_grad_gates(nn::draw_on_device(model, device));
  return draws;
}

std::string prepare_capture(nn::Module& model, optim::Optimizer& optimizer, Device device,
                            int world_size, const std::string& comm_backend,
                            const TrainOptions& train, std::string* moved) {
  moved->clear();
  const std::string obstacle = cuda_graph_obstacle(device, world_size, comm_backend, train, "");
  if (!obstacle.empty()) return obstacle;
  *moved = move_draws_to_device(model, optimizer, device);
  return cuda_graph_obstacle(device, world_size, comm_backend, train,
                             nn::host_draws_in_training(model));
}

GraphedStep::GraphedStep(TrainStep& step, optim::Optimizer& optimizer, UpdateStats& stats,
                         Generator& generator, const Tensor& images, const Tensor& target,
                         double lr)
    : optimizer_(optimizer),
      generator_(generator),
      images_(images.clone()),
      target_(target.clone()) {
  const Device device = images.device();
  // Written outside the capture, so that the captured step writes no learning rate of its own.
  optimizer_.set_lr(lr);
  synchronize(device);
  // A host draw inside the step would be frozen into every replay: fail the capture instead
  // (cuda_graph_obstacle turns away the models known to draw there before it is tried).
  const ForbidDraws host_draws(default_generator(Device::cpu()),
                               "capturing the training step as a CUDA Graph (train.cuda_graph), "
                               "whose replays would all repeat them");
  generator_.begin_capture(device);
  try {
    graph_ = std::make_unique<DeviceGraph>(device, [&] {
      stats.record(step.apply_update(step.micro_step(images_, target_, true), lr));
    });
  } catch (...) {
    generator_.end_capture();
    throw;
  }
  draws_ = generator_.end_capture();
}

std::unique_ptr<GraphedStep> capture_step(const std::string& mode, TrainStep& step,
                                          optim::Optimizer& optimizer, UpdateStats& stats,
                                          Generator& generator, const Tensor& images,
                                          const Tensor& target, double lr,
                                          const std::function<void(const std::string&)>& log) {
  try {
    return std::make_unique<GraphedStep>(step, optimizer, stats, generator, images, target, lr);
  } catch (const Error& e) {
    SKA_CHECK(mode == "auto", DeviceError, "train.cuda_graph: on, but the training step could not ",
              "be captured: ", e.what(), " (train.cuda_graph: auto runs eager steps instead)");
    optimizer.zero_grad();
    log(std::string("warning: train.cuda_graph: auto: the training step could not be captured (") +
        e.what() + "); eager steps from here");
    return nullptr;
  }
}

bool GraphedStep::fits(const Tensor& images, const Tensor& target) const {
  return images.shape() == images_.shape() && images.dtype() == images_.dtype() &&
         target.shape() == target_.shape() && target.dtype() == target_.dtype() &&
         images.device() == images_.device() && target.device() == target_.device();
}

void GraphedStep::run(const Tensor& images, const Tensor& target, double lr) {
  images_.copy_(images);
  target_.copy_(target);
  optimizer_.set_lr(lr);
  generator_.before_replay(draws_);
  graph_->replay();
}

}  // namespace ska::train
