// BlockPool, the caching allocators' bookkeeping: splitting, best fit, merging within segments,
// keys and their moves, segment release, and a long random sequence against a shadow model; the
// host allocator's replay of its requests under the device allocator's rules.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/block_pool.h"
#include "core/tensor.h"

using ska::BlockPool;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Segments from real host memory (never touched), freed at the end.
struct Segments {
  std::vector<void*> owned;
  ~Segments() {
    for (void* p : owned) std::free(p);
  }
  void release(void* p) {
    const auto it = std::find(owned.begin(), owned.end(), p);
    REQUIRE(it != owned.end());
    std::free(p);
    owned.erase(it);
  }
  char* get(size_t bytes) {
    owned.push_back(std::malloc(bytes));
    REQUIRE(owned.back() != nullptr);
    return static_cast<char*>(owned.back());
  }
};

// Takes `nbytes` for `key` as the allocator does: a cached block, else a new segment.
char* take(BlockPool& pool, Segments& mem, uintptr_t key, size_t nbytes, size_t* block) {
  const size_t size = pool.round(nbytes);
  void* p = pool.take(key, size, block);
  if (!p) {
    const size_t seg = pool.segment_size(size);
    p = pool.take_from_new_segment(key, mem.get(seg), seg, size, block);
  }
  return static_cast<char*>(p);
}

}  // namespace

TEST_CASE("block pool: rounding and segment sizes", "[cpu][allocator]") {
  const BlockPool split(true);
  CHECK(split.round(1) == 512);
  CHECK(split.round(512) == 512);
  CHECK(split.round(3000001) == 3000320);
  CHECK(split.segment_size(512) == 2 * kMiB);
  CHECK(split.segment_size(kMiB) == 2 * kMiB);
  CHECK(split.segment_size(kMiB + 512) == 20 * kMiB);
  CHECK(split.segment_size(10 * kMiB) == 20 * kMiB);
  CHECK(split.segment_size(10 * kMiB + 512) == 12 * kMiB);
  const BlockPool whole(false);
  CHECK(whole.round(1000) == 1024);
  CHECK(whole.round(3000001) == 4 * kMiB);
  CHECK(whole.segment_size(4 * kMiB) == 4 * kMiB);
}

TEST_CASE("block pool: small blocks are cut from one segment and merge back into it",
          "[cpu][allocator]") {
  BlockPool pool(true);
  Segments mem;
  size_t b = 0;
  char* p0 = take(pool, mem, 7, 1000, &b);
  CHECK(b == 1024);
  char* p1 = take(pool, mem, 7, 5000, &b);
  CHECK(b == 5120);
  char* p2 = take(pool, mem, 7, 1, &b);
  CHECK(b == 512);
  CHECK(pool.segment_count() == 1);
  CHECK(pool.reserved_bytes() == 2 * kMiB);
  CHECK(p1 == p0 + 1024);
  CHECK(p2 == p1 + 5120);
  CHECK(pool.free_bytes() == 2 * kMiB - 1024 - 5120 - 512);
  CHECK(pool.largest_free_bytes() == 2 * kMiB - 1024 - 5120 - 512);
  pool.check_invariants();

  // The middle block comes back and serves a request that fits it, before the large remainder.
  CHECK(pool.give_back(p1) == 5120);
  CHECK(pool.give_back(p1) == 0);  // twice: not handed out any more, nothing changes
  CHECK(pool.free_bytes() == 2 * kMiB - 1024 - 512);
  CHECK(pool.largest_free_bytes() == 2 * kMiB - 1024 - 5120 - 512);  // not merged with p1
  pool.check_invariants();
  char* again = take(pool, mem, 7, 4000, &b);
  CHECK(again == p1);
  CHECK(b == 4096);
  pool.check_invariants();
  CHECK(pool.remove_free_segments().empty());  // blocks of the segment are still in use

  CHECK(pool.give_back(p0) == 1024);
  CHECK(pool.give_back(p2) == 512);
  CHECK(pool.give_back(again) == 4096);
  pool.check_invariants();
  CHECK(pool.free_bytes() == 2 * kMiB);  // one free block, the whole segment
  const auto removed = pool.remove_free_segments();
  REQUIRE(removed.size() == 1);
  CHECK(removed[0].first == p0);
  CHECK(removed[0].second == 2 * kMiB);
  CHECK(pool.reserved_bytes() == 0);
  CHECK(pool.segment_count() == 0);
  CHECK(pool.give_back(p0) == 0);  // an address the pool no longer knows
  pool.check_invariants();
}

