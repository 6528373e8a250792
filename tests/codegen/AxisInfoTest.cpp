// Axis analysis: one test per transfer rule, plus vector widths. Facts are
// cross-checked against the values they describe where the values are known
// (brute force over small tiles).
#include <gtest/gtest.h>

#include <random>

#include "LayoutTestUtil.h"
#include "codegen/AxisInfo.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using testing::K;
using testing::testSeed;
using V = std::vector<int64_t>;

struct Fixture {
  Function f{"t"};
  Builder b{f};
  K k{b};
};

TEST(AxisInfo, ArangeConstantSplat) {
  Fixture t;
  Value* a = t.b.arange(0, 64);
  Value* a8 = t.b.arange(8, 24);
  Value* c = t.b.constantInt(Type(DType::I32, {4, 8}), 24);
  Value* s = t.b.splat(t.k.i32(48), {16});
  AxisInfoAnalysis ai(t.f);
  EXPECT_EQ(ai.get(a).contiguity, V{64});
  EXPECT_EQ(ai.get(a).divisibility, V{AxisInfo::kMaxDivisibility});
  EXPECT_EQ(ai.get(a).constancy, V{1});
  EXPECT_EQ(ai.get(a8).contiguity, V{16});
  EXPECT_EQ(ai.get(a8).divisibility, V{8});
  EXPECT_EQ(ai.get(c).constancy, (V{4, 8}));
  EXPECT_EQ(ai.get(c).divisibility, (V{8, 8}));
  EXPECT_EQ(ai.get(c).constantValue, 24);
  EXPECT_EQ(ai.get(s).constancy, V{16});
  EXPECT_EQ(ai.get(s).divisibility, V{16});
  EXPECT_EQ(ai.get(s).contiguity, V{1});
}

TEST(AxisInfo, ParametersAndProgramIds) {
  Function f("params");
  Value* p = f.addParam(Type::pointer(DType::F16), "p");
  Value* q = f.addParam(Type::pointer(DType::F32), "q");
  Value* n = f.addParam(Type(DType::I32), "n");
  Value* m = f.addParam(Type(DType::I32), "m");
  Builder b(f);
  Value* pid = b.programId(0);
  {
    AxisInfoAnalysis ai(f);
    EXPECT_EQ(ai.get(p).divisibility, V{16});  // default pointer alignment
    EXPECT_EQ(ai.get(n).divisibility, V{1});   // default integer divisor
    EXPECT_EQ(ai.get(pid).divisibility, V{1});
  }
  f.attrs()["arg_divisibility"] = V{8, 32, 48, 7};
  AxisInfoAnalysis ai(f);
  EXPECT_EQ(ai.get(p).divisibility, V{8});
  EXPECT_EQ(ai.get(q).divisibility, V{32});
  EXPECT_EQ(ai.get(n).divisibility, V{16});  // largest power of two dividing 48
  EXPECT_EQ(ai.get(m).divisibility, V{1});
  f.attrs()["arg_divisibility"] = V{8, 32};
  EXPECT_THROW(AxisInfoAnalysis{f}, Error);
}

TEST(AxisInfo, AddMulOfProgramBlock) {
  Fixture t;
  Value* offs = t.k.add(t.k.splat(t.k.mul(t.b.programId(0), t.k.i32(128)), {128}), t.b.arange(0, 128));
  Value* shifted = t.k.add(offs, t.k.splat(t.k.i32(4), {128}));
  Value* twice = t.k.add(offs, offs);
  Value* back = t.k.sub(t.k.splat(t.k.i32(4), {128}), offs);
  Value* scaled = t.k.mul(offs, t.k.splat(t.k.i32(8), {128}));
  Value* one = t.k.mul(offs, t.k.splat(t.k.i32(1), {128}));
  AxisInfoAnalysis ai(t.f);
  EXPECT_EQ(ai.get(offs).contiguity, V{128});
  EXPECT_EQ(ai.get(offs).divisibility, V{128});
  EXPECT_EQ(ai.get(shifted).contiguity, V{128});
  EXPECT_EQ(ai.get(shifted).divisibility, V{4});
  EXPECT_EQ(ai.get(twice).contiguity, V{1});  // stride 2
  EXPECT_EQ(ai.get(twice).divisibility, V{1});
  EXPECT_EQ(ai.get(back).contiguity, V{1});   // decreasing
  EXPECT_EQ(ai.get(scaled).contiguity, V{1});
  EXPECT_EQ(ai.get(scaled).divisibility, V{8});  // (run start + i) * 8
  EXPECT_EQ(ai.get(one), ai.get(offs));
}

