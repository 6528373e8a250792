// A tiny scanner for the bracketed attribute texts of layouts
// ("#ft.linear<...>", "#ft.shared<...>"): whitespace-insensitive tokens,
// integers and integer lists, with errors that name the column. Internal to ir/.
#pragma once

#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/IR.h"

namespace flextile::ir {

struct AttrScanner {
  std::string_view what;  // "layout", "shared layout": prefixes error messages
  std::string_view t;
  size_t p = 0;

  [[noreturn]] void fail(const std::string& message) const {
    throw Error(std::string(what) + ": " + message + " at column " + std::to_string(p) + " in '" + std::string(t) +
                "'");
  }
  void ws() {
    while (p < t.size() && std::isspace(static_cast<unsigned char>(t[p]))) ++p;
  }
  bool eat(std::string_view s) {
    ws();
    if (t.substr(p, s.size()) != s) return false;
    p += s.size();
    return true;
  }
  void expect(std::string_view s) {
    if (!eat(s)) fail("expected '" + std::string(s) + "'");
  }
  int64_t integer() {
    ws();
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(t.data() + p, t.data() + t.size(), v);
    if (ec != std::errc()) fail("expected an integer");
    p = size_t(ptr - t.data());
    return v;
  }
  std::vector<int64_t> ints() {
    std::vector<int64_t> v;
    expect("[");
    if (eat("]")) return v;
    do v.push_back(integer());
    while (eat(","));
    expect("]");
    return v;
  }
};

}  // namespace flextile::ir
