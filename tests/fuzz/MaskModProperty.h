// The property of random mask_mods, shared by the libFuzzer target (mask_mod_fuzzer.cpp) and the
// deterministic gtest (tests/attention/RandomMaskModsTest.cpp).
//
// A mask is a random tree of the mask algebra (and_masks, or_masks, not_mask of 1 to 3 operands,
// up to 3 deep) over random structural pieces, each with an independent plain-C++ reference:
// causal, a sliding window (one, or one per head from a captured [H] table), a prefix, documents
// (captured ids [L] or [B, L], or captured start offsets [D + 1] or [B, D + 1]), a per-head limit
// table [H], a per-(b, h) modulus table [B, H], a dense captured [Q_LEN, KV_LEN] table, index
// stripes, a rectangle, a shifted diagonal, noop_mask and the empty or_masks. Shapes are random:
// lengths 1..160 (rarely block multiples), blocks 16..128 a side, B 1..2 and Hq 1..4 with GQA
// (Hkv any divisor of Hq), the mask's B and H either the inputs' or 1 (broadcast; pieces that read
// b or h appear only where the mask has that dimension). In a quarter of the cases the inputs are
// one row of 1 to 4 packed sequences (PackedSequences, attention_templates/Varlen.h; empty ones
// too, the queries at the end of their keys where no sequence has more queries than keys): the
// random mask is then each sequence's inner mask at its own positions, the reference the packed
// definition (tests/attention/VarlenCheck.h), and the BlockMask the structural one or the generic
// builder's of the wrapped mod.
//
//   * createBlockMask on the host is exact against the reference (BlockMaskExactness.h): no block
//     with an allowed pair is empty, no block with a forbidden in-range pair is full, full blocks
//     are full, empty blocks empty, and toDense() equals the reference pair by pair;
//   * flex_attention through the interpreter (random q, k, v of f32, bf16 or f16, D 16 or 32,
//     outputs poisoned; the default config, or a random valid one of the prefill template, or of
//     the decode template for 16 queries or fewer) matches the float64 reference
//     (AttentionComparison.h): rows with no allowed key give exactly 0 and lse -inf; in a quarter
//     of the cases with attention sinks (a row without keys then has the sink's lse);
//   * flex_attention_backward on that forward's out and lse (the default config, or a random valid
//     one where the forward's was random) matches the float64 reference's dq, dk and dv, exactly 0
//     on rows without keys and keys no query sees, and dsinks with sinks.
#pragma once

#include <cstdint>
#include <string>

#include "Choices.h"

namespace flextile::fuzz {

struct MaskModOutcome {
  std::string broken;       // empty: the property holds; else what broke
  std::string description;  // the mask and the shapes, for the report
  int64_t emptyBlocks = 0, partialBlocks = 0, fullBlocks = 0;
  bool packed = false;  // the mask was the inner mask of packed sequences
};

MaskModOutcome checkMaskMod(Choices& choices);

}  // namespace flextile::fuzz
