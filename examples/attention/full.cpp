// Full attention: no mask, no score_mod — every query sees every key.
//
// There is no mod to write: flex_attention without a BlockMask allows every
// pair, and without a score_mod uses the scores as they are. The same thing
// as an explicit BlockMask is createBlockMask(noop_mask(), ...): every block
// full, so no block pays for mask_mod. There is no structural builder to
// compare with (nothing to compute), so the example checks that the explicit
// mask lists every block as full and gives bit-identical output.
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "full attention: no mask, no score_mod";
  ex::Options opt = ex::parseOptions(argc, argv, "full", summary);
  ex::printHeader(opt, summary);
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t N = opt.N;

  // 1. The call without a mask: q [B, H, N, D], k and v [B, Hkv, N, D].
  FlexAttentionOptions options;
  options.return_lse = true;  // log-sum-exp per query row, natural log
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, noop_score(), std::nullopt, options);
  });

  // 2. The same with an explicit all-allowing BlockMask. Pass one when
  //    calling repeatedly: without it flex_attention makes the all-full lists
  //    again on every call.
  BlockMask everything = ex::buildTwice("createBlockMask(noop_mask()) (generic)", [&] {
    return createBlockMask(noop_mask(), 1, 1, N, N);
  });
  ex::printMask(everything);
  if (everything.numPartialBlocks() != 0 ||
      everything.numFullBlocks() != everything.numQBlocks() * everything.numKvBlocks())
    throw Error("noop_mask() should make every block full: " + everything.describe());
  FlexAttentionResult again = flex_attention(in.q, in.k, in.v, noop_score(), everything, options);
  const bool identical = toDoubles(again.out) == toDoubles(result.out);
  std::printf("  with the explicit all-full BlockMask the output is %s\n",
              identical ? "bit-identical" : "DIFFERENT (FAILED)");

  // 3. The check: an empty reference mask and score mean "everything" and
  //    "the identity".
  return ex::checkReportAndFinish(opt, in, result, noop_score(), everything, nullptr, nullptr, rng, identical);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_full: %s\n", e.what());
  return 1;
}
