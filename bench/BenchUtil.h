// What the attention benches share: argument lists, PyTorch's document cuts, random inputs.
#pragma once

#include <cctype>
#include <cmath>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/Reference.h"
#include "dsl/Tensor.h"

namespace flextile::bench {

// "a,b,c" -> {"a", "b", "c"} (empty items dropped); another separator for lists of configs.
inline std::vector<std::string> split(const std::string& s, char separator = ',') {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, separator);)
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

// A bf16 device tensor of standard normal values.
inline dsl::Tensor randomBf16(std::mt19937_64& rng, const dsl::Shape& shape) {
  std::normal_distribution<float> n(0.f, 1.f);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> host(static_cast<size_t>(count));
  for (float& x : host) x = n(rng);
  return dsl::Tensor::fromHost(host, dsl::DType::BF16, shape, dsl::MemorySpace::Device);
}

// --sinks: a logit per head uniform within 2 of log(keys), where a sink weighs about as much as
// a row's keys with random unit inputs.
inline std::vector<float> sinksNear(std::mt19937_64& rng, int64_t heads, int64_t keys) {
  std::uniform_real_distribution<float> near(std::log(float(keys)) - 2, std::log(float(keys)) + 2);
  std::vector<float> values;
  for (int64_t h = 0; h < heads; ++h) values.push_back(near(rng));
  return values;
}

}  // namespace flextile::bench
