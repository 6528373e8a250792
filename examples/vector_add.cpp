// out = x + y over n floats, BLOCK elements per program, with a mask for the
// tail; on the GPU when present, else through the IR interpreter.
//
//   vector_add [n]     (default 1000003)
#include "examples/common.h"
#include "examples/kernels.h"

using namespace flextile;
using namespace flextile::examples;

int main(int argc, char** argv) try {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000003;
  if (n < 1) {
    std::fprintf(stderr, "vector_add: n must be positive, got %d\n", n);
    return 2;
  }
  constexpr int kBlock = 1024;
  LaunchOptions launch{{cdiv(n, kBlock), 1, 1}, {kBlock}, 4};
  std::mt19937 rng(std::random_device{}());
  auto x = randomVector<float>(size_t(n), rng), y = randomVector<float>(size_t(n), rng);
  std::vector<float> out(size_t(n), NAN);

  Kernel add = vectorAdd();
  std::string why;
  if (gpuAvailable(&why)) {
    auto dx = toDevice(x), dy = toDevice(y), dout = toDevice(out);
    add.run(launch, dx, dy, dout, n);
    runtime::synchronize();
    fromDevice(dout, out);
    std::printf("ran on the GPU (%s)\n", runtime::Device::current().name().c_str());
  } else {
    std::printf("no GPU (%s): running the IR interpreter\n", why.c_str());
    add.interpret(launch, x, y, out, n);
  }
  std::vector<double> ref(static_cast<size_t>(n));
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = double(x[i]) + double(y[i]);
  double err = relativeError(out, ref);
  std::printf("vector_add n=%d: relative error %.2e (%s)\n", n, err, err < 1e-6 ? "ok" : "FAILED");
  return err < 1e-6 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "vector_add: %s\n", e.what());
  return 1;
}
