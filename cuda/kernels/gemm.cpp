// CUDA kernel: batched GEMM through cuBLASLt, c[b] = alpha * a[b] @ b[b] + beta * c[b] (+ bias).
// cuBLASLt is column-major; a row-major C [M, N] is the column-major C^T [N, M], so we compute
// C^T = B^T A^T: b goes in cuBLASLt's A slot and a in its B slot, each transposed or not by its
// own layout. Descriptors and the heuristic's algorithm are cached per shape/layout key.
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "backend/gemm_checks.h"
#include "core/error.h"
#include "core/precision.h"
#include "cuda/runtime/check.h"
#include "cuda/runtime/cublaslt.h"
#include "cuda/runtime/runtime.h"

namespace ska::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// How many of the heuristic's algorithms GemmAlgorithm::kTimed times for a problem.
constexpr int kCandidates = 8;

// cuBLASLt's workspace for products on `stream`: taken on the stream's first product outside a
// graph capture and kept for the process, as PyTorch keeps one for each handle and stream. Taken
// and given back for every product, the 32 MiB block went back to the cache between products,
// where a tensor could be cut from it and the next product need a new segment. A stream that has
// none yet while it is captured takes one from the graph's pool for the call.
Tensor stream_workspace(int device, cudaStream_t stream) {
  static std::mutex mutex;
  static auto* kept = new std::map<std::pair<int, cudaStream_t>, Tensor>();  // never destroyed
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = kept->find({device, stream});
  if (found != kept->end()) return found->second;
  Tensor ws = workspace(device, kWorkspaceBytes);
  if (!capturing(Device::cuda(device))) kept->emplace(std::make_pair(device, stream), ws);
  return ws;
}

std::atomic<GemmAlgorithm> g_algorithm_mode{GemmAlgorithm::kHeuristic};
std::mutex g_choice_mutex;
std::vector<std::string>& choice_lines() {
  static std::vector<std::string> lines;
  return lines;
}

// A [R, C] matrix (a view's last two dims) as a cuBLASLt operand whose op() is its transpose.
struct Operand {
  cublasOperation_t op;
  uint64_t rows, cols;  // of the column-major layout before op()
  int64_t ld;
  int64_t batch_stride;  // 0: broadcast over the batch
};

Operand transposed_operand(const Tensor& x, const char* name) {
  SKA_CHECK(x.dim() == 2 || x.dim() == 3, ShapeError, "cuda gemm: ", name,
            " must be [B, R, C] or [R, C], got ", x.str());
  const int64_t r = x.size(-2), c = x.size(-1), sr = x.stride(-2), sc = x.stride(-1);
  const int64_t batch_stride = x.dim() == 3 && x.size(0) > 1 ? x.stride(0) : 0;
  // Row-major: memory read column-major is x^T [C, R] with leading dimension sr.
  if ((c == 1 || sc == 1) && (r <= 1 || sr >= c)) {
    return {CUBLAS_OP_N, static_cast<uint64_t>(c), static_cast<uint64_t>(r),
            r <= 1 ? std::max<int64_t>(c, 1) : sr, batch_stride};
  }
  // Column-major: memory read column-major is x [R, C] with leading dimension sc.
  if ((r == 1 || sr == 1) && (c <= 1 || sc >= r)) {
    return {CUBLAS_OP_T, static_cast<uint64_t>(r), static_cast<uint64_t>(c),
            c <= 1 ? std::max<int64_t>(r, 1) : sc, batch_stride};
  }
  SKA_FAIL(ValueError, "cuda gemm: ", name, " ", x.str(), " with strides ",
           shape_str(x.strides()), " is neither row- nor column-major in its last two dims");
}

cudaDataType_t cuda_data_type(DType dt) {
  switch (dt) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default:
      SKA_FAIL(DTypeError, "cuda kernel 'gemm' supports f32, bf16 and f16, got ", dtype_name(dt));
  }
}

// Largest power of two (up to 256) dividing the address: the heuristic must know it.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

