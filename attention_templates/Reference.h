// A float64 reference of flex_attention (Eigen), for tests, the examples'
// self-checks and `flextile run --check`. The mods are plain C++ here,
// written independently of the DSL ones they check.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "dsl/Tensor.h"

namespace flextile::attention {

class BlockMask;

// allowed(b, h, q, kv) and score(s, b, h, q, kv) at global positions; h is
// the query head.
using RefMaskFn = std::function<bool(int64_t b, int64_t h, int64_t q, int64_t kv)>;
using RefScoreFn = std::function<double(double s, int64_t b, int64_t h, int64_t q, int64_t kv)>;

struct ReferenceResult {
  std::vector<double> out;  // [B, Hq, L, DV]
  std::vector<double> lse;  // [B, Hq, L], natural log; -inf for a row with no allowed key
  std::vector<double> maxScores;  // [B, Hq, L]: the largest score after score_mod; -inf as lse
  int64_t allowedPairs = 0; // over all (b, h)
};

// q [B, Hq, L, D], k [B, Hkv, S, D], v [B, Hkv, S, DV] of any float dtype in either memory
// space. An empty mask allows everything, an empty score is the identity. With `sinks` ([Hq],
// FlexAttentionOptions::sinks), head h's rows take one more key of score sinks[h] and value 0.
ReferenceResult referenceAttention(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                   const RefScoreFn& score, const RefMaskFn& mask, double scale,
                                   int64_t qOffset = 0, const std::vector<double>* sinks = nullptr);

// One query row: batch b, query head h, row i of q (global position i + qOffset).
struct QueryRow {
  int64_t b = 0, h = 0, i = 0;
  auto operator<=>(const QueryRow&) const = default;
};

struct ReferenceRows {
  std::vector<double> out;   // [rows.size(), DV], in the order of the rows asked for
  std::vector<double> lse;   // [rows.size()], natural log; -inf for a row with no allowed key
  std::vector<double> maxScores;  // [rows.size()]: the largest score after score_mod; -inf as lse
  int64_t allowedPairs = 0;  // over these rows
};

// The reference of some rows only, on `threads` threads (0: every core): how a check of a large
// problem stays within seconds (a sample), or uses the whole machine (every row). The rows are
// grouped by (batch, kv head) so that each task converts its K and V once. Unlike
// referenceAttention, the mods are called from several threads at once and must be safe to call
// concurrently (pure functions of their arguments are).
ReferenceRows referenceAttentionRows(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                     const RefScoreFn& score, const RefMaskFn& mask, double scale,
                                     std::span<const QueryRow> rows, int64_t qOffset = 0, int threads = 0,
                                     const std::vector<double>* sinks = nullptr);

// Every row of [B, H, L] in row-major order (the rows of referenceAttention).
std::vector<QueryRow> allQueryRows(int64_t B, int64_t H, int64_t L);

// The rows a sampled check reads, chosen where attention kernels go wrong:
//   * every (b, h): its first and last row, and `randomPerHead` seeded random rows;
//   * both sides of every query block boundary (multiples of `boundaryBlock`, the kernel's
//     BLOCK_M, and of the mask's Q_BLOCK_SIZE): each boundary in at least one (b, h), and each
//     (b, h) at least one boundary, dealt round-robin so the sample grows with B * H + L / block
//     and not with their product;
//   * rows the mask leaves without any key (out 0, lse -inf): the first and last row of every such
//     run, up to kMaxMaskedRunsPerHead runs per (b, h). Found from the BlockMask's lists (a row
//     block with a full block has none), asking `refMask` only in row blocks of partial blocks
//     alone, and stopping at a row's first allowed key.
// Sorted, without duplicates. `mask` may be null (no mask: no row is masked).
struct RowSample {
  int64_t randomPerHead = 16;
  int64_t boundaryBlock = 0;  // 0: the mask's Q_BLOCK_SIZE only (or no boundaries without a mask)
  uint64_t seed = 0;
  int threads = 0;            // for the search of masked rows (0: every core)
};
inline constexpr int64_t kMaxMaskedRunsPerHead = 8;
std::vector<QueryRow> sampleQueryRows(int64_t B, int64_t H, int64_t L, const BlockMask* mask, const RefMaskFn& refMask,
                                      const RowSample& options = {});

// The (query, key) pairs `mask` allows for inputs of batch B and Hq query heads, summed over every
// (b, h) (a mask's broadcast B or H of 1 counts B or Hq times): full blocks count their in-range
// pairs, partial blocks ask `refMask` pair by pair (empty: every in-range pair of a partial block
// counts). For FLOPs (flexAttentionFlops takes the count per head: divide by B * Hq).
double countAllowedPairs(const BlockMask& mask, const RefMaskFn& refMask, int64_t B, int64_t Hq);

// d score / d s of a RefScoreFn at s (empty: 1, the identity's).
using RefScoreGradFn = std::function<double(double s, int64_t b, int64_t h, int64_t q, int64_t kv)>;
// Called for every allowed pair with g = dloss / d(score_mod's output) and the mod's input s: where a
// test accumulates the gradients of captured tensors by their formulas (a bias table's entry
// gets g, an ALiBi slope g * (kv - q)).
using RefScoreGradSink = std::function<void(double g, double s, int64_t b, int64_t h, int64_t q, int64_t kv)>;

struct ReferenceGrads {
  std::vector<double> dq;  // [B, Hq, L, D]
  std::vector<double> dk;  // [B, Hkv, S, D], summed over each GQA group
  std::vector<double> dv;  // [B, Hkv, S, DV]
  std::vector<double> dsinks;  // [Hq] with sinks, else empty
};

// The gradients of loss(out, lse) given dout = dloss/dout (any float tensor [B, Hq, L, DV]) and
// optionally dlse ([B, Hq, L], row-major), from the formulas, in float64:
//   p = softmax(score(scale q·k)) over allowed keys, dP = dout·vᵀ, delta_i = sum_j p_ij dP_ij - dlse_i,
//   dS = p (dP - delta), dS' = dS · score'(s), dq = scale dS' k, dk = scale dS'ᵀ q, dv = pᵀ dout.
// With `out` (the forward's output, as a backward receives it) delta_i = <dout_i, out_i> - dlse_i
// instead: the same in exact arithmetic, and what a kernel computes from a rounded out (sums over
// all pairs, such as an ALiBi slope's gradient, are sensitive to the difference).
// With `sinks` ([Hq]) each row's softmax has the sink key too (as referenceAttention's), and
// dsinks[h] = -sum over b and i of p_sink delta_i, p_sink = e^{sinks[h]} / the row's sum.
ReferenceGrads referenceAttentionBackward(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                          const dsl::Tensor& dout, const RefScoreFn& score,
                                          const RefScoreGradFn& scoreGrad, const RefMaskFn& mask, double scale,
                                          int64_t qOffset = 0, const std::vector<double>* dlse = nullptr,
                                          const RefScoreGradSink& sink = nullptr, const dsl::Tensor* out = nullptr,
                                          const std::vector<double>* sinks = nullptr);

// One key of k and v: batch b, kv head h, key j.
struct KeyRow {
  int64_t b = 0, h = 0, j = 0;
  auto operator<=>(const KeyRow&) const = default;
};

struct ReferenceGradRows {
  std::vector<double> dq;  // [queryRows.size(), D], in the order asked for
  std::vector<double> dk;  // [keyRows.size(), D], summed over the kv head's GQA group
  std::vector<double> dv;  // [keyRows.size(), DV]
};

// The backward's gradients at some rows of dq and some keys of dk and dv, on `threads` threads (0:
// every core), in float64 from the inputs and the forward's `out` and `lse` (natural log, as
// flex_attention returns it): p_ij = e^{score(s_ij) - lse_i}, delta_i = <dout_i, out_i> (out's
// rounding, as a kernel sees it), then the formulas of referenceAttentionBackward. A row's lse
// holds what normalized it (attention sinks too), so no sink is needed here; a row with lse -inf
// has p = 0. Reading the forward's lse is what makes a key's gradient cheap (one pass over the
// group's queries, O(G L D) a key): a sampled check of a large backward in seconds. The forward's
// lse is checked on its own (referenceAttentionRows). Mods are called from several threads.
ReferenceGradRows referenceAttentionBackwardRows(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                                 const dsl::Tensor& out, const dsl::Tensor& lse,
                                                 const dsl::Tensor& dout, const RefScoreFn& score,
                                                 const RefScoreGradFn& scoreGrad, const RefMaskFn& mask, double scale,
                                                 std::span<const QueryRow> queryRows, std::span<const KeyRow> keyRows,
                                                 int64_t qOffset = 0, int threads = 0);

// Any float tensor's elements as float64, row-major.
std::vector<double> toDoubles(const dsl::Tensor& t);

}  // namespace flextile::attention
