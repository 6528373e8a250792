// Sliding-window attention: each query sees itself and the window - 1 keys
// before it (1024 in the DESIGN.md yardstick).
//
//   mask_mod(b, h, q, kv) = kv <= q  and  q - kv < window
//
// The window is a C++ number here, so it is a constant in the traced IR (a
// new window is a new kernel). A window that changes between calls, or one
// per head, is a captured tensor instead: sliding_window_mask(CapturedTensor)
// in attention_templates/Mods.h reads it as w(h).
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "sliding window: kv <= q and q - kv < window";
  ex::Options opt = ex::parseOptions(argc, argv, "sliding_window", summary,
                                     {{"window", "keys each query sees, itself included (1024; N/8 below N=8192)"}});
  const int64_t window = opt.scaledParam("window", kYardstickWindow);
  if (window < 1) throw Error("--window must be at least 1");
  ex::printHeader(opt, summary, "window " + std::to_string(window));
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t N = opt.N;

  // 1. The mask_mod over a [BM, 1] tile of query positions and a [1, BN]
  //    tile of key positions: `&` of two i1 tiles is the logical and.
  MaskMod slidingWindow("sliding_window", [window](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return (q_idx >= kv_idx) & (q_idx - kv_idx < window);
  });

  // 2. The BlockMask: generic (the mod, block by block) and structural (each
  //    row's key interval [q - window + 1, q], no evaluation). Only the
  //    diagonal block and the far edge of the window are partial.
  BlockMask mask = ex::buildTwice("createBlockMask(sliding_window) (generic)", [&] {
    return createBlockMask(slidingWindow, 1, 1, N, N);
  });
  BlockMask structural = ex::buildTwice("slidingWindowBlockMask (structural)", [&] {
    return slidingWindowBlockMask(1, 1, N, N, {window});
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
  RefMaskFn refMask = [window](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < window; };
  return ex::checkReportAndFinish(opt, in, result, noop_score(), mask, nullptr, refMask, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_sliding_window: %s\n", e.what());
  return 1;
}