// Descriptors and algorithms of one problem shape; `mu` guards the bias pointer attribute and
// the timing. `found` is false when cuBLASLt has no algorithm for a row-sum epilogue (the caller
// then sums with the reduce kernel). `candidates`: the heuristic's answers, best first (the
// algorithm of GemmAlgorithm::kHeuristic); `fastest`: the one kTimed timed fastest, -1 until
// timed.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  std::vector<cublasLtMatmulAlgo_t> candidates;
  int fastest = -1;
  bool found = true;
  std::mutex mu;
};

// What the GEMM's epilogue adds: nothing, the bias (EPILOGUE_BIAS), or the row sums of our a,
// which is cuBLASLt's B (EPILOGUE_BGRADB: the sums over k of B, one per column of its D).
enum class Epilogue : int64_t { kNone = 0, kBias = 1, kRowSumsOfA = 2 };

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                                   int32_t batch, int64_t batch_stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  SKA_CUBLAS_CHECK(cublaslt().matrix_layout_create(&layout, type, rows, cols, ld));
  if (batch > 1) {
    SKA_CUBLAS_CHECK(cublaslt().matrix_layout_set_attribute(
        layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    SKA_CUBLAS_CHECK(cublaslt().matrix_layout_set_attribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride, sizeof(batch_stride)));
  }
  return layout;
}

void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* value,
              size_t size) {
  SKA_CUBLAS_CHECK(cublaslt().matmul_desc_set_attribute(desc, attr, value, size));
}

struct Problem {
  int device;
  DType dtype;             // a's and b's
  DType c_dtype;           // c's and the bias's: dtype, or f32 for 16-bit a and b
  Operand a_slot, b_slot;  // b and a (see the file comment)
  uint64_t m, n, k;        // of the column-major problem: m = N, n = M
  int32_t batch;
  Epilogue epilogue;
  bool tf32;  // f32 data on TF32 tensor cores (core/precision.h)
  std::array<uint32_t, 4> align;  // A slot, B slot, C, D

  std::vector<int64_t> key() const {
    const int64_t dtypes = static_cast<int64_t>(dtype) * 256 + static_cast<int64_t>(c_dtype);
    // clang-format off
    return {device, dtypes, a_slot.op, static_cast<int64_t>(a_slot.rows),
            static_cast<int64_t>(a_slot.cols), a_slot.ld, a_slot.batch_stride, b_slot.op,
            static_cast<int64_t>(b_slot.rows), static_cast<int64_t>(b_slot.cols), b_slot.ld,
            b_slot.batch_stride, static_cast<int64_t>(m), static_cast<int64_t>(n),
            static_cast<int64_t>(k), batch, static_cast<int64_t>(epilogue), tf32, align[0],
            align[1], align[2], align[3]};
    // clang-format on
  }
};

