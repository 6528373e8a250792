// Software-pipelined matmuls (cp.async rings, num_stages 1-4) on the GPU
// against float64 Eigen references: bf16 and f16, M, N, K not multiples of
// the block (masked and zero-filled copies, stages past the end of the loop),
// 4 and 8 warps. Budget (TestBudget.h, docs/testing.md): each shape runs a random quarter of the
// (tile, stages) points, so every point runs each time over the four shapes (all of them for
// every shape with FLEXTILE_GPU_TESTS_FULL=1).
#include <Eigen/Core>
#include <cmath>

#include "GpuTest.h"
#include "IrHarness.h"
#include "examples/common.h"
#include "examples/kernels.h"

namespace flextile::testing {
namespace {

using namespace flextile::examples;
using dsl::cdiv;
using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void checkPipelined(int M, int N, int K, int BM, int BN, int BK, int warps, int stages, std::mt19937& gen,
                    bool tma = false, bool warpSpecialize = false) {
  using H = host_t<T>;
  auto a = randomVector<H>(size_t(M) * K, gen), b = randomVector<H>(size_t(K) * N, gen);
  std::vector<float> c(size_t(M) * N, NAN);
  auto da = toDevice(a), db = toDevice(b), dc = toDevice(c);
  dsl::Kernel mm = examples::matmul<T>();
  dsl::LaunchOptions launch{{cdiv(M, BM), cdiv(N, BN), 1}, {BM, BN, BK}, warps, stages, tma, warpSpecialize};
  const auto& code = mm.compile(launch, {da, db, dc, M, N, K});
  const std::string what = std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) + " tile " +
                           std::to_string(BM) + "x" + std::to_string(BN) + "x" + std::to_string(BK) + " warps " +
                           std::to_string(warps) + " stages " + std::to_string(stages) + (tma ? " tma" : "") +
                           (warpSpecialize ? " warp-specialized" : "");
  if (tma) {
    EXPECT_NE(code.ptx.find("cp.async.bulk.tensor"), std::string::npos) << what;
    EXPECT_EQ(code.producerWarps, warpSpecialize ? 4 : 0) << what;
  } else if (stages > 1 && K % 8 == 0 && N % 8 == 0) {
    // K % 8 != 0 leaves rows unaligned: then no cp.async (narrower than 4 bytes), still correct.
    EXPECT_NE(code.ptx.find("cp.async"), std::string::npos) << what;
  }
  if (stages == 1) {
    EXPECT_EQ(code.ptx.find("cp.async"), std::string::npos) << what;
  }
  mm.run(launch, da, db, dc, M, N, K);
  runtime::synchronize();
  fromDevice(dc, c);
  RowMajor A(M, K), B(K, N);
  for (int i = 0; i < M * K; ++i) A.data()[i] = double(float(a[size_t(i)]));
  for (int i = 0; i < K * N; ++i) B.data()[i] = double(float(b[size_t(i)]));
  RowMajor C = A * B;
  EXPECT_LT(relativeError(c, std::vector<double>(C.data(), C.data() + size_t(M) * N)), 1e-5) << what;
}

template <class T>
void pipelinedGrid() {
  SeededRandom rng;
  std::mt19937 gen{uint32_t(rng())};
  // {M, N, K}: ragged in every dimension; K = 40 has fewer iterations than 4 stages.
  const std::array<int, 3> shapes[] = {{200, 136, 328}, {129, 72, 40}, {64, 64, 1000}, {131, 257, 200}};
  const std::array<int, 4> tiles[] = {{64, 64, 32, 4}, {128, 128, 32, 8}, {128, 64, 64, 4}, {64, 128, 16, 8}};
  std::vector<std::pair<std::array<int, 4>, int>> points;  // (tile, stages)
  for (const auto& tile : tiles)
    for (int stages = 1; stages <= 4; ++stages) points.push_back({tile, stages});
  ConfigSample sample(points, points.size() / std::size(shapes), rng);
  for (auto [M, N, K] : shapes)
    for (const auto& [tile, stages] : sample.next()) {
      const auto [bm, bn, bk, warps] = tile;
      checkPipelined<T>(M, N, K, bm, bn, bk, warps, stages, gen);
    }
}

// The matmul's tiles copied by TMA (LaunchOptions::tma), and by a producer warpgroup
// (warp_specialize), on wgmma with the warps along M: ragged M, N, K whose rows are multiples of
// 16 bytes (TMA's rule), the boxes' last rows and columns zero-filled by TMA. Budget: each shape
// runs a quarter of the (tile, producer) points, all of them over the four shapes.
TEST(PipelineGpu, MatmulBf16ByTmaAndAProducerWarpgroup) {
  FLEXTILE_REQUIRE_GPU();
  if (!currentTarget().has(codegen::Feature::TensorMemoryAccelerator)) GTEST_SKIP() << "TMA needs sm_90a";
  SeededRandom rng;
  std::mt19937 gen{uint32_t(rng())};
  const std::array<int, 3> shapes[] = {{200, 136, 328}, {131, 264, 200}, {1000, 72, 64}, {64, 520, 1000}};
  std::vector<std::pair<std::array<int, 5>, bool>> points;  // (tile, warp-specialized)
  for (const auto& tile : {std::array<int, 5>{128, 128, 64, 8, 3}, std::array<int, 5>{128, 64, 64, 8, 4},
                           std::array<int, 5>{128, 256, 64, 8, 3}, std::array<int, 5>{64, 128, 64, 4, 2}})
    for (bool ws : {false, true}) points.push_back({tile, ws});
  ConfigSample sample(points, points.size() / std::size(shapes), rng);  // every point over the four shapes
  for (auto [M, N, K] : shapes) {
    if (!inScope(int64_t(M) * N * K)) continue;
    for (const auto& [tile, ws] : sample.next()) {
      const auto [bm, bn, bk, warps, stages] = tile;
      checkPipelined<dsl::bf16>(M, N, K, bm, bn, bk, warps, stages, gen, true, ws);
    }
  }
}

TEST(PipelineGpu, MatmulBf16Stages1To4) {
  FLEXTILE_REQUIRE_GPU();
  pipelinedGrid<dsl::bf16>();
}

TEST(PipelineGpu, MatmulF16Stages1To4) {
  FLEXTILE_REQUIRE_GPU();
  pipelinedGrid<dsl::f16>();
}

}  // namespace
}  // namespace flextile::testing
