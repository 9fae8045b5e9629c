// Crash-safe file writing: data goes to a temporary file beside the destination, is fsync'd, and
// replaces the destination by rename, so a kill at any moment leaves either the old or the new file.
#pragma once

#include <cstdint>
#include <string>

namespace ska::io {

class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);  // IOError when the temporary cannot be created
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary unless committed

  void write(const void* data, uint64_t bytes);
  // fsync, close, rename over the destination, then sync the directory entry.
  void commit();

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole of `bytes` written to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace ska::io
