// The run-folder lock (see run_lock.h).
#include "train/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace ska::train {

namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

std::string read_holder(int fd) {
  char buf[512] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  std::string text = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? "another process" : text;
}

}  // namespace

RunFolderLock::RunFolderLock(const std::string& run_dir)
    : path_((std::filesystem::path(run_dir) / ".lock").string()) {
  std::filesystem::create_directories(run_dir);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SKA_CHECK(fd_ >= 0, IOError, "cannot open the run-folder lock '", path_, "': ",
            std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = read_holder(fd_);
    ::close(fd_);
    fd_ = -1;
    SKA_CHECK(err != EWOULDBLOCK, IOError, "run folder '", run_dir, "' is in use by ", holder,
              ": another train is writing it (stop that one first, or choose another --output)");
    SKA_FAIL(IOError, "cannot lock the run folder '", run_dir, "' (", path_, "): ",
             std::strerror(err));
  }
  const std::string holder = "host " + host_name() + " pid " + std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, holder.data(), holder.size(), 0) < 0) {
    // The lock holds without its note; the message of a second writer is only less specific.
  }
}

RunFolderLock::~RunFolderLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays (removing it would race)
}

}  // namespace ska::train
