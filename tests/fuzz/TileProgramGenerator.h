// A generator of random well-typed tile programs, for the property that the tile-level passes do
// not change what a program computes (TileProgramProperty.h) and that every such program lowers to
// PTX. What it emits:
//   * every element-wise op of ir/Ops.def, enumerated from the table's traits (kElementwise, with
//     kFloatOnly / kIntOnly deciding the dtypes), on tiles and scalars of every dtype but ptr;
//     cmp with every predicate, select, cast between any two dtypes; integer div/rem get divisors
//     made non-zero with a select;
//   * reduce (sum, max, min on any axis), dot (f16/bf16/f32/f64 inputs into an f32 or f16
//     accumulator, i8 x i8 into i32), every shape op (splat, broadcast, expand_dims, reshape,
//     trans), constants including -0, inf and NaN, arange, program_id and num_programs;
//   * loads, stores and atomic_add with and without masks and `other`, at row-major,
//     column-major, repeated, strided and data-dependent (gathered) offsets, and at offsets that
//     are out of the buffer exactly where the mask is off (a pass that dropped or reordered a
//     mask makes the interpreter report an out-of-bounds access);
//   * for loops (nested twice at most) with 0 to 40 iterations, i32 or i64 bounds, carrying 1 to
//     3 values of any shape and dtype, bodies that load, store and use the induction variable;
//   * in half of the programs, dots inside loops whose B operand streams as a tensor box of the
//     f16 buffer (rows past the tensor's end zero-filled), with the function asking for TMA and
//     sometimes for warp specialization: on sm_90a the pipeline's TMA rings, their shared rings,
//     ldmatrix rings in wgmma's panels (rows of 128 columns) and the producer warpgroup, which the
//     interpreter then runs after the passes. Those programs run one program (the tensor is the
//     buffer's first rows, which every program would read while another writes them).
//   * in those programs also atomic_adds of f32 tiles named as tensor boxes of the f32 buffer
//     (on sm_90a the bulk-reduce pass's TMA reductions where the old values go unused);
//
// Memory: three buffers, f32, f16 and i32, each both read and written; program p of the grid
// touches only elements [p * kRegion, (p + 1) * kRegion) of each (every local offset is below
// kRegion by construction), so programs never race and a run is deterministic. The other
// parameters are n (i32, 1..40, the length the masks compare with) and alpha (f32).
//
// Tile dims are powers of two (layout assignment requires them); n is not, so masks cut tiles
// anywhere.
//
// A seed must be one program on every compiler (CI runs the seeds in the gcc and the clang
// builds): choices are drawn, and ops created, one statement at a time, never two in the
// arguments of one call, whose order of evaluation C++ leaves unspecified. A fingerprint test
// (RandomTilePrograms.ASeedIsTheSameProgramOnEveryCompiler) holds the generator to it.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "Choices.h"
#include "ir/Builder.h"
#include "ir/IR.h"

namespace flextile::fuzz {

// Elements of each buffer one program may touch.
inline constexpr int64_t kRegion = 4096;
// Added to the offsets of masked-off lanes: past the end of any buffer.
inline constexpr int64_t kOutOfBuffer = int64_t(1) << 24;

// The element-wise ops of the op table, with their operand count and traits.
struct ElementwiseOp {
  ir::OpKind kind;
  int operands;
  uint32_t traits;
};
inline const std::vector<ElementwiseOp>& elementwiseOps() {
  static const std::vector<ElementwiseOp> ops = [] {
    using namespace flextile::ir;
    std::vector<ElementwiseOp> v;
#define FT_OP(Enum, name, nops, nres, traits) \
  if ((traits) & kElementwise) v.push_back({OpKind::Enum, nops, uint32_t(traits)});
#include "ir/Ops.def"
    return v;
  }();
  return ops;
}

struct GeneratedProgram {
  std::unique_ptr<ir::Function> f;
  int64_t programs = 1;  // grid (programs, 1, 1)
  int64_t n = 1;
  float alpha = 1;
  uint64_t dataSeed = 0;  // the input buffers' contents
  int numStages = 1;
  bool streamed = false;  // dots over streamed tensor boxes (one program)
  // False when the program holds an op the PTX lowering refuses by design, with a clear error,
  // though the IR allows it and the interpreter and the passes take it: a dot other than
  // f16/bf16/f32 x same into f32 (codegen/LowerDot.cpp), exp/exp2/log/log2/tanh of f64
  // (codegen/LowerElementwise.cpp: no approximate f64 instruction).
  bool lowerable = true;
};

class TileProgramGenerator {
 public:
  explicit TileProgramGenerator(Choices& c) : c_(c) {}