TEST(AxisInfo, ConstantFolding) {
  Fixture t;
  Value* c = t.k.mul(t.k.add(t.k.i32(3), t.k.i32(5)), t.k.i32(4));  // 32
  Value* d = t.b.binary(OpKind::Div, c, t.k.i32(8));                 // 4
  Value* r = t.b.binary(OpKind::Rem, c, t.k.i32(12));                // 8
  Value* s = t.b.binary(OpKind::Shl, d, t.k.i32(3));                 // 32
  AxisInfoAnalysis ai(t.f);
  EXPECT_EQ(ai.get(c).constantValue, 32);
  EXPECT_EQ(ai.get(d).constantValue, 4);
  EXPECT_EQ(ai.get(r).constantValue, 8);
  EXPECT_EQ(ai.get(s).constantValue, 32);
  EXPECT_EQ(ai.get(s).divisibility, V{32});
}

TEST(AxisInfo, DivRemShiftKeepOnlyWhatHolds) {
  Fixture t;
  Value* offs = t.b.arange(0, 64);
  Value* scaled = t.k.mul(offs, t.k.splat(t.k.i32(16), {64}));
  Value* q = t.b.binary(OpKind::Div, scaled, t.k.splat(t.k.i32(4), {64}));
  Value* r = t.b.binary(OpKind::Rem, scaled, t.k.splat(t.k.i32(8), {64}));
  Value* sh = t.b.binary(OpKind::Shr, offs, t.k.splat(t.k.i32(2), {64}));
  Value* sl = t.b.binary(OpKind::Shl, offs, t.k.splat(t.k.i32(2), {64}));
  Value* dv = t.b.binary(OpKind::Div, offs, t.k.splat(t.k.i32(4), {64}));
  AxisInfoAnalysis ai(t.f);
  EXPECT_EQ(ai.get(q).divisibility, V{4});
  EXPECT_EQ(ai.get(r).divisibility, V{8});
  EXPECT_EQ(ai.get(sh).constancy, V{4});  // floor(i / 4): groups of 4 equal
  EXPECT_EQ(ai.get(sh).contiguity, V{1});
  EXPECT_EQ(ai.get(sl).divisibility, V{4});
  EXPECT_EQ(ai.get(sl).contiguity, V{1});
  // Truncating division is not claimed piecewise constant (negative values).
  EXPECT_EQ(ai.get(dv).constancy, V{1});
}

TEST(AxisInfo, CompareAgainstDivisibleBound) {
  Fixture t;
  Function& f = t.f;
  Value* n16 = f.addParam(Type(DType::I32), "n16");
  Value* n1 = f.addParam(Type(DType::I32), "n1");
  f.attrs()["arg_divisibility"] = V{16, 1};
  Value* offs = t.k.add(t.k.splat(t.k.mul(t.b.programId(0), t.k.i32(64)), {64}), t.b.arange(0, 64));
  Value* lt16 = t.k.lt(offs, t.k.splat(n16, {64}));
  Value* ge16 = t.b.cmp("ge", offs, t.k.splat(n16, {64}));
  Value* gt16rev = t.b.cmp("gt", t.k.splat(n16, {64}), offs);
  Value* le16 = t.b.cmp("le", offs, t.k.splat(n16, {64}));  // offs == n flips inside a group
  Value* eq16 = t.b.cmp("eq", offs, t.k.splat(n16, {64}));
  Value* lt1 = t.k.lt(offs, t.k.splat(n1, {64}));
  AxisInfoAnalysis ai(f);
  EXPECT_EQ(ai.get(lt16).constancy, V{16});
  EXPECT_EQ(ai.get(ge16).constancy, V{16});
  EXPECT_EQ(ai.get(gt16rev).constancy, V{16});
  EXPECT_EQ(ai.get(le16).constancy, V{1});
  EXPECT_EQ(ai.get(eq16).constancy, V{1});
  EXPECT_EQ(ai.get(lt1).constancy, V{1});
}

