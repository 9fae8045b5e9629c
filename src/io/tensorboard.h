// TensorBoard event files: Event protobufs (wall_time, step, file_version or summary scalars)
// hand-encoded and framed as TFRecords (length, masked CRC32C of it, data, masked CRC32C of it).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace ska::io {

// One `summary.value` entry: a tag and its simple_value (TensorBoard stores f32).
struct TbScalar {
  std::string tag;
  float value = 0.f;
};

// One Event record. `file_version` is set only in a file's first event ("brain.Event:2");
// `scalars` are the summary's values (empty for the header event).
struct TbEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;
  std::vector<TbScalar> scalars;
};

// CRC-32C (Castagnoli), and the TFRecord mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t bytes);
uint32_t tfrecord_masked_crc(const void* data, size_t bytes);

// The protobuf bytes of an Event, and back. Decoding skips fields it does not know (any wire
// type) and throws IOError naming `where` for malformed bytes.
std::string tb_encode_event(const TbEvent& event);
TbEvent tb_decode_event(const std::string& bytes, const std::string& where);

// Every event of a TFRecord event file. A truncated record or a CRC that does not match throws
// IOError naming the file and the record's byte offset.
std::vector<TbEvent> read_tb_events(const std::string& path);

// Appends events to `dir`/events.out.tfevents.<unix time>.<host> (".N" added when that name is
// taken), starting with the file_version event. Each event is flushed as written, so TensorBoard
// sees a live run and a killed run leaves whole records.
class TbWriter {
 public:
  explicit TbWriter(const std::string& dir);  // IOError when the file cannot be created
  const std::string& path() const { return path_; }
  // One event at `step` holding all of `scalars`; wall_time is now unless given (>= 0).
  void write(int64_t step, const std::vector<TbScalar>& scalars, double wall_time = -1.0);

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::ofstream out_;
};

}  // namespace ska::io
