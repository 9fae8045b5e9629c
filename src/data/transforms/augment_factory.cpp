// Builds the training augmentation from `data.augment` and `data.mixup`.
#include "data/transforms/augment_factory.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "data/transforms/basic_transforms.h"
#include "data/transforms/rand_augment.h"

namespace ska::data {
namespace {

std::array<double, 2> read_range(const ConfigNode& node, const std::string& key,
                                 std::array<double, 2> fallback, double lo, double hi) {
  if (!node.has(key)) return fallback;
  const auto v = node.get<std::vector<double>>(key);
  if (v.size() != 2 || !(v[0] > lo) || !(v[0] <= v[1]) || !(v[1] <= hi)) {
    node.fail(key, "expected [lo, hi] with " + std::to_string(lo) +
                       " < lo <= hi <= " + std::to_string(hi));
  }
  return {v[0], v[1]};
}

std::unique_ptr<Transform> read_rand_augment(const ConfigNode& aug, Resample resample,
                                             const std::vector<uint8_t>& fill, bool* is_timm) {
  const std::string ra = aug.get("randaugment", "none");
  *is_timm = false;
  if (ra == "none" || ra.empty()) return nullptr;
  if (ra == "torchvision") {
    const int bins = static_cast<int>(aug.get_int_in("randaugment_bins", 31, 2, 1000));
    const int ops = static_cast<int>(aug.get_int_in("randaugment_ops", 2, 0, 10));
    const int mag = static_cast<int>(aug.get_int_in("randaugment_magnitude", 9, 0, bins - 1));
    return std::make_unique<TorchvisionRandAugment>(ops, mag, bins, Resample::kNearest,
                                                    std::vector<uint8_t>{0});
  }
  if (ra.rfind("rand", 0) != 0) {
    aug.fail("randaugment", "value '" + ra +
                                "' is not a valid choice; expected none, torchvision or a timm "
                                "string such as rand-m9-mstd0.5-inc1");
  }
  try {
    *is_timm = true;
    return std::make_unique<TimmRandAugment>(parse_timm_rand_augment(ra), fill, resample);
  } catch (const ValueError& e) {
    aug.fail("randaugment", e.what());
  }
}

}  // namespace

TrainAugment read_train_augment(const ConfigNode& data, int64_t image_size, int64_t channels,
                                int64_t num_classes, const std::vector<double>& mean) {
  TrainAugment out;
  const ConfigNode aug = data["augment"];
  const int size = static_cast<int>(image_size);

  std::vector<uint8_t> fill{124, 116, 104};  // timm's ImageNet mean pixel
  if (!mean.empty()) {
    fill.clear();
    for (double m : mean)
      fill.push_back(static_cast<uint8_t>(std::clamp(std::lround(255 * m), 0L, 255L)));
  }
  const Resample resample =
      aug.get_choice("interpolation", "bicubic", {"bicubic", "bilinear"}) == "bilinear"
          ? Resample::kBilinear
          : Resample::kBicubic;
  bool timm_ra = false;
  std::unique_ptr<Transform> ra = read_rand_augment(aug, resample, fill, &timm_ra);
  const int padding = static_cast<int>(aug.get_int_in("crop_padding", 0, 0, 64));
  const double hflip = aug.get_double_in("hflip", 0.0, 0.0, 1.0);
  const int pad_to = static_cast<int>(aug.get_int_in("pad_to", 0, 0, 4096));
  const bool rrc = aug.get<bool>("random_resized_crop", false);
  const auto scale = read_range(aug, "rrc_scale", {0.08, 1.0}, 0.0, 1.0);
  const auto ratio = read_range(aug, "rrc_ratio", {3.0 / 4.0, 4.0 / 3.0}, 0.0, 100.0);
  const double jitter = aug.get_double_in("color_jitter", 0.0, 0.0, 1.0);
  const bool force_jitter = aug.get<bool>("force_color_jitter", false);
  const double erasing = aug.get_double_in("random_erasing", 0.0, 0.0, 1.0);

  std::vector<std::unique_ptr<Transform>> steps;
  if (pad_to > 0)
    steps.push_back(std::make_unique<PadReplicate>(pad_to, static_cast<int>(channels)));
  if (rrc) {
    steps.push_back(std::make_unique<RandomResizedCrop>(size, scale, ratio, resample));
    if (hflip > 0) steps.push_back(std::make_unique<RandomHorizontalFlip>(hflip));
    if (jitter > 0 && (!timm_ra || force_jitter)) {
      steps.push_back(std::make_unique<ColorJitter>(jitter, jitter, jitter));
    }
    if (ra) steps.push_back(std::move(ra));
  } else {
    if (ra) steps.push_back(std::move(ra));
    if (jitter > 0 && (!timm_ra || force_jitter)) {
      steps.push_back(std::make_unique<ColorJitter>(jitter, jitter, jitter));
    }
    if (padding > 0) steps.push_back(std::make_unique<RandomCrop>(size, padding));
    if (hflip > 0) steps.push_back(std::make_unique<RandomHorizontalFlip>(hflip));
  }
  for (const auto& s : steps) out.steps.push_back(s->name());
  if (!steps.empty()) out.transform = std::make_shared<Compose>(std::move(steps));

  if (erasing > 0) {
    RandomErasingOptions o;
    o.probability = erasing;
    out.erasing = std::make_shared<RandomErasing>(o);
  }

  const ConfigNode mix = data["mixup"];
  if (!mix.is_null()) {
    MixupOptions o;
    o.mixup_alpha = mix.get_double_in("mixup_alpha", 0.8, 0.0, 100.0);
    o.cutmix_alpha = mix.get_double_in("cutmix_alpha", 1.0, 0.0, 100.0);
    o.prob = mix.get_double_in("prob", 1.0, 0.0, 1.0);
    o.switch_prob = mix.get_double_in("switch_prob", 0.5, 0.0, 1.0);
    o.label_smoothing = mix.get_double_in("label_smoothing", 0.1, 0.0, 0.999);
    o.correct_lam = mix.get<bool>("correct_lam", true);
    out.mixup = std::make_shared<MixupCutmix>(o, num_classes);
  }
  return out;
}

Tensor TrainAugment::apply_batch(Tensor& images, const Tensor& labels, uint64_t seed,
                                 uint64_t step) const {
  if (erasing) erasing->apply(images, seed, step);
  if (mixup) return mixup->apply(images, labels, seed, step);
  return Tensor();
}

std::string TrainAugment::describe() const {
  std::string s;
  for (const auto& name : steps) s += (s.empty() ? "" : " -> ") + name;
  if (s.empty()) s = "none";
  if (erasing) s += " | RandomErasing(p=" + std::to_string(erasing->options().probability) + ")";
  if (mixup) s += " | Mixup";
  return s;
}

}  // namespace ska::data
