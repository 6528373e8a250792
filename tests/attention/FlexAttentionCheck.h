// Runs flex_attention on fresh random inputs (outputs poisoned first) and
// compares output and LSE with the float64 reference. Shared by the host
// tests (interpreter) and the GPU tests.
//
// The comparison is element-wise (one bad row among thousands must not hide
// in a norm) and exact where the semantics are: a row with no allowed key
// must give out 0 (bit-exact) and lse -inf.
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "AttentionComparison.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"
#include "gpu/TestBudget.h"

namespace flextile::testing {

struct AttentionCase {
  int64_t B = 1, Hq = 2, Hkv = 2, L = 129, S = 129, D = 64;
  dsl::DType dtype = dsl::DType::BF16;
  std::string context;
  int64_t DV = 0;  // v's head dim (and the output's); 0: D

  int64_t valueDim() const { return DV > 0 ? DV : D; }

  int64_t work() const { return B * Hq * L * S; }  // score elements (TestBudget.h's inScope)

  std::string describe() const {
    return context + " B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
           " L=" + std::to_string(L) + " S=" + std::to_string(S) + " D=" + std::to_string(D) +
           (DV > 0 && DV != D ? " DV=" + std::to_string(DV) : std::string()) + " " + std::string(ir::dtypeName(dtype));
  }
};

// Random sinks [H] within 3 of log(keys), a row's log-sum-exp over `keys` keys of random unit
// inputs' scores (so that the keys outweigh a sink or it outweighs them), head 1's -inf where there
// are two heads or more (a head without a sink beside those with one).
inline dsl::Tensor randomSinks(std::mt19937_64& rng, int64_t H, dsl::MemorySpace space, int64_t keys) {
  std::vector<float> s(static_cast<size_t>(H));
  const float center = std::log(float(std::max<int64_t>(keys, 1)));
  std::uniform_real_distribution<float> logit(center - 3.0f, center + 3.0f);
  for (float& x : s) x = logit(rng);
  if (H > 1) s[1] = -INFINITY;
  return dsl::Tensor::fromHost(s, {H}).to(space);
}

// Compares flex_attention's out and lse with the reference of the same inputs
// (attentionMismatch, AttentionComparison.h). Returns false after the first reported failure.
inline bool compareWithReference(const dsl::Tensor& out, const dsl::Tensor& lse, const attention::ReferenceResult& ref,
                                 int64_t D, dsl::DType dtype) {
  const std::string mismatch = attentionMismatch(out, lse, ref, D, dtype);
  if (mismatch.empty()) return true;
  ADD_FAILURE() << mismatch;
  return false;
}

// Runs flex_attention on the given inputs into `out` (any view of the right
// shape; poisoned first) and compares with a reference computed beforehand
// (so several configs can share one). The lse is a fresh poisoned tensor.
inline bool runAndCompare(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v, dsl::Tensor& out,
                          const attention::ReferenceResult& ref, const std::string& context,
                          const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                          const attention::FlexAttentionOptions& options = {}) {
  SCOPED_TRACE(context + (options.config ? " config " + options.config->describe() : std::string(" default config")) +
               (mask ? " mask blocks " + std::to_string(mask->qBlockSize()) + "x" +
                           std::to_string(mask->kvBlockSize())
                     : std::string(" no mask")));
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), DV = v.size(3);
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {B, Hq, L}, q.space());
  poison(out);
  poison(lse);
  attention::FlexAttentionOptions o = options;
  if (options.return_max_scores) {  // the test asks for them: a poisoned output of its own
    o.max_scores = dsl::Tensor::empty(dsl::DType::F32, {B, Hq, L}, q.space());
    poison(*o.max_scores);
  }
  attention::flex_attention_into(q, k, v, score, mask, out, &lse, o);
  if (!compareWithReference(out, lse, ref, DV, q.dtype())) return false;
  if (!o.max_scores) return true;
  const std::string mismatch = maxScoresMismatch(*o.max_scores, ref);
  if (mismatch.empty()) return true;
  ADD_FAILURE() << mismatch;
  return false;
}

// Above this many score elements (B * Hq * L * S) a GPU check's float64 reference covers a sample
// of the rows (unless FLEXTILE_GPU_TESTS_FULL=1): the full one of B=2 Hq=8 L=S=1000 takes seconds
// on one core, of L=S=8190 most of a minute, while the kernel runs in microseconds.
inline constexpr int64_t kFullReferenceWork = int64_t(1) << 22;

