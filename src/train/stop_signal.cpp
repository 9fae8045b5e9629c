#include "train/stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

namespace ska::train {

namespace {

std::atomic<int> g_first{0};               // the first signal, 0 before any
std::atomic<int64_t> g_first_ms{0};        // when it came (CLOCK_MONOTONIC, ms)
std::atomic<bool> g_announce{true};
std::atomic<bool> g_deferred{false};       // signals ask for a clean stop (training has begun)
constexpr int64_t kRepeatAfterMs = 1000;   // a repeat sooner is a copy of the same request

int64_t now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

void write_stderr(const char* text) { (void)!::write(2, text, std::strlen(text)); }

// Async-signal-safe: it runs in the waiting thread, or as the handler of a thread that started
// before the signals were blocked (a library's pool).
void on_signal(int sig) {
  if (!g_deferred.load()) end_by_signal(sig);  // still setting up: nothing to save
  int64_t unset = 0;
  g_first_ms.compare_exchange_strong(unset, now_ms());  // the first signal's time, set once
  int none = 0;
  if (g_first.compare_exchange_strong(none, sig)) {
    if (!g_announce.load()) return;
    write_stderr(sig == SIGINT    ? "\ntrain: interrupted; stopping with a checkpoint (Ctrl-C "
                                    "again to quit at once)\n"
                 : sig == SIGTERM ? "\ntrain: SIGTERM; stopping with a checkpoint\n"
                                  : "\ntrain: SIGUSR1 (time limit near); stopping with a "
                                    "checkpoint\n");
    return;
  }
  if (sig == SIGUSR1 || now_ms() - g_first_ms.load() < kRepeatAfterMs) return;
  end_by_signal(sig);  // a second request to stop: what the signal does by default
}

}  // namespace

void watch_stop_signals(bool announce) {
  g_announce.store(announce);
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = on_signal;
    action.sa_flags = SA_RESTART;
    sigfillset(&action.sa_mask);
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
      // A signal the parent set to be ignored stays ignored (a shell's background job ignores
      // SIGINT, so Ctrl-C in the terminal is not meant for it).
      struct sigaction old {};
      ::sigaction(sig, nullptr, &old);
      if (old.sa_handler == SIG_IGN) continue;
      ::sigaction(sig, &action, nullptr);
      sigaddset(&set, sig);
    }
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    bool any = false;
    for (int sig : {SIGINT, SIGTERM, SIGUSR1}) any = any || sigismember(&set, sig) == 1;
    if (!any) return;
    std::thread([set] {
      for (;;) {
        int sig = 0;
        if (::sigwait(&set, &sig) == 0) on_signal(sig);
      }
    }).detach();
  });
}

void defer_stop_signals() { g_deferred.store(true); }

int stop_signal_received() { return g_first.load(); }

void end_by_signal(int sig) {
  ::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  ::pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  ::raise(sig);
  // Still here: the signal is blocked until a handler returns (a library thread's), or its
  // default action does not end the process.
  ::_exit(128 + sig);
}

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: {
      static thread_local char text[24];
      std::snprintf(text, sizeof(text), "signal %d", sig);
      return text;
    }
  }
}

}  // namespace ska::train
