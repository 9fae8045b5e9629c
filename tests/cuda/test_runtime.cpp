// CUDA runtime and first-half kernel tests: caching allocator, OOM errors, transfers, pinned
// memory, streams, Philox parity with the CPU, GEMM against a host reference, reductions.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>

#include "support/test_util.h"

#ifdef SKA_WITH_CUDA

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "core/precision.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/cublaslt.h"
#include "cuda/runtime/runtime.h"
#include "ops/ops.h"

using namespace ska;

namespace {

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                                DType::kI32, DType::kI64, DType::kU8};

// Small integers: exact in every dtype, u8 included.
std::vector<double> small_ints(int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>((i * 37) % 101);
  return v;
}

// Multiples of 1/8 in [-1, 1]: exact in bf16, f16 and TF32, so GEMM sums are exact in f32.
std::vector<double> eighths(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = philox4x32_10(seed, static_cast<uint64_t>(i)).w[0];
    v[static_cast<size_t>(i)] = static_cast<double>(static_cast<int>(h % 17) - 8) / 8.0;
  }
  return v;
}

}  // namespace

TEST_CASE("CUDA caching allocator reuses blocks and tracks statistics", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Allocator& alloc = allocator_for(Device::cuda(0));
  const MemoryStats s0 = alloc.stats();
  void* p = alloc.allocate(1000000);
  const MemoryStats s1 = alloc.stats();
  CHECK(s1.allocated - s0.allocated >= 1000000);
  CHECK(s1.num_allocs == s0.num_allocs + 1);
  alloc.deallocate(p);
  CHECK(alloc.stats().allocated == s0.allocated);
  void* q = alloc.allocate(1000000);
  const MemoryStats s2 = alloc.stats();
  CHECK(s2.num_system_allocs == s1.num_system_allocs);  // served from the cache
  CHECK(s2.num_allocs == s1.num_allocs + 1);
  alloc.deallocate(q);

  alloc.reset_peak();
  const int64_t base = alloc.stats().allocated;
  CHECK(alloc.stats().peak_allocated == base);
  std::vector<void*> blocks;
  for (int i = 0; i < 3; ++i) blocks.push_back(alloc.allocate(size_t{4} << 20));
  for (void* b : blocks) alloc.deallocate(b);
  const MemoryStats s3 = alloc.stats();
  CHECK(s3.allocated == base);
  CHECK(s3.peak_allocated >= base + (int64_t{12} << 20));
  CHECK(s3.reserved >= s3.peak_allocated);
  // Requested bytes: the callers' own, under the blocks (cut from a segment, rounded to 512 B).
  alloc.reset_peak();
  const int64_t asked = alloc.stats().requested;
  void* odd = alloc.allocate(3000001);
  CHECK(alloc.stats().requested - asked == 3000001);
  // Splitting (the default): a large block is cut to the request rounded to 512 B, or handed out
  // whole when what is left would be 1 MiB or less. SKA_CUDA_ALLOCATOR=whole_blocks (what
  // gpu_check.sh runs memcheck with): a block of its own, 4 MiB, or a cached one a quarter larger.
  const char* mode = std::getenv("SKA_CUDA_ALLOCATOR");
  const bool whole = mode != nullptr && std::string(mode) == "whole_blocks";
  const int64_t odd_block = alloc.stats().allocated - base;
  CHECK(odd_block >= (whole ? int64_t{4} << 20 : 3000320));
  CHECK(odd_block <= (whole ? int64_t{5} << 20 : 3000320 + (int64_t{1} << 20)));
  // Small blocks: the request rounded to 512 B, with less than 512 B left over (whole blocks: or
  // a cached one up to a quarter larger).
  void* first = alloc.allocate(1000);
  const int64_t small_block = alloc.stats().allocated - base - odd_block;
  CHECK(small_block >= 1024);
  CHECK(small_block <= (whole ? 1280 : 1535));
  alloc.deallocate(first);
  alloc.deallocate(odd);
  CHECK(alloc.stats().requested == asked);
  CHECK(alloc.stats().peak_requested - asked == 3000001 + 1000);  // odd and first at once
  // empty_cache gives back every segment with nothing in use: a 30 MiB one of its own here.
  void* big = alloc.allocate(size_t{30} << 20);
  alloc.deallocate(big);
  const int64_t held = alloc.stats().reserved;
  alloc.empty_cache();
  CHECK(alloc.stats().reserved <= held - (int64_t{30} << 20));
  CHECK(alloc.stats().reserved >= alloc.stats().allocated);
  CHECK(alloc.stats().peak_reserved >= held);  // the peak stays
  alloc.reset_peak();
  CHECK(alloc.stats().peak_reserved == alloc.stats().reserved);
}

