// The input files of the fuzz targets (see fuzz_util.h).
#include "fuzz_util.h"

#include <zlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace ska::fuzz {

const std::string& scratch_dir() {
  // Never destroyed: the atexit cleanup runs after function-local statics are gone.
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/ska_fuzz_XXXXXX";
    if (!mkdtemp(pattern.data())) throw std::runtime_error("fuzz: cannot create " + pattern);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return new std::string(pattern);
  }();
  return *dir;
}

std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("fuzz: cannot write " + path);
  return path;
}

std::string write_input_gzip(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  gzFile f = gzopen(path.c_str(), "wb1");
  if (!f) throw std::runtime_error("fuzz: cannot write " + path);
  const int written = size ? gzwrite(f, data, static_cast<unsigned>(size)) : 0;
  gzclose(f);
  if (written != static_cast<int>(size)) throw std::runtime_error("fuzz: gzwrite " + path);
  return path;
}

}  // namespace ska::fuzz
