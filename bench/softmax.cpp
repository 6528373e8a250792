// Row softmax bandwidth: the fused examples::rowSoftmax kernel on large bf16
// matrices, a small sweep of (rows per program, warps) per shape, checked
// against a float64 reference on sampled rows before any time counts.
// Prints a table and one JSON line per shape (for bench/compare_softmax.py).
//
//   flextile_softmax_bench [ROWSxCOLS ...]     (default 32768x4096 16384x1000 4096x16384)
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

struct Result {
  int rows, cols, rowsPerProgram, warps;
  double ms, gbps, error;
};

// Largest relative error over `samples` random rows, against float64.
double sampledError(const std::vector<Eigen::bfloat16>& x, const std::vector<Eigen::bfloat16>& y, int rows, int cols,
                    std::mt19937& rng, int samples = 48) {
  std::uniform_int_distribution<int> pick(0, rows - 1);
  double worst = 0;
  for (int s = 0; s < samples; ++s) {
    int r = s == 0 ? rows - 1 : pick(rng);
    const size_t base = size_t(r) * cols;
    double m = -INFINITY, sum = 0;
    for (int c = 0; c < cols; ++c) m = std::max(m, double(float(x[base + c])));
    for (int c = 0; c < cols; ++c) sum += std::exp(double(float(x[base + c])) - m);
    double num = 0, den = 0;
    for (int c = 0; c < cols; ++c) {
      double ref = std::exp(double(float(x[base + c])) - m) / sum, out = double(float(y[base + c]));
      if (!std::isfinite(out)) return INFINITY;
      num += (out - ref) * (out - ref);
      den += ref * ref;
    }
    worst = std::max(worst, std::sqrt(num / den));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::pair<int, int>> shapes;
  for (int i = 1; i < argc; ++i) {
    int r = 0, c = 0;
    if (std::sscanf(argv[i], "%dx%d", &r, &c) != 2 || r < 1 || c < 1 || c > 16384) {
      std::fprintf(stderr, "flextile_softmax_bench: bad shape '%s' (want ROWSxCOLS, COLS <= 16384)\n", argv[i]);
      return 2;
    }
    shapes.emplace_back(r, c);
  }
  if (shapes.empty()) shapes = {{32768, 4096}, {16384, 1000}, {4096, 16384}};
  std::string why;
  if (!gpuAvailable(&why)) {
    std::fprintf(stderr, "flextile_softmax_bench: needs a GPU (%s)\n", why.c_str());
    return 2;
  }
  auto& dev = runtime::Device::current();
  std::printf("device: %s\n", dev.name().c_str());
  Kernel softmax = rowSoftmax<bf16>();
  std::mt19937 rng(std::random_device{}());
  std::vector<Result> best;
  for (auto [rows, cols] : shapes) {
    int block = 1;
    while (block < cols) block *= 2;
    const size_t n = size_t(rows) * cols;
    // Three input sets, rotated, so that L2 (60 MB) never holds the next input.
    std::vector<std::vector<Eigen::bfloat16>> hx;
    std::vector<runtime::DeviceBuffer> dx;
    for (int s = 0; s < 3; ++s) {
      hx.push_back(randomVector<Eigen::bfloat16>(n, rng, -8, 8));
      dx.push_back(toDevice(hx.back()));
    }
    runtime::DeviceBuffer dy(n * sizeof(Eigen::bfloat16));
    std::vector<Eigen::bfloat16> hy(n);
    Result top{rows, cols, 0, 0, INFINITY, 0, 0};
    for (int warps : {4, 8, 16}) {
      for (int rpp = 1; rpp * block <= 16384 && rpp <= 64; rpp *= 2) {
        if (rpp * block < 32 * warps) continue;  // fewer elements than threads
        LaunchOptions launch{{cdiv(rows, rpp), 1, 1}, {rpp, block}, warps};
        dy.fillBytes(0xFF);  // NaN poison
        softmax.run(launch, dx[0], dy, rows, cols);
        runtime::synchronize();
        dy.copyToHost(hy.data(), n * sizeof(Eigen::bfloat16));
        double err = sampledError(hx[0], hy, rows, cols, rng);
        if (!(err < 1e-2)) {
          std::printf("%6d x %-6d rows/program %2d warps %2d: WRONG (relative error %.2e): not timed\n", rows, cols,
                      rpp, warps, err);
          continue;
        }
        int k = 0;
        auto samples = runtime::timeKernel([&] { softmax.run(launch, dx[k++ % 3], dy, rows, cols); }, 5, 40);
        double ms = runtime::median(samples);
        double gbps = 2.0 * n * sizeof(Eigen::bfloat16) / ms / 1e6;
        std::printf("%6d x %-6d rows/program %2d warps %2d: %8.4f ms %7.0f GB/s (error %.1e)\n", rows, cols, rpp,
                    warps, ms, gbps, err);
        if (ms < top.ms) top = {rows, cols, rpp, warps, ms, gbps, err};
      }
    }
    best.push_back(top);
  }
  std::printf("\n%-14s %-18s %10s %10s\n", "shape", "config", "ms", "GB/s");
  for (const auto& r : best) {
    std::printf("%6dx%-7d rows=%-3d warps=%-3d %10.4f %10.0f\n", r.rows, r.cols, r.rowsPerProgram, r.warps, r.ms,
                r.gbps);
    std::printf("{\"name\": \"flextile.row_softmax\", \"rows\": %d, \"cols\": %d, \"ms\": %.6f, \"gbps\": %.1f, "
                "\"config\": \"rows_per_program=%d num_warps=%d\"}\n",
                r.rows, r.cols, r.ms, r.gbps, r.rowsPerProgram, r.warps);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_softmax_bench: %s\n", e.what());
  return 1;
}
