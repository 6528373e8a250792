// Shape ops and reductions: reduce kinds along every axis of rank-2 and rank-3
// tiles; trans, reshape, expand_dims, broadcast and splat.
#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

// Row-major offsets of a tile of `shape`, built from arange + expand_dims +
// broadcast (so those ops are under test too).
Value* rowMajorOffsets(Builder& b, const Shape& shape) {
  Value* total = nullptr;
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    Value* a = b.arange(0, shape[d]);
    a = b.binary(OpKind::Mul, a, b.constantInt(Type(DType::I32, {shape[d]}), stride));
    for (size_t e = 0; e < shape.size(); ++e)
      if (e != d) a = b.expandDims(a, int(e));
    a = b.broadcast(a, shape);
    total = total ? b.binary(OpKind::Add, total, a) : a;
    stride *= shape[d];
  }
  return total;
}

// Loads x of `inShape`, applies `body`, stores the result densely to out.
std::unique_ptr<Function> tileKernel(DType in, DType out, const Shape& inShape,
                                     const std::function<Value*(Builder&, Value*)>& body) {
  auto f = std::make_unique<Function>("tile");
  Value* x = f->addParam(Type::pointer(in), "x");
  Value* o = f->addParam(Type::pointer(out), "out");
  Builder b(*f);
  Value* v = b.load(ptrTile(b, x, rowMajorOffsets(b, inShape)));
  Value* r = body(b, v);
  if (r->type().isScalar()) b.store(o, r);
  else b.store(ptrTile(b, o, rowMajorOffsets(b, r->type().shape())), r);
  b.ret();
  return f;
}

TEST(InterpreterShapes, ReduceEveryKindAlongEveryAxis) {
  FT_SEEDED_RNG(rng);
  for (const Shape& shape : {Shape{8, 16}, Shape{4, 8, 16}, Shape{1, 128}, Shape{1024}})
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32})
      for (size_t axis = 0; axis < shape.size(); ++axis)
        for (const char* kind : {"sum", "max", "min"}) {
          SCOPED_TRACE(shapeString(shape) + " " + std::string(dtypeName(t)) + " axis " + std::to_string(axis) + " " + kind);
          auto f = tileKernel(t, t, shape, [&](Builder& b, Value* v) { return b.reduce(v, int(axis), kind); });
          const size_t n = size_t(numElements(shape));
          HostBuf x(t, n);
          for (size_t i = 0; i < n; ++i) x.set(i, randomIn(rng, t, -100, 100));
          Shape outShape = shape;
          outShape.erase(outShape.begin() + int64_t(axis));
          HostBuf out(t, size_t(numElements(outShape)));
          out.poison();
          interpret(*f, {x.arg(), out.arg()}, {1, 1, 1});
          int64_t outer = 1, inner = 1, len = shape[axis];
          for (size_t d = 0; d < axis; ++d) outer *= shape[d];
          for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t i = 0; i < inner; ++i) {
              double acc = std::string(kind) == "sum" ? 0 : x.get(size_t(o * len * inner + i));
              for (int64_t k = 0; k < len; ++k) {
                double v = x.get(size_t((o * len + k) * inner + i));
                acc = std::string(kind) == "sum" ? acc + v : std::string(kind) == "max" ? std::max(acc, v) : std::min(acc, v);
              }
              // Sums are accumulated exactly enough in double and rounded once.
              ASSERT_EQ(out.get(size_t(o * inner + i)), isFloat(t) ? roundTo(acc, t) : acc) << o << "," << i;
            }
        }
}

