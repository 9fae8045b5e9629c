// Tests of the .npy reader and writer: files written by NumPy (tests/fixtures/io, made by
// make_fixtures.py there), round trips of every supported dtype, and corrupt-file errors.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "io/npy.h"
#include "support/test_util.h"

namespace {

using namespace ska;

std::string fixture(const std::string& name) { return std::string(SKA_TEST_FIXTURES) + "/io/" + name; }

std::string temp_path(const std::string& name) {
  return (std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp")) + "/ska_test_npy_" +
         name;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("read_npy reads files written by NumPy", "[cpu][io]") {
  SECTION("float32, version 1.0") {
    Tensor x = read_npy(fixture("f32_2x3.npy"));
    REQUIRE(x.dtype() == DType::kF32);
    REQUIRE(x.shape() == Shape{2, 3});
    REQUIRE(x.to_vector<float>() == std::vector<float>{-0.5f, -0.25f, 0.f, 0.25f, 0.5f, 0.75f});
  }
  SECTION("float32, version 2.0") {
    Tensor x = read_npy(fixture("f32_v2_2x3.npy"));
    REQUIRE(x.shape() == Shape{2, 3});
    REQUIRE(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  }
  SECTION("float64") {
    Tensor x = read_npy(fixture("f64_3.npy"));
    REQUIRE(x.dtype() == DType::kF64);
    REQUIRE(x.to_vector<double>() == std::vector<double>{1.5, -2.25, 1e-300});
  }
  SECTION("int64") {
    Tensor x = read_npy(fixture("i64_2x2x2.npy"));
    REQUIRE(x.dtype() == DType::kI64);
    REQUIRE(x.shape() == Shape{2, 2, 2});
    REQUIRE(x.to_vector<int64_t>().front() == -4000000000000);
    REQUIRE(x.to_vector<int64_t>().back() == 3000000000000);
  }
  SECTION("uint8") {
    Tensor x = read_npy(fixture("u8_4.npy"));
    REQUIRE(x.dtype() == DType::kU8);
    REQUIRE(x.to_vector<uint8_t>() == std::vector<uint8_t>{0, 1, 128, 255});
  }
  SECTION("a 0-d array") {
    Tensor x = read_npy(fixture("f32_scalar.npy"));
    REQUIRE(x.shape().empty());
    REQUIRE(x.item() == 3.5);
  }
}

TEST_CASE("write_npy writes what NumPy writes, byte for byte", "[cpu][io]") {
  const std::string path = temp_path("f32_2x3.npy");
  write_npy(path, read_npy(fixture("f32_2x3.npy")));
  REQUIRE(read_bytes(path) == read_bytes(fixture("f32_2x3.npy")));
  write_npy(path, read_npy(fixture("f32_scalar.npy")));
  REQUIRE(read_bytes(path) == read_bytes(fixture("f32_scalar.npy")));
  std::remove(path.c_str());
}

TEST_CASE("write_npy and read_npy round-trip every supported dtype", "[cpu][io]") {
  const std::string path = temp_path("round_trip.npy");
  for (DType dtype : {DType::kF32, DType::kF64, DType::kI64, DType::kU8}) {
    Tensor x = test::uniform({3, 1, 4}, 7, 0.0, 200.0).to(dtype);
    // A non-contiguous view is written in C order.
    write_npy(path, x.transpose(0, 2));
    Tensor y = read_npy(path);
    REQUIRE(y.dtype() == dtype);
    REQUIRE(y.shape() == Shape{4, 1, 3});
    test::require_close(y, x.transpose(0, 2), {0, 0}, dtype_name(dtype));
    // The data starts 64-byte aligned, as NumPy writes it.
    REQUIRE((read_bytes(path).size() - x.numel() * x.element_size()) % 64 == 0);
  }
  SECTION("an empty array") {
    write_npy(path, Tensor::zeros({0, 5}));
    REQUIRE(read_npy(path).shape() == Shape{0, 5});
  }
  std::remove(path.c_str());
  REQUIRE_THROWS_AS(write_npy(path, Tensor::zeros({2}, DType::kBF16)), DTypeError);
}

TEST_CASE("read_npy rejects unsupported and corrupt files, naming the file", "[cpu][io]") {
  using Catch::Matchers::Contains;
  SECTION("unsupported layouts and dtypes") {
    REQUIRE_THROWS_WITH(read_npy(fixture("fortran_2x3.npy")),
                        Contains("fortran_2x3.npy") && Contains("Fortran"));
    REQUIRE_THROWS_WITH(read_npy(fixture("big_endian_f4.npy")),
                        Contains("big_endian_f4.npy") && Contains("unsupported .npy dtype '>f4'"));
    REQUIRE_THROWS_WITH(read_npy(fixture("bool_3.npy")), Contains("unsupported .npy dtype '|b1'"));
  }
  const std::string good = read_bytes(fixture("f32_2x3.npy"));
  const std::string path = temp_path("corrupt.npy");
  SECTION("bad magic") {
    write_bytes(path, "PK" + good.substr(2));
    REQUIRE_THROWS_WITH(read_npy(path), Contains(path) && Contains("bad magic"));
  }
  SECTION("unsupported version") {
    std::string bytes = good;
    bytes[6] = 3;
    write_bytes(path, bytes);
    REQUIRE_THROWS_WITH(read_npy(path), Contains("unsupported .npy version 3.0"));
  }
  SECTION("truncated data") {
    write_bytes(path, good.substr(0, good.size() - 4));
    REQUIRE_THROWS_WITH(read_npy(path), Contains(path) && Contains("truncated .npy data"));
  }
  SECTION("truncated header") {
    write_bytes(path, good.substr(0, 40));
    REQUIRE_THROWS_WITH(read_npy(path), Contains("truncated .npy file"));
  }
  SECTION("trailing bytes") {
    write_bytes(path, good + "xx");
    REQUIRE_THROWS_WITH(read_npy(path), Contains("trailing bytes"));
  }
  SECTION("malformed header") {
    std::string bytes = good;
    bytes.replace(bytes.find("(2, 3)"), 6, "(2, x)");
    write_bytes(path, bytes);
    REQUIRE_THROWS_WITH(read_npy(path), Contains("malformed .npy header"));
  }
  SECTION("missing file") {
    REQUIRE_THROWS_AS(read_npy(path + ".absent"), IOError);
  }
  std::remove(path.c_str());
}

namespace {

// A version-1.0 .npy file with `header` (the Python dict text) and `data` after it.
std::string npy_bytes(const std::string& header, const std::string& data = "") {
  std::string padded = header;
  padded.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  padded.push_back('\n');
  std::string out = "\x93NUMPY";
  out += std::string{'\x01', '\x00'};
  out.push_back(static_cast<char>(padded.size() & 0xff));
  out.push_back(static_cast<char>(padded.size() >> 8));
  return out + padded + data;
}

std::string f4_header(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

}  // namespace

TEST_CASE("read_npy checks header sizes before allocating, naming the file",
          "[cpu][io][hardening]") {
  using Catch::Matchers::Contains;
  const std::string path = temp_path("huge.npy");
  write_bytes(path, npy_bytes(f4_header("(2, 3)"), std::string(24, '\0')));
  REQUIRE(read_npy(path).shape() == Shape{2, 3});  // the helper writes valid files
  SECTION("a shape of 2^40 floats with 8 bytes of data") {
    write_bytes(path, npy_bytes(f4_header("(1099511627776,)"), std::string(8, '\0')));
    REQUIRE_THROWS_AS(read_npy(path), IOError);
    REQUIRE_THROWS_WITH(read_npy(path), Contains(path) && Contains("truncated .npy data") &&
                                            Contains("needs 4398046511104 bytes, the file has 8"));
  }
  SECTION("a shape whose product overflows 64 bits") {
    write_bytes(path, npy_bytes(f4_header("(4294967296, 4294967296, 4)")));
    REQUIRE_THROWS_AS(read_npy(path), IOError);
    REQUIRE_THROWS_WITH(read_npy(path),
                        Contains(path) && Contains("more elements than a 64-bit integer holds"));
  }
  SECTION("a shape entry beyond 64 bits") {
    write_bytes(path, npy_bytes(f4_header("(99999999999999999999,)")));
    REQUIRE_THROWS_AS(read_npy(path), IOError);
    REQUIRE_THROWS_WITH(read_npy(path), Contains(path) && Contains("99999999999999999999") &&
                                            Contains("overflows a 64-bit integer"));
  }
  SECTION("a version-2.0 header length of 4 GiB in a small file") {
    std::string bytes = npy_bytes(f4_header("(2, 3)"), std::string(24, '\0'));
    bytes = "\x93NUMPY" + std::string{'\x02', '\x00', '\xff', '\xff', '\xff', '\xff'} +
            bytes.substr(10);
    write_bytes(path, bytes);
    REQUIRE_THROWS_AS(read_npy(path), IOError);
    REQUIRE_THROWS_WITH(read_npy(path), Contains(path) && Contains("truncated .npy file (header") &&
                                            Contains("expected 4294967295 bytes, the file has ") &&
                                            Contains(" left)"));
  }
  std::remove(path.c_str());
}
