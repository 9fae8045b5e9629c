// Kernel-level tests of the CUDA fused attention (scalar, WMMA and mma.sync paths) against its CPU
// twin, a double-precision reference and each other: broadcast keys, permuted views, masked bias,
// class attention, long rows, determinism.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "ops/shape_ops.h"
#include "support/test_util.h"

#ifdef SKA_WITH_CUDA

using namespace ska;
using ska::test::require_close;
using ska::test::tolerance_for;
using ska::test::uniform;

namespace {

const Device kGpu = Device::cuda(0);
constexpr double kInf = std::numeric_limits<double>::infinity();

Shape with_last(Shape lead, std::vector<int64_t> last) {
  lead.insert(lead.end(), last.begin(), last.end());
  return lead;
}

// The operands as the kernels get them (views of one device and dtype); bias may be undefined.
struct Operands {
  Tensor q, k, v, bias, grad_out, out;
};

// A case: base tensors (f64, host) and how to view them as the operands, on whatever device and
// in whatever dtype the base tensors were moved to.
struct Case {
  std::string name;
  Shape lead;
  int64_t nq, nk, d, dv;
  bool grad_bias;  // request dL/dz
  std::vector<Tensor> base;
  std::function<Operands(const std::vector<Tensor>&)> views;
  // grad_q, grad_k, grad_v as the kernels write them for qkv_attention: views of one
  // [B, N, 3, h, d] gradient (lead {B, h}, nq = nk, d = dv) instead of contiguous tensors.
  bool packed_grads = false;
  AttentionMask mask = AttentionMask::kNone;
  // grad_bias as a [h, B, nq, nk] tensor seen as [B, h, nq, nk] (lead {B, h}), as the op lays
  // out the gradient of CSKA's logits from their matrix product.
  bool permuted_grad_bias = false;
  // grad_bias in rows padded to 16 bytes (empty_aligned_rows), as the op writes the gradient of
  // a bias in such rows (CSKA-ViT's logits).
  bool padded_grad_bias = false;
};

// out as a contiguous [L..., nq, dv] tensor like q.
Tensor empty_out(const Case& c, const Tensor& q) {
  return Tensor::empty(with_last(c.lead, {c.nq, c.dv}), q.dtype(), q.device());
}

struct Results {
  Tensor out, lse, grad_q, grad_k, grad_v, grad_bias;
};

// softmax(scale * q k^T + bias) v and its gradients for dL/dout = grad_out, in double, from the
// formulas: P = exp(z - lse), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O), dZ = P * (dP - D),
// dQ = scale dZ K, dK = scale dZ^T Q. Operands on the host in f64; results contiguous f64.
Results reference(const Case& c, const Operands& x, double scale) {
  const std::vector<double> q = x.q.contiguous().to_vector<double>(),
                            k = x.k.contiguous().to_vector<double>(),
                            v = x.v.contiguous().to_vector<double>(),
                            go = x.grad_out.contiguous().to_vector<double>();
  const std::vector<double> bias =
      x.bias.defined() ? x.bias.contiguous().to_vector<double>() : std::vector<double>();
  const int64_t nq = c.nq, nk = c.nk, d = c.d, dv = c.dv, groups = shape_numel(c.lead);
  std::vector<double> out(groups * nq * dv, 0.0), lse(groups * nq), gq(groups * nq * d, 0.0),
      gk(groups * nk * d, 0.0), gv(groups * nk * dv, 0.0), gz(groups * nq * nk);
  std::vector<double> p(nk), dp(nk);
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t i = 0; i < nq; ++i) {
      const int64_t qi = (g * nq + i) * d, oi = (g * nq + i) * dv;
      double mx = -kInf;
      for (int64_t j = 0; j < nk; ++j) {
        double z = 0;
        for (int64_t e = 0; e < d; ++e) z += q[qi + e] * k[(g * nk + j) * d + e];
        p[j] = scale * z + (bias.empty() ? 0.0 : bias[(g * nq + i) * nk + j]);
        if (c.mask == AttentionMask::kDiagonal && i == j) p[j] = -kInf;
        mx = std::max(mx, p[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < nk; ++j) sum += std::exp(p[j] - mx);
      lse[g * nq + i] = mx + std::log(sum);
      for (int64_t j = 0; j < nk; ++j) p[j] = std::exp(p[j] - lse[g * nq + i]);
      for (int64_t j = 0; j < nk; ++j) {
        for (int64_t e = 0; e < dv; ++e) out[oi + e] += p[j] * v[(g * nk + j) * dv + e];
      }
      double delta = 0;
      for (int64_t e = 0; e < dv; ++e) delta += go[oi + e] * out[oi + e];
      for (int64_t j = 0; j < nk; ++j) {
        dp[j] = 0;
        for (int64_t e = 0; e < dv; ++e) {
          dp[j] += go[oi + e] * v[(g * nk + j) * dv + e];
          gv[(g * nk + j) * dv + e] += p[j] * go[oi + e];
        }
        const double dz =
            c.mask == AttentionMask::kDiagonal && i == j ? 0.0 : p[j] * (dp[j] - delta);
        gz[(g * nq + i) * nk + j] = dz;
        for (int64_t e = 0; e < d; ++e) {
          gq[qi + e] += scale * dz * k[(g * nk + j) * d + e];
          gk[(g * nk + j) * d + e] += scale * dz * q[qi + e];
        }
      }
    }
  }
  const auto host = [](const std::vector<double>& values, const Shape& shape) {
    return Tensor::from_vector(values, shape, DType::kF64);
  };
  return {host(out, with_last(c.lead, {nq, dv})), host(lse, with_last(c.lead, {nq})),
          host(gq, with_last(c.lead, {nq, d})),   host(gk, with_last(c.lead, {nk, d})),
          host(gv, with_last(c.lead, {nk, dv})),  host(gz, with_last(c.lead, {nq, nk}))};
}

// The forward and backward pass of one backend (ska::cuda or ska::cpu, by `on_gpu`) over x.
// factor, bias_factor > 0: passed as the device-side factors (one f32 element each) that
// multiply scale and the bias.
Results run(const Case& c, const Operands& x, double scale, bool on_gpu, double factor = 0.0,
            double bias_factor = 0.0) {
  const Device dev = x.q.device();
  const DType dt = x.q.dtype();
  const Tensor factor_t = factor > 0.0 ? Tensor::full({1}, factor, DType::kF32, dev) : Tensor();
  const Tensor bias_factor_t =
      bias_factor > 0.0 ? Tensor::full({1}, bias_factor, DType::kF32, dev) : Tensor();
  Results r;
  r.out = x.out;
  r.lse = Tensor::empty(with_last(c.lead, {c.nq}), DType::kF32, dev);
  if (c.packed_grads) {
    REQUIRE((c.lead.size() == 2 && c.nq == c.nk && c.d == c.dv));
    Tensor packed = Tensor::empty({c.lead[0], c.nq, 3, c.lead[1], c.d}, dt, dev);
    packed.fill_(std::numeric_limits<double>::quiet_NaN());  // gaps between the parts too
    const auto part = [&](int64_t i) { return packed.select(2, i).permute({0, 2, 1, 3}); };
    r.grad_q = part(0);
    r.grad_k = part(1);
    r.grad_v = part(2);
  } else {
    r.grad_q = Tensor::empty(with_last(c.lead, {c.nq, c.d}), dt, dev);
    r.grad_k = Tensor::empty(with_last(c.lead, {c.nk, c.d}), dt, dev);
    r.grad_v = Tensor::empty(with_last(c.lead, {c.nk, c.dv}), dt, dev);
  }
  if (c.grad_bias && c.permuted_grad_bias) {
    REQUIRE(c.lead.size() == 2);
    r.grad_bias = Tensor::empty({c.lead[1], c.lead[0], c.nq, c.nk}, dt, dev).transpose(0, 1);
  } else if (c.grad_bias && c.padded_grad_bias) {
    r.grad_bias = empty_aligned_rows(with_last(c.lead, {c.nq, c.nk}), dt, dev);
    REQUIRE(r.grad_bias.stride(-2) % 8 == 0);
  } else if (c.grad_bias) {
    r.grad_bias = Tensor::empty(with_last(c.lead, {c.nq, c.nk}), dt, dev);
  }
  // NaN first: an element the kernels leave unwritten fails the comparisons.
  for (Tensor* t : {&r.out, &r.lse, &r.grad_q, &r.grad_k, &r.grad_v, &r.grad_bias}) {
    if (t->defined()) t->fill_(std::numeric_limits<double>::quiet_NaN());
  }
  const auto forward = on_gpu ? &cuda::attention_forward : &cpu::attention_forward;
  const auto backward = on_gpu ? &cuda::attention_backward : &cpu::attention_backward;
  forward(x.q, x.k, x.v, x.bias, c.mask, scale, factor_t, bias_factor_t, r.out, r.lse);
  backward(x.q, x.k, x.v, x.bias, c.mask, r.out, r.lse, x.grad_out, scale, factor_t, bias_factor_t,
           r.grad_q, r.grad_k, r.grad_v, r.grad_bias);
  return r;
}

// The operands of case c in dtype: on the GPU, on the host (for the CPU twin), and the host ones
// widened to f64 (for the reference: the same rounded values).
struct Prepared {
  Operands gpu, cpu, ref;
};
Prepared prepare(const Case& c, DType dtype) {
  std::vector<Tensor> gpu, cpu, ref;
  for (const Tensor& b : c.base) {
    cpu.push_back(b.to(dtype));
    gpu.push_back(cpu.back().to(kGpu));
    ref.push_back(cpu.back().to(DType::kF64));
  }
  return {c.views(gpu), c.views(cpu), c.views(ref)};
}

// Compares every result of `actual` with `expected` within tol (lse, f32 in both, within the f32
// tolerance). by_nmse: out and the gradients by NMSE <= tol.rtol^2 instead (an RMS error within
// the relative tolerance), for long rows, where a few elements near zero exceed atol + rtol |e|.
void compare(const Results& actual, const Results& expected, ska::test::Tolerance tol,
             const std::string& what, bool by_nmse = false) {
  require_close(actual.lse, expected.lse, tolerance_for(DType::kF32), what + ": lse");
  const auto close = [&](const Tensor& a, const Tensor& e, const std::string& name) {
    if (!by_nmse) return require_close(a, e, tol, what + ": " + name);
    INFO(what << ": " << name << " by NMSE");
    CHECK(ska::test::nmse(a, e) <= tol.rtol * tol.rtol);
  };
  close(actual.out, expected.out, "out");
  close(actual.grad_q, expected.grad_q, "grad_q");
  close(actual.grad_k, expected.grad_k, "grad_k");
  close(actual.grad_v, expected.grad_v, "grad_v");
  if (actual.grad_bias.defined()) close(actual.grad_bias, expected.grad_bias, "grad_bias");
}

// Every result as host values (out, lse, grad_q, grad_k, grad_v, grad_bias; none for an undefined
// grad_bias), copied before the next run on the same operands rewrites out.
std::vector<std::vector<double>> values(const Results& r) {
  const auto host = [](const Tensor& t) {
    return t.defined() ? t.to_vector<double>() : std::vector<double>();
  };
  return {host(r.out),    host(r.lse),    host(r.grad_q),
          host(r.grad_k), host(r.grad_v), host(r.grad_bias)};
}

// Runs c's operands x on the GPU (scale 0.125, with the backward pass) with the defaults, then
// with `set(switched)` in force (a kernel-choice setter: it returns the previous setting, which
// must be the default, !switched, and is restored after), and requires every result to be the
// same bits: for a switch that changes how a kernel runs, not what it computes.
void check_same_bits_when(const Case& c, const Operands& x, bool (*set)(bool), bool switched) {
  const std::vector<std::vector<double>> defaults = values(run(c, x, 0.125, true));
  const bool previous = set(switched);
  const std::vector<std::vector<double>> other = values(run(c, x, 0.125, true));
  set(previous);
  CHECK(previous == !switched);  // the default
  for (size_t i = 0; i < defaults.size(); ++i) {
    INFO("result " << i << " (out, lse, grad_q, grad_k, grad_v, grad_bias)");
    CHECK(other[i] == defaults[i]);
  }
}

// The results copied to the host (the next run on the same operands rewrites out).
Results on_host(const Results& r) {
  Results h;
  const Tensor* from[] = {&r.out, &r.lse, &r.grad_q, &r.grad_k, &r.grad_v, &r.grad_bias};
  Tensor* to[] = {&h.out, &h.lse, &h.grad_q, &h.grad_k, &h.grad_v, &h.grad_bias};
  for (int i = 0; i < 6; ++i) {
    if (from[i]->defined()) *to[i] = from[i]->to(Device::cpu()).clone();
  }
  return h;
}

// The scalar CUDA kernels while alive (the tensor-core path switched off).
struct ScalarAttention {
  bool previous = set_cuda_attention_tensor_cores(false);
  ~ScalarAttention() { set_cuda_attention_tensor_cores(previous); }
};

// The WMMA tensor-core kernels while alive (instead of the mma.sync ones, the default).
struct WmmaAttention {
  bool previous = set_cuda_attention_mma(false);
  ~WmmaAttention() { set_cuda_attention_mma(previous); }
};

// The mma.sync kernels' one-block backward (problems of up to 80 queries and keys, head dims up
// to 64; others keep the two kernels) while alive.
struct OneBlockBackward {
  bool previous = set_cuda_attention_one_block_backward(true);
  ~OneBlockBackward() { set_cuda_attention_one_block_backward(previous); }
};

// The mma.sync kernels' one-pass backward (the one-block backward's problems, each weight
// computed once and shared for dK and dV) while alive.
struct OnePassBackward {
  bool previous = set_cuda_attention_one_pass_backward(true);
  ~OnePassBackward() { set_cuda_attention_one_pass_backward(previous); }
};

// The mma.sync kernels' one-block forward (problems whose longer side has 65 to 80 rows, head dims
// up to 64; others keep the tiled launch) while alive.
struct OneBlockForward {
  bool previous = set_cuda_attention_one_block_forward(true);
  ~OneBlockForward() { set_cuda_attention_one_block_forward(previous); }
};

// The CUDA paths against the CPU twin and the double reference, by default in f32 and bf16, and
// against each other. bf16 and f16 with head dims that are multiples of 16 take the tensor cores
// by default, mma.sync (also with OneBlockBackward, and with OneBlockForward and OneBlockBackward
// together), and with WmmaAttention the WMMA kernels
// (f32 and other dims: the scalar
// kernels every time). The 16-bit results are computed in
// f32 from the same rounded inputs and rounded once (the tensor-core path also rounds P and dS
// to the dtype before its second products), so tolerance_for(dtype) covers them.
void check_case(const Case& c, double scale,
                const std::vector<DType>& dtypes = {DType::kF32, DType::kBF16},
                bool by_nmse = false) {
  for (const DType dtype : dtypes) {
    INFO(c.name << ", " << dtype_name(dtype));
    const Prepared x = prepare(c, dtype);
    const Results fast = on_host(run(c, x.gpu, scale, true));
    Results scalar;
    {
      const ScalarAttention off;
      scalar = on_host(run(c, x.gpu, scale, true));
    }
    Results wmma;
    {
      const WmmaAttention on;
      wmma = on_host(run(c, x.gpu, scale, true));
    }
    Results one_block;
    {
      const OneBlockBackward on;
      one_block = on_host(run(c, x.gpu, scale, true));
    }
    Results one_block_both;
    {
      const OneBlockForward forward;
      const OneBlockBackward backward;
      one_block_both = on_host(run(c, x.gpu, scale, true));
    }
    Results one_pass;
    {
      const OnePassBackward on;
      one_pass = on_host(run(c, x.gpu, scale, true));
    }
    const Results cpu = run(c, x.cpu, scale, false);
    const Results ref = reference(c, x.ref, scale);
    const ska::test::Tolerance tol = tolerance_for(dtype);
    compare(one_pass, cpu, tol, "one-pass backward cuda vs cpu", by_nmse);
    compare(one_pass, ref, tol, "one-pass backward cuda vs reference", by_nmse);
    compare(one_pass, one_block, tol, "one-pass backward vs one-block backward", by_nmse);
    compare(one_block, cpu, tol, "one-block backward cuda vs cpu", by_nmse);
    compare(one_block_both, cpu, tol, "one-block forward and backward cuda vs cpu", by_nmse);
    compare(one_block_both, ref, tol, "one-block forward and backward cuda vs reference", by_nmse);
    compare(one_block, ref, tol, "one-block backward cuda vs reference", by_nmse);
    compare(wmma, cpu, tol, "wmma cuda vs cpu", by_nmse);
    compare(wmma, ref, tol, "wmma cuda vs reference", by_nmse);
    compare(fast, cpu, tol, "cuda vs cpu", by_nmse);
    compare(fast, ref, tol, "cuda vs reference", by_nmse);
    compare(scalar, cpu, tol, "scalar cuda vs cpu", by_nmse);
    compare(scalar, ref, tol, "scalar cuda vs reference", by_nmse);
    compare(fast, scalar, tol, "cuda vs scalar cuda", by_nmse);
  }
}

// Plain contiguous operands [lead..., n, d] without a bias; the base is q, k, v, grad_out.
Case plain_case(const std::string& name, const Shape& lead, int64_t nq, int64_t nk, int64_t d,
                int64_t dv, uint64_t seed) {
  Case c{name, lead, nq, nk, d, dv, false, {}, nullptr};
  c.base = {
      uniform(with_last(lead, {nq, d}), seed, -2, 2), uniform(with_last(lead, {nk, d}), seed + 1),
      uniform(with_last(lead, {nk, dv}), seed + 2), uniform(with_last(lead, {nq, dv}), seed + 3)};
  c.views = [c](const std::vector<Tensor>& b) {
    return Operands{b[0], b[1], b[2], Tensor(), b[3], empty_out(c, b[0])};
  };
  return c;
}

// plain_case with an additive bias [lead..., nq, nk] of uniform values in [lo, hi] (seed + 4)
// and its gradient requested.
Case biased_case(const std::string& name, const Shape& lead, int64_t nq, int64_t nk, int64_t d,
                 int64_t dv, uint64_t seed, double lo = -2, double hi = 2) {
  Case c = plain_case(name, lead, nq, nk, d, dv, seed);
  c.grad_bias = true;
  c.base.push_back(uniform(with_last(lead, {nq, nk}), seed + 4, lo, hi));
  c.views = [c](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
  };
  return c;
}

// biased_case with the bias and its gradient in rows padded to 16 bytes (nk rounded up to 8
// elements), as CSKA-ViT lays out its logits: the bias a view of the first nk columns of
// [lead..., nq, padded] values, so that its storage holds the padding of every row.
Case padded_case(const std::string& name, const Shape& lead, int64_t nq, int64_t nk, int64_t d,
                 int64_t dv, uint64_t seed) {
  Case c = biased_case(name, lead, nq, nk, d, dv, seed);
  const int64_t padded = (nk + 7) / 8 * 8;
  c.base.back() = uniform(with_last(lead, {nq, padded}), seed + 4, -2, 2);
  c.padded_grad_bias = true;
  c.views = [c](const std::vector<Tensor>& t) {
    const Tensor bias = t[4].narrow(-1, 0, c.nk);
    return Operands{t[0], t[1], t[2], bias, t[3], empty_out(c, t[0])};
  };
  return c;
}

// A problem's sizes: queries, keys, head dims of q k^T and of v.
struct Problem {
  int64_t nq, nk, d, dv;
};

// Static keys and values [h, nk, d] broadcast over the batch with stride 0; dL/dz requested
// without a bias.
Case static_keys_case(int64_t d) {
  const int64_t b = 3, h = 2, nq = 65, nk = 16;
  Case c{"static keys", {b, h}, nq, nk, d, d, true, {}, nullptr};
  c.base = {uniform({b, h, nq, d}, 201, -2, 2), uniform({h, nk, d}, 202), uniform({h, nk, d}, 203),
            uniform({b, h, nq, d}, 204)};
  c.views = [=](const std::vector<Tensor>& t) {
    const Tensor k = t[1].unsqueeze(0).expand({b, h, nk, d});
    const Tensor v = t[2].unsqueeze(0).expand({b, h, nk, d});
    REQUIRE(k.stride(0) == 0);
    return Operands{t[0], k, v, Tensor(), t[3], empty_out(c, t[0])};
  };
  return c;
}

// q, k, v as slices of one [B, N, 3, h, d] projection, out and grad_out as permuted [B, N, h, d];
// the gradients of q, k and v written into one [B, N, 3, h, d] tensor likewise (qkv_attention).
Case split_heads_case(int64_t d) {
  const int64_t b = 2, n = 50, h = 4;
  Case c{"split heads", {b, h}, n, n, d, d, false, {}, nullptr};
  c.packed_grads = true;
  c.base = {uniform({b, n, 3, h, d}, 301, -2, 2), uniform({b, n, h, d}, 302)};
  c.views = [=](const std::vector<Tensor>& t) {
    const auto heads = [&](int64_t which) { return t[0].select(2, which).permute({0, 2, 1, 3}); };
    const Tensor out =
        Tensor::empty({b, n, h, d}, t[0].dtype(), t[0].device()).permute({0, 2, 1, 3});
    return Operands{heads(0), heads(1), heads(2), Tensor(), t[1].permute({0, 2, 1, 3}), out};
  };
  return c;
}

// Swin windows of 7 x 7 tokens: relative position bias [windows, h, 49, 49] broadcast over the
// batch, plus the shift mask of the odd windows: pairs across the 3 | 4 column split of a window
// are excluded with -inf (never a whole row: a token always sees itself). dL/dz requested.
Case swin_case(int64_t d) {
  const int64_t b = 2, windows = 4, h = 3, n = 49;
  std::vector<double> bias = uniform({windows, h, n, n}, 401, -1, 1).to_vector<double>();
  for (int64_t w = 1; w < windows; w += 2) {
    for (int64_t i = 0; i < h * n * n; ++i) {
      const int64_t qi = (i / n) % n, kj = i % n;
      if ((qi % 7 < 3) != (kj % 7 < 3)) bias[w * h * n * n + i] = -kInf;
    }
  }
  Case c{"swin bias", {b, windows, h}, n, n, d, d, true, {}, nullptr};
  c.base = {uniform({b, windows, h, n, d}, 402, -2, 2), uniform({b, windows, h, n, d}, 403),
            uniform({b, windows, h, n, d}, 404), uniform({b, windows, h, n, d}, 405),
            Tensor::from_vector(bias, {windows, h, n, n}, DType::kF64)};
  c.views = [=](const std::vector<Tensor>& t) {
    const Tensor bias_view = t[4].unsqueeze(0).expand({b, windows, h, n, n});
    return Operands{t[0], t[1], t[2], bias_view, t[3], empty_out(c, t[0])};
  };
  return c;
}

}  // namespace

