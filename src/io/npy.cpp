// Reading and writing NumPy .npy files (see npy.h): header parsing and validation with errors that
// name the file, and atomic writes.
#include "io/npy.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/checked_math.h"
#include "io/atomic_file.h"

namespace ska {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy reader copies little-endian data as it is");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;
constexpr size_t kAlignment = 64;  // NumPy pads the header so the data starts 64-byte aligned
constexpr const char* kSupported = "'<f4' (float32), '<f8' (float64), '<i8' (int64), '|u1' (uint8)";

struct NpyDType {
  DType dtype;
  const char* descr;
};
// '<' (little-endian) and '=' (native, little-endian here) are accepted when reading; '|' means
// "not applicable" for one-byte types. We always write the canonical form.
constexpr NpyDType kNpyDTypes[] = {
    {DType::kF32, "<f4"}, {DType::kF64, "<f8"}, {DType::kI64, "<i8"}, {DType::kU8, "|u1"}};

bool dtype_from_descr(std::string descr, DType* dtype) {
  if (descr.size() == 3 && descr[0] == '=') descr[0] = '<';
  if (descr == "<u1" || descr == "=u1") descr = "|u1";
  for (const NpyDType& entry : kNpyDTypes) {
    if (descr == entry.descr) {
      *dtype = entry.dtype;
      return true;
    }
  }
  return false;
}

const char* descr_of(DType dtype) {
  for (const NpyDType& entry : kNpyDTypes) {
    if (entry.dtype == dtype) return entry.descr;
  }
  SKA_FAIL(DTypeError, "write_npy: dtype ", dtype_name(dtype),
           " has no .npy writer; supported: f32, f64, i64, u8");
}

// --- Header parsing: the Python literal NumPy writes, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }

struct Header {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

[[noreturn]] void fail_header(const std::string& path, const std::string& header,
                              const std::string& why) {
  SKA_FAIL(IOError, path, ": malformed .npy header (", why, "): ", header);
}

// The text right after `'key':` (skipping spaces); fails when the key is absent.
size_t value_start(const std::string& path, const std::string& header, const std::string& key) {
  const std::string quoted = "'" + key + "'";
  size_t pos = header.find(quoted);
  if (pos == std::string::npos) fail_header(path, header, "no '" + key + "' entry");
  pos = header.find(':', pos + quoted.size());
  if (pos == std::string::npos) fail_header(path, header, "no ':' after '" + key + "'");
  pos = header.find_first_not_of(' ', pos + 1);
  if (pos == std::string::npos) fail_header(path, header, "no value for '" + key + "'");
  return pos;
}

std::string parse_descr(const std::string& path, const std::string& header) {
  const size_t start = value_start(path, header, "descr");
  const char quote = header[start];
  if (quote != '\'' && quote != '"') {
    fail_header(path, header, "'descr' is not a string (structured dtypes are not supported)");
  }
  const size_t end = header.find(quote, start + 1);
  if (end == std::string::npos) fail_header(path, header, "unterminated 'descr'");
  return header.substr(start + 1, end - start - 1);
}

bool parse_fortran_order(const std::string& path, const std::string& header) {
  const size_t start = value_start(path, header, "fortran_order");
  if (header.compare(start, 4, "True") == 0) return true;
  if (header.compare(start, 5, "False") == 0) return false;
  fail_header(path, header, "'fortran_order' is neither True nor False");
}

Shape parse_shape(const std::string& path, const std::string& header) {
  const size_t start = value_start(path, header, "shape");
  if (header[start] != '(') fail_header(path, header, "'shape' is not a tuple");
  const size_t end = header.find(')', start);
  if (end == std::string::npos) fail_header(path, header, "unterminated 'shape'");
  Shape shape;
  std::stringstream items(header.substr(start + 1, end - start - 1));
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t first = item.find_first_not_of(' ');
    if (first == std::string::npos) continue;  // the trailing comma of (3,)
    const size_t last = item.find_last_not_of(" L");  // Python 2 wrote 3L
    const std::string digits = item.substr(first, last - first + 1);
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
      fail_header(path, header, "shape entry '" + item + "' is not a non-negative integer");
    }
    int64_t dim = 0;
    for (char digit : digits) {
      dim = checked_add<IOError>(checked_mul<IOError>(dim, 10, path, ": .npy shape entry ", digits),
                                 digit - '0', path, ": .npy shape entry ", digits);
    }
    shape.push_back(dim);
  }
  return shape;
}

Header parse_header(const std::string& path, const std::string& header) {
  Header parsed;
  parsed.descr = parse_descr(path, header);
  parsed.fortran_order = parse_fortran_order(path, header);
  parsed.shape = parse_shape(path, header);
  return parsed;
}

// --- Reading ---

std::string read_exactly(std::ifstream& in, size_t bytes, const std::string& path,
                         const char* what) {
  std::string buffer(bytes, '\0');
  in.read(buffer.data(), static_cast<std::streamsize>(bytes));
  SKA_CHECK(static_cast<size_t>(in.gcount()) == bytes, IOError, path, ": truncated .npy file (",
            what, ": expected ", bytes, " bytes, got ", in.gcount(), ")");
  return buffer;
}

