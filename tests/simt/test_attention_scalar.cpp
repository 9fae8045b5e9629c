// The scalar attention kernels' own code (cuda/kernels/attention.cu: what f32 attention and the
// head dims the tensor cores do not take run on), run on the host by tests/simt: the forward and
// backward kernels against an f64 reference in f32, bf16 and f16, the same bits whatever order a
// block's threads run in, and the delta kernels (D = rowsum(dO * O), by warps or by 16-byte
// vectors) to the bit against the host's float arithmetic in their order. What a GPU adds (its
// own expf and FMA contraction, timing) is for the [cuda] tests in
// tests/cuda/test_attention_kernels.cpp.
// clang-format off
#include "tests/simt/attention_problems.h"  // first: simt.h, then the kernels' headers
// clang-format on

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace ska::simt::attention;

// D of the forward's output by the kernels' launch_delta (`fast`: its 16-byte vector form where
// the rows allow it).
template <typename T>
std::vector<float> kernel_delta(const Data<T>& x, const std::vector<T>& out, bool fast) {
  const Problem& p = x.p;
  const int64_t rows = int64_t{p.heads} * p.nq;
  std::vector<float> delta(static_cast<size_t>(rows), NAN);
  const View v = dense_view(p.heads, int64_t{p.nq} * p.dv, p.dv);
  ska::cuda::attn::launch_delta(out.data(), v, x.go.data(), v, delta.data(), rows, p.nq, p.dv, fast,
                                nullptr);
  return delta;
}

// The forward pass, then the backward from its output with the kernels' own D.
template <typename T>
Results<T> run(const Data<T>& x, bool fast_delta = true) {
  Results<T> r;
  ska::cuda::attn::scalar_forward(forward_args(x, false, r), x.p.heads, nullptr);
  const std::vector<float> delta = kernel_delta(x, r.out, fast_delta);
  ska::cuda::attn::scalar_backward(backward_args(x, r, delta.data(), false, r), x.p.heads, nullptr);
  return r;
}

// The paper models' shapes the scalar kernels serve in f32, and edges: ViT-S's LSA (65 tokens of
// 64, the diagonal masked, a learnable temperature, q, k and v strided views of one projection),
// CSKA's logits as the bias (head dim 0, rows of 72), Swin's windows with their position bias
// and a device-side factor of it, CaiT's patch attention, head dims that are not multiples of 4
// (the tiles' zero columns), of 128 (four accumulator columns a lane), several query and key
// tiles ending mid-tile (and in every other row a first tile of keys masked out by the bias),
// and no keys at all.
std::vector<Problem> problems() {
  std::vector<Problem> list = {
      {"vit lsa 65x65 d64", 4, 65, 65, 64, 64, false, 0, true, true, true},
      {"cska logits as bias 65x65 d0 rows of 72", 3, 65, 65, 0, 64, true, 72},
      {"swin window 49x49 d32 with bias", 3, 49, 49, 32, 32, true, 49},
      {"cska-cait 64x64 d48 with bias", 2, 64, 64, 48, 48, true, 64},
      {"17 queries over 80 keys d16/48 with bias", 2, 17, 80, 16, 48, true, 80},
      {"9 queries over 13 keys d20/36 with bias", 3, 9, 13, 20, 36, true, 13},
      {"97x97 d64 with bias rows of 100", 2, 97, 97, 64, 64, true, 100},
      {"33x70 d128", 2, 33, 70, 128, 128},
      {"5 queries over no keys d32", 2, 5, 0, 32, 32},
  };
  list[2].bias_factor = true;
  list[6].scale_factor = true;
  list[6].masked_tile = true;
  return list;
}

TEST_CASE("simt: scalar attention kernels against an f64 reference (f32)", "[cpu][simt]") {
  for (const Problem& p : problems()) {
    const Data<float> x = make_data<float>(p, 7);
    require_reference(x, run(x), "forward and backward, D by vectors where the rows allow");
    require_reference(x, run(x, false), "forward and backward, D by warps");
  }
}

