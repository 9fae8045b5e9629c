// The device-resident batch's crop-and-flip kernel's own code (cuda/kernels/augment.cu), run on
// the host by tests/simt: CIFAR's RandomCrop(32, padding 4) and horizontal flip with the
// normalisation, f32 and bf16, and a sample index outside the dataset (zeros). Every element
// against the pixel its sample's draws name (crop_flip_draw: the host pipeline's Philox words),
// the multiply and the add rounded separately as the CPU twin rounds them, zero padding outside
// the image, and the same bits in other thread orders.
// clang-format off
#include "tests/simt/simt.h"  // first: the kernels' headers below build for the host
// clang-format on

#include <cuda_bf16.h>

#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "backend/crop_flip_draw.h"
#include "tests/simt/augment_host.h"
#include "tests/simt/values.h"

namespace {

using bf16 = __nv_bfloat16;
using ska::simt::round_to;
using ska::simt::same_bits;

template <typename T>
void check() {
  const int64_t n = 6, h = 32, w = 32, c = 3, ho = 32, wo = 32;
  std::vector<uint8_t> images(static_cast<size_t>(n * h * w * c));
  std::mt19937 rng(121);
  for (uint8_t& v : images) v = static_cast<uint8_t>(rng() & 0xff);
  const std::vector<int64_t> index{4, 0, 5, 7, 2, 2, 1, -1};  // 7 and -1: outside the dataset
  const int64_t batch = static_cast<int64_t>(index.size());
  ska::CropFlipParams p;
  p.padding = 4;
  p.flip_p = 0.5;
  p.seed = 2026;
  p.epoch = 3;
  const float mean[3] = {0.4914f, 0.4822f, 0.4465f}, stdv[3] = {0.2470f, 0.2435f, 0.2616f};
  for (int k = 0; k < 3; ++k) {
    p.scale[k] = 1.0f / (255.0f * stdv[k]);
    p.shift[k] = -mean[k] / stdv[k];
  }
  std::vector<T> out = ska::simt::unwritten<T>(static_cast<size_t>(batch * c * ho * wo));
  ska::simt::augment::crop_flip<T>(images.data(), n, h, w, c, index.data(), batch, ho, wo, p,
                                   out.data());

  const int64_t range_y = h + 2 * p.padding - ho, range_x = w + 2 * p.padding - wo;
  std::vector<T> want(out.size());
  int flips = 0, offsets = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t sample = index[static_cast<size_t>(i)];
    const bool valid = sample >= 0 && sample < n;
    const ska::CropFlipDraw d =
        valid ? ska::crop_flip_draw(p, static_cast<uint64_t>(sample), range_y, range_x)
              : ska::CropFlipDraw{};
    flips += valid && d.flip;
    offsets += valid && (d.top != p.padding || d.left != p.padding);
    for (int64_t k = 0; k < c; ++k) {
      for (int64_t y = 0; y < ho; ++y) {
        for (int64_t x = 0; x < wo; ++x) {
          const size_t e = static_cast<size_t>(((i * c + k) * ho + y) * wo + x);
          if (!valid) {
            want[e] = round_to<T>(0.0f);
            continue;
          }
          const int64_t sy = d.top + y - p.padding;
          const int64_t sx = d.left + (d.flip ? wo - 1 - x : x) - p.padding;
          const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
          const float byte =
              inside ? static_cast<float>(images[((sample * h + sy) * w + sx) * c + k]) : 0.0f;
          const float scaled = byte * p.scale[k];
          want[e] = round_to<T>(scaled + p.shift[k]);
        }
      }
    }
  }
  CHECK(flips > 0);    // the draws flip some samples,
  CHECK(flips < 6);    // not all,
  CHECK(offsets > 0);  // and move some crops off the centre
  CHECK(same_bits(out, want));
  ska::simt::in_other_orders(122, [&](const char* order) {
    INFO(order);
    std::vector<T> again = ska::simt::unwritten<T>(out.size());
    ska::simt::augment::crop_flip<T>(images.data(), n, h, w, c, index.data(), batch, ho, wo, p,
                                     again.data());
    CHECK(same_bits(again, out));
  });
}

TEST_CASE("simt: crop and flip: every element from the pixel its sample's draws name",
          "[cpu][simt][augment]") {
  check<float>();
  check<bf16>();
}

}  // namespace
