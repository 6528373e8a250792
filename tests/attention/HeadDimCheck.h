// Forward and backward checks at a (D, DV) pair of head dims, shared by the tests of v's own head
// dim (ValueHeadDimTest.cpp) and of the split head dim (HeadDimSplitTest.cpp): named variants on
// host tensors, and a persistent forward with its last round split.
#pragma once

#include <string>
#include <vector>

#include "FlexAttentionBackwardCheck.h"
#include "FlexAttentionCheck.h"
#include "attention_templates/Variants.h"
#include "gpu/GpuTest.h"

namespace flextile::testing {

struct HeadDims {
  int64_t D, DV;
  std::string describe() const { return "D=" + std::to_string(D) + " DV=" + std::to_string(DV); }
};

// Each named variant (Variants.h) at `dims` on the interpreter: B=2, GQA 2:1, lengths off every
// block (L = 130, S = 259). Returns false after the first reported failure.
inline bool checkVariantsAt(std::mt19937_64& rng, const std::string& label, const std::vector<const char*>& names,
                            HeadDims dims, const attention::FlexAttentionOptions& options) {
  for (const char* name : names) {
    AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 130, .S = 259, .D = dims.D, .dtype = dsl::DType::BF16,
                    .DV = dims.DV};
    c.context = std::string(name) + " " + label;
    attention::VariantInstance inst = attention::variant(name).make(
        {c.B, c.Hq, c.L, c.S, dsl::MemorySpace::Host, attention::BlockSizes{128, 128}, rng()});
    if (!checkFlexAttention(rng, c, dsl::MemorySpace::Host, inst.score, inst.mask, inst.refScore, inst.refMask,
                            options))
      return false;
  }
  return true;
}

// The backward of `full`, `causal` and `softcap` at `dims` on the interpreter: B=1, GQA 2:1, L
// queries and S keys on square mask blocks of `block`, the forward at `forwardConfig`, the backward
// with `options`. Returns false after the first reported failure.
inline bool checkBackwardVariantsAt(std::mt19937_64& rng, const std::string& label, HeadDims dims, int64_t L,
                                    int64_t S, int64_t block, const attention::FlexAttentionConfig& forwardConfig,
                                    const attention::FlexAttentionBackwardOptions& options) {
  for (const char* name : {"full", "causal", "softcap"}) {
    AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = L, .S = S, .D = dims.D, .dtype = dsl::DType::BF16,
                    .context = std::string(name) + " " + label, .DV = dims.DV};
    attention::VariantInstance inst = attention::variant(name).make(
        {c.B, c.Hq, c.L, c.S, dsl::MemorySpace::Host, attention::BlockSizes{block, block}, rng()});
    BackwardCheck how;
    how.refScore = inst.refScore;
    how.refScoreGrad = inst.refScoreGrad;
    how.refMask = inst.refMask;
    how.forwardConfig = forwardConfig;
    how.options = options;
    if (!checkBackward(rng, c, dsl::MemorySpace::Host, inst.score, inst.mask, how)) return false;
  }
  return true;
}

// A persistent forward at 128 x 64 on 8 warps whose last round splits (the plan must say so: a
// no-mask L = S = 1000, GQA 2:1), against float64: the partials and the merge kernel at V's width.
inline bool checkPersistentSplitLastRound(std::mt19937_64& rng, const std::string& label, HeadDims dims) {
  ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
  ScopedSetenv split("FLEXTILE_SPLIT_LAST_ROUND", "1");
  AttentionCase c{.B = 1, .Hq = 4, .Hkv = 2, .L = 1000, .S = 1000, .D = dims.D, .dtype = dsl::DType::BF16,
                  .context = "persistent, split last round, " + label,
                  .DV = dims.DV};
  const attention::FlexAttentionOptions o{.config = attention::FlexAttentionConfig{128, 64, 8, 2}};
  const dsl::MemorySpace host = dsl::MemorySpace::Host;
  dsl::Tensor q = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, host);
  dsl::Tensor k = dsl::Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, host);
  dsl::Tensor v = dsl::Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, dims.DV}, host);
  const bool splits = attention::plan_flex_attention(q, k, v, attention::noop_score(), std::nullopt, o).lastRoundSplit;
  EXPECT_TRUE(splits) << label;
  return splits && checkFlexAttention(rng, c, host, attention::noop_score(), std::nullopt, nullptr, nullptr, o);
}

}  // namespace flextile::testing
