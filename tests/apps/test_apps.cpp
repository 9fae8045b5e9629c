// Tests of the commands: config lookup and sections (app_common), the summary report on a model
// whose MACs are known by hand, and the built `summary` / `inference` executables end to end.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "app_common.h"
#include "app_test_util.h"
#include "backend/profiler.h"
#include "data/eval_transform.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/png.h"
#include "io/safetensors.h"
#include "io/weight_map.h"
#include "model_summary.h"
#include "nn/layers.h"
#include "support/test_util.h"

namespace {

using ska::test::read_text;
using ska::test::run_command;
using ska::test::RunResult;

using namespace ska;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

const std::string kSourceDir = SKA_SOURCE_DIR;
const std::string kTinyVit = std::string(SKA_TEST_FIXTURES) + "/models/tiny_vit.yaml";

// conv 3->4 (k2, s2) on 8x8 -> mean over H, W -> linear 4->classes. MACs by hand: conv
// 4*3*2*2 * 4*4 = 768, linear 4*classes.
class HandCountedNet : public nn::Module {
 public:
  HandCountedNet(int64_t channels, int64_t classes) {
    conv = register_module(
        "conv", std::make_shared<nn::Conv2d>(channels, 4, 2, nn::Conv2dOptions{2, 0, 1, 1}));
    head = register_module("head", std::make_shared<nn::Linear>(4, classes));
  }
  Tensor forward(const Tensor& x) override { return (*head)(mean((*conv)(x), {2, 3})); }
  std::string type_name() const override { return "HandCountedNet"; }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::Linear> head;
};

std::string scratch_dir() { return ska::test::app_scratch_dir("apps"); }

nn::ModulePtr build_from_file(const std::string& path) {
  Config config = Config::load(path);
  return models::build_model(config.root());
}

}  // namespace

// Run only by name, by the test below, in the process limit_openmp_spinning re-executes.
TEST_CASE("apps: limit_openmp_spinning's re-executed process", "[.][openmp_child]") {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  REQUIRE(spin != nullptr);
  REQUIRE(std::string(spin) == "10000");
}

// ctest sets OMP_WAIT_POLICY for every test, so the commands' own re-execution is tested here.
TEST_CASE("apps: the commands re-execute themselves once with GOMP_SPINCOUNT=10000",
          "[cpu][apps]") {
  const auto run = [](const char* wait_policy) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::unsetenv("GOMP_SPINCOUNT");
      if (wait_policy != nullptr) {
        ::setenv("OMP_WAIT_POLICY", wait_policy, 1);
      } else {
        ::unsetenv("OMP_WAIT_POLICY");
      }
      std::string name = "apps: limit_openmp_spinning's re-executed process", warn = "-w",
                  no_tests = "NoTests", program = "ska_tests";
      char* argv[] = {program.data(), name.data(), warn.data(), no_tests.data(), nullptr};
      ska::apps::limit_openmp_spinning(argv);
      ::_exit(42);  // returned: not re-executed
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  CHECK(run(nullptr) == 0);     // re-executed; the child test saw GOMP_SPINCOUNT=10000
  CHECK(run("passive") == 42);  // the user's OpenMP setting is left alone
}

TEST_CASE("apps: bare config names are looked up in the configs folders", "[cpu][apps]") {
  const std::string vit = apps::resolve_config_path("vit_s");
  REQUIRE(fs::equivalent(vit, kSourceDir + "/configs/models/vit_s.yaml"));
  REQUIRE(apps::resolve_config_path(kTinyVit) == kTinyVit);
  REQUIRE_THROWS_WITH(apps::resolve_config_path("no_such_model"),
                      Contains("config 'no_such_model' not found") &&
                          Contains("configs/models/no_such_model.yaml"));

  const std::string dir = scratch_dir() + "/configs";
  fs::create_directories(dir + "/models");
  std::ofstream(dir + "/models/elsewhere.yaml") << "family: vit\n";
  setenv("SKA_CONFIG_DIR", dir.c_str(), 1);
  REQUIRE(apps::resolve_config_path("elsewhere") == dir + "/models/elsewhere.yaml");
  unsetenv("SKA_CONFIG_DIR");
  fs::remove_all(scratch_dir());
}

