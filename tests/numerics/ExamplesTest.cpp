// The example kernels as a newcomer writes them (examples/kernels.h), run by
// the IR interpreter against float64 Eigen references at sizes that are not
// multiples of the block, and assembled by ptxas for sm_80 and sm_90a across
// configurations. (The same kernels run on the GPU in tests/gpu.)
#include <gtest/gtest.h>

#include <Eigen/Core>

#include "codegen/Compiler.h"
#include "codegen/Ptxas.h"
#include "examples/common.h"
#include "examples/kernels.h"

namespace flextile::examples {
namespace {

class Seeded : public std::mt19937 {
 public:
  Seeded() : Seeded(std::random_device{}()) {}
  explicit Seeded(uint32_t seed) : std::mt19937(seed), trace_(__FILE__, __LINE__, "seed " + std::to_string(seed)) {}

 private:
  ::testing::ScopedTrace trace_;
};

const int kSizes[] = {1, 3, 127, 129, 1000};

TEST(ExamplesInterpreted, VectorAdd) {
  Seeded rng;
  Kernel add = vectorAdd();
  for (int n : kSizes) {
    auto x = randomVector<float>(size_t(n), rng), y = randomVector<float>(size_t(n), rng);
    std::vector<float> out(size_t(n), NAN);
    add.interpret({{cdiv(n, 128), 1, 1}, {128}, 4}, x, y, out, n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(out[size_t(i)], x[size_t(i)] + y[size_t(i)]) << "n=" << n << " i=" << i;
  }
}

template <class T>
void softmaxCase(int rows, int cols, int rowsPerProgram, std::mt19937& rng) {
  using H = host_t<T>;
  int block = 1;
  while (block < cols) block *= 2;
  auto x = randomVector<H>(size_t(rows) * cols, rng, -5, 5);
  std::vector<H> y(x.size(), H(NAN));
  rowSoftmax<T>().interpret({{cdiv(rows, rowsPerProgram), 1, 1}, {rowsPerProgram, block}, 4}, x, y, rows, cols);
  const std::vector<double> refv = softmaxReference(x, rows, cols);
  bool nonFinite = false;
  double err = relativeError(y, refv, &nonFinite);
  EXPECT_FALSE(nonFinite) << rows << "x" << cols;
  const double tol = std::is_same_v<T, dsl::f32> ? 1e-6 : 1e-2;
  EXPECT_LT(err, tol) << rows << "x" << cols << " rows/program " << rowsPerProgram;
}

TEST(ExamplesInterpreted, RowSoftmax) {
  Seeded rng;
  for (int rows : kSizes)
    for (int cols : kSizes) {
      softmaxCase<dsl::f32>(rows, cols, 2, rng);
      softmaxCase<dsl::bf16>(rows, cols, 1, rng);
    }
  softmaxCase<dsl::f16>(129, 1000, 4, rng);
}

template <class T>
void matmulCase(int M, int N, int K, std::mt19937& rng) {
  using H = host_t<T>;
  auto a = randomVector<H>(size_t(M) * K, rng), b = randomVector<H>(size_t(K) * N, rng);
  std::vector<float> c(size_t(M) * N, NAN);
  constexpr int BM = 32, BN = 32, BK = 16;
  matmul<T>().interpret({{cdiv(M, BM), cdiv(N, BN), 1}, {BM, BN, BK}, 4}, a, b, c, M, N, K);
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor A(M, K), B(K, N);
  for (int i = 0; i < M * K; ++i) A.data()[i] = double(float(a[size_t(i)]));
  for (int i = 0; i < K * N; ++i) B.data()[i] = double(float(b[size_t(i)]));
  RowMajor C = A * B;
  // f32 accumulation of K products: each element within K * 2^-24 of sum |a| |b| (the classic
  // bound), not of |C|, which cancellation can make tiny (a 1x1x129 product failed a 1e-6
  // relative check by chance). A wrong product or a missing k-step is far outside it.
  const RowMajor magnitude = A.cwiseAbs() * B.cwiseAbs();
  int bad = 0;
  for (int i = 0; i < M * N; ++i) {
    const double bound = double(K) * 0x1p-24 * magnitude.data()[i] + 1e-30;
    if (!(std::abs(double(c[size_t(i)]) - C.data()[i]) <= bound) && bad++ < 3)
      ADD_FAILURE() << M << "x" << N << "x" << K << ": c[" << i << "] = " << c[size_t(i)] << ", float64 "
                    << C.data()[i] << ", allowed error " << bound;
  }
  EXPECT_EQ(bad, 0) << M << "x" << N << "x" << K;
}

TEST(ExamplesInterpreted, Matmul) {
  Seeded rng;
  for (int M : {1, 3, 127})
    for (int N : {1, 129})
      for (int K : {1, 3, 129}) {
        matmulCase<dsl::f32>(M, N, K, rng);
        matmulCase<dsl::bf16>(M, N, K, rng);
      }
  matmulCase<dsl::f16>(129, 127, 1000, rng);
}

// ---- ptxas ------------------------------------------------------------------

// Assembles for both targets; `expectNoSpills` where a thread's share of the
// tiles is small enough to live in registers (big tiles on few warps do spill
// on the FMA path, and ptxas's report says so in the test log).
void assemble(Kernel& k, const LaunchOptions& o, const std::string& what, bool expectNoSpills) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found (PATH or /usr/local/cuda/bin): not assembling";
  auto f = k.trace({o.constants, o.num_warps});
  for (const auto& target : {codegen::Target::sm80(), codegen::Target::sm90a()}) {
    codegen::CompiledKernel code;
    ASSERT_NO_THROW(code = codegen::compile(*f, {target, true})) << what << " for " << target.smName();
    const auto report = codegen::parsePtxasLog(code.ptxasInfo);
    if (expectNoSpills)
      EXPECT_EQ(report.spillStoreBytes, 0) << what << " spills on " << target.smName() << "\n" << code.ptxasInfo;
    else if (report.spillStoreBytes > 0)
      std::printf("note: %s on %s spills %d bytes (%d registers)\n", what.c_str(), target.smName().c_str(),
                  report.spillStoreBytes, report.registers);
    EXPECT_GT(report.registers, 0) << code.ptxasInfo;
  }
}

TEST(ExamplesPtxas, EveryExampleAssemblesForSm80AndSm90a) {
  Kernel add = vectorAdd();
  for (int block : {128, 1024, 4096})
    for (int warps : {1, 4, 8})
      assemble(add, {{1, 1, 1}, {block}, warps}, "vector_add " + std::to_string(block), block / (32 * warps) <= 64);
  Kernel sm = rowSoftmax<dsl::bf16>(), sm32 = rowSoftmax<dsl::f32>();
  for (auto [rows, block] : std::vector<std::pair<int, int>>{{1, 1024}, {4, 256}, {1, 4096}, {8, 32}})
    for (int warps : {1, 4, 16}) {
      const bool small = rows * block / (32 * warps) <= 64;
      assemble(sm, {{1, 1, 1}, {rows, block}, warps}, "row_softmax bf16", small);
      assemble(sm32, {{1, 1, 1}, {rows, block}, warps}, "row_softmax f32", small);
    }
  Kernel mm = matmul<dsl::bf16>(), mm32 = matmul<dsl::f32>();
  for (auto [bm, bn, bk] : std::vector<std::array<int, 3>>{{16, 16, 16}, {64, 64, 32}, {32, 128, 16}})
    for (int warps : {2, 4, 8}) {
      const bool small = bm * bn / (32 * warps) <= 32;
      const std::string cfg = " " + std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) + " w" +
                              std::to_string(warps);
      assemble(mm, {{1, 1, 1}, {bm, bn, bk}, warps}, "matmul bf16" + cfg, small);
      assemble(mm32, {{1, 1, 1}, {bm, bn, bk}, warps}, "matmul f32" + cfg, small);
    }
}

}  // namespace
}  // namespace flextile::examples
