// CPU kernel: torch.roll in one pass. Rows along the last dim are copied as runs (two runs when
// the last dim itself moves), rows spread over OpenMP threads.
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/roll_checks.h"

namespace ska::cpu {

void roll(const Tensor& x, const std::vector<int64_t>& shifts, const Tensor& out) {
  check_roll("roll", x, shifts, out);
  const int64_t numel = x.numel();
  if (numel == 0) return;
  const int64_t rank = x.dim();
  const size_t esize = x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  if (rank == 0) {
    std::memcpy(dst, src, esize);
    return;
  }
  const int64_t cols = x.size(rank - 1), shift = shifts.back();
  const int64_t col_stride = x.strides().back();
  const int64_t rows = numel / cols;
#pragma omp parallel for schedule(static) if (numel > 32768)
  for (int64_t r = 0; r < rows; ++r) {
    // The source row of output row r: each outer coordinate moved back by its shift.
    int64_t rest = r, offset = 0;
    for (int64_t d = rank - 2; d >= 0; --d) {
      const int64_t n = x.size(d), i = rest % n;
      rest /= n;
      const int64_t from = i >= shifts[static_cast<size_t>(d)]
                               ? i - shifts[static_cast<size_t>(d)]
                               : i - shifts[static_cast<size_t>(d)] + n;
      offset += from * x.strides()[static_cast<size_t>(d)];
    }
    char* row = dst + static_cast<size_t>(r * cols) * esize;
    const char* in = src + offset * static_cast<int64_t>(esize);
    if (col_stride == 1) {  // out[shift:] = in[:cols - shift], out[:shift] = in[cols - shift:]
      std::memcpy(row + shift * esize, in, static_cast<size_t>(cols - shift) * esize);
      std::memcpy(row, in + (cols - shift) * static_cast<int64_t>(esize),
                  static_cast<size_t>(shift) * esize);
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t from = c >= shift ? c - shift : c - shift + cols;
        std::memcpy(row + c * esize, in + from * col_stride * static_cast<int64_t>(esize), esize);
      }
    }
  }
}

}  // namespace ska::cpu