  GeneratedProgram generate() {
    using namespace flextile::ir;
    GeneratedProgram g;
    g_ = &g;
    g.f = std::make_unique<Function>("random_program");
    f_ = g.f.get();
    b_ = std::make_unique<Builder>(*f_);
    bufF32_ = f_->addParam(Type::pointer(DType::F32), "xf32");
    bufF16_ = f_->addParam(Type::pointer(DType::F16), "xf16");
    bufI32_ = f_->addParam(Type::pointer(DType::I32), "xi32");
    n_ = f_->addParam(Type(DType::I32), "n");
    alpha_ = f_->addParam(Type(DType::F32), "alpha");
    g.programs = 1 + c_.below(3);
    g.n = 1 + c_.below(40);
    g.alpha = c_.of({1.0f, -2.5f, 0.375f, 1e-3f, 3e4f});
    g.numStages = c_.of({1, 2, 3});
    g.dataSeed = c_.bits();
    f_->attrs()["num_warps"] = int64_t(c_.of({1, 2, 4, 8}));
    g.streamed = c_.percent(50);
    if (g.streamed) {
      g.programs = 1;
      g.numStages = c_.of({2, 3});
      // Most random loop bodies reduce or convert through shared memory, which gets TMA only
      // with a producer warpgroup (tma_in_staging_loops): ask for both often.
      if (c_.percent(85)) f_->attrs()["tma"] = int64_t(1);
      if (c_.percent(75)) f_->attrs()["warp_specialize"] = int64_t(1);
      if (c_.percent(75)) f_->attrs()["tma_in_staging_loops"] = int64_t(1);
      // One tile for the program's streamed dots, mostly, so that their loops' rings can be one
      // set (share_rings): the forward's walks, a peeled walk's loops of at most one trip.
      if (c_.percent(50)) f_->attrs()["share_rings"] = int64_t(1);
      // Warpgroup turns around the products of 8-warp loops (the forward's on its walks).
      const bool turns = c_.percent(30);
      if (turns) {
        f_->attrs()["num_warps"] = int64_t(8);
        f_->attrs()["pingpong"] = int64_t(1);
      }
      streamC_ = c_.of({int64_t(8), int64_t(16), int64_t(32), int64_t(64), int64_t(128)});
      streamK_ = c_.of({int64_t(16), int64_t(32)});
      streamM_ = turns ? 128 : c_.of({int64_t(16), int64_t(32), int64_t(64)});  // 8 warps of 16 rows: wgmma
    }
    if (g.numStages > 1) f_->attrs()["num_stages"] = int64_t(g.numStages);
    // What a launcher promises: 16-byte aligned buffers, nothing about n.
    f_->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 1, 1};

    const int baseShapes = 1 + c_.below(3);
    for (int i = 0; i < baseShapes; ++i) shapes_.push_back(randomShape());
    pid_ = b_->programId(0);
    regionBase_ = mul(pid_, i32(kRegion));

    const int steps = 3 + c_.below(14);
    for (int i = 0; i < steps; ++i) {
      if (g.streamed && i == steps / 2)
        for (int loops = 1 + c_.below(3); loops > 0; --loops) streamedLoop();  // back to back: shared rings
      step(0);
    }
    // Everything left alive is observable: a sample of it is stored.
    const int stores = int(pool_.size() < 6 ? pool_.size() : 6);
    for (int i = 0; i < stores; ++i) store(pool_[size_t(c_.below(int(pool_.size())))]);
    b_->ret();
    return g;
  }

 private:
  using DType = ir::DType;
  using Shape = ir::Shape;
  using Type = ir::Type;
  using Value = ir::Value;
  using OpKind = ir::OpKind;

  static constexpr DType kInts[] = {DType::I1, DType::I8, DType::I32, DType::I64};
  static constexpr DType kAll[] = {DType::I1, DType::I8, DType::I32, DType::I64,
                                   DType::F16, DType::BF16, DType::F32, DType::F64};

