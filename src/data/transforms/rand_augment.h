// RandAugment in its two reference forms: torchvision's (fixed magnitude bin of 31, 14 ops, fill 0,
// nearest) for the CIFAR recipe, and timm's ("rand-m9-mstd0.5-inc1": 15 ops applied with
// probability 0.5, gaussian magnitude noise, increasing-severity variants, mean-pixel fill).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/transforms/image_ops.h"
#include "data/transforms/transform.h"

namespace ska::data {

// ---------------------------------------------------------------- torchvision (0.14) RandAugment
enum class TvOp {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize
};
constexpr int kTvOpCount = 14;
const char* tv_op_name(TvOp op);

// One op with its (already signed) magnitude.
struct TvOpDraw {
  TvOp op = TvOp::kIdentity;
  double magnitude = 0.0;
};

// torchvision's magnitude table: bin `bin` of `num_bins` for an image of height x width
// (shear 0..0.3, translate 0..150/331 of the side, rotate 0..30 degrees, enhance 0..0.9,
// posterize 8 - round(bin / ((num_bins - 1) / 4)) bits, solarize 255..0; unsigned magnitude).
double tv_magnitude(TvOp op, int bin, int num_bins, int height, int width);
bool tv_op_signed(TvOp op);
// Applies one op as torchvision's _apply_op on a PIL image (shear via atan, translate truncated
// to whole pixels, enhance factor 1 + magnitude).
void tv_apply_op(Image& image, TvOp op, double magnitude, Resample resample,
                 const std::vector<uint8_t>& fill);

class TorchvisionRandAugment : public Transform {
 public:
  explicit TorchvisionRandAugment(int num_ops = 2, int magnitude = 9, int num_bins = 31,
                                  Resample resample = Resample::kNearest,
                                  std::vector<uint8_t> fill = {0});
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "RandAugment"; }
  // The ops and signed magnitudes one sample gets (what apply() uses, in order).
  std::vector<TvOpDraw> draw(int height, int width, SampleRng& rng) const;

 private:
  int num_ops_, magnitude_, num_bins_;
  Resample resample_;
  std::vector<uint8_t> fill_;
};

// ------------------------------------------------------------------------- timm RandAugment
enum class TimmOp {
  kAutoContrast,
  kEqualize,
  kInvert,
  kRotate,
  kPosterize,
  kSolarize,
  kSolarizeAdd,
  kColor,
  kContrast,
  kBrightness,
  kSharpness,
  kShearX,
  kShearY,
  kTranslateXRel,
  kTranslateYRel
};
constexpr int kTimmOpCount = 15;
const char* timm_op_name(TimmOp op, bool increasing);

// The parsed timm config string: "rand" then dash-separated sections in any order:
// m<int> magnitude, n<int> ops per image, p<float> probability per op, mstd<float> magnitude std
// (> 100: uniform in [0, m]), mmax<int> magnitude upper bound, inc<int> increasing ops.
struct TimmRandAugmentConfig {
  double magnitude = 10.0;
  int num_layers = 2;
  double prob = 0.5;
  double magnitude_std = 0.0;  // infinity: uniform
  double magnitude_max = 10.0;
  bool increasing = false;
};
// ValueError naming the string and the bad section ("t..." weighted sets are not supported).
TimmRandAugmentConfig parse_timm_rand_augment(const std::string& config);

struct TimmOpDraw {
  TimmOp op = TimmOp::kAutoContrast;
  bool applied = false;  // the per-op probability passed
  double magnitude = 0;  // after noise and clipping
};

// Applies one op with level `magnitude` (0..magnitude_max) as timm's level_to_arg + op; `rng`
// supplies the sign of signed ops.
void timm_apply_op(Image& image, TimmOp op, bool increasing, double magnitude, double translate_pct,
                   Resample resample, const std::vector<uint8_t>& fill, SampleRng& rng);

class TimmRandAugment : public Transform {
 public:
  // fill: timm's img_mean (ImageNet mean pixel by default); translate_pct 0.45.
  explicit TimmRandAugment(TimmRandAugmentConfig config,
                           std::vector<uint8_t> fill = {124, 116, 104},
                           Resample resample = Resample::kBicubic, double translate_pct = 0.45);
  void apply(Image& image, SampleRng& rng) const override;
  std::string name() const override { return "TimmRandAugment"; }
  const TimmRandAugmentConfig& config() const { return config_; }
  // Draws one op's choice, gate and magnitude (the first draws apply() makes for a layer).
  TimmOpDraw draw_layer(SampleRng& rng) const;

 private:
  TimmRandAugmentConfig config_;
  std::vector<uint8_t> fill_;
  Resample resample_;
  double translate_pct_;
};

}  // namespace ska::data
