// Tests of the rendezvous stores, the Gloo communicator (2 and 4 forked processes on loopback,
// exact results, a dead peer, a timeout) and the worker launcher.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "distributed/communicator.h"
#include "distributed/launcher.h"
#include "distributed/store.h"

using namespace ska;
using namespace ska::dist;
using Catch::Matchers::Contains;

namespace {

using Clock = std::chrono::steady_clock;

// A child process must never return into Catch2: it reports by exit code, 0 for success.
constexpr int kChildThrew = 90;
constexpr int kChildGuardS = 40;  // a child still running after this long is killed

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs body(world) in n forked processes forming one world on loopback; returns their exit codes
// (128 + signal for a signal). A child that throws prints the error and exits kChildThrew.
std::vector<int> run_world(int n, const std::function<int(const World&)>& body) {
  int port = find_free_port();
  std::vector<pid_t> pids;
  for (int rank = 0; rank < n; ++rank) {
    std::fflush(nullptr);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      World world;
      world.rank = world.local_rank = rank;
      world.world_size = world.local_world_size = n;
      world.master_port = port;
      world.source = "env";
      int code = kChildThrew;
      try {
        code = body(world);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d threw: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  auto deadline = Clock::now() + std::chrono::seconds(kChildGuardS);
  for (pid_t pid : pids) {
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) ::kill(pid, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    codes.push_back(WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status));
  }
  return codes;
}

void require_all_zero(const std::vector<int>& codes) {
  for (size_t r = 0; r < codes.size(); ++r) {
    INFO("rank " << r << " exit code " << codes[r]);
    CHECK(codes[r] == 0);
  }
}

// In a child: print what failed and return 1 from the body.
#define CHILD_EXPECT(cond)                                                                    \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      std::fprintf(stderr, "rank %d: %s failed at line %d\n", world.rank, #cond, __LINE__); \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

// Compares n elements of a tensor with expected(i), exactly.
template <typename T, typename F>
bool equals(const Tensor& t, const F& expected) {
  const T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (!(p[i] == static_cast<T>(expected(i)))) {
      std::fprintf(stderr, "element %lld: %g, expected %g\n", static_cast<long long>(i),
                   static_cast<double>(p[i]), static_cast<double>(expected(i)));
      return false;
    }
  }
  return true;
}

std::unique_ptr<Communicator> make_cpu(const World& world, double timeout_s = 20) {
  CommOptions options;
  options.timeout_s = timeout_s;
  return make_communicator(world, Device::cpu(), options);
}

// Every reduction dtype, summed and averaged; the values are exact in each dtype.
int all_reduce_body(const World& world) {
  auto comm = make_cpu(world);
  const int n = world.world_size, r = world.rank;
  const int64_t m = 1000;
  const double ranks_sum = n * (n + 1) / 2.0;  // sum of (r + 1)
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
    double scale = op == ReduceOp::kSum ? ranks_sum : ranks_sum / n;
    std::vector<float> f(m);
    std::vector<double> d(m);
    std::vector<int64_t> l(m);
    for (int64_t i = 0; i < m; ++i) {
      f[i] = static_cast<float>((r + 1) * (i + 1));
      d[i] = (r + 1) * 0.125 * (i + 1);
      l[i] = (r + 1) * 1000000000000LL + i;  // beyond float precision
    }
    Tensor tf = Tensor::from_vector(f, {m}), td = Tensor::from_vector(d, {10, 100});
    Tensor tl = Tensor::from_vector(l, {m});
    comm->all_reduce(tf, op);
    comm->all_reduce(td, op);
    comm->all_reduce(tl, op);
    CHILD_EXPECT(equals<float>(tf, [&](int64_t i) { return scale * (i + 1); }));
    CHILD_EXPECT(equals<double>(td, [&](int64_t i) { return scale * 0.125 * (i + 1); }));
    CHILD_EXPECT(equals<int64_t>(tl, [&](int64_t i) {
      int64_t sum = static_cast<int64_t>(ranks_sum) * 1000000000000LL + n * i;
      return op == ReduceOp::kSum ? sum : sum / n;
    }));
    // bf16: small integers, exact in 8 bits of mantissa.
    std::vector<BFloat16> b(64);
    for (int i = 0; i < 64; ++i) b[i] = BFloat16(static_cast<float>((r + 1) * (i % 8 + 1)));
    Tensor tb = Tensor::from_vector(b, {64});
    comm->all_reduce(tb, op);
    CHILD_EXPECT(equals<BFloat16>(tb, [&](int64_t i) {
      return BFloat16(static_cast<float>(scale * (i % 8 + 1)));
    }));
  }
  // bf16 sums in f32 and rounds once: 256 + 1 + 1 + 1 = 259 -> 260 in bf16, where rounding after
  // every addition would stay at 256.
  Tensor once = Tensor::from_vector(std::vector<BFloat16>{BFloat16(r == 0 ? 256.0f : 1.0f)}, {1});
  comm->all_reduce(once);
  float expected = BFloat16(256.0f + (n - 1));
  CHILD_EXPECT(static_cast<float>(once.data<BFloat16>()[0]) == expected);
  return 0;
}

