// Compiled kernels on the GPU against the interpreter (the semantic oracle)
// and against float64 Eigen references: every element-wise op and cast,
// reductions with warps along the axis, layout conversions, and the example
// kernels over sizes that are not multiples of the block.
#include <Eigen/Core>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "GpuTest.h"
#include "IrHarness.h"
#include "ir/Parser.h"
#include "codegen/LoweringKernels.h"
#include "examples/common.h"
#include "examples/kernels.h"

namespace flextile::testing {
namespace {

using ir::DType;
using ir::OpKind;

// ---- typed byte buffers ------------------------------------------------------

double readAs(const Bytes& b, DType t, size_t i) {
  switch (t) {
    case DType::F32: { float v; std::memcpy(&v, &b[i * 4], 4); return v; }
    case DType::F16: { Eigen::half v; std::memcpy(&v, &b[i * 2], 2); return double(float(v)); }
    case DType::BF16: { Eigen::bfloat16 v; std::memcpy(&v, &b[i * 2], 2); return double(float(v)); }
    case DType::I32: { int32_t v; std::memcpy(&v, &b[i * 4], 4); return v; }
    case DType::I64: { int64_t v; std::memcpy(&v, &b[i * 8], 8); return double(v); }
    case DType::I8: return double(int8_t(b[i]));
    case DType::I1: return b[i] ? 1.0 : 0.0;
    default: ADD_FAILURE() << "unexpected dtype"; return 0;
  }
}

void writeAs(Bytes& b, DType t, size_t i, double x) {
  switch (t) {
    case DType::F32: { float v = float(x); std::memcpy(&b[i * 4], &v, 4); break; }
    case DType::F16: { Eigen::half v{float(x)}; std::memcpy(&b[i * 2], &v, 2); break; }
    case DType::BF16: { Eigen::bfloat16 v{float(x)}; std::memcpy(&b[i * 2], &v, 2); break; }
    case DType::I32: { int32_t v = int32_t(x); std::memcpy(&b[i * 4], &v, 4); break; }
    case DType::I64: { int64_t v = int64_t(x); std::memcpy(&b[i * 8], &v, 8); break; }
    case DType::I8: b[i] = uint8_t(int8_t(x)); break;
    case DType::I1: b[i] = x != 0; break;
    default: ADD_FAILURE() << "unexpected dtype";
  }
}

Bytes randomBuffer(DType t, size_t n, std::mt19937_64& rng, double lo, double hi, bool awayFromZero = false) {
  Bytes b(n * size_t(ir::byteWidth(t)));
  std::uniform_real_distribution<double> d(lo, hi);
  std::bernoulli_distribution sign(0.5);
  for (size_t i = 0; i < n; ++i) {
    double x = d(rng);
    if (awayFromZero) x = (sign(rng) ? 1 : -1) * (0.5 + std::abs(x));
    if (ir::isInteger(t)) x = std::round(x);
    if (awayFromZero && ir::isInteger(t) && x == 0) x = 1;
    writeAs(b, t, i, x);
  }
  return b;
}

Bytes poisoned(DType t, size_t n) { return Bytes(n * size_t(ir::byteWidth(t)), 0xA5); }

// ---- element-wise ops --------------------------------------------------------

struct Domain {
  double lo, hi;
  bool awayFromZeroY = false;
};

Domain domainOf(OpKind k, DType t) {
  switch (k) {
    case OpKind::Log: case OpKind::Log2: case OpKind::Sqrt: case OpKind::Rsqrt: return {0.05, 20};
    case OpKind::Exp: case OpKind::Exp2: return {-12, 12};
    case OpKind::Div: case OpKind::Rem: return {-50, 50, true};
    case OpKind::Shl: case OpKind::Shr: return {0, 31};
    default: return ir::isInteger(t) ? Domain{-1000, 1000} : Domain{-8, 8};
  }
}

// How far the GPU may be from the interpreter: the hardware approximations
// (ex2/lg2/tanh/rsqrt .approx) differ from libm, and a 16-bit result may land
// one rounding step away.
double tolerance(OpKind k, DType result, double ref) {
  double rel = 0, abs = 0;
  switch (k) {
    case OpKind::Tanh: abs = 1e-3; break;               // tanh.approx.f32: about 2^-11
    case OpKind::Exp: case OpKind::Exp2: rel = 4e-6; break;
    case OpKind::Log: case OpKind::Log2: rel = 2e-6; abs = 2e-6; break;
    case OpKind::Rsqrt: rel = 2e-6; break;
    default: break;
  }
  if (result == DType::BF16) rel += 1.0 / 128;
  if (result == DType::F16) rel += 1.0 / 1024;
  return rel * std::abs(ref) + abs;
}

void checkElementwise(OpKind kind, DType t, DType to, std::mt19937_64& rng) {
  const int64_t n = 1000;  // not a multiple of the 256-element block
  const DType resT = kind == OpKind::Cast ? to : kind == OpKind::Cmp ? DType::I1 : t;
  auto f = testkernels::elementwise(kind, t, to, 256, 4);
  Domain d = domainOf(kind, t);
  std::vector<IrArg> args{randomBuffer(t, n, rng, d.lo, d.hi),
                          randomBuffer(t, n, rng, d.lo, d.hi, d.awayFromZeroY),
                          randomBuffer(DType::I1, n, rng, 0, 1), poisoned(resT, n), int64_t(n)};
  if (kind == OpKind::Cast && ir::isFloat(t) && ir::isInteger(to))  // exercise saturation too
    std::get<Bytes>(args[0]) = randomBuffer(t, n, rng, -3e9, 3e9);
  BothRuns r = runBoth(*f, args, {4, 1, 1});
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    double g = readAs(r.gpu[3], resT, size_t(i)), e = readAs(r.interpreter[3], resT, size_t(i));
    bool same = g == e || (std::isnan(g) && std::isnan(e)) || std::abs(g - e) <= tolerance(kind, resT, e);
    if (!same) {
      ++bad;
      ADD_FAILURE() << opName(kind) << " " << dtypeName(t) << "->" << dtypeName(resT) << " element " << i
                    << ": x=" << readAs(std::get<Bytes>(args[0]), t, size_t(i))
                    << " y=" << readAs(std::get<Bytes>(args[1]), t, size_t(i)) << " gpu " << g << " interpreter " << e;
    }
  }
}

TEST(CompiledGpu, FloatElementwiseOpsMatchTheInterpreter) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (OpKind k : {OpKind::Neg, OpKind::Exp, OpKind::Exp2, OpKind::Log, OpKind::Log2, OpKind::Tanh, OpKind::Sqrt,
                     OpKind::Rsqrt, OpKind::Abs, OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Maximum,
                     OpKind::Minimum, OpKind::Cmp, OpKind::Select})
      checkElementwise(k, t, t, rng);
}

