// Causal attention: each query sees itself and the keys before it.
//
//   mask_mod(b, h, q, kv) = kv <= q
//
// Shows the three steps of every variant: write the mod over DSL tiles, build
// the BlockMask (here with the generic builder, which runs the mod block by
// block, and with the structural causalBlockMask, which computes the same
// lists from interval end-points), and call flex_attention. The result is
// checked against a float64 reference whose mask is plain C++.
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "causal: each query sees the keys up to itself (kv <= q)";
  ex::Options opt = ex::parseOptions(argc, argv, "causal", summary);
  ex::printHeader(opt, summary);
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t N = opt.N;

  // 1. The mask_mod. b and h are i32 scalars, q_idx an i32 [BM, 1] tile and
  //    kv_idx an i32 [1, BN] tile of global positions: one call decides a
  //    whole [BM, BN] tile of pairs, and must return i1.
  MaskMod causal("causal", [](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return q_idx >= kv_idx;
  });

  // 2. The BlockMask. B = H = 1: the same mask serves every batch and head.
  //    The generic builder evaluates the mod on the GPU (or the interpreter);
  //    the structural builder needs no evaluation at all.
  BlockMask mask = ex::buildTwice("createBlockMask(causal) (generic)", [&] {
    return createBlockMask(causal, 1, 1, N, N);
  });
  BlockMask structural = ex::buildTwice("causalBlockMask (structural)", [&] { return causalBlockMask(1, 1, N, N); });
  ex::printMask(mask);
  ex::expectSameBlocks(mask, structural);

  // 3. The call: q [B, H, N, D], k and v [B, Hkv, N, D] (GQA when Hkv < H).
  //    The options default to scale 1/sqrt(D), no LSE and the default tile
  //    config (BLOCK_M and BLOCK_N must divide the mask's 128 x 128 blocks).
  FlexAttentionOptions options;
  options.return_lse = true;  // log-sum-exp per query row, natural log
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, noop_score(), mask, options);
  });

  // 4. The check, with the mask written again in plain C++.
  RefMaskFn refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
  return ex::checkReportAndFinish(opt, in, result, noop_score(), mask, nullptr, refMask, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_causal: %s\n", e.what());
  return 1;
}