int broadcast_gather_scatter_body(const World& world) {
  auto comm = make_cpu(world);
  const int n = world.world_size, r = world.rank;
  CHILD_EXPECT(comm->backend() == "gloo" && comm->rank() == r && comm->world_size() == n);
  // Broadcast from the last rank.
  const int64_t m = 300;
  Tensor b = Tensor::zeros({3, 100});
  if (r == n - 1) {
    for (int64_t i = 0; i < m; ++i) b.data<float>()[i] = 7.0f * i + 1;
  }
  comm->broadcast(b, n - 1);
  CHILD_EXPECT(equals<float>(b, [](int64_t i) { return 7.0 * i + 1; }));
  // All-gather: rank p's chunk holds 100 p + i.
  std::vector<int64_t> mine(5);
  for (int i = 0; i < 5; ++i) mine[i] = 100 * r + i;
  Tensor gathered = Tensor::zeros({n * 5}, DType::kI64);
  comm->all_gather(Tensor::from_vector(mine, {5}), gathered);
  CHILD_EXPECT(equals<int64_t>(gathered, [](int64_t j) { return 100 * (j / 5) + j % 5; }));
  // Reduce-scatter: rank p contributes p + j at position j; rank r keeps chunk r of the sums.
  const int64_t chunk = 6;
  std::vector<double> in(n * chunk);
  for (int64_t j = 0; j < n * chunk; ++j) in[j] = r + j;
  Tensor out = Tensor::zeros({chunk}, DType::kF64);
  comm->reduce_scatter(Tensor::from_vector(in, {n * chunk}), out, ReduceOp::kSum);
  CHILD_EXPECT(equals<double>(out, [&](int64_t k) {
    return n * static_cast<double>(r * chunk + k) + n * (n - 1) / 2.0;
  }));
  comm->reduce_scatter(Tensor::from_vector(in, {n * chunk}), out, ReduceOp::kAverage);
  CHILD_EXPECT(equals<double>(out, [&](int64_t k) {
    return static_cast<double>(r * chunk + k) + (n - 1) / 2.0;
  }));
  comm->barrier();
  return 0;
}

// Eight all-reduces issued back to back, then waited for in order: each has its own result.
int async_body(const World& world) {
  auto comm = make_cpu(world);
  const int n = world.world_size, r = world.rank;
  std::vector<Tensor> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int k = 0; k < 8; ++k) {
    comm->set_label("bucket " + std::to_string(k));
    tensors.push_back(Tensor::full({1000 * (k + 1)}, (r + 1) * (k + 1), DType::kF32));
    works.push_back(comm->all_reduce_async(tensors.back(), ReduceOp::kSum));
  }
  for (int k = 0; k < 8; ++k) {
    works[k]->wait();
    works[k]->wait();  // harmless
    CHILD_EXPECT(equals<float>(tensors[k], [&](int64_t) { return n * (n + 1) / 2 * (k + 1); }));
  }
  return 0;
}

