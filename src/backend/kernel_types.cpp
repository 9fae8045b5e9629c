// Names of the op enums, for error messages and benchmarks.
#include "backend/kernel_types.h"

namespace ska {

const char* unary_op_name(UnaryOp op) {
  static const char* const kNames[] = {"neg",  "abs",        "exp",          "log",  "sqrt",
                                       "rsqrt", "reciprocal", "sigmoid",      "tanh", "relu",
                                       "gelu",  "gelu_tanh",  "quick_gelu",   "squared_relu",
                                       "silu",  "affine",     "pow"};
  return kNames[static_cast<int>(op)];
}

const char* binary_op_name(BinaryOp op) {
  static const char* const kNames[] = {"add", "sub", "mul", "div", "maximum", "minimum",
                                       "eq",  "ne",  "lt",  "le",  "gt",      "ge"};
  return kNames[static_cast<int>(op)];
}

const char* reduce_op_name(ReduceOp op) {
  static const char* const kNames[] = {"sum", "mean", "max", "min"};
  return kNames[static_cast<int>(op)];
}

}  // namespace ska
