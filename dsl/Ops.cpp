#include "dsl/Ops.h"

#include <cmath>

namespace flextile::dsl {

using ir::OpKind;

namespace {

ir::Builder& builderAt(const SourceLoc& loc, const char* op) { return TraceContext::current(loc, op).at(loc); }

std::string describe(const Operand& o) {
  if (o.isTile()) return o.tile().type().str();
  if (auto* i = std::get_if<int64_t>(&o.v)) return "integer " + std::to_string(*i);
  return "number " + std::to_string(std::get<double>(o.v));
}

bool isPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

void checkTileShape(const Shape& s, const SourceLoc& loc, const char* op) {
  for (auto d : s)
    if (!isPow2(d))
      traceError(loc, op, "tile dimensions must be powers of two (as in Triton), got " + ir::shapeString(s));
}

// The dtype two tiles meet at (see the rules in Ops.h).
DType promote(DType a, DType b) {
  if (a == b) return a;
  bool fa = ir::isFloat(a), fb = ir::isFloat(b);
  if (fa != fb) return fa ? a : b;
  if (fa) {
    if (a == DType::F64 || b == DType::F64) return DType::F64;
    return DType::F32;  // f16 with bf16, or either with f32
  }
  return ir::bitWidth(a) >= ir::bitWidth(b) ? a : b;
}

Tile constantOf(double v, DType dtype, const SourceLoc& loc) {
  auto& b = builderAt(loc, "constant");
  if (ir::isInteger(dtype)) return Tile(b.constantInt(ir::Type(dtype), int64_t(v)));
  return Tile(b.constant(ir::Type(dtype), v));
}

Tile castTo(const Tile& t, DType to, const SourceLoc& loc) {
  if (t.dtype() == to) return t;
  if (t.isPointer()) traceError(loc, "cast", "cannot cast a pointer " + t.type().str() + " to " + std::string(ir::dtypeName(to)));
  return Tile(builderAt(loc, "cast").cast(t.value(), to));
}

// A number operand becomes a scalar of the dtype it meets.
Tile asTile(const Operand& o, DType dtype, const SourceLoc& loc) {
  if (o.isTile()) return castTo(o.tile(), dtype, loc);
  if (auto* i = std::get_if<int64_t>(&o.v)) return constantOf(double(*i), dtype, loc);
  return constantOf(std::get<double>(o.v), dtype, loc);
}

// The dtype a binary operation computes in.
DType commonDType(const Operand& a, const Operand& b) {
  auto numberDType = [](const Operand& o) { return std::holds_alternative<double>(o.v) ? DType::F32 : DType::I32; };
  if (a.isTile() && b.isTile()) return promote(a.tile().dtype(), b.tile().dtype());
  if (!a.isTile() && !b.isTile()) return promote(numberDType(a), numberDType(b));
  const Tile& t = a.isTile() ? a.tile() : b.tile();
  const Operand& n = a.isTile() ? b : a;
  if (ir::isFloat(t.dtype())) return t.dtype();
  if (std::holds_alternative<double>(n.v)) return DType::F32;
  return t.dtype() == DType::I1 ? DType::I32 : t.dtype();
}

Shape broadcastShapes(const Shape& a, const Shape& b, const SourceLoc& loc, const char* op) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (da != db && da != 1 && db != 1)
      traceError(loc, op, "shapes " + ir::shapeString(a) + " and " + ir::shapeString(b) + " cannot broadcast");
    out[i] = std::max(da, db);
  }
  return out;
}

Tile broadcastTile(const Tile& t, const Shape& shape, const SourceLoc& loc, const char* op) {
  if (t.shape() == shape) return t;
  auto& b = builderAt(loc, op);
  if (t.isScalar()) return Tile(b.splat(t.value(), shape));
  broadcastShapes(t.shape(), shape, loc, op);
  if (t.rank() > int(shape.size()))
    traceError(loc, op, "cannot broadcast " + t.type().str() + " to the smaller rank of " + ir::shapeString(shape));
  ir::Value* v = t.value();
  while (v->type().rank() < int(shape.size())) v = b.expandDims(v, 0);
  for (size_t i = 0; i < shape.size(); ++i)
    if (v->type().shape()[i] != shape[i] && v->type().shape()[i] != 1)
      traceError(loc, op, "cannot broadcast " + t.type().str() + " to " + ir::shapeString(shape));
  if (v->type().shape() != shape) v = b.broadcast(v, shape);
  return Tile(v);
}

