// Document masking + causal: sequences packed from several documents, each
// token attending causally within its own document only.
//
//   mask_mod(b, h, q, kv) = doc[b][q] == doc[b][kv]  and  kv <= q
//
// The document ids are a captured tensor: the mod reads doc_ids(b, q_idx),
// and the tensor becomes extra parameters of every kernel the mod is traced
// into (the BlockMask builder, the attention kernel). New ids — the next
// batch — need no retrace and no recompile: write them into the same tensor
// or rebind() the capture. The cuts differ per batch element, so the mask is
// built with B rows (not broadcast).
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "documents (ids captured) + causal: same document and kv <= q";
  ex::Options opt = ex::parseOptions(argc, argv, "document", summary,
                                     {{"docs", "documents per sequence, cut at random places (8)"}});
  const int64_t docs = opt.intParam("docs", kYardstickDocuments);
  if (docs < 1) throw Error("--docs must be at least 1");
  ex::printHeader(opt, summary, std::to_string(docs) + " documents per sequence at random cuts");
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);
  const int64_t B = opt.B, N = opt.N;

  // The documents: start offsets per batch element (for the structural
  // builder) and the id of every position (for the mod), i32 [B, N].
  std::vector<std::vector<int64_t>> offsets;
  std::vector<int32_t> ids(size_t(B * N));
  for (int64_t b = 0; b < B; ++b) {
    offsets.push_back(randomDocumentOffsets(N, int(docs), opt.seed + uint64_t(b)));
    for (size_t d = 0; d + 1 < offsets.back().size(); ++d)
      for (int64_t i = offsets.back()[d]; i < offsets.back()[d + 1]; ++i) ids[size_t(b * N + i)] = int32_t(d);
  }

  // 1. The captured tensor, where the kernels run (device or host), and the
  //    mods. A capture read with index tiles gives 0 outside [0, size): tail
  //    lanes past N read nothing (the template discards them anyway). The
  //    MaskMod lists what it captures.
  CapturedTensor docIds = capture(Tensor::fromHost(ids, {B, N}, opt.space()), "doc_ids");
  MaskMod sameDocument("same_document", [docIds](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return docIds(b, q_idx) == docIds(b, kv_idx);  // [BM, 1] == [1, BN] broadcasts to [BM, BN]
  }, {docIds});
  MaskMod causal("causal", [](const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
    return q_idx >= kv_idx;
  });
  MaskMod documentCausal = and_masks(sameDocument, causal);  // captures are merged

  // 2. The BlockMask, B rows (one per batch element's cuts), H = 1. The
  //    generic builder runs where the captured ids live; the structural one
  //    takes the offsets and computes each row's interval.
  BlockMask mask = ex::buildTwice("createBlockMask(document & causal) (generic)", [&] {
    return createBlockMask(documentCausal, B, 1, N, N);
  });
  BlockMask structural = ex::buildTwice("documentBlockMask (structural)", [&] {
    return documentBlockMask(B, 1, N, N, offsets, /*causal=*/true, {}, opt.space());
  });
  ex::printMask(mask);
  ex::expectSameBlocks(mask, structural);

  // 3. The call.
  FlexAttentionOptions options;
  options.return_lse = true;
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, noop_score(), mask, options);
  });

  // 4. The check, with the mask in plain C++ over the same ids.
  RefMaskFn refMask = [&ids, N](int64_t b, int64_t, int64_t q, int64_t kv) {
    return kv <= q && ids[size_t(b * N + q)] == ids[size_t(b * N + kv)];
  };
  return ex::checkReportAndFinish(opt, in, result, noop_score(), mask, nullptr, refMask, rng);
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_document: %s\n", e.what());
  return 1;
}
