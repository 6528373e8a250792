// exp2 on the FMA and integer pipes instead of the SFU (MUFU.EX2), for a share of a tile's
// registers: FlashAttention-4's remedy for a softmax whose exponentials, at 16 a clock per SM,
// take as long as the tensor cores' products of the step they belong to (docs/performance.md,
// "Exponentials off the SFU"). Opt-in: FLEXTILE_EXP2_EMULATION=N, or the function attribute
// exp2_emulation = N, computes every N-th register of an f32 exp2 tile so (N >= 2; 0 or 1: none).
//
// The method (x clamped to [-127, 128]; NaN stays NaN):
//   t = x + 1.5 * 2^23           rounds x to the nearest integer j, held in t's low mantissa bits
//   f = x - (t - 1.5 * 2^23)     in [-0.5, 0.5]
//   p = 1 + f (c1 + f (c2 + f (c3 + f c4)))   a degree-4 fit of 2^f (relative error 2.9e-6)
//   2^x = p * bits((t + 127) << 23)           the scale 2^j built in the exponent field: 0 for
//                                             j = -127 (x = -inf), inf for j = 128
// Results below 2^-126 (subnormal) come out 0, as ex2.approx.ftz.f32 flushes them; nothing the
// softmax sums can tell. One SFU instruction becomes ten FMA-pipe and two integer ones, so the share that pays is small:
// where the SFU and the issue slots balance. This header is the one definition: the lowering
// (codegen/LowerElementwise.cpp) emits exactly these operations, and exp2Emulated is the host
// mirror its test measures.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace flextile::ir {
class Function;
}

namespace flextile::codegen {

// N for `f`: FLEXTILE_EXP2_EMULATION=N when set (an integer), else its attribute exp2_emulation,
// else 0 (none).
int64_t exp2EmulationPeriod(const ir::Function& f);

// Whether `f`'s f32 exp2 (and exp) take ex2.approx.ftz.f32, which flushes subnormal results to 0
// (the interpreter's semantics), rather than ex2.approx.f32, around which ptxas adds a compare and
// two predicated multiplies per exponential: FLEXTILE_EXP2_FTZ=0/1 when set, else the function
// attribute exp2_ftz (default 1). The forward sets it to 0 where its warpgroups take turns on
// unoverlapped walks (measured slower with ftz there; FlexAttentionForward.cpp).
bool exp2FlushesSubnormals(const ir::Function& f);

// Relative least-squares-minimax fit of 2^f on [-0.5, 0.5] with p(0) = 1 (Lawson iterations over
// Chebyshev nodes), rounded to f32.
inline constexpr float kExp2Coefficients[4] = {0.6931241750717163f, 0.24024099111557007f, 0.055906444787979126f,
                                               0.009582845494151115f};
inline constexpr float kExp2RoundingMagic = 12582912.0f;  // 1.5 * 2^23
inline constexpr float kExp2Low = -127.0f, kExp2High = 128.0f;

inline float exp2Emulated(float x) {
  const float xc = std::isnan(x) ? x : std::fmin(std::fmax(x, kExp2Low), kExp2High);
  const float t = xc + kExp2RoundingMagic;
  const float f = xc - (t - kExp2RoundingMagic);
  float p = kExp2Coefficients[3];
  for (int i = 2; i >= 0; --i) p = std::fma(p, f, kExp2Coefficients[i]);
  p = std::fma(p, f, 1.0f);
  const float scale = std::bit_cast<float>((std::bit_cast<uint32_t>(t) + 127u) << 23);
  return p * scale;
}

}  // namespace flextile::codegen
