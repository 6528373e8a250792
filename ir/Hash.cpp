#include "ir/Hash.h"

#include "ir/Printer.h"

namespace flextile::ir {

uint64_t hashText(std::string_view text, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  // FNV's low bits mix poorly; a splitmix64 finalizer spreads every input bit.
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return h;
}

uint64_t structuralHash(const Function& f) { return hashText(printFunction(f, PrintOptions{.locations = false})); }

}  // namespace flextile::ir
