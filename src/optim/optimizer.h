// Optimizers over parameter groups (SGD, Adam, AdamW, LAMB): fused in-place updates on the
// parameters' device, per-parameter state saved and restored as named tensors, config parsing.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ska {
class ConfigNode;
}

namespace ska::optim {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Parameters that share a learning rate and weight decay. Names key the optimizer state.
struct ParamGroup {
  NamedTensors params;
  double lr = 0.0;
  double weight_decay = 0.0;
};

// timm's param_groups_weight_decay: trainable parameters split into a no-decay group (1-D
// tensors: norm weights, biases, scales; names ending in ".bias"; names matching a pattern of
// `no_weight_decay`, where '*' and '?' are wildcards) and a decay group, in that order; empty
// groups are left out, and weight_decay == 0 gives one group. Both groups get `lr`.
std::vector<ParamGroup> param_groups_weight_decay(const NamedTensors& named_params, double lr,
                                                  double weight_decay,
                                                  const std::vector<std::string>& no_weight_decay);
// fnmatch-style match of `name` against `pattern` ('*' any run, '?' one character).
bool name_matches(const std::string& name, const std::string& pattern);

// What configures an optimizer (the `optim:` section of a config).
struct OptimizerOptions {
  std::string name = "adamw";  // sgd | adam | adamw | lamb
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;           // lamb: 1e-6 unless set (timm's default)
  double momentum = 0.9;       // sgd
  bool nesterov = false;       // sgd
  double max_grad_norm = 1.0;  // lamb: global gradient norm clip inside the step; 0 = off
  bool always_adapt = false;   // lamb: trust ratio also for groups without weight decay
  bool trust_clip = false;     // lamb: trust ratio clipped at 1 (LAMBC)
  std::vector<std::string> no_weight_decay;  // name patterns kept out of weight decay

  // Reads and range-checks `node` (the optim map); ConfigError names the key at fault.
  static OptimizerOptions from_config(const ConfigNode& node);
};

// Base class: groups, learning rate, zeroing, the step loop and the state bookkeeping.
// Parameters must be contiguous floating tensors on one device; grads must match their shape,
// dtype and device. A parameter without a grad is skipped (its step count does not advance), as
// in PyTorch; so is one whose grad gate is set (set_grad_gates). The update counts live on the
// parameters' device, so that a step can be skipped by a flag computed there (non-finite gradients)
// without the host reading it.
class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string name() const = 0;
  // One update of every parameter that has a grad, in place, on its device (no host sync).
  // `skip`: undefined, or a u8 one-element tensor on the parameters' device; when its value is
  // nonzero the step changes nothing (parameters, moments, update counts), as if not called.
  void step(const Tensor& skip = Tensor());
  // Drops every grad (set_to_none, PyTorch's default) or fills it with zeros.
  void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& groups() { return groups_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Sets the lr of every group (what a schedule does each step / epoch). The update kernels read
  // each group's lr from device memory, written here (a fill, no host synchronisation); step()
  // also writes a group whose lr was changed through groups().
  void set_lr(double lr);
  // For the next step() only: the global gradient norm over every parameter of the model, for
  // an optimizer that needs one (LAMB's clip) when this one steps only some parameters (the
  // sharded optimizer state of data parallelism: each worker updates its share).
  void set_global_grad_norm(const Tensor& norm) { global_grad_norm_ = norm; }

  // Parameters whose gradient a training forward may leave out by a decision drawn on the device
  // (nn::draw_on_device: CaiT's layer dropout, drawn there so that a CUDA Graph can replay it):
  // each entry names a parameter and its flag, one u8 element on the parameters' device (a view
  // shared by a layer's parameters). The backward gives a left-out parameter a zero gradient;
  // while its flag is nonzero, step() leaves it, its moments and its update count as they are,
  // as it leaves a parameter without a grad. Replaces earlier gates; ValueError for a name this
  // optimizer lacks or a flag that is not one u8 element on that device.
  void set_grad_gates(const NamedTensors& gates);

  // State for checkpoints: "<param>.step" (i64 scalar, CPU) and "<param>.<slot>" per parameter
  // that has been stepped. The tensors are the live state: clone them for a snapshot.
  // Reading the counts back makes this a host synchronisation (a checkpoint's, not a step's).
  std::map<std::string, Tensor> state_dict() const;
  // Restores state saved by state_dict (values converted to each parameter's device and dtype).
  // ValueError / ShapeError naming the key for unknown parameters or slots, missing slots and
  // mis-shaped tensors; parameters absent from `state` start fresh.
  void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  struct ParamState {
    Tensor step;  // i64, one element on the device: updates applied, this one included
    std::map<std::string, Tensor> slots;  // moments / momentum buffer, like the parameter
  };
  // The state tensors this optimizer keeps per parameter ("exp_avg", ...).
  virtual std::vector<std::string> slot_names() const = 0;
  // Called once per step() before the updates (LAMB computes its global grad clip here).
  virtual void begin_step() {}
  // Updates one parameter unless `skip` (undefined or as in step()) is set; state.step has
  // already been advanced (unless skipped).
  virtual void update(const ParamGroup& group, const Tensor& param, const Tensor& grad,
                      ParamState& state, const Tensor& skip) = 0;
  // A parameter of a group that steps now, with its (contiguous) grad and its state.
  struct Item {
    Tensor param, grad;
    ParamState* state;
  };
  // The lists an Adam-family multi-tensor kernel takes: the items' parameters, grads, "exp_avg"
  // and "exp_avg_sq" slots and update counts.
  struct MomentLists {
    TensorList params, grads, exp_avgs, exp_avg_sqs, steps;
  };
  static MomentLists moment_lists(const std::vector<Item>& items);
  // Updates the parameters of one group that have grads: update() for each, unless an optimizer
  // has a multi-tensor kernel for the whole list.
  virtual void update_group(const ParamGroup& group, const std::vector<Item>& items,
                            const Tensor& skip);

  Tensor global_grad_norm_;  // set_global_grad_norm's value for this step; cleared after it

  // The lr of `group` (one of groups()) as the kernels read it: one f64 element on the device.
  Tensor lr_of(const ParamGroup& group) const;

 private:
  ParamState& state_for(const std::string& name, const Tensor& param);
  // Writes the lr of every group whose device copy is stale.
  void write_lrs();

  std::vector<ParamGroup> groups_;
  std::map<std::string, ParamState> state_;
  std::map<std::string, int64_t> index_;  // parameter name -> its element of counts_
  // set_grad_gates: the distinct flags, and each gated parameter's index into them.
  std::vector<Tensor> gates_;
  std::map<std::string, size_t> gate_of_;
  Tensor counts_;  // i64 [parameters] on their device: the update count of each parameter
  Tensor lrs_;     // f64 [groups] on that device: each group's lr, as the kernels read it
  std::vector<double> lrs_written_;  // what lrs_ holds (NaN: not written yet)
};

// torch.optim.SGD with dampening 0: momentum, Nesterov, coupled (L2) weight decay.
class Sgd : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, double momentum, bool nesterov);
  std::string name() const override { return "sgd"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state,
              const Tensor& skip) override;
  void update_group(const ParamGroup& group, const std::vector<Item>& items,
                    const Tensor& skip) override;

 private:
  double momentum_;
  bool nesterov_;
};

