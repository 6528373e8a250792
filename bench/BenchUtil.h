// What the attention benches share: argument lists and PyTorch's document cuts.
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
