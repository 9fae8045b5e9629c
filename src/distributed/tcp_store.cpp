// TcpStore (see store.h): the server, a poll loop on a thread of rank 0, and the client of a
// length-prefixed request/reply protocol over POSIX sockets.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/store.h"

namespace ska::dist {

namespace {

// Request: u32 length of the rest | u8 op | u32 key length | key | payload.
// Reply:   u32 length of the rest | u8 status | payload. Integers are little-endian.
// Every request is answered at once: waiting for a key is the client's loop, so one slow key
// never holds up the server.
constexpr char kOpSet = 1;    // payload: the value
constexpr char kOpGet = 2;    // reply status 1 and the value when set, status 0 when not (yet)
constexpr char kOpAdd = 3;    // payload: i64 delta; reply: i64 sum
constexpr char kOpCheck = 4;  // reply status 1 when set
constexpr uint32_t kMaxFrame = 1u << 30;
constexpr size_t kReadChunk = 64 * 1024;

using Clock = std::chrono::steady_clock;

Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void put_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}
void put_i64(Bytes& out, int64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((uint64_t(v) >> (8 * i)) & 0xff));
}
int64_t get_i64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return static_cast<int64_t>(v);
}

// MSG_NOSIGNAL: a peer that went away must be an error here, not a SIGPIPE that kills the worker.
bool send_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, data, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Reads exactly n bytes before `deadline`; false when the peer closed, failed or was too slow.
bool recv_all(int fd, char* data, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t k = ::recv(fd, data, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    data += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

Bytes frame(char head, const std::string& key, const Bytes& payload, bool with_key) {
  Bytes out;
  size_t rest = 1 + (with_key ? 4 + key.size() : 0) + payload.size();
  put_u32(out, static_cast<uint32_t>(rest));
  out.push_back(head);
  if (with_key) {
    put_u32(out, static_cast<uint32_t>(key.size()));
    out.insert(out.end(), key.begin(), key.end());
  }
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// A socket listening on every interface: IPv6 accepting IPv4 too, or IPv4 where IPv6 is off.
int listen_any(int port, int* bound_port) {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1, zero = 0;
  sockaddr_storage ss{};
  socklen_t len;
  if (fd >= 0) {
    ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in6);
  } else {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    SKA_CHECK(fd >= 0, CommError, "rendezvous store: socket() failed: ", std::strerror(errno));
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(sockaddr_in);
  }
  // SO_REUSEADDR: a job restarted at once must not wait out TIME_WAIT on its port.
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 || ::listen(fd, 1024) != 0) {
    int err = errno;
    ::close(fd);
    SKA_FAIL(CommError, "rank 0 cannot serve the rendezvous store on port ", port, ": ",
             std::strerror(err), err == EADDRINUSE ? " (another job on this port? set MASTER_PORT)"
                                                   : "");
  }
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  *bound_port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

// One connection attempt to host:port; -1 with `error` set when it fails.
int connect_once(const std::string& host, int port, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    *error = ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      *error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(found);
  if (fd >= 0) set_nodelay(fd);
  return fd;
}

}  // namespace

class TcpStore::Server {
 public:
  explicit Server(int port) {
    listen_fd_ = listen_any(port, &port_);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      ::close(listen_fd_);
      SKA_FAIL(CommError, "rendezvous store: pipe() failed: ", std::strerror(errno));
    }
    thread_ = std::thread([this] { loop(); });
  }
  ~Server() {
    char byte = 0;
    (void)!::write(wake_[1], &byte, 1);
    thread_.join();
    for (Conn& c : conns_) ::close(c.fd);
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  int port() const { return port_; }

 private:
  struct Conn {
    int fd;
    Bytes in;
  };

  void loop() {
    std::vector<pollfd> fds;
    while (true) {
      fds.assign({{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}});
      for (const Conn& c : conns_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
      if (fds[0].revents) return;
      // Back to front, so that erasing a closed connection keeps the earlier indices valid.
      for (size_t i = fds.size(); i-- > 2;) {
        if (fds[i].revents && !serve(conns_[i - 2])) {
          ::close(conns_[i - 2].fd);
          conns_.erase(conns_.begin() + static_cast<std::ptrdiff_t>(i - 2));
        }
      }
      if (fds[1].revents & POLLIN) accept_one();
    }
  }

  void accept_one() {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    set_nodelay(fd);
    conns_.push_back({fd, {}});
  }

  // Reads what arrived and answers every complete request; false when the client is gone.
  bool serve(Conn& c) {
    char buf[kReadChunk];
    ssize_t k = ::recv(c.fd, buf, sizeof(buf), 0);
    if (k <= 0) return k < 0 && errno == EINTR;
    c.in.insert(c.in.end(), buf, buf + k);
    size_t used = 0;
    while (c.in.size() - used >= 4) {
      uint32_t len = get_u32(c.in.data() + used);
      if (len < 5 || len > kMaxFrame) return false;
      if (c.in.size() - used - 4 < len) break;
      const char* p = c.in.data() + used + 4;
      uint32_t key_len = get_u32(p + 1);
      if (key_len > len - 5) return false;
      std::string key(p + 5, key_len);
      Bytes payload(p + 5 + key_len, p + len);
      Bytes reply = answer(p[0], key, payload);
      if (!send_all(c.fd, reply.data(), reply.size())) return false;
      used += 4 + len;
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(used));
    return true;
  }

  Bytes answer(char op, const std::string& key, const Bytes& payload) {
    auto it = data_.find(key);
    Bytes body;
    switch (op) {
      case kOpSet:
        data_[key] = payload;
        return frame(1, "", {}, false);
      case kOpGet:
        return it == data_.end() ? frame(0, "", {}, false) : frame(1, "", it->second, false);
      case kOpAdd: {
        // A key set() to something other than a number counts as 0: the server must not throw.
        int64_t sum = it == data_.end() ? 0 : std::strtoll(std::string(it->second.begin(),
                                                                       it->second.end()).c_str(),
                                                           nullptr, 10);
        sum += payload.size() == 8 ? get_i64(payload.data()) : 0;
        std::string text = std::to_string(sum);
        data_[key] = Bytes(text.begin(), text.end());
        put_i64(body, sum);
        return frame(1, "", body, false);
      }
      case kOpCheck:
        return frame(it == data_.end() ? 0 : 1, "", {}, false);
      default:
        return frame(0, "", {}, false);
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::vector<Conn> conns_;
  std::map<std::string, Bytes> data_;
};

TcpStore::TcpStore(const std::string& host, int port, bool serve, double timeout_s)
    : Store(timeout_s), host_(host), port_(port) {
  if (serve) {
    server_ = std::make_unique<Server>(port);
    port_ = server_->port();
  }
  // Workers start in any order: keep trying while rank 0 is not listening yet.
  auto deadline = deadline_after(timeout_s);
  std::string error;
  while ((fd_ = connect_once(host_, port_, &error)) < 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  SKA_CHECK(fd_ >= 0, CommError, "could not reach the rendezvous store at ", address(),
            " within ", timeout_s, " s (is rank 0 running and MASTER_ADDR/MASTER_PORT right? ",
            "last error: ", error, ")");
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::string TcpStore::address() const { return "tcp://" + host_ + ":" + std::to_string(port_); }

// Sends one request and returns the reply's status byte followed by its payload.
Bytes TcpStore::request(char op, const std::string& key, const Bytes& payload) {
  std::lock_guard<std::mutex> lock(mutex_);
  SKA_CHECK(fd_ >= 0, CommError, "the connection to the rendezvous store at ", address(),
            " was lost earlier (did rank 0 die?)");
  Bytes out = frame(op, key, payload, true);
  // The server answers at once, so a reply that does not come within the timeout means it hangs.
  auto deadline = deadline_after(timeout_s());
  char head[4];
  bool ok = send_all(fd_, out.data(), out.size()) && recv_all(fd_, head, 4, deadline);
  Bytes reply(ok ? get_u32(head) : 0);
  ok = ok && !reply.empty() && recv_all(fd_, reply.data(), reply.size(), deadline);
  if (!ok) {
    ::close(fd_);
    fd_ = -1;
    SKA_FAIL(CommError, "lost the connection to the rendezvous store at ", address(),
             " while accessing key '", key, "' (did rank 0 die?)");
  }
  return reply;
}

void TcpStore::set(const std::string& key, const Bytes& value) { request(kOpSet, key, value); }

Bytes TcpStore::get(const std::string& key) {
  auto deadline = deadline_after(timeout_s());
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    Bytes reply = request(kOpGet, key, {});
    if (reply[0] == 1) return Bytes(reply.begin() + 1, reply.end());
    SKA_CHECK(Clock::now() < deadline, CommError, "timed out after ", timeout_s(),
              " s waiting for key '", key, "' in the rendezvous store at ", address());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  Bytes payload;
  put_i64(payload, delta);
  Bytes reply = request(kOpAdd, key, payload);
  SKA_CHECK(reply.size() == 9, CommError, "malformed reply from the rendezvous store at ",
            address(), " to add('", key, "')");
  return get_i64(reply.data() + 1);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    if (request(kOpCheck, key, {})[0] != 1) return false;
  }
  return true;
}

}  // namespace ska::dist
