// Device parsing and printing.
#include "core/device.h"

#include "core/error.h"

namespace ska {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    const std::string idx = text.substr(5);
    if (!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos) {
      return cuda(std::stoi(idx));
    }
  }
  SKA_FAIL(ValueError, "invalid device '", text, "'; expected 'cpu', 'cuda' or 'cuda:N'");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace ska
