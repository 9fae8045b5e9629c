// Tensor factories, metadata, host read-back and in-place fill/copy.
#include "core/tensor.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "backend/backend.h"
#include "backend/device_runtime.h"
#include "core/checked_math.h"

namespace ska {

namespace detail {
void throw_no_cuda(const char* kernel) {
  SKA_FAIL(DeviceError, "kernel '", kernel,
           "' called for a CUDA tensor, but this build has no CUDA support (-DSKA_CUDA=ON)");
}
}  // namespace detail

#ifndef SKA_WITH_CUDA
void copy_between_devices(const Tensor& src, const Tensor& dst) {
  SKA_FAIL(DeviceError, "copy from ", src.device(), " to ", dst.device(),
           ": this build has no CUDA support");
}
void synchronize(Device) {}
bool capturing(Device) { return false; }
void* record_device_event(Device device) {
  SKA_FAIL(DeviceError, "timing work on ", device, ": this build has no CUDA support");
}
double device_event_ms(void*, void*) {
  SKA_FAIL(DeviceError, "device events: this build has no CUDA support");
}
struct DeviceGraph::State {};
DeviceGraph::DeviceGraph(Device device, const std::function<void()>&) {
  SKA_FAIL(DeviceError, "a CUDA Graph on ", device, ": this build has no CUDA support");
}
DeviceGraph::~DeviceGraph() = default;
void DeviceGraph::replay() {
  SKA_FAIL(DeviceError, "a CUDA Graph: this build has no CUDA support");
}
std::string cuda_device_name(int index) {
  SKA_FAIL(DeviceError, "the name of cuda:", index, ": this build has no CUDA support");
}
int cuda_compute_capability(int index) {
  SKA_FAIL(DeviceError, "the compute capability of cuda:", index,
           ": this build has no CUDA support");
}
bool set_cuda_elementwise_fast_paths(bool enabled) {
  static bool setting = true;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_tensor_cores(bool enabled) {
  static bool setting = true;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_mma(bool enabled) {
  static bool setting = true;
  return std::exchange(setting, enabled);
}
bool set_cuda_layer_norm_held_forward(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_layer_norm_fused_backward(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_one_block_backward(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_one_pass_backward(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_register_cap(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_persistent(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_one_block_forward(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
bool set_cuda_attention_async_loads(bool enabled) {
  static bool setting = true;
  return std::exchange(setting, enabled);
}
bool set_cuda_conv_logits_grad_w_rows(bool enabled) {
  static bool setting = false;
  return std::exchange(setting, enabled);
}
ConvInputGrad set_cuda_conv_input_grad(ConvInputGrad mode) {
  static ConvInputGrad setting = ConvInputGrad::kTimed;
  return std::exchange(setting, mode);
}
DepthwiseConv set_cuda_depthwise_conv(DepthwiseConv mode) {
  static DepthwiseConv setting = DepthwiseConv::kCudnn;
  return std::exchange(setting, mode);
}
std::vector<std::string> cuda_depthwise_conv_choices() { return {}; }
GemmAlgorithm set_cuda_gemm_algorithm(GemmAlgorithm mode) {
  static GemmAlgorithm setting = GemmAlgorithm::kHeuristic;
  return std::exchange(setting, mode);
}
std::vector<std::string> cuda_gemm_choices() { return {}; }
void push_profile_range(const char*) {}
void pop_profile_range() {}
void start_device_profiler_capture() {
  SKA_FAIL(DeviceError, "a profiler capture range needs CUDA (this build has none)");
}
void stop_device_profiler_capture() {
  SKA_FAIL(DeviceError, "a profiler capture range needs CUDA (this build has none)");
}
#endif

Tensor Tensor::make_view(std::shared_ptr<Storage> storage, Shape shape, Shape strides,
                         int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t s : shape) {
    SKA_CHECK(s >= 0, ShapeError, "empty: negative size in shape ", shape_str(shape));
  }
  const int64_t bytes = checked_nbytes<ShapeError>(shape, static_cast<int64_t>(dtype_size(dtype)), "empty");
  auto storage = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
  return make_view(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  const int64_t bytes = checked_nbytes<ShapeError>(shape, static_cast<int64_t>(dtype_size(dtype)),
                                                    "empty_pinned");
  auto storage =
      std::make_shared<Storage>(static_cast<size_t>(bytes), Device::cpu(), &pinned_host_allocator());
  return make_view(std::move(storage), shape, contiguous_strides(shape), 0, dtype);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full({}, value, dtype, device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return from_vector(v, {n}, dtype, device);
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  // As in PyTorch, a tensor without elements is contiguous whatever its strides (those that
  // contiguous_strides gives a shape with a zero do not multiply out).
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t i = shape().size(); i-- > 0;) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

bool Tensor::same_view(const Tensor& other) const {
  return same_storage(other) && offset() == other.offset() && shape() == other.shape() &&
         strides() == other.strides() && dtype() == other.dtype();
}

bool Tensor::is_non_overlapping_and_dense() const {
  return non_overlapping_and_dense(shape(), strides());
}

bool Tensor::is_channels_last() const {
  if (dim() != 4) return false;
  int64_t expected = 1;
  for (const int d : {1, 3, 2, 0}) {  // innermost first
    if (shape()[d] == 1) continue;
    if (strides()[d] != expected) return false;
    expected *= shape()[d];
  }
  return true;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor" << shape_str(shape()) << " " << dtype_name(dtype()) << " " << device();
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage()->data()) + offset() * static_cast<int64_t>(element_size());
}

double Tensor::item() const {
  SKA_CHECK(numel() == 1, ShapeError, "item: tensor of shape ", shape_str(shape()),
            " has ", numel(), " elements, expected 1");
  return to_vector<double>()[0];
}

Tensor& Tensor::fill_(double value) {
  SKA_KERNEL(device(), fill)(*this, value);
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  Tensor s = src.shape() == shape() ? src : src.expand(shape());
  if (s.device() == device()) {
    SKA_KERNEL(device(), copy)(s, *this);
    return *this;
  }
  // Across devices: convert and pack on the source side, move bytes, unpack on the destination.
  Tensor packed = s.dtype() == dtype() && s.is_contiguous()
                      ? s
                      : Tensor::empty(shape(), dtype(), s.device()).copy_(s);
  if (is_contiguous()) {
    copy_between_devices(packed, *this);
  } else {
    Tensor staged = Tensor::empty(shape(), dtype(), device());
    copy_between_devices(packed, staged);
    SKA_KERNEL(device(), copy)(staged, *this);
  }
  return *this;
}

Tensor& Tensor::set_requires_grad(bool on) {
  SKA_CHECK(!on || is_floating(), DTypeError, "requires_grad on a ", dtype_name(dtype()),
            " tensor: only floating tensors can require gradients");
  SKA_CHECK(is_leaf(), AutogradError, "set_requires_grad on a non-leaf tensor; use detach()");
  impl().requires_grad = on;
  return *this;
}

Tensor Tensor::detach() const {
  return make_view(storage(), shape(), strides(), offset(), dtype());
}

void Tensor::backward(const Tensor& grad) const {
  Tensor g = grad;
  if (!g.defined()) {
    SKA_CHECK(numel() == 1, AutogradError, "backward on a tensor of shape ", shape_str(shape()),
              ": pass a gradient, or call it on a scalar");
    g = Tensor::ones(shape(), dtype(), device());
  }
  autograd::run_backward({*this}, {g});
}

void Tensor::register_grad_ready_hook(GradHook hook) {
  SKA_CHECK(is_leaf() && requires_grad(), AutogradError,
            "register_grad_ready_hook: only leaf tensors that require grad have a final gradient");
  impl().grad_ready_hooks.push_back(std::move(hook));
}

}  // namespace ska