std::unique_ptr<Plan> make_plan(const Problem& pr) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t type = cuda_data_type(pr.dtype);
  const cudaDataType_t c_type = cuda_data_type(pr.c_dtype);
  const cublasComputeType_t compute =
      pr.dtype == DType::kF32 && pr.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  SKA_CUBLAS_CHECK(cublaslt().matmul_desc_create(&plan->desc, compute, CUDA_R_32F));
  const int32_t ta = pr.a_slot.op, tb = pr.b_slot.op;
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  set_desc(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  if (pr.epilogue == Epilogue::kRowSumsOfA) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BGRADB;  // its bias-gradient output: c's type
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  }
  if (pr.epilogue == Epilogue::kBias) {
    const uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const int32_t bias_type = c_type;
    const int64_t bias_batch_stride = 0;  // one bias for every batch
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    set_desc(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_batch_stride,
             sizeof(bias_batch_stride));
  }
  plan->a = make_layout(type, pr.a_slot.rows, pr.a_slot.cols, pr.a_slot.ld, pr.batch,
                        pr.a_slot.batch_stride);
  plan->b = make_layout(type, pr.b_slot.rows, pr.b_slot.cols, pr.b_slot.ld, pr.batch,
                        pr.b_slot.batch_stride);
  plan->c = make_layout(c_type, pr.m, pr.n, static_cast<int64_t>(pr.m), pr.batch,
                        static_cast<int64_t>(pr.m * pr.n));

  cublasLtMatmulPreference_t pref = nullptr;
  SKA_CUBLAS_CHECK(cublaslt().preference_create(&pref));
  const uint64_t max_ws = kWorkspaceBytes;
  cublasStatus_t st = cublaslt().preference_set_attribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
  const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; ++i) {
    st = cublaslt().preference_set_attribute(pref, align_attrs[i],
                                             &pr.align[static_cast<size_t>(i)], sizeof(uint32_t));
  }
  // For a 16-bit output, split-K algorithms only where the parts are summed in f32 (the compute
  // type): summed in the output type, in the workspace or in place, each part is rounded to 16
  // bits first (an H200 chose that for a 96 x 64 product over 130 rows: errors of 10% where the
  // sum cancels). Algorithms without split-K always qualify; should the filter leave none, the
  // heuristic is asked again without it. f32 outputs take any scheme.
  const bool narrow_c = pr.c_dtype != DType::kF32;
  std::array<cublasLtMatmulHeuristicResult_t, kCandidates> results{};
  int found = 0;
  for (const uint32_t reductions : {narrow_c ? uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE}
                                             : uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK},
                                    uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK}}) {
    if (st != CUBLAS_STATUS_SUCCESS || found > 0) break;
    st = cublaslt().preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                             &reductions, sizeof(reductions));
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = cublaslt().algo_get_heuristic(cublaslt_handle(pr.device), plan->desc, plan->a, plan->b,
                                         plan->c, plan->c, pref, kCandidates, results.data(),
                                         &found);
    }
  }
  cublaslt().preference_destroy(pref);
  for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < found; ++i) {
    const cublasLtMatmulHeuristicResult_t& r = results[static_cast<size_t>(i)];
    if (r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= kWorkspaceBytes) {
      plan->candidates.push_back(r.algo);
    }
  }
  if (pr.epilogue == Epilogue::kRowSumsOfA &&
      (st != CUBLAS_STATUS_SUCCESS || plan->candidates.empty())) {
    plan->found = false;  // not supported for this problem: the caller sums the rows itself
    return plan;
  }
  SKA_CUBLAS_CHECK(st);
  SKA_CHECK(!plan->candidates.empty(), CudaError, "cuda gemm: cuBLASLt found no algorithm for ",
            dtype_name(pr.dtype), " into ", dtype_name(pr.c_dtype), " m=", pr.m, " n=", pr.n,
            " k=", pr.k, " batch=", pr.batch, " (column-major problem)");
  return plan;
}

// Never destroyed: plans may be used until exit.
Plan& plan_for(const Problem& pr) {
  static std::mutex mu;
  static auto* plans = new std::map<std::vector<int64_t>, std::unique_ptr<Plan>>();
  const std::vector<int64_t> key = pr.key();
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans->find(key);
  if (it == plans->end()) it = plans->emplace(key, make_plan(pr)).first;
  return *it->second;
}

int64_t batch_of(const Tensor& t) { return t.dim() == 3 ? t.size(0) : 1; }

