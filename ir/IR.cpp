#include "ir/IR.h"

#include <algorithm>
#include <sstream>
#include <unordered_map>

namespace flextile {

const char* errorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "invalid argument";
    case ErrorKind::UnknownName: return "unknown name";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::ResourceLimit: return "resource limit";
    case ErrorKind::Compile: return "compile";
    case ErrorKind::Io: return "i/o";
    case ErrorKind::Internal: return "internal";
  }
  return "unknown";
}

}  // namespace flextile

namespace flextile::ir {

namespace {
constexpr OpInfo kOpInfos[] = {
#define FT_OP(Enum, name, nops, nres, traits) {OpKind::Enum, name, nops, nres, traits},
#include "ir/Ops.def"
};
}  // namespace

const OpInfo& opInfo(OpKind k) { return kOpInfos[size_t(k)]; }

std::optional<OpKind> parseOpKind(std::string_view name) {
  for (const auto& i : kOpInfos)
    if (i.name == name) return i.kind;
  return std::nullopt;
}

std::string Location::str() const { return known() ? file + ":" + std::to_string(line) : ""; }

std::string attrString(const Attr& a) {
  struct V {
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const {
      std::ostringstream os;
      os.precision(17);
      os << v;
      std::string s = os.str();
      // Keep a float a float when printed back: "1" -> "1.0".
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::string& v) const { return "\"" + v + "\""; }
    std::string operator()(const std::vector<int64_t>& v) const {
      std::string s = "[";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    }
  };
  return std::visit(V{}, a);
}

// ---- Block -----------------------------------------------------------------

Op* Block::terminator() const {
  if (ops_.empty()) return nullptr;
  Op* last = ops_.back().get();
  return last->hasTrait(kTerminator) ? last : nullptr;
}

Value* Block::addArg(Type t, std::string nameHint) {
  Value* v = func_->newValue(std::move(t));
  v->block_ = this;
  v->index_ = int(args_.size());
  v->name_ = std::move(nameHint);
  args_.push_back(v);
  return v;
}

Op* Block::insert(OpList::iterator pos, std::unique_ptr<Op> op) {
  op->parent_ = this;
  Op* raw = op.get();
  ops_.insert(pos, std::move(op));
  return raw;
}

Block::OpList::iterator Block::find(const Op* op) {
  return std::find_if(ops_.begin(), ops_.end(), [&](const auto& p) { return p.get() == op; });
}

void Block::erase(const Op* op) {
  auto it = find(op);
  if (it != ops_.end()) ops_.erase(it);
}

// ---- Op --------------------------------------------------------------------

int64_t Op::intAttr(const std::string& k) const {
  auto it = attrs_.find(k);
  if (it == attrs_.end() || !std::holds_alternative<int64_t>(it->second))
    throw Error(describe() + ": missing integer attribute '" + k + "'");
  return std::get<int64_t>(it->second);
}

double Op::floatAttr(const std::string& k) const {
  auto it = attrs_.find(k);
  if (it != attrs_.end()) {
    if (auto* d = std::get_if<double>(&it->second)) return *d;
    if (auto* i = std::get_if<int64_t>(&it->second)) return double(*i);
  }
  throw Error(describe() + ": missing numeric attribute '" + k + "'");
}

const std::string& Op::strAttr(const std::string& k) const {
  auto it = attrs_.find(k);
  if (it == attrs_.end() || !std::holds_alternative<std::string>(it->second))
    throw Error(describe() + ": missing string attribute '" + k + "'");
  return std::get<std::string>(it->second);
}

const std::vector<int64_t>& Op::intsAttr(const std::string& k) const {
  auto it = attrs_.find(k);
  if (it == attrs_.end() || !std::holds_alternative<std::vector<int64_t>>(it->second))
    throw Error(describe() + ": missing integer-list attribute '" + k + "'");
  return std::get<std::vector<int64_t>>(it->second);
}

Attrs withRoleOf(const Op& at, Attrs attrs) {
  if (auto role = at.attrs().find("ws"); role != at.attrs().end()) attrs.insert(*role);
  return attrs;
}

Block* Op::addRegion() {
  regions_.push_back(std::make_unique<Block>());
  Block* b = regions_.back().get();
  b->parent_ = this;
  b->func_ = func_;
  return b;
}

std::string Op::describe() const {
  std::string s = "op '" + std::string(name()) + "'";
  if (loc_.known()) s += " (" + loc_.str() + ")";
  return s;
}

// ---- Function --------------------------------------------------------------

Function::Function(std::string name) : name_(std::move(name)) { body_.func_ = this; }

int64_t Function::intAttrOr(const std::string& k, int64_t dflt) const {
  auto it = attrs_.find(k);
  if (it != attrs_.end())
    if (auto* i = std::get_if<int64_t>(&it->second)) return *i;
  return dflt;
}

Value* Function::newValue(Type t) {
  auto v = std::make_unique<Value>();
  v->id_ = int(values_.size());
  v->type_ = std::move(t);
  values_.push_back(std::move(v));
  return values_.back().get();
}

std::unique_ptr<Op> Function::createOp(OpKind kind, std::vector<Value*> operands, std::vector<Type> resultTypes,
                                       Attrs attrs, Location loc) {
  auto op = std::make_unique<Op>();
  op->kind_ = kind;
  op->func_ = this;
  op->operands_ = std::move(operands);
  op->attrs_ = std::move(attrs);
  op->loc_ = std::move(loc);
  for (size_t i = 0; i < resultTypes.size(); ++i) {
    Value* v = newValue(std::move(resultTypes[i]));
    v->def_ = op.get();
    v->index_ = int(i);
    op->results_.push_back(v);
  }
  return op;
}

Value* Op::addResult(Type t) {
  Value* v = func_->newValue(std::move(t));
  v->def_ = this;
  v->index_ = int(results_.size());
  results_.push_back(v);
  return v;
}

namespace {
template <class F>
void walkBlock(Block& b, const F& f) {
  for (auto& op : b.ops()) {
    f(*op);
    for (auto& r : op->regions()) walkBlock(*r, f);
  }
}
template <class F>
void walkBlockConst(const Block& b, const F& f) {
  for (const auto& op : b.ops()) {
    f(static_cast<const Op&>(*op));
    for (const auto& r : op->regions()) walkBlockConst(*r, f);
  }
}
}  // namespace

void Function::walk(const std::function<void(Op&)>& f) { walkBlock(body_, f); }
void Function::walk(const std::function<void(const Op&)>& f) const { walkBlockConst(body_, f); }

bool Function::hasUses(const Value* v) const {
  bool used = false;
  walk([&](const Op& op) {
    for (const Value* o : op.operands()) used = used || o == v;
  });
  return used;
}

void Function::replaceAllUsesWith(Value* from, Value* to) {
  walk([&](Op& op) {
    for (size_t i = 0; i < op.numOperands(); ++i)
      if (op.operand(i) == from) op.setOperand(i, to);
  });
}

std::unique_ptr<Function> Function::clone() const {
  auto f = std::make_unique<Function>(name_);
  f->attrs_ = attrs_;
  // Recreate every value with the same id so printed forms match.
  std::unordered_map<const Value*, Value*> map;
  for (const auto& v : values_) {
    Value* nv = f->newValue(v->type_);
    nv->name_ = v->name_;
    map[v.get()] = nv;
  }
  std::function<void(const Block&, Block&)> copyBlock = [&](const Block& from, Block& to) {
    for (Value* a : from.args()) {
      Value* na = map.at(a);
      na->block_ = &to;
      na->index_ = a->index_;
      to.args_.push_back(na);
    }
    for (const auto& op : from.ops()) {
      auto nop = std::make_unique<Op>();
      nop->kind_ = op->kind_;
      nop->func_ = f.get();
      nop->attrs_ = op->attrs_;
      nop->loc_ = op->loc_;
      for (Value* o : op->operands_) nop->operands_.push_back(map.at(o));
      for (Value* r : op->results_) {
        Value* nr = map.at(r);
        nr->def_ = nop.get();
        nr->index_ = r->index_;
        nop->results_.push_back(nr);
      }
      for (const auto& reg : op->regions_) {
        Block* nb = nop->addRegion();
        copyBlock(*reg, *nb);
      }
      to.insert(to.ops().end(), std::move(nop));
    }
  };
  copyBlock(body_, f->body_);
  return f;
}

Function* Module::lookup(std::string_view name) const {
  for (const auto& f : functions)
    if (f->name() == name) return f.get();
  return nullptr;
}

std::optional<TensorBox> tensorBoxOf(const Op& op) {
  if ((op.kind() != OpKind::Load && op.kind() != OpKind::AtomicAdd) || !op.hasAttr("tensor_rank"))
    return std::nullopt;
  const int64_t rank = op.intAttr("tensor_rank");
  if (rank < 1 || op.numOperands() != size_t(3 + 3 * rank)) return std::nullopt;  // the verifier says why
  TensorBox box;
  box.base = op.operand(3);
  for (int64_t k = 0; k < rank; ++k) box.dims.push_back(op.operand(size_t(4 + k)));
  for (int64_t k = 0; k + 1 < rank; ++k) box.strides.push_back(op.operand(size_t(4 + rank + k)));
  for (int64_t k = 0; k < rank; ++k) box.coords.push_back(op.operand(size_t(3 + 2 * rank + k)));
  return box;
}

size_t operandsBeforeBox(const Op& op) { return op.hasAttr("tensor_rank") ? 3 : op.numOperands(); }

bool writesGlobalMemory(const Op& op) {
  return op.kind() == OpKind::Store || op.kind() == OpKind::AtomicAdd || op.kind() == OpKind::StoreTagged;
}

size_t loadTaggedMaskIndex(const Op& op, size_t t) {
  const size_t tiles = op.numResults();
  return op.numOperands() == 2 * tiles + 1 ? tiles + 1 + t : 0;
}

int64_t clusterSize(const Function& f) {
  int64_t size = 1;
  f.walk([&](const Op& op) {
    if (op.kind() == OpKind::ClusterAllGather && op.hasAttr("size")) size = op.intAttr("size");
  });
  return size;
}

Value* pointerBase(Value* ptr) {
  while (const Op* def = ptr->definingOp()) {
    switch (def->kind()) {
      case OpKind::AddPtr:
      case OpKind::Splat:
      case OpKind::Broadcast:
      case OpKind::ExpandDims:
      case OpKind::Reshape:
      case OpKind::Trans: ptr = def->operand(0); break;
      default: return nullptr;
    }
  }
  return ptr->ownerBlock() && !ptr->ownerBlock()->parentOp() ? ptr : nullptr;
}

}  // namespace flextile::ir
