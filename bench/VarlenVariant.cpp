// The benches' "varlen" variant (not a built-in: the test matrices that loop over every variant
// stay as they are): the document variant's causal documents as packed sequences
// (attention_templates/Varlen.h), whose mods read per-row tables instead of a document id per key.
// Every batch row packs the same sequences, batch 0's cuts (PackedSequences packs one row), so run
// it beside `document` with one offset list, or read its TFLOP/s (counted from its own mask)
// against the document variant's.
#include "attention_templates/Varlen.h"
#include "attention_templates/Variants.h"

namespace flextile::attention {

FLEXTILE_REGISTER_VARIANT(varlen, "batch 0's document cuts as packed sequences (Varlen.h), causal within each",
                          [](const VariantInputs& in) {
  if (in.L != in.S) throw Error("varlen variant: give equal query and key lengths, got " + std::to_string(in.L) +
                                " and " + std::to_string(in.S));
  const std::vector<int64_t> cuts = in.documentOffsets.empty()
                                        ? randomDocumentOffsets(in.L, kYardstickDocuments, in.seed)
                                        : in.documentOffsets[0];
  if (cuts.size() < 2 || cuts.front() != 0 || cuts.back() != in.L)
    throw Error("varlen variant: the offsets must run from 0 to the length " + std::to_string(in.L));
  std::vector<int64_t> lengths;
  for (size_t d = 0; d + 1 < cuts.size(); ++d) lengths.push_back(cuts[d + 1] - cuts[d]);
  PackedSequences seqs = PackedSequences::fromLengths(lengths, {}, {.space = in.space});
  VariantInstance r;
  r.mask = seqs.blockMask(causal_mask(), 1, in.blocks);
  r.refMask = [cuts](int64_t, int64_t, int64_t q, int64_t kv) {
    const auto start = *(std::upper_bound(cuts.begin(), cuts.end(), q) - 1);
    return kv <= q && kv >= start;
  };
  r.parameters = std::to_string(lengths.size()) + " packed sequences";
  return r;
});

}  // namespace flextile::attention
