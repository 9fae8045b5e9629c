// Batch-level augmentations on normalised float [B, C, H, W] tensors: timm's RandomErasing
// ('pixel' mode) and timm's Mixup/CutMix with soft, label-smoothed targets. Both are
// deterministic from (seed, step) and work on CPU and CUDA tensors (boxes are copied with views).
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "data/transforms/transform.h"

namespace ska::data {

// Draws from Gamma(alpha, 1) and Beta(a, b) (Marsaglia-Tsang; alpha < 1 by the U^(1/alpha) boost).
double sample_gamma(double alpha, SampleRng& rng);
double sample_beta(double a, double b, SampleRng& rng);
double sample_normal(SampleRng& rng);

struct RandomErasingOptions {
  double probability = 0.25;
  double min_area = 0.02, max_area = 1.0 / 3.0;
  double min_aspect = 0.3;  // max_aspect = 1 / min_aspect
  int min_count = 1, max_count = 1;
};

// timm RandomErasing(mode='pixel', device=any): per sample, with `probability`, up to `count`
// boxes (10 attempts each: area ~ U(min, max) * HW / count, log aspect uniform, h = round(sqrt(A
// r)), w = round(sqrt(A / r)), accepted when h < H and w < W), filled with N(0, 1) per pixel and
// channel.
class RandomErasing {
 public:
  explicit RandomErasing(RandomErasingOptions options = {});
  // Erases in place; sample i draws from SampleRng(seed, stream of (step, i)).
  void apply(Tensor& images, uint64_t seed, uint64_t step) const;
  const RandomErasingOptions& options() const { return options_; }

 private:
  RandomErasingOptions options_;
};

struct MixupOptions {
  double mixup_alpha = 0.8;
  double cutmix_alpha = 1.0;
  double prob = 1.0;         // probability of mixing a batch at all
  double switch_prob = 0.5;  // cutmix instead of mixup when both are enabled
  double label_smoothing = 0.1;
  bool correct_lam = true;  // lambda from the clipped cutmix box's area
};

// What one batch got (for logging and tests).
struct MixupDraw {
  bool mixed = false;
  bool cutmix = false;
  double lambda = 1.0;  // weight of the original sample (after box correction)
  int box_y0 = 0, box_y1 = 0, box_x0 = 0, box_x1 = 0;  // cutmix box [y0, y1) x [x0, x1)
};

// timm's Mixup in 'batch' mode: one lambda per batch; the partner of sample i is B - 1 - i
// (the batch flipped). mixup: x = lam x + (1 - lam) flip(x); cutmix: a box of side
// sqrt(1 - lam) * (H, W) centred uniformly, clipped, pasted from flip(x). Targets:
// lam * smooth(y) + (1 - lam) * smooth(flip(y)), smooth = one-hot with on 1 - s + s / K, off s / K.
class MixupCutmix {
 public:
  MixupCutmix(MixupOptions options, int64_t num_classes);
  // The batch's draw from SampleRng(seed, stream of step); H and W size the cutmix box.
  MixupDraw draw(int64_t height, int64_t width, uint64_t seed, uint64_t step) const;
  // Mixes `images` (f32 [B, C, H, W], B even) in place and returns the soft targets f32
  // [B, num_classes] on the images' device. `labels` is i64 [B] on any device.
  Tensor apply(Tensor& images, const Tensor& labels, uint64_t seed, uint64_t step,
               MixupDraw* out_draw = nullptr) const;
  const MixupOptions& options() const { return options_; }
  int64_t num_classes() const { return num_classes_; }

 private:
  MixupOptions options_;
  int64_t num_classes_;
};

// Soft targets lam * smooth(y) + (1 - lam) * smooth(flip(y)) as f32 [B, num_classes] (CPU).
Tensor mixup_targets(const Tensor& labels, int64_t num_classes, double lambda, double smoothing);

}  // namespace ska::data
