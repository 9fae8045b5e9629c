// Channels-last depthwise 2-D convolution (stride 1, dilation 1, one filter per channel): the
// arithmetic of the CUDA kernels in conv2d_depthwise.cu, written once for the device and the host,
// so that a CPU test runs the kernels' own indexing and accumulation block by block
// (tests/cuda/test_conv2d_depthwise.cpp) and only the launch itself is left to a GPU.
//
// Each thread owns `Vec` adjacent channels (16-byte loads of [N, H, W, C]) and a strip of `Strip`
// adjacent outputs of one row, accumulated in f32 registers over the K x K taps; a block covers up
// to kTileChannels channels (threadIdx.x) and kThreads / that many strips (threadIdx.y), and
// stages its channels' filters in shared memory as f32, tap-major. The input gradient is the same
// correlation of the output gradient with the flipped filter (padding K - 1 - pad). The weight
// gradient: each thread sums dy * x over its strips for one filter row (blockIdx.z), the block adds
// its threads' sums in a fixed order and writes one partial per slice of strips (blockIdx.x), and a
// second kernel adds the partials in order: no atomics, the same bits on every run and every GPU.
#pragma once

#include <cstdint>

// SKA_DW_HD: layout arithmetic, for the launchers and the kernels. SKA_DW_DEV: a thread's work,
// which reads through the element type's `Io` (device loads in the kernels, host ones in the test).
#if defined(__CUDACC__)
#define SKA_DW_HD __host__ __device__ __forceinline__
#define SKA_DW_DEV __device__ __forceinline__
#define SKA_DW_UNROLL _Pragma("unroll")
#else
#define SKA_DW_HD inline
#define SKA_DW_DEV inline
#define SKA_DW_UNROLL
#endif

