// Helpers for the layout tests: a checker of the per-op layout rules (until
// ir/Verifier.h lands) and builders of small kernels in the style of the DSL.
#pragma once

#include <cmath>
#include <cstdlib>
#include <random>
#include <functional>
#include <limits>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

#include "ir/Builder.h"
#include "ir/IR.h"

namespace flextile::testing {

using namespace flextile::ir;

inline std::string layoutOf(const Value* v) { return v->type().hasLayout() ? v->type().layout()->str() : "<none>"; }

// Every rule of codegen/Passes.h; returns one message per violation.
inline std::vector<std::string> layoutRuleViolations(const Function& f) {
  std::vector<std::string> errs;
  const int nw = f.numWarps();
  int warpBits = 0;
  while ((1 << warpBits) < nw) ++warpBits;
  auto checkValue = [&](const Value* v, const std::string& where) {
    if (!v->type().isTile()) {
      if (v->type().hasLayout()) errs.push_back(where + ": scalar %" + std::to_string(v->id()) + " has a layout");
      return;
    }
    if (!v->type().hasLayout()) {
      errs.push_back(where + ": tile %" + std::to_string(v->id()) + " has no layout");
      return;
    }
    const Layout& l = *v->type().layout();
    if (auto e = l.verify(); !e.empty()) errs.push_back(where + ": invalid layout: " + e);
    if (l.shape() != v->type().shape()) errs.push_back(where + ": layout shape differs from the type's");
    if (int(l.warpBases().size()) != warpBits) errs.push_back(where + ": layout has the wrong number of warp bases");
    if (l.laneBases().size() != 5) errs.push_back(where + ": layout has the wrong number of lane bases");
  };
  auto same = [&](const Op& op, const std::vector<const Value*>& vs) {
    const Value* first = nullptr;
    for (const Value* v : vs) {
      if (!v || !v->type().isTile() || !v->type().hasLayout()) continue;
      if (!first) first = v;
      else if (*first->type().layout() != *v->type().layout())
        errs.push_back(op.describe() + ": %" + std::to_string(first->id()) + " and %" + std::to_string(v->id()) +
                       " must share a layout: " + layoutOf(first) + " vs " + layoutOf(v));
    }
  };
  auto expectEq = [&](const Op& op, const Layout& want, const Value* v, const std::string& rule) {
    if (!v->type().hasLayout() || *v->type().layout() != want)
      errs.push_back(op.describe() + ": " + rule + ": want " + want.str() + ", got " + layoutOf(v));
  };
  for (const Value* p : f.params()) checkValue(p, "parameter");
  f.walk([&](const Op& op) {
    for (const Value* r : op.results()) checkValue(r, op.describe());
    for (const auto& reg : op.regions())
      for (const Value* a : reg->args()) checkValue(a, op.describe() + " region arg");
    auto tileWithLayout = [](const Value* v) { return v->type().isTile() && v->type().hasLayout(); };
    switch (op.kind()) {
      case OpKind::Broadcast:
        if (tileWithLayout(op.operand(0)) && tileWithLayout(op.result()))
          expectEq(op, op.result()->type().layout()->projected(op.operand(0)->type().shape()), op.operand(0),
                   "broadcast operand == result.projected");
        break;
      case OpKind::ExpandDims:
        if (tileWithLayout(op.operand(0)) && tileWithLayout(op.result()))
          expectEq(op, op.result()->type().layout()->sliced(int(op.intAttr("axis"))), op.operand(0),
                   "expand_dims operand == result.sliced");
        break;
      case OpKind::Reshape:
        if (tileWithLayout(op.operand(0)) && tileWithLayout(op.result()))
          expectEq(op, op.operand(0)->type().layout()->reshaped(op.result()->type().shape()), op.result(),
                   "reshape result == operand.reshaped");
        break;
      case OpKind::Trans: {
        std::vector<int> perm;
        for (auto p : op.intsAttr("perm")) perm.push_back(int(p));
        if (tileWithLayout(op.operand(0)) && tileWithLayout(op.result()))
          expectEq(op, op.operand(0)->type().layout()->transposed(perm), op.result(), "trans result == operand.transposed");
        break;
      }
      case OpKind::Reduce:
        if (tileWithLayout(op.operand(0)) && tileWithLayout(op.result()))
          expectEq(op, op.operand(0)->type().layout()->sliced(int(op.intAttr("axis"))), op.result(),
                   "reduce result == operand.sliced");
        break;
      case OpKind::Load:
      case OpKind::AtomicAdd: {
        std::vector<const Value*> vs(op.operands().begin(), op.operands().end());
        vs.push_back(op.result());
        same(op, vs);
        break;
      }
      case OpKind::Store:
        same(op, std::vector<const Value*>(op.operands().begin(), op.operands().end()));
        break;
      case OpKind::Dot:
        same(op, {op.operand(2), op.result()});
        break;
      case OpKind::For: {
        const Op* yield = op.region().terminator();
        for (size_t i = 0; i < op.numResults(); ++i)
          same(op, {op.operand(3 + i), op.region().arg(1 + i), op.result(i), yield ? yield->operand(i) : nullptr});
        break;
      }
      default:
        if (op.hasTrait(kElementwise)) {
          std::vector<const Value*> vs(op.operands().begin(), op.operands().end());
          vs.push_back(op.result());
          same(op, vs);
        }
        break;
    }
  });
  return errs;
}

inline int countOps(const Function& f, OpKind k) {
  int n = 0;
  f.walk([&](const Op& op) { n += op.kind() == k; });
  return n;
}

inline std::vector<const Op*> opsOf(const Function& f, OpKind k) {
  std::vector<const Op*> out;
  f.walk([&](const Op& op) {
    if (op.kind() == k) out.push_back(&op);
  });
  return out;
}

// ---- kernels ------------------------------------------------------------------

inline constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// A thin layer over ir::Builder so the kernels read like the DSL.
struct K {
  Builder& b;
  Value* i32(int64_t v) { return b.constantInt(Type(DType::I32), v); }
  Value* add(Value* x, Value* y) { return b.binary(OpKind::Add, x, y); }
  Value* sub(Value* x, Value* y) { return b.binary(OpKind::Sub, x, y); }
  Value* mul(Value* x, Value* y) { return b.binary(OpKind::Mul, x, y); }
  Value* div(Value* x, Value* y) { return b.binary(OpKind::Div, x, y); }
  Value* land(Value* x, Value* y) { return b.binary(OpKind::And, x, y); }
  Value* lt(Value* x, Value* y) { return b.cmp("lt", x, y); }
  Value* splat(Value* s, const Shape& shape) { return b.splat(s, shape); }
  // x[:, None] / x[None, :] broadcast to shape.
  Value* col(Value* x, const Shape& shape) { return b.broadcast(b.expandDims(x, 1), shape); }
  Value* row(Value* x, const Shape& shape) { return b.broadcast(b.expandDims(x, 0), shape); }
  Value* ptrs(Value* base, Value* offsets) { return b.addptr(b.splat(base, offsets->type().shape()), offsets); }
};

inline void setAttrs(Function& f, int numWarps, std::vector<int64_t> argDivisibility) {
  f.attrs()["num_warps"] = int64_t(numWarps);
  if (!argDivisibility.empty()) f.attrs()["arg_divisibility"] = std::move(argDivisibility);
}

// y[64, 128] = x[64, 128] + v[None, :], with v = vectorOf(k, pointers to bias[0..128)): the
// program behind the tests of how a loaded or computed column vector reaches a tile's layout.
struct BiasAdd {
  std::unique_ptr<Function> f;
  Value* tile;  // the loaded x tile
};
inline BiasAdd biasAdd(const std::function<Value*(K&, Value* biasPointers)>& vectorOf) {
  auto f = std::make_unique<Function>("bias");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* bias = f->addParam(Type::pointer(DType::F32), "bias");
  Value* y = f->addParam(Type::pointer(DType::F32), "y");
  setAttrs(*f, 4, {});
  Builder b(*f);
  K k{b};
  const Shape tile{64, 128};
  Value* cols = b.arange(0, 128);
  Value* offs = k.add(k.col(k.mul(b.arange(0, 64), k.splat(k.i32(128), {64})), tile), k.row(cols, tile));
  Value* t = b.load(k.ptrs(x, offs));
  b.store(k.ptrs(y, offs), k.add(t, k.row(vectorOf(k, k.ptrs(bias, cols)), tile)));
  b.ret();
  return {std::move(f), t};
}

// out[i] = x[i] + y[i] for i < n, one BLOCK per program.
inline std::unique_ptr<Function> vectorAdd(int64_t block, int numWarps, int64_t nDivisibility) {
  auto f = std::make_unique<Function>("vector_add");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* y = f->addParam(Type::pointer(DType::F32), "y");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Value* n = f->addParam(Type(DType::I32), "n");
  setAttrs(*f, numWarps, {16, 16, 16, nDivisibility});
  Builder b(*f);
  K k{b};
  Value* offs = k.add(k.splat(k.mul(b.programId(0), k.i32(block)), {block}), b.arange(0, block));
  Value* mask = k.lt(offs, k.splat(n, {block}));
  Value* sum = k.add(b.load(k.ptrs(x, offs), mask), b.load(k.ptrs(y, offs), mask));
  b.store(k.ptrs(out, offs), sum, mask);
  b.ret();
  return f;
}

// Row softmax in the exp2 domain over an [M, N] row-major matrix (stride N),
// one [BM, BN] tile per program, BN >= N; masked loads fill with -inf.
inline std::unique_ptr<Function> rowSoftmax(int64_t bm, int64_t bn, int numWarps, int64_t nDivisibility,
                                            DType dtype = DType::F32) {
  auto f = std::make_unique<Function>("row_softmax");
  Value* x = f->addParam(Type::pointer(dtype), "x");
  Value* y = f->addParam(Type::pointer(dtype), "y");
  Value* m = f->addParam(Type(DType::I32), "M");
  Value* n = f->addParam(Type(DType::I32), "N");
  setAttrs(*f, numWarps, {16, 16, 1, nDivisibility});
  Builder b(*f);
  K k{b};
  const Shape tile{bm, bn};
  Value* rows = k.add(k.splat(k.mul(b.programId(0), k.i32(bm)), {bm}), b.arange(0, bm));
  Value* cols = b.arange(0, bn);
  Value* offs = k.add(k.col(k.mul(rows, k.splat(n, {bm})), tile), k.row(cols, tile));
  Value* mask = k.land(k.col(k.lt(rows, k.splat(m, {bm})), tile), k.row(k.lt(cols, k.splat(n, {bn})), tile));
  Value* t = b.load(k.ptrs(x, offs), mask, b.constant(Type(dtype, tile), kNegInf));
  Value* mx = b.reduce(t, 1, "max");
  Value* p = b.unary(OpKind::Exp2, k.sub(t, k.col(mx, tile)));
  Value* sum = b.reduce(p, 1, "sum");
  b.store(k.ptrs(y, offs), k.div(p, k.col(sum, tile)), mask);
  b.ret();
  return f;
}

// C[M, N] = A[M, K] @ B[K, N] (row-major, f16 inputs, f32 accumulation), one
// [BM, BN] tile of C per program, a loop over K in steps of BK. With
// `carriedPointers` the A and B pointer tiles are loop-carried and advanced
// by BK each iteration (Triton's classic form); otherwise they are
// recomputed from the induction variable.
inline std::unique_ptr<Function> matmul(int64_t bm, int64_t bn, int64_t bk, int numWarps, bool carriedPointers,
                                        int64_t dimDivisibility = 16, DType in = DType::F16) {
  auto f = std::make_unique<Function>("matmul");
  Value* a = f->addParam(Type::pointer(in), "a");
  Value* bp = f->addParam(Type::pointer(in), "b");
  Value* c = f->addParam(Type::pointer(DType::F32), "c");
  Value* M = f->addParam(Type(DType::I32), "M");
  Value* N = f->addParam(Type(DType::I32), "N");
  Value* Kd = f->addParam(Type(DType::I32), "K");
  setAttrs(*f, numWarps, {16, 16, 16, dimDivisibility, dimDivisibility, dimDivisibility});
  Builder b(*f);
  K k{b};
  Value* rm = k.add(k.splat(k.mul(b.programId(0), k.i32(bm)), {bm}), b.arange(0, bm));
  Value* rn = k.add(k.splat(k.mul(b.programId(1), k.i32(bn)), {bn}), b.arange(0, bn));
  Value* rk = b.arange(0, bk);
  const Shape aShape{bm, bk}, bShape{bk, bn}, cShape{bm, bn};
  Value* acc0 = b.constant(Type(DType::F32, cShape), 0.0);
  auto aOffsets = [&](Value* kcols) { return k.add(k.col(k.mul(rm, k.splat(Kd, {bm})), aShape), k.row(kcols, aShape)); };
  auto bOffsets = [&](Value* krows) { return k.add(k.col(k.mul(krows, k.splat(N, {bk})), bShape), k.row(rn, bShape)); };
  auto aMask = [&](Value* kcols) {
    return k.land(k.col(k.lt(rm, k.splat(M, {bm})), aShape), k.row(k.lt(kcols, k.splat(Kd, {bk})), aShape));
  };
  auto bMask = [&](Value* krows) {
    return k.land(k.col(k.lt(krows, k.splat(Kd, {bk})), bShape), k.row(k.lt(rn, k.splat(N, {bn})), bShape));
  };
  Value* result;
  if (!carriedPointers) {
    result = b.forLoop(k.i32(0), Kd, k.i32(bk), {acc0}, [&](Value* iv, std::vector<Value*> carried) {
      Value* kk = k.add(k.splat(iv, {bk}), rk);
      Value* at = b.load(k.ptrs(a, aOffsets(kk)), aMask(kk), b.constant(Type(in, aShape), 0.0));
      Value* bt = b.load(k.ptrs(bp, bOffsets(kk)), bMask(kk), b.constant(Type(in, bShape), 0.0));
      return std::vector<Value*>{b.dot(at, bt, carried[0])};
    })[0];
  } else {
    Value* ap0 = k.ptrs(a, aOffsets(rk));
    Value* bp0 = k.ptrs(bp, bOffsets(rk));
    auto res = b.forLoop(k.i32(0), Kd, k.i32(bk), {acc0, ap0, bp0}, [&](Value* iv, std::vector<Value*> carried) {
      Value* kk = k.add(k.splat(iv, {bk}), rk);
      Value* at = b.load(carried[1], aMask(kk), b.constant(Type(in, aShape), 0.0));
      Value* bt = b.load(carried[2], bMask(kk), b.constant(Type(in, bShape), 0.0));
      Value* acc = b.dot(at, bt, carried[0]);
      Value* an = b.addptr(carried[1], k.splat(k.i32(bk), aShape));
      Value* bn2 = b.addptr(carried[2], k.splat(k.mul(k.i32(bk), N), bShape));
      return std::vector<Value*>{acc, an, bn2};
    });
    result = res[0];
  }
  Value* cOffsets = k.add(k.col(k.mul(rm, k.splat(N, {bm})), cShape), k.row(rn, cShape));
  Value* cMask = k.land(k.col(k.lt(rm, k.splat(M, {bm})), cShape), k.row(k.lt(rn, k.splat(N, {bn})), cShape));
  b.store(k.ptrs(c, cOffsets), result, cMask);
  b.ret();
  return f;
}

// Row sums of an [M, N] matrix with a loop over column tiles: a [BM]
// accumulator initialised by a splat constant and updated by a reduction.
// With `online` also the running maximum and an exp2-rescaled sum, as in an
// online softmax.
inline std::unique_ptr<Function> rowSumLoop(int64_t bm, int64_t bn, int numWarps, bool online) {
  auto f = std::make_unique<Function>("row_sum_loop");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Value* M = f->addParam(Type(DType::I32), "M");
  Value* N = f->addParam(Type(DType::I32), "N");
  setAttrs(*f, numWarps, {16, 16, 1, 16});
  Builder b(*f);
  K k{b};
  const Shape tile{bm, bn};
  Value* rows = k.add(k.splat(k.mul(b.programId(0), k.i32(bm)), {bm}), b.arange(0, bm));
  Value* rowOk = k.lt(rows, k.splat(M, {bm}));
  std::vector<Value*> init{b.constant(Type(DType::F32, {bm}), 0.0)};
  if (online) init.push_back(b.constant(Type(DType::F32, {bm}), kNegInf));
  auto res = b.forLoop(k.i32(0), N, k.i32(bn), init, [&](Value* iv, std::vector<Value*> carried) {
    Value* cols = k.add(k.splat(iv, {bn}), b.arange(0, bn));
    Value* offs = k.add(k.col(k.mul(rows, k.splat(N, {bm})), tile), k.row(cols, tile));
    Value* mask = k.land(k.col(rowOk, tile), k.row(k.lt(cols, k.splat(N, {bn})), tile));
    Value* t = b.load(k.ptrs(x, offs), mask, b.constant(Type(DType::F32, tile), online ? kNegInf : 0.0));
    if (!online) return std::vector<Value*>{k.add(carried[0], b.reduce(t, 1, "sum"))};
    Value* mNew = b.binary(OpKind::Maximum, carried[1], b.reduce(t, 1, "max"));
    Value* alpha = b.unary(OpKind::Exp2, k.sub(carried[1], mNew));
    Value* p = b.unary(OpKind::Exp2, k.sub(t, k.col(mNew, tile)));
    Value* l = k.add(k.mul(carried[0], alpha), b.reduce(p, 1, "sum"));
    return std::vector<Value*>{l, mNew};
  });
  b.store(k.ptrs(out, rows), res[0], rowOk);
  b.ret();
  return f;
}

}  // namespace flextile::testing