TEST_CASE("apps: an experiment config is validated strictly on its model section", "[cpu][apps]") {
  const std::string experiment = R"(
model: {family: vit, image_size: 8, in_channels: 3, num_classes: 5, patch_size: 4, dim: 8,
        depth: 1, mlp_dim: 8, mixer: {type: lsa, heads: 2, head_dim: 4}}
data: {dataset: cifar10, root: /data, mean: [0.5], crop_pct: 1.0}
optim: {name: adam, lr: 0.001}
train: {epochs: 3}
)";
  SECTION("the trainer's other sections are read as the trainer reads them") {
    Config config = Config::parse(experiment);
    const ConfigNode model = apps::model_section(config);
    REQUIRE(model.path() == "model");
    REQUIRE(apps::model_input(model).num_classes == 5);
    models::build_model(model);
    const ConfigNode data = apps::data_section(config);
    const data::EvalTransform t = data::read_eval_transform(data, 8, 3);
    REQUIRE(t.mean == std::vector<double>{0.5, 0.5, 0.5});
    REQUIRE_NOTHROW(config.check_unused());
  }
  SECTION("a typo in one of them is reported, though the command does not use it") {
    Config config = Config::parse(experiment);
    config.set("train.optimizer={name: adam}");
    apps::model_section(config);
    apps::data_section(config);
    REQUIRE_THROWS_WITH(config.check_unused(), Contains("train.optimizer: unknown key"));
  }
  SECTION("so is a section that is none of the trainer's") {
    Config config = Config::parse(experiment);
    config.set("trian.epochs=4");
    apps::model_section(config);
    apps::data_section(config);
    REQUIRE_THROWS_WITH(config.check_unused(),
                        Contains("trian: unknown key; did you mean 'train'?"));
  }
  SECTION("a typo in the model section is reported") {
    Config config = Config::parse(experiment);
    config.set("model.mlp_dimm=4");
    models::build_model(apps::model_section(config));
    apps::data_section(config);
    REQUIRE_THROWS_WITH(config.check_unused(), Contains("model.mlp_dimm"));
  }
  SECTION("a section the command reads itself is judged too") {
    Config config = Config::parse(experiment);
    config.set("train.epochz=4");
    apps::model_section(config, {"train"});
    apps::data_section(config);
    REQUIRE_THROWS_WITH(config.check_unused(), Contains("train.epochz"));
  }
  SECTION("a model file is its own model section") {
    Config config = Config::load(kTinyVit);
    REQUIRE(apps::model_section(config).path().empty());
    REQUIRE(apps::data_section(config).path() == "data");
  }
}

TEST_CASE("summary report: parameters and MACs of a hand-counted model", "[cpu][apps]") {
  HandCountedNet net(3, 10);
  const apps::ModelSummary s = apps::summarize_model(net, {2, 3, 8, 8}, Device::cpu());
  REQUIRE(s.trainable_params == (4 * 3 * 4 + 4) + (4 * 10 + 10));
  REQUIRE(s.total_params == s.trainable_params);
  REQUIRE(s.macs_per_image == 768 + 40);  // per image although the batch is 2
  REQUIRE(s.gflops() == Approx(2 * 808e-9));
  REQUIRE(s.layers.size() == 3);
  REQUIRE(s.layers[1].name == "conv");
  REQUIRE(s.layers[1].output == Shape{2, 4, 4, 4});
  REQUIRE(s.layers[1].macs == 768);
  REQUIRE(s.layers[2].depth == 1);
  REQUIRE_FALSE(net.is_training());

  const std::string table = apps::format_summary_table(s);
  REQUIRE_THAT(table, Contains("  conv   Conv2d          [2, 4, 4, 4]") &&
                          Contains("Trainable params:   102"));
  REQUIRE_THAT(table, Contains("MACs per image:     0.0000 G (808;"));
  REQUIRE_THAT(apps::format_summary_table(s, 0), !Contains("conv"));
  const std::string json = apps::format_summary_json(s, -1, {{"config", "x.yaml"}});
  REQUIRE_THAT(json, Contains("\"config\": \"x.yaml\"") && Contains("\"trainable_params\": 102") &&
                         Contains("\"macs\": 808") && Contains("\"name\": \"head\""));
  REQUIRE(apps::with_thousands(26341656) == "26,341,656");
  REQUIRE(apps::with_thousands(999) == "999");
}

TEST_CASE("summary command: table, JSON, overrides and errors", "[cpu][apps]") {
  RunResult r = run_command(SKA_SUMMARY_EXE, "--config " + kTinyVit + " --depth 1");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(
      r.out, Contains("(model)") && Contains("Trainable params:") && Contains("FLOPs per image:"));
  const int64_t params = build_from_file(kTinyVit)->num_parameters(true);
  REQUIRE_THAT(r.out, Contains("Trainable params:   " + apps::with_thousands(params)));

  r = run_command(SKA_SUMMARY_EXE, "--config " + kTinyVit + " --json --set num_classes=7");
  REQUIRE(r.exit_code == 0);
  Config seven = Config::load(kTinyVit);
  seven.set("num_classes=7");
  const int64_t params7 = models::build_model(seven.root())->num_parameters(true);
  REQUIRE_THAT(r.out, Contains("\"family\": \"vit\"") && Contains("\"gmacs\"") &&
                          Contains("\"trainable_params\": " + std::to_string(params7)));

  r = run_command(SKA_SUMMARY_EXE, "--config " + kTinyVit + " --set depht=2");
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(
      r.err, Contains("summary: error:") && Contains("depht") && Contains("did you mean 'depth'"));
  r = run_command(SKA_SUMMARY_EXE, "--config " + kTinyVit + " --print-config --depth 0");
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(r.out, Contains("family: vit"));
  REQUIRE(run_command(SKA_SUMMARY_EXE, "--bogus").exit_code == 1);  // usage error
}

