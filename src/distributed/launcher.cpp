// The one-node worker launcher (see launcher.h): fork + execve with torchrun's environment,
// signal forwarding, and stopping every worker when one fails.
#include "distributed/launcher.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace ska::dist {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr int kExitExecFailed = 127;  // as a shell reports a command it cannot run

// The last SIGINT/SIGTERM received while workers run; the wait loop forwards it.
std::atomic<int> g_pending_signal{0};

void remember_signal(int sig) { g_pending_signal.store(sig); }

// Installs the forwarding handlers for the lifetime of the launch, then restores the old ones.
class SignalForwarding {
 public:
  SignalForwarding() {
    struct sigaction action {};
    action.sa_handler = remember_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGINT, &action, &old_int_);
    ::sigaction(SIGTERM, &action, &old_term_);
    g_pending_signal.store(0);
  }
  ~SignalForwarding() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

// argv[0] itself when it names a path, else the first executable of that name in PATH.
std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t begin = 0; begin <= dirs.size();) {
    size_t end = dirs.find(':', begin);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(begin, end - begin);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    begin = end + 1;
  }
  SKA_FAIL(ValueError, "launch: '", name, "' is not an executable found in PATH");
}

// This process's environment with the worker's variables replacing any of the same name.
std::vector<std::string> worker_environment(const LaunchOptions& o, int local_rank, int port) {
  const std::pair<const char*, std::string> vars[] = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"NODE_RANK", std::to_string(o.node_rank)},
  };
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    bool replaced = false;
    for (const auto& [name, value] : vars) {
      size_t n = std::strlen(name);
      replaced = replaced || (std::strncmp(*e, name, n) == 0 && (*e)[n] == '=');
    }
    if (!replaced) env.emplace_back(*e);
  }
  for (const auto& [name, value] : vars) env.push_back(std::string(name) + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Forks one worker. Everything the child needs is built before fork(), so that the child only
// makes async-signal-safe calls before execve (the parent may have threads).
pid_t spawn(const std::string& program, std::vector<std::string> args,
            std::vector<std::string> env) {
  std::vector<char*> argv = c_strings(args);
  std::vector<char*> envp = c_strings(env);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  SKA_CHECK(pid >= 0, Error, "launch: fork() failed: ", std::strerror(errno));
  if (pid > 0) return pid;
  // A worker must not outlive a launcher that was killed without the chance to stop it.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(kExitExecFailed);
  ::execve(program.c_str(), argv.data(), envp.data());
  const char* prefix = "launch: cannot execute ";
  (void)!::write(2, prefix, std::strlen(prefix));
  (void)!::write(2, program.c_str(), program.size());
  (void)!::write(2, "\n", 1);
  ::_exit(kExitExecFailed);
}

struct Worker {
  int rank;
  pid_t pid;
  bool running = true;
};

// 128 + signal for a signal, as shells report it.
int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (const Worker& w : workers) {
    if (w.running) ::kill(w.pid, sig);
  }
}

void check_options(const std::vector<std::string>& argv, const LaunchOptions& o) {
  SKA_CHECK(!argv.empty(), ValueError, "launch: no program to run");
  SKA_CHECK(o.nproc_per_node >= 1, ValueError, "launch: nproc_per_node=", o.nproc_per_node,
            " must be at least 1");
  SKA_CHECK(o.nnodes >= 1, ValueError, "launch: nnodes=", o.nnodes, " must be at least 1");
  SKA_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes, ValueError, "launch: node_rank=",
            o.node_rank, " is outside 0..", o.nnodes - 1);
  SKA_CHECK(o.master_port > 0 || o.nnodes == 1, ValueError,
            "launch: a job over ", o.nnodes, " nodes needs master_port set (every node must ",
            "agree on it)");
  SKA_CHECK(o.master_port >= 0 && o.master_port <= 65535, ValueError, "launch: master_port=",
            o.master_port, " is outside 1..65535");
  SKA_CHECK(o.grace_s >= 0, ValueError, "launch: grace_s=", o.grace_s, " is negative");
}

}  // namespace

int find_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  SKA_CHECK(fd >= 0, Error, "socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  int err = errno;
  ::close(fd);
  SKA_CHECK(ok, Error, "cannot find a free TCP port: ", std::strerror(err));
  return ntohs(addr.sin_port);
}

int launch_local_workers(const std::vector<std::string>& argv, const LaunchOptions& options,
                         int* forwarded_signal) {
  if (forwarded_signal != nullptr) *forwarded_signal = 0;
  check_options(argv, options);
  std::string program = resolve_program(argv[0]);
  int port = options.master_port > 0 ? options.master_port : find_free_port();
  SignalForwarding forwarding;
  std::vector<Worker> workers;
  for (int local = 0; local < options.nproc_per_node; ++local) {
    int rank = options.node_rank * options.nproc_per_node + local;
    workers.push_back({rank, spawn(program, argv, worker_environment(options, local, port))});
  }

  int result = 0;
  bool stopping = false, killed = false;
  Clock::time_point kill_at;
  // Signals the workers; they have `grace` seconds (or less, if an earlier stop said so).
  auto stop = [&](int sig, double grace) {
    signal_all(workers, sig);
    const Clock::time_point deadline =
        Clock::now() +
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace));
    if (!stopping || deadline < kill_at) kill_at = deadline;
    stopping = true;
  };
  int forwarded = 0;
  for (size_t running = workers.size(); running > 0;) {
    for (Worker& w : workers) {
      int status = 0;
      if (!w.running || ::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.running = false;
      --running;
      bool failed = WIFSIGNALED(status) || WEXITSTATUS(status) != 0;
      if (failed && result == 0 && !stopping) {
        result = exit_code_of(status);
        std::fprintf(stderr, "launch: rank %d (pid %d) %s; stopping the other workers\n", w.rank,
                     static_cast<int>(w.pid), how_it_ended(status).c_str());
        stop(SIGTERM, options.grace_s);
      }
    }
    if (int sig = g_pending_signal.exchange(0)) {
      if (result == 0) result = 128 + sig;
      if (forwarded_signal != nullptr && *forwarded_signal == 0) *forwarded_signal = sig;
      stop(sig, ++forwarded == 1 ? options.signal_grace_s : options.grace_s);
    }
    if (stopping && !killed && running > 0 && Clock::now() >= kill_at) {
      std::fprintf(stderr, "launch: %zu worker(s) still running after their grace period; "
                   "killing\n", running);
      signal_all(workers, SIGKILL);
      killed = true;
    }
    if (running > 0) std::this_thread::sleep_for(kPollInterval);
  }
  return result;
}

}  // namespace ska::dist