TEST_CASE("CUDA out-of-memory errors say how much was asked and held", "[cuda][oom]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Allocator& alloc = allocator_for(Device::cuda(0));
  const size_t absurd = size_t{1} << 50;
  REQUIRE_THROWS_AS(alloc.allocate(absurd), OutOfMemoryError);
  try {
    alloc.allocate(absurd);
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("1125899906842624"));
    CHECK_THAT(msg, Catch::Contains("cuda:0"));
    CHECK_THAT(msg, Catch::Contains("allocated"));
    CHECK_THAT(msg, Catch::Contains("reserved"));
  }
  // The allocator still works afterwards.
  Tensor t = Tensor::full({16}, 3.0, DType::kF32, Device::cuda(0));
  CHECK(t.to_vector<float>()[15] == 3.0f);
}

TEST_CASE("CUDA host<->device round trips of every dtype, strided views included", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Shape shape{3, 4, 5};
  for (DType dt : kAllDTypes) {
    INFO("dtype " << dtype_name(dt));
    const Tensor host = Tensor::from_vector(small_ints(60), shape, dt);
    const Tensor dev = host.to(Device::cuda(0));
    CHECK(dev.device() == Device::cuda(0));
    CHECK(dev.to(Device::cpu()).to_vector<double>() == host.to_vector<double>());
    // Strided on the device (cuda::copy) and strided on the host (packed before the transfer).
    const Tensor dev_t = dev.permute({2, 0, 1}).contiguous();
    CHECK(dev_t.to_vector<double>() == host.permute({2, 0, 1}).contiguous().to_vector<double>());
    CHECK(host.slice(2, 1, 5, 2).to(Device::cuda(0)).to_vector<double>() ==
          host.slice(2, 1, 5, 2).contiguous().to_vector<double>());
    // Writing into a strided device view.
    Tensor target = Tensor::zeros({5, 3, 4}, dt, Device::cuda(0));
    target.permute({1, 2, 0}).copy_(host);
    CHECK(target.to_vector<double>() == host.permute({2, 0, 1}).contiguous().to_vector<double>());
    // Conversions on the device equal those on the host.
    for (DType to : kAllDTypes) {
      INFO("to " << dtype_name(to));
      CHECK(dev.to(to).to_vector<double>() == host.to(to).to_vector<double>());
    }
  }
}

TEST_CASE("CUDA pinned memory round trip", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Tensor pinned = Tensor::empty_pinned({1000}, DType::kF32);
  CHECK(pinned.storage()->pinned());
  for (int i = 0; i < 1000; ++i) pinned.data<float>()[i] = static_cast<float>(i) * 0.5f;
  Tensor dev = Tensor::empty({1000}, DType::kF32, Device::cuda(0));
  dev.copy_(pinned);  // asynchronous
  Tensor back = Tensor::empty_pinned({1000}, DType::kF32);
  back.copy_(dev);  // synchronises
  CHECK(std::memcmp(back.data<float>(), pinned.data<float>(), 1000 * sizeof(float)) == 0);
  const MemoryStats before = pinned_host_allocator().stats();
  { Tensor again = Tensor::empty_pinned({1000}, DType::kF32); }
  { Tensor again = Tensor::empty_pinned({1000}, DType::kF32); }
  CHECK(pinned_host_allocator().stats().num_system_allocs <= before.num_system_allocs + 1);
}

TEST_CASE("CUDA StreamGuard selects the current stream of this thread", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const cudaStream_t compute = cuda::current_stream(0);
  CHECK(compute == cuda::current_stream(0));
  const cudaStream_t side = cuda::create_stream(0);
  REQUIRE(side != compute);
  {
    cuda::StreamGuard guard(0, side);
    CHECK(cuda::current_stream(0) == side);
    cudaStream_t seen_by_other = nullptr;
    std::thread([&] { seen_by_other = cuda::current_stream(0); }).join();
    CHECK(seen_by_other == compute);
    Tensor t = Tensor::full({100}, 2.0, DType::kF32, Device::cuda(0));  // runs on `side`
    CHECK(t.to_vector<float>()[99] == 2.0f);
  }
  CHECK(cuda::current_stream(0) == compute);
  CHECK(cuda::compute_capability(0) >= 50);
  CHECK(cuda::sm_count(0) > 0);
  CHECK(cuda::cudnn_handle(0) != nullptr);
  CHECK(cuda::cublaslt_handle(0) != nullptr);
}

