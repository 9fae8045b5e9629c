// CSKA's convolutional logits on CUDA (cuda/kernels/conv_logits.cu, the grid_conv_logits op and
// conv_logits' direct form) against the CPU twin and the convolution.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/conv_logits_geometry.h"
#include "backend/device_runtime.h"
#include "nn/mixers/attention_core.h"
#include "ops/autocast.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;

namespace {

const Device kGpu = Device::cuda(0);

struct Case {
  int64_t batch, heads, height, width, keys, d, k;
  bool bias;
  bool misaligned = false;  // q's rows 4 elements off 16-byte alignment: element-wise staging
  // Where the logits are written: 0 a tensor of their own; 1 rows 1 to P of [B, h, 1 + P, K] (a
  // class row first, as CSKA-ViT's); 2 columns 0 to K - 1 of [B, h, P, K + 1] (an odd row stride
  // for an even K: no paired stores); 3 rows 1 to P of [B, h, 1 + P, K] in rows padded to 16
  // bytes (CSKA-ViT's mixer, empty_aligned_rows: paired stores for an odd K too).
  int out_layout = 0;
};

std::string describe(const Case& c) {
  return std::to_string(c.batch) + " x " + std::to_string(c.heads) + " heads of " +
         std::to_string(c.d) + " on " + std::to_string(c.height) + "x" + std::to_string(c.width) +
         ", " + std::to_string(c.keys) + " keys, " + std::to_string(c.k) + "x" +
         std::to_string(c.k) + (c.bias ? ", bias" : "") + (c.misaligned ? ", misaligned q" : "") +
         (c.out_layout == 1   ? ", logits below a class row"
          : c.out_layout == 2 ? ", logits in a wider tensor's columns"
          : c.out_layout == 3 ? ", logits below a class row in padded rows"
                              : "");
}

// Every element of `actual` within rel * max|expected| of `expected`: sums of hundreds of
// products rounded once to 16 bits, in another order than the reference's.
void require_scaled_close(const Tensor& actual, const Tensor& expected, double rel,
                          const std::string& what) {
  const double scale = amax(abs(expected.to(Device::cpu()).to(DType::kF64))).item();
  test::require_close(actual, expected, {rel * scale + 1e-6, 0.0}, what);
}

// The op's outputs and gradients (of sum(logits * weights)) for q, w and the bias.
TensorList logits_and_grads(const Tensor& q, const Tensor& w, const Tensor& bias, const Case& c,
                            const Tensor& weights) {
  const Tensor logits = grid_conv_logits(q, w, bias, c.height, c.width);
  sum(logits.to(DType::kF32) * weights).backward();
  TensorList out = {logits, q.grad(), w.grad()};
  if (bias.defined()) out.push_back(bias.grad());
  return out;
}

// The CUDA kernels in `dt` against the CPU twin in f32 on the same (rounded) values. q is the
// first piece of split_heads on a [B, H*W, 2 h d] projection, as CSKA's mixers pass it (its
// gradient written into the projection's), or, misaligned, the heads of the last h d columns of
// a [B, H*W, h d + 4] one (a gradient of its own).
void check_case(const Case& c, DType dt) {
  INFO(describe(c) << ", " << dtype_name(dt));
  REQUIRE(conv_logits_direct_fits(c.d, c.width, c.k));
  const int64_t positions = c.height * c.width;
  const int64_t first = c.misaligned ? 4 : 0;
  const int64_t columns = c.misaligned ? c.heads * c.d + 4 : 2 * c.heads * c.d;
  const Tensor proj = test::uniform({c.batch, positions, columns}, 1).to(dt);
  const Tensor w0 = test::uniform({c.heads, c.k * c.k, c.keys, c.d}, 2, -0.2, 0.2).to(dt);
  const Tensor b0 = c.bias ? test::uniform({c.heads, c.keys}, 3).to(dt) : Tensor();
  const Tensor weights = test::uniform({c.batch, c.heads, positions, c.keys}, 4).to(DType::kF32);
  const auto run = [&](Device device, DType dtype) {
    const Tensor p = proj.to(device).to(dtype).set_requires_grad(true);
    // CSKA's q: the kernel writes its gradient into the projection's (a strided grad_q).
    const int64_t hd = c.heads * c.d;
    const Tensor q = c.misaligned ? nn::split_heads(p.narrow(2, first, hd), c.heads)
                                  : nn::split_heads(p, {hd, hd}, c.heads)[0];
    const Tensor w = w0.to(device).to(dtype).set_requires_grad(true);
    const Tensor b = c.bias ? b0.to(device).to(dtype).set_requires_grad(true) : Tensor();
    // Around a view, NaN: the comparison below fails where the kernels write outside it.
    Tensor whole;
    Tensor view;
    if (c.out_layout == 1) {
      whole = Tensor::full({c.batch, c.heads, 1 + positions, c.keys}, NAN, dtype, device);
      view = whole.narrow(2, 1, positions);
    } else if (c.out_layout == 2) {
      whole = Tensor::full({c.batch, c.heads, positions, c.keys + 1}, NAN, dtype, device);
      view = whole.narrow(3, 0, c.keys);
    } else if (c.out_layout == 3) {
      const Tensor rows =
          empty_aligned_rows({c.batch, c.heads, 1 + positions, c.keys}, dtype, device);
      whole =
          Tensor::make_view(rows.storage(), {c.batch, c.heads, 1 + positions, rows.stride(2)},
                            contiguous_strides({c.batch, c.heads, 1 + positions, rows.stride(2)}),
                            rows.offset(), dtype);
      whole.fill_(NAN);
      view = rows.narrow(2, 1, positions);
    }
    const Tensor logits = grid_conv_logits(q, w, b, c.height, c.width, view);
    sum(logits.to(DType::kF32) * weights.to(device)).backward();
    if (whole.defined()) {
      CHECK(logits.same_storage(whole));
      TensorList around;  // the class row, and the columns past the keys
      if (c.out_layout != 2) around.push_back(whole.narrow(2, 0, 1));
      if (c.out_layout != 1) {
        around.push_back(whole.narrow(3, c.keys, whole.size(3) - c.keys)
                             .narrow(2, c.out_layout == 3, positions));
      }
      for (const Tensor& t : around) {
        const std::vector<double> v = t.to(Device::cpu()).to(DType::kF64).to_vector<double>();
        CHECK(std::all_of(v.begin(), v.end(), [](double e) { return std::isnan(e); }));
      }
    }
    TensorList out = {logits, p.grad().narrow(2, first, c.heads * c.d), w.grad()};
    if (b.defined()) out.push_back(b.grad());
    return out;
  };
  const TensorList gpu = run(kGpu, dt), cpu = run(Device::cpu(), DType::kF32);
  const char* names[] = {"logits", "q grad", "w grad", "bias grad"};
  REQUIRE(gpu.size() == cpu.size());
  for (size_t i = 0; i < gpu.size(); ++i) {
    CHECK(gpu[i].dtype() == dt);
    require_scaled_close(gpu[i], cpu[i], 1e-2, names[i]);
  }
  // A gradient reached q (the comparison above is relative to its largest element).
  CHECK(amax(abs(gpu[1].to(Device::cpu()).to(DType::kF64))).item() > 0.0);
}

}  // namespace

