// The host runtime of tests/simt/simt.h: a block's threads as fibers on one OS thread, switched
// at barriers and warp-wide operations; blocks one after another.
#include "tests/simt/simt.h"

#include <cuda_fp16.h>
#include <ucontext.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <utility>
#include <vector>

// Switching fibers: on x86-64 a few instructions that save the callee-saved registers and swap
// stacks (glibc's swapcontext also saves the signal mask by a system call and the FPU state: most
// of a test's time); elsewhere ucontext.
#if defined(__x86_64__)
#define SKA_SIMT_FAST_SWITCH 1
extern "C" void ska_simt_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .globl ska_simt_switch
  .hidden ska_simt_switch
  .type ska_simt_switch, @function
ska_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ska_simt_switch, .-ska_simt_switch
)");
#else
#define SKA_SIMT_FAST_SWITCH 0
#endif

namespace ska::simt {
namespace {

constexpr size_t kStackBytes = 256 * 1024;
// The most dynamic shared memory a block may take: sm_90's opt-in limit (227 KiB).
constexpr size_t kMaxSharedBytes = 227 * 1024;
constexpr size_t kSlotBytes = 64;  // the largest per-lane operand of a warp-wide operation

struct Copy {
  unsigned char* to;
  unsigned char bytes[16];
  int size;
};

// Where a suspended fiber (or the scheduler) resumes.
struct Context {
  void* sp = nullptr;  // SKA_SIMT_FAST_SWITCH
  ucontext_t uc;
};

// Saves the running code's state into `from` and resumes `to`.
void switch_context(Context& from, Context& to) {
#if SKA_SIMT_FAST_SWITCH
  ska_simt_switch(&from.sp, to.sp);
#else
  swapcontext(&from.uc, &to.uc);
#endif
}

struct Fiber {
  Context context;
  std::unique_ptr<char[]> stack;
  ThreadIds ids;
  int index = 0;  // in the block: x + y * blockDim.x + z * blockDim.x * blockDim.y
  bool done = false;
  int64_t barriers = 0;                   // __syncthreads passed
  uint64_t exchanges = 0;                 // warp-wide operations taken
  std::vector<Copy> open;                 // cp.async copies since the last commit
  std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

struct Warp {
  alignas(16) unsigned char slots[2][32 * kSlotBytes];
  size_t bytes[2] = {0, 0};
  int arrived[2] = {0, 0};
  uint64_t released = 0;  // exchanges 0 .. released - 1 are complete
};

struct Block {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int live = 0, arrived = 0;
  int64_t epoch = 0;
  const std::function<void()>* body = nullptr;
  size_t shared_bytes = 0;
};

Block g_block;
Fiber* g_current = nullptr;
Context g_scheduler;
uint64_t g_progress = 0;
std::exception_ptr g_error;
// The registered buffers (register_shared runs in other files' static initialisers: a function's
// static, constructed on first use); register_shared_of's, registered by the first launch on
// each thread that runs launches.
std::vector<std::pair<unsigned char* (*)(), size_t>>& lazy_shared_buffers() {
  static std::vector<std::pair<unsigned char* (*)(), size_t>> buffers;
  return buffers;
}
Submitter g_submitter = nullptr;
std::vector<std::pair<unsigned char*, size_t>>& shared_buffers() {
  static std::vector<std::pair<unsigned char*, size_t>> buffers;
  return buffers;
}
Schedule g_schedule = Schedule::kForward;
uint64_t g_seed = 0;
int64_t g_resident = 3;
Counts g_counts;

[[noreturn]] void fail(const std::string& what) {
  std::ostringstream os;
  os << "simt: ";
  if (g_current != nullptr) {
    const ThreadIds& i = g_current->ids;
    os << "block " << i.block.x << "," << i.block.y << "," << i.block.z << " thread " << i.thread.x
       << ": ";
  }
  os << what;
  throw std::runtime_error(os.str());
}

Fiber& current() {
  if (g_current == nullptr) fail("a device function called outside a launch");
  return *g_current;
}

void yield() { switch_context(current().context, g_scheduler); }

// Whether [p, p + n) lies in the launch's dynamic shared memory.
bool in_shared(const void* p, size_t n) {
  const auto* c = static_cast<const unsigned char*>(p);
  for (const auto& [base, size] : shared_buffers()) {
    if (c >= base && c + n <= base + g_block.shared_bytes) return true;
  }
  return false;
}

void release_barrier_if_complete() {
  if (g_block.arrived > 0 && g_block.arrived == g_block.live) {
    g_block.arrived = 0;
    ++g_block.epoch;
  }
}

void land(std::vector<Copy>& copies) {
  for (const Copy& c : copies) std::memcpy(c.to, c.bytes, c.size);
  copies.clear();
}

void entry() {
  try {
    (*g_block.body)();
    Fiber& f = current();
    size_t pending = f.open.size();
    for (const std::vector<Copy>& g : f.groups) pending += g.size();
    // (Committed empty groups are harmless: a persistent kernel's last stage has no copies.)
    if (pending > 0) fail("the thread ended with cp.async copies it never waited for");
  } catch (...) {
    if (!g_error) g_error = std::current_exception();
  }
  Fiber& f = current();
  f.done = true;
  --g_block.live;
  ++g_progress;
  release_barrier_if_complete();
}

// A fiber's first frame: the thread's code, then back to the scheduler for good.
[[noreturn]] void fiber_main() {
  entry();
  switch_context(current().context, g_scheduler);
  __builtin_unreachable();
}

// Makes `f` start at fiber_main on its own stack when first switched to.
void start_fiber(Fiber& f) {
#if SKA_SIMT_FAST_SWITCH
  // ska_simt_switch pops six registers and returns: to fiber_main, with the stack as a call
  // leaves it (16-byte aligned before the return address, a null one here).
  auto top = reinterpret_cast<uintptr_t>(f.stack.get() + kStackBytes) & ~uintptr_t{15};
  auto* sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                               // fiber_main's return address
  *--sp = reinterpret_cast<void*>(&fiber_main);  // where the switch returns to
  for (int i = 0; i < 6; ++i) *--sp = nullptr;   // rbp, rbx, r12-r15
  f.context.sp = sp;
#else
  getcontext(&f.context.uc);
  f.context.uc.uc_stack.ss_sp = f.stack.get();
  f.context.uc.uc_stack.ss_size = kStackBytes;
  f.context.uc.uc_link = nullptr;
  makecontext(&f.context.uc, reinterpret_cast<void (*)()>(&fiber_main), 0);
#endif
}

uint64_t next_random() {
  g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
  return g_seed >> 33;
}

void run_block(uint3 block, dim3 grid, dim3 dims) {
  const int threads = static_cast<int>(dims.x * dims.y * dims.z);
  for (const auto& [base, size] : shared_buffers()) std::memset(base, 0xff, g_block.shared_bytes);
  g_block.live = threads;
  g_block.arrived = 0;
  g_block.epoch = 0;
  for (Warp& w : g_block.warps) w = Warp{};
  for (int t = 0; t < threads; ++t) {
    Fiber& f = g_block.fibers[t];
    f.done = false;
    f.barriers = 0;
    f.exchanges = 0;
    f.open.clear();
    f.groups.clear();
    f.ids.thread = make_uint3(t % dims.x, t / dims.x % dims.y, t / (dims.x * dims.y));
    f.index = t;
    f.ids.block = block;
    f.ids.block_dim = dims;
    f.ids.grid_dim = grid;
    start_fiber(f);
  }
  std::vector<int> order(threads);
  std::iota(order.begin(), order.end(), 0);
  if (g_schedule == Schedule::kReverse) std::reverse(order.begin(), order.end());
  // Runs the live threads of order[from, to) once each; whether any was live.
  const auto sweep = [&](size_t from, size_t to) {
    bool any = false;
    for (size_t i = from; i < to; ++i) {
      Fiber& f = g_block.fibers[order[i]];
      if (f.done) continue;
      any = true;
      g_current = &f;
      switch_context(g_scheduler, f.context);
      g_current = nullptr;
      if (g_error) std::rethrow_exception(std::exchange(g_error, nullptr));
    }
    return any;
  };
  for (;;) {
    if (g_schedule == Schedule::kShuffled) {
      for (int i = threads - 1; i > 0; --i) std::swap(order[i], order[next_random() % (i + 1)]);
    }
    const uint64_t before = g_progress;
    bool any = false;
    if (g_schedule == Schedule::kWarpsAhead) {  // order is first to last: a warp is 32 of it
      for (size_t w = (order.size() + 31) / 32 * 32; w > 0; w -= 32) {
        const size_t begin = w - 32, end = std::min(order.size(), w);
        for (;;) {  // until none of the warp's lanes moves (all wait at a barrier, or ended)
          const uint64_t warp_before = g_progress;
          const bool live = sweep(begin, end);
          any = any || live;
          if (!live || g_progress == warp_before) break;
        }
      }
    } else {
      any = sweep(0, order.size());
    }
    if (!any) break;
    if (g_progress == before) {
      std::ostringstream os;
      os << "simt: block " << block.x << " deadlocked: " << g_block.live
         << " threads wait on one another (" << g_block.arrived
         << " at __syncthreads, the others at warp-wide operations)";
      throw std::runtime_error(os.str());
    }
  }
  const int64_t barriers = g_block.fibers[0].barriers;
  for (int t = 1; t < threads; ++t) {
    if (g_block.fibers[t].barriers != barriers) {
      std::ostringstream os;
      os << "simt: block " << block.x << ": thread " << t << " passed "
         << g_block.fibers[t].barriers << " barriers, thread 0 " << barriers;
      throw std::runtime_error(os.str());
    }
  }
}

}  // namespace

const ThreadIds& ids() { return current().ids; }
int lane() { return current().index % 32; }

void syncthreads() {
  Fiber& f = current();
  // Copies in flight stay in flight across a barrier (only their waits land them).
  const int64_t epoch = g_block.epoch;
  ++g_block.arrived;
  ++g_progress;
  ++f.barriers;
  release_barrier_if_complete();
  while (g_block.epoch == epoch) yield();
}

const unsigned char* exchange(const void* mine, size_t bytes) {
  Fiber& f = current();
  if (bytes > kSlotBytes) fail("a warp-wide operand over 64 bytes");
  const int lane = f.index % 32;
  if (f.index / 32 * 32 + 32 > static_cast<int>(g_block.fibers.size()))
    fail("a warp-wide operation in a warp of fewer than 32 threads (a full mask's lanes missing)");
  Warp& w = g_block.warps[f.index / 32];
  const uint64_t gen = f.exchanges++;
  const int s = static_cast<int>(gen & 1);
  if (w.arrived[s] == 0) {
    w.bytes[s] = bytes;
  } else if (w.bytes[s] != bytes) {
    fail("lanes of a warp in different warp-wide operations");
  }
  std::memcpy(w.slots[s] + lane * bytes, mine, bytes);
  ++w.arrived[s];
  ++g_progress;
  if (w.arrived[s] == 32) {
    w.arrived[s] = 0;
    w.released = gen + 1;
  }
  while (w.released <= gen) yield();
  return w.slots[s];
}

void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16) {
  struct Operands {
    uint32_t a[4], b[2];
    float c[4];
  };
  Operands mine{{a[0], a[1], a[2], a[3]}, {b0, b1}, {c[0], c[1], c[2], c[3]}};
  const auto* all = reinterpret_cast<const Operands*>(exchange(&mine, sizeof mine));
  auto value = [bf16](uint32_t word, int half) {
    const auto bits = static_cast<uint16_t>(half ? word >> 16 : word & 0xffffu);
    if (bf16) return static_cast<double>(__uint_as_float(static_cast<uint32_t>(bits) << 16));
    __half h;
    std::memcpy(static_cast<void*>(&h), &bits, 2);
    return static_cast<double>(__half2float(h));
  };
  auto A = [&](int r, int k) {
    return value(all[(r % 8) * 4 + (k % 8) / 2].a[(r >= 8) + 2 * (k >= 8)], k % 2);
  };
  auto B = [&](int k, int n) { return value(all[n * 4 + (k % 8) / 2].b[k >= 8], k % 2); };
  const int lane = current().index % 32, g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), n = 2 * t + (e & 1);
    double sum = mine.c[e];
    for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, n);
    c[e] = static_cast<float>(sum);
  }
}

