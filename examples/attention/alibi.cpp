// ALiBi + causal: a per-head linear penalty on the distance to the key,
// with the per-head slopes captured.
//
//   score_mod(s, b, h, q, kv) = s + slope[h] * (kv - q)      (kv - q <= 0 under the causal mask)
//   mask_mod(b, h, q, kv)     = kv <= q
//
// slope[h] = 2^(-8 (h + 1) / H), the geometric sequence of the ALiBi paper.
// Under GQA the mods receive the query head, so there are H (query) slopes.
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "ALiBi (per-head slopes captured) + causal: s + slope[h] * (kv - q), kv <= q";
  ex::Options opt = ex::parseOptions(argc, argv, "alibi", summary);
  ex::printHeader(opt, summary);
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t H = opt.H, N = opt.N;

  std::vector<float> slopeValues(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) slopeValues[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(H));

  // 1. The score_mod. `score` is the f32 [BM, BN] tile of scaled scores
  //    (q·k / sqrt(D)); it must return a float tile that broadcasts to it.
  //    slopes(h) reads one f32 per program (h is a scalar); the positions are
  //    i32, so the distance is converted before the multiply.
  CapturedTensor slopes = capture(Tensor::fromHost(slopeValues, {H}, opt.space()), "alibi_slopes");
  ScoreMod alibiBias("alibi", [slopes](const Tile& score, const Tile& b, const Tile& h, const Tile& q_idx,
                                       const Tile& kv_idx) {
    return score + slopes(h) * (kv_idx - q_idx).to(DType::F32);
  }, {slopes});
  MaskMod causal("causal", [](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return q_idx >= kv_idx;
  });

  // 2. The BlockMask: the mask does not depend on the score_mod, so it is the
  //    causal one (generic and structural).
  BlockMask mask = ex::buildTwice("createBlockMask(causal) (generic)", [&] {
    return createBlockMask(causal, 1, 1, N, N);
  });
  BlockMask structural = ex::buildTwice("causalBlockMask (structural)", [&] { return causalBlockMask(1, 1, N, N); });
  ex::printMask(mask);
  ex::expectSameBlocks(mask, structural);

  // 3. The call: the score_mod is inlined into the kernel, in full and
  //    partial blocks alike; the slopes become kernel parameters.
  FlexAttentionOptions options;
  options.return_lse = true;
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, alibiBias, mask, options);
  });

  // 4. The check, with both mods in plain C++.
  RefMaskFn refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
  RefScoreFn refScore = [&slopeValues](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s + double(slopeValues[size_t(h)]) * double(kv - q);
  };
  return ex::checkReportAndFinish(opt, in, result, alibiBias, mask, refScore, refMask, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_alibi: %s\n", e.what());
  return 1;
}
