// The Gloo backend: collectives over TCP for CPU tensors, run in issue order on one background
// thread per communicator so that an async all-reduce overlaps with the caller's work.
#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "core/error.h"
#include "distributed/backends.h"

namespace ska::dist::detail {

namespace {

// Gloo's rendezvous over our store, under a prefix of its own.
class GlooStore : public gloo::rendezvous::Store {
 public:
  explicit GlooStore(dist::Store& store) : store_(store) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(kPrefix + key, data);
  }
  std::vector<char> get(const std::string& key) override { return store_.get(kPrefix + key); }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> prefixed;
    for (const std::string& k : keys) prefixed.push_back(kPrefix + k);
    store_.wait(prefixed);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    wait(keys);  // our store's own timeout is the communicator's
  }

 private:
  static constexpr const char* kPrefix = "ska/gloo/";
  dist::Store& store_;
};

// The local address from which this host reaches `host`: the interface Gloo should listen on.
// A UDP connect sends nothing; it only makes the kernel pick the route.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string local;
  int fd = ::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    char text[INET6_ADDRSTRLEN] = {0};
    const void* addr = ss.ss_family == AF_INET6
                           ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr)
                           : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&ss)->sin_addr);
    if (::inet_ntop(ss.ss_family, addr, text, sizeof(text))) local = text;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return local;
}

// SKA_GLOO_IFNAME or GLOO_SOCKET_IFNAME (as PyTorch reads it) name the interface; otherwise the
// one that routes to MASTER_ADDR, else this host's name.
std::shared_ptr<gloo::transport::Device> create_device(const World& world) {
  gloo::transport::tcp::attr attr;
  const char* ifname = std::getenv("SKA_GLOO_IFNAME");
  if (!ifname || !*ifname) ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) {
    attr.iface = ifname;
  } else {
    attr.hostname = local_address_towards(world.master_addr, world.master_port);
    if (attr.hostname.empty()) {
      char name[256] = {0};
      ::gethostname(name, sizeof(name) - 1);
      attr.hostname = name;
    }
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    SKA_FAIL(CommError, "Gloo cannot open a TCP device on ",
             attr.iface.empty() ? "address " + attr.hostname : "interface " + attr.iface, ": ",
             e.what());
  }
}

// Gloo writes to its sockets with writev, which raises SIGPIPE when a peer has died: that would
// kill this worker silently instead of failing the collective with a message. Ignored unless the
// program installed a handler of its own.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

// What went wrong in Gloo, in its own words (EnforceNotMet keeps its text in msg()).
std::string gloo_message(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const gloo::EnforceNotMet& e) {
    return e.msg();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}

// A collective in flight on the communicator's thread.
class GlooWork : public Work {
 public:
  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  void finish(std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = error;
    }
    done_cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

struct Task {
  std::string what;          // describe_collective(...), for failure messages
  std::function<void()> run;  // on the communicator's thread
  std::shared_ptr<GlooWork> work;
};

template <typename T>
void add_into(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<T*>(out);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(const World& world, std::shared_ptr<Store> store, const CommOptions& options)
      : world_(world), store_(std::move(store)), options_(options) {
    ignore_sigpipe();
    connect();
    thread_ = std::thread([this] { serve(); });
  }

  ~GlooCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    thread_.join();  // after the queued collectives: the peers expect them
  }

  int rank() const override { return world_.rank; }
  int world_size() const override { return world_.world_size; }
  std::string backend() const override { return "gloo"; }
  Device device() const override { return Device::cpu(); }

  std::shared_ptr<Work> all_reduce_async(Tensor tensor, ReduceOp op) override {
    check_collective_tensor("all_reduce", tensor, Device::cpu(), true);
    size_t bytes = tensor.numel() * tensor.element_size();
    return enqueue("all_reduce", bytes, [this, tensor, op] {
      reduce_in_place(tensor.data_ptr(), tensor.dtype(), tensor.numel(), op);
    });
  }

