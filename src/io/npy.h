// NumPy's .npy format (versions 1.0 and 2.0, C order): a magic string, a Python-dict header
// ({'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}) padded to 64 bytes, then raw data.
#pragma once

#include <string>

#include "core/tensor.h"

namespace ska {

// Reads a whole .npy file into a contiguous CPU tensor. Supported element types: float32,
// float64, int64 (little-endian) and uint8. Throws IOError naming the file for a bad magic
// string, an unsupported version, a malformed header, an unsupported dtype (big-endian or other
// kinds), Fortran order, a shape whose size overflows 64 bits, and data shorter or longer than
// the shape says (checked against the file size before the tensor is allocated).
Tensor read_npy(const std::string& path);

// Writes `tensor` (any device, any strides) as a C-order .npy file, version 1.0 (2.0 when the
// header does not fit in 64 KiB). Its dtype must be f32, f64, i64 or u8 (DTypeError otherwise).
// Written under a temporary name and renamed, so `path` never holds a half-written file.
void write_npy(const std::string& path, const Tensor& tensor);

}  // namespace ska
