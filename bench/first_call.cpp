// The first flex_attention call of a fresh process, on the GPU: wall time from nothing compiled or
// loaded in this process to its result on the host (trace, compile or compile-cache hit, module
// load — the driver's JIT of the PTX or a kept cubin — launch, wait), then a second call for
// comparison. Which cache state the process starts from is the caller's: bench/first_call.sh runs
// it three times in fresh processes (cold cache, warm cache without driver cubins, warm cubin).
//
//   flextile_first_call_bench LABEL [B,H,L,D]      # default 1,16,4096,128 bf16, causal
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "BenchUtil.h"
#include "codegen/CompileCache.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
double msSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

int main(int argc, char** argv) {
  const std::string label = argc > 1 ? argv[1] : "first_call";
  int64_t B = 1, H = 16, L = 4096, D = 128;
  if (argc > 2) {
    const std::vector<std::string> dims = bench::split(argv[2]);
    if (dims.size() != 4) {
      std::fprintf(stderr, "usage: %s LABEL [B,H,L,D]\n", argv[0]);
      return 2;
    }
    B = std::stoll(dims[0]), H = std::stoll(dims[1]), L = std::stoll(dims[2]), D = std::stoll(dims[3]);
  }
  std::string whyNot;
  if (!dsl::deviceAvailable(&whyNot)) {
    std::printf("%s: skipped: %s\n", label.c_str(), whyNot.c_str());
    return 0;
  }
  try {
    runtime::Device& device = runtime::Device::current();
    std::mt19937_64 rng(1);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<float> host(size_t(B * H * L * D));
    for (float& x : host) x = dist(rng);
    Tensor q = Tensor::fromHost(host, DType::BF16, {B, H, L, D}, MemorySpace::Device);
    Tensor k = Tensor::fromHost(host, DType::BF16, {B, H, L, D}, MemorySpace::Device);
    Tensor v = Tensor::fromHost(host, DType::BF16, {B, H, L, D}, MemorySpace::Device);
    Tensor out = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Device);
    BlockMask mask = causalBlockMask(1, 1, L, L, {128, 128}, MemorySpace::Device);
    runtime::synchronize();

    const auto first = std::chrono::steady_clock::now();
    flex_attention_into(q, k, v, noop_score(), mask, out, nullptr);
    runtime::synchronize();
    const double firstMs = msSince(first);
    const auto second = std::chrono::steady_clock::now();
    flex_attention_into(q, k, v, noop_score(), mask, out, nullptr);
    runtime::synchronize();
    const double secondMs = msSince(second);
    const auto stats = codegen::CompileCache::global().stats();
    std::printf("%-22s first call %9.2f ms   second call %7.3f ms   (compile cache: %zu hits, %zu misses; "
                "B=%lld H=%lld L=%lld D=%lld bf16 causal; %s)\n",
                label.c_str(), firstMs, secondMs, stats.hits, stats.misses, (long long)B, (long long)H, (long long)L,
                (long long)D, device.codeIdentity().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", label.c_str(), e.what());
    return 1;
  }
  return 0;
}
