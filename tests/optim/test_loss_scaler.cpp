// Dynamic loss scaling: GradScaler's update rule with real numbers (backoff, growth after the
// interval, f32 overflow kept out), unscaling fused with the non-finite check, and bad states.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ops/ops.h"
#include "optim/grad_utils.h"
#include "optim/loss_scaler.h"
#include "support/test_util.h"

using namespace ska;
using namespace ska::optim;
using Catch::Matchers::Contains;

TEST_CASE("loss scaler: init 2^16, backoff 0.5 on overflow, growth 2 after 2000 finite steps",
          "[cpu][optim][amp]") {
  LossScaler s;
  REQUIRE(s.scale_value() == 65536.0);
  REQUIRE(s.growth_tracker() == 0);
  s.update(true);
  CHECK(s.scale_value() == 32768.0);
  s.update(true);
  CHECK(s.scale_value() == 16384.0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  CHECK(s.scale_value() == 16384.0);
  CHECK(s.growth_tracker() == 1999);
  s.update(false);  // the 2000th finite step in a row
  CHECK(s.scale_value() == 32768.0);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 1500; ++i) s.update(false);
  s.update(true);  // an overflow resets the count
  CHECK(s.scale_value() == 16384.0);
  CHECK(s.growth_tracker() == 0);
  for (int i = 0; i < 1999; ++i) s.update(false);
  CHECK(s.scale_value() == 16384.0);
}

TEST_CASE("loss scaler: custom factors, and growth that would overflow f32 keeps the scale",
          "[cpu][optim][amp]") {
  LossScalerOptions o;
  o.init_scale = 3.0;
  o.growth_factor = 4.0;
  o.backoff_factor = 0.25;
  o.growth_interval = 3;
  LossScaler s(o);
  s.update(false);
  s.update(false);
  s.update(false);
  CHECK(s.scale_value() == 12.0);
  s.update(true);
  CHECK(s.scale_value() == 3.0);
  // 2^126 * 4 = 2^128 overflows f32: the scale stays, the count restarts.
  s.load(std::ldexp(1.0, 126), 2);
  s.update(false);
  CHECK(s.scale_value() == std::ldexp(1.0, 126));
  CHECK(s.growth_tracker() == 0);
  // The scale is kept as an f32 number: 65536 * 0.3 = 19660.8 rounds to 19660.80078125.
  o = LossScalerOptions();
  o.backoff_factor = 0.3;
  LossScaler t(o);
  t.update(true);
  CHECK(t.scale_value() == 19660.80078125);
}

TEST_CASE("loss scaler: bad options and states are rejected with the value", "[cpu][optim][amp]") {
  LossScalerOptions o;
  o.growth_factor = 1.0;
  REQUIRE_THROWS_WITH(LossScaler(o), Contains("growth_factor") && Contains("1"));
  o = LossScalerOptions();
  o.backoff_factor = 1.5;
  REQUIRE_THROWS_WITH(LossScaler(o), Contains("backoff_factor") && Contains("1.5"));
  LossScaler s;
  REQUIRE_THROWS_WITH(s.load(-1.0, 0), Contains("scale") && Contains("-1"));
  REQUIRE_THROWS_WITH(s.load(std::numeric_limits<double>::infinity(), 0), Contains("scale"));
  REQUIRE_THROWS_WITH(s.load(0.1, 0), Contains("f32"));  // 0.1 is not an f32 value
  REQUIRE_THROWS_WITH(s.load(1024.0, 2000), Contains("growth tracker") && Contains("2000"));
  s.load(1024.0, 1999);
  CHECK(s.scale_value() == 1024.0);
  CHECK(s.growth_tracker() == 1999);
}

TEST_CASE("loss scaler: scaled backward, then unscale and check in one sweep",
          "[cpu][optim][amp]") {
  const Tensor w = test::uniform({3, 4}, 1, -1.0, 1.0, DType::kF32).set_requires_grad();
  const Tensor b = test::uniform({3}, 2, -1.0, 1.0, DType::kF32).set_requires_grad();
  const Tensor x = test::uniform({5, 4}, 3, -1.0, 1.0, DType::kF32);
  auto loss_of = [&] { return mean(mul(linear(x, w, b), linear(x, w, b))); };
  loss_of().backward();
  const Tensor gw = w.grad().clone(), gb = b.grad().clone();
  w.zero_grad();
  b.zero_grad();

  LossScaler s;
  const Tensor scaled = s.scale(loss_of());
  CHECK(scaled.item() == Approx(loss_of().item() * 65536.0).epsilon(1e-6));
  scaled.backward();
  test::require_close(w.grad(), gw * 65536.0, test::tolerance_for(DType::kF32));
  const Tensor flag = s.unscale_and_check({w, b});
  CHECK(flag.dtype() == DType::kU8);
  CHECK(flag.item() == 0.0);
  // Scaling by a power of two is exact: the unscaled grads equal the plain ones bit for bit.
  CHECK(w.grad().to_vector<float>() == gw.to_vector<float>());
  CHECK(b.grad().to_vector<float>() == gb.to_vector<float>());

  // An overflowed element (inf) or NaN anywhere raises the flag.
  w.grad().select(0, 1).select(0, 2).fill_(std::numeric_limits<double>::infinity());
  CHECK(s.unscale_and_check({w, b}).item() == 1.0);
  w.grad().fill_(1.0);
  b.grad().select(0, 0).fill_(std::nan(""));
  CHECK(unscale_grads_nonfinite({w, b}, 0.5).item() == 1.0);
  CHECK(w.grad().to_vector<float>()[0] == 0.5f);
  b.grad().fill_(2.0);
  CHECK(unscale_grads_nonfinite({w, b}, 0.25).item() == 0.0);
  CHECK(b.grad().to_vector<float>()[2] == 0.5f);
  REQUIRE_THROWS_WITH(unscale_grads_nonfinite({w, b}, 0.0), Contains("inv_scale"));
}

TEST_CASE("loss scaler: unscale and check on CUDA grads, flag left on the device",
          "[cuda][optim][amp]") {
  if (!test::cuda_available_or_skip()) return;
  const Device cuda = Device::cuda(0);
  const Tensor host = test::uniform({64, 33}, 4, -4.0, 4.0, DType::kF32);
  const Tensor w = Tensor::zeros({64, 33}, DType::kF32, cuda).set_requires_grad();
  const Tensor b = Tensor::zeros({33}, DType::kF32, cuda).set_requires_grad();
  w.set_grad(mul(host, 1024.0).to(cuda));
  b.set_grad(Tensor::full({33}, 2048.0, DType::kF32, cuda));
  LossScaler s;
  s.load(1024.0, 0);
  const Tensor flag = s.unscale_and_check({w, b});
  REQUIRE(flag.device() == cuda);
  CHECK(flag.item() == 0.0);
  CHECK(w.grad().to_vector<float>() == host.to_vector<float>());  // powers of two: exact
  CHECK(b.grad().to_vector<float>()[32] == 2.0f);
  w.grad().select(0, 63).select(0, 32).fill_(std::numeric_limits<double>::infinity());
  CHECK(s.unscale_and_check({w, b}).item() == 1.0);
}