namespace ska::cuda::depthwise {

constexpr int kThreads = 256;         // threads per block, every kernel
constexpr int kTileChannels = 128;    // channels per block: 49 x 128 f32 staged taps = 25 KB
constexpr int kForwardStrip = 8;      // outputs along W per thread (forward, input gradient)
constexpr int kWeightStrip = 4;       // outputs along W per thread (weight gradient)
constexpr int kForwardBlocks = 1024;  // at most this many forward blocks: each stages its taps once
constexpr int kWeightBlocks = 1024;   // about this many weight-gradient blocks (from shapes only)

// One call: x [N, H, W, C] -> y [N, Ho, Wo, C] with Ho = H + 2 pad_h - K + 1 (likewise Wo).
struct Geometry {
  int n, h, w, c;
  int ho, wo;
  int pad_h, pad_w;
};

// How a kernel's threads cover a call: blockDim (channel_threads, strip_threads), grid.y =
// channel_tiles; strips of `strip` outputs enumerate (n, oh, ow0) with ow0 fastest.
struct Layout {
  int vec, strip;
  int channel_threads, strip_threads, channel_tiles;
  int strips_per_row;
  int64_t strips;
};

SKA_DW_HD Layout make_layout(const Geometry& g, int vec, int strip) {
  Layout l{};
  l.vec = vec;
  l.strip = strip;
  const int groups = g.c / vec;
  const int tile = kTileChannels / vec;
  l.channel_threads = groups < tile ? groups : tile;
  l.strip_threads = kThreads / l.channel_threads;
  l.channel_tiles = (groups + l.channel_threads - 1) / l.channel_threads;
  l.strips_per_row = (g.wo + strip - 1) / strip;
  l.strips = static_cast<int64_t>(g.n) * g.ho * l.strips_per_row;
  return l;
}

// The output position a strip starts at.
struct StripPos {
  int n, oh, ow0;
};
SKA_DW_HD StripPos strip_pos(const Geometry& g, const Layout& l, int64_t strip) {
  const int64_t row = strip / l.strips_per_row;
  StripPos p;
  p.ow0 = static_cast<int>(strip - row * l.strips_per_row) * l.strip;
  p.oh = static_cast<int>(row % g.ho);
  p.n = static_cast<int>(row / g.ho);
  return p;
}

SKA_DW_HD int64_t pixel_offset(const Geometry& g, int n, int h, int w, int rows, int cols) {
  return ((static_cast<int64_t>(n) * rows + h) * cols + w) * g.c;
}

// Staging: element e of the block's tap-major table [K * K][channel_threads * vec] (f32) from the
// filter w [C, 1, K, K]; taps reversed when `flip` (the input gradient), zeros past C.
template <int K, typename T, typename Io>
SKA_DW_DEV float staged_tap(const T* w, const Geometry& g, const Layout& l, int channel_tile,
                            bool flip, int e) {
  const int width = l.channel_threads * l.vec;
  const int tap = e / width;
  const int ch = channel_tile * width + (e - tap * width);
  if (ch >= g.c) return 0.0f;
  return Io::to_f32(w[static_cast<int64_t>(ch) * K * K + (flip ? K * K - 1 - tap : tap)]);
}

// One input row under a strip of outputs [ow0, ow0 + Strip): each column u of the row that the
// strip's taps reach and that lies inside (padding adds nothing) is loaded once (Vec channels
// from `row`, the row's first pixel at the thread's channels) and f(t, j, xv) is called for every
// output t of the strip that tap j pairs with it (u = t + j), in order of u, then t.
template <int K, int Strip, int Vec, typename T, typename Io, typename F>
SKA_DW_DEV void walk_row(const T* row, const Geometry& g, int ow0, F&& f) {
  SKA_DW_UNROLL
  for (int u = 0; u < Strip + K - 1; ++u) {
    const int iw = ow0 - g.pad_w + u;
    if (iw < 0 || iw >= g.w) continue;
    float xv[Vec];
    Io::template load<Vec>(row + static_cast<int64_t>(iw) * g.c, xv);
    SKA_DW_UNROLL
    for (int t = 0; t < Strip; ++t) {
      const int j = u - t;
      if (j >= 0 && j < K) f(t, j, xv);
    }
  }
}

// One thread of the forward kernel: y[n, oh, ow0 .. ow0 + Strip, c0 .. c0 + Vec] = bias + the
// correlation of x with the staged taps (taps[(i * K + j) * tap_stride + v]).
template <int K, int Strip, int Vec, typename T, typename Io>
SKA_DW_DEV void forward_strip(const T* x, const float* taps, int tap_stride, const T* bias,
                              const Geometry& g, StripPos p, int c0, T* y) {
  float acc[Strip][Vec];
  SKA_DW_UNROLL
  for (int v = 0; v < Vec; ++v) {
    const float b = bias ? Io::to_f32(bias[c0 + v]) : 0.0f;
    SKA_DW_UNROLL
    for (int t = 0; t < Strip; ++t) acc[t][v] = b;
  }
  for (int i = 0; i < K; ++i) {
    const int ih = p.oh - g.pad_h + i;
    if (ih < 0 || ih >= g.h) continue;
    float wrow[K][Vec];
    SKA_DW_UNROLL
    for (int j = 0; j < K; ++j) SKA_DW_UNROLL
    for (int v = 0; v < Vec; ++v) wrow[j][v] = taps[(i * K + j) * tap_stride + v];
    walk_row<K, Strip, Vec, T, Io>(x + pixel_offset(g, p.n, ih, 0, g.h, g.w) + c0, g, p.ow0,
                                   [&](int t, int j, const float* xv) {
                                     SKA_DW_UNROLL
                                     for (int v = 0; v < Vec; ++v) acc[t][v] += xv[v] * wrow[j][v];
                                   });
  }
  T* out = y + pixel_offset(g, p.n, p.oh, p.ow0, g.ho, g.wo) + c0;
  SKA_DW_UNROLL
  for (int t = 0; t < Strip; ++t)
    if (p.ow0 + t < g.wo) Io::template store<Vec>(out + static_cast<int64_t>(t) * g.c, acc[t]);
}

// Blocks along the strips (grid.x) of the forward kernel: one row of threads a strip, at most
// `cap` (kForwardBlocks in the launches), so that a block walks several rows of strips for the
// taps it staged.
SKA_DW_HD int64_t forward_blocks(const Layout& l, int64_t cap = kForwardBlocks) {
  const int64_t rows = (l.strips + l.strip_threads - 1) / l.strip_threads;
  return rows < cap ? rows : cap;
}

// Thread (tx, ty) of forward block (bx, channel_tile) in a grid of `blocks` along the strips:
// strips bx * strip_threads + ty, then every blocks * strip_threads; `taps` is the block's
// staged table.
template <int K, int Vec, typename T, typename Io>
SKA_DW_DEV void forward_thread(const T* x, const float* taps, const T* bias, const Geometry& g,
                               const Layout& l, int64_t blocks, int64_t bx, int channel_tile,
                               int tx, int ty, T* y) {
  const int group = channel_tile * l.channel_threads + tx;
  if (group * Vec >= g.c) return;
  const int64_t step = blocks * l.strip_threads;
  for (int64_t s = bx * l.strip_threads + ty; s < l.strips; s += step) {
    forward_strip<K, kForwardStrip, Vec, T, Io>(x, taps + tx * Vec, l.channel_threads * Vec, bias,
                                                g, strip_pos(g, l, s), group * Vec, y);
  }
}

// One thread of the weight-gradient kernel, one strip: acc[j][v] += the sum over the strip's
// outputs of dy[n, oh, ow, c0 + v] * x[n, oh - pad_h + i, ow - pad_w + j, c0 + v].
template <int K, int Strip, int Vec, typename T, typename Io>
SKA_DW_DEV void weight_grad_strip(const T* x, const T* dy, const Geometry& g, int i, StripPos p,
                                  int c0, float (&acc)[K][Vec]) {
  const int ih = p.oh - g.pad_h + i;
  if (ih < 0 || ih >= g.h) return;
  float d[Strip][Vec];
  const T* drow = dy + pixel_offset(g, p.n, p.oh, p.ow0, g.ho, g.wo) + c0;
  SKA_DW_UNROLL
  for (int t = 0; t < Strip; ++t) {
    if (p.ow0 + t < g.wo) {
      Io::template load<Vec>(drow + static_cast<int64_t>(t) * g.c, d[t]);
    } else {
      SKA_DW_UNROLL
      for (int v = 0; v < Vec; ++v) d[t][v] = 0.0f;
    }
  }
  walk_row<K, Strip, Vec, T, Io>(x + pixel_offset(g, p.n, ih, 0, g.h, g.w) + c0, g, p.ow0,
                                 [&](int t, int j, const float* xv) {
                                   SKA_DW_UNROLL
                                   for (int v = 0; v < Vec; ++v) acc[j][v] += d[t][v] * xv[v];
                                 });
}

// Slices of strips (grid.x) of the weight-gradient kernel: about kWeightBlocks blocks in all, no
// more slices than there are strips per thread row.
SKA_DW_HD int weight_grad_slices(const Layout& l, int k) {
  const int64_t per_slice = l.strip_threads;
  const int64_t most = (l.strips + per_slice - 1) / per_slice;
  int64_t s = (kWeightBlocks + static_cast<int64_t>(l.channel_tiles) * k - 1) /
              (static_cast<int64_t>(l.channel_tiles) * k);
  if (s > most) s = most;
  return static_cast<int>(s < 1 ? 1 : s);
}

// Thread (tx, ty) of slice `slice`: its strips are lane, lane + lanes, ... with lane = slice *
// strip_threads + ty and lanes = slices * strip_threads.
template <int K, int Vec, typename T, typename Io>
SKA_DW_DEV void weight_grad_thread(const T* x, const T* dy, const Geometry& g, const Layout& l,
                                   int slices, int slice, int channel_tile, int i, int tx, int ty,
                                   float (&acc)[K][Vec]) {
  for (int j = 0; j < K; ++j)
    for (int v = 0; v < Vec; ++v) acc[j][v] = 0.0f;
  const int group = channel_tile * l.channel_threads + tx;
  if (group * Vec >= g.c) return;
  const int64_t lanes = static_cast<int64_t>(slices) * l.strip_threads;
  for (int64_t s = static_cast<int64_t>(slice) * l.strip_threads + ty; s < l.strips; s += lanes)
    weight_grad_strip<K, kWeightStrip, Vec, T, Io>(x, dy, g, i, strip_pos(g, l, s), group * Vec,
                                                   acc);
}

// The block's sum for tap j of the thread row tx: red holds every thread's acc[j] as
// red[ty][tx * Vec + v]; added over ty in order into partial[slice][c][i][j] (f32).
template <int K, int Vec>
SKA_DW_HD void weight_grad_block_sum(const float* red, const Geometry& g, const Layout& l,
                                     int slice, int channel_tile, int i, int j, int tx,
                                     float* partial) {
  const int group = channel_tile * l.channel_threads + tx;
  if (group * Vec >= g.c) return;
  const int width = l.channel_threads * Vec;
  for (int v = 0; v < Vec; ++v) {
    float s = 0.0f;
    for (int r = 0; r < l.strip_threads; ++r) s += red[r * width + tx * Vec + v];
    const int64_t ch = static_cast<int64_t>(group) * Vec + v;
    partial[(static_cast<int64_t>(slice) * g.c + ch) * K * K + i * K + j] = s;
  }
}

// Element e of the weight gradient [C, 1, K, K]: the slices' partials added in order.
SKA_DW_HD float weight_grad_total(const float* partial, int64_t elements, int slices, int64_t e) {
  float s = 0.0f;
  for (int k = 0; k < slices; ++k) s += partial[k * elements + e];
  return s;
}

}  // namespace ska::cuda::depthwise