// Rank n - 1 dies after the rendezvous; the others must fail promptly, naming what and when.
int dead_peer_body(const World& world) {
  auto comm = make_cpu(world, /*timeout_s=*/30);
  comm->barrier();
  if (world.rank == world.world_size - 1) ::_exit(3);
  comm->set_label("step 7");
  Tensor t = Tensor::ones({1000});
  auto start = Clock::now();
  try {
    comm->all_reduce(t);
    CHILD_EXPECT(!"all_reduce succeeded without a peer");
  } catch (const CommError& e) {
    std::string message = e.what();
    std::fprintf(stderr, "rank %d: %s\n", world.rank, message.c_str());
    CHILD_EXPECT(message.find("all_reduce of 4.0 KB at step 7") != std::string::npos);
    CHILD_EXPECT(message.find("rank 2 closed its connection (did it die?)") != std::string::npos);
    CHILD_EXPECT(seconds_since(start) < 10);
  }
  // Later collectives fail at once with the first error.
  start = Clock::now();
  try {
    comm->barrier();
    CHILD_EXPECT(!"barrier succeeded after a failure");
  } catch (const CommError& e) {
    CHILD_EXPECT(std::string(e.what()).find("at step 7") != std::string::npos);
    CHILD_EXPECT(seconds_since(start) < 1);
  }
  return 0;
}

// Rank 1 sleeps past the 2 s timeout; rank 0's all-reduce fails naming the timeout and rank 1.
int timeout_body(const World& world) {
  auto comm = make_cpu(world, /*timeout_s=*/2);
  if (world.rank == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    ::_exit(0);
  }
  comm->set_label("step 3");
  auto start = Clock::now();
  try {
    comm->all_reduce(Tensor::ones({10}));
    CHILD_EXPECT(!"all_reduce succeeded although rank 1 slept");
  } catch (const CommError& e) {
    std::string message = e.what();
    std::fprintf(stderr, "rank %d: %s\n", world.rank, message.c_str());
    CHILD_EXPECT(message.find("all_reduce of 40 B at step 3 timed out after 2 s") !=
                 std::string::npos);
    CHILD_EXPECT(message.find("waiting for rank 1") != std::string::npos);
    CHILD_EXPECT(seconds_since(start) >= 1.9 && seconds_since(start) < 4.5);
  }
  return 0;
}

Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }
std::string text(const Bytes& b) { return std::string(b.begin(), b.end()); }

// set/get/add/check/wait against `store`, and the timeout message of a key never set.
void exercise_store(Store& store) {
  store.set("a/b c", bytes("hello"));
  CHECK(text(store.get("a/b c")) == "hello");
  store.set("a/b c", bytes(std::string("\0x\xff", 3)));
  CHECK(store.get("a/b c") == bytes(std::string("\0x\xff", 3)));
  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", -2) == 3);
  CHECK(store.check({"a/b c", "counter"}));
  CHECK_FALSE(store.check({"a/b c", "missing"}));
  store.wait({"a/b c", "counter"});
  // A value set later by another thread satisfies a waiting get.
  std::thread later([&store] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    store.set("later", bytes("x"));
  });
  CHECK(text(store.get("later")) == "x");
  later.join();
  auto start = Clock::now();
  CHECK_THROWS_WITH(store.get("never"), Contains("key 'never'") && Contains(store.address()) &&
                                            Contains("timed out after 0.3 s"));
  CHECK(seconds_since(start) < 20);  // not a hang (bounds far above the timeouts: loaded CI)
  CHECK_THROWS_AS(store.wait({"never"}), CommError);
}

}  // namespace

TEST_CASE("TcpStore: set, get, add, wait and timeouts", "[cpu][distributed]") {
  TcpStore server("127.0.0.1", 0, /*serve=*/true, 0.3);
  REQUIRE(server.port() > 0);
  exercise_store(server);
  // A second client sees the server's keys, and adds are shared.
  TcpStore client("127.0.0.1", server.port(), /*serve=*/false, 0.3);
  CHECK(text(client.get("later")) == "x");
  CHECK(client.add("counter", 10) == 13);
  CHECK(server.add("counter", 0) == 13);
}