TEST_CASE("cuda attention: contiguous [B, h, N, d], N = 65, d = 32", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(plain_case("plain", {2, 3}, 65, 65, 32, 32, 101), 1.0 / std::sqrt(32.0),
             {DType::kF32, DType::kBF16, DType::kF16});
}

TEST_CASE("cuda attention: static keys broadcast over the batch with stride 0", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(static_keys_case(32), 1.0 / std::sqrt(32.0));
}

TEST_CASE("cuda attention: q, k, v, out, grad_out and the gradients as views of [B, N, h, d]",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(split_heads_case(32), 1.0 / std::sqrt(32.0));
}

TEST_CASE("cuda attention: Swin bias broadcast over the batch with -inf shift masks", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(swin_case(32), 1.0 / std::sqrt(32.0));
}

TEST_CASE("cuda attention: class attention, one query over 197 keys, d = 48", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(plain_case("class attention", {4, 8}, 1, 197, 48, 48, 501), 1.0 / std::sqrt(48.0));
}

TEST_CASE("cuda attention: long rows, N = 785, d = 64 (tile boundaries)", "[cuda][emu-slow]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(plain_case("long rows", {1, 2}, 785, 785, 64, 64, 601), 1.0 / std::sqrt(64.0));
}

TEST_CASE("cuda attention: d = 16 with dv = 40, and d = dv = 128", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(plain_case("d 16 dv 40", {3, 2}, 20, 37, 16, 40, 701), 0.25);
  // The widest head dims: shared memory above the 48 KiB default.
  check_case(plain_case("d 128", {2, 2}, 40, 72, 128, 128, 711), 1.0 / std::sqrt(128.0));
}

