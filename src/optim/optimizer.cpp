// The optimizers: parameter grouping, the step loop with per-parameter state, the fused update
// kernels of SGD / Adam / AdamW, LAMB's device-side global clip and trust ratio (one multi-tensor
// call per group; per parameter where a group mixes dtypes).
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "autograd/grad_mode.h"
#include "backend/backend.h"
#include "ops/ops.h"
#include "optim/grad_utils.h"

namespace ska::optim {

// --- Grouping ---

bool name_matches(const std::string& name, const std::string& pattern) {
  // Iterative wildcard match with backtracking to the last '*'.
  size_t n = 0, p = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++n, ++p;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++, resume = n;
    } else if (star != std::string::npos) {
      p = star + 1, n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<ParamGroup> param_groups_weight_decay(const NamedTensors& named_params, double lr,
                                                  double weight_decay,
                                                  const std::vector<std::string>& no_weight_decay) {
  ParamGroup no_decay{{}, lr, 0.0}, decay{{}, lr, weight_decay};
  for (const auto& [name, param] : named_params) {
    if (!param.requires_grad()) continue;
    bool excluded = weight_decay == 0.0 || param.dim() <= 1 ||
                    (name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0);
    for (const std::string& pattern : no_weight_decay) excluded |= name_matches(name, pattern);
    (excluded ? no_decay : decay).params.emplace_back(name, param);
  }
  std::vector<ParamGroup> groups;
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  return groups;
}

// --- Optimizer ---

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  Device device = Device::cpu();
  for (const ParamGroup& group : groups_) {
    SKA_CHECK(group.lr >= 0 && group.weight_decay >= 0, ValueError,
              "optimizer group needs lr >= 0 and weight_decay >= 0, got lr ", group.lr,
              ", weight_decay ", group.weight_decay);
    for (const auto& [name, param] : group.params) {
      SKA_CHECK(index_.count(name) == 0, ValueError, "parameter '", name,
                "' appears twice in the optimizer");
      SKA_CHECK(param.is_floating() && param.is_contiguous(), ValueError, "parameter '", name,
                "' must be a contiguous floating tensor, got ", param.str());
      if (index_.empty()) device = param.device();
      SKA_CHECK(param.device() == device, DeviceError, "parameter '", name, "' is on ",
                param.device(), " but the optimizer's first parameter is on ", device,
                "; an optimizer keeps its parameters on one device");
      const int64_t next = static_cast<int64_t>(index_.size());
      index_[name] = next;
    }
  }
  counts_ = Tensor::zeros({static_cast<int64_t>(index_.size())}, DType::kI64, device);
  lrs_ = Tensor::zeros({static_cast<int64_t>(groups_.size())}, DType::kF64, device);
  lrs_written_.assign(groups_.size(), std::numeric_limits<double>::quiet_NaN());
  write_lrs();
}

void Optimizer::set_lr(double lr) {
  for (ParamGroup& group : groups_) group.lr = lr;
  write_lrs();
}

void Optimizer::write_lrs() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (lrs_written_[g] == groups_[g].lr) continue;
    lrs_.narrow(0, static_cast<int64_t>(g), 1).fill_(groups_[g].lr);
    lrs_written_[g] = groups_[g].lr;
  }
}

Tensor Optimizer::lr_of(const ParamGroup& group) const {
  const auto g = &group - groups_.data();
  SKA_CHECK(g >= 0 && g < static_cast<std::ptrdiff_t>(groups_.size()), ValueError,
            "lr_of: not one of this optimizer's groups");
  return lrs_.narrow(0, g, 1);
}

void Optimizer::zero_grad(bool set_to_none) {
  TensorList params;
  for (const ParamGroup& group : groups_) {
    for (const auto& entry : group.params) params.push_back(entry.second);
  }
  optim::zero_grad(params, set_to_none);
}

Optimizer::ParamState& Optimizer::state_for(const std::string& name, const Tensor& param) {
  ParamState& state = state_[name];
  if (!state.step.defined()) state.step = counts_.narrow(0, index_.at(name), 1);
  if (state.slots.empty()) {
    for (const std::string& slot : slot_names()) {
      state.slots[slot] = Tensor::zeros(param.shape(), param.dtype(), param.device());
    }
  }
  return state;
}

void Optimizer::set_grad_gates(const NamedTensors& gates) {
  std::vector<Tensor> flags;
  std::map<std::string, size_t> gate_of;
  std::map<const void*, size_t> by_address;  // a layer's parameters share one flag
  for (const auto& [param, flag] : gates) {
    SKA_CHECK(index_.count(param) != 0, ValueError, name(), ": grad gate for '", param,
              "', which is not one of this optimizer's parameters");
    SKA_CHECK(flag.numel() == 1 && flag.dtype() == DType::kU8 && flag.device() == counts_.device(),
              ValueError, name(), ": the grad gate of '", param, "' must be one u8 element on ",
              counts_.device(), ", got ", flag.str());
    const auto [it, added] = by_address.emplace(flag.data_ptr(), flags.size());
    if (added) flags.push_back(flag);
    gate_of[param] = it->second;
  }
  gates_ = std::move(flags);
  gate_of_ = std::move(gate_of);
}

