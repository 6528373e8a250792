// The scalar semantics of element-wise ops, each written once: the interpreter
// applies them to every element of a tile, constant folding (Canonicalize) and
// the axis analysis (codegen/AxisInfo.cpp) to constants, so what the compiler
// folds is what the semantic oracle computes. ir/Interpreter.h states the rules
// in prose; this file is their code.
//
// How values are held (as in the interpreter):
//   * integers as int64, sign-extended from their dtype (i1 as 0 or 1); an
//     arithmetic result is wrapped to the width afterwards (wrapToWidth);
//   * f16, bf16 and f32 as float, rounded once to the dtype after each op
//     (roundToDType); f64 as double.
//
// The arithmetic ops (FT_ARITHMETIC_OP in Ops.def) each have a Semantics<K>
// below. The static_asserts at the end of this file make a new arithmetic op
// without semantics, or with semantics that disagree with its table entry
// (operand count, kIntOnly, kFloatOnly), a compile error.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <type_traits>

#include "ir/IR.h"

namespace flextile::ir {

// ---- integers and float formats ----------------------------------------------

// Two's complement wrap of an int64-held value to t's width (i1: modulo 2).
inline int64_t wrapToWidth(int64_t v, DType t) {
  switch (t) {
    case DType::I1: return v & 1;
    case DType::I8: return int8_t(uint8_t(uint64_t(v)));
    case DType::I32: return int32_t(uint32_t(uint64_t(v)));
    default: return v;
  }
}

// A float-held value rounded to nearest even to f16 or bf16; f32 unchanged.
inline float roundToDType(float v, DType t) {
  if (t == DType::F16) return static_cast<float>(Eigen::half(v));
  if (t == DType::BF16) return static_cast<float>(Eigen::bfloat16(v));
  return v;
}

// A double or an int64 rounded once (never twice) to a float-held dtype.
float narrowToFloat(double v, DType t);
float narrowToFloat(int64_t v, DType t);

// The value of dtype t (any float dtype) nearest to v, as a double: what a
// constant or a cast to t holds.
inline double toFloatDType(double v, DType t) { return t == DType::F64 ? v : double(narrowToFloat(v, t)); }
inline double toFloatDType(int64_t v, DType t) { return t == DType::F64 ? double(v) : double(narrowToFloat(v, t)); }

// float -> integer cast: truncates toward zero and saturates to t's range,
// NaN gives 0; to i1 it is v != 0 (NaN gives 1).
int64_t floatToInt(double v, DType t);

// integer -> integer cast of an int64-held value: wraps to t; to i1 it is v != 0.
inline int64_t intToInt(int64_t v, DType t) { return t == DType::I1 ? int64_t(v != 0) : wrapToWidth(v, t); }

// ---- cmp ----------------------------------------------------------------------

enum class ComparePredicate : uint8_t { Eq, Ne, Lt, Le, Gt, Ge };
std::optional<ComparePredicate> parseComparePredicate(std::string_view pred);

// Signed for integers; ordered for floats (false with a NaN) except ne, which
// is unordered (true with a NaN).
template <ComparePredicate P, class T>
constexpr bool compareValues(T a, T b) {
  if constexpr (P == ComparePredicate::Eq) return a == b;
  else if constexpr (P == ComparePredicate::Ne) return !(a == b);
  else if constexpr (P == ComparePredicate::Lt) return a < b;
  else if constexpr (P == ComparePredicate::Le) return a <= b;
  else if constexpr (P == ComparePredicate::Gt) return a > b;
  else return a >= b;
}

// Calls f(std::integral_constant<ComparePredicate, P>{}) for the runtime p, so
// that a loop over elements is compiled once per predicate.
template <class F>
decltype(auto) withComparePredicate(ComparePredicate p, F&& f) {
  using P = ComparePredicate;
  switch (p) {
    case P::Eq: return f(std::integral_constant<P, P::Eq>{});
    case P::Ne: return f(std::integral_constant<P, P::Ne>{});
    case P::Lt: return f(std::integral_constant<P, P::Lt>{});
    case P::Le: return f(std::integral_constant<P, P::Le>{});
    case P::Gt: return f(std::integral_constant<P, P::Gt>{});
    case P::Ge: break;
  }
  return f(std::integral_constant<P, P::Ge>{});
}

// ---- arithmetic ops -----------------------------------------------------------

namespace elementwise {

// Semantics<K> of an arithmetic op K declares
//   kOperands              1 or 2, as in Ops.def
//   kOnFloats, kOnInts     which dtypes it is defined on (kIntOnly / kFloatOnly)
//   onFloat(a[, b])        T is float (f16/bf16/f32; the caller rounds to the
//                          dtype) or double (f64)
//   onInt(a[, b], t)       int64-held operands of dtype t; the caller wraps the
//                          result to t's width
//   kZeroDivisorIsError    onInt must not be called with b == 0: the
//                          interpreter reports an error, folding declines
template <OpKind K>
struct Semantics {
  static constexpr bool kDefined = false;
};

struct Unary {
  static constexpr bool kDefined = true;
  static constexpr int kOperands = 1;
  static constexpr bool kZeroDivisorIsError = false;
};
struct Binary {
  static constexpr bool kDefined = true;
  static constexpr int kOperands = 2;
  static constexpr bool kZeroDivisorIsError = false;
};
struct OnFloatsAndInts {
  static constexpr bool kOnFloats = true, kOnInts = true;
};
struct OnFloatsOnly {
  static constexpr bool kOnFloats = true, kOnInts = false;
};
struct OnIntsOnly {
  static constexpr bool kOnFloats = false, kOnInts = true;
};

inline uint64_t asUnsigned(int64_t v) { return uint64_t(v); }

// A shift amount, read as an unsigned number of t's width.
inline uint64_t shiftAmount(int64_t b, DType t) {
  int bits = bitWidth(t);
  return bits == 64 ? asUnsigned(b) : asUnsigned(b) & ((uint64_t(1) << bits) - 1);
}

template <>
struct Semantics<OpKind::Neg> : Unary, OnFloatsAndInts {
  template <class T> static T onFloat(T a) { return -a; }
  static int64_t onInt(int64_t a, DType) { return int64_t(0 - asUnsigned(a)); }
};
template <>
struct Semantics<OpKind::Not> : Unary, OnIntsOnly {
  static int64_t onInt(int64_t a, DType) { return ~a; }  // logical on i1 once wrapped
};
template <>
struct Semantics<OpKind::Abs> : Unary, OnFloatsAndInts {
  template <class T> static T onFloat(T a) { return std::fabs(a); }
  static int64_t onInt(int64_t a, DType) { return a < 0 ? int64_t(0 - asUnsigned(a)) : a; }  // abs(INT_MIN) wraps
};
// exp and exp2 of the 32-bit-and-narrower floats flush a subnormal result to +0, as the GPU's
// ex2.approx.ftz.f32 does (its non-ftz form costs a compare and two predicated multiplies around
// every MUFU.EX2: a third of the softmax's instructions). f64 keeps its subnormals.
template <class T>
T flushSubnormalExp(T r) {
  if constexpr (std::is_same_v<T, float>) return r < std::numeric_limits<float>::min() ? 0.0f : r;
  return r;
}
template <>
struct Semantics<OpKind::Exp> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return flushSubnormalExp(std::exp(a)); }
};
template <>
struct Semantics<OpKind::Exp2> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return flushSubnormalExp(std::exp2(a)); }
};
template <>
struct Semantics<OpKind::Log> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return std::log(a); }
};
template <>
struct Semantics<OpKind::Log2> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return std::log2(a); }
};
template <>
struct Semantics<OpKind::Tanh> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return std::tanh(a); }
};
template <>
struct Semantics<OpKind::Sqrt> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return std::sqrt(a); }
};
template <>
struct Semantics<OpKind::Rsqrt> : Unary, OnFloatsOnly {
  template <class T> static T onFloat(T a) { return T(1) / std::sqrt(a); }
};

