// Compile time of one flex_attention kernel, no GPU needed: the time of
// plan_flex_attention(compile) for a yardstick variant (B=2, H=16, N=8192,
// D=128, bf16, sm_90a, the default config unless --config), which traces the
// template with the mods, runs the IR passes, LLVM O3 and the NVPTX backend —
// or, when the on-disk compile cache holds the kernel, traces, hashes and reads
// the entry. Then the same call again in this process (the in-memory layer).
// Prints one JSON line. bench/compile_time.sh runs it in fresh processes over
// an empty and then a warm cache folder (FLEXTILE_CACHE_DIR) and tabulates.
//
//   flextile_compile_bench VARIANT [--config BM,BN,W,S]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"

using namespace flextile;
using namespace flextile::attention;

int main(int argc, char** argv) try {
  if (argc < 2) {
    std::fprintf(stderr, "usage: flextile_compile_bench VARIANT [--config BM,BN,W,S]\n");
    return 2;
  }
  const std::string name = argv[1];
  FlexAttentionOptions options;
  if (argc == 4 && std::string(argv[2]) == "--config") {
    std::vector<int64_t> c;
    std::stringstream ss(argv[3]);
    for (std::string x; std::getline(ss, x, ',');) c.push_back(std::stoll(x));
    if (c.size() != 4) throw Error("--config needs BM,BN,W,S");
    options.config = FlexAttentionConfig{c[0], c[1], int(c[2]), int(c[3])};
  } else if (argc != 2) {
    throw Error("unexpected arguments (usage: flextile_compile_bench VARIANT [--config BM,BN,W,S])");
  }
  const int64_t B = 2, H = 16, N = 8192, D = 128;
  const VariantInstance v = variant(name).make({B, H, N, N, dsl::MemorySpace::Host, {128, 128}, 1});
  // Compiling reads shapes, strides and alignment only: views over one small block.
  alignas(1024) static std::byte block[1024];
  const dsl::Tensor q = dsl::Tensor::hostView(block, dsl::DType::BF16, {B, H, N, D});
  using Clock = std::chrono::steady_clock;
  auto plan = [&] {
    const auto t0 = Clock::now();
    const FlexAttentionPlan p = plan_flex_attention(q, q, q, v.score, v.mask, options, true, codegen::Target::sm90a());
    return std::pair{std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), p.compiled->fromCache};
  };
  const auto [firstMs, fromDisk] = plan();
  const auto [againMs, unused] = plan();
  (void)unused;
  std::printf("{\"variant\": \"%s\", \"first_ms\": %.3f, \"from_disk_cache\": %s, \"again_in_process_ms\": %.3f}\n",
              name.c_str(), firstMs, fromDisk ? "true" : "false", againMs);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_compile_bench: %s\n", e.what());
  return 1;
}
