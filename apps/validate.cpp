// validate: evaluates a checkpoint (or its EMA weights) on the config's test split and prints
// top-1, top-5 and the loss.
// Usage: validate --config quickstart --checkpoint runs/X [--ema] [--device cpu] [--set k=v]
//        [--json]
#include <iostream>
#include <nlohmann/json.hpp>

#include "app_common.h"
#include "train/trainer.h"

namespace {

struct ValidateCommand {
  ska::apps::ConfigOptions config;
  std::string checkpoint;
  bool ema = false;
  bool json = false;
  std::string device = "cpu";
};

int run_validate(const ValidateCommand& cmd) {
  using namespace ska;
  const ska::Config config = apps::load_config(cmd.config);
  const ConfigNode model_cfg = apps::model_section(config, {"train"});
  const models::ModelInput input = apps::model_input(model_cfg);
  nn::ModulePtr model = models::build_model(model_cfg);
  const train::DataOptions data =
      train::DataOptions::from_config(config.root()["data"], input.image_size, input.in_channels,
                                      input.num_classes);
  // Evaluated as the trainer evaluates: under train.precision's autocast (override with
  // --set train.precision=fp32), so validate reproduces the trainer's figures.
  const train::TrainOptions train_options = train::TrainOptions::from_config(config.root()["train"]);
  config.check_unused();

  const std::string weights = apps::resolve_weights_file(cmd.checkpoint, cmd.ema);
  apps::load_weights(*model, weights);
  const Device device = apps::device_option(cmd.device);
  model->to(device);
  train_options.kernels.apply();  // train.attention etc., as the trainer chose its kernels

  const auto eval_set = train::load_dataset_split(data, "test", input.image_size,
                                                  input.in_channels, data.eval_subset);
  data::DataLoader loader(*eval_set, train::eval_loader_options(data, *eval_set));
  const train::EvalResult r =
      train::evaluate(*model, loader, device, train_options.eval_precision());
  if (cmd.json) {
    const nlohmann::json j = {{"weights", weights}, {"dataset", data.dataset},
                              {"precision", train::precision_name(train_options.precision)}, {"count", r.count},
                              {"top1", r.top1}, {"top5", r.top5}, {"loss", r.loss}};
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::printf("validate: %s on %s test (%lld images): top-1 %.2f%% top-5 %.2f%% loss %.4f\n",
              weights.c_str(), data.dataset.c_str(), static_cast<long long>(r.count), r.top1,
              r.top5, r.loss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ska::apps::limit_openmp_spinning(argv);
  CLI::App app{"Evaluates a checkpoint on the config's test split", "validate"};
  ValidateCommand cmd;
  ska::apps::add_config_options(app, cmd.config);
  app.add_option("--checkpoint", cmd.checkpoint,
                 "a checkpoint folder, a run folder (its last checkpoint) or a .safetensors file")
      ->required();
  app.add_flag("--ema", cmd.ema, "evaluate the checkpoint's EMA weights");
  app.add_option("--device", cmd.device, "cpu, cuda or cuda:N");
  app.add_flag("--json", cmd.json, "print one JSON object (full-precision figures)");
  return ska::apps::run_main(app, argc, argv, [&] { return run_validate(cmd); });
}
