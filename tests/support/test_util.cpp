// Shared test helpers (see test_util.h).
#include "support/test_util.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/node.h"
#include "backend/profiler.h"

namespace ska::test {

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::kF64: return {1e-10, 1e-8};
    case DType::kF32: return {1e-4, 2e-3};
    case DType::kBF16: return {2e-2, 2e-2};
    case DType::kF16: return {2e-3, 5e-3};
    default: return {0.0, 0.0};
  }
}

void require_close(const Tensor& actual, const Tensor& expected, Tolerance tol,
                   const std::string& what) {
  INFO(what);
  REQUIRE(actual.defined());
  REQUIRE(expected.defined());
  INFO("actual " << actual.str() << ", expected " << expected.str());
  REQUIRE(actual.shape() == expected.shape());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  size_t worst = 0, failures = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = tol.atol + tol.rtol * std::fabs(e[i]);
    const double err = std::fabs(a[i] - e[i]);
    const bool nan_mismatch = std::isnan(a[i]) != std::isnan(e[i]);
    if (nan_mismatch || err > bound) {
      ++failures;
      const double excess = nan_mismatch ? 1e300 : err - bound;
      if (excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (failures > 0) {
    std::ostringstream msg;
    msg << failures << " of " << a.size() << " elements differ beyond atol " << tol.atol
        << " + rtol " << tol.rtol << "; worst at flat index " << worst << ": actual "
        << a[worst] << ", expected " << e[worst];
    FAIL(msg.str());
  }
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu()).contiguous(), y = b.to(Device::cpu()).contiguous();
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()) == 0;
}

bool plus_zero_diagonal(const Tensor& t) {
  const std::vector<double> x = t.to(Device::cpu()).contiguous().to_vector<double>();
  const int64_t nq = t.size(-2), nk = t.size(-1);
  for (size_t m = 0; m < x.size(); m += static_cast<size_t>(nq * nk)) {
    for (int64_t i = 0; i < std::min(nq, nk); ++i) {
      const double e = x[m + static_cast<size_t>(i * nk + i)];
      if (e != 0.0 || std::signbit(e)) return false;
    }
  }
  return true;
}

bool graph_has(const Tensor& t, const std::string& name) {
  std::vector<std::shared_ptr<autograd::Node>> todo = {t.grad_fn()};
  while (!todo.empty()) {
    const std::shared_ptr<autograd::Node> node = todo.back();
    todo.pop_back();
    if (!node) continue;
    if (node->name() == name) return true;
    for (const autograd::Edge& e : node->next_edges) todo.push_back(e.fn);
  }
  return false;
}

double nmse(const Tensor& actual, const Tensor& expected) {
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.to_vector<double>();
  REQUIRE(a.size() == e.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - e[i]) * (a[i] - e[i]);
    den += e[i] * e[i];
  }
  return den > 0.0 ? num / den : num;
}

Tensor uniform(const Shape& shape, uint64_t seed, double lo, double hi, DType dtype) {
  Generator gen(seed);
  return add(mul(rand(shape, DType::kF64, Device::cpu(), &gen), hi - lo), lo).to(dtype);
}

Tensor values(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return Tensor::from_vector(v, shape, dtype);
}

namespace {

double weighted_sum(const Tensor& out, const Tensor& w) {
  return sum(mul(out, w)).item();
}

}  // namespace

void check_gradients(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                     const GradCheckOptions& options) {
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) REQUIRE(t.dtype() == DType::kF64);
  }
  // Analytic gradients of L = sum(f(x) * w).
  Tensor out = f(inputs);
  REQUIRE(out.dtype() == DType::kF64);
  const Tensor w = uniform(out.shape(), 12345, 0.5, 1.5);
  for (const Tensor& t : inputs) {
    if (t.defined()) t.zero_grad();
  }
  sum(mul(out, w)).backward();

  NoGradGuard no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& x = inputs[k];
    if (!x.defined() || !x.requires_grad()) continue;
    INFO("input " << k << " " << x.str());
    REQUIRE(x.is_contiguous());
    const Tensor analytic = x.grad();
    REQUIRE(analytic.defined());
    double* p = x.data<double>();
    std::vector<double> numeric(static_cast<size_t>(x.numel()));
    std::vector<char> skip(numeric.size(), 0);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double orig = p[i];
      if (options.kink_range >= 0.0 && std::fabs(orig - options.kink) <= options.kink_range) {
        skip[static_cast<size_t>(i)] = 1;
        continue;
      }
      p[i] = orig + options.eps;
      const double up = weighted_sum(f(inputs), w);
      p[i] = orig - options.eps;
      const double down = weighted_sum(f(inputs), w);
      p[i] = orig;
      numeric[static_cast<size_t>(i)] = (up - down) / (2.0 * options.eps);
    }
    std::vector<double> a = analytic.to_vector<double>();
    for (size_t i = 0; i < a.size(); ++i) {
      if (skip[i]) a[i] = numeric[i] = 0.0;
    }
    require_close(Tensor::from_vector(a, x.shape()), Tensor::from_vector(numeric, x.shape()),
                  options.tol, "gradient vs central differences");
  }
}

namespace {
// The folders to remove when the process exits (a function-local static: destroyed at exit).
struct ScratchDirs {
  std::mutex mutex;
  std::vector<std::string> dirs;
  ~ScratchDirs() {
    const char* keep = std::getenv("SKA_KEEP_TEST_DIRS");
    if (keep != nullptr && std::string(keep) == "1") return;
    for (const std::string& d : dirs) {
      std::error_code ignored;
      std::filesystem::remove_all(d, ignored);
    }
  }
};
ScratchDirs& scratch_dirs() {
  static ScratchDirs dirs;
  return dirs;
}
}  // namespace