namespace flextile::testing {

// A plain dump for failure messages (ir/Printer.h will replace it): layouts
// are listed once and referred to by alias.
inline std::string dump(const Function& f) {
  std::vector<std::string> aliases;
  auto alias = [&](const Value* v) -> std::string {
    if (!v->type().hasLayout()) return "";
    std::string s = v->type().layout()->str();
    for (size_t i = 0; i < aliases.size(); ++i)
      if (aliases[i] == s) return " #L" + std::to_string(i);
    aliases.push_back(s);
    return " #L" + std::to_string(aliases.size() - 1);
  };
  auto val = [](const Value* v) { return "%" + std::to_string(v->id()); };
  std::string body;
  std::function<void(const Block&, int)> block = [&](const Block& b, int depth) {
    for (const auto& op : b.ops()) {
      std::string line(size_t(depth) * 2, ' ');
      for (size_t i = 0; i < op->numResults(); ++i) line += (i ? ", " : "") + val(op->result(i));
      if (op->numResults()) line += " = ";
      line += std::string(op->name()) + "(";
      for (size_t i = 0; i < op->numOperands(); ++i) line += (i ? ", " : "") + val(op->operand(i));
      line += ")";
      for (const auto& [k, a] : op->attrs()) line += " " + k + "=" + attrString(a);
      for (const Value* r : op->results()) line += " : " + r->type().str() + alias(r);
      body += line + "\n";
      for (const auto& reg : op->regions()) {
        std::string args(size_t(depth) * 2 + 2, ' ');
        args += "^(";
        for (const Value* a : reg->args()) args += val(a) + ": " + a->type().str() + alias(a) + " ";
        body += args + ")\n";
        block(*reg, depth + 2);
      }
    }
  };
  block(f.body(), 0);
  std::string out;
  for (size_t i = 0; i < aliases.size(); ++i) out += "#L" + std::to_string(i) + " = " + aliases[i] + "\n";
  return out + "func " + f.name() + "\n" + body;
}

}  // namespace flextile::testing