template <>
struct Semantics<OpKind::Add> : Binary, OnFloatsAndInts {
  template <class T> static T onFloat(T a, T b) { return a + b; }
  static int64_t onInt(int64_t a, int64_t b, DType) { return int64_t(asUnsigned(a) + asUnsigned(b)); }
};
template <>
struct Semantics<OpKind::Sub> : Binary, OnFloatsAndInts {
  template <class T> static T onFloat(T a, T b) { return a - b; }
  static int64_t onInt(int64_t a, int64_t b, DType) { return int64_t(asUnsigned(a) - asUnsigned(b)); }
};
template <>
struct Semantics<OpKind::Mul> : Binary, OnFloatsAndInts {
  template <class T> static T onFloat(T a, T b) { return a * b; }
  static int64_t onInt(int64_t a, int64_t b, DType) { return int64_t(asUnsigned(a) * asUnsigned(b)); }
};
// Integer div and rem truncate toward zero (C); INT_MIN / -1 wraps to INT_MIN
// and INT_MIN % -1 is 0 instead of trapping. On floats div is IEEE and rem is
// fmod (the sign of the dividend).
template <>
struct Semantics<OpKind::Div> : Binary, OnFloatsAndInts {
  static constexpr bool kZeroDivisorIsError = true;
  template <class T> static T onFloat(T a, T b) { return a / b; }
  static int64_t onInt(int64_t a, int64_t b, DType) { return b == -1 ? int64_t(0 - asUnsigned(a)) : a / b; }
};
template <>
struct Semantics<OpKind::Rem> : Binary, OnFloatsAndInts {
  static constexpr bool kZeroDivisorIsError = true;
  template <class T> static T onFloat(T a, T b) { return std::fmod(a, b); }
  static int64_t onInt(int64_t a, int64_t b, DType) { return b == -1 ? 0 : a % b; }
};
// On floats: NaN propagates and -0 < +0 (IEEE 754-2019 maximum/minimum, PTX
// max.NaN/min.NaN). Signed on integers.
template <>
struct Semantics<OpKind::Maximum> : Binary, OnFloatsAndInts {
  template <class T> static T onFloat(T a, T b) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
    if (a == b) return std::signbit(a) ? b : a;
    return a > b ? a : b;
  }
  static int64_t onInt(int64_t a, int64_t b, DType) { return a > b ? a : b; }
};
template <>
struct Semantics<OpKind::Minimum> : Binary, OnFloatsAndInts {
  template <class T> static T onFloat(T a, T b) {
    if (std::isnan(a) || std::isnan(b)) return a + b;
    if (a == b) return std::signbit(a) ? a : b;
    return a < b ? a : b;
  }
  static int64_t onInt(int64_t a, int64_t b, DType) { return a < b ? a : b; }
};
template <>
struct Semantics<OpKind::And> : Binary, OnIntsOnly {
  static int64_t onInt(int64_t a, int64_t b, DType) { return a & b; }
};
template <>
struct Semantics<OpKind::Or> : Binary, OnIntsOnly {
  static int64_t onInt(int64_t a, int64_t b, DType) { return a | b; }
};
template <>
struct Semantics<OpKind::Xor> : Binary, OnIntsOnly {
  static int64_t onInt(int64_t a, int64_t b, DType) { return a ^ b; }
};
// Amounts >= the width give 0 for shl and the sign fill for shr (as PTX
// clamps); shr is arithmetic.
template <>
struct Semantics<OpKind::Shl> : Binary, OnIntsOnly {
  static int64_t onInt(int64_t a, int64_t b, DType t) {
    uint64_t s = shiftAmount(b, t);
    return s >= uint64_t(bitWidth(t)) ? 0 : int64_t(asUnsigned(a) << s);
  }
};
template <>
struct Semantics<OpKind::Shr> : Binary, OnIntsOnly {
  static int64_t onInt(int64_t a, int64_t b, DType t) {
    if (t == DType::I1) return a;  // the only bit is the sign bit
    uint64_t s = shiftAmount(b, t);
    return s >= uint64_t(bitWidth(t)) ? (a < 0 ? -1 : 0) : a >> s;  // a is sign-extended: arithmetic
  }
};

