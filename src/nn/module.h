// Module: the base of every layer and model. Owns named parameters, buffers and child modules
// (dotted hierarchical names as in PyTorch's state_dict), train/eval mode and device moves.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ska::nn {

// True when a stored tensor of dtype `stored` may be loaded into a parameter or buffer of dtype
// `target` without an explicit conversion: the same dtype, or two floating dtypes (F32, F64,
// BF16, F16). Integers stored for floats (or floats for integers) are a mistake to report.
bool dtype_loads_into(DType stored, DType target);

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. Token mixers and blocks take and return [B, N, C]; see each module's doc.
  virtual Tensor forward(const Tensor& x) = 0;
  // A short type name for summaries ("Linear", "CSKA", ...).
  virtual std::string type_name() const = 0;
  // Whether forward reads its input only through one matrix product (a single linear layer, which
  // autocast casts to its lower precision anyway), after exact rearrangements at most. A LayerNorm
  // in front of such a module may write its output in the autocast dtype (LayerNorm::
  // autocast_output): the same bits, without the f32 round trip. (Two products reading it would
  // sum their gradients in 16 bits instead of f32.)
  virtual bool reads_input_by_matmul_only() const { return false; }
  // Runs forward; when a SummaryRecorder is active, records this call (see nn/summary.h).
  Tensor operator()(const Tensor& x);
  // forward(x)'s first token alone, [B, 1, C], for a block whose next layer reads only the class
  // token: what forward_first_token computes, recorded as operator() records forward.
  Tensor first_token(const Tensor& x);
  // The computation of first_token. By default forward(x).narrow(1, 0, 1); a token mixer that can
  // compute token 0 without the other tokens' outputs overrides it (Attention: the class token's
  // query alone against every key).
  virtual Tensor forward_first_token(const Tensor& x);
  // Hands the dropout that ends forward (a mixer's proj_drop, an MLP's second dropout) over to
  // the caller: from then on forward (and forward_first_token) return the output undropped, and
  // the caller applies a dropout of the returned probability in training, fused into its residual
  // sum (residual_sum, nn/layers.h). 0 for a module that ends in no dropout it can hand
  // over; nothing changes then. A block calls it once, when it is built.
  virtual double take_output_dropout() { return 0.0; }
  // What this module's own forward draws on the host in training ("" when nothing), which a
  // CUDA Graph of the training step would freeze: the graph replays the device's work alone, so
  // a decision the host draws (CaiT's layer dropout) would be the captured step's in every
  // replay. Device draws (dropout, drop path) replay correctly. See host_draws_in_training().
  virtual std::string host_draws() const { return ""; }
  // Makes the draws host_draws() names happen on `device` (where the module is) instead, so that
  // a CUDA Graph of the training step replays them: host_draws() is "" from then on. What such a
  // draw decides reaches the device's work through tensors the forward writes there. Returns the
  // parameters (names relative to this module) whose gradient a training forward may then leave
  // out, each with its flag: one u8 element on `device`, nonzero after a forward that left the
  // parameter out. The backward gives such a parameter zeros; the optimizer must leave it as it
  // is while its flag is set (optim::Optimizer::set_grad_gates). Default: nothing to move.
  virtual std::vector<std::pair<std::string, Tensor>> draw_on_device(Device device) {
    (void)device;
    return {};
  }

  // --- Registration (in the constructor) ---
  // Trainable parameters require grad; non-trainable ones (e.g. Swin's stored masks in the
  // authors' code) count in "all parameters" only.
  Tensor register_parameter(const std::string& name, Tensor value, bool trainable = true);
  // Persistent state that is not a parameter (batch-norm running statistics).
  Tensor register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // --- Traversal ---
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool trainable_only = false) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children() const { return children_; }
  TensorList parameters(bool trainable_only = true) const;
  int64_t num_parameters(bool trainable_only = true) const;

  // Parameters and buffers by dotted name (what safetensors checkpoints hold).
  std::map<std::string, Tensor> state_dict() const;
  // Copies values into this module's tensors (converting between floating dtypes, and device).
  // Reports every missing, unexpected, mis-shaped and mis-typed (see dtype_loads_into) name in
  // one ShapeError, or a DTypeError when only dtypes are at fault; with strict = false missing
  // and unexpected names are allowed (mis-shaped and mis-typed ones never are). Convert a
  // tensor with .to(dtype) first to load it anyway.
  void load_state_dict(const std::map<std::string, Tensor>& values, bool strict = true);

  // --- Mode and placement ---
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer in place (the Tensor handles stay valid).
  void to(Device device);
  void to(DType dtype);  // floating parameters and buffers only

 protected:
  // Called by train(); modules with per-mode state may override (call the base).
  virtual void on_train_mode(bool on) {}

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, bool params, bool trainable_only,
               std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

using ModulePtr = std::shared_ptr<Module>;

// The first module under `root` (root included) whose training forward draws on the host, as
// "NAME: WHAT" (Module::host_draws; the name is root's for root itself), or "" when none does.
std::string host_draws_in_training(Module& root);
// Module::draw_on_device for root and every module below it; the flags keyed by the parameters'
// names in root (as root.named_parameters() gives them). Call it once the model is on `device`.
std::vector<std::pair<std::string, Tensor>> draw_on_device(Module& root, Device device);

// Applies children in order.
class Sequential : public Module {
 public:
  Sequential() = default;
  void append(const std::string& name, ModulePtr module) {
    layers_.push_back(register_module(name, std::move(module)));
  }
  size_t size() const { return layers_.size(); }
  Module& at(size_t i) const { return *layers_.at(i); }
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }

 private:
  std::vector<ModulePtr> layers_;
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};

}  // namespace ska::nn