TEST_CASE("TcpStore: no server within the timeout, a port taken, a lost server",
          "[cpu][distributed]") {
  int port = find_free_port();
  auto start = Clock::now();
  CHECK_THROWS_WITH(TcpStore("127.0.0.1", port, false, 0.3),
                    Contains("could not reach the rendezvous store at tcp://127.0.0.1:" +
                             std::to_string(port)));
  CHECK(seconds_since(start) < 20);
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, true, 1);
  CHECK_THROWS_WITH(TcpStore("127.0.0.1", server->port(), true, 1), Contains("cannot serve"));
  TcpStore client("127.0.0.1", server->port(), false, 1);
  client.set("k", bytes("v"));
  server.reset();
  CHECK_THROWS_WITH(client.get("k"), Contains("lost the connection") && Contains("rank 0"));
}

TEST_CASE("FileStore: set, get, add, wait and timeouts", "[cpu][distributed]") {
  std::string folder = std::filesystem::temp_directory_path() /
                       ("ska_file_store_" + std::to_string(::getpid()));
  std::filesystem::remove_all(folder);
  {
    FileStore store(folder, 0.3);
    exercise_store(store);
    FileStore other(folder, 0.3);
    CHECK(other.add("counter", 1) == 4);
  }
  World world;
  world.master_addr = "file://" + folder;
  CHECK(make_store(world, 1)->address() == "file://" + folder);
  std::filesystem::remove_all(folder);
}

TEST_CASE("Gloo all_reduce: sum and average of every dtype, 2 ranks", "[cpu][distributed]") {
  require_all_zero(run_world(2, all_reduce_body));
}

TEST_CASE("Gloo all_reduce: sum and average of every dtype, 4 ranks",
          "[cpu][distributed][slow]") {
  require_all_zero(run_world(4, all_reduce_body));
}

TEST_CASE("Gloo broadcast, all_gather, reduce_scatter, barrier", "[cpu][distributed]") {
  require_all_zero(run_world(2, broadcast_gather_scatter_body));
  require_all_zero(run_world(4, broadcast_gather_scatter_body));
}

TEST_CASE("Gloo async all-reduces complete in issue order", "[cpu][distributed]") {
  require_all_zero(run_world(2, async_body));
}

TEST_CASE("Gloo: a dead peer fails the others promptly", "[cpu][distributed][slow]") {
  std::vector<int> codes = run_world(3, dead_peer_body);
  CHECK(codes[2] == 3);
  codes.pop_back();
  require_all_zero(codes);
}

TEST_CASE("Gloo: a peer that sleeps past the timeout", "[cpu][distributed][slow]") {
  require_all_zero(run_world(2, timeout_body));
}

TEST_CASE("Communicator: bad tensors fail on the caller's thread", "[cpu][distributed]") {
  World single;
  auto comm = make_communicator(single, Device::cpu());
  CHECK(comm->backend() == "single");
  Tensor t = Tensor::ones({4});
  comm->all_reduce(t, ReduceOp::kAverage);
  CHECK(t.data<float>()[3] == 1.0f);
  require_all_zero(run_world(2, [](const World& world) {
    auto comm = make_cpu(world);
    try {
      comm->all_reduce(Tensor::ones({4}, DType::kI32));
      return 1;
    } catch (const DTypeError&) {
    }
    try {
      comm->all_reduce(Tensor::ones({4, 4}).transpose(0, 1));
      return 2;
    } catch (const ValueError&) {
    }
    try {
      comm->all_gather(Tensor::ones({4}), Tensor::ones({7}));
      return 3;
    } catch (const ShapeError&) {
    }
    comm->barrier();  // nothing was queued by the rejected calls
    return 0;
  }));
}

