// Tensor-core dots on the GPU against float64 Eigen references: the
// examples::matmul kernel through the DSL over bf16, f16 and f32 (tf32) with
// M, N, K that are not multiples of the block and 1-16 warps, and an attention
// block (softmax over the accumulator in registers, P feeding P.V from
// registers, or through ldmatrix when the warps split N).
#include <Eigen/Core>
#include <cmath>
#include <cstring>

#include "GpuTest.h"
#include "IrHarness.h"
#include "codegen/MmaKernels.h"
#include "codegen/TensorCores.h"
#include "ir/Parser.h"
#include "examples/common.h"
#include "examples/kernels.h"

namespace flextile::testing {
namespace {

using namespace flextile::examples;
using dsl::cdiv;
using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Norm-relative error bounds. 16-bit inputs multiply exactly and accumulate
// in f32; f32 inputs are rounded to tf32 (10 mantissa bits, unit roundoff
// 2^-11) before the product.
template <class T>
double tolerance() {
  return std::is_same_v<T, dsl::f32> ? 1e-3 : 1e-5;
}

template <class T>
void checkMatmul(int M, int N, int K, int BM, int BN, int BK, int warps, std::mt19937& gen) {
  using H = host_t<T>;
  auto a = randomVector<H>(size_t(M) * K, gen), b = randomVector<H>(size_t(K) * N, gen);
  std::vector<float> c(size_t(M) * N, NAN);
  auto da = toDevice(a), db = toDevice(b), dc = toDevice(c);
  dsl::Kernel mm = examples::matmul<T>();
  dsl::LaunchOptions launch{{cdiv(M, BM), cdiv(N, BN), 1}, {BM, BN, BK}, warps};
  const auto& code = mm.compile(launch, {da, db, dc, M, N, K});
  const bool tensorCores = code.ptx.find("mma.sync") != std::string::npos || code.ptx.find("wgmma.mma_async") != std::string::npos;
  mm.run(launch, da, db, dc, M, N, K);
  runtime::synchronize();
  fromDevice(dc, c);
  RowMajor A(M, K), B(K, N);
  for (int i = 0; i < M * K; ++i) A.data()[i] = double(float(a[size_t(i)]));
  for (int i = 0; i < K * N; ++i) B.data()[i] = double(float(b[size_t(i)]));
  RowMajor C = A * B;
  double err = relativeError(c, std::vector<double>(C.data(), C.data() + size_t(M) * N));
  const std::string what = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " tile " +
                           std::to_string(BM) + "x" + std::to_string(BN) + "x" + std::to_string(BK) + " warps " +
                           std::to_string(warps) + (tensorCores ? " (mma)" : " (fma)");
  EXPECT_LT(err, tolerance<T>()) << what;
  // Every tile here satisfies the mma shape rules: the tensor-core path ran.
  EXPECT_TRUE(tensorCores) << what;
  // tf32 really rounds: an exact f32 result would mean the FMA path.
  if (std::is_same_v<T, dsl::f32> && M * N * K > 1000) {
    EXPECT_GT(err, 1e-6) << what;
  }
}

struct Config {
  int BM, BN, BK, warps;
};

template <class T>
void matmulGrid(const std::vector<Config>& configs) {
  SeededRandom rng;
  std::mt19937 gen{uint32_t(rng())};
  for (auto [M, N, K] : std::vector<std::array<int, 3>>{{127, 129, 200}, {1, 9, 17}, {300, 70, 33}})
    for (const Config& c : configs) checkMatmul<T>(M, N, K, c.BM, c.BN, c.BK, c.warps, gen);
}

TEST(MmaGpu, MatmulBf16) {
  FLEXTILE_REQUIRE_GPU();
  matmulGrid<dsl::bf16>({{16, 16, 16, 1}, {64, 64, 32, 4}, {128, 128, 32, 8}, {32, 64, 64, 2}, {16, 128, 16, 4},
                         {128, 16, 32, 8}, {64, 32, 16, 1}, {256, 128, 32, 16}, {128, 128, 32, 16}});
}

TEST(MmaGpu, MatmulF16) {
  FLEXTILE_REQUIRE_GPU();
  matmulGrid<dsl::f16>({{16, 16, 16, 2}, {64, 64, 32, 4}, {128, 64, 64, 8}, {32, 32, 32, 1}});
}

TEST(MmaGpu, MatmulTf32) {
  FLEXTILE_REQUIRE_GPU();
  matmulGrid<dsl::f32>({{16, 8, 8, 1}, {64, 64, 16, 4}, {128, 64, 32, 8}, {32, 32, 8, 2}});
}

// ---- attention block ------------------------------------------------------------

Bytes bf16Buffer(const std::vector<double>& v) {
  Bytes b(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    Eigen::bfloat16 h{float(v[i])};
    std::memcpy(&b[i * 2], &h, 2);
  }
  return b;
}

void checkAttentionBlock(int64_t bm, int64_t bn, int64_t d, int warps, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1, 1);
  auto rounded = [&](size_t n) {  // values exactly representable in bf16
    std::vector<double> v(n);
    for (auto& x : v) x = double(float(Eigen::bfloat16{float(u(rng))}));
    return v;
  };
  auto q = rounded(size_t(bm * d)), k = rounded(size_t(bn * d)), v = rounded(size_t(bn * d));
  Bytes o(size_t(bm * d) * 4, 0xff);
  auto f = testkernels::attentionBlock(bm, bn, d, warps);
  BothRuns runs = runBoth(*f, {bf16Buffer(q), bf16Buffer(k), bf16Buffer(v), o}, {1, 1, 1});
  // float64 reference; P is rounded to bf16 as the kernel does before P.V.
  Eigen::Map<const RowMajor> Q(q.data(), bm, d), Kt(k.data(), bn, d), V(v.data(), bn, d);
  RowMajor S = Q * Kt.transpose();
  RowMajor P(bm, bn), Pb(bm, bn);
  Eigen::VectorXd l(bm);
  for (int64_t i = 0; i < bm; ++i) {
    double mx = S.row(i).maxCoeff();
    for (int64_t j = 0; j < bn; ++j) {
      P(i, j) = std::exp2(S(i, j) - mx);
      Pb(i, j) = double(float(Eigen::bfloat16{float(P(i, j))}));
    }
    l(i) = P.row(i).sum();
  }
  RowMajor O = Pb * V;
  for (int64_t i = 0; i < bm; ++i) O.row(i) /= l(i);
  std::vector<float> got(size_t(bm * d));
  std::memcpy(got.data(), runs.gpu[3].data(), got.size() * 4);
  double err = relativeError(got, std::vector<double>(O.data(), O.data() + bm * d));
  // bf16(P) may round the other way where the kernel's exp2.approx differs
  // from exp2 in the last bits: a few elements off by 2^-8 relative.
  EXPECT_LT(err, 4e-3) << bm << "x" << bn << " d " << d << " warps " << warps;
  EXPECT_NE(runs.code.ptx.find("mma.sync"), std::string::npos);
}

TEST(MmaGpu, AttentionBlockSoftmaxOverTheAccumulator) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (auto [bm, bn, d, warps] : std::vector<std::array<int, 4>>{
           {64, 64, 64, 4}, {128, 64, 64, 8}, {128, 64, 128, 4}, {16, 64, 64, 1}, {64, 128, 32, 2}})
    checkAttentionBlock(bm, bn, d, warps, rng);
}

