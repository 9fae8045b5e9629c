// Device parsing and printing.
#include "core/device.h"

#include "core/checked_math.h"
#include "core/error.h"

namespace ska {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0) {
    if (const std::optional<int64_t> idx = parse_decimal(text.substr(5), 1023)) {
      return cuda(static_cast<int>(*idx));
    }
  }
  SKA_FAIL(ValueError, "invalid device '", text, "'; expected 'cpu', 'cuda' or 'cuda:N'");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace ska
