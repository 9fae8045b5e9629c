// What the tests/simt attention tests share (test_attention_mma.cpp: the mma.sync kernels;
// test_attention_scalar.cpp: the scalar kernels): problems shaped as the paper models' attention,
// their operands as the kernels take them, an f64 reference with per-element error bounds, and
// bit-for-bit comparisons of two runs.
#pragma once

// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda/kernels/attention_tc.cuh"
#include "tests/simt/values.h"

namespace ska::simt::attention {

using cuda::attn::BackwardArgs;
using cuda::attn::ForwardArgs;
using cuda::attn::Inputs;
using cuda::attn::View;

// One attention problem: `heads` leading indices of nq queries and nk keys. q, k and v are
// either dense [heads, n, d] or, with `packed`, strided views of one [batch, n, 3, 2, d]
// projection as ViT's qkv linear lays them out (two heads a sample). The bias (d = 0: the
// logits themselves, as CSKA gives them) is [heads, nq, nk] in rows of bias_row >= nk elements.
struct Problem {
  std::string name;
  int heads, nq, nk, d, dv;
  bool bias = false;
  int bias_row = 0;
  bool diagonal = false;
  bool packed = false;
  bool scale_factor = false;
  float scale = 0.125f;
  bool bias_factor = false;  // a device-side factor of the bias (Inputs::bias_factor)
  // The bias -inf at the first 64 keys of every other query (a whole tile of keys masked out in
  // the scalar and WMMA kernels' 32-key tiles and the mma.sync kernels' 64-key ones: those rows'
  // running max still -inf after it); nk > 64.
  bool masked_tile = false;
};

// Dense [lead, n, cols] with leading index g at g * lead_stride (one leading dim).
inline View dense_view(int64_t lead, int64_t lead_stride, int64_t row) {
  View v{};
  v.lead.ndim = 1;
  v.lead.sizes[0] = lead;
  v.lead.strides[0] = lead_stride;
  v.row = row;
  v.col = 1;
  return v;
}

template <typename T>
struct Data {
  Problem p;
  std::vector<T> qkv, q, k, v, bias, go;
  float factor = 1.5f;        // the scale's factor, where the problem has one
  float bias_factor = 0.75f;  // the bias's factor, where the problem has one
  const T* qp() const { return p.packed ? qkv.data() : q.data(); }
  const T* kp() const { return p.packed ? qkv.data() + 2 * p.d : k.data(); }
  const T* vp() const { return p.packed ? qkv.data() + 4 * p.d : v.data(); }
  View qkv_view(int n, int cols) const {
    if (!p.packed) return dense_view(p.heads, int64_t{n} * cols, cols);
    View view{};  // [batch, 2 heads] leading dims
    view.lead.ndim = 2;
    view.lead.sizes[0] = p.heads / 2;
    view.lead.sizes[1] = 2;
    view.lead.strides[0] = int64_t{n} * 6 * p.d;
    view.lead.strides[1] = p.d;
    view.row = 6 * p.d;
    view.col = 1;
    return view;
  }
  View bias_view() const { return dense_view(p.heads, int64_t{p.nq} * p.bias_row, p.bias_row); }
};

template <typename T>
Data<T> make_data(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](size_t n, float s) {
    std::vector<T> x(n);
    for (T& e : x) e = round_to<T>(s * normal(rng));
    return x;
  };
  Data<T> x;
  x.p = p;
  if (p.packed) {
    REQUIRE((p.nq == p.nk && p.d == p.dv && p.heads % 2 == 0));
    x.qkv = fill(static_cast<size_t>(p.heads / 2) * p.nq * 6 * p.d, 1.0f);
  } else {
    x.q = fill(static_cast<size_t>(p.heads) * p.nq * p.d, 1.0f);
    x.k = fill(static_cast<size_t>(p.heads) * p.nk * p.d, 1.0f);
    x.v = fill(static_cast<size_t>(p.heads) * p.nk * p.dv, 1.0f);
  }
  // One element past the last row: a pair at an odd last key reads it (bias_pairs_readable).
  if (p.bias) x.bias = fill(static_cast<size_t>(p.heads) * p.nq * p.bias_row + 2, 2.0f);
  if (p.masked_tile) {
    REQUIRE((p.bias && p.nk > 64));
    for (int64_t row = 0; row < int64_t{p.heads} * p.nq; row += 2) {
      for (int j = 0; j < 64; ++j) x.bias[row * p.bias_row + j] = round_to<T>(-INFINITY);
    }
  }
  x.go = fill(static_cast<size_t>(p.heads) * p.nq * p.dv, 1.0f);
  return x;
}

