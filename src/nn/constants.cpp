// device_constant: one map of (key, device) -> tensor under a mutex.
#include "nn/constants.h"

#include <map>
#include <mutex>
#include <utility>

namespace ska::nn {

Tensor device_constant(const std::string& key, Device device,
                       const std::function<Tensor()>& build) {
  static std::mutex mu;
  // Never destroyed: device tensors must not be freed after the device runtime is torn down.
  static auto* constants = new std::map<std::pair<std::string, std::string>, Tensor>();
  const std::pair<std::string, std::string> id{key, device.str()};
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = constants->find(id);
  if (it != constants->end()) return it->second;
  Tensor t = build().to(device);
  constants->emplace(id, t);
  return t;
}

}  // namespace ska::nn