void remove_at_exit(const std::string& dir) {
  ScratchDirs& s = scratch_dirs();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (std::find(s.dirs.begin(), s.dirs.end(), dir) == s.dirs.end()) s.dirs.push_back(dir);
}

bool cuda_available_or_skip() {
  if (cuda_is_available()) return true;
  WARN("skipped: no CUDA device available (build with -DSKA_CUDA=ON and run on a GPU)");
  return false;
}

void check_cuda_parity(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                       DType dtype, const Tolerance* tol) {
  const Tolerance t = tol ? *tol : tolerance_for(dtype);
  auto prepare = [&](Device dev, DType dt) {
    TensorList xs;
    for (const Tensor& x : inputs) {
      if (!x.defined()) {
        xs.emplace_back();
        continue;
      }
      // Both sides see the same values: the CPU reference gets the inputs rounded to `dtype`
      // (then computes in f32), so the comparison is of the arithmetic, not of the rounding
      // (rounding to bf16 can create ties that move an amax gradient, for example).
      Tensor y = x.is_floating() ? x.detach().to(dtype).to(dev, dt) : x.detach().to(dev);
      if (x.requires_grad()) y.set_requires_grad(true);
      xs.push_back(y);
    }
    return xs;
  };
  TensorList cpu_in = prepare(Device::cpu(), DType::kF32);
  TensorList gpu_in = prepare(Device::cuda(0), dtype);
  Tensor cpu_out = f(cpu_in);
  Tensor gpu_out = f(gpu_in);
  require_close(gpu_out, cpu_out, t, "CUDA forward vs CPU");
  // The output weights, representable in `dtype` so both sides weight alike.
  const Tensor w = uniform(cpu_out.shape(), 777, 0.5, 1.5, DType::kF32).to(dtype).to(DType::kF32);
  if (cpu_out.requires_grad()) {
    sum(mul(cpu_out, w)).backward();
    sum(mul(gpu_out, w.to(Device::cuda(0), gpu_out.dtype()))).backward();
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].defined() || !inputs[k].requires_grad()) continue;
      // An input that only feeds non-differentiable paths (a mask) gets no gradient on either.
      INFO("gradient of input " << k);
      REQUIRE(gpu_in[k].grad().defined() == cpu_in[k].grad().defined());
      if (!cpu_in[k].grad().defined()) continue;
      require_close(gpu_in[k].grad(), cpu_in[k].grad(), t,
                    "CUDA gradient of input " + std::to_string(k) + " vs CPU");
    }
  }
}

int count_nodes(const Tensor& root, const std::string& name, bool into_leaf) {
  std::vector<autograd::Node*> stack = {root.grad_fn().get()};
  std::set<autograd::Node*> seen;
  int count = 0;
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    const bool leaf_input = !n->next_edges.empty() && n->next_edges[0].fn != nullptr &&
                            n->next_edges[0].fn->name() == "AccumulateGrad";
    if (n->name() == name && (leaf_input || !into_leaf)) ++count;
    for (const autograd::Edge& e : n->next_edges) stack.push_back(e.fn.get());
  }
  return count;
}

std::vector<profiler::KernelTime> kernels_of(const std::function<void()>& fn) {
  profiler::start();
  fn();
  std::vector<profiler::KernelTime> calls;
  profiler::stop(&calls);
  return calls;
}

int64_t calls_of(const std::vector<profiler::KernelTime>& kernels, const std::string& name) {
  int64_t n = 0;
  for (const profiler::KernelTime& k : kernels) n += k.name == name ? k.calls : 0;
  return n;
}

std::vector<std::string> copies_of(const std::function<void()>& fn,
                                   const std::vector<std::string>& shapes) {
  std::vector<std::string> found;
  for (const auto& c : kernels_of(fn)) {
    if (c.name != "copy") continue;
    for (const std::string& shape : shapes) {
      if (c.operands.find(shape) != std::string::npos) {
        found.push_back("copy " + c.operands);
        break;
      }
    }
  }
  return found;
}

const std::vector<std::string>& zoo_models() {
  static const std::vector<std::string> kZoo = {
      "vit_s",          "ska_vit_s",    "cska_vit_s",    "cait_s",        "ska_cait_s",
      "cska_cait_s",    "swin_t",       "ska_swin_t",    "cska_swin_t",   "cvt_13",
      "ska_cvt_13",     "cska_cvt_13",  "caformer_s18",  "skaformer_s18", "cskaformer_s18",
      "convformer_s18", "caformer_b36", "skaformer_b36", "cskaformer_b36"};
  return kZoo;
}

Config zoo_config(const std::string& name, bool reduced) {
  Config config = Config::load(std::string(SKA_SOURCE_DIR) + "/configs/models/" + name + ".yaml");
  if (!reduced) return config;
  const std::string family = config.root().get<std::string>("family");
  std::vector<std::string> sets;
  if (family == "vit") {
    sets = {"depth=2", "heads=2", "dim=128", "mlp_dim=128"};
  } else if (family == "cait") {
    sets = {"depth=2", "cls_depth=1", "heads=2", "dim=128", "mlp_dim=128"};
  } else if (family == "swin") {
    sets = {"depths=[2, 2, 2, 2]", "hidden_dim=32", "heads=[1, 1, 2, 2]"};
  } else if (family == "cvt") {
    sets = {"depths=[1, 1, 2]", "dims=[32, 64, 96]", "heads=[1, 2, 3]"};
  } else if (family == "metaformer") {
    sets = {"depths=[1, 1, 2, 1]", "dims=[32, 64, 96, 128]", "image_size=64"};
  }
  for (const std::string& s : sets) config.set(s);
  return config;
}

}  // namespace ska::test
