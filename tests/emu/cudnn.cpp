// cuDNN for the emulated device (tests/emu/device.h): the convolution calls cuda/kernels/conv2d.cpp
// makes (4-d NCHW or NHWC tensors, KCRS or KRSC filters, padding, stride, dilation, groups;
// cross-correlation), computed on host memory in f64 (f32 data rounded to TF32 first unless the
// math is CUDNN_FMA_MATH) and rounded once to the output's type, with
// y = alpha * result + beta * y. Every query offers one algorithm in FMA and one in tensor-op math,
// deterministic, needing no workspace.
#include <cudnn.h>

#include <stdexcept>
#include <vector>

#include "tests/emu/device.h"
#include "tests/emu/values.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};
struct cudnnTensorStruct {
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};
struct cudnnFilterStruct {
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, r = 0, s = 0;
};
struct cudnnConvolutionStruct {
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1, groups = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

// Element (a, b, y, x) of a 4-d operand: [N, C, H, W] (or [K, C, R, S]) in its format.
int64_t offset(cudnnTensorFormat_t f, int /*d0*/, int d1, int d2, int d3, int a, int b, int y,
               int x) {
  if (f == CUDNN_TENSOR_NHWC) return ((int64_t{a} * d2 + y) * d3 + x) * d1 + b;
  return ((int64_t{a} * d1 + b) * d2 + y) * d3 + x;
}
ska::emu::Element element_of(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_FLOAT:
      return ska::emu::Element::kF32;
    case CUDNN_DATA_BFLOAT16:
      return ska::emu::Element::kBF16;
    case CUDNN_DATA_HALF:
      return ska::emu::Element::kF16;
    default:
      throw std::logic_error("emulated cuDNN: an unsupported data type");
  }
}
double load(const void* p, cudnnDataType_t t, int64_t i) {
  return ska::emu::load(p, element_of(t), i);
}
void store(void* p, cudnnDataType_t t, int64_t i, double v) {
  ska::emu::store(p, element_of(t), i, v);
}
using ska::emu::tf32;

bool fits(const cudnnTensorStruct& x, const cudnnFilterStruct& w, const cudnnConvolutionStruct& c,
          const cudnnTensorStruct& y) {
  const auto out = [](int in, int pad, int k, int dil, int stride) {
    return (in + 2 * pad - dil * (k - 1) - 1) / stride + 1;
  };
  return c.groups > 0 && x.c == w.c * c.groups && w.k % c.groups == 0 && y.n == x.n && y.c == w.k &&
         y.h == out(x.h, c.pad_h, w.r, c.dil_h, c.stride_h) &&
         y.w == out(x.w, c.pad_w, w.s, c.dil_w, c.stride_w) && x.type == y.type && w.type == x.type;
}

enum class Pass { kForward, kData, kFilter };