TEST_CASE("apps: a --device that is not here is an error naming it and what there is",
          "[cpu][apps][hardening]") {
#ifdef SKA_WITH_CUDA
  const std::string what =
      ska::cuda_device_count() == 0 ? "no CUDA device is visible" : "CUDA device(s) are visible";
#else
  const std::string what = "this build has no CUDA support";
#endif
  const std::string dir = scratch_dir() + "/device";
  for (const auto& [exe, name] : {std::pair{SKA_SUMMARY_EXE, "summary"},
                                  std::pair{SKA_BENCHMARK_EXE, "benchmark"},
                                  std::pair{SKA_TRAIN_EXE, "train"}}) {
    const std::string runs = std::string(name) == "train" ? " --runs " + dir : "";
    const RunResult r = run_command(exe, "--config " + kTinyVit + " --device cuda:1000" + runs);
    INFO(name << ": " << r.out << r.err);
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.err, Contains(std::string(name) + ": error: --device cuda:1000: ") &&
                            Contains(what));
  }
  REQUIRE_FALSE(fs::exists(dir));  // train made no run folder
  // With --nproc-per-node the launcher says it once, before any worker starts.
  const RunResult launched = run_command(
      SKA_TRAIN_EXE, "--config " + kTinyVit + " --device cuda:1000 --nproc-per-node 2");
  INFO(launched.err);
  REQUIRE(launched.exit_code == 2);
  REQUIRE_THAT(launched.err, Contains("train: error: --device cuda:1000: ") &&
                                 !Contains("launch:") && !Contains("rank"));
  REQUIRE_THAT(run_command(SKA_SUMMARY_EXE, "--config " + kTinyVit + " --device gpu").err,
               Contains("invalid device 'gpu'; expected 'cpu', 'cuda' or 'cuda:N'"));
}

TEST_CASE("inference command: npy and images in, logits out, with and without a weight map",
          "[cpu][apps]") {
  const std::string dir = scratch_dir();
  manual_seed(3);
  nn::ModulePtr model = build_from_file(kTinyVit);
  // Non-trivial weights, saved as our checkpoint and under "model." names for the weight map.
  for (auto& [name, p] : model->named_parameters())
    p.copy_(test::uniform(p.shape(), 11, -0.5, 0.5));
  save_safetensors(dir + "/ours.safetensors", model->state_dict());
  const WeightMap map =
      load_weight_map(std::string(SKA_TEST_FIXTURES) + "/models/tiny_prefix_map.yaml");
  save_safetensors(dir + "/theirs.safetensors", export_weights(map, model->state_dict()));

  const Tensor x = test::uniform({3, 3, 8, 8}, 5, -1, 1, DType::kF32);
  write_npy(dir + "/x.npy", x);
  model->eval();
  Tensor expected;
  {
    NoGradGuard no_grad;
    expected = (*model)(x);
  }
  const std::string common = "--config " + kTinyVit + " --output " + dir + "/logits.npy ";

  RunResult r =
      run_command(SKA_INFERENCE_EXE, common + "--weights " + dir + "/ours.safetensors --input " +
                                         dir + "/x.npy --batch 2");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  REQUIRE_THAT(r.out, Contains("x.npy[2]: class") && Contains("wrote logits [3, 5]"));
  test::require_close(read_npy(dir + "/logits.npy"), expected, test::tolerance_for(DType::kF32));

  r = run_command(SKA_INFERENCE_EXE, common + "--weights " + dir + "/theirs.safetensors " +
                                         "--weight-map " + SKA_TEST_FIXTURES +
                                         "/models/tiny_prefix_map.yaml --input " + dir + "/x.npy");
  REQUIRE(r.exit_code == 0);
  test::require_close(read_npy(dir + "/logits.npy"), expected, test::tolerance_for(DType::kF32));

  // The kernels' switches (train.attention etc.) apply here too.
  r = run_command(SKA_INFERENCE_EXE, common + "--weights " + dir + "/ours.safetensors --input " +
                                         dir + "/x.npy --set train.attention=unfused");
  REQUIRE(r.exit_code == 0);
  test::require_close(read_npy(dir + "/logits.npy"), expected, test::tolerance_for(DType::kF32));
  r = run_command(SKA_INFERENCE_EXE, common + "--weights " + dir + "/ours.safetensors --input " +
                                         dir + "/x.npy --set train.attention=flash");
  REQUIRE(r.exit_code == 2);
  REQUIRE_THAT(r.err, Contains("train.attention") && Contains("flash"));

  SECTION("images") {
    // A 12x8 PNG: resized to 8 on the shorter side is itself; the centre crop takes rows 2..9.
    io::RgbImage png(8, 12, {});
    for (int y = 0; y < 12; ++y) {
      for (int x = 0; x < 8; ++x) {
        const int i = (y * 8 + x) * 3;
        png.set(x, y,
                {static_cast<uint8_t>(i * 37 % 256), static_cast<uint8_t>((i + 1) * 37 % 256),
                 static_cast<uint8_t>((i + 2) * 37 % 256)});
      }
    }
    const std::vector<uint8_t>& pixels = png.pixels();
    io::write_png(dir + "/a.png", png);
    r = run_command(SKA_INFERENCE_EXE, common + "--weights " + dir + "/ours.safetensors --image " +
                                           dir + "/a.png --image " + dir + "/a.png");
    REQUIRE(r.exit_code == 0);
    Config config = Config::load(kTinyVit);
    const auto t = data::read_eval_transform(config.root()["data"], 8, 3);
    const Tensor image = data::preprocess_pixels(pixels.data(), 12, 8, 3, t);
    NoGradGuard no_grad;
    const Tensor one = (*model)(image.unsqueeze(0));
    const Tensor logits = read_npy(dir + "/logits.npy");
    REQUIRE(logits.shape() == Shape{2, 5});
    test::require_close(logits.narrow(0, 1, 1), one, test::tolerance_for(DType::kF32));
  }
  SECTION("an --output that cannot be written fails before the forward pass, leaving nothing") {
    fs::create_directories(dir + "/out_folder");
    for (const std::string& out : {dir + "/out_folder", dir + "/out_folder/"}) {
      r = run_command(SKA_INFERENCE_EXE, "--config " + kTinyVit + " --output " + out +
                                             " --weights " + dir + "/ours.safetensors --input " +
                                             dir + "/x.npy");
      REQUIRE(r.exit_code == 2);
      REQUIRE_THAT(r.err, Contains("is a folder; expected the path of the .npy file to write"));
    }
    REQUIRE(fs::is_empty(dir + "/out_folder"));
    r = run_command(SKA_INFERENCE_EXE, "--config " + kTinyVit + " --output " + dir +
                                           "/missing/l.npy --weights " + dir +
                                           "/ours.safetensors --input " + dir + "/x.npy");
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.err, Contains("/missing' does not exist"));
    // write_npy itself: a folder in the way is an error, and no temporary is left beside it,
    // nor by a write that fails after its temporary exists (the rename onto a non-empty folder).
    REQUIRE_THROWS_WITH(write_npy(dir + "/out_folder", Tensor::zeros({2})),
                        Contains("is a folder"));
    std::ofstream(dir + "/out_folder/keep.txt") << "x";
    {
      io::AtomicFile file(dir + "/out_folder");
      file.write("abc", 3);
      REQUIRE_THROWS_WITH(file.commit(), Contains("renaming"));
    }
    for (const auto& e : fs::directory_iterator(dir)) {
      INFO(e.path().string());
      CHECK(e.path().filename().string().find(".tmp") == std::string::npos);
    }
  }
  SECTION("errors name the file and what was expected") {
    write_npy(dir + "/bad.npy", Tensor::zeros({2, 3, 9, 8}));
    r = run_command(SKA_INFERENCE_EXE,
                    common + "--weights " + dir + "/ours.safetensors --input " + dir + "/bad.npy");
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.err, Contains("bad.npy: input of shape [2, 3, 9, 8]") &&
                            Contains("expected [N, 3, 8, 8]"));
    r = run_command(SKA_INFERENCE_EXE,
                    common + "--weights " + dir + "/theirs.safetensors --input " + dir + "/x.npy");
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.err, Contains("theirs.safetensors: the weights do not fit the model"));
    r = run_command(SKA_INFERENCE_EXE, common + "--weights " + dir + "/ours.safetensors");
    REQUIRE(r.exit_code == 2);
    REQUIRE_THAT(r.err, Contains("--input x.npy or --image"));
  }
  fs::remove_all(dir);
}

