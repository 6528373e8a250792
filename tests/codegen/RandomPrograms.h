// A generator of random tile programs for the layout tests: loads with
// assorted access patterns (row-major, column-major, repeated rows; masked or
// not), reductions, broadcasts back, element-wise mixes, trans, reshape, dots,
// selects, casts and loops carrying tiles (nested once). Parameters:
// (x: ptr<f32>, out: ptr<f32>, n: i32). Tiles have at most 1024 elements per
// dimension (a reshaped [32, 32]) and 32 in the other, so every offset stays
// below 1024 * max(n, 32) + 1024: buffers of 65536 floats hold any n <= 32.
#pragma once

#include <random>
#include <vector>

#include "LayoutTestUtil.h"

namespace flextile::testing {

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

  // `steps` random steps, then stores of (with storeAll, all) live tiles.
  void generate(int steps, bool storeAll = false) {
    for (int i = 0; i < steps; ++i) step(0);
    for (Value* v : pool)
      if (storeAll || pick(2)) b.store(k.ptrs(out, offsets(v->type().shape())), v);
    b.ret();
  }
};

}  // namespace flextile::testing