// The pass's output, summed in f64: y from x and w, dx from dy and w, or dw from x and dy.
void run(Pass pass, const cudnnTensorStruct& xd, const void* x, const cudnnFilterStruct& wd,
         const void* w, const cudnnConvolutionStruct& cd, const cudnnTensorStruct& yd,
         const void* y, void* out, float alpha, float beta) {
  const cudnnTensorFormat_t xf = xd.format, wf = wd.format, yf = yd.format;
  const bool round = cd.math != CUDNN_FMA_MATH && xd.type == CUDNN_DATA_FLOAT;
  const auto in = [&](const void* p, cudnnDataType_t t, int64_t i) {
    const double v = load(p, t, i);
    return round ? tf32(v) : v;
  };
  const int kg = wd.k / cd.groups;
  const int64_t out_count = pass == Pass::kForward ? int64_t{yd.n} * yd.c * yd.h * yd.w
                            : pass == Pass::kData  ? int64_t{xd.n} * xd.c * xd.h * xd.w
                                                   : int64_t{wd.k} * wd.c * wd.r * wd.s;
  std::vector<double> acc(static_cast<size_t>(out_count), 0.0);
  for (int n = 0; n < yd.n; ++n) {
    for (int k = 0; k < wd.k; ++k) {
      const int g = k / kg;
      for (int oh = 0; oh < yd.h; ++oh) {
        for (int ow = 0; ow < yd.w; ++ow) {
          const int64_t yi = offset(yf, yd.n, yd.c, yd.h, yd.w, n, k, oh, ow);
          const double dy = pass == Pass::kForward ? 0.0 : in(y, yd.type, yi);
          double sum = 0.0;
          for (int c = 0; c < wd.c; ++c) {
            const int xc = g * wd.c + c;
            for (int r = 0; r < wd.r; ++r) {
              const int ih = oh * cd.stride_h - cd.pad_h + r * cd.dil_h;
              if (ih < 0 || ih >= xd.h) continue;
              for (int s = 0; s < wd.s; ++s) {
                const int iw = ow * cd.stride_w - cd.pad_w + s * cd.dil_w;
                if (iw < 0 || iw >= xd.w) continue;
                const int64_t xi = offset(xf, xd.n, xd.c, xd.h, xd.w, n, xc, ih, iw);
                const int64_t wi = offset(wf, wd.k, wd.c, wd.r, wd.s, k, c, r, s);
                if (pass == Pass::kForward) {
                  sum += in(x, xd.type, xi) * in(w, wd.type, wi);
                } else if (pass == Pass::kData) {
                  acc[static_cast<size_t>(xi)] += dy * in(w, wd.type, wi);
                } else {
                  acc[static_cast<size_t>(wi)] += dy * in(x, xd.type, xi);
                }
              }
            }
          }
          if (pass == Pass::kForward) acc[static_cast<size_t>(yi)] = sum;
        }
      }
    }
  }
  const cudnnDataType_t t = pass == Pass::kFilter ? wd.type
                            : pass == Pass::kData ? xd.type
                                                  : yd.type;
  for (int64_t i = 0; i < out_count; ++i) {
    double v = alpha * acc[static_cast<size_t>(i)];
    if (beta != 0.0f) v += beta * load(out, t, i);
    store(out, t, i, v);
  }
}

template <typename Perf, typename Algo>
void offer(int requested, int* count, Perf* perf) {
  *count = 0;
  const cudnnMathType_t maths[2] = {CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH};
  for (int i = 0; i < 2 && i < requested; ++i) {
    perf[i] = Perf{};
    perf[i].algo = static_cast<Algo>(i == 0 ? 1 : 0);
    perf[i].status = CUDNN_STATUS_SUCCESS;
    perf[i].time = 0.1f * static_cast<float>(i + 1);
    perf[i].memory = 0;
    perf[i].determinism = CUDNN_DETERMINISTIC;
    perf[i].mathType = maths[i];
    *count = i + 1;
  }
}

float scalar(const void* p) { return *static_cast<const float*>(p); }

}  // namespace

