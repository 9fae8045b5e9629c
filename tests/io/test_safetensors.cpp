// safetensors I/O: round trips of every dtype, the exact byte layout, a file written by Python, and
// the error (type and message naming file and tensor) for each kind of corrupt file.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "io/safetensors.h"
#include "nn/layers.h"
#include "support/test_util.h"

using namespace ska;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using ska::test::values;

namespace {

// A fresh directory for one test case, removed afterwards.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : dir_(fs::temp_directory_path() /
             ("ska_safetensors_" + name + "_" + std::to_string(getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ScratchDir() { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  size_t entry_count() const {
    return static_cast<size_t>(std::distance(fs::directory_iterator(dir_), {}));
  }

 private:
  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file made of `header` JSON and `data_bytes` zero bytes (for corruption cases).
std::string write_raw(const ScratchDir& dir, const std::string& name, const std::string& header,
                      size_t data_bytes) {
  const std::string path = dir.file(name);
  write_bytes(path, le64(header.size()) + header + std::string(data_bytes, '\0'));
  return path;
}

// Reading `path` throws IOError whose message names the file and contains `expected`.
void require_read_error(const std::string& path, const std::string& expected) {
  INFO("reading " << path);
  REQUIRE_THROWS_AS(read_safetensors(path), IOError);
  REQUIRE_THROWS_WITH(read_safetensors(path), Contains(path) && Contains(expected));
}

void require_same_tensor(const Tensor& actual, const Tensor& expected, const std::string& name) {
  INFO("tensor " << name);
  REQUIRE(actual.dtype() == expected.dtype());
  REQUIRE(actual.shape() == expected.shape());
  CHECK(actual.device().is_cpu());
  CHECK(actual.to_vector<double>() == expected.to_vector<double>());
}

}  // namespace

TEST_CASE("safetensors round trip of every dtype, views, scalars and metadata", "[cpu][io]") {
  ScratchDir dir("roundtrip");
  const Tensor grid = Tensor::arange(12, DType::kF64).reshape({3, 4});
  TensorMap tensors;
  for (DType dt : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16, DType::kI64, DType::kI32}) {
    tensors[std::string("x_") + dtype_name(dt)] = sub(grid, 5.0).to(dt);  // negative values too
  }
  tensors["x_u8"] = add(grid, 244.0).to(DType::kU8);             // values up to 255
  tensors["x_f32"] = mul(tensors["x_f32"], 0.1);                 // non-integers
  tensors["transposed"] = grid.to(DType::kF32).transpose(0, 1);  // a strided view
  tensors["narrowed"] = grid.narrow(1, 1, 2);                    // a view with an offset
  tensors["scalar"] = Tensor::scalar(-2.5, DType::kF64);
  tensors["empty"] = Tensor::zeros({0, 3}, DType::kF32);
  const StringMap metadata{{"format", "pt"}, {"epoch", "7"}};

  const std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, metadata);
  const SafetensorsContents back = read_safetensors(path);
  CHECK(back.metadata == metadata);
  REQUIRE(back.tensors.size() == tensors.size());
  for (const auto& [name, tensor] : tensors) {
    REQUIRE(back.tensors.count(name) == 1);
    require_same_tensor(back.tensors.at(name), tensor, name);
  }
  CHECK(load_safetensors(path).size() == tensors.size());
  CHECK(dir.entry_count() == 1);  // no temporary file left behind
}

TEST_CASE("safetensors byte layout: length, padded JSON header, little-endian data", "[cpu][io]") {
  ScratchDir dir("layout");
  const std::string path = dir.file("one.safetensors");
  save_safetensors(path, {{"w", values({1.0, -2.0}, {2}, DType::kF32)}});
  const std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  CHECK(header_len % 8 == 0);
  REQUIRE(bytes.size() == 8 + header_len + 8);
  const std::string header = bytes.substr(8, header_len);
  CHECK_THAT(header, Contains("\"w\":{\"data_offsets\":[0,8],\"dtype\":\"F32\",\"shape\":[2]}"));
  const std::string data = bytes.substr(8 + header_len);
  CHECK(data == std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8));  // 1.0f, -2.0f
}

