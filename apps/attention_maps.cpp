// attention_maps: pictures of attention (the paper's Figure 5). For each --config (one row per
// model) a PNG row: the input and, per head, one query's attention over the token grid, upsampled
// and overlaid as a heat map. Usage: attention_maps --config A --checkpoint CA [--config B
// --checkpoint CB ...] --image a.png | --input x.npy [--layer L] [--query cls|i,j] [--output F]
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "app_common.h"
#include "autograd/grad_mode.h"
#include "data/eval_transform.h"
#include "io/heatmap.h"
#include "io/npy.h"
#include "io/plot.h"
#include "nn/mixers/attention_probe.h"

namespace {

using namespace ska;

struct MapsCommand {
  std::vector<std::string> configs, checkpoints, sets;
  std::string image, input, output = "attention_maps.png", query, device = "cpu";
  int64_t layer = -1;
  int cell = 128;
};

constexpr int kPad = 6, kLabel = 14;

// One model's row: its name and the maps of its heads.
struct Row {
  std::string label;
  Tensor input;  // [C, H, W] as the model saw it
  nn::AttentionMap map;
  nn::AttentionQuery query;
};

// "cls" or "i,j" (pixel row and column of the model's input) -> relative position.
std::optional<nn::AttentionQuery> parse_query(const std::string& text, int64_t image_size) {
  if (text.empty()) return std::nullopt;
  nn::AttentionQuery q;
  if (text == "cls") {
    q.cls = true;
    return q;
  }
  std::istringstream in(text);
  int64_t i = -1, j = -1;
  char comma = 0;
  const bool ok = (in >> i >> comma >> j) && comma == ',' && in.peek() == EOF;
  SKA_CHECK(ok && i >= 0 && j >= 0 && i < image_size && j < image_size, ValueError, "--query '",
            text, "': expected cls or i,j with 0 <= i, j < ", image_size,
            " (pixel row, column of the model's input)");
  q.y = (static_cast<double>(i) + 0.5) / static_cast<double>(image_size);
  q.x = (static_cast<double>(j) + 0.5) / static_cast<double>(image_size);
  return q;
}

// "cls" or "row I col J" (the pixel of the model's input), in the PNG font's characters.
std::string query_label(const nn::AttentionQuery& q, int64_t image_size) {
  if (q.cls) return "cls";
  const auto pixel = [image_size](double p) {
    return std::to_string(static_cast<int64_t>(p * static_cast<double>(image_size)));
  };
  return "row " + pixel(q.y) + " col " + pixel(q.x);
}

// The model's input [C, H, W]: the first image of the .npy file, or the decoded image.
Tensor model_input(const MapsCommand& cmd, const Config& config, const models::ModelInput& in) {
  if (!cmd.input.empty()) {
    Tensor x = read_npy(cmd.input);
    if (x.dim() == 4) x = x.select(0, 0);
    SKA_CHECK(x.dim() == 3 && x.size(0) == in.in_channels && x.size(1) == in.image_size &&
                  x.size(2) == in.image_size && x.is_floating(),
              ShapeError, cmd.input, ": input ", x.str(),
              " does not fit the model; expected float [", in.in_channels, ", ", in.image_size,
              ", ", in.image_size, "] (or [N, C, H, W])");
    return x.to(DType::kF32);
  }
  const data::EvalTransform t =
      data::read_eval_transform(apps::data_section(config), in.image_size, in.in_channels);
  return data::load_eval_image(cmd.image, t);
}

// A row's name: the config's file name, or for a run folder's config.yaml the folder's name.
std::string row_name(const std::string& config) {
  const std::filesystem::path path(config);
  const bool run_config = path.filename() == "config.yaml" && path.has_parent_path();
  return run_config ? path.parent_path().filename().string() : path.stem().string();
}

// The record of --layer (negative counts from the end), listing the layers when out of range.
const nn::AttentionRecord& pick_layer(const std::vector<nn::AttentionRecord>& records,
                                      int64_t layer, const std::string& name) {
  const auto n = static_cast<int64_t>(records.size());
  SKA_CHECK(n > 0, ValueError, name, ": the model computed no attention (no attention mixer)");
  const int64_t index = layer < 0 ? n + layer : layer;
  if (index >= 0 && index < n) return records[static_cast<size_t>(index)];
  std::string list;
  for (int64_t i = 0; i < n; ++i)
    list += "\n  layer " + std::to_string(i) + ": " + records[static_cast<size_t>(i)].weights.str();
  SKA_FAIL(ValueError, name, ": --layer ", layer, " is outside the ", n, " attention layers (0..",
           n - 1, ", or -1 for the last):", list);
}

// Runs one model on its input and cuts out the query's attention at --layer.
Row compute_row(const MapsCommand& cmd, size_t k) {
  apps::ConfigOptions options;
  options.config = cmd.configs[k];
  options.sets = cmd.sets;
  const Config config = apps::load_config(options);
  const ConfigNode model_cfg = apps::model_section(config);
  const models::ModelInput in = apps::model_input(model_cfg);
  nn::ModulePtr model = models::build_model(model_cfg);
  Row row;
  row.input = model_input(cmd, config, in);
  config.check_unused();
  apps::load_weights(*model, apps::resolve_weights_file(cmd.checkpoints[k]));
  const Device device = apps::device_option(cmd.device);
  model->to(device);
  model->eval();
  NoGradGuard no_grad;
  nn::AttentionRecorder recorder;
  (*model)(row.input.unsqueeze(0).to(device));
  const std::string name = row_name(cmd.configs[k]);
  const nn::AttentionRecord& record = pick_layer(recorder.records(), cmd.layer, name);
  const auto n = static_cast<int64_t>(recorder.records().size());
  const int64_t layer = cmd.layer < 0 ? n + cmd.layer : cmd.layer;
  std::optional<nn::AttentionQuery> query = parse_query(cmd.query, in.image_size);
  if (!query) {  // the class token when the layer has one, else the centre
    query = nn::AttentionQuery{};
    query->cls = nn::has_class_query(record);
  }
  row.query = *query;
  row.map = nn::attention_map(record, row.query);
  row.label = name + "  layer " + std::to_string(layer) + "/" + std::to_string(n - 1) + "  query " +
              query_label(row.query, in.image_size);
  return row;
}

// The row's cells: the input, then one heat map per head, each with the query marked.
void draw_row(io::RgbImage& canvas, const Row& row, int top, int cell) {
  io::draw_text(canvas, kPad, top, row.label, io::Rgb{0, 0, 0});
  const int y = top + kLabel;
  const io::RgbImage base = io::tensor_image(row.input, cell, cell);
  const int qx = static_cast<int>(row.query.x * cell), qy = static_cast<int>(row.query.y * cell);
  io::RgbImage input = base;
  if (!row.query.cls) io::draw_marker(input, qx, qy, std::max(2, cell / 32));
  io::paste(canvas, input, kPad, y);
  for (int64_t h = 0; h < row.map.grid.size(0); ++h) {
    io::RgbImage heat = io::overlay_heat(base, row.map.grid.select(0, h));
    if (!row.query.cls) io::draw_marker(heat, qx, qy, std::max(2, cell / 32));
    const int x = kPad + static_cast<int>(h + 1) * (cell + kPad);
    io::paste(canvas, heat, x, y);
    io::draw_text(canvas, x + 2, y + 2, "h" + std::to_string(h), io::Rgb{255, 255, 255});
  }
}

int run_maps(const MapsCommand& cmd) {
  std::vector<Row> rows;
  int64_t columns = 1;
  for (size_t k = 0; k < cmd.configs.size(); ++k) {
    rows.push_back(compute_row(cmd, k));
    columns = std::max<int64_t>(columns, 1 + rows.back().map.grid.size(0));
  }
  const int width = kPad + static_cast<int>(columns) * (cmd.cell + kPad);
  const int row_height = kLabel + cmd.cell + kPad;
  io::RgbImage canvas(width, kPad + static_cast<int>(rows.size()) * row_height,
                      io::kPlotBackground);
  for (size_t k = 0; k < rows.size(); ++k) {
    draw_row(canvas, rows[k], kPad + static_cast<int>(k) * row_height, cmd.cell);
    const nn::AttentionMap& m = rows[k].map;
    std::cout << rows[k].label << ": " << m.grid.size(0) << " heads over a " << m.keys.height << "x"
              << m.keys.width << " key grid" << (m.keys.cls ? " + class key" : "") << "\n";
  }
  io::write_png(cmd.output, canvas);
  std::cout << "wrote " << cmd.output << " (" << width << "x" << canvas.height() << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Draws attention maps of one query, per head, for one or more models",
               "attention_maps"};
  MapsCommand cmd;
  app.add_option("--config", cmd.configs, "a config path or name (repeatable: one row each)")
      ->required();
  app.add_option("--checkpoint", cmd.checkpoints,
                 "a checkpoint folder, run folder or .safetensors file, one per --config")
      ->required();
  app.add_option("--set", cmd.sets, "key.path=value override applied to every config");
  auto* image = app.add_option("--image", cmd.image, "an image file (needs OpenCV)")
                    ->check(CLI::ExistingFile);
  auto* npy = app.add_option("--input", cmd.input,
                             "float32 .npy [C, H, W] or [N, C, H, W] "
                             "(normalised; the first image is used)")
                  ->check(CLI::ExistingFile);
  npy->excludes(image);
  app.add_option("--layer", cmd.layer,
                 "which attention layer, in forward order (negative: from the end; default -1)");
  app.add_option("--query", cmd.query,
                 "cls, or i,j: the token at pixel row i, column j of the input (default: cls "
                 "when the layer has a class token, else the centre)");
  app.add_option("--output", cmd.output, "the PNG to write (default attention_maps.png)");
  app.add_option("--cell", cmd.cell, "pixels per map (default 128)")->check(CLI::Range(16, 1024));
  app.add_option("--device", cmd.device, "cpu, cuda or cuda:N");
  return apps::run_main(app, argc, argv, [&] {
    SKA_CHECK(!cmd.image.empty() || !cmd.input.empty(), ValueError,
              "give the input with --image FILE or --input x.npy");
    SKA_CHECK(cmd.checkpoints.size() == cmd.configs.size(), ValueError, cmd.configs.size(),
              " --config but ", cmd.checkpoints.size(), " --checkpoint; give one checkpoint each");
    return run_maps(cmd);
  });
}