// exp2's ftz form (the default): a result below 2^-126 is 0 on the GPU as in the interpreter, the
// smallest normal one and the ends are exact; FLEXTILE_EXP2_FTZ=0 keeps the subnormals, which the
// interpreter flushes (the one place the two differ, below 2^-126).
TEST(CompiledGpu, Exp2FlushesSubnormalResultsAsTheInterpreterDoes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<float> xs = {-130.0f, -140.5f, -126.5f, -126.0f, -125.0f, 0.0f, 3.0f, -INFINITY};
  const int64_t n = 256;
  auto f = testkernels::elementwise(OpKind::Exp2, DType::F32, DType::F32, 256, 4);
  for (const char* ftz : {"1", "0"}) {
    SCOPED_TRACE(std::string("FLEXTILE_EXP2_FTZ=") + ftz);
    ScopedSetenv form("FLEXTILE_EXP2_FTZ", ftz);
    Bytes x = randomBuffer(DType::F32, size_t(n), rng, -12, 12);
    for (size_t i = 0; i < xs.size(); ++i) writeAs(x, DType::F32, i, xs[i]);
    BothRuns r = runBoth(*f, {x, randomBuffer(DType::F32, size_t(n), rng, -1, 1), randomBuffer(DType::I1, size_t(n), rng, 0, 1),
                              poisoned(DType::F32, size_t(n)), int64_t(n)},
                         {1, 1, 1});
    for (size_t i = 0; i < xs.size(); ++i) {
      const double g = readAs(r.gpu[3], DType::F32, i), e = readAs(r.interpreter[3], DType::F32, i);
      const bool subnormal = xs[i] < -126.0f && xs[i] > -150.0f;
      if (subnormal && ftz[0] == '0') {
        EXPECT_GT(g, 0.0) << "x = " << xs[i] << ": the non-ftz form keeps a subnormal";
        EXPECT_EQ(e, 0.0) << "x = " << xs[i];
      } else if (subnormal || xs[i] == -INFINITY) {
        EXPECT_EQ(g, 0.0) << "x = " << xs[i];
        EXPECT_EQ(e, 0.0) << "x = " << xs[i];
      } else {
        EXPECT_NEAR(g, e, tolerance(OpKind::Exp2, DType::F32, e)) << "x = " << xs[i];
      }
    }
  }
}