// torch.optim.Adam (L2 weight decay added to the gradient) or, with decoupled_decay,
// torch.optim.AdamW (param *= 1 - lr * weight_decay). amsgrad is not supported.
class Adam : public Optimizer {
 public:
  Adam(std::vector<ParamGroup> groups, double beta1, double beta2, double eps,
       bool decoupled_decay);
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state,
              const Tensor& skip) override;
  void update_group(const ParamGroup& group, const std::vector<Item>& items,
                    const Tensor& skip) override;

 private:
  double beta1_, beta2_, eps_;
  bool decoupled_;
};

// timm's Lamb (defaults: bias correction, grad averaging, decoupled_decay off): gradients divided
// by max(global_norm / max_grad_norm, 1) (timm divides p.grad in place; here the grads are left
// as they are), Adam direction plus weight_decay * param, scaled by the trust ratio
// ||param|| / ||update|| (1 when either norm is 0; min(., 1) with trust_clip) for groups with
// weight decay or when always_adapt; param -= lr * update. Norms stay on the device.
class Lamb : public Optimizer {
 public:
  struct Options {
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-6;
    double max_grad_norm = 1.0;  // <= 0: no global clipping
    bool always_adapt = false;
    bool trust_clip = false;
  };
  Lamb(std::vector<ParamGroup> groups, const Options& options);
  std::string name() const override { return "lamb"; }

 protected:
  std::vector<std::string> slot_names() const override;
  void begin_step() override;
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad, ParamState& state,
              const Tensor& skip) override;
  void update_group(const ParamGroup& group, const std::vector<Item>& items,
                    const Tensor& skip) override;

 private:
  Options options_;
  Tensor clip_divisor_;  // this step's max(global_norm / max_grad_norm, 1), f32 on the device
};

// The optimizer named by options.name over `groups` (group lr / weight_decay are kept as given).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          std::vector<ParamGroup> groups);
// Groups from param_groups_weight_decay(named_params, options...) and make_optimizer.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options,
                                          const NamedTensors& named_params);

}  // namespace ska::optim