TEST_CASE("block pool: large requests share 20 MiB segments, apart from small ones",
          "[cpu][allocator]") {
  BlockPool pool(true);
  Segments mem;
  size_t b = 0;
  char* a = take(pool, mem, 1, 3000001, &b);
  CHECK(b == 3000320);
  CHECK(pool.reserved_bytes() == 20 * kMiB);
  char* c = take(pool, mem, 1, 4 * kMiB, &b);
  CHECK(c == a + 3000320);
  CHECK(pool.segment_count() == 1);
  // A small request takes a small segment, not the large one's free remainder.
  take(pool, mem, 1, 100, &b);
  CHECK(pool.segment_count() == 2);
  // A remainder of at most 1 MiB is not split off a large block: the block is handed out whole.
  const size_t rest = 20 * kMiB - 3000320 - 4 * kMiB;
  char* d = take(pool, mem, 1, rest - kMiB + 512, &b);
  CHECK(d == c + 4 * kMiB);
  CHECK(b == rest);
  // Requests above 10 MiB get segments of their own size, rounded to 2 MiB.
  take(pool, mem, 1, 11 * kMiB, &b);
  CHECK(b == 12 * kMiB);
  CHECK(pool.reserved_bytes() == 20 * kMiB + 2 * kMiB + 12 * kMiB);
  pool.check_invariants();
}

TEST_CASE("block pool: best fit, and no merging across adjacent segments", "[cpu][allocator]") {
  BlockPool pool(true);
  Segments mem;
  char* both = mem.get(4 * kMiB);  // two segments that touch in memory
  size_t b = 0;
  char* s0 = static_cast<char*>(pool.take_from_new_segment(3, both, 2 * kMiB, 2 * kMiB, &b));
  char* s1 = static_cast<char*>(pool.take_from_new_segment(3, both + 2 * kMiB, 2 * kMiB, kMiB, &b));
  CHECK(s0 == both);
  CHECK(b == kMiB);
  pool.give_back(s0);
  pool.give_back(s1);
  pool.check_invariants();
  CHECK(pool.free_bytes() == 4 * kMiB);
  CHECK(pool.remove_free_segments().size() == 2);  // two segments, never one block of 4 MiB

  // Of the free blocks that fit, the smallest is taken.
  BlockPool fit(true);
  std::vector<char*> held;
  for (int i = 0; i < 6; ++i) held.push_back(take(fit, mem, 3, 100 * 1024, &b));
  fit.give_back(held[1]);  // a 100 KiB hole
  fit.give_back(held[3]);
  fit.give_back(held[4]);  // a 200 KiB hole
  CHECK(take(fit, mem, 3, 150 * 1024, &b) == held[3]);
  CHECK(take(fit, mem, 3, 90 * 1024, &b) == held[1]);
  fit.check_invariants();
}