// exp2 with every other register off the SFU (FLEXTILE_EXP2_EMULATION=2, codegen/Exp2Emulation.h):
// within exp2's tolerance of the interpreter over random inputs, and the ends: -inf and below -127
// give 0 (a subnormal result may flush), 128 and above inf, NaN NaN.
TEST(CompiledGpu, Exp2OffTheSfuMatchesTheInterpreter) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ScopedSetenv emulate("FLEXTILE_EXP2_EMULATION", "2");
  checkElementwise(OpKind::Exp2, DType::F32, DType::F32, rng);
  const std::vector<float> ends = {-INFINITY, -1000.0f, -127.0f, -126.6f, -0.5f, 0.0f, 0.49999997f, 1.0f, 127.4f, 128.0f,
                                   300.0f, INFINITY, NAN};
  const int64_t n = 256;
  Bytes x = randomBuffer(DType::F32, size_t(n), rng, -12, 12);
  for (size_t i = 0; i < ends.size(); ++i)
    for (size_t rep = 0; rep < 2; ++rep) writeAs(x, DType::F32, 2 * i + rep, ends[i]);  // both registers of a pair
  auto f = testkernels::elementwise(OpKind::Exp2, DType::F32, DType::F32, 256, 4);
  BothRuns r = runBoth(*f, {x, randomBuffer(DType::F32, size_t(n), rng, -1, 1), randomBuffer(DType::I1, size_t(n), rng, 0, 1),
                            poisoned(DType::F32, size_t(n)), int64_t(n)},
                       {1, 1, 1});
  for (int64_t i = 0; i < n; ++i) {
    const double g = readAs(r.gpu[3], DType::F32, size_t(i)), e = readAs(r.interpreter[3], DType::F32, size_t(i));
    // Just above 2^-126 the emulation and ex2.approx.ftz may differ by a subnormal.
    const bool same = g == e || (std::isnan(g) && std::isnan(e)) ||
                      std::abs(g - e) <= tolerance(OpKind::Exp2, DType::F32, e) + double(FLT_MIN);
    EXPECT_TRUE(same) << "x = " << readAs(x, DType::F32, size_t(i)) << ": gpu " << g << " interpreter " << e;
  }
}

TEST(CompiledGpu, IntegerElementwiseOpsMatchTheInterpreter) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (OpKind k : {OpKind::Neg, OpKind::Abs, OpKind::Not, OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div,
                   OpKind::Rem, OpKind::Maximum, OpKind::Minimum, OpKind::And, OpKind::Or, OpKind::Xor, OpKind::Shl,
                   OpKind::Shr, OpKind::Cmp, OpKind::Select})
    checkElementwise(k, DType::I32, DType::I32, rng);
}

TEST(CompiledGpu, CastsMatchTheInterpreter) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::I8, DType::I1};
  for (DType from : all)
    for (DType to : all)
      if (from != to) checkElementwise(OpKind::Cast, from, to, rng);
}

// ---- reductions and layout conversions --------------------------------------

