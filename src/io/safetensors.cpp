// Reading and writing safetensors files (see safetensors.h): header validation with errors that
// name the file and the tensor, direct reads into tensor storage, and atomic writes.
#include "io/safetensors.h"

#include "io/atomic_file.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/checked_math.h"

namespace ska {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian data; this reader copies bytes as they are");

namespace {

using Json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the limit of the reference implementation
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kKnownDTypes = "F32, F64, BF16, F16, I64, I32, U8";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::kF32, "F32"}, {DType::kF64, "F64"}, {DType::kBF16, "BF16"}, {DType::kF16, "F16"},
    {DType::kI64, "I64"}, {DType::kI32, "I32"}, {DType::kU8, "U8"},
};

bool find_dtype(const std::string& name, DType* dtype) {
  for (const DTypeName& entry : kDTypeNames) {
    if (name == entry.name) {
      *dtype = entry.dtype;
      return true;
    }
  }
  return false;
}

// One tensor's entry of the header, validated against the data section.
struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// --- Reading ---

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

FilePtr open_for_reading(const std::string& path) {
  FilePtr file(std::fopen(path.c_str(), "rb"));
  SKA_CHECK(file != nullptr, IOError, "safetensors: cannot open '", path,
            "' for reading: ", std::strerror(errno));
  return file;
}

uint64_t file_size(std::FILE* file, const std::string& path) {
  SKA_CHECK(fseeko(file, 0, SEEK_END) == 0, IOError, "safetensors: cannot seek in '", path, "'");
  const off_t size = ftello(file);
  SKA_CHECK(size >= 0, IOError, "safetensors: cannot tell the size of '", path, "'");
  return static_cast<uint64_t>(size);
}

void read_exactly(std::FILE* file, uint64_t offset, void* dst, uint64_t bytes,
                  const std::string& path, const std::string& what) {
  if (bytes == 0) return;
  const bool ok = fseeko(file, static_cast<off_t>(offset), SEEK_SET) == 0 &&
                  std::fread(dst, 1, bytes, file) == bytes;
  SKA_CHECK(ok, IOError, "safetensors: '", path, "': cannot read ", bytes, " bytes of ", what,
            " at offset ", offset, " (file truncated or unreadable)");
}

