// The multi-tensor optimizer kernels' own code (cuda/kernels/multi_tensor.cu), run on the host by
// tests/simt, over 40 tensors (two tables of at most 32), one of them three chunks of 16K
// elements, one empty: AdamW (with an L2 term too), LAMB (trust ratio per tensor across its
// chunks, clipped and not, a gradient divisor), SGD (momentum, Nesterov), the weight average
// and the casts, and the gradient statistics (rescaled in place, a NaN found), each against its
// math in f64 (backend/kernels.inc), the weight average, the casts and the rescale to the bit,
// a set skip flag changing nothing, and the same bits in other thread orders.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "tests/simt/multi_tensor_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::round_to;
using ska::simt::same_bits;
using ska::simt::value;
namespace mt = ska::simt::multi_tensor;
template <typename T>
using List = mt::List<T>;

// 40 tensors: small ones, an empty one, one of three chunks (16K elements each) and one that
// ends a chunk exactly.
std::vector<size_t> sizes() {
  std::vector<size_t> s;
  for (int i = 0; i < 40; ++i) s.push_back(static_cast<size_t>(7 + 37 * i));
  s[3] = 0;
  s[10] = 40000;
  s[25] = 16384;
  return s;
}

template <typename T>
List<T> random_list(uint32_t seed, float mean, float stddev, bool positive = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, stddev);
  List<T> l;
  for (size_t n : sizes()) {
    std::vector<T> t;
    for (size_t j = 0; j < n; ++j) {
      const float x = normal(rng);
      t.push_back(round_to<T>(positive ? std::abs(x) : x));
    }
    l.push_back(std::move(t));
  }
  return l;
}

template <typename T>
std::vector<double> flat(const List<T>& l) {
  std::vector<double> out;
  for (const auto& t : l)
    for (const T& e : t) out.push_back(value(e));
  return out;
}

template <typename T>
bool same(const List<T>& a, const List<T>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!same_bits(a[i], b[i])) return false;
  return a.size() == b.size();
}

// How many elements of `got` are off `want` by more than rel of its size plus abs.
template <typename T>
int64_t off(const List<T>& got, const std::vector<double>& want, double rel, double abs) {
  const std::vector<double> g = flat(got);
  int64_t bad = 0;
  for (size_t e = 0; e < want.size(); ++e)
    bad += !(std::abs(g[e] - want[e]) <= rel * std::abs(want[e]) + abs);
  return bad;
}

template <typename T>
constexpr double rounding() {
  return std::is_same_v<T, float> ? 2e-6 : 0x1p-8;
}

struct AdamState {
  std::vector<double> p, m, v;
};

// Adam's step on every element in f64 (steps[i] the tensor's count; l2 and decoupled decay).
AdamState adam_reference(const std::vector<double>& p, const std::vector<double>& g,
                         const std::vector<double>& m, const std::vector<double>& v,
                         const std::vector<int64_t>& steps, double lr, const mt::Adam& a,
                         double grad_scale = 1.0, std::vector<double>* update = nullptr) {
  AdamState s{p, m, v};
  size_t e = 0;
  const std::vector<size_t> n = sizes();
  for (size_t i = 0; i < n.size(); ++i) {
    const double t = static_cast<double>(steps[i]);
    const double c1 = 1.0 - std::pow(a.beta1, t), c2 = std::sqrt(1.0 - std::pow(a.beta2, t));
    for (size_t j = 0; j < n[i]; ++j, ++e) {
      const double gj = g[e] * grad_scale + a.l2_decay * p[e];
      s.m[e] = a.beta1 * m[e] + (1 - a.beta1) * gj;
      s.v[e] = a.beta2 * v[e] + (1 - a.beta2) * gj * gj;
      const double u = (s.m[e] / c1) / (std::sqrt(s.v[e]) / c2 + a.eps) + a.decoupled_decay * p[e];
      if (update != nullptr) {
        update->push_back(u);
      } else {
        s.p[e] = p[e] - lr * u;
      }
    }
  }
  return s;
}

std::vector<int64_t> step_counts() {
  std::vector<int64_t> s;
  for (int i = 0; i < 40; ++i) s.push_back(1 + i % 7);
  return s;
}

