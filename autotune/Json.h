// A small JSON value with a strict parser and a stable printer: enough for the
// autotune cache file (objects, strings, numbers, booleans, null, arrays).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace flextile::autotune {

struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;  // printed in key order: files diff cleanly

  static Json num(double v) { Json j; j.kind = Kind::Number; j.number = v; return j; }
  static Json str(std::string v) { Json j; j.kind = Kind::String; j.string = std::move(v); return j; }
  static Json obj() { Json j; j.kind = Kind::Object; return j; }

  bool isObject() const { return kind == Kind::Object; }
  // The member `key` of an object, or nullptr.
  const Json* find(const std::string& key) const;

  std::string dump(int indent = 0) const;
};

// Throws flextile::Error with the byte offset of the first problem.
Json parseJson(std::string_view text);

}  // namespace flextile::autotune