// No device needed: the library is loaded by the first call (not linked), and a failed status is
// reported by name with the call and its file:line.
TEST_CASE("cuBLASLt is loaded on first use and names its statuses") {
  const cuda::CublasLt& lt = cuda::cublaslt();
  CHECK(&lt == &cuda::cublaslt());
  CHECK(std::string(lt.status_name(CUBLAS_STATUS_NOT_SUPPORTED)) == "CUBLAS_STATUS_NOT_SUPPORTED");
  CHECK(std::string(lt.status_string(CUBLAS_STATUS_SUCCESS)).size() > 0);
  CHECK_NOTHROW(cuda::check_cublas(CUBLAS_STATUS_SUCCESS, "f()", "a.cpp", 1));
  try {
    cuda::check_cublas(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul(x)", "gemm.cpp", 12);
    FAIL("no error");
  } catch (const CudaError& e) {
    const std::string what = e.what();
    CHECK(what.find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
    CHECK(what.find("cublasLtMatmul(x) at gemm.cpp:12") != std::string::npos);
  }
}

TEST_CASE("CUDA Philox draws equal the CPU's bit for bit", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (int64_t n : {1, 7, 1001, 65537}) {
    INFO("n = " << n);
    const uint64_t seed = 0x1234567890abcdefull, offset = 17;
    Tensor c = Tensor::empty({n}, DType::kF32);
    Tensor g = Tensor::empty({n}, DType::kF32, Device::cuda(0));
    cpu::random_uniform(c, seed, offset, -2.0, 3.0, Tensor());
    cuda::random_uniform(g, seed, offset, -2.0, 3.0, Tensor());
    const std::vector<float> gu = g.to_vector<float>();
    CHECK(std::memcmp(gu.data(), c.data<float>(), static_cast<size_t>(n) * 4) == 0);
    cpu::random_bernoulli(c, seed, offset, 0.3, 1.0 / 0.3, Tensor());
    cuda::random_bernoulli(g, seed, offset, 0.3, 1.0 / 0.3, Tensor());
    const std::vector<float> gb = g.to_vector<float>();
    CHECK(std::memcmp(gb.data(), c.data<float>(), static_cast<size_t>(n) * 4) == 0);
    // Normal draws use logf/cosf/sinf, which may differ by an ulp between CUDA and glibc.
    cpu::random_normal(c, seed, offset, 0.5, 2.0, Tensor());
    cuda::random_normal(g, seed, offset, 0.5, 2.0, Tensor());
    ska::test::require_close(g, c, {1e-5, 1e-5}, "normal draws");
  }
}

TEST_CASE("CUDA gemm matches a host reference", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const int64_t B = 3, M = 33, N = 47, K = 65;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int variant = 0; variant < 16; ++variant) {
      const bool a_col = variant & 1, b_col = variant & 2, a_bcast = variant & 4,
                 bias_on = variant & 8;
      INFO(dtype_name(dt) << " a_col " << a_col << " b_col " << b_col << " a_broadcast "
                          << a_bcast << " bias " << bias_on);
      const int64_t a_batches = a_bcast ? 1 : B;
      const std::vector<double> av = eighths(a_batches * M * K, 1), bv = eighths(B * K * N, 2),
                                cv = eighths(B * M * N, 3), biasv = eighths(N, 4);
      const float alpha = 0.5f, beta = bias_on ? 0.25f : 0.0f;
      // Device operands with the requested layouts; logical shapes [*, M, K] and [B, K, N].
      auto upload = [&](const std::vector<double>& v, int64_t batches, int64_t r, int64_t c,
                        bool col_major) {
        // Logical row-major values; a column-major layout is made on the device (cuda::copy).
        Tensor t = Tensor::from_vector(v, {batches, r, c}, dt, Device::cuda(0));
        return col_major ? t.transpose(1, 2).contiguous().transpose(1, 2) : t;
      };
      GemmArgs args;
      args.a = upload(av, a_batches, M, K, a_col);
      if (a_bcast) args.a = args.a.expand({B, M, K});
      args.b = upload(bv, B, K, N, b_col);
      args.c = Tensor::from_vector(cv, {B, M, N}, dt, Device::cuda(0));
      if (bias_on) args.bias = Tensor::from_vector(biasv, {N}, dt, Device::cuda(0));
      args.alpha = alpha;
      args.beta = beta;
      REQUIRE(args.a.stride(a_col ? 1 : 2) == 1);
      cuda::gemm(args);

      std::vector<double> ref(static_cast<size_t>(B * M * N));
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              acc += av[static_cast<size_t>(((a_bcast ? 0 : b) * M + m) * K + k)] *
                     bv[static_cast<size_t>((b * K + k) * N + n)];
            }
            const size_t o = static_cast<size_t>((b * M + m) * N + n);
            ref[o] = alpha * acc + beta * cv[o] + (bias_on ? biasv[static_cast<size_t>(n)] : 0.0);
          }
        }
      }
      ska::test::require_close(args.c, Tensor::from_vector(ref, {B, M, N}),
                               ska::test::tolerance_for(dt), "cuda gemm vs host reference");
    }
  }
}

