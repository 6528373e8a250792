// What the fuzz targets' gtests share: the saved inputs of a corpus or regression folder, and the
// seed count of the seeded runs (FLEXTILE_FUZZ_SEEDS overrides the test's own).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

namespace flextile::fuzz {

// The inputs in `dir`, sorted by name (README.md and other .md notes left out); none when the
// folder does not exist.
inline std::vector<std::filesystem::path> fuzzInputFiles(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> out;
  if (std::filesystem::exists(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.is_regular_file() && e.path().extension() != ".md") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::vector<uint8_t> readFuzzInput(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline int fuzzSeedCount(int fallback) {
  if (const char* s = std::getenv("FLEXTILE_FUZZ_SEEDS")) return std::max(1, std::atoi(s));
  return fallback;
}

}  // namespace flextile::fuzz
