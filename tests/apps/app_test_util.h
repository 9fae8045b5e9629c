// What the tests of the built commands share: a scratch folder per test process, reading a
// file whole, and running a command with its stdout and stderr captured.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "support/test_util.h"

namespace ska::test {

// <temp>/ska_test_<tag>_<pid>, created; removed when the test process exits.
inline std::string app_scratch_dir(const std::string& tag) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("ska_test_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  remove_at_exit(dir.string());
  return dir.string();
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

struct RunResult {
  int exit_code;
  std::string out, err;
};

// Runs a built command with `args` (shell words), capturing stdout and stderr.
inline RunResult run_command(const std::string& exe, const std::string& args) {
  const std::string dir = app_scratch_dir("commands");
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const int status = std::system((exe + " " + args + " >" + out + " 2>" + err).c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(out), read_text(err)};
}

}  // namespace ska::test