template <typename T>
Inputs<T> inputs_of(const Data<T>& x, bool async_loads) {
  const Problem& p = x.p;
  Inputs<T> in{};
  in.q = x.qp();
  in.k = x.kp();
  in.v = x.vp();
  in.qv = x.qkv_view(p.nq, p.d);
  in.kv = x.qkv_view(p.nk, p.d);
  in.vv = x.qkv_view(p.nk, p.dv);
  if (p.bias) {
    in.bias = x.bias.data();
    in.bv = x.bias_view();
  }
  in.nq = p.nq;
  in.nk = p.nk;
  in.d = p.d;
  in.dv = p.dv;
  in.scale = p.scale;
  in.scale_factor = p.scale_factor ? &x.factor : nullptr;
  in.bias_factor = p.bias_factor ? &x.bias_factor : nullptr;
  in.diagonal = p.diagonal;
  in.async_loads = async_loads;
  // As attention.cu decides it: aligned words, and the element after the last one allocated.
  in.bias_pairs = p.bias && async_loads && ska::cuda::attn::pairs_aligned(in.bias, in.bv);
  return in;
}

// The paper models' attention shapes the tensor-core kernels take (head dims multiples of 16,
// or 0), and edges: ViT-S's LSA (65 tokens of 64, the diagonal masked, a learnable temperature,
// q, k and v in one projection), CSKA-ViT's logits as the bias (head dim 0, rows of 72), CaiT's
// patch attention, CAFormer's stage 4 (49 tokens of 32) and Swin's windows with their position
// bias, and sizes that end mid-tile (one with a first tile of keys masked out by the bias in
// every other row).
inline std::vector<Problem> tensor_core_problems() {
  std::vector<Problem> list = {
      {"vit lsa 65x65 d64", 4, 65, 65, 64, 64, false, 0, true, true, true},
      {"cska logits as bias 65x65 d0 rows of 72", 3, 65, 65, 0, 64, true, 72},
      {"cska-cait 64x64 d64 with bias", 2, 64, 64, 64, 64, true, 64},
      {"caformer s4 49x49 d32", 3, 49, 49, 32, 32},
      {"swin window 16x16 d32 with bias", 3, 16, 16, 32, 32, true, 16},
      {"17 queries over 80 keys d16/48 with bias", 2, 17, 80, 16, 48, true, 80},
      {"97x97 d64 (tiled) with bias rows of 100", 2, 97, 97, 64, 64, true, 100},
      {"33x70 d128", 2, 33, 70, 128, 128},
  };
  list[6].masked_tile = true;
  return list;
}

template <typename T>
struct Results {
  std::vector<T> out;
  std::vector<float> lse;
  std::vector<T> gq, gk, gv, gb;
};

// The forward's operands of x into fresh outputs r.out and r.lse (every element unwritten).
template <typename T>
ForwardArgs<T> forward_args(const Data<T>& x, bool async_loads, Results<T>& r) {
  const Problem& p = x.p;
  ForwardArgs<T> a{};
  a.in = inputs_of(x, async_loads);
  r.out = unwritten<T>(static_cast<size_t>(p.heads) * p.nq * p.dv);
  r.lse.assign(static_cast<size_t>(p.heads) * p.nq, NAN);
  a.out = r.out.data();
  a.ov = dense_view(p.heads, int64_t{p.nq} * p.dv, p.dv);
  a.lse = r.lse.data();
  return a;
}

