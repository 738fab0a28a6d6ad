// A folder of a test's own under the system's temporary folder, removed with it (unique per
// process and object, so tests in one process never share one).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

namespace moeblaze::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "moeblaze_test") {
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(reinterpret_cast<uintptr_t>(this)));
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace moeblaze::testing