extern "C" {

const char* cudnnGetErrorString(cudnnStatus_t s) {
  return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_(emulated) error";
}
void cudnnGetLastErrorString(char* message, size_t max) {
  if (max > 0) message[0] = '\0';
}
cudnnStatus_t cudnnCreate(cudnnHandle_t* h) {
  *h = new cudnnContext();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* d) {
  *d = new cudnnTensorStruct();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t f,
                                         cudnnDataType_t t, int n, int c, int h, int w) {
  if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *d = {f, t, n, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* d) {
  *d = new cudnnFilterStruct();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t t,
                                         cudnnTensorFormat_t f, int k, int c, int h, int w) {
  if (k <= 0 || c <= 0 || h <= 0 || w <= 0) return CUDNN_STATUS_BAD_PARAM;
  *d = {f, t, k, c, h, w};
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* d) {
  *d = new cudnnConvolutionStruct();
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d) {
  delete d;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int pad_h, int pad_w,
                                              int u, int v, int dil_h, int dil_w,
                                              cudnnConvolutionMode_t mode, cudnnDataType_t) {
  if (u <= 0 || v <= 0 || dil_h <= 0 || dil_w <= 0 || pad_h < 0 || pad_w < 0) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (mode != CUDNN_CROSS_CORRELATION) return CUDNN_STATUS_NOT_SUPPORTED;
  d->pad_h = pad_h;
  d->pad_w = pad_w;
  d->stride_h = u;
  d->stride_w = v;
  d->dil_h = dil_h;
  d->dil_w = dil_w;
  d->mode = mode;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d, int groups) {
  if (groups <= 0) return CUDNN_STATUS_BAD_PARAM;
  d->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m) {
  d->math = m;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t c,
                                                     const cudnnTensorDescriptor_t y,
                                                     const int requested, int* count,
                                                     cudnnConvolutionFwdAlgoPerf_t* perf) {
  if (!fits(*x, *w, *c, *y)) return CUDNN_STATUS_BAD_PARAM;
  offer<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(requested, count, perf);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void*, const cudnnFilterDescriptor_t w,
    const void*, const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y, void*,
    const int requested, int* count, cudnnConvolutionFwdAlgoPerf_t* perf, void*, size_t) {
  return cudnnGetConvolutionForwardAlgorithm_v7(h, x, w, c, y, requested, count, perf);
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t,
                                                      const cudnnFilterDescriptor_t,
                                                      const cudnnConvolutionDescriptor_t,
                                                      const cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t, size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void* alpha,
                                      const cudnnTensorDescriptor_t xd, const void* x,
                                      const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t cd,
                                      cudnnConvolutionFwdAlgo_t, void*, size_t, const void* beta,
                                      const cudnnTensorDescriptor_t yd, void* y) {
  if (!fits(*xd, *wd, *cd, *yd)) return CUDNN_STATUS_BAD_PARAM;
  const cudnnTensorStruct xs = *xd, ys = *yd;
  const cudnnFilterStruct ws = *wd;
  const cudnnConvolutionStruct cs = *cd;
  const float a = scalar(alpha), b = scalar(beta);
  const cudaError_t e = ska::emu::submit(
      h->stream, [=] { run(Pass::kForward, xs, x, ws, w, cs, ys, nullptr, y, a, b); });
  return e == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx, const int requested,
    int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  if (!fits(*dx, *w, *c, *dy)) return CUDNN_STATUS_BAD_PARAM;
  offer<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(requested, count, perf);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const void*, const cudnnTensorDescriptor_t dy,
    const void*, const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx, void*,
    const int requested, int* count, cudnnConvolutionBwdDataAlgoPerf_t* perf, void*, size_t) {
  return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, w, dy, c, dx, requested, count, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, const cudnnFilterDescriptor_t, const cudnnTensorDescriptor_t,
    const cudnnConvolutionDescriptor_t, const cudnnTensorDescriptor_t,
    cudnnConvolutionBwdDataAlgo_t, size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void* alpha,
                                           const cudnnFilterDescriptor_t wd, const void* w,
                                           const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t cd,
                                           cudnnConvolutionBwdDataAlgo_t, void*, size_t,
                                           const void* beta, const cudnnTensorDescriptor_t dxd,
                                           void* dx) {
  if (!fits(*dxd, *wd, *cd, *dyd)) return CUDNN_STATUS_BAD_PARAM;
  const cudnnTensorStruct xs = *dxd, ys = *dyd;
  const cudnnFilterStruct ws = *wd;
  const cudnnConvolutionStruct cs = *cd;
  const float a = scalar(alpha), b = scalar(beta);
  const cudaError_t e = ska::emu::submit(
      h->stream, [=] { run(Pass::kData, xs, nullptr, ws, w, cs, ys, dy, dx, a, b); });
  return e == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw, const int requested,
    int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  if (!fits(*x, *dw, *c, *dy)) return CUDNN_STATUS_BAD_PARAM;
  offer<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(requested, count,
                                                                              perf);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const void*, const cudnnTensorDescriptor_t dy,
    const void*, const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw, void*,
    const int requested, int* count, cudnnConvolutionBwdFilterAlgoPerf_t* perf, void*, size_t) {
  return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, x, dy, c, dw, requested, count, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
    const cudnnConvolutionDescriptor_t, const cudnnFilterDescriptor_t,
    cudnnConvolutionBwdFilterAlgo_t, size_t* bytes) {
  *bytes = 0;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void* alpha,
                                             const cudnnTensorDescriptor_t xd, const void* x,
                                             const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t cd,
                                             cudnnConvolutionBwdFilterAlgo_t, void*, size_t,
                                             const void* beta, const cudnnFilterDescriptor_t dwd,
                                             void* dw) {
  if (!fits(*xd, *dwd, *cd, *dyd)) return CUDNN_STATUS_BAD_PARAM;
  const cudnnTensorStruct xs = *xd, ys = *dyd;
  const cudnnFilterStruct ws = *dwd;
  const cudnnConvolutionStruct cs = *cd;
  const float a = scalar(alpha), b = scalar(beta);
  const cudaError_t e = ska::emu::submit(
      h->stream, [=] { run(Pass::kFilter, xs, x, ws, nullptr, cs, ys, dy, dw, a, b); });
  return e == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