TEST_CASE("cuda attention: tensor cores, head dims 32, 48, 64 and 128, N = 65", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  for (const int64_t d : {32, 48, 64, 128}) {
    check_case(plain_case("tensor cores d " + std::to_string(d), {2, 2}, 65, 65, d, d, 1001 + d),
               1.0 / std::sqrt(static_cast<double>(d)), {DType::kBF16, DType::kF16});
  }
  // Unequal head dims, and queries and keys of different tile tails.
  check_case(plain_case("tensor cores d 16 dv 48", {3, 1}, 33, 47, 16, 48, 1201), 0.25,
             {DType::kBF16, DType::kF16});
}

TEST_CASE("cuda attention: tensor cores, views, masks and broadcasts in f16", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  check_case(static_keys_case(48), 1.0 / std::sqrt(48.0), {DType::kF16});
  check_case(split_heads_case(64), 0.125, {DType::kF16});
  check_case(swin_case(32), 1.0 / std::sqrt(32.0), {DType::kF16});
  check_case(plain_case("class attention", {4, 8}, 1, 197, 48, 48, 501), 1.0 / std::sqrt(48.0),
             {DType::kF16});
}

TEST_CASE("cuda attention: tensor cores, long rows by NMSE, N = 197 with bias", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Case c = plain_case("long rows", {2, 3}, 197, 197, 64, 64, 1301);
  c.grad_bias = true;
  c.base.push_back(uniform({2, 3, 197, 197}, 1305, -2, 2));
  c.views = [=](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
  };
  check_case(c, 0.125, {DType::kBF16, DType::kF16}, true);
}

