// The safetensors file format: an 8-byte little-endian header length, a JSON header (dtype, shape,
// data_offsets per tensor, optional __metadata__), then the raw little-endian tensor bytes.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace ska {

using TensorMap = std::map<std::string, Tensor>;
using StringMap = std::map<std::string, std::string>;

struct SafetensorsContents {
  TensorMap tensors;   // contiguous CPU tensors, by name
  StringMap metadata;  // the optional "__metadata__" entry (string -> string)
};

// Reads and validates a whole file. Throws IOError naming the file (and the tensor, when one is at
// fault) for unreadable or truncated files, a header longer than the file, malformed JSON, unknown
// dtypes, shapes whose size overflows, data_offsets that are out of range, overlapping, or
// disagree with shape and dtype, and bytes after the last tensor.
SafetensorsContents read_safetensors(const std::string& path);
TensorMap load_safetensors(const std::string& path);  // the tensors of read_safetensors

// Writes `tensors` (any device, any dtype, any strides; stored contiguous in their own dtype) and
// `metadata`. The file is written under a temporary name in the same directory, flushed, synced
// and renamed over `path`, so a crash never leaves a half-written file at `path`.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const StringMap& metadata = {});

// The safetensors name of a dtype ("F32", "BF16", ...) and its inverse (throws IOError for
// names outside F32, F64, BF16, F16, I64, I32, U8).
const char* safetensors_dtype_name(DType dtype);
DType safetensors_dtype_from_name(const std::string& name);

}  // namespace ska