TEST_CASE("cuda conv logits: the tensor-core kernels against the CPU twin", "[cuda][emu-slow]") {
  if (!test::cuda_available_or_skip()) return;
  // CSKA-ViT-S's logits (8x8 queries, 65 keys, 8 heads of 64), with fewer images; and as the mixer
  // writes them, below the class row.
  check_case({3, 8, 8, 8, 65, 64, 3, false}, DType::kBF16);
  check_case({3, 8, 8, 8, 65, 64, 3, false, false, 1}, DType::kBF16);
  check_case({3, 8, 8, 8, 65, 64, 3, false, false, 3}, DType::kBF16);
  // CSKAFormer-S18's stage 2 (28x28 queries over 784 keys, head dim 16), with its bias; below a
  // row (even strides: paired stores) and in columns of a wider tensor (an odd row stride).
  check_case({2, 2, 28, 28, 784, 16, 3, true}, DType::kBF16);
  check_case({2, 2, 28, 28, 784, 16, 3, true, false, 1}, DType::kBF16);
  check_case({2, 2, 28, 28, 784, 16, 3, true, false, 2}, DType::kBF16);
  // Fewer positions than a block's 64, an even key count, head dim 32.
  check_case({2, 3, 7, 7, 50, 32, 3, true}, DType::kBF16);
  // A non-square grid, an odd key count, head dim 48 (a 64-wide instantiation part used), f16.
  check_case({2, 2, 5, 9, 13, 48, 3, true}, DType::kF16);
  // 5x5 filters and head dim 128 on 14x14 (the widest halo of the cases).
  check_case({1, 2, 14, 14, 70, 128, 5, false}, DType::kBF16);
  // 1x1 filters; and enough images for grad_w to sum several chunks of positions.
  check_case({2, 2, 6, 6, 9, 16, 1, true}, DType::kBF16);
  // q's rows off 16-byte alignment (staged element by element).
  check_case({2, 3, 7, 7, 50, 32, 3, true, true}, DType::kBF16);
  const Case many{40, 2, 8, 8, 65, 64, 3, true};
  REQUIRE(conv_logits_chunks(
              {many.batch, many.heads, many.height, many.width, many.keys, many.d, many.k})
              .chunks > 1);
  check_case(many, DType::kBF16);
  // A grid too wide for the kernels' shared tiles: a ShapeError from the op (the mixers take the
  // convolution there).
  REQUIRE_FALSE(conv_logits_direct_fits(16, 400, 3));
  CHECK_THROWS_AS(
      grid_conv_logits(test::uniform({1, 1, 400, 16}, 1).to(kGpu, DType::kBF16),
                       test::uniform({1, 9, 3, 16}, 2).to(kGpu, DType::kBF16), Tensor(), 1, 400),
      ShapeError);
}