TEST_CASE("block pool: keys keep their blocks apart, and rekey moves whole segments",
          "[cpu][allocator]") {
  BlockPool pool(true);
  Segments mem;
  size_t b = 0;
  char* graph_held = take(pool, mem, 17, 4096, &b);  // a graph's private pool (odd key)
  char* graph_free = take(pool, mem, 17, 8192, &b);
  CHECK(pool.segment_count() == 1);
  pool.give_back(graph_free);
  size_t got = 0;
  CHECK(pool.take(16, 8192, &got) == nullptr);  // the stream does not get the graph's blocks
  pool.rekey(17, 16);                           // the graph is destroyed
  pool.check_invariants();
  CHECK(pool.take(16, 8192, &got) == graph_free);
  pool.give_back(graph_held);  // a block in use at the move comes back to the stream's key
  CHECK(pool.take(16, 4096, &got) == graph_held);
  pool.check_invariants();
  CHECK(pool.take(17, 512, &got) == nullptr);  // nothing left under the old key

  // Wholly free segments of a kept key (a live graph's pool) stay; the others go.
  BlockPool two(true);
  char* kept = take(two, mem, 19, 4096, &b);
  char* gone = take(two, mem, 20, 4096, &b);
  two.give_back(kept);
  two.give_back(gone);
  const auto removed = two.remove_free_segments([](uintptr_t key) { return key == 19; });
  REQUIRE(removed.size() == 1);
  CHECK(removed[0].first == gone);
  CHECK(two.segment_count() == 1);
  CHECK(two.take(19, 4096, &got) == kept);
  two.check_invariants();
}

TEST_CASE("block pool: without splitting, blocks are whole and waste at most a quarter",
          "[cpu][allocator]") {
  BlockPool pool(false);
  Segments mem;
  size_t b = 0;
  char* p = take(pool, mem, 1, 3000001, &b);
  CHECK(b == 4 * kMiB);
  pool.give_back(p);
  CHECK(pool.take(1, pool.round(4 * kMiB), &b) == p);  // the same size: reused
  pool.give_back(p);
  CHECK(pool.take(1, pool.round(2 * kMiB), &b) == nullptr);  // half of it would be wasted
  CHECK(pool.take(1, 3 * kMiB + 512 * 1024, &b) == p);       // within a quarter: the whole block
  CHECK(b == 4 * kMiB);
  pool.check_invariants();
}

TEST_CASE("block pool: a long random sequence keeps blocks disjoint and the books exact",
          "[cpu][allocator]") {
  for (bool split : {true, false}) {
    BlockPool pool(split);
    Segments mem;
    std::mt19937 rng(split ? 11 : 12);
    struct Held {
      size_t size;
      uintptr_t key;
    };
    std::map<char*, Held> held;  // the shadow model: what is handed out
    std::vector<char*> order;    // the same blocks in the order taken (addresses vary by run)
    uintptr_t pool_key = 101;    // a graph pool, moved to the stream key 100 now and then
    for (int step = 0; step < 6000; ++step) {
      const int op = static_cast<int>(rng() % 100);
      if (op < 55 || held.empty()) {
        const size_t kinds[] = {1 + rng() % 4096, 1 + rng() % kMiB, 1 + rng() % (12 * kMiB)};
        const size_t nbytes = kinds[rng() % 3];
        const uintptr_t key = rng() % 4 == 0 ? pool_key : 100;
        size_t b = 0;
        char* p = take(pool, mem, key, nbytes, &b);
        CHECK(b >= nbytes);
        if (split) CHECK(b < pool.round(nbytes) + kMiB + 1);
        // Disjoint from every block handed out.
        auto next = held.lower_bound(p);
        if (next != held.end()) REQUIRE(p + b <= next->first);
        if (next != held.begin()) {
          const auto prev = std::prev(next);
          REQUIRE(prev->first + prev->second.size <= p);
        }
        held[p] = Held{b, key};
        order.push_back(p);
      } else if (op < 97) {
        const size_t i = rng() % order.size();
        const auto it = held.find(order[i]);
        REQUIRE(pool.give_back(it->first) == it->second.size);
        held.erase(it);
        order[i] = order.back();
        order.pop_back();
      } else if (op < 99) {
        pool.rekey(pool_key, 100);
        for (auto& [p, h] : held) h.key = h.key == pool_key ? 100 : h.key;
        pool_key += 2;
      } else {
        for (const auto& [base, bytes] : pool.remove_free_segments()) mem.release(base);
      }
      if (step % 50 == 0) pool.check_invariants();
    }
    pool.check_invariants();
    size_t handed = 0;
    for (const auto& [p, h] : held) handed += h.size;
    CHECK(pool.reserved_bytes() == handed + pool.free_bytes());
    for (const auto& [p, h] : held) pool.give_back(p);
    for (const auto& [base, bytes] : pool.remove_free_segments()) mem.release(base);
    CHECK(pool.reserved_bytes() == 0);
    CHECK(pool.segment_count() == 0);
    pool.check_invariants();
  }
}

