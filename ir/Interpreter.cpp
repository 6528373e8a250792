// The tile-IR interpreter. The rules it implements are written at the top of
// Interpreter.h; this file keeps to them.
//
// Shape of the implementation: the function is checked once (checkFunction),
// arguments are bound once, then every program instance walks the op list with
// one dispatch per op; each op runs a tight typed loop over whole tiles. Values
// are immutable, reference-counted arrays indexed by Value::id, so reshape,
// expand_dims, convert_layout and loop-carried values cost no copy.
#include "ir/Interpreter.h"

#include "ir/Elementwise.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace flextile::ir {

// ---- InterpArg --------------------------------------------------------------

InterpArg InterpArg::buffer(void* base, size_t bytes, std::string name) {
  InterpArg a;
  a.kind_ = Kind::Buffer;
  a.base_ = base;
  a.bytes_ = bytes;
  a.name_ = std::move(name);
  return a;
}

InterpArg InterpArg::integer(int64_t v) {
  InterpArg a;
  a.kind_ = Kind::Integer;
  a.int_ = v;
  return a;
}

InterpArg InterpArg::real(double v) {
  InterpArg a;
  a.kind_ = Kind::Real;
  a.real_ = v;
  return a;
}

std::string InterpArg::describe() const {
  std::ostringstream os;
  switch (kind_) {
    case Kind::Buffer: os << "buffer '" << name_ << "' (" << bytes_ << " bytes)"; break;
    case Kind::Integer: os << "integer " << int_; break;
    case Kind::Real: os << "real " << real_; break;
  }
  return os.str();
}

namespace {

// ---- storage ----------------------------------------------------------------

// How a dtype is held while interpreting (see "Values and storage").
enum class Storage : uint8_t { F32, F64, Int, Ptr };

Storage storageOf(DType t) {
  switch (t) {
    case DType::F16:
    case DType::BF16:
    case DType::F32: return Storage::F32;
    case DType::F64: return Storage::F64;
    case DType::Ptr: return Storage::Ptr;
    default: return Storage::Int;
  }
}

// A pointer keeps the argument it was derived from: that is what lets an
// access be checked against the right allocation.
struct PtrVal {
  int64_t offset = 0;  // bytes from the buffer's base
  int64_t buffer = 0;  // argument index
};

struct Data {
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<int64_t> ints;
  std::vector<PtrVal> ptrs;

  template <class T>
  std::vector<T>& vec() {
    if constexpr (std::is_same_v<T, float>) return f32;
    else if constexpr (std::is_same_v<T, double>) return f64;
    else if constexpr (std::is_same_v<T, int64_t>) return ints;
    else return ptrs;
  }
  template <class T>
  const std::vector<T>& vec() const {
    return const_cast<Data*>(this)->vec<T>();
  }
};
using DataRef = std::shared_ptr<const Data>;

template <class T>
std::shared_ptr<Data> alloc(size_t n) {
  auto d = std::make_shared<Data>();
  d->vec<T>().resize(n);
  return d;
}

// Calls f with a value of the C++ type that holds storage s.
template <class F>
decltype(auto) withStorage(Storage s, F&& f) {
  switch (s) {
    case Storage::F32: return f(float{});
    case Storage::F64: return f(double{});
    case Storage::Int: return f(int64_t{});
    case Storage::Ptr: break;
  }
  return f(PtrVal{});
}

// ---- rounding (ir/Elementwise.h) ----------------------------------------------

// Rounds float-held results to their dtype (a no-op for f32).
void roundFloats(float* v, size_t n, DType t) {
  if (t == DType::F32) return;
  for (size_t i = 0; i < n; ++i) v[i] = roundToDType(v[i], t);
}

void wrapInts(int64_t* v, size_t n, DType t) {
  if (t == DType::I64) return;
  for (size_t i = 0; i < n; ++i) v[i] = wrapToWidth(v[i], t);
}

template <class T>
T maxNaN(T a, T b) {
  return elementwise::Semantics<OpKind::Maximum>::onFloat(a, b);
}

template <class T>
T minNaN(T a, T b) {
  return elementwise::Semantics<OpKind::Minimum>::onFloat(a, b);
}

std::string coordString(const Shape& shape, int64_t linear) {
  if (shape.empty()) return "[] (scalar)";
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = linear % shape[d];
    linear /= shape[d];
  }
  return shapeString(c);
}

