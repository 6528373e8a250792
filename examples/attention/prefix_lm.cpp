// Prefix-LM attention: the first `prefix` positions (the prompt) are seen by
// every query, the rest causally (2048 in the DESIGN.md yardstick).
//
//   mask_mod(b, h, q, kv) = kv < prefix  or  kv <= q
//
// The prompt's queries see the whole prompt (bidirectional), later queries
// see the prompt and the keys up to themselves.
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "prefix LM: kv < prefix or kv <= q";
  ex::Options opt = ex::parseOptions(argc, argv, "prefix_lm", summary,
                                     {{"prefix", "length of the bidirectional prefix (2048; N/4 below N=8192)"}});
  const int64_t prefix = opt.scaledParam("prefix", kYardstickPrefix);
  if (prefix < 0) throw Error("--prefix must not be negative");
  ex::printHeader(opt, summary, "prefix " + std::to_string(prefix));
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t N = opt.N;

  // 1. The mask_mod: `|` of two i1 tiles is the logical or. (The same mod is
  //    or_masks(prefix-only mod, causal mod), see attention_templates/Mods.h.)
  MaskMod prefixLm("prefix_lm", [prefix](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return (kv_idx < prefix) | (q_idx >= kv_idx);
  });

  // 2. The BlockMask: generic and structural (row q sees keys
  //    [0, max(prefix - 1, q)], one interval).
  BlockMask mask = ex::buildTwice("createBlockMask(prefix_lm) (generic)", [&] {
    return createBlockMask(prefixLm, 1, 1, N, N);
  });
  BlockMask structural = ex::buildTwice("prefixLmBlockMask (structural)", [&] {
    return prefixLmBlockMask(1, 1, N, N, prefix);
  });
  ex::printMask(mask);
  ex::expectSameBlocks(mask, structural);

  // 3. The call.
  FlexAttentionOptions options;
  options.return_lse = true;
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, noop_score(), mask, options);
  });

  // 4. The check, with the mask in plain C++.
  RefMaskFn refMask = [prefix](int64_t, int64_t, int64_t q, int64_t kv) { return kv < prefix || kv <= q; };
  return ex::checkReportAndFinish(opt, in, result, noop_score(), mask, nullptr, refMask, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_prefix_lm: %s\n", e.what());
  return 1;
}
