// The CUDA elementwise kernels' launch paths (16-byte dense, one element dense, 32-bit strided,
// 64-bit strided) against the reference path (every view dim in 64 bits) bit for bit, and against
// the CPU: casts, tails, misaligned views, permutations, broadcasts, comparisons, fills.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "backend/device_runtime.h"
#include "support/test_util.h"

#ifdef SKA_WITH_CUDA

using namespace ska;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;

namespace {

const Device kGpu = Device::cuda(0);

// Restores the fast paths however a test ends.
struct FastPathsGuard {
  ~FastPathsGuard() { set_cuda_elementwise_fast_paths(true); }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const Tensor ha = a.to(Device::cpu()).contiguous(), hb = b.to(Device::cpu()).contiguous();
  return std::memcmp(ha.data_ptr(), hb.data_ptr(),
                     static_cast<size_t>(ha.numel()) * ha.element_size()) == 0;
}

// f(device) computes from host inputs moved to `device`. The CUDA result must be the same bits
// with the fast paths on and off, and within the dtype's tolerance of the CPU's.
void check_paths(const std::string& what, DType dtype, const std::function<Tensor(Device)>& f) {
  FastPathsGuard restore;
  INFO(what << " in " << dtype_name(dtype));
  set_cuda_elementwise_fast_paths(true);
  const Tensor fast = f(kGpu);
  set_cuda_elementwise_fast_paths(false);
  const Tensor reference = f(kGpu);
  set_cuda_elementwise_fast_paths(true);
  REQUIRE(fast.device() == kGpu);
  CHECK(same_bits(fast, reference));
  const Tensor cpu = f(Device::cpu());
  if (dtype_is_floating(cpu.dtype())) {
    require_close(fast, cpu, tolerance_for(dtype), what);
  } else {
    CHECK(same_bits(fast, cpu));
  }
}

// A one-element zero to compare against (broadcast).
Tensor zeros_like_scalar(Device d, DType dt) { return Tensor::zeros({1}, dt, d); }

}  // namespace

TEST_CASE("cuda elementwise: casts and copies, dense, misaligned, odd-sized and permuted",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Tensor x = uniform({1000003}, 1, -3.0, 3.0);
  for (DType from : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    for (DType to : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
      if (from == to) continue;
      const DType loose = to == DType::kBF16 || from == DType::kBF16 ? DType::kBF16 : DType::kF16;
      check_paths("dense cast", loose, [&](Device d) { return x.to(d, from).to(to); });
      // One element in: dense but not 16-byte aligned, so one element per access.
      check_paths("misaligned cast", loose,
                  [&](Device d) { return x.to(d, from).narrow(0, 1, 999999).to(to); });
    }
  }
  const Tensor counts = uniform({4099}, 2, 0.0, 250.0);
  check_paths("u8 to f32", DType::kF32,
              [&](Device d) { return counts.to(d, DType::kU8).to(DType::kF32); });
  check_paths("i64 to bf16", DType::kBF16,
              [&](Device d) { return counts.to(d, DType::kI64).to(DType::kBF16); });
  check_paths("u8 misaligned copy", DType::kF32, [&](Device d) {
    return counts.to(d, DType::kU8).narrow(0, 3, 4000).to(DType::kF32);
  });
  const Tensor heads = uniform({2, 7, 3, 8}, 3);
  const Tensor windows = uniform({2, 4, 7, 4, 7, 16}, 4);
  const Tensor tokens = uniform({65, 384}, 5);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    check_paths("head split", dt,
                [&](Device d) { return heads.to(d, dt).permute({0, 2, 1, 3}).contiguous(); });
    check_paths("window partition", dt, [&](Device d) {
      return windows.to(d, dt).permute({0, 1, 3, 2, 4, 5}).contiguous();
    });
    check_paths("transpose with a cast", dt,
                [&](Device d) { return tokens.to(d, DType::kF32).transpose(0, 1).to(dt); });
    check_paths("expand", dt,
                [&](Device d) { return tokens.to(d, dt).narrow(0, 0, 1).expand({9, 384}).contiguous(); });
  }
  check_paths("0-dim", DType::kF32,
              [&](Device d) { return tokens.to(d, DType::kF32).select(0, 3).select(0, 5).to(DType::kBF16); });
}