Shape shapeOf(const Operand& o) { return o.isTile() ? o.tile().shape() : Shape{}; }

// Brings both operands to one dtype and one shape.
std::pair<Tile, Tile> unify(const Operand& a, const Operand& b, const SourceLoc& loc, const char* op) {
  if ((a.isTile() && a.tile().isPointer()) || (b.isTile() && b.tile().isPointer()))
    traceError(loc, op, "operands " + describe(a) + " and " + describe(b) + ": pointers only support `+ offset`");
  DType dt = commonDType(a, b);
  Shape shape = broadcastShapes(shapeOf(a), shapeOf(b), loc, op);
  Tile ta = broadcastTile(asTile(a, dt, loc), shape, loc, op);
  Tile tb = broadcastTile(asTile(b, dt, loc), shape, loc, op);
  return {ta, tb};
}

Tile binary(OpKind kind, const char* op, const Operand& a, const Operand& b) {
  const SourceLoc& loc = a.isTile() ? a.loc : b.loc;
  auto [ta, tb] = unify(a, b, loc, op);
  const uint32_t traits = ir::opInfo(kind).traits;
  if ((traits & ir::kIntOnly) && !ir::isInteger(ta.dtype()))
    traceError(loc, op, "expects integer operands, got " + describe(a) + " and " + describe(b));
  return Tile(builderAt(loc, op).binary(kind, ta.value(), tb.value()));
}

Tile compare(const char* pred, const char* op, const Operand& a, const Operand& b) {
  const SourceLoc& loc = a.isTile() ? a.loc : b.loc;
  auto [ta, tb] = unify(a, b, loc, op);
  return Tile(builderAt(loc, op).cmp(pred, ta.value(), tb.value()));
}

Tile requireTileOperand(const Operand& x, const SourceLoc& loc, const char* op) {
  if (x.isTile()) return x.tile();
  return asTile(x, std::holds_alternative<double>(x.v) ? DType::F32 : DType::I32, loc);
}

Tile unaryFloat(OpKind kind, const char* op, const Operand& x, const SourceLoc& loc) {
  Tile t = requireTileOperand(x, loc, op);
  if (!ir::isFloat(t.dtype()))
    traceError(loc, op, "expects a floating-point operand, got " + t.type().str() + " (cast it with .to(f32))");
  return Tile(builderAt(loc, op).unary(kind, t.value()));
}

Tile reduceAlong(const char* kind, const Operand& x, int axis, const SourceLoc& loc) {
  Tile t = requireTileOperand(x, loc, kind);
  if (t.isScalar()) traceError(loc, kind, "cannot reduce a scalar");
  if (t.isPointer()) traceError(loc, kind, "cannot reduce pointers");
  int n = t.rank();
  int a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n) traceError(loc, kind, "axis " + std::to_string(axis) + " is out of range for " + t.type().str());
  if (t.dtype() == DType::I1) t = castTo(t, DType::I32, loc);
  return Tile(builderAt(loc, kind).reduce(t.value(), a, kind));
}

}  // namespace

Tile operator+(Operand a, Operand b) {
  // Pointer arithmetic: pointer + integer offsets.
  bool pa = a.isTile() && a.tile().isPointer(), pb = b.isTile() && b.tile().isPointer();
  if (pa || pb) {
    const Operand& p = pa ? a : b;
    const Operand& off = pa ? b : a;
    const SourceLoc& loc = p.loc;
    if (pa && pb) traceError(loc, "add", "cannot add two pointers");
    Tile o = off.isTile() ? off.tile() : asTile(off, DType::I32, loc);
    if (!ir::isInteger(o.dtype()) || o.dtype() == DType::I1)
      traceError(loc, "add", "pointer offsets must be i32 or i64, got " + o.type().str());
    Shape shape = broadcastShapes(p.tile().shape(), o.shape(), loc, "add");
    Tile pt = broadcastTile(p.tile(), shape, loc, "add");
    Tile ot = broadcastTile(o, shape, loc, "add");
    return Tile(builderAt(loc, "add").addptr(pt.value(), ot.value()));
  }
  return binary(OpKind::Add, "add", a, b);
}
Tile operator-(Operand a, Operand b) { return binary(OpKind::Sub, "sub", a, b); }
Tile operator*(Operand a, Operand b) { return binary(OpKind::Mul, "mul", a, b); }
Tile operator/(Operand a, Operand b) { return binary(OpKind::Div, "div", a, b); }
Tile operator%(Operand a, Operand b) { return binary(OpKind::Rem, "rem", a, b); }
Tile operator&(Operand a, Operand b) { return binary(OpKind::And, "and", a, b); }
Tile operator|(Operand a, Operand b) { return binary(OpKind::Or, "or", a, b); }
Tile operator^(Operand a, Operand b) { return binary(OpKind::Xor, "xor", a, b); }
Tile operator<<(Operand a, Operand b) { return binary(OpKind::Shl, "shl", a, b); }
Tile operator>>(Operand a, Operand b) { return binary(OpKind::Shr, "shr", a, b); }
Tile operator<(Operand a, Operand b) { return compare("lt", "cmp lt", a, b); }
Tile operator<=(Operand a, Operand b) { return compare("le", "cmp le", a, b); }
Tile operator>(Operand a, Operand b) { return compare("gt", "cmp gt", a, b); }
Tile operator>=(Operand a, Operand b) { return compare("ge", "cmp ge", a, b); }
Tile operator==(Operand a, Operand b) { return compare("eq", "cmp eq", a, b); }
Tile operator!=(Operand a, Operand b) { return compare("ne", "cmp ne", a, b); }

