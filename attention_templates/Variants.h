// Named attention variants: a score_mod, a BlockMask and their float64
// reference mods, made for given sizes. The seven yardstick variants of
// DESIGN.md and a bias-table variant are built in; users add their own with
// FLEXTILE_REGISTER_VARIANT in their own C++ file (the `flextile` CLI, the
// bench and the examples all read this registry).
//
//   FLEXTILE_REGISTER_VARIANT(my_window, "sliding window 256 + causal", [](const VariantInputs& in) {
//     VariantInstance v;
//     v.mask = slidingWindowBlockMask(1, 1, in.L, in.S, {256}, in.blocks, in.space);
//     v.refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < 256; };
//     return v;
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/Mods.h"
#include "attention_templates/Reference.h"

namespace flextile::attention {

struct VariantInputs {
  int64_t B = 1, H = 1, L = 128, S = 128;  // H: query heads
  dsl::MemorySpace space = dsl::MemorySpace::Host;  // where captured tensors and mask lists live
  BlockSizes blocks{};
  uint64_t seed = 1;  // for variants with random data (document cuts, bias tables)
  // Document start offsets per batch (0 = o_0 < ... < o_D = L) for the
  // document variant; empty: random cuts from `seed`.
  std::vector<std::vector<int64_t>> documentOffsets;
};

struct VariantInstance {
  ScoreMod score = noop_score();
  std::optional<BlockMask> mask;  // empty: every pair allowed
  RefScoreFn refScore;            // empty: identity
  RefScoreGradFn refScoreGrad;    // d refScore / d s; empty: 1 (identity, or a score plus a constant)
  RefMaskFn refMask;              // empty: every pair allowed
  std::string parameters;         // "window 1024", for reports
};

struct Variant {
  std::string name;
  std::string description;
  std::function<VariantInstance(const VariantInputs&)> make;
};

// All registered variants, in registration order (the built-ins first): a copy, so that a
// registration on another thread cannot change the list under the caller's loop.
std::vector<Variant> variants();
// The variant called `name`; an unknown name is an error listing the known ones.
const Variant& variant(const std::string& name);
// Adds a variant; a duplicate name is an error. Returns true (for the macro).
bool registerVariant(Variant v);

#define FLEXTILE_REGISTER_VARIANT(ident, description, ...)                                              \
  static const bool flextile_variant_registered_##ident [[maybe_unused]] =                              \
      ::flextile::attention::registerVariant(::flextile::attention::Variant{#ident, description, __VA_ARGS__})

// Document cuts the yardstick uses: `docs` documents per sequence at random
// cut points (seeded), as start offsets 0 = o_0 < ... < o_D = L.
std::vector<int64_t> randomDocumentOffsets(int64_t L, int docs, uint64_t seed);

// The yardstick's parameters (DESIGN.md).
constexpr int64_t kYardstickWindow = 1024;
constexpr int64_t kYardstickPrefix = 2048;
constexpr int kYardstickDocuments = 8;
constexpr double kYardstickSoftCap = 20.0;

}  // namespace flextile::attention
