// Runs the decode template on fresh random inputs (outputs poisoned first) against the float64
// reference, for several split counts, and the prefill template on the same queries (a sliced
// mask) against both. Shared by the host tests (interpreter) and the GPU tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "FlexAttentionCheck.h"
#include "attention_templates/Variants.h"

namespace flextile::testing {

// Element-wise |a - b| within twice the reference tolerance: the two templates round differently.
inline bool templatesAgree(const dsl::Tensor& a, const dsl::Tensor& b, dsl::DType dt, const std::string& what) {
  const std::vector<double> x = attention::toDoubles(a), y = attention::toDoubles(b);
  for (size_t i = 0; i < x.size(); ++i)
    if (!(std::abs(x[i] - y[i]) <= 2 * elementTolerance(dt))) {
      ADD_FAILURE() << what << ": decode and prefill differ at element " << i << ": " << x[i] << " vs " << y[i];
      return false;
    }
  return true;
}

struct DecodeCheck {
  std::vector<int64_t> splits = {0, 1, 3};  // decode_config.splits to run (0: the template's choice)
  attention::BlockSizes blocks{32, 32};
  attention::FlexAttentionConfig prefillConfig{32, 16, 4, 2};
  int64_t decodeBlockN = 64;  // narrowed to the mask's KV block by the template
};

// `c.L` queries per head against `c.S` keys for one registered variant. The variant's mask is
// built for c.S + c.L queries (a mask pre-built past the KV length, as a serving loop keeps one)
// and the queries sit at the end of it and in its middle, addressed with query_offset; where they
// fit in one mask row the prefill template runs them on sliceRows and must agree.
inline bool checkDecodeVariant(std::mt19937_64& rng, const attention::Variant& variant, AttentionCase c,
                               dsl::MemorySpace space, const DecodeCheck& how = {}) {
  using namespace attention;
  const int64_t maxQueries = c.S + c.L;
  VariantInputs in{.B = c.B, .H = c.Hq, .L = maxQueries, .S = c.S, .space = space, .blocks = how.blocks, .seed = rng()};
  VariantInstance inst = variant.make(in);
  c.context = variant.name + " " + inst.parameters + " " + c.context;
  SCOPED_TRACE(c.describe());
  dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor out = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {c.B, c.Hq, c.L}, space);
  dsl::Tensor prefillOut = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  const double scale = 1.0 / std::sqrt(double(c.D));

  std::vector<int64_t> positions = {maxQueries - c.L, std::max<int64_t>(0, c.S / 2 - c.L / 2)};
  if (!inst.mask) positions = {0};  // no mask: the queries are [0, L)
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  for (int64_t pos : positions) {
    SCOPED_TRACE("queries at " + std::to_string(pos));
    std::optional<BlockMask> whole;
    if (inst.mask) whole = *inst.mask;
    const ReferenceResult ref = referenceAttention(q, k, v, inst.refScore, inst.refMask, scale, pos);
    for (int64_t splits : how.splits) {
      SCOPED_TRACE("decode splits " + std::to_string(splits));
      FlexAttentionOptions o{.kernel = AttentionTemplate::Decode,
                             .decode_config = FlexDecodeConfig{.block_n = how.decodeBlockN, .splits = splits}};
      if (inst.mask) o.query_offset = pos;
      poison(out);
      poison(lse);
      flex_attention_into(q, k, v, inst.score, whole, out, &lse, o);
      if (!compareWithReference(out, lse, ref, c.D, c.dtype)) return false;
    }
    // The prefill template on the same queries, through a row slice where one row holds them.
    std::optional<BlockMask> slice;
    if (inst.mask) {
      const BlockMask& m = *inst.mask;
      const int64_t row = pos / m.qBlockSize();
      if (pos % m.qBlockSize() + c.L > m.qBlockSize()) continue;
      slice = m.sliceRows(row, 1, pos, c.L);
    }
    FlexAttentionConfig pc = how.prefillConfig;
    poison(prefillOut);
    poison(lse);
    flex_attention_into(q, k, v, inst.score, slice, prefillOut, &lse,
                        {.config = pc, .kernel = AttentionTemplate::Prefill});
    if (!compareWithReference(prefillOut, lse, ref, c.D, c.dtype)) return false;
    if (!templatesAgree(out, prefillOut, c.dtype, c.describe())) return false;
  }
  return true;
}

}  // namespace flextile::testing