TEST_CASE("apps: benchmark reports images/s and peak memory for both modes", "[cpu][apps]") {
  for (const char* mode : {"train", "infer"}) {
    INFO(mode);
    const RunResult r =
        run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --mode " + mode +
                                           " --batch 4 --warmup 1 --iters 2 --json");
    REQUIRE(r.exit_code == 0);
    const std::smatch m = [&] {
      std::smatch match;
      std::regex_search(r.out, match, std::regex("\"images_per_s\":([0-9.e+-]+)"));
      return match;
    }();
    REQUIRE(m.size() == 2);
    CHECK(std::stod(m[1].str()) > 0.0);
    CHECK_THAT(r.out, Catch::Contains("\"mode\":\"" + std::string(mode) + "\""));
    CHECK_THAT(r.out, Catch::Contains("\"peak_bytes\":"));
    // The tensors' own bytes, under the allocator's blocks (64-byte and 1 MiB rounding).
    const nlohmann::json j = nlohmann::json::parse(r.out);
    const int64_t blocks = j.at("peak_bytes"), tensors = j.at("peak_requested_bytes");
    CHECK(tensors > 0);
    CHECK(tensors <= blocks);
    // What the allocator held from the system at most, its cache included, is at least as much.
    CHECK(j.at("peak_reserved_bytes").get<int64_t>() >= blocks);
    // Training reports what its forward pass keeps per image (activations grow with the batch);
    // a forward without a backward keeps nothing to report.
    if (std::string(mode) == "train") {
      CHECK(j.at("activation_bytes_per_image").get<double>() > 0.0);
      CHECK(j.at("activation_bytes_per_image").get<double>() < static_cast<double>(tensors));
    } else {
      CHECK_FALSE(j.contains("activation_bytes_per_image"));
    }
  }
  const RunResult bad = run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --dtype bf16");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.err, Catch::Contains("needs --device cuda"));
  const RunResult graph = run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --cuda-graph");
  CHECK(graph.exit_code == 2);
  CHECK_THAT(graph.err, Catch::Contains("--cuda-graph needs --device cuda"));
  const RunResult capture =
      run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --capture-range");
  CHECK(capture.exit_code == 2);
  CHECK_THAT(capture.err, Catch::Contains("--capture-range needs --device cuda"));
}

