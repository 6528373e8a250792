// Paged K/V test helpers shared by the host tests (interpreter) and the GPU tests: random logical
// K/V scattered into a pool of pages in random physical order (built on the host, independently of
// PagedKVCache and materializePagedKV, so a bug there cannot hide in the reference), and the
// comparison of the paged forward with the float64 reference over the logical K/V.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "FlexAttentionCheck.h"
#include "attention_templates/PagedKVCache.h"

namespace flextile::testing {

struct PagedCase {
  int64_t B = 2, Hq = 4, Hkv = 1, L = 40, D = 32;
  int64_t pageSize = 16;
  std::vector<int64_t> lengths;  // per batch (empty: every batch has S keys)
  int64_t S = 0;                 // the logical length (0: the longest of `lengths`)
  int64_t spareTablePages = 1;   // table entries past S's pages (left garbage: never read)
  int64_t sharedPrefixPages = 0; // batch 1 reuses batch 0's first pages (a shared prefix)
  dsl::DType dtype = dsl::DType::BF16;
  std::string context;
  int64_t DV = 0;                // v's head dim (0: D)

  int64_t valueDim() const { return DV > 0 ? DV : D; }
  int64_t logicalLength() const { return S ? S : *std::max_element(lengths.begin(), lengths.end()); }
  std::string describe() const {
    std::string s = context + " B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
                    " L=" + std::to_string(L) + " S=" + std::to_string(logicalLength()) + " D=" + std::to_string(D) +
                    (valueDim() != D ? " DV=" + std::to_string(valueDim()) : std::string()) + " page " + std::to_string(pageSize) + " " + std::string(ir::dtypeName(dtype)) + " lengths";
    for (int64_t l : lengths) s += " " + std::to_string(l);
    return s;
  }
};

struct PagedInputs {
  attention::PagedKV kv;
  dsl::Tensor kLogical, vLogical;   // [B, Hkv, S, D] (v: DV), zeros past each length (host)
  std::vector<int32_t> table;       // [B, maxPages] as uploaded
  std::vector<int64_t> lengths;     // per batch
};

// Random logical K/V, scattered into a pool with a few unused pages, each batch's pages at random
// distinct physical pages (batch 1's first sharedPrefixPages pages are batch 0's, its keys there
// equal to batch 0's). Table entries past a batch's pages hold -1 (never read). Built in `space`.
inline PagedInputs makePagedInputs(std::mt19937_64& rng, const PagedCase& c, dsl::MemorySpace space) {
  const int64_t S = c.logicalLength(), ps = c.pageSize;
  std::vector<int64_t> lengths = c.lengths.empty() ? std::vector<int64_t>(size_t(c.B), S) : c.lengths;
  const int64_t maxPages = (S + ps - 1) / ps + c.spareTablePages;
  int64_t needed = 0;
  for (int64_t b = 0; b < c.B; ++b) needed += (lengths[size_t(b)] + ps - 1) / ps;
  const int64_t numPages = needed + 3;  // a few pages nobody uses
  std::vector<int32_t> order(static_cast<size_t>(numPages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  PagedInputs in;
  in.lengths = lengths;
  in.table.assign(size_t(c.B * maxPages), -1);
  size_t next = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t j = 0; j < (lengths[size_t(b)] + ps - 1) / ps; ++j)
      in.table[size_t(b * maxPages + j)] =
          (b == 1 && j < c.sharedPrefixPages) ? in.table[size_t(j)] : order[next++];

  std::uniform_real_distribution<double> u(-1, 1);
  const int64_t rows = numPages * ps, H = c.Hkv, D = c.D, DV = c.valueDim();
  std::vector<float> kPool(size_t(H * rows * D)), vPool(size_t(H * rows * DV));
  for (float& x : kPool) x = float(u(rng));
  for (float& x : vPool) x = float(u(rng));
  // Rounded to the dtype first, so the logical copy holds exactly what the pool holds.
  auto rounded = [&](const std::vector<float>& pool, int64_t dim) {
    return dsl::Tensor::fromHost(pool, c.dtype, {1, H, rows, dim}).toHost<float>();
  };
  kPool = rounded(kPool, D), vPool = rounded(vPool, DV);
  std::vector<float> kLog(size_t(c.B * H * S * D), 0.0f), vLog(size_t(c.B * H * S * DV), 0.0f);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t s = 0; s < lengths[size_t(b)]; ++s) {
      const int64_t row = int64_t(in.table[size_t(b * maxPages + s / ps)]) * ps + s % ps;
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t d = 0; d < D; ++d)
          kLog[size_t(((b * H + h) * S + s) * D + d)] = kPool[size_t((h * rows + row) * D + d)];
        for (int64_t d = 0; d < DV; ++d)
          vLog[size_t(((b * H + h) * S + s) * DV + d)] = vPool[size_t((h * rows + row) * DV + d)];
      }
    }
  in.kLogical = dsl::Tensor::fromHost(kLog, c.dtype, {c.B, H, S, D});
  in.vLogical = dsl::Tensor::fromHost(vLog, c.dtype, {c.B, H, S, DV});
  in.kv.k = dsl::Tensor::fromHost(kPool, c.dtype, {1, H, rows, D}, space);
  in.kv.v = dsl::Tensor::fromHost(vPool, c.dtype, {1, H, rows, DV}, space);
  in.kv.pageTable = dsl::Tensor::fromHost(in.table, {c.B, maxPages}, space);
  in.kv.pageSize = ps;
  in.kv.length = S;
  if (!c.lengths.empty()) {
    std::vector<int32_t> l32(lengths.begin(), lengths.end());
    in.kv.lengths = dsl::Tensor::fromHost(l32, {c.B}, space);
  }
  return in;
}