// The backward's operands from `fwd`'s log-sum-exps and `delta` (D of fwd's output) into fresh
// gradients of r (grad_bias in rows of bias_row, every element unwritten).
template <typename T>
BackwardArgs<T> backward_args(const Data<T>& x, const Results<T>& fwd, const float* delta,
                              bool async_loads, Results<T>& r) {
  const Problem& p = x.p;
  BackwardArgs<T> a{};
  a.in = inputs_of(x, async_loads);
  a.go = x.go.data();
  a.gov = dense_view(p.heads, int64_t{p.nq} * p.dv, p.dv);
  a.lse = fwd.lse.data();
  a.delta = delta;
  r.gq = unwritten<T>(static_cast<size_t>(p.heads) * p.nq * p.d);
  r.gk = unwritten<T>(static_cast<size_t>(p.heads) * p.nk * p.d);
  r.gv = unwritten<T>(static_cast<size_t>(p.heads) * p.nk * p.dv);
  a.gq = r.gq.data();
  a.gk = r.gk.data();
  a.gv = r.gv.data();
  a.gqv = dense_view(p.heads, int64_t{p.nq} * p.d, p.d);
  a.gkv = dense_view(p.heads, int64_t{p.nk} * p.d, p.d);
  a.gvv = dense_view(p.heads, int64_t{p.nk} * p.dv, p.dv);
  if (p.bias) {
    r.gb = unwritten<T>(static_cast<size_t>(p.heads) * p.nq * p.bias_row);
    a.gb = r.gb.data();
    a.gbv = x.bias_view();
    a.grad_bias_pairs = async_loads && ska::cuda::attn::pairs_aligned(a.gb, a.gbv);
  }
  return a;
}

// D = rowsum(dO * O) in f32 from the forward's output, summed column by column (the delta
// kernels of attention.cu take other orders, within f32 rounding of it).
template <typename T>
std::vector<float> delta_of(const Data<T>& x, const std::vector<T>& out) {
  const Problem& p = x.p;
  std::vector<float> delta(static_cast<size_t>(p.heads) * p.nq);
  for (size_t row = 0; row < delta.size(); ++row) {
    float s = 0.0f;
    for (int c = 0; c < p.dv; ++c) {
      s += static_cast<float>(value(x.go[row * p.dv + c])) *
           static_cast<float>(value(out[row * p.dv + c]));
    }
    delta[row] = s;
  }
  return delta;
}

// The f64 reference from the same inputs, each value with the error the kernels' rounding allows
// it: the tensor-core kernels round P (or the forward's unnormalised weights) and dS to T before
// their second products, each by at most half a unit in the last place (eps / 2; eps = 2^-8 in
// bf16, 2^-11 in f16, 2^-24 in f32), so an output sum(w x) may differ by eps / 2 sum |w x| from
// them, and by eps / 2 of itself when it is rounded to T; `bound` allows eps times each, plus the
// f32 sums' error (1e-5 of the sum of the terms' magnitudes). The backward's D is delta_of's
// (from the forward's output `kernel_out`), so that dS differs by f32 rounding only.
struct Reference {
  std::vector<double> out, lse, gq, gk, gv, gb;
  std::vector<double> out_bound, gq_bound, gk_bound, gv_bound, gb_bound;
};