Shape rowMajorStrides(const Shape& s) {
  Shape st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// dst[i] = src[sum_d idx_d * srcStrides[d]] over dst's row-major index space:
// broadcast (stride 0) and transpose (permuted strides) in one loop nest.
template <class T>
void gather(const T* src, T* dst, const Shape& shape, const Shape& srcStrides) {
  if (shape.empty()) {
    dst[0] = src[0];
    return;
  }
  size_t rank = shape.size();
  int64_t inner = shape[rank - 1], innerStride = srcStrides[rank - 1];
  int64_t outer = numElements(shape) / std::max<int64_t>(inner, 1);
  Shape idx(rank, 0);
  int64_t base = 0;
  for (int64_t o = 0; o < outer; ++o) {
    const T* s = src + base;
    if (innerStride == 1)
      std::copy(s, s + inner, dst);
    else
      for (int64_t i = 0; i < inner; ++i) dst[i] = s[i * innerStride];
    dst += inner;
    for (size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dims
      base += srcStrides[d];
      if (++idx[d] < shape[d]) break;
      base -= srcStrides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

// ---- memory element access --------------------------------------------------

template <DType D>
struct Mem;
template <>
struct Mem<DType::F32> {
  using Held = float;
  static float read(const void* p) { float v; std::memcpy(&v, p, 4); return v; }
  static void write(void* p, float v) { std::memcpy(p, &v, 4); }
};
template <>
struct Mem<DType::F16> {
  using Held = float;
  static float read(const void* p) {
    uint16_t b; std::memcpy(&b, p, 2);
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(b));
  }
  static void write(void* p, float v) {
    uint16_t b = Eigen::numext::bit_cast<uint16_t>(Eigen::half(v));
    std::memcpy(p, &b, 2);
  }
};
template <>
struct Mem<DType::BF16> {
  using Held = float;
  static float read(const void* p) {
    uint16_t b; std::memcpy(&b, p, 2);
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(b));
  }
  static void write(void* p, float v) {
    uint16_t b = Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(v));
    std::memcpy(p, &b, 2);
  }
};
template <>
struct Mem<DType::F64> {
  using Held = double;
  static double read(const void* p) { double v; std::memcpy(&v, p, 8); return v; }
  static void write(void* p, double v) { std::memcpy(p, &v, 8); }
};
template <>
struct Mem<DType::I1> {
  using Held = int64_t;
  static int64_t read(const void* p) { return *static_cast<const uint8_t*>(p) != 0; }
  static void write(void* p, int64_t v) { *static_cast<uint8_t*>(p) = uint8_t(v != 0); }
};
template <>
struct Mem<DType::I8> {
  using Held = int64_t;
  static int64_t read(const void* p) { return *static_cast<const int8_t*>(p); }
  static void write(void* p, int64_t v) { *static_cast<int8_t*>(p) = int8_t(v); }
};
template <>
struct Mem<DType::I32> {
  using Held = int64_t;
  static int64_t read(const void* p) { int32_t v; std::memcpy(&v, p, 4); return v; }
  static void write(void* p, int64_t v) { int32_t w = int32_t(v); std::memcpy(p, &w, 4); }
};
template <>
struct Mem<DType::I64> {
  using Held = int64_t;
  static int64_t read(const void* p) { int64_t v; std::memcpy(&v, p, 8); return v; }
  static void write(void* p, int64_t v) { std::memcpy(p, &v, 8); }
};

template <class F>
decltype(auto) withMemDType(DType t, F&& f) {
  switch (t) {
    case DType::F16: return f(Mem<DType::F16>{});
    case DType::BF16: return f(Mem<DType::BF16>{});
    case DType::F64: return f(Mem<DType::F64>{});
    case DType::I1: return f(Mem<DType::I1>{});
    case DType::I8: return f(Mem<DType::I8>{});
    case DType::I32: return f(Mem<DType::I32>{});
    case DType::I64: return f(Mem<DType::I64>{});
    default: break;
  }
  return f(Mem<DType::F32>{});
}

// ---- static checks ----------------------------------------------------------

[[noreturn]] void bad(const Op& op, const std::string& what) { throw Error(op.describe() + ": " + what); }

std::string typeStr(const Value* v) { return v->type().str(); }

// Checks, once per launch, everything the interpreter relies on: operand
// counts, shapes, dtypes, attributes, and that every operand is defined before
// use. After it, execution needs no checks other than data-dependent ones.
class Checker {
 public:
  explicit Checker(const Function& f) : defined_(size_t(f.numValues()), false) {
    for (Value* p : f.params()) define(p);
  }

  void block(const Block& b, bool isFunctionBody) {
    for (auto it = b.ops().begin(); it != b.ops().end(); ++it) {
      const Op& op = **it;
      bool last = std::next(it) == b.ops().end();
      for (Value* v : op.operands())
        if (!v || size_t(v->id()) >= defined_.size() || !defined_[size_t(v->id())])
          bad(op, "uses a value that is not defined before it");
      if (op.kind() == OpKind::Yield && (isFunctionBody || !last)) bad(op, "yield must end a for body");
      if (op.kind() == OpKind::Return && (!isFunctionBody || !last)) bad(op, "return must end the function body");
      checkOp(op);
      if (op.kind() == OpKind::For) forLoop(op);
      for (Value* r : op.results()) define(r);
    }
  }

 private:
  std::vector<bool> defined_;

  void define(Value* v) {
    if (size_t(v->id()) < defined_.size()) defined_[size_t(v->id())] = true;
  }

  static void count(const Op& op, size_t lo, size_t hi, size_t results) {
    if (op.numOperands() < lo || op.numOperands() > hi)
      bad(op, "has " + std::to_string(op.numOperands()) + " operands, expected " + std::to_string(lo) +
                  (hi != lo ? " to " + std::to_string(hi) : ""));
    if (op.numResults() != results)
      bad(op, "has " + std::to_string(op.numResults()) + " results, expected " + std::to_string(results));
  }
  static void sameShape(const Op& op, const Value* a, const Value* b) {
    if (a->type().shape() != b->type().shape())
      bad(op, "shape mismatch: " + typeStr(a) + " vs " + typeStr(b));
  }
  static void sameType(const Op& op, const Value* a, const Value* b) {
    if (!a->type().sameShapeAndElement(b->type())) bad(op, "type mismatch: " + typeStr(a) + " vs " + typeStr(b));
  }
  static void sameStorage(const Op& op, const Value* a, const Value* b) {
    if (a->type().dtype() != b->type().dtype() || (a->type().isPointer() && a->type().pointee() != b->type().pointee()))
      bad(op, "dtype mismatch: " + typeStr(a) + " vs " + typeStr(b));
  }
  static void sameCount(const Op& op, const Value* a, const Value* b) {
    if (a->type().numElements() != b->type().numElements())
      bad(op, "element count mismatch: " + typeStr(a) + " vs " + typeStr(b));
  }
  static void intScalar(const Op& op, const Value* v, const char* what) {
    if (!v->type().isScalar() || !isInteger(v->type().dtype()))
      bad(op, std::string(what) + " must be an integer scalar, got " + typeStr(v));
  }
  static void maskOrOther(const Op& op, const Value* p, const Value* v, const char* what) {
    if (!v->type().isScalar() && v->type().shape() != p->type().shape())
      bad(op, std::string(what) + " " + typeStr(v) + " must be a scalar or have the pointer's shape " +
                  shapeString(p->type().shape()));
  }
  static void loadStoreTarget(const Op& op, const Value* p) {
    if (!p->type().isPointer()) bad(op, "needs a pointer, got " + typeStr(p));
    if (p->type().pointee() == DType::Ptr) bad(op, "cannot load or store pointers");
  }

  void checkOp(const Op& op) {
    for (const Value* v : op.operands())
      for (int64_t d : v->type().shape())
        if (d < 1) bad(op, "operand " + typeStr(v) + " has a dimension < 1");
    for (const Value* v : op.results())
      for (int64_t d : v->type().shape())
        if (d < 1) bad(op, "result " + typeStr(v) + " has a dimension < 1");
    const OpKind k = op.kind();
    switch (k) {
      case OpKind::ProgramId:
      case OpKind::NumPrograms: {
        count(op, 0, 0, 1);
        int64_t axis = op.intAttr("axis");
        if (axis < 0 || axis > 2) bad(op, "axis " + std::to_string(axis) + " is not 0, 1 or 2");
        intScalar(op, op.result(), "result");
        return;
      }
      case OpKind::Constant:
        count(op, 0, 0, 1);
        (void)op.floatAttr("value");
        if (op.result()->type().isPointer()) bad(op, "a constant cannot be a pointer");
        return;
      case OpKind::Arange: {
        count(op, 0, 0, 1);
        int64_t start = op.intAttr("start"), end = op.intAttr("end");
        const Type& t = op.result()->type();
        if (t.dtype() != DType::I32 || t.shape() != Shape{end - start})
          bad(op, "result " + t.str() + " does not match [" + std::to_string(start) + ", " + std::to_string(end) + ")");
        return;
      }
      case OpKind::Splat:
        count(op, 1, 1, 1);
        if (!op.operand(0)->type().isScalar()) bad(op, "operand must be a scalar, got " + typeStr(op.operand(0)));
        sameStorage(op, op.operand(0), op.result());
        return;
      case OpKind::Broadcast: {
        count(op, 1, 1, 1);
        const Shape& in = op.operand(0)->type().shape();
        const Shape& out = op.result()->type().shape();
        sameStorage(op, op.operand(0), op.result());
        bool ok = in.empty() || in.size() == out.size();
        for (size_t d = 0; ok && d < in.size(); ++d) ok = in[d] == out[d] || in[d] == 1;
        if (!ok) bad(op, "cannot broadcast " + shapeString(in) + " to " + shapeString(out));
        return;
      }
      case OpKind::ExpandDims: {
        count(op, 1, 1, 1);
        int64_t axis = op.intAttr("axis");
        Shape s = op.operand(0)->type().shape();
        if (axis < 0 || axis > int64_t(s.size())) bad(op, "axis " + std::to_string(axis) + " out of range");
        s.insert(s.begin() + axis, 1);
        if (s != op.result()->type().shape()) bad(op, "result shape " + typeStr(op.result()) + ", expected " + shapeString(s));
        sameStorage(op, op.operand(0), op.result());
        return;
      }
      case OpKind::Reshape:
      case OpKind::ConvertLayout:
        count(op, 1, 1, 1);
        sameCount(op, op.operand(0), op.result());
        sameStorage(op, op.operand(0), op.result());
        if (k == OpKind::ConvertLayout) sameShape(op, op.operand(0), op.result());
        return;
      case OpKind::Trans: {
        count(op, 1, 1, 1);
        const auto& perm = op.intsAttr("perm");
        const Shape& in = op.operand(0)->type().shape();
        std::vector<bool> seen(in.size(), false);
        if (perm.size() != in.size()) bad(op, "perm has " + std::to_string(perm.size()) + " entries for " + shapeString(in));
        Shape out;
        for (int64_t p : perm) {
          if (p < 0 || p >= int64_t(in.size()) || seen[size_t(p)]) bad(op, "perm " + attrString(perm) + " is not a permutation");
          seen[size_t(p)] = true;
          out.push_back(in[size_t(p)]);
        }
        if (out != op.result()->type().shape()) bad(op, "result " + typeStr(op.result()) + ", expected " + shapeString(out));
        sameStorage(op, op.operand(0), op.result());
        return;
      }
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) case OpKind::Enum:
#include "ir/Ops.def"
      {
        size_t n = size_t(op.info().numOperands);
        count(op, n, n, 1);
        for (const Value* v : op.operands()) sameType(op, v, op.result());
        DType t = op.result()->type().dtype();
        if (t == DType::Ptr) bad(op, "does not apply to pointers");
        if ((op.hasTrait(kFloatOnly)) && !isFloat(t)) bad(op, "needs a float dtype, got " + typeStr(op.result()));
        if (op.hasTrait(kIntOnly) && !isInteger(t))
          bad(op, "needs an integer dtype, got " + typeStr(op.result()));
        return;
      }
      case OpKind::Cmp: {
        count(op, 2, 2, 1);
        sameType(op, op.operand(0), op.operand(1));
        sameShape(op, op.operand(0), op.result());
        if (op.result()->type().dtype() != DType::I1) bad(op, "result must be i1, got " + typeStr(op.result()));
        const std::string& p = op.strAttr("pred");
        if (!parseComparePredicate(p)) bad(op, "unknown pred '" + p + "'");
        if (op.operand(0)->type().isPointer() && p != "eq" && p != "ne") bad(op, "pointers compare only with eq or ne");
        return;
      }
      case OpKind::Select:
        count(op, 3, 3, 1);
        if (op.operand(0)->type().dtype() != DType::I1) bad(op, "condition must be i1, got " + typeStr(op.operand(0)));
        sameShape(op, op.operand(0), op.result());
        sameType(op, op.operand(1), op.result());
        sameType(op, op.operand(2), op.result());
        return;
      case OpKind::Cast: {
        count(op, 1, 1, 1);
        sameShape(op, op.operand(0), op.result());
        bool fromPtr = op.operand(0)->type().isPointer(), toPtr = op.result()->type().isPointer();
        if (fromPtr != toPtr) bad(op, "cannot cast " + typeStr(op.operand(0)) + " to " + typeStr(op.result()));
        return;
      }
      case OpKind::AddPtr:
        count(op, 2, 2, 1);
        if (!op.operand(0)->type().isPointer()) bad(op, "first operand must be a pointer, got " + typeStr(op.operand(0)));
        if (!isInteger(op.operand(1)->type().dtype()) || op.operand(1)->type().dtype() == DType::I1)
          bad(op, "offset must be an integer, got " + typeStr(op.operand(1)));
        sameShape(op, op.operand(0), op.operand(1));
        sameType(op, op.operand(0), op.result());
        return;
      case OpKind::Load: {
        count(op, 1, 3, 1);
        const Value* p = op.operand(0);
        loadStoreTarget(op, p);
        const Type& r = op.result()->type();
        if (r.dtype() != p->type().pointee() || r.shape() != p->type().shape())
          bad(op, "result " + r.str() + " does not match pointer " + typeStr(p));
        if (op.numOperands() > 1) {
          if (op.operand(1)->type().dtype() != DType::I1) bad(op, "mask must be i1, got " + typeStr(op.operand(1)));
          maskOrOther(op, p, op.operand(1), "mask");
        }
        if (op.numOperands() > 2) {
          if (op.operand(2)->type().dtype() != r.dtype()) bad(op, "other " + typeStr(op.operand(2)) + " must be " + r.str());
          maskOrOther(op, p, op.operand(2), "other");
        }
        return;
      }
      case OpKind::Store: {
        count(op, 2, 3, 0);
        const Value* p = op.operand(0);
        loadStoreTarget(op, p);
        const Type& v = op.operand(1)->type();
        if (v.dtype() != p->type().pointee() || v.shape() != p->type().shape())
          bad(op, "value " + v.str() + " does not match pointer " + typeStr(p));
        if (op.numOperands() > 2) {
          if (op.operand(2)->type().dtype() != DType::I1) bad(op, "mask must be i1, got " + typeStr(op.operand(2)));
          maskOrOther(op, p, op.operand(2), "mask");
        }
        return;
      }
      case OpKind::AtomicAdd: {
        count(op, 2, 3, 1);
        const Value* p = op.operand(0);
        loadStoreTarget(op, p);
        const DType t = p->type().pointee();
        if (t != DType::F32 && t != DType::I32 && t != DType::I64)
          bad(op, "adds f32, i32 or i64 atomically, got pointer " + typeStr(p));
        const Type& v = op.operand(1)->type();
        if (v.dtype() != t || v.shape() != p->type().shape())
          bad(op, "value " + v.str() + " does not match pointer " + typeStr(p));
        const Type& r = op.result()->type();
        if (r.dtype() != t || r.shape() != p->type().shape())
          bad(op, "result " + r.str() + " does not match pointer " + typeStr(p));
        if (op.numOperands() > 2) {
          if (op.operand(2)->type().dtype() != DType::I1) bad(op, "mask must be i1, got " + typeStr(op.operand(2)));
          maskOrOther(op, p, op.operand(2), "mask");
        }
        return;
      }
      case OpKind::Fence: count(op, 0, 0, 0); return;
      case OpKind::Reduce: {
        count(op, 1, 1, 1);
        int64_t axis = op.intAttr("axis");
        Shape s = op.operand(0)->type().shape();
        if (axis < 0 || axis >= int64_t(s.size())) bad(op, "axis " + std::to_string(axis) + " out of range for " + typeStr(op.operand(0)));
        s.erase(s.begin() + axis);
        if (s != op.result()->type().shape()) bad(op, "result " + typeStr(op.result()) + ", expected shape " + shapeString(s));
        sameStorage(op, op.operand(0), op.result());
        if (op.result()->type().isPointer()) bad(op, "cannot reduce pointers");
        const std::string& kind = op.strAttr("kind");
        if (kind != "sum" && kind != "max" && kind != "min") bad(op, "unknown reduce kind '" + kind + "'");
        return;
      }
      case OpKind::Dot: {
        count(op, 3, 3, 1);
        const Shape& a = op.operand(0)->type().shape();
        const Shape& b = op.operand(1)->type().shape();
        const Shape& c = op.operand(2)->type().shape();
        size_t r = a.size();
        bool ok = (r == 2 || r == 3) && b.size() == r && c.size() == r && a[r - 1] == b[r - 2] && c[r - 2] == a[r - 2] &&
                  c[r - 1] == b[r - 1] && (r == 2 || (a[0] == b[0] && a[0] == c[0]));
        if (!ok) bad(op, "shapes " + shapeString(a) + " @ " + shapeString(b) + " + " + shapeString(c) + " do not fit");
        sameType(op, op.operand(2), op.result());
        DType ta = op.operand(0)->type().dtype(), tb = op.operand(1)->type().dtype(), tc = op.result()->type().dtype();
        bool floats = isFloat(ta) && isFloat(tb) && isFloat(tc);
        bool ints = isInteger(ta) && isInteger(tb) && isInteger(tc);
        if (!floats && !ints)
          bad(op, "operand dtypes " + typeStr(op.operand(0)) + ", " + typeStr(op.operand(1)) + ", " +
                      typeStr(op.operand(2)) + " must be all float or all integer");
        return;
      }
      case OpKind::For: {
        if (op.numOperands() < 3) bad(op, "needs lb, ub and step");
        intScalar(op, op.operand(0), "lb");
        intScalar(op, op.operand(1), "ub");
        intScalar(op, op.operand(2), "step");
        size_t n = op.numOperands() - 3;
        if (op.numResults() != n) bad(op, "has " + std::to_string(op.numResults()) + " results for " + std::to_string(n) + " carried values");
        if (op.regions().size() != 1) bad(op, "needs exactly one region");
        const Block& body = op.region(0);
        if (body.args().size() != n + 1) bad(op, "body has " + std::to_string(body.args().size()) + " arguments, expected " + std::to_string(n + 1));
        if (!body.arg(0)->type().isScalar() || !isInteger(body.arg(0)->type().dtype()))
          bad(op, "induction variable must be an integer scalar, got " + typeStr(body.arg(0)));
        for (size_t i = 0; i < n; ++i) {
          sameType(op, op.operand(3 + i), body.arg(1 + i));
          sameType(op, op.operand(3 + i), op.result(i));
        }
        const Op* y = body.terminator();
        if (!y || y->kind() != OpKind::Yield) bad(op, "body must end with yield");
        if (y->numOperands() != n) bad(*y, "yields " + std::to_string(y->numOperands()) + " values for " + std::to_string(n) + " carried");
        for (size_t i = 0; i < n; ++i) sameType(*y, y->operand(i), body.arg(1 + i));
        return;
      }
      case OpKind::Yield:
      case OpKind::Return:
        return;
      // The memory/async level: the structural rules are ir::verify's (run by the caller of every
      // pass that makes these ops); here only what running them needs.
      case OpKind::LocalAlloc:
        count(op, 0, 0, 1);
        if (!op.result()->type().isSharedBuffer()) bad(op, "result must be a shared buffer, got " + typeStr(op.result()));
        return;
      case OpKind::AsyncCopy:
      case OpKind::LocalLoad: {
        count(op, 2, k == OpKind::AsyncCopy ? 4 : 2, k == OpKind::AsyncCopy ? 0 : 1);
        const Type& buf = op.operand(0)->type();
        if (!buf.isSharedBuffer()) bad(op, "operand 0 must be a shared buffer, got " + typeStr(op.operand(0)));
        intScalar(op, op.operand(1), "the slot");
        const Type& tile = k == OpKind::AsyncCopy ? (op.numOperands() > 2 ? op.operand(2)->type() : buf)
                                                   : op.result()->type();
        if (k == OpKind::AsyncCopy && (op.numOperands() < 3 || !tile.isPointer() || tile.pointee() != buf.dtype()))
          bad(op, "needs a ptr<" + std::string(dtypeName(buf.dtype())) + "> tile as operand 2");
        if (k == OpKind::LocalLoad && tile.dtype() != buf.dtype()) bad(op, "result " + tile.str() + " must hold " + buf.str());
        if (tile.shape() != buf.shape()) bad(op, "tile " + tile.str() + " is not one slot of " + buf.str());
        if (op.numOperands() > 3 &&
            (op.operand(3)->type().dtype() != DType::I1 || op.operand(3)->type().shape() != buf.shape()))
          bad(op, "mask must be i1" + shapeString(buf.shape()) + ", got " + typeStr(op.operand(3)));
        return;
      }
      case OpKind::AsyncCommit:
      case OpKind::AsyncWait:
      case OpKind::Barrier:
      case OpKind::FenceAsyncShared:
        count(op, 0, 0, 0);
        return;
    }
    bad(op, "is not known to the interpreter");
  }

  void forLoop(const Op& op) {
    const Block& body = op.region(0);
    std::vector<bool> saved = defined_;
    for (Value* a : body.args()) define(a);
    block(body, false);
    defined_ = std::move(saved);  // values of the body are not visible after the loop
  }
};