TEST_CASE("cuda attention: two runs give the same bits, forward and backward", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // N = 197 takes the two-kernel backward, N = 65 the one-block one where it is switched on.
  for (const int64_t n : {197, 65}) {
    Case c = plain_case("determinism", {2, 2}, n, n, 64, 64, 801);
    c.grad_bias = true;
    c.base.push_back(uniform({2, 2, n, n}, 805));
    c.views = [=](const std::vector<Tensor>& t) {
      return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
    };
    // values() copies to the host before the next run (both runs write the same out tensor).
    // WMMA, mma.sync, mma.sync with the one-block backward, and with the one-block forward too,
    // and with the one-pass backward
    for (const int mode : {0, 1, 2, 3, 4}) {
      const bool use_mma = mode > 0;
      const bool previous = set_cuda_attention_mma(use_mma);
      const bool previous_one_block = set_cuda_attention_one_block_backward(mode >= 2);
      const bool previous_forward = set_cuda_attention_one_block_forward(mode >= 3);
      const bool previous_one_pass = set_cuda_attention_one_pass_backward(mode == 4);
      for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {  // 16-bit: tensor cores
        INFO("N = " << n << ", " << dtype_name(dtype) << (use_mma ? ", mma.sync" : "")
                    << (mode == 4   ? ", one-pass backward"
                        : mode >= 2 ? ", one-block backward"
                                    : "")
                    << (mode >= 3 ? ", one-block forward" : ""));
        const Prepared x = prepare(c, dtype);
        const std::vector<std::vector<double>> first = values(run(c, x.gpu, 0.125, true));
        const std::vector<std::vector<double>> second = values(run(c, x.gpu, 0.125, true));
        for (size_t i = 0; i < first.size(); ++i) {
          INFO("result " << i << " (out, lse, grad_q, grad_k, grad_v, grad_bias)");
          CHECK(first[i] == second[i]);
        }
      }
      set_cuda_attention_mma(previous);
      set_cuda_attention_one_block_backward(previous_one_block);
      set_cuda_attention_one_block_forward(previous_forward);
      set_cuda_attention_one_pass_backward(previous_one_pass);
    }
  }
}