TEST_CASE("apps: benchmark --memory-census lists what is live at the peak, as the replay counts",
          "[cpu][apps]") {
  const RunResult r =
      run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit +
                                         " --batch 4 --warmup 1 --iters 2 --json --memory-census");
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& census = j.at("memory_census");
  // The storages counted by size from the model's weights on, CPU kernels' scratch left out: the
  // bytes the CUDA rules' replay counted at its peak, from the same allocations.
  const int64_t peak = census.at("peak_bytes");
  CHECK(peak > 0);
  CHECK(peak == j.at("device_rules_requested_bytes").get<int64_t>());
  int64_t bytes = 0, storages = 0, last_total = INT64_MAX;
  for (const nlohmann::json& size : census.at("sizes")) {
    const int64_t b = size.at(0), n = size.at(1);
    CHECK(b * n <= last_total);  // largest totals first
    last_total = b * n;
    bytes += b * n;
    storages += n;
  }
  if (census.at("sizes").size() < 64) {  // every size listed
    CHECK(bytes == peak);
    CHECK(storages == census.at("storages").get<int64_t>());
  }
  const RunResult text =
      run_command(SKA_BENCHMARK_EXE,
                  "--config " + kTinyVit + " --batch 4 --warmup 1 --iters 1 --memory-census");
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("live at the peak of tensors: "));
  const RunResult plain = run_command(
      SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --batch 4 --warmup 1 --iters 1 --json");
  REQUIRE(plain.exit_code == 0);
  CHECK_FALSE(nlohmann::json::parse(plain.out).contains("memory_census"));
}

TEST_CASE("apps: benchmark takes the config's train kernel choices, the command line's over them",
          "[cpu][apps]") {
  const std::string quickstart = kSourceDir + "/configs/quickstart.yaml";
  const std::string common = "--config " + quickstart + " --batch 2 --warmup 1 --iters 1 --json";
  const auto choices = [&](const std::string& extra) {
    const RunResult r = run_command(SKA_BENCHMARK_EXE, common + extra);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    return std::make_pair(j.at("norm_backward").get<std::string>(),
                          j.at("residual_norm").get<std::string>());
  };
  // The defaults (fused, fused); the config's choices; a flag over the config's for its key.
  CHECK(choices("") == std::make_pair(std::string("fused"), std::string("fused")));
  const std::string sets = " --set train.norm_backward=split --set train.residual_norm=unfused";
  CHECK(choices(sets) == std::make_pair(std::string("split"), std::string("unfused")));
  CHECK(choices(sets + " --norm-backward fused") ==
        std::make_pair(std::string("fused"), std::string("unfused")));
}

TEST_CASE("apps: a typo under train or optim is an error in benchmark, validate and inference",
          "[cpu][apps]") {
  // They read these sections (the kernels' choices, the step's optimizer), so they judge them.
  const std::string quickstart = kSourceDir + "/configs/quickstart.yaml";
  const RunResult bench =
      run_command(SKA_BENCHMARK_EXE,
                  "--config " + quickstart + " --batch 2 --iters 1 --set train.attenton=fused");
  CHECK(bench.exit_code == 2);
  CHECK_THAT(bench.err, Contains("train.attenton: unknown key; did you mean 'attention'?"));
  const RunResult optim =
      run_command(SKA_BENCHMARK_EXE, "--config " + quickstart + " --batch 2 --set optim.lrr=1");
  CHECK(optim.exit_code == 2);
  CHECK_THAT(optim.err, Contains("optim.lrr: unknown key; did you mean 'lr'?"));
  const RunResult validate =
      run_command(SKA_VALIDATE_EXE, "--config " + quickstart + " --checkpoint " + quickstart +
                                        " --set train.weight_cast=per_step");
  CHECK(validate.exit_code == 2);
  CHECK_THAT(validate.err,
             Contains("train.weight_cast: unknown key; did you mean 'weight_casts'?"));
  const RunResult infer =
      run_command(SKA_INFERENCE_EXE,
                  "--config " + quickstart + " --weights " + quickstart + " --image " + quickstart +
                      " --output /dev/null --set train.attention_backwards=split");
  CHECK(infer.exit_code == 2);
  CHECK_THAT(infer.err, Contains("train.attention_backwards: unknown key"));
}

TEST_CASE("apps: a misspelt section, or a typo in a section the command does not use, is an error",
          "[cpu][apps][hardening]") {
  // Every command that takes an experiment config judges all of the trainer's sections as
  // `train` does: before, validate, benchmark and inference ignored `trian:` (evaluating in f32)
  // and took `sched.min_lrr` or `checkpoint.kep` without a word.
  const std::string quickstart = kSourceDir + "/configs/quickstart.yaml";
  const RunResult validate =
      run_command(SKA_VALIDATE_EXE, "--config " + quickstart + " --checkpoint " + quickstart +
                                        " --set trian.precision=bf16");
  CHECK(validate.exit_code == 2);
  CHECK_THAT(validate.err, Contains("trian: unknown key; did you mean 'train'?"));
  const RunResult bench = run_command(
      SKA_BENCHMARK_EXE, "--config " + quickstart + " --batch 2 --iters 1 --set modle.dim=1");
  CHECK(bench.exit_code == 2);
  CHECK_THAT(bench.err, Contains("modle: unknown key; did you mean 'model'?"));
  for (const std::string& typo : {"sched.min_lrr=1", "checkpoint.kep=1", "distributed.bucket=1"}) {
    INFO(typo);
    const RunResult r = run_command(
        SKA_BENCHMARK_EXE, "--config " + quickstart + " --batch 2 --iters 1 --set " + typo);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Contains(typo.substr(0, typo.find('=')) + ": unknown key"));
  }
  const RunResult range =
      run_command(SKA_SUMMARY_EXE, "--config " + quickstart + " --set checkpoint.keep=0");
  CHECK(range.exit_code == 2);
  CHECK_THAT(range.err, Contains("checkpoint.keep"));
  const RunResult infer = run_command(SKA_INFERENCE_EXE, "--config " + quickstart + " --weights " +
                                                             quickstart + " --image " + quickstart +
                                                             " --output /dev/null --set optm.lr=1");
  CHECK(infer.exit_code == 2);
  CHECK_THAT(infer.err, Contains("optm: unknown key; did you mean 'optim'?"));
}