TEST_CASE("cuda conv logits: the kernels repeat their results bit for bit", "[cuda]") {
  if (!test::cuda_available_or_skip()) return;
  const Case c{6, 4, 14, 14, 196, 32, 3, true};
  const Tensor weights =
      test::uniform({c.batch, c.heads, c.height * c.width, c.keys}, 4).to(kGpu, DType::kF32);
  TensorList runs[2];
  for (TensorList& r : runs) {
    const Tensor q = test::uniform({c.batch, c.heads, c.height * c.width, c.d}, 1)
                         .to(kGpu, DType::kBF16)
                         .set_requires_grad(true);
    const Tensor w = test::uniform({c.heads, 9, c.keys, c.d}, 2, -0.2, 0.2)
                         .to(kGpu, DType::kBF16)
                         .set_requires_grad(true);
    const Tensor b =
        test::uniform({c.heads, c.keys}, 3).to(kGpu, DType::kBF16).set_requires_grad(true);
    r = logits_and_grads(q, w, b, c, weights);
  }
  for (size_t i = 0; i < runs[0].size(); ++i) CHECK(test::bitwise_equal(runs[0][i], runs[1][i]));
}

// Case c's logits and gradients in dt (q, w and the bias drawn from fixed seeds, the loss
// weighted by `weights`), for runs that must give the same bits.
TensorList seeded_results(const Case& c, DType dt, const Tensor& weights) {
  const int64_t positions = c.height * c.width;
  const Tensor q =
      test::uniform({c.batch, c.heads, positions, c.d}, 1).to(kGpu, dt).set_requires_grad(true);
  const Tensor w = test::uniform({c.heads, c.k * c.k, c.keys, c.d}, 2, -0.2, 0.2)
                       .to(kGpu, dt)
                       .set_requires_grad(true);
  const Tensor b =
      c.bias ? test::uniform({c.heads, c.keys}, 3).to(kGpu, dt).set_requires_grad(true) : Tensor();
  return logits_and_grads(q, w, b, c, weights);
}

void check_same_bits(const TensorList& a, const TensorList& b) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("result " << i << " (logits, q grad, w grad, bias grad)");
    CHECK(test::bitwise_equal(a[i], b[i]));
  }
}

TEST_CASE("cuda conv logits: fragments by 16- and 32-bit loads give ldmatrix's bits", "[cuda]") {
  if (!test::cuda_available_or_skip()) return;
  // The kernels read their mma.sync fragments by ldmatrix (the neighbours' A rows named lane by
  // lane, a zero row for those off the grid), or with train.attention_loads: sync by 32- and
  // 16-bit shared loads: the same registers, so the same bits. CSKA-ViT-S's shape, CSKAFormer's
  // stage 2 (several key chunks), a non-square grid in f16 and 5x5 filters at head dim 128.
  for (const auto& [c, dt] : {std::pair{Case{3, 8, 8, 8, 65, 64, 3, true}, DType::kBF16},
                              std::pair{Case{2, 2, 28, 28, 784, 16, 3, true}, DType::kBF16},
                              std::pair{Case{2, 2, 5, 9, 13, 48, 3, true}, DType::kF16},
                              std::pair{Case{1, 2, 14, 14, 70, 128, 5, false}, DType::kBF16}}) {
    INFO(describe(c) << ", " << dtype_name(dt));
    const Tensor weights =
        test::uniform({c.batch, c.heads, c.height * c.width, c.keys}, 4).to(kGpu, DType::kF32);
    const TensorList by_ldmatrix = seeded_results(c, dt, weights);
    const bool previous = set_cuda_attention_async_loads(false);
    const TensorList by_loads = seeded_results(c, dt, weights);
    set_cuda_attention_async_loads(previous);
    CHECK(previous);  // ldmatrix is the default
    check_same_bits(by_loads, by_ldmatrix);
  }
}

