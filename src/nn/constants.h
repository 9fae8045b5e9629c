// Constant tensors a forward needs on its device (masks, index tables), built once per key and
// device and kept for the life of the process: building them per call would copy from the host
// on every forward (a host round trip in the training step, and a copy a CUDA Graph capture
// refuses).
#pragma once

#include <functional>
#include <string>

#include "core/tensor.h"

namespace ska::nn {

// The tensor `build` returns (on the CPU, called once per key), on `device`. `key` names the
// constant and everything its values depend on ("diagonal_mask 65x65"). Thread-safe; never
// freed. Treat the result as read-only.
Tensor device_constant(const std::string& key, Device device, const std::function<Tensor()>& build);

}  // namespace ska::nn
