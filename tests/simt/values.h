// What the tests/simt tests share: element conversions, buffers no kernel has written yet (every
// word all ones, NaN in bf16 and f16; also at or one element off a 16-byte boundary),
// bit-for-bit equality, the dropouts fused kernels draw, the warp and block sums' orders, and
// runs in other thread orders.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "core/random.h"
#include "tests/simt/simt.h"

namespace ska::simt {

// x rounded to T (bf16, f16 or f32: then x itself).
template <typename T>
T round_to(float x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half(x);
  } else {
    return x;
  }
}

// The value of a bf16, f16 or f32 element (exact in f32 and f64).
template <typename T>
double value(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return x;
  }
}

// value(x) as a float (exact: every bf16, f16 and f32 is one).
template <typename T>
float as_float(T x) {
  return static_cast<float>(value(x));
}

template <typename T>
std::vector<T> unwritten(size_t n) {
  std::vector<T> v(n);
  std::memset(static_cast<void*>(v.data()), 0xff, n * sizeof(T));
  return v;
}

// Whether an element still holds unwritten's bits (all ones).
template <typename T>
bool untouched(const T& e) {
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &e, sizeof(T));
  for (unsigned char b : bytes) {
    if (b != 0xff) return false;
  }
  return true;
}

template <typename E>
bool same_bits(const std::vector<E>& a, const std::vector<E>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(E)) == 0;
}

// n elements of T at a 16-byte boundary, or one element past it (`misalign`: the kernels'
// element accesses where they would take 16 bytes), with 16 more after them; every byte starts
// all ones, so that a store past the n shows.
template <typename T>
struct Buffer {
  std::vector<float4> storage;
  T* data;
  int64_t n;
  Buffer(int64_t count, bool misalign) : n(count) {
    const size_t shift = misalign ? 1 : 0;
    storage.resize((static_cast<size_t>(count) + shift + 16) * sizeof(T) / sizeof(float4) + 1);
    std::memset(static_cast<void*>(storage.data()), 0xff, storage.size() * sizeof(float4));
    data = reinterpret_cast<T*>(storage.data()) + shift;
  }
  std::vector<T> values() const { return std::vector<T>(data, data + n); }
  // Whether the 16 elements after the last are still all ones.
  bool untouched_after() const {
    const auto* b = reinterpret_cast<const unsigned char*>(data + n);
    for (size_t i = 0; i < 16 * sizeof(T); ++i) {
      if (b[i] != 0xff) return false;
    }
    return true;
  }
};

// A Buffer of standard normal values rounded to T.
template <typename T>
Buffer<T> random_buffer(int64_t n, bool misalign, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Buffer<T> b(n, misalign);
  for (int64_t i = 0; i < n; ++i) b.data[i] = round_to<T>(normal(rng));
  return b;
}

// A dropout drawn inside a fused kernel, as the kernels take it (cuda::BranchDrop, of the same
// members): element i kept where kept(d, i), bit i % 8 of bits[i / 8] recording it.
struct Dropout {
  uint8_t* bits = nullptr;               // null: no dropout
  const int64_t* offset_base = nullptr;  // added to offset where set (a captured step's counter)
  uint64_t seed = 0, offset = 0;
  float keep = 1.0f, scale = 1.0f;
};

// d as the kernels' struct K.
template <typename K>
K kernel_form(const Dropout& d) {
  K k;
  k.bits = d.bits;
  k.offset_base = d.offset_base;
  k.seed = d.seed;
  k.offset = d.offset;
  k.keep = d.keep;
  k.scale = d.scale;
  return k;
}

// Element i's draw, as dropout_forward draws it: the uniform of Philox counter offset (plus the
// base) + i / 4, word i % 4, below keep.
inline bool kept(const Dropout& d, int64_t i) {
  const uint64_t offset = d.offset + (d.offset_base ? static_cast<uint64_t>(*d.offset_base) : 0);
  const PhiloxOut r = philox4x32_10(d.seed, offset + static_cast<uint64_t>(i / 4));
  return philox_uniform(r.w[i % 4]) < d.keep;
}

// __shfl_xor_sync's butterfly over v.size() lanes' values (a power of two: 32 for a warp, fewer
// for a row's lanes within one) as the kernels run it (offsets v.size() / 2, ..., 1; lane l takes
// combine(v[l], v[l ^ offset])): lane 0's result, in host floats.
template <typename Combine>
float warp_butterfly(std::vector<float> v, Combine combine) {
  const size_t lanes = v.size();
  for (size_t o = lanes / 2; o > 0; o /= 2) {
    std::vector<float> w(lanes);
    for (size_t l = 0; l < lanes; ++l) w[l] = combine(v[l], v[l ^ o]);
    v = w;
  }
  return v[0];
}

// common.cuh's block_sum over a block's per-thread values (a multiple of 32): each warp's
// butterfly, then one over the warps' sums (0 past the last warp).
inline float block_sum(const std::vector<float>& threads) {
  const auto add = [](float a, float b) { return a + b; };
  std::vector<float> warps(32, 0.0f);
  for (size_t w = 0; w < threads.size() / 32; ++w) {
    warps[w] = warp_butterfly(
        std::vector<float>(threads.begin() + 32 * w, threads.begin() + 32 * (w + 1)), add);
  }
  return warp_butterfly(warps, add);
}

// Runs f(order) with a block's threads last to first, shuffled by `seed`, and warp by warp from
// the last (order names it), then goes back to first to last.
template <typename F>
void in_other_orders(uint64_t seed, F&& f) {
  struct Restore {
    ~Restore() { set_schedule(Schedule::kForward); }  // also when f throws
  } restore;
  for (Schedule s : {Schedule::kReverse, Schedule::kShuffled, Schedule::kWarpsAhead}) {
    set_schedule(s, seed);
    f(s == Schedule::kReverse    ? "threads reversed"
      : s == Schedule::kShuffled ? "threads shuffled"
                                 : "warps ahead");
  }
}

}  // namespace ska::simt