template <typename T>
void check_adam() {
  const List<T> p0 = random_list<T>(1, 0.0f, 1.0f), g = random_list<T>(2, 0.0f, 0.1f);
  const List<T> m0 = random_list<T>(3, 0.0f, 0.05f), v0 = random_list<T>(4, 0.0f, 0.01f, true);
  const std::vector<int64_t> steps = step_counts();
  const double lr = 1e-2;
  for (const mt::Adam a :
       {mt::Adam{0.9, 0.999, 1e-8, 0.0, 0.05}, mt::Adam{0.8, 0.99, 1e-6, 0.01, 0.0}}) {
    INFO("l2 " << a.l2_decay << ", decoupled " << a.decoupled_decay);
    List<T> p = p0, m = m0, v = v0;
    mt::adam(p, g, m, v, steps, nullptr, &lr, a);
    const AdamState want = adam_reference(flat(p0), flat(g), flat(m0), flat(v0), steps, lr, a);
    CHECK(off(p, want.p, rounding<T>(), 1e-6) == 0);
    CHECK(off(m, want.m, rounding<T>(), 1e-7) == 0);
    CHECK(off(v, want.v, rounding<T>(), 1e-8) == 0);
    // A set skip flag changes nothing; the other thread orders change no bit.
    const uint8_t skip = 1;
    List<T> ps = p0, ms = m0, vs = v0;
    mt::adam(ps, g, ms, vs, steps, &skip, &lr, a);
    CHECK((same(ps, p0) && same(ms, m0) && same(vs, v0)));
    ska::simt::in_other_orders(3, [&](const char* order) {
      INFO(order);
      List<T> pr = p0, mr = m0, vr = v0;
      mt::adam(pr, g, mr, vr, steps, nullptr, &lr, a);
      CHECK((same(pr, p) && same(mr, m) && same(vr, v)));
    });
  }
}

TEST_CASE("simt: multi-tensor Adam and AdamW over two tables against f64", "[cpu][simt]") {
  check_adam<float>();
  check_adam<bf16>();
}

template <typename T>
void check_lamb(bool adapt, bool trust_clip, bool divided) {
  INFO("adapt " << adapt << ", trust clip " << trust_clip << ", divisor " << divided);
  const List<T> p0 = random_list<T>(5, 0.0f, 0.5f), g = random_list<T>(6, 0.0f, 0.2f);
  const List<T> m0 = random_list<T>(7, 0.0f, 0.05f), v0 = random_list<T>(8, 0.0f, 0.01f, true);
  const std::vector<int64_t> steps = step_counts();
  const double lr = 1e-2;
  const float divisor = 2.5f;
  const mt::Adam a{0.9, 0.999, 1e-6, 0.0, 0.02};
  List<T> p = p0, m = m0, v = v0;
  mt::lamb(p, g, m, v, steps, nullptr, divided ? &divisor : nullptr, &lr, a, adapt, trust_clip);
  std::vector<double> u;
  const std::vector<double> pv = flat(p0);
  const AdamState s = adam_reference(pv, flat(g), flat(m0), flat(v0), steps, lr, a,
                                     divided ? 1.0 / divisor : 1.0, &u);
  std::vector<double> want(pv.size()), slack(pv.size());
  size_t e = 0;
  for (size_t n : sizes()) {
    double w2 = 0.0, u2 = 0.0;
    for (size_t j = 0; j < n; ++j) {
      w2 += pv[e + j] * pv[e + j];
      u2 += u[e + j] * u[e + j];
    }
    double trust = 1.0;
    if (adapt && w2 > 0.0 && u2 > 0.0) trust = std::sqrt(w2) / std::sqrt(u2);
    if (adapt && trust_clip) trust = std::min(trust, 1.0);
    for (size_t j = 0; j < n; ++j, ++e) {
      want[e] = pv[e] - lr * trust * u[e];
      // In 16 bits the update is stored rounded before the trust ratio and the step read it.
      slack[e] = rounding<T>() * (std::abs(want[e]) + 2 * lr * trust * std::abs(u[e])) + 1e-6;
    }
  }
  const std::vector<double> got = flat(p);
  int64_t p_off = 0;
  for (size_t k = 0; k < want.size(); ++k) p_off += !(std::abs(got[k] - want[k]) <= slack[k]);
  CHECK(p_off == 0);
  CHECK(off(m, s.m, rounding<T>(), 1e-7) == 0);
  CHECK(off(v, s.v, rounding<T>(), 1e-8) == 0);
  ska::simt::in_other_orders(4, [&](const char* order) {
    INFO(order);
    List<T> pr = p0, mr = m0, vr = v0;
    mt::lamb(pr, g, mr, vr, steps, nullptr, divided ? &divisor : nullptr, &lr, a, adapt,
             trust_clip);
    CHECK((same(pr, p) && same(mr, m) && same(vr, v)));
  });
}

TEST_CASE("simt: multi-tensor LAMB, its trust ratio over each tensor's chunks, against f64",
          "[cpu][simt]") {
  check_lamb<float>(true, false, false);
  check_lamb<float>(true, true, true);
  check_lamb<float>(false, false, true);
  check_lamb<bf16>(true, true, false);
  // A set skip flag changes nothing.
  List<float> p = random_list<float>(5, 0.0f, 0.5f), m = random_list<float>(7, 0.0f, 0.05f),
              v = random_list<float>(8, 0.0f, 0.01f, true);
  const List<float> p0 = p, m0 = m, v0 = v;
  const uint8_t skip = 1;
  const double lr = 1e-2;
  mt::lamb(p, random_list<float>(6, 0.0f, 0.2f), m, v, step_counts(), &skip, nullptr, &lr,
           mt::Adam{}, true, true);
  CHECK((same(p, p0) && same(m, m0) && same(v, v0)));
}

