// Whole kernels through the interpreter against Eigen float64 references: a
// fused row softmax, a tiled matmul with a K loop, and an attention forward
// (online softmax in the exp2 domain) that also times the interpreter.
#include <Eigen/Dense>
#include <chrono>
#include <cstdio>

#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

constexpr double kLog2e = 1.4426950408889634;
const double kInf = std::numeric_limits<double>::infinity();

Value* cI32(Builder& b, int64_t v) { return b.constantInt(Type(DType::I32), v); }

// op(col[:, None], row[None, :]) as a [P, Q] tile.
Value* outer(Builder& b, OpKind op, Value* col, Value* row) {
  Shape s{col->type().shape()[0], row->type().shape()[0]};
  return b.binary(op, b.broadcast(b.expandDims(col, 1), s), b.broadcast(b.expandDims(row, 0), s));
}
Value* colTile(Builder& b, Value* col, int64_t q) {  // [P] -> [P, q]
  return b.broadcast(b.expandDims(col, 1), {col->type().shape()[0], q});
}
Value* mulScalar(Builder& b, Value* s, int64_t c) { return b.binary(OpKind::Mul, s, cI32(b, c)); }
Value* rangeFrom(Builder& b, Value* start, int64_t n) { return b.binary(OpKind::Add, b.splat(start, {n}), b.arange(0, n)); }

int64_t nextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// ---- row softmax ------------------------------------------------------------

// One row per program, the row in a 1-D tile of `block` >= cols.
std::unique_ptr<Function> softmaxRows1D(int64_t block) {
  auto f = std::make_unique<Function>("softmax_1d");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* y = f->addParam(Type::pointer(DType::F32), "y");
  Value* cols = f->addParam(Type(DType::I32), "cols");
  Builder b(*f);
  Value* base = b.binary(OpKind::Mul, b.programId(0), cols);
  Value* offs = b.arange(0, block);
  Value* mask = b.cmp("lt", offs, b.splat(cols, {block}));
  Value* v = b.load(ptrTile(b, b.addptr(x, base), offs), mask, b.constant(Type(DType::F32, {block}), -kInf));
  Value* m = b.reduce(v, 0, "max");
  Value* z = b.binary(OpKind::Mul, b.binary(OpKind::Sub, v, b.splat(m, {block})), b.constant(Type(DType::F32, {block}), kLog2e));
  Value* e = b.unary(OpKind::Exp2, z);
  Value* s = b.reduce(e, 0, "sum");
  b.store(ptrTile(b, b.addptr(y, base), offs), b.binary(OpKind::Div, e, b.splat(s, {block})), mask);
  b.ret();
  return f;
}

// bm rows per program in a [bm, bn] tile, masked on rows and columns.
std::unique_ptr<Function> softmaxRows2D(int64_t bm, int64_t bn) {
  auto f = std::make_unique<Function>("softmax_2d");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* y = f->addParam(Type::pointer(DType::F32), "y");
  Value* rows = f->addParam(Type(DType::I32), "rows");
  Value* cols = f->addParam(Type(DType::I32), "cols");
  Builder b(*f);
  Value* r = rangeFrom(b, mulScalar(b, b.programId(0), bm), bm);
  Value* c = b.arange(0, bn);
  Value* offs = outer(b, OpKind::Add, b.binary(OpKind::Mul, r, b.splat(cols, {bm})), c);
  Value* mask = outer(b, OpKind::And, b.cmp("lt", r, b.splat(rows, {bm})), b.cmp("lt", c, b.splat(cols, {bn})));
  Value* v = b.load(ptrTile(b, x, offs), mask, b.constant(Type(DType::F32, {bm, bn}), -kInf));
  Value* m = colTile(b, b.reduce(v, 1, "max"), bn);
  Value* e = b.unary(OpKind::Exp2, b.binary(OpKind::Mul, b.binary(OpKind::Sub, v, m), b.constant(Type(DType::F32, {bm, bn}), kLog2e)));
  Value* s = colTile(b, b.reduce(e, 1, "sum"), bn);
  b.store(ptrTile(b, y, offs), b.binary(OpKind::Div, e, s), mask);
  b.ret();
  return f;
}