Tile operator-(Operand a) {
  Tile t = requireTileOperand(a, a.loc, "neg");
  return Tile(builderAt(a.loc, "neg").unary(OpKind::Neg, t.value()));
}

Tile operator~(Operand a) {
  Tile t = requireTileOperand(a, a.loc, "not");
  if (!ir::isInteger(t.dtype())) traceError(a.loc, "not", "expects an integer or i1 operand, got " + t.type().str());
  return Tile(builderAt(a.loc, "not").unary(OpKind::Not, t.value()));
}

Tile operator!(Operand a) {
  Tile t = requireTileOperand(a, a.loc, "logical not");
  if (t.dtype() == DType::I1) return Tile(builderAt(a.loc, "not").unary(OpKind::Not, t.value()));
  return a == 0;
}

Tile program_id(int axis, SourceLoc loc) {
  if (axis < 0 || axis > 2) traceError(loc, "program_id", "axis must be 0, 1 or 2, got " + std::to_string(axis));
  return Tile(builderAt(loc, "program_id").programId(axis));
}

Tile num_programs(int axis, SourceLoc loc) {
  if (axis < 0 || axis > 2) traceError(loc, "num_programs", "axis must be 0, 1 or 2, got " + std::to_string(axis));
  return Tile(builderAt(loc, "num_programs").numPrograms(axis));
}

Tile arange(int64_t start, int64_t end, SourceLoc loc) {
  if (!isPow2(end - start))
    traceError(loc, "arange", "the length end - start must be a power of two, got [" + std::to_string(start) + ", " +
                                  std::to_string(end) + ")");
  return Tile(builderAt(loc, "arange").arange(start, end));
}

Tile full(const Shape& shape, double value, DType dtype, SourceLoc loc) {
  checkTileShape(shape, loc, "full");
  if (dtype == DType::Ptr) traceError(loc, "full", "cannot fill a tile with pointers");
  auto& b = builderAt(loc, "full");
  ir::Type t(dtype, shape);
  return Tile(ir::isInteger(dtype) ? b.constantInt(t, int64_t(value)) : b.constant(t, value));
}

Tile zeros(const Shape& shape, DType dtype, SourceLoc loc) { return full(shape, 0.0, dtype, loc); }

Tile scalar(double value, DType dtype, SourceLoc loc) { return constantOf(value, dtype, loc); }