TEST(InterpreterShapes, TransposeEveryPermutationOfRank3) {
  FT_SEEDED_RNG(rng);
  const Shape shape{2, 4, 8};
  const std::vector<std::vector<int64_t>> perms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
  HostBuf x(DType::I32, 64);
  for (size_t i = 0; i < 64; ++i) x.setInt(i, uniformInt(rng, -1000, 1000));
  for (const auto& perm : perms) {
    auto f = tileKernel(DType::I32, DType::I32, shape, [&](Builder& b, Value* v) { return b.trans(v, perm); });
    HostBuf out(DType::I32, 64);
    out.poison();
    interpret(*f, {x.arg(), out.arg()}, {1, 1, 1});
    Shape os{shape[size_t(perm[0])], shape[size_t(perm[1])], shape[size_t(perm[2])]};
    for (int64_t i = 0; i < os[0]; ++i)
      for (int64_t j = 0; j < os[1]; ++j)
        for (int64_t k = 0; k < os[2]; ++k) {
          int64_t src[3];
          src[perm[0]] = i, src[perm[1]] = j, src[perm[2]] = k;
          ASSERT_EQ(out.getInt(size_t((i * os[1] + j) * os[2] + k)), x.getInt(size_t((src[0] * 4 + src[1]) * 8 + src[2])))
              << attrString(perm);
        }
  }
}

TEST(InterpreterShapes, ReshapeExpandBroadcastSplat) {
  FT_SEEDED_RNG(rng);
  HostBuf x(DType::F32, 32);
  for (size_t i = 0; i < 32; ++i) x.set(i, uniform(rng, -1, 1));
  {  // reshape [4, 8] -> [2, 16] -> [32] keeps row-major order, then a transposed view shows it
    auto f = tileKernel(DType::F32, DType::F32, {4, 8}, [](Builder& b, Value* v) {
      return b.trans(b.reshape(b.reshape(v, {2, 16}), {16, 2}), {1, 0});
    });
    HostBuf out(DType::F32, 32);
    out.poison();
    interpret(*f, {x.arg(), out.arg()}, {1, 1, 1});
    for (size_t r = 0; r < 2; ++r)
      for (size_t c = 0; c < 16; ++c) ASSERT_EQ(out.get(r * 16 + c), x.get(c * 2 + r));
  }
  {  // row [1, 8] broadcast down, column [4, 1] broadcast across, a scalar expanded to [1, 1] and broadcast
     // both ways, and the scalar splat: out = row + col + s + s
    auto f = tileKernel(DType::F32, DType::F32, {4, 8}, [](Builder& b, Value* v) {
      Value* row = b.reduce(v, 0, "sum");                       // [8]
      Value* col = b.reduce(v, 1, "max");                       // [4]
      Value* s = b.reduce(b.reduce(v, 1, "min"), 0, "min");    // scalar
      Value* rowT = b.broadcast(b.expandDims(row, 0), {4, 8});
      Value* colT = b.broadcast(b.expandDims(col, 1), {4, 8});
      Value* sT = b.broadcast(b.expandDims(b.expandDims(s, 0), 0), {4, 8});
      return b.binary(OpKind::Add, b.binary(OpKind::Add, rowT, colT), b.binary(OpKind::Add, sT, b.splat(s, {4, 8})));
    });
    HostBuf out(DType::F32, 32);
    out.poison();
    interpret(*f, {x.arg(), out.arg()}, {1, 1, 1});
    double mn = 1e9;
    for (size_t i = 0; i < 32; ++i) mn = std::min(mn, x.get(i));
    for (size_t r = 0; r < 4; ++r)
      for (size_t c = 0; c < 8; ++c) {
        double colSum = 0, rowMax = -1e9;
        for (size_t k = 0; k < 4; ++k) colSum += x.get(k * 8 + c);
        for (size_t k = 0; k < 8; ++k) rowMax = std::max(rowMax, x.get(r * 8 + k));
        float want = float(float(float(colSum) + float(rowMax)) + float(float(mn) + float(mn)));
        ASSERT_EQ(out.get(r * 8 + c), double(want)) << r << "," << c;
      }
  }
}