void checkSoftmax(const HostBuf& x, const HostBuf& y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    Eigen::ArrayXd v(cols);
    for (int64_t c = 0; c < cols; ++c) v(c) = x.get(size_t(r * cols + c));
    Eigen::ArrayXd e = (v - v.maxCoeff()).exp();
    e /= e.sum();
    for (int64_t c = 0; c < cols; ++c) {
      size_t i = size_t(r * cols + c);
      ASSERT_FALSE(y.poisoned(i)) << "row " << r << " col " << c << " never written";
      ASSERT_NEAR(y.get(i), e(c), 2e-6 * e(c) + 1e-9) << "row " << r << " col " << c;
    }
  }
}

TEST(InterpreterKernels, FusedRowSoftmax) {
  FT_SEEDED_RNG(rng);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{3, 1000}, {129, 127}, {1, 1}, {5, 3}}) {
    SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols));
    HostBuf x(DType::F32, size_t(rows * cols)), y(DType::F32, size_t(rows * cols));
    for (size_t i = 0; i < x.size(); ++i) x.set(i, uniform(rng, -20, 20));
    y.poison();
    interpret(*softmaxRows1D(nextPow2(cols)), {x.arg("x"), y.arg("y"), InterpArg::integer(cols)}, {rows, 1, 1});
    checkSoftmax(x, y, rows, cols);
    const int64_t bm = 4, bn = nextPow2(cols);
    y.poison();
    interpret(*softmaxRows2D(bm, bn), {x.arg("x"), y.arg("y"), InterpArg::integer(rows), InterpArg::integer(cols)},
              {(rows + bm - 1) / bm, 1, 1});
    checkSoftmax(x, y, rows, cols);
  }
}

// ---- tiled matmul -----------------------------------------------------------

// C[M, N] (f32) = A[M, K] @ B[K, N] with A, B of dtype t; a loop over K tiles.
std::unique_ptr<Function> matmulKernel(DType t, int64_t bm, int64_t bn, int64_t bk) {
  auto f = std::make_unique<Function>("matmul");
  Value* a = f->addParam(Type::pointer(t), "a");
  Value* bp = f->addParam(Type::pointer(t), "b");
  Value* c = f->addParam(Type::pointer(DType::F32), "c");
  Value* M = f->addParam(Type(DType::I32), "M");
  Value* N = f->addParam(Type(DType::I32), "N");
  Value* K = f->addParam(Type(DType::I32), "K");
  Builder b(*f);
  Value* rm = rangeFrom(b, mulScalar(b, b.programId(0), bm), bm);
  Value* rn = rangeFrom(b, mulScalar(b, b.programId(1), bn), bn);
  Value* rmOk = b.cmp("lt", rm, b.splat(M, {bm}));
  Value* rnOk = b.cmp("lt", rn, b.splat(N, {bn}));
  Value* acc0 = b.constant(Type(DType::F32, {bm, bn}), 0.0);
  auto acc = b.forLoop(cI32(b, 0), K, cI32(b, bk), {acc0}, [&](Value* k0, std::vector<Value*> carried) -> std::vector<Value*> {
    Value* rk = rangeFrom(b, k0, bk);
    Value* rkOk = b.cmp("lt", rk, b.splat(K, {bk}));
    Value* aOffs = outer(b, OpKind::Add, b.binary(OpKind::Mul, rm, b.splat(K, {bm})), rk);
    Value* bOffs = outer(b, OpKind::Add, b.binary(OpKind::Mul, rk, b.splat(N, {bk})), rn);
    Value* at = b.load(ptrTile(b, a, aOffs), outer(b, OpKind::And, rmOk, rkOk));
    Value* bt = b.load(ptrTile(b, bp, bOffs), outer(b, OpKind::And, rkOk, rnOk));
    return {b.dot(at, bt, carried[0])};
  });
  Value* cOffs = outer(b, OpKind::Add, b.binary(OpKind::Mul, rm, b.splat(N, {bm})), rn);
  b.store(ptrTile(b, c, cOffs), acc[0], outer(b, OpKind::And, rmOk, rnOk));
  b.ret();
  return f;
}

