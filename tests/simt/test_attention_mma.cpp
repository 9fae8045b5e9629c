// The mma.sync attention kernels' own code (cuda/kernels/attention_mma.cu), run on the host by
// tests/simt: every forward and backward form against an f64 reference, and the forms that
// promise the same bits (persistent and per-head blocks, pairs of bias keys and single keys,
// threads in any order) compared bit for bit. What a GPU adds (the tensor cores' own summation,
// timing) is for the [cuda] tests in tests/cuda/test_attention_kernels.cpp.
// clang-format off
#include "tests/simt/attention_problems.h"  // first: simt.h, then the kernels' headers
// clang-format on

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/device_runtime.h"

namespace {

using namespace ska::simt::attention;

// The kernel choices of one run (the process-wide switches of attention_mma.cu).
struct Forms {
  bool one_block_forward = true, one_block_backward = true, one_pass = false, persistent = false;
  bool async_loads = true;
  int64_t resident = 3;
  ska::simt::Schedule schedule = ska::simt::Schedule::kForward;
  uint64_t seed = 0;
};

void apply(const Forms& f) {
  ska::set_cuda_attention_one_block_forward(f.one_block_forward);
  ska::set_cuda_attention_one_block_backward(f.one_block_backward);
  ska::set_cuda_attention_one_pass_backward(f.one_pass);
  ska::set_cuda_attention_persistent(f.persistent);
  ska::simt::set_resident_blocks(f.resident);
  ska::simt::set_schedule(f.schedule, f.seed);
}

template <typename T>
void forward(const Data<T>& x, const Forms& f, Results<T>& r) {
  apply(f);
  ska::cuda::attn::mma_forward(forward_args(x, f.async_loads, r), x.p.heads, nullptr);
}

// The backward from `fwd`'s output and log-sum-exps (D = rowsum(dO * O) in f32 by delta_of),
// into fresh gradients (grad_bias in rows of bias_row).
template <typename T>
void backward(const Data<T>& x, const Results<T>& fwd, const Forms& f, Results<T>& r) {
  apply(f);
  const std::vector<float> delta = delta_of(x, fwd.out);
  ska::cuda::attn::mma_backward(backward_args(x, fwd, delta.data(), f.async_loads, r), x.p.heads,
                                nullptr);
}

template <typename T>
Results<T> run(const Data<T>& x, const Forms& f) {
  Results<T> r;
  forward(x, f, r);
  backward(x, r, f, r);
  return r;
}

TEST_CASE("simt: mma.sync attention kernels against an f64 reference (bf16)", "[cpu][simt]") {
  for (const Problem& p : tensor_core_problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 7);
    Forms one_block;
    Forms split = one_block;
    split.one_block_forward = split.one_block_backward = false;
    Forms one_pass = one_block;
    one_pass.one_pass = true;
    require_reference(x, run(x, one_block), "one-block forward and backward (the defaults)");
    require_reference(x, run(x, split), "tiled forward, split backward");
    require_reference(x, run(x, one_pass), "one-pass backward");
  }
}

TEST_CASE("simt: mma.sync attention kernels against an f64 reference (f16)", "[cpu][simt]") {
  const std::vector<Problem> all = tensor_core_problems();
  for (const Problem& p : {all[0], all[1], all[5]}) {
    const Data<__half> x = make_data<__half>(p, 11);
    require_reference(x, run(x, Forms{}), "one-block forward and backward, f16");
  }
}

TEST_CASE("simt: persistent attention kernels give the per-head kernels' bits", "[cpu][simt]") {
  for (const Problem& p : tensor_core_problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 3);
    const Results<__nv_bfloat16> per_head = run(x, Forms{});
    for (int64_t resident : {1, 2, 5}) {
      Forms f;
      f.persistent = true;
      f.resident = resident;
      require_same_bits(run(x, f), per_head,
                        p.name + ": persistent, grid of " + std::to_string(resident));
    }
  }
}

TEST_CASE("simt: attention by synchronous loads gives the asynchronous copies' bits",
          "[cpu][simt]") {
  // Sync: loads and stores into the tiles, fragments by 32- and 16-bit loads, the bias and its
  // gradient one key at a time; async: cp.async, ldmatrix and key pairs.
  for (const Problem& p : tensor_core_problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 5);
    for (bool persistent : {false, true}) {
      Forms async, sync;
      async.persistent = sync.persistent = persistent;
      sync.async_loads = false;
      require_same_bits(run(x, sync), run(x, async),
                        p.name + (persistent ? ": persistent" : ": per head"));
    }
    Forms split_async, split_sync;
    split_async.one_block_forward = split_async.one_block_backward = false;
    split_sync = split_async;
    split_sync.async_loads = false;
    require_same_bits(run(x, split_sync), run(x, split_async), p.name + ": tiled and split");
  }
}

TEST_CASE("simt: attention gives the same bits whatever order a block's threads run in",
          "[cpu][simt]") {
  // A race between threads of a block (a tile read before the barrier that publishes it, a
  // buffer refilled while another warp reads it) gives results that depend on the order.
  const std::vector<Problem> all = tensor_core_problems();
  for (const Problem& p : {all[0], all[1], all[5], all[6]}) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 9);
    for (bool persistent : {false, true}) {
      for (bool one_pass : {false, true}) {
        Forms forward;
        forward.persistent = persistent;
        forward.one_pass = one_pass;
        const Results<__nv_bfloat16> base = run(x, forward);
        Forms reverse = forward, shuffled = forward, warps = forward;
        reverse.schedule = ska::simt::Schedule::kReverse;
        shuffled.schedule = ska::simt::Schedule::kShuffled;
        shuffled.seed = 1234;
        warps.schedule = ska::simt::Schedule::kWarpsAhead;
        const std::string what =
            p.name + (persistent ? ", persistent" : ", per head") + (one_pass ? ", one-pass" : "");
        require_same_bits(run(x, reverse), base, what + ": threads last to first");
        require_same_bits(run(x, shuffled), base, what + ": threads shuffled");
        require_same_bits(run(x, warps), base, what + ": warps ahead");
      }
    }
  }
}

TEST_CASE("simt: the attention kernels' ldmatrix loads are free of bank conflicts", "[cpu][simt]") {
  // Every 8 x 8 matrix in one shared-memory wavefront: the tiles' 16-byte row padding puts a
  // matrix's 8 rows in the 8 groups of 4 banks (simt::Counts).
  for (const Problem& p : tensor_core_problems()) {
    const Data<__nv_bfloat16> x = make_data<__nv_bfloat16>(p, 3);
    Forms one_block, split, one_pass, persistent;
    split.one_block_forward = split.one_block_backward = false;
    one_pass.one_pass = true;
    persistent.persistent = true;
    for (const auto& [name, f] : {std::pair{"one-block", one_block},
                                  {"tiled and split", split},
                                  {"one-pass", one_pass},
                                  {"persistent", persistent}}) {
      const ska::simt::Counts before = ska::simt::counts();
      run(x, f);
      const ska::simt::Counts after = ska::simt::counts();
      INFO(p.name << ": " << name);
      CHECK(after.ldmatrix_matrices > before.ldmatrix_matrices);
      CHECK(after.ldmatrix_wavefronts - before.ldmatrix_wavefronts ==
            after.ldmatrix_matrices - before.ldmatrix_matrices);
    }
  }
}

}  // namespace
