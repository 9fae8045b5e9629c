// CaiT (lucidrains' CIFAR variant): patch-attention layers with talking heads, then class-attention
// layers in which the class token attends to [class, patches]; SKA / CSKA logits in patch layers
// (the attention itself is nn/mixers/attention_core; CaiT supplies the layout and names).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/block_chain.h"
#include "models/model.h"
#include "nn/layers.h"
#include "nn/mixers/attention_parts.h"

namespace ska::models {

struct CaitAttentionOptions {
  int64_t dim = 512;
  int64_t heads = 8;
  int64_t head_dim = 64;
  // How the logits are formed. kMhsa: q k^T from to_q / to_kv. kSka: static keys `static_key`
  // [h, K, d]. kCska: `to_k`, a grouped 3x3 conv over the query grid, outputs each query's logits
  // over the context tokens directly (no q k^T).
  nn::AttentionKind logits = nn::AttentionKind::kMhsa;
  bool scaled = true;                  // multiply logits by head_dim^-0.5 (always for kMhsa)
  std::string activation = "softmax";  // or gelu | relu | starrelu (ablations: no normalisation)
  // kSka: the static keys lie on a grid f times finer than the token grid (f^2 keys per token,
  // each using its token's value); f = 1: one key per token.
  int64_t key_grid_factor = 1;
  bool talking_heads = true;  // learnt h x h head mixes before and after the normalisation
  bool class_query = false;   // only token 0 queries (class attention); all tokens are context
  double dropout = 0.0;       // after the output projection
  TokenGrid grid;             // the spatial context tokens (kCska, kSka)
};

// Multi-head attention of CaiT. x [B, N, C] -> [B, N, C] ([B, 1, C] with class_query).
class CaitAttention : public nn::Module {
 public:
  explicit CaitAttention(const CaitAttentionOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override;
  // Patch attention with stacked projections (nn::stacked_linear): q and k, v (or v) by one
  // product of its input.
  bool reads_input_by_matmul_only() const override;

  // Class attention: the query token [B, 1, C] (the normalised class token) against the keys and
  // values of context [B, N, C]; forward(x) is this with x's first token as the query.
  Tensor class_attention(const Tensor& query, const Tensor& context);

  const CaitAttentionOptions& options() const { return options_; }
  // The dropout after the output projection.
  double take_output_dropout() override { return drop_->take_over(); }

 private:
  Tensor fine_values(const Tensor& v) const;  // kSka: each token's value once per fine key
  // The heads' attention from the head-split queries q [B, h, Nq, d], keys k (mhsa; undefined
  // for ska and cska, whose logits come without them) and values v [B, h, N, d], projected out.
  Tensor attend_heads(const Tensor& q, Tensor k, Tensor v);

  CaitAttentionOptions options_;
  std::shared_ptr<nn::Linear> to_q_, to_kv_, to_v_, to_out_;
  std::shared_ptr<nn::Conv2d> to_k_;
  std::shared_ptr<nn::AttentionWeights> attend_;
  std::shared_ptr<nn::Dropout> drop_;
  Tensor static_key_, mix_pre_, mix_post_;
  int64_t fine_factor_ = 1;  // kSka: keys per token along each grid axis
};

struct CaitBlockOptions {
  CaitAttentionOptions attention;
  int64_t mlp_dim = 512;
  double dropout = 0.0;           // in the feed-forward
  double layer_scale_init = 0.1;  // LayerScale of both sublayers
};

// x + LayerScale(PreNorm(attn)), then x + LayerScale(PreNorm(mlp)); the dropouts closing the two
// branches run inside the residual sums (nn::residual_sum). A class block takes
// [B, 1 + N, C] (class token first) and updates only the class token; as in lucidrains' CaiT
// the keys and values come from [norm(class), patches] (the patches are not normalised).
// CaitLayerStack runs class blocks by class_update, on the class token and the patches apart.
// Patch blocks chain (models/block_chain.h): a block's MLP sum is fused with the next block's
// norm1, its LayerScale inside add_layer_norm's kernels.
class CaitBlock : public ChainedBlock {
 public:
  explicit CaitBlock(const CaitBlockOptions& options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "CaitBlock"; }
  bool class_block() const { return class_block_; }
  // norm1, its output written in the autocast dtype where the attention reads it only by one
  // product (stacked projections: a process-wide switch, so set here, before the norm runs).
  nn::LayerNorm& first_norm() override;
  // Patch blocks only (a class block's norm1 reads the class token alone).
  ResidualNorm forward_chained(const ResidualNorm& in, ChainedBlock* next) override;
  // A class block's update: the class token cls [B, 1, C] after the block, its keys and values
  // from [norm1(cls), patches] (patches [B, N, C], which the block does not change). forward(x)
  // of a class block is this on x's two parts, concatenated again.
  Tensor class_update(const Tensor& cls, const Tensor& patches);
  // In training, the two branches are multiplied by `kept` (one f32 element on the block's
  // device, 0 or 1; undefined: always 1), folded into their LayerScales: at 0 the block returns
  // its input bit for bit and its parameters get zero gradients (CaitLayerStack's layer dropout
  // drawn on the device).
  void set_kept(Tensor kept) { kept_ = std::move(kept); }

