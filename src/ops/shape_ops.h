// Differentiable shape ops that copy: cat, stack, split/chunk/unbind (views), constant pad, roll,
// grid neighbourhoods (im2col).
// Pure views (reshape, permute, narrow, expand, ...) are Tensor methods.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace ska {

Tensor cat(const TensorList& xs, int64_t dim);
// cat into `out` (the result's shape, dtype and device; not requiring grad: a fresh tensor, which
// becomes the result, recorded as cat's output). A piece that is already out's view at its place
// (its producer wrote it there) is not copied: so the pieces of a tensor are made in place and
// put together without the copy. Other pieces must not overlap out.
Tensor cat(const TensorList& xs, int64_t dim, const Tensor& out);
Tensor stack(const TensorList& xs, int64_t dim);
// An uninitialised row-major tensor of `shape` whose rows (along the last dim) start a multiple
// of 16 bytes apart: the first shape[-1] columns of a tensor with rows padded to 16 bytes.
// Kernels that stage rows in shared memory copy them 16 bytes at a time, where rows of an odd
// length (CSKA-ViT's 65 logits a row) go element by element. Contiguous where the rows need no
// padding.
Tensor empty_aligned_rows(const Shape& shape, DType dtype, Device device);
// Views of consecutive pieces along `dim`.
TensorList split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
TensorList split(const Tensor& x, int64_t piece, int64_t dim);  // last piece may be shorter
TensorList chunk(const Tensor& x, int64_t chunks, int64_t dim);
// Views of every index along `dim`, that dim removed (torch.unbind): q, k and v of a projection.
// One autograd node: the backward writes each piece's gradient into one tensor laid out in
// memory as x is, so that the views x came from undo without a copy (where x.select() for each
// piece would zero-fill a whole x-sized gradient per piece and add them up).
TensorList unbind(const Tensor& x, int64_t dim);
// pads = {last_lo, last_hi, second_last_lo, second_last_hi, ...} as torch.nn.functional.pad.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);
// Cyclic shifts along dims, as torch.roll.
Tensor roll(const Tensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& dims);
// The k x k neighbourhood (k odd, zero outside the grid) of every position of a channels-last
// grid, taps before channels: x [..., H, W, C] -> [..., H, W, k*k, C] with
//   out[..., y, x, ky*k + kx, c] = x[..., y + ky - k/2, x + kx - k/2, c]   (0 off the grid).
// Flattened to [..., H*W, k*k*C] it is im2col, so a stride-1 "same" convolution becomes a matrix
// product with the weight [C_out, C, k, k] reordered to [C_out, k, k, C]. Backward sums each
// tap's gradient back onto the positions it read. Copies only (k*k strided copies each way).
Tensor grid_neighbourhoods(const Tensor& x, int64_t kernel);

// y itself (no copy), recorded so that the backward pass gives each tensor of `unused` a zero
// gradient: a shortcut that skips work whose result did not reach y (a ViT's last block
// computing its class token alone) leaves the parameters of that work with the gradients the
// whole computation gives them, zeros, rather than none (an optimizer skips a parameter without
// a gradient, its step count and weight decay included).
Tensor with_zero_grads(const Tensor& y, const TensorList& unused);
// The same neighbourhoods as rows of `width` columns (width > k*k*C): [..., H, W, width] holding
// the k*k*C values of grid_neighbourhoods' [..., k*k, C], then a one, then zeros. A matrix
// product with filters [C_out, width] (the weight's k*k*C values, then the bias, then zeros)
// is the convolution with its bias added in the product's own accumulation, its bias gradient
// computed by the product's weight gradient; a width that is a multiple of 8 keeps 16-bit rows
// 16-byte aligned for the tensor cores.
Tensor grid_neighbourhood_rows(const Tensor& x, int64_t kernel, int64_t width);

}  // namespace ska
