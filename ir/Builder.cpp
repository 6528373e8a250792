#include "ir/Builder.h"

namespace flextile::ir {

void Builder::setInsertionPointBefore(Op* op) {
  block_ = op->parentBlock();
  pos_ = block_->find(op);
}

void Builder::setInsertionPointAfter(Op* op) {
  block_ = op->parentBlock();
  pos_ = std::next(block_->find(op));
}

Op* Builder::create(OpKind kind, std::vector<Value*> operands, std::vector<Type> resultTypes, Attrs attrs) {
  auto op = func_->createOp(kind, std::move(operands), std::move(resultTypes), std::move(attrs), loc_);
  return block_->insert(pos_, std::move(op));
}

Value* Builder::programId(int axis) { return create1(OpKind::ProgramId, {}, Type(DType::I32), {{"axis", int64_t(axis)}}); }

Value* Builder::numPrograms(int axis) {
  return create1(OpKind::NumPrograms, {}, Type(DType::I32), {{"axis", int64_t(axis)}});
}

Value* Builder::constant(Type t, double value) {
  if (isInteger(t.dtype())) return constantInt(std::move(t), int64_t(value));
  return create1(OpKind::Constant, {}, std::move(t), {{"value", value}});
}

Value* Builder::constantInt(Type t, int64_t value) {
  if (isFloat(t.dtype())) return constant(std::move(t), double(value));
  return create1(OpKind::Constant, {}, std::move(t), {{"value", value}});
}

Value* Builder::arange(int64_t start, int64_t end) {
  return create1(OpKind::Arange, {}, Type(DType::I32, {end - start}), {{"start", start}, {"end", end}});
}

Value* Builder::splat(Value* s, const Shape& shape) { return create1(OpKind::Splat, {s}, s->type().withShape(shape)); }

Value* Builder::broadcast(Value* x, const Shape& shape) {
  return create1(OpKind::Broadcast, {x}, x->type().withShape(shape));
}

Value* Builder::expandDims(Value* x, int axis) {
  Shape s = x->type().shape();
  s.insert(s.begin() + axis, 1);
  return create1(OpKind::ExpandDims, {x}, x->type().withShape(s), {{"axis", int64_t(axis)}});
}

Value* Builder::reshape(Value* x, const Shape& shape) {
  return create1(OpKind::Reshape, {x}, x->type().withShape(shape));
}

Value* Builder::trans(Value* x, const std::vector<int64_t>& perm) {
  Shape s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) s[i] = x->type().shape()[size_t(perm[i])];
  return create1(OpKind::Trans, {x}, x->type().withShape(s), {{"perm", perm}});
}

Value* Builder::unary(OpKind k, Value* x) { return create1(k, {x}, x->type().withShape(x->type().shape())); }

Value* Builder::binary(OpKind k, Value* a, Value* b) {
  return create1(k, {a, b}, a->type().withShape(a->type().shape()));
}

Value* Builder::cmp(std::string_view pred, Value* a, Value* b) {
  return create1(OpKind::Cmp, {a, b}, Type(DType::I1, a->type().shape()), {{"pred", std::string(pred)}});
}

Value* Builder::select(Value* c, Value* a, Value* b) {
  return create1(OpKind::Select, {c, a, b}, a->type().withShape(a->type().shape()));
}

Value* Builder::cast(Value* x, DType to) { return create1(OpKind::Cast, {x}, x->type().withDType(to)); }

Value* Builder::addptr(Value* p, Value* offset) {
  return create1(OpKind::AddPtr, {p, offset}, p->type().withShape(p->type().shape()));
}

Value* Builder::load(Value* ptr, Value* mask, Value* other) {
  std::vector<Value*> ops{ptr};
  if (mask) ops.push_back(mask);
  if (mask && other) ops.push_back(other);
  return create1(OpKind::Load, ops, Type(ptr->type().pointee(), ptr->type().shape()));
}

namespace {
// (first..., base, dims, strides, coords) and the op's {tensor_rank}.
std::vector<Value*> withBox(std::vector<Value*> ops, const TensorBox& box) {
  ops.push_back(box.base);
  ops.insert(ops.end(), box.dims.begin(), box.dims.end());
  ops.insert(ops.end(), box.strides.begin(), box.strides.end());
  ops.insert(ops.end(), box.coords.begin(), box.coords.end());
  return ops;
}
}  // namespace

Value* Builder::load(Value* ptr, Value* mask, Value* other, const TensorBox& box) {
  return create1(OpKind::Load, withBox({ptr, mask, other}, box), Type(ptr->type().pointee(), ptr->type().shape()),
                 {{"tensor_rank", int64_t(box.dims.size())}});
}

