// Tensor: a strided view (shape, strides, offset, dtype) into a reference-counted Storage, plus the
// autograd metadata of the value. Copying a Tensor copies a handle; use clone() for data.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"

namespace ska {

namespace autograd {
class Node;
}

class Tensor;
using TensorList = std::vector<Tensor>;
using GradHook = std::function<void(const Tensor& grad)>;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::kF32;

  // Autograd: leaves that require grad accumulate into `grad`; non-leaves have a `grad_fn`.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  int output_nr = 0;                               // which output of grad_fn this value is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: created on first use
  std::vector<GradHook> grad_ready_hooks;          // leaves: called once the grad is final
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- Factories (raw data, no autograd) ---
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::kF32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::kF32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::kF32, Device device = Device::cpu());
  static Tensor arange(int64_t n, DType dtype = DType::kI64, Device device = Device::cpu());
  // Copies host values; converts them to `dtype` (defaults to the C++ type's dtype).
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype,
                            Device device = Device::cpu());
  // A view over existing storage.
  static Tensor make_view(std::shared_ptr<Storage> storage, Shape shape, Shape strides,
                          int64_t offset, DType dtype);

  // --- Metadata ---
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;    // negative dims count from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t element_size() const { return dtype_size(impl().dtype); }
  bool is_contiguous() const;
  // 4-D [N, C, H, W] laid out as a contiguous [N, H, W, C] (PyTorch's channels_last): what
  // permute({0, 3, 1, 2}) of a contiguous tensor gives. Size-1 dims match any stride, so a tensor
  // with C == 1 or H == W == 1 is both this and contiguous.
  bool is_channels_last() const;
  // Whether the elements fill a block of memory, each once, in some order of the dims: a
  // contiguous tensor seen through a permutation (torch's is_non_overlapping_and_dense).
  bool is_non_overlapping_and_dense() const;
  bool is_floating() const { return dtype_is_floating(impl().dtype); }
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  bool same_storage(const Tensor& other) const { return impl().storage == other.impl().storage; }
  // Whether other is this very view: the same storage, offset, shape, strides and dtype (a
  // result its producer already wrote where it is wanted needs no copy there).
  bool same_view(const Tensor& other) const;
  std::string str() const;  // "Tensor[2, 3] f32 cpu"

  // Pointer to the first element of this view (device memory for CUDA tensors).
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    SKA_CHECK(DTypeOf<T>::value == dtype(), DTypeError, "data<", dtype_name(DTypeOf<T>::value),
              ">() called on a ", dtype_name(dtype()), " tensor");
    return static_cast<T*>(data_ptr());
  }

  // --- Views (no copy; differentiable) ---
  Tensor view(const Shape& shape) const;     // requires compatible strides; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view when possible, else copy
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor expand(const Shape& shape) const;          // -1 keeps a size
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;

  // --- Copies and conversions (differentiable) ---
  Tensor contiguous() const;
  Tensor clone() const;
  // to(): a copy on `device` in `dtype` (this tensor itself when both match), contiguous, except
  // that a dtype cast on the same device keeps a channels-last layout (is_channels_last), as
  // PyTorch's preserve_format does.
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;

  // Reads back to the host (synchronises for CUDA). `item` needs exactly one element.
  double item() const;
  template <typename T>
  std::vector<T> to_vector() const;  // converts from any dtype

  // In-place, outside autograd: fill or copy values into this view.
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // broadcasts src; converts dtype and device

  // --- Autograd ---
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& set_requires_grad(bool on = true);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl().grad); }
  void set_grad(const Tensor& g) const { impl().grad = g.impl_; }
  void zero_grad() const { impl().grad.reset(); }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  Tensor detach() const;  // shares data, no history
  // Runs backpropagation from this value; a scalar needs no `grad`.
  void backward(const Tensor& grad = Tensor()) const;
  // Leaves only: `hook(grad)` runs when this tensor's gradient is complete in a backward pass.
  void register_grad_ready_hook(GradHook hook);

  TensorImpl& impl() const {
    SKA_CHECK(impl_ != nullptr, ValueError, "operation on an undefined tensor");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// --- Template definitions ---
template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  return from_vector(values, shape, DTypeOf<T>::value, device);
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, DType dtype,
                           Device device) {
  SKA_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), ShapeError,
            "from_vector: ", values.size(), " values for shape ", shape_str(shape));
  Tensor host = empty(shape, DTypeOf<T>::value);
  std::copy(values.begin(), values.end(), host.data<T>());
  if (dtype == DTypeOf<T>::value && device.is_cpu()) return host;
  return host.to(device, dtype);
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu(), DTypeOf<T>::value).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

}  // namespace ska
