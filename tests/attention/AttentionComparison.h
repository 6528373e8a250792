// Random attention inputs and the comparison of flex_attention's results with the float64
// reference, without gtest: the attention tests (FlexAttentionCheck.h) and the mask_mod fuzzer
// (tests/fuzz/MaskModProperty.cpp) share them.
//
// The comparison is element-wise (one bad row among thousands must not hide
// in a norm) and exact where the semantics are: a row with no allowed key
// must give out 0 (bit-exact) and lse -inf.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"
#include "dsl/Tensor.h"

namespace flextile::testing {

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

// The float64 reference when sequence b's queries sit at positions[b] (the decode's
// query_offsets): each batch row of q against its own K/V, with `mask` at that position.
inline attention::ReferenceResult referenceAtPositions(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                                       const attention::RefMaskFn& mask,
                                                       const std::vector<int32_t>& positions) {
  attention::ReferenceResult ref;
  for (int64_t b = 0; b < q.size(0); ++b) {
    auto one = [&](const dsl::Tensor& t) {
      return dsl::Tensor::viewOf(t, b * t.strides()[0], {1, t.size(1), t.size(2), t.size(3)}, t.strides())
          .to(dsl::MemorySpace::Host);
    };
    attention::ReferenceResult r = attention::referenceAttention(one(q), one(k), one(v), nullptr, mask,
                                                                 1.0 / std::sqrt(double(q.size(3))), positions[size_t(b)]);
    ref.out.insert(ref.out.end(), r.out.begin(), r.out.end());
    ref.lse.insert(ref.lse.end(), r.lse.begin(), r.lse.end());
  }
  return ref;
}

// Element-wise bound on |out - reference|. Outputs are convex combinations
// of values in [-1, 1]: bf16 (8-bit mantissa) rounds P and out to ~2^-9
// relative; f16 to ~2^-12; f32 runs its dots on tf32 (10-bit) on the GPU.
inline double elementTolerance(dsl::DType dt) {
  return dt == dsl::DType::BF16 ? 1.6e-2 : dt == dsl::DType::F16 ? 3e-3 : 4e-3;
}
// Relative Frobenius bound over the whole output (tighter than the element one).
inline double tolerance(dsl::DType dt) { return dt == dsl::DType::F16 ? 4e-3 : dt == dsl::DType::BF16 ? 1e-2 : 4e-3; }

// A value per row (lse, max scores) against the reference's: NaN where a sampled reference left the
// row out (then only written over the poison), -inf where the row has no live score, else within
// `absolute` + 1e-3 relative. The first difference, "" if none.
inline std::string rowValuesMismatch(const char* what, const std::vector<float>& got, const std::vector<double>& want,
                                     double absolute) {
  if (got.size() != want.size())
    return std::string(what) + " has " + std::to_string(got.size()) + " rows, the reference " +
           std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i], have = got[i];
    const bool ok = std::isnan(w)   ? !std::isnan(have)
                    : std::isinf(w) ? (std::isinf(have) && have < 0)
                                    : std::abs(have - w) <= absolute + 1e-3 * std::abs(w);
    if (!ok) {
      std::ostringstream os;
      os << what << "[" << i << "] = " << have << ", reference " << w;
      return os.str();
    }
  }
  return "";
}