TEST(MmaGpu, AttentionBlockWithWarpsAlongN) {
  // M = 16 with 4 warps: S is split along N, the row reductions combine
  // warps through shared memory and P reaches P.V through ldmatrix.
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  checkAttentionBlock(16, 64, 64, 4, rng);
  checkAttentionBlock(32, 128, 64, 8, rng);
}

// A loop-invariant B read by wgmma from a resident one-slot shared tile (TensorCores.h
// wgmmaResidentB; tests/lit/codegen/wgmma_smem_b.ftir is the same function): c = sum over t of
// a_t @ b, against float64.
TEST(MmaGpu, LoopInvariantBFromSharedMemory) {
  FLEXTILE_REQUIRE_GPU();
  const char* text = R"(
func @loop_invariant_b(%a: ptr<bf16>, %b: ptr<bf16>, %c: ptr<f32>, %T: i32)
    attributes {arg_divisibility = [16, 16, 16, 1], num_stages = 2, num_warps = 4} {
  %rm1 = arange {start = 0, end = 64} : i32[64]
  %rm = expand_dims %rm1 {axis = 1} : i32[64,1]
  %rk1 = arange {start = 0, end = 64} : i32[64]
  %rk = expand_dims %rk1 {axis = 0} : i32[1,64]
  %c64 = constant {value = 64} : i32[64,1]
  %row = mul %rm, %c64 : i32[64,1]
  %rowb = broadcast %row : i32[64,64]
  %rkb = broadcast %rk : i32[64,64]
  %off = add %rowb, %rkb : i32[64,64]
  %bs = splat %b : ptr<bf16>[64,64]
  %pb = addptr %bs, %off : ptr<bf16>[64,64]
  %tb = load %pb : bf16[64,64]
  %zero = constant {value = 0.0} : f32[64,64]
  %lb = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %tile = constant {value = 4096} : i32
  %acc = for %lb, %T, %one, %zero : f32[64,64] {
  ^bb(%t: i32, %cacc: f32[64,64]):
    %base = mul %t, %tile : i32
    %bases = splat %base : i32[64,64]
    %aoff = add %off, %bases : i32[64,64]
    %as = splat %a : ptr<bf16>[64,64]
    %pa = addptr %as, %aoff : ptr<bf16>[64,64]
    %ta = load %pa : bf16[64,64]
    %next = dot %ta, %tb, %cacc : f32[64,64]
    yield %next
  }
  %cs = splat %c : ptr<f32>[64,64]
  %pc = addptr %cs, %off : ptr<f32>[64,64]
  store %pc, %acc
  return
}
)";
  std::unique_ptr<ir::Function> f = ir::parseFunction(text);
  SeededRandom rng;
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t T = 5;
  auto rounded = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = double(float(Eigen::bfloat16{float(u(rng))}));
    return v;
  };
  auto a = rounded(size_t(T * 64 * 64)), b = rounded(64 * 64);
  Bytes c(64 * 64 * 4, 0xff);
  BothRuns runs = runBoth(*f, {bf16Buffer(a), bf16Buffer(b), c, T}, {1, 1, 1});
  Eigen::Map<const RowMajor> B(b.data(), 64, 64);
  RowMajor C = RowMajor::Zero(64, 64);
  for (int64_t t = 0; t < T; ++t) C += Eigen::Map<const RowMajor>(a.data() + t * 64 * 64, 64, 64) * B;
  std::vector<float> got(64 * 64);
  std::memcpy(got.data(), runs.gpu[2].data(), got.size() * 4);
  EXPECT_LT(relativeError(got, std::vector<double>(C.data(), C.data() + 64 * 64)), 1e-5);
  if (currentTarget().has(codegen::Feature::Wgmma)) {
    EXPECT_NE(runs.code.ptx.find("wgmma.mma_async"), std::string::npos);
    EXPECT_EQ(runs.code.ptx.find("mma.sync"), std::string::npos);
  }
}

