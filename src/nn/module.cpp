// Module bookkeeping: registration, traversal, state dicts, modes and device moves.
#include "nn/module.h"

#include <cstdint>
#include <set>
#include <sstream>

#include "autograd/grad_mode.h"
#include "nn/summary.h"

namespace ska::nn {

namespace {

void check_name(const std::string& name, const char* what) {
  SKA_CHECK(!name.empty() && name.find('.') == std::string::npos, ValueError, what, " name '",
            name, "' must be non-empty and contain no '.'");
}

// Replaces the data of `t` in place with `value` (same handle, new storage/dtype/device).
void assign_in_place(const Tensor& t, const Tensor& value) {
  TensorImpl& impl = t.impl();
  const TensorImpl& src = value.impl();
  impl.storage = src.storage;
  impl.shape = src.shape;
  impl.strides = src.strides;
  impl.offset = src.offset;
  impl.dtype = src.dtype;
  impl.grad.reset();
}

}  // namespace

Tensor Module::operator()(const Tensor& x) {
  return record_call(this, [&] { return forward(x); });
}

Tensor Module::first_token(const Tensor& x) {
  return record_call(this, [&] { return forward_first_token(x); });
}

Tensor Module::forward_first_token(const Tensor& x) { return forward(x).narrow(1, 0, 1); }

Tensor Module::register_parameter(const std::string& name, Tensor value, bool trainable) {
  check_name(name, "parameter");
  SKA_CHECK(value.is_floating(), DTypeError, "parameter '", name, "' must be floating, got ",
            dtype_name(value.dtype()));
  Tensor p = value.detach();
  p.set_requires_grad(trainable);
  parameters_.emplace_back(name, p);
  return p;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name(name, "buffer");
  Tensor b = value.detach();
  buffers_.emplace_back(name, b);
  return b;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name(name, "module");
  SKA_CHECK(module != nullptr, ValueError, "register_module('", name, "'): null module");
  for (const auto& [n, m] : children_) {
    SKA_CHECK(n != name, ValueError, "module name '", name, "' registered twice");
  }
  children_.emplace_back(name, std::move(module));
}

void Module::collect(const std::string& prefix, bool params, bool trainable_only,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params ? parameters_ : buffers_) {
    if (params && trainable_only && !t.requires_grad()) continue;
    out.emplace_back(prefix + name, t);
  }
  for (const auto& [name, child] : children_) {
    child->collect(prefix + name + ".", params, trainable_only, out);
  }
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool trainable_only) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, trainable_only, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, false, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (const auto& [name, child] : children_) {
    auto sub = child->named_modules(prefix.empty() ? name : prefix + "." + name);
    out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

std::string host_draws_in_training(Module& root) {
  for (const auto& [name, module] : root.named_modules()) {
    const std::string what = module->host_draws();
    if (!what.empty()) return (name.empty() ? root.type_name() : name) + ": " + what;
  }
  return "";
}

std::vector<std::pair<std::string, Tensor>> draw_on_device(Module& root, Device device) {
  std::vector<std::pair<std::string, Tensor>> gates;
  for (const auto& [name, module] : root.named_modules()) {
    for (auto& [param, flag] : module->draw_on_device(device)) {
      gates.emplace_back(name.empty() ? param : name + "." + param, std::move(flag));
    }
  }
  return gates;
}

TensorList Module::parameters(bool trainable_only) const {
  TensorList out;
  for (const auto& [name, t] : named_parameters(trainable_only)) out.push_back(t);
  return out;
}

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters(trainable_only)) n += t.numel();
  return n;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : named_parameters(false)) out[name] = t;
  for (const auto& [name, t] : named_buffers()) out[name] = t;
  return out;
}

bool dtype_loads_into(DType stored, DType target) {
  return stored == target || (dtype_is_floating(stored) && dtype_is_floating(target));
}

void Module::load_state_dict(const std::map<std::string, Tensor>& values, bool strict) {
  const std::map<std::string, Tensor> mine = state_dict();
  std::vector<std::string> missing, unexpected, misshaped, mistyped;
  for (const auto& [name, t] : mine) {
    auto it = values.find(name);
    if (it == values.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != t.shape()) {
      misshaped.push_back(name + " (expected " + shape_str(t.shape()) + ", got " +
                          shape_str(it->second.shape()) + ")");
    } else if (!dtype_loads_into(it->second.dtype(), t.dtype())) {
      mistyped.push_back(name + " (expected " + dtype_name(t.dtype()) + ", got " +
                         dtype_name(it->second.dtype()) + ")");
    }
  }
  for (const auto& [name, t] : values) {
    if (!mine.count(name)) unexpected.push_back(name);
  }
  std::ostringstream msg;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    msg << "\n  " << what << " (" << names.size() << "):";
    for (const std::string& n : names) msg << "\n    " << n;
  };
  list("mis-shaped", misshaped);
  if (strict) {
    list("missing", missing);
    list("unexpected", unexpected);
  }
  const bool only_dtypes = msg.str().empty();
  list("mis-typed (only floating dtypes convert into each other)", mistyped);
  const std::string problems = msg.str();
  SKA_CHECK(problems.empty() || !only_dtypes, DTypeError, "load_state_dict:", problems);
  SKA_CHECK(problems.empty(), ShapeError, "load_state_dict:", problems);
  NoGradGuard no_grad;
  for (const auto& [name, t] : mine) {
    auto it = values.find(name);
    if (it != values.end()) Tensor(t).copy_(it->second);
  }
}

void Module::train(bool on) {
  training_ = on;
  on_train_mode(on);
  for (const auto& [name, child] : children_) child->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters(false)) assign_in_place(t, t.detach().to(device));
  for (auto& [name, t] : named_buffers()) assign_in_place(t, t.detach().to(device));
}

void Module::to(DType dtype) {
  NoGradGuard no_grad;
  for (auto& [name, t] : named_parameters(false)) assign_in_place(t, t.detach().to(dtype));
  for (auto& [name, t] : named_buffers()) {
    if (t.is_floating()) assign_in_place(t, t.detach().to(dtype));
  }
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const ModulePtr& layer : layers_) y = (*layer)(y);
  return y;
}

}  // namespace ska::nn
