// Runs the decode template on fresh random inputs (outputs poisoned first) against the float64
// reference, for several split counts, and the prefill template on the same queries (a sliced
// mask) against both. Shared by the host tests (interpreter) and the GPU tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
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
  bool maxScores = false;     // ask both templates for the max scores too, and check them
  bool sinks = false;         // random attention sinks (FlexAttentionOptions::sinks), one head's -inf
};


// With `maxScores` (poisoned here), the call's options ask for them; after the call, whether they
// match the reference (a failure reported).
inline void askMaxScores(attention::FlexAttentionOptions& o, std::optional<dsl::Tensor>& maxScores) {
  if (!maxScores) return;
  poison(*maxScores);
  o.max_scores = *maxScores;
}
inline bool maxScoresAgree(const std::optional<dsl::Tensor>& maxScores, const attention::ReferenceResult& ref) {
  if (!maxScores) return true;
  const std::string mismatch = maxScoresMismatch(*maxScores, ref);
  if (!mismatch.empty()) ADD_FAILURE() << mismatch;
  return mismatch.empty();
}

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
  dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.valueDim()}, space);
  dsl::Tensor out = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.valueDim()}, space);
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {c.B, c.Hq, c.L}, space);
  dsl::Tensor prefillOut = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.valueDim()}, space);
  std::optional<dsl::Tensor> maxScores;
  if (how.maxScores) maxScores = dsl::Tensor::empty(dsl::DType::F32, {c.B, c.Hq, c.L}, space);
  const double scale = 1.0 / std::sqrt(double(c.D));
  std::optional<dsl::Tensor> sinks;
  if (how.sinks) sinks = randomSinks(rng, c.Hq, space, c.S);
  const std::vector<double> sinkValues = sinks ? toDoubles(*sinks) : std::vector<double>();

  std::vector<int64_t> positions = {maxQueries - c.L, std::max<int64_t>(0, c.S / 2 - c.L / 2)};
  if (!inst.mask) positions = {0};  // no mask: the queries are [0, L)
  positions.erase(std::unique(positions.begin(), positions.end()), positions.end());
  for (int64_t pos : positions) {
    SCOPED_TRACE("queries at " + std::to_string(pos));
    std::optional<BlockMask> whole;
    if (inst.mask) whole = *inst.mask;
    const ReferenceResult ref =
        referenceAttention(q, k, v, inst.refScore, inst.refMask, scale, pos, sinks ? &sinkValues : nullptr);
    for (int64_t splits : how.splits) {
      SCOPED_TRACE("decode splits " + std::to_string(splits));
      FlexAttentionOptions o{.kernel = AttentionTemplate::Decode,
                             .decode_config = FlexDecodeConfig{.block_n = how.decodeBlockN, .splits = splits}};
      if (inst.mask) o.query_offset = pos;
      o.sinks = sinks;
      askMaxScores(o, maxScores);
      poison(out);
      poison(lse);
      flex_attention_into(q, k, v, inst.score, whole, out, &lse, o);
      if (!compareWithReference(out, lse, ref, c.valueDim(), c.dtype) || !maxScoresAgree(maxScores, ref)) return false;
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
    FlexAttentionOptions po{.config = pc, .kernel = AttentionTemplate::Prefill};
    po.sinks = sinks;
    askMaxScores(po, maxScores);
    poison(prefillOut);
    poison(lse);
    flex_attention_into(q, k, v, inst.score, slice, prefillOut, &lse, po);
    if (!compareWithReference(prefillOut, lse, ref, c.valueDim(), c.dtype) || !maxScoresAgree(maxScores, ref))
      return false;
    if (!templatesAgree(out, prefillOut, c.dtype, c.describe())) return false;
  }
  return true;
}

// The fused merge (the last program of each group merges the group's partials and resets the
// group's ticket counter) over many splits, call after call on the thread's one scratch. Each call
// must find every counter at 0: a counter left at n by one call would make the program drawing
// ticket splits - 1 - n of the next call merge before the others have written, or nobody merge
// (the output stays poisoned), and the split counts here change from call to call. The mask is
// causal with an optional window, built past the keys (the queries [S, S + L) at its end); with
// `blindOddQueries` the odd query positions see no key at all (their rows end with out 0 and
// lse -inf, next to live rows of the same program). More splits than inner steps leave splits
// empty (lse -inf partials).
struct FusedMergeCase {
  int64_t B, Hq, Hkv, L, S, D;
  dsl::DType dtype = dsl::DType::BF16;
  int64_t window = 0;  // 0: causal only
  bool blindOddQueries = false;
  attention::BlockSizes blocks{32, 32};
  int64_t blockN = 16;
  std::vector<int64_t> splits;  // one call per entry, in order
  std::string describe() const {
    return "B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) + " L=" +
           std::to_string(L) + " S=" + std::to_string(S) + " D=" + std::to_string(D) + " " +
           std::string(ir::dtypeName(dtype)) + " window " + std::to_string(window) +
           (blindOddQueries ? " odd queries blind" : "");
  }
};

