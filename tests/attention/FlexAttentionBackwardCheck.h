// Runs flex_attention forward and backward on fresh random inputs (gradients poisoned first) and
// compares dq, dk, dv (and captured gradients) with the float64 reference written from the
// formulas (attention_templates/Reference.h). Shared by the host tests (interpreter) and the GPU
// tests.
//
// Element-wise, against a bound relative to the largest reference gradient of the tensor (the
// gradients are sums of products of rounded P and dS, so their error scales with the tensor, not
// with each element); rows with no allowed key (and keys no query sees) must be exactly 0.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "FlexAttentionCheck.h"

namespace flextile::testing {

// Bound on |error| / max |reference| per element; the Frobenius bound is half of it.
// `floor`: a magnitude below which the bound does not shrink (AttentionComparison.h,
// gradMismatch); false after the failure is reported.
inline bool compareGrad(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                        dsl::DType dt, const std::vector<char>* exactZeroRows = nullptr, int64_t rowLength = 1,
                        double floor = 0) {
  const std::string mismatch = gradMismatch(what, got, want, dt, exactZeroRows, rowLength, floor);
  if (!mismatch.empty()) ADD_FAILURE() << mismatch;
  return mismatch.empty();
}

struct BackwardCheck {
  attention::RefScoreFn refScore;
  attention::RefScoreGradFn refScoreGrad;
  attention::RefMaskFn refMask;
  // Reference gradients of the trainable captures: given a sink's calls, the expected gradient of
  // each trainable capture (row-major, its shape), filled by `sink`.
  attention::RefScoreGradSink sink;
  std::vector<std::vector<double>>* expectedCaptureGrads = nullptr;
  std::optional<attention::FlexAttentionConfig> forwardConfig;
  attention::FlexAttentionBackwardOptions options;
  bool withDlse = false;
  bool sinks = false;  // random attention sinks in the forward and the backward; dsinks checked
};

// Fresh random inputs of case `c` in `space`; forward (return_lse), then backward into poisoned
// gradients; compared with the reference. Returns false after the first failure.
inline bool checkBackward(std::mt19937_64& rng, const AttentionCase& c, dsl::MemorySpace space,
                          const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                          const BackwardCheck& check) {
  const std::string what = c.describe() + (check.options.config ? " config " + check.options.config->describe()
                                                                 : std::string(" default config")) +
                           (mask ? " mask " + mask->describe() : std::string(" no mask"));
  SCOPED_TRACE(what);
  // On the GPU each case is named before it runs, so that a shard cut off by its time limit
  // (scripts/gpu_run.sh) shows which case it was in: a kernel that never ends, or a slow one.
  if (space == dsl::MemorySpace::Device) {
    std::fprintf(stdout, "[ CASE     ] %s\n", what.c_str());
    std::fflush(stdout);
  }
  dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.valueDim()}, space);
  dsl::Tensor dout = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.valueDim()}, space);
  attention::FlexAttentionOptions fo{.scale = check.options.scale, .return_lse = true, .config = check.forwardConfig};
  std::vector<double> sinks;
  if (check.sinks) {
    fo.sinks = randomSinks(rng, c.Hq, space, c.S);
    sinks = attention::toDoubles(*fo.sinks);
  }
  attention::FlexAttentionResult fwd = attention::flex_attention(q, k, v, score, mask, fo);
  attention::FlexAttentionBackwardOptions bo = check.options;
  bo.sinks = fo.sinks;
  std::vector<double> dlse;
  if (check.withDlse) {
    dsl::Tensor t = randomTensor(rng, dsl::DType::F32, {c.B, c.Hq, c.L}, space);
    dlse = attention::toDoubles(t);
    bo.dlse = t;
  }
  attention::FlexAttentionGrads g;
  g.dq = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  g.dk = dsl::Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  g.dv = dsl::Tensor::empty(c.dtype, {c.B, c.Hkv, c.S, c.valueDim()}, space);
  poison(g.dq);
  poison(g.dk);
  poison(g.dv);
  attention::flex_attention_backward_into(q, k, v, fwd.out, fwd.lse, dout, score, mask, g, bo);

  const double scale = bo.scale ? *bo.scale : 1.0 / std::sqrt(double(c.D));
  const int64_t qOffset = mask ? mask->qOffset() : 0;
  const attention::ReferenceGrads ref = attention::referenceAttentionBackward(
      q, k, v, dout, check.refScore, check.refScoreGrad, check.refMask, scale, qOffset,
      check.withDlse ? &dlse : nullptr, check.sink, &fwd.out, check.sinks ? &sinks : nullptr);
  // Rows with no allowed key (the forward reference's), and keys no query of their group sees: exactly 0.
  const attention::ReferenceResult fref = attention::referenceAttention(q, k, v, check.refScore, check.refMask, scale, qOffset);
  std::vector<char> deadRows(fref.lse.size());
  for (size_t i = 0; i < deadRows.size(); ++i) deadRows[i] = std::isinf(fref.lse[i]);
  if (const std::string m = gradsMismatch(g, ref, deadRows, check.refMask, qOffset, c.dtype); !m.empty()) {
    ADD_FAILURE() << m;
    return false;
  }
  if (check.expectedCaptureGrads) {
    if (g.captureGrads.size() != check.expectedCaptureGrads->size()) {
      ADD_FAILURE() << g.captureGrads.size() << " captured gradients, expected " << check.expectedCaptureGrads->size();
      return false;
    }
    for (size_t i = 0; i < g.captureGrads.size(); ++i) {
      const std::string what = "gradient of capture '" + g.trainable[i].name() + "'";
      // f32 accumulation of many bf16-rounded products: the same bound as the inputs' dtype.
      if (!compareGrad(what.c_str(), attention::toDoubles(g.captureGrads[i]), (*check.expectedCaptureGrads)[i],
                       c.dtype))
        return false;
    }
  }
  return true;
}

}  // namespace flextile::testing
