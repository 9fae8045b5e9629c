// torchvision's and timm's RandAugment over the PIL-compatible ops of image_ops.
#include "data/transforms/rand_augment.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/error.h"

namespace ska::data {

// ---------------------------------------------------------------- torchvision
const char* tv_op_name(TvOp op) {
  static const char* const kNames[kTvOpCount] = {
      "Identity", "ShearX",   "ShearY",    "TranslateX", "TranslateY", "Rotate",       "Brightness",
      "Color",    "Contrast", "Sharpness", "Posterize",  "Solarize",   "AutoContrast", "Equalize"};
  return kNames[static_cast<int>(op)];
}

bool tv_op_signed(TvOp op) {
  switch (op) {
    case TvOp::kShearX:
    case TvOp::kShearY:
    case TvOp::kTranslateX:
    case TvOp::kTranslateY:
    case TvOp::kRotate:
    case TvOp::kBrightness:
    case TvOp::kColor:
    case TvOp::kContrast:
    case TvOp::kSharpness:
      return true;
    default:
      return false;
  }
}

double tv_magnitude(TvOp op, int bin, int num_bins, int height, int width) {
  // torch.linspace(0, hi, num_bins)[bin]
  const double t = num_bins > 1 ? static_cast<double>(bin) / (num_bins - 1) : 0.0;
  switch (op) {
    case TvOp::kShearX:
    case TvOp::kShearY:
      return 0.3 * t;
    case TvOp::kTranslateX:
      return 150.0 / 331.0 * width * t;
    case TvOp::kTranslateY:
      return 150.0 / 331.0 * height * t;
    case TvOp::kRotate:
      return 30.0 * t;
    case TvOp::kBrightness:
    case TvOp::kColor:
    case TvOp::kContrast:
    case TvOp::kSharpness:
      return 0.9 * t;
    case TvOp::kPosterize:  // 8 - round(bin / ((num_bins - 1) / 4)), round half to even
      return 8.0 - std::nearbyint(bin / ((num_bins - 1) / 4.0));
    case TvOp::kSolarize:
      return 255.0 * (1.0 - t);
    default:
      return 0.0;
  }
}

void tv_apply_op(Image& image, TvOp op, double magnitude, Resample resample,
                 const std::vector<uint8_t>& fill) {
  switch (op) {
    case TvOp::kIdentity:
      return;
    // F.affine(shear = degrees(atan(m)), center = [0, 0]) is PIL's (1, m, 0, 0, 1, 0).
    case TvOp::kShearX:
      return image_affine(image, {1, magnitude, 0, 0, 1, 0}, resample, fill);
    case TvOp::kShearY:
      return image_affine(image, {1, 0, 0, magnitude, 1, 0}, resample, fill);
    // F.affine(translate = [int(m), 0]): the output at x samples the input at x - int(m).
    case TvOp::kTranslateX:
      return image_affine(image, {1, 0, -std::trunc(magnitude), 0, 1, 0}, resample, fill);
    case TvOp::kTranslateY:
      return image_affine(image, {1, 0, 0, 0, 1, -std::trunc(magnitude)}, resample, fill);
    case TvOp::kRotate:
      return image_rotate(image, magnitude, resample, fill);
    case TvOp::kBrightness:
      return image_brightness(image, 1.0 + magnitude);
    case TvOp::kColor:
      return image.channels == 3 ? image_color(image, 1.0 + magnitude) : void();
    case TvOp::kContrast:
      return image_contrast(image, 1.0 + magnitude);
    case TvOp::kSharpness:
      return image_sharpness(image, 1.0 + magnitude);
    case TvOp::kPosterize:
      return image_posterize(image, static_cast<int>(magnitude));
    case TvOp::kSolarize:
      return image_solarize(image, magnitude);
    case TvOp::kAutoContrast:
      return image_autocontrast(image);
    case TvOp::kEqualize:
      return image_equalize(image);
  }
}

TorchvisionRandAugment::TorchvisionRandAugment(int num_ops, int magnitude, int num_bins,
                                               Resample resample, std::vector<uint8_t> fill)
    : num_ops_(num_ops),
      magnitude_(magnitude),
      num_bins_(num_bins),
      resample_(resample),
      fill_(std::move(fill)) {
  SKA_CHECK(num_ops >= 0 && num_bins >= 2 && magnitude >= 0 && magnitude < num_bins, ValueError,
            "RandAugment: needs num_ops >= 0, num_bins >= 2 and magnitude in [0, num_bins), got ",
            num_ops, ", ", num_bins, ", ", magnitude);
}

std::vector<TvOpDraw> TorchvisionRandAugment::draw(int height, int width, SampleRng& rng) const {
  std::vector<TvOpDraw> ops(num_ops_);
  for (auto& d : ops) {
    d.op = static_cast<TvOp>(rng.randint(0, kTvOpCount - 1));
    d.magnitude = tv_magnitude(d.op, magnitude_, num_bins_, height, width);
    if (tv_op_signed(d.op) && rng.bernoulli(0.5)) d.magnitude = -d.magnitude;
  }
  return ops;
}

void TorchvisionRandAugment::apply(Image& image, SampleRng& rng) const {
  for (const TvOpDraw& d : draw(image.height, image.width, rng)) {
    tv_apply_op(image, d.op, d.magnitude, resample_, fill_);
  }
}

// ------------------------------------------------------------------------- timm
const char* timm_op_name(TimmOp op, bool increasing) {
  static const char* const kNames[kTimmOpCount] = {
      "AutoContrast", "Equalize",    "Invert", "Rotate",        "Posterize",
      "Solarize",     "SolarizeAdd", "Color",  "Contrast",      "Brightness",
      "Sharpness",    "ShearX",      "ShearY", "TranslateXRel", "TranslateYRel"};
  static const char* const kIncreasing[kTimmOpCount] = {"AutoContrast",
                                                        "Equalize",
                                                        "Invert",
                                                        "Rotate",
                                                        "PosterizeIncreasing",
                                                        "SolarizeIncreasing",
                                                        "SolarizeAdd",
                                                        "ColorIncreasing",
                                                        "ContrastIncreasing",
                                                        "BrightnessIncreasing",
                                                        "SharpnessIncreasing",
                                                        "ShearX",
                                                        "ShearY",
                                                        "TranslateXRel",
                                                        "TranslateYRel"};
  return (increasing ? kIncreasing : kNames)[static_cast<int>(op)];
}

TimmRandAugmentConfig parse_timm_rand_augment(const std::string& config) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dash = config.find('-', start);
    parts.push_back(config.substr(start, dash == std::string::npos ? dash : dash - start));
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  SKA_CHECK(parts[0] == "rand", ValueError, "RandAugment string '", config,
            "' must start with 'rand'");
  TimmRandAugmentConfig c;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& s = parts[i];
    SKA_CHECK(s.empty() || s[0] != 't', ValueError, "RandAugment string '", config,
              "': transform sets ('t...') are not supported");
    const size_t digit = s.find_first_of("0123456789.");
    if (digit == std::string::npos) continue;  // timm ignores sections without a value
    const std::string key = s.substr(0, digit), val = s.substr(digit);
    double v = 0.0;
    size_t used = 0;
    try {
      v = std::stod(val, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SKA_CHECK(used == val.size(), ValueError, "RandAugment string '", config, "': section '", s,
              "' has a malformed number");
    if (key == "m") {
      c.magnitude = std::trunc(v);
    } else if (key == "n") {
      c.num_layers = static_cast<int>(v);
    } else if (key == "p") {
      c.prob = v;
    } else if (key == "mstd") {
      c.magnitude_std = v > 100 ? std::numeric_limits<double>::infinity() : v;
    } else if (key == "mmax") {
      c.magnitude_max = std::trunc(v);
    } else if (key == "inc") {
      c.increasing = v != 0.0;
    } else {
      SKA_CHECK(false, ValueError, "RandAugment string '", config, "': unknown section '", s,
                "' (known: m, n, p, mstd, mmax, inc)");
    }
  }
  SKA_CHECK(c.num_layers >= 0 && c.prob >= 0 && c.prob <= 1 && c.magnitude >= 0 &&
                c.magnitude_std >= 0 && c.magnitude_max > 0,
            ValueError, "RandAugment string '", config, "': values out of range");
  return c;
}

namespace {
double maybe_negate(double v, SampleRng& rng) { return rng.uniform() > 0.5 ? -v : v; }
}  // namespace

void timm_apply_op(Image& image, TimmOp op, bool increasing, double m, double translate_pct,
                   Resample resample, const std::vector<uint8_t>& fill, SampleRng& rng) {
  const double level = m / 10.0;  // timm's _LEVEL_DENOM
  auto enhance_factor = [&]() {
    return increasing ? std::max(0.1, 1.0 + maybe_negate(level * 0.9, rng)) : level * 1.8 + 0.1;
  };
  switch (op) {
    case TimmOp::kAutoContrast:
      return image_autocontrast(image);
    case TimmOp::kEqualize:
      return image_equalize(image);
    case TimmOp::kInvert:
      return image_invert(image);
    case TimmOp::kRotate:
      return image_rotate(image, maybe_negate(level * 30.0, rng), resample, fill);
    case TimmOp::kPosterize: {
      const int bits = static_cast<int>(level * 4);
      const int keep = increasing ? 4 - bits : bits;
      if (keep >= 8) return;
      return image_posterize(image, std::max(0, keep));
    }
    case TimmOp::kSolarize: {
      const int t = std::min(256, static_cast<int>(level * 256));
      return image_solarize(image, increasing ? 256 - t : t);
    }
    case TimmOp::kSolarizeAdd:
      return image_solarize_add(image, std::min(128, static_cast<int>(level * 110)), 128);
    case TimmOp::kColor:
      return image.channels == 3 ? image_color(image, enhance_factor()) : void();
    case TimmOp::kContrast:
      return image_contrast(image, enhance_factor());
    case TimmOp::kBrightness:
      return image_brightness(image, enhance_factor());
    case TimmOp::kSharpness:
      return image_sharpness(image, enhance_factor());
    case TimmOp::kShearX:
      return image_affine(image, {1, maybe_negate(level * 0.3, rng), 0, 0, 1, 0}, resample, fill);
    case TimmOp::kShearY:
      return image_affine(image, {1, 0, 0, maybe_negate(level * 0.3, rng), 1, 0}, resample, fill);
    case TimmOp::kTranslateXRel: {
      const double px = maybe_negate(level * translate_pct, rng) * image.width;
      return image_affine(image, {1, 0, px, 0, 1, 0}, resample, fill);
    }
    case TimmOp::kTranslateYRel: {
      const double px = maybe_negate(level * translate_pct, rng) * image.height;
      return image_affine(image, {1, 0, 0, 0, 1, px}, resample, fill);
    }
  }
}

TimmRandAugment::TimmRandAugment(TimmRandAugmentConfig config, std::vector<uint8_t> fill,
                                 Resample resample, double translate_pct)
    : config_(config), fill_(std::move(fill)), resample_(resample), translate_pct_(translate_pct) {}

namespace {
// Standard normal from two uniforms (Box-Muller; 1 - u keeps the log finite).
double normal(SampleRng& rng) {
  const double u1 = 1.0 - rng.uniform(), u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}
}  // namespace

TimmOpDraw TimmRandAugment::draw_layer(SampleRng& rng) const {
  TimmOpDraw d;
  d.op = static_cast<TimmOp>(rng.randint(0, kTimmOpCount - 1));
  d.applied = config_.prob >= 1.0 || rng.uniform() <= config_.prob;
  if (!d.applied) return d;
  double m = config_.magnitude;
  if (std::isinf(config_.magnitude_std)) {
    m = rng.uniform(0.0, m);
  } else if (config_.magnitude_std > 0) {
    m += config_.magnitude_std * normal(rng);
  }
  d.magnitude = std::clamp(m, 0.0, config_.magnitude_max);
  return d;
}

void TimmRandAugment::apply(Image& image, SampleRng& rng) const {
  for (int i = 0; i < config_.num_layers; ++i) {
    const TimmOpDraw d = draw_layer(rng);
    if (!d.applied) continue;
    timm_apply_op(image, d.op, config_.increasing, d.magnitude, translate_pct_, resample_, fill_,
                  rng);
  }
}

}  // namespace ska::data
