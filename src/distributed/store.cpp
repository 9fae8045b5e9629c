// The store interface's waiting, the FileStore in a shared folder, and the choice of store for a
// world (see store.h). The TcpStore lives in tcp_store.cpp.
#include "distributed/store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "core/error.h"
#include "distributed/communicator.h"

namespace ska::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kFileScheme = "file://";

// Sleeps between polls of a key that is not there yet: short at first, then at most 50 ms.
class Backoff {
 public:
  void pause() {
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::milliseconds(50));
  }

 private:
  std::chrono::milliseconds pause_{1};
};

}  // namespace

void Store::wait(const std::vector<std::string>& keys) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s());
  Backoff backoff;
  for (const std::string& key : keys) {
    while (!check({key})) {
      SKA_CHECK(Clock::now() < deadline, CommError, "timed out after ", timeout_s(),
                " s waiting for key '", key, "' in the rendezvous store at ", address());
      backoff.pause();
    }
  }
}

FileStore::FileStore(const std::string& folder, double timeout_s)
    : Store(timeout_s), folder_(folder) {
  std::error_code error;
  std::filesystem::create_directories(folder_, error);
  SKA_CHECK(std::filesystem::is_directory(folder_), CommError, "the file store folder '", folder_,
            "' cannot be created: ", error.message());
}

// Keys may hold '/' and other characters a file name cannot: everything but [A-Za-z0-9_.-] is
// written as %XX.
std::string FileStore::path_of(const std::string& key) const {
  static const char* kHex = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '_' || c == '-' || (c == '.' && !name.empty())) {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
  }
  return folder_ + "/" + name;
}

// A temporary named after this process and a counter, renamed over the key: readers on any node
// see the whole old value or the whole new one.
void FileStore::write_atomic(const std::string& path, const Bytes& value) {
  static std::atomic<int64_t> counter{0};
  std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                     std::to_string(counter.fetch_add(1));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    SKA_CHECK(out.good(), CommError, "cannot write '", temp, "' in the file store ", address());
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(temp.c_str());
    SKA_FAIL(CommError, "cannot rename '", temp, "' in the file store ", address(), ": ",
             std::strerror(err));
  }
}

void FileStore::set(const std::string& key, const Bytes& value) {
  write_atomic(path_of(key), value);
}

Bytes FileStore::get(const std::string& key) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s());
  Backoff backoff;
  std::string path = path_of(key);
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in) return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    SKA_CHECK(Clock::now() < deadline, CommError, "timed out after ", timeout_s(),
              " s waiting for key '", key, "' in the rendezvous store at ", address());
    backoff.pause();
  }
}

// flock on a lock file beside the key serialises the read-modify-write across processes.
int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::string path = path_of(key);
  std::string lock_path = path + ".lock";
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  SKA_CHECK(fd >= 0, CommError, "cannot open '", lock_path, "': ", std::strerror(errno));
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  int64_t sum = delta;
  try {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!text.empty()) sum += std::strtoll(text.c_str(), nullptr, 10);
    std::string out = std::to_string(sum);
    write_atomic(path, Bytes(out.begin(), out.end()));
  } catch (...) {
    ::close(fd);  // releases the lock
    throw;
  }
  ::close(fd);
  return sum;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (::access(path_of(key).c_str(), F_OK) != 0) return false;
  }
  return true;
}

std::unique_ptr<Store> make_store(const World& world, double timeout_s) {
  const std::string& addr = world.master_addr;
  if (addr.rfind(kFileScheme, 0) == 0) {
    return std::make_unique<FileStore>(addr.substr(std::strlen(kFileScheme)), timeout_s);
  }
  return std::make_unique<TcpStore>(addr, world.master_port, world.rank == 0, timeout_s);
}

}  // namespace ska::dist