TEST(InterpreterShapes, IntegerAndFloatDot) {
  FT_SEEDED_RNG(rng);
  // [4, 8] @ [8, 4] + acc: i8 inputs with an i32 accumulator near INT32_MAX (the sum wraps), and f32.
  const int64_t accValue = INT32_MAX - 1000;
  for (auto [in, acct] : {std::pair{DType::I8, DType::I32}, std::pair{DType::F32, DType::F32}}) {
    SCOPED_TRACE(dtypeName(in));
    auto f = std::make_unique<Function>("dot");
    Value* a = f->addParam(Type::pointer(in), "a");
    Value* bb = f->addParam(Type::pointer(in), "b");
    Value* o = f->addParam(Type::pointer(acct), "out");
    Builder b(*f);
    Value* av = b.load(ptrTile(b, a, b.reshape(b.arange(0, 32), {4, 8})));
    Value* bv = b.load(ptrTile(b, bb, b.reshape(b.arange(0, 32), {8, 4})));
    Value* acc = acct == DType::I32 ? b.constantInt(Type(acct, {4, 4}), accValue) : b.constant(Type(acct, {4, 4}), 3);
    b.store(ptrTile(b, o, b.reshape(b.arange(0, 16), {4, 4})), b.dot(av, bv, acc));
    b.ret();
    HostBuf ha(in, 32), hb(in, 32), out(acct, 16);
    for (size_t i = 0; i < 32; ++i) {
      ha.set(i, in == DType::I8 ? double(uniformInt(rng, -128, 127)) : uniform(rng, -1, 1));
      hb.set(i, in == DType::I8 ? double(uniformInt(rng, -128, 127)) : uniform(rng, -1, 1));
    }
    out.poison();
    interpret(*f, {ha.arg(), hb.arg(), out.arg()}, {1, 1, 1});
    bool wrapped = false;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        int64_t iacc = accValue;
        double dacc = 3;
        for (int k = 0; k < 8; ++k) {
          iacc += ha.getInt(size_t(i * 8 + k)) * hb.getInt(size_t(k * 4 + j));
          dacc += ha.get(size_t(i * 8 + k)) * hb.get(size_t(k * 4 + j));
        }
        size_t idx = size_t(i * 4 + j);
        wrapped = wrapped || iacc > INT32_MAX;
        if (acct == DType::I32) {
          ASSERT_EQ(out.getInt(idx), int64_t(int32_t(uint32_t(uint64_t(iacc))))) << i << "," << j;
        } else {
          ASSERT_NEAR(out.get(idx), dacc, 1e-6) << i << "," << j;
        }
      }
    if (acct == DType::I32) {
      EXPECT_TRUE(wrapped) << "no element wrapped: the test does not test wrapping";
    }
  }
}

TEST(InterpreterShapes, LayoutsAreIgnoredAndConvertLayoutIsTheIdentity) {
  // Every tile has a layout (the verifier wants all or none); the add runs in another layout than
  // the load and store, reached and left by convert_layout.
  FT_SEEDED_RNG(rng);
  auto f = std::make_unique<Function>("laid_out");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* o = f->addParam(Type::pointer(DType::F32), "out");
  Builder b(*f);
  Value* offs = b.arange(0, 128);
  Value* v = b.load(ptrTile(b, x, offs));
  const Layout plain = Layout::defaultBlocked({128}, f->numWarps());
  const Layout vectored = Layout::defaultBlocked({128}, f->numWarps(), 4);
  ASSERT_NE(plain, vectored);
  Value* w = b.create1(OpKind::ConvertLayout, {v}, Type(DType::F32, {128}));
  Value* sum = b.binary(OpKind::Add, w, w);
  Value* back = b.create1(OpKind::ConvertLayout, {sum}, Type(DType::F32, {128}));
  b.store(ptrTile(b, o, offs), back);
  b.ret();
  std::vector<Value*> inVectored = {w, sum};
  f->walk([&](const Op& op) {
    for (Value* r : op.results())
      if (r->type().isTile()) {
        bool vec = std::find(inVectored.begin(), inVectored.end(), r) != inVectored.end();
        r->setType(r->type().withLayout(std::make_shared<const Layout>(vec ? vectored : plain)));
      }
  });
  HostBuf xb(DType::F32, 128), out(DType::F32, 128);
  for (size_t i = 0; i < 128; ++i) xb.set(i, uniform(rng, -1, 1));
  out.poison();
  interpret(*f, {xb.arg(), out.arg()}, {1, 1, 1});
  for (size_t i = 0; i < 128; ++i) ASSERT_EQ(out.get(i), 2 * xb.get(i));
}

}  // namespace
}  // namespace flextile::test