// The reference of q's rows (all of them, or a sample of a large problem on the device; the rows
// left out have lse NaN): the sample (attention::sampleQueryRows) keeps every (b, h)'s first and
// last row, 16 random rows per (b, h), both sides of every 16-row boundary (every BLOCK_M a config
// may use, and the mask's blocks) and the ends of every run of rows the mask leaves without a key.
inline attention::ReferenceResult referenceFor(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                               const attention::RefScoreFn& refScore,
                                               const attention::RefMaskFn& refMask,
                                               const std::optional<attention::BlockMask>& mask,
                                               const attention::FlexAttentionOptions& options = {},
                                               uint64_t rowSampleSeed = 0) {
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(q.size(3)));
  const int64_t qOffset = mask ? mask->qOffset() : 0;
  const int64_t B = q.size(0), H = q.size(1), L = q.size(2), D = v.size(3), S = k.size(2);  // D: out's rows
  const std::vector<double> sinkValues = options.sinks ? attention::toDoubles(*options.sinks) : std::vector<double>();
  const std::vector<double>* sinks = options.sinks ? &sinkValues : nullptr;
  if (q.space() != dsl::MemorySpace::Device || fullSweeps() || B * H * L * S <= kFullReferenceWork)
    return attention::referenceAttention(q, k, v, refScore, refMask, scale, qOffset, sinks);
  const std::vector<attention::QueryRow> rows = attention::sampleQueryRows(
      B, H, L, mask ? &*mask : nullptr, refMask, {.randomPerHead = 16, .boundaryBlock = 16, .seed = rowSampleSeed});
  // One thread: the tests' reference mods need not be safe to call concurrently.
  const attention::ReferenceRows some =
      attention::referenceAttentionRows(q, k, v, refScore, refMask, scale, rows, qOffset, /*threads=*/1, sinks);
  attention::ReferenceResult ref;
  ref.out.assign(size_t(B * H * L * D), NAN);
  ref.lse.assign(size_t(B * H * L), NAN);
  ref.maxScores.assign(size_t(B * H * L), NAN);
  ref.allowedPairs = some.allowedPairs;
  for (size_t n = 0; n < rows.size(); ++n) {
    const size_t row = size_t((rows[n].b * H + rows[n].h) * L + rows[n].i);
    ref.lse[row] = some.lse[n];
    ref.maxScores[row] = some.maxScores[n];
    std::copy_n(some.out.begin() + std::ptrdiff_t(n * size_t(D)), D, ref.out.begin() + std::ptrdiff_t(row * size_t(D)));
  }
  return ref;
}

// The same with the reference computed here.
inline bool checkFlexAttentionOn(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v, dsl::Tensor& out,
                                 const std::string& context, const attention::ScoreMod& score,
                                 const std::optional<attention::BlockMask>& mask,
                                 const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                                 const attention::FlexAttentionOptions& options = {}, uint64_t rowSampleSeed = 0) {
  const attention::ReferenceResult ref = referenceFor(q, k, v, refScore, refMask, mask, options, rowSampleSeed);
  return runAndCompare(q, k, v, out, ref, context, score, mask, options);
}

// Fresh random q [B, Hq, L, D], k [B, Hkv, S, D] and v [B, Hkv, S, DV] in `space`, run and checked.
inline bool checkFlexAttention(std::mt19937_64& rng, const AttentionCase& c, dsl::MemorySpace space,
                               const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                               const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                               const attention::FlexAttentionOptions& options = {}) {
  dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.valueDim()}, space);
  dsl::Tensor out = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.valueDim()}, space);
  return checkFlexAttentionOn(q, k, v, out, c.describe(), score, mask, refScore, refMask, options, rng());
}

// The forward kernel flex_attention cached for this pair of mods and dtype,
// or nullptr; for tests that count traces and compilations.
inline const dsl::Kernel* forwardKernel(const attention::MaskMod& maskMod, const attention::ScoreMod& scoreMod,
                                        dsl::DType dtype) {
  return attention::cachedForwardKernel(maskMod, scoreMod, dtype);
}

}  // namespace flextile::testing