TEST_CASE("cuda attention: the one-block backward gives the two kernels' bits", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // Both sum the same products in the same order (query or key pieces of 16 in turn, the tiles
  // zero past the end), so for up to 80 tokens their gradients agree to the bit: ViT-S on CIFAR
  // (65 tokens, d = 64, a class token), Swin's windows with their bias (49, d = 32), and CSKA's
  // logits (d = 0, all from the bias).
  for (const Problem s : {Problem{65, 65, 64, 64}, Problem{49, 49, 32, 32},
                          Problem{65, 65, 0, 64}, Problem{80, 17, 48, 64}}) {
    const Case c = biased_case("one block", {3, 2}, s.nq, s.nk, s.d, s.dv, 1701);
    for (const DType dtype : {DType::kBF16, DType::kF16}) {
      INFO(s.nq << " x " << s.nk << ", d " << s.d << ", dv " << s.dv << ", " << dtype_name(dtype));
      const Prepared x = prepare(c, dtype);
      const std::vector<std::vector<double>> split = values(run(c, x.gpu, 0.125, true));
      std::vector<std::vector<double>> one_block;
      {
        const OneBlockBackward on;
        one_block = values(run(c, x.gpu, 0.125, true));
      }
      for (size_t i = 0; i < split.size(); ++i) {
        INFO("result " << i << " (out, lse, grad_q, grad_k, grad_v, grad_bias)");
        CHECK(one_block[i] == split[i]);
      }
    }
  }
}

TEST_CASE("cuda attention: the register-capped one-block backward gives the uncapped kernel's bits",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // train.attention_registers: capped runs the one-block backward at head dim 64 held to fewer
  // registers: the same instructions on the same values, so every gradient must be the same
  // bits. ViT-S's 65 tokens with a bias, CSKA's logits as the bias (d = 0, dv = 64), a head dim
  // below 64 that the 64 kernel takes (48) with fewer keys than queries; and head dim 32, where
  // the setting changes nothing.
  const OneBlockBackward one_block;
  for (const Problem s : {Problem{65, 65, 64, 64}, Problem{65, 65, 0, 64}, Problem{80, 17, 48, 64},
                          Problem{49, 49, 32, 32}}) {
    const Case c = biased_case("register cap", {3, 2}, s.nq, s.nk, s.d, s.dv, 1777);
    for (const DType dtype : {DType::kBF16, DType::kF16}) {
      INFO(s.nq << " x " << s.nk << ", d " << s.d << ", dv " << s.dv << ", " << dtype_name(dtype));
      check_same_bits_when(c, prepare(c, dtype).gpu, set_cuda_attention_register_cap, true);
    }
  }
}

TEST_CASE("cuda attention: the persistent one-block kernels give the one-block kernels' bits",
          "[cuda][emu-slow]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // train.attention_schedule: persistent runs the one-block forward and backward with blocks
  // that walk the leading indices, staging the next one's tiles while computing the current one:
  // the same instructions on the same tiles, so the output, the log-sum-exps and every gradient
  // must be the same bits. 768 heads of ViT-S (65 tokens, d = 64, with a bias) are more than an
  // H100 or H200 holds at once (two backward blocks an SM, three or four forward ones), so
  // blocks take several in turn and some one fewer; CSKA's logits as the bias (d = 0) likewise;
  // 6 heads, fewer than the grid could hold; a head dim (48) that the 64 kernels take with fewer
  // keys than queries, and 17 queries over 80 keys (a two-warp forward block); Swin's windows
  // (49 tokens, d = 32; the backward alone, as the forward's one-block form starts at 65) with a
  // broadcast bias and -inf masks; static keys broadcast with stride 0; q, k, v and their
  // gradients as strided views of one projection. And the same with the tiles loaded by plain
  // loads and stores (train.attention_loads: sync), the staging then synchronous.
  const OneBlockBackward one_block;
  const OneBlockForward one_block_forward;
  std::vector<Case> cases;
  for (const Problem s : {Problem{65, 65, 64, 64}, Problem{65, 65, 0, 64}}) {
    cases.push_back(biased_case("persistent", {96, 8}, s.nq, s.nk, s.d, s.dv, 1811));
  }
  cases.push_back(biased_case("persistent, few heads", {3, 2}, 65, 65, 64, 64, 1812));
  cases.push_back(biased_case("persistent, d 48", {40, 8}, 80, 17, 48, 64, 1813));
  cases.push_back(biased_case("persistent, 17 queries", {64, 6}, 17, 80, 32, 32, 1814));
  cases.push_back(swin_case(32));
  cases.push_back(static_keys_case(64));
  cases.push_back(split_heads_case(64));
  for (const bool async : {true, false}) {
    const bool previous_loads = set_cuda_attention_async_loads(async);
    for (const Case& c : cases) {
      for (const DType dtype : {DType::kBF16, DType::kF16}) {
        INFO(c.name << ", " << c.nq << " x " << c.nk << ", d " << c.d << ", dv " << c.dv << ", "
                    << dtype_name(dtype) << (async ? ", async loads" : ", sync loads"));
        check_same_bits_when(c, prepare(c, dtype).gpu, set_cuda_attention_persistent, true);
      }
    }
    set_cuda_attention_async_loads(previous_loads);
  }
}