TEST_CASE("host allocations replayed under the device allocator's rules", "[cpu][allocator]") {
  using ska::DType;
  using ska::Tensor;
  const auto bytes = [](size_t n) {
    return Tensor::empty({static_cast<int64_t>(n)}, DType::kU8, ska::Device::cpu());
  };
  const auto reserved = [] { return static_cast<size_t>(ska::host_device_rules_stats().reserved); };
  const auto peak = [] {
    return static_cast<size_t>(ska::host_device_rules_stats().peak_reserved);
  };
  const Tensor before = bytes(3 * kMiB);  // made before the replay: never counted
  ska::set_host_device_rules(true);
  CHECK(reserved() == 0);
  CHECK(peak() == 0);
  {
    Tensor a = bytes(3 * kMiB);  // up to 10 MiB: a 20 MiB segment
    CHECK(reserved() == 20 * kMiB);
    CHECK(ska::host_device_rules_stats().requested == int64_t{3 << 20});
    const Tensor b = bytes(12 * kMiB + 1);  // the 17 MiB left of it, split
    CHECK(reserved() == 20 * kMiB);
    const Tensor c = bytes(30 * kMiB);  // past 10 MiB: a segment of its own size
    CHECK(reserved() == 50 * kMiB);
    a = Tensor();
    const Tensor d = bytes(4 * kMiB);  // the 5 MiB block left after b, not worth splitting
    CHECK(reserved() == 50 * kMiB);
    const Tensor e = bytes(100);  // small: a 2 MiB segment of its own class
    CHECK(reserved() == 52 * kMiB);
    const Tensor f = bytes(3 * kMiB);  // a's block, free again
    CHECK(reserved() == 52 * kMiB);
    CHECK(ska::host_device_rules_stats().segments == 3);
    const Tensor g = bytes(3 * kMiB);  // nothing free that large: a new 20 MiB segment
    CHECK(reserved() == 72 * kMiB);
    CHECK(ska::host_device_rules_stats().segments == 4);
    {
      const ska::HostKernelScratch in_a_kernel(true);
      const Tensor scratch = bytes(64 * kMiB);  // a CPU kernel's own: left out
      CHECK(reserved() == 72 * kMiB);
      CHECK(ska::host_device_rules_stats().peak_requested == int64_t{(52 << 20) + 101});
    }
    {
      const ska::HostKernelScratch not_cpu(false);
      const Tensor t = bytes(64 * kMiB);
      CHECK(reserved() == 136 * kMiB);
    }
  }
  CHECK(reserved() == 136 * kMiB);  // freed blocks stay cached
  CHECK(ska::host_device_rules_stats().requested == 0);
  CHECK(ska::host_device_rules_stats().peak_requested == int64_t{(116 << 20) + 101});
  CHECK(peak() == 136 * kMiB);
  ska::host_allocator().empty_cache();  // the free segments go back
  CHECK(reserved() == 0);
  CHECK(peak() == 136 * kMiB);
  ska::host_allocator().reset_peak();
  CHECK(peak() == 0);
  ska::set_host_device_rules(false);
  const Tensor h = bytes(3 * kMiB);  // not replayed
  CHECK(reserved() == 0);
}
