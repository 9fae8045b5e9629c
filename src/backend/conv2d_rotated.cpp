// The forward form of a stride-1 convolution's backward-input pass (see conv2d_rotated.h).
#include "backend/conv2d_rotated.h"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace ska {
namespace {

// [taps - 1, ..., 1, 0] as i64 on `device`, made once per device and length: reversing the
// flattened kH x kW taps reverses both axes. Kept, so that no step uploads it again (a graph
// capture replays the first steps' tensor); never freed, as device memory must not be released
// by static destructors after the CUDA runtime has gone.
Tensor reversed_taps(int64_t taps, Device device) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::pair<std::pair<int, int>, int64_t>, Tensor>();
  const auto key =
      std::make_pair(std::make_pair(static_cast<int>(device.type), device.index), taps);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache->find(key);
  if (it == cache->end()) {
    std::vector<int64_t> order(static_cast<size_t>(taps));
    for (int64_t t = 0; t < taps; ++t) order[static_cast<size_t>(t)] = taps - 1 - t;
    it = cache->emplace(key, Tensor::from_vector(order, {taps}, DType::kI64, device)).first;
  }
  return it->second;
}

}  // namespace

bool conv2d_rotatable(const Shape& w, const Conv2dParams& p) {
  return w.size() == 4 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 &&
         p.dilation_w == 1 && p.pad_h >= 0 && p.pad_w >= 0 && p.pad_h <= w[2] - 1 &&
         p.pad_w <= w[3] - 1 && p.groups >= 1 && w[0] % p.groups == 0;
}

Conv2dParams conv2d_rotated_params(const Shape& w, const Conv2dParams& p) {
  SKA_CHECK(conv2d_rotatable(w, p), ValueError, "conv2d_rotated_params: weight ", shape_str(w),
            " with stride ", p.stride_h, "x", p.stride_w, ", dilation ", p.dilation_h, "x",
            p.dilation_w, ", padding ", p.pad_h, "x", p.pad_w,
            " has no forward form of its backward-input pass");
  Conv2dParams r;
  r.pad_h = w[2] - 1 - p.pad_h;
  r.pad_w = w[3] - 1 - p.pad_w;
  r.groups = p.groups;
  return r;
}

Tensor conv2d_rotated_filter(const Tensor& w, int64_t groups) {
  SKA_CHECK(w.dim() == 4 && w.is_contiguous() && groups >= 1 && w.size(0) % groups == 0,
            ShapeError, "conv2d_rotated_filter: weight ", w.str(),
            " must be contiguous [C_out, C_in / groups, kH, kW] with C_out a multiple of ",
            groups, " groups");
  const int64_t c_out_group = w.size(0) / groups, c_in_group = w.size(1);
  const int64_t kh = w.size(2), kw = w.size(3), taps = kh * kw;
  // [groups, C_out_g, C_in_g, taps] seen as [groups, C_in_g, C_out_g, taps], taps reversed.
  const Tensor source =
      Tensor::make_view(w.storage(), {groups, c_in_group, c_out_group, taps},
                        {c_out_group * c_in_group * taps, taps, c_in_group * taps, 1}, w.offset(),
                        w.dtype());
  const Shape shape = {groups, c_in_group, c_out_group, taps};
  const Tensor swapped = Tensor::empty(shape, w.dtype(), w.device());
  SKA_KERNEL(w.device(), copy)(source, swapped);
  const Tensor out = Tensor::empty(shape, w.dtype(), w.device());
  SKA_KERNEL(w.device(), index_select)(swapped, 3, reversed_taps(taps, w.device()), out);
  return Tensor::make_view(out.storage(), {groups * c_in_group, c_out_group, kh, kw},
                           {c_out_group * taps, taps, kw, 1}, 0, w.dtype());
}

}  // namespace ska