  // ---- small helpers ----
  Value* i32(int64_t v) { return b_->constantInt(Type(DType::I32), v); }
  Value* add(Value* a, Value* b) { return b_->binary(OpKind::Add, a, b); }
  Value* mul(Value* a, Value* b) { return b_->binary(OpKind::Mul, a, b); }
  Value* splatTo(Value* scalar, const Shape& s) { return s.empty() ? scalar : b_->splat(scalar, s); }
  Value* i32Tile(int64_t v, const Shape& s) { return b_->constantInt(Type(DType::I32, s), v); }

  int64_t dim() { return int64_t(1) << c_.below(6); }  // 1 .. 32
  Shape randomShape() {
    int r = c_.below(10);
    if (r == 0) return {};
    if (r < 4) return {dim()};
    return {dim(), dim()};
  }
  Shape pickShape() {
    if (!pool_.empty() && c_.percent(40)) return pool_[size_t(c_.below(int(pool_.size())))]->type().shape();
    if (c_.percent(85)) return shapes_[size_t(c_.below(int(shapes_.size())))];
    Shape s = randomShape();
    shapes_.push_back(s);
    return s;
  }
  DType pickDType(uint32_t traits) {
    if (traits & ir::kFloatOnly)  // f64 rarely: most of these ops do not lower for it (lowerable)
      return c_.percent(8) ? DType::F64 : c_.of({DType::F16, DType::BF16, DType::F32});
    if (traits & ir::kIntOnly) return c_.of(kInts);
    // The buffers' dtypes more often: their values come from memory rather than constants.
    if (c_.percent(50)) return c_.of({DType::F32, DType::F16, DType::I32});
    return c_.of(kAll);
  }