TEST(AxisInfo, BroadcastExpandTransReshape2D) {
  Fixture t;
  Value* N = t.f.addParam(Type(DType::I32), "N");
  t.f.attrs()["arg_divisibility"] = V{32};
  const Shape tile{16, 64};
  Value* rows = t.b.arange(0, 16);
  Value* cols = t.b.arange(0, 64);
  Value* rowsN = t.k.mul(rows, t.k.splat(N, {16}));
  Value* e = t.b.expandDims(rowsN, 1);  // [16, 1]
  Value* rowPart = t.b.broadcast(e, tile);
  Value* colPart = t.k.row(cols, tile);
  Value* offs = t.k.add(rowPart, colPart);
  Value* tr = t.b.trans(offs, {1, 0});
  Value* flat = t.b.reshape(t.b.expandDims(cols, 0), {64});  // squeeze: exact
  Value* mixed = t.b.reshape(offs, {1024});                  // general: conservative
  AxisInfoAnalysis ai(t.f);
  EXPECT_EQ(ai.get(e).divisibility, (V{32, 32}));
  EXPECT_EQ(ai.get(rowPart).constancy, (V{1, 64}));
  EXPECT_EQ(ai.get(colPart).constancy, (V{16, 1}));
  EXPECT_EQ(ai.get(colPart).contiguity, (V{1, 64}));
  EXPECT_EQ(ai.get(offs).contiguity, (V{1, 64}));
  EXPECT_EQ(ai.get(offs).divisibility, (V{1, 32}));
  EXPECT_EQ(ai.get(tr).contiguity, (V{64, 1}));
  EXPECT_EQ(ai.get(tr).divisibility, (V{32, 1}));
  EXPECT_EQ(ai.get(flat).contiguity, V{64});
  EXPECT_EQ(ai.get(mixed).contiguity, V{1});
}

TEST(AxisInfo, AddPtrCountsBytes) {
  Function f("p");
  Value* p = f.addParam(Type::pointer(DType::F32), "p");
  Value* q = f.addParam(Type::pointer(DType::F16), "q");
  Value* n = f.addParam(Type(DType::I32), "n");
  f.attrs()["arg_divisibility"] = V{16, 4, 2};
  Builder b(f);
  K k{b};
  Value* offs = b.arange(0, 32);
  Value* pp = k.ptrs(p, offs);
  Value* shifted = k.ptrs(p, k.add(offs, k.splat(n, {32})));  // n * 4 bytes: 8-byte aligned
  Value* qq = k.ptrs(q, offs);
  AxisInfoAnalysis ai(f);
  EXPECT_EQ(ai.get(pp).contiguity, V{32});
  EXPECT_EQ(ai.get(pp).divisibility, V{16});
  EXPECT_EQ(ai.get(shifted).divisibility, V{8});
  EXPECT_EQ(ai.get(qq).divisibility, V{4});
  EXPECT_EQ(vectorWidth(pp, ai), 4);       // 16 bytes of f32
  EXPECT_EQ(vectorWidth(shifted, ai), 2);  // 8-byte alignment
  EXPECT_EQ(vectorWidth(qq, ai), 2);       // 4-byte alignment of f16
}

