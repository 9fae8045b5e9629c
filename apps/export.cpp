// export: writes a checkpoint's weights under another implementation's names (a weight map run
// backwards: transforms undone, concatenations split, splits joined) as safetensors for their code.
// Usage: export --config X --checkpoint C --weight-map M --output theirs.safetensors [--like F]
#include <cstdint>
#include <iostream>

#include "app_common.h"
#include "io/safetensors.h"
#include "io/weight_map.h"

namespace {

using namespace ska;

struct ExportCommand {
  apps::ConfigOptions config;
  std::string checkpoint;
  bool ema = false;
  std::string weight_map;
  std::string output;
  std::string like;  // a checkpoint of theirs: the shapes for undoing reshapes and splitting cats
};

std::map<std::string, Shape> shapes_of(const std::string& path) {
  std::map<std::string, Shape> shapes;
  if (path.empty()) return shapes;
  for (const auto& [name, tensor] : load_safetensors(path)) shapes[name] = tensor.shape();
  return shapes;
}

int run_export(const ExportCommand& cmd) {
  const Config config = apps::load_config(cmd.config);
  const ConfigNode model_cfg = apps::model_section(config);
  nn::ModulePtr model = models::build_model(model_cfg);
  config.check_unused();
  const std::string weights = apps::resolve_weights_file(cmd.checkpoint, cmd.ema);
  apps::load_weights(*model, weights);
  const WeightMap map = load_weight_map(cmd.weight_map);
  std::map<std::string, Tensor> theirs;
  try {
    theirs = export_weights(map, model->state_dict(), shapes_of(cmd.like));
  } catch (const ValueError& e) {
    SKA_FAIL(ValueError, "exporting ", weights, ": ", e.what(),
             cmd.like.empty() ? " (--like THEIRS.safetensors gives their shapes)" : "");
  }
  int64_t numbers = 0;
  for (const auto& [name, tensor] : theirs) numbers += tensor.numel();
  save_safetensors(cmd.output, theirs,
                   {{"exported_from", weights}, {"weight_map", cmd.weight_map}});
  std::cout << "export: wrote " << theirs.size() << " tensors (" << numbers << " numbers) named by "
            << cmd.weight_map << " to " << cmd.output << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Writes a checkpoint's weights under another implementation's names", "export"};
  ExportCommand cmd;
  apps::add_config_options(app, cmd.config);
  app.add_option("--checkpoint", cmd.checkpoint,
                 "a checkpoint folder, a run folder (its last checkpoint) or a .safetensors file")
      ->required();
  app.add_flag("--ema", cmd.ema, "export the checkpoint's EMA weights");
  app.add_option("--weight-map", cmd.weight_map,
                 "YAML map from their names to ours (configs/weight_maps/*.yaml), run backwards")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--output", cmd.output, "the safetensors file to write")->required();
  app.add_option("--like", cmd.like,
                 "a checkpoint of theirs whose shapes undo reshapes (only maps with reshape: "
                 "need it)")
      ->check(CLI::ExistingFile);
  return apps::run_main(app, argc, argv, [&] { return run_export(cmd); });
}