namespace {
Tile pointerOperand(const Operand& ptr, const SourceLoc& loc, const char* op) {
  if (!ptr.isTile() || !ptr.tile().isPointer())
    traceError(loc, op, "expects a pointer (a pointer parameter plus offsets), got " + describe(ptr));
  return ptr.tile();
}

Tile maskOperand(const Operand& mask, const Shape& shape, const SourceLoc& loc, const char* op) {
  Tile m = mask.isTile() ? mask.tile() : asTile(mask, DType::I1, loc);
  if (m.dtype() != DType::I1) traceError(loc, op, "mask must be i1 (a comparison), got " + m.type().str());
  broadcastShapes(m.shape(), shape, loc, op);
  return broadcastTile(m, shape, loc, op);
}

Tile loadImpl(const Operand& ptr, const Operand* mask, const Operand* other, const SourceLoc& loc) {
  Tile p = pointerOperand(ptr, loc, "load");
  ir::Value* m = nullptr;
  ir::Value* o = nullptr;
  if (mask) m = maskOperand(*mask, p.shape(), loc, "load").value();
  if (other) {
    DType pointee = p.type().pointee();
    if (other->isTile() && other->tile().isPointer()) traceError(loc, "load", "`other` cannot be a pointer");
    o = broadcastTile(asTile(*other, pointee, loc), p.shape(), loc, "load").value();
  }
  return Tile(builderAt(loc, "load").load(p.value(), m, o));
}

// The IR form of `box` for `op`'s pointer tile `p` (checked: ranks, base, scalar integers).
ir::TensorBox irBox(const Tile& p, const TensorBox& box, const SourceLoc& loc, const char* op) {
  const size_t rank = box.dims.size();
  if (rank < 1 || rank > 5 || box.coords.size() != rank || box.strides.size() + 1 != rank)
    traceError(loc, op, "a tensor box needs R dims, R-1 strides and R coords (R from 1 to 5), got " +
                            std::to_string(box.dims.size()) + ", " + std::to_string(box.strides.size()) + " and " +
                            std::to_string(box.coords.size()));
  if (p.rank() > int64_t(rank))
    traceError(loc, op, "the tile " + p.type().str() + " has more dimensions than its tensor box (rank " +
                            std::to_string(rank) + ")");
  if (!box.base.isTile() || !box.base.tile().isPointer() || box.base.tile().rank() != 0 ||
      box.base.tile().type().pointee() != p.type().pointee())
    traceError(loc, op, "a tensor box's base must be a scalar pointer to the tile's dtype (" +
                            std::string(ir::dtypeName(p.type().pointee())) + ")");
  ir::TensorBox ops;
  ops.base = box.base.tile().value();
  auto scalarI32 = [&](const Operand& o, const char* what) {
    if (o.isTile() && o.tile().rank() != 0)
      traceError(loc, op, std::string("a tensor box's ") + what + " must be scalars");
    if (o.isTile() && !ir::isInteger(o.tile().dtype()))
      traceError(loc, op, std::string("a tensor box's ") + what + " must be integers, got " + o.tile().type().str());
    return asTile(o, DType::I32, loc).value();
  };
  for (const Operand& d : box.dims) ops.dims.push_back(scalarI32(d, "dims"));
  for (const Operand& s : box.strides) ops.strides.push_back(scalarI32(s, "strides"));
  for (const Operand& c : box.coords) ops.coords.push_back(scalarI32(c, "coords"));
  return ops;
}

Tile boxLoadImpl(const Operand& ptr, const Operand* mask, const TensorBox& box, const SourceLoc& loc) {
  Tile p = pointerOperand(ptr, loc, "load");
  const ir::TensorBox ops = irBox(p, box, loc, "load");
  auto& b = builderAt(loc, "load");
  ir::Value* m = mask ? maskOperand(*mask, p.shape(), loc, "load").value()
                      : broadcastTile(constantOf(1, DType::I1, loc), p.shape(), loc, "load").value();
  ir::Value* zero = broadcastTile(constantOf(0, p.type().pointee(), loc), p.shape(), loc, "load").value();
  return Tile(b.load(p.value(), m, zero, ops));
}

void storeImpl(const Operand& ptr, const Operand& value, const Operand* mask, const SourceLoc& loc) {
  Tile p = pointerOperand(ptr, loc, "store");
  if (value.isTile() && value.tile().isPointer()) traceError(loc, "store", "storing pointers is not supported");
  if (value.isTile()) broadcastShapes(value.tile().shape(), p.shape(), loc, "store");
  if (value.isTile() && value.tile().rank() > p.rank())
    traceError(loc, "store", "value " + value.tile().type().str() + " does not fit pointer tile " + p.type().str());
  Tile v = broadcastTile(asTile(value, p.type().pointee(), loc), p.shape(), loc, "store");
  ir::Value* m = mask ? maskOperand(*mask, p.shape(), loc, "store").value() : nullptr;
  builderAt(loc, "store").store(p.value(), v.value(), m);
}

Tile atomicAddImpl(const Operand& ptr, const Operand& value, const Operand* mask, const SourceLoc& loc,
                   bool acqRel = false, const TensorBox* box = nullptr) {
  Tile p = pointerOperand(ptr, loc, "atomic_add");
  if (acqRel && !p.type().isScalar())
    traceError(loc, "atomic_add", "MemoryOrder::AcqRel takes the program's one ticket, a scalar pointer, not " +
                                      p.type().str());
  const DType t = p.type().pointee();
  if (t != DType::F32 && t != DType::I32 && t != DType::I64)
    traceError(loc, "atomic_add", "adds f32, i32 or i64 atomically, but the pointer is " + p.type().str());
  if (value.isTile()) {
    const Tile& v = value.tile();
    // No silent casts: an f32 gradient added into an i32 counter is a bug, not a conversion.
    if (v.dtype() != t)
      traceError(loc, "atomic_add", "value " + v.type().str() + " does not match the pointee of " + p.type().str() +
                                        " (cast it first)");
    if (v.rank() > p.rank() || broadcastShapes(v.shape(), p.shape(), loc, "atomic_add") != p.shape())
      traceError(loc, "atomic_add", "value " + v.type().str() + " does not fit pointer tile " + p.type().str());
  } else if (auto* x = std::get_if<double>(&value.v); x && ir::isInteger(t) && *x != std::trunc(*x)) {
    traceError(loc, "atomic_add", "cannot add " + describe(value) + " to the integers of " + p.type().str());
  }
  Tile v = broadcastTile(asTile(value, t, loc), p.shape(), loc, "atomic_add");
  if (acqRel) return Tile(builderAt(loc, "atomic_add").atomicAddAcqRel(p.value(), v.value()));
  ir::Value* m = mask ? maskOperand(*mask, p.shape(), loc, "atomic_add").value() : nullptr;
  if (box) {
    const ir::TensorBox ops = irBox(p, *box, loc, "atomic_add");
    if (!m) m = broadcastTile(constantOf(1, DType::I1, loc), p.shape(), loc, "atomic_add").value();
    return Tile(builderAt(loc, "atomic_add").atomicAdd(p.value(), v.value(), m, ops));
  }
  return Tile(builderAt(loc, "atomic_add").atomicAdd(p.value(), v.value(), m));
}

Tile taggedPointer(const Operand& ptr, const Operand& tag, const SourceLoc& loc, const char* op) {
  Tile p = pointerOperand(ptr, loc, op);
  if (p.type().pointee() != DType::I64)
    traceError(loc, op, "tagged words are i64 (tag << 32 | value bits), but the pointer is " + p.type().str());
  if (tag.isTile() && (!tag.tile().type().isScalar() || tag.tile().dtype() != DType::I32))
    traceError(loc, op, "the tag must be an i32 scalar, got " + tag.tile().type().str());
  return p;
}

void storeTaggedImpl(const Operand& ptr, const Operand& value, const Operand& tag, const Operand* mask,
                     const SourceLoc& loc) {
  Tile p = taggedPointer(ptr, tag, loc, "store_tagged");
  if (value.isTile() && value.tile().dtype() != DType::F32)
    traceError(loc, "store_tagged", "stores f32 values, got " + value.tile().type().str() + " (cast it first)");
  if (value.isTile() && (value.tile().rank() > p.rank() ||
                         broadcastShapes(value.tile().shape(), p.shape(), loc, "store_tagged") != p.shape()))
    traceError(loc, "store_tagged", "value " + value.tile().type().str() + " does not fit pointer tile " + p.type().str());
  Tile v = broadcastTile(asTile(value, DType::F32, loc), p.shape(), loc, "store_tagged");
  ir::Value* m = mask ? maskOperand(*mask, p.shape(), loc, "store_tagged").value() : nullptr;
  builderAt(loc, "store_tagged").storeTagged(p.value(), v.value(), asTile(tag, DType::I32, loc).value(), m);
}

std::vector<Tile> loadTaggedImpl(const std::vector<Operand>& ptrs, const Operand& tag, const std::vector<Operand>& masks,
                                 const SourceLoc& loc) {
  const char* op = "load_tagged";
  if (ptrs.empty()) traceError(loc, op, "needs at least one pointer tile");
  if (!masks.empty() && masks.size() != ptrs.size())
    traceError(loc, op, "takes a mask for every pointer or none, got " + std::to_string(masks.size()) + " masks for " +
                            std::to_string(ptrs.size()) + " pointers");
  std::vector<ir::Value*> ps, ms;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    Tile p = taggedPointer(ptrs[i], tag, loc, op);
    ps.push_back(p.value());
    if (!masks.empty()) ms.push_back(maskOperand(masks[i], p.shape(), loc, op).value());
  }
  std::vector<Tile> out;
  for (ir::Value* v : builderAt(loc, op).loadTagged(ps, asTile(tag, DType::I32, loc).value(), ms)) out.emplace_back(v);
  return out;
}
}  // namespace

