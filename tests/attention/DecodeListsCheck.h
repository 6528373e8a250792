// The check shared by the host and GPU tests of decodeBlockLists: a brute-force reference (the
// element mask evaluated pair by pair, classified per kv block over the step's queries) against
// the lists the kernel wrote.
#pragma once

#include <gtest/gtest.h>

#include <sstream>

#include "MaskTestUtil.h"
#include "attention_templates/DecodeLists.h"

namespace flextile::testing {

// What decodeBlockLists must list for the mask's row (b, h): blocks with some allowed pair (q in
// [q0, q0 + n), kv < kvLen) by `ref` at global positions, full when every such pair is allowed.
struct ExpectedRow {
  std::vector<int32_t> full, partial;
};
inline ExpectedRow expectedDecodeRow(const attention::BlockMask& m, const RefMask& ref, int64_t b, int64_t h,
                                     int64_t q0, int64_t n) {
  ExpectedRow row;
  for (int64_t c = 0; c < m.numKvBlocks(); ++c) {
    int64_t inRange = 0, allowed = 0;
    for (int64_t q = q0; q < q0 + n; ++q)
      for (int64_t kv = c * m.kvBlockSize(); kv < std::min((c + 1) * m.kvBlockSize(), m.kvLen()); ++kv) {
        ++inRange;
        allowed += ref(b, h, q, kv) ? 1 : 0;
      }
    if (allowed == inRange) row.full.push_back(int32_t(c));
    else if (allowed > 0) row.partial.push_back(int32_t(c));
  }
  return row;
}

inline std::string listText(const std::vector<int32_t>& v) {
  std::ostringstream s;
  s << "{";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "}";
  return s.str();
}

// Computes the lists in `space` and checks every row (counts, entries, zero padding) and the
// host-side bounds against the reference. Returns false after the first mismatching row.
inline bool expectDecodeListsExact(const attention::BlockMask& m, const RefMask& ref, int64_t q0, int64_t n,
                                   dsl::MemorySpace space, const std::string& context) {
  const std::string where = context + ", queries [" + std::to_string(q0) + ", " + std::to_string(q0 + n) + ")";
  attention::DecodeBlockLists lists = attention::decodeBlockLists(m, q0, n, space);
  EXPECT_EQ(lists.batch, m.batch()) << where;
  EXPECT_EQ(lists.heads, m.heads()) << where;
  EXPECT_EQ(lists.numKvBlocks, m.numKvBlocks()) << where;
  EXPECT_EQ(lists.fullNum.shape(), (dsl::Shape{m.batch(), m.heads()})) << where;
  EXPECT_EQ(lists.partialIndices.shape(), (dsl::Shape{m.batch(), m.heads(), m.numKvBlocks()})) << where;
  const auto fullNum = lists.fullNum.toHost<int32_t>(), partialNum = lists.partialNum.toHost<int32_t>();
  const auto fullIdx = lists.fullIndices.toHost<int32_t>(), partialIdx = lists.partialIndices.toHost<int32_t>();
  const int64_t nKv = m.numKvBlocks();
  bool anyFull = false, anyPartial = false;
  int64_t longest = 0;
  for (int64_t b = 0; b < m.batch(); ++b)
    for (int64_t h = 0; h < m.heads(); ++h) {
      const int64_t r = b * m.heads() + h;
      const ExpectedRow want = expectedDecodeRow(m, ref, b, h, q0, n);
      auto got = [&](const std::vector<int32_t>& num, const std::vector<int32_t>& idx) {
        const int32_t count = num[size_t(r)];
        if (count < 0 || count > nKv) return std::vector<int32_t>{-1, count};
        return std::vector<int32_t>(idx.begin() + r * nKv, idx.begin() + r * nKv + count);
      };
      const auto gotFull = got(fullNum, fullIdx), gotPartial = got(partialNum, partialIdx);
      if (gotFull != want.full || gotPartial != want.partial) {
        ADD_FAILURE() << where << ", row (b " << b << ", h " << h << "): full " << listText(gotFull) << " partial "
                      << listText(gotPartial) << ", expected full " << listText(want.full) << " partial "
                      << listText(want.partial) << "\n"
                      << m.picture(b, h);
        return false;
      }
      for (int64_t k = fullNum[size_t(r)]; k < nKv; ++k)
        if (fullIdx[size_t(r * nKv + k)] != 0) {
          ADD_FAILURE() << where << ": full padding of row " << r << " at " << k << " is not 0";
          return false;
        }
      for (int64_t k = partialNum[size_t(r)]; k < nKv; ++k)
        if (partialIdx[size_t(r * nKv + k)] != 0) {
          ADD_FAILURE() << where << ": partial padding of row " << r << " at " << k << " is not 0";
          return false;
        }
      anyFull |= !want.full.empty();
      anyPartial |= !want.partial.empty();
      longest = std::max<int64_t>(longest, int64_t(want.full.size() + want.partial.size()));
    }
  // The host bounds are bounds: never below what the device lists hold.
  EXPECT_GE(lists.maxLiveBlocks, longest) << where;
  EXPECT_LE(lists.maxLiveBlocks, nKv) << where;
  EXPECT_TRUE(!anyFull || lists.mayHaveFull) << where;
  EXPECT_TRUE(!anyPartial || lists.mayHavePartial) << where;
  return !::testing::Test::HasFailure();
}

}  // namespace flextile::testing

