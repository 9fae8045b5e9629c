// Shared test helpers: tolerances per dtype, closeness checks, the finite-difference gradient
// checker, CUDA-vs-CPU parity, and small tensor factories. Every op test uses these.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "backend/profiler.h"
#include "config/config.h"
#include "ops/ops.h"

namespace ska::test {

// Absolute + relative tolerance: |a - e| <= atol + rtol * |e|.
struct Tolerance {
  double atol;
  double rtol;
};

// The tolerances of a result computed in `dtype` (defined here once, used by every test).
//  f64: reference arithmetic; f32: one backend vs another (TF32 GEMMs on CUDA included);
//  bf16 / f16: storage and compute in 16 bits with f32 accumulation.
Tolerance tolerance_for(DType dtype);
// The gradient checker's tolerance (central differences in f64).
constexpr Tolerance kGradCheckTolerance{1e-6, 1e-5};

// Fails the current test (naming `what`, the shapes and the worst element) unless every element
// of `actual` is within `tol` of `expected`. Both may be on any device and of any dtype.
void require_close(const Tensor& actual, const Tensor& expected, Tolerance tol,
                   const std::string& what = "");
// Normalised mean squared error sum((a - e)^2) / sum(e^2): for long reductions and attention.
double nmse(const Tensor& actual, const Tensor& expected);
// Whether a and b (any devices) have the same dtype, shape and bytes.
bool bitwise_equal(const Tensor& a, const Tensor& b);
// Whether every (i, i) entry of the trailing [nq, nk] matrices of t (any device) is +0 (not -0).
bool plus_zero_diagonal(const Tensor& t);
// Whether the autograd graph of `t` records an op named `name`.
bool graph_has(const Tensor& t, const std::string& name);

// Deterministic test data (f64 on the CPU unless stated), uniform in [lo, hi).
Tensor uniform(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0,
               DType dtype = DType::kF64);
Tensor values(const std::vector<double>& v, const Shape& shape, DType dtype = DType::kF64);

struct GradCheckOptions {
  double eps = 1e-6;         // central-difference step
  Tolerance tol = kGradCheckTolerance;
  double kink = 0.0;         // skip inputs within kink_range of this point (ReLU-like kinks)
  double kink_range = -1.0;  // < 0: no skipping
};

// Checks the gradients of f at `inputs` (f64 CPU tensors; those with requires_grad are checked):
// the analytic gradient of sum(f(inputs) * w), for a fixed random w, against central differences.
void check_gradients(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                     const GradCheckOptions& options = {});

// Removes `dir` (recursively) when the test process exits, so that test runs leave nothing in the
// temp folder; SKA_KEEP_TEST_DIRS=1 keeps them for a look after a failure.
void remove_at_exit(const std::string& dir);

// True when a CUDA device is usable; otherwise emits a Catch2 WARN saying why the test is skipped.
bool cuda_available_or_skip();

// Runs f on CPU (f32) and on CUDA in `dtype`, with the same inputs, and compares outputs and the
// gradients of every input that requires grad, within tolerance_for(dtype) (or `tol` if given).
void check_cuda_parity(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                       DType dtype, const Tolerance* tol = nullptr);

// The autograd nodes named `name` reachable from `root`'s grad_fn (with `into_leaf`, only those
// whose first input is a leaf's gradient sink).
int count_nodes(const Tensor& root, const std::string& name, bool into_leaf = false);

// The model configs of the zoo (configs/models/NAME.yaml), every family and mixer at full size.
const std::vector<std::string>& zoo_models();
// Model `name` of configs/models/; reduced: one or two layers a stage (Swin's come in pairs: a
// window layer and a shifted one), a few heads of the full model's head width, narrow channels
// and the ImageNet MetaFormers on 64x64 images, every mixer, norm and block kind of the full
// model kept (on the emulated device, tests/emu, the full models take hours).
Config zoo_config(const std::string& name, bool reduced);

// The kernels `fn` runs, as the kernel profiler records them (a row per kernel and operands).
std::vector<profiler::KernelTime> kernels_of(const std::function<void()>& fn);
// How many times kernel `name` runs among `kernels`, whatever its operands.
int64_t calls_of(const std::vector<profiler::KernelTime>& kernels, const std::string& name);

// The copy kernels `fn` runs (under the kernel profiler) with an operand of one of `shapes` (as
// the profiler writes them: "[2, 3, 5, 4]"), each as "copy OPERANDS"; empty if none.
std::vector<std::string> copies_of(const std::function<void()>& fn,
                                   const std::vector<std::string>& shapes);

}  // namespace ska::test
