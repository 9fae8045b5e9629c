// TensorBoard event files: protobuf wire format by hand (varints, fixed32/64, length-delimited
// fields) and TFRecord framing with masked CRC32C (see tensorboard.h).
#include "io/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iterator>

#include "core/error.h"

namespace ska::io {

namespace {

// Event and Summary field numbers (tensorflow/core/util/event.proto, framework/summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1, kValueTag = 1, kValueSimpleValue = 2;
constexpr uint32_t kWireVarint = 0, kWireFixed64 = 1, kWireBytes = 2, kWireFixed32 = 5;

std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

void put_key(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, field << 3 | wire); }

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kWireBytes);
  put_varint(out, bytes.size());
  out += bytes;
}

uint64_t get_le(const std::string& s, size_t pos, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(s[pos + i])) << (8 * i);
  return v;
}

// A cursor over protobuf bytes; every read is bounds-checked and names `where`.
class WireReader {
 public:
  WireReader(const std::string& bytes, const std::string& where) : s_(bytes), where_(where) {}
  bool done() const { return pos_ >= s_.size(); }

  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1, "varint");
      const uint8_t b = static_cast<uint8_t>(s_[pos_++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    SKA_FAIL(IOError, where_, ": varint longer than 10 bytes at byte ", pos_);
  }
  uint64_t fixed(int bytes) {
    need(bytes, "fixed-width field");
    const uint64_t v = get_le(s_, pos_, bytes);
    pos_ += bytes;
    return v;
  }
  std::string bytes() {
    const uint64_t n = varint();
    need(n, "length-delimited field");
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case kWireVarint: varint(); return;
      case kWireFixed64: fixed(8); return;
      case kWireBytes: bytes(); return;
      case kWireFixed32: fixed(4); return;
      default: SKA_FAIL(IOError, where_, ": unsupported protobuf wire type ", wire, " before byte ", pos_);
    }
  }

 private:
  void need(uint64_t n, const char* what) {
    SKA_CHECK(n <= s_.size() - pos_, IOError, where_, ": ", what, " at byte ", pos_,
              " runs past the end (", s_.size(), " bytes)");
  }
  const std::string& s_;
  const std::string& where_;
  size_t pos_ = 0;
};

TbScalar decode_value(const std::string& bytes, const std::string& where) {
  TbScalar v;
  WireReader r(bytes, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), wire = key & 7;
    if (field == kValueTag && wire == kWireBytes) {
      v.tag = r.bytes();
    } else if (field == kValueSimpleValue && wire == kWireFixed32) {
      const uint32_t u = static_cast<uint32_t>(r.fixed(4));
      std::memcpy(&v.value, &u, 4);
    } else {
      r.skip(wire);
    }
  }
  return v;
}