void wmma_mma(float (&d)[8], const uint16_t (&a)[8], const uint16_t (&b)[8], const float (&c)[8],
              bool bf16) {
  struct Operands {
    uint16_t a[8], b[8];
    float c[8];
  };
  Operands mine;
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  std::memcpy(mine.c, c, sizeof mine.c);
  const auto* all = reinterpret_cast<const Operands*>(exchange(&mine, sizeof mine));
  auto value = [bf16](uint16_t bits) {
    if (bf16) return static_cast<double>(__uint_as_float(static_cast<uint32_t>(bits) << 16));
    __half h;
    std::memcpy(static_cast<void*>(&h), &bits, 2);
    return static_cast<double>(__half2float(h));
  };
  // Element (r, col) of a tile is lane (16 r + col) / 8's element (16 r + col) % 8.
  auto A = [&](int r, int k) { return value(all[(16 * r + k) / 8].a[(16 * r + k) % 8]); };
  auto B = [&](int k, int n) { return value(all[(16 * k + n) / 8].b[(16 * k + n) % 8]); };
  const int lane = current().index % 32;
  for (int e = 0; e < 8; ++e) {
    const int r = (8 * lane + e) / 16, n = (8 * lane + e) % 16;
    double sum = mine.c[e];
    for (int k = 0; k < 16; ++k) sum += A(r, k) * B(k, n);
    d[e] = static_cast<float>(sum);
  }
}

