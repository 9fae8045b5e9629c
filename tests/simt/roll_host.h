// torch.roll's kernel (cuda/kernels/roll.cu) on host memory, run by tests/simt
// (tests/simt/roll_host.cpp builds the kernel file for the host), planned and launched as roll
// does: x a view (sizes, strides in elements of elem_bytes bytes) rolled by shifts (each in
// [0, size)) into a contiguous out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ska::simt::roll {

// Returns the size of the elements the launch moved (16: rows moved as 16-byte packs).
size_t roll(const void* x, const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
            const std::vector<int64_t>& shifts, size_t elem_bytes, void* out);

}  // namespace ska::simt::roll