TEST(CompiledGpu, ReductionsWithWarpsAlongTheAxisMatch) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  using ir::Layout;
  // Warps along rows and along columns, lanes split both ways.
  const Layout parents[] = {
      Layout::blocked({64, 32}, {1, 2}, {4, 8}, {4, 1}, {1, 0}),
      Layout::blocked({64, 32}, {2, 1}, {8, 4}, {1, 4}, {1, 0}),
      Layout::blocked({32, 128}, {1, 4}, {1, 32}, {2, 4}, {1, 0}),
      Layout::blocked({128, 16}, {1, 1}, {32, 1}, {8, 1}, {0, 1}),
  };
  for (const Layout& p : parents)
    for (int axis : {0, 1})
      for (const char* kind : {"sum", "max", "min"})
        for (DType t : {DType::F32, DType::I32}) {
          auto f = testkernels::reduceTile(p, axis, kind, t);
          const int64_t n = p.shape()[0] * p.shape()[1], m = p.shape()[1 - axis];
          BothRuns r = runBoth(*f, {randomBuffer(t, size_t(n), rng, -100, 100), poisoned(t, size_t(m))}, {1, 1, 1});
          for (int64_t i = 0; i < m; ++i) {
            double g = readAs(r.gpu[1], t, size_t(i)), e = readAs(r.interpreter[1], t, size_t(i));
            // f32 sums round at every step: the error scales with the terms (|x| <= 100), not the result.
            const double tol = std::string(kind) == "sum" ? 1e-6 * 100 * double(p.shape()[axis]) : 0;
            ASSERT_NEAR(g, e, tol) << kind << " axis " << axis << " of " << p.str() << " at " << i;
          }
        }
}

TEST(CompiledGpu, LayoutConversionsMoveEveryElement) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  using ir::Layout;
  Layout a = Layout::blocked({64, 64}, {1, 4}, {2, 16}, {4, 1}, {1, 0});
  Layout b = Layout::blocked({64, 64}, {4, 1}, {16, 2}, {1, 4}, {0, 1});
  for (DType t : {DType::F32, DType::BF16, DType::I8}) {
    auto f = testkernels::convertCopy(a, b, t);
    Bytes x = randomBuffer(t, 64 * 64, rng, -100, 100);
    BothRuns r = runBoth(*f, {x, poisoned(t, 64 * 64)}, {1, 1, 1});
    EXPECT_EQ(r.gpu[1], x) << dtypeName(t);
  }
  // 128x32 transposes with other vector widths (swizzled scratch, ConversionPlan.h).
  Layout c = Layout::blocked({128, 32}, {1, 8}, {8, 4}, {8, 1}, {1, 0});
  Layout d = Layout::blocked({128, 32}, {2, 1}, {32, 1}, {1, 8}, {0, 1});
  for (DType t : {DType::BF16, DType::I8})
    for (auto [from, to] : {std::pair{c, d}, std::pair{d, c}}) {
      auto f = testkernels::convertCopy(from, to, t);
      Bytes x = randomBuffer(t, 128 * 32, rng, -100, 100);
      BothRuns r = runBoth(*f, {x, poisoned(t, 128 * 32)}, {1, 1, 1});
      EXPECT_EQ(r.gpu[1], x) << dtypeName(t) << " " << from.str() << " -> " << to.str();
    }
}

// ---- the example kernels, through the DSL ------------------------------------

using namespace flextile::examples;

TEST(CompiledGpu, VectorAddOverRaggedSizes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  std::mt19937 gen{uint32_t(rng())};
  Kernel add = vectorAdd();
  for (int n : {1, 3, 127, 129, 1000, 1000003}) {
    auto x = randomVector<float>(size_t(n), gen), y = randomVector<float>(size_t(n), gen);
    std::vector<float> out(size_t(n), NAN);
    auto dx = toDevice(x), dy = toDevice(y), dout = toDevice(out);
    for (int warps : {1, 4, 8}) {
      dout.fillBytes(0xFF);
      add.run({{cdiv(n, 1024), 1, 1}, {1024}, warps}, dx, dy, dout, n);
      runtime::synchronize();
      fromDevice(dout, out);
      for (int i = 0; i < n; ++i) ASSERT_EQ(out[size_t(i)], x[size_t(i)] + y[size_t(i)]) << "n=" << n << " i=" << i;
    }
  }
}

