// The MAT level-5 reader (see mat_file.h): element tags (long and small formats, 8-byte padding),
// miCOMPRESSED elements inflated with zlib, and miMATRIX sub-elements checked against each other.
#include "data/datasets/mat_file.h"

#include <cstdint>
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "data/datasets/file_bytes.h"

namespace ska::data {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the MAT reader copies little-endian values as they are");

namespace {

using detail::str_cat;
using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

constexpr size_t kHeaderBytes = 128;
constexpr int64_t kMaxElements = int64_t{1} << 40;
constexpr uint64_t kMaxInflateRatio = 1032;  // zlib's largest expansion of compressed bytes

// A byte range being parsed: the file itself or one decompressed element of it.
struct Region {
  Bytes bytes;
  const std::string* path;
  int64_t compressed_at = -1;  // file offset of the miCOMPRESSED element, or -1 for the file

  std::string where(size_t offset) const {
    if (compressed_at < 0) return str_cat("MAT file '", *path, "' offset ", offset);
    return str_cat("MAT file '", *path, "' compressed element at offset ", compressed_at,
                   ", uncompressed offset ", offset);
  }
  const uint8_t* at(size_t offset) const { return bytes->data() + offset; }
};

// One data element: its type, byte count, where its data starts and where the next one does.
struct Element {
  uint32_t type = 0;
  uint32_t nbytes = 0;
  size_t data = 0;
  size_t next = 0;
};

size_t pad8(size_t n) { return (n + 7) & ~size_t{7}; }

size_t mi_type_size(uint32_t type) {
  switch (type) {
    case kMiInt8:
    case kMiUInt8:
      return 1;
    case kMiInt16:
    case kMiUInt16:
      return 2;
    case kMiInt32:
    case kMiUInt32:
    case kMiSingle:
      return 4;
    case kMiDouble:
    case kMiInt64:
    case kMiUInt64:
      return 8;
    default:
      return 0;
  }
}

bool is_numeric_class(uint32_t mx_class) { return mx_class >= kMxDouble && mx_class <= kMxUInt64; }

// The element whose tag is at `pos`; its data must end by `end`.
Element read_element(const Region& r, size_t pos, size_t end) {
  SKA_CHECK(pos <= end && end - pos >= 8, IOError, r.where(pos),
            ": truncated data element tag; expected 8 bytes, ", pos <= end ? end - pos : 0,
            " left");
  const uint32_t w0 = load_le32(r.at(pos));
  Element e;
  if ((w0 >> 16) != 0) {  // small data element: type and size share the first word
    e.type = w0 & 0xffff;
    e.nbytes = w0 >> 16;
    SKA_CHECK(e.nbytes <= 4, IOError, r.where(pos), ": small data element claims ", e.nbytes,
              " bytes; expected at most 4");
    e.data = pos + 4;
    e.next = pos + 8;
    return e;
  }
  e.type = w0;
  e.nbytes = load_le32(r.at(pos + 4));
  e.data = pos + 8;
  SKA_CHECK(e.nbytes <= end - e.data, IOError, r.where(pos), ": element of type ", e.type,
            " claims ", e.nbytes, " bytes but only ", end - e.data,
            " remain; expected a complete element (truncated file?)");
  // Compressed elements are not padded; every other element is padded to 8 bytes.
  e.next = e.type == kMiCompressed ? e.data + e.nbytes : std::min(end, e.data + pad8(e.nbytes));
  return e;
}

// Reads the dims sub-element into `a` (dims and numel).
void read_dims(const Region& r, const Element& dims, MatArray* a) {
  SKA_CHECK(dims.type == kMiInt32 && dims.nbytes % 4 == 0 && dims.nbytes >= 8, IOError,
            r.where(dims.data), ": array dimensions: expected an miINT32 element of at least 2 ",
            "dims, got type ", dims.type, " of ", dims.nbytes, " bytes");
  a->numel = 1;
  for (size_t k = 0; k < dims.nbytes / 4; ++k) {
    int32_t d;
    std::memcpy(&d, r.at(dims.data + 4 * k), 4);
    SKA_CHECK(d >= 0, IOError, r.where(dims.data + 4 * k), ": dimension ", k, " is ", d,
              "; expected a non-negative size");
    a->dims.push_back(d);
    SKA_CHECK(d == 0 || a->numel <= kMaxElements / d, IOError, r.where(dims.data),
              ": array dimensions multiply to more than ", kMaxElements, " elements");
    a->numel *= d;
  }
}

// The real part of a numeric array: its size must agree with the dims.
void read_real_part(const Region& r, const Element& real, MatArray* a) {
  const size_t size = mi_type_size(real.type);
  SKA_CHECK(size > 0, IOError, r.where(real.data), ": real part of '", a->name, "' has type ",
            real.type, "; expected a numeric MAT data type");
  SKA_CHECK(real.nbytes == static_cast<uint64_t>(a->numel) * size, IOError, r.where(real.data),
            ": real part of '", a->name, "' holds ", real.nbytes, " bytes; expected ",
            a->numel * static_cast<int64_t>(size), " (", a->numel, " elements of ", size,
            " bytes)");
  a->has_data = true;
  a->data_type = real.type;
  a->buffer = r.bytes;
  a->data_offset = real.data;
}

MatArray parse_matrix(const Region& r, const Element& m) {
  const size_t end = m.data + m.nbytes;
  MatArray a;
  const Element flags = read_element(r, m.data, end);
  SKA_CHECK(flags.type == kMiUInt32 && flags.nbytes == 8, IOError, r.where(m.data),
            ": array flags: expected an miUINT32 element of 8 bytes, got type ", flags.type, " of ",
            flags.nbytes, " bytes");
  const uint32_t word = load_le32(r.at(flags.data));
  a.mx_class = word & 0xff;
  a.is_complex = (word & 0x800) != 0;
  const Element dims = read_element(r, flags.next, end);
  read_dims(r, dims, &a);
  const Element name = read_element(r, dims.next, end);
  SKA_CHECK(name.type == kMiInt8, IOError, r.where(dims.next),
            ": array name: expected an miINT8 element, got type ", name.type);
  a.name.assign(reinterpret_cast<const char*>(r.at(name.data)), name.nbytes);
  if (!is_numeric_class(a.mx_class)) return a;  // char, cell, struct, sparse, ...: not read
  read_real_part(r, read_element(r, name.next, end), &a);
  return a;
}

// Inflates into dst[0, n); returns the last zlib status. Throws for corrupt or short streams.
int inflate_exactly(z_stream* zs, uint8_t* dst, size_t n, size_t produced, uint64_t expected,
                    const Region& file, const Element& c) {
  zs->next_out = dst;
  zs->avail_out = static_cast<uInt>(n);
  int ret = Z_OK;
  while (zs->avail_out > 0 && ret == Z_OK) ret = inflate(zs, Z_NO_FLUSH);
  const size_t got = produced + (n - zs->avail_out);
  SKA_CHECK(ret == Z_OK || ret == Z_STREAM_END || ret == Z_BUF_ERROR, IOError, file.where(c.data),
            ": corrupt zlib stream in miCOMPRESSED element (zlib: ", zs->msg ? zs->msg : "error",
            ") after ", got, " uncompressed bytes; expected ", expected);
  SKA_CHECK(zs->avail_out == 0, IOError, file.where(c.data), ": zlib stream ",
            ret == Z_STREAM_END ? "ends" : "is truncated", " after ", got,
            " uncompressed bytes; expected ", expected, " (the miMATRIX element)");
  return ret;
}

struct InflateGuard {
  z_stream* zs;
  ~InflateGuard() { inflateEnd(zs); }
};

// The miMATRIX element inside a miCOMPRESSED element, decompressed into its own buffer.
Bytes inflate_element(const Region& file, const Element& c) {
  z_stream zs{};
  SKA_CHECK(inflateInit(&zs) == Z_OK, IOError, file.where(c.data), ": zlib inflateInit failed");
  InflateGuard guard{&zs};
  zs.next_in = const_cast<Bytef*>(file.at(c.data));
  zs.avail_in = c.nbytes;
  auto out = std::make_shared<std::vector<uint8_t>>(8);
  int ret = inflate_exactly(&zs, out->data(), 8, 0, 8, file, c);
  const uint32_t type = load_le32(out->data());
  const uint32_t nbytes = load_le32(out->data() + 4);
  SKA_CHECK(type == kMiMatrix, IOError, file.where(c.data), ": compressed element holds type ",
            type, "; expected miMATRIX (14)");
  SKA_CHECK(nbytes <= uint64_t{c.nbytes} * kMaxInflateRatio, IOError, file.where(c.data),
            ": compressed miMATRIX claims ", nbytes, " bytes, more than zlib can expand ", c.nbytes,
            " compressed bytes to");
  out->resize(8 + size_t{nbytes});
  if (nbytes > 0)
    ret = inflate_exactly(&zs, out->data() + 8, nbytes, 8, 8 + uint64_t{nbytes}, file, c);
  if (ret != Z_STREAM_END) {  // the stream must end right after the element
    uint8_t extra = 0;
    zs.next_out = &extra;
    zs.avail_out = 1;
    ret = inflate(&zs, Z_NO_FLUSH);
    SKA_CHECK(ret == Z_STREAM_END && zs.avail_out == 1, IOError, file.where(c.data),
              ": zlib stream ", zs.avail_out == 0 ? "holds more than" : "does not end after",
              " the ", 8 + uint64_t{nbytes}, "-byte miMATRIX element; expected a complete ",
              "stream of exactly that element");
  }
  return out;
}

MatArray parse_compressed(const Region& file, const Element& c, size_t pos) {
  Region inner{inflate_element(file, c), file.path, static_cast<int64_t>(pos)};
  const Element m = read_element(inner, 0, inner.bytes->size());
  return parse_matrix(inner, m);
}

void check_header(const std::vector<uint8_t>& bytes, const std::string& path) {
  SKA_CHECK(bytes.size() >= kHeaderBytes, IOError, "MAT file '", path, "' is ", bytes.size(),
            " bytes; expected at least the ", kHeaderBytes, "-byte MAT header");
  const uint8_t* endian = bytes.data() + 126;
  SKA_CHECK(!(endian[0] == 'M' && endian[1] == 'I'), IOError, "MAT file '", path,
            "' offset 126: big-endian MAT files are not supported; expected 'IM'");
  SKA_CHECK(endian[0] == 'I' && endian[1] == 'M', IOError, "MAT file '", path,
            "' offset 126: expected the endian indicator 'IM' of a MAT level-5 file");
  const uint16_t version = load_le16(bytes.data() + 124);
  SKA_CHECK(version == 0x0100, IOError, "MAT file '", path, "' offset 124: version 0x", std::hex,
            version, std::dec, "; expected 0x100 (MAT level 5; MATLAB 7.3 HDF5 files are not ",
            "supported, save with -v7)");
}

}  // namespace

double MatArray::value(int64_t index) const {
  const uint8_t* p = data() + index * static_cast<int64_t>(mi_type_size(data_type));
  auto load = [p](auto v) {
    std::memcpy(&v, p, sizeof(v));
    return static_cast<double>(v);
  };
  switch (data_type) {
    case kMiInt8:
      return load(int8_t{});
    case kMiUInt8:
      return load(uint8_t{});
    case kMiInt16:
      return load(int16_t{});
    case kMiUInt16:
      return load(uint16_t{});
    case kMiInt32:
      return load(int32_t{});
    case kMiUInt32:
      return load(uint32_t{});
    case kMiSingle:
      return load(float{});
    case kMiDouble:
      return load(double{});
    case kMiInt64:
      return load(int64_t{});
    case kMiUInt64:
      return load(uint64_t{});
    default:
      SKA_FAIL(ValueError, "MatArray::value: '", name, "' has no numeric data");
  }
}

std::vector<MatArray> read_mat_file(const std::string& path) {
  auto bytes = std::make_shared<const std::vector<uint8_t>>(read_file_bytes(path, "MAT file"));
  check_header(*bytes, path);
  const Region file{bytes, &path, -1};
  std::vector<MatArray> arrays;
  for (size_t pos = kHeaderBytes; pos < bytes->size();) {
    const Element e = read_element(file, pos, bytes->size());
    if (e.type == kMiCompressed) {
      arrays.push_back(parse_compressed(file, e, pos));
    } else {
      SKA_CHECK(e.type == kMiMatrix, IOError, file.where(pos), ": data element of type ", e.type,
                "; expected miMATRIX (14) or miCOMPRESSED (15)");
      arrays.push_back(parse_matrix(file, e));
    }
    pos = e.next;
  }
  return arrays;
}

const MatArray* find_mat_array(const std::vector<MatArray>& arrays, const std::string& name) {
  for (const MatArray& a : arrays) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

const char* mat_class_name(uint32_t mx_class) {
  static const char* const kNames[] = {"unknown", "cell",   "struct", "object", "char",  "sparse",
                                       "double",  "single", "int8",   "uint8",  "int16", "uint16",
                                       "int32",   "uint32", "int64",  "uint64"};
  return mx_class < 16 ? kNames[mx_class] : "unknown";
}

}  // namespace ska::data
