// Tests of the TensorBoard event files: a fixture written by python3-protobuf
// (scripts/make_tensorboard_fixture.py), round trips of our writer, and CRC / truncation errors.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "io/tensorboard.h"
#include "train/train_test_util.h"

namespace {

using namespace ska;
namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return std::string(SKA_TEST_FIXTURES) + "/io/" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

TEST_CASE("crc32c has the standard check value", "[cpu][io][tensorboard]") {
  const std::string s = "123456789";
  REQUIRE(io::crc32c(s.data(), s.size()) == 0xE3069283u);
  REQUIRE(io::crc32c("", 0) == 0u);
}

TEST_CASE("read_tb_events decodes a file written by python3-protobuf", "[cpu][io][tensorboard]") {
  const auto events = io::read_tb_events(fixture("tb_fixture.tfevents"));
  REQUIRE(events.size() == 5);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].wall_time == 1700000000.5);
  CHECK(events[0].scalars.empty());
  CHECK(events[1].step == 1);
  CHECK(events[1].wall_time == 1700000001.25);
  REQUIRE(events[1].scalars.size() == 2);
  CHECK(events[1].scalars[0].tag == "train/loss");
  CHECK(events[1].scalars[0].value == 2.5f);
  CHECK(events[1].scalars[1].tag == "train/lr");
  CHECK(events[1].scalars[1].value == 0.001f);
  CHECK(events[2].scalars[0].value == 1.25f);
  // eval/top1 carries metadata and node_name, which the reader skips.
  CHECK(events[3].step == 300);
  REQUIRE(events[3].scalars.size() == 2);
  CHECK(events[3].scalars[0].tag == "eval/top1");
  CHECK(events[3].scalars[0].value == 87.5f);
  CHECK(events[3].scalars[1].value == 99.25f);
  CHECK(events[4].step == (int64_t{1} << 40) + 3);
  CHECK(events[4].scalars[0].value == 0.f);
}

TEST_CASE("our event encoding equals python3-protobuf's bytes", "[cpu][io][tensorboard]") {
  // Re-encoding every decoded event and re-framing it reproduces the fixture byte for byte,
  // except the one event with fields we do not write (metadata, node_name).
  const std::string original = read_bytes(fixture("tb_fixture.tfevents"));
  const auto events = io::read_tb_events(fixture("tb_fixture.tfevents"));
  const std::string dir = test::train_scratch_dir("tb_bytes");
  io::TbWriter w(dir);
  for (size_t i = 1; i < events.size(); ++i) w.write(events[i].step, events[i].scalars, events[i].wall_time);
  const auto ours = io::read_tb_events(w.path());
  REQUIRE(ours.size() == events.size());
  for (size_t i : {1, 2, 4}) {
    CHECK(io::tb_encode_event(ours[i]) == io::tb_encode_event(events[i]));
    CHECK(original.find(io::tb_encode_event(ours[i])) != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("TbWriter round-trips through read_tb_events", "[cpu][io][tensorboard]") {
  const std::string dir = test::train_scratch_dir("tb_round");
  io::TbWriter w(dir);
  REQUIRE(fs::path(w.path()).filename().string().rfind("events.out.tfevents.", 0) == 0);
  w.write(0, {{"train/loss", 2.302585f}}, 10.0);
  w.write(7, {{"eval/top1", 55.5f}, {"eval/loss", -1.5f}}, 11.0);
  w.write(-3, {}, 12.0);
  io::TbWriter second(dir);  // same second: a distinct file
  REQUIRE(second.path() != w.path());

  const auto events = io::read_tb_events(w.path());
  REQUIRE(events.size() == 4);
  CHECK(events[0].file_version == "brain.Event:2");
  CHECK(events[0].wall_time > 1.6e9);
  CHECK(events[1].step == 0);
  CHECK(events[1].scalars[0].value == 2.302585f);
  CHECK(events[2].step == 7);
  CHECK(events[2].wall_time == 11.0);
  REQUIRE(events[2].scalars.size() == 2);
  CHECK(events[2].scalars[1].tag == "eval/loss");
  CHECK(events[2].scalars[1].value == -1.5f);
  CHECK(events[3].step == -3);
  fs::remove_all(dir);
}

TEST_CASE("read_tb_events names the file and offset of a corrupt record", "[cpu][io][tensorboard]") {
  const std::string dir = test::train_scratch_dir("tb_corrupt");
  const std::string bytes = read_bytes(fixture("tb_fixture.tfevents"));
  const std::string path = dir + "/events.out.tfevents.1.bad";
  // The second record starts after the first (12 + data + 4 bytes).
  const auto first_len = static_cast<size_t>(static_cast<uint8_t>(bytes[0]));
  const size_t second = 12 + first_len + 4;

  SECTION("a flipped data byte") {
    std::string bad = bytes;
    bad[second + 14] ^= 0x01;
    write_bytes(path, bad);
    REQUIRE_THROWS_AS(io::read_tb_events(path), IOError);
    REQUIRE_THROWS_WITH(io::read_tb_events(path),
                        Catch::Contains(path) &&
                            Catch::Contains("record at byte offset " + std::to_string(second)) &&
                            Catch::Contains("data's CRC32C"));
  }
  SECTION("a flipped length byte") {
    std::string bad = bytes;
    bad[second] ^= 0x40;
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(io::read_tb_events(path),
                        Catch::Contains("byte offset " + std::to_string(second)) &&
                            Catch::Contains("length's CRC32C"));
  }
  SECTION("a truncated file") {
    write_bytes(path, bytes.substr(0, bytes.size() - 3));
    REQUIRE_THROWS_WITH(io::read_tb_events(path), Catch::Contains(path) && Catch::Contains("truncated"));
  }
  SECTION("a missing file") {
    REQUIRE_THROWS_WITH(io::read_tb_events(dir + "/none"), Catch::Contains(dir + "/none"));
  }
  fs::remove_all(dir);
}