// Calls f(Semantics<K>{}) for the arithmetic op k; k must have kArithmetic.
template <class F>
decltype(auto) withArithmetic(OpKind k, F&& f) {
  switch (k) {
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) \
  case OpKind::Enum:                               \
    return f(Semantics<OpKind::Enum>{});
#include "ir/Ops.def"
    default: break;
  }
  throw Error("internal: op '" + std::string(opName(k)) + "' is not an arithmetic op", ErrorKind::Internal);
}

// Every arithmetic op of Ops.def has semantics, and they agree with its traits.
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits)                                                       \
  static_assert(Semantics<OpKind::Enum>::kDefined, "ir/Elementwise.h: no Semantics for the op " name);  \
  static_assert(Semantics<OpKind::Enum>::kOperands == (nops), "Semantics of " name ": operand count");   \
  static_assert(Semantics<OpKind::Enum>::kOnFloats == (((traits) & kIntOnly) == 0),                     \
                "Semantics of " name ": kOnFloats must match kIntOnly in Ops.def");                     \
  static_assert(Semantics<OpKind::Enum>::kOnInts == (((traits) & kFloatOnly) == 0),                     \
                "Semantics of " name ": kOnInts must match kFloatOnly in Ops.def");
#include "ir/Ops.def"

}  // namespace elementwise

// One element of the arithmetic op k on operands of dtype t, exactly as the
// interpreter computes it (float results rounded to t, integers wrapped to t),
// or nullopt where the interpreter stops with an error (an integer zero
// divisor) or the op is not defined on t. Operands are values of t (a float
// operand already rounded to t); b is ignored by unary ops.
std::optional<double> evaluateFloatArithmetic(OpKind k, DType t, double a, double b = 0);
std::optional<int64_t> evaluateIntArithmetic(OpKind k, DType t, int64_t a, int64_t b = 0);

}  // namespace flextile::ir
