// Your own attention variants in the `flextile` tool: register them in a C++
// file of yours and link it with the `flextile_main` library, which provides
// main(). The resulting program is the whole tool — list, run, autotune,
// compile, bench, blockmask — with your variants next to the built-ins:
//
//   add_executable(my_flextile user_variant_cli.cpp)
//   target_link_libraries(my_flextile PRIVATE FlexTile::flextile_main)   # find_package(FlexTile) or in-tree
//
//   ./my_flextile list
//   ./my_flextile run local_256 --shape 1,2,512,64 --check        # interpreter without a GPU
//   ./my_flextile compile tanh_cap_30 --emit ptx --target sm_80
//   ./my_flextile autotune local_256 --shape 2,16,8192,128       # on a GPU
//
// A variant makes its score_mod, its BlockMask and float64 reference mods
// (for run --check) for the requested sizes.
#include <cmath>

#include "attention_templates/Variants.h"

using namespace flextile::attention;

// Sliding window of 256 keys, causal.
FLEXTILE_REGISTER_VARIANT(local_256, "sliding window 256 + causal (a user variant)", [](const VariantInputs& in) {
  VariantInstance v;
  v.mask = slidingWindowBlockMask(1, 1, in.L, in.S, {256}, in.blocks, in.space);
  v.refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < 256; };
  v.parameters = "window 256";
  return v;
});

// A soft cap of 30 on the scores, no mask.
FLEXTILE_REGISTER_VARIANT(tanh_cap_30, "soft-cap 30, no mask (a user variant)", [](const VariantInputs&) {
  VariantInstance v;
  v.score = soft_cap(30.0);
  v.refScore = [](double s, int64_t, int64_t, int64_t, int64_t) { return 30.0 * std::tanh(s / 30.0); };
  v.parameters = "cap 30";
  return v;
});