// ---- execution --------------------------------------------------------------

struct Launch {
  const Function* f = nullptr;
  const std::vector<InterpArg>* args = nullptr;
  std::vector<DataRef> params;  // bound once, shared by every program
  std::array<int64_t, 3> grid{};
};

class Program {
 public:
  explicit Program(const Launch& l) : l_(l), slots_(size_t(l.f->numValues())) {}

  void run(std::array<int64_t, 3> pid) {
    pid_ = pid;
    for (size_t i = 0; i < l_.params.size(); ++i) slots_[size_t(l_.f->params()[i]->id())] = l_.params[i];
    runBlock(l_.f->body());
  }

 private:
  const Launch& l_;
  std::vector<DataRef> slots_;
  // The writable storage of this program's shared buffers (slots_ holds a read-only view).
  std::unordered_map<const Value*, std::shared_ptr<Data>> buffers_;
  std::array<int64_t, 3> pid_{};

  [[noreturn]] void fail(const Op& op, const std::string& what) const {
    throw Error(op.describe() + " in program (" + std::to_string(pid_[0]) + ", " + std::to_string(pid_[1]) + ", " +
                std::to_string(pid_[2]) + "): " + what);
  }

  const Data& in(const Op& op, size_t i) const { return *slots_[size_t(op.operand(i)->id())]; }
  template <class T>
  const T* inp(const Op& op, size_t i) const {
    return in(op, i).vec<T>().data();
  }
  void set(const Value* v, DataRef d) { slots_[size_t(v->id())] = std::move(d); }
  int64_t scalarInt(const Value* v) const { return slots_[size_t(v->id())]->ints[0]; }