TEST_CASE("CUDA gemm and column sums of 16-bit operands into f32 match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  // A weight gradient's shapes: g^T [out, rows] (column-major) @ x [rows, in], rows = 2 * 65.
  for (DType dt : {DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dt));
    const Tensor g = ska::test::uniform({1, 130, 96}, 41, -1.0, 1.0, DType::kF32).to(dt);
    const Tensor x = ska::test::uniform({1, 130, 64}, 42, -1.0, 1.0, DType::kF32).to(dt);
    GemmArgs host, device;
    host.a = g.transpose(1, 2);
    host.b = x;
    host.c = Tensor::empty({1, 96, 64}, DType::kF32);
    device.a = g.to(gpu).transpose(1, 2);
    device.b = x.to(gpu);
    device.c = Tensor::empty({1, 96, 64}, DType::kF32, gpu);
    // The same shape into the 16-bit dtype first: the plan cache tells the two apart.
    GemmArgs narrow = device;
    narrow.c = Tensor::empty({1, 96, 64}, dt, gpu);
    cuda::gemm(narrow);
    cpu::gemm(host);
    cuda::gemm(device);
    // f32 sums of exact products (16-bit operands) in another order: f32 tolerances.
    ska::test::require_close(device.c, host.c, {1e-5, 1e-5}, "gemm into f32");
    ska::test::require_close(narrow.c, host.c, ska::test::tolerance_for(dt), "gemm into 16 bits");
    // With an f32 bias, alpha and beta.
    host.bias = ska::test::uniform({64}, 43, -1.0, 1.0, DType::kF32);
    device.bias = host.bias.to(gpu);
    host.alpha = device.alpha = 0.5f;
    host.beta = device.beta = 2.0f;
    cpu::gemm(host);
    cuda::gemm(device);
    ska::test::require_close(device.c, host.c, {1e-5, 1e-5}, "gemm into f32 with a bias");
    // Column sums (a bias gradient) and row sums into f32.
    for (int64_t dim : {0, 1}) {
      INFO("reduced dim " << dim);
      Shape shape = {130, 96};
      shape[static_cast<size_t>(dim)] = 1;
      const Tensor want = Tensor::empty(shape, DType::kF32);
      const Tensor got = Tensor::empty(shape, DType::kF32, gpu);
      cpu::reduce(ReduceOp::kSum, g.view({130, 96}), {dim}, want);
      cuda::reduce(ReduceOp::kSum, g.to(gpu).view({130, 96}), {dim}, got);
      ska::test::require_close(got, want, {1e-5, 1e-5}, "sums into f32");
    }
    // The weight gradient's product with the bias gradient from the same call (cuBLASLt's
    // BGRADB epilogue where it has one, else the reduce kernel), into f32 and into 16 bits.
    for (DType out : {DType::kF32, dt}) {
      INFO("into " << dtype_name(out));
      GemmArgs h, d;
      h.a = g.transpose(1, 2);
      h.b = x;
      h.c = Tensor::empty({1, 96, 64}, out);
      h.a_row_sums = Tensor::empty({96}, out);
      d.a = g.to(gpu).transpose(1, 2);
      d.b = x.to(gpu);
      d.c = Tensor::empty({1, 96, 64}, out, gpu);
      d.a_row_sums = Tensor::empty({96}, out, gpu);
      cpu::gemm(h);
      cuda::gemm(d);
      const ska::test::Tolerance tol =
          out == DType::kF32 ? ska::test::Tolerance{1e-5, 1e-5} : ska::test::tolerance_for(dt);
      ska::test::require_close(d.c, h.c, tol, "the product beside the row sums");
      ska::test::require_close(d.a_row_sums, h.a_row_sums, tol, "a's row sums");
    }
  }
}