TEST(AxisInfo, SelectAndCast) {
  Fixture t;
  Value* offs = t.b.arange(0, 64);
  Value* c = t.k.lt(offs, t.k.splat(t.k.i32(32), {64}));  // constancy 32
  Value* sel = t.b.select(c, offs, t.k.add(offs, t.k.splat(t.k.i32(64), {64})));
  Value* wide = t.b.cast(offs, DType::I64);
  Value* fl = t.b.cast(t.k.splat(t.k.i32(3), {64}), DType::F32);
  Value* trueSel = t.b.select(t.b.constantInt(Type(DType::I1, {64}), 1), offs, sel);
  AxisInfoAnalysis ai(t.f);
  EXPECT_EQ(ai.get(c).constancy, V{32});
  EXPECT_EQ(ai.get(sel).contiguity, V{32});
  EXPECT_EQ(ai.get(sel).divisibility, V{32});  // 96, the start of the second run
  EXPECT_EQ(ai.get(wide), ai.get(offs));
  EXPECT_EQ(ai.get(fl).constancy, V{64});
  EXPECT_EQ(ai.get(fl).divisibility, V{1});
  EXPECT_EQ(ai.get(trueSel), ai.get(offs));
}

TEST(AxisInfo, LoopInductionAndCarriedValues) {
  Function f("loop");
  Value* p = f.addParam(Type::pointer(DType::F32), "p");
  Value* n = f.addParam(Type(DType::I32), "n");
  Builder b(f);
  K k{b};
  Value* ptr0 = k.ptrs(p, b.arange(0, 64));
  Value* iv = nullptr;
  Value* argPtr = nullptr;
  Value* argOff = nullptr;
  auto res = b.forLoop(k.i32(32), n, k.i32(64), {ptr0, b.arange(0, 64)}, [&](Value* i, std::vector<Value*> c) {
    iv = i;
    argPtr = c[0];
    argOff = c[1];
    // The pointer advances by 64 elements (256 bytes): alignment and
    // contiguity survive; the offsets advance by 1 each iteration: their
    // divisibility does not.
    return std::vector<Value*>{b.addptr(c[0], k.splat(k.i32(64), {64})), k.add(c[1], k.splat(k.i32(1), {64}))};
  });
  AxisInfoAnalysis ai(f);
  EXPECT_EQ(ai.get(iv).divisibility, V{32});  // gcd(32, 64)
  EXPECT_EQ(ai.get(argPtr).contiguity, V{64});
  EXPECT_EQ(ai.get(argPtr).divisibility, V{16});
  EXPECT_EQ(ai.get(res[0]), ai.get(argPtr));
  EXPECT_EQ(ai.get(argOff).contiguity, V{64});
  EXPECT_EQ(ai.get(argOff).divisibility, V{1});
}

TEST(AxisInfo, ReduceAndLoadConstancy) {
  Function f("r");
  Value* p = f.addParam(Type::pointer(DType::F32), "p");
  Builder b(f);
  K k{b};
  // Every row of the pointer tile is one address: the loaded tile is
  // constant along rows, and so are its row reductions.
  Value* ptrs = k.col(k.ptrs(p, b.arange(0, 16)), {16, 32});
  Value* t = b.load(ptrs);
  Value* r = b.reduce(t, 0, "sum");
  AxisInfoAnalysis ai(f);
  EXPECT_EQ(ai.get(t).constancy, (V{1, 32}));
  EXPECT_EQ(ai.get(r).constancy, V{32});
}

// Brute force: build random integer expressions over small 2-D tiles whose
// values we can compute, and check that every claimed fact holds.
struct Eval {
  Shape shape;
  std::vector<int64_t> v;  // row-major
};