template <typename T>
void check_sgd(float momentum, bool nesterov) {
  INFO("momentum " << momentum << ", nesterov " << nesterov);
  const List<T> p0 = random_list<T>(9, 0.0f, 1.0f), g = random_list<T>(10, 0.0f, 0.1f);
  const List<T> b0 = random_list<T>(11, 0.0f, 0.1f);
  const double lr = 0.1;
  const float wd = 5e-4f;
  List<T> p = p0, bufs = momentum > 0.0f ? b0 : List<T>();
  mt::sgd(p, g, bufs, nullptr, &lr, momentum, wd, nesterov);
  const std::vector<double> pv = flat(p0), gv = flat(g), bv = flat(b0);
  std::vector<double> want_p(pv.size()), want_b(pv.size());
  for (size_t e = 0; e < pv.size(); ++e) {
    double d = gv[e] + static_cast<double>(wd) * pv[e];
    if (momentum > 0.0f) {
      want_b[e] = momentum * bv[e] + d;
      d = nesterov ? d + momentum * want_b[e] : want_b[e];
    }
    want_p[e] = pv[e] - lr * d;
  }
  CHECK(off(p, want_p, rounding<T>(), 1e-6) == 0);
  if (momentum > 0.0f) CHECK(off(bufs, want_b, rounding<T>(), 1e-7) == 0);
}

TEST_CASE("simt: multi-tensor SGD with and without momentum against f64", "[cpu][simt]") {
  check_sgd<float>(0.0f, false);
  check_sgd<float>(0.9f, false);
  check_sgd<float>(0.9f, true);
  check_sgd<bf16>(0.9f, true);
}

template <typename T>
void check_ema_and_casts() {
  const List<T> e0 = random_list<T>(12, 0.0f, 1.0f), x = random_list<T>(13, 0.0f, 1.0f);
  const double decay = 0.9998;
  List<T> e = e0;
  mt::ema(e, x, nullptr, decay);
  // Each product and the sum rounded to T, no fused multiply-add (the CPU twin's bits).
  const float keep = static_cast<float>(decay), take = static_cast<float>(1.0 - decay);
  List<T> want = e0;
  for (size_t i = 0; i < want.size(); ++i) {
    for (size_t j = 0; j < want[i].size(); ++j) {
      const float a =
          static_cast<float>(value(round_to<T>(static_cast<float>(value(e0[i][j])) * keep)));
      const float b =
          static_cast<float>(value(round_to<T>(static_cast<float>(value(x[i][j])) * take)));
      want[i][j] = round_to<T>(a + b);
    }
  }
  CHECK(same(e, want));
  const uint8_t skip = 1;
  List<T> skipped = e0;
  mt::ema(skipped, x, &skip, decay);
  CHECK(same(skipped, e0));
}

TEST_CASE("simt: the multi-tensor weight average and casts, to the bit", "[cpu][simt]") {
  check_ema_and_casts<float>();
  check_ema_and_casts<bf16>();
  const List<float> src = random_list<float>(14, 0.0f, 3.0f);
  List<bf16> narrow;
  for (const auto& t : src) narrow.emplace_back(t.size());
  mt::cast(src, narrow);
  List<float> wide;
  for (const auto& t : src) wide.emplace_back(t.size());
  mt::cast(narrow, wide);
  bool narrow_ok = true, wide_ok = true;
  for (size_t i = 0; i < src.size(); ++i) {
    for (size_t j = 0; j < src[i].size(); ++j) {
      narrow_ok &=
          same_bits(std::vector<bf16>{round_to<bf16>(src[i][j])}, std::vector<bf16>{narrow[i][j]});
      wide_ok &= wide[i][j] == static_cast<float>(value(narrow[i][j]));
    }
  }
  CHECK(narrow_ok);
  CHECK(wide_ok);
}

TEST_CASE("simt: multi-tensor gradient statistics, rescaled in place, a NaN found", "[cpu][simt]") {
  const List<float> x0 = random_list<float>(15, 0.0f, 1.0f);
  for (const double scale : {1.0, 0.25}) {
    INFO("scale " << scale);
    List<float> x = x0;
    float out[2] = {NAN, NAN};
    mt::grad_stats(x, scale, out);
    double squares = 0.0;
    bool rescaled = true;
    for (size_t i = 0; i < x.size(); ++i) {
      for (size_t j = 0; j < x[i].size(); ++j) {
        const float want = scale == 1.0 ? x0[i][j] : x0[i][j] * static_cast<float>(scale);
        rescaled &= x[i][j] == want;
        squares += static_cast<double>(want) * want;
      }
    }
    CHECK(rescaled);
    CHECK(out[0] == Approx(squares).epsilon(1e-5));
    CHECK(out[1] == 0.0f);
    float again[2];
    ska::simt::in_other_orders(6, [&](const char* order) {
      INFO(order);
      List<float> xr = x0;
      mt::grad_stats(xr, scale, again);
      CHECK(again[0] == out[0]);
    });
  }
  List<float> x = x0;
  x[10][39999] = NAN;  // the last element of the three-chunk tensor
  float out[2];
  mt::grad_stats(x, 1.0, out);
  CHECK(std::isnan(out[1]));
}

}  // namespace