TEST_CASE("CUDA gemm with timed algorithms: the CPU's results, and a choice per problem",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  // GemmAlgorithm::kTimed on problems of ViT-S's shapes (rows of 2 x 65 tokens): the product,
  // with a bias and beta (c read: the timing runs must not write it), and the weight gradient's
  // with the row sums of its epilogue, against the CPU, with one choice line a problem.
  const GemmAlgorithm previous = set_cuda_gemm_algorithm(GemmAlgorithm::kTimed);
  const bool benchmark = cudnn_benchmark();
  set_cudnn_benchmark(true);
  const size_t lines_before = cuda_gemm_choices().size();
  const DType dt = DType::kBF16;
  const Tensor x = ska::test::uniform({1, 130, 512}, 51, -1.0, 1.0, DType::kF32).to(dt);
  const Tensor w = ska::test::uniform({1, 512, 384}, 52, -0.1, 0.1, DType::kF32).to(dt);
  const Tensor c0 = ska::test::uniform({1, 130, 384}, 53, -1.0, 1.0, DType::kF32).to(dt);
  const Tensor bias = ska::test::uniform({384}, 54, -1.0, 1.0, DType::kF32).to(dt);
  for (int run = 0; run < 2; ++run) {  // the second call takes the problems' choices
    INFO("call " << run + 1);
    GemmArgs h, d;
    h.a = x.to(DType::kF32);
    h.b = w.to(DType::kF32);
    h.c = c0.to(DType::kF32);
    h.bias = bias.to(DType::kF32);
    h.alpha = d.alpha = 0.5f;
    h.beta = d.beta = 2.0f;
    d.a = x.to(gpu);
    d.b = w.to(gpu);
    d.c = c0.to(gpu);
    d.bias = bias.to(gpu);
    cpu::gemm(h);
    cuda::gemm(d);
    ska::test::require_close(d.c, h.c, ska::test::tolerance_for(dt), "timed gemm with bias, beta");
    GemmArgs hg, dg;  // x^T [512, 130] @ c0 [130, 384] with x^T's row sums
    hg.a = h.a.transpose(1, 2);
    hg.b = c0.to(DType::kF32);
    hg.c = Tensor::empty({1, 512, 384}, DType::kF32);
    hg.a_row_sums = Tensor::empty({512}, DType::kF32);
    dg.a = x.to(gpu).transpose(1, 2);
    dg.b = c0.to(gpu);
    dg.c = Tensor::empty({1, 512, 384}, DType::kF32, gpu);
    dg.a_row_sums = Tensor::empty({512}, DType::kF32, gpu);
    cpu::gemm(hg);
    cuda::gemm(dg);
    ska::test::require_close(dg.c, hg.c, {1e-4, 1e-4}, "timed weight-gradient gemm");
    ska::test::require_close(dg.a_row_sums, hg.a_row_sums, {1e-4, 1e-4}, "its row sums");
  }
  const std::vector<std::string> lines = cuda_gemm_choices();
  CHECK(lines.size() <= lines_before + 2);  // each problem timed once at most
  for (size_t i = lines_before; i < lines.size(); ++i) {
    INFO(lines[i]);
    CHECK(lines[i].find("gemm bf16") == 0);
  }
  set_cudnn_benchmark(benchmark);
  set_cuda_gemm_algorithm(previous);
}

