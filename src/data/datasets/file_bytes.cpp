// File reads for the dataset readers (see file_bytes.h): stdio for whole plain files, zlib's gz*
// API, a piece at a time, for files that may be gzip-compressed.
#include "data/datasets/file_bytes.h"

#include <cstdint>
#include <zlib.h>

#include <algorithm>
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

GzipReader::GzipReader(const std::string& path, const std::string& who)
    : path_(path), who_(who), file_(gzopen(path.c_str(), "rb")) {
  SKA_CHECK(file_ != nullptr, IOError, who, ": cannot open '", path,
            "' for reading: ", std::strerror(errno));
}

GzipReader::~GzipReader() { gzclose(file_); }

bool GzipReader::compressed() const { return gzdirect(file_) == 0; }

size_t GzipReader::read(std::vector<uint8_t>& out, uint64_t n) {
  const size_t start = out.size();
  uint64_t left = n;
  while (left > 0) {
    const size_t old = out.size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(left, kGzChunk));
    out.resize(old + want);
    const int got = gzread(file_, out.data() + old, static_cast<unsigned>(want));
    out.resize(old + (got > 0 ? static_cast<size_t>(got) : 0));
    offset_ += got > 0 ? static_cast<uint64_t>(got) : 0;
    int errnum = Z_OK;
    const char* message = gzerror(file_, &errnum);
    SKA_CHECK(errnum == Z_OK, IOError, who_, ": '", path_,
              "' is a corrupt or truncated gzip stream (zlib: ", message, ") after ", offset_,
              " uncompressed bytes; expected a complete gzip file");
    if (got <= 0) break;
    left -= static_cast<uint64_t>(got);
  }
  return out.size() - start;
}

std::string first_existing_file(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec)) return p;
  }
  return "";
}

}  // namespace ska::data
