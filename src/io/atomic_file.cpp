// AtomicFile: temporary file, fsync, rename, directory sync.
#include "io/atomic_file.h"

#include <cstdint>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace ska::io {

AtomicFile::AtomicFile(const std::string& path) : path_(path), temp_(path + ".tmp.XXXXXX") {
  fd_ = mkstemp(temp_.data());
  SKA_CHECK(fd_ >= 0, IOError, "cannot create a temporary file beside '", path,
            "': ", std::strerror(errno));
  fchmod(fd_, 0644);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(temp_.c_str());
}

void AtomicFile::write(const void* data, uint64_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, std::min<uint64_t>(bytes, 1ull << 30));
    if (n < 0 && errno == EINTR) continue;
    SKA_CHECK(n > 0, IOError, "writing '", temp_, "' (for '", path_, "') failed: ",
              std::strerror(errno));
    p += n;
    bytes -= static_cast<uint64_t>(n);
  }
}

void AtomicFile::commit() {
  SKA_CHECK(fsync(fd_) == 0, IOError, "fsync of '", temp_, "' failed: ", std::strerror(errno));
  const int rc = close(fd_);
  fd_ = -1;
  SKA_CHECK(rc == 0, IOError, "closing '", temp_, "' failed: ", std::strerror(errno));
  SKA_CHECK(std::rename(temp_.c_str(), path_.c_str()) == 0, IOError, "renaming '", temp_,
            "' to '", path_, "' failed: ", std::strerror(errno));
  committed_ = true;
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dir_fd < 0) return;  // best effort: the data itself is already synced
  fsync(dir_fd);
  close(dir_fd);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

}  // namespace ska::io