TEST_CASE("CUDA reduce, argmax and topk kernels match the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Tensor x = ska::test::uniform({5, 7, 300}, 11, -3.0, 3.0, DType::kF32);
  const Tensor xg = x.to(Device::cuda(0));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
    for (const std::vector<int64_t>& dims :
         std::vector<std::vector<int64_t>>{{0}, {1}, {2}, {0, 2}, {0, 1, 2}}) {
      Shape out_shape = x.shape();
      for (int64_t d : dims) out_shape[static_cast<size_t>(d)] = 1;
      Tensor c = Tensor::empty(out_shape, DType::kF32);
      Tensor g = Tensor::empty(out_shape, DType::kF32, Device::cuda(0));
      cpu::reduce(op, x, dims, c);
      cuda::reduce(op, xg, dims, g);
      ska::test::require_close(g, c, ska::test::tolerance_for(DType::kF32),
                               std::string("reduce ") + reduce_op_name(op));
    }
  }
  // One long row: split over blocks.
  const Tensor big = ska::test::uniform({1, 1 << 20}, 12, 0.0, 1.0, DType::kF32);
  Tensor c = Tensor::empty({1, 1}, DType::kF32), g = Tensor::empty({1, 1}, DType::kF32, Device::cuda(0));
  cpu::reduce(ReduceOp::kSum, big, {1}, c);
  cuda::reduce(ReduceOp::kSum, big.to(Device::cuda(0)), {1}, g);
  ska::test::require_close(g, c, {1e-2, 1e-5}, "long sum");

  // Ties: the first maximum wins; top-k orders ties by index.
  const Tensor t = ska::test::values({1, 5, 5, 2, 5, 0, 3, 3, 1, 3, 2, 0}, {2, 6}, DType::kF32);
  const Tensor tg = t.to(Device::cuda(0));
  for (int64_t dim : {0, 1}) {
    Shape s = t.shape();
    s[static_cast<size_t>(dim)] = 1;
    Tensor ci = Tensor::empty(s, DType::kI64), gi = Tensor::empty(s, DType::kI64, Device::cuda(0));
    cpu::argmax(t, dim, ci);
    cuda::argmax(tg, dim, gi);
    CHECK(gi.to_vector<int64_t>() == ci.to_vector<int64_t>());
  }
  Tensor cv = Tensor::empty({2, 4}, DType::kF32), gv = Tensor::empty({2, 4}, DType::kF32, Device::cuda(0));
  Tensor ci = Tensor::empty({2, 4}, DType::kI64), gi = Tensor::empty({2, 4}, DType::kI64, Device::cuda(0));
  cpu::topk(t, 4, cv, ci);
  cuda::topk(tg, 4, gv, gi);
  CHECK(gv.to_vector<float>() == cv.to_vector<float>());
  CHECK(gi.to_vector<int64_t>() == ci.to_vector<int64_t>());
}

