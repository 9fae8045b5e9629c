// The `summary` report: one no-grad forward of a model on zeros under nn::SummaryRecorder, with
// per-layer rows and totals (parameters, MACs, FLOPs), rendered as an aligned table or JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/summary.h"

namespace ska::apps {

struct ModelSummary {
  Shape input;                 // [batch, C, H, W]
  int64_t trainable_params = 0;
  int64_t total_params = 0;    // trainable + non-trainable (e.g. Swin's stored masks)
  int64_t macs_per_image = 0;  // fvcore's convention: one multiply-add = one MAC
  std::vector<nn::SummaryRecorder::Row> layers;  // in call order; MACs per image
  double gmacs() const { return static_cast<double>(macs_per_image) * 1e-9; }
  double gflops() const { return 2.0 * gmacs(); }
};

// Puts `model` in eval mode and runs it once without gradients on zeros of `input_shape`
// (f32, on `device`, where the model must already be).
ModelSummary summarize_model(nn::Module& model, const Shape& input_shape, Device device);

// The aligned per-layer table (names indented by depth; rows deeper than `max_depth` left out
// when max_depth >= 0), then the totals.
std::string format_summary_table(const ModelSummary& summary, int max_depth = -1);

// One JSON object: input, trainable_params, total_params, macs, gmacs, gflops, layers[{name,
// type, depth, output, params, macs}] plus the `extra` string fields (config path, family).
std::string format_summary_json(const ModelSummary& summary, int max_depth = -1,
                                const std::vector<std::pair<std::string, std::string>>& extra = {});

// 26341656 -> "26,341,656".
std::string with_thousands(int64_t value);

}  // namespace ska::apps
