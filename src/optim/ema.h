// Exponential moving average of model weights (timm's ModelEmaV2): a holder of tensors keyed by
// state_dict name, updated as ema = decay * ema + (1 - decay) * value after optimizer steps.
#pragma once

#include <map>
#include <set>
#include <string>

#include "core/tensor.h"

namespace ska::nn {
class Module;
}

namespace ska::optim {

class ModelEma {
 public:
  // Copies (clones) every parameter and buffer of `model`, on the model's device.
  // average_buffers: floating buffers are averaged like parameters (ModelEmaV2); false copies
  // them (ModelEmaV3's exclude_buffers). Non-floating buffers are always copied.
  ModelEma(const nn::Module& model, double decay, bool average_buffers = true);

  // One update from `model` (same names, shapes; any device: values are moved to the EMA's).
  // `skip`: undefined, or a u8 one-element tensor (on the EMA's device, or it is moved there)
  // whose nonzero value leaves every EMA tensor as it was: the update of a skipped step, decided
  // on the device.
  void update(const nn::Module& model, const Tensor& skip = Tensor());
  // Overwrites every EMA tensor with the model's (e.g. after loading pretrained weights).
  void set(const nn::Module& model);

  double decay() const { return decay_; }
  // The averaged tensors by name: load them into a model copy for evaluation, or save them.
  const std::map<std::string, Tensor>& state_dict() const { return tensors_; }
  // Restores saved tensors; ValueError / ShapeError naming missing, unknown or mis-shaped keys.
  void load_state_dict(const std::map<std::string, Tensor>& values);

 private:
  void apply(const nn::Module& model, bool copy_all, const Tensor& skip);

  double decay_;
  bool average_buffers_;
  std::map<std::string, Tensor> tensors_;
  std::set<std::string> buffers_;
};

}  // namespace ska::optim