template <class T>
void checkSoftmax(int rows, int cols, int rowsPerProgram, int warps, std::mt19937& gen) {
  using H = host_t<T>;
  int block = 1;
  while (block < cols) block *= 2;
  auto x = randomVector<H>(size_t(rows) * cols, gen, -6, 6);
  std::vector<H> y(x.size(), H(NAN)), yi(x.size(), H(NAN));
  auto dx = toDevice(x), dy = toDevice(y);
  Kernel k = rowSoftmax<T>();
  LaunchOptions launch{{cdiv(rows, rowsPerProgram), 1, 1}, {rowsPerProgram, block}, warps};
  k.run(launch, dx, dy, rows, cols);
  runtime::synchronize();
  fromDevice(dy, y);
  k.interpret(launch, x, yi, rows, cols);
  const std::vector<double> ref = softmaxReference(x, rows, cols);
  const double tol = std::is_same_v<T, dsl::f32> ? 1e-5 : 1e-2;
  bool nonFinite = false;
  double err = relativeError(y, ref, &nonFinite), errI = relativeError(yi, ref);
  EXPECT_FALSE(nonFinite);
  EXPECT_LT(err, tol) << rows << "x" << cols << " rows/program " << rowsPerProgram << " warps " << warps;
  EXPECT_LT(errI, tol);
}

TEST(CompiledGpu, RowSoftmaxAgainstFloat64) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  std::mt19937 gen{uint32_t(rng())};
  // (warps, rows per program): two sampled per shape, so the five shapes visit all eight (every
  // point for every shape with FLEXTILE_GPU_TESTS_FULL=1; TestBudget.h).
  std::vector<std::pair<int, int>> points;
  for (int warps : {1, 2, 4, 8})
    for (int rpp : {1, 4}) points.push_back({warps, rpp});
  ConfigSample sample(points, 2, rng);
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 1}, {3, 1000}, {129, 127}, {1000, 3}, {7, 4096}})
    for (auto [warps, rpp] : sample.next()) {
      checkSoftmax<dsl::bf16>(rows, cols, rpp, warps, gen);
      checkSoftmax<dsl::f32>(rows, cols, rpp, warps, gen);
    }
  checkSoftmax<dsl::f16>(333, 777, 2, 4, gen);
}

template <class T>
void checkMatmul(int M, int N, int K, int BM, int BN, int BK, int warps, std::mt19937& gen) {
  using H = host_t<T>;
  auto a = randomVector<H>(size_t(M) * K, gen), b = randomVector<H>(size_t(K) * N, gen);
  std::vector<float> c(size_t(M) * N, NAN);
  auto da = toDevice(a), db = toDevice(b), dc = toDevice(c);
  matmul<T>().run({{cdiv(M, BM), cdiv(N, BN), 1}, {BM, BN, BK}, warps}, da, db, dc, M, N, K);
  runtime::synchronize();
  fromDevice(dc, c);
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor A(M, K), B(K, N);
  for (int i = 0; i < M * K; ++i) A.data()[i] = double(float(a[size_t(i)]));
  for (int i = 0; i < K * N; ++i) B.data()[i] = double(float(b[size_t(i)]));
  RowMajor C = A * B;
  double err = relativeError(c, std::vector<double>(C.data(), C.data() + size_t(M) * N));
  // f32 dots run on tensor cores in tf32 (10 mantissa bits, as Triton's default).
  const double tol = std::is_same_v<T, dsl::f32> ? 1e-3 : 1e-5;
  EXPECT_LT(err, tol) << M << "x" << N << "x" << K << " tile " << BM << "x" << BN << "x" << BK << " warps " << warps;
}

TEST(CompiledGpu, MatmulAgainstFloat64) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  std::mt19937 gen{uint32_t(rng())};
  for (auto [M, N, K] : std::vector<std::array<int, 3>>{{1, 1, 1}, {127, 129, 200}, {64, 64, 64}, {3, 1000, 17}}) {
    checkMatmul<dsl::f32>(M, N, K, 32, 32, 16, 4, gen);
    checkMatmul<dsl::f16>(M, N, K, 64, 64, 32, 4, gen);
    checkMatmul<dsl::bf16>(M, N, K, 64, 32, 16, 2, gen);
    checkMatmul<dsl::bf16>(M, N, K, 16, 64, 64, 8, gen);
  }
}


