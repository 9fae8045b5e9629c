// CPU kernels: uniform, normal and Bernoulli draws from Philox4x32-10 (same stream as CUDA).
#include "core/random.h"

#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/widen.h"
#include "backend/dropout_checks.h"

namespace ska::cpu {

namespace {

// Calls f(i, word) for every element i of an n-element draw.
template <typename F>
void for_each_word(int64_t n, uint64_t seed, uint64_t offset, F&& f) {
  const int64_t groups = (n + 3) / 4;
  parallel_for(groups, [&](int64_t g) {
    const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
    for (int k = 0; k < 4 && g * 4 + k < n; ++k) f(g * 4 + k, r.w[k]);
  }, 4096);
}

// The offset of a draw with its capture base added (kernels.inc).
uint64_t with_base(uint64_t offset, const Tensor& offset_base, const char* kernel) {
  if (!offset_base.defined()) return offset;
  SKA_CHECK(offset_base.numel() == 1 && offset_base.dtype() == DType::kI64, DTypeError, kernel,
            ": offset_base must be one i64 element, got ", offset_base.str());
  return offset + static_cast<uint64_t>(*static_cast<const int64_t*>(offset_base.data_ptr()));
}

}  // namespace

void random_uniform(const Tensor& out, uint64_t seed, uint64_t offset, double lo, double hi,
                    const Tensor& offset_base) {
  offset = with_base(offset, offset_base, "random_uniform");
  if (is_16bit_float(out.dtype())) {
    const Tensor result = f32_output(out);
    random_uniform(result, seed, offset, lo, hi, Tensor());
    return round_into(result, out);
  }
  dispatch_floating(out.dtype(), "random_uniform", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    for_each_word(out.numel(), seed, offset, [&](int64_t i, uint32_t w) {
      p[i] = static_cast<T>(lo + (hi - lo) * static_cast<double>(philox_uniform(w)));
    });
  });
}

void random_normal(const Tensor& out, uint64_t seed, uint64_t offset, double mean, double std,
                   const Tensor& offset_base) {
  offset = with_base(offset, offset_base, "random_normal");
  if (is_16bit_float(out.dtype())) {
    const Tensor result = f32_output(out);
    random_normal(result, seed, offset, mean, std, Tensor());
    return round_into(result, out);
  }
  dispatch_floating(out.dtype(), "random_normal", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    const int64_t n = out.numel();
    const int64_t groups = (n + 3) / 4;
    parallel_for(groups, [&](int64_t g) {
      const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
      for (int pair = 0; pair < 2; ++pair) {
        // u1 in (0, 1] so the log is finite.
        const float u1 = 1.0f - philox_uniform(r.w[2 * pair]);
        const float u2 = philox_uniform(r.w[2 * pair + 1]);
        const float radius = std::sqrt(-2.0f * std::log(u1));
        const float angle = 6.28318530717958647692f * u2;
        const int64_t i = g * 4 + 2 * pair;
        if (i < n) p[i] = static_cast<T>(mean + std * radius * std::cos(angle));
        if (i + 1 < n) p[i + 1] = static_cast<T>(mean + std * radius * std::sin(angle));
      }
    }, 4096);
  });
}

void random_bernoulli(const Tensor& out, uint64_t seed, uint64_t offset, double keep_prob,
                      double scale, const Tensor& offset_base) {
  offset = with_base(offset, offset_base, "random_bernoulli");
  if (is_16bit_float(out.dtype())) {
    const Tensor result = f32_output(out);
    random_bernoulli(result, seed, offset, keep_prob, scale, Tensor());
    return round_into(result, out);
  }
  dispatch_floating(out.dtype(), "random_bernoulli", [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(out.data_ptr());
    const float keep = static_cast<float>(keep_prob);
    const T s = static_cast<T>(scale);
    for_each_word(out.numel(), seed, offset, [&](int64_t i, uint32_t w) {
      p[i] = philox_uniform(w) < keep ? s : T(0);
    });
  });
}

namespace {

// A dropout mask's scale as a mask of `dtype` holds it (rounded to 16 bits for those), in f64.
double mask_scale(DType dtype, double scale) {
  if (!is_16bit_float(dtype)) return scale;
  const Tensor rounded = Tensor::full({1}, static_cast<float>(scale), DType::kF32).to(dtype);
  return rounded.to(DType::kF32).to_vector<float>()[0];
}

void check_pair(const char* kernel, const Tensor& x, const Tensor& out) {
  SKA_CHECK(x.is_contiguous() && out.is_contiguous() && x.dtype() == out.dtype() &&
                x.numel() == out.numel(),
            ValueError, kernel,
            ": input and output must be contiguous, of one dtype and size, got ", x.str(), " and ",
            out.str());
}

void check_bits(const char* kernel, const Tensor& bits, int64_t n) {
  SKA_CHECK(bits.dtype() == DType::kU8 && bits.is_contiguous() && bits.numel() == (n + 7) / 8,
            ValueError, kernel, ": bits must be ", (n + 7) / 8, " contiguous u8 bytes for ", n,
            " elements, got ", bits.str());
}

}  // namespace

