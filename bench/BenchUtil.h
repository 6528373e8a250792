// What the attention benches share: argument lists, exact allowed-pair counts and PyTorch's
// document cuts.
#pragma once

#include <cctype>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/Reference.h"

namespace flextile::bench {

// "a,b,c" -> {"a", "b", "c"} (empty items dropped).
inline std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Allowed pairs of one (b, h) summed over the mask's batches (times the broadcast factor): full
// blocks count their in-range pairs, partial blocks ask the reference mask pair by pair.
inline double allowedPairs(const attention::BlockMask& m, const attention::RefMaskFn& ref, int64_t B, int64_t Hq) {
  double total = 0;
  for (int64_t b = 0; b < m.batch(); ++b)
    for (int64_t h = 0; h < m.heads(); ++h)
      for (int64_t r = 0; r < m.numQBlocks(); ++r) {
        const int64_t q0 = r * m.qBlockSize(), q1 = std::min(q0 + m.qBlockSize(), m.qLen());
        for (int32_t c : m.fullKvBlocks(b, h, r)) {
          const int64_t k0 = c * m.kvBlockSize(), k1 = std::min(k0 + m.kvBlockSize(), m.kvLen());
          total += double(q1 - q0) * double(k1 - k0);
        }
        for (int32_t c : m.partialKvBlocks(b, h, r)) {
          const int64_t k0 = c * m.kvBlockSize(), k1 = std::min(k0 + m.kvBlockSize(), m.kvLen());
          for (int64_t i = q0; i < q1; ++i)
            for (int64_t j = k0; j < k1; ++j) total += ref(b, h, i, j) ? 1 : 0;
        }
      }
  return total * double(B / m.batch()) * double(Hq / m.heads());
}

// {"offsets": [[0, 17, ..., N], [...]]}: the integers of each inner list (bench/torch_document_cuts.py).
inline std::vector<std::vector<int64_t>> readOffsets(const std::string& path, const std::string& who) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (!f) throw Error(who + ": cannot read " + path);
  std::string text;
  for (int c; (c = std::fgetc(f)) != EOF;) text += char(c);
  std::fclose(f);
  std::vector<std::vector<int64_t>> out;
  int depth = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '[' && ++depth == 2) out.emplace_back();
    else if (c == ']') --depth;
    else if (depth == 2 && std::isdigit(static_cast<unsigned char>(c))) {
      size_t end = i;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      out.back().push_back(std::stoll(text.substr(i, end - i)));
      i = end - 1;
    }
  }
  if (out.empty()) throw Error(who + ": no offset lists in " + path);
  return out;
}

}  // namespace flextile::bench
