// tests/simt's own checks: the emulated instructions against their PTX definitions (and WMMA's
// fragments against exact products), and the faults it exists to find (a race between threads,
// a tile read before its copy lands, a warp whose lanes part ways) found in small kernels
// written here.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cuda/kernels/attention_tc.cuh"
#include "cuda/kernels/mma.cuh"

namespace {

alignas(128) unsigned char g_smem[227 * 1024];  // at least the most a launch may take
const bool g_registered = (ska::simt::register_shared(g_smem, sizeof g_smem), true);

using ska::simt::Schedule;

// Each thread writes its index to shared memory and reads its neighbour's, with or without a
// barrier between.
std::vector<int> neighbours(bool barrier, Schedule schedule) {
  std::vector<int> out(64, -1);
  ska::simt::set_schedule(schedule, 42);
  ska::simt::run_grid(dim3(1), dim3(64), 256, [&] {
    int* s = reinterpret_cast<int*>(g_smem);
    const int t = static_cast<int>(threadIdx.x);
    s[t] = t;
    if (barrier) __syncthreads();
    out[t] = s[(t + 1) % 64];
  });
  ska::simt::set_schedule(Schedule::kForward);
  return out;
}

TEST_CASE("simt: a race between a block's threads gives results that depend on their order",
          "[cpu][simt]") {
  std::vector<int> want(64);
  for (int t = 0; t < 64; ++t) want[t] = (t + 1) % 64;
  for (Schedule s : {Schedule::kForward, Schedule::kReverse, Schedule::kShuffled}) {
    CHECK(neighbours(true, s) == want);
  }
  // Without the barrier, a thread that runs before its neighbour reads poisoned memory.
  CHECK(neighbours(false, Schedule::kForward) != neighbours(false, Schedule::kReverse));
}

// Two warps reduce three rows through one shared array, as a block-per-row reduction does:
// each warp's sum in slot `warp`, a barrier, warp 0 adds the slots; with or without the barrier
// that keeps a warp from refilling its slot for the next row before warp 0 has read it.
std::vector<float> shared_rows(bool end_barrier, Schedule schedule) {
  std::vector<float> out(3, -1.0f);
  ska::simt::set_schedule(schedule, 7);
  ska::simt::run_grid(dim3(1), dim3(64), 256, [&] {
    float* slot = reinterpret_cast<float*>(g_smem);
    const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
    for (int row = 0; row < 3; ++row) {
      float v = static_cast<float>(100 * row + threadIdx.x);
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) slot[warp] = v;
      __syncthreads();
      if (warp == 0) {
        float w = lane < 2 ? slot[lane] : 0.0f;
        w += __shfl_xor_sync(0xffffffffu, w, 1);
        if (lane == 0) out[row] = w;
      }
      if (end_barrier) __syncthreads();
    }
  });
  ska::simt::set_schedule(Schedule::kForward);
  return out;
}

TEST_CASE("simt: warps run ahead of one another find a shared slot refilled too early",
          "[cpu][simt]") {
  const std::vector<float> want = {2016.0f, 8416.0f, 14816.0f};  // 64 threads' sums
  for (Schedule s :
       {Schedule::kForward, Schedule::kReverse, Schedule::kShuffled, Schedule::kWarpsAhead}) {
    CHECK(shared_rows(true, s) == want);
  }
  // Without the second barrier only the warp-by-warp order lets warp 1 refill its slot first.
  CHECK(shared_rows(false, Schedule::kForward) == want);
  CHECK(shared_rows(false, Schedule::kWarpsAhead) != want);
}

TEST_CASE("simt: a static __shared__ array is one for all of a block's threads", "[cpu][simt]") {
  for (Schedule schedule : {Schedule::kForward, Schedule::kReverse, Schedule::kShuffled}) {
    std::vector<int> out(2 * 64, -1);
    ska::simt::set_schedule(schedule, 7);
    ska::simt::run_grid(dim3(2), dim3(64), 0, [&] {
      __shared__ int s[64];
      const int t = static_cast<int>(threadIdx.x), b = static_cast<int>(blockIdx.x);
      s[t] = 100 * b + t;
      __syncthreads();
      out[b * 64 + t] = s[(t + 1) % 64];  // the neighbour's write, of this block
    });
    ska::simt::set_schedule(Schedule::kForward);
    for (int b = 0; b < 2; ++b) {
      for (int t = 0; t < 64; ++t) CHECK(out[b * 64 + t] == 100 * b + (t + 1) % 64);
    }
  }
}

