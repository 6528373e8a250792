// The float64 side of the packed-sequence tests (VarlenTest.cpp, VarlenGpuTest.cpp): where a packed
// query's sequence and position are, computed from the lengths alone (not by the library), and the
// packed reference mods made from a sequence's own.
#pragma once

#include <cstdint>
#include <vector>

#include "attention_templates/Reference.h"
#include "attention_templates/Varlen.h"

namespace flextile::testing {

// The packed definition: key kv belongs to query q's sequence, and the inner mod allows the pair at
// the sequence's positions, computed here from the lengths (not by the library).
struct PackedLayout {
  std::vector<int64_t> qStarts, kStarts;
  bool atEnd = false;
  PackedLayout(const std::vector<int64_t>& qLens, const std::vector<int64_t>& kLens,
               attention::QueryPositions positions)
      : qStarts{0}, kStarts{0}, atEnd(positions == attention::QueryPositions::AtEnd) {
    for (size_t s = 0; s < qLens.size(); ++s) {
      qStarts.push_back(qStarts.back() + qLens[s]);
      kStarts.push_back(kStarts.back() + (kLens.empty() ? qLens : kLens)[s]);
    }
  }
  int64_t sequence(int64_t q) const {
    int64_t s = 0;
    while (qStarts[size_t(s) + 1] <= q) ++s;
    return s;
  }
  int64_t position(int64_t q) const {
    const auto s = size_t(sequence(q));
    const int64_t qLen = qStarts[s + 1] - qStarts[s], kLen = kStarts[s + 1] - kStarts[s];
    return q - qStarts[s] + (atEnd ? kLen - qLen : 0);
  }
};

inline attention::RefMaskFn packedMask(const PackedLayout& p, attention::RefMaskFn inner) {
  return [p, inner](int64_t, int64_t h, int64_t q, int64_t kv) {
    const int64_t s = p.sequence(q), k0 = p.kStarts[size_t(s)];
    return kv >= k0 && kv < p.kStarts[size_t(s) + 1] && inner(s, h, p.position(q), kv - k0);
  };
}
inline attention::RefScoreFn packedScore(const PackedLayout& p, attention::RefScoreFn inner) {
  return [p, inner](double score, int64_t, int64_t h, int64_t q, int64_t kv) {
    const int64_t s = p.sequence(q);
    return inner(score, s, h, p.position(q), kv - p.kStarts[size_t(s)]);
  };
}

}  // namespace flextile::testing
