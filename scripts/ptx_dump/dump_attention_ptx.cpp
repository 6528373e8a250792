// Dumps the PTX of every registered attention variant's forward (two grid sizes: the larger takes the
// big-grid default), backward and decode kernels at D = 64 and 128, bf16 with GQA, default configs,
// for each target named on the command line, into OUT/<target>/ (the config on the first line of
// each file; a plan that fails leaves its message in a .err file). Run by scripts/ptx_dump/dump.sh,
// which builds it against a checkout's libflextile.
//
//   dump_attention_ptx OUT sm_80 sm_90a ...
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"
#include "codegen/Compiler.h"
#include "dsl/Kernel.h"
#include "examples/kernels.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
namespace fs = std::filesystem;

namespace {

void put(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }

// Spelled out rather than Target::fromName, so that the same file builds against older checkouts.
std::optional<codegen::Target> parseTarget(const std::string& s) {
  if (s == "sm_80") return codegen::Target{80, false};
  if (s == "sm_86") return codegen::Target{86, false};
  if (s == "sm_89") return codegen::Target{89, false};
  if (s == "sm_90") return codegen::Target{90, false};
  if (s == "sm_90a") return codegen::Target{90, true};
  return std::nullopt;
}

Tensor host(DType dt, std::vector<int64_t> shape) { return Tensor::empty(dt, std::move(shape), MemorySpace::Host); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: dump_attention_ptx OUT TARGET... (sm_80, sm_86, sm_89, sm_90, sm_90a)\n");
    return 2;
  }
  const fs::path out = argv[1];
  for (int a = 2; a < argc; ++a) {
    const std::optional<codegen::Target> target = parseTarget(argv[a]);
    if (!target) {
      std::fprintf(stderr, "dump_attention_ptx: unknown target '%s'\n", argv[a]);
      return 2;
    }
    const fs::path dir = out / argv[a];
    fs::create_directories(dir);
    int kernels = 0, failures = 0;
    auto attempt = [&](const std::string& tag, const auto& dump) {
      try {
        dump();
      } catch (const std::exception& e) {
        put(dir / (tag + ".err"), e.what());
        ++failures;
      }
    };
    for (const Variant& var : variants())
      for (int64_t D : {64, 128})
        for (bool big : {false, true}) {
          const int64_t B = big ? 4 : 1, Hq = big ? 32 : 4, Hkv = big ? 8 : 2, L = big ? 1024 : 1000;
          const std::string tag = var.name + "_D" + std::to_string(D) + (big ? "_big" : "");
          VariantInstance inst = var.make({B, Hq, L, L, MemorySpace::Host, BlockSizes{}, 7});
          attempt(tag + "_fwd", [&] {
            Tensor q = host(DType::BF16, {B, Hq, L, D}), kv = host(DType::BF16, {B, Hkv, L, D});
            const FlexAttentionPlan p = plan_flex_attention(q, kv, kv, inst.score, inst.mask, {}, true, *target);
            put(dir / (tag + "_fwd.ptx"), p.config.describe() + "\n" + p.compiled->ptx);
            ++kernels;
          });
          if (big) continue;
          attempt(tag + "_bwd", [&] {
            Tensor q = host(DType::BF16, {B, Hq, L, D}), lse = host(DType::F32, {B, Hq, L});
            const FlexAttentionBackwardPlan p =
                plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, {}, *target);
            for (size_t i = 0; i < p.compiled.size(); ++i, ++kernels)
              put(dir / (tag + "_bwd" + std::to_string(i) + ".ptx"), p.config.describe() + "\n" + p.compiled[i]->ptx);
          });
          attempt(tag + "_dec", [&] {
            const int64_t S = 4097;
            VariantInstance di = var.make({B, Hq, S, S, MemorySpace::Host, BlockSizes{}, 7});
            Tensor q = host(DType::BF16, {B, Hq, 1, D}), kv = host(DType::BF16, {B, Hkv, S, D});
            FlexAttentionOptions o{.kernel = AttentionTemplate::Decode};
            if (di.mask) o.query_offset = S - 1;
            const FlexDecodePlan p = plan_flex_decode(q, kv, kv, di.score, di.mask, o, *target);
            for (size_t i = 0; i < p.compiled.size(); ++i, ++kernels)
              put(dir / (tag + "_dec" + std::to_string(i) + ".ptx"), p.config.describe() + "\n" + p.compiled[i]->ptx);
          });
        }
    // The GEMM example (bf16; mma.sync, and wgmma where BLOCK_N gives every warp 16 rows).
    for (auto [bm, bn, bk, warps, stages] : std::vector<std::array<int, 5>>{
             {128, 128, 32, 8, 3}, {128, 16, 32, 8, 3}, {128, 128, 64, 8, 2}, {64, 128, 16, 4, 4}}) {
      const std::string tag = "gemm_" + std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) + "_w" +
                              std::to_string(warps) + "_s" + std::to_string(stages);
      attempt(tag, [&] {
        dsl::Kernel mm = examples::matmul<dsl::bf16>();
        auto f = mm.trace({.constants = {bm, bn, bk}, .num_warps = warps, .num_stages = stages});
        f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16, 16, 16};
        put(dir / (tag + ".ptx"), codegen::compile(*f, codegen::CompileOptions{*target, false}).ptx);
        ++kernels;
      });
    }
    std::printf("%s: %d kernels, %d failed plans\n", argv[a], kernels, failures);
  }
  return 0;
}
