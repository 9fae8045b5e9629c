// Shared by the libFuzzer targets: the input as a file (most readers take a path) and the rule
// that our typed exceptions are expected outcomes; anything else escaping is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace ska::fuzz {

// A private folder for this process's input files (under $TMPDIR or /tmp), created once.
const std::string& scratch_dir();

// Writes `size` bytes to scratch_dir()/name (replacing it) and returns the path.
std::string write_input(const std::string& name, const uint8_t* data, size_t size);

// The same, gzip-compressed (so a target can reach a gzip reader's decoded-data paths).
std::string write_input_gzip(const std::string& name, const uint8_t* data, size_t size);

// Runs `read`; a ska::Error (the readers' IOError, ConfigError, ...) is an accepted answer to a
// malformed input. Other exceptions propagate, so libFuzzer reports them as crashes.
template <typename Fn>
int expect_ska_errors(Fn&& read) {
  try {
    read();
  } catch (const ska::Error&) {
  }
  return 0;
}

}  // namespace ska::fuzz