void dropout_apply(const Tensor& x, uint64_t seed, uint64_t offset, double keep_prob, double scale,
                   const Tensor& offset_base, const Tensor& out) {
  check_pair("dropout_apply", x, out);
  offset = with_base(offset, offset_base, "dropout_apply");
  if (is_16bit_float(x.dtype())) {  // the mask's scale as the 16-bit mask holds it, then f32
    const Tensor result = f32_output(out);
    dropout_apply(widen_f32(x), seed, offset, keep_prob, mask_scale(x.dtype(), scale), Tensor(),
                  result);
    return round_into(result, out);
  }
  dispatch_floating(x.dtype(), "dropout_apply", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    const float keep = static_cast<float>(keep_prob);
    const T s = static_cast<T>(scale);
    for_each_word(x.numel(), seed, offset, [&](int64_t i, uint32_t w) {
      op[i] = xp[i] * (philox_uniform(w) < keep ? s : T(0));  // x * 0 keeps NaN, as mul does
    });
  });
}

void dropout_forward(const Tensor& x, uint64_t seed, uint64_t offset, double keep_prob,
                     double scale, const Tensor& offset_base, const Tensor& out,
                     const Tensor& bits) {
  check_pair("dropout_forward", x, out);
  const int64_t n = x.numel();
  check_bits("dropout_forward", bits, n);
  offset = with_base(offset, offset_base, "dropout_forward");
  if (is_16bit_float(x.dtype())) {
    const Tensor result = f32_output(out);
    dropout_forward(widen_f32(x), seed, offset, keep_prob, mask_scale(x.dtype(), scale), Tensor(),
                    result, bits);
    return round_into(result, out);
  }
  dispatch_floating(x.dtype(), "dropout_forward", [&](auto tag) {
    using T = decltype(tag);
    const T* xp = static_cast<const T*>(x.data_ptr());
    T* op = static_cast<T*>(out.data_ptr());
    uint8_t* bp = static_cast<uint8_t*>(bits.data_ptr());
    const float keep = static_cast<float>(keep_prob);
    const T s = static_cast<T>(scale);
    // Byte j holds elements 8j to 8j + 7: the words of counters offset + 2j and offset + 2j + 1.
    parallel_for(
        bits.numel(),
        [&](int64_t j) {
          uint32_t byte = 0;
          for (int64_t half = 0; half < 2 && 8 * j + 4 * half < n; ++half) {
            const int64_t g = 2 * j + half;
            const PhiloxOut r = philox4x32_10(seed, offset + static_cast<uint64_t>(g));
            for (int k = 0; k < 4 && 4 * g + k < n; ++k) {
              const bool kept = philox_uniform(r.w[k]) < keep;
              op[4 * g + k] = xp[4 * g + k] * (kept ? s : T(0));
              byte |= static_cast<uint32_t>(kept) << (4 * half + k);
            }
          }
          bp[j] = static_cast<uint8_t>(byte);
        },
        1024);
  });
}

void dropout_backward(const Tensor& grad, const Tensor& bits, double scale, const Tensor& grad_x) {
  check_pair("dropout_backward", grad, grad_x);
  check_bits("dropout_backward", bits, grad.numel());
  if (is_16bit_float(grad.dtype())) {
    const Tensor result = f32_output(grad_x);
    dropout_backward(widen_f32(grad), bits, mask_scale(grad.dtype(), scale), result);
    return round_into(result, grad_x);
  }
  dispatch_floating(grad.dtype(), "dropout_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* gp = static_cast<const T*>(grad.data_ptr());
    T* op = static_cast<T*>(grad_x.data_ptr());
    const uint8_t* bp = static_cast<const uint8_t*>(bits.data_ptr());
    const T s = static_cast<T>(scale);
    parallel_for(
        grad.numel(), [&](int64_t i) { op[i] = gp[i] * ((bp[i >> 3] >> (i & 7)) & 1 ? s : T(0)); },
        16384);
  });
}

// The reference composes the two kernels the unfused ops run, so its bits are theirs.
void unary_dropout_forward(UnaryOp op, const Tensor& x, double a, double b, uint64_t seed,
                           uint64_t offset, double keep_prob, double scale,
                           const Tensor& offset_base, const Tensor& out, const Tensor& bits) {
  const Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  unary(op, x, y, a, b);
  dropout_forward(y, seed, offset, keep_prob, scale, offset_base, out, bits);
}

void unary_dropout_backward(UnaryOp op, const Tensor& grad, const Tensor& bits, double scale,
                            const Tensor& x, double a, double b, const Tensor& grad_x) {
  const Tensor dropped = Tensor::empty(grad.shape(), grad.dtype(), grad.device());
  dropout_backward(grad, bits, scale, dropped);
  unary_backward(op, dropped, x, grad_x, a, b);
}

// The references compose the kernels the unfused ops run (dropout, then add; add's gradient cast
// to y's dtype, then dropout's), so their bits are those ops'.
void dropout_add_forward(const Tensor& x, const Tensor& y, uint64_t seed, uint64_t offset,
                         double keep_prob, double scale, const Tensor& offset_base,
                         const Tensor& out, const Tensor& bits) {
  check_dropout_add_forward("dropout_add_forward", x, y, out, bits);
  const Tensor dropped = Tensor::empty(y.shape(), y.dtype(), y.device());
  dropout_forward(y, seed, offset, keep_prob, scale, offset_base, dropped, bits);
  binary(BinaryOp::kAdd, x, dropped, out);
}

void dropout_add_backward(const Tensor& grad, const Tensor& bits, double scale,
                          const Tensor& grad_y) {
  check_dropout_add_backward("dropout_add_backward", grad, bits, grad_y);
  const Tensor narrow = grad.dtype() == grad_y.dtype() ? grad : grad.to(grad_y.dtype());
  dropout_backward(narrow.view(grad_y.shape()), bits, scale, grad_y);
}

}  // namespace ska::cpu
