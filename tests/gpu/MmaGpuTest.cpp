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

}  // namespace
}  // namespace flextile::testing