inline bool checkFusedMergeCalls(std::mt19937_64& rng, const FusedMergeCase& c, dsl::MemorySpace space) {
  using namespace attention;
  using dsl::Tile;
  SCOPED_TRACE(c.describe());
  const int64_t window = c.window > 0 ? c.window : c.S + c.L;
  const bool blind = c.blindOddQueries;
  MaskMod mod("fused_merge_case", [window, blind](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    Tile ok = (kv <= q) & (q - kv < window);
    return blind ? ok & (q % 2 == 0) : ok;
  });
  RefMaskFn ref = [window, blind](int64_t, int64_t, int64_t q, int64_t kv) {
    return kv <= q && q - kv < window && (!blind || q % 2 == 0);
  };
  const BlockMask mask = createBlockMask(mod, 1, 1, c.S + c.L, c.S, c.blocks, space);
  const dsl::Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  const dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor out = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {c.B, c.Hq, c.L}, space);
  const double scale = 1.0 / std::sqrt(double(c.D));
  for (size_t call = 0; call < c.splits.size(); ++call) {
    SCOPED_TRACE("call " + std::to_string(call) + ", splits " + std::to_string(c.splits[call]));
    const dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
    const ReferenceResult want = referenceAttention(q, k, v, nullptr, ref, scale, c.S);
    FlexAttentionOptions o{.kernel = AttentionTemplate::Decode,
                           .decode_config = FlexDecodeConfig{.block_n = c.blockN, .splits = c.splits[call]},
                           .query_offset = c.S};
    EXPECT_EQ(plan_flex_decode(q, k, v, noop_score(), mask, o).kernelNames.size(), 1u) << "the merge is fused";
    poison(out);
    poison(lse);
    flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
    if (!compareWithReference(out, lse, want, c.D, c.dtype)) return false;
  }
  return true;
}

// FlexAttentionOptions::decode_timeline: every program's clock at its phases, in order; with
// several splits exactly one program of each (batch, group) merges, after its partials are
// released; with one split nothing is released or merged; the whole call spans well under a
// second. The output stays the reference's. A timeline of the wrong dtype is refused by name.
inline void checkDecodeTimeline(std::mt19937_64& rng, dsl::MemorySpace space) {
  using namespace attention;
  using dsl::DType;
  using dsl::Tensor;
  const int64_t B = 2, Hq = 8, Hkv = 2, S = 300, pos = S - 1;
  BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {200}, {32, 32}, space);
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, 64}, space);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, 64}, space), v = randomTensor(rng, DType::BF16, {B, Hkv, S, 64}, space);
  const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow({200}), 0.125, pos);
  for (int64_t splits : {1, 3}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{32, 4, 2, splits},
                           .query_offset = pos};
    const FlexDecodePlan plan = plan_flex_decode(q, k, v, noop_score(), mask, o);
    const int64_t groups = Hq / plan.headsPerProgram, programs = splits * groups * B;
    Tensor timeline = Tensor::fromHost(std::vector<int64_t>(size_t(programs * kTimelineSlots), -1),
                                       {programs, kTimelineSlots}, space);
    o.decode_timeline = timeline;
    Tensor out = Tensor::empty(DType::BF16, q.shape(), space), lse = Tensor::empty(DType::F32, {B, Hq, 1}, space);
    poison(out);
    poison(lse);
    flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
    if (!compareWithReference(out, lse, ref, 64, DType::BF16)) return;
    const std::vector<int64_t> t = timeline.toHost<int64_t>();
    int64_t first = INT64_MAX, last = 0;
    for (int64_t program = 0; program < programs; ++program) {
      first = std::min(first, t[size_t(program * kTimelineSlots + kTimelineStart)]);
      last = std::max(last, t[size_t(program * kTimelineSlots + kTimelineEnd)]);
    }
    EXPECT_LT(last - first, int64_t(1e9)) << "a call of a few microseconds took a second by its clock";
    // The SM column is each program's multiprocessor (%smid: its numbering may skip disabled SMs,
    // so no bound but 0): a call of many programs on a GPU spreads over more than one.
    std::set<int64_t> sms;
    for (int64_t program = 0; program < programs; ++program) sms.insert(t[size_t(program * kTimelineSlots + kTimelineSm)]);
    if (space == dsl::MemorySpace::Device) {
      EXPECT_GT(sms.size(), 1u) << "every program reported one SM";
    }
    std::vector<int> mergers(size_t(B * groups), 0);
    for (int64_t program = 0; program < programs; ++program) {
      auto at = [&](int slot) { return t[size_t(program * kTimelineSlots + slot)]; };
      SCOPED_TRACE("program " + std::to_string(program));
      EXPECT_GT(at(kTimelineStart), 0);
      EXPECT_GE(at(kTimelineSm), 0);
      if (space == dsl::MemorySpace::Host) {
        EXPECT_EQ(at(kTimelineSm), 0) << "the interpreter is one multiprocessor";
      }
      EXPECT_LE(at(kTimelineStart), at(kTimelineWalked));
      EXPECT_LE(at(kTimelineWalked), at(kTimelineEnd));
      if (splits == 1) {
        EXPECT_EQ(at(kTimelineReleased), 0);
        EXPECT_EQ(at(kTimelineMerging), 0);
        continue;
      }
      EXPECT_LE(at(kTimelineWalked), at(kTimelineReleased));
      EXPECT_LE(at(kTimelineReleased), at(kTimelineEnd));
      if (at(kTimelineMerging) != 0) {
        ++mergers[size_t(program / splits)];
        EXPECT_LE(at(kTimelineReleased), at(kTimelineMerging));
        EXPECT_LE(at(kTimelineMerging), at(kTimelineEnd));
      }
    }
    if (splits > 1) {
      for (int merged : mergers) EXPECT_EQ(merged, 1);
    }
  }
  FlexAttentionOptions wrong{.kernel = AttentionTemplate::Decode, .decode_config = FlexDecodeConfig{32, 4, 2, 3},
                             .query_offset = pos, .decode_timeline = Tensor::empty(DType::I32, {24, kTimelineSlots}, space)};
  Tensor out = Tensor::empty(DType::BF16, q.shape(), space);
  try {
    flex_attention_into(q, k, v, noop_score(), mask, out, nullptr, wrong);
    ADD_FAILURE() << "an i32 timeline was taken";
  } catch (const flextile::Error& e) {
    EXPECT_NE(std::string(e.what()).find("decode_timeline"), std::string::npos) << e.what();
  }
}

}  // namespace flextile::testing