TEST(InterpreterKernels, TiledMatmulWithKLoop) {
  FT_SEEDED_RNG(rng);
  const int64_t bm = 32, bn = 32, bk = 16;
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    auto f = matmulKernel(t, bm, bn, bk);
    for (auto [M, N, K] : std::vector<std::array<int64_t, 3>>{{129, 127, 1000}, {3, 1000, 127}, {1, 1, 1}, {33, 31, 17}}) {
      SCOPED_TRACE(std::string(dtypeName(t)) + " M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
      HostBuf a(t, size_t(M * K)), bb(t, size_t(K * N)), c(DType::F32, size_t(M * N));
      for (size_t i = 0; i < a.size(); ++i) a.set(i, uniform(rng, -1, 1));
      for (size_t i = 0; i < bb.size(); ++i) bb.set(i, uniform(rng, -1, 1));
      c.poison();
      interpret(*f, {a.arg("a"), bb.arg("b"), c.arg("c"), InterpArg::integer(M), InterpArg::integer(N), InterpArg::integer(K)},
                {(M + bm - 1) / bm, (N + bn - 1) / bn, 1});
      Eigen::MatrixXd A(M, K), B(K, N);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) A(i, k) = a.get(size_t(i * K + k));
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j) B(k, j) = bb.get(size_t(k * N + j));
      Eigen::MatrixXd C = A * B, mag = A.cwiseAbs() * B.cwiseAbs();
      // The inputs are exact in t; the error is the f32 rounding of the
      // accumulator once per K tile (products and sums inside a tile are exact
      // enough in double).
      const double tilesK = double((K + bk - 1) / bk);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          size_t idx = size_t(i * N + j);
          ASSERT_FALSE(c.poisoned(idx)) << i << "," << j;
          ASSERT_NEAR(c.get(idx), C(i, j), tilesK * std::ldexp(1.0, -23) * mag(i, j) + 1e-30) << i << "," << j;
        }
    }
  }
}

// ---- attention forward ------------------------------------------------------

// FlashAttention forward for one (query block, batch*head) per program:
// online softmax in the exp2 domain (qk_scale = sm_scale * log2 e), P cast to
// f16 for the second product. q, k, v, o are [B*H, n, D] f16.
std::unique_ptr<Function> attentionForward(int64_t bm, int64_t bn, int64_t d) {
  auto f = std::make_unique<Function>("attention_fwd");
  Value* q = f->addParam(Type::pointer(DType::F16), "q");
  Value* k = f->addParam(Type::pointer(DType::F16), "k");
  Value* v = f->addParam(Type::pointer(DType::F16), "v");
  Value* o = f->addParam(Type::pointer(DType::F16), "o");
  Value* n = f->addParam(Type(DType::I32), "n");
  Value* qkScale = f->addParam(Type(DType::F32), "qk_scale");
  Builder b(*f);
  Value* head = b.binary(OpKind::Mul, b.programId(1), mulScalar(b, n, d));
  Value* rows = rangeFrom(b, mulScalar(b, b.programId(0), bm), bm);
  Value* dims = b.arange(0, d);
  auto tileOffsets = [&](Value* r, int64_t len) {  // head + r[:, None] * d + dims[None, :]
    Value* rowStart = b.binary(OpKind::Add, b.splat(head, {len}), b.binary(OpKind::Mul, r, b.constantInt(Type(DType::I32, {len}), d)));
    return outer(b, OpKind::Add, rowStart, dims);
  };
  Value* qOffs = tileOffsets(rows, bm);
  Value* qMask = colTile(b, b.cmp("lt", rows, b.splat(n, {bm})), d);
  Value* qt = b.load(ptrTile(b, q, qOffs), qMask);
  Value* m0 = b.constant(Type(DType::F32, {bm}), -kInf);
  Value* l0 = b.constant(Type(DType::F32, {bm}), 0.0);
  Value* acc0 = b.constant(Type(DType::F32, {bm, d}), 0.0);
  auto res = b.forLoop(cI32(b, 0), n, cI32(b, bn), {m0, l0, acc0}, [&](Value* start, std::vector<Value*> c) -> std::vector<Value*> {
    Value *m = c[0], *l = c[1], *acc = c[2];
    Value* cols = rangeFrom(b, start, bn);
    Value* colOk = b.cmp("lt", cols, b.splat(n, {bn}));
    Value* kvOffs = tileOffsets(cols, bn);
    Value* kvMask = colTile(b, colOk, d);
    Value* kt = b.load(ptrTile(b, k, kvOffs), kvMask);
    Value* vt = b.load(ptrTile(b, v, kvOffs), kvMask);
    Value* s = b.dot(qt, b.trans(kt, {1, 0}), b.constant(Type(DType::F32, {bm, bn}), 0.0));
    s = b.binary(OpKind::Mul, s, b.splat(qkScale, {bm, bn}));
    s = b.select(b.broadcast(b.expandDims(colOk, 0), {bm, bn}), s, b.constant(Type(DType::F32, {bm, bn}), -kInf));
    Value* mNew = b.binary(OpKind::Maximum, m, b.reduce(s, 1, "max"));
    Value* alpha = b.unary(OpKind::Exp2, b.binary(OpKind::Sub, m, mNew));
    Value* p = b.unary(OpKind::Exp2, b.binary(OpKind::Sub, s, colTile(b, mNew, bn)));
    Value* lNew = b.binary(OpKind::Add, b.binary(OpKind::Mul, l, alpha), b.reduce(p, 1, "sum"));
    Value* accNew = b.dot(b.cast(p, DType::F16), vt, b.binary(OpKind::Mul, acc, colTile(b, alpha, d)));
    return {mNew, lNew, accNew};
  });
  Value* out = b.binary(OpKind::Div, res[2], colTile(b, res[1], d));
  b.store(ptrTile(b, o, qOffs), b.cast(out, DType::F16), qMask);
  b.ret();
  return f;
}

