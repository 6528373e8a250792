// Layout assignment on random programs: loads with assorted access patterns,
// reductions, broadcasts back, element-wise mixes, trans, reshape, dots and
// loops carrying tiles. Whatever the program, the result must satisfy every
// layout rule, compute the same thing (semantic fingerprint), plan its shared
// memory, and survive a second run.
#include <gtest/gtest.h>

#include <iostream>
#include <random>

#include "LayoutTestUtil.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using namespace flextile::testing;

struct ProgramGenerator {
  std::mt19937& rng;
  Function& f;
  Builder b;
  K k;
  Value *x, *out, *n;
  std::vector<Value*> pool;  // f32 tiles usable at the insertion point

  ProgramGenerator(std::mt19937& r, Function& fn) : rng(r), f(fn), b(fn), k{b} {
    x = f.addParam(Type::pointer(DType::F32), "x");
    out = f.addParam(Type::pointer(DType::F32), "out");
    n = f.addParam(Type(DType::I32), "n");
  }

  int pick(int n) { return int(rng() % unsigned(n)); }
  int64_t dim() { return int64_t(1) << pick(6); }  // 1 .. 32
  Shape shape() { return pick(3) ? Shape{dim(), dim()} : Shape{dim()}; }

  Value* offsets(const Shape& s) {
    if (s.size() == 1) return k.mul(b.arange(0, s[0]), k.splat(k.i32(1 + pick(3)), s));
    Value* r = b.arange(0, s[0]);
    Value* c = b.arange(0, s[1]);
    switch (pick(3)) {
      case 0: return k.add(k.col(k.mul(r, k.splat(n, {s[0]})), s), k.row(c, s));             // row-major
      case 1: return k.add(k.col(r, s), k.row(k.mul(c, k.splat(k.i32(s[0]), {s[1]})), s));  // column-major
      default: return k.col(r, s);                                                         // rows repeat
    }
  }

  Value* load(const Shape& s) {
    Value* offs = offsets(s);
    Value* ptrs = k.ptrs(x, offs);
    switch (pick(3)) {
      case 0: return b.load(ptrs);
      case 1: return b.load(ptrs, k.lt(offs, k.splat(n, s)));
      default: return b.load(ptrs, k.lt(offs, k.splat(n, s)), b.constant(Type(DType::F32, s), kNegInf));
    }
  }

  Value* ofShape(const Shape& s) {
    std::vector<Value*> c;
    for (Value* v : pool)
      if (v->type().shape() == s) c.push_back(v);
    if (!c.empty() && pick(4)) return c[size_t(pick(int(c.size())))];
    return pick(2) ? load(s) : b.constant(Type(DType::F32, s), 0.5);
  }

  Value* any() { return pool.empty() ? load(shape()) : pool[size_t(pick(int(pool.size())))]; }

  void step(int depth) {
    Value* r = nullptr;
    switch (pick(12)) {
      case 0: r = load(shape()); break;
      case 1: {
        Value* a = any();
        OpKind kinds[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Maximum};
        r = pick(2) ? b.binary(kinds[pick(4)], a, ofShape(a->type().shape()))
                    : b.binary(kinds[pick(4)], ofShape(a->type().shape()), a);
        break;
      }
      case 2: r = b.unary(OpKind::Exp2, any()); break;
      case 3: {
        Value* a = any();
        int axis = pick(a->type().rank());
        r = b.reduce(a, axis, pick(2) ? "sum" : "max");
        if (r->type().isScalar()) r = k.splat(r, shape());
        break;
      }
      case 4: {
        Value* a = any();
        if (a->type().rank() != 1) break;
        int axis = pick(2);
        Shape s = axis == 0 ? Shape{dim(), a->type().shape()[0]} : Shape{a->type().shape()[0], dim()};
        r = b.broadcast(b.expandDims(a, axis), s);
        if (pick(2)) r = b.binary(OpKind::Add, r, ofShape(s));  // the broadcast first
        break;
      }
      case 5: {
        Value* a = any();
        if (a->type().rank() == 2) r = b.trans(a, {1, 0});
        break;
      }
      case 6: {
        Value* a = any();
        if (a->type().rank() != 2) break;
        const Shape& s = a->type().shape();
        r = b.reshape(a, pick(2) ? Shape{s[0] * s[1]} : Shape{s[1], s[0]});
        break;
      }
      case 7: {
        int64_t m = dim(), kk = dim(), nn = dim();
        Value* acc = ofShape({m, nn});
        r = b.dot(ofShape({m, kk}), ofShape({kk, nn}), acc);
        break;
      }
      case 8: {
        if (depth > 1) break;
        int carried = 1 + pick(2);
        std::vector<Value*> inits;
        for (int i = 0; i < carried; ++i) inits.push_back(pick(3) ? any() : b.constant(Type(DType::F32, shape()), 0.0));
        auto saved = pool;
        auto res = b.forLoop(k.i32(0), n, k.i32(1), inits, [&](Value*, std::vector<Value*> args) {
          for (Value* a : args) pool.push_back(a);
          for (int i = 0, steps = 1 + pick(5); i < steps; ++i) step(depth + 1);
          std::vector<Value*> next;
          for (Value* a : args) next.push_back(pick(4) ? ofShape(a->type().shape()) : a);
          return next;
        });
        pool = saved;
        for (Value* v : res) pool.push_back(v);
        break;
      }
      case 9: {
        Value* v = any();
        b.store(k.ptrs(out, offsets(v->type().shape())), v);
        break;
      }
      case 10: {
        Value* a = any();
        Value* c = b.cmp("lt", a, ofShape(a->type().shape()));
        r = b.select(c, a, ofShape(a->type().shape()));
        break;
      }
      default: r = b.cast(b.cast(any(), DType::F16), DType::F32); break;
    }
    if (r && r->type().isTile()) pool.push_back(r);
  }

  void generate(int steps) {
    for (int i = 0; i < steps; ++i) step(0);
    for (Value* v : pool)
      if (pick(2)) b.store(k.ptrs(out, offsets(v->type().shape())), v);
    b.ret();
  }
};

TEST(AssignLayoutsFuzz, RandomProgramsKeepRulesAndMeaning) {
  const unsigned seed = testSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  int converts = 0, programs = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Function f("fuzz");
    ProgramGenerator gen(rng, f);
    const int nw = 1 << gen.pick(5);
    setAttrs(f, nw, {16, 16, int64_t(1) << gen.pick(5)});
    gen.generate(4 + gen.pick(12));
    auto before = semanticFingerprint(f);
    SCOPED_TRACE("trial " + std::to_string(trial) + ", num_warps " + std::to_string(nw));
    ASSERT_NO_THROW(assignLayouts(f, Target::sm80())) << dump(f);
    auto errs = layoutRuleViolations(f);
    ASSERT_TRUE(errs.empty()) << errs.front() << "\n" << dump(f);
    ASSERT_EQ(semanticFingerprint(f), before) << dump(f);
    ASSERT_NO_THROW(planSharedMemory(f));
    converts += countOps(f, OpKind::ConvertLayout);
    ++programs;
    // Running again on the laid-out program (its clones are now ordinary
    // ops) must still give a valid program computing the same thing.
    ASSERT_NO_THROW(assignLayouts(f, Target::sm80())) << dump(f);
    errs = layoutRuleViolations(f);
    ASSERT_TRUE(errs.empty()) << "second run: " << errs.front() << "\n" << dump(f);
    ASSERT_EQ(semanticFingerprint(f), before) << "second run\n" << dump(f);
  }
  std::cout << programs << " random programs, " << converts << " conversions\n";
}

}  // namespace
}  // namespace flextile::codegen