  // A constant of dtype dt: ordinary values and the edge cases (signed zero, infinities, NaN,
  // the integer extremes).
  Value* constantOf(const Shape& s, DType dt) {
    Type t(dt, s);
    if (ir::isFloat(dt)) {
      const double inf = std::numeric_limits<double>::infinity();
      double v = c_.of({0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -7.25, 1e-5, 65504.0, 1e30, inf, -inf,
                        std::numeric_limits<double>::quiet_NaN()});
      return splatOrConstant(t, [&](const Type& tt) { return b_->constant(tt, v); });
    }
    const int bits = ir::bitWidth(dt);
    int64_t v;
    if (bits == 1) {
      v = c_.below(2);
    } else {
      const int64_t hi = bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t(1) << (bits - 1)) - 1;
      const int64_t lo = -hi - 1;
      v = c_.of({int64_t(0), int64_t(1), int64_t(-1), int64_t(2), int64_t(7), int64_t(-100), hi, lo});
      if (v > hi || v < lo) v = 3;
    }
    return splatOrConstant(t, [&](const Type& tt) { return b_->constantInt(tt, v); });
  }
  template <class Make>
  Value* splatOrConstant(const Type& t, const Make& make) {
    if (t.isScalar() || c_.percent(70)) return make(t);
    return b_->splat(make(Type(t.dtype())), t.shape());  // canonicalize turns it into a constant tile
  }

  // A value of shape s and dtype dt: from the pool mostly, else made fresh.
  Value* value(const Shape& s, DType dt, int depth = 0) {
    std::vector<Value*> fits;
    for (Value* v : pool_)
      if (v->type().shape() == s && v->type().dtype() == dt) fits.push_back(v);
    if (!fits.empty() && c_.percent(75)) return fits[size_t(c_.below(int(fits.size())))];
    const bool buffered = dt == DType::F32 || dt == DType::F16 || dt == DType::I32;
    switch (depth > 2 ? c_.below(2) : c_.below(7)) {
      case 0: return constantOf(s, dt);
      case 1:
      case 2:
        if (buffered) return load(s, dt);
        [[fallthrough]];
      case 3: return b_->cast(value(s, c_.of({DType::F32, DType::I32, DType::F16}), depth + 1), dt);
      case 4:
        if (dt == DType::I32 && !s.empty()) return iotaLike(s);
        [[fallthrough]];
      case 5: {
        Value* scalar = c_.percent(50) ? n_ : alpha_;
        if (c_.percent(20)) scalar = b_->numPrograms(0);
        if (!loopIvs_.empty() && c_.percent(40)) scalar = loopIvs_.back();
        return splatTo(b_->cast(scalar, dt), s);
      }
      default: return load(s, buffered ? dt : DType::F32, dt);
    }
  }

  // An i32 tile of shape s counting along one of its axes.
  Value* iotaLike(const Shape& s) {
    const int axis = c_.below(int(s.size()));
    Value* r = b_->arange(0, s[size_t(axis)]);
    if (s.size() == 1) return r;
    return b_->broadcast(b_->expandDims(r, axis == 0 ? 1 : 0), s);
  }

  // Local offsets of shape s, every one below 2048 (kRegion less room for the induction variable).
  // Tiles have at most 1024 elements (dims up to 32, or a reshape of such a tile): row-major
  // offsets reach (s0 - 1) * ld + s1 - 1 < 1536 with ld <= s1 + 1, or 31 * 40 + 31 with ld = n
  // (used only for s0 <= 32); the base adds up to 511.
  Value* localOffsets(const Shape& s) {
    Value* base = i32(c_.below(512));
    if (s.empty()) return add(base, c_.percent(50) ? n_ : i32(c_.below(64)));
    Value* offs;
    const int pattern = c_.below(s.size() == 1 ? 2 : 6);
    if (s.size() == 1) {
      // Strided by up to 3 while that stays below 1024 (a reshaped tile has up to 1024 elements).
      const int64_t stride = s[0] <= 256 ? 1 + c_.below(3) : 1;
      if (pattern == 0) {
        Value* r = b_->arange(0, s[0]);
        offs = mul(r, i32Tile(stride, s));
      } else {
        offs = gathered(s);
      }
    } else {
      Value* r = b_->arange(0, s[0]);
      Value* col = b_->arange(0, s[1]);
      auto asCol = [&](Value* x) { return b_->broadcast(b_->expandDims(x, 1), s); };
      auto asRow = [&](Value* x) { return b_->broadcast(b_->expandDims(x, 0), s); };
      switch (pattern) {
        case 0: {  // row-major with a leading dimension of the tile's width, one more, or n
          Value* ld = s[0] <= 32 && c_.percent(40) ? n_ : i32(s[1] + c_.below(2));
          Value* rowStarts = asCol(mul(r, b_->splat(ld, {s[0]})));
          offs = add(rowStarts, asRow(col));
          break;
        }
        case 1: {  // column-major
          Value* rows = asCol(r);
          offs = add(rows, asRow(mul(col, i32Tile(s[0], {s[1]}))));
          break;
        }
        case 2: offs = asCol(r); break;  // every column the same: repeated addresses
        case 3: offs = gathered(s); break;
        case 4: {  // a reshaped arange
          Value* flat = b_->arange(0, s[0] * s[1]);
          offs = b_->reshape(flat, s);
          break;
        }
        default: {  // the transpose of a row-major tile of the transposed shape
          Value* rt = b_->arange(0, s[1]);
          Value* ct = b_->arange(0, s[0]);
          Shape t{s[1], s[0]};
          Value* rowStarts = b_->broadcast(b_->expandDims(mul(rt, i32Tile(s[0], {s[1]})), 1), t);
          Value* rowMajor = add(rowStarts, b_->broadcast(b_->expandDims(ct, 0), t));
          offs = b_->trans(rowMajor, {1, 0});
          break;
        }
      }
    }
    return add(offs, b_->splat(base, s));
  }
  // Offsets read from data: an i32 value of the pool (or loaded) masked to [0, 1024).
  Value* gathered(const Shape& s) {
    Value* v = value(s, DType::I32, 3);
    return b_->binary(OpKind::And, v, i32Tile(1023, s));
  }

  // Pointers of dtype dt at shape s inside this program's region (with the innermost induction
  // variable added sometimes, so loop iterations touch different elements), and optionally a mask;
  // with a mask, the masked-off lanes may point out of the buffer.
  struct Access {
    Value* ptrs;
    Value* mask = nullptr;
  };
  Access access(const Shape& s, DType dt, bool allowMask) {
    Value* local = localOffsets(s);
    if (!loopIvs_.empty() && c_.percent(50)) {
      Value* iv = loopIvs_.back();
      if (iv->type().dtype() != DType::I32) iv = b_->cast(iv, DType::I32);
      local = add(local, splatTo(b_->binary(OpKind::And, iv, i32(63)), s));
    }
    Value* offs = add(local, splatTo(regionBase_, s));
    Access a;
    if (allowMask && !s.empty() && c_.percent(60)) {
      a.mask = mask(s, local);
      if (c_.percent(40)) offs = b_->select(a.mask, offs, add(offs, i32Tile(kOutOfBuffer, s)));
    }
    Value* base = dt == DType::F32 ? bufF32_ : dt == DType::F16 ? bufF16_ : bufI32_;
    a.ptrs = b_->addptr(splatTo(base, s), offs);
    return a;
  }
  Value* mask(const Shape& s, Value* local) {
    switch (c_.below(4)) {
      case 0: return b_->cmp("lt", local, b_->splat(mul(n_, i32(1 + c_.below(40))), s));
      case 1: return value(s, DType::I1, 2);
      case 2: {
        const OpKind join = c_.percent(50) ? OpKind::And : OpKind::Or;
        Value* drawn = value(s, DType::I1, 2);
        Value* counted = iotaLike(s);
        return b_->binary(join, drawn, b_->cmp("lt", counted, b_->splat(n_, s)));
      }
      default: {
        const char* predicate = c_.of({"lt", "le", "gt", "ge", "eq", "ne"});
        return b_->cmp(predicate, local, b_->splat(mul(n_, n_), s));
      }
    }
  }

  // A load of shape s from the buffer of dtype `from`, cast to `to` (default: from).
  Value* load(const Shape& s, DType from, DType to = DType::Ptr) {
    Access a = access(s, from, true);
    Value* v;
    if (!a.mask) v = b_->load(a.ptrs);
    else if (c_.percent(50)) v = b_->load(a.ptrs, a.mask);
    else v = b_->load(a.ptrs, a.mask, constantOf(s, from));
    if (to != DType::Ptr && to != from) v = b_->cast(v, to);
    return v;
  }

  // Stores v (cast to a buffer's dtype) into this program's region.
  void store(Value* v) {
    const Shape s = v->type().shape();
    DType dt = v->type().dtype();
    if (dt != DType::F32 && dt != DType::F16 && dt != DType::I32) dt = c_.of({DType::F32, DType::F16, DType::I32});
    if (v->type().dtype() != dt) v = b_->cast(v, dt);
    Access a = access(s, dt, true);
    b_->store(a.ptrs, v, a.mask);
  }

  void push(Value* v) {
    if (v && !v->type().isPointer()) pool_.push_back(v);
  }
  Value* fresh() {
    const Shape s = pickShape();
    return value(s, pickDType(0));
  }
  Value* any() {
    if (pool_.empty() || c_.percent(15)) return fresh();
    return pool_[size_t(c_.below(int(pool_.size())))];
  }

  Value* elementwise() {
    const auto& ops = elementwiseOps();
    const ElementwiseOp& op = ops[size_t(c_.below(int(ops.size())))];
    const Shape s = pickShape();
    switch (op.kind) {
      case OpKind::AddPtr: return load(s, c_.of({DType::F32, DType::F16, DType::I32}));  // addresses are addptrs
      case OpKind::Cmp: {
        const DType dt = pickDType(0);
        const char* predicate = c_.of({"eq", "ne", "lt", "le", "gt", "ge"});
        Value* lhs = value(s, dt);
        return b_->cmp(predicate, lhs, value(s, dt));
      }
      case OpKind::Select: {
        const DType dt = pickDType(0);
        Value* condition = value(s, DType::I1);
        Value* ifTrue = value(s, dt);
        return b_->select(condition, ifTrue, value(s, dt));
      }
      case OpKind::Cast: {
        Value* x = value(s, pickDType(0));
        return b_->cast(x, c_.of(kAll));
      }
      default: break;
    }
    const DType dt = pickDType(op.traits);
    const bool approximate = op.kind == OpKind::Exp || op.kind == OpKind::Exp2 || op.kind == OpKind::Log ||
                             op.kind == OpKind::Log2 || op.kind == OpKind::Tanh;
    if (approximate && dt == DType::F64) g_->lowerable = false;
    std::vector<Value*> operands;
    for (int i = 0; i < op.operands; ++i) operands.push_back(value(s, dt));
    if ((op.kind == OpKind::Div || op.kind == OpKind::Rem) && ir::isInteger(dt)) {
      // A zero divisor is an error in the interpreter (and undefined on the GPU): make it 1.
      Value* d = operands[1];
      Value* zero = splatTo(b_->constantInt(Type(dt), 0), s);
      Value* one = splatTo(b_->constantInt(Type(dt), 1), s);
      operands[1] = b_->select(b_->cmp("eq", d, zero), one, d);
    }
    Type result(dt, s);
    return b_->create1(op.kind, operands, result);
  }

  Value* shapeOp() {
    Value* x = any();
    const Shape s = x->type().shape();
    switch (c_.below(5)) {
      case 0:
        if (s.size() <= 1) return b_->expandDims(x, c_.below(int(s.size()) + 1));
        break;
      case 1: {  // a dim of 1 broadcast to a power of two
        if (s.size() != 1 || s[0] > 32) break;
        const int axis = c_.below(2);
        Shape to = axis == 0 ? Shape{dim(), s[0]} : Shape{s[0], dim()};
        return b_->broadcast(b_->expandDims(x, axis), to);
      }
      case 2:
        if (s.size() == 2) return b_->trans(x, {1, 0});
        break;
      case 3:
        if (s.size() == 2) return b_->reshape(x, c_.percent(50) ? Shape{s[0] * s[1]} : Shape{s[1], s[0]});
        if (s.size() == 1 && s[0] >= 2) return b_->reshape(x, {2, s[0] / 2});
        break;
      default:
        if (s.empty()) return b_->splat(x, shapes_[0].empty() ? Shape{dim(), dim()} : shapes_[0]);
        break;
    }
    return nullptr;
  }

  Value* reduce() {
    Value* x = any();
    if (x->type().isScalar()) return nullptr;
    const int axis = c_.below(x->type().rank());
    return b_->reduce(x, axis, c_.of({"sum", "max", "min"}));
  }

  Value* dot() {
    const int64_t m = dim(), k = dim(), n = dim();
    DType in, acc;
    // Rarely what the lowering refuses (lowerable): i8 into i32, f64 inputs, an f16 accumulator.
    if (c_.percent(3)) {
      in = DType::I8;
      acc = DType::I32;
    } else {
      in = c_.percent(4) ? DType::F64 : c_.of({DType::F16, DType::BF16, DType::F32});
      acc = c_.percent(96) ? DType::F32 : DType::F16;
    }
    if (in == DType::F64 || in == DType::I8 || acc != DType::F32) g_->lowerable = false;
    Value* a = value({m, k}, in);
    Value* b = value({k, n}, in);
    return b_->dot(a, b, value({m, n}, acc));
  }

  // A dot whose B operand is rows [row0, row0 + k) of the f16 buffer viewed as a [R, C] tensor
  // (row stride C), loaded as that tensor box: R is n where the buffer holds n rows, else the
  // rows it holds, so tiles past the end are cut (zero-filled) anywhere; row0 moves with the
  // innermost induction variable. The mask and the pointers are exactly the box's (the
  // interpreter checks it), with `other` zero (+0 or -0, a constant or a splat).
  // With `acc` ([m, C] f32, the caller's carried accumulator, m and C the program's own), the dot
  // accumulates into it and is returned whole.
  Value* streamedDot(Value* acc = nullptr) {
    const bool same = acc || c_.percent(80);
    const int64_t C = same ? streamC_ : c_.of({int64_t(8), int64_t(16), int64_t(32), int64_t(64), int64_t(128)});
    const int64_t k = same ? streamK_ : c_.of({int64_t(16), int64_t(32)});
    const int64_t m = same ? streamM_ : c_.of({int64_t(16), int64_t(32), int64_t(64)});
    const Shape s{k, C};
    Value* iv = ivAsI32();
    const BoxedRows t = boxedRows(bufF16_, mul(iv, i32(c_.percent(50) ? k : 8)), k, C);
    Value* other = c_.percent(50) ? b_->constant(Type(DType::F16, s), 0.0)
                                  : b_->splat(b_->constant(Type(DType::F16), -0.0), s);
    Value* bt = b_->load(t.ptrs, t.live, other, t.box);
    Value* a = wideValue({m, k}, DType::F16);
    Value* d = b_->dot(a, bt, acc ? acc : wideValue({m, C}, DType::F32));
    if (acc) return d;  // the caller carries it
    // Tiles past 1024 elements must not reach the pool (localOffsets' bound): a row reduction
    // does, stored at once so that the dot is never dead code.
    const int axis = c_.below(2);
    Value* folded = b_->reduce(d, axis, c_.of({"sum", "max", "min"}));
    store(folded);
    return folded;
  }
  // A value of a shape past the pool's 1024 elements: a constant, a scalar splat, or a load at
  // offsets wrapped into [0, 1024) of the region.
  Value* wideValue(const Shape& s, DType dt) {
    switch (c_.below(3)) {
      case 0: return constantOf(s, dt);
      case 1: return b_->splat(b_->cast(c_.percent(50) ? alpha_ : n_, dt), s);
      default: {
        Value* flat = b_->reshape(b_->arange(0, s[0] * s[1]), s);
        Value* wrapped = b_->binary(OpKind::And, flat, i32Tile(1023, s));
        Value* offs = add(wrapped, b_->splat(add(regionBase_, i32(c_.below(512))), s));
        Value* ptrs = b_->addptr(b_->splat(dt == DType::F16 ? bufF16_ : bufF32_, s), offs);
        return b_->load(ptrs);
      }
    }
  }

  Value* atomic() {
    const Shape s = pickShape();
    if (g_->streamed && s.size() == 2 && c_.percent(50)) return boxedAtomic(s);
    const DType dt = c_.percent(50) ? DType::F32 : DType::I32;
    Access a = access(s, dt, true);
    return b_->atomicAdd(a.ptrs, value(s, dt), a.mask);
  }
  // An f32 tile [R, C] added into rows [row0, row0 + R) of the f32 buffer viewed as a [rows, C]
  // tensor (rows as streamedDot's), named as that tensor box too: the mask and the pointers are
  // exactly the box's. On sm_90a, where its old values go unused, the bulk-reduce pass adds it by
  // TMA reductions (bulk_tensor). One program only (streamed programs), so its rows race nothing.
  Value* boxedAtomic(const Shape& s) {
    const int64_t R = s[0], C = s[1];
    Value* row0;
    if (loopIvs_.empty() || c_.percent(30)) {
      row0 = i32(c_.below(9));
    } else {
      Value* iv = ivAsI32();
      row0 = mul(iv, i32(c_.percent(50) ? R : 3));
    }
    const BoxedRows t = boxedRows(bufF32_, row0, R, C);
    return b_->atomicAdd(t.ptrs, value(s, DType::F32), t.live, t.box);
  }
  // Rows [row0, row0 + R) of `buf` viewed as a [rows, C] tensor (row stride C; rows is n where the
  // region holds n rows, else the rows it holds): the pointers, the mask of the rows inside, and
  // that tensor box.
  struct BoxedRows {
    Value *ptrs, *live;
    ir::TensorBox box;
  };
  BoxedRows boxedRows(Value* buf, Value* row0, int64_t R, int64_t C) {
    const Shape s{R, C};
    Value* rows = C * 40 <= kRegion ? n_ : i32(kRegion / C);
    Value* row0s = b_->splat(row0, {R});
    Value* rowsOf = b_->broadcast(b_->expandDims(add(row0s, b_->arange(0, R)), 1), s);
    Value* rowStarts = mul(rowsOf, i32Tile(C, s));
    Value* offs = add(rowStarts, b_->broadcast(b_->expandDims(b_->arange(0, C), 0), s));
    return {b_->addptr(b_->splat(buf, s), offs), b_->cmp("lt", rowsOf, b_->splat(rows, s)),
            ir::TensorBox{buf, {rows, i32(C)}, {i32(C)}, {row0, i32(0)}}};
  }
  // The innermost induction variable as i32, bounded to [0, 3] (rows stay inside the region).
  Value* ivAsI32() {
    Value* iv = loopIvs_.back();
    if (iv->type().dtype() != DType::I32) iv = b_->cast(iv, DType::I32);
    return b_->binary(OpKind::And, iv, i32(3));
  }

  void loop(int depth) {
    const bool wide = c_.percent(25);  // i64 bounds
    auto bound = [&](Value* v) { return wide ? b_->cast(v, DType::I64) : v; };
    Value* lb = bound(i32(c_.below(3)));
    Value* ub;
    switch (c_.below(3)) {
      case 0: ub = bound(n_); break;
      case 1: ub = bound(i32(c_.below(6))); break;  // sometimes no iteration at all
      default: ub = bound(b_->binary(OpKind::Shr, n_, i32(2))); break;
    }
    Value* stepV = bound(i32(1 + c_.below(3)));
    std::vector<Value*> inits;
    for (int i = 0, carried = 1 + c_.below(3); i < carried; ++i) inits.push_back(any());
    const auto saved = pool_;
    auto results = b_->forLoop(lb, ub, stepV, inits, [&](Value* iv, std::vector<Value*> args) {
      loopIvs_.push_back(iv);
      for (Value* a : args) push(a);
      if (g_->streamed && c_.percent(60)) push(streamedDot());
      for (int i = 0, steps = 1 + c_.below(6); i < steps; ++i) step(depth + 1);
      std::vector<Value*> next;
      for (Value* a : args) next.push_back(c_.percent(80) ? value(a->type().shape(), a->type().dtype()) : a);
      loopIvs_.pop_back();
      return next;
    });
    pool_ = saved;
    for (Value* r : results) push(r);
  }

  // A loop around a streamed dot with few other ops in its body (more streamed dots come from
  // step()): the pattern the pipeline's TMA rings serve.
  void streamedLoop() {
    Value* lb = i32(c_.below(2));
    Value* ub = c_.percent(50) ? n_ : i32(c_.below(12));
    // A loop of at most one trip, as a peeled walk's prologue (the pipeline proves the bound:
    // staticTripBound, and issues no refill in it).
    if (c_.percent(25)) ub = b_->binary(OpKind::Minimum, ub, add(lb, i32(1)));
    const auto saved = pool_;
    // Half the loops accumulate one dot across iterations (a GEMM's K loop, the forward's P·V):
    // the accumulator is carried, reduced and stored after the loop, and the body holds nothing
    // else, so it may take the warpgroup turns.
    const bool accumulate = c_.percent(50);
    std::vector<Value*> inits{any()};
    if (accumulate) inits.push_back(wideValue({streamM_, streamC_}, DType::F32));
    auto results = b_->forLoop(lb, ub, i32(1 + c_.below(2)), inits, [&](Value* iv, std::vector<Value*> args) {
      loopIvs_.push_back(iv);
      push(args[0]);
      std::vector<Value*> next;
      if (accumulate) {
        Value* acc = streamedDot(args[1]);
        next = {args[0], acc};
      } else {
        push(streamedDot());
        for (int i = 0, steps = c_.below(3); i < steps; ++i) step(1);
        next = {c_.percent(70) ? value(args[0]->type().shape(), args[0]->type().dtype()) : args[0]};
      }
      loopIvs_.pop_back();
      return next;
    });
    pool_ = saved;
    push(results[0]);
    if (accumulate) {
      const int axis = c_.below(2);
      Value* folded = b_->reduce(results[1], axis, c_.of({"sum", "max", "min"}));
      store(folded);
      push(folded);
    }
  }

  void step(int depth) {
    Value* r = nullptr;
    switch (c_.below(16)) {
      case 0:
      case 1:
      case 2:
      case 3:
      case 4: r = elementwise(); break;
      case 5: r = reduce(); break;
      case 6:
      case 7: r = shapeOp(); break;
      case 8: r = g_->streamed && !loopIvs_.empty() && c_.percent(70) ? streamedDot() : dot(); break;
      case 9: {
        const Shape s = pickShape();
        r = load(s, c_.of({DType::F32, DType::F16, DType::I32}));
        break;
      }
      case 10:
      case 11: store(any()); break;
      case 12: r = atomic(); break;
      case 13:
      case 14:
        if (depth < 2) loop(depth);
        break;
      default: r = fresh(); break;
    }
    push(r);
  }

  Choices& c_;
  GeneratedProgram* g_ = nullptr;
  ir::Function* f_ = nullptr;
  std::unique_ptr<ir::Builder> b_;
  Value *bufF32_ = nullptr, *bufF16_ = nullptr, *bufI32_ = nullptr, *n_ = nullptr, *alpha_ = nullptr;
  Value *pid_ = nullptr, *regionBase_ = nullptr;
  std::vector<Shape> shapes_;
  std::vector<Value*> pool_;
  std::vector<Value*> loopIvs_;
  int64_t streamC_ = 32, streamK_ = 16, streamM_ = 16;  // the streamed dots' usual tile
};

}  // namespace flextile::fuzz
