// Typed exceptions for the library and the check macros that raise them.
// Library code throws; only the apps' main() turns errors into exit codes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ska {

// Base of every error the library raises on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ShapeError : public Error { using Error::Error; };     // incompatible shapes or dims
class DTypeError : public Error { using Error::Error; };     // unsupported or mismatched dtype
class DeviceError : public Error { using Error::Error; };    // wrong or unavailable device
class ValueError : public Error { using Error::Error; };     // bad argument value
class OutOfMemoryError : public Error { using Error::Error; };
class CudaError : public Error { using Error::Error; };      // CUDA / cuBLAS / cuDNN / NCCL status
class AutogradError : public Error { using Error::Error; };
class IOError : public Error { using Error::Error; };        // unreadable, unwritable or malformed file

namespace detail {

inline void stream_all(std::ostringstream&) {}
template <typename T, typename... Rest>
void stream_all(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  stream_all(os, rest...);
}

// Joins the arguments with operator<< into one string.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  stream_all(os, args...);
  return os.str();
}

}  // namespace detail
}  // namespace ska

// SKA_CHECK(cond, ExceptionType, message parts...): throws ExceptionType with the message when
// cond is false. The parts are streamed, so shapes and dtypes can be passed directly.
#define SKA_CHECK(cond, ExceptionType, ...)                               \
  do {                                                                    \
    if (!(cond)) throw ExceptionType(::ska::detail::str_cat(__VA_ARGS__)); \
  } while (0)

// SKA_FAIL(ExceptionType, message parts...): throws unconditionally.
#define SKA_FAIL(ExceptionType, ...) throw ExceptionType(::ska::detail::str_cat(__VA_ARGS__))