TEST_CASE("cuda elementwise: unary, binary and where over dense, broadcast and strided views",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Tensor a = uniform({8, 65, 97}, 6, -2.0, 2.0);
  const Tensor bias = uniform({97}, 7, 0.5, 2.0);
  const Tensor per_sample = uniform({8, 1, 1}, 8, 0.5, 1.5);
  const Tensor b = uniform({8, 97, 65}, 9, -2.0, 2.0);
  const Tensor mask = uniform({65, 97}, 10, -1.0, 1.0);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    check_paths("gelu, dense with a tail", dt, [&](Device d) { return gelu(a.to(d, dt)); });
    check_paths("exp, misaligned", dt,
                [&](Device d) { return exp(a.to(d, dt).flatten().narrow(0, 1, 50001)); });
    check_paths("silu of a transposed view", dt,
                [&](Device d) { return silu(b.to(d, dt).transpose(1, 2)); });
    check_paths("bias add", dt, [&](Device d) { return add(a.to(d, dt), bias.to(d, dt)); });
    check_paths("drop-path scale", dt,
                [&](Device d) { return mul(a.to(d, dt), per_sample.to(d, dt)); });
    check_paths("both strided", dt,
                [&](Device d) { return sub(a.to(d, dt), b.to(d, dt).transpose(1, 2)); });
    check_paths("comparison to u8", dt,
                [&](Device d) { return gt(a.to(d, dt), b.to(d, dt).transpose(1, 2)); });
    check_paths("where with a broadcast mask", dt, [&](Device d) {
      return where(gt(mask.to(d, dt), zeros_like_scalar(d, dt)), a.to(d, dt), b.to(d, dt).transpose(1, 2));
    });
    check_paths("gelu backward", dt, [&](Device d) {
      const Tensor x = a.to(d, dt).set_requires_grad();
      sum(mul(gelu(x), b.to(d, dt).transpose(1, 2))).backward();
      return x.grad();
    });
    check_paths("fill of every other column", dt, [&](Device d) {
      Tensor y = a.to(d, dt).clone();
      y.slice(2, 0, 97, 2).fill_(0.75);
      return y;
    });
  }
}

TEST_CASE("cuda elementwise: mixed precision binary ops read f32 with bf16/f16 as they are",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Tensor x = uniform({8, 65, 97}, 12, -2.0, 2.0);
  const Tensor branch = uniform({8, 65, 97}, 13, -2.0, 2.0);
  const Tensor keep = uniform({8, 1, 1}, 14, 0.0, 2.0);
  for (DType narrow : {DType::kBF16, DType::kF16}) {
    // The residual stream (f32) plus a block's output (16-bit), both ways round.
    check_paths("f32 + 16-bit", DType::kF32, [&](Device d) {
      return add(x.to(d, DType::kF32), branch.to(d, narrow));
    });
    check_paths("16-bit - f32", DType::kF32, [&](Device d) {
      return sub(branch.to(d, narrow), x.to(d, DType::kF32));
    });
    // Drop-path: a 16-bit branch times an f32 per-sample factor (broadcast, strided path).
    check_paths("16-bit * broadcast f32", DType::kF32, [&](Device d) {
      return mul(branch.to(d, narrow), keep.to(d, DType::kF32));
    });
    check_paths("misaligned 16-bit / f32", DType::kF32, [&](Device d) {
      return div(branch.to(d, narrow).flatten().narrow(0, 1, 5001),
                 x.to(d, DType::kF32).flatten().narrow(0, 0, 5001));
    });
    check_paths("comparison", DType::kF32, [&](Device d) {
      return gt(x.to(d, DType::kF32), branch.to(d, narrow));
    });
    check_paths("gradients of a mixed mul", DType::kF32, [&](Device d) {
      const Tensor p = x.to(d, DType::kF32).set_requires_grad();
      const Tensor q = branch.to(d, narrow).set_requires_grad();
      sum(mul(p, q)).backward();
      REQUIRE(q.grad().dtype() == narrow);
      return cat({p.grad().flatten(), q.grad().to(DType::kF32).flatten()}, 0);
    });
  }
}

TEST_CASE("cuda elementwise: views with offsets past 2^31 take 64-bit offsets", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  FastPathsGuard restore;
  // 2^31 + 16 bytes; every 2^20-th one is written and read back through a strided view whose
  // last offset is 2^31, one past the 32-bit range.
  const int64_t step = int64_t{1} << 20, n = 2049;
  const Tensor values = uniform({n}, 11, 0.0, 250.0).to(DType::kU8);
  for (bool fast : {true, false}) {
    set_cuda_elementwise_fast_paths(fast);
    Tensor big = Tensor::zeros({(int64_t{1} << 31) + 16}, DType::kU8, kGpu);
    big.slice(0, 0, (n - 1) * step + 1, step).copy_(values.to(kGpu));
    const Tensor back = big.slice(0, 0, (n - 1) * step + 1, step).contiguous();
    INFO("fast paths " << fast);
    CHECK(same_bits(back, values));
    CHECK(big.narrow(0, step - 1, 3).to(Device::cpu()).to_vector<int>() ==
          std::vector<int>{0, values.to_vector<int>()[1], 0});
  }
}

#endif  // SKA_WITH_CUDA
