#include "ir/Parser.h"

#include "ir/SharedLayout.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <unordered_map>

namespace flextile::ir {

namespace {

enum class Tok { Eof, Value, Symbol, Alias, InlineLayout, InlineShared, Label, Ident, Int, Float, String, Punct };

struct Token {
  Tok kind = Tok::Eof;
  std::string text;  // without the sigil for Value/Symbol/Alias/Label; unescaped for String
  int line = 0, col = 0;
};

std::string describeToken(const Token& t) {
  switch (t.kind) {
    case Tok::Eof: return "end of input";
    case Tok::Value: return "'%" + t.text + "'";
    case Tok::Symbol: return "'@" + t.text + "'";
    case Tok::Alias: return "'#" + t.text + "'";
    case Tok::Label: return "'^" + t.text + "'";
    case Tok::String: return "string \"" + t.text + "\"";
    case Tok::InlineLayout:
    case Tok::InlineShared: return "'" + t.text.substr(0, 20) + "...'";
    default: return "'" + t.text + "'";
  }
}

bool isNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

class Lexer {
 public:
  Lexer(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  std::vector<Token> run() {
    std::vector<Token> out;
    for (;;) {
      skipSpace();
      Token t;
      t.line = line_;
      t.col = col();
      if (p_ >= s_.size()) {
        out.push_back(t);
        return out;
      }
      lexOne(t);
      out.push_back(std::move(t));
    }
  }

 private:
  int col() const { return int(p_ - lineStart_) + 1; }

  [[noreturn]] void fail(const std::string& what) {
    throw Error(std::string(source_) + ":" + std::to_string(line_) + ":" + std::to_string(col()) + ": " + what);
  }

  void skipSpace() {
    while (p_ < s_.size()) {
      char c = s_[p_];
      if (c == '\n') {
        ++line_;
        lineStart_ = ++p_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++p_;
      } else if (c == '/' && p_ + 1 < s_.size() && s_[p_ + 1] == '/') {
        while (p_ < s_.size() && s_[p_] != '\n') ++p_;
      } else {
        return;
      }
    }
  }

  std::string name() {
    size_t b = p_;
    while (p_ < s_.size() && isNameChar(s_[p_])) ++p_;
    return std::string(s_.substr(b, p_ - b));
  }

  std::string string() {
    ++p_;  // opening quote
    std::string out;
    for (;;) {
      if (p_ >= s_.size() || s_[p_] == '\n') fail("unterminated string");
      char c = s_[p_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= s_.size()) fail("unterminated string");
      char e = s_[p_++];
      if (e == 'n') out += '\n';
      else if (e == 't') out += '\t';
      else if (e == '"' || e == '\\') out += e;
      else if (e == 'x' && p_ + 2 <= s_.size() && std::isxdigit(static_cast<unsigned char>(s_[p_])) &&
               std::isxdigit(static_cast<unsigned char>(s_[p_ + 1]))) {
        out += char(std::stoi(std::string(s_.substr(p_, 2)), nullptr, 16));
        p_ += 2;
      } else {
        fail(std::string("unknown escape '\\") + e + "' in string");
      }
    }
  }

  void lexOne(Token& t) {
    char c = s_[p_];
    auto sigil = [&](Tok k, std::string_view what) {
      ++p_;
      t.kind = k;
      t.text = name();
      if (t.text.empty()) fail("expected " + std::string(what) + " after '" + c + "'");
    };
    if (c == '%') return sigil(Tok::Value, "a value name");
    if (c == '^') return sigil(Tok::Label, "a block label");
    if (c == '@') {
      if (p_ + 1 < s_.size() && s_[p_ + 1] == '"') {
        ++p_;
        t.kind = Tok::Symbol;
        t.text = string();
        return;
      }
      return sigil(Tok::Symbol, "a function name");
    }
    if (c == '#') {
      size_t b = p_++;
      while (p_ < s_.size() && (isNameChar(s_[p_]) || s_[p_] == '.')) ++p_;
      std::string word(s_.substr(b + 1, p_ - b - 1));
      if ((word == "ft.linear" || word == "ft.shared") && p_ < s_.size() && s_[p_] == '<') {
        int depth = 0;
        do {
          if (s_[p_] == '<') ++depth;
          if (s_[p_] == '>') --depth;
          if (s_[p_] == '\n') fail("unterminated layout");
          ++p_;
        } while (depth > 0 && p_ < s_.size());
        if (depth) fail("unterminated layout");
        t.kind = word == "ft.linear" ? Tok::InlineLayout : Tok::InlineShared;
        t.text = std::string(s_.substr(b, p_ - b));
        return;
      }
      if (word.empty()) fail("expected a layout alias name after '#'");
      t.kind = Tok::Alias;
      t.text = word;
      return;
    }
    if (c == '"') {
      t.kind = Tok::String;
      t.text = string();
      return;
    }
    bool neg = c == '-' && p_ + 1 < s_.size();
    if (std::isdigit(static_cast<unsigned char>(c)) || (neg && std::isdigit(static_cast<unsigned char>(s_[p_ + 1])))) {
      size_t b = p_;
      if (neg) ++p_;
      bool isFloat = false;
      while (p_ < s_.size()) {
        char d = s_[p_];
        if (std::isdigit(static_cast<unsigned char>(d))) {
          ++p_;
        } else if (d == '.' || d == 'e' || d == 'E') {
          isFloat = true;
          ++p_;
          if ((d == 'e' || d == 'E') && p_ < s_.size() && (s_[p_] == '+' || s_[p_] == '-')) ++p_;
        } else {
          break;
        }
      }
      t.kind = isFloat ? Tok::Float : Tok::Int;
      t.text = std::string(s_.substr(b, p_ - b));
      return;
    }
    if (neg && (s_.substr(p_, 4) == "-inf" || s_.substr(p_, 4) == "-nan")) {
      t.kind = Tok::Float;
      t.text = std::string(s_.substr(p_, 4));
      p_ += 4;
      return;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      t.kind = Tok::Ident;
      t.text = name();
      return;
    }
    if (std::string_view("(){}[]<>,:=").find(c) != std::string_view::npos) {
      t.kind = Tok::Punct;
      t.text = std::string(1, c);
      ++p_;
      return;
    }
    fail(std::string("unexpected character '") + c + "'");
  }

  std::string_view s_;
  std::string_view source_;
  size_t p_ = 0, lineStart_ = 0;
  int line_ = 1;
};

bool isNumber(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : source_(source), toks_(Lexer(text, source).run()) {}

  Module module() {
    Module m;
    while (!at(Tok::Eof)) {
      if (at(Tok::Alias)) {
        aliasDefinition();
      } else if (atIdent("func")) {
        m.functions.push_back(function());
        if (m.lookup(m.functions.back()->name()) != m.functions.back().get())
          failAt(lastFuncName_, "redefinition of function @" + m.functions.back()->name());
      } else {
        fail("expected 'func' or a layout alias definition");
      }
    }
    return m;
  }

 private:
  using Scope = std::unordered_map<std::string, Value*>;

  // ---- tokens ----
  const Token& tok() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  bool at(Tok k) const { return tok().kind == k; }
  bool atPunct(char c) const { return at(Tok::Punct) && tok().text[0] == c; }
  bool atIdent(std::string_view w) const { return at(Tok::Ident) && tok().text == w; }
  Token take() {
    Token t = tok();
    if (pos_ + 1 < toks_.size()) ++pos_;
    return t;
  }
  bool eatPunct(char c) {
    if (!atPunct(c)) return false;
    take();
    return true;
  }

  [[noreturn]] void failAt(const Token& t, const std::string& what) const {
    throw Error(std::string(source_) + ":" + std::to_string(t.line) + ":" + std::to_string(t.col) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& expected) const {
    failAt(tok(), expected + ", got " + describeToken(tok()));
  }
  void expectPunct(char c) {
    if (!eatPunct(c)) fail(std::string("expected '") + c + "'");
  }
  Token expect(Tok k, std::string_view what) {
    if (!at(k)) fail("expected " + std::string(what));
    return take();
  }
  void expectIdent(std::string_view w) {
    if (!atIdent(w)) fail("expected '" + std::string(w) + "'");
    take();
  }

  // ---- layouts and types ----
  LayoutPtr layoutText(const Token& t) {
    try {
      return makeLayout(Layout::parse(t.text));
    } catch (const Error& e) {
      failAt(t, e.what());
    }
  }

  void aliasDefinition() {
    Token name = take();
    expectPunct('=');
    Token body = expect(Tok::InlineLayout, "a layout '#ft.linear<...>'");
    if (aliases_.count(name.text)) failAt(name, "redefinition of layout alias #" + name.text);
    aliases_[name.text] = layoutText(body);
  }

  // The dimensions after a tile type's '[', through its ']'.
  Shape tileDims() {
    Shape shape;
    do {
      Token dim = expect(Tok::Int, "a tile dimension");
      int64_t v = integer(dim);
      if (v <= 0) failAt(dim, "tile dimension " + dim.text + " is not positive");
      shape.push_back(v);
    } while (eatPunct(','));
    expectPunct(']');
    return shape;
  }

  // smem<SLOTS x DTYPE[DIMS], #ft.shared<...>>
  Type sharedBufferType() {
    expectPunct('<');
    Token slots = expect(Tok::Int, "a slot count");
    const int64_t n = integer(slots);
    if (n < 1 || n > 64) failAt(slots, "a shared buffer has 1 to 64 slots, got " + slots.text);
    expectIdent("x");
    Token et = expect(Tok::Ident, "an element dtype");
    auto d = parseDType(et.text);
    if (!d || *d == DType::Ptr) failAt(et, "a shared buffer holds numbers, not '" + et.text + "'");
    expectPunct('[');
    Shape shape = tileDims();
    expectPunct(',');
    Token lt = expect(Tok::InlineShared, "a shared layout '#ft.shared<...>'");
    std::shared_ptr<const SharedLayout> layout;
    try {
      layout = std::make_shared<const SharedLayout>(SharedLayout::parse(lt.text));
    } catch (const Error& e) {
      failAt(lt, e.what());
    }
    if (layout->shape() != shape)
      failAt(lt, "the shared layout's shape " + shapeString(layout->shape()) + " is not the tile's " + shapeString(shape));
    if (layout->elemBytes() != byteWidth(*d))
      failAt(lt, "the shared layout stores " + std::to_string(layout->elemBytes()) + "-byte elements, " + et.text +
                     " has " + std::to_string(byteWidth(*d)));
    expectPunct('>');
    return Type::sharedBuffer(*d, n, std::move(layout));
  }

  Type type() {
    Token t = expect(Tok::Ident, "a type");
    Type result;
    if (t.text == "smem") return sharedBufferType();
    if (t.text == "ptr") {
      expectPunct('<');
      Token pt = expect(Tok::Ident, "a pointee dtype");
      auto d = parseDType(pt.text);
      if (!d || *d == DType::Ptr) failAt(pt, "unknown pointee dtype '" + pt.text + "'");
      expectPunct('>');
      result = Type::pointer(*d);
    } else {
      auto d = parseDType(t.text);
      if (!d) failAt(t, "expected a type, got '" + t.text + "'");
      result = Type(*d);
    }
    if (eatPunct('[')) {
      Shape shape = tileDims();
      result = result.isPointer() ? Type::pointer(result.pointee(), shape) : result.withShape(shape);
    }
    if (at(Tok::Alias)) {
      Token a = take();
      auto it = aliases_.find(a.text);
      if (it == aliases_.end()) failAt(a, "undefined layout alias #" + a.text);
      result = result.withLayout(it->second);
    } else if (at(Tok::InlineLayout)) {
      result = result.withLayout(layoutText(take()));
    }
    return result;
  }

  int64_t integer(const Token& t) const {
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc() || ptr != t.text.data() + t.text.size()) failAt(t, "integer " + t.text + " is out of range");
    return v;
  }

  // ---- attributes ----
  Attr attrValue() {
    if (at(Tok::Int)) return integer(take());
    if (at(Tok::Float) || atIdent("inf") || atIdent("nan")) {
      Token t = take();
      double v = 0;
      auto [ptr, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      if (ec != std::errc() || ptr != t.text.data() + t.text.size()) failAt(t, "malformed float " + t.text);
      return v;
    }
    if (at(Tok::String)) return take().text;
    if (eatPunct('[')) {
      std::vector<int64_t> v;
      if (eatPunct(']')) return v;
      do v.push_back(integer(expect(Tok::Int, "an integer")));
      while (eatPunct(','));
      expectPunct(']');
      return v;
    }
    fail("expected an attribute value (integer, float, string or [integers])");
  }

  Attrs attrDict() {
    Attrs attrs;
    expectPunct('{');
    if (eatPunct('}')) return attrs;
    do {
      if (!at(Tok::Ident) && !at(Tok::String)) fail("expected an attribute name");
      Token key = take();
      expectPunct('=');
      if (attrs.count(key.text)) failAt(key, "duplicate attribute '" + key.text + "'");
      attrs[key.text] = attrValue();
    } while (eatPunct(','));
    expectPunct('}');
    return attrs;
  }

  // ---- values ----
  Value* lookup(const Token& t) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (auto f = it->find(t.text); f != it->end()) return f->second;
    failAt(t, "use of undefined value %" + t.text);
  }

  void define(const Token& t, Value* v) {
    for (const auto& s : scopes_)
      if (s.count(t.text)) failAt(t, "redefinition of value %" + t.text);
    scopes_.back()[t.text] = v;
    if (!isNumber(t.text)) v->setNameHint(t.text);
  }

  // ---- functions, blocks, ops ----
  std::unique_ptr<Function> function() {
    take();  // func
    lastFuncName_ = expect(Tok::Symbol, "a function name '@name'");
    auto f = std::make_unique<Function>(lastFuncName_.text);
    func_ = f.get();
    scopes_.assign(1, {});
    expectPunct('(');
    if (!eatPunct(')')) {
      do {
        Token name = expect(Tok::Value, "a parameter '%name'");
        expectPunct(':');
        Value* p = f->addParam(type());
        define(name, p);
      } while (eatPunct(','));
      expectPunct(')');
    }
    if (atIdent("attributes")) {
      take();
      f->attrs() = attrDict();
    }
    expectPunct('{');
    ops(f->body());
    expectPunct('}');
    scopes_.clear();
    return f;
  }

  void ops(Block& block) {
    while (!atPunct('}')) {
      if (at(Tok::Eof)) fail("expected '}'");
      op(block);
    }
  }

  void op(Block& block) {
    std::vector<Token> resultNames;
    if (at(Tok::Value)) {
      do resultNames.push_back(expect(Tok::Value, "a result name"));
      while (eatPunct(','));
      expectPunct('=');
    }
    Token nameTok = expect(Tok::Ident, "an op name");
    auto kind = parseOpKind(nameTok.text);
    if (!kind) failAt(nameTok, "unknown op '" + nameTok.text + "'");
    const OpInfo& info = opInfo(*kind);

    // Operands start on the op's own line: that keeps "store %p, %v" followed by
    // a line "%7 = ..." unambiguous without a terminator character.
    std::vector<Value*> operands;
    if (at(Tok::Value) && tok().line == nameTok.line) {
      do operands.push_back(lookup(expect(Tok::Value, "an operand")));
      while (eatPunct(','));
    }
    Attrs attrs;
    if (atPunct('{') && peek().kind != Tok::Label) attrs = attrDict();
    std::vector<Type> types;
    if (eatPunct(':')) {
      do types.push_back(type());
      while (eatPunct(','));
    }
    auto count = [](size_t n, std::string_view what) {
      return std::to_string(n) + " " + std::string(what) + (n == 1 ? "" : "s");
    };
    if (info.numOperands >= 0 && operands.size() != size_t(info.numOperands))
      failAt(nameTok, "op '" + nameTok.text + "' expects " + count(size_t(info.numOperands), "operand") + ", got " +
                          std::to_string(operands.size()));
    if (info.numResults >= 0 && resultNames.size() != size_t(info.numResults))
      failAt(nameTok, "op '" + nameTok.text + "' has " + count(size_t(info.numResults), "result") + ", got " +
                          std::to_string(resultNames.size()) + " result names");
    if (types.size() != resultNames.size())
      failAt(nameTok, "op '" + nameTok.text + "' names " + count(resultNames.size(), "result") + " but lists " +
                          count(types.size(), "result type"));

    Op* op = block.append(func_->createOp(*kind, std::move(operands), std::move(types), std::move(attrs)));
    if (info.traits & kHasRegion) {
      if (!atPunct('{')) fail("expected a region '{ ^bb(...): ... }' for op '" + nameTok.text + "'");
      region(*op->addRegion());
    } else if (atPunct('{')) {
      fail("op '" + nameTok.text + "' takes no region; expected the next op");
    }
    for (size_t i = 0; i < resultNames.size(); ++i) define(resultNames[i], op->result(i));
    if (atIdent("loc")) {
      take();
      expectPunct('(');
      Location loc;
      loc.file = expect(Tok::String, "a file name string").text;
      expectPunct(':');
      Token line = expect(Tok::Int, "a line number");
      int64_t n = integer(line);
      // Location::line is an int; a wider number would silently become another line.
      if (n < 0 || n > INT32_MAX) failAt(line, "line number " + line.text + " is out of range");
      loc.line = int(n);
      expectPunct(')');
      op->setLoc(std::move(loc));
    }
  }

  void region(Block& block) {
    if (scopes_.size() > size_t(kMaxRegionDepth))  // scopes_: the function's, then one per open region
      fail("regions nested more than " + std::to_string(kMaxRegionDepth) + " deep");
    expectPunct('{');
    expect(Tok::Label, "a block label '^bb'");
    scopes_.emplace_back();
    expectPunct('(');
    if (!eatPunct(')')) {
      do {
        Token name = expect(Tok::Value, "a block argument '%name'");
        expectPunct(':');
        define(name, block.addArg(type()));
      } while (eatPunct(','));
      expectPunct(')');
    }
    expectPunct(':');
    ops(block);
    expectPunct('}');
    scopes_.pop_back();
  }

  std::string_view source_;
  std::vector<Token> toks_;
  size_t pos_ = 0;
  std::unordered_map<std::string, LayoutPtr> aliases_;
  Function* func_ = nullptr;
  std::vector<Scope> scopes_;
  Token lastFuncName_;
};

}  // namespace

Module parseModule(std::string_view text, std::string_view sourceName) { return Parser(text, sourceName).module(); }

std::unique_ptr<Function> parseFunction(std::string_view text, std::string_view sourceName) {
  Module m = parseModule(text, sourceName);
  if (m.functions.size() != 1)
    throw Error(std::string(sourceName) + ": expected exactly one function, found " +
                std::to_string(m.functions.size()));
  return std::move(m.functions.front());
}

}  // namespace flextile::ir