TEST_CASE("launch_local_workers: the workers' environment", "[cpu][distributed]") {
  LaunchOptions options;
  options.nproc_per_node = 3;
  const std::string script =
      "[ \"$WORLD_SIZE\" = 3 ] && [ \"$LOCAL_WORLD_SIZE\" = 3 ] && [ \"$RANK\" = \"$LOCAL_RANK\" ]"
      " && [ \"$MASTER_ADDR\" = 127.0.0.1 ] && [ \"$MASTER_PORT\" -gt 0 ]"
      " && [ \"$NODE_RANK\" = 0 ] && [ \"$GROUP_RANK\" = 0 ] && [ \"$1\" = arg ] || exit 9";
  CHECK(launch_local_workers({"/bin/sh", "-c", script, "sh", "arg"}, options) == 0);

  // Two nodes' ranks: this one is node 1.
  options.nproc_per_node = 2;
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "head";
  options.master_port = 4321;
  const std::string node1 =
      "[ \"$WORLD_SIZE\" = 4 ] && [ \"$RANK\" = $((LOCAL_RANK + 2)) ] && [ \"$NODE_RANK\" = 1 ]"
      " && [ \"$MASTER_ADDR\" = head ] && [ \"$MASTER_PORT\" = 4321 ] || exit 9";
  CHECK(launch_local_workers({"sh", "-c", node1}, options) == 0);

  options.master_port = 0;
  CHECK_THROWS_AS(launch_local_workers({"sh", "-c", "true"}, options), ValueError);
  CHECK(launch_local_workers({"/nonexistent/program"}, LaunchOptions{}) == 127);
}

TEST_CASE("launch_local_workers: one failure stops the others", "[cpu][distributed]") {
  LaunchOptions options;
  options.nproc_per_node = 3;
  options.grace_s = 0.5;
  auto start = Clock::now();
  const std::string fails = "if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 7; fi; exec sleep 60";
  CHECK(launch_local_workers({"/bin/sh", "-c", fails}, options) == 7);
  CHECK(seconds_since(start) < 30);  // not the 60 s the others sleep

  // A worker that ignores SIGTERM is killed after grace_s; a signal's code is 128 + signal.
  start = Clock::now();
  const std::string killed =
      "if [ \"$RANK\" = 0 ]; then sleep 0.2; kill -9 $$; fi; trap '' TERM; exec sleep 60";
  CHECK(launch_local_workers({"/bin/sh", "-c", killed}, options) == 128 + SIGKILL);
  CHECK(seconds_since(start) < 30);
}

TEST_CASE("launch_local_workers: SIGTERM is forwarded to the workers", "[cpu][distributed]") {
  LaunchOptions options;
  options.nproc_per_node = 2;
  options.grace_s = 2;
  std::thread terminate([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(::getpid(), SIGTERM);
  });
  auto start = Clock::now();
  int code = launch_local_workers({"/bin/sh", "-c", "exec sleep 60"}, options);
  terminate.join();
  CHECK(code == 128 + SIGTERM);
  CHECK(seconds_since(start) < 30);  // not the 60 s the workers sleep
}

TEST_CASE("launch_local_workers: after a forwarded signal the workers have signal_grace_s",
          "[cpu][distributed]") {
  LaunchOptions options;
  options.nproc_per_node = 2;
  options.grace_s = 0.3;
  options.signal_grace_s = 30;
  const auto signal_after = [](std::vector<int> ms) {
    return std::thread([ms] {
      for (int t : ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(t));
        ::kill(::getpid(), SIGTERM);
      }
    });
  };
  // Workers that take a second to end after SIGTERM (train writes its checkpoint): not killed
  // (that would end it 0.8 s after the start, not 1.5 s).
  const std::string slow_end = "trap 'sleep 1; kill $!; exit 143' TERM; sleep 60 & wait";
  std::thread once = signal_after({500});
  auto start = Clock::now();
  CHECK(launch_local_workers({"/bin/sh", "-c", slow_end}, options) == 128 + SIGTERM);
  once.join();
  CHECK(seconds_since(start) > 1.2);
  CHECK(seconds_since(start) < 10);

  // Workers that ignore it: a second signal leaves them grace_s, then they are killed.
  const std::string deaf = "trap '' TERM; exec sleep 60";  // ignored across exec
  std::thread twice = signal_after({300, 300});
  start = Clock::now();
  CHECK(launch_local_workers({"/bin/sh", "-c", deaf}, options) == 128 + SIGTERM);
  twice.join();
  CHECK(seconds_since(start) < 20);  // not signal_grace_s (30 s)
}