// GemmAlgorithm::kTimed: runs each of the plan's candidates on `args`' operands into scratch
// outputs (3 timed runs after one to warm up; a candidate cuBLASLt refuses is left out) and keeps
// the fastest as plan.fastest. Called with plan.mu held, outside a capture.
void time_candidates(Plan& plan, const Problem& pr, const GemmArgs& args) {
  const Tensor &a = args.a, &b = args.b, &c = args.c;
  const int device = pr.device;
  Tensor out = Tensor::empty(c.shape(), c.dtype(), c.device());
  if (args.beta != 0.0f) out.copy_(c);  // read by the product: no uninitialised memory
  Tensor sums;                          // the row-sum epilogue's output
  if (pr.epilogue == Epilogue::kRowSumsOfA) {
    sums = Tensor::empty(args.a_row_sums.shape(), args.a_row_sums.dtype(), c.device());
    const void* ptr = sums.data_ptr();
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof(ptr));
  } else if (pr.epilogue == Epilogue::kBias) {
    const void* ptr = args.bias.data_ptr();
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr, sizeof(ptr));
  }
  const cudaStream_t stream = current_stream(device);
  const Tensor ws = stream_workspace(device, stream);
  const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
    return cublaslt().matmul(cublaslt_handle(device), plan.desc, &args.alpha, b.data_ptr(), plan.a,
                             a.data_ptr(), plan.b, &args.beta, out.data_ptr(), plan.c,
                             out.data_ptr(), plan.c, &algo, ws.data_ptr(), kWorkspaceBytes, stream);
  };
  float best_ms = 0.0f, first_ms = 0.0f;
  size_t best = 0;
  int timed = 0;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const cublasLtMatmulAlgo_t& algo = plan.candidates[i];
    if (run(algo) != CUBLAS_STATUS_SUCCESS) continue;
    const float ms = time_ms(
        device, [&] { SKA_CUBLAS_CHECK(run(algo)); }, 3);
    if (i == 0) first_ms = ms;
    if (timed++ == 0 || ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  plan.fastest = static_cast<int>(best);  // the heuristic's first if none ran
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(3);
  line << "gemm " << dtype_name(a.dtype()) << (c.dtype() != a.dtype() ? " into f32 " : " ")
       << shape_str(a.shape()) << " x " << shape_str(b.shape())
       << (pr.epilogue == Epilogue::kBias ? " bias" : "")
       << (pr.epilogue == Epilogue::kRowSumsOfA ? " row sums" : "") << ": algorithm " << best + 1
       << " of " << plan.candidates.size() << ", " << best_ms << " ms; the heuristic's " << first_ms
       << " ms";
  std::lock_guard<std::mutex> lock(g_choice_mutex);
  choice_lines().push_back(line.str());
}

// K == 0: c = beta * c (+ bias), which cuBLASLt does not cover.
void gemm_empty_k(const GemmArgs& args) {
  const Tensor& c = args.c;
  if (args.beta == 0.0f) {
    fill(c, 0.0);
  } else if (args.beta != 1.0f) {
    unary(UnaryOp::kAffine, c, c, args.beta, 0.0);
  }
  if (args.bias.defined()) {
    Shape strides(static_cast<size_t>(c.dim()), 0);
    strides.back() = args.bias.stride(0);
    const Tensor bias = Tensor::make_view(args.bias.storage(), c.shape(), strides,
                                          args.bias.offset(), args.bias.dtype());
    binary(BinaryOp::kAdd, c, bias, c);
  }
}

}  // namespace