  // Returns the yield that ended a loop body (null for the function body).
  const Op* runBlock(const Block& b) {
    for (const auto& up : b.ops()) {
      const Op& op = *up;
      if (op.kind() == OpKind::Yield) return &op;
      if (op.kind() == OpKind::Return) return nullptr;
      exec(op);
    }
    return nullptr;
  }

  void exec(const Op& op) {
    switch (op.kind()) {
      // Every async op runs at once, in program order: a copy is complete when issued, so waits,
      // commits, barriers and proxy fences have nothing left to do (the program is one thread here).
      case OpKind::AsyncCommit:
      case OpKind::AsyncWait:
      case OpKind::Barrier:
      case OpKind::FenceAsyncShared: return;
      case OpKind::LocalAlloc: return localAlloc(op);
      case OpKind::AsyncCopy: return asyncCopy(op);
      case OpKind::LocalLoad: return localLoad(op);
      default: break;
    }
    if (op.kind() == OpKind::Fence) {
      // Programs run on several host threads: their plain stores before the fence must be visible
      // to a program that learns of them through an atomic_add after its own fence.
      std::atomic_thread_fence(std::memory_order_acq_rel);
      return;
    }
    const Type& rt = op.numResults() ? op.result()->type() : op.operand(0)->type();
    const size_t n = size_t(rt.numElements());
    switch (op.kind()) {
      case OpKind::ProgramId:
      case OpKind::NumPrograms: {
        auto d = alloc<int64_t>(1);
        size_t axis = size_t(op.intAttr("axis"));
        d->ints[0] = wrapToWidth(op.kind() == OpKind::ProgramId ? pid_[axis] : l_.grid[axis], rt.dtype());
        return set(op.result(), std::move(d));
      }
      case OpKind::Constant: return set(op.result(), constant(op, rt, n));
      case OpKind::Arange: {
        auto d = alloc<int64_t>(n);
        int64_t start = op.intAttr("start");
        for (size_t i = 0; i < n; ++i) d->ints[i] = wrapToWidth(start + int64_t(i), DType::I32);
        return set(op.result(), std::move(d));
      }
      case OpKind::Splat:
        return set(op.result(), withStorage(storageOf(rt.dtype()), [&](auto tag) -> DataRef {
          using T = decltype(tag);
          auto d = alloc<T>(n);
          std::fill(d->template vec<T>().begin(), d->template vec<T>().end(), inp<T>(op, 0)[0]);
          return d;
        }));
      case OpKind::Broadcast: {
        const Shape& inShape = op.operand(0)->type().shape();
        Shape strides(rt.rank(), 0);
        if (!inShape.empty()) {
          Shape st = rowMajorStrides(inShape);
          for (size_t d = 0; d < inShape.size(); ++d) strides[d] = inShape[d] == 1 ? 0 : st[d];
        }
        return set(op.result(), regather(op, rt, strides));
      }
      case OpKind::Trans: {
        Shape st = rowMajorStrides(op.operand(0)->type().shape());
        const auto& perm = op.intsAttr("perm");
        Shape strides(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) strides[i] = st[size_t(perm[i])];
        return set(op.result(), regather(op, rt, strides));
      }
      case OpKind::ExpandDims:
      case OpKind::Reshape:
      case OpKind::ConvertLayout: return set(op.result(), slots_[size_t(op.operand(0)->id())]);
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) case OpKind::Enum:
#include "ir/Ops.def"
        return set(op.result(), arithmetic(op, rt, n));
      case OpKind::Cmp: return set(op.result(), compare(op, n));
      case OpKind::Select:
        return set(op.result(), withStorage(storageOf(rt.dtype()), [&](auto tag) -> DataRef {
          using T = decltype(tag);
          auto d = alloc<T>(n);
          const int64_t* c = inp<int64_t>(op, 0);
          const T *a = inp<T>(op, 1), *b = inp<T>(op, 2);
          T* o = d->template vec<T>().data();
          for (size_t i = 0; i < n; ++i) o[i] = c[i] ? a[i] : b[i];
          return d;
        }));
      case OpKind::Cast: return set(op.result(), cast(op, rt, n));
      case OpKind::AddPtr: {
        auto d = alloc<PtrVal>(n);
        const PtrVal* p = inp<PtrVal>(op, 0);
        const int64_t* off = inp<int64_t>(op, 1);
        int64_t w = byteWidth(rt.pointee());
        for (size_t i = 0; i < n; ++i) d->ptrs[i] = {int64_t(uint64_t(p[i].offset) + uint64_t(off[i]) * uint64_t(w)), p[i].buffer};
        return set(op.result(), std::move(d));
      }
      case OpKind::Load: return set(op.result(), load(op, rt, n));
      case OpKind::Store: return store(op, n);
      case OpKind::AtomicAdd: return set(op.result(), atomicAdd(op, rt, n));
      case OpKind::Fence:  // run above: it has neither operands nor results
      case OpKind::LocalAlloc:
      case OpKind::AsyncCopy:
      case OpKind::AsyncCommit:
      case OpKind::AsyncWait:
      case OpKind::LocalLoad:
      case OpKind::Barrier:
      case OpKind::FenceAsyncShared: return;  // the memory/async level, run above
      case OpKind::Reduce: return set(op.result(), reduce(op, rt));
      case OpKind::Dot: return set(op.result(), dot(op, rt));
      case OpKind::For: return forLoop(op);
      case OpKind::Yield:
      case OpKind::Return: return;
    }
  }

  DataRef constant(const Op& op, const Type& rt, size_t n) {
    const Attr& a = op.attrs().at("value");
    const int64_t* iv = std::get_if<int64_t>(&a);
    double dv = iv ? double(*iv) : std::get<double>(a);
    switch (storageOf(rt.dtype())) {
      case Storage::F32: {
        auto d = alloc<float>(n);
        float v = iv ? narrowToFloat(*iv, rt.dtype()) : narrowToFloat(dv, rt.dtype());
        std::fill(d->f32.begin(), d->f32.end(), v);
        return d;
      }
      case Storage::F64: {
        auto d = alloc<double>(n);
        std::fill(d->f64.begin(), d->f64.end(), iv ? double(*iv) : dv);
        return d;
      }
      default: {
        auto d = alloc<int64_t>(n);
        int64_t v = iv ? (rt.dtype() == DType::I1 ? *iv != 0 : wrapToWidth(*iv, rt.dtype())) : floatToInt(dv, rt.dtype());
        std::fill(d->ints.begin(), d->ints.end(), v);
        return d;
      }
    }
  }

  DataRef regather(const Op& op, const Type& rt, const Shape& strides) {
    return withStorage(storageOf(rt.dtype()), [&](auto tag) -> DataRef {
      using T = decltype(tag);
      auto d = alloc<T>(size_t(rt.numElements()));
      gather(inp<T>(op, 0), d->template vec<T>().data(), rt.shape(), strides);
      return d;
    });
  }

  // One loop per op and held type, over the op's scalar semantics (ir/Elementwise.h). Each loop is
  // a template of its own, instantiated only for the storage the op is defined on (an int-only op
  // has no onFloat: clang checks a generic lambda's non-dependent names eagerly).
  template <class S, class T>
  DataRef floatLoop(const Op& op, const Type& rt, size_t n) {
    const DType t = rt.dtype();
    auto d = alloc<T>(n);
    T* o = d->template vec<T>().data();
    const T* a = inp<T>(op, 0);
    if constexpr (S::kOperands == 1) {
      for (size_t i = 0; i < n; ++i) o[i] = S::onFloat(a[i]);
    } else {
      const T* b = inp<T>(op, 1);
      for (size_t i = 0; i < n; ++i) o[i] = S::onFloat(a[i], b[i]);
    }
    if constexpr (std::is_same_v<T, float>) roundFloats(o, n, t);
    return d;
  }

  template <class S>
  DataRef intLoop(const Op& op, const Type& rt, size_t n) {
    const DType t = rt.dtype();
    auto d = alloc<int64_t>(n);
    int64_t* o = d->template vec<int64_t>().data();
    const int64_t* a = inp<int64_t>(op, 0);
    if constexpr (S::kOperands == 1) {
      for (size_t i = 0; i < n; ++i) o[i] = S::onInt(a[i], t);
    } else {
      const int64_t* b = inp<int64_t>(op, 1);
      if constexpr (S::kZeroDivisorIsError)
        for (size_t i = 0; i < n; ++i)
          if (b[i] == 0)
            fail(op, "integer division by zero at element " + coordString(rt.shape(), int64_t(i)) + " (dividend " +
                         std::to_string(a[i]) + ")");
      for (size_t i = 0; i < n; ++i) o[i] = S::onInt(a[i], b[i], t);
    }
    wrapInts(o, n, t);
    return d;
  }

  DataRef arithmetic(const Op& op, const Type& rt, size_t n) {
    return elementwise::withArithmetic(op.kind(), [&](auto sem) -> DataRef {
      using S = decltype(sem);
      const Storage storage = storageOf(rt.dtype());
      if constexpr (S::kOnFloats) {
        if (storage == Storage::F32) return this->template floatLoop<S, float>(op, rt, n);
        if (storage == Storage::F64) return this->template floatLoop<S, double>(op, rt, n);
      }
      if constexpr (S::kOnInts) {
        if (storage == Storage::Int) return this->template intLoop<S>(op, rt, n);
      }
      fail(op, "is not defined on " + rt.str());  // unreachable after checkFunction
    });
  }

  template <class T>
  static void compareLoop(ComparePredicate p, const T* a, const T* b, int64_t* o, size_t n) {
    withComparePredicate(p, [&](auto pred) {
      for (size_t i = 0; i < n; ++i) o[i] = compareValues<decltype(pred)::value>(a[i], b[i]);
    });
  }

  DataRef compare(const Op& op, size_t n) {
    auto d = alloc<int64_t>(n);
    const std::string& pred = op.strAttr("pred");
    const ComparePredicate p = *parseComparePredicate(pred);  // checked by checkFunction
    int64_t* o = d->ints.data();
    switch (storageOf(op.operand(0)->type().dtype())) {
      case Storage::F32: compareLoop(p, inp<float>(op, 0), inp<float>(op, 1), o, n); break;
      case Storage::F64: compareLoop(p, inp<double>(op, 0), inp<double>(op, 1), o, n); break;
      case Storage::Int: compareLoop(p, inp<int64_t>(op, 0), inp<int64_t>(op, 1), o, n); break;
      case Storage::Ptr: {
        const PtrVal *a = inp<PtrVal>(op, 0), *b = inp<PtrVal>(op, 1);
        bool eq = p == ComparePredicate::Eq;
        for (size_t i = 0; i < n; ++i) o[i] = ((a[i].buffer == b[i].buffer && a[i].offset == b[i].offset) == eq);
        break;
      }
    }
    return d;
  }

  DataRef cast(const Op& op, const Type& rt, size_t n) {
    const DType from = op.operand(0)->type().dtype(), to = rt.dtype();
    const Storage sf = storageOf(from), st = storageOf(to);
    if (sf == Storage::Ptr) return slots_[size_t(op.operand(0)->id())];  // same address, another pointee
    if (sf == st && from == to) return slots_[size_t(op.operand(0)->id())];
    // Source values as one of float / double / int64; destination by storage.
    return withStorage(sf, [&](auto tag) -> DataRef {
      using S = decltype(tag);
      const S* x = inp<S>(op, 0);
      if constexpr (std::is_same_v<S, PtrVal>) {
        return nullptr;  // unreachable: handled above
      } else {
        switch (st) {
          case Storage::F32: {
            auto d = alloc<float>(n);
            float* o = d->f32.data();
            if constexpr (std::is_same_v<S, float>) {
              // float-held to float-held: exact when widening, one rounding when narrowing.
              for (size_t i = 0; i < n; ++i) o[i] = x[i];
              roundFloats(o, n, to);
            } else {
              for (size_t i = 0; i < n; ++i) o[i] = narrowToFloat(x[i], to);
            }
            return d;
          }
          case Storage::F64: {
            auto d = alloc<double>(n);
            for (size_t i = 0; i < n; ++i) d->f64[i] = double(x[i]);
            return d;
          }
          default: {
            auto d = alloc<int64_t>(n);
            int64_t* o = d->ints.data();
            if constexpr (std::is_same_v<S, int64_t>) {
              if (to == DType::I1)
                for (size_t i = 0; i < n; ++i) o[i] = x[i] != 0;
              else
                for (size_t i = 0; i < n; ++i) o[i] = wrapToWidth(x[i], to);
            } else {
              for (size_t i = 0; i < n; ++i) o[i] = floatToInt(double(x[i]), to);
            }
            return d;
          }
        }
      }
    });
  }

  // Checks an active element's access; returns its host address.
  char* address(const Op& op, const char* verb, const Shape& shape, size_t i, const PtrVal& p, int width) const {
    const InterpArg& a = (*l_.args)[size_t(p.buffer)];
    bool inside = p.offset >= 0 && uint64_t(p.offset) + uint64_t(width) <= a.bytes();
    char* addr = static_cast<char*>(a.base()) + (inside ? p.offset : 0);
    if (inside && reinterpret_cast<uintptr_t>(addr) % uintptr_t(width) == 0) return addr;
    fail(op, std::string(inside ? "misaligned " : "out-of-bounds ") + verb + " of " + std::to_string(width) +
                 " bytes at tile element " + coordString(shape, int64_t(i)) + ": byte offset " +
                 std::to_string(p.offset) + " in buffer '" + a.name() + "' of " + std::to_string(a.bytes()) + " bytes");
  }

  DataRef load(const Op& op, const Type& rt, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const int64_t* mask = op.numOperands() > 1 ? inp<int64_t>(op, 1) : nullptr;
    size_t maskStep = mask && op.operand(1)->type().isScalar() ? 0 : 1;
    const Value* other = op.numOperands() > 2 ? op.operand(2) : nullptr;
    size_t otherStep = other && other->type().isScalar() ? 0 : 1;
    const Shape& shape = rt.shape();
    const int width = byteWidth(rt.dtype());
    return withMemDType(rt.dtype(), [&](auto mem) -> DataRef {
      using M = decltype(mem);
      using T = typename M::Held;
      auto d = alloc<T>(n);  // zero: the default for inactive elements
      T* o = d->template vec<T>().data();
      const T* oth = other ? inp<T>(op, 2) : nullptr;
      for (size_t i = 0; i < n; ++i) {
        if (mask && !mask[i * maskStep]) {
          if (oth) o[i] = oth[i * otherStep];
          continue;
        }
        o[i] = M::read(address(op, "load", shape, i, p[i], width));
      }
      return d;
    });
  }

  // ---- shared buffers: one mutable array of slots * tile elements per local_alloc ----

  int64_t slotOf(const Op& op) const {
    const int64_t slot = scalarInt(op.operand(1)), slots = op.operand(0)->type().slots();
    if (slot < 0 || slot >= slots)
      fail(op, "slot " + std::to_string(slot) + " is outside the buffer's " + std::to_string(slots) + " slots");
    return slot;
  }

  void localAlloc(const Op& op) {
    const Type& t = op.result()->type();
    const size_t n = size_t(t.slots() * numElements(t.shape()));
    std::shared_ptr<Data> d = withStorage(storageOf(t.dtype()), [&](auto held) { return alloc<decltype(held)>(n); });
    buffers_[op.result()] = d;
    set(op.result(), d);
  }

  void asyncCopy(const Op& op) {
    const Type& t = op.operand(0)->type();
    const size_t n = size_t(numElements(t.shape())), base = size_t(slotOf(op)) * n;
    Data& buf = *buffers_.at(op.operand(0));
    const PtrVal* p = inp<PtrVal>(op, 2);
    const int64_t* mask = op.numOperands() > 3 ? inp<int64_t>(op, 3) : nullptr;
    const int width = byteWidth(t.dtype());
    withMemDType(t.dtype(), [&](auto mem) {
      using M = decltype(mem);
      using T = typename M::Held;
      T* o = buf.template vec<T>().data() + base;
      for (size_t i = 0; i < n; ++i) o[i] = mask && !mask[i] ? T{} : M::read(address(op, "async_copy", t.shape(), i, p[i], width));
      return 0;
    });
  }

  void localLoad(const Op& op) {
    const Type& t = op.operand(0)->type();
    const size_t n = size_t(numElements(t.shape())), base = size_t(slotOf(op)) * n;
    const Data& buf = in(op, 0);
    set(op.result(), withStorage(storageOf(t.dtype()), [&](auto held) -> DataRef {
          using T = decltype(held);
          auto d = alloc<T>(n);
          const T* src = buf.template vec<T>().data() + base;
          std::copy(src, src + n, d->template vec<T>().begin());
          return d;
        }));
  }

  void store(const Op& op, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const int64_t* mask = op.numOperands() > 2 ? inp<int64_t>(op, 2) : nullptr;
    size_t maskStep = mask && op.operand(2)->type().isScalar() ? 0 : 1;
    const Type& vt = op.operand(1)->type();
    const int width = byteWidth(vt.dtype());
    withMemDType(vt.dtype(), [&](auto mem) {
      using M = decltype(mem);
      using T = typename M::Held;
      const T* v = inp<T>(op, 1);
      for (size_t i = 0; i < n; ++i)
        if (!mask || mask[i * maskStep]) M::write(address(op, "store", vt.shape(), i, p[i], width), v[i]);
      return 0;
    });
  }

  // Elements in row-major order, each read-modify-write one host atomic, so
  // programs running on other threads may add to the same addresses.
  DataRef atomicAdd(const Op& op, const Type& rt, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const int64_t* mask = op.numOperands() > 2 ? inp<int64_t>(op, 2) : nullptr;
    size_t maskStep = mask && op.operand(2)->type().isScalar() ? 0 : 1;
    const Shape& shape = rt.shape();
    const DType t = rt.dtype();
    const int width = byteWidth(t);
    auto active = [&](size_t i) { return !mask || mask[i * maskStep]; };
    auto at = [&](size_t i) { return address(op, "atomic_add", shape, i, p[i], width); };
    if (t == DType::F32) {
      auto d = alloc<float>(n);  // zero: the result of inactive elements
      const float* v = inp<float>(op, 1);
      for (size_t i = 0; i < n; ++i)
        if (active(i)) d->f32[i] = std::atomic_ref<float>(*reinterpret_cast<float*>(at(i))).fetch_add(v[i]);
      return d;
    }
    auto d = alloc<int64_t>(n);
    const int64_t* v = inp<int64_t>(op, 1);
    for (size_t i = 0; i < n; ++i) {
      if (!active(i)) continue;
      if (t == DType::I32)  // wraps: atomic arithmetic on signed integers is two's complement
        d->ints[i] = std::atomic_ref<int32_t>(*reinterpret_cast<int32_t*>(at(i))).fetch_add(int32_t(v[i]));
      else
        d->ints[i] = std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(at(i))).fetch_add(v[i]);
    }
    return d;
  }

  DataRef reduce(const Op& op, const Type& rt) {
    const Shape& s = op.operand(0)->type().shape();
    const size_t axis = size_t(op.intAttr("axis"));
    int64_t outer = 1, inner = 1, len = s[axis];
    for (size_t d = 0; d < axis; ++d) outer *= s[d];
    for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
    const std::string& kind = op.strAttr("kind");
    const DType t = rt.dtype();
    return withStorage(storageOf(t), [&](auto tag) -> DataRef {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, PtrVal>) {
        return nullptr;  // rejected by the checker
      } else {
        const T* x = inp<T>(op, 0);
        auto d = alloc<T>(size_t(outer * inner));
        T* o = d->template vec<T>().data();
        constexpr bool isInt = std::is_same_v<T, int64_t>;
        using Acc = std::conditional_t<isInt, uint64_t, double>;  // sums: wrapping ints, doubles for floats
        std::vector<Acc> sum(static_cast<size_t>(inner), Acc(0));
        for (int64_t a = 0; a < outer; ++a) {
          const T* blk = x + a * len * inner;
          T* out = o + a * inner;
          if (kind == "sum") {
            std::fill(sum.begin(), sum.end(), Acc(0));
            for (int64_t k = 0; k < len; ++k)
              for (int64_t i = 0; i < inner; ++i) sum[size_t(i)] += Acc(blk[k * inner + i]);
            for (int64_t i = 0; i < inner; ++i) {
              if constexpr (isInt) out[i] = wrapToWidth(int64_t(sum[size_t(i)]), t);
              else if constexpr (std::is_same_v<T, float>) out[i] = narrowToFloat(sum[size_t(i)], t);
              else out[i] = sum[size_t(i)];
            }
          } else {
            bool isMax = kind == "max";
            std::copy(blk, blk + inner, out);
            for (int64_t k = 1; k < len; ++k) {
              const T* row = blk + k * inner;
              if constexpr (isInt) {
                if (isMax) for (int64_t i = 0; i < inner; ++i) out[i] = std::max(out[i], row[i]);
                else for (int64_t i = 0; i < inner; ++i) out[i] = std::min(out[i], row[i]);
              } else {
                if (isMax) for (int64_t i = 0; i < inner; ++i) out[i] = maxNaN(out[i], row[i]);
                else for (int64_t i = 0; i < inner; ++i) out[i] = minNaN(out[i], row[i]);
              }
            }
          }
        }
        return d;
      }
    });
  }

  // A float-held or double-held operand as a double matrix (row-major input).
  Eigen::MatrixXd asDouble(const Op& op, size_t i, int64_t batch, int64_t rows, int64_t cols) const {
    using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    int64_t off = batch * rows * cols;
    if (storageOf(op.operand(i)->type().dtype()) == Storage::F64)
      return Eigen::Map<const RowMajorD>(inp<double>(op, i) + off, rows, cols);
    return Eigen::Map<const RowMajorF>(inp<float>(op, i) + off, rows, cols).cast<double>();
  }

  DataRef dot(const Op& op, const Type& rt) {
    const Shape& as = op.operand(0)->type().shape();
    const Shape& bs = op.operand(1)->type().shape();
    const size_t r = as.size();
    const int64_t batches = r == 3 ? as[0] : 1, m = as[r - 2], k = as[r - 1], nn = bs[r - 1];
    const DType t = rt.dtype();
    if (isInteger(t)) {
      auto d = alloc<int64_t>(size_t(batches * m * nn));
      const int64_t *a = inp<int64_t>(op, 0), *b = inp<int64_t>(op, 1), *c = inp<int64_t>(op, 2);
      for (int64_t q = 0; q < batches; ++q)
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < nn; ++j) {
            uint64_t acc = uint64_t(c[(q * m + i) * nn + j]);
            for (int64_t p = 0; p < k; ++p) acc += uint64_t(a[(q * m + i) * k + p]) * uint64_t(b[(q * k + p) * nn + j]);
            d->ints[size_t((q * m + i) * nn + j)] = wrapToWidth(int64_t(acc), t);
          }
      return d;
    }
    const bool f64 = storageOf(t) == Storage::F64;
    auto d = f64 ? alloc<double>(size_t(batches * m * nn)) : alloc<float>(size_t(batches * m * nn));
    Eigen::MatrixXd prod;
    for (int64_t q = 0; q < batches; ++q) {
      prod.noalias() = asDouble(op, 0, q, m, k) * asDouble(op, 1, q, k, nn);
      prod += asDouble(op, 2, q, m, nn);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nn; ++j) {
          size_t idx = size_t((q * m + i) * nn + j);
          if (f64) d->f64[idx] = prod(i, j);
          else d->f32[idx] = narrowToFloat(prod(i, j), t);
        }
    }
    return d;
  }

  void forLoop(const Op& op) {
    const int64_t lb = scalarInt(op.operand(0)), ub = scalarInt(op.operand(1)), step = scalarInt(op.operand(2));
    if (step <= 0) fail(op, "loop step " + std::to_string(step) + " is not positive");
    const Block& body = op.region(0);
    const size_t n = op.numResults();
    std::vector<DataRef> carried(n);
    for (size_t j = 0; j < n; ++j) carried[j] = slots_[size_t(op.operand(3 + j)->id())];
    for (int64_t iv = lb; iv < ub;) {
      auto ivData = alloc<int64_t>(1);
      ivData->ints[0] = iv;
      set(body.arg(0), std::move(ivData));
      for (size_t j = 0; j < n; ++j) set(body.arg(1 + j), carried[j]);
      const Op* y = runBlock(body);
      for (size_t j = 0; j < n; ++j) carried[j] = slots_[size_t(y->operand(j)->id())];
      if (uint64_t(ub) - uint64_t(iv) <= uint64_t(step)) break;  // the next iv would reach ub (or overflow)
      iv += step;
    }
    for (size_t j = 0; j < n; ++j) set(op.result(j), carried[j]);
  }
};

