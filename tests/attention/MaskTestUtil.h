// Helpers of the attention tests: element-wise reference masks written as
// plain C++ (independent of the DSL), and the exactness check of a BlockMask
// against such a reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "BlockMaskExactness.h"
#include "attention_templates/BlockMask.h"
#include "attention_templates/Variants.h"
#include "dsl/Capture.h"

namespace flextile::testing {

inline RefMask refCausal() {
  return [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
}
inline RefMask refWindow(std::vector<int64_t> perHead) {
  return [perHead](int64_t, int64_t h, int64_t q, int64_t kv) {
    int64_t w = perHead.size() == 1 ? perHead[0] : perHead[size_t(h)];
    return kv <= q && q - kv < w;
  };
}
inline RefMask refPrefix(int64_t p) {
  return [p](int64_t, int64_t, int64_t q, int64_t kv) { return kv < p || kv <= q; };
}
// ids[b][position] (one row broadcasts over b).
inline RefMask refDocuments(std::vector<std::vector<int32_t>> ids) {
  return [ids](int64_t b, int64_t, int64_t q, int64_t kv) {
    const auto& row = ids.size() == 1 ? ids[0] : ids[size_t(b)];
    return row[size_t(q)] == row[size_t(kv)];
  };
}
inline RefMask refAnd(RefMask a, RefMask b) {
  return [a, b](int64_t bb, int64_t h, int64_t q, int64_t kv) { return a(bb, h, q, kv) && b(bb, h, q, kv); };
}
inline RefMask refOr(RefMask a, RefMask b) {
  return [a, b](int64_t bb, int64_t h, int64_t q, int64_t kv) { return a(bb, h, q, kv) || b(bb, h, q, kv); };
}
inline RefMask refNot(RefMask a) {
  return [a](int64_t bb, int64_t h, int64_t q, int64_t kv) { return !a(bb, h, q, kv); };
}

// Document ids of positions [0, L) for documents starting at `offsets`.
inline std::vector<int32_t> idsFromOffsets(const std::vector<int64_t>& offsets, int64_t L) {
  std::vector<int32_t> ids(static_cast<size_t>(L));
  for (size_t d = 0; d + 1 < offsets.size(); ++d)
    for (int64_t i = offsets[d]; i < std::min(offsets[d + 1], L); ++i) ids[size_t(i)] = int32_t(d);
  return ids;
}

// Mask algebra for the attention tests: and/or/not of standard masks, of
// captured document ids (B rows of `len` positions, `docs` documents each,
// captured in `space`) and of a mask that depends on b and h (each (b, h) has
// its own lists). `scale` stretches the window and prefix lengths and the
// per-head slack of the striped mask, so one list serves short host tests
// and long GPU tests.
struct MaskCombo {
  std::string name;
  attention::MaskMod mod;
  RefMask ref;
  int64_t maskB, maskH;  // the BlockMask's batch and heads (1: broadcast)
};
inline std::vector<MaskCombo> maskAlgebraCombos(std::mt19937_64& rng, int64_t B, int64_t Hq, int64_t len, int docs,
                                                dsl::MemorySpace space, int64_t scale) {
  using namespace attention;
  std::vector<std::vector<int32_t>> ids;
  std::vector<int32_t> flat;
  for (int64_t b = 0; b < B; ++b) {
    ids.push_back(idsFromOffsets(randomDocumentOffsets(len, docs, rng()), len));
    flat.insert(flat.end(), ids.back().begin(), ids.back().end());
  }
  dsl::CapturedTensor docIds = dsl::capture(dsl::Tensor::fromHost(flat, {B, len}, space), "document_ids");
  const int64_t slack = 10 * scale, prefix = 10 * scale, window = 8 * scale, wide = 30 * scale;
  MaskMod striped("striped", [slack](const dsl::Tile& b, const dsl::Tile& h, const dsl::Tile& q, const dsl::Tile& kv) {
    return ((kv + b * 7 + h * 13) % 5 != 0) & (kv <= q + h * slack);
  });
  RefMask refStriped = [slack](int64_t b, int64_t h, int64_t q, int64_t kv) {
    return (kv + b * 7 + h * 13) % 5 != 0 && kv <= q + h * slack;
  };
  const std::string p = std::to_string(prefix), w = std::to_string(window), ww = std::to_string(wide);
  return {
      {"causal & documents", and_masks(causal_mask(), document_mask(docIds)), refAnd(refCausal(), refDocuments(ids)),
       B, 1},
      {"prefix " + p + " | window " + w, or_masks(prefix_lm_mask(prefix), sliding_window_mask(window)),
       refOr(refPrefix(prefix), refWindow({window})), 1, 1},
      {"window " + ww + " | documents", or_masks(sliding_window_mask(wide), document_mask(docIds)),
       refOr(refWindow({wide}), refDocuments(ids)), B, 1},
      {"!causal & documents", and_masks(not_mask(causal_mask()), document_mask(docIds)),
       refAnd(refNot(refCausal()), refDocuments(ids)), B, 1},
      {"striped per (b, h)", striped, refStriped, B, Hq},
      {"striped & prefix " + std::to_string(2 * prefix) + " per (b, h)", and_masks(striped, prefix_lm_mask(2 * prefix)),
       refAnd(refStriped, refPrefix(2 * prefix)), B, Hq},
  };
}

// Checks that `m` is exact against `ref` (blockMaskMismatch, BlockMaskExactness.h); returns false
// after reporting the first mismatch with `context`.
inline bool expectExact(const attention::BlockMask& m, const RefMask& ref, const std::string& context,
                        bool exactPartial = true) {
  const std::string mismatch = blockMaskMismatch(m, ref, exactPartial);
  if (mismatch.empty()) return true;
  ADD_FAILURE() << context << ": " << mismatch;
  return false;
}

// The four list pairs of two masks are identical.
inline bool expectSameLists(const attention::BlockMask& a, const attention::BlockMask& b, const std::string& context) {
  auto same = [&](const attention::BlockLists& x, const attention::BlockLists& y, const char* name) {
    if (x.num == y.num && x.indices == y.indices) return true;
    ADD_FAILURE() << context << ": the " << name << " lists differ\n" << a.picture() << b.picture();
    return false;
  };
  return same(a.partialKv(), b.partialKv(), "partial kv") && same(a.fullKv(), b.fullKv(), "full kv") &&
         same(a.partialQ(), b.partialQ(), "partial q") && same(a.fullQ(), b.fullQ(), "full q");
}

// EXPECT that `f` throws flextile::Error whose message contains every one of `parts`.
template <class F>
void expectError(F&& f, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << parts[0] << "'";
  } catch (const flextile::Error& e) {
    std::string what = e.what();
    for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << "message: " << what << "\nmissing: " << p;
  }
}

// Masks with rows that see no key, for the fully-masked-row tests: every third query row blind
// (causal otherwise), and the first 40 rows blind (each row sees the keys 40 or more behind it).
struct BlindRowMasks {
  attention::MaskMod everyThird, first40;
  RefMask refEveryThird, refFirst40;
};
inline BlindRowMasks blindRowMasks() {
  using dsl::Tile;
  return {attention::MaskMod("every_third_row_blind",
                             [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q % 3 != 0) & (kv <= q); }),
          attention::MaskMod("first_40_rows_blind",
                             [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q >= 40) & (kv <= q - 40); }),
          [](int64_t, int64_t, int64_t q, int64_t kv) { return q % 3 != 0 && kv <= q; },
          [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 40 && kv <= q - 40; }};
}

// The registered variants' names, in order: the parameters of the tests that run one test a
// variant (INSTANTIATE_TEST_SUITE_P(EveryVariant, Suite, ValuesIn(variantNames()), variantParamName)),
// so that the GPU suite's shards share them.
inline std::vector<std::string> variantNames() {
  std::vector<std::string> names;
  for (const attention::Variant& v : attention::variants()) names.push_back(v.name);
  return names;
}
inline std::string variantParamName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

}  // namespace flextile::testing
