// Runs flex_attention on fresh random inputs (outputs poisoned first) and
// compares output and LSE with the float64 reference. Shared by the host
// tests (interpreter) and the GPU tests.
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <random>
#include <string>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"

namespace flextile::testing {

struct AttentionCase {
  int64_t B = 1, Hq = 2, Hkv = 2, L = 129, S = 129, D = 64;
  dsl::DType dtype = dsl::DType::BF16;
  std::string context;
};

inline dsl::Tensor randomTensor(std::mt19937_64& rng, dsl::DType dt, dsl::Shape shape, dsl::MemorySpace space,
                                double lo = -1, double hi = 1) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::uniform_real_distribution<double> u(lo, hi);
  switch (dt) {
    case dsl::DType::BF16: {
      std::vector<Eigen::bfloat16> v{}; v.resize(size_t(n));
      for (auto& x : v) x = Eigen::bfloat16(float(u(rng)));
      return dsl::Tensor::fromHost(v, shape, space);
    }
    case dsl::DType::F16: {
      std::vector<Eigen::half> v{}; v.resize(size_t(n));
      for (auto& x : v) x = Eigen::half(float(u(rng)));
      return dsl::Tensor::fromHost(v, shape, space);
    }
    default: {
      std::vector<float> v{}; v.resize(size_t(n));
      for (auto& x : v) x = float(u(rng));
      return dsl::Tensor::fromHost(v, shape, space);
    }
  }
}

// NaN everywhere, so an element the kernel forgets to write fails the check.
inline void poison(dsl::Tensor& t) {
  switch (t.dtype()) {
    case dsl::DType::BF16: t.copyFromHost(std::vector<Eigen::bfloat16>(size_t(t.numel()), Eigen::bfloat16(NAN))); break;
    case dsl::DType::F16: t.copyFromHost(std::vector<Eigen::half>(size_t(t.numel()), Eigen::half(NAN))); break;
    default: t.copyFromHost(std::vector<float>(size_t(t.numel()), NAN)); break;
  }
}

inline double tolerance(dsl::DType dt) { return dt == dsl::DType::F16 ? 4e-3 : dt == dsl::DType::BF16 ? 2e-2 : 4e-3; }

// Runs one case and checks it; returns false after reporting a failure.
inline bool checkFlexAttention(std::mt19937_64& rng, const AttentionCase& c, dsl::MemorySpace space,
                               const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                               const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                               const attention::FlexAttentionOptions& options = {}) {
  using namespace flextile::attention;
  SCOPED_TRACE(c.context + " B=" + std::to_string(c.B) + " Hq=" + std::to_string(c.Hq) + " Hkv=" +
               std::to_string(c.Hkv) + " L=" + std::to_string(c.L) + " S=" + std::to_string(c.S) +
               " D=" + std::to_string(c.D) + " " + std::string(ir::dtypeName(c.dtype)));
  dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, space);
  dsl::Tensor out = dsl::Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {c.B, c.Hq, c.L}, space);
  poison(out);
  poison(lse);
  flex_attention_into(q, k, v, score, mask, out, &lse, options);
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(c.D));
  const int64_t qOffset = mask ? mask->qOffset() : 0;
  ReferenceResult ref = referenceAttention(q, k, v, refScore, refMask, scale, qOffset);
  const std::vector<double> got = toDoubles(out);
  const std::vector<float> gotLse = lse.toHost<float>();
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << "out[" << i << "] = " << got[i] << " (reference " << ref.out[i] << ")";
      return false;
    }
    num += (got[i] - ref.out[i]) * (got[i] - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  if (den == 0 ? num != 0 : rel > tolerance(c.dtype)) {
    ADD_FAILURE() << "relative error of out " << rel << " > " << tolerance(c.dtype);
    return false;
  }
  for (size_t i = 0; i < gotLse.size(); ++i) {
    const double want = ref.lse[i], have = gotLse[i];
    const bool ok = std::isinf(want) ? (std::isinf(have) && have < 0) : std::abs(have - want) <= 2e-2 + 1e-3 * std::abs(want);
    if (!ok) {
      ADD_FAILURE() << "lse[" << i << "] = " << have << ", reference " << want;
      return false;
    }
  }
  return true;
}

}  // namespace flextile::testing