TEST_CASE("simt: a block of part of a warp runs, and a warp-wide operation there is an error",
          "[cpu][simt]") {
  std::vector<int> out(8, -1);
  ska::simt::run_grid(dim3(1), dim3(8), 0, [&] {
    __shared__ int s[8];
    const int t = static_cast<int>(threadIdx.x);
    s[t] = 10 * t;
    __syncthreads();
    out[t] = s[7 - t];
  });
  CHECK(out == std::vector<int>{70, 60, 50, 40, 30, 20, 10, 0});
  // A 2-D block's warps are its threads in x-fastest order: (32, 2)'s row y = 1 is warp 1.
  std::vector<int> lanes(64, -1);
  ska::simt::run_grid(dim3(1), dim3(32, 2), 0, [&] {
    const int t = static_cast<int>(threadIdx.x + 32 * threadIdx.y);
    lanes[t] = __shfl_xor_sync(0xffffffffu, t, 1);
  });
  for (int t = 0; t < 64; ++t) CHECK(lanes[t] == (t ^ 1));
  // 40 threads: the second warp has 8 lanes, and a full-mask shuffle there has lanes missing.
  CHECK_THROWS_WITH(
      ska::simt::run_grid(dim3(1), dim3(40), 0, [&] { (void)__shfl_xor_sync(0xffffffffu, 1, 1); }),
      Catch::Contains("fewer than 32 threads"));
}

TEST_CASE("simt: cp.async copies land at the wait that covers them, not before", "[cpu][simt]") {
  const std::vector<uint32_t> global = {11, 22, 33, 44};
  std::vector<uint32_t> before(4), between(4), after(4);
  ska::simt::run_grid(dim3(1), dim3(32), 64, [&] {
    const int t = static_cast<int>(threadIdx.x);
    auto* s = reinterpret_cast<uint32_t*>(g_smem);
    if (t < 2) {
      s[t] = s[2 + t] = 7;
      ska::cuda::attn::copy4(s + t, &global[t]);  // group 0
      ska::cuda::attn::commit_copies();
      ska::cuda::attn::copy4(s + 2 + t, &global[2 + t]);  // group 1
      ska::cuda::attn::commit_copies();
      before[t] = s[t];
      ska::cuda::attn::wait_copies_pending<1>();  // group 0 has landed
      between[t] = s[t];
      between[2 + t] = s[2 + t];
      ska::cuda::attn::wait_copies();
      after[2 + t] = s[2 + t];
    }
  });
  CHECK(before[0] == 0xffffffffu);  // the 7 poisoned from the copy's issue
  CHECK(between[0] == 11);
  CHECK(between[1] == 22);
  CHECK(between[2] == 0xffffffffu);
  CHECK(after[2] == 33);
  CHECK(after[3] == 44);
  // A copy never waited for is reported.
  CHECK_THROWS_WITH(ska::simt::run_grid(dim3(1), dim3(32), 64,
                                        [&] {
                                          ska::cuda::attn::copy4(g_smem, &global[0]);
                                          ska::cuda::attn::commit_copies();
                                        }),
                    Catch::Contains("never waited for"));
}

TEST_CASE("simt: mma.sync and ldmatrix follow the PTX fragment layouts", "[cpu][simt]") {
  using T = __nv_bfloat16;
  // A 16 x 16 and B^T 8 x 16 (rows are B's columns), row-major in shared memory with rows of 24.
  constexpr int kLd = 24;
  std::vector<float> a(16 * 16), bt(8 * 16);
  for (int i = 0; i < 256; ++i) a[i] = static_cast<float>((i * 7) % 13 - 6) / 4.0f;
  for (int i = 0; i < 128; ++i) bt[i] = static_cast<float>((i * 5) % 11 - 5) / 8.0f;
  std::vector<float> want(16 * 8, 0.0f);
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 8; ++n) {
      for (int k = 0; k < 16; ++k) want[r * 8 + n] += a[r * 16 + k] * bt[n * 16 + k];
    }
  }
  for (bool ldsm : {false, true}) {
    std::vector<float> got(16 * 8, 0.0f);
    ska::simt::run_grid(dim3(1), dim3(32), 2048, [&] {
      T* sa = reinterpret_cast<T*>(g_smem);
      T* sb = sa + 16 * kLd;
      const int lane = static_cast<int>(threadIdx.x);
      for (int i = lane; i < 256; i += 32) sa[i / 16 * kLd + i % 16] = __float2bfloat16(a[i]);
      for (int i = lane; i < 128; i += 32) sb[i / 16 * kLd + i % 16] = __float2bfloat16(bt[i]);
      __syncthreads();
      uint32_t fa[4], b0, b1;
      if (ldsm) {
        ska::cuda::attn::load_a_ldsm(fa, sa, kLd, lane);
        ska::cuda::attn::load_b_rows_ldsm(b0, b1, sb, kLd, lane);
      } else {
        ska::cuda::attn::load_a(fa, sa, kLd, lane);
        ska::cuda::attn::load_b_rows(b0, b1, sb, kLd, lane);
      }
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      ska::cuda::attn::mma<T>(c, fa, b0, b1);
      const int g = lane / 4, t = lane % 4;
      got[g * 8 + 2 * t] = c[0];
      got[g * 8 + 2 * t + 1] = c[1];
      got[(g + 8) * 8 + 2 * t] = c[2];
      got[(g + 8) * 8 + 2 * t + 1] = c[3];
    });
    INFO((ldsm ? "ldmatrix" : "32-bit loads"));
    CHECK(got == want);  // the inputs and products are exact in bf16 and f32
  }
}