uint32_t little_endian(const std::string& bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

// `file_size` bounds the header length before a buffer of that length is made.
std::string read_header_text(std::ifstream& in, const std::string& path, uint64_t file_size) {
  const std::string magic = read_exactly(in, kMagicBytes + 2, path, "magic and version");
  SKA_CHECK(magic.compare(0, kMagicBytes, kMagic, kMagicBytes) == 0, IOError, path,
            ": not a .npy file (bad magic string; expected \\x93NUMPY)");
  const int major = static_cast<unsigned char>(magic[kMagicBytes]);
  const int minor = static_cast<unsigned char>(magic[kMagicBytes + 1]);
  SKA_CHECK((major == 1 || major == 2) && minor == 0, IOError, path, ": unsupported .npy version ",
            major, ".", minor, " (supported: 1.0, 2.0)");
  const size_t length_bytes = major == 1 ? 2 : 4;
  const uint32_t header_bytes = little_endian(read_exactly(in, length_bytes, path, "header length"));
  const uint64_t left = file_size - kMagicBytes - 2 - length_bytes;
  SKA_CHECK(header_bytes <= left, IOError, path, ": truncated .npy file (header: expected ",
            header_bytes, " bytes, the file has ", left, " left)");
  return read_exactly(in, header_bytes, path, "header");
}

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SKA_CHECK(in.good(), IOError, path, ": cannot open .npy file: ", std::strerror(errno));
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  SKA_CHECK(!ec, IOError, path, ": cannot tell the size of the .npy file: ", ec.message());
  const std::string header_text = read_header_text(in, path, file_size);
  const Header header = parse_header(path, header_text);
  DType dtype;
  SKA_CHECK(dtype_from_descr(header.descr, &dtype), IOError, path, ": unsupported .npy dtype '",
            header.descr, "'; supported: ", kSupported);
  SKA_CHECK(!header.fortran_order, IOError, path,
            ": Fortran-order .npy arrays are not supported (save with np.ascontiguousarray)");
  // The size the header asks for, checked against the bytes the file has before allocating it.
  const uint64_t data_bytes = static_cast<uint64_t>(checked_nbytes<IOError>(
      header.shape, static_cast<int64_t>(dtype_size(dtype)), path, ": .npy header"));
  const uint64_t left = file_size - static_cast<uint64_t>(in.tellg());
  SKA_CHECK(data_bytes <= left, IOError, path, ": truncated .npy data (shape ",
            shape_str(header.shape), " ", dtype_name(dtype), " needs ", data_bytes,
            " bytes, the file has ", left, ")");
  Tensor tensor = Tensor::empty(header.shape, dtype);
  in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(data_bytes));
  SKA_CHECK(static_cast<uint64_t>(in.gcount()) == data_bytes, IOError, path,
            ": truncated .npy data (shape ", shape_str(header.shape), " ", dtype_name(dtype),
            " needs ", data_bytes, " bytes, the file has ", in.gcount(), ")");
  SKA_CHECK(in.peek() == std::char_traits<char>::eof(), IOError, path,
            ": trailing bytes after the .npy data of shape ", shape_str(header.shape));
  return tensor;
}

namespace {

std::string header_text(DType dtype, const Shape& shape) {
  // Python's tuple syntax: "()", "(3,)", "(2, 3)".
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";
  return std::string("{'descr': '") + descr_of(dtype) + "', 'fortran_order': False, 'shape': (" +
         dims + "), }";
}

// The magic, version, header length and the space-padded header ending in '\n'.
std::string preamble(DType dtype, const Shape& shape) {
  std::string header = header_text(dtype, shape);
  const bool version1 = kMagicBytes + 2 + 2 + header.size() + 1 <= 65535;
  const size_t fixed = kMagicBytes + 2 + (version1 ? 2 : 4);
  const size_t padded = (fixed + header.size() + 1 + kAlignment - 1) / kAlignment * kAlignment;
  header.append(padded - fixed - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicBytes);
  out.push_back(static_cast<char>(version1 ? 1 : 2));
  out.push_back('\0');
  for (size_t i = 0; i < (version1 ? 2u : 4u); ++i) {
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  }
  return out + header;
}

}  // namespace

void write_npy(const std::string& path, const Tensor& tensor) {
  const std::string head = preamble(tensor.dtype(), tensor.shape());
  const Tensor host = tensor.detach().to(Device::cpu()).contiguous();
  SKA_CHECK(!std::filesystem::is_directory(path), IOError, path,
            ": is a folder; expected the path of the .npy file to write");
  // A temporary beside it, renamed into place once complete; removed on any failure.
  io::AtomicFile file(path);
  file.write(head.data(), head.size());
  file.write(host.data_ptr(), static_cast<uint64_t>(host.numel()) * host.element_size());
  file.commit();
}

}  // namespace ska