TEST_CASE("CUDA column reductions (leading dims reduced) match the CPU, chunked or not",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  struct Case {
    Shape shape;
    std::vector<int64_t> dims;
  };
  // A bias gradient [B * N, C] at ViT sizes; few rows; many rows and few columns (chunked);
  // two leading dims; size-1 dims between them.
  const std::vector<Case> cases = {{{33280, 384}, {0}},  {{4160, 1536}, {0}}, {{2, 33}, {0}},
                                   {{65, 3}, {0}},       {{100000, 5}, {0}},  {{8, 65, 97}, {0, 1}},
                                   {{4, 1, 7, 1, 5}, {0, 2}}};
  for (const Case& c : cases) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const Tensor x = ska::test::uniform(c.shape, 21, -2.0, 2.0, DType::kF32).to(dt);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
        INFO(shape_str(c.shape) << " " << reduce_op_name(op) << " " << dtype_name(dt));
        Shape out_shape = c.shape;
        for (int64_t d : c.dims) out_shape[static_cast<size_t>(d)] = 1;
        Tensor want = Tensor::empty(out_shape, dt), got = Tensor::empty(out_shape, dt, gpu);
        Tensor again = Tensor::empty(out_shape, dt, gpu);
        cpu::reduce(op, x, c.dims, want);
        cuda::reduce(op, x.to(gpu), c.dims, got);
        cuda::reduce(op, x.to(gpu), c.dims, again);
        // Sums of up to 33,280 terms: f32 accumulation in another order than the CPU's f64.
        const ska::test::Tolerance tol =
            dt == DType::kBF16 ? ska::test::tolerance_for(dt) : ska::test::Tolerance{1e-3, 1e-5};
        ska::test::require_close(got, want, tol, "column reduction");
        CHECK(got.to(DType::kF32).to_vector<float>() == again.to(DType::kF32).to_vector<float>());
      }
    }
  }
  // A view one element past a 16-byte boundary (element loads where the columns would take
  // 16-byte ones), MetaFormer's narrow channels and f16: the same CPU figures.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const Shape& shape : std::vector<Shape>{{3000, 64}, {12544, 64}}) {
      const int64_t n = shape[0] * shape[1];
      const Tensor flat = ska::test::uniform({n + 1}, 23, -2.0, 2.0, DType::kF32).to(dt);
      const Tensor x = flat.narrow(0, 1, n).view(shape);
      INFO(shape_str(shape) << " " << dtype_name(dt));
      Tensor want = Tensor::empty({1, shape[1]}, dt);
      cpu::reduce(ReduceOp::kSum, x, {0}, want);
      for (const bool misaligned : {false, true}) {
        const Tensor xg = misaligned ? flat.to(gpu).narrow(0, 1, n).view(shape) : x.to(gpu);
        Tensor got = Tensor::empty({1, shape[1]}, dt, gpu);
        cuda::reduce(ReduceOp::kSum, xg, {0}, got);
        const ska::test::Tolerance tol =
            dt == DType::kF32 ? ska::test::Tolerance{1e-3, 1e-5} : ska::test::tolerance_for(dt);
        ska::test::require_close(got, want, tol, misaligned ? "misaligned columns" : "columns");
      }
    }
  }
  // NaN propagates through max in a chunked column.
  Tensor x = ska::test::uniform({20000, 3}, 22, -1.0, 1.0, DType::kF32);
  x.data<float>()[12345 * 3 + 1] = NAN;
  Tensor got = Tensor::empty({1, 3}, DType::kF32, gpu);
  cuda::reduce(ReduceOp::kMax, x.to(gpu), {0}, got);
  const std::vector<float> v = got.to_vector<float>();
  CHECK(std::isnan(v[1]));
  CHECK_FALSE(std::isnan(v[0]));
}

TEST_CASE("CUDA Graph: a replay reruns the captured kernels on the current inputs", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  Tensor x = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {4}).to(gpu);
  const Tensor w = Tensor::from_vector(std::vector<float>{2, 2, 2, 2}, {4}).to(gpu);
  Tensor y;
  {
    DeviceGraph graph(gpu, [&] { y = add(mul(x, w), 1.0); });  // a temporary freed inside
    synchronize(gpu);
    // Captured, not run: y is the graph's buffer until the first replay writes it.
    graph.replay();
    CHECK(y.to_vector<float>() == std::vector<float>{3, 5, 7, 9});
    x.copy_(Tensor::from_vector(std::vector<float>{10, 20, 30, 40}, {4}).to(gpu));
    graph.replay();
    graph.replay();
    CHECK(y.to_vector<float>() == std::vector<float>{21, 41, 61, 81});
    // The graph's blocks are its own while it lives: a new tensor of y's size gets other memory.
    const Tensor other = Tensor::zeros({4}, DType::kF32, gpu);
    CHECK(other.data_ptr() != y.data_ptr());
    graph.replay();
    CHECK(y.to_vector<float>() == std::vector<float>{21, 41, 61, 81});
  }
  // Destroyed: y keeps its values; its block returns to the stream's cache when freed.
  CHECK(y.to_vector<float>() == std::vector<float>{21, 41, 61, 81});
}