TEST_CASE("cuda conv logits: grad_w by filter rows gives the per-tap blocks' bits", "[cuda][emu-slow]") {
  if (!test::cuda_available_or_skip()) return;
  // train.conv_logits_grad_w: per_row computes the three taps of a 3x3 filter row in one block
  // (head dims up to 64), 32 rows a step: each tap's sums over the same rows in the same order,
  // so the same partial sums and the same bits. CSKA-ViT-S's shape over several row chunks,
  // CSKAFormer's stage 2 (ten key chunks), Swin's 7x7 windows' head dim 32 in f16, a non-square
  // grid at head dim 48 with no bias; by ldmatrix and by the 16- and 32-bit loads. And 5x5
  // filters at head dim 128, which keep a block per tap.
  for (const auto& [c, dt] : {std::pair{Case{40, 2, 8, 8, 65, 64, 3, true}, DType::kBF16},
                              std::pair{Case{2, 2, 28, 28, 784, 16, 3, true}, DType::kBF16},
                              std::pair{Case{6, 3, 7, 7, 49, 32, 3, true}, DType::kF16},
                              std::pair{Case{2, 2, 5, 9, 13, 48, 3, false}, DType::kBF16},
                              std::pair{Case{1, 2, 14, 14, 70, 128, 5, false}, DType::kBF16}}) {
    const Tensor weights =
        test::uniform({c.batch, c.heads, c.height * c.width, c.keys}, 4).to(kGpu, DType::kF32);
    for (const bool async : {true, false}) {
      INFO(describe(c) << ", " << dtype_name(dt)
                       << (async ? ", ldmatrix" : ", 16- and 32-bit loads"));
      const bool previous_loads = set_cuda_attention_async_loads(async);
      const TensorList per_tap = seeded_results(c, dt, weights);
      const bool previous = set_cuda_conv_logits_grad_w_rows(true);
      const TensorList per_row = seeded_results(c, dt, weights);
      set_cuda_conv_logits_grad_w_rows(previous);
      set_cuda_attention_async_loads(previous_loads);
      CHECK_FALSE(previous);  // per tap is the default
      check_same_bits(per_row, per_tap);
    }
  }
}

TEST_CASE("cuda conv logits: the direct form equals the convolution under bf16 autocast",
          "[cuda]") {
  if (!test::cuda_available_or_skip()) return;
  // CSKA-ViT-S's mixer shape, through nn::conv_logits as the mixers call it.
  const int64_t heads = 8, d = 64, keys = 65, grid = 8, batch = 4;
  std::shared_ptr<nn::Conv2d> conv = nn::make_conv_logits(heads * d, heads, keys);
  conv->to(kGpu);
  const Tensor tokens = test::uniform({batch, grid * grid, heads * d}, 5).to(kGpu, DType::kF32);
  const Tensor weights = test::uniform({batch, heads, grid * grid, keys}, 6).to(kGpu, DType::kF32);
  const auto run = [&](nn::ConvLogitsForm form) {
    const nn::ConvLogitsFormGuard guard(form);
    const AutocastGuard autocast(DType::kBF16);
    const Tensor x = tokens.clone().set_requires_grad(true);
    conv->weight.zero_grad();
    conv->bias.zero_grad();
    const Tensor logits = nn::conv_logits(nn::split_heads(x, heads), *conv, grid, grid);
    CHECK(test::graph_has(logits, "conv_logits") == (form == nn::ConvLogitsForm::kDirect));
    sum(logits.to(DType::kF32) * weights).backward();
    return TensorList{logits, x.grad(), conv->weight.grad(), conv->bias.grad()};
  };
  const TensorList direct = run(nn::ConvLogitsForm::kDirect);
  const TensorList by_conv = run(nn::ConvLogitsForm::kConv);
  const char* names[] = {"logits", "q grad", "weight grad", "bias grad"};
  for (size_t i = 0; i < direct.size(); ++i) {
    require_scaled_close(direct[i], by_conv[i], 2e-2, names[i]);
  }
}