namespace flextile::testing {

// Query ranges of a decode step inside [first, end): counts 1, 2, 5 and 16 at the start, at the
// end, at a random place, and straddling every given row boundary.
inline std::vector<std::pair<int64_t, int64_t>> decodeRanges(std::mt19937_64& rng, int64_t first, int64_t end,
                                                             const std::vector<int64_t>& boundaries) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t n : {1, 2, 5, 16}) {
    if (n > end - first) continue;
    out.push_back({first, n});
    out.push_back({end - n, n});
    out.push_back({first + int64_t(rng() % uint64_t(end - first - n + 1)), n});
    for (int64_t boundary : boundaries)
      if (n > 1 && boundary - n / 2 >= first && boundary - n / 2 + n <= end) out.push_back({boundary - n / 2, n});
  }
  return out;
}

// The suite of decode cases, built with lists and captures in `space`; `scale` multiplies the
// largest lengths (the GPU runs longer contexts). Each mask is checked on every range.
inline void runDecodeListsSuite(std::mt19937_64& rng, dsl::MemorySpace space) {
  using namespace attention;
  const BlockSizes blocks{128, 128};
  auto rowBoundaries = [](const BlockMask& m) {
    std::vector<int64_t> v;
    for (int64_t r = 1; r < m.numQBlocks(); ++r) v.push_back(m.qOffset() - m.qPhase() + r * m.qBlockSize());
    return v;
  };
  auto all = [&](const BlockMask& m, const RefMask& ref, const std::string& name) {
    for (auto [q0, n] : decodeRanges(rng, m.qOffset(), m.qOffset() + m.qLen(), rowBoundaries(m)))
      if (!expectDecodeListsExact(m, ref, q0, n, space, name)) return false;
    return true;
  };
  for (int64_t kvLen : {1, 127, 128, 129, 4097}) {
    // Every query of a prebuilt square mask, plus a few past the keys (top-left causal: they see all).
    const int64_t qLen = kvLen + 40;
    const std::string lens = " Q_LEN=" + std::to_string(qLen) + " KV_LEN=" + std::to_string(kvLen);
    if (!all(causalBlockMask(1, 1, qLen, kvLen, blocks, space), refCausal(), "causal" + lens)) return;
    const int64_t w = kvLen > 1000 ? 300 : 50;
    if (!all(slidingWindowBlockMask(1, 1, qLen, kvLen, {w}, blocks, space), refWindow({w}),
             "window " + std::to_string(w) + lens))
      return;
    const int64_t p = kvLen / 2 + 1;
    if (!all(prefixLmBlockMask(1, 1, qLen, kvLen, p, blocks, space), refPrefix(p), "prefix " + std::to_string(p) + lens))
      return;
  }
  // Documents per batch, causal and not.
  {
    const int64_t L = 1000;
    std::vector<std::vector<int64_t>> offsets{{0, 100, 130, 350, 500, 1000}, {0, 260, 1000}};
    std::vector<std::vector<int32_t>> ids{idsFromOffsets(offsets[0], L), idsFromOffsets(offsets[1], L)};
    for (bool causal : {true, false}) {
      BlockMask m = documentBlockMask(2, 1, L, L, offsets, causal, blocks, space);
      RefMask ref = causal ? refAnd(refCausal(), refDocuments(ids)) : refDocuments(ids);
      if (!all(m, ref, causal ? "documents + causal, per batch" : "documents, per batch")) return;
    }
  }
  // Per-head windows (H = 3), the batch broadcast.
  {
    const std::vector<int64_t> windows{1, 130, 400};
    if (!all(slidingWindowBlockMask(1, 3, 777, 777, windows, blocks, space), refWindow(windows), "window per head"))
      return;
  }
  // A generic mask with a fully masked query: query 300 sees nothing (and 301 only its even keys).
  {
    MaskMod mod("holes", [](const dsl::Tile&, const dsl::Tile&, const dsl::Tile& q, const dsl::Tile& kv) {
      return (kv <= q) & (q != 300) & ((q != 301) | (kv % 2 == 0));
    });
    RefMask ref = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q != 300 && (q != 301 || kv % 2 == 0); };
    BlockMask m = createBlockMask(mod, 1, 1, 600, 600, blocks, space);
    for (auto [q0, n] : std::vector<std::pair<int64_t, int64_t>>{{300, 1}, {300, 2}, {299, 2}, {298, 5}})
      if (!expectDecodeListsExact(m, ref, q0, n, space, "holes")) return;
    // Nothing at all for the fully masked query.
    DecodeBlockLists lists = decodeBlockLists(m, 300, 1, space);
    EXPECT_EQ(lists.fullNum.toHost<int32_t>(), std::vector<int32_t>{0});
    EXPECT_EQ(lists.partialNum.toHost<int32_t>(), std::vector<int32_t>{0});
  }
  // Small blocks: 16 queries cover up to 3 block rows of 8.
  {
    BlockMask m = slidingWindowBlockMask(1, 2, 200, 200, {20}, {8, 16}, space);
    if (!all(m, refWindow({20}), "window 20, blocks 8 x 16")) return;
  }
  // Slices: rows of a prebuilt mask (qOffset at a row start), a one-row slice starting mid-row
  // (qPhase), and the slice of a slice.
  {
    const int64_t L = 1500, w = 200;
    BlockMask parent = slidingWindowBlockMask(1, 2, L, L, {w}, blocks, space);
    BlockMask rows = parent.sliceRows(3, 4);  // queries 384..895
    if (!all(rows, refWindow({w}), "slice rows 3..6")) return;
    const int64_t t = 1000 + int64_t(rng() % 10);
    BlockMask tail = parent.sliceRows(t / 128, 1, t, 1024 - t);  // from mid-row to the row's end
    EXPECT_NE(tail.qPhase(), 0);
    if (!all(tail, refWindow({w}), "one-row slice from " + std::to_string(t))) return;
    BlockMask again = tail.sliceRows(0, 1, t + 3, 5);
    if (!all(again, refWindow({w}), "slice of a slice from " + std::to_string(t + 3))) return;
  }
}

}  // namespace flextile::testing
