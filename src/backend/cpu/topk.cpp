// CPU kernels: argmax along a dim and top-k along the last dim.
#include <algorithm>
#include <cstdint>
#include <numeric>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"

namespace ska::cpu {

void argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  if (is_16bit_float(x.dtype())) return argmax(widen_f32(x), dim, out);
  dispatch_floating(x.dtype(), "argmax", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    int64_t* op = out.data<int64_t>();
    const int64_t len = x.shape()[dim], step = x.strides()[dim];
    // Iterate over out's elements; each scans x along `dim`.
    Shape out_strides_in_x = x.strides();
    out_strides_in_x[dim] = 0;
    for_each_row<2>(out.shape(), {out_strides_in_x, out.strides()},
                    [&](const auto& off, int64_t n, const auto& st) {
                      for (int64_t j = 0; j < n; ++j) {
                        const T* p = xp + off[0] + j * st[0];
                        int64_t best = 0;
                        for (int64_t k = 1; k < len; ++k) {
                          if (p[k * step] > p[best * step]) best = k;
                        }
                        op[off[1] + j * st[1]] = best;
                      }
                    });
  });
}

void topk(const Tensor& x, int64_t k, const Tensor& values, const Tensor& indices) {
  if (is_16bit_float(x.dtype())) {
    const Tensor result = f32_output(values);
    topk(widen_f32(x), k, result, indices);
    return round_into(result, values);
  }
  dispatch_floating(x.dtype(), "topk", [&](auto tag) {
    using T = decltype(tag);
    const int64_t len = x.shape().empty() ? 1 : x.shape().back();
    const int64_t rows = len == 0 ? 0 : x.numel() / len;
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* vp = static_cast<T*>(values.data_ptr());
    int64_t* ip = indices.data<int64_t>();
    parallel_for(rows, [&](int64_t r) {
      const T* row = xp + r * len;
      std::vector<int64_t> order(static_cast<size_t>(len));
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      for (int64_t j = 0; j < k; ++j) {
        ip[r * k + j] = order[static_cast<size_t>(j)];
        vp[r * k + j] = row[order[static_cast<size_t>(j)]];
      }
    }, 16);
  });
}

}  // namespace ska::cpu
