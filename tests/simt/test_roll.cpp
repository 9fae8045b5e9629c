// torch.roll's kernel's own code (cuda/kernels/roll.cu), run on the host by tests/simt: Swin's
// cyclic shift of channels-last windows (rows moved as 16-byte packs), a shifted last dim and a
// strided view (elements one by one), 1-, 2-, 4- and 8-byte elements, and a 0-dim tensor: every
// element against the source index torch.roll names, and the same bits in other thread orders.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "tests/simt/roll_host.h"
#include "tests/simt/values.h"

namespace {

using Dims = std::vector<int64_t>;

struct Case {
  std::string name;
  Dims sizes, strides, shifts;
  size_t elem_bytes, moved;  // the element size and what the launch should move
};

std::vector<Case> cases() {
  return {
      {"Swin's shift of [2, 8, 8, 96] bf16 by (-2, -2) over H and W: 16-byte packs",
       {2, 8, 8, 96},
       {8 * 8 * 96, 8 * 96, 96, 1},
       {0, 6, 6, 0},
       2,
       16},
      {"its f32 form", {2, 8, 8, 96}, {8 * 8 * 96, 8 * 96, 96, 1}, {0, 6, 6, 0}, 4, 16},
      {"a shifted last dim [3, 10] by 3: elements", {3, 10}, {10, 1}, {1, 3}, 4, 4},
      {"a shifted last dim of whole packs [4, 16] f32 by 4: still elements",
       {4, 16},
       {16, 1},
       {0, 4},
       4,
       4},
      {"a transposed view [6, 5] of [5, 6], shifts (2, 4)", {6, 5}, {1, 6}, {2, 4}, 2, 2},
      {"bytes [4, 7, 3], shifts (1, 0, 2)", {4, 7, 3}, {21, 3, 1}, {1, 0, 2}, 1, 1},
      {"8-byte elements [5, 4], shift (3, 0): 16-byte packs of two", {5, 4}, {4, 1}, {3, 0}, 8, 16},
      {"a 0-dim tensor", {}, {}, {}, 4, 4},
  };
}

TEST_CASE("simt: roll: every element from its shifted source, packs and elements",
          "[cpu][simt][roll]") {
  for (const Case& c : cases()) {
    INFO(c.name);
    int64_t n = 1, span = 1;
    for (size_t d = 0; d < c.sizes.size(); ++d) {
      n *= c.sizes[d];
      span += (c.sizes[d] - 1) * c.strides[d];
    }
    // Distinct bytes per element, so that a wrong source shows.
    std::vector<float4> xs(static_cast<size_t>(span) * c.elem_bytes / 16 + 2);
    auto* x = reinterpret_cast<unsigned char*>(xs.data());
    for (size_t i = 0; i < static_cast<size_t>(span) * c.elem_bytes; ++i) {
      x[i] = static_cast<unsigned char>(i * 7 + i / 251);
    }
    std::vector<float4> outs(static_cast<size_t>(n) * c.elem_bytes / 16 + 2);
    std::vector<float4> want = outs;
    std::memset(static_cast<void*>(outs.data()), 0xff, outs.size() * sizeof(float4));
    std::memset(static_cast<void*>(want.data()), 0xff, want.size() * sizeof(float4));
    auto* w = reinterpret_cast<unsigned char*>(want.data());
    // out[i] = x[(i - shift) mod size] in every dim, at x's strides.
    std::vector<int64_t> idx(c.sizes.size(), 0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t src = 0;
      for (size_t d = 0; d < c.sizes.size(); ++d) {
        src += ((idx[d] - c.shifts[d] + c.sizes[d]) % c.sizes[d]) * c.strides[d];
      }
      std::memcpy(w + i * c.elem_bytes, x + src * c.elem_bytes, c.elem_bytes);
      for (size_t d = c.sizes.size(); d-- > 0;) {
        if (++idx[d] < c.sizes[d]) break;
        idx[d] = 0;
      }
    }
    const size_t moved =
        ska::simt::roll::roll(x, c.sizes, c.strides, c.shifts, c.elem_bytes, outs.data());
    CHECK(moved == c.moved);
    CHECK(std::memcmp(outs.data(), want.data(), want.size() * sizeof(float4)) == 0);
    ska::simt::in_other_orders(101, [&](const char* order) {
      INFO(order);
      std::vector<float4> again(outs.size());
      std::memset(static_cast<void*>(again.data()), 0xff, again.size() * sizeof(float4));
      ska::simt::roll::roll(x, c.sizes, c.strides, c.shifts, c.elem_bytes, again.data());
      CHECK(std::memcmp(again.data(), want.data(), want.size() * sizeof(float4)) == 0);
    });
  }
}

}  // namespace