namespace {

// One u8 element, nonzero where `skip` (undefined: never) or `gate` is.
Tensor skip_or(const Tensor& skip, const Tensor& gate) {
  if (!skip.defined()) return gate;
  const Tensor both = add(skip.to(DType::kF32).reshape({1}), gate.to(DType::kF32).reshape({1}));
  return gt(both, Tensor::zeros({1}, DType::kF32, both.device()));
}

}  // namespace

void Optimizer::step(const Tensor& skip) {
  NoGradGuard no_grad;
  SKA_CHECK(!skip.defined() || (skip.numel() == 1 && skip.dtype() == DType::kU8 &&
                                skip.device() == counts_.device()),
            ValueError, name(), ": skip must be one u8 element on ", counts_.device(), ", got ",
            skip.str());
  write_lrs();
  // Part 0: the parameters without a gate, under `skip`; part 1 + k: those of gate k, under
  // `skip` or that gate.
  const size_t parts = 1 + gates_.size();
  std::vector<std::vector<std::vector<Item>>> work(parts,
                                                   std::vector<std::vector<Item>>(groups_.size()));
  std::vector<std::vector<int64_t>> stepping_counts(parts);  // counts_ elements that step
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [name, param] : groups_[g].params) {
      const Tensor grad = param.grad();
      if (!grad.defined()) continue;
      SKA_CHECK(grad.shape() == param.shape() && grad.dtype() == param.dtype() &&
                    grad.device() == param.device(),
                ValueError, "grad of parameter '", name, "' is ", grad.str(),
                " but the parameter is ", param.str());
      const auto gate = gate_of_.find(name);
      const size_t part = gate == gate_of_.end() ? 0 : 1 + gate->second;
      work[part][g].push_back({param, grad.contiguous(), &state_for(name, param)});
      stepping_counts[part].push_back(index_.at(name));
    }
  }
  begin_step();
  for (size_t part = 0; part < parts; ++part) {
    if (stepping_counts[part].empty()) continue;
    const Tensor part_skip = part == 0 ? skip : skip_or(skip, gates_[part - 1]);
    // The counts advance first (the kernels read them): one launch for each run of consecutive
    // counts, so one when every parameter steps, and a few when a layer's parameters have no
    // gradient (CaiT's layer dropout), not one per parameter.
    std::vector<int64_t>& counts = stepping_counts[part];
    std::sort(counts.begin(), counts.end());
    for (size_t first = 0; first < counts.size();) {
      size_t end = first + 1;
      while (end < counts.size() && counts[end] == counts[end - 1] + 1) ++end;
      const Tensor run = counts_.narrow(0, counts[first], static_cast<int64_t>(end - first));
      SKA_KERNEL(counts_.device(), advance_counts)(run, part_skip);
      first = end;
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!work[part][g].empty()) update_group(groups_[g], work[part][g], part_skip);
    }
  }
  global_grad_norm_ = Tensor();
}

void Optimizer::update_group(const ParamGroup& group, const std::vector<Item>& items,
                             const Tensor& skip) {
  for (const Item& item : items) update(group, item.param, item.grad, *item.state, skip);
}