namespace flextile::testing {

// What the program computes, independent of layouts: one hash per effect
// (store, loop, yield, return) in program order, where a value hashes its
// defining op's kind, attributes, dtype, shape and operands; convert_layout
// hashes as its operand and clones hash like their originals. Layout
// assignment must leave it unchanged (it only adds conversions, recomputes
// pure ops and drops dead ones).
inline std::vector<uint64_t> semanticFingerprint(const Function& f) {
  std::unordered_map<const Value*, uint64_t> h;
  auto mix = [](uint64_t a, uint64_t b) { return a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2)); };
  auto str = [](const std::string& s) { return uint64_t(std::hash<std::string>()(s)); };
  for (size_t i = 0; i < f.params().size(); ++i) h[f.params()[i]] = mix(str("param"), i);
  std::vector<uint64_t> effects;
  int loops = 0;
  std::function<void(const Block&)> block = [&](const Block& b) {
    for (const auto& op : b.ops()) {
      std::vector<uint64_t> operands;
      for (const Value* o : op->operands()) operands.push_back(h.at(o));
      if (op->kind() == OpKind::ConvertLayout) {
        h[op->result()] = operands[0];
        continue;
      }
      uint64_t self = str(std::string(op->name()));
      for (const auto& [k, a] : op->attrs()) self = mix(self, str(k + "=" + attrString(a)));
      for (uint64_t o : operands) self = mix(self, o);
      if (op->kind() == OpKind::For) {
        int id = loops++;
        const Block& body = op->region();
        for (size_t i = 0; i < body.args().size(); ++i) h[body.arg(i)] = mix(mix(str("arg"), uint64_t(id)), i);
        effects.push_back(self);
        block(body);
        for (size_t i = 0; i < op->numResults(); ++i) h[op->result(i)] = mix(mix(str("for"), uint64_t(id)), i);
        continue;
      }
      for (size_t i = 0; i < op->numResults(); ++i) {
        const Type& t = op->result(i)->type();
        h[op->result(i)] = mix(mix(self, str(t.str())), i);
      }
      if (op->hasTrait(kSideEffect) || op->hasTrait(kTerminator)) effects.push_back(self);
    }
  };
  block(f.body());
  return effects;
}

}  // namespace flextile::testing

namespace flextile::testing {
// A fresh seed each run; FLEXTILE_SEED=<n> replays a failure.
inline unsigned testSeed() {
  if (const char* s = std::getenv("FLEXTILE_SEED")) return unsigned(std::stoul(s));
  return std::random_device{}();
}
}  // namespace flextile::testing
