// inference: runs a model with trained weights on a .npy batch or on image files and writes the
// logits as a float32 .npy [N, num_classes]; prints each input's top-1 class.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iostream>

#include "app_common.h"
#include "autograd/grad_mode.h"
#include "data/eval_transform.h"
#include "io/npy.h"
#include "ops/ops.h"
#include "train/options.h"

namespace {

using namespace ska;
namespace fs = std::filesystem;

struct InferenceOptions {
  apps::ConfigOptions config;
  std::string weights;
  std::string weight_map;
  std::string input;
  std::vector<std::string> images;
  std::string output;
  std::string device = "cpu";
  int64_t batch = 32;
};

constexpr size_t kMaxPrintedRows = 20;

// A float32 [N, C, H, W] batch from a .npy file ([C, H, W] is one image), checked against the
// model's input.
Tensor read_input_npy(const std::string& path, const models::ModelInput& input) {
  Tensor x = read_npy(path);
  if (x.dim() == 3) x = x.unsqueeze(0);
  const Shape expected = {-1, input.in_channels, input.image_size, input.image_size};
  const bool fits = x.dim() == 4 && x.size(0) > 0 && x.size(1) == input.in_channels &&
                    x.size(2) == input.image_size && x.size(3) == input.image_size;
  SKA_CHECK(fits, ShapeError, path, ": input of shape ", shape_str(x.shape()),
            " does not fit the model; expected [N, ", input.in_channels, ", ", input.image_size,
            ", ", input.image_size, "] (N images of in_channels x image_size x image_size)");
  SKA_CHECK(x.is_floating(), DTypeError, path, ": input dtype ", dtype_name(x.dtype()),
            " is not floating; expected float32 (normalised pixels)");
  return x.to(DType::kF32);
}

Tensor read_input_images(const std::vector<std::string>& paths, const data::EvalTransform& t) {
  TensorList images;
  for (const std::string& path : paths) images.push_back(data::load_eval_image(path, t));
  return stack(images, 0);
}

// Runs the model over `x` in chunks of `batch` rows without gradients; logits on the CPU.
Tensor run_batches(nn::Module& model, const Tensor& x, int64_t batch, Device device) {
  model.eval();
  NoGradGuard no_grad;
  TensorList outputs;
  for (int64_t start = 0; start < x.size(0); start += batch) {
    const int64_t rows = std::min(batch, x.size(0) - start);
    outputs.push_back(model(x.narrow(0, start, rows).to(device)).to(Device::cpu()));
  }
  return cat(outputs, 0).to(DType::kF32);
}

void print_top1(const Tensor& logits, const std::vector<std::string>& sources) {
  const Tensor probs = softmax(logits).contiguous();
  const int64_t n = probs.size(0), classes = probs.size(1);
  const std::vector<float> p = probs.to_vector<float>();
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(kMaxPrintedRows); ++i) {
    const float* row = p.data() + i * classes;
    const int64_t best = std::max_element(row, row + classes) - row;
    std::cout << sources[i] << ": class " << best << " (p = " << row[best] << ")\n";
  }
  if (n > static_cast<int64_t>(kMaxPrintedRows)) std::cout << "... (" << n << " rows)\n";
}

int run_inference(const InferenceOptions& options) {
  const Config config = apps::load_config(options.config);
  const ConfigNode model_cfg = apps::model_section(config, {"train"});
  const models::ModelInput input = apps::model_input(model_cfg);
  nn::ModulePtr model = models::build_model(model_cfg);
  const ConfigNode data = apps::data_section(config);
  data::EvalTransform transform;
  if (!options.images.empty() || !data.is_null()) {
    transform = data::read_eval_transform(data, input.image_size, input.in_channels);
  }
  // train.attention etc. (an experiment config's; the defaults for a model file). The whole
  // section is read, so that a typo in it is reported.
  const train::KernelChoices kernels =
      train::TrainOptions::from_config(config.root()["train"]).kernels;
  config.check_unused();
  // Where the logits go, checked before the forward pass rather than after it.
  const fs::path out_dir = fs::absolute(options.output).parent_path();
  SKA_CHECK(!fs::is_directory(options.output) && options.output.back() != '/', ValueError,
            "--output '", options.output,
            "' is a folder; expected the path of the .npy file to write");
  SKA_CHECK(fs::is_directory(out_dir), ValueError, "--output '", options.output, "': the folder '",
            out_dir.string(), "' does not exist");

  apps::load_weights(*model, options.weights, options.weight_map);
  const Device device = apps::device_option(options.device);
  model->to(device);
  kernels.apply();

  std::vector<std::string> sources = options.images;
  Tensor x;
  if (!options.input.empty()) {
    x = read_input_npy(options.input, input);
    for (int64_t i = 0; i < x.size(0); ++i) {
      sources.push_back(options.input + "[" + std::to_string(i) + "]");
    }
  } else {
    x = read_input_images(options.images, transform);
  }
  const Tensor logits = run_batches(*model, x, options.batch, device);
  write_npy(options.output, logits);
  print_top1(logits, sources);
  std::cout << "wrote logits " << shape_str(logits.shape()) << " to " << options.output << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ska::apps::limit_openmp_spinning(argv);
  CLI::App app{"Runs a model with trained weights on a .npy batch or on images; writes logits",
               "inference"};
  InferenceOptions options;
  apps::add_config_options(app, options.config);
  app.add_option("--weights", options.weights, "safetensors file of the model's weights")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--weight-map", options.weight_map,
                 "YAML map from the file's names to ours (configs/weight_maps/*.yaml)")
      ->check(CLI::ExistingFile);
  auto* npy = app.add_option("--input", options.input,
                             "float32 .npy [N, C, H, W], already normalised")
                  ->check(CLI::ExistingFile);
  auto* images = app.add_option("--image", options.images,
                                "image file(s), preprocessed as the config's data: keys say "
                                "(repeatable)")
                     ->allow_extra_args(false)
                     ->check(CLI::ExistingFile);
  npy->excludes(images);
  app.add_option("--output", options.output, "where to write the logits (.npy)")->required();
  app.add_option("--device", options.device, "cpu, cuda or cuda:N");
  apps::add_batch_option(app, options.batch, "rows per forward pass");
  return apps::run_main(app, argc, argv, [&] {
    SKA_CHECK(!options.input.empty() || !options.images.empty(), ValueError,
              "give the inputs with --input x.npy or --image file [--image file ...]");
    return run_inference(options);
  });
}
