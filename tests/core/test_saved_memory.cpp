// What a forward pass keeps alive for its backward pass, measured by the host allocator's
// requested bytes: an op keeps the tensors its gradient formula reads and no others, and a ViT
// block keeps exactly the activations its backward pass reads (a regression guard for peak
// training memory, which eager PyTorch's sets the bar for).
#include <catch2/catch.hpp>
#include <functional>

#include "core/allocator.h"
#include "models/vit.h"
#include "nn/layers.h"
#include "nn/mixers/mixer.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::uniform;

namespace {

int64_t requested() { return allocator_for(Device::cpu()).stats().requested; }

int64_t bytes_of(const Tensor& t) { return t.numel() * t.element_size(); }

// The bytes `make` leaves allocated besides its result once everything else it made is dropped:
// what the autograd graph holds for the backward pass.
int64_t kept_besides_output(const std::function<Tensor()>& make) {
  const int64_t before = requested();
  const Tensor out = make();
  return requested() - before - bytes_of(out);
}

}  // namespace

TEST_CASE("ops keep for the backward pass only the tensors their gradients read", "[cpu]") {
  const Tensor x = uniform({64, 32}, 1).to(DType::kF32).set_requires_grad();
  const Tensor scale = uniform({32}, 2).to(DType::kF32).set_requires_grad();
  const Tensor keep = drop_path_factors(64, 0.5, true, DType::kF32, Device::cpu());
  const Tensor cond = gt(uniform({64, 32}, 3), Tensor::zeros({}, DType::kF64));
  // y = exp(x): a fresh tensor in the graph (exp keeps x, which exists anyway), dropped by the
  // caller right after the op under test; kept only if that op's backward holds it.
  const auto with_y = [&](const std::function<Tensor(const Tensor&)>& op) {
    return kept_besides_output([&] { return op(exp(x)); });
  };
  const int64_t y_bytes = 64 * 32 * 4;
  CHECK(with_y([&](const Tensor& y) { return add(y, x); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return sub(x, y); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return where(cond, y, x); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return sum(y); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return mean(y, {0}); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return mul(y, 3.0); }) == 0);  // an affine map
  CHECK(with_y([&](const Tensor& y) { return add(y, 1.0); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return neg(y); }) == 0);
  // A residual sum keeps an operand only for its scale's gradient.
  CHECK(with_y([&](const Tensor& y) { return scaled_residual(x, Tensor(), y, Tensor(), keep); }) ==
        0);
  CHECK(with_y([&](const Tensor& y) { return scaled_residual(x, scale, y, Tensor(), keep); }) == 0);
  CHECK(with_y([&](const Tensor& y) { return scaled_residual(y, scale, x, Tensor(), keep); }) ==
        y_bytes);
  CHECK(with_y([&](const Tensor& y) { return scaled_residual(x, Tensor(), y, scale, keep); }) ==
        y_bytes);
  // The measure itself: ops whose gradients read the operand keep it.
  CHECK(with_y([&](const Tensor& y) { return mul(y, x); }) == y_bytes);
  CHECK(with_y([&](const Tensor& y) { return amax(y, {1}); }) == y_bytes);
}

TEST_CASE("a ViT block under bf16 autocast keeps the activations its backward pass reads",
          "[cpu]") {
  // LSA with 2 heads of 32 over C = 64 channels, an MLP of 128, no dropout. Per token, what the
  // backward pass reads: the first norm's bf16 output (read by the qkv product) and its mean and
  // rstd (f32), the packed bf16 q, k, v and the attention's bf16 output (and its f32 log-sum-exp
  // per head), the f32 residual sum that the second norm normalises, its bf16 output and
  // statistics, the MLP's two bf16 hidden activations (fc1's output for GELU, GELU's for fc2),
  // and the block's f32 output. The residual sums' bf16 branches are not kept. The weights'
  // autocast copies do not grow with the batch: the difference of two batches leaves them out.
  constexpr int64_t kC = 64, kHeads = 2, kHeadDim = 32, kMlp = 128, kTokens = 17;
  const int64_t per_token = (2 * kC + 8)                          // norm 1: bf16 output, mean, rstd
                            + 3 * kHeads * kHeadDim * 2           // q, k, v (bf16)
                            + kHeads * kHeadDim * 2 + kHeads * 4  // attention output, lse
                            + 4 * kC        // the f32 residual sum after attention
                            + (2 * kC + 8)  // norm 2
                            + 2 * kMlp * 2  // fc1's and GELU's outputs (bf16)
                            + 4 * kC;       // the block's output (f32)
  nn::MixerArgs args;
  args.dim = kC;
  args.grid = nn::TokenGrid{4, 4, true};
  args.flavour = nn::MixerFlavour::kVit;
  args.heads = kHeads;
  args.head_dim = kHeadDim;
  const Config mixer = Config::parse("type: lsa\n");
  const auto block = std::make_shared<models::VitBlock>(
      kC, nn::build_mixer_from_node(mixer.root(), args), kMlp, 0.0);
  block->train();
  const auto kept = [&](int64_t batch) {
    const Tensor x = uniform({batch, kTokens, kC}, 5).to(DType::kF32).set_requires_grad();
    const int64_t before = requested();
    Tensor out;
    {
      AutocastGuard autocast(DType::kBF16);
      out = (*block)(x);
    }
    CHECK(out.dtype() == DType::kF32);
    return requested() - before;
  };
  CHECK(kept(7) - kept(3) == 4 * kTokens * per_token);
}