TEST_CASE("simt: WMMA fragments multiply in every layout, lane by lane", "[cpu][simt]") {
  namespace wmma = nvcuda::wmma;
  using T = __nv_bfloat16;
  // C = A B + C0 over 16 x 16 tiles in shared memory with rows (or columns) of 24 elements; A, B
  // and the products exact in bf16 and f32. B is read from its row-major or its transposed copy.
  constexpr int kLd = 24;
  std::vector<float> a(256), b(256), c0(256);
  for (int i = 0; i < 256; ++i) {
    a[i] = static_cast<float>((i * 7) % 13 - 6) / 4.0f;
    b[i] = static_cast<float>((i * 5) % 11 - 5) / 8.0f;
    c0[i] = static_cast<float>(i % 9) - 4.0f;
  }
  std::vector<float> want(256);
  for (int r = 0; r < 16; ++r) {
    for (int n = 0; n < 16; ++n) {
      float sum = c0[r * 16 + n];
      for (int k = 0; k < 16; ++k) sum += a[r * 16 + k] * b[k * 16 + n];
      want[r * 16 + n] = sum;
    }
  }
  for (bool b_columns : {false, true}) {
    for (bool c_columns : {false, true}) {
      std::vector<float> got(256, 0.0f);
      ska::simt::run_grid(dim3(1), dim3(32), 8192, [&] {
        T* sa = reinterpret_cast<T*>(g_smem);
        T* sb = sa + 16 * kLd;
        float* sc = reinterpret_cast<float*>(g_smem + 4096);
        const int lane = static_cast<int>(threadIdx.x);
        for (int i = lane; i < 256; i += 32) {
          const int r = i / 16, col = i % 16;
          sa[r * kLd + col] = __float2bfloat16(a[i]);
          sb[b_columns ? col * kLd + r : r * kLd + col] = __float2bfloat16(b[i]);
          sc[c_columns ? col * kLd + r : r * kLd + col] = c0[i];
        }
        __syncwarp();
        const wmma::layout_t c_layout = c_columns ? wmma::mem_col_major : wmma::mem_row_major;
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
        wmma::load_matrix_sync(fa, sa, kLd);
        wmma::load_matrix_sync(fc, sc, kLd, c_layout);
        if (b_columns) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
          wmma::load_matrix_sync(fb, sb, kLd);
          wmma::mma_sync(fc, fa, fb, fc);
        } else {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
          wmma::load_matrix_sync(fb, sb, kLd);
          wmma::mma_sync(fc, fa, fb, fc);
        }
        wmma::store_matrix_sync(sc, fc, kLd, c_layout);
        __syncwarp();
        for (int i = lane; i < 256; i += 32) {
          const int r = i / 16, col = i % 16;
          got[i] = sc[c_columns ? col * kLd + r : r * kLd + col];
        }
      });
      INFO("B " << (b_columns ? "col" : "row") << "-major, C " << (c_columns ? "col" : "row")
                << "-major");
      CHECK(got == want);
    }
  }
  // Each lane loads and stores only its own elements: without the __syncwarp after the lanes'
  // writes, the first lanes load the tile before the others wrote their rows.
  std::vector<float> early(256, 0.0f);
  ska::simt::run_grid(dim3(1), dim3(32), 8192, [&] {
    float* sc = reinterpret_cast<float*>(g_smem);
    const int lane = static_cast<int>(threadIdx.x);
    for (int i = lane; i < 256; i += 32) sc[i / 16 * kLd + i % 16] = 1.0f;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fc, sc, kLd, wmma::mem_row_major);
    for (int e = 0; e < fc.num_elements; ++e) early[lane * 8 + e] = fc.x[e];
  });
  CHECK(std::count(early.begin(), early.end(), 1.0f) < 256);
  CHECK_THROWS_WITH(ska::simt::run_grid(dim3(1), dim3(32), 8192,
                                        [&] {
                                          wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
                                          wmma::load_matrix_sync(
                                              f, reinterpret_cast<float*>(g_smem + 16), kLd,
                                              wmma::mem_row_major);
                                        }),
                    Catch::Contains("32-byte aligned"));
  CHECK_THROWS_WITH(ska::simt::run_grid(dim3(1), dim3(32), 8192,
                                        [&] {
                                          wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
                                          wmma::load_matrix_sync(f,
                                                                 reinterpret_cast<float*>(g_smem),
                                                                 18, wmma::mem_row_major);
                                        }),
                    Catch::Contains("multiple of 16 bytes"));
}

TEST_CASE("simt: lanes of a warp that part ways at a shuffle are reported", "[cpu][simt]") {
  CHECK_THROWS_WITH(ska::simt::run_grid(dim3(1), dim3(32), 0,
                                        [&] {
                                          if (threadIdx.x < 16) {
                                            (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
                                          }
                                        }),
                    Catch::Contains("deadlocked"));
  CHECK_THROWS_WITH(ska::simt::run_grid(dim3(1), dim3(64), 0,
                                        [&] {
                                          if (threadIdx.x == 0) __syncthreads();
                                        }),
                    Catch::Contains("barriers"));
}

}  // namespace