 private:
  // x + ls1(attended), then the MLP's residual: fused with next's first norm where there is a
  // next block (else normed undefined).
  ResidualNorm residual_mlp(const Tensor& x, const Tensor& attended, ChainedBlock* next);
  // What scaled_operand(ls, branch) gives, times kept_ when it applies.
  nn::ScaledOperand scaled_branch(nn::Module& ls, const Tensor& branch);

  bool class_block_;
  std::shared_ptr<nn::LayerNorm> norm1_, norm2_;
  std::shared_ptr<CaitAttention> attn_;
  std::shared_ptr<nn::Scale> ls1_, ls2_;
  std::shared_ptr<nn::Mlp> mlp_;
  // The probabilities of the dropouts that close the attention's and the MLP's branches, taken
  // over from them (Module::take_output_dropout) and applied in the residual sums.
  double attn_drop_ = 0.0, mlp_drop_ = 0.0;
  Tensor kept_;  // set_kept
};

// CaiT's layer dropout rule: from n + 1 uniform draws u, layer i runs if u_i >= layer_dropout;
// if none does, layer min(n - 1, floor(u_n n)) alone runs. kept_layers is the host's form (u in
// f64, as the CPU's generator draws them for CaitLayerStack), LayerKeepRule the device's, on f32
// draws (every uniform draw is an f32 value, so both decide alike for the same draws): its
// thresholds are the smallest f32 values at or above layer_dropout and i / n, so that f32
// comparisons give the exact comparisons' answers.
std::vector<bool> kept_layers(const std::vector<double>& u, double layer_dropout);
class LayerKeepRule {
 public:
  LayerKeepRule() = default;
  LayerKeepRule(int64_t layers, double layer_dropout, Device device);
  // u: f32 [n + 1] on the rule's device -> f32 [n], 1 for the layers that run and 0 for the others
  // (a few elementwise ops and a max, on the device).
  Tensor kept(const Tensor& u) const;

