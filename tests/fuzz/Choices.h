// The decisions of a random generator, read from a fuzzer's input first and from a PRNG once the
// input is used up. Reading the input byte by byte (instead of hashing it into one seed) is what
// lets libFuzzer's mutations work: flipping one byte changes one decision of the program or mask
// it generates, so coverage-guided search explores nearby programs instead of unrelated ones.
// The deterministic gtests construct it from a seed alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>

namespace flextile::fuzz {

class Choices {
 public:
  explicit Choices(uint64_t seed) : rng_(seed) {}
  // The PRNG that takes over after the input is seeded by the input, so an input is one program.
  Choices(const uint8_t* data, size_t size) : data_(data), size_(size), rng_(hash(data, size)) {}

  // A number in [0, n); 0 when n <= 1.
  int below(int n) {
    if (n <= 1) return 0;
    uint32_t r;
    if (pos_ < size_) {
      r = data_[pos_++];
      if (n > 256 && pos_ < size_) r = r << 8 | data_[pos_++];
    } else {
      r = uint32_t(rng_());
    }
    return int(r % uint32_t(n));
  }
  bool percent(int p) { return below(100) < p; }
  template <class T, size_t N>
  const T& of(const T (&values)[N]) {
    return values[size_t(below(int(N)))];
  }
  // For bulk data (input buffer contents): from the PRNG only, so that the input's bytes stay
  // decisions about structure.
  uint64_t bits() { return rng_(); }

 private:
  static uint64_t hash(const uint8_t* data, size_t size) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
    return h;
  }
  const uint8_t* data_ = nullptr;
  size_t size_ = 0, pos_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace flextile::fuzz
