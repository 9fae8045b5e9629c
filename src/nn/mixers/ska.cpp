// ska: static-key attention (STU in the authors' code).
#include "nn/mixers/ska.h"

#include <cstdint>

#include "nn/mixers/attention_probe.h"
#include "ops/ops.h"

namespace ska::nn {

Ska::Ska(int64_t dim, int64_t num_keys, const SkaOptions& options)
    : options_(options), num_keys_(num_keys) {
  const int64_t width = options.layout.width();
  SKA_CHECK(options.query == "linear" || width == dim, ValueError,
            "ska with query: identity needs heads * head_dim (", width, ") == the width ", dim);
  if (options.query == "linear") {
    qv_ = register_module("qv",
                          std::make_shared<Linear>(dim, 2 * width, options.qkv_bias, options.init));
  } else {
    v_ = register_module("v", std::make_shared<Linear>(dim, width, options.qkv_bias, options.init));
  }
  k = register_parameter(
      "k", init_static_keys({options.layout.heads, num_keys, options.layout.head_dim}));
  scale_ = std::make_unique<LogitScale>(options.scale, options.layout.head_dim, *this);
  attend_ = register_module("attend", std::make_shared<AttentionWeights>(options.activation));
  proj_ = register_module("proj",
                          std::make_shared<Linear>(width, dim, options.proj_bias, options.init));
  // Registered so that eval() reaches it.
  proj_drop_ = register_module("proj_drop", std::make_shared<Dropout>(options.proj_drop));
}

bool Ska::reads_input_by_matmul_only() const { return qv_ != nullptr; }

Tensor Ska::forward(const Tensor& x) { return mix(x, false); }

Tensor Ska::forward_first_token(const Tensor& x) {
  // An attention probe records full maps, which only the whole forward makes.
  if (AttentionRecorder::active()) return Module::forward_first_token(x);
  return mix(x, true);
}

Tensor Ska::mix(const Tensor& x, bool first_only) {
  SKA_CHECK(x.dim() == 3 && x.size(1) == num_keys_, ShapeError, "ska: expected [B, ", num_keys_,
            ", C] tokens (one per static key), got ", shape_str(x.shape()));
  const int64_t heads = options_.layout.heads;
  Tensor q, v;
  if (qv_) {
    const TensorList qv =
        split_heads((*qv_)(x), {options_.layout.width(), options_.layout.width()}, heads);
    q = qv[0];
    v = qv[1];
  } else {
    q = split_heads(x, heads);
    v = split_heads((*v_)(x), heads);
  }
  AttentionSpec spec;
  scale_->configure(spec);
  attend_->configure(spec);
  spec.exclude_diagonal = options_.diagonal_mask;  // query 0 is token 0 also alone
  const Tensor out = merge_heads(attend_qk(first_only ? q.narrow(2, 0, 1) : q, k, v, spec));
  return (*proj_drop_)((*proj_)(out));
}

SkaOptions read_ska_options(const ConfigNode& cfg, const MixerArgs& args) {
  const bool vit = read_vit_flavour(cfg, args);
  SkaOptions o;
  o.layout = vit ? read_head_layout(cfg, args, 10, 64) : read_head_layout(cfg, args, 0, 32);
  o.query = cfg.get_choice("query", vit ? "linear" : "identity", {"linear", "identity"});
  o.qkv_bias = cfg.get<bool>("qkv_bias", false);
  o.proj_bias = cfg.get<bool>("proj_bias", vit);
  o.proj_drop = cfg.get_double_in("proj_drop", args.proj_drop, 0.0, 1.0);
  o.init = args.init;
  o.scale = read_logit_scale(cfg, "scale", true, vit ? "learnable" : "fixed");
  o.diagonal_mask = cfg.get<bool>("diagonal_mask", vit);
  o.activation = cfg.get_choice("activation", "softmax", AttentionWeights::names());
  if (o.query == "identity" && o.layout.width() != args.dim) {
    cfg.fail("query", "identity queries need heads * head_dim (" +
                          std::to_string(o.layout.width()) + ") == the width " +
                          std::to_string(args.dim));
  }
  return o;
}

void register_ska_mixer(Registry<MixerBuilder>& r) {
  r.add("ska", [](const ConfigNode& cfg, const MixerArgs& args) -> ModulePtr {
    return std::make_shared<Ska>(args.dim, args.grid.tokens(), read_ska_options(cfg, args));
  });
}

}  // namespace ska::nn
