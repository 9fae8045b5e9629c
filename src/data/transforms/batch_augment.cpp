// Random erasing and mixup/cutmix on batch tensors, with their gamma/beta samplers.
#include "data/transforms/batch_augment.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "autograd/grad_mode.h"
#include "core/error.h"
#include "ops/ops.h"

namespace ska::data {
namespace {
// Distinct stream families so batch-level draws never coincide with per-sample ones.
constexpr uint64_t kErasingSalt = 0x45524153ull << 32;  // "ERAS"
constexpr uint64_t kMixupSalt = 0x4D495855ull << 32;    // "MIXU"

void check_batch(const Tensor& images, const char* who) {
  SKA_CHECK(images.dim() == 4 && images.dtype() == DType::kF32, ValueError, who,
            ": expects f32 [B, C, H, W] images, got ", images.str());
}
}  // namespace

double sample_normal(SampleRng& rng) {
  const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

double sample_gamma(double alpha, SampleRng& rng) {
  SKA_CHECK(alpha > 0, ValueError, "gamma: alpha must be > 0, got ", alpha);
  if (alpha < 1.0) {
    const double u = 1.0 - rng.uniform();
    return sample_gamma(alpha + 1.0, rng) * std::pow(u, 1.0 / alpha);
  }
  const double d = alpha - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    double x, v;
    do {
      x = sample_normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = 1.0 - rng.uniform();
    if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

double sample_beta(double a, double b, SampleRng& rng) {
  const double x = sample_gamma(a, rng), y = sample_gamma(b, rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

// ------------------------------------------------------------------ random erasing
RandomErasing::RandomErasing(RandomErasingOptions o) : options_(o) {
  SKA_CHECK(o.probability >= 0 && o.probability <= 1 && o.min_area > 0 &&
                o.min_area <= o.max_area && o.min_aspect > 0 && o.min_count >= 1 &&
                o.max_count >= o.min_count,
            ValueError, "RandomErasing: invalid options");
}

void RandomErasing::apply(Tensor& images, uint64_t seed, uint64_t step) const {
  check_batch(images, "RandomErasing");
  NoGradGuard no_grad;
  const int64_t batch = images.size(0), chans = images.size(1);
  const int64_t img_h = images.size(2), img_w = images.size(3);
  const double log_lo = std::log(options_.min_aspect), log_hi = -log_lo;
  for (int64_t i = 0; i < batch; ++i) {
    SampleRng rng(seed, kErasingSalt ^ SampleRng::stream_of(step, static_cast<uint64_t>(i)));
    if (rng.uniform() > options_.probability) continue;
    const int count = options_.min_count == options_.max_count
                          ? options_.min_count
                          : rng.randint(options_.min_count, options_.max_count);
    const double area = static_cast<double>(img_h) * img_w;
    for (int n = 0; n < count; ++n) {
      for (int attempt = 0; attempt < 10; ++attempt) {
        const double target = rng.uniform(options_.min_area, options_.max_area) * area / count;
        const double aspect =
            std::exp(rng.uniform(std::min(log_lo, log_hi), std::max(log_lo, log_hi)));
        const int64_t h = std::lround(std::sqrt(target * aspect));
        const int64_t w = std::lround(std::sqrt(target / aspect));
        if (!(w < img_w && h < img_h)) continue;
        const int64_t top = rng.randint(0, static_cast<int>(img_h - h));
        const int64_t left = rng.randint(0, static_cast<int>(img_w - w));
        std::vector<float> noise(static_cast<size_t>(chans * h * w));
        for (float& v : noise) v = static_cast<float>(sample_normal(rng));
        images.select(0, i)
            .narrow(1, top, h)
            .narrow(2, left, w)
            .copy_(Tensor::from_vector(noise, Shape{chans, h, w}));
        break;
      }
    }
  }
}

// ------------------------------------------------------------------ mixup / cutmix
MixupCutmix::MixupCutmix(MixupOptions o, int64_t num_classes)
    : options_(o), num_classes_(num_classes) {
  SKA_CHECK(o.mixup_alpha >= 0 && o.cutmix_alpha >= 0 && o.prob >= 0 && o.prob <= 1 &&
                o.switch_prob >= 0 && o.switch_prob <= 1 && o.label_smoothing >= 0 &&
                o.label_smoothing < 1 && num_classes > 0,
            ValueError,
            "Mixup: invalid options (alphas >= 0, probabilities in [0, 1], "
            "label_smoothing in [0, 1), num_classes > 0)");
}

MixupDraw MixupCutmix::draw(int64_t height, int64_t width, uint64_t seed, uint64_t step) const {
  SampleRng rng(seed, kMixupSalt ^ SampleRng::stream_of(step, 0));
  MixupDraw d;
  const double ma = options_.mixup_alpha, ca = options_.cutmix_alpha;
  if ((ma <= 0 && ca <= 0) || rng.uniform() >= options_.prob) return d;
  if (ma > 0 && ca > 0) {
    d.cutmix = rng.uniform() < options_.switch_prob;
    d.lambda = d.cutmix ? sample_beta(ca, ca, rng) : sample_beta(ma, ma, rng);
  } else if (ma > 0) {
    d.lambda = sample_beta(ma, ma, rng);
  } else {
    d.cutmix = true;
    d.lambda = sample_beta(ca, ca, rng);
  }
  d.mixed = d.lambda != 1.0;
  if (!d.mixed || !d.cutmix) return d;
  // timm rand_bbox: cut = int(side * sqrt(1 - lam)), centre uniform in [0, side), clipped.
  const double r = std::sqrt(1.0 - d.lambda);
  const int cut_h = static_cast<int>(height * r), cut_w = static_cast<int>(width * r);
  const int cy = rng.randint(0, static_cast<int>(height) - 1);
  const int cx = rng.randint(0, static_cast<int>(width) - 1);
  d.box_y0 = std::clamp(cy - cut_h / 2, 0, static_cast<int>(height));
  d.box_y1 = std::clamp(cy + cut_h / 2, 0, static_cast<int>(height));
  d.box_x0 = std::clamp(cx - cut_w / 2, 0, static_cast<int>(width));
  d.box_x1 = std::clamp(cx + cut_w / 2, 0, static_cast<int>(width));
  if (options_.correct_lam) {
    const double box = static_cast<double>(d.box_y1 - d.box_y0) * (d.box_x1 - d.box_x0);
    d.lambda = 1.0 - box / (static_cast<double>(height) * width);
  }
  return d;
}

Tensor mixup_targets(const Tensor& labels, int64_t num_classes, double lambda, double smoothing) {
  const std::vector<int64_t> y = labels.to_vector<int64_t>();
  const int64_t b = static_cast<int64_t>(y.size());
  const double off = smoothing / num_classes, on = 1.0 - smoothing + off;
  std::vector<float> t(static_cast<size_t>(b * num_classes), 0.0f);
  for (int64_t i = 0; i < b; ++i) {
    const int64_t a = y[i], p = y[b - 1 - i];
    SKA_CHECK(a >= 0 && a < num_classes && p >= 0 && p < num_classes, ValueError,
              "Mixup: label out of range [0, ", num_classes, ")");
    for (int64_t k = 0; k < num_classes; ++k) {
      const double va = k == a ? on : off, vp = k == p ? on : off;
      t[i * num_classes + k] = static_cast<float>(lambda * va + (1.0 - lambda) * vp);
    }
  }
  return Tensor::from_vector(t, Shape{b, num_classes});
}

Tensor MixupCutmix::apply(Tensor& images, const Tensor& labels, uint64_t seed, uint64_t step,
                          MixupDraw* out_draw) const {
  check_batch(images, "Mixup");
  const int64_t b = images.size(0);
  SKA_CHECK(b % 2 == 0, ValueError, "Mixup: the batch size must be even, got ", b);
  SKA_CHECK(labels.dim() == 1 && labels.size(0) == b, ValueError, "Mixup: labels must be [", b,
            "], got ", labels.str());
  NoGradGuard no_grad;
  const MixupDraw d = draw(images.size(2), images.size(3), seed, step);
  if (out_draw) *out_draw = d;
  if (d.mixed) {
    std::vector<int64_t> reversed(b);
    for (int64_t i = 0; i < b; ++i) reversed[i] = b - 1 - i;
    const Tensor index = Tensor::from_vector(reversed, Shape{b}, images.device());
    const Tensor flipped = index_select(images, 0, index);
    if (d.cutmix) {
      const int64_t h = d.box_y1 - d.box_y0, w = d.box_x1 - d.box_x0;
      if (h > 0 && w > 0) {
        images.narrow(2, d.box_y0, h)
            .narrow(3, d.box_x0, w)
            .copy_(flipped.narrow(2, d.box_y0, h).narrow(3, d.box_x0, w));
      }
    } else {
      images.copy_(add(mul(images, d.lambda), mul(flipped, 1.0 - d.lambda)));
    }
  }
  return mixup_targets(labels, num_classes_, d.lambda, options_.label_smoothing)
      .to(images.device());
}

}  // namespace ska::data