// The reference mask with keys past each batch's length excluded.
inline attention::RefMaskFn withLengths(const attention::RefMaskFn& mask, std::vector<int64_t> lengths) {
  return [mask, lengths](int64_t b, int64_t h, int64_t q, int64_t kv) {
    return kv < lengths[size_t(b)] && (!mask || mask(b, h, q, kv));
  };
}

// Runs the paged forward on q (out and lse poisoned first) and compares with the float64
// reference over the logical K/V `k`, `v` ([B, Hkv, S, D]) with keys past `lengths` excluded.
inline bool checkPagedOn(const dsl::Tensor& q, const attention::PagedKV& kv, const dsl::Tensor& k,
                         const dsl::Tensor& v, const std::vector<int64_t>& lengths, const std::string& context,
                         const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                         const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                         const attention::FlexAttentionOptions& options = {}, uint64_t rowSampleSeed = 0) {
  SCOPED_TRACE(context + (options.config ? " config " + options.config->describe() : std::string(" default config")) +
               (mask ? " mask " + mask->maskMod().name() : std::string(" no mask")));
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = v.size(3);  // D: out's rows (v's head dim)
  // A sample of the rows for a large problem on the device (FlexAttentionCheck.h).
  const attention::ReferenceResult ref =
      referenceFor(q, k, v, refScore, withLengths(refMask, lengths), mask, options, rowSampleSeed);
  dsl::Tensor out = dsl::Tensor::empty(q.dtype(), {B, Hq, L, D}, q.space());
  dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {B, Hq, L}, q.space());
  poison(out);
  poison(lse);
  attention::FlexAttentionOptions o = options;
  if (options.return_max_scores) {  // the test asks for them: a poisoned output of its own
    o.max_scores = dsl::Tensor::empty(dsl::DType::F32, {B, Hq, L}, q.space());
    poison(*o.max_scores);
  }
  attention::flex_attention_into(q, kv, score, mask, out, &lse, o);
  if (!compareWithReference(out, lse, ref, D, q.dtype())) return false;
  const std::string mismatch = o.max_scores ? maxScoresMismatch(*o.max_scores, ref) : "";
  if (!mismatch.empty()) ADD_FAILURE() << mismatch;
  return mismatch.empty();
}

