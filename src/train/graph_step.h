// train.cuda_graph: the training step (micro-step, update and its statistics) captured once as a
// CUDA Graph and replayed for every later batch of the same shape, so a step costs one launch
// instead of about a thousand. The batch is copied into the captured step's own input buffers;
// the learning rate reaches the kernels through device memory (Optimizer::set_lr) and dropout
// draws through the generator's capture base (Generator::begin_capture), so replays compute what
// eager steps compute.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/device_runtime.h"
#include "core/random.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "train/options.h"
#include "train/train_step.h"

namespace ska::train {

// Why the step cannot be captured under these settings ("" when it can): CUDA, one worker whose
// gradients go through no communicator (`comm_backend` "single"), no gradient accumulation, not
// fp16 (whose loss scale is a host number read every step), and a model that draws nothing on
// the host in training (`model_host_draws`: nn::host_draws_in_training of the model, "" when it
// draws nothing there).
std::string cuda_graph_obstacle(Device device, int world_size, const std::string& comm_backend,
                                const TrainOptions& train, const std::string& model_host_draws);

// For a step that could be captured but for the model's draws on the host: moves them to the
// device (nn::draw_on_device, CaiT's layer dropout) and hands the optimizer the parameters they
// may leave without a gradient (Optimizer::set_grad_gates). Returns what drew on the host
// (nn::host_draws_in_training before the move; "" when nothing did, and nothing changes).
std::string move_draws_to_device(nn::Module& model, optim::Optimizer& optimizer, Device device);
// cuda_graph_obstacle for `model`'s step, after its draws on the host have moved to the device
// (move_draws_to_device) where nothing else stands in the way of a capture; `moved` gets what moved
// ("" when nothing did). What the trainer and benchmark --cuda-graph check before capturing.
std::string prepare_capture(nn::Module& model, optim::Optimizer& optimizer, Device device,
                            int world_size, const std::string& comm_backend,
                            const TrainOptions& train, std::string* moved);

class GraphedStep {
 public:
  // Captures one update (micro_step(images, target, last = true), apply_update at `lr`,
  // stats.record) on copies of images and target; `generator` is the device's, which dropout
  // draws from. Nothing runs yet: run() the same batch to train on it.
  GraphedStep(TrainStep& step, optim::Optimizer& optimizer, UpdateStats& stats,
              Generator& generator, const Tensor& images, const Tensor& target, double lr);

  // Whether a batch can go through the captured step (the captured shapes and dtypes).
  bool fits(const Tensor& images, const Tensor& target) const;
  // One update on this batch at `lr`: copies, the lr and the draws' base written, one replay.
  void run(const Tensor& images, const Tensor& target, double lr);

 private:
  optim::Optimizer& optimizer_;
  Generator& generator_;
  Tensor images_, target_;  // the captured step's input buffers
  CapturedDraws draws_;
  std::unique_ptr<DeviceGraph> graph_;
};

// The training step captured as GraphedStep, under train.cuda_graph `mode` (on or auto). A capture
// that fails is an error under `on` (the reason and the way out named); under `auto` it is
// reported through `log` and gives null, with the gradients a backward cut short left in the
// graph's released memory dropped (optimizer.zero_grad) and the generator's offset restored, so
// that eager steps go on exactly as if no capture had been tried.
std::unique_ptr<GraphedStep> capture_step(const std::string& mode, TrainStep& step,
                                          optim::Optimizer& optimizer, UpdateStats& stats,
                                          Generator& generator, const Tensor& images,
                                          const Tensor& target, double lr,
                                          const std::function<void(const std::string&)>& log);

}  // namespace ska::train
