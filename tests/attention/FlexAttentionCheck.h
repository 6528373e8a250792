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
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"

namespace flextile::testing {

struct AttentionCase {
  int64_t B = 1, Hq = 2, Hkv = 2, L = 129, S = 129, D = 64;
  dsl::DType dtype = dsl::DType::BF16;
  std::string context;

  std::string describe() const {
    return context + " B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
           " L=" + std::to_string(L) + " S=" + std::to_string(S) + " D=" + std::to_string(D) + " " +
           std::string(ir::dtypeName(dtype));
  }
};

// Row-major random values in [lo, hi) of dtype `dt` (bf16, f16 or f32).
inline void fillRandom(std::mt19937_64& rng, dsl::Tensor& t, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> u(lo, hi);
  const size_t n = size_t(t.numel());
  switch (t.dtype()) {
    case dsl::DType::BF16: {
      std::vector<Eigen::bfloat16> v(n);
      for (auto& x : v) x = Eigen::bfloat16(float(u(rng)));
      t.copyFromHost(v);
      break;
    }
    case dsl::DType::F16: {
      std::vector<Eigen::half> v(n);
      for (auto& x : v) x = Eigen::half(float(u(rng)));
      t.copyFromHost(v);
      break;
    }
    default: {
      std::vector<float> v(n);
      for (auto& x : v) x = float(u(rng));
      t.copyFromHost(v);
      break;
    }
  }
}

inline dsl::Tensor randomTensor(std::mt19937_64& rng, dsl::DType dt, dsl::Shape shape, dsl::MemorySpace space,
                                double lo = -1, double hi = 1) {
  dsl::Tensor t = dsl::Tensor::empty(dt, std::move(shape), space);
  fillRandom(rng, t, lo, hi);
  return t;
}

// NaN everywhere, so an element the kernel forgets to write fails the check.
inline void poison(dsl::Tensor& t) {
  switch (t.dtype()) {
    case dsl::DType::BF16: t.copyFromHost(std::vector<Eigen::bfloat16>(size_t(t.numel()), Eigen::bfloat16(NAN))); break;
    case dsl::DType::F16: t.copyFromHost(std::vector<Eigen::half>(size_t(t.numel()), Eigen::half(NAN))); break;
    default: t.copyFromHost(std::vector<float>(size_t(t.numel()), NAN)); break;
  }
}

// Element-wise bound on |out - reference|. Outputs are convex combinations
// of values in [-1, 1]: bf16 (8-bit mantissa) rounds P and out to ~2^-9
// relative; f16 to ~2^-12; f32 runs its dots on tf32 (10-bit) on the GPU.
inline double elementTolerance(dsl::DType dt) {
  return dt == dsl::DType::BF16 ? 1.6e-2 : dt == dsl::DType::F16 ? 3e-3 : 4e-3;
}
// Relative Frobenius bound over the whole output (tighter than the element one).
inline double tolerance(dsl::DType dt) { return dt == dsl::DType::F16 ? 4e-3 : dt == dsl::DType::BF16 ? 1e-2 : 4e-3; }

// Compares flex_attention's out and lse with the reference of the same inputs.
// Returns false after the first reported failure.
inline bool compareWithReference(const dsl::Tensor& out, const dsl::Tensor& lse, const attention::ReferenceResult& ref,
                                 int64_t D, dsl::DType dtype) {
  const std::vector<double> got = attention::toDoubles(out);
  const std::vector<float> gotLse = lse.toHost<float>();
  if (got.size() != ref.out.size() || gotLse.size() != ref.lse.size()) {
    ADD_FAILURE() << "sizes differ from the reference: out " << got.size() << " vs " << ref.out.size() << ", lse "
                  << gotLse.size() << " vs " << ref.lse.size();
    return false;
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool maskedRow = std::isinf(ref.lse[i / size_t(D)]);
    const double err = std::abs(got[i] - ref.out[i]);
    if (!std::isfinite(got[i]) || (maskedRow && got[i] != 0.0) || err > elementTolerance(dtype)) {
      ADD_FAILURE() << "out[" << i << "] (row " << i / size_t(D) << ", d " << i % size_t(D) << ") = " << got[i]
                    << ", reference " << ref.out[i] << (maskedRow ? " (a row with no allowed key)" : "")
                    << ", |error| " << err << " > " << elementTolerance(dtype);
      return false;
    }
    num += (got[i] - ref.out[i]) * (got[i] - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  if (den == 0 ? num != 0 : rel > tolerance(dtype)) {
    ADD_FAILURE() << "relative error of out " << rel << " > " << tolerance(dtype);
    return false;
  }
  for (size_t i = 0; i < gotLse.size(); ++i) {
    const double want = ref.lse[i], have = gotLse[i];
    const bool ok =
        std::isinf(want) ? (std::isinf(have) && have < 0) : std::abs(have - want) <= 2e-2 + 1e-3 * std::abs(want);
    if (!ok) {
      ADD_FAILURE() << "lse[" << i << "] = " << have << ", reference " << want;
      return false;
    }
  }
  return true;
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
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3);
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {B, Hq, L}, q.space());
  poison(out);
  poison(lse);
  attention::flex_attention_into(q, k, v, score, mask, out, &lse, options);
  return compareWithReference(out, lse, ref, D, q.dtype());
}

inline attention::ReferenceResult referenceFor(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                               const attention::RefScoreFn& refScore,
                                               const attention::RefMaskFn& refMask,
                                               const std::optional<attention::BlockMask>& mask,
                                               const attention::FlexAttentionOptions& options = {}) {
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(q.size(3)));
  return attention::referenceAttention(q, k, v, refScore, refMask, scale, mask ? mask->qOffset() : 0);
}

// The same with the reference computed here.
inline bool checkFlexAttentionOn(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v, dsl::Tensor& out,
                                 const std::string& context, const attention::ScoreMod& score,
                                 const std::optional<attention::BlockMask>& mask,
                                 const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                                 const attention::FlexAttentionOptions& options = {}) {
  const attention::ReferenceResult ref = referenceFor(q, k, v, refScore, refMask, mask, options);
  return runAndCompare(q, k, v, out, ref, context, score, mask, options);
}

// Fresh random q [B, Hq, L, D], k and v [B, Hkv, S, D] in `space`, run and checked.
inline bool checkFlexAttention(std::mt19937_64& rng, const AttentionCase& c, dsl::MemorySpace space,
                               const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                               const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                               const attention::FlexAttentionOptions& options = {}) {
  dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor out = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  return checkFlexAttentionOn(q, k, v, out, c.describe(), score, mask, refScore, refMask, options);
}

// The forward kernel flex_attention cached for this pair of mods and dtype,
// or nullptr; for tests that count traces and compilations.
inline const dsl::Kernel* forwardKernel(const attention::MaskMod& maskMod, const attention::ScoreMod& scoreMod,
                                        dsl::DType dtype) {
  return attention::cachedForwardKernel(maskMod, scoreMod, dtype);
}

}  // namespace flextile::testing