TEST_CASE("cuda attention: synchronous tile loads give the asynchronous copies' bits", "[cuda][emu-slow]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // load_tile fills the shared tiles with cp.async copies by default, or with a load and a store
  // per 16 bytes (set_cuda_attention_async_loads(false)): the same tiles, so every result must
  // be the same bits, for every tensor-core family: WMMA, mma.sync, and mma.sync with the
  // one-block forward and backward. Problems: ViT-S's 65 tokens of 64 with a bias, 197 tokens of
  // 32 (tiles past the first), class attention (one query, d = 48) and logits given as the bias
  // (d = 0); the tails of each are zero-filled rows. The same with the bias and its gradient in
  // padded rows (CSKA-ViT's logits) and with 80 keys, where the mma.sync kernels read and write
  // them by key pairs by default and one key at a time with the synchronous loads.
  struct Loads {
    Problem s;
    bool padded;  // the bias and grad_bias in padded rows
  };
  for (const Loads l :
       {Loads{{65, 65, 64, 64}, false}, Loads{{197, 197, 32, 32}, false},
        Loads{{1, 197, 48, 48}, false}, Loads{{65, 65, 0, 64}, false}, Loads{{65, 65, 0, 64}, true},
        Loads{{197, 197, 32, 32}, true}, Loads{{80, 80, 64, 64}, false}}) {
    const Problem s = l.s;
    const Case c = l.padded
                       ? padded_case("tile loads, padded rows", {2, 3}, s.nq, s.nk, s.d, s.dv, 1901)
                       : biased_case("tile loads", {2, 3}, s.nq, s.nk, s.d, s.dv, 1901);
    // WMMA, mma.sync, mma.sync one-block, mma.sync one-block forward and one-pass backward
    for (const int mode : {0, 1, 2, 3}) {
      const bool previous_mma = set_cuda_attention_mma(mode > 0);
      const bool previous_backward = set_cuda_attention_one_block_backward(mode >= 2);
      const bool previous_forward = set_cuda_attention_one_block_forward(mode >= 2);
      const bool previous_one_pass = set_cuda_attention_one_pass_backward(mode == 3);
      for (const DType dtype : {DType::kBF16, DType::kF16}) {
        INFO(s.nq << " x " << s.nk << ", d " << s.d << (l.padded ? ", padded rows, " : ", ")
                  << dtype_name(dtype) << ", "
                  << (mode == 0   ? "WMMA"
                      : mode == 1 ? "mma.sync"
                      : mode == 2 ? "mma.sync one-block"
                                  : "mma.sync one-pass backward"));
        check_same_bits_when(c, prepare(c, dtype).gpu, set_cuda_attention_async_loads, false);
      }
      set_cuda_attention_mma(previous_mma);
      set_cuda_attention_one_block_backward(previous_backward);
      set_cuda_attention_one_block_forward(previous_forward);
      set_cuda_attention_one_pass_backward(previous_one_pass);
    }
  }
}

TEST_CASE("cuda attention: D = rowsum(dO * O) by 16-byte vectors agrees with the per-row kernel",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // The backward pass's D: by 16-byte vectors (several rows a warp) where the rows are dense and
  // aligned, else one warp a row (the elementwise fast paths off). The two sum in different
  // orders: the outputs and lse are the same bits, the gradients equal to the rounding of D (f32:
  // 1e-5 of the gradient's largest element; 16 bits: about an ulp). Head dims 64 and 128 (8 and
  // 16 lanes a row in 16 bits, 16 and 32 in f32), 16 (2 and 4), 8 (1 and 2; the scalar kernels),
  // views of [B, N, h, d] (strided rows), a bias whose gradient is dS itself; and head dim 48
  // (6 and 12 lanes: no power of two), which both runs take a row a warp.
  struct FastPaths {  // restored however the test ends
    ~FastPaths() { set_cuda_elementwise_fast_paths(true); }
  } restore;
  Case biased = biased_case("D, bias", {2, 3}, 65, 65, 64, 64, 2131);
  for (const Case& c : {plain_case("D, d 64", {2, 3}, 65, 65, 64, 64, 2101),
                        plain_case("D, d 128", {2, 2}, 40, 72, 128, 128, 2111),
                        plain_case("D, d 16", {3, 2}, 33, 47, 16, 16, 2121),
                        plain_case("D, d 8", {2, 2}, 17, 17, 8, 8, 2141), split_heads_case(64),
                        biased, plain_case("D, d 48", {2, 2}, 65, 65, 48, 48, 2151)}) {
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      INFO(c.name << ", " << dtype_name(dtype));
      const Prepared x = prepare(c, dtype);
      CHECK(set_cuda_elementwise_fast_paths(true));  // the default
      const std::vector<std::vector<double>> vectors = values(run(c, x.gpu, 0.125, true));
      set_cuda_elementwise_fast_paths(false);
      const std::vector<std::vector<double>> rows = values(run(c, x.gpu, 0.125, true));
      set_cuda_elementwise_fast_paths(true);
      REQUIRE(vectors.size() == rows.size());
      CHECK(vectors[0] == rows[0]);  // out
      CHECK(vectors[1] == rows[1]);  // lse
      const double rel = dtype == DType::kF32 ? 1e-5 : 1e-2;
      for (size_t i = 2; i < vectors.size(); ++i) {
        INFO("result " << i << " (grad_q, grad_k, grad_v, grad_bias)");
        REQUIRE(vectors[i].size() == rows[i].size());
        double largest = 0.0;
        for (const double v : rows[i]) largest = std::max(largest, std::abs(v));
        int64_t off = 0;  // NaNs count as off
        for (size_t j = 0; j < rows[i].size(); ++j) {
          if (!(std::abs(vectors[i][j] - rows[i][j]) <= rel * largest + 1e-30)) ++off;
        }
        CHECK(off == 0);
      }
    }
  }
}