void store_tagged(Operand ptr, Operand value, Operand tag, SourceLoc loc) {
  storeTaggedImpl(ptr, value, tag, nullptr, loc);
}
void store_tagged(Operand ptr, Operand value, Operand tag, Operand mask, SourceLoc loc) {
  storeTaggedImpl(ptr, value, tag, &mask, loc);
}
Tile load_tagged(Operand ptr, Operand tag, SourceLoc loc) { return loadTaggedImpl({ptr}, tag, {}, loc)[0]; }
Tile load_tagged(Operand ptr, Operand tag, Operand mask, SourceLoc loc) {
  return loadTaggedImpl({ptr}, tag, {mask}, loc)[0];
}
std::vector<Tile> load_tagged(const std::vector<Tile>& ptrs, Operand tag, const std::vector<Tile>& masks, SourceLoc loc) {
  return loadTaggedImpl(std::vector<Operand>(ptrs.begin(), ptrs.end()), tag,
                        std::vector<Operand>(masks.begin(), masks.end()), loc);
}

Tile atomic_add(Operand ptr, Operand value, SourceLoc loc) { return atomicAddImpl(ptr, value, nullptr, loc); }
Tile atomic_add(Operand ptr, Operand value, MemoryOrder order, SourceLoc loc) {
  return atomicAddImpl(ptr, value, nullptr, loc, order == MemoryOrder::AcqRel);
}
void fence(SourceLoc loc) { builderAt(loc, "fence").fence(); }
void wait_for_prior_grids(SourceLoc loc) { builderAt(loc, "wait_for_prior_grids").gridDependency("wait"); }
Tile global_timer(SourceLoc loc) { return Tile(builderAt(loc, "global_timer").globalTimer()); }
Tile sm_id(SourceLoc loc) { return Tile(builderAt(loc, "sm_id").smId()); }
void release_dependent_grids(SourceLoc loc) { builderAt(loc, "release_dependent_grids").gridDependency("release"); }
std::vector<Tile> cluster_all_gather(const std::vector<Tile>& values, int64_t size, SourceLoc loc) {
  return cluster_all_gather(values, size, ClusterGatherOptions{}, loc);
}

