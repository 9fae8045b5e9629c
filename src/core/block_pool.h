// The block bookkeeping of the caching allocators: segments taken from the system, split into
// blocks for requests and merged again when their blocks are given back. No system calls here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

namespace ska {

// Every segment and its blocks belong to one key (in the CUDA allocator: the stream that
// allocated them, or a CUDA Graph's private pool); a block is only handed out for a request of
// its own key. Small requests (up to kSmallLimit) and large ones come from separate segments, so
// that small blocks do not pin down large segments.
//
// With splitting (the device allocator), requests round up to 512 bytes; a small request gets a
// 2 MiB segment, one up to 10 MiB a 20 MiB segment, a larger one a segment of its own size
// rounded up to 2 MiB. A free block larger than the request is split when the remainder is a
// useful block (512 bytes in small segments, more than 1 MiB in large ones), and a block given
// back merges with its free neighbours in the same segment. Without splitting (pinned host
// memory), every segment is one block: small requests round up to 512 bytes, large ones to
// 2 MiB, and a cached block serves a request that it exceeds by at most a quarter.
class BlockPool {
 public:
  static constexpr size_t kSmallLimit = size_t{1} << 20;  // 1 MiB
  static constexpr size_t kMaxRequest = size_t{1} << 60;  // beyond this, rounding could overflow

  explicit BlockPool(bool split) : split_(split) {}

  bool splits() const { return split_; }

  // The size a request of `nbytes` (0 < nbytes <= kMaxRequest) is served with, before a larger
  // cached block is handed out whole.
  size_t round(size_t nbytes) const;

  // The size of the segment to take from the system for a request rounded by round().
  size_t segment_size(size_t size) const;

  // A free block of `key` for a request of rounded `size`: its address, with *block_size set to
  // the block's size (at least `size`). nullptr when none fits.
  void* take(uintptr_t key, size_t size, size_t* block_size);

  // Registers a segment [base, base + segment_bytes) that the caller took from the system for a
  // request of rounded `size` (segment_bytes >= size), and takes the request from it.
  void* take_from_new_segment(uintptr_t key, void* base, size_t segment_bytes, size_t size,
                              size_t* block_size);

  // Gives back a block handed out by take(): it becomes free for its key and merges with its
  // free neighbours. Returns the block's size; 0 (and nothing changes) for an unknown address.
  size_t give_back(void* ptr);

  // Removes every segment whose memory is all free, but those of the keys `keep` names, and
  // returns them (base, size), for the caller to give back to the system. (A live CUDA Graph's
  // pool must be kept: its replays write to its free blocks too.)
  std::vector<std::pair<void*, size_t>> remove_free_segments(
      const std::function<bool(uintptr_t key)>& keep = nullptr);

  // Moves every segment of key `from`, and so its blocks, free or handed out, to key `to`.
  void rekey(uintptr_t from, uintptr_t to);

  size_t reserved_bytes() const { return reserved_; }  // all segments
  size_t free_bytes() const;                           // the free blocks'
  size_t largest_free_bytes() const;                   // the largest free block's
  size_t segment_count() const { return segments_.size(); }

  // Throws std::logic_error when the bookkeeping is inconsistent: blocks that do not tile their
  // segments exactly, free neighbours left unmerged, a free list out of step. For tests.
  void check_invariants() const;

 private:
  struct Block {
    size_t size = 0;
    uintptr_t key = 0;
    char* segment = nullptr;  // base of the segment it was split from
    bool small = false;       // from a small segment
    bool free = false;
  };
  using FreeEntry = std::tuple<uintptr_t, bool, size_t, char*>;  // (key, small, size, address)

  bool is_small(size_t size) const { return size <= kSmallLimit; }
  void add_free(char* ptr, const Block& b) { free_.emplace(b.key, b.small, b.size, ptr); }
  void remove_free(char* ptr, const Block& b) {
    free_.erase(FreeEntry{b.key, b.small, b.size, ptr});
  }
  // Hands out the free block at `it` for `size`, splitting off the remainder when it pays.
  void* hand_out(std::map<char*, Block>::iterator it, size_t size, size_t* block_size);
  bool worth_splitting(const Block& b, size_t size) const;

  bool split_;
  std::map<char*, Block> blocks_;     // every block of every segment, by address
  std::set<FreeEntry> free_;          // the free ones, smallest first within a key and class
  std::map<char*, size_t> segments_;  // segment base -> its size
  size_t reserved_ = 0;
};

}  // namespace ska