// Binds one argument to its parameter, checking its kind and range.
DataRef bindParam(const Function& f, size_t i, InterpArg& arg) {
  const Value* p = f.params()[i];
  const Type& t = p->type();
  std::string pname = "parameter " + std::to_string(i) + (p->nameHint().empty() ? "" : " '" + p->nameHint() + "'");
  auto fail = [&](const std::string& what) -> DataRef {
    throw Error("interpret '" + f.name() + "': " + pname + " of type " + t.str() + ": " + what);
  };
  if (!t.isScalar()) return fail("tile parameters are not supported");
  if (t.isPointer()) {
    if (arg.kind() != InterpArg::Kind::Buffer) return fail("expects a buffer, got " + arg.describe());
    if (!arg.base() && arg.bytes() != 0) return fail("null buffer of " + std::to_string(arg.bytes()) + " bytes");
    if (arg.name().empty())
      arg = InterpArg::buffer(arg.base(), arg.bytes(), p->nameHint().empty() ? "arg" + std::to_string(i) : p->nameHint());
    auto d = alloc<PtrVal>(1);
    d->ptrs[0] = {0, int64_t(i)};
    return d;
  }
  if (isInteger(t.dtype())) {
    if (arg.kind() != InterpArg::Kind::Integer) return fail("expects an integer, got " + arg.describe());
    int64_t v = arg.intValue();
    if ((t.dtype() == DType::I1 && v != 0 && v != 1) || wrapToWidth(v, t.dtype()) != v)
      return fail("value " + std::to_string(v) + " does not fit");
    auto d = alloc<int64_t>(1);
    d->ints[0] = v;
    return d;
  }
  if (arg.kind() != InterpArg::Kind::Real) return fail("expects a real, got " + arg.describe());
  if (t.dtype() == DType::F64) {
    auto d = alloc<double>(1);
    d->f64[0] = arg.realValue();
    return d;
  }
  auto d = alloc<float>(1);
  d->f32[0] = narrowToFloat(arg.realValue(), t.dtype());
  return d;
}

}  // namespace

