// A float64 reference of flex_attention (Eigen), for tests, the examples'
// self-checks and `flextile run --check`. The mods are plain C++ here,
// written independently of the DSL ones they check.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "dsl/Tensor.h"

namespace flextile::attention {

// allowed(b, h, q, kv) and score(s, b, h, q, kv) at global positions; h is
// the query head.
using RefMaskFn = std::function<bool(int64_t b, int64_t h, int64_t q, int64_t kv)>;
using RefScoreFn = std::function<double(double s, int64_t b, int64_t h, int64_t q, int64_t kv)>;

struct ReferenceResult {
  std::vector<double> out;  // [B, Hq, L, D]
  std::vector<double> lse;  // [B, Hq, L], natural log; -inf for a row with no allowed key
  int64_t allowedPairs = 0; // over all (b, h)
};

// q [B, Hq, L, D], k/v [B, Hkv, S, D] of any float dtype in either memory
// space. An empty mask allows everything, an empty score is the identity.
ReferenceResult referenceAttention(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                   const RefScoreFn& score, const RefMaskFn& mask, double scale,
                                   int64_t qOffset = 0);

// Any float tensor's elements as float64, row-major.
std::vector<double> toDoubles(const dsl::Tensor& t);

}  // namespace flextile::attention
