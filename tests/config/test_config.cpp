// The YAML config module: typed reads and their errors, unknown-key checks with suggestions,
// includes (order, relative paths, SKA_CONFIG_DIR, cycles), overrides, dump and closest_match.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "config/config.h"
#include "optim/optimizer.h"

using namespace ska;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path() /
            ("ska_config_test_" + std::to_string(stamp) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    const fs::path file = path_ / name;
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text;
    return file.string();
  }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string unused_message(const Config& config) {
  try {
    config.check_unused();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("config: typed reads of scalars and lists", "[cpu][config]") {
  const Config config = Config::parse(
      "model:\n  depth: 12\n  dim: -384\n  lr: 1e-4\n  scale: 2\n  name: vit_s\n"
      "  bias: true\n  dims: [1, 2, 3]\n  ratios: [0.5, 1, 2e1]\n  names: [a, 'b', \"3\"]\n"
      "  quoted_int: '7'\n");
  const ConfigNode model = config.root()["model"];
  CHECK(model.path() == "model");
  CHECK(model.get<int64_t>("depth") == 12);
  CHECK(model.get<int>("dim") == -384);
  CHECK(model.get<double>("lr") == Approx(1e-4));
  CHECK(model.get<double>("scale") == 2.0);
  CHECK(model.get<std::string>("name") == "vit_s");
  CHECK(model.get<bool>("bias"));
  CHECK(model.get<std::vector<int64_t>>("dims") == std::vector<int64_t>{1, 2, 3});
  CHECK(model.get<std::vector<double>>("ratios") == std::vector<double>{0.5, 1.0, 20.0});
  CHECK(model.get<std::vector<std::string>>("names") == std::vector<std::string>{"a", "b", "3"});
  CHECK(model.get<int>("quoted_int") == 7);
  CHECK(model["depth"].as<int>() == 12);
  CHECK(model.get<int>("missing", 5) == 5);
  CHECK(model.get("missing_name", "fallback") == "fallback");
  CHECK(model.get<bool>("missing_flag", false) == false);
  CHECK(model.keys().size() == 10);
  CHECK(model.is_map());
  CHECK(model["dims"].is_list());
  CHECK(model["dims"].size() == 3);
  CHECK(model["depth"].is_scalar());
  CHECK(model["nothing"].is_null());
  CHECK(model["nothing"].path() == "model.nothing");
  CHECK(model.has("depth"));
  CHECK_FALSE(model.has("nothing"));
}

TEST_CASE("config: type errors name the path and the value", "[cpu][config]") {
  const Config config = Config::parse(
      "model:\n  depth: abc\n  half: 3.5\n  flag: yes\n  lr: fast\n  dims: [1, 2, x]\n"
      "  sub: {a: 1}\n  big: 3000000000\n  empty:\n");
  const ConfigNode model = config.root()["model"];
  CHECK_THROWS_AS(model.get<int64_t>("depth"), ConfigError);
  CHECK_THROWS_WITH(model.get<int64_t>("depth"),
                    Contains("model.depth: expected an integer, got 'abc'"));
  CHECK_THROWS_WITH(model.get<int>("half"), Contains("model.half: expected an integer, got '3.5'"));
  CHECK_THROWS_WITH(model.get<bool>("flag"),
                    Contains("model.flag: expected a boolean (true or false), got 'yes'"));
  CHECK_THROWS_WITH(model.get<double>("lr"), Contains("model.lr: expected a number, got 'fast'"));
  CHECK_THROWS_WITH(model.get<std::vector<int64_t>>("dims"),
                    Contains("model.dims[2]: expected an integer, got 'x'"));
  CHECK_THROWS_WITH(model.get<std::string>("sub"),
                    Contains("model.sub: expected a string, got a map"));
  CHECK_THROWS_WITH(model.get<std::vector<double>>("depth"),
                    Contains("model.depth: expected a list of numbers, got 'abc'"));
  CHECK_THROWS_WITH(model.get<int>("big"), Contains("model.big: value 3000000000 is out of range"));
  CHECK_THROWS_WITH(model.get<int>("absent"),
                    Contains("model.absent: required key missing (expected an integer)"));
  CHECK_THROWS_WITH(model.get<int>("empty"),
                    Contains("model.empty: expected an integer, got null"));
  CHECK(model.get<int>("empty", 4) == 4);
  CHECK_THROWS_WITH(model["depth"]["x"], Contains("model.depth: expected a map, got 'abc'"));
  CHECK_THROWS_WITH(model.at(0), Contains("model: expected a list, got a map"));
  CHECK_THROWS_WITH(model.fail("depth", "must be even"), Contains("model.depth: must be even"));
  // Errors say where the value was written.
  CHECK_THROWS_WITH(model.get<int64_t>("depth"), Contains("(at <string>:2:10)"));
}

TEST_CASE("config: range and choice checks", "[cpu][config]") {
  const Config config = Config::parse("depth: 0\nratio: 1.5\nmixer: csk\nother: ska\n");
  const ConfigNode root = config.root();
  CHECK_THROWS_WITH(root.get_int_in("depth", 12, 1, 64),
                    Contains("depth: value 0 is out of range; expected an integer in [1, 64]"));
  CHECK(root.get_int_in("absent", 12, 1, 64) == 12);
  CHECK_THROWS_WITH(root.get_double_in("ratio", 0.5, 0.0, 1.0),
                    Contains("ratio: value 1.5 is out of range; expected a number in [0, 1]"));
  CHECK(root.get_double_in("absent_ratio", 0.5, 0.0, 1.0) == 0.5);
  const std::vector<std::string> choices{"attention", "ska", "cska"};
  CHECK_THROWS_WITH(root.get_choice("mixer", "ska", choices),
                    Contains("mixer: value 'csk' is not a valid choice; expected one of: "
                             "attention, ska, cska; did you mean 'cska'?"));
  CHECK(root.get_choice("other", "attention", choices) == "ska");
  CHECK(root.get_choice("absent_mixer", "attention", choices) == "attention");
}

TEST_CASE("config: nested maps and lists carry full paths", "[cpu][config]") {
  const Config config = Config::parse(
      "model:\n  stages:\n    - {depth: 2, mixer: {type: ska}}\n"
      "    - depth: 4\n      mixer: {type: cska, heads: many}\n");
  const ConfigNode stages = config.root()["model"]["stages"];
  REQUIRE(stages.size() == 2);
  const ConfigNode mixer = stages.at(1)["mixer"];
  CHECK(mixer.path() == "model.stages[1].mixer");
  CHECK(mixer.get<std::string>("type") == "cska");
  CHECK_THROWS_WITH(mixer.get<int>("heads"),
                    Contains("model.stages[1].mixer.heads: expected an integer, got 'many'"));
  CHECK_THROWS_WITH(stages.at(2),
                    Contains("model.stages: index 2 is out of range; the list has 2 elements"));
  CHECK(stages.at(0)["mixer"]["type"].as<std::string>() == "ska");
}

TEST_CASE("config: unknown keys are reported with suggestions", "[cpu][config]") {
  const Config config = Config::parse(
      "model:\n  stages:\n    - {mixer: {type: ska}}\n"
      "    - mixer: {type: cska, activaton: gelu}\n");
  const ConfigNode stages = config.root()["model"]["stages"];
  for (size_t i = 0; i < stages.size(); ++i) {
    const ConfigNode mixer = stages.at(i)["mixer"];
    mixer.get<std::string>("type");
    mixer.get<std::string>("activation", "gelu");
  }
  // Where the key was written comes last (an include's file, or the --set that made it).
  CHECK(unused_message(config) ==
        "model.stages[1].mixer.activaton: unknown key; did you mean 'activation'? (at "
        "<string>:4:38)");

  const Config clean = Config::parse("a: 1\nb: {c: 2}\n");
  clean.root().get<int>("a");
  clean.root()["b"].get<int>("c");
  CHECK_NOTHROW(clean.check_unused());
}

TEST_CASE("config: an unknown key says the file and line of an include that wrote it",
          "[cpu][config]") {
  const TempDir tmp;
  const std::string part = tmp.write("part.yaml", "depth: 2\ndeptj: 3\n");
  Config config = Config::load(tmp.write("top.yaml", "model: {include: part.yaml}\n"));
  config.set("model.widht=4");
  config.root()["model"].get<int>("depth");
  config.root()["model"].get<int>("width", 1);
  const std::string message = unused_message(config);
  CHECK_THAT(message,
             Contains("model.deptj: unknown key; did you mean 'depth'? (at " + part + ":2:8)"));
  CHECK_THAT(message, Contains("model.widht: unknown key; did you mean 'width'? (from override "
                               "'model.widht=4')"));
}

TEST_CASE("config: unknown key suggestions by case and prefix, else the known keys",
          "[cpu][config]") {
  const Config config =
      Config::parse("model:\n  Depth: 1\n  drop: 0.1\n  xyz: 3\n  extra: {a: 1, b: 2}\n");
  const ConfigNode model = config.root()["model"];
  model.get<int>("depth", 12);
  model.get<double>("drop_path_rate", 0.0);
  model.get<int>("width", 3);
  const std::string message = unused_message(config);
  CHECK_THAT(message, Contains("model.Depth: unknown key; did you mean 'depth'?"));
  CHECK_THAT(message, Contains("model.drop: unknown key; did you mean 'drop_path_rate'?"));
  CHECK_THAT(message, Contains("model.xyz: unknown key; known keys: depth, drop_path_rate, width"));
  // A map nobody visited is reported once, at its own key.
  CHECK_THAT(message, Contains("model.extra: unknown key"));
  CHECK_THAT(message, !Contains("model.extra.a"));
}

TEST_CASE("config: unvisited top-level sections and list elements are reported", "[cpu][config]") {
  const Config config =
      Config::parse("model: {depth: 1}\ndata: {name: x}\nlist: [{a: 1}, {a: 2}]\n");
  const ConfigNode root = config.root();
  root["model"].get<int>("depth");
  root["list"].at(0).get<int>("a");
  const std::string message = unused_message(config);
  CHECK_THAT(message, Contains("data: unknown key"));
  CHECK_THAT(message, Contains("list[1]: list element never read"));
  CHECK_THAT(message, !Contains("data.name"));
  CHECK_THAT(message, !Contains("list[0]"));
}

TEST_CASE("config: includes merge in order and the including map overrides", "[cpu][config]") {
  const TempDir dir;
  dir.write("models/base.yaml",
            "model:\n  depth: 12\n  dim: 384\n  mixer: {type: attention, heads: 6}\n"
            "tags: [a, b]\n");
  dir.write("models/small.yaml", "model:\n  depth: 6\n  mixer: {heads: 3}\n");
  const std::string top = dir.write(
      "exp.yaml",
      "include: [models/base.yaml, models/small.yaml]\nmodel:\n  dim: 192\n  mixer: {type: cska}\n"
      "tags: [c]\noptim: {include: optim/adamw.yaml, lr: 1e-3}\n");
  dir.write("optim/adamw.yaml", "name: adamw\nlr: 5e-4\nweight_decay: 0.05\n");

  const Config config = Config::load(top);
  const ConfigNode model = config.root()["model"];
  CHECK(model.get<int>("depth") == 6);  // small.yaml overrides base.yaml
  CHECK(model.get<int>("dim") == 192);  // the including file overrides both
  CHECK(model["mixer"].get<std::string>("type") == "cska");
  CHECK(model["mixer"].get<int>("heads") == 3);  // maps merge deeply
  CHECK(config.root().get<std::vector<std::string>>("tags") == std::vector<std::string>{"c"});
  const ConfigNode optim = config.root()["optim"];
  CHECK(optim.get<std::string>("name") == "adamw");  // nested include, relative to exp.yaml
  CHECK(optim.get<double>("lr") == Approx(1e-3));
  CHECK(optim.get<double>("weight_decay") == Approx(0.05));
  CHECK_FALSE(config.root().has("include"));
  CHECK_FALSE(optim.has("include"));
  CHECK_NOTHROW(config.check_unused());
}

TEST_CASE("config: include paths are relative to the including file, then SKA_CONFIG_DIR",
          "[cpu][config]") {
  const TempDir dir;
  dir.write("a/b/leaf.yaml", "value: 1\n");
  dir.write("a/mid.yaml", "include: b/leaf.yaml\nother: 2\n");
  dir.write("shared/common.yaml", "common: 3\n");
  const std::string top = dir.write("top.yaml", "include: [a/mid.yaml, common.yaml]\n");
  ::setenv("SKA_CONFIG_DIR", (dir.path() + "/shared").c_str(), 1);
  const Config config = Config::load(top);
  ::unsetenv("SKA_CONFIG_DIR");
  CHECK(config.root().get<int>("value") == 1);
  CHECK(config.root().get<int>("other") == 2);
  CHECK(config.root().get<int>("common") == 3);
}

TEST_CASE("config: include cycles and missing files name the chain and the file", "[cpu][config]") {
  const TempDir dir;
  const std::string a = dir.write("a.yaml", "include: b.yaml\nx: 1\n");
  dir.write("b.yaml", "include: a.yaml\ny: 2\n");
  CHECK_THROWS_AS(Config::load(a), ConfigError);
  CHECK_THROWS_WITH(Config::load(a),
                    Contains("include cycle: ") && Contains("a.yaml -> b.yaml -> a.yaml"));
  const std::string self = dir.write("self.yaml", "include: self.yaml\n");
  CHECK_THROWS_WITH(Config::load(self), Contains("self.yaml -> self.yaml"));

  const std::string broken = dir.write("broken.yaml", "x: 1\ninclude: nope.yaml\n");
  CHECK_THROWS_WITH(Config::load(broken),
                    Contains("include 'nope.yaml' not found") && Contains("broken.yaml:2:10"));
  CHECK_THROWS_WITH(Config::load(dir.path() + "/absent.yaml"),
                    Contains("cannot open config file") && Contains("absent.yaml"));
}

TEST_CASE("config: YAML syntax errors name the file, line and column", "[cpu][config]") {
  const TempDir dir;
  const std::string bad = dir.write("bad.yaml", "model:\n  depth: [1, 2\n");
  CHECK_THROWS_WITH(Config::load(bad), Contains("bad.yaml:") && Contains("YAML syntax error"));
  CHECK_THROWS_WITH(Config::parse("a: 1\na: 2\n"), Contains("<string>:2:1: duplicate key 'a'"));
  CHECK_THROWS_WITH(Config::parse("- 1\n- 2\n"), Contains("expected a map at the top level"));
  CHECK_THROWS_WITH(Config::parse("a: {b: 1\n", "cfg.yaml"),
                    Contains("cfg.yaml:") && Contains("YAML syntax error"));
}

TEST_CASE("config: overrides set scalars, lists, maps and list elements", "[cpu][config]") {
  Config config = Config::parse(
      "model:\n  depth: 12\n  stages:\n    - {mixer: {type: ska}}\n    - {mixer: {type: ska}}\n"
      "optim: {lr: 1e-3}\n");
  config.set("optim.lr=5e-4");
  config.set("model.stages[1].mixer.type=cska");
  config.set("model.dims=[64, 128]");
  config.set("model.extra={a: 1, b: [x, y]}");
  config.set("data.name = cifar10");
  const ConfigNode root = config.root();
  config.set("model.stages[2]={mixer: {type: attention}}");  // appends; seen by earlier nodes
  CHECK(root["optim"].get<double>("lr") == Approx(5e-4));
  CHECK(root["model"]["stages"].at(1)["mixer"].get<std::string>("type") == "cska");
  CHECK(root["model"]["stages"].at(0)["mixer"].get<std::string>("type") == "ska");
  CHECK(root["model"]["stages"].at(2)["mixer"].get<std::string>("type") == "attention");
  CHECK(root["model"].get<std::vector<int64_t>>("dims") == std::vector<int64_t>{64, 128});
  CHECK(root["model"]["extra"].get<int>("a") == 1);
  CHECK(root["model"]["extra"].get<std::vector<std::string>>("b") ==
        std::vector<std::string>{"x", "y"});
  CHECK(root["data"].get<std::string>("name") == "cifar10");
  config.set("optim.lr=fast");
  CHECK_THROWS_WITH(root["optim"].get<double>("lr"),
                    Contains("optim.lr: expected a number, got 'fast' (from override "
                             "'optim.lr=fast')"));
}

TEST_CASE("config: malformed overrides are quoted in the error", "[cpu][config]") {
  Config config = Config::parse("model: {depth: 12, stages: [{a: 1}]}\n");
  for (const std::string bad : {"model.depth", "=3", "model..depth=3", "model.stages[x]=1",
                                "model.stages[1=2", "model.depth.=1", "model.depth={a: 1"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(config.set(bad), Contains("malformed override '" + bad + "'"));
  }
  CHECK_THROWS_WITH(
      config.set("model.depth=[1, "),
      Contains("malformed override 'model.depth=[1, ': the value is not valid YAML: "));
  CHECK_THROWS_WITH(config.set("model.depth.inner=1"),
                    Contains("'model.depth' is '12', not a map"));
  CHECK_THROWS_WITH(config.set("model.stages[5].a=1"), Contains("index 5 is out of range"));
  CHECK_THROWS_WITH(config.set("model.stages.a=1"), Contains("'model.stages' is a list"));
  CHECK_THROWS_WITH(config.set("model.new.list[1]=1"), Contains("index 1 is out of range"));
  CHECK_FALSE(config.root()["model"].has("new"));  // a failed override changes nothing
}

TEST_CASE("config: dump gives the resolved document back", "[cpu][config]") {
  const TempDir dir;
  dir.write("base.yaml", "model: {depth: 12, name: 'true', note: \"a: b\", empty: ''}\n");
  const std::string top =
      dir.write("top.yaml",
                "include: base.yaml\nmodel: {dims: [1, 2], lr: 1e-4, on: true}\nlist: [{a: 1}]\n"
                "nothing: ~\n");
  Config config = Config::load(top);
  config.set("model.depth=6");
  const std::string text = config.dump();
  CHECK_THAT(text, !Contains("include"));
  const Config again = Config::parse(text);
  const ConfigNode model = again.root()["model"];
  CHECK(model.get<int>("depth") == 6);
  CHECK(model.get<std::string>("name") == "true");
  CHECK(model.get<std::string>("note") == "a: b");
  CHECK(model.get<std::string>("empty") == "");
  CHECK(model.get<std::vector<int64_t>>("dims") == std::vector<int64_t>{1, 2});
  CHECK(model.get<double>("lr") == Approx(1e-4));
  CHECK(model.get<bool>("on"));
  CHECK(again.root()["list"].at(0).get<int>("a") == 1);
  CHECK(again.root()["nothing"].is_null());
  CHECK(again.dump() == text);
}

TEST_CASE("config: closest_match", "[cpu][config]") {
  const std::vector<std::string> names{"vit_s", "cait_s", "swin_t", "cvt_13", "caformer_s18"};
  CHECK(closest_match("vit_s", names) == "vit_s");
  CHECK(closest_match("vits", names) == "vit_s");
  CHECK(closest_match("VIT_S", names) == "vit_s");
  CHECK(closest_match("swin-t", names) == "swin_t");
  CHECK(closest_match("caformer_s36", names) == "caformer_s18");  // 2 edits, within 12/3
  CHECK(closest_match("resnet50", names) == "");
  CHECK(closest_match("x", {}) == "");
}

namespace {

// Nine levels of nine aliases: 9^9 (387 million) scalars once copied out, from 1.4 KB of YAML.
// `flow` writes it as one flow map (for overrides), else one key per line.
std::string alias_bomb(bool flow) {
  std::string text = flow ? "{l0: &l0 [x, x, x, x, x, x, x, x, x]" : "l0: &l0 [x, x, x, x, x, x, x, x, x]\n";
  for (int level = 1; level < 9; ++level) {
    const std::string name = "l" + std::to_string(level);
    text += (flow ? ", " : "") + name + ": &" + name + " [";
    for (int i = 0; i < 9; ++i) text += (i ? ", *l" : "*l") + std::to_string(level - 1);
    text += flow ? "]" : "]\n";
  }
  return flow ? text + "}" : text;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TEST_CASE("config: an alias bomb is rejected before it expands", "[cpu][config][hardening]") {
  TempDir dir;
  const std::string path = dir.write("bomb.yaml", alias_bomb(false));
  REQUIRE(fs::file_size(path) < 1500);
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_AS(Config::load(path), ConfigError);
  REQUIRE_THROWS_WITH(Config::load(path),
                      Contains(path) && Contains("expands to more than 100000 nodes"));
  REQUIRE_THROWS_WITH(Config::parse(alias_bomb(false), "inline.yaml"),
                      Contains("inline.yaml: the config expands to more than 100000 nodes"));
  Config config;
  REQUIRE_THROWS_WITH(config.set("a=" + alias_bomb(true)),
                      Contains("override 'a={l0") && Contains("more than 100000 nodes"));
  // An include is read by the same reader.
  const std::string includer = dir.write("main.yaml", "include: bomb.yaml\nx: 1\n");
  REQUIRE_THROWS_WITH(Config::load(includer), Contains(path) && Contains("100000 nodes"));
  // Stopped after 100000 nodes, not 387 million (minutes and tens of GB): a bound far above the
  // ~0.1 s this takes, so that a loaded machine under ASan does not fail it (it took 7.7 s once).
  CHECK(seconds_since(start) < 60.0);

  // A long scalar repeated through aliases is bounded by bytes, not by nodes.
  std::string wide = "s: &s " + std::string(1 << 20, 'y') + "\nl: [*s";
  for (int i = 0; i < 20; ++i) wide += ", *s";
  REQUIRE_THROWS_WITH(Config::parse(wide + "]\n", "wide.yaml"),
                      Contains("wide.yaml") && Contains("bytes of keys and values"));

  // An alias inside its own anchor is a cycle in yaml-cpp's graph: a depth error, not a crash.
  REQUIRE_THROWS_WITH(Config::parse("a:\n  b: &b {lr: *b, name: cosine}\n", "cycle.yaml"),
                      Contains("cycle.yaml:") && Contains("nest more than 64 levels"));
  REQUIRE_THROWS_WITH(Config::parse("l: &l [1, *l]\n", "cycle.yaml"),
                      Contains("nest more than 64 levels"));
  // Deep nesting written out is bounded the same way.
  REQUIRE_THROWS_WITH(Config::parse("a: " + std::string(100, '[') + std::string(100, ']') + "\n"),
                      Contains("nest more than 64 levels"));

  // Ordinary aliases still read as copies.
  const Config ok = Config::parse("base: &b {lr: 0.5, betas: [0.9, 0.99]}\nother: *b\n");
  CHECK(ok.root()["other"].get<double>("lr") == 0.5);
  CHECK(ok.root()["other"].get<std::vector<double>>("betas") == std::vector<double>{0.9, 0.99});
}

TEST_CASE("config: non-finite numbers are range errors everywhere", "[cpu][config][hardening]") {
  const Config config =
      Config::parse("optim: {lr: .inf}\nnan: .nan\nneg: -.Inf\nhuge: 1e999\nlist: [1, .inf]\n");
  const ConfigNode root = config.root();
  CHECK_THROWS_WITH(root["optim"].get<double>("lr"),
                    Contains("optim.lr: value .inf is out of range; expected a finite number"));
  CHECK_THROWS_WITH(root.get_double_in("nan", 0.5, 0.0, 1.0),
                    Contains("nan: value .nan is out of range; expected a finite number"));
  CHECK_THROWS_WITH(root.get_double_in("neg", 0.5, -1e300, 1e300), Contains("neg: value -.Inf"));
  CHECK_THROWS_WITH(root.get<double>("huge"), Contains("huge: value 1e999 is out of range"));
  CHECK_THROWS_WITH(root.get<std::vector<double>>("list"), Contains("list[1]: value .inf"));
  // The optimizer's "> 0" check no longer lets infinity through.
  CHECK_THROWS_AS(optim::OptimizerOptions::from_config(root["optim"]), ConfigError);
  CHECK_THROWS_WITH(optim::OptimizerOptions::from_config(root["optim"]), Contains("optim.lr"));
}

TEST_CASE("config: an override with an empty value is an error naming the key",
          "[cpu][config][hardening]") {
  Config config = Config::parse("data: {batch_size: 64}\n");
  for (const std::string empty : {"data.batch_size=", "data.batch_size=  "}) {
    CAPTURE(empty);
    CHECK_THROWS_AS(config.set(empty), ConfigError);
    CHECK_THROWS_WITH(config.set(empty), Contains("malformed override '" + empty + "'") &&
                                             Contains("the value of 'data.batch_size' is empty"));
  }
  CHECK(config.root()["data"].get<int64_t>("batch_size") == 64);  // unchanged
  config.set("data.batch_size=null");  // an explicit null still clears the key
  CHECK(config.root()["data"].get_int_in("batch_size", 7, 1, 100) == 7);
}