std::vector<Tile> cluster_all_gather(const std::vector<Tile>& values, int64_t size, const ClusterGatherOptions& options,
                                     SourceLoc loc) {
  const char* op = "cluster_all_gather";
  if (size < 2 || size > 8) traceError(loc, op, "a cluster holds 2 to 8 programs (the portable cluster size), got " + std::to_string(size));
  if (values.empty()) traceError(loc, op, "needs at least one value");
  if (options.to && (*options.to < 0 || *options.to >= size))
    traceError(loc, op, "to = " + std::to_string(*options.to) + " is not a rank of a cluster of " + std::to_string(size));
  if (options.rows < 0 || (options.rows & (options.rows - 1)) != 0)
    traceError(loc, op, "rows = " + std::to_string(options.rows) + " is not a power of two (or 0: every row)");
  std::vector<ir::Value*> vs;
  for (const Tile& v : values) {
    if (v.type().isPointer()) traceError(loc, op, "cannot hand a pointer (" + v.type().str() + ") to another program");
    if (options.rows > 0 && v.rank() > 0 && v.shape()[0] < options.rows)
      traceError(loc, op, "rows = " + std::to_string(options.rows) + " is more than the rows of " + v.type().str());
    vs.push_back(v.value());
  }
  std::vector<Tile> out;
  for (ir::Value* r : builderAt(loc, op).clusterAllGather(vs, size, options.to, options.rows)) out.push_back(Tile(r));
  return out;
}
Tile atomic_add(Operand ptr, Operand value, Operand mask, SourceLoc loc) {
  return atomicAddImpl(ptr, value, &mask, loc);
}
Tile atomic_add(Operand ptr, Operand value, Operand mask, const TensorBox& box, SourceLoc loc) {
  return atomicAddImpl(ptr, value, &mask, loc, false, &box);
}
Tile atomic_add(Operand ptr, Operand value, const TensorBox& box, SourceLoc loc) {
  return atomicAddImpl(ptr, value, nullptr, loc, false, &box);
}

