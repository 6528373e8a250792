// The code flex_attention's forward template compiles to, without a GPU: on
// sm_90a both products run on wgmma straight from the pipelined K and V ring
// slots (Q K^T K-major, P V MN-major), on sm_80 on mma.sync; ptxas accepts
// both without spills.
#include <gtest/gtest.h>

#include <regex>

#include "attention_templates/FlexAttention.h"
#include "codegen/Ptxas.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
int count(const std::string& text, const std::string& re) {
  std::regex r(re);
  return int(std::distance(std::sregex_iterator(text.begin(), text.end(), r), std::sregex_iterator()));
}

const codegen::CompiledKernel& compileFor(codegen::Target target, FlexAttentionConfig config, int64_t D = 128) {
  Tensor q = Tensor::empty(DType::BF16, {1, 2, 1024, D}, MemorySpace::Host);
  Tensor k = Tensor::empty(DType::BF16, {1, 2, 1024, D}, MemorySpace::Host);
  static std::optional<BlockMask> mask;
  mask = causalBlockMask(1, 1, 1024, 1024);
  auto plan = plan_flex_attention(q, k, k, noop_score(), mask, {.config = config}, true, target);
  return *plan.compiled;
}
}  // namespace

TEST(FlexAttentionCodegen, HopperRunsBothProductsOnWgmmaFromTheRing) {
  for (FlexAttentionConfig c : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 64, 8, 3}}) {
    SCOPED_TRACE(c.describe());
    const auto& k = compileFor(codegen::Target::sm90a(), c);
    // Two loops (full and partial blocks), each: 8 k-steps of Q K^T (m64n64,
    // K-major) and 4 of P V (m64n128, MN-major).
    EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.bf16\\.bf16[^;]*p, 1, 1, 0;"), 16);
    EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16[^;]*p, 1, 1, 1;"), 8);
    EXPECT_EQ(count(k.ptx, "mma\\.sync"), 0);
    EXPECT_EQ(count(k.ptx, "fence\\.proxy\\.async"), 2);
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
  }
}

TEST(FlexAttentionCodegen, AmpereRunsMmaSync) {
  const auto& k = compileFor(codegen::Target::sm80(), {64, 64, 4, 2});
  EXPECT_EQ(count(k.ptx, "wgmma"), 0);
  EXPECT_GT(count(k.ptx, "mma\\.sync\\.aligned\\.m16n8k16"), 0);
  EXPECT_GT(count(k.ptx, "ldmatrix"), 0);
  if (codegen::findPtxas()) {
    codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm80());
    EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
  }
}
