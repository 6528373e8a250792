// Test kernels for the lowering, built with ir::Builder and given layouts by
// hand (as layout assignment would): every tile derives its layout from one
// "parent" 2-d layout per tile shape, so broadcasts, expand_dims and reduces
// are register-local exactly as AssignLayouts arranges them.
#pragma once

#include <cmath>
#include <memory>
#include <string>

#include "ir/Builder.h"

namespace flextile::testkernels {

using namespace flextile::ir;

inline Value* lay(Value* v, const Layout& l) {
  v->setType(v->type().withLayout(makeLayout(l)));
  return v;
}

inline std::unique_ptr<Function> newKernel(const std::string& name, int warps) {
  auto f = std::make_unique<Function>(name);
  f->attrs()["num_warps"] = int64_t(warps);
  return f;
}

// Layouts of the row index [BM] / column index [BN] of a tile with parent P,
// and of their expansions [BM,1] / [1,BN].
struct TileLayouts {
  Layout parent, rowsE, colsE, rows, cols;
  explicit TileLayouts(const Layout& p)
      : parent(p),
        rowsE(p.projected({p.shape()[0], 1})),
        colsE(p.projected({1, p.shape()[1]})),
        rows(rowsE.sliced(1)),
        cols(colsE.sliced(0)) {}
};

// Index tiles of a [BM,BN] tile: rowsB[i,j] = rowStart + i, colsB[i,j] = colStart + j.
struct Grid2D {
  Value *rows, *cols, *rowsB, *colsB;
};

inline Grid2D grid2D(Builder& b, const TileLayouts& t, Value* rowStart, Value* colStart) {
  const Shape& s = t.parent.shape();
  Grid2D g;
  g.rows = lay(b.arange(0, s[0]), t.rows);
  if (rowStart) g.rows = lay(b.binary(OpKind::Add, g.rows, lay(b.splat(rowStart, {s[0]}), t.rows)), t.rows);
  g.cols = lay(b.arange(0, s[1]), t.cols);
  if (colStart) g.cols = lay(b.binary(OpKind::Add, g.cols, lay(b.splat(colStart, {s[1]}), t.cols)), t.cols);
  g.rowsB = lay(b.broadcast(lay(b.expandDims(g.rows, 1), t.rowsE), s), t.parent);
  g.colsB = lay(b.broadcast(lay(b.expandDims(g.cols, 0), t.colsE), s), t.parent);
  return g;
}

inline Value* splatTo(Builder& b, Value* s, const Layout& l) { return lay(b.splat(s, l.shape()), l); }

// (rows < M) & (cols < N) and base + rows * stride + cols, on the parent layout.
inline Value* inBounds(Builder& b, const TileLayouts& t, const Grid2D& g, Value* M, Value* N) {
  const Layout& p = t.parent;
  Value* r = lay(b.cmp("lt", g.rowsB, splatTo(b, M, p)), p);
  Value* c = lay(b.cmp("lt", g.colsB, splatTo(b, N, p)), p);
  return lay(b.binary(OpKind::And, r, c), p);
}

inline Value* pointers2D(Builder& b, const TileLayouts& t, const Grid2D& g, Value* base, Value* stride) {
  const Layout& p = t.parent;
  Value* off = lay(b.binary(OpKind::Add, lay(b.binary(OpKind::Mul, g.rowsB, splatTo(b, stride, p)), p), g.colsB), p);
  return lay(b.addptr(splatTo(b, base, p), off), p);
}

// out[i] = x[i] + y[i] for i < n; BLOCK elements per program.
inline std::unique_ptr<Function> vectorAdd(int64_t block, int warps, DType t, int64_t vector = 4) {
  auto f = newKernel("vector_add", warps);
  Value* x = f->addParam(Type::pointer(t), "x");
  Value* y = f->addParam(Type::pointer(t), "y");
  Value* out = f->addParam(Type::pointer(t), "out");
  Value* n = f->addParam(Type(DType::I32), "n");
  Builder b(*f);
  Layout l = Layout::defaultBlocked({block}, warps, vector);
  Value* start = b.binary(OpKind::Mul, b.programId(0), b.constantInt(Type(DType::I32), block));
  Value* offs = lay(b.binary(OpKind::Add, splatTo(b, start, l), lay(b.arange(0, block), l)), l);
  Value* mask = lay(b.cmp("lt", offs, splatTo(b, n, l)), l);
  Value* xv = lay(b.load(lay(b.addptr(splatTo(b, x, l), offs), l), mask), l);
  Value* yv = lay(b.load(lay(b.addptr(splatTo(b, y, l), offs), l), mask), l);
  Value* sum = lay(b.binary(OpKind::Add, xv, yv), l);
  b.store(lay(b.addptr(splatTo(b, out, l), offs), l), sum, mask);
  b.ret();
  return f;
}

// Row softmax of x[M, N] (row-major, row stride N) into out, one [BM, BN]
// tile per program (N <= BN).
inline std::unique_ptr<Function> rowSoftmax(const Layout& parent, DType t) {
  const int64_t BM = parent.shape()[0];
  auto f = newKernel("row_softmax", parent.numWarps());
  Value* x = f->addParam(Type::pointer(t), "x");
  Value* out = f->addParam(Type::pointer(t), "out");
  Value* M = f->addParam(Type(DType::I32), "M");
  Value* N = f->addParam(Type(DType::I32), "N");
  Builder b(*f);
  TileLayouts tl(parent);
  const Layout& p = parent;
  Value* rowStart = b.binary(OpKind::Mul, b.programId(0), b.constantInt(Type(DType::I32), BM));
  Grid2D g = grid2D(b, tl, rowStart, nullptr);
  Value* mask = inBounds(b, tl, g, M, N);
  Value* xs = lay(b.load(pointers2D(b, tl, g, x, N), mask, lay(b.constant(Type(t, p.shape()), -INFINITY), p)), p);
  Value* mx = lay(b.reduce(xs, 1, "max"), tl.rows);
  Value* mxB = lay(b.broadcast(lay(b.expandDims(mx, 1), tl.rowsE), p.shape()), p);
  Value* e = lay(b.unary(OpKind::Exp, lay(b.binary(OpKind::Sub, xs, mxB), p)), p);
  Value* s = lay(b.reduce(e, 1, "sum"), tl.rows);
  Value* sB = lay(b.broadcast(lay(b.expandDims(s, 1), tl.rowsE), p.shape()), p);
  Value* y = lay(b.binary(OpKind::Div, e, sB), p);
  b.store(pointers2D(b, tl, g, out, N), y, mask);
  b.ret();
  return f;
}

// c[M,N] = a[M,K] @ b[K,N] (row-major, f32 result), a loop over K in steps of BK.
inline std::unique_ptr<Function> matmul(int64_t BM, int64_t BN, int64_t BK, int warps, DType t) {
  auto f = newKernel("matmul", warps);
  Value* a = f->addParam(Type::pointer(t), "a");
  Value* bp = f->addParam(Type::pointer(t), "b");
  Value* c = f->addParam(Type::pointer(DType::F32), "c");
  Value* M = f->addParam(Type(DType::I32), "M");
  Value* N = f->addParam(Type(DType::I32), "N");
  Value* K = f->addParam(Type(DType::I32), "K");
  Builder b(*f);
  TileLayouts ta(Layout::defaultBlocked({BM, BK}, warps, 4));
  TileLayouts tb(Layout::defaultBlocked({BK, BN}, warps, 4));
  TileLayouts tc(Layout::defaultBlocked({BM, BN}, warps, 2));
  auto i32c = [&](int64_t v) { return b.constantInt(Type(DType::I32), v); };
  Value* m0 = b.binary(OpKind::Mul, b.programId(0), i32c(BM));
  Value* n0 = b.binary(OpKind::Mul, b.programId(1), i32c(BN));
  Value* acc0 = lay(b.constant(Type(DType::F32, {BM, BN}), 0.0), tc.parent);
  std::vector<Value*> res = b.forLoop(i32c(0), K, i32c(BK), {acc0}, [&](Value* k0, std::vector<Value*> carried) {
    Grid2D ga = grid2D(b, ta, m0, k0);
    Value* at = lay(b.load(pointers2D(b, ta, ga, a, K), inBounds(b, ta, ga, M, K),
                           lay(b.constant(Type(t, {BM, BK}), 0.0), ta.parent)),
                    ta.parent);
    Grid2D gb = grid2D(b, tb, k0, n0);
    Value* bt = lay(b.load(pointers2D(b, tb, gb, bp, N), inBounds(b, tb, gb, K, N),
                           lay(b.constant(Type(t, {BK, BN}), 0.0), tb.parent)),
                    tb.parent);
    return std::vector<Value*>{lay(b.dot(at, bt, carried[0]), tc.parent)};
  });
  Grid2D gc = grid2D(b, tc, m0, n0);
  b.store(pointers2D(b, tc, gc, c, N), res[0], inBounds(b, tc, gc, M, N));
  b.ret();
  return f;
}

// out[j] = kind over i of x[i, j] (axis 0) or out[i] = kind over j (axis 1)
// for one [R, C] tile of a row-major x with row stride C; parent gives the
// distribution (put warps along the axis to exercise shared memory).
inline std::unique_ptr<Function> reduceTile(const Layout& parent, int axis, const std::string& kind, DType t) {
  auto f = newKernel("reduce_" + kind + "_axis" + std::to_string(axis), parent.numWarps());
  Value* x = f->addParam(Type::pointer(t), "x");
  Value* out = f->addParam(Type::pointer(t), "out");
  Builder b(*f);
  TileLayouts tl(parent);
  const Layout& p = parent;
  Grid2D g = grid2D(b, tl, nullptr, nullptr);
  Value* xs = lay(b.load(pointers2D(b, tl, g, x, b.constantInt(Type(DType::I32), p.shape()[1]))), p);
  const Layout& rl = axis == 0 ? tl.cols : tl.rows;
  Value* r = lay(b.reduce(xs, axis, kind), rl);
  Value* idx = lay(b.arange(0, p.shape()[1 - axis]), rl);
  b.store(lay(b.addptr(splatTo(b, out, rl), idx), rl), r);
  b.ret();
  return f;
}

// out[0] = sum of x[0..n) for one 1-d tile: a reduction to a scalar.
inline std::unique_ptr<Function> reduceToScalar(int64_t n, int warps, DType t) {
  auto f = newKernel("reduce_scalar", warps);
  Value* x = f->addParam(Type::pointer(t), "x");
  Value* out = f->addParam(Type::pointer(t), "out");
  Builder b(*f);
  Layout l = Layout::defaultBlocked({n}, warps, 2);
  Value* xs = lay(b.load(lay(b.addptr(splatTo(b, x, l), lay(b.arange(0, n), l)), l)), l);
  b.store(out, b.reduce(xs, 0, "sum"));
  b.ret();
  return f;
}

// out = x for one [R, C] tile, loaded in layout `from` and stored in `to`.
inline std::unique_ptr<Function> convertCopy(const Layout& from, const Layout& to, DType t) {
  auto f = newKernel("convert_copy", from.numWarps());
  Value* x = f->addParam(Type::pointer(t), "x");
  Value* out = f->addParam(Type::pointer(t), "out");
  Builder b(*f);
  const int64_t C = from.shape()[1];
  TileLayouts tf(from), tt(to);
  Grid2D gf = grid2D(b, tf, nullptr, nullptr);
  Value* xs = lay(b.load(pointers2D(b, tf, gf, x, b.constantInt(Type(DType::I32), C))), from);
  Value* ys = lay(b.create1(OpKind::ConvertLayout, {xs}, xs->type().withLayout(nullptr)), to);
  Grid2D gt = grid2D(b, tt, nullptr, nullptr);
  b.store(pointers2D(b, tt, gt, out, b.constantInt(Type(DType::I32), C)), ys);
  b.ret();
  return f;
}

// out[i] = op(x[i] [, y[i]]) for i < n: one element-wise op (cast: to `to`;
// cmp: pred "lt"; select: c ? x : y with c loaded as i1).
inline std::unique_ptr<Function> elementwise(OpKind kind, DType t, DType to, int64_t block, int warps) {
  auto f = newKernel("ew_" + std::string(opName(kind)), warps);
  DType resT = kind == OpKind::Cast ? to : kind == OpKind::Cmp ? DType::I1 : t;
  Value* x = f->addParam(Type::pointer(t), "x");
  Value* y = f->addParam(Type::pointer(t), "y");
  Value* c = f->addParam(Type::pointer(DType::I1), "c");
  Value* out = f->addParam(Type::pointer(resT), "out");
  Value* n = f->addParam(Type(DType::I32), "n");
  Builder b(*f);
  Layout l = Layout::defaultBlocked({block}, warps, 2);
  Value* offs = lay(b.arange(0, block), l);
  Value* mask = lay(b.cmp("lt", offs, splatTo(b, n, l)), l);
  auto loadOf = [&](Value* p) { return lay(b.load(lay(b.addptr(splatTo(b, p, l), offs), l), mask), l); };
  Value* xv = loadOf(x);
  Value* r = nullptr;
  const int arity = opInfo(kind).numOperands;
  if (kind == OpKind::Cast) r = b.cast(xv, to);
  else if (kind == OpKind::Cmp) r = b.cmp("lt", xv, loadOf(y));
  else if (kind == OpKind::Select) r = b.select(loadOf(c), xv, loadOf(y));
  else if (arity == 1) r = b.unary(kind, xv);
  else r = b.binary(kind, xv, loadOf(y));
  lay(r, l);
  b.store(lay(b.addptr(splatTo(b, out, l), offs), l), r, mask);
  b.ret();
  return f;
}

}  // namespace flextile::testkernels
