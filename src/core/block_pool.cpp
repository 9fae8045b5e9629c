// The caching allocators' block bookkeeping: best-fit search, splitting and merging (block_pool.h).
#include "core/block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace ska {
namespace {

constexpr size_t kRound = 512;                       // every request rounds up to this
constexpr size_t kLargeRound = size_t{2} << 20;      // large segments round up to 2 MiB
constexpr size_t kSmallSegment = size_t{2} << 20;    // one segment holds many small blocks
constexpr size_t kMediumLimit = size_t{10} << 20;    // requests up to this share ...
constexpr size_t kMediumSegment = size_t{20} << 20;  // ... 20 MiB segments

size_t round_up(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

[[noreturn]] void fail(const std::string& what) { throw std::logic_error("BlockPool: " + what); }

}  // namespace

size_t BlockPool::round(size_t nbytes) const {
  if (!split_ && !is_small(nbytes)) return round_up(nbytes, kLargeRound);
  return round_up(nbytes, kRound);
}

size_t BlockPool::segment_size(size_t size) const {
  if (!split_) return size;
  if (is_small(size)) return kSmallSegment;
  if (size <= kMediumLimit) return kMediumSegment;
  return round_up(size, kLargeRound);
}

bool BlockPool::worth_splitting(const Block& b, size_t size) const {
  const size_t rest = b.size - size;
  return b.small ? rest >= kRound : rest > kSmallLimit;
}

void* BlockPool::take(uintptr_t key, size_t size, size_t* block_size) {
  const bool small = is_small(size);
  const auto it = free_.lower_bound(FreeEntry{key, small, size, nullptr});
  if (it == free_.end() || std::get<0>(*it) != key || std::get<1>(*it) != small) return nullptr;
  if (!split_ && std::get<2>(*it) > size + size / 4) return nullptr;  // would waste too much
  return hand_out(blocks_.find(std::get<3>(*it)), size, block_size);
}

void* BlockPool::take_from_new_segment(uintptr_t key, void* base, size_t segment_bytes, size_t size,
                                       size_t* block_size) {
  char* p = static_cast<char*>(base);
  if (segment_bytes < size) fail("a segment smaller than its request");
  if (!segments_.emplace(p, segment_bytes).second) fail("a segment registered twice");
  reserved_ += segment_bytes;
  Block b{segment_bytes, key, p, is_small(size), true};
  const auto it = blocks_.emplace(p, b).first;
  add_free(p, b);
  return hand_out(it, size, block_size);
}

void* BlockPool::hand_out(std::map<char*, Block>::iterator it, size_t size, size_t* block_size) {
  Block& b = it->second;
  remove_free(it->first, b);
  b.free = false;
  if (split_ && worth_splitting(b, size)) {
    Block rest{b.size - size, b.key, b.segment, b.small, true};
    b.size = size;
    blocks_.emplace_hint(std::next(it), it->first + size, rest);
    add_free(it->first + size, rest);
  }
  *block_size = b.size;
  return it->first;
}

size_t BlockPool::give_back(void* ptr) {
  auto it = blocks_.find(static_cast<char*>(ptr));
  if (it == blocks_.end() || it->second.free) return 0;
  const size_t size = it->second.size;
  it->second.free = true;
  // Merge with the next block, then fold this one into the previous, within the segment.
  const auto next = std::next(it);
  if (next != blocks_.end() && next->second.free && next->second.segment == it->second.segment) {
    remove_free(next->first, next->second);
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    const auto prev = std::prev(it);
    if (prev->second.free && prev->second.segment == it->second.segment) {
      remove_free(prev->first, prev->second);
      prev->second.size += it->second.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  add_free(it->first, it->second);
  return size;
}

std::vector<std::pair<void*, size_t>> BlockPool::remove_free_segments(
    const std::function<bool(uintptr_t key)>& keep) {
  std::vector<std::pair<void*, size_t>> removed;
  for (auto s = segments_.begin(); s != segments_.end();) {
    const auto b = blocks_.find(s->first);
    if (b == blocks_.end() || !b->second.free || b->second.size != s->second ||
        (keep && keep(b->second.key))) {
      ++s;
      continue;
    }
    remove_free(b->first, b->second);
    blocks_.erase(b);
    reserved_ -= s->second;
    removed.emplace_back(s->first, s->second);
    s = segments_.erase(s);
  }
  return removed;
}

void BlockPool::rekey(uintptr_t from, uintptr_t to) {
  if (from == to) return;
  for (auto& [ptr, b] : blocks_) {
    if (b.key != from) continue;
    if (b.free) remove_free(ptr, b);
    b.key = to;
    if (b.free) add_free(ptr, b);
  }
}

size_t BlockPool::free_bytes() const {
  size_t n = 0;
  for (const FreeEntry& f : free_) n += std::get<2>(f);
  return n;
}

size_t BlockPool::largest_free_bytes() const {
  size_t n = 0;
  for (const FreeEntry& f : free_) n = std::max(n, std::get<2>(f));
  return n;
}

void BlockPool::check_invariants() const {
  size_t reserved = 0;
  size_t free_blocks = 0;
  for (const auto& [base, bytes] : segments_) {
    reserved += bytes;
    auto it = blocks_.find(base);
    if (it == blocks_.end()) fail("a segment without a block at its base");
    const Block& first = it->second;
    size_t covered = 0;
    bool prev_free = false;
    for (; it != blocks_.end() && it->second.segment == base; ++it) {
      const Block& b = it->second;
      if (it->first != base + covered) fail("blocks that do not tile their segment");
      if (b.key != first.key || b.small != first.small) fail("one segment, two keys or classes");
      if (b.size == 0) fail("an empty block");
      if (b.free && prev_free) fail("two free neighbours left unmerged");
      if (b.free != (free_.count(FreeEntry{b.key, b.small, b.size, it->first}) == 1)) {
        fail("a free list out of step with its blocks");
      }
      if (!split_ && b.size != bytes) fail("a split block in a pool that does not split");
      free_blocks += b.free ? 1 : 0;
      prev_free = b.free;
      covered += b.size;
    }
    if (covered != bytes) fail("blocks that do not cover their segment");
  }
  if (reserved != reserved_) fail("reserved bytes out of step with the segments");
  if (free_blocks != free_.size()) fail("free entries without blocks");
  size_t in_segments = 0;
  for (const auto& entry : blocks_) in_segments += segments_.count(entry.second.segment);
  if (in_segments != blocks_.size()) fail("a block outside every segment");
}

}  // namespace ska
