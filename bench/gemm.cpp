// bf16 GEMM on tensor cores: the examples::matmul kernel (mma.sync, operands
// staged through swizzled shared memory and ldmatrix; no cp.async pipelining
// yet) for C[M, N] f32 = A[M, K] @ B[K, N], row-major, over a few tile
// configurations per shape. Each config is checked against float64 on
// sampled elements before any time counts; times are CUDA-event medians.
// Prints a table and one JSON line per shape (best config), like
// bench/softmax.cpp; bench/torch_gemm.py times torch.matmul on the same shapes.
//
//   flextile_gemm_bench [MxNxK ...]     (default 8192x8192x8192 16384x128x128)
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "examples/common.h"
#include "examples/kernels.h"
#include "runtime/Device.h"
#include "runtime/Event.h"

using namespace flextile;
using namespace flextile::examples;

namespace {

struct Config {
  int BM, BN, BK, warps;
};

struct Result {
  int M, N, K;
  Config config;
  double ms, tflops, error;
};

// Largest norm-relative error over sampled elements (a whole row's worth of
// products each), against float64.
double sampledError(const std::vector<Eigen::bfloat16>& a, const std::vector<Eigen::bfloat16>& b,
                    const std::vector<float>& c, int M, int N, int K, std::mt19937& rng, int samples = 256) {
  std::uniform_int_distribution<int> pm(0, M - 1), pn(0, N - 1);
  double num = 0, den = 0;
  for (int s = 0; s < samples; ++s) {
    int i = s == 0 ? M - 1 : pm(rng), j = s == 0 ? N - 1 : pn(rng);
    double ref = 0;
    for (int k = 0; k < K; ++k) ref += double(float(a[size_t(i) * K + k])) * double(float(b[size_t(k) * N + j]));
    double out = c[size_t(i) * N + j];
    if (!std::isfinite(out)) return INFINITY;
    num += (out - ref) * (out - ref);
    den += ref * ref;
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::array<int, 3>> shapes;
  for (int i = 1; i < argc; ++i) {
    int m = 0, n = 0, k = 0;
    if (std::sscanf(argv[i], "%dx%dx%d", &m, &n, &k) != 3 || m < 1 || n < 1 || k < 1) {
      std::fprintf(stderr, "flextile_gemm_bench: bad shape '%s' (want MxNxK)\n", argv[i]);
      return 2;
    }
    shapes.push_back({m, n, k});
  }
  if (shapes.empty()) shapes = {{8192, 8192, 8192}, {16384, 128, 128}};
  std::string why;
  if (!gpuAvailable(&why)) {
    std::fprintf(stderr, "flextile_gemm_bench: needs a GPU (%s)\n", why.c_str());
    return 2;
  }
  std::printf("device: %s\n", runtime::Device::current().name().c_str());
  Kernel mm = matmul<bf16>();
  std::mt19937 rng(std::random_device{}());
  std::vector<Result> best;
  for (auto [M, N, K] : shapes) {
    auto a = randomVector<Eigen::bfloat16>(size_t(M) * K, rng), b = randomVector<Eigen::bfloat16>(size_t(K) * N, rng);
    std::vector<float> c(size_t(M) * N);
    auto da = toDevice(a), db = toDevice(b), dc = toDevice(c);
    std::vector<Config> configs = {{128, 128, 32, 4}, {128, 128, 32, 8}, {128, 256, 32, 8}, {128, 128, 64, 8},
                                   {64, 128, 32, 4},  {128, 64, 32, 4},  {64, 64, 64, 4}};
    Result top{M, N, K, {}, INFINITY, 0, 0};
    for (const Config& cf : configs) {
      if (cf.BN > 2 * N || cf.BK > 2 * K) continue;
      LaunchOptions launch{{cdiv(M, cf.BM), cdiv(N, cf.BN), 1}, {cf.BM, cf.BN, cf.BK}, cf.warps};
      const auto& code = mm.compile(launch, {da, db, dc, M, N, K});
      dc.fillBytes(0xFF);  // NaN poison
      mm.run(launch, da, db, dc, M, N, K);
      runtime::synchronize();
      fromDevice(dc, c);
      double err = sampledError(a, b, c, M, N, K, rng);
      char what[96];
      std::snprintf(what, sizeof what, "%5d x %5d x %5d  BM %3d BN %3d BK %3d warps %d", M, N, K, cf.BM, cf.BN, cf.BK,
                    cf.warps);
      if (!(err < 1e-4)) {
        std::printf("%s: WRONG (relative error %.2e): not timed\n", what, err);
        continue;
      }
      auto samples = runtime::timeKernel([&] { mm.run(launch, da, db, dc, M, N, K); }, 3, M * N * double(K) > 1e11 ? 10 : 50);
      double ms = runtime::median(samples);
      double tflops = 2.0 * M * N * double(K) / ms / 1e9;
      std::printf("%s: %9.4f ms %7.1f TFLOP/s (error %.1e, smem %d B)\n", what, ms, tflops, err, code.sharedBytes);
      if (ms < top.ms) top = {M, N, K, cf, ms, tflops, err};
    }
    best.push_back(top);
  }
  std::printf("\n%-20s %-28s %10s %10s\n", "shape", "config", "ms", "TFLOP/s");
  for (const auto& r : best) {
    std::printf("%5dx%5dx%-8d BM=%-3d BN=%-3d BK=%-3d warps=%d %10.4f %10.1f\n", r.M, r.N, r.K, r.config.BM,
                r.config.BN, r.config.BK, r.config.warps, r.ms, r.tflops);
    std::printf("{\"name\": \"flextile.gemm\", \"M\": %d, \"N\": %d, \"K\": %d, \"ms\": %.6f, \"tflops\": %.2f, "
                "\"config\": \"BM=%d BN=%d BK=%d num_warps=%d\"}\n",
                r.M, r.N, r.K, r.ms, r.tflops, r.config.BM, r.config.BN, r.config.BK, r.config.warps);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_gemm_bench: %s\n", e.what());
  return 1;
}
