// bf16 GEMM throughput: examples::matmul (f32 accumulation) on two shapes — a
// large square product and the skinny shape of an attention block product —
// over a small sweep of tile configurations. Each configuration is checked
// against float64 on sampled outputs before it is timed. Prints a
// table and one JSON line per shape (bench/compare_gemm.py reads them).
//
//   flextile_gemm_bench [MxNxK ...]     (default 8192x8192x8192 16384x128x128)
#include <algorithm>
#include <array>
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

using H = Eigen::bfloat16;

// Largest relative error of `samples` random entries of c = a @ b (float64).
double sampledError(const std::vector<H>& a, const std::vector<H>& b, const std::vector<float>& c, int M, int N, int K,
                    std::mt19937& rng, int samples = 64) {
  std::uniform_int_distribution<int> pm(0, M - 1), pn(0, N - 1);
  double worst = 0;
  for (int s = 0; s < samples; ++s) {
    int i = s == 0 ? M - 1 : pm(rng), j = s == 0 ? N - 1 : pn(rng);
    double ref = 0, mag = 0;
    for (int k = 0; k < K; ++k) {
      double p = double(float(a[size_t(i) * K + k])) * double(float(b[size_t(k) * N + j]));
      ref += p;
      mag += std::abs(p);
    }
    double out = c[size_t(i) * N + j];
    if (!std::isfinite(out)) return INFINITY;
    worst = std::max(worst, std::abs(out - ref) / std::max(mag, 1e-30));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::array<int, 3>> shapes;
  for (int i = 1; i < argc; ++i) {
    std::array<int, 3> s{};
    if (std::sscanf(argv[i], "%dx%dx%d", &s[0], &s[1], &s[2]) != 3 || s[0] < 1 || s[1] < 1 || s[2] < 1) {
      std::fprintf(stderr, "flextile_gemm_bench: bad shape '%s' (want MxNxK)\n", argv[i]);
      return 2;
    }
    shapes.push_back(s);
  }
  if (shapes.empty()) shapes = {{8192, 8192, 8192}, {16384, 128, 128}};
  std::string why;
  if (!gpuAvailable(&why)) {
    std::fprintf(stderr, "flextile_gemm_bench: needs a GPU (%s)\n", why.c_str());
    return 2;
  }
  std::printf("device: %s\n", runtime::Device::current().name().c_str());
  Kernel mm = matmul<dsl::bf16>();
  std::mt19937 rng(std::random_device{}());
  struct Best {
    std::array<int, 3> shape;
    std::string config;
    double ms = INFINITY, tflops = 0;
  };
  std::vector<Best> best;
  // {BM, BN, BK, warps, num_stages, copies}: copies 0 = cp.async, 1 = TMA (LaunchOptions::tma),
  // 2 = TMA issued by a producer warpgroup (warp_specialize). A 128-row tile on 8 warps (and a
  // 64-row one on 4) runs on wgmma, the others on mma.sync.
  const std::array<int, 6> configs[] = {
      {128, 128, 32, 4, 1, 0}, {128, 128, 32, 8, 1, 0}, {128, 128, 32, 4, 2, 0}, {128, 128, 32, 4, 3, 0},
      {128, 128, 32, 8, 3, 0}, {128, 128, 32, 8, 4, 0}, {128, 256, 32, 8, 3, 0}, {256, 128, 32, 8, 3, 0},
      {128, 256, 32, 8, 4, 0}, {128, 128, 64, 8, 3, 0}, {128, 128, 64, 4, 3, 0}, {64, 128, 32, 4, 3, 0},
      {64, 64, 64, 4, 3, 0},   {128, 64, 64, 4, 3, 0},  {256, 128, 64, 8, 3, 0}, {128, 128, 32, 4, 4, 0},
      {128, 128, 64, 4, 4, 0}, {128, 256, 32, 4, 3, 0}, {256, 128, 32, 4, 3, 0}, {128, 128, 64, 8, 4, 1},
      {128, 256, 64, 8, 3, 1}, {128, 128, 64, 8, 3, 2}, {128, 128, 64, 8, 4, 2}, {128, 256, 64, 8, 3, 2},
      {128, 256, 64, 8, 4, 2}};
  for (auto [M, N, K] : shapes) {
    const int sets = size_t(M) * K * 2 < (64u << 20) ? 3 : 1;  // rotate inputs that fit in L2
    std::vector<std::vector<H>> ha, hb;
    std::vector<runtime::DeviceBuffer> da, db;
    for (int s = 0; s < sets; ++s) {
      ha.push_back(randomVector<H>(size_t(M) * K, rng));
      hb.push_back(randomVector<H>(size_t(K) * N, rng));
      da.push_back(toDevice(ha.back()));
      db.push_back(toDevice(hb.back()));
    }
    runtime::DeviceBuffer dc(size_t(M) * N * sizeof(float));
    std::vector<float> hc(size_t(M) * N);
    Best top{{M, N, K}};
    for (auto [bm, bn, bk, warps, stages, copies] : configs) {
      if (bn > 2 * N || bk > 2 * K) continue;
      if (copies > 0 && (K % 8 != 0 || N % 8 != 0)) continue;  // TMA needs rows of 16-byte multiples
      LaunchOptions launch{{cdiv(M, bm), cdiv(N, bn), 1}, {bm, bn, bk}, warps, stages, copies > 0, copies == 2};
      const std::string cfg = std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) + " w" +
                              std::to_string(warps) + " s" + std::to_string(stages) +
                              (copies == 2 ? " ws" : copies == 1 ? " tma" : "");
      try {
        dc.fillBytes(0xFF);
        mm.run(launch, da[0], db[0], dc, M, N, K);
        runtime::synchronize();
      } catch (const std::exception& e) {
        std::printf("%5dx%5dx%5d %-16s refused: %s\n", M, N, K, cfg.c_str(), e.what());
        continue;
      }
      dc.copyToHost(hc.data(), hc.size() * sizeof(float));
      double err = sampledError(ha[0], hb[0], hc, M, N, K, rng);
      if (!(err < 1e-4)) {
        std::printf("%5dx%5dx%5d %-16s WRONG (error %.2e): not timed\n", M, N, K, cfg.c_str(), err);
        continue;
      }
      int k = 0;
      auto samples = runtime::timeKernel([&] { mm.run(launch, da[k % sets], db[k % sets], dc, M, N, K); ++k; }, 3,
                                         M * double(N) * K > 1e11 ? 10 : 40);
      double ms = runtime::median(samples), tflops = 2.0 * M * N * K / ms / 1e9;
      std::printf("%5dx%5dx%5d %-16s %9.3f ms %7.1f TFLOP/s (error %.1e)\n", M, N, K, cfg.c_str(), ms, tflops, err);
      if (ms < top.ms) top = {{M, N, K}, cfg, ms, tflops};
    }
    best.push_back(top);
  }
  std::printf("\n%-18s %-16s %10s %10s\n", "shape", "config", "ms", "TFLOP/s");
  for (const auto& b : best) {
    std::printf("%5dx%5dx%-5d  %-16s %10.3f %10.1f\n", b.shape[0], b.shape[1], b.shape[2], b.config.c_str(), b.ms,
                b.tflops);
    std::printf("{\"name\": \"flextile.matmul\", \"M\": %d, \"N\": %d, \"K\": %d, \"ms\": %.6f, \"tflops\": %.2f, "
                "\"config\": \"%s\"}\n",
                b.shape[0], b.shape[1], b.shape[2], b.ms, b.tflops, b.config.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_gemm_bench: %s\n", e.what());
  return 1;
}
