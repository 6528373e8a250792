// c = a @ b in bf16 with f32 accumulation, tiled BM x BN with a run-time loop
// over K; checked against a float64 Eigen product. On the GPU when present,
// else through the IR interpreter.
//
//   matmul [M] [N] [K]     (default 127 x 129 x 200)
#include "examples/common.h"
#include "examples/kernels.h"

using namespace flextile;
using namespace flextile::examples;

int main(int argc, char** argv) try {
  const int M = argc > 1 ? std::atoi(argv[1]) : 127;
  const int N = argc > 2 ? std::atoi(argv[2]) : 129;
  const int K = argc > 3 ? std::atoi(argv[3]) : 200;
  if (M < 1 || N < 1 || K < 1) {
    std::fprintf(stderr, "matmul: sizes must be positive, got %d x %d x %d\n", M, N, K);
    return 2;
  }
  using T = bf16;
  using H = host_t<T>;
  constexpr int BM = 64, BN = 64, BK = 32;
  LaunchOptions launch{{cdiv(M, BM), cdiv(N, BN), 1}, {BM, BN, BK}, 4};
  std::mt19937 rng(std::random_device{}());
  auto a = randomVector<H>(size_t(M) * K, rng), b = randomVector<H>(size_t(K) * N, rng);
  std::vector<float> c(size_t(M) * N, NAN);

  Kernel mm = matmul<T>();
  std::string why;
  if (gpuAvailable(&why)) {
    auto da = toDevice(a), db = toDevice(b), dc = toDevice(c);
    mm.run(launch, da, db, dc, M, N, K);
    runtime::synchronize();
    fromDevice(dc, c);
    std::printf("ran on the GPU (%s)\n", runtime::Device::current().name().c_str());
  } else {
    std::printf("no GPU (%s): running the IR interpreter\n", why.c_str());
    mm.interpret(launch, a, b, c, M, N, K);
  }
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  RowMajor A(M, K), B(K, N);
  for (int i = 0; i < M * K; ++i) A.data()[i] = double(float(a[size_t(i)]));
  for (int i = 0; i < K * N; ++i) B.data()[i] = double(float(b[size_t(i)]));
  RowMajor C = A * B;
  std::vector<double> ref(C.data(), C.data() + size_t(M) * N);
  double err = relativeError(c, ref);
  std::printf("matmul %d x %d x %d bf16: relative error %.2e (%s)\n", M, N, K, err, err < 1e-4 ? "ok" : "FAILED");
  return err < 1e-4 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "matmul: %s\n", e.what());
  return 1;
}
