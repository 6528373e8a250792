// Fused row softmax: y = softmax(x) along each row of a [rows, cols] matrix,
// in one kernel (max, exp2, sum, divide), checked against a float64 reference.
// Runs on the GPU when one is present, otherwise through the IR interpreter.
//
//   row_softmax [rows] [cols]     (default 1000 x 1000; bf16 in, bf16 out)
#include "examples/common.h"
#include "examples/kernels.h"

using namespace flextile;
using namespace flextile::examples;

int main(int argc, char** argv) try {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int cols = argc > 2 ? std::atoi(argv[2]) : 1000;
  if (rows < 1 || cols < 1 || cols > 16384) {
    std::fprintf(stderr, "row_softmax: need 1 <= rows and 1 <= cols <= 16384, got %d x %d\n", rows, cols);
    return 2;
  }
  using T = bf16;
  using H = host_t<T>;
  int block = 1;
  while (block < cols) block *= 2;
  const int rowsPerProgram = block >= 1024 ? 1 : 1024 / block;
  const int warps = block >= 4096 ? 8 : 4;
  LaunchOptions launch{{cdiv(rows, rowsPerProgram), 1, 1}, {rowsPerProgram, block}, warps};

  std::mt19937 rng(std::random_device{}());
  auto x = randomVector<H>(size_t(rows) * cols, rng, -4, 4);
  std::vector<H> y(x.size(), H(NAN));  // poisoned: every element must be written

  Kernel softmax = rowSoftmax<T>();
  std::string why;
  auto t0 = std::chrono::steady_clock::now();
  if (gpuAvailable(&why)) {
    auto dx = toDevice(x), dy = toDevice(y);
    softmax.run(launch, dx, dy, rows, cols);
    runtime::synchronize();
    fromDevice(dy, y);
    std::printf("ran on the GPU (%s)\n", runtime::Device::current().name().c_str());
  } else {
    std::printf("no GPU (%s): running the IR interpreter\n", why.c_str());
    // Without a GPU the compiler still runs: show what would be launched.
    const auto& code = softmax.compile(launch, {KernelArg(x), KernelArg(y), rows, cols}, codegen::Target::sm90a());
    std::printf("compiled for %s in %.1f ms: %zu bytes of PTX, %d warps, %d bytes of shared memory\n",
                code.target.smName().c_str(), code.compileMs, code.ptx.size(), code.numWarps, code.sharedBytes);
    softmax.interpret(launch, x, y, rows, cols);
  }
  const double seconds = secondsSince(t0);

  const std::vector<double> refv = softmaxReference(x, rows, cols);  // float64, from the same bf16 inputs
  bool nonFinite = false;
  double err = relativeError(y, refv, &nonFinite);
  std::printf("row_softmax %d x %d bf16: relative error %.2e (%s), %.3f s including compilation\n", rows, cols, err,
              err < 1e-2 && !nonFinite ? "ok" : "FAILED", seconds);
  return err < 1e-2 && !nonFinite ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "row_softmax: %s\n", e.what());
  return 1;
}