Optimizer::MomentLists Optimizer::moment_lists(const std::vector<Item>& items) {
  MomentLists lists;
  for (const Item& item : items) {
    lists.params.push_back(item.param);
    lists.grads.push_back(item.grad);
    lists.exp_avgs.push_back(item.state->slots.at("exp_avg"));
    lists.exp_avg_sqs.push_back(item.state->slots.at("exp_avg_sq"));
    lists.steps.push_back(item.state->step);
  }
  return lists;
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  for (const auto& [name, state] : state_) {
    out[name + ".step"] = state.step.to(Device::cpu()).clone().reshape({});
    for (const auto& [slot, value] : state.slots) out[name + "." + slot] = value;
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> params;
  for (const ParamGroup& group : groups_) {
    for (const auto& entry : group.params) params.insert(entry);
  }
  std::vector<std::string> slots = slot_names();
  slots.push_back("step");
  // Validate everything before changing anything.
  std::map<std::string, std::map<std::string, Tensor>> by_param;
  for (const auto& [key, value] : state) {
    const size_t dot = key.rfind('.');
    const std::string param = dot == std::string::npos ? key : key.substr(0, dot);
    const std::string slot = dot == std::string::npos ? "" : key.substr(dot + 1);
    SKA_CHECK(params.count(param) != 0, ValueError, name(), " state '", key,
              "': no parameter named '", param, "' in this optimizer");
    SKA_CHECK(std::find(slots.begin(), slots.end(), slot) != slots.end(), ValueError, name(),
              " state '", key, "': unknown slot '", slot, "'");
    const Shape expected = slot == "step" ? Shape{} : params.at(param).shape();
    SKA_CHECK(value.shape() == expected, ShapeError, name(), " state '", key, "' has shape ",
              shape_str(value.shape()), ", expected ", shape_str(expected));
    by_param[param][slot] = value;
  }
  for (const auto& [param, values] : by_param) {
    for (const std::string& slot : slots) {
      SKA_CHECK(values.count(slot) != 0, ValueError, name(), " state of parameter '", param,
                "' lacks '", param, ".", slot, "'");
    }
  }
  state_.clear();
  counts_.fill_(0.0);
  for (const auto& [param_name, values] : by_param) {
    const Tensor& param = params.at(param_name);
    const double step = values.at("step").item();
    SKA_CHECK(step >= 0 && step == std::floor(step) && step < 9.0e15, ValueError, name(),
              " state '", param_name, ".step' is ", step, "; expected a whole number >= 0");
    ParamState& st = state_[param_name];
    st.step = counts_.narrow(0, index_.at(param_name), 1);
    st.step.fill_(step);
    for (const auto& [slot, value] : values) {
      if (slot == "step") continue;
      st.slots[slot] = Tensor::empty(param.shape(), param.dtype(), param.device());
      st.slots[slot].copy_(value);
    }
  }
}

// --- SGD ---

namespace {

// The multi-tensor kernels take lists of one dtype.
bool one_dtype(const TensorList& tensors) {
  for (const Tensor& t : tensors) {
    if (t.dtype() != tensors.front().dtype()) return false;
  }
  return true;
}

}  // namespace

Sgd::Sgd(std::vector<ParamGroup> groups, double momentum, bool nesterov)
    : Optimizer(std::move(groups)), momentum_(momentum), nesterov_(nesterov) {
  SKA_CHECK(momentum >= 0 && momentum < 1, ValueError, "sgd: momentum must be in [0, 1), got ",
            momentum);
  SKA_CHECK(!nesterov || momentum > 0, ValueError, "sgd: nesterov needs momentum > 0");
}

std::vector<std::string> Sgd::slot_names() const {
  if (momentum_ == 0.0) return {};
  return {"momentum_buffer"};
}

void Sgd::update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                 ParamState& state, const Tensor& skip) {
  const Tensor buf = momentum_ == 0.0 ? Tensor() : state.slots.at("momentum_buffer");
  SKA_KERNEL(param.device(), sgd_step)
  (param, grad, buf, skip, lr_of(group), momentum_, group.weight_decay, nesterov_);
}

void Sgd::update_group(const ParamGroup& group, const std::vector<Item>& items,
                       const Tensor& skip) {
  TensorList params, grads, bufs;
  for (const Item& item : items) {
    params.push_back(item.param);
    grads.push_back(item.grad);
    if (momentum_ != 0.0) bufs.push_back(item.state->slots.at("momentum_buffer"));
  }
  if (!one_dtype(params)) return Optimizer::update_group(group, items, skip);
  SKA_KERNEL(params.front().device(), multi_sgd_step)
  (params, grads, bufs, skip, lr_of(group), momentum_, group.weight_decay, nesterov_);
}

// --- Adam / AdamW ---

namespace {

void check_betas(const char* who, double beta1, double beta2, double eps) {
  SKA_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, ValueError, who,
            ": betas must be in [0, 1), got (", beta1, ", ", beta2, ")");
  SKA_CHECK(eps > 0, ValueError, who, ": eps must be > 0, got ", eps);
}

}  // namespace

Adam::Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps,
           bool decoupled_decay)
    : Optimizer(std::move(groups)),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      decoupled_(decoupled_decay) {
  check_betas(name().c_str(), beta1, beta2, eps);
}

std::vector<std::string> Adam::slot_names() const { return {"exp_avg", "exp_avg_sq"}; }

void Adam::update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                  ParamState& state, const Tensor& skip) {
  const double l2 = decoupled_ ? 0.0 : group.weight_decay;
  const double decoupled = decoupled_ ? group.weight_decay : 0.0;
  SKA_KERNEL(param.device(), adam_step)
  (param, grad, Tensor(), state.slots.at("exp_avg"), state.slots.at("exp_avg_sq"), Tensor(),
   state.step, skip, lr_of(group), beta1_, beta2_, eps_, l2, decoupled);
}

