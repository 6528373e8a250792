// The recording fake driver (RecordingCuda.cpp) for one test process: a scratch folder made, and
// the driver pointed at it through the environment, before anything loads the driver — declare one
// RecordingDriverLog at namespace scope, ahead of any other static that may touch the runtime.
// The folder (and everything in it) goes when the process ends.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace flextile::testing {

class RecordingDriverLog {
 public:
  // `name` tags the folder; withCache also points the compile cache into it.
  explicit RecordingDriverLog(std::string_view name, bool withCache = false) {
    std::random_device rd;
    dir_ = std::filesystem::temp_directory_path() /
           ("flextile-" + std::string(name) + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(dir_);
    setenv("FLEXTILE_CUDA_LIBRARY", FLEXTILE_RECORDING_CUDA_LIBRARY, 1);
    setenv("FLEXTILE_FAKE_CUDA_LOG", (dir_ / "calls.log").c_str(), 1);
    if (withCache) setenv("FLEXTILE_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  }
  ~RecordingDriverLog() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RecordingDriverLog(const RecordingDriverLog&) = delete;
  RecordingDriverLog& operator=(const RecordingDriverLog&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

  // The calls logged since the last take() that start with `prefix` (all of them for ""); the
  // log starts over.
  std::vector<std::string> take(std::string_view prefix = "") const {
    const std::filesystem::path log = dir_ / "calls.log";
    std::vector<std::string> lines;
    std::ifstream in(log);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(prefix, 0) == 0) lines.push_back(line);
    in.close();
    std::error_code ec;
    std::filesystem::remove(log, ec);
    return lines;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace flextile::testing
