// The out-of-line parts of ir/Elementwise.h: rounding that needs care, cmp
// predicates by name, and the one-element evaluation used by constant folding.
#include "ir/Elementwise.h"

#include <bit>
#include <limits>

namespace flextile::ir {

namespace {

// Round-to-odd to float: truncate, then set the last bit when inexact. A value
// rounded to odd with at least two extra bits and then rounded to nearest even
// to a narrower format gives the correctly rounded result, so double -> f16
// never suffers double rounding.
float toFloatRoundToOdd(double d) {
  float f = static_cast<float>(d);
  if (std::isnan(d) || static_cast<double>(f) == d) return f;
  if (std::isinf(f)) return std::copysign(std::numeric_limits<float>::max(), f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

float toFloatRoundToOdd(int64_t v) {
  uint64_t mag = v < 0 ? 0 - uint64_t(v) : uint64_t(v);
  if (mag < (uint64_t(1) << 24)) return static_cast<float>(v);
  int shift = 64 - std::countl_zero(mag) - 24;
  uint64_t kept = mag >> shift;
  if (mag & ((uint64_t(1) << shift) - 1)) kept |= 1;
  float f = std::ldexp(static_cast<float>(kept), shift);
  return v < 0 ? -f : f;
}

template <class Src>
float narrow(Src x, DType t) {
  if (t == DType::F32) return static_cast<float>(x);
  return roundToDType(toFloatRoundToOdd(x), t);
}

}  // namespace

float narrowToFloat(double v, DType t) { return narrow(v, t); }
float narrowToFloat(int64_t v, DType t) { return narrow(v, t); }

int64_t floatToInt(double x, DType t) {
  if (t == DType::I1) return x != 0;
  if (std::isnan(x)) return 0;
  double tr = std::trunc(x);
  int bits = bitWidth(t);
  double hi = std::ldexp(1.0, bits - 1);
  if (tr >= hi) return int64_t((uint64_t(1) << (bits - 1)) - 1);
  if (tr < -hi) return bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t(1) << (bits - 1));
  return int64_t(tr);
}

std::optional<ComparePredicate> parseComparePredicate(std::string_view p) {
  using P = ComparePredicate;
  if (p == "eq") return P::Eq;
  if (p == "ne") return P::Ne;
  if (p == "lt") return P::Lt;
  if (p == "le") return P::Le;
  if (p == "gt") return P::Gt;
  if (p == "ge") return P::Ge;
  return std::nullopt;
}

std::optional<double> evaluateFloatArithmetic(OpKind k, DType t, double a, double b) {
  if (!isFloat(t)) return std::nullopt;
  return elementwise::withArithmetic(k, [&](auto sem) -> std::optional<double> {
    using S = decltype(sem);
    if constexpr (!S::kOnFloats) {
      return std::nullopt;
    } else {
      auto apply = [&](auto x, auto y) {
        if constexpr (S::kOperands == 1) return S::onFloat(x);
        else return S::onFloat(x, y);
      };
      if (t == DType::F64) return apply(a, b);
      return double(roundToDType(apply(float(a), float(b)), t));
    }
  });
}

std::optional<int64_t> evaluateIntArithmetic(OpKind k, DType t, int64_t a, int64_t b) {
  if (!isInteger(t)) return std::nullopt;
  return elementwise::withArithmetic(k, [&](auto sem) -> std::optional<int64_t> {
    using S = decltype(sem);
    if constexpr (!S::kOnInts) {
      return std::nullopt;
    } else if constexpr (S::kOperands == 1) {
      return wrapToWidth(S::onInt(a, t), t);
    } else {
      if (S::kZeroDivisorIsError && b == 0) return std::nullopt;
      return wrapToWidth(S::onInt(a, b, t), t);
    }
  });
}

}  // namespace flextile::ir