TEST_CASE("cuda attention: the one-block forward for 65 to 80 rows, against the CPU", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // ViT-S's 65 tokens with LSA's bias, class attention over 65 keys, the 80-row limit, queries
  // and keys of different lengths, and CSKA's logits given as the bias (d = 0); check_case runs
  // each tiled and in one block, against the CPU twin and the f64 reference.
  struct Problem {
    int64_t nq, nk, d, dv;
  };
  for (const Problem s : {Problem{65, 65, 64, 64}, Problem{1, 65, 64, 64}, Problem{80, 80, 32, 32},
                          Problem{72, 17, 48, 48}, Problem{65, 65, 0, 64}}) {
    Case c = plain_case("one-block forward " + std::to_string(s.nq) + " x " + std::to_string(s.nk) +
                            ", d " + std::to_string(s.d),
                        {3, 2}, s.nq, s.nk, s.d, s.dv, 1901);
    c.grad_bias = true;
    c.base.push_back(uniform({3, 2, s.nq, s.nk}, 1905, -2, 2));
    c.views = [=](const std::vector<Tensor>& t) {
      return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
    };
    check_case(c, s.d > 0 ? 1.0 / std::sqrt(static_cast<double>(s.d)) : 1.0,
               {DType::kBF16, DType::kF16});
  }
}

TEST_CASE("cuda attention: a bias and its gradient in padded rows, read and written by key pairs",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // The mma.sync kernels read the bias and store grad_bias two keys at a time where the pairs
  // are aligned words (Inputs::bias_pairs, BackwardArgs::grad_bias_pairs): CSKA-ViT's logits in
  // rows of 72 for 65 keys (d = 0; the pair at key 64 reads the padding beside it), the same
  // with q k^T (d = 64), 197 tokens in rows of 200 (key tiles past the first), and 80 keys in
  // unpadded rows of 80 (an even count); tiled and in one block (check_case), against the CPU
  // twin and the f64 reference.
  for (const Problem s : {Problem{65, 65, 0, 64}, Problem{65, 65, 64, 64},
                          Problem{197, 197, 32, 32}, Problem{80, 80, 64, 64}}) {
    const Case c = s.nk % 8 == 0 ? biased_case("even keys", {3, 2}, s.nq, s.nk, s.d, s.dv, 1951)
                                 : padded_case("padded rows", {3, 2}, s.nq, s.nk, s.d, s.dv, 1951);
    INFO(s.nq << " x " << s.nk << ", d " << s.d);
    check_case(c, s.d > 0 ? 1.0 / std::sqrt(static_cast<double>(s.d)) : 1.0,
               {DType::kBF16, DType::kF16});
  }
}

TEST_CASE("cuda attention: a device-side scale factor equals the same scale given on the host",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // factor is an f32 value and scale a power of two, so scale * factor is the same f32 either
  // way: both paths must give the same bits (scalar kernels in f32, tensor cores in bf16).
  const double factor = static_cast<double>(static_cast<float>(1.3702));
  Case c = plain_case("scale factor", {2, 2}, 65, 65, 64, 64, 901);
  c.grad_bias = true;
  c.base.push_back(uniform({2, 2, 65, 65}, 905));
  c.views = [=](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
  };
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    INFO(dtype_name(dtype));
    const Prepared x = prepare(c, dtype);
    const auto host = values(run(c, x.gpu, 0.125 * factor, true));
    const auto device = values(run(c, x.gpu, 0.125, true, factor));
    const auto cpu_host = values(run(c, x.cpu, 0.125 * factor, false));
    const auto cpu_device = values(run(c, x.cpu, 0.125, false, factor));
    for (size_t i = 0; i < host.size(); ++i) {
      INFO("result " << i << " (out, lse, grad_q, grad_k, grad_v, grad_bias)");
      CHECK(device[i] == host[i]);
      CHECK(cpu_device[i] == cpu_host[i]);
    }
  }
}

TEST_CASE("cuda attention: head dim 0 (logits given as the bias) with a bias factor", "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // CSKA's shape: [B, h, 65, 65] logits (a diagonal of -inf), values of head dim 64.
  const double f = 0.75;
  Case c = plain_case("logits", {2, 3}, 65, 65, 0, 64, 1401);
  c.grad_bias = true;
  Tensor logits = uniform({2, 3, 65, 65}, 1405, -3, 3);
  for (int64_t i = 0; i < 65; ++i) logits.narrow(2, i, 1).narrow(3, i, 1).fill_(-kInf);
  c.base.push_back(logits);
  c.views = [=](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
  };
  for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    INFO(dtype_name(dtype));
    const Prepared x = prepare(c, dtype);
    const Results fast = on_host(run(c, x.gpu, 1.0, true, 0.0, f));
    Results scalar;
    {
      const ScalarAttention off;
      scalar = on_host(run(c, x.gpu, 1.0, true, 0.0, f));
    }
    Results wmma;
    {
      const WmmaAttention on;
      wmma = on_host(run(c, x.gpu, 1.0, true, 0.0, f));
    }
    Results one_block;
    {
      const OneBlockBackward on;
      one_block = on_host(run(c, x.gpu, 1.0, true, 0.0, f));
    }
    const Results cpu = run(c, x.cpu, 1.0, false, 0.0, f);
    // The reference takes f * bias as its bias; its dL/dbias is then dL/dz, ours f dL/dz.
    Operands scaled = x.ref;
    scaled.bias = mul(x.ref.bias, f);
    Results ref = reference(c, scaled, 1.0);
    ref.grad_bias = mul(ref.grad_bias, f);
    const ska::test::Tolerance tol = tolerance_for(dtype);
    compare(fast, cpu, tol, "cuda vs cpu");
    compare(fast, ref, tol, "cuda vs reference");
    compare(scalar, ref, tol, "scalar cuda vs reference");
    compare(one_block, cpu, tol, "one-block backward cuda vs cpu");
    compare(one_block, ref, tol, "one-block backward cuda vs reference");
    compare(wmma, cpu, tol, "wmma cuda vs cpu");
    compare(wmma, ref, tol, "wmma cuda vs reference");
    CHECK(fast.grad_q.numel() == 0);
  }
}

TEST_CASE(
    "cuda attention: the diagonal mask, N = 65 (LSA), and 70 queries over 66 keys with a bias",
    "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  Case lsa = plain_case("lsa", {2, 4}, 65, 65, 64, 64, 1501);
  lsa.mask = AttentionMask::kDiagonal;
  check_case(lsa, 0.125, {DType::kF32, DType::kBF16, DType::kF16});
  // Rows past the keys (nothing excluded there), a bias beside the mask, its gradient +0 on
  // the diagonal.
  Case biased = biased_case("mask and bias", {2, 3}, 70, 66, 32, 32, 1511, -1, 1);
  biased.mask = AttentionMask::kDiagonal;
  check_case(biased, 0.2);
  const Prepared x = prepare(biased, DType::kBF16);
  CHECK(ska::test::plus_zero_diagonal(run(biased, x.gpu, 0.2, true).grad_bias));
}