TEST(AxisInfo, RandomExpressionsFactsHold) {
  const unsigned seed = testSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const Shape shape{8, 16};
  for (int trial = 0; trial < 200; ++trial) {
    Function f("rand");
    Builder b(f);
    K k{b};
    std::vector<std::pair<Value*, std::vector<int64_t>>> pool;
    auto values2D = [&](auto fn) {
      std::vector<int64_t> out(128);
      for (int i = 0; i < 8; ++i)
        for (int j = 0; j < 16; ++j) out[i * 16 + j] = fn(i, j);
      return out;
    };
    auto pick = [&]() -> auto& { return pool[rng() % pool.size()]; };
    // Leaves: aranges along each dimension with random starts, splats.
    for (int i = 0; i < 4; ++i) {
      const int64_t eighths = int64_t(rng() % 4);  // two draws, one statement each: the same on every compiler
      int64_t start = eighths * 8 * int64_t(rng() % 3);
      pool.push_back({k.row(b.arange(start, start + 16), shape), values2D([&](int, int j) { return start + j; })});
      pool.push_back({k.col(b.arange(start, start + 8), shape), values2D([&](int i2, int) { return start + i2; })});
      int64_t c = int64_t(rng() % 64) - 8;
      pool.push_back({k.splat(k.i32(c), shape), values2D([&](int, int) { return c; })});
    }
    for (int step = 0; step < 6; ++step) {
      auto [x, xv] = pick();
      auto [y, yv] = pick();
      int which = int(rng() % 6);
      OpKind kinds[] = {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Shr, OpKind::And, OpKind::Maximum};
      std::vector<int64_t> out(128);
      Value* r;
      if (kinds[which] == OpKind::Shr) {
        int64_t s = rng() % 4;
        r = b.binary(OpKind::Shr, x, k.splat(k.i32(s), shape));
        for (int i = 0; i < 128; ++i) out[i] = xv[i] >> s;
      } else {
        r = b.binary(kinds[which], x, y);
        for (int i = 0; i < 128; ++i) {
          switch (kinds[which]) {
            case OpKind::Add: out[i] = xv[i] + yv[i]; break;
            case OpKind::Sub: out[i] = xv[i] - yv[i]; break;
            case OpKind::Mul: out[i] = xv[i] * yv[i]; break;
            case OpKind::And: out[i] = xv[i] & yv[i]; break;
            default: out[i] = std::max(xv[i], yv[i]); break;
          }
        }
      }
      pool.push_back({r, out});
    }
    // Comparisons against splats.
    {
      auto [x, xv] = pick();
      int64_t bound = int64_t(rng() % 8) * 16;
      Value* c = b.cmp("lt", x, k.splat(k.i32(bound), shape));
      std::vector<int64_t> out(128);
      for (int i = 0; i < 128; ++i) out[i] = xv[i] < bound;
      pool.push_back({c, out});
    }
    AxisInfoAnalysis ai(f);
    for (auto& [v, vals] : pool) {
      const AxisInfo& info = ai.get(v);
      for (int d = 0; d < 2; ++d) {
        const int64_t c = info.contiguity[d], kk = info.constancy[d], dv = info.divisibility[d];
        for (int i = 0; i < 8; ++i)
          for (int j = 0; j < 16; ++j) {
            int pos = d == 0 ? i : j;
            int gi = d == 0 ? i - pos % int(c) : i, gj = d == 1 ? j - pos % int(c) : j;
            int64_t first = vals[gi * 16 + gj];
            ASSERT_EQ(vals[i * 16 + j], first + pos % c) << "contiguity " << info.str() << " dim " << d;
            if (v->type().dtype() != DType::I1) {
              ASSERT_EQ(first % dv, 0) << "divisibility " << info.str() << " dim " << d;
            }
            int ki = d == 0 ? i - pos % int(kk) : i, kj = d == 1 ? j - pos % int(kk) : j;
            ASSERT_EQ(vals[i * 16 + j], vals[ki * 16 + kj]) << "constancy " << info.str() << " dim " << d;
          }
      }
    }
  }
}

}  // namespace
}  // namespace flextile::codegen