// cluster_all_gather through distributed shared memory: each program of a cluster of `size` loads
// a [16, 128] f32 tile (the decode's partial: 4 warps, 16 registers a thread) and gathers it with
// its program id; it stores sum_r (r + 1) * tile_r + sum_r pid_r, so a rank that read another's
// copy, or a copy not yet written, shows. Against the interpreter, over two clusters along x and
// three rows along y; and with {to, rows = 4}: only the last rank receives, only 4 of the 16 rows.
TEST(CompiledGpu, ClusterAllGatherHandsEveryRankEveryTile) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (const auto& [size, attrs] : std::vector<std::pair<int64_t, std::string>>{
           {2, ""}, {6, ""}, {8, ""}, {2, ", to = 1, rows = 4"}, {6, ", to = 5, rows = 4"}}) {
    SCOPED_TRACE("size " + std::to_string(size) + attrs);
    std::string results, types, sum = "  %acc0 = constant {value = 0.0} : f32[16,128]\n  %pacc0 = constant {value = 0} : i32\n";
    for (int64_t r = 0; r < size; ++r) {
      results += "%v" + std::to_string(r) + ", ";
      types += "f32[16,128], ";
    }
    for (int64_t r = 0; r < size; ++r) {
      const std::string a = std::to_string(r), n = std::to_string(r + 1);
      results += std::string(r ? ", " : "") + "%q" + a;
      types += std::string(r ? ", " : "") + "i32";
      sum += "  %w" + a + " = constant {value = " + n + ".0} : f32[16,128]\n  %m" + a + " = mul %v" + a + ", %w" + a +
             " : f32[16,128]\n  %acc" + n + " = add %acc" + a + ", %m" + a + " : f32[16,128]\n  %pacc" + n +
             " = add %pacc" + a + ", %q" + a + " : i32\n";
    }
    const std::string last = std::to_string(size);
    const std::string text = R"(
func @gather_tiles(%x: ptr<f32>, %out: ptr<f32>) attributes {num_warps = 4, arg_divisibility = [16, 16]} {
  %pid = program_id {axis = 0} : i32
  %y = program_id {axis = 1} : i32
  %np = num_programs {axis = 0} : i32
  %row0 = mul %y, %np : i32
  %row = add %row0, %pid : i32
  %c2048 = constant {value = 2048} : i32
  %base = mul %row, %c2048 : i32
  %rows = arange {start = 0, end = 16} : i32[16]
  %cols = arange {start = 0, end = 128} : i32[128]
  %r2 = expand_dims %rows {axis = 1} : i32[16,1]
  %r3 = broadcast %r2 : i32[16,128]
  %c2 = expand_dims %cols {axis = 0} : i32[1,128]
  %c3 = broadcast %c2 : i32[16,128]
  %c128 = constant {value = 128} : i32[16,128]
  %ro = mul %r3, %c128 : i32[16,128]
  %o0 = add %ro, %c3 : i32[16,128]
  %b = splat %base : i32[16,128]
  %i = add %b, %o0 : i32[16,128]
  %xs = splat %x : ptr<f32>[16,128]
  %px = addptr %xs, %i : ptr<f32>[16,128]
  %v = load %px : f32[16,128]
  )" + results + " = cluster_all_gather %v, %pid {size = " + last + attrs + "} : " + types + "\n" + sum +
                             "  %pf = cast %pacc" + last + " : f32\n  %ps = splat %pf : f32[16,128]\n  %o = add %acc" +
                             last + ", %ps : f32[16,128]\n" + R"(
  %outs = splat %out : ptr<f32>[16,128]
  %po = addptr %outs, %i : ptr<f32>[16,128]
  store %po, %o
  return
}
)";
    std::unique_ptr<ir::Function> f = ir::parseFunction(text);
    const int64_t P = 2 * size, Y = 3, n = P * Y * 2048;
    BothRuns r = runBoth(*f, {randomBuffer(DType::F32, size_t(n), rng, -2, 2), poisoned(DType::F32, size_t(n))}, {P, Y, 1});
    EXPECT_NE(r.code.ptx.find(".reqnctapercluster " + last + ", 1, 1"), std::string::npos);
    int bad = 0;
    for (int64_t i = 0; i < n && bad < 5; ++i) {
      const double g = readAs(r.gpu[1], DType::F32, size_t(i)), e = readAs(r.interpreter[1], DType::F32, size_t(i));
      if (!(std::abs(g - e) <= 1e-5 * (1 + std::abs(e)))) {
        ++bad;
        ADD_FAILURE() << "cluster of " << size << ", element " << i << " (program " << (i / 2048) % P << ", "
                      << i / 2048 / P << "): gpu " << g << " interpreter " << e;
      }
    }
  }
}

}  // namespace
}  // namespace flextile::testing
