// The `summary` report: recording a forward pass and rendering it as a table or as JSON.
#include "model_summary.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/grad_mode.h"
#include "ops/mac_counter.h"

namespace ska::apps {
namespace {

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%.*f", digits, value);
  return buffer;
}

std::string row_label(const nn::SummaryRecorder::Row& row) {
  return std::string(2 * row.depth, ' ') + (row.name.empty() ? "(model)" : row.name);
}

bool shown(const nn::SummaryRecorder::Row& row, int max_depth) {
  return max_depth < 0 || row.depth <= max_depth;
}

// Pads to `width`: left-aligned text, right-aligned numbers.
std::string cell(const std::string& text, size_t width, bool right) {
  const std::string pad(width > text.size() ? width - text.size() : 0, ' ');
  return right ? pad + text : text + pad;
}

}  // namespace

std::string with_thousands(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value);
  for (int pos = static_cast<int>(digits.size()) - 3; pos > 0; pos -= 3) digits.insert(pos, ",");
  return (value < 0 ? "-" : "") + digits;
}

ModelSummary summarize_model(nn::Module& model, const Shape& input_shape, Device device) {
  SKA_CHECK(input_shape.size() == 4 && input_shape[0] > 0, ShapeError,
            "summary: the input is [batch, C, H, W] with batch > 0, got ", shape_str(input_shape));
  ModelSummary summary;
  summary.input = input_shape;
  summary.trainable_params = model.num_parameters(true);
  summary.total_params = model.num_parameters(false);
  model.eval();
  const int64_t batch = input_shape[0];
  NoGradGuard no_grad;
  MacCounter total;
  nn::SummaryRecorder recorder(model);
  model(Tensor::zeros(input_shape, DType::kF32, device));
  summary.macs_per_image = total.total() / batch;
  summary.layers = recorder.rows();
  for (auto& row : summary.layers) row.macs /= batch;
  return summary;
}

std::string format_summary_table(const ModelSummary& summary, int max_depth) {
  const std::vector<std::string> headers = {"Layer", "Type", "Output shape", "Params", "MACs"};
  std::vector<std::vector<std::string>> rows;
  for (const auto& row : summary.layers) {
    if (!shown(row, max_depth)) continue;
    rows.push_back({row_label(row), row.type, shape_str(row.output), with_thousands(row.params),
                    with_thousands(row.macs)});
  }
  std::vector<size_t> widths(headers.size());
  for (size_t c = 0; c < headers.size(); ++c) {
    widths[c] = headers[c].size();
    for (const auto& r : rows) widths[c] = std::max(widths[c], r[c].size());
  }
  std::ostringstream out;
  auto print_row = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < r.size(); ++c) {
      out << (c ? "  " : "") << cell(r[c], widths[c], /*right=*/c >= 3);
    }
    out << "\n";
  };
  print_row(headers);
  size_t line = 2 * (headers.size() - 1);
  for (size_t w : widths) line += w;
  out << std::string(line, '-') << "\n";
  for (const auto& r : rows) print_row(r);
  out << std::string(line, '-') << "\n";
  out << "Input:              " << shape_str(summary.input) << "\n";
  out << "Trainable params:   " << with_thousands(summary.trainable_params) << "\n";
  out << "All params:         " << with_thousands(summary.total_params)
      << " (incl. non-trainable)\n";
  out << "MACs per image:     " << fixed(summary.gmacs(), 4) << " G ("
      << with_thousands(summary.macs_per_image) << "; one multiply-add = one MAC, as fvcore)\n";
  out << "FLOPs per image:    " << fixed(summary.gflops(), 4) << " G (2 x MACs)\n";
  return out.str();
}

std::string format_summary_json(const ModelSummary& summary, int max_depth,
                                const std::vector<std::pair<std::string, std::string>>& extra) {
  nlohmann::ordered_json j;
  for (const auto& [key, value] : extra) j[key] = value;
  j["input"] = summary.input;
  j["trainable_params"] = summary.trainable_params;
  j["total_params"] = summary.total_params;
  j["macs"] = summary.macs_per_image;
  j["gmacs"] = summary.gmacs();
  j["gflops"] = summary.gflops();
  j["layers"] = nlohmann::ordered_json::array();
  for (const auto& row : summary.layers) {
    if (!shown(row, max_depth)) continue;
    j["layers"].push_back({{"name", row.name},
                           {"type", row.type},
                           {"depth", row.depth},
                           {"output", row.output},
                           {"params", row.params},
                           {"macs", row.macs}});
  }
  return j.dump(1);
}

}  // namespace ska::apps