template <typename T>
Reference reference(const Data<T>& x, const std::vector<T>& kernel_out) {
  const Problem& p = x.p;
  const double eps = std::is_same_v<T, __nv_bfloat16> ? 0x1p-8
                     : std::is_same_v<T, __half>      ? 0x1p-11
                                                      : 0x1p-24;
  const double f32 = 1e-5;
  const double scale = p.scale * (p.scale_factor ? x.factor : 1.0f);
  const double bscale = p.bias_factor ? x.bias_factor : 1.0;
  const Inputs<T> in = inputs_of(x, false);
  const std::vector<float> D = delta_of(x, kernel_out);
  Reference r;
  const auto zeros = [](size_t n) { return std::vector<double>(n, 0.0); };
  const size_t nout = static_cast<size_t>(p.heads) * p.nq * p.dv;
  const size_t nq = static_cast<size_t>(p.heads) * p.nq * p.d;
  const size_t nk = static_cast<size_t>(p.heads) * p.nk * p.d;
  const size_t nv = static_cast<size_t>(p.heads) * p.nk * p.dv;
  const size_t nb = static_cast<size_t>(p.heads) * p.nq * p.bias_row;
  r.out = zeros(nout), r.out_bound = zeros(nout), r.lse = zeros(size_t(p.heads) * p.nq);
  r.gq = zeros(nq), r.gq_bound = zeros(nq), r.gk = zeros(nk), r.gk_bound = zeros(nk);
  r.gv = zeros(nv), r.gv_bound = zeros(nv), r.gb = zeros(nb), r.gb_bound = zeros(nb);
  for (int g = 0; g < p.heads; ++g) {
    const T* q = in.q + in.qv.lead.offset(g);
    const T* k = in.k + in.kv.lead.offset(g);
    const T* v = in.v + in.vv.lead.offset(g);
    auto Q = [&](int i, int c) { return double(value(q[i * in.qv.row + c])); };
    auto K = [&](int j, int c) { return double(value(k[j * in.kv.row + c])); };
    auto V = [&](int j, int c) { return double(value(v[j * in.vv.row + c])); };
    auto dO = [&](int i, int c) { return double(value(x.go[(int64_t{g} * p.nq + i) * p.dv + c])); };
    for (int i = 0; i < p.nq; ++i) {
      const int64_t row = int64_t{g} * p.nq + i;
      double mx = -INFINITY;
      std::vector<double> z(p.nk, -INFINITY), P(p.nk), dS(p.nk), dS_terms(p.nk);
      for (int j = 0; j < p.nk; ++j) {
        if (p.diagonal && i == j) continue;
        double s = 0.0;
        for (int c = 0; c < p.d; ++c) s += Q(i, c) * K(j, c);
        z[j] = scale * s;
        if (p.bias) z[j] += bscale * value(x.bias[row * p.bias_row + j]);
        mx = std::max(mx, z[j]);
      }
      double sum = 0.0;
      for (int j = 0; j < p.nk; ++j) sum += std::exp(z[j] - mx);
      const double lse = mx + std::log(sum);
      r.lse[row] = lse;
      for (int j = 0; j < p.nk; ++j) P[j] = std::exp(z[j] - lse);
      for (int c = 0; c < p.dv; ++c) {
        double o = 0.0, terms = 0.0;
        for (int j = 0; j < p.nk; ++j) {
          o += P[j] * V(j, c);
          terms += std::abs(P[j] * V(j, c));
        }
        r.out[row * p.dv + c] = o;
        r.out_bound[row * p.dv + c] = eps * (terms + std::abs(o)) + f32 * terms;
      }
      for (int j = 0; j < p.nk; ++j) {
        double dp = 0.0, dp_terms = 0.0;
        for (int c = 0; c < p.dv; ++c) {
          dp += dO(i, c) * V(j, c);
          dp_terms += std::abs(dO(i, c) * V(j, c));
        }
        dS[j] = P[j] * (dp - D[row]);
        dS_terms[j] = P[j] * (dp_terms + std::abs(D[row]) + std::abs(dp - D[row]));
        if (p.bias) {
          r.gb[row * p.bias_row + j] = bscale * dS[j];
          r.gb_bound[row * p.bias_row + j] = bscale * (eps * std::abs(dS[j]) + f32 * dS_terms[j]);
        }
      }
      for (int j = 0; j < p.nk; ++j) {
        const int64_t kr = int64_t{g} * p.nk + j;
        for (int c = 0; c < p.dv; ++c) {
          r.gv[kr * p.dv + c] += P[j] * dO(i, c);
          r.gv_bound[kr * p.dv + c] += (eps + f32) * std::abs(P[j] * dO(i, c));
        }
        for (int c = 0; c < p.d; ++c) {
          r.gq[row * p.d + c] += scale * dS[j] * K(j, c);
          r.gq_bound[row * p.d + c] +=
              std::abs(scale * K(j, c)) * (eps * std::abs(dS[j]) + f32 * dS_terms[j]);
          r.gk[kr * p.d + c] += scale * dS[j] * Q(i, c);
          r.gk_bound[kr * p.d + c] +=
              std::abs(scale * Q(i, c)) * (eps * std::abs(dS[j]) + f32 * dS_terms[j]);
        }
      }
    }
  }
  // The outputs' own rounding to T.
  for (auto [v, b] : {std::pair{&r.gq, &r.gq_bound}, {&r.gk, &r.gk_bound}, {&r.gv, &r.gv_bound}}) {
    for (size_t e = 0; e < v->size(); ++e) (*b)[e] += eps * std::abs((*v)[e]);
  }
  return r;
}