void wmma_check(const void* p, size_t ldm_bytes, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0)
    fail(std::string(what) + ": a pointer not 32-byte aligned");
  if (ldm_bytes % 16 != 0) fail(std::string(what) + ": a stride not a multiple of 16 bytes");
}

void ldmatrix(uint32_t* regs, int count, bool trans, const void* row) {
  const int lane = current().index % 32;
  if (lane < 8 * count) {
    if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fail("an ldmatrix row not 16-byte aligned");
    if (!in_shared(row, 16)) fail("an ldmatrix row outside the block's dynamic shared memory");
  }
  const auto* rows = reinterpret_cast<const unsigned char* const*>(exchange(&row, sizeof row));
  if (lane == 0) {
    for (int j = 0; j < count; ++j) {  // matrix j's 8 rows: distinct addresses a group of banks
      std::vector<uintptr_t> distinct;
      int in_group[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int r = 0; r < 8; ++r) {
        const auto at = reinterpret_cast<uintptr_t>(rows[8 * j + r]);
        if (std::find(distinct.begin(), distinct.end(), at) != distinct.end()) continue;
        distinct.push_back(at);
        ++in_group[at / 16 % 8];
      }
      ++g_counts.ldmatrix_matrices;
      g_counts.ldmatrix_wavefronts += *std::max_element(in_group, in_group + 8);
    }
  }
  for (int j = 0; j < count; ++j) {
    if (!trans) {
      std::memcpy(&regs[j], rows[8 * j + lane / 4] + 4 * (lane % 4), 4);
    } else {
      uint16_t lo, hi;
      std::memcpy(&lo, rows[8 * j + 2 * (lane % 4)] + 2 * (lane / 4), 2);
      std::memcpy(&hi, rows[8 * j + 2 * (lane % 4) + 1] + 2 * (lane / 4), 2);
      regs[j] = lo | (static_cast<uint32_t>(hi) << 16);
    }
  }
}