void interpret(const Function& f, const std::vector<InterpArg>& argsIn, std::array<int64_t, 3> grid,
               const InterpOptions& options) {
  for (int a = 0; a < 3; ++a)
    if (grid[size_t(a)] < 0)
      throw Error("interpret '" + f.name() + "': grid dimension " + std::to_string(a) + " is " +
                  std::to_string(grid[size_t(a)]));
  if (argsIn.size() != f.params().size()) {
    std::string which;
    if (argsIn.size() < f.params().size()) {
      const Value* p = f.params()[argsIn.size()];
      which = "; first missing: parameter " + std::to_string(argsIn.size()) +
              (p->nameHint().empty() ? "" : " '" + p->nameHint() + "'") + " of type " + p->type().str();
    }
    throw Error("interpret '" + f.name() + "': " + std::to_string(argsIn.size()) + " arguments for " +
                std::to_string(f.params().size()) + " parameters" + which);
  }
  Checker(f).block(f.body(), true);

  std::vector<InterpArg> args = argsIn;  // gets default buffer names
  Launch launch;
  launch.f = &f;
  launch.args = &args;
  launch.grid = grid;
  for (size_t i = 0; i < args.size(); ++i) launch.params.push_back(bindParam(f, i, args[i]));

  const int64_t total = grid[0] * grid[1] * grid[2];
  if (total == 0) return;
  int64_t threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, total);

  // Programs are claimed in increasing order; after a failure no new program
  // starts, so every program numbered below a failing one has run, and the
  // lowest failure reported is the same whatever the scheduling.
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex errorMutex;
  int64_t errorProgram = total;
  std::exception_ptr error;  // the first failing program's, rethrown as it was
  auto worker = [&] {
    Program program(launch);
    for (;;) {
      if (stop.load(std::memory_order_relaxed)) return;
      int64_t l = next.fetch_add(1);
      if (l >= total) return;
      try {
        program.run({l % grid[0], (l / grid[0]) % grid[1], l / (grid[0] * grid[1])});
      } catch (const std::exception& e) {
        // An Error goes on as it is (its kind intact); anything else was a bug of the interpreter's.
        const bool isError = dynamic_cast<const Error*>(&e) != nullptr;
        std::lock_guard<std::mutex> lock(errorMutex);
        if (l < errorProgram) {
          errorProgram = l;
          error = isError ? std::current_exception() : std::make_exception_ptr(Error(e.what(), ErrorKind::Internal));
        }
        stop = true;
      }
    }
  };
  if (threads == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (errorProgram < total) std::rethrow_exception(error);
}

}  // namespace flextile::ir