// Every element within its bound of the reference, plus 1e-6 of the reference's RMS, and none
// left unwritten. A key, a query or a product missed in one element fails it.
template <typename T>
void require_near(const std::vector<T>& actual, const std::vector<double>& expected,
                  const std::vector<double>& bound, const std::string& what) {
  INFO(what);
  REQUIRE(actual.size() == expected.size());
  double norm = 0.0;
  for (double e : expected) norm += e * e;
  const double slack = 1e-6 * std::sqrt(norm / std::max<size_t>(expected.size(), 1));
  int64_t outside = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = value(actual[i]);
    REQUIRE(std::isfinite(a));
    if (std::abs(a - expected[i]) > bound[i] + slack) {
      if (outside++ == 0) {
        UNSCOPED_INFO("first at " << i << ": " << a << " against " << expected[i] << " +- "
                                  << bound[i]);
      }
    }
  }
  CHECK(outside == 0);
}

// grad_bias: the view's elements near the reference, the rows' padding left as it was.
template <typename T>
void require_grad_bias(const Problem& p, const std::vector<T>& gb, const Reference& ref) {
  std::vector<T> live;
  std::vector<double> want, bound;
  int64_t touched = 0;
  for (int64_t row = 0; row < int64_t{p.heads} * p.nq; ++row) {
    for (int j = 0; j < p.bias_row; ++j) {
      const T e = gb[row * p.bias_row + j];
      if (j < p.nk) {
        live.push_back(e);
        want.push_back(ref.gb[row * p.bias_row + j]);
        bound.push_back(ref.gb_bound[row * p.bias_row + j]);
      } else {
        touched += !untouched(e);
      }
    }
  }
  CHECK(touched == 0);
  require_near(live, want, bound, "grad_bias");
}

template <typename T>
void require_reference(const Data<T>& x, const Results<T>& r, const std::string& what) {
  INFO(x.p.name << ": " << what);
  const Reference ref = reference(x, r.out);
  require_near(r.out, ref.out, ref.out_bound, "out");
  for (size_t i = 0; i < r.lse.size(); ++i) {  // -inf exactly for a row without keys
    if (std::isinf(ref.lse[i])) {
      REQUIRE(r.lse[i] == ref.lse[i]);
    } else {
      REQUIRE(std::abs(r.lse[i] - ref.lse[i]) <= 1e-5 * (1.0 + std::abs(ref.lse[i])));
    }
  }
  require_near(r.gv, ref.gv, ref.gv_bound, "grad_v");
  if (x.p.d > 0) {
    require_near(r.gq, ref.gq, ref.gq_bound, "grad_q");
    require_near(r.gk, ref.gk, ref.gk_bound, "grad_k");
  }
  if (x.p.bias) require_grad_bias(x.p, r.gb, ref);
}

template <typename T>
void require_same_bits(const Results<T>& a, const Results<T>& b, const std::string& what) {
  INFO(what);
  CHECK(same_bits(a.out, b.out));
  CHECK(same_bits(a.lse, b.lse));
  CHECK(same_bits(a.gq, b.gq));
  CHECK(same_bits(a.gk, b.gk));
  CHECK(same_bits(a.gv, b.gv));
  CHECK(same_bits(a.gb, b.gb));
}

}  // namespace ska::simt::attention
