// Byte-level helpers shared by the dataset readers: whole-file reads (plain or gzip) with IOErrors
// that name the file, and fixed-width integer loads in either byte order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ska::data {

// The whole file. IOError "<who>: cannot open '<path>' ..." when it cannot be read.
std::vector<uint8_t> read_file_bytes(const std::string& path, const std::string& who);

// The whole file through zlib's gz* API: gzip files are decompressed, other files read as they
// are. IOError naming the file and the uncompressed offset for a corrupt or truncated gzip
// stream, and when the contents exceed `max_bytes`.
std::vector<uint8_t> read_maybe_gzip(const std::string& path, const std::string& who,
                                     uint64_t max_bytes);

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