void Builder::store(Value* ptr, Value* value, Value* mask) {
  std::vector<Value*> ops{ptr, value};
  if (mask) ops.push_back(mask);
  create(OpKind::Store, ops, {});
}

Value* Builder::atomicAdd(Value* ptr, Value* value, Value* mask) {
  std::vector<Value*> ops{ptr, value};
  if (mask) ops.push_back(mask);
  return create1(OpKind::AtomicAdd, ops, Type(ptr->type().pointee(), ptr->type().shape()));
}

Value* Builder::atomicAdd(Value* ptr, Value* value, Value* mask, const TensorBox& box) {
  return create1(OpKind::AtomicAdd, withBox({ptr, value, mask}, box), Type(ptr->type().pointee(), ptr->type().shape()),
                 {{"tensor_rank", int64_t(box.dims.size())}});
}

Value* Builder::atomicAddAcqRel(Value* ptr, Value* value) {
  return create1(OpKind::AtomicAdd, {ptr, value}, Type(ptr->type().pointee(), ptr->type().shape()),
                 {{"order", std::string("acq_rel")}});
}

void Builder::storeTagged(Value* ptr, Value* value, Value* tag, Value* mask) {
  std::vector<Value*> ops{ptr, value, tag};
  if (mask) ops.push_back(mask);
  create(OpKind::StoreTagged, ops, {});
}

Value* Builder::loadTagged(Value* ptr, Value* tag, Value* mask) {
  return loadTagged(std::vector<Value*>{ptr}, tag, mask ? std::vector<Value*>{mask} : std::vector<Value*>{})[0];
}

std::vector<Value*> Builder::loadTagged(const std::vector<Value*>& ptrs, Value* tag, const std::vector<Value*>& masks) {
  std::vector<Value*> ops(ptrs);
  ops.push_back(tag);
  ops.insert(ops.end(), masks.begin(), masks.end());
  std::vector<Type> types;
  for (Value* p : ptrs) types.push_back(Type(DType::F32, p->type().shape()));
  Op* op = create(OpKind::LoadTagged, ops, types);
  return std::vector<Value*>(op->results().begin(), op->results().end());
}

void Builder::fence() { create(OpKind::Fence, {}, {}); }
void Builder::gridDependency(const std::string& kind) { create(OpKind::GridDependency, {}, {}, {{"kind", kind}}); }
Value* Builder::globalTimer() { return create1(OpKind::GlobalTimer, {}, Type(DType::I64)); }
Value* Builder::smId() { return create1(OpKind::SmId, {}, Type(DType::I32)); }

std::vector<Value*> Builder::clusterAllGather(const std::vector<Value*>& values, int64_t size,
                                              std::optional<int64_t> to, int64_t rows) {
  std::vector<Type> types;
  for (Value* v : values)
    for (int64_t r = 0; r < size; ++r) types.push_back(v->type());
  Attrs attrs{{"size", size}};
  if (to) attrs["to"] = *to;
  if (rows > 0) attrs["rows"] = rows;
  Op* op = create(OpKind::ClusterAllGather, values, types, std::move(attrs));
  std::vector<Value*> results;
  for (size_t i = 0; i < op->numResults(); ++i) results.push_back(op->result(i));
  return results;
}

Value* Builder::reduce(Value* x, int axis, std::string_view kind) {
  Shape s = x->type().shape();
  s.erase(s.begin() + axis);
  return create1(OpKind::Reduce, {x}, x->type().withShape(s), {{"axis", int64_t(axis)}, {"kind", std::string(kind)}});
}

Value* Builder::dot(Value* a, Value* b, Value* acc) {
  return create1(OpKind::Dot, {a, b, acc}, acc->type().withShape(acc->type().shape()));
}

void Builder::ret() { create(OpKind::Return, {}, {}); }

std::vector<Value*> Builder::forLoop(Value* lb, Value* ub, Value* step, std::vector<Value*> inits,
                                     const std::function<std::vector<Value*>(Value*, std::vector<Value*>)>& body) {
  std::vector<Value*> operands{lb, ub, step};
  std::vector<Type> types;
  for (Value* v : inits) {
    operands.push_back(v);
    types.push_back(v->type());
  }
  Op* op = create(OpKind::For, operands, types);
  Block* b = op->addRegion();
  Value* iv = b->addArg(lb->type(), "iv");
  std::vector<Value*> carried;
  for (Value* v : inits) carried.push_back(b->addArg(v->type()));

  Block* savedBlock = block_;
  auto savedPos = pos_;
  setInsertionPointToEnd(b);
  std::vector<Value*> next = body(iv, carried);
  create(OpKind::Yield, next, {});
  block_ = savedBlock;
  pos_ = savedPos;
  return op->results();
}

}  // namespace flextile::ir