Tile load(Operand ptr, SourceLoc loc) { return loadImpl(ptr, nullptr, nullptr, loc); }
Tile load(Operand ptr, Operand mask, SourceLoc loc) { return loadImpl(ptr, &mask, nullptr, loc); }
Tile load(Operand ptr, Operand mask, Operand other, SourceLoc loc) { return loadImpl(ptr, &mask, &other, loc); }
Tile load(Operand ptr, Operand mask, const TensorBox& box, SourceLoc loc) { return boxLoadImpl(ptr, &mask, box, loc); }
Tile load(Operand ptr, const TensorBox& box, SourceLoc loc) { return boxLoadImpl(ptr, nullptr, box, loc); }

Tile unpipelined(const Tile& loaded, SourceLoc loc) {
  ir::Op* def = loaded.value() ? loaded.value()->definingOp() : nullptr;
  if (!def || def->kind() != ir::OpKind::Load || !loaded.type().isTile())
    traceError(loc, "unpipelined",
               "takes the tile a load returns, got " + (loaded.value() ? loaded.type().str() : "an empty tile"));
  def->setAttr("no_ring", int64_t(1));
  return loaded;
}

void store(Operand ptr, Operand value, SourceLoc loc) { storeImpl(ptr, value, nullptr, loc); }
void store(Operand ptr, Operand value, Operand mask, SourceLoc loc) { storeImpl(ptr, value, &mask, loc); }

Tile max(Operand x, int axis, SourceLoc loc) { return reduceAlong("max", x, axis, loc); }
Tile min(Operand x, int axis, SourceLoc loc) { return reduceAlong("min", x, axis, loc); }
Tile sum(Operand x, int axis, SourceLoc loc) { return reduceAlong("sum", x, axis, loc); }

Tile exp(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Exp, "exp", x, loc); }
Tile exp2(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Exp2, "exp2", x, loc); }
Tile log(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Log, "log", x, loc); }
Tile log2(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Log2, "log2", x, loc); }
Tile tanh(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Tanh, "tanh", x, loc); }
Tile sqrt(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Sqrt, "sqrt", x, loc); }
Tile rsqrt(Operand x, SourceLoc loc) { return unaryFloat(OpKind::Rsqrt, "rsqrt", x, loc); }

Tile abs(Operand x, SourceLoc loc) {
  Tile t = requireTileOperand(x, loc, "abs");
  if (t.isPointer()) traceError(loc, "abs", "expects a number, got " + t.type().str());
  return Tile(builderAt(loc, "abs").unary(OpKind::Abs, t.value()));
}

Tile maximum(Operand a, Operand b, SourceLoc loc) {
  a.loc = b.loc = loc;
  return binary(OpKind::Maximum, "maximum", a, b);
}

Tile minimum(Operand a, Operand b, SourceLoc loc) {
  a.loc = b.loc = loc;
  return binary(OpKind::Minimum, "minimum", a, b);
}

Tile where(Operand cond, Operand a, Operand b, SourceLoc loc) {
  a.loc = b.loc = loc;
  auto [ta, tb] = unify(a, b, loc, "where");
  Shape shape = broadcastShapes(shapeOf(cond), ta.shape(), loc, "where");
  Tile c = maskOperand(cond, shape, loc, "where");
  ta = broadcastTile(ta, shape, loc, "where");
  tb = broadcastTile(tb, shape, loc, "where");
  return Tile(builderAt(loc, "where").select(c.value(), ta.value(), tb.value()));
}

Tile cast(Operand x, DType to, SourceLoc loc) {
  if (to == DType::Ptr) traceError(loc, "cast", "cannot cast to a pointer");
  Tile t = requireTileOperand(x, loc, "cast");
  return castTo(t, to, loc);
}

Tile dot(Operand a, Operand b, SourceLoc loc) {
  Tile ta = requireTileOperand(a, loc, "dot");
  Tile tb = requireTileOperand(b, loc, "dot");
  if (ta.rank() != 2 || tb.rank() != 2)
    traceError(loc, "dot", "expects rank-2 tiles, got " + ta.type().str() + " and " + tb.type().str());
  return dot(a, b, zeros({ta.shape()[0], tb.shape()[1]}, DType::F32, loc), loc);
}