TEST_CASE("apps: benchmark --variants times kernel-choice variants in one process", "[cpu][apps]") {
  for (const char* mode : {"train", "infer"}) {
    INFO(mode);
    const RunResult r = run_command(
        SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --mode " + mode +
                               " --batch 2 --warmup 0 --iters 2 --precision bf16 --rounds 2 --json"
                               " --variants 'weight_casts=per_step,linear_grads=f32;default'");
    REQUIRE(r.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    REQUIRE(j.at("variants").size() == 3);
    const nlohmann::json& first = j.at("variants")[0];
    const nlohmann::json& both = j.at("variants")[1];
    CHECK(first.at("variant") == "command line");
    CHECK(first.at("kernels").at("weight_casts") == "per_use");
    CHECK(both.at("variant") == "weight_casts=per_step,linear_grads=f32");
    CHECK(both.at("kernels").at("weight_casts") == "per_step");
    CHECK(both.at("kernels").at("linear_grads") == "f32");
    CHECK(both.at("kernels").at("attention") == "fused");  // the rest: the command line's
    CHECK(j.at("variants")[2].at("kernels") == first.at("kernels"));
    for (const nlohmann::json& v : j.at("variants")) {
      CHECK(v.at("round_ms").size() == 2);
      CHECK(v.at("images_per_s").get<double>() > 0.0);
    }
    // The run's own figures are the first variant's.
    CHECK(j.at("median_ms") == first.at("median_ms"));
  }
  const RunResult text =
      run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit +
                                         " --batch 2 --warmup 0 --iters 1 --variants "
                                         "'attention=unfused'");
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Contains("variants (1 round of 1 steps each") &&
                           Contains("attention=unfused") && Contains("vs first"));
  const RunResult typo =
      run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --variants 'weight_cast=per_step'");
  CHECK(typo.exit_code == 2);
  CHECK_THAT(typo.err, Contains("--variants 'weight_cast=per_step': train.weight_cast: unknown "
                                "key; did you mean 'weight_casts'?"));
  const RunResult value =
      run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --variants 'residual_norm=on'");
  CHECK(value.exit_code == 2);
  CHECK_THAT(value.err, Contains("'on' is not a valid choice") && Contains("unfused, fused"));
  const RunResult profiled =
      run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " --profile --variants 'default'");
  CHECK(profiled.exit_code == 2);
  CHECK_THAT(profiled.err, Contains("--variants times each variant's eager steps"));
}

TEST_CASE("apps: benchmark --profile says where a step's time goes", "[cpu][apps]") {
  const RunResult r =
      run_command(SKA_BENCHMARK_EXE,
                  "--config " + std::string(SKA_SOURCE_DIR) +
                      "/configs/quickstart.yaml --batch 8 --warmup 1 --iters 2 --profile --json");
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.at("step") == "adamw, clip 1");
  const nlohmann::json& p = j.at("profile");
  const double step_ms = p.at("step_ms");
  double kernels_ms = 0.0, families_ms = 0.0;
  std::map<std::string, double> calls;
  for (const auto& k : p.at("kernels")) {
    kernels_ms += k.at("ms_per_step").get<double>();
    calls[k.at("name")] = k.at("calls_per_step");
  }
  for (const auto& f : p.at("families")) families_ms += f.at("ms_per_step").get<double>();
  CHECK(kernels_ms > 0.0);
  CHECK(kernels_ms <= step_ms * 1.01);  // kernels run inside the step
  CHECK(families_ms == Approx(kernels_ms));
  // The quick-start CSKA-ViT: each convolution's forward has its weight gradient; one sweep
  // over the grads for the check and the norm, one for the clip, AdamW per group.
  CHECK(calls.at("conv2d_forward") >= 1);
  CHECK(calls.at("conv2d_backward_weight") == calls.at("conv2d_forward"));
  CHECK(calls.at("multi_grad_stats") == 1);
  CHECK(calls.at("multi_scale") == 1);
  CHECK(calls.at("multi_adam_step") == 2);
  CHECK(calls.at("gemm") > 10);
  // The same time by kernel and operands: per kernel, the rows sum to the kernel's time and
  // calls; the quick start's CSKA logit convolution reads [8, 64, 7, 7] (64 query channels on
  // its 7x7 grid) with a [200, 16, 3, 3] filter (4 heads x 50 keys, 16 channels a head).
  std::map<std::string, double> call_ms, call_count, call_bytes, call_flops;
  std::set<std::string> conv_operands;
  double logit_conv_flops = 0.0;
  for (const auto& c : p.at("calls")) {
    const std::string name = c.at("name"), operands = c.at("operands");
    call_ms[name] += c.at("ms_per_step").get<double>();
    call_count[name] += c.at("calls_per_step").get<double>();
    call_bytes[name] += c.at("bytes_per_step").get<double>();
    call_flops[name] += c.at("flops_per_step").get<double>();
    if (name == "conv2d_forward") conv_operands.insert(operands);
    if (operands == "[8, 64, 7, 7] f32, [200, 16, 3, 3] f32, [200] f32, [8, 200, 7, 7] f32") {
      logit_conv_flops =
          c.at("flops_per_step").get<double>() / c.at("calls_per_step").get<double>();
    }
  }
  CHECK(conv_operands.count("[8, 64, 7, 7] f32, [200, 16, 3, 3] f32, [200] f32, "
                            "[8, 200, 7, 7] f32") == 1);
  // Its flops: 2 x 8 x 200 x 7 x 7 outputs, 16 channels x 3 x 3 taps each.
  CHECK(logit_conv_flops == 2.0 * (8 * 200 * 7 * 7) * (16 * 3 * 3));
  for (const auto& k : p.at("kernels")) {
    const std::string name = k.at("name");
    CHECK(call_ms[name] == Approx(k.at("ms_per_step").get<double>()));
    CHECK(call_count[name] == Approx(k.at("calls_per_step").get<double>()));
    CHECK(call_bytes[name] == Approx(k.at("bytes_per_step").get<double>()));
    CHECK(call_flops[name] == Approx(k.at("flops_per_step").get<double>()));
    CHECK(k.at("bytes_per_step").get<double>() > 0.0);
  }
  CHECK(call_flops.at("gemm") > 0.0);
  CHECK(call_flops.at("copy") == 0.0);
  // The table is printed without --json.
  const RunResult text =
      run_command(SKA_BENCHMARK_EXE,
                  "--config " + std::string(SKA_SOURCE_DIR) +
                      "/configs/quickstart.yaml --batch 8 --warmup 1 --iters 1 --profile --top 3");
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("profile: 1 steps") && Catch::Contains("family") &&
                           Catch::Contains("matmul") && Catch::Contains("kernel") &&
                           Catch::Contains("operands") && Catch::Contains("] f32") &&
                           Catch::Contains("TFLOP/s") && Catch::Contains("GB/s"));
}