TEST_CASE("CUDA Graph: the graph's private segments return to the stream when it is destroyed",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  Allocator& alloc = allocator_for(gpu);
  alloc.empty_cache();  // no free block of the stream can serve 300 MiB now
  const int64_t base_reserved = alloc.stats().reserved;
  const int64_t n = (int64_t{300} << 20) / 4;
  const Tensor x = Tensor::ones({4}, DType::kF32, gpu);
  const void* held = nullptr;
  Tensor y;
  {
    DeviceGraph graph(gpu, [&] {
      const Tensor scratch = Tensor::empty({n}, DType::kF32, gpu);  // freed inside the capture
      held = scratch.data_ptr();
      y = add(x, 1.0);
    });
    graph.replay();
    // The scratch block is free in the graph's pool, never the stream's while the graph lives,
    // and empty_cache keeps it: the replays write there.
    const int64_t with_pool = alloc.stats().reserved;
    alloc.empty_cache();
    CHECK(alloc.stats().reserved - base_reserved >= (int64_t{300} << 20));
    CHECK(alloc.stats().reserved <= with_pool);
    graph.replay();
    const Tensor eager = Tensor::empty({n}, DType::kF32, gpu);
    CHECK(eager.data_ptr() != held);
  }
  // Destroyed: its segment serves the stream. Two blocks of 300 MiB are free now, the eager one
  // and the former pool's: two requests take both, without asking the system.
  const int64_t system_allocs = alloc.stats().num_system_allocs;
  const Tensor first = Tensor::empty({n}, DType::kF32, gpu);
  const Tensor second = Tensor::empty({n}, DType::kF32, gpu);
  CHECK((first.data_ptr() == held || second.data_ptr() == held));
  CHECK(alloc.stats().num_system_allocs == system_allocs);
  CHECK(y.to_vector<float>() == std::vector<float>{2, 2, 2, 2});
}

TEST_CASE("CUDA Graph: a capture that synchronises fails with a clear error", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  const Tensor x = Tensor::ones({4}, DType::kF32, gpu);
  CHECK_THROWS_AS(DeviceGraph(gpu, [&] { (void)x.to_vector<float>(); }), Error);
  // The stream works normally afterwards.
  CHECK(add(x, 1.0).to_vector<float>() == std::vector<float>{2, 2, 2, 2});
}

TEST_CASE("CUDA Graph: a stream forked into a capture records there and leaves it at its end",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const Device gpu = Device::cuda(0);
  const Tensor buf = Tensor::zeros({256}, DType::kU8, gpu);
  auto* bytes = static_cast<uint8_t*>(buf.data_ptr());
  const cudaStream_t origin = cuda::current_stream(0), side = cuda::create_stream(0);
  cudaEvent_t fork = nullptr, join = nullptr;
  SKA_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  SKA_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  synchronize(gpu);
  SKA_CUDA_CHECK(cudaStreamBeginCapture(origin, cudaStreamCaptureModeThreadLocal));
  SKA_CUDA_CHECK(cudaMemsetAsync(bytes + 128, 9, 128, origin));
  SKA_CUDA_CHECK(cudaEventRecord(fork, origin));
  SKA_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SKA_CUDA_CHECK(cudaStreamIsCapturing(side, &status));
  CHECK(status == cudaStreamCaptureStatusActive);
  SKA_CUDA_CHECK(cudaMemsetAsync(bytes, 7, 128, side));
  SKA_CUDA_CHECK(cudaEventRecord(join, side));
  SKA_CUDA_CHECK(cudaStreamWaitEvent(origin, join, 0));
  cudaGraph_t graph = nullptr;
  SKA_CUDA_CHECK(cudaStreamEndCapture(origin, &graph));
  // The capture is over for both streams; its work is recorded, not run.
  SKA_CUDA_CHECK(cudaStreamIsCapturing(side, &status));
  CHECK(status == cudaStreamCaptureStatusNone);
  SKA_CUDA_CHECK(cudaStreamIsCapturing(origin, &status));
  CHECK(status == cudaStreamCaptureStatusNone);
  CHECK(buf.to_vector<int64_t>() == std::vector<int64_t>(256, 0));
  cudaGraphExec_t exec = nullptr;
  SKA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  SKA_CUDA_CHECK(cudaGraphLaunch(exec, origin));
  std::vector<int64_t> expected(128, 7);
  expected.resize(256, 9);
  CHECK(buf.to_vector<int64_t>() == expected);
  // The side stream runs its own work again.
  SKA_CUDA_CHECK(cudaMemsetAsync(bytes, 1, 256, side));
  SKA_CUDA_CHECK(cudaStreamSynchronize(side));
  CHECK(buf.to_vector<int64_t>() == std::vector<int64_t>(256, 1));
  SKA_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SKA_CUDA_CHECK(cudaGraphDestroy(graph));
  SKA_CUDA_CHECK(cudaEventDestroy(fork));
  SKA_CUDA_CHECK(cudaEventDestroy(join));
}

#else

TEST_CASE("CUDA runtime tests need a CUDA build", "[cuda]") {
  ska::test::cuda_available_or_skip();
}

#endif