// A random case end to end: inputs, a random q in `space`, the paged forward against the reference.
inline bool checkPaged(std::mt19937_64& rng, const PagedCase& c, dsl::MemorySpace space,
                       const attention::ScoreMod& score, const std::optional<attention::BlockMask>& mask,
                       const attention::RefScoreFn& refScore, const attention::RefMaskFn& refMask,
                       const attention::FlexAttentionOptions& options = {}) {
  const PagedInputs in = makePagedInputs(rng, c, space);
  const dsl::Tensor q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, space);
  return checkPagedOn(q, in.kv, in.kLogical, in.vLogical, in.lengths, c.describe(), score, mask, refScore, refMask,
                      options, rng());
}

// Host-side logical K/V of a cache test: what the test appended, per batch, as rows of
// [Hkv, length, D] floats (already rounded to the dtype; v's rows DV wide).
struct LogicalHistory {
  int64_t Hkv, D, DV;
  std::vector<std::vector<float>> k, v;  // per batch: [token][h][d]

  LogicalHistory(int64_t batches, int64_t Hkv_, int64_t D_, int64_t DV_ = 0)
      : Hkv(Hkv_), D(D_), DV(DV_ > 0 ? DV_ : D_), k(size_t(batches)), v(size_t(batches)) {}
  int64_t length(int64_t b) const { return int64_t(k[size_t(b)].size()) / (Hkv * D); }

  // Appends tokens [0, count) of row `row` of kNew/vNew ([rows, Hkv, T, D or DV], host floats) to batch b.
  void append(int64_t b, const std::vector<float>& kNew, const std::vector<float>& vNew, int64_t row, int64_t T,
              int64_t count) {
    for (int64_t t = 0; t < count; ++t)
      for (int64_t h = 0; h < Hkv; ++h) {
        for (int64_t d = 0; d < D; ++d) k[size_t(b)].push_back(kNew[size_t(((row * Hkv + h) * T + t) * D + d)]);
        for (int64_t d = 0; d < DV; ++d) v[size_t(b)].push_back(vNew[size_t(((row * Hkv + h) * T + t) * DV + d)]);
      }
  }
  // The first `batches` batches as [B, Hkv, S, D] tensors (v: DV) of `dtype`, zeros past each length.
  std::pair<dsl::Tensor, dsl::Tensor> tensors(int64_t batches, int64_t S, dsl::DType dtype) const {
    std::vector<float> kl(size_t(batches * Hkv * S * D), 0.0f), vl(size_t(batches * Hkv * S * DV), 0.0f);
    for (int64_t b = 0; b < batches; ++b)
      for (int64_t t = 0; t < std::min(S, length(b)); ++t)
        for (int64_t h = 0; h < Hkv; ++h) {
          for (int64_t d = 0; d < D; ++d)
            kl[size_t(((b * Hkv + h) * S + t) * D + d)] = k[size_t(b)][size_t((t * Hkv + h) * D + d)];
          for (int64_t d = 0; d < DV; ++d)
            vl[size_t(((b * Hkv + h) * S + t) * DV + d)] = v[size_t(b)][size_t((t * Hkv + h) * DV + d)];
        }
    return {dsl::Tensor::fromHost(kl, dtype, {batches, Hkv, S, D}), dsl::Tensor::fromHost(vl, dtype, {batches, Hkv, S, DV})};
  }
  std::vector<int64_t> lengths(int64_t batches) const {
    std::vector<int64_t> l;
    for (int64_t b = 0; b < batches; ++b) l.push_back(length(b));
    return l;
  }
};

// Random new K/V [rows, Hkv, T, D] (v: DV, 0 for D) of `dtype` in `space`, and the same values (rounded)
// as host floats.
struct NewTokens {
  dsl::Tensor k, v;
  std::vector<float> kHost, vHost;
};
inline NewTokens randomTokens(std::mt19937_64& rng, dsl::DType dtype, int64_t rows, int64_t Hkv, int64_t T,
                              int64_t D, dsl::MemorySpace space, int64_t DV = 0) {
  NewTokens n;
  n.k = randomTensor(rng, dtype, {rows, Hkv, T, D}, space);
  n.v = randomTensor(rng, dtype, {rows, Hkv, T, DV > 0 ? DV : D}, space);
  n.kHost = n.k.toHost<float>();
  n.vHost = n.v.toHost<float>();
  return n;
}

}  // namespace flextile::testing
