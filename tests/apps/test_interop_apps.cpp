// Tests of the interop commands end to end: `attention_maps` writes a PNG grid of the expected
// size (decoded by libpng) from a .npy or an image file, and `export` writes our weights under
// another implementation's names (the authors' SKA-CaiT class attention split into to_k, to_v).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "app_test_util.h"
#include "data/datasets/image_folder.h"
#include "io/npy.h"
#include "io/png.h"
#include "io/safetensors.h"
#include "io/weight_map.h"
#include "io/weight_map_fixtures.h"
#include "models/model.h"
#include "support/test_util.h"

namespace {

using ska::test::read_text;
using ska::test::run_command;
using ska::test::RunResult;

using namespace ska;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

std::string scratch_dir() { return ska::test::app_scratch_dir("interop"); }

// Writes `yaml` as a model config and its freshly initialised weights; returns the config path.
std::string write_model(const std::string& dir, const std::string& name, const std::string& yaml) {
  const std::string config = dir + "/" + name + ".yaml";
  std::ofstream(config) << yaml;
  Config parsed = Config::parse(yaml);
  save_safetensors(dir + "/" + name + ".safetensors",
                   models::build_model(parsed.root())->state_dict());
  return config;
}

}  // namespace

// The picture is measured with libpng; the input image is written by our PNG writer.
TEST_CASE("apps: attention_maps draws one row per model and one cell per head", "[cpu][apps]") {
  const std::string dir = scratch_dir();
  // The reduced ViT (8x8 input, 2x2 patches: 16 tokens + cls, 2 heads) with two mixers.
  const std::string ska = write_model(dir, "vit_ska", test::with_mixer(test::kSmallVit, "ska"));
  const std::string cska = write_model(dir, "vit_cska", test::with_mixer(test::kSmallVit, "cska"));
  write_npy(dir + "/x.npy", test::uniform({1, 3, 8, 8}, 1, -1, 1, DType::kF32));
  const std::string png = dir + "/maps.png";
  const std::string models = "--config " + ska + " --checkpoint " + dir + "/vit_ska.safetensors" +
                             " --config " + cska + " --checkpoint " + dir + "/vit_cska.safetensors";
  RunResult r = run_command(SKA_ATTENTION_MAPS_EXE,
                            models + " --input " + dir + "/x.npy --cell 32 --output " + png);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("vit_ska  layer 1/1  query cls: 2 heads over a 4x4 key grid"));
  // Columns: the input and 2 heads of 32 px, 6 px apart; rows: a 14 px label over each cell.
  Tensor image = data::decode_image_rgb(png);
  REQUIRE(image.size(1) == 6 + 3 * (32 + 6));
  REQUIRE(image.size(0) == 6 + 2 * (14 + 32 + 6));

  // An image file, a position query and the first layer.
  io::write_png(dir + "/a.png", io::RgbImage(8, 8, {30, 200, 10}));
  r = run_command(SKA_ATTENTION_MAPS_EXE, "--config " + ska + " --checkpoint " + dir +
                                              "/vit_ska.safetensors --image " + dir +
                                              "/a.png --query 1,6 --layer 0 --output " + png);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Contains("layer 0/1  query row 1 col 6"));
  image = data::decode_image_rgb(png);
  REQUIRE(image.size(1) == 6 + 3 * (128 + 6));
  REQUIRE(image.size(0) == 6 + 14 + 128 + 6);

  r = run_command(SKA_ATTENTION_MAPS_EXE, models + " --input " + dir + "/x.npy --layer 5");
  REQUIRE(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("--layer 5 is outside the 2 attention layers"));
  r = run_command(SKA_ATTENTION_MAPS_EXE, models + " --input " + dir + "/x.npy --query 9,1");
  REQUIRE(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("expected cls or i,j with 0 <= i, j < 8"));
}

TEST_CASE("apps: export writes the authors' SKA-CaiT names, class attention split", "[cpu][apps]") {
  const std::string dir = scratch_dir();
  const std::string yaml = test::with_mixer(test::kSmallCait, "ska");
  const std::string config = write_model(dir, "cait_ska", yaml);
  const std::string map =
      std::string(SKA_SOURCE_DIR) + "/configs/weight_maps/authors_cifar_cait.yaml";
  const std::string out = dir + "/theirs.safetensors";
  RunResult r = run_command(SKA_EXPORT_EXE, "--config " + config + " --checkpoint " + dir +
                                                "/cait_ska.safetensors --weight-map " + map +
                                                " --output " + out);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  const TensorMap theirs = load_safetensors(out);
  const TensorMap ours = load_safetensors(dir + "/cait_ska.safetensors");
  const Tensor kv = ours.at("class_layers.0.attn.to_kv.weight");
  test::require_close(theirs.at("cls_transformer.layers.0.0.fn.fn.to_k.weight"), kv.narrow(0, 0, 8),
                      {0, 0}, "to_k");
  test::require_close(theirs.at("cls_transformer.layers.0.0.fn.fn.to_v.weight"), kv.narrow(0, 8, 8),
                      {0, 0}, "to_v");
  REQUIRE(theirs.at("patch_transformer.layers.0.0.scale").shape() == Shape{1, 1, 16});
  // Their file loads straight back into ours through the same map.
  const auto back = import_weights(load_weight_map(map), theirs, ours);
  for (const auto& [name, value] : ours) test::require_close(back.at(name), value, {0, 0}, name);
}
