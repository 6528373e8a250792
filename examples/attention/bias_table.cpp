// A learned bias table read by score_mod: a per-head bias for each relative
// position kv - q, clipped to [-reach, reach] (as in T5 and Shaw et al.'s
// relative position representations), no mask.
//
//   score_mod(s, b, h, q, kv) = s + bias[h][clamp(kv - q, -reach, reach) + reach]
//
// The table is a captured f32 tensor [H, 2 * reach + 1]; the mod reads it at
// an index *computed* from the positions (a gather), and derives `reach`
// from the table's size, which is a run-time kernel parameter: a new table of
// another reach needs no recompile. (A dense [H, L, S] table is
// bias_table() in attention_templates/Mods.h; it reads L * S values per head.)
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "relative-position bias table (captured) read by score_mod, no mask";
  ex::Options opt = ex::parseOptions(argc, argv, "bias_table", summary,
                                     {{"reach", "relative distances beyond it share a bias (512; N/16 below N=8192)"}});
  const int64_t reach = opt.scaledParam("reach", 512);
  if (reach < 0) throw Error("--reach must not be negative");
  ex::printHeader(opt, summary, "reach " + std::to_string(reach) + ", biases uniform in [-2, 2)");
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t H = opt.H, N = opt.N, width = 2 * reach + 1;

  std::vector<float> table(size_t(H * width));
  std::uniform_real_distribution<float> u(-2, 2);
  for (float& x : table) x = u(rng);

  // 1. The score_mod. bias.size(1) is an i32 scalar parameter of the kernel;
  //    minimum / maximum clamp element-wise; bias(h, index) broadcasts the
  //    scalar head with the [BM, BN] index tile and gathers [BM, BN] values.
  CapturedTensor bias = capture(Tensor::fromHost(table, {H, width}, opt.space()), "relative_bias");
  ScoreMod relativeBias("relative_bias", [bias](const Tile& score, const Tile& b, const Tile& h, const Tile& q_idx,
                                                const Tile& kv_idx) {
    Tile reach = (bias.size(1) - 1) / 2;
    Tile distance = minimum(maximum(kv_idx - q_idx, -reach), reach);
    return score + bias(h, distance + reach);
  }, {bias});

  // 2. No mask: every block is full. The all-allowing BlockMask is passed
  //    explicitly so the timed calls below do not rebuild it each time.
  BlockMask everything = ex::buildTwice("createBlockMask(noop_mask()) (generic)", [&] {
    return createBlockMask(noop_mask(), 1, 1, N, N);
  });
  ex::printMask(everything);

  // 3. The call.
  FlexAttentionOptions options;
  options.return_lse = true;
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, relativeBias, everything, options);
  });

  // 4. The check, with the score_mod in plain C++ over the same table.
  RefScoreFn refScore = [&table, reach, width](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
    const int64_t distance = std::clamp(kv - q, -reach, reach);
    return s + double(table[size_t(h * width + distance + reach)]);
  };
  return ex::checkReportAndFinish(opt, in, result, relativeBias, everything, refScore, nullptr, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_bias_table: %s\n", e.what());
  return 1;
}
