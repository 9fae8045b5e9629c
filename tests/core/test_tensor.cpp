// Tensor factories, views without copies, contiguous(), conversions and error messages.
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "core/checked_math.h"
#include "ops/ops.h"
#include "support/test_util.h"

using namespace ska;
using ska::test::values;

TEST_CASE("factories and metadata", "[cpu]") {
  Tensor z = Tensor::zeros({2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.is_contiguous());
  CHECK(z.to_vector<float>() == std::vector<float>(6, 0.0f));
  CHECK(Tensor::full({2}, 2.5, DType::kF64).to_vector<double>() == std::vector<double>{2.5, 2.5});
  CHECK(Tensor::arange(4).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(Tensor::scalar(3.0).item() == 3.0);
  CHECK(z.str() == "Tensor[2, 3] f32 cpu");
  CHECK_THROWS_AS(Tensor::empty({2, -1}), ShapeError);
  CHECK_THROWS_AS(Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}), ShapeError);
}

TEST_CASE("tensors without elements are contiguous, whatever their strides", "[cpu]") {
  // contiguous_strides gives a zero-sized dim's outer dims strides that do not multiply out
  // ([1, 1, 65, 0] gets {65, 65, 1, 1}); kernels that require contiguous operands (CUDA's
  // reductions and copies) must still take such tensors, as PyTorch's do.
  const Tensor e = Tensor::empty({1, 1, 65, 0});
  CHECK(e.numel() == 0);
  CHECK(e.is_contiguous());
  CHECK(Tensor::empty({0, 3}).transpose(0, 1).is_contiguous());
  CHECK(sum(Tensor::empty({2, 3, 65, 0}), {0, 1}, true).shape() == Shape{1, 1, 65, 0});
  CHECK(Tensor::empty({2, 0}).contiguous().is_contiguous());
}

