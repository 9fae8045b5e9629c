// summary: builds a model from its config and prints its layers, parameter counts and MACs.
// Usage: summary --config caformer_s18 [--json] [--depth N] [--batch 1] [--device cpu] [--set k=v]
#include <cstdint>
#include <iostream>

#include "app_common.h"
#include "data/eval_transform.h"
#include "model_summary.h"

namespace {

struct SummaryOptions {
  ska::apps::ConfigOptions config;
  bool json = false;
  int depth = -1;
  int64_t batch = 1;
  std::string device = "cpu";
};

int run_summary(SummaryOptions options) {
  using namespace ska;
  options.config.print_config_to_stderr = options.json;
  const Config config = apps::load_config(options.config);
  const ConfigNode model_cfg = apps::model_section(config);
  const models::ModelInput input = apps::model_input(model_cfg);
  nn::ModulePtr model = models::build_model(model_cfg);
  const ConfigNode data = apps::data_section(config);
  if (!data.is_null()) data::read_eval_transform(data, input.image_size, input.in_channels);
  config.check_unused();

  const Device device = apps::device_option(options.device);
  model->to(device);
  const apps::ModelSummary summary = apps::summarize_model(
      *model, {options.batch, input.in_channels, input.image_size, input.image_size}, device);
  if (options.json) {
    const std::string family = model_cfg.get<std::string>("family");
    const std::string path = apps::resolve_config_path(options.config.config);
    std::cout << apps::format_summary_json(summary, options.depth,
                                           {{"config", path}, {"family", family}})
              << std::endl;
  } else {
    std::cout << apps::format_summary_table(summary, options.depth);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Builds a model from its config and prints its layers, parameters and MACs",
               "summary"};
  SummaryOptions options;
  ska::apps::add_config_options(app, options.config);
  app.add_flag("--json", options.json, "print one JSON object instead of the table");
  app.add_option("--depth", options.depth,
                 "show layers up to this nesting depth (0: the model only; default: all)");
  ska::apps::add_batch_option(app, options.batch, "batch size of the recorded forward pass");
  app.add_option("--device", options.device, "cpu, cuda or cuda:N");
  return ska::apps::run_main(app, argc, argv, [&] { return run_summary(options); });
}