void gemm(const GemmArgs& args) {
  const Tensor &a = args.a, &b = args.b, &c = args.c;
  const bool widening =
      c.dtype() == DType::kF32 && (a.dtype() == DType::kBF16 || a.dtype() == DType::kF16);
  SKA_CHECK(a.dtype() == b.dtype() && (a.dtype() == c.dtype() || widening), DTypeError,
            "cuda gemm: a and b must share c's dtype, or a 16-bit one for an f32 c; got a ",
            dtype_name(a.dtype()), ", b ", dtype_name(b.dtype()), ", c ", dtype_name(c.dtype()));
  SKA_CHECK(c.is_contiguous() && (c.dim() == 2 || c.dim() == 3), ShapeError,
            "cuda gemm: c must be a contiguous [B, M, N] or [M, N], got ", c.str());
  const int64_t m = c.size(-2), n = c.size(-1), k = a.size(-1), batch = batch_of(c);
  SKA_CHECK(a.size(-2) == m && b.size(-2) == k && b.size(-1) == n &&
                (batch_of(a) == batch || batch_of(a) == 1) &&
                (batch_of(b) == batch || batch_of(b) == 1),
            ShapeError, "cuda gemm: incompatible shapes a ", shape_str(a.shape()), ", b ",
            shape_str(b.shape()), ", c ", shape_str(c.shape()));
  SKA_CHECK(batch <= INT32_MAX, ShapeError, "cuda gemm: batch ", batch, " too large");
  if (args.bias.defined()) {
    SKA_CHECK(args.bias.dtype() == c.dtype() && args.bias.numel() == n &&
                  args.bias.is_contiguous(),
              ShapeError, "cuda gemm: bias must be a contiguous [", n, "] of c's dtype, got ",
              args.bias.str());
  }
  check_gemm_row_sums("cuda gemm", args);
  cuda_data_type(c.dtype());  // throws DTypeError for unsupported dtypes
  if (m == 0 || n == 0 || batch == 0) return;
  const int device = c.device().index;
  DeviceGuard guard(device);
  // a's row sums by the reduce kernel (the GEMM's epilogue computes them where it can).
  const auto sum_rows = [&] {
    const Tensor rows =
        Tensor::make_view(a.storage(), {m, k}, {a.stride(-2), a.stride(-1)}, a.offset(), a.dtype());
    reduce(ReduceOp::kSum, rows, std::vector<int64_t>{1},
           args.a_row_sums.view({args.a_row_sums.numel(), 1}));
  };
  if (k == 0) {
    gemm_empty_k(args);
    if (args.a_row_sums.defined()) fill(args.a_row_sums, 0.0);
    return;
  }

  Problem pr{};
  pr.device = device;
  pr.dtype = a.dtype();
  pr.c_dtype = c.dtype();
  pr.a_slot = transposed_operand(b, "b");
  pr.b_slot = transposed_operand(a, "a");
  pr.m = static_cast<uint64_t>(n);
  pr.n = static_cast<uint64_t>(m);
  pr.k = static_cast<uint64_t>(k);
  pr.batch = static_cast<int32_t>(batch);
  pr.epilogue = args.bias.defined() ? Epilogue::kBias : Epilogue::kNone;
  if (args.a_row_sums.defined() && alignment_of(args.a_row_sums.data_ptr()) >= 16) {
    pr.epilogue = Epilogue::kRowSumsOfA;
  }
  pr.tf32 = tf32_policy().matmul;
  pr.align = {alignment_of(b.data_ptr()), alignment_of(a.data_ptr()), alignment_of(c.data_ptr()),
              alignment_of(c.data_ptr())};
  Plan* chosen = &plan_for(pr);
  if (!chosen->found) {  // no epilogue for these row sums: the plain product, then the reduce
    pr.epilogue = Epilogue::kNone;
    chosen = &plan_for(pr);
  }
  Plan& plan = *chosen;
  if (args.a_row_sums.defined() && pr.epilogue != Epilogue::kRowSumsOfA) sum_rows();

  std::lock_guard<std::mutex> lock(plan.mu);
  const bool timed_choice = g_algorithm_mode.load() == GemmAlgorithm::kTimed;
  if (timed_choice && plan.fastest < 0 && plan.candidates.size() > 1 && cudnn_benchmark() &&
      !capturing(Device::cuda(device))) {
    time_candidates(plan, pr, args);
  }
  const cublasLtMatmulAlgo_t& algo =
      plan.candidates[timed_choice && plan.fastest >= 0 ? static_cast<size_t>(plan.fastest) : 0];
  const cudaStream_t stream = current_stream(device);
  const Tensor ws = stream_workspace(device, stream);
  if (pr.epilogue != Epilogue::kNone) {
    const void* bias_ptr =
        pr.epilogue == Epilogue::kBias ? args.bias.data_ptr() : args.a_row_sums.data_ptr();
    set_desc(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr));
  }
  SKA_CUBLAS_CHECK(cublaslt().matmul(cublaslt_handle(device), plan.desc, &args.alpha, b.data_ptr(),
                                     plan.a, a.data_ptr(), plan.b, &args.beta, c.data_ptr(), plan.c,
                                     c.data_ptr(), plan.c, &algo, ws.data_ptr(), kWorkspaceBytes,
                                     stream));
}

}  // namespace ska::cuda

namespace ska {

GemmAlgorithm set_cuda_gemm_algorithm(GemmAlgorithm mode) {
  return cuda::g_algorithm_mode.exchange(mode);
}

std::vector<std::string> cuda_gemm_choices() {
  std::lock_guard<std::mutex> lock(cuda::g_choice_mutex);
  return cuda::choice_lines();
}

}  // namespace ska
