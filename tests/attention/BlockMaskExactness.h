// The exactness check of a BlockMask against an element-wise reference mask, without gtest: the
// attention tests (MaskTestUtil.h's expectExact) and the mask_mod fuzzer
// (tests/fuzz/MaskModProperty.cpp) share it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/BlockMask.h"

namespace flextile::testing {

// allowed(b, h, q, kv) at global positions.
using RefMask = std::function<bool(int64_t b, int64_t h, int64_t q, int64_t kv)>;

// Checks, for every (b, h, block) and every (b, h, i, j) of the mask, that
//   * the lists are consistent (check());
//   * the block state is exact against `ref`: empty iff no in-range pair is
//     allowed, full iff every in-range pair is, partial otherwise;
//   * toDense() equals `ref` element by element.
// Queries are at global positions qOffset() + i. A slice may keep a partial
// block in which its own queries have no allowed pair (sound, not exact):
// `exactPartial = false` accepts that. Returns the first mismatch, "" when
// there is none.
inline std::string blockMaskMismatch(const attention::BlockMask& m, const RefMask& ref, bool exactPartial = true) {
  using attention::BlockState;
  try {
    m.check();
  } catch (const std::exception& e) {
    return std::string("check() failed: ") + e.what();
  }
  const int64_t B = m.batch(), H = m.heads(), Q = m.qLen(), KV = m.kvLen();
  const int64_t BQ = m.qBlockSize(), BKV = m.kvBlockSize(), off = m.qOffset(), phase = m.qPhase();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < m.numQBlocks(); ++r)
        for (int64_t c = 0; c < m.numKvBlocks(); ++c) {
          int64_t inRange = 0, allowed = 0;
          for (int64_t i = std::max<int64_t>(r * BQ - phase, 0); i < std::min<int64_t>((r + 1) * BQ - phase, Q); ++i)
            for (int64_t j = c * BKV; j < std::min<int64_t>((c + 1) * BKV, KV); ++j) {
              ++inRange;
              allowed += ref(b, h, off + i, j) ? 1 : 0;
            }
          BlockState want = allowed == 0 ? BlockState::Empty : allowed == inRange ? BlockState::Full : BlockState::Partial;
          BlockState got = m.state(b, h, r, c);
          if (!exactPartial && got == BlockState::Partial) continue;
          if (got != want) {
            std::ostringstream os;
            os << "block (b " << b << ", h " << h << ", q block " << r << ", kv block " << c
                          << ") is " << int(got) << " but " << allowed << " of " << inRange
                          << " in-range pairs are allowed (0 empty, 1 partial, 2 full)\n"
                          << m.picture(b, h);
            return os.str();
          }
        }
  const std::vector<uint8_t> dense = m.toDense();
  if (dense.size() != size_t(B * H * Q * KV)) {
    return "toDense() has " + std::to_string(dense.size()) + " elements";
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Q; ++i)
        for (int64_t j = 0; j < KV; ++j) {
          bool got = dense[size_t(((b * H + h) * Q + i) * KV + j)] != 0, want = ref(b, h, off + i, j);
          if (got != want) {
            std::ostringstream os;
            os << "toDense()[b " << b << ", h " << h << ", q " << i << ", kv " << j
                          << "] is " << got << ", the reference says " << want;
            return os.str();
          }
        }
  return "";
}

}  // namespace flextile::testing
