// How often a pattern occurs in a compiler's text (PTX, IR): the codegen tests count instructions.
#pragma once

#include <iterator>
#include <regex>
#include <string>

namespace flextile::testing {

// The non-overlapping matches of the regular expression `re` (ECMAScript) in `text`.
inline int count(const std::string& text, const std::string& re) {
  const std::regex r(re);
  return int(std::distance(std::sregex_iterator(text.begin(), text.end(), r), std::sregex_iterator()));
}

}  // namespace flextile::testing