void async_copy(void* shared, const void* global, int bytes) {
  Fiber& f = current();
  if (bytes != 4 && bytes != 8 && bytes != 16) fail("a cp.async of other than 4, 8 or 16 bytes");
  if (reinterpret_cast<uintptr_t>(shared) % bytes != 0 ||
      reinterpret_cast<uintptr_t>(global) % bytes != 0) {
    fail("a cp.async address not aligned to its size");
  }
  if (!in_shared(shared, bytes)) fail("a cp.async outside the block's dynamic shared memory");
  Copy c;
  c.to = static_cast<unsigned char*>(shared);
  c.size = bytes;
  std::memcpy(c.bytes, global, bytes);
  std::memset(shared, 0xff, bytes);  // unreadable until it lands
  f.open.push_back(c);
}

void async_commit() {
  Fiber& f = current();
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}

void async_wait(int pending) {
  Fiber& f = current();
  while (static_cast<int>(f.groups.size()) > pending) {
    land(f.groups.front());
    f.groups.erase(f.groups.begin());
  }
}

void async_wait_all() {
  async_commit();
  async_wait(0);
}

void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (g_current != nullptr) fail("a launch from device code");
  static thread_local bool lazy_registered = false;
  if (!lazy_registered) {
    lazy_registered = true;
    for (const auto& [instance, bytes] : lazy_shared_buffers()) register_shared(instance(), bytes);
  }
  const int threads = static_cast<int>(block.x * block.y * block.z);
  if (threads <= 0 || threads > 1024) {
    throw std::runtime_error("simt: a block of " + std::to_string(threads) +
                             " threads (1 to 1024)");
  }
  if (shared_bytes > kMaxSharedBytes) {
    throw std::runtime_error("simt: a launch with " + std::to_string(shared_bytes) +
                             " bytes of dynamic shared memory (at most 227 KiB on sm_90)");
  }
  if (g_block.fibers.size() != static_cast<size_t>(threads)) {
    g_block.fibers = std::vector<Fiber>(threads);
    for (Fiber& f : g_block.fibers) f.stack.reset(new char[kStackBytes]);
  }
  g_block.warps.resize((threads + 31) / 32);
  g_block.body = &body;
  g_block.shared_bytes = shared_bytes;
  for (unsigned z = 0; z < grid.z; ++z) {
    for (unsigned y = 0; y < grid.y; ++y) {
      for (unsigned x = 0; x < grid.x; ++x) {
        run_block(make_uint3(x, y, z), grid, block);
      }
    }
  }
}

void register_shared(unsigned char* base, size_t bytes) {
  if (bytes < kMaxSharedBytes) throw std::logic_error("simt: a shared memory buffer under 227 KiB");
  shared_buffers().emplace_back(base, bytes);
}

void register_shared_of(unsigned char* (*instance)(), size_t bytes) {
  lazy_shared_buffers().emplace_back(instance, bytes);
}

void set_submitter(Submitter submitter) { g_submitter = submitter; }

void submit(cudaStream_t stream, std::function<void()> work) {
  if (g_submitter != nullptr) {
    g_submitter(stream, std::move(work));
  } else {
    work();
  }
}

void set_schedule(Schedule s, uint64_t seed) {
  g_schedule = s;
  g_seed = seed;
}

void set_resident_blocks(int64_t n) { g_resident = n; }
int64_t resident_blocks() { return g_resident; }

Counts counts() { return g_counts; }

}  // namespace ska::simt