Tile dot(Operand a, Operand b, Operand acc, SourceLoc loc) {
  Tile ta = requireTileOperand(a, loc, "dot");
  Tile tb = requireTileOperand(b, loc, "dot");
  Tile tc = requireTileOperand(acc, loc, "dot");
  auto shapes = ta.type().str() + " @ " + tb.type().str() + " + " + tc.type().str();
  if (ta.rank() != 2 || tb.rank() != 2 || tc.rank() != 2)
    traceError(loc, "dot", "expects rank-2 tiles, got " + shapes);
  if (ta.dtype() != tb.dtype() || !ir::isFloat(ta.dtype()) || ta.dtype() == DType::F64)
    traceError(loc, "dot", "a and b must share one of f16, bf16, f32; got " + shapes);
  if (tc.dtype() != DType::F32) traceError(loc, "dot", "the accumulator must be f32; got " + shapes);
  if (ta.shape()[1] != tb.shape()[0] || tc.shape()[0] != ta.shape()[0] || tc.shape()[1] != tb.shape()[1])
    traceError(loc, "dot", "shapes do not chain ([M, K] @ [K, N] + [M, N]); got " + shapes);
  return Tile(builderAt(loc, "dot").dot(ta.value(), tb.value(), tc.value()));
}

Tile dot(Operand a, Operand b, Operand acc, InputPrecision precision, SourceLoc loc) {
  Tile r = dot(a, b, acc, loc);
  if (precision == InputPrecision::IEEE) r.value()->definingOp()->setAttr("input_precision", std::string("ieee"));
  return r;
}

std::vector<Tile> forRangeImpl(Operand lo, Operand hi, Operand step, const std::vector<Tile>& init,
                               const std::function<std::vector<Tile>(Tile, const std::vector<Tile>&)>& body,
                               SourceLoc loc) {
  auto bound = [&](const Operand& o, const char* what) {
    Tile t = o.isTile() ? o.tile() : asTile(o, DType::I32, loc);
    if (!t.isScalar() || !ir::isInteger(t.dtype()) || t.dtype() == DType::I1)
      traceError(loc, "for_range", std::string(what) + " must be an integer scalar, got " + describe(o));
    return t;
  };
  Tile l = bound(lo, "lower bound"), h = bound(hi, "upper bound"), s = bound(step, "step");
  DType dt = promote(promote(l.dtype(), h.dtype()), s.dtype());
  l = castTo(l, dt, loc);
  h = castTo(h, dt, loc);
  s = castTo(s, dt, loc);
  if (auto* c = std::get_if<int64_t>(&step.v); c && *c <= 0)
    traceError(loc, "for_range", "step must be positive, got " + std::to_string(*c));
  std::vector<ir::Value*> inits;
  for (size_t i = 0; i < init.size(); ++i) {
    if (!init[i].valid()) traceError(loc, "for_range", "carried value " + std::to_string(i) + " is an empty Tile");
    inits.push_back(init[i].value());
  }
  auto& b = builderAt(loc, "for_range");
  auto results = b.forLoop(l.value(), h.value(), s.value(), inits, [&](ir::Value* iv, std::vector<ir::Value*> carried) {
    std::vector<Tile> c;
    for (auto* v : carried) c.push_back(Tile(v));
    std::vector<Tile> next = body(Tile(iv), c);
    if (next.size() != init.size())
      traceError(loc, "for_range", "the body returns " + std::to_string(next.size()) + " values but the loop carries " +
                                       std::to_string(init.size()));
    std::vector<ir::Value*> out;
    for (size_t i = 0; i < next.size(); ++i) {
      if (!next[i].valid()) traceError(loc, "for_range", "the body returns an empty Tile as value " + std::to_string(i));
      if (!next[i].type().sameShapeAndElement(init[i].type()))
        traceError(loc, "for_range", "carried value " + std::to_string(i) + " starts as " + init[i].type().str() +
                                         " but the body returns " + next[i].type().str());
      out.push_back(next[i].value());
    }
    TraceContext::current(loc, "for_range").at(loc);
    return out;
  });
  std::vector<Tile> out;
  for (auto* v : results) out.push_back(Tile(v));
  return out;
}

}  // namespace flextile::dsl

namespace flextile::dsl {
Tile Tile::broadcast_to(const Shape& shape, SourceLoc loc) const {
  checkTileShape(shape, loc, "broadcast_to");
  return broadcastTile(*this, shape, loc, "broadcast_to");
}
}  // namespace flextile::dsl