uint64_t read_header_length(std::FILE* file, uint64_t size, const std::string& path) {
  SKA_CHECK(size >= 8, IOError, "safetensors: '", path, "' is truncated: ", size,
            " bytes, expected at least the 8-byte header length");
  unsigned char bytes[8];
  read_exactly(file, 0, bytes, 8, path, "the header length");
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | bytes[i];
  SKA_CHECK(length <= size - 8, IOError, "safetensors: '", path, "': header length ", length,
            " goes beyond the file size (", size,
            " bytes); the file is truncated or not safetensors");
  SKA_CHECK(length <= kMaxHeaderBytes, IOError, "safetensors: '", path, "': header length ", length,
            " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  return length;
}

Json parse_header(const std::string& text, const std::string& path) {
  Json header;
  try {
    header = Json::parse(text);
  } catch (const Json::exception& e) {
    SKA_FAIL(IOError, "safetensors: '", path, "': the header is not valid JSON: ", e.what());
  }
  SKA_CHECK(header.is_object(), IOError, "safetensors: '", path,
            "': the header must be a JSON object, got ", header.type_name());
  return header;
}

uint64_t json_to_count(const Json& value, const std::string& path, const std::string& name,
                       const char* field) {
  SKA_CHECK(value.is_number_unsigned(), IOError, "safetensors: '", path, "': tensor '", name,
            "': ", field, " must hold non-negative integers, got ", value.dump());
  return value.get<uint64_t>();
}

DType entry_dtype(const Json& spec, const std::string& path, const std::string& name) {
  SKA_CHECK(spec.contains("dtype") && spec["dtype"].is_string(), IOError, "safetensors: '", path,
            "': tensor '", name, "' has no \"dtype\" string");
  const std::string text = spec["dtype"].get<std::string>();
  DType dtype;
  SKA_CHECK(find_dtype(text, &dtype), IOError, "safetensors: '", path, "': tensor '", name,
            "' has unknown or unsupported dtype '", text, "'; expected one of ", kKnownDTypes);
  return dtype;
}

Shape entry_shape(const Json& spec, const std::string& path, const std::string& name) {
  SKA_CHECK(spec.contains("shape") && spec["shape"].is_array(), IOError, "safetensors: '", path,
            "': tensor '", name, "' has no \"shape\" array");
  Shape shape;
  for (const Json& dim : spec["shape"]) {
    const uint64_t count = json_to_count(dim, path, name, "shape");
    SKA_CHECK(count <= static_cast<uint64_t>(INT64_MAX), IOError, "safetensors: '", path,
              "': tensor '", name, "' has shape entry ", count, " beyond a 64-bit integer");
    shape.push_back(static_cast<int64_t>(count));
  }
  return shape;
}

// Bytes that `shape` of `dtype` occupies; throws when that overflows 64 bits.
uint64_t shape_bytes(const Shape& shape, DType dtype, const std::string& path,
                     const std::string& name) {
  return static_cast<uint64_t>(checked_nbytes<IOError>(shape, static_cast<int64_t>(dtype_size(dtype)),
                                                       "safetensors: '", path, "': tensor '", name,
                                                       "'"));
}

TensorEntry parse_entry(const std::string& name, const Json& spec, uint64_t data_bytes,
                        const std::string& path) {
  SKA_CHECK(spec.is_object(), IOError, "safetensors: '", path, "': tensor '", name,
            "' must be a JSON object, got ", spec.dump());
  TensorEntry entry{name, entry_dtype(spec, path, name), entry_shape(spec, path, name), 0, 0};
  const bool has_offsets = spec.contains("data_offsets") && spec["data_offsets"].is_array() &&
                           spec["data_offsets"].size() == 2;
  SKA_CHECK(has_offsets, IOError, "safetensors: '", path, "': tensor '", name,
            "' needs \"data_offsets\": [begin, end]");
  entry.begin = json_to_count(spec["data_offsets"][0], path, name, "data_offsets");
  entry.end = json_to_count(spec["data_offsets"][1], path, name, "data_offsets");
  SKA_CHECK(entry.begin <= entry.end, IOError, "safetensors: '", path, "': tensor '", name,
            "' has data_offsets [", entry.begin, ", ", entry.end, "] that end before they begin");
  SKA_CHECK(entry.end <= data_bytes, IOError, "safetensors: '", path, "': tensor '", name,
            "' has data_offsets [", entry.begin, ", ", entry.end,
            "] out of range: the data section holds ", data_bytes, " bytes");
  const uint64_t expected = shape_bytes(entry.shape, entry.dtype, path, name);
  SKA_CHECK(entry.end - entry.begin == expected, IOError, "safetensors: '", path, "': tensor '",
            name, "' has data_offsets [", entry.begin, ", ", entry.end, "] spanning ",
            entry.end - entry.begin, " bytes, but shape ", shape_str(entry.shape), " of ",
            safetensors_dtype_name(entry.dtype), " needs ", expected, " bytes");
  return entry;
}

StringMap parse_metadata(const Json& value, const std::string& path) {
  SKA_CHECK(value.is_object(), IOError, "safetensors: '", path,
            "': \"__metadata__\" must be an object of strings, got ", value.dump());
  StringMap metadata;
  for (const auto& item : value.items()) {
    SKA_CHECK(item.value().is_string(), IOError, "safetensors: '", path, "': metadata key '",
              item.key(), "' must map to a string, got ", item.value().dump());
    metadata[item.key()] = item.value().get<std::string>();
  }
  return metadata;
}

// Entries sorted by their offsets; throws if two of them share bytes or if the data section holds
// bytes after the last tensor.
std::vector<TensorEntry> sorted_without_overlap(std::vector<TensorEntry> entries,
                                                uint64_t data_bytes, const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const TensorEntry* last = nullptr;  // the non-empty entry that ends furthest so far
  for (const TensorEntry& cur : entries) {
    if (cur.begin == cur.end) continue;  // empty tensors occupy no bytes
    SKA_CHECK(last == nullptr || cur.begin >= last->end, IOError, "safetensors: '", path,
              "': tensors '", last->name, "' [", last->begin, ", ", last->end, ") and '", cur.name,
              "' [", cur.begin, ", ", cur.end, ") have overlapping data_offsets");
    last = &cur;
  }
  const uint64_t used = last == nullptr ? 0 : last->end;
  SKA_CHECK(used == data_bytes, IOError, "safetensors: '", path, "': the data section holds ",
            data_bytes, " bytes but its tensors end at byte ", used, "; expected no trailing bytes");
  return entries;
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const DTypeName& entry : kDTypeNames) {
    if (entry.dtype == dtype) return entry.name;
  }
  SKA_FAIL(DTypeError, "safetensors: dtype ", dtype_name(dtype), " has no safetensors name");
}