TEST_CASE("apps: benchmark reports model FLOPs, TFLOP/s and MFU", "[cpu][apps]") {
  const std::string config = std::string(SKA_SOURCE_DIR) + "/configs/quickstart.yaml";
  const RunResult summary = run_command(SKA_SUMMARY_EXE, "--config " + config + " --json");
  REQUIRE(summary.exit_code == 0);
  const double macs = nlohmann::json::parse(summary.out).at("macs").get<double>();
  REQUIRE(macs > 0);
  for (const char* mode : {"train", "infer"}) {
    INFO(mode);
    const RunResult r = run_command(SKA_BENCHMARK_EXE, "--config " + config + " --mode " + mode +
                                                           " --batch 4 --warmup 1 --iters 2 "
                                                           "--peak-tflops 0.5 --json");
    REQUIRE(r.exit_code == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    // 2 FLOPs per MAC of the forward `summary` counts; training 3 forwards' worth.
    const double per_image = 2e-9 * macs * (std::string(mode) == "train" ? 3.0 : 1.0);
    CHECK(j.at("gflops_per_image").get<double>() == Approx(per_image).epsilon(1e-12));
    const double tflops = per_image * j.at("images_per_s").get<double>() * 1e-3;
    CHECK(j.at("tflops").get<double>() == Approx(tflops).epsilon(1e-9));
    CHECK(j.at("mfu").get<double>() == Approx(tflops / 0.5).epsilon(1e-9));
    CHECK(j.at("peak_of") == "--peak-tflops");
  }
  // On the CPU without --peak-tflops there is no peak to compare with: no MFU.
  const RunResult plain = run_command(
      SKA_BENCHMARK_EXE, "--config " + config + " --mode infer --batch 2 --warmup 0 --iters 1");
  REQUIRE(plain.exit_code == 0);
  CHECK_THAT(plain.out, Catch::Contains("GFLOP per image (2 x MACs)") &&
                            Catch::Contains("TFLOP/s") && !Catch::Contains("MFU"));
}

TEST_CASE("the bf16 peak table matches GPU names as the driver gives them", "[cpu]") {
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA H100 80GB HBM3") == 989.4);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA H100 PCIe") == 756.5);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA H200") == 989.4);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA A10") == 125.0);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA L40S") == 362.05);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA L4") == 121.0);
  CHECK(profiler::bf16_dense_peak_tflops("NVIDIA GeForce RTX 4090") == 165.2);
  CHECK(profiler::bf16_dense_peak_tflops("Tesla V100-SXM2-16GB") == 0.0);
  CHECK(profiler::bf16_dense_peak_tflops("") == 0.0);
}