TEST_CASE("simt: scalar attention kernels against an f64 reference (bf16 and f16)", "[cpu][simt]") {
  // The 16-bit problems the tensor-core kernels do not take (head dims not multiples of 16), and
  // two they do (the scalar kernels are their reference).
  const std::vector<Problem> all = problems();
  for (const Problem& p : {all[0], all[1], all[4], all[5]}) {
    const Data<__nv_bfloat16> b = make_data<__nv_bfloat16>(p, 11);
    require_reference(b, run(b), "bf16");
    const Data<__half> h = make_data<__half>(p, 13);
    require_reference(h, run(h), "f16");
  }
}

TEST_CASE("simt: scalar attention gives the same bits whatever order a block's threads run in",
          "[cpu][simt]") {
  // A race between threads of a block (a tile refilled while another warp reads it, a warp's
  // weights read before its lanes wrote them) gives results that depend on the order.
  const std::vector<Problem> all = problems();
  for (const Problem& p : {all[0], all[1], all[2], all[6], all[7]}) {
    const Data<float> x = make_data<float>(p, 9);
    const Results<float> base = run(x);
    ska::simt::in_other_orders(
        1234, [&](const char* order) { require_same_bits(run(x), base, p.name + ": " + order); });
  }
}

// D of row `row` in the delta kernels' order: by warps, lane l sums columns l, l + 32, ... and
// the warp's butterfly adds the lanes; by vectors (`lanes` > 0), lane l sums its kVec columns
// in turn and the row's lanes are added by their butterfly.
template <typename T>
float delta_in_kernel_order(const Data<T>& x, const std::vector<T>& out, int64_t row, int lanes) {
  const int dv = x.p.dv;
  const auto product = [&](int c) {
    return ska::simt::as_float(x.go[row * dv + c]) * ska::simt::as_float(out[row * dv + c]);
  };
  if (lanes > 0) {
    const int vec = dv / lanes;
    std::vector<float> sums(static_cast<size_t>(lanes), 0.0f);
    for (int l = 0; l < lanes; ++l) {
      for (int k = 0; k < vec; ++k) sums[l] += product(l * vec + k);
    }
    return ska::simt::warp_butterfly(sums, [](float a, float b) { return a + b; });
  }
  std::vector<float> sums(32, 0.0f);
  for (int l = 0; l < 32; ++l) {
    for (int c = l; c < dv; c += 32) sums[l] += product(c);
  }
  return ska::simt::warp_butterfly(sums, [](float a, float b) { return a + b; });
}

template <typename T>
void require_delta_bits(const Problem& p, int vector_lanes) {
  INFO(p.name << ", " << sizeof(T) * 8 << "-bit");
  const Data<T> x = make_data<T>(p, 21);
  Results<T> r;
  ska::cuda::attn::scalar_forward(forward_args(x, false, r), p.heads, nullptr);
  const std::vector<float> by_vectors = kernel_delta(x, r.out, true);
  const std::vector<float> by_warps = kernel_delta(x, r.out, false);
  int64_t vector_off = 0, warp_off = 0;
  for (int64_t row = 0; row < int64_t{p.heads} * p.nq; ++row) {
    const float v = delta_in_kernel_order(x, r.out, row, vector_lanes);
    const float w = delta_in_kernel_order(x, r.out, row, 0);
    vector_off += std::memcmp(&v, &by_vectors[row], sizeof v) != 0;
    warp_off += std::memcmp(&w, &by_warps[row], sizeof w) != 0;
  }
  CHECK(vector_off == 0);
  CHECK(warp_off == 0);
}

TEST_CASE("simt: the attention delta kernels give the host's float sums in their order",
          "[cpu][simt]") {
  // 16-byte vectors: 4 f32 or 8 bf16 columns a lane, dv / that many lanes a row, where that is a
  // power of two up to 32; else (48 f32 columns: 12 lanes) a warp a row.
  const std::vector<Problem> all = problems();
  require_delta_bits<float>(all[0], 16);  // dv 64: 16 lanes, 2 rows a warp
  require_delta_bits<float>(all[2], 8);   // dv 32: 8 lanes, 4 rows a warp
  require_delta_bits<float>(all[3], 0);   // dv 48: 12 lanes, not a power of two
  require_delta_bits<float>(all[7], 32);  // dv 128: a warp a row either way
  require_delta_bits<__nv_bfloat16>(all[0], 8);
  require_delta_bits<__nv_bfloat16>(all[5], 0);  // dv 36: not a multiple of 8
}

}  // namespace
