// The backward's kernels compile for sm_90a and sm_80 and assemble with ptxas without spills,
// at the configs the defaults and the bench use; their products run on tensor cores.
#include <gtest/gtest.h>

#include <regex>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"
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

FlexAttentionBackwardPlan planFor(codegen::Target target, const std::optional<FlexAttentionBackwardConfig>& config,
                                  const std::string& variantName, int64_t D = 128, DType dt = DType::BF16) {
  const int64_t B = 1, H = 2, L = 1024;
  Tensor q = Tensor::empty(dt, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantInstance inst = variant(variantName).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  return plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, {.config = config}, target);
}

}  // namespace

TEST(FlexAttentionBackwardCodegen, EveryVariantAssemblesWithoutSpills) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found";
  for (const Variant& var : variants())
    for (auto target : {codegen::Target::sm90a(), codegen::Target::sm80()}) {
      SCOPED_TRACE(var.name + " " + target.smName());
      // The default config (what the call picks with no config given).
      FlexAttentionBackwardPlan plan = planFor(target, std::nullopt, var.name);
      SCOPED_TRACE(plan.config.describe());
      ASSERT_GE(plan.compiled.size(), 3u);
      for (size_t i = 0; i < plan.compiled.size(); ++i) {
        codegen::PtxasReport r = codegen::runPtxas(plan.compiled[i]->ptx, target);
        // A score_mod's live values may spill a few words on sm_90a at the measured-best default
        // (soft-cap: 40 bytes, faster on the H200 than the narrower tile that does not spill).
        const bool scoreMod = var.name == "alibi" || var.name == "softcap";
        EXPECT_LE(r.spillStoreBytes, scoreMod && target.capability == 90 ? 64 : 0) << plan.kernelNames[i] << ": " << r.log;
      }
      // dkdv: four products per step (K·Qᵀ, Pᵀ·dO, V·dOᵀ, dSᵀ·Q); dq: three (Q·Kᵀ, dO·Vᵀ, dS·K).
      const std::string& dkdv = plan.compiled[1]->ptx;
      const std::string& dq = plan.compiled[2]->ptx;
      const std::string mma = target.capability == 90 ? "wgmma\\.mma_async|mma\\.sync" : "mma\\.sync";
      EXPECT_GT(count(dkdv, mma), 0) << plan.kernelNames[1];
      EXPECT_GT(count(dq, mma), 0) << plan.kernelNames[2];
    }
}