// TMA on the GPU (ir/Ops.def tma_copy, codegen/TensorMaps.h): the pipeline pass's ring-barrier
// schedule of C = sum_t A B_t (B_t rows [64t, 64t + 64) of a [R, 64] bf16 tensor), printed after the
// tile passes (by a version that also waited on each slot's last phase after the loop, and with
// each thread's wait for a slot's previous release before it releases the slot again) with B's
// cp.async copies replaced by hand with one TMA copy per stage on a one-arrival
// `full` barrier (mbarrier_expect_tx; 0 bytes for the stage past the end). R stops 20 rows short of
// the last tile: those rows must land as zeros. The tensor map is encoded from the launch arguments
// as dsl::Kernel does; the interpreter runs the same IR.
TEST(TmaGpu, PipelinedProductReadsItsRingThroughTensorMaps) {
  FLEXTILE_REQUIRE_GPU();
  if (!currentTarget().has(codegen::Feature::TensorMemoryAccelerator)) GTEST_SKIP() << "TMA needs sm_90";
  const char* text = R"(#L0 = #ft.linear<[64], reg=[[16], [32]], lane=[[0], [0], [0], [1], [2]], warp=[[4], [8]]>
#L1 = #ft.linear<[64], reg=[[8], [32]], lane=[[0], [0], [1], [2], [4]], warp=[[0], [16]]>
#L2 = #ft.linear<[64], reg=[[1], [2], [4]], lane=[[8], [16], [32], [0], [0]], warp=[[0], [0]]>
#L3 = #ft.linear<[64], reg=[[1], [16], [32]], lane=[[2], [4], [0], [0], [0]], warp=[[8], [0]]>
#L4 = #ft.linear<[64,1], reg=[[16,0], [32,0]], lane=[[0,0], [0,0], [0,0], [1,0], [2,0]], warp=[[4,0], [8,0]]>
#L5 = #ft.linear<[64,1], reg=[[8,0], [32,0]], lane=[[0,0], [0,0], [1,0], [2,0], [4,0]], warp=[[0,0], [16,0]]>
#L6 = #ft.linear<[1,64], reg=[[0,1], [0,2], [0,4]], lane=[[0,8], [0,16], [0,32], [0,0], [0,0]], warp=[[0,0], [0,0]]>
#L7 = #ft.linear<[1,64], reg=[[0,1], [0,16], [0,32]], lane=[[0,2], [0,4], [0,0], [0,0], [0,0]], warp=[[0,8], [0,0]]>
#L8 = #ft.linear<[64,64], reg=[[0,1], [0,2], [0,4], [16,0], [32,0]], lane=[[0,8], [0,16], [0,32], [1,0], [2,0]], warp=[[4,0], [8,0]]>
#L9 = #ft.linear<[64,64], reg=[[0,1], [8,0], [0,16], [0,32], [32,0]], lane=[[0,2], [0,4], [1,0], [2,0], [4,0]], warp=[[0,8], [16,0]]>
#L10 = #ft.linear<[64,64], reg=[[0,1], [8,0], [0,8], [0,16], [0,32], [32,0]], lane=[[0,2], [0,4], [1,0], [2,0], [4,0]], warp=[[0,0], [16,0]]>
#L11 = #ft.linear<[64,64], reg=[[1,0], [8,0], [16,0], [32,0], [0,16], [0,32]], lane=[[2,0], [4,0], [0,1], [0,2], [0,4]], warp=[[0,8], [0,0]]>

func @gemm(%a: ptr<bf16>, %b: ptr<bf16>, %c: ptr<f32>, %T: i32, %R: i32) attributes {arg_divisibility = [16, 16, 16, 1, 1], num_stages = 2, num_warps = 4, ring_barriers = 1} {
  %0 = arange {end = 64, start = 0} : i32[64]#L0
  %1 = arange {end = 64, start = 0} : i32[64]#L1
  %2 = arange {end = 64, start = 0} : i32[64]#L2
  %3 = arange {end = 64, start = 0} : i32[64]#L3
  %4 = expand_dims %0 {axis = 1} : i32[64,1]#L4
  %5 = expand_dims %1 {axis = 1} : i32[64,1]#L5
  %6 = expand_dims %2 {axis = 0} : i32[1,64]#L6
  %7 = expand_dims %3 {axis = 0} : i32[1,64]#L7
  %8 = constant {value = 64} : i32[64,1]#L4
  %9 = constant {value = 64} : i32[64,1]#L5
  %10 = mul %4, %8 : i32[64,1]#L4
  %11 = mul %5, %9 : i32[64,1]#L5
  %12 = broadcast %10 : i32[64,64]#L8
  %13 = broadcast %11 : i32[64,64]#L9
  %14 = broadcast %6 : i32[64,64]#L8
  %15 = broadcast %7 : i32[64,64]#L9
  %16 = add %12, %14 : i32[64,64]#L8
  %17 = add %13, %15 : i32[64,64]#L9
  %18 = splat %a : ptr<bf16>[64,64]#L8
  %19 = addptr %18, %16 : ptr<bf16>[64,64]#L8
  %20 = load %19 : bf16[64,64]#L8
  %21 = convert_layout %20 : bf16[64,64]#L10
  %22 = constant {value = 0.0} : f32[64,64]#L9
  %23 = constant {value = 0} : i32
  %24 = constant {value = 1} : i32
  %25 = constant {value = 4096} : i32
  %26 = local_alloc : smem<2 x bf16[64,64], #ft.shared<[64, 64], order=[1,0], vec=8, perPhase=1, maxPhase=8, bytes=2>>
  %27 = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>
  %28 = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>
  mbarrier_init %27 {arrivals = 1}
  mbarrier_init %28
  barrier
  %29 = constant {value = 0} : i32
  mbarrier_arrive %28, %29
  %30 = constant {value = 1} : i32
  mbarrier_arrive %28, %30
  %31 = constant {value = 0} : i32
  %32 = mul %24, %31 : i32
  %33 = add %23, %32 : i32
  %34 = constant {value = 0} : i32
  %35 = cmp %33, %T {pred = "lt"} : i1
  %36 = mul %33, %25 : i32
  %37 = splat %36 : i32[64,64]#L8
  %38 = add %16, %37 : i32[64,64]#L8
  %39 = splat %b : ptr<bf16>[64,64]#L8
  %40 = addptr %39, %38 : ptr<bf16>[64,64]#L8
  %41 = splat %35 : i1[64,64]#L8
  %42 = constant {value = 0} : i32
  %c64x = constant {value = 64} : i32
  %row0 = mul %33, %c64x : i32
  mbarrier_expect_tx %27, %42, %35 {bytes = 8192}
  tma_copy %26, %34, %27, %42, %35, %b, %R, %c64x, %c64x, %row0, %42
  %43 = constant {value = 0} : i32
  %44 = constant {value = 0} : i32
  %45, %46, %47 = for %23, %T, %24, %22, %43, %44 : f32[64,64]#L9, i32, i32 {
  ^bb(%48: i32, %49: f32[64,64]#L9, %50: i32, %51: i32):
    %52 = constant {value = 0} : i32
    %53 = cmp %50, %52 {pred = "eq"} : i1
    %54 = constant {value = 1} : i32
    %55 = constant {value = 1} : i32
    %56 = sub %50, %55 : i32
    %57 = select %53, %54, %56 : i32
    %58 = constant {value = 2} : i32
    %59 = div %51, %58 : i32
    %60 = constant {value = 1} : i32
    %61 = and %59, %60 : i32
    mbarrier_wait %27, %50, %61
    %62 = constant {value = 1} : i32
    %63 = add %51, %62 : i32
    %64 = constant {value = 2} : i32
    %65 = div %63, %64 : i32
    %66 = constant {value = 1} : i32
    %67 = and %65, %66 : i32
    mbarrier_wait %28, %57, %67
    %68 = constant {value = 1} : i32
    %69 = mul %24, %68 : i32
    %70 = add %48, %69 : i32
    %71 = cmp %70, %T {pred = "lt"} : i1
    %72 = mul %70, %25 : i32
    %73 = splat %72 : i32[64,64]#L8
    %74 = add %16, %73 : i32[64,64]#L8
    %75 = splat %b : ptr<bf16>[64,64]#L8
    %76 = addptr %75, %74 : ptr<bf16>[64,64]#L8
    %77 = splat %71 : i1[64,64]#L8
    %row1 = mul %70, %c64x : i32
    mbarrier_expect_tx %27, %57, %71 {bytes = 8192}
    tma_copy %26, %57, %27, %57, %71, %b, %R, %c64x, %c64x, %row1, %42
    %78 = local_load %26, %50 : bf16[64,64]#L11
    %79 = dot %21, %78, %49 : f32[64,64]#L9
    %80 = constant {value = 1} : i32
    %81 = add %50, %80 : i32
    %82 = constant {value = 2} : i32
    %83 = cmp %81, %82 {pred = "eq"} : i1
    %84 = constant {value = 0} : i32
    %85 = select %83, %84, %81 : i32
    mbarrier_wait %28, %50, %61
    mbarrier_arrive %28, %50
    %86 = constant {value = 1} : i32
    %87 = add %51, %86 : i32
    yield %79, %85, %87
  }
  async_wait {pending = 0}
  %88 = constant {value = 0} : i32
  %89 = constant {value = 2} : i32
  %90 = add %47, %89 : i32
  %91 = constant {value = 2} : i32
  %92 = div %90, %91 : i32
  %93 = constant {value = 1} : i32
  %94 = add %92, %93 : i32
  %95 = constant {value = 1} : i32
  %96 = and %94, %95 : i32
  mbarrier_wait %27, %88, %96
  %97 = constant {value = 0} : i32
  %98 = constant {value = 1} : i32
  %99 = add %47, %98 : i32
  %100 = constant {value = 2} : i32
  %101 = div %99, %100 : i32
  %102 = constant {value = 0} : i32
  %103 = add %101, %102 : i32
  %104 = constant {value = 1} : i32
  %105 = and %103, %104 : i32
  mbarrier_wait %28, %97, %105
  %106 = constant {value = 1} : i32
  %107 = constant {value = 1} : i32
  %108 = add %47, %107 : i32
  %109 = constant {value = 2} : i32
  %110 = div %108, %109 : i32
  %111 = constant {value = 1} : i32
  %112 = add %110, %111 : i32
  %113 = constant {value = 1} : i32
  %114 = and %112, %113 : i32
  mbarrier_wait %27, %106, %114
  %115 = constant {value = 1} : i32
  %116 = constant {value = 0} : i32
  %117 = add %47, %116 : i32
  %118 = constant {value = 2} : i32
  %119 = div %117, %118 : i32
  %120 = constant {value = 0} : i32
  %121 = add %119, %120 : i32
  %122 = constant {value = 1} : i32
  %123 = and %121, %122 : i32
  mbarrier_wait %28, %115, %123
  barrier
  mbarrier_inval %27
  mbarrier_inval %28
  barrier
  %124 = splat %c : ptr<f32>[64,64]#L9
  %125 = addptr %124, %17 : ptr<f32>[64,64]#L9
  store %125, %45
  return
}
)";
  std::unique_ptr<ir::Function> f = ir::parseFunction(text);
  SeededRandom rng;
  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t T = 5, R = T * 64 - 20;
  auto rounded = [&](size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = double(float(Eigen::bfloat16{float(u(rng))}));
    return v;
  };
  auto a = rounded(64 * 64), b = rounded(size_t(T * 64 * 64));
  Bytes c(64 * 64 * 4, 0xff);
  BothRuns runs = runBoth(*f, {bf16Buffer(a), bf16Buffer(b), c, T, R}, {1, 1, 1});
  ASSERT_EQ(runs.code.tensorMaps.size(), 1u);
  EXPECT_EQ(runs.code.tensorMaps[0].str(), "bf16 base %1 dims [%4, 64] strides [64] box [64, 64] swizzle 128");
  EXPECT_NE(runs.code.ptx.find("cp.async.bulk.tensor.2d"), std::string::npos);
  Eigen::Map<const RowMajor> A(a.data(), 64, 64);
  RowMajor C = RowMajor::Zero(64, 64);
  for (int64_t t = 0; t < T; ++t) {
    RowMajor Bt = Eigen::Map<const RowMajor>(b.data() + t * 64 * 64, 64, 64);
    for (int64_t r = 0; r < 64; ++r)
      if (64 * t + r >= R) Bt.row(r).setZero();
    C += A * Bt;
  }
  std::vector<float> got(64 * 64), interpreted(64 * 64);
  std::memcpy(got.data(), runs.gpu[2].data(), got.size() * 4);
  std::memcpy(interpreted.data(), runs.interpreter[2].data(), interpreted.size() * 4);
  EXPECT_LT(relativeError(got, std::vector<double>(C.data(), C.data() + 64 * 64)), 1e-5);
  EXPECT_LT(relativeError(interpreted, std::vector<double>(C.data(), C.data() + 64 * 64)), 1e-5);
}

}  // namespace
}  // namespace flextile::testing
