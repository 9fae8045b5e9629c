// Whole-file reads for the dataset readers (see file_bytes.h): stdio for plain files, zlib's gz*
// API for files that may be gzip-compressed.
#include "data/datasets/file_bytes.h"

#include <cstdint>
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace ska::data {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

constexpr size_t kGzChunk = 1 << 20;

}  // namespace

std::vector<uint8_t> read_file_bytes(const std::string& path, const std::string& who) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  SKA_CHECK(file != nullptr, IOError, who, ": cannot open '", path,
            "' for reading: ", std::strerror(errno));
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  SKA_CHECK(!ec, IOError, who, ": cannot tell the size of '", path, "': ", ec.message());
  std::vector<uint8_t> bytes(size);
  const size_t got = size == 0 ? 0 : std::fread(bytes.data(), 1, size, file.get());
  SKA_CHECK(got == size, IOError, who, ": read ", got, " of the ", size, " bytes of '", path, "'");
  return bytes;
}

std::vector<uint8_t> read_maybe_gzip(const std::string& path, const std::string& who,
                                     uint64_t max_bytes) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  SKA_CHECK(file != nullptr, IOError, who, ": cannot open '", path,
            "' for reading: ", std::strerror(errno));
  std::vector<uint8_t> bytes;
  for (;;) {
    const size_t old = bytes.size();
    bytes.resize(old + kGzChunk);
    const int got = gzread(file.get(), bytes.data() + old, static_cast<unsigned>(kGzChunk));
    bytes.resize(old + (got > 0 ? static_cast<size_t>(got) : 0));
    int errnum = Z_OK;
    const char* message = gzerror(file.get(), &errnum);
    SKA_CHECK(errnum == Z_OK, IOError, who, ": '", path,
              "' is a corrupt or truncated gzip stream (zlib: ", message, ") after ", bytes.size(),
              " uncompressed bytes; expected a complete gzip file");
    SKA_CHECK(bytes.size() <= max_bytes, IOError, who, ": '", path, "' holds more than ", max_bytes,
              " bytes; expected at most that");
    if (got <= 0) break;
  }
  return bytes;
}

std::string first_existing_file(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return "";
}

}  // namespace ska::data
