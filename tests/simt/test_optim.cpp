// The single-tensor optimizer kernels' own code (cuda/kernels/optim.cu), run on the host by
// tests/simt: adam_step and sgd_step give the multi-tensor kernels' bits on the same tensor (the
// same per-element math, optim_math.cuh, in their own grid loops), a set skip flag changes
// nothing, and the step counts and the update statistics advance as the trainer reads them.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "tests/simt/multi_tensor_host.h"
#include "tests/simt/optim_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::round_to;
using ska::simt::same_bits;
namespace mt = ska::simt::multi_tensor;
namespace op = ska::simt::optim;

template <typename T>
std::vector<T> random_vector(size_t n, uint32_t seed, float stddev, bool positive = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<T> v(n);
  for (T& x : v) {
    const float r = normal(rng);
    x = round_to<T>(positive ? std::abs(r) : r);
  }
  return v;
}

template <typename T>
void check_adam() {
  const size_t n = 40000;  // more elements than one grid pass of a small grid needs
  std::vector<T> p = random_vector<T>(n, 1, 1.0f), g = random_vector<T>(n, 2, 0.1f),
                 m = random_vector<T>(n, 3, 0.01f), v = random_vector<T>(n, 4, 1e-3f, true);
  const mt::Adam a{0.9, 0.999, 1e-8, 0.0, 0.05};  // AdamW
  const double lr = 1e-3;
  const std::vector<int64_t> steps{7};
  mt::List<T> lp{p}, lg{g}, lm{m}, lv{v};
  mt::adam<T>(lp, lg, lm, lv, steps, nullptr, &lr, a);
  std::vector<T> sp = p, sm = m, sv = v;
  op::adam<T>(sp, g, sm, sv, &steps[0], nullptr, &lr, a);
  CHECK(same_bits(sp, lp[0]));
  CHECK(same_bits(sm, lm[0]));
  CHECK(same_bits(sv, lv[0]));
  CHECK_FALSE(same_bits(sp, p));  // it moved
  // A set skip flag: nothing changes.
  const uint8_t skip = 1;
  std::vector<T> kp = p, km = m, kv = v;
  op::adam<T>(kp, g, km, kv, &steps[0], &skip, &lr, a);
  CHECK(same_bits(kp, p));
  CHECK(same_bits(km, m));
  CHECK(same_bits(kv, v));
  ska::simt::in_other_orders(131, [&](const char* order) {
    INFO(order);
    std::vector<T> op2 = p, om = m, ov = v;
    op::adam<T>(op2, g, om, ov, &steps[0], nullptr, &lr, a);
    CHECK(same_bits(op2, sp));
  });
}

TEST_CASE("simt: single-tensor adam_step gives the multi-tensor kernel's bits, a skip flag holds",
          "[cpu][simt][optim]") {
  check_adam<float>();
  check_adam<bf16>();
}

TEST_CASE("simt: single-tensor sgd_step gives the multi-tensor kernel's bits",
          "[cpu][simt][optim]") {
  const size_t n = 5003;
  const std::vector<float> p = random_vector<float>(n, 5, 1.0f),
                           g = random_vector<float>(n, 6, 0.1f),
                           buf = random_vector<float>(n, 7, 0.05f);
  const double lr = 0.1;
  for (const bool nesterov : {false, true}) {
    INFO((nesterov ? "Nesterov" : "momentum"));
    mt::List<float> lp{p}, lg{g}, lb{buf};
    mt::sgd<float>(lp, lg, lb, nullptr, &lr, 0.9f, 5e-4f, nesterov);
    std::vector<float> sp = p, sb = buf;
    op::sgd<float>(sp, g, sb, nullptr, &lr, 0.9f, 5e-4f, nesterov);
    CHECK(same_bits(sp, lp[0]));
    CHECK(same_bits(sb, lb[0]));
  }
  mt::List<float> lp{p}, lg{g}, none;
  mt::sgd<float>(lp, lg, none, nullptr, &lr, 0.0f, 0.0f, false);
  std::vector<float> sp = p, empty;
  op::sgd<float>(sp, g, empty, nullptr, &lr, 0.0f, 0.0f, false);
  CHECK(same_bits(sp, lp[0]));
}

TEST_CASE("simt: step counts and update statistics advance unless the step is skipped",
          "[cpu][simt][optim]") {
  std::vector<int64_t> counts{0, 5, 9, 1000};
  const uint8_t go = 0, skip = 1;
  op::advance_counts(counts, &go);
  CHECK(counts == std::vector<int64_t>{1, 6, 10, 1001});
  op::advance_counts(counts, &skip);
  CHECK(counts == std::vector<int64_t>{1, 6, 10, 1001});
  op::advance_counts(counts, nullptr);  // no flag: every step counts
  CHECK(counts == std::vector<int64_t>{2, 7, 11, 1002});

  // {loss sum, updates, skipped, skipped in a row, most in a row}
  float stats[5] = {0, 0, 0, 0, 0};
  const float loss = 0.25f;
  for (const uint8_t* flag : {&go, &skip, &skip, &go, &skip}) op::record_update(stats, &loss, flag);
  CHECK(stats[0] == 0.5f);
  CHECK(stats[1] == 2.0f);
  CHECK(stats[2] == 3.0f);
  CHECK(stats[3] == 1.0f);
  CHECK(stats[4] == 2.0f);
}

}  // namespace