 private:
  int64_t layers_ = 0;
  // f32: layer_dropout's threshold [1]; u_n's share [lower_i, upper_i) for layer i [n] each.
  Tensor threshold_, lower_, upper_;
};

// Blocks applied in order; in training each block is skipped with probability layer_dropout
// (the same draw for the whole batch), keeping at least one (kept_layers). Eval runs every block.
//
// Which blocks run is drawn on the host at every training forward (n + 1 uniform f64 draws from
// the CPU's generator), and the others are not computed. After draw_on_device the same rule is
// evaluated on the device from the device's generator (LayerKeepRule), every block is computed,
// and a dropped one is multiplied out (CaitBlock::set_kept): the same outputs and gradients as
// the skipped block's (but for a dropped block whose branches overflow: 0 * inf), zero gradients
// for its parameters, which the optimizer's grad gates then leave alone, and draws a CUDA Graph
// replays; it costs the dropped blocks' work (layer_dropout of the stack's on average).
//
// A stack of class blocks passes the class token alone from block to block (forward_class):
// every block reads the same patches, and [class, patches] is formed only inside each block's
// attention context, not as each block's output (which would copy the patches twice a block
// and sum their gradient through a concatenation per block).
class CaitLayerStack : public nn::Module {
 public:
  explicit CaitLayerStack(double layer_dropout) : layer_dropout_(layer_dropout) {}
  void append(std::shared_ptr<CaitBlock> block);
  // Patch blocks: x [B, N, C] through the blocks that run. Class blocks: x [B, 1 + N, C], class
  // token first: forward_class on its two parts, concatenated again.
  Tensor forward(const Tensor& x) override;
  // Class blocks: the class token cls [B, 1, C] after the blocks that run, each reading patches
  // [B, N, C]; each block's call recorded as its operator() would be (model summaries).
  Tensor forward_class(const Tensor& cls, const Tensor& patches);
  std::string type_name() const override { return "CaitLayerStack"; }
  // With layer dropout, which layers run is drawn on the host at every training forward, until
  // draw_on_device.
  std::string host_draws() const override;
  // Block i's parameters ("i.<name>") gated by element i of the dropped flags.
  std::vector<std::pair<std::string, Tensor>> draw_on_device(Device device) override;
  // After draw_on_device: which blocks the last training forward ran (f32 [n], 0 or 1).
  const Tensor& kept_on_device() const { return kept_; }

 private:
  void draw_kept_on_device();  // writes kept_ and dropped_
  // The blocks this forward runs, in order: all of them, or in training those the layer
  // dropout keeps (drawn on the host, or on the device after draw_on_device, where all run).
  // DeviceError for an input on another device than the device draws.
  std::vector<CaitBlock*> running_blocks(Device input);

  double layer_dropout_;
  std::vector<std::shared_ptr<CaitBlock>> blocks_;
  // draw_on_device's state, on the device: the blocks kept (f32 [n]) and dropped (u8 [n]) by the
  // last training forward, and the rule.
  Tensor kept_, dropped_;
  LayerKeepRule rule_;
};

struct CaitOptions {
  ModelInput input{32, 3, 10};
  int64_t patch_size = 4;
  int64_t dim = 512;
  int64_t depth = 6;      // patch-attention layers
  int64_t cls_depth = 2;  // class-attention layers
  int64_t mlp_dim = 512;
  double dropout = 0.1;
  double emb_dropout = 0.1;
  double layer_dropout = 0.05;
  double layer_scale_init = 0.1;
  CaitAttentionOptions patch_attention;  // heads, head width, logits of the patch layers
};

// images [B, in_channels, S, S] -> logits [B, num_classes].
class Cait : public nn::Module {
 public:
  explicit Cait(const CaitOptions& options);
  Tensor forward(const Tensor& images) override;
  std::string type_name() const override { return "CaiT"; }

 private:
  Tensor patchify(const Tensor& images) const;

  CaitOptions options_;
  std::shared_ptr<nn::Linear> patch_embed_, head_;
  std::shared_ptr<nn::Dropout> emb_drop_;
  std::shared_ptr<CaitLayerStack> patch_layers_, class_layers_;
  std::shared_ptr<nn::LayerNorm> head_norm_;
  Tensor pos_embed_, cls_token_;
};

// Reads a model map with `family: cait` (keys and defaults in configs/models/cait_s.yaml).
CaitOptions read_cait_options(const ConfigNode& cfg, const ModelInput& input);

}  // namespace ska::models