// Compares flex_attention's out and lse with the reference of the same inputs: the first
// difference past the tolerances (or a masked row that is not exactly 0 / -inf), "" if none.
// A reference row whose lse is NaN was not computed (a sampled reference, see referenceFor):
// there the output must only be finite and the lse not NaN, i.e. written over the poison.
inline std::string attentionMismatch(const dsl::Tensor& out, const dsl::Tensor& lse, const attention::ReferenceResult& ref,
                                     int64_t D, dsl::DType dtype) {
  const std::vector<double> got = attention::toDoubles(out);
  const std::vector<float> gotLse = lse.toHost<float>();
  if (got.size() != ref.out.size() || gotLse.size() != ref.lse.size()) {
    std::ostringstream os;
    os << "sizes differ from the reference: out " << got.size() << " vs " << ref.out.size() << ", lse "
                  << gotLse.size() << " vs " << ref.lse.size();
    return os.str();
  }
  double num = 0, den = 0;
  // The first element over tolerance, then how many there are and in which rows: a race shows as
  // a scatter of rows, a wrong layout or mask as a pattern.
  std::string first;
  size_t bad = 0;
  double worst = 0;
  std::vector<size_t> badRows;
  for (size_t i = 0; i < got.size(); ++i) {
    const size_t row = i / size_t(D);
    if (std::isnan(ref.lse[row])) {  // a row the sampled reference left out
      if (!std::isfinite(got[i])) {
        std::ostringstream os;
        os << "out[" << i << "] (row " << row << ", d " << i % size_t(D) << ") = " << got[i]
           << ": not written, or not finite (a row outside the reference's sample)";
        return os.str();
      }
      continue;
    }
    const bool maskedRow = std::isinf(ref.lse[row]);
    const double err = std::abs(got[i] - ref.out[i]);
    if (!std::isfinite(got[i]) || (maskedRow && got[i] != 0.0) || err > elementTolerance(dtype)) {
      if (first.empty()) {
        std::ostringstream os;
        os << "out[" << i << "] (row " << row << ", d " << i % size_t(D) << ") = " << got[i] << ", reference "
           << ref.out[i] << (maskedRow ? " (a row with no allowed key)" : "") << ", |error| " << err << " > "
           << elementTolerance(dtype);
        first = os.str();
      }
      ++bad;
      worst = std::isfinite(err) ? std::max(worst, err) : worst;
      if (badRows.empty() || badRows.back() != row) badRows.push_back(row);
    }
    num += (got[i] - ref.out[i]) * (got[i] - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  if (bad) {
    std::ostringstream os;
    os << first << "; " << bad << " of " << got.size() << " elements over the tolerance, largest error " << worst
       << ", in " << badRows.size() << " rows of " << got.size() / size_t(D) << " (rows";
    for (size_t r = 0; r < std::min<size_t>(badRows.size(), 12); ++r) os << " " << badRows[r];
    os << (badRows.size() > 12 ? " ...)" : ")");
    return os.str();
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  if (den == 0 ? num != 0 : rel > tolerance(dtype)) {
    return "relative error of out " + std::to_string(rel) + " > " + std::to_string(tolerance(dtype));
  }
  return rowValuesMismatch("lse", gotLse, ref.lse, 2e-2);
}

// Compares the max scores a call wrote (FlexAttentionOptions::return_max_scores) with the
// reference's: -inf exactly where the reference's row has no live score, else within a tolerance of
// the f32 scores (inputs are exact in both; only the score's arithmetic and the mods round). A row
// a sampled reference left out (NaN) must only have been written over the poison. "" if they agree.
inline std::string maxScoresMismatch(const dsl::Tensor& maxScores, const attention::ReferenceResult& ref) {
  return rowValuesMismatch("max_scores", maxScores.toHost<float>(), ref.maxScores, 5e-3);
}

// The bound of a gradient's element relative to the largest of its reference (bf16 and f16 inputs
// round every product's operands; f32's run as tf32).
inline double gradTolerance(dsl::DType dt) {
  return dt == dsl::DType::BF16 ? 3e-2 : dt == dsl::DType::F16 ? 6e-3 : 6e-3;
}

// Compares a gradient with its float64 reference element by element and as a whole; "" if they
// agree, else the first element out of bounds. `floor`: a magnitude below which the bound does not
// shrink (a gradient that cancels to ~0 in exact arithmetic, dq of a row with one allowed key say,
// still carries the rounding of its terms). Rows marked in `exactZeroRows` (rows of `rowLength`
// elements: a query without keys, a key no query sees) must be exactly 0.
inline std::string gradMismatch(const char* what, const std::vector<double>& got, const std::vector<double>& want,
                                dsl::DType dt, const std::vector<char>* exactZeroRows = nullptr,
                                int64_t rowLength = 1, double floor = 0) {
  std::ostringstream m;
  if (got.size() != want.size()) {
    m << what << ": " << got.size() << " elements, reference " << want.size();
    return m.str();
  }
  double maxRef = 0, num = 0, den = 0;
  for (double x : want) maxRef = std::max(maxRef, std::abs(x));
  const double bound = gradTolerance(dt) * std::max({maxRef, floor, 1e-6});
  for (size_t i = 0; i < got.size(); ++i) {
    const bool zeroRow = exactZeroRows && (*exactZeroRows)[i / size_t(rowLength)];
    const double err = std::abs(got[i] - want[i]);
    if (!std::isfinite(got[i]) || (zeroRow && got[i] != 0.0) || err > bound) {
      m << what << "[" << i << "] (row " << i / size_t(rowLength) << ", d " << i % size_t(rowLength) << ") = " << got[i]
        << ", reference " << want[i] << (zeroRow ? " (must be exactly 0)" : "") << ", |error| " << err << " > "
        << bound << " (max |reference| " << maxRef << ")";
      return m.str();
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  // The Frobenius norm takes the same floor, per element: a gradient that is zero in exact
  // arithmetic (a row of one allowed key has dS = p (dP - delta) = 0) is only rounding, which its
  // own norm would make an unbounded relative error.
  const double scaleSq = std::max(den, floor * floor * double(got.size()));
  const double rel = std::sqrt(num / std::max(scaleSq, 1e-30));
  if (scaleSq > 0 && rel > gradTolerance(dt) / 2)
    m << what << ": relative error " << rel << " > " << gradTolerance(dt) / 2;
  return m.str();
}

// flex_attention_backward's dq, dk, dv, and dsinks where `want` has them, against the float64
// reference: rows without an allowed key (`deadRows`, [B, Hq, L]) and keys that no query of their
// group sees (`mask` at query offset `qOffset`; empty: every pair allowed) exactly 0, each gradient
// within gradMismatch's bounds with a floor of 5 % of the largest reference element of the three.
// "" if they agree.
inline std::string gradsMismatch(const attention::FlexAttentionGrads& got, const attention::ReferenceGrads& want,
                                 const std::vector<char>& deadRows, const attention::RefMaskFn& mask, int64_t qOffset,
                                 dsl::DType dt) {
  const int64_t B = got.dq.size(0), Hq = got.dq.size(1), L = got.dq.size(2), D = got.dq.size(3);
  const int64_t Hkv = got.dk.size(1), S = got.dk.size(2), DV = got.dv.size(3), G = Hq / Hkv;
  std::vector<char> deadKeys(size_t(B * Hkv * S), 1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j)
          if (!mask || mask(b, h, i + qOffset, j)) deadKeys[size_t((b * Hkv + h / G) * S + j)] = 0;
  double floor = 0;
  for (const auto* t : {&want.dq, &want.dk, &want.dv})
    for (double x : *t) floor = std::max(floor, 0.05 * std::abs(x));
  std::string m = gradMismatch("dq", attention::toDoubles(got.dq), want.dq, dt, &deadRows, D, floor);
  if (m.empty()) m = gradMismatch("dk", attention::toDoubles(got.dk), want.dk, dt, &deadKeys, D, floor);
  if (m.empty()) m = gradMismatch("dv", attention::toDoubles(got.dv), want.dv, dt, &deadKeys, DV, floor);
  if (m.empty() && want.dsinks.empty() == got.dsinks.defined())
    m = got.dsinks.defined() ? "dsinks returned without sinks" : "dsinks missing";
  if (m.empty() && !want.dsinks.empty())
    m = gradMismatch("dsinks", attention::toDoubles(got.dsinks), want.dsinks, dt);
  return m;
}

}  // namespace flextile::testing