  void broadcast(Tensor tensor, int root) override {
    check_collective_tensor("broadcast", tensor, Device::cpu(), false);
    SKA_CHECK(root >= 0 && root < world_.world_size, ValueError, "broadcast: root ", root,
              " is outside the world of ", world_.world_size);
    size_t bytes = tensor.numel() * tensor.element_size();
    enqueue("broadcast", bytes, [this, tensor, root, bytes] {
      if (bytes == 0) return;
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(tensor.data_ptr()), bytes);
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      gloo::broadcast(opts);
    })->wait();
  }

  void all_gather(const Tensor& input, Tensor output) override {
    check_collective_tensor("all_gather", input, Device::cpu(), false);
    check_collective_tensor("all_gather", output, Device::cpu(), false);
    check_chunks("all_gather", output, input);
    size_t bytes = input.numel() * input.element_size();
    enqueue("all_gather", bytes, [this, input, output, bytes] {
      if (bytes == 0) return;
      gloo::AllgatherOptions opts(context_);
      opts.setInput(static_cast<uint8_t*>(input.data_ptr()), bytes);  // Gloo only reads it
      opts.setOutput(static_cast<uint8_t*>(output.data_ptr()), bytes * world_.world_size);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      gloo::allgather(opts);
    })->wait();
  }

  // An all-reduce of a copy of the input, of which this rank keeps its chunk: twice the traffic
  // of a ring reduce-scatter, which Gloo's option-style API lacks.
  void reduce_scatter(const Tensor& input, Tensor output, ReduceOp op) override {
    check_collective_tensor("reduce_scatter", input, Device::cpu(), true);
    check_collective_tensor("reduce_scatter", output, Device::cpu(), true);
    check_chunks("reduce_scatter", input, output);
    size_t chunk = output.numel() * output.element_size();
    enqueue("reduce_scatter", chunk * world_.world_size, [this, input, output, op, chunk] {
      const char* in = static_cast<const char*>(input.data_ptr());
      std::vector<char> copy(in, in + chunk * world_.world_size);
      reduce_in_place(copy.data(), input.dtype(), input.numel(), op);
      if (chunk) std::memcpy(output.data_ptr(), copy.data() + chunk * world_.rank, chunk);
    })->wait();
  }

  void barrier() override {
    enqueue("barrier", 0, [this] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout());
      gloo::barrier(opts);
    })->wait();
  }

  void set_label(const std::string& label) override {
    std::lock_guard<std::mutex> lock(mutex_);
    label_ = label;
  }

 private:
  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000.0));
  }
  uint32_t next_tag() { return tag_++; }

  // `big` holds world_size chunks of `small`'s size and dtype.
  void check_chunks(const char* name, const Tensor& big, const Tensor& small) const {
    SKA_CHECK(big.dtype() == small.dtype(), DTypeError, name, ": ", big.dtype(), " and ",
              small.dtype(), " tensors");
    SKA_CHECK(big.numel() == small.numel() * world_.world_size, ShapeError, name, ": ", big.str(),
              " is not ", world_.world_size, " chunks of ", small.str());
  }

  // Meets the other ranks through the store and opens a TCP pair to each.
  void connect() {
    auto device = create_device(world_);
    context_ = std::make_shared<gloo::rendezvous::Context>(world_.rank, world_.world_size);
    context_->setTimeout(timeout());
    GlooStore gloo_store(*store_);
    try {
      context_->connectFullMesh(gloo_store, device);
    } catch (const CommError& e) {
      SKA_FAIL(CommError, "rank ", world_.rank, " could not connect to its peers: ", e.what());
    } catch (...) {
      SKA_FAIL(CommError, "rank ", world_.rank, " could not connect to its peers: ",
               gloo_message(std::current_exception()));
    }
    exchange_addresses();
    // Nobody leaves the rendezvous (rank 0 may destroy the store) while another still reads it.
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag());
    try {
      gloo::barrier(opts);
    } catch (...) {
      SKA_FAIL(CommError, "rank ", world_.rank, " connected, but the barrier after the rendezvous ",
               "failed: ", gloo_message(std::current_exception()));
    }
  }

  // Each rank publishes the address of its pair towards every peer, so that an error naming the
  // address of a pair ("Connection closed by peer [10.0.0.2]:4711") can name its rank.
  void exchange_addresses() {
    std::string mine;
    for (int p = 0; p < world_.world_size; ++p) {
      if (p != world_.rank) mine += context_->getPair(p)->address().str();
      mine += '\n';
    }
    store_->set("ska/gloo_addr/" + std::to_string(world_.rank), Bytes(mine.begin(), mine.end()));
    peer_addresses_.assign(world_.world_size, "");
    for (int p = 0; p < world_.world_size; ++p) {
      if (p == world_.rank) continue;
      Bytes theirs = store_->get("ska/gloo_addr/" + std::to_string(p));
      std::string text(theirs.begin(), theirs.end());
      size_t begin = 0;
      for (int line = 0; line < world_.rank; ++line) begin = text.find('\n', begin) + 1;
      peer_addresses_[p] = text.substr(begin, text.find('\n', begin) - begin);
    }
  }

  // The rank whose pair address appears in `message`, or -1.
  int peer_in(const std::string& message) const {
    for (int p = 0; p < world_.world_size; ++p) {
      const std::string& a = peer_addresses_[p];
      if (a.empty()) continue;
      for (size_t at = message.find(a); at != std::string::npos; at = message.find(a, at + 1)) {
        size_t end = at + a.size();  // "...:4711" must not match "...:47110"
        if (end == message.size() || !std::isdigit(static_cast<unsigned char>(message[end]))) {
          return p;
        }
      }
    }
    return -1;
  }

  std::shared_ptr<Work> enqueue(const char* name, size_t bytes, std::function<void()> run) {
    auto work = std::make_shared<GlooWork>();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back({describe_collective(name, bytes, label_), std::move(run), work});
    }
    queue_cv_.notify_one();
    return work;
  }

  // The communicator's thread: runs the collectives in issue order until destruction.
  void serve() {
    while (true) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task.work->finish(run(task));
    }
  }

  // Runs one collective; after a first failure every later one fails at once with its error.
  std::exception_ptr run(Task& task) {
    if (first_error_) return first_error_;
    try {
      task.run();
      return nullptr;
    } catch (...) {
      std::string message = explain(task.what, gloo_message(std::current_exception()));
      first_error_ = std::make_exception_ptr(CommError(message));
      abandon(message);
      return first_error_;
    }
  }

  // Tells the others (through the store) why this rank stops, then closes its connections so
  // that peers blocked on it fail now rather than at their timeout.
  void abandon(const std::string& message) {
    report_failure(*store_, world_.rank, message);
    try {
      context_->closeConnections();
    } catch (...) {
    }
  }

  // The words of a failure: who, what, why, from Gloo's message.
  std::string explain(const std::string& what, const std::string& gloo) {
    if (contains(gloo, "imed out") || contains(gloo, "imeout")) {
      // Reported before looking for the silent ranks, which the others are doing too.
      report_failure(*store_, world_.rank, what + " timed out after " + seconds_text() + " s");
      return what + " timed out after " + seconds_text() + " s waiting for " +
             name_ranks(silent_ranks(*store_, world_.rank, world_.world_size), "its peers");
    }
    if (contains(gloo, "losed") || contains(gloo, "reset by peer") || contains(gloo, "roken pipe")) {
      return closed_connection(what, gloo);
    }
    return what + " failed: " + gloo;
  }

  // A closed connection: a peer that died, or one that gave up after a failure of its own (which
  // it reported in the store). The pair address in Gloo's message names the peer when this rank
  // dialled it; otherwise the peers that report nothing in the store are the dead ones. A peer
  // whose report is kUnattributed could not tell either, so its report names nobody. A rank that
  // names the peer reports too: a rank that cannot tell then finds it among the living, not
  // among the silent ones.
  std::string closed_connection(const std::string& what, const std::string& gloo) {
    int peer = peer_in(gloo);
    if (peer >= 0) {
      std::string report = reported_failure(*store_, peer);
      std::string message;
      if (report.empty()) {
        message =
            what + " failed: rank " + std::to_string(peer) + " closed its connection (did it die?)";
      } else if (!ends_with(report, kUnattributed)) {
        message = what + " failed: rank " + std::to_string(peer) + " gave up first: " + report;
      }
      if (!message.empty()) {
        report_failure(*store_, world_.rank, message);
        return message;
      }
    }
    // Report, then close this rank's connections before waiting for the others' reports: a peer
    // blocked on this rank (rather than on the dead one) fails now and reports too, instead of
    // after its timeout, and the silent ranks are then exactly the dead ones.
    report_failure(*store_, world_.rank, what + kUnattributed);
    try {
      context_->closeConnections();
    } catch (...) {
    }
    std::vector<int> silent = silent_ranks(*store_, world_.rank, world_.world_size);
    if (silent.empty()) {
      return what + " failed: a peer closed its connection (did it die?) [" + gloo + "]";
    }
    return what + " failed: " + name_ranks(silent, "") +
           (silent.size() == 1 ? " closed its connection (did it die?)"
                               : " closed their connections (did they die?)");
  }

  // The interim report of a rank that saw a connection close and does not know whose.
  static constexpr const char* kUnattributed = " failed: a peer closed its connection";

  std::string seconds_text() const {
    std::ostringstream os;
    os << options_.timeout_s;
    return os.str();
  }

  World world_;
  std::shared_ptr<Store> store_;
  CommOptions options_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::vector<std::string> peer_addresses_;  // [p]: the address of rank p's pair towards us

  std::mutex mutex_;  // guards queue_, stopping_ and label_
  std::condition_variable queue_cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  std::string label_;
  std::thread thread_;

  // Only the communicator's thread touches these.
  uint32_t tag_ = 0;
  std::exception_ptr first_error_;

  // In place over n elements of `data`: the sum (or average) over ranks. bf16 is widened to f32,
  // summed and averaged there, and rounded once.
  void reduce_in_place(void* data, DType dtype, int64_t n, ReduceOp op) {
    if (n == 0) return;
    switch (dtype) {
      case DType::kF32: return reduce_typed<float>(static_cast<float*>(data), n, op);
      case DType::kF64: return reduce_typed<double>(static_cast<double*>(data), n, op);
      case DType::kI64: return reduce_typed<int64_t>(static_cast<int64_t*>(data), n, op);
      case DType::kBF16: {
        auto* bits = static_cast<uint16_t*>(data);
        std::vector<float> wide(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) wide[i] = bf16_bits_to_f32(bits[i]);
        reduce_typed<float>(wide.data(), n, op);
        for (int64_t i = 0; i < n; ++i) bits[i] = f32_to_bf16_bits(wide[i]);
        return;
      }
      default:
        SKA_FAIL(DTypeError, "all_reduce of ", dtype, " is not supported");
    }
  }

  // i64 averages divide with C++ semantics (truncation towards zero).
  template <typename T>
  void reduce_typed(T* data, int64_t n, ReduceOp op) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(n));
    opts.setReduceFunction(&add_into<T>);
    opts.setTag(next_tag());
    opts.setTimeout(timeout());
    gloo::allreduce(opts);
    if (op == ReduceOp::kAverage) {
      T size = static_cast<T>(world_.world_size);
      for (int64_t i = 0; i < n; ++i) data[i] /= size;
    }
  }
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const World& world,
                                                     std::shared_ptr<Store> store,
                                                     const CommOptions& options) {
  return std::make_unique<GlooCommunicator>(world, std::move(store), options);
}

}  // namespace ska::dist::detail