TEST_CASE(
    "cuda attention: the diagonal mask at head dim 128, fewer queries than keys, a permuted "
    "grad_bias at 65 tokens, and f16 with a bias",
    "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // Every family of check_case (mma.sync and its one-block kernels, WMMA, scalar) with the mask
  // where their tiles differ: head dim 128 (32-wide key tiles), 40 queries over 66 keys (no
  // query excludes keys 40 to 65), and a bias laid out [h, B, N, N] whose gradient is written
  // in that layout at the one-block kernels' size (65 tokens, d = 64).
  Case wide = plain_case("mask, d 128", {2, 2}, 65, 65, 128, 128, 1521);
  wide.mask = AttentionMask::kDiagonal;
  check_case(wide, 0.088, {DType::kF32, DType::kBF16, DType::kF16});
  Case fewer = biased_case("mask, 40 x 66", {2, 3}, 40, 66, 32, 32, 1531, -1, 1);
  fewer.mask = AttentionMask::kDiagonal;
  check_case(fewer, 0.2, {DType::kF32, DType::kBF16, DType::kF16});
  Case permuted = plain_case("mask, permuted bias, 65 tokens", {2, 3}, 65, 65, 64, 64, 1541);
  permuted.mask = AttentionMask::kDiagonal;
  permuted.grad_bias = true;
  permuted.permuted_grad_bias = true;
  permuted.base.push_back(uniform({3, 2, 65, 65}, 1545, -1, 1));
  permuted.views = [=](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4].transpose(0, 1), t[3], empty_out(permuted, t[0])};
  };
  check_case(permuted, 0.125, {DType::kBF16, DType::kF16});
  const Prepared x = prepare(permuted, DType::kBF16);
  CHECK(ska::test::plus_zero_diagonal(run(permuted, x.gpu, 0.125, true).grad_bias));
  {
    const OneBlockBackward on;
    CHECK(ska::test::plus_zero_diagonal(run(permuted, x.gpu, 0.125, true).grad_bias));
  }
}

TEST_CASE("cuda attention: head dim 0 with the diagonal mask, bias and grad_bias as [h, B, N, K]",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  // CSKAFormer's logits from their matrix product, [h, B, N, K] seen as [B, h, N, K], at a
  // smaller grid: 2 images, 3 heads, 100 queries and keys, values of head dim 16.
  Case c = plain_case("permuted logits", {2, 3}, 100, 100, 0, 16, 1601);
  c.grad_bias = true;
  c.permuted_grad_bias = true;
  c.mask = AttentionMask::kDiagonal;
  c.base.push_back(uniform({3, 2, 100, 100}, 1605, -3, 3));
  c.views = [=](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4].transpose(0, 1), t[3], empty_out(c, t[0])};
  };
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    INFO(dtype_name(dtype));
    const Prepared x = prepare(c, dtype);
    const Results fast = on_host(run(c, x.gpu, 1.0, true));
    Results scalar;
    {
      const ScalarAttention off;
      scalar = on_host(run(c, x.gpu, 1.0, true));
    }
    Results wmma;
    {
      const WmmaAttention on;
      wmma = on_host(run(c, x.gpu, 1.0, true));
    }
    const Results cpu = run(c, x.cpu, 1.0, false);
    const Results ref = reference(c, x.ref, 1.0);
    const ska::test::Tolerance tol = tolerance_for(dtype);
    for (const auto& [name, r] : {std::pair<const char*, const Results*>{"mma", &fast},
                                  {"scalar", &scalar},
                                  {"wmma", &wmma}}) {
      compare(*r, cpu, tol, std::string(name) + " cuda vs cpu");
      compare(*r, ref, tol, std::string(name) + " cuda vs reference");
      CHECK(ska::test::plus_zero_diagonal(r->grad_bias));
    }
    CHECK(ska::test::plus_zero_diagonal(cpu.grad_bias));
  }
}

TEST_CASE("cuda attention: edge cases: a fully masked row, no keys, head dims above 128",
          "[cuda]") {
  if (!ska::test::cuda_available_or_skip()) return;
  const int64_t nq = 4, nk = 8, d = 16;
  std::vector<double> bias(nq * nk, 0.0);
  for (int64_t j = 0; j < nk; ++j) bias[2 * nk + j] = -kInf;  // row 2 sees no key
  Case c = plain_case("masked row", {1, 1}, nq, nk, d, d, 901);
  c.grad_bias = true;
  c.base.push_back(Tensor::from_vector(bias, {1, 1, nq, nk}, DType::kF64));
  c.views = [=](const std::vector<Tensor>& t) {
    return Operands{t[0], t[1], t[2], t[4], t[3], empty_out(c, t[0])};
  };
  const Prepared x = prepare(c, DType::kF32);
  const Results gpu = run(c, x.gpu, 0.25, true);
  compare(gpu, run(c, x.cpu, 0.25, false), tolerance_for(DType::kF32), "cuda vs cpu, NaN rows");
  const std::vector<float> out = gpu.out.to_vector<float>();
  for (int64_t i = 0; i < nq; ++i) {
    for (int64_t e = 0; e < d; ++e) CHECK(std::isnan(out[i * d + e]) == (i == 2));
  }

  // No keys: zero output, lse -inf and zero grad_q, as the CPU twin's forward.
  const Case empty = plain_case("no keys", {2, 1}, 3, 0, d, d, 911);
  const Results none = run(empty, prepare(empty, DType::kF32).gpu, 0.25, true);
  for (const double o : none.out.to_vector<double>()) CHECK(o == 0.0);
  for (const double l : none.lse.to_vector<double>()) CHECK(l == -kInf);
  for (const double g : none.grad_q.to_vector<double>()) CHECK(g == 0.0);

  const Tensor q = Tensor::zeros({1, 2, 4, 160}, DType::kF32, kGpu);
  const Tensor lse = Tensor::empty({1, 2, 4}, DType::kF32, kGpu);
  const auto run_forward = [&] {
    cuda::attention_forward(q, q, q, Tensor(), AttentionMask::kNone, 1.0, Tensor(), Tensor(), q,
                            lse);
  };
  REQUIRE_THROWS_AS(run_forward(), ValueError);
  REQUIRE_THROWS_WITH(run_forward(),
                      Catch::Contains("attention_forward") && Catch::Contains("d = 160"));
}

#endif  // SKA_WITH_CUDA