TEST_CASE("safetensors save replaces an existing file and reports unwritable paths", "[cpu][io]") {
  ScratchDir dir("replace");
  const std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"a", Tensor::ones({4}, DType::kF32)}});
  save_safetensors(path, {{"b", Tensor::zeros({2}, DType::kI64)}});
  const TensorMap back = load_safetensors(path);
  CHECK(back.size() == 1);
  CHECK(back.count("b") == 1);
  CHECK(dir.entry_count() == 1);

  const std::string missing_dir = dir.file("no/such/dir/x.safetensors");
  REQUIRE_THROWS_AS(save_safetensors(missing_dir, {{"a", Tensor::ones({1})}}), IOError);
  REQUIRE_THROWS_WITH(save_safetensors(missing_dir, {{"a", Tensor::ones({1})}}),
                      Contains(missing_dir));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"__metadata__", Tensor::ones({1})}}),
                      Contains("reserved"));
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"undefined", Tensor()}}), Contains("undefined"));
  CHECK(load_safetensors(path).count("b") == 1);  // failed saves left the old file intact
}

TEST_CASE("safetensors reads a file written by Python (struct + json)", "[cpu][io]") {
  const std::string path = std::string(SKA_TEST_FIXTURES) + "/golden/python_all_dtypes.safetensors";
  const SafetensorsContents file = read_safetensors(path);
  CHECK(file.metadata.at("writer") == "scripts/make_golden_fixtures.py");
  // Each tensor holds arange(6) - 2 in its dtype (u8: arange(6) + 250), shape [2, 3].
  const Tensor expected = sub(Tensor::arange(6, DType::kF64).reshape({2, 3}), 2.0);
  const std::pair<const char*, DType> cases[] = {{"F32", DType::kF32},   {"F64", DType::kF64},
                                                 {"BF16", DType::kBF16}, {"F16", DType::kF16},
                                                 {"I64", DType::kI64},   {"I32", DType::kI32}};
  for (const auto& [name, dtype] : cases) {
    REQUIRE(file.tensors.count(name) == 1);
    require_same_tensor(file.tensors.at(name), expected.to(dtype), name);
  }
  require_same_tensor(file.tensors.at("U8"), add(expected, 252.0).to(DType::kU8), "U8");
  require_same_tensor(file.tensors.at("scalar"), Tensor::scalar(0.5, DType::kF64), "scalar");
}

