// Soft-capping + causal (Gemma 2, Grok): scores squashed smoothly into
// (-cap, cap) before the softmax.
//
//   score_mod(s, b, h, q, kv) = cap * tanh(s / cap)
//   mask_mod(b, h, q, kv)     = kv <= q
//
// On the GPU tanh is tanh.approx.f32 (maximum relative error about 2^-11),
// far below what bf16 inputs resolve; the interpreter computes it exactly.
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "soft-cap + causal: cap * tanh(s / cap), kv <= q";
  ex::Options opt = ex::parseOptions(argc, argv, "softcap", summary, {{"cap", "the soft cap (20)"}});
  const double cap = opt.realParam("cap", kYardstickSoftCap);
  if (!(cap > 0) || !std::isfinite(cap)) throw Error("--cap must be a positive number");
  char capText[32];
  std::snprintf(capText, sizeof capText, "cap %g", cap);
  ex::printHeader(opt, summary, capText);
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t N = opt.N;

  // 1. The mods. A C++ number next to a tile adopts the tile's dtype (f32);
  //    multiplying by 1 / cap (a constant folded at trace time) is cheaper
  //    than a division per score.
  ScoreMod softCap("soft_cap", [cap](const Tile& score, const Tile& b, const Tile& h, const Tile& q_idx,
                                     const Tile& kv_idx) {
    return cap * tanh(score * (1.0 / cap));
  });
  MaskMod causal("causal", [](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return q_idx >= kv_idx;
  });

  // 2. The BlockMask: causal, generic and structural.
  BlockMask mask = ex::buildTwice("createBlockMask(causal) (generic)", [&] {
    return createBlockMask(causal, 1, 1, N, N);
  });
  BlockMask structural = ex::buildTwice("causalBlockMask (structural)", [&] { return causalBlockMask(1, 1, N, N); });
  ex::printMask(mask);
  ex::expectSameBlocks(mask, structural);

  // 3. The call.
  FlexAttentionOptions options;
  options.return_lse = true;
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, softCap, mask, options);
  });

  // 4. The check, with both mods in plain C++ (std::tanh in float64).
  RefMaskFn refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
  RefScoreFn refScore = [cap](double s, int64_t, int64_t, int64_t, int64_t) { return cap * std::tanh(s / cap); };
  return ex::checkReportAndFinish(opt, in, result, softCap, mask, refScore, refMask, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_softcap: %s\n", e.what());
  return 1;
}
