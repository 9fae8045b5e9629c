// ModelEma: the weight average kept beside the model, updated with ops under NoGradGuard on the
// tensors' device.
#include "optim/ema.h"

#include "autograd/grad_mode.h"
#include "backend/backend.h"
#include "nn/module.h"
#include "ops/ops.h"

namespace ska::optim {

ModelEma::ModelEma(const nn::Module& model, double decay, bool average_buffers)
    : decay_(decay), average_buffers_(average_buffers) {
  SKA_CHECK(decay >= 0 && decay <= 1, ValueError, "ema decay must be in [0, 1], got ", decay);
  NoGradGuard no_grad;
  for (const auto& [name, value] : model.state_dict()) tensors_[name] = value.detach().clone();
  for (const auto& entry : model.named_buffers()) buffers_.insert(entry.first);
}

void ModelEma::update(const nn::Module& model, const Tensor& skip) { apply(model, false, skip); }

void ModelEma::set(const nn::Module& model) { apply(model, true, Tensor()); }

void ModelEma::apply(const nn::Module& model, bool copy_all, const Tensor& skip) {
  NoGradGuard no_grad;
  const std::map<std::string, Tensor> values = model.state_dict();
  SKA_CHECK(values.size() == tensors_.size(), ValueError, "ema: the model has ", values.size(),
            " tensors, the EMA holds ", tensors_.size());
  // The averaged tensors of the common dtype go through one multi-tensor update; the rest
  // (copied buffers, other dtypes or devices) tensor by tensor.
  TensorList batch_ema, batch_values;
  for (auto& [name, ema] : tensors_) {
    const auto it = values.find(name);
    SKA_CHECK(it != values.end(), ValueError, "ema: the model has no tensor '", name, "'");
    SKA_CHECK(it->second.shape() == ema.shape(), ShapeError, "ema: '", name, "' has shape ",
              shape_str(it->second.shape()), " in the model, ", shape_str(ema.shape()),
              " in the EMA");
    const Tensor value = it->second.to(ema.device(), ema.dtype()).contiguous();
    const bool average =
        !copy_all && ema.is_floating() && (average_buffers_ || buffers_.count(name) == 0);
    const bool batched = average && ema.is_contiguous() &&
                         (batch_ema.empty() || (ema.dtype() == batch_ema.front().dtype() &&
                                                ema.device() == batch_ema.front().device()));
    if (batched) {
      batch_ema.push_back(ema);
      batch_values.push_back(value);
      continue;
    }
    const Tensor next = average ? add(mul(ema, decay_), mul(value, 1.0 - decay_)) : value;
    ema.copy_(skip.defined() ? where(skip.to(ema.device()), ema, next) : next);
  }
  if (!batch_ema.empty()) {
    const Device device = batch_ema.front().device();
    SKA_KERNEL(device, multi_ema_update)
    (batch_ema, batch_values, decay_, skip.defined() ? skip.to(device) : skip);
  }
}

void ModelEma::load_state_dict(const std::map<std::string, Tensor>& values) {
  for (const auto& [name, value] : values) {
    const auto it = tensors_.find(name);
    SKA_CHECK(it != tensors_.end(), ValueError, "ema state: unknown tensor '", name, "'");
    SKA_CHECK(value.shape() == it->second.shape(), ShapeError, "ema state: '", name, "' has shape ",
              shape_str(value.shape()), ", expected ", shape_str(it->second.shape()));
  }
  for (const auto& entry : tensors_) {
    SKA_CHECK(values.count(entry.first) != 0, ValueError, "ema state: missing tensor '",
              entry.first, "'");
  }
  for (auto& [name, ema] : tensors_) ema.copy_(values.at(name));
}

}  // namespace ska::optim