TEST_CASE("safetensors rejects corrupt files with errors naming file and tensor", "[cpu][io]") {
  ScratchDir dir("corrupt");
  const std::string good = dir.file("good.safetensors");
  save_safetensors(
      good, {{"a", Tensor::ones({2, 2}, DType::kF32)}, {"b", Tensor::ones({3}, DType::kF64)}});
  const std::string good_bytes = read_bytes(good);

  SECTION("missing file") { require_read_error(dir.file("absent.safetensors"), "cannot open"); }
  SECTION("shorter than the length field") {
    const std::string path = dir.file("tiny.safetensors");
    write_bytes(path, good_bytes.substr(0, 5));
    require_read_error(path, "truncated");
  }
  SECTION("header length beyond the file size") {
    const std::string path = dir.file("long_header.safetensors");
    write_bytes(path, le64(1u << 20) + good_bytes.substr(8));
    require_read_error(path, "beyond the file size");
  }
  SECTION("data section cut short") {
    const std::string path = dir.file("cut.safetensors");
    write_bytes(path, good_bytes.substr(0, good_bytes.size() - 4));
    require_read_error(path, "out of range");
  }
  SECTION("malformed JSON") {
    require_read_error(write_raw(dir, "bad_json.safetensors", "{\"a\": {\"dtype\": ", 0),
                       "not valid JSON");
    require_read_error(write_raw(dir, "array.safetensors", "[1, 2]  ", 0), "JSON object");
  }
  SECTION("unknown dtype names the tensor") {
    const std::string path =
        write_raw(dir, "dtype.safetensors",
                  R"({"weights":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
    require_read_error(path, "tensor 'weights' has unknown or unsupported dtype 'F8_E4M3'");
  }
  SECTION("missing fields and negative sizes") {
    require_read_error(
        write_raw(dir, "noshape.safetensors", R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4),
        "tensor 'w' has no \"shape\"");
    require_read_error(
        write_raw(dir, "nooffsets.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", 4),
        "tensor 'w' needs \"data_offsets\"");
    require_read_error(write_raw(dir, "negative.safetensors",
                                 R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                       "non-negative");
  }
  SECTION("data_offsets out of range") {
    const std::string path = write_raw(
        dir, "range.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
    require_read_error(path, "tensor 'w' has data_offsets [0, 16] out of range");
    const std::string reversed = write_raw(
        dir, "reversed.safetensors", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8);
    require_read_error(reversed, "tensor 'w' has data_offsets [4, 2] that end before they begin");
  }
  SECTION("data_offsets not matching shape and dtype") {
    const std::string path =
        write_raw(dir, "size.safetensors",
                  R"({"w":{"dtype":"F64","shape":[2,3],"data_offsets":[0,24]}})", 48);
    require_read_error(path,
                       "tensor 'w' has data_offsets [0, 24] spanning 24 bytes, but shape "
                       "[2, 3] of F64 needs 48 bytes");
  }
  SECTION("overlapping data_offsets") {
    const std::string path = write_raw(dir, "overlap.safetensors",
                                       R"({"p":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                       R"("q":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                       12);
    require_read_error(path, "tensors 'p' [0, 8) and 'q' [4, 12) have overlapping data_offsets");
  }
  SECTION("metadata that is not string to string") {
    const std::string path =
        write_raw(dir, "meta.safetensors", R"({"__metadata__":{"epoch":7}})", 0);
    require_read_error(path, "metadata key 'epoch' must map to a string");
  }
}

TEST_CASE("safetensors: bytes after the last tensor are rejected, naming the file",
          "[cpu][io][hardening]") {
  ScratchDir dir("trailing");
  const std::string path = dir.file("trailing.safetensors");
  save_safetensors(path, {{"a", Tensor::ones({2, 2}, DType::kF32)}});
  REQUIRE(read_safetensors(path).tensors.size() == 1);
  write_bytes(path, read_bytes(path) + "junk");
  require_read_error(path, "the data section holds 20 bytes but its tensors end at byte 16");
  // Empty tensors occupy nothing: a data section with only them must be empty too.
  require_read_error(
      write_raw(dir, "empty.safetensors", R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
                4),
      "expected no trailing bytes");
}

TEST_CASE("safetensors: integer tensors do not load silently into float parameters",
          "[cpu][io][hardening]") {
  ScratchDir dir("dtype");
  const std::string path = dir.file("int.safetensors");
  nn::Linear model(2, 3);
  TensorMap tensors = model.state_dict();
  tensors["weight"] = Tensor::ones({3, 2}, DType::kI32);
  save_safetensors(path, tensors);
  const TensorMap loaded = load_safetensors(path);
  REQUIRE_THROWS_AS(model.load_state_dict(loaded), DTypeError);
  REQUIRE_THROWS_WITH(model.load_state_dict(loaded),
                      Contains("mis-typed") && Contains("weight (expected f32, got i32)"));
  // Floating dtypes still convert into each other; an explicit conversion loads the integers.
  TensorMap halves = loaded;
  halves["weight"] = loaded.at("weight").to(DType::kBF16);
  REQUIRE_NOTHROW(model.load_state_dict(halves));
  halves["weight"] = loaded.at("weight").to(DType::kF32);
  model.load_state_dict(halves);
  CHECK(model.weight.to_vector<float>() == std::vector<float>(6, 1.0f));
}
