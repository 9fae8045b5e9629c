// Byte-level helpers shared by the dataset readers: whole-file and piecewise (plain or gzip) reads
// with IOErrors that name the file, and fixed-width integer loads in either byte order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct gzFile_s;  // zlib's stream type (zlib.h)

namespace ska::data {

// The whole file. IOError "<who>: cannot open '<path>' ..." when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::string& path, const std::string& who);

// A file read through zlib's gz* API, piece by piece: gzip files are decompressed, other files
// read as they are. Readers check a header before deciding how much more to read, so a small
// gzip bomb never expands further than its header announces.
class GzipReader {
 public:
  // IOError "<who>: cannot open '<path>' ..." when the file cannot be opened.
  GzipReader(const std::string& path, const std::string& who);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Appends up to `n` bytes to `out` (fewer only at the end of the stream), growing it as data
  // arrives rather than by `n` up front; returns how many were read. IOError naming the file and
  // the uncompressed offset for a corrupt or truncated gzip stream.
  size_t read(std::vector<uint8_t>& out, uint64_t n);
  uint64_t offset() const { return offset_; }  // uncompressed bytes read so far
  bool compressed() const;                       // false for a plain file (after a first read)

 private:
  std::string path_, who_;
  ::gzFile_s* file_ = nullptr;
  uint64_t offset_ = 0;
};

// The first of `paths` that is a regular file, or "" when none is.
std::string first_existing_file(const std::vector<std::string>& paths);

inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) | (uint32_t{p[3]} << 24);
}
inline uint16_t load_le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

}  // namespace ska::data
