// The training augmentation built from a config's `data:` map: the per-sample pipeline
// (torchvision CIFAR recipe or timm ImageNet recipe) plus the batch-level random erasing and
// mixup/cutmix steps the trainer runs on the normalised batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"
#include "data/transforms/batch_augment.h"
#include "data/transforms/transform.h"

namespace ska::data {

struct TrainAugment {
  std::shared_ptr<const Transform> transform;    // per sample (uint8 HWC); null: none
  std::shared_ptr<const RandomErasing> erasing;  // on the normalised batch; null: off
  std::shared_ptr<const MixupCutmix> mixup;      // on the normalised batch; null: off
  std::vector<std::string> steps;                // names in order, for logs ("RandAugment", ...)

  // The batch-level steps in timm's order (erasing, then mixup) on f32 [B, C, H, W] `images`,
  // in place. Returns the soft targets f32 [B, num_classes] when mixup is on, else an undefined
  // Tensor (use the hard labels). Deterministic from (seed, step).
  Tensor apply_batch(Tensor& images, const Tensor& labels, uint64_t seed, uint64_t step) const;
  std::string describe() const;  // "RandAugment -> RandomCrop -> ... | RandomErasing | Mixup"
};

// Reads `data.augment` and `data.mixup` (both optional; a missing map turns everything off):
//   augment.randaugment:    none | torchvision | a timm string "rand-m9-mstd0.5-inc1" (default
//   none) augment.randaugment_ops, augment.randaugment_magnitude, augment.randaugment_bins:
//                           torchvision's num_ops [0, 10] (2), magnitude [0, bins) (9), bins (31)
//   augment.crop_padding:   RandomCrop(image_size, padding) [0, 64]; 0 off (default 0)
//   augment.hflip:          flip probability [0, 1] (default 0)
//   augment.pad_to:         pad grey images to this size and replicate to `channels`; 0 off
//   augment.random_resized_crop: bool (default false); with augment.rrc_scale [lo, hi]
//                           (0.08, 1) and augment.rrc_ratio [lo, hi] (3/4, 4/3)
//   augment.interpolation:  bicubic | bilinear (default bicubic; RRC and timm RandAugment)
//   augment.color_jitter:   strength [0, 1] (default 0); as timm, skipped when a timm RandAugment
//                           is on unless augment.force_color_jitter: true
//   augment.random_erasing: probability [0, 1] (default 0), timm 'pixel' mode
//   mixup.mixup_alpha, mixup.cutmix_alpha: >= 0 (0.8 / 1.0 when the map is present)
//   mixup.prob, mixup.switch_prob: [0, 1] (1.0 / 0.5); mixup.label_smoothing [0, 1) (0.1);
//   mixup.correct_lam: bool (true)
// Order: with random_resized_crop, timm's (RRC, flip, jitter or RandAugment); otherwise the CIFAR
// recipe's (pad_to, RandAugment, RandomCrop, flip). `mean` (per channel, 0..1) gives timm's
// fill colour round(255 mean). ConfigError naming the key for any bad value.
TrainAugment read_train_augment(const ConfigNode& data, int64_t image_size, int64_t channels,
                                int64_t num_classes, const std::vector<double>& mean);

}  // namespace ska::data