DType safetensors_dtype_from_name(const std::string& name) {
  DType dtype;
  SKA_CHECK(find_dtype(name, &dtype), IOError, "safetensors: unknown or unsupported dtype '", name,
            "'; expected one of ", kKnownDTypes);
  return dtype;
}

SafetensorsContents read_safetensors(const std::string& path) {
  FilePtr file = open_for_reading(path);
  const uint64_t size = file_size(file.get(), path);
  const uint64_t header_bytes = read_header_length(file.get(), size, path);
  std::string text(header_bytes, '\0');
  read_exactly(file.get(), 8, text.data(), header_bytes, path, "the JSON header");
  const Json header = parse_header(text, path);

  const uint64_t data_start = 8 + header_bytes;
  const uint64_t data_bytes = size - data_start;
  SafetensorsContents contents;
  std::vector<TensorEntry> entries;
  for (const auto& item : header.items()) {
    if (item.key() == kMetadataKey) {
      contents.metadata = parse_metadata(item.value(), path);
    } else {
      entries.push_back(parse_entry(item.key(), item.value(), data_bytes, path));
    }
  }
  for (const TensorEntry& entry : sorted_without_overlap(std::move(entries), data_bytes, path)) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
    read_exactly(file.get(), data_start + entry.begin, tensor.data_ptr(), entry.end - entry.begin,
                 path, "tensor '" + entry.name + "'");
    contents.tensors.emplace(entry.name, std::move(tensor));
  }
  return contents;
}

TensorMap load_safetensors(const std::string& path) { return read_safetensors(path).tensors; }

// --- Writing ---

namespace {

// A temporary file beside the destination that is removed unless committed.

// Contiguous host copies of the tensors (no copy for tensors that already are).
TensorMap host_contiguous(const TensorMap& tensors, const std::string& path) {
  TensorMap host;
  for (const auto& [name, tensor] : tensors) {
    SKA_CHECK(name != kMetadataKey, ValueError, "safetensors: '", path, "': '", kMetadataKey,
              "' is reserved and cannot name a tensor");
    SKA_CHECK(tensor.defined(), ValueError, "safetensors: '", path, "': tensor '", name,
              "' is undefined");
    safetensors_dtype_name(tensor.dtype());  // throws for a dtype the format cannot hold
    host.emplace(name, tensor.detach().to(Device::cpu()).contiguous());
  }
  return host;
}

// The JSON header padded with spaces to a multiple of 8 bytes (keeps the data aligned).
std::string make_header(const TensorMap& host, const StringMap& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : host) {
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(tensor.dtype())},
                    {"shape", tensor.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const StringMap& metadata) {
  const TensorMap host = host_contiguous(tensors, path);
  const std::string header = make_header(host, metadata);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));

  io::AtomicFile file(path);
  file.write(length, 8);
  file.write(header.data(), header.size());
  for (const auto& item : host) {
    const Tensor& tensor = item.second;
    file.write(tensor.data_ptr(), static_cast<uint64_t>(tensor.numel()) * tensor.element_size());
  }
  file.commit();
}

}  // namespace ska
