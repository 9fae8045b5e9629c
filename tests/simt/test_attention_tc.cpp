// The WMMA attention kernels' own code (cuda/kernels/attention_tc.cu: `train.attention: wmma`),
// run on the host by tests/simt with tests/simt/wmma.h's fragments: the forward and backward
// kernels against the f64 reference in bf16 and f16, the same bits by synchronous loads and by
// cp.async, and whatever order a block's threads run in. What a GPU adds (the tensor cores' own
// summation, the fragments' real layout, timing) is for the [cuda] tests in
// tests/cuda/test_attention_kernels.cpp.
// clang-format off
#include "tests/simt/attention_problems.h"  // first: simt.h, then the kernels' headers
// clang-format on

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace {

using namespace ska::simt::attention;

// The forward pass, then the backward from its output (D by delta_of).
template <typename T>
Results<T> run(const Data<T>& x, bool async_loads = true) {
  Results<T> r;
  ska::cuda::attn::tc_forward(forward_args(x, async_loads, r), x.p.heads, nullptr);
  const std::vector<float> delta = delta_of(x, r.out);
  ska::cuda::attn::tc_backward(backward_args(x, r, delta.data(), async_loads, r), x.p.heads,
                               nullptr);
  return r;
}

TEST_CASE("simt: WMMA attention kernels against an f64 reference (bf16)", "[cpu][simt]") {
  for (const Problem& p : tensor_core_problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 7);
    require_reference(x, run(x), "forward and backward");
  }
}

TEST_CASE("simt: WMMA attention kernels against an f64 reference (f16)", "[cpu][simt]") {
  const std::vector<Problem> all = tensor_core_problems();
  for (const Problem& p : {all[0], all[1], all[5], all[6]}) {
    const Data<__half> x = make_data<__half>(p, 11);
    require_reference(x, run(x), "forward and backward, f16");
  }
}

TEST_CASE("simt: WMMA attention by synchronous loads gives the asynchronous copies' bits",
          "[cpu][simt]") {
  for (const Problem& p : tensor_core_problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 5);
    require_same_bits(run(x, false), run(x, true), p.name);
  }
}

TEST_CASE("simt: WMMA attention gives the same bits whatever order a block's threads run in",
          "[cpu][simt]") {
  // A race between threads of a block (a tile refilled while another warp reads it, a fragment
  // loaded from a lane's row before the lane wrote it) gives results that depend on the order.
  const std::vector<Problem> all = tensor_core_problems();
  for (const Problem& p : {all[0], all[1], all[5], all[6]}) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 9);
    const Results<__nv_bfloat16> base = run(x);
    ska::simt::in_other_orders(
        4321, [&](const char* order) { require_same_bits(run(x), base, p.name + ": " + order); });
  }
}

}  // namespace
