// MATLAB level-5 MAT files (the format of SVHN's *_32x32.mat): a 128-byte header, then data
// elements, miMATRIX arrays either as they are or wrapped in zlib-compressed miCOMPRESSED elements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ska::data {

// MAT data types (mi*) and array classes (mx*) this reader knows by value.
enum MatDataType : uint32_t {
  kMiInt8 = 1,
  kMiUInt8 = 2,
  kMiInt16 = 3,
  kMiUInt16 = 4,
  kMiInt32 = 5,
  kMiUInt32 = 6,
  kMiSingle = 7,
  kMiDouble = 9,
  kMiInt64 = 12,
  kMiUInt64 = 13,
  kMiMatrix = 14,
  kMiCompressed = 15,
  kMiUtf8 = 16,
};
enum MatClass : uint32_t { kMxDouble = 6, kMxSingle = 7, kMxUInt8 = 9, kMxUInt64 = 15 };

// One top-level variable. Numeric arrays (classes double .. uint64) carry their real part as
// stored; other classes (char, cell, struct, sparse, ...) only their name, class and dims.
struct MatArray {
  std::string name;
  uint32_t mx_class = 0;
  bool is_complex = false;
  bool has_data = false;      // a numeric class whose real part was read
  std::vector<int64_t> dims;  // MATLAB order: column-major, first index fastest
  uint32_t data_type = 0;     // mi type of the real part (may differ from the class)
  int64_t numel = 0;
  std::shared_ptr<const std::vector<uint8_t>> buffer;  // owns the bytes below
  size_t data_offset = 0;                              // the real part within *buffer

  const uint8_t* data() const { return buffer->data() + data_offset; }
  double value(int64_t index) const;  // element `index` of the real part, as a double
};

// Reads every top-level variable of `path`. IOError naming the file, the offset (and, inside a
// compressed element, the uncompressed offset) and what was expected for: a bad header (level
// 7.3 / HDF5 and big-endian files are refused with that said), a truncated element, an unknown
// element type, a corrupt or short zlib stream, malformed array sub-elements (flags, dims, name),
// or a real part whose size disagrees with the dims.
std::vector<MatArray> read_mat_file(const std::string& path);

// The variable named `name`, or nullptr.
const MatArray* find_mat_array(const std::vector<MatArray>& arrays, const std::string& name);

// "double", "uint8", ... for messages.
const char* mat_class_name(uint32_t mx_class);

}  // namespace ska::data
