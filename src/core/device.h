// Where a tensor lives: the host ("cpu") or one CUDA device ("cuda:N").
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace ska {

enum class DeviceType : uint8_t { kCPU, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;

  static Device cpu() { return {DeviceType::kCPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  static Device parse(const std::string& text);  // "cpu", "cuda", "cuda:1"; throws ValueError

  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// True when the library was built with CUDA and at least one device is visible.
bool cuda_is_available();
int cuda_device_count();

}  // namespace ska