std::vector<TbScalar> decode_summary(const std::string& bytes, const std::string& where) {
  std::vector<TbScalar> values;
  WireReader r(bytes, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    if ((key >> 3) == kSummaryValue && (key & 7) == kWireBytes) {
      values.push_back(decode_value(r.bytes(), where));
    } else {
      r.skip(key & 7);
    }
  }
  return values;
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string fresh_event_path(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string base = (fs::path(dir) / ("events.out.tfevents." +
                            std::to_string(std::time(nullptr)) + "." + host_name())).string();
  std::string path = base;
  for (int i = 1; fs::exists(path); ++i) path = base + "." + std::to_string(i);
  return path;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t tfrecord_masked_crc(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tb_encode_event(const TbEvent& event) {
  // Proto3: fields at their default value are left out, as protobuf's own serialiser does.
  std::string out;
  if (event.wall_time != 0.0) {
    uint64_t bits;
    std::memcpy(&bits, &event.wall_time, 8);
    put_key(out, kEventWallTime, kWireFixed64);
    put_le(out, bits, 8);
  }
  if (event.step != 0) {
    put_key(out, kEventStep, kWireVarint);
    put_varint(out, static_cast<uint64_t>(event.step));
  }
  if (!event.file_version.empty()) put_bytes(out, kEventFileVersion, event.file_version);
  if (!event.scalars.empty()) {
    std::string summary;
    for (const TbScalar& s : event.scalars) {
      std::string value;
      put_bytes(value, kValueTag, s.tag);
      uint32_t bits;
      std::memcpy(&bits, &s.value, 4);
      put_key(value, kValueSimpleValue, kWireFixed32);
      put_le(value, bits, 4);
      put_bytes(summary, kSummaryValue, value);
    }
    put_bytes(out, kEventSummary, summary);
  }
  return out;
}

TbEvent tb_decode_event(const std::string& bytes, const std::string& where) {
  TbEvent e;
  WireReader r(bytes, where);
  while (!r.done()) {
    const uint64_t key = r.varint();
    const uint32_t field = static_cast<uint32_t>(key >> 3), wire = key & 7;
    if (field == kEventWallTime && wire == kWireFixed64) {
      const uint64_t bits = r.fixed(8);
      std::memcpy(&e.wall_time, &bits, 8);
    } else if (field == kEventStep && wire == kWireVarint) {
      e.step = static_cast<int64_t>(r.varint());
    } else if (field == kEventFileVersion && wire == kWireBytes) {
      e.file_version = r.bytes();
    } else if (field == kEventSummary && wire == kWireBytes) {
      e.scalars = decode_summary(r.bytes(), where);
    } else {
      r.skip(wire);
    }
  }
  return e;
}

std::vector<TbEvent> read_tb_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SKA_CHECK(in.good(), IOError, "cannot open TensorBoard event file '", path, "'");
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<TbEvent> events;
  size_t pos = 0;
  while (pos < s.size()) {
    const std::string at = "'" + path + "': record at byte offset " + std::to_string(pos);
    SKA_CHECK(s.size() - pos >= 12, IOError, at, ": truncated header (", s.size() - pos,
              " of 12 bytes)");
    const uint64_t length = get_le(s, pos, 8);
    SKA_CHECK(static_cast<uint32_t>(get_le(s, pos + 8, 4)) == tfrecord_masked_crc(&s[pos], 8),
              IOError, at, ": the length's CRC32C does not match (corrupt bytes ", pos, "..",
              pos + 11, ")");
    SKA_CHECK(length <= s.size() - pos - 12 && s.size() - pos - 12 - length >= 4, IOError, at,
              ": truncated data (", length, " bytes + 4 of CRC announced, ", s.size() - pos - 12,
              " left)");
    const size_t data = pos + 12;
    SKA_CHECK(static_cast<uint32_t>(get_le(s, data + length, 4)) ==
                  tfrecord_masked_crc(s.data() + data, length),
              IOError, at, ": the data's CRC32C does not match (corrupt bytes ", data, "..",
              data + length + 3, ")");
    events.push_back(tb_decode_event(s.substr(data, length), at));
    pos = data + length + 4;
  }
  return events;
}

TbWriter::TbWriter(const std::string& dir) : path_(fresh_event_path(dir)) {
  out_.open(path_, std::ios::binary);
  SKA_CHECK(out_.good(), IOError, "cannot create TensorBoard event file '", path_, "'");
  TbEvent header;
  header.wall_time = now_seconds();
  header.file_version = "brain.Event:2";
  write_record(tb_encode_event(header));
}

void TbWriter::write(int64_t step, const std::vector<TbScalar>& scalars, double wall_time) {
  TbEvent e;
  e.wall_time = wall_time >= 0 ? wall_time : now_seconds();
  e.step = step;
  e.scalars = scalars;
  write_record(tb_encode_event(e));
}

void TbWriter::write_record(const std::string& data) {
  std::string header;
  put_le(header, data.size(), 8);
  std::string record = header;
  put_le(record, tfrecord_masked_crc(header.data(), 8), 4);
  record += data;
  put_le(record, tfrecord_masked_crc(data.data(), data.size()), 4);
  out_.write(record.data(), static_cast<std::streamsize>(record.size()));
  out_.flush();
  SKA_CHECK(out_.good(), IOError, "cannot write to TensorBoard event file '", path_, "'");
}

}  // namespace ska::io