TEST_CASE("apps: a missing config lists each searched place once", "[cpu][apps][hardening]") {
  auto tried_list = [](const std::string& name) {
    try {
      apps::resolve_config_path(name);
    } catch (const ConfigError& e) {
      const std::string message = e.what();
      const size_t start = message.find("(tried: ") + 8;
      std::vector<std::string> tried;
      std::string rest = message.substr(start, message.find(';', start) - start);
      for (size_t comma; (comma = rest.find(", ")) != std::string::npos;
           rest = rest.substr(comma + 2)) {
        tried.push_back(rest.substr(0, comma));
      }
      tried.push_back(rest);
      return tried;
    }
    FAIL("expected a ConfigError for " << name);
    return std::vector<std::string>{};
  };
  for (const std::string name : {"/no/such/dir/model.yaml", "no_such_model", "sub/none.yaml"}) {
    CAPTURE(name);
    const std::vector<std::string> tried = tried_list(name);
    std::vector<std::string> unique = tried;
    std::sort(unique.begin(), unique.end());
    unique.erase(std::unique(unique.begin(), unique.end()), unique.end());
    CHECK(unique.size() == tried.size());
    CHECK(tried.front() == name);
  }
  CHECK(tried_list("/no/such/dir/model.yaml").size() == 1);
}

TEST_CASE("apps: --batch out of range names the option and the range", "[cpu][apps][hardening]") {
  for (const std::string value : {"0", "-3", "100000"}) {
    CAPTURE(value);
    const RunResult r = run_command(SKA_SUMMARY_EXE, "--config " + kTinyVit + " --batch " + value);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Contains("--batch: value " + value +
                               " is out of range; expected an integer in [1, 65536]"));
  }
  const RunResult r = run_command(SKA_INFERENCE_EXE, "--config " + kTinyVit + " --weights " +
                                                         kTinyVit + " --output x.npy --batch abc");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.err, Contains("--batch: 'abc' is not an integer in [1, 65536]"));
  // benchmark's counts and numbers say their ranges the same way (CLI11's own checks printed
  // "Value 0 not in range 0.000000 to 1797693134862315708145274237317043567981...").
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--iters 0", "--iters: value 0 is out of range; expected an integer in [1, 1000000]"},
      {"--warmup -1", "--warmup: value -1 is out of range; expected an integer in [0, 1000000]"},
      {"--top 0", "--top: value 0 is out of range; expected an integer in [1, 100000]"},
      {"--peak-tflops -1", "--peak-tflops: value -1 is out of range; expected a number >= 0"},
      {"--peak-tflops nan", "--peak-tflops: 'nan' is not a number >= 0"}};
  for (const auto& [args, message] : cases) {
    CAPTURE(args);
    const RunResult b = run_command(SKA_BENCHMARK_EXE, "--config " + kTinyVit + " " + args);
    CHECK(b.exit_code == 1);
    CHECK_THAT(b.err, Contains(message));
  }
}

TEST_CASE("apps: integer weights for float parameters are a dtype error naming the file",
          "[cpu][apps][hardening]") {
  const std::string dir = scratch_dir();
  nn::ModulePtr model = build_from_file(kTinyVit);
  TensorMap tensors = model->state_dict();
  const std::string name = tensors.begin()->first;
  tensors[name] = tensors.at(name).to(DType::kI32);
  const std::string path = dir + "/int.safetensors";
  save_safetensors(path, tensors);
  REQUIRE_THROWS_AS(apps::load_weights(*model, path), DTypeError);
  REQUIRE_THROWS_WITH(apps::load_weights(*model, path),
                      Contains(path) && Contains(name + " (expected f32, got i32)"));
  // Through a weight map the importer reports it the same way.
  const std::string map = std::string(SKA_TEST_FIXTURES) + "/models/tiny_prefix_map.yaml";
  save_safetensors(path, export_weights(load_weight_map(map), tensors));
  REQUIRE_THROWS_AS(apps::load_weights(*model, path, map), DTypeError);
  REQUIRE_THROWS_WITH(
      apps::load_weights(*model, path, map),
      Contains(path) && Contains("ours '" + name + "' f32 <- theirs") && Contains("i32"));
  fs::remove_all(dir);
}

#ifdef SKA_BENCHMARK_LOADER_EXE
TEST_CASE("benchmark_loader: synthetic ImageNet JPEGs through the MetaFormer recipe's loader",
          "[cpu][apps][data]") {
  // Rates are not checked (speed belongs to benchmarks); what it measured and wrote is.
  RunResult r = run_command(SKA_BENCHMARK_LOADER_EXE,
                            "--synthetic 8 --workers 1,2 --batch 4 --seconds 0.2 --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CHECK(j.at("images") == 8);
  CHECK(j.at("synthetic") == true);
  CHECK(j.at("batch") == 4);
  CHECK(j.at("image_size") == 224);
  // ImageNet's sizes in rotation: 500x375, 500x333, 375x500, 500x400, 500x500, 400x500, then the
  // first two again.
  CHECK(j.at("mean_megapixels").get<double>() == Approx(1545500 / 8.0 / 1e6));
  CHECK(j.at("mean_file_kb").get<double>() > 50);
  CHECK(j.at("decode_images_per_s").get<double>() > 0);
  CHECK(j.at("sample_images_per_s").get<double>() > 0);
  CHECK(j.at("eval_images_per_s").get<double>() > 0);
  REQUIRE(j.at("loader").size() == 2);
  CHECK(j.at("loader")[1].at("workers") == 2);
  CHECK(j.at("loader")[1].at("images_per_s").get<double>() > 0);
  CHECK(j.at("workers_needed").get<int>() >= 1);
  // A typo in the recipe it reads is rejected with its key path.
  r = run_command(SKA_BENCHMARK_LOADER_EXE,
                  "--synthetic 2 --workers 1 --seconds 0.1 --set data.augment.hflp=0.5");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Contains("data.augment.hflp"));
}
#endif
