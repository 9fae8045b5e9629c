// Overflow-checked int64 arithmetic for sizes computed from input (file headers, shapes, configs):
// a typed error naming what was being computed instead of a wrapped or undefined result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/shape.h"

namespace ska {

// A shape to stream into an error message only when it is raised (the `what` parts below): found
// by argument-dependent lookup, which a bare Shape (a std::vector) is not.
struct ShapeText {
  const Shape& shape;
};
inline std::ostream& operator<<(std::ostream& os, ShapeText s) { return os << shape_str(s.shape); }

// The value of `text` when it is a non-empty run of decimal digits (nothing else) not above
// `max`; nullopt otherwise (std::stoll's exceptions, overflow included, never escape).
inline std::optional<int64_t> parse_decimal(const std::string& text, int64_t max = INT64_MAX) {
  if (text.empty()) return std::nullopt;
  int64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, c - '0', &value)) {
      return std::nullopt;
    }
    if (value > max) return std::nullopt;
  }
  return value;
}

// a * b. Throws E "<what...>: a x b overflows a 64-bit integer" when it does not fit. The parts
// of `what` are streamed only on failure, so this is cheap on hot paths.
template <typename E = ValueError, typename... What>
int64_t checked_mul(int64_t a, int64_t b, const What&... what) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    SKA_FAIL(E, what..., ": ", a, " x ", b, " overflows a 64-bit integer");
  }
  return out;
}

// a + b, with the same error as checked_mul for an overflow.
template <typename E = ValueError, typename... What>
int64_t checked_add(int64_t a, int64_t b, const What&... what) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    SKA_FAIL(E, what..., ": ", a, " + ", b, " overflows a 64-bit integer");
  }
  return out;
}

// The product of `dims` (0 when any dim is 0, whatever the others). Throws E "<what...>: shape
// [..] has a negative dim" / "... has more elements than a 64-bit integer holds".
template <typename E = ValueError, typename... What>
int64_t checked_numel(const Shape& dims, const What&... what) {
  bool has_zero = false;
  for (int64_t d : dims) {
    if (d < 0) SKA_FAIL(E, what..., ": shape ", shape_str(dims), " has a negative dim");
    has_zero = has_zero || d == 0;
  }
  if (has_zero) return 0;
  int64_t n = 1;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(n, d, &n)) {
      SKA_FAIL(E, what..., ": shape ", shape_str(dims),
               " has more elements than a 64-bit integer holds");
    }
  }
  return n;
}

// checked_numel(dims) * element_size: the bytes a tensor of that shape occupies.
template <typename E = ValueError, typename... What>
int64_t checked_nbytes(const Shape& dims, int64_t element_size, const What&... what) {
  return checked_mul<E>(checked_numel<E>(dims, what...), element_size, what..., ": shape ",
                        ShapeText{dims}, " in bytes");
}

}  // namespace ska