TEST_CASE("views share storage and index correctly", "[cpu]") {
  Tensor x = Tensor::arange(24, DType::kF64).reshape({2, 3, 4});
  Tensor t = x.transpose(0, 2);  // [4, 3, 2]
  CHECK(t.same_storage(x));
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK_FALSE(t.is_contiguous());
  // t[i][j][k] == x[k][j][i] == 12k + 4j + i
  const std::vector<double> tv = t.contiguous().to_vector<double>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 2; ++k) REQUIRE(tv[(i * 3 + j) * 2 + k] == 12 * k + 4 * j + i);

  Tensor n = x.narrow(2, 1, 2);  // [2, 3, 2]
  CHECK(n.same_storage(x));
  CHECK(n.contiguous().to_vector<double>() ==
        std::vector<double>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
  CHECK(x.slice(1, 0, 3, 2).select(2, 3).to_vector<double>() == std::vector<double>{3, 11, 15, 23});
  CHECK(x.select(0, -1).shape() == Shape{3, 4});

  Tensor e = values({1, 2, 3}, {3, 1}).expand({3, 4});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(e.contiguous().to_vector<double>() ==
        std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  CHECK_THROWS_AS(values({1, 2, 3}, {3}).expand({2, 4}), ShapeError);

  CHECK(x.unsqueeze(0).shape() == Shape{1, 2, 3, 4});
  CHECK(x.unsqueeze(-1).shape() == Shape{2, 3, 4, 1});
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(x.view({-1, 4}).shape() == Shape{6, 4});
}

TEST_CASE("view refuses incompatible strides, reshape copies", "[cpu]") {
  Tensor x = Tensor::arange(6, DType::kF64).reshape({2, 3});
  Tensor t = x.transpose(0, 1);
  CHECK_THROWS_AS(t.view({6}), ShapeError);
  Tensor r = t.reshape({6});
  CHECK_FALSE(r.same_storage(x));
  CHECK(r.to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
  // A view that only splits a contiguous dim stays a view even on a permuted tensor.
  Tensor p = Tensor::arange(24, DType::kF64).reshape({2, 3, 4}).permute({2, 0, 1});
  CHECK(p.view({4, 6}).same_storage(p));
  CHECK_THROWS_WITH(x.view({4, 2}), Catch::Contains("invalid for 6 elements"));
}

TEST_CASE("dtype conversions and in-place copy with broadcasting", "[cpu]") {
  Tensor x = values({1.5, -2.25, 3.0}, {3});
  CHECK(x.to(DType::kF32).to_vector<float>() == std::vector<float>{1.5f, -2.25f, 3.0f});
  CHECK(x.to(DType::kI64).to_vector<int64_t>() == std::vector<int64_t>{1, -2, 3});
  CHECK(x.to(DType::kBF16).to_vector<double>() == std::vector<double>{1.5, -2.25, 3.0});
  CHECK(x.to(DType::kF16).to(DType::kF64).to_vector<double>() == x.to_vector<double>());
  Tensor d = Tensor::zeros({2, 3}, DType::kF64);
  d.copy_(x);
  CHECK(d.to_vector<double>() == std::vector<double>{1.5, -2.25, 3, 1.5, -2.25, 3});
  d.narrow(1, 1, 1).fill_(7.0);
  CHECK(d.to_vector<double>() == std::vector<double>{1.5, 7, 3, 1.5, 7, 3});
}

TEST_CASE("devices parse, CUDA without a device is a clear error", "[cpu]") {
  CHECK(Device::parse("cuda:3") == Device::cuda(3));
  CHECK(Device::parse("cpu").is_cpu());
  CHECK_THROWS_AS(Device::parse("gpu0"), ValueError);
  CHECK_THROWS_AS(Device::parse("cuda:99999999999999999999"), ValueError);  // not out_of_range
  CHECK_THROWS_AS(Device::parse("cuda:"), ValueError);
  if (!cuda_is_available()) {
    CHECK_THROWS_AS(Tensor::zeros({2}, DType::kF32, Device::cuda(0)), Error);
  }
}

TEST_CASE("host allocator statistics track live and peak bytes", "[cpu]") {
  Allocator& a = allocator_for(Device::cpu());
  a.reset_peak();
  const MemoryStats before = a.stats();
  {
    Tensor t = Tensor::empty({1024, 1024});  // 4 MiB
    const MemoryStats during = a.stats();
    CHECK(during.allocated - before.allocated >= 4 * 1024 * 1024);
    CHECK(during.peak_allocated >= during.allocated);
  }
  CHECK(a.stats().allocated == before.allocated);
  CHECK(a.stats().peak_allocated - before.allocated >= 4 * 1024 * 1024);
  // Requested bytes: the tensor's own, where the block is rounded up (to 1 MiB here).
  a.reset_peak();
  const MemoryStats start = a.stats();
  CHECK(start.peak_requested == start.requested);
  {
    Tensor t = Tensor::empty({1000, 1001});  // 4,004,000 bytes: a block of 4 MiB
    const MemoryStats during = a.stats();
    CHECK(during.requested - start.requested == 4004000);
    CHECK(during.allocated - start.allocated == 4 * 1024 * 1024);
  }
  const MemoryStats after = a.stats();
  CHECK(after.requested == start.requested);
  CHECK(after.peak_requested - start.requested == 4004000);
  // Reserved bytes: the blocks held from the system, cached ones included, and their peak.
  a.empty_cache();
  a.reset_peak();
  const MemoryStats empty = a.stats();
  CHECK(empty.reserved == empty.allocated);
  CHECK(empty.peak_reserved == empty.reserved);
  { Tensor t = Tensor::empty({1000, 1001}); }  // its 4 MiB block stays cached
  CHECK(a.stats().reserved - empty.reserved == 4 * 1024 * 1024);
  a.empty_cache();
  CHECK(a.stats().reserved == empty.reserved);
  CHECK(a.stats().peak_reserved - empty.reserved == 4 * 1024 * 1024);
  a.reset_peak();
  CHECK(a.stats().peak_reserved == empty.reserved);
}

TEST_CASE("host allocator caches large blocks for the next request of their size", "[cpu]") {
  Allocator& a = allocator_for(Device::cpu());
  a.empty_cache();
  const Shape large{3, 1000, 1000};  // 12 MB (f32): rounded up to 12 MiB and cached when freed
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty(large);
    first = t.data_ptr();
  }
  const MemoryStats cached = a.stats();
  CHECK(cached.reserved - cached.allocated >= 12 * 1024 * 1024);
  {
    Tensor again = Tensor::empty(large);
    CHECK(again.data_ptr() == first);  // the same block, no system call
    CHECK(a.stats().num_system_allocs == cached.num_system_allocs);
    CHECK(a.stats().allocated - cached.allocated >= 12 * 1000 * 1000);
    // A different rounded size is a new block.
    Tensor other = Tensor::empty({5, 1000, 1000});
    CHECK(a.stats().num_system_allocs == cached.num_system_allocs + 1);
  }
  a.empty_cache();
  CHECK(a.stats().reserved == a.stats().allocated);
  // Small blocks are not cached: reserved stays equal to allocated.
  { Tensor small = Tensor::empty({100}); }
  CHECK(a.stats().reserved == a.stats().allocated);
}

TEST_CASE("sizes that overflow 64 bits are errors, not wrapped numbers", "[cpu][hardening]") {
  using Catch::Matchers::Contains;
  const Shape huge = {int64_t{1} << 32, int64_t{1} << 32, 4};  // 2^66 elements
  REQUIRE_THROWS_AS(shape_numel(huge), ShapeError);
  REQUIRE_THROWS_WITH(shape_numel(huge), Contains("[4294967296, 4294967296, 4]") &&
                                             Contains("more elements than a 64-bit integer"));
  CHECK(shape_numel({int64_t{1} << 40, int64_t{1} << 40, 0}) == 0);  // empty, whatever the rest
  CHECK(shape_numel({int64_t{1} << 31, int64_t{1} << 31}) == int64_t{1} << 62);
  REQUIRE_THROWS_WITH(contiguous_strides({2, int64_t{1} << 40, int64_t{1} << 40, 3}),
                      Contains("contiguous_strides") && Contains("overflows a 64-bit integer"));
  CHECK(contiguous_strides({int64_t{1} << 40, int64_t{1} << 20, 0}) ==
        Shape{int64_t{1} << 20, 1, 1});
  // 2^61 floats: the element count fits, the byte count does not.
  REQUIRE_THROWS_WITH(Tensor::empty({int64_t{1} << 61}),
                      Contains("empty") && Contains("overflows a 64-bit integer"));
  REQUIRE_THROWS_WITH(checked_mul<IOError>(int64_t{1} << 40, int64_t{1} << 30, "file 'x': count"),
                      Contains("file 'x': count: 1099511627776 x 1073741824 overflows"));
  REQUIRE_THROWS_AS(checked_add<IOError>(INT64_MAX, 1, "sum"), IOError);
}

TEST_CASE("the kernel profiler counts each call's operand bytes and product flops", "[cpu][core]") {
  const Tensor x = randn({2, 3, 6, 5}), w = randn({4, 3, 3, 3}), bias = randn({4});
  const Tensor a = randn({2, 7, 5}), b = randn({2, 5, 3});
  const Tensor q = randn({2, 3, 9, 4}), k = randn({2, 3, 11, 4}), v = randn({2, 3, 11, 6});
  const Tensor row = randn({1, 6});  // broadcast: its 6 elements are read once
  profiler::start();
  const Tensor y = conv2d(x, w, bias, 1, 1);  // [2, 4, 6, 5]
  const Tensor c = matmul(a, b);              // [2, 7, 3]
  const Tensor o = scaled_dot_attention(q, k, v, 0.5);
  const Tensor added = add(Tensor::ones({10, 6}), row);
  std::vector<profiler::KernelTime> calls;
  const std::vector<profiler::KernelTime> kernels = profiler::stop(&calls);
  std::map<std::string, profiler::KernelTime> by_name;
  for (const auto& kt : kernels) by_name[kt.name] = kt;
  const double f = 4.0;  // bytes an f32 element
  REQUIRE(by_name.count("conv2d_forward") == 1);
  CHECK(by_name["conv2d_forward"].flops == 2.0 * (2 * 4 * 6 * 5) * (3 * 3 * 3));
  CHECK(by_name["conv2d_forward"].bytes == f * (2 * 3 * 6 * 5 + 4 * 3 * 3 * 3 + 4 + 2 * 4 * 6 * 5));
  REQUIRE(by_name.count("gemm") == 1);
  CHECK(by_name["gemm"].flops == 2.0 * (2 * 7 * 3) * 5);
  CHECK(by_name["gemm"].bytes == f * (2 * 7 * 5 + 2 * 5 * 3 + 2 * 7 * 3));
  REQUIRE(by_name.count("attention_forward") == 1);
  // S = q k^T (d 4) and O = P v (dv 6) for 2 x 3 x 9 queries and 11 keys; out [2, 3, 9, 6] and
  // the f32 log-sum-exp [2, 3, 9] are written.
  CHECK(by_name["attention_forward"].flops == 2.0 * (2 * 3 * 9) * 11 * (4 + 6));
  CHECK(by_name["attention_forward"].bytes ==
        f * (2 * 3 * 9 * 4 + 2 * 3 * 11 * 4 + 2 * 3 * 11 * 6 + 2 * 3 * 9 * 6 + 2 * 3 * 9));
  REQUIRE(by_name.count("binary") == 1);
  CHECK(by_name["binary"].flops == 0.0);
  CHECK(by_name["binary"].bytes == f * (60 + 6 + 60));
  // Per operands, the same totals.
  for (const auto& call : calls) {
    if (call.name != "gemm") continue;
    CHECK(call.flops == by_name["gemm"].flops);
    CHECK(call.bytes == by_name["gemm"].bytes);
  }
  // The backward passes: dL/dx and dL/dw of the convolution (the output grid's positions times
  // a filter's taps each), the attention's five products (S, dP, dV, dQ, dK).
  Tensor xg = x.detach().clone(), wg = w.detach().clone(), qg = q.detach().clone();
  xg.set_requires_grad();
  wg.set_requires_grad();
  qg.set_requires_grad();
  const Tensor loss =
      add(sum(conv2d(xg, wg, Tensor(), 1, 1)), sum(scaled_dot_attention(qg, k, v, 0.5)));
  profiler::start();
  loss.backward();
  by_name.clear();
  for (const auto& kt : profiler::stop()) by_name[kt.name] = kt;
  CHECK(by_name["conv2d_backward_input"].flops == 2.0 * (2 * 4 * 6 * 5) * (3 * 3 * 3));
  CHECK(by_name["conv2d_backward_weight"].flops == 2.0 * (2 * 4 * 6 * 5) * (3 * 3 * 3));
  CHECK(by_name["attention_backward"].flops == 2.0 * (2 * 3 * 9) * 11 * (3 * 4 + 2 * 6));
  CHECK(y.size(1) == 4);
  CHECK(c.size(2) == 3);
  CHECK(o.size(3) == 6);
  CHECK(added.size(0) == 10);
}

TEST_CASE("the kernel profiler counts each kernel call once, outer calls only", "[cpu][core]") {
  const Tensor a = Tensor::ones({8, 8}), b = Tensor::ones({8, 8});
  profiler::start();
  CHECK(profiler::active());
  const Tensor c = matmul(a, b);
  const Tensor d = add(c, b);
  // A kernel that calls another through SKA_KERNEL is timed as one call of the outer one.
  profiler::timed("outer_test", Device::cpu(), [&] {
    SKA_KERNEL(Device::cpu(), fill)(Tensor::empty({4}), 1.0);
  })();
  const std::vector<profiler::KernelTime> kernels = profiler::stop();
  CHECK_FALSE(profiler::active());
  std::map<std::string, int64_t> calls;
  for (const auto& k : kernels) {
    calls[k.name] = k.calls;
    CHECK(k.ms >= 0.0);
    CHECK(k.family == profiler::family_of(k.name));
  }
  CHECK(calls["gemm"] == 1);
  CHECK(calls["binary"] == 1);
  CHECK(calls["outer_test"] == 1);
  CHECK(calls.count("fill") == 0);
  CHECK(profiler::family_of("gemm") == "matmul");
  CHECK(profiler::family_of("multi_adam_step") == "optimizer");
  CHECK(profiler::family_of("attention_backward") == "attention");
  CHECK(profiler::family_of("something_new") == "other");
  // CUDA Graphs are for CUDA devices only.
  CHECK_THROWS_AS(DeviceGraph(Device::cpu(), [] {}), DeviceError);
  // Off again: nothing is recorded.
  matmul(a, b);
  profiler::start();
  CHECK(profiler::stop().empty());
  CHECK(d.to_vector<float>()[0] == 9.0f);
}
