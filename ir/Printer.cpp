#include "ir/Printer.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <unordered_map>

// GCC 12 warns falsely about "literal" + std::string (GCC bug 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

namespace flextile::ir {

namespace {

bool isIdentifier(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

std::string quoted(std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\x";
          out += kHex[(c >> 4) & 0xf];
          out += kHex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string floatString(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back exactly
  std::string s(buf, res.ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string symbolName(std::string_view name) { return "@" + (isIdentifier(name) ? std::string(name) : quoted(name)); }

// Prints one or more functions sharing one table of layout aliases.
class Printer {
 public:
  explicit Printer(const PrintOptions& o) : opts_(o) {}

  void collectLayouts(const Function& f) {
    for (Value* p : f.params()) noteLayout(p->type());
    f.walk([&](const Op& op) {
      for (Value* r : op.results()) noteLayout(r->type());
      for (const auto& region : op.regions())
        for (Value* a : region->args()) noteLayout(a->type());
    });
  }

  std::string aliasDeclarations() const {
    std::string out;
    for (size_t i = 0; i < aliasTexts_.size(); ++i) out += "#L" + std::to_string(i) + " = " + aliasTexts_[i] + "\n";
    return out;
  }

  std::string function(const Function& f) {
    names_.clear();
    next_ = 0;
    std::unordered_map<std::string, int> hintCount;
    for (Value* p : f.params()) ++hintCount[p->nameHint()];
    std::string out = "func " + symbolName(f.name()) + "(";
    for (size_t i = 0; i < f.params().size(); ++i) {
      Value* p = f.params()[i];
      bool named = isIdentifier(p->nameHint()) && hintCount[p->nameHint()] == 1;
      names_[p] = named ? "%" + p->nameHint() : "%" + std::to_string(next_++);
      out += (i ? ", " : "") + names_[p] + ": " + type(p->type());
    }
    out += ")";
    if (!f.attrs().empty()) out += " attributes " + attrDict(f.attrs());
    out += " {\n";
    ops(f.body(), 2, out);
    return out + "}\n";
  }

  std::string type(const Type& t) {
    std::string s = t.str();
    if (t.hasLayout()) s += "#L" + std::to_string(noteLayout(t));
    return s;
  }

 private:
  int noteLayout(const Type& t) {
    if (!t.hasLayout()) return -1;
    std::string text = t.layout()->str();
    auto [it, inserted] = aliasIndex_.emplace(text, int(aliasTexts_.size()));
    if (inserted) aliasTexts_.push_back(text);
    return it->second;
  }

  std::string define(const Value* v) { return names_[v] = "%" + std::to_string(next_++); }

  std::string use(const Value* v) const {
    if (!v) return "%<null>";
    auto it = names_.find(v);
    // Only invalid IR (a use before its definition) gets here; print something
    // the parser rejects rather than crash, since error messages print IR too.
    return it != names_.end() ? it->second : "%<undefined " + std::to_string(v->id()) + ">";
  }

  static std::string attrDict(const Attrs& attrs) {
    std::string s = "{";
    bool first = true;
    for (const auto& [k, v] : attrs) {
      s += (first ? "" : ", ") + (isIdentifier(k) ? k : quoted(k)) + " = " + printAttr(v);
      first = false;
    }
    return s + "}";
  }

  void ops(const Block& b, int indent, std::string& out) {
    for (const auto& op : b.ops()) this->op(*op, indent, out);
  }

  void op(const Op& op, int indent, std::string& out) {
    std::string pad(size_t(indent), ' ');
    out += pad;
    for (size_t i = 0; i < op.numResults(); ++i) out += (i ? ", " : "") + define(op.result(i));
    if (op.numResults()) out += " = ";
    out += op.name();
    for (size_t i = 0; i < op.numOperands(); ++i) out += (i ? ", " : " ") + use(op.operand(i));
    if (!op.attrs().empty()) out += " " + attrDict(op.attrs());
    if (op.numResults()) {
      out += " :";
      for (size_t i = 0; i < op.numResults(); ++i) out += (i ? ", " : " ") + type(op.result(i)->type());
    }
    for (const auto& region : op.regions()) {
      out += " {\n" + pad + "^bb(";
      for (size_t i = 0; i < region->args().size(); ++i) {
        Value* a = region->arg(i);
        out += (i ? ", " : "") + define(a) + ": " + type(a->type());
      }
      out += "):\n";
      ops(*region, indent + 2, out);
      out += pad + "}";
    }
    if (opts_.locations && op.loc().known())
      out += " loc(" + quoted(op.loc().file) + ":" + std::to_string(op.loc().line) + ")";
    out += "\n";
  }

  PrintOptions opts_;
  std::unordered_map<std::string, int> aliasIndex_;
  std::vector<std::string> aliasTexts_;
  std::unordered_map<const Value*, std::string> names_;
  int next_ = 0;
};

}  // namespace

std::string printAttr(const Attr& a) {
  struct V {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return floatString(v); }
    std::string operator()(const std::string& v) const { return quoted(v); }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
  };
  return std::visit(V{}, a);
}

std::string typeString(const Type& t) { return t.hasLayout() ? t.str() + t.layout()->str() : t.str(); }

std::string printFunction(const Function& f, const PrintOptions& options) {
  Printer p(options);
  p.collectLayouts(f);
  std::string aliases = p.aliasDeclarations();
  std::string body = p.function(f);
  return aliases.empty() ? body : aliases + "\n" + body;
}

std::string printModule(const Module& m, const PrintOptions& options) {
  Printer p(options);
  for (const auto& f : m.functions) p.collectLayouts(*f);
  std::string out = p.aliasDeclarations();
  for (const auto& f : m.functions) out += (out.empty() ? "" : "\n") + p.function(*f);
  return out;
}

}  // namespace flextile::ir