void Adam::update_group(const ParamGroup& group, const std::vector<Item>& items,
                        const Tensor& skip) {
  const MomentLists lists = moment_lists(items);
  if (!one_dtype(lists.params)) return Optimizer::update_group(group, items, skip);
  const double l2 = decoupled_ ? 0.0 : group.weight_decay;
  const double decoupled = decoupled_ ? group.weight_decay : 0.0;
  SKA_KERNEL(lists.params.front().device(), multi_adam_step)
  (lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, lists.steps, skip, lr_of(group),
   beta1_, beta2_, eps_, l2, decoupled);
}

// --- LAMB ---

Lamb::Lamb(std::vector<ParamGroup> groups, const Options& options)
    : Optimizer(std::move(groups)), options_(options) {
  check_betas("lamb", options.beta1, options.beta2, options.eps);
}

std::vector<std::string> Lamb::slot_names() const { return {"exp_avg", "exp_avg_sq"}; }

void Lamb::begin_step() {
  clip_divisor_ = Tensor();
  if (options_.max_grad_norm <= 0) return;
  TensorList params;
  for (const ParamGroup& group : groups()) {
    for (const auto& entry : group.params) params.push_back(entry.second);
  }
  const Tensor norm =
      (global_grad_norm_.defined() ? global_grad_norm_ : grad_norm(params)).to(DType::kF32);
  // max(norm / max_grad_norm, 1): stays on the device, read by the update kernel.
  clip_divisor_ =
      maximum(div(norm, options_.max_grad_norm), Tensor::ones({}, DType::kF32, norm.device()));
}

void Lamb::update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                  ParamState& state, const Tensor& skip) {
  // A skipped step leaves `update` all zeros, so the trust ratio is 1 and param - lr * 0 is param.
  const Tensor update = Tensor::empty(param.shape(), param.dtype(), param.device());
  const Tensor divisor = clip_divisor_.defined() ? clip_divisor_.to(param.device()) : Tensor();
  SKA_KERNEL(param.device(), adam_step)
  (param, grad, divisor, state.slots.at("exp_avg"), state.slots.at("exp_avg_sq"), update,
   state.step, skip, Tensor(), options_.beta1, options_.beta2, options_.eps, 0.0,
   group.weight_decay);
  Tensor scaled = update;
  if (group.weight_decay != 0.0 || options_.always_adapt) {
    const Tensor w_norm = sqrt(sum(mul(param, param)));
    const Tensor u_norm = sqrt(sum(mul(update, update)));
    const Tensor zero = Tensor::zeros({}, param.dtype(), param.device());
    const Tensor one = Tensor::ones({}, param.dtype(), param.device());
    Tensor trust = where(gt(w_norm, zero), where(gt(u_norm, zero), div(w_norm, u_norm), one), one);
    if (options_.trust_clip) trust = minimum(trust, one);
    scaled = mul(update, trust);
  }
  Tensor(param).copy_(sub(param, mul(scaled, lr_of(group).to(param.dtype()))));
}

void Lamb::update_group(const ParamGroup& group, const std::vector<Item>& items,
                        const Tensor& skip) {
  const MomentLists lists = moment_lists(items);
  if (!one_dtype(lists.params)) return Optimizer::update_group(group, items, skip);
  const Device device = lists.params.front().device();
  const Tensor divisor = clip_divisor_.defined() ? clip_divisor_.to(device) : Tensor();
  SKA_KERNEL(device, multi_lamb_step)
  (lists.params, lists.grads, lists.exp_avgs, lists.exp_avg_sqs, lists.steps, skip, divisor,
   lr_of(group), options_.beta1, options_.beta2, options_.eps, group.weight_decay,
   group.weight_decay != 0.0 || options_.always_adapt, options_.trust_clip);
}

// --- Factory ---

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          std::vector<ParamGroup> groups) {
  if (options.name == "sgd") {
    return std::make_unique<Sgd>(std::move(groups), options.momentum, options.nesterov);
  }
  if (options.name == "adam" || options.name == "adamw") {
    return std::make_unique<Adam>(std::move(groups), options.beta1, options.beta2, options.eps,
                                  options.name == "adamw");
  }
  if (options.name == "lamb") {
    Lamb::Options lamb;
    lamb.beta1 = options.beta1;
    lamb.beta2 = options.beta2;
    lamb.eps = options.eps;
    lamb.max_grad_norm = options.max_grad_norm;
    lamb.always_adapt = options.always_adapt;
    lamb.trust_clip = options.trust_clip;
    return std::make_unique<Lamb>(std::move(groups), lamb);
  }
  SKA_FAIL(ValueError, "unknown optimizer '", options.name, "'; known: adam, adamw, lamb, sgd");
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          const NamedTensors& named_params) {
  return make_optimizer(options,
                        param_groups_weight_decay(named_params, options.lr, options.weight_decay,
                                                  options.no_weight_decay));
}

}  // namespace ska::optim