double runAttention(std::mt19937_64& rng, int64_t heads, int64_t n, int64_t d, int threads, bool print) {
  const int64_t bm = 64, bn = 64;
  auto f = attentionForward(bm, bn, d);
  const size_t total = size_t(heads * n * d);
  HostBuf q(DType::F16, total), k(DType::F16, total), v(DType::F16, total), o(DType::F16, total);
  for (size_t i = 0; i < total; ++i) {
    q.set(i, uniform(rng, -1, 1));
    k.set(i, uniform(rng, -1, 1));
    v.set(i, uniform(rng, -0.5, 1.5));  // a nonzero mean: a wrongly unmasked key tail shifts every output
  }
  o.poison();
  const double smScale = 1 / std::sqrt(double(d));
  auto t0 = std::chrono::steady_clock::now();
  interpret(*f, {q.arg("q"), k.arg("k"), v.arg("v"), o.arg("o"), InterpArg::integer(n), InterpArg::real(smScale * kLog2e)},
            {(n + bm - 1) / bm, heads, 1}, InterpOptions{threads});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (print)
    std::printf("[ timing   ] attention forward B=1 H=%lld N=%lld D=%lld, grid (%lld, %lld, 1), %s threads: %.3f s\n",
                (long long)heads, (long long)n, (long long)d, (long long)((n + bm - 1) / bm), (long long)heads,
                threads ? std::to_string(threads).c_str() : "all", seconds);

  for (int64_t h = 0; h < heads; ++h) {
    Eigen::MatrixXd Q(n, d), K(n, d), V(n, d);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) {
        size_t idx = size_t((h * n + i) * d + j);
        Q(i, j) = q.get(idx), K(i, j) = k.get(idx), V(i, j) = v.get(idx);
      }
    Eigen::MatrixXd S = Q * K.transpose() * smScale;
    Eigen::VectorXd rowMax = S.rowwise().maxCoeff();
    Eigen::MatrixXd P = (S.colwise() - rowMax).array().exp().matrix();
    Eigen::VectorXd rowSum = P.rowwise().sum();
    Eigen::MatrixXd O = (P * V).array().colwise() / rowSum.array();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) {
        size_t idx = size_t((h * n + i) * d + j);
        EXPECT_FALSE(o.poisoned(idx)) << "head " << h << " row " << i << " col " << j;
        // f16: P is rounded to f16 (relative 2^-11 per weight) and so is the output.
        EXPECT_NEAR(o.get(idx), O(i, j), 2e-3 * std::fabs(O(i, j)) + 2e-4) << "head " << h << " row " << i << " col " << j;
        if (::testing::Test::HasFailure()) return seconds;
      }
  }
  return seconds;
}

TEST(InterpreterKernels, AttentionForwardMatchesFloat64AndTiming) {
  FT_SEEDED_RNG(rng);
  runAttention(rng, 2, 1000, 64, 0, true);
  runAttention(rng, 2, 1000, 64, 2, true);
  runAttention(rng, 1, 129, 64, 0, false);
  runAttention(rng, 1, 1, 64, 0, false);
}

}  // namespace
}  // namespace flextile::test
