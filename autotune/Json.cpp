#include "autotune/Json.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "ir/IR.h"

namespace flextile::autotune {

const Json* Json::find(const std::string& key) const {
  if (kind != Kind::Object) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

namespace {

void quote(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void print(std::string& out, const Json& j, int indent, int depth) {
  const std::string pad = indent ? "\n" + std::string(size_t(indent * (depth + 1)), ' ') : "";
  const std::string close = indent ? "\n" + std::string(size_t(indent * depth), ' ') : "";
  switch (j.kind) {
    case Json::Kind::Null: out += "null"; break;
    case Json::Kind::Bool: out += j.boolean ? "true" : "false"; break;
    case Json::Kind::Number: {
      char buf[32];
      if (std::isfinite(j.number) && j.number == std::floor(j.number) && std::abs(j.number) < 1e15)
        std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(j.number));
      else if (std::isfinite(j.number))
        std::snprintf(buf, sizeof buf, "%.9g", j.number);
      else
        std::snprintf(buf, sizeof buf, "null");
      out += buf;
      break;
    }
    case Json::Kind::String: quote(out, j.string); break;
    case Json::Kind::Array: {
      out += '[';
      for (size_t i = 0; i < j.array.size(); ++i) {
        out += (i ? "," : "") + pad;
        print(out, j.array[i], indent, depth + 1);
      }
      out += (j.array.empty() ? "" : close) + "]";
      break;
    }
    case Json::Kind::Object: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : j.object) {
        out += (first ? "" : ",") + pad;
        first = false;
        quote(out, k);
        out += indent ? ": " : ":";
        print(out, v, indent, depth + 1);
      }
      out += (j.object.empty() ? "" : close) + "}";
      break;
    }
  }
}

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}
  Json document() {
    Json j = value(0);
    space();
    if (pos_ != t_.size()) fail("trailing characters");
    return j;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw Error("JSON: " + what + " at byte " + std::to_string(pos_));
  }
  void space() {
    while (pos_ < t_.size() && (t_[pos_] == ' ' || t_[pos_] == '\n' || t_[pos_] == '\r' || t_[pos_] == '\t')) ++pos_;
  }
  bool eat(char c) {
    space();
    if (pos_ < t_.size() && t_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }
  bool word(std::string_view w) {
    if (t_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  std::string stringBody() {
    expect('"');
    std::string s;
    while (true) {
      if (pos_ >= t_.size()) fail("unterminated string");
      char c = t_[pos_++];
      if (c == '"') return s;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos_ >= t_.size()) fail("unterminated escape");
      char e = t_[pos_++];
      switch (e) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'u': {
          if (pos_ + 4 > t_.size()) fail("short \\u escape");
          unsigned v = unsigned(std::strtoul(std::string(t_.substr(pos_, 4)).c_str(), nullptr, 16));
          pos_ += 4;
          if (v < 0x80) s += char(v);
          else fail("non-ASCII \\u escapes are not used by FlexTile files");
          break;
        }
        default: fail("bad escape");
      }
    }
  }
  Json value(int depth) {
    if (depth > 64) fail("nesting too deep");
    space();
    if (pos_ >= t_.size()) fail("unexpected end");
    const char c = t_[pos_];
    Json j;
    if (c == '{') {
      ++pos_;
      j.kind = Json::Kind::Object;
      if (eat('}')) return j;
      do {
        space();
        std::string key = stringBody();
        expect(':');
        j.object[key] = value(depth + 1);
      } while (eat(','));
      expect('}');
    } else if (c == '[') {
      ++pos_;
      j.kind = Json::Kind::Array;
      if (eat(']')) return j;
      do j.array.push_back(value(depth + 1));
      while (eat(','));
      expect(']');
    } else if (c == '"') {
      j.kind = Json::Kind::String;
      j.string = stringBody();
    } else if (word("true")) {
      j.kind = Json::Kind::Bool;
      j.boolean = true;
    } else if (word("false")) {
      j.kind = Json::Kind::Bool;
    } else if (word("null")) {
    } else {
      const char* begin = t_.data() + pos_;
      char* end = nullptr;
      std::string copy(t_.substr(pos_, std::min<size_t>(64, t_.size() - pos_)));
      j.number = std::strtod(copy.c_str(), &end);
      if (end == copy.c_str()) fail("unexpected character");
      pos_ += size_t(end - copy.c_str());
      (void)begin;
      j.kind = Json::Kind::Number;
    }
    return j;
  }
  std::string_view t_;
  size_t pos_ = 0;
};

}  // namespace

std::string Json::dump(int indent) const {
  std::string out;
  print(out, *this, indent, 0);
  return out;
}

Json parseJson(std::string_view text) { return Parser(text).document(); }

}  // namespace flextile::autotune
