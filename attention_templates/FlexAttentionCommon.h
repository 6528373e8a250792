// What the attention templates share (not part of the public API): host-side checks and
// defaults, and the trace-side reading of a paged K/V (attention_templates/PagedKVCache.h).
#pragma once

#include <algorithm>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/PagedKVCache.h"
#include "attention_templates/TemplateParams.h"
#include "dsl/Tensor.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"

namespace flextile::attention::tmpl {

// The kernel parameters a template reading a paged K/V declares after its own (the order is the
// ABI): the page table, the stride between its batch rows, and the per-batch lengths (bound to
// the page table when PagedKV::lengths is undefined: then never read).
template <template <class> class P>
struct PagedKvParams {
  BOOST_HANA_DEFINE_STRUCT(PagedKvParams, (P<I32Ptr>, page_table), (P<I32>, page_table_stride_b),
                           (P<I32Ptr>, kv_lengths));
};

// The parameter a template declares after its own (and the paged ones) when it hands its tiles
// out in an order (the forward's and the backward's `tileOrder` constant): the tiles in that order
// (BlockMask::heaviestTilesFirst, heaviestKeyTilesFirst).
template <template <class> class P>
struct TileOrderParams {
  BOOST_HANA_DEFINE_STRUCT(TileOrderParams, (P<I32Ptr>, tile_order));
};

// The parameter a template declares last, after the paged and the tile-order ones, when it has
// attention sinks (its `hasSinks` constant; FlexAttentionOptions::sinks): f32 [Hq]. Not a member
// of the templates' own parameters, so that their kernels without sinks keep their signatures.
template <template <class> class P>
struct SinkParams {
  BOOST_HANA_DEFINE_STRUCT(SinkParams, (P<F32Ptr>, sinks));
};

// The compile-time constants of a paged K/V, after the template's own: the page size and whether
// the per-batch lengths are read.
struct PagedKvConstants {
  BOOST_HANA_DEFINE_STRUCT(PagedKvConstants, (int64_t, PAGE), (int64_t, hasLengths));
};

}  // namespace flextile::attention::tmpl

namespace flextile::attention::detail {

// ---- paged K/V, trace side -----------------------------------------------------------------
//
// A template walks logical key positions (the mods and the BlockMask see those) and asks for the
// physical K/V rows of each step:
//
//   const auto paged = declareParams<PagedKvParams>(f, dt);            // after the template's own
//   const PagedKvRows rows = pagedKvRows(paged, pagedConstants, b);
//   Tile keyEnd = pagedKeyEnd(paged, pagedConstants, b, p.kv_len);     // keys >= keyEnd are dead
//   ... in the loop, for the keys [start, start + BN):
//   Tile offsN = start + arange(0, BN);                                // logical: for the mods
//   Tile phys = kvStorageRows(rows, start, BN, keyEnd);                // physical: for the loads
//   Tile kt = load(kBase + phys.expand(1) * k_stride_n + offsD.expand(0), (offsN < keyEnd) ...);
//
// kBase is the head's base pointer (the storage's batch stride is 0), and the K/V loads must be
// masked with offsN < keyEnd whenever keys past keyEnd may be visited: their rows are not real.

// The program's view of a paged K/V: its batch row of the page table and the page size.
struct PagedKvRows {
  dsl::Tile batchTable;  // ptr<i32> scalar: page_table + b * page_table_stride_b
  int64_t pageSize;      // PagedKvConstants::PAGE, a power of two
};
PagedKvRows pagedKvRows(const tmpl::PagedKvParams<tmpl::Traced>& params, const tmpl::PagedKvConstants& constants,
                        const dsl::Tile& batch);

// The end of batch `batch`'s keys: kvLen, or min(kvLen, kv_lengths[batch]) with per-batch lengths
// (an i32 scalar, loaded once outside the key loop).
dsl::Tile pagedKeyEnd(const tmpl::PagedKvParams<tmpl::Traced>& params, const tmpl::PagedKvConstants& constants,
                      const dsl::Tile& batch, const dsl::Tile& kvLen);

// The physical storage rows (i32 [blockN]) of the logical keys [start, start + blockN), `start` an
// i32 scalar multiple of blockN. The page-table entries of keys at or past `keyEnd` are not read
// (those rows come out as rows of page 0: mask the loads).
//   * pageSize >= blockN: the keys lie in one page, so one scalar load of the table gives them
//     (rows page * pageSize + start % pageSize + arange(blockN)): the software pipeline can
//     recompute it for the iterations it prefetches (codegen/passes/Pipeline.cpp re-reads
//     scalar loads of a read-only loop), and K/V stream through cp.async as for contiguous keys.
//   * pageSize < blockN: one table load per key (a gather). Correct, but a tile-valued load in
//     the address keeps the K/V loads out of the pipeline: choose blockN <= pageSize.
dsl::Tile kvStorageRows(const PagedKvRows& paged, const dsl::Tile& start, int64_t blockN, const dsl::Tile& keyEnd);

// ---- paged K/V, host side ------------------------------------------------------------------

// Checks `kv` (checkPagedKV) and that it fits a query of batch B, dtype `dtype`, head dim D in
// `space`; `op` names the call in the errors.
void expectPagedKvFor(const char* op, const PagedKV& kv, int64_t B, int64_t D, dsl::DType dtype,
                      dsl::MemorySpace space);
// The arguments and constants of kv's PagedKvParams (kv checked).
tmpl::PagedKvParams<tmpl::Bound> pagedKvArguments(const PagedKV& kv);
tmpl::PagedKvConstants pagedKvConstants(const PagedKV& kv);

// Throws unless `t` is a rank-4 [B, H, len, D] tensor whose last dim is contiguous and whose
// strides fit the kernels' i32 parameters; `op` and `what` name the call and the tensor.
void expectAttentionInput(const char* op, const char* what, const dsl::Tensor& t);
// FlexAttentionOptions::sinks (and the backward's): f32 [Hq], contiguous, in the inputs' memory
// space; an error naming `op` and what is wrong otherwise.
void expectSinks(const char* op, const dsl::Tensor& sinks, int64_t Hq, dsl::MemorySpace space);

// Throws unless q [B, Hq, L, D], k and v [B, Hkv, S, D] are inputs both attention templates take:
// one float dtype, agreeing shapes, Hq a multiple of Hkv, D a multiple of 16 up to 256, one memory
// space, and the score mod's captures in that space.
// `sameBatch` false: k and v are a paged pool ([1, Hkv, rows, D]) for any batch.
void checkAttentionInputs(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                          const ScoreMod& scoreMod, bool sameBatch = true);

// The mask that lists every block as full (no BlockMask given), kept per lengths and block sizes.
BlockMask denseBlockMask(int64_t L, int64_t S, BlockSizes sizes);

// Whether a kernel names its tiles of these [B, H, N, D] tensors as tensor boxes (dsl::TensorBox),
// which the pipeline copies with TMA where the target has it (sm_90a; elsewhere the boxes are
// ordinary loads and the PTX is unchanged): `byDefault` (the forward: faster on every yardstick
// variant on the H200; the backward's kernels: mixed, so not by default, bench/RESULTS.md), or
// FLEXTILE_TMA=1 for every template, FLEXTILE_TMA=0 for none. A tensor map needs a 16-byte aligned
// base, a contiguous last dim and positive strides of multiples of 16 bytes (runtime/TensorMap.h),
// and only a pipelined loop (num_stages >= 2) has the ring TMA fills.
bool tmaBoxesFor(std::initializer_list<const dsl::Tensor*> tensors, int numStages, bool byDefault);
// A tensor box's bound on a dim the program's coordinates never leave (the batch, the head).
inline constexpr int64_t kUnboundedDim = 2147483647;

// The tensor a walk streams [rows, DP] tiles of: a [B, H, N, D] parameter, its strides and the
// rows that exist (N).
struct StreamedRows {
  dsl::Tile tensor, len, strideB, strideH, strideN;
};
// One streamed tile, rows row0 .. of head (b, h): the load of `ptrs` under `live` (no mask when
// `exact`), which with `tma` (tmaBoxesFor) also names the tile as a box of `t`, rows bounded by
// t.len and columns by D, so that the pipeline may copy it with TMA.
// `col0`: the tile's first column (a chunk of a split head dim, headDimSplit).
dsl::Tile loadStreamedRows(const dsl::Tile& ptrs, bool exact, const dsl::Tile& live, const StreamedRows& t,
                           const dsl::Tile& b, const dsl::Tile& h, const dsl::Tile& row0, int64_t D, bool tma,
                           int64_t col0 = 0);
struct HeadDimChunk;
// The chunks of a streamed tile over a split head dim, each loaded as loadStreamedRows loads a tile
// (a TMA box at the chunk's first column): the rows at `rowOffs` from `base` ([rows, 1]: row ·
// stride), masked by `rowLive` where rows may end (not `rowsExact`) or the chunk pads.
std::vector<dsl::Tile> loadStreamedChunks(const dsl::Tile& base, const dsl::Tile& rowOffs,
                                          const std::vector<HeadDimChunk>& chunks, bool rowsExact,
                                          const dsl::Tile& rowLive, const StreamedRows& t, const dsl::Tile& b,
                                          const dsl::Tile& h, const dsl::Tile& row0, int64_t D, bool tma);
// The same for a tile a program loads once (plain loads, no box: a resident K or Q).
std::vector<dsl::Tile> loadChunks(const dsl::Tile& base, const dsl::Tile& rowOffs, const std::vector<HeadDimChunk>& chunks,
                                  bool rowsExact, const dsl::Tile& rowLive);

// One step of the online softmax in the exp2 domain, as the forward and decode walks take it: the
// running row max `m`, row sum `l` and accumulator `acc` take a block of scores `s` (log2-scaled,
// -inf where masked) and its values `v` (the products in `dt`); a row without a live score keeps
// m = -inf and adds nothing. With `rowScale`, `s` holds the raw products, which are scaled after
// the row max (scale · max(s) = max(scale · s) for a positive scale): one fma a score inside
// exp2's argument instead of a multiply and an fma. With `sumAfterProduct` the row sum is traced
// after P·V (sumAfterProductWanted). Returns the new (m, l, acc).
std::tuple<dsl::Tile, dsl::Tile, dsl::Tile> onlineSoftmaxStep(const dsl::Tile& m, const dsl::Tile& l, const dsl::Tile& acc,
                                                              dsl::Tile s, const dsl::Tile& v, dsl::DType dt,
                                                              const dsl::Tile* rowScale = nullptr,
                                                              bool sumAfterProduct = false);
// The same over an accumulator in chunks (v's head dim split, headDimSplit): `acc[i]` takes P·`v[i]`.
std::tuple<dsl::Tile, dsl::Tile, std::vector<dsl::Tile>> onlineSoftmaxStep(const dsl::Tile& m, const dsl::Tile& l,
                                                                           const std::vector<dsl::Tile>& acc, dsl::Tile s,
                                                                           const std::vector<dsl::Tile>& v, dsl::DType dt,
                                                                           const dsl::Tile* rowScale, bool sumAfterProduct);

// Whether a walk traces its row sum after P·V, so that on wgmma the sum's adds and shuffles run
// while the product is in flight instead of delaying its issue (the program order is the PTX's).
// FLEXTILE_SUM_AFTER_PRODUCT=0/1 forces it; by default the forward does so without a score_mod
// (H200, 2026-12-05: no mask +0.5 to +1.2 %, masks level, ALiBi −2 %) and the decode does not
// (level).
bool sumAfterProductWanted(bool byDefault);

// The online softmax's weights for a block of scores (as in onlineSoftmaxStep, whose first half this
// is): the new row max m', the weights p = 2^(s − m') and the factor alpha = 2^(m − m') that
// rescales what was summed before.
struct SoftmaxWeights {
  dsl::Tile m, p, alpha;
};
SoftmaxWeights softmaxWeights(const dsl::Tile& m, dsl::Tile s, const dsl::Tile* rowScale = nullptr);

// A tile order (TileOrderParams): the grid coordinates (x, y, z) of its entry n, a launch index
// (z·ny + y)·nx + x of a grid nx × ny × …; and this program's own launch index, the n a program per
// tile takes.
std::tuple<dsl::Tile, dsl::Tile, dsl::Tile> tileFromOrder(const dsl::Tile& order, const dsl::Tile& n,
                                                          const dsl::Tile& nx, const dsl::Tile& ny);
dsl::Tile launchIndex();

// A row's log-sum-exp from its online-softmax state in the exp2 domain (`empty`: l == 0, a row with
// no live score, whose lse is -inf): m + log2 l, the partials' lse that the merges fold, or with
// `natural` that times ln 2, the lse a caller gets.
dsl::Tile rowLse(const dsl::Tile& m, const dsl::Tile& l, const dsl::Tile& empty, bool natural);
// A row's largest score in natural units (FlexAttentionOptions::return_max_scores) from its running
// max `m` in the exp2 domain (always scaled, even where the walk scales after the max); -inf where
// `empty`.
dsl::Tile rowMaxScore(const dsl::Tile& m, const dsl::Tile& empty);
// An attention sink (FlexAttentionOptions::sinks) folded into a row's final online-softmax state:
// one more key, of score `sinkLog2` (the exp2 domain) and value zero. m and l become the state's
// with that key and each accumulator in `acc` ([rows, D], or shaped as m) is rescaled to the new
// m. A row without live scores ends with m = the sink, l = 1 and its accumulators 0: out 0 and
// lse = the sink. Added once per row: never to a partial that a merge folds with others.
void foldSink(dsl::Tile& m, dsl::Tile& l, std::vector<dsl::Tile>& acc, const dsl::Tile& sinkLog2);

// One round of an exact merge of partial results by the online-softmax rule, as the decode
// template's splits and the forward's last-round pieces are merged: the running row max `m` and sum
// `l` ([rows]) and accumulator `acc` ([rows, D]) take partials u (each a normalized output `part[u]`
// and its lse[u] = m_u + log2 l_u; -inf for an empty or absent partial, which weighs nothing). The
// caller issues every load of the round before calling, so the round waits on one round trip.
// `m`, `l` and the lse may instead be [rows, D] like the partials, each row's value repeated along
// D (a broadcast load): then every weight lives where its partial does, and no row value crosses
// threads — a [rows] value meets a [rows, D] tile through a layout conversion, a shared-memory round
// trip between two barriers for each partial.
std::tuple<dsl::Tile, dsl::Tile, dsl::Tile> foldPartials(const dsl::Tile& m, const dsl::Tile& l, const dsl::Tile& acc,
                                                         const std::vector<dsl::Tile>& lse,
                                                         const std::vector<dsl::Tile>& part);
// The same over a merge loop's carried state {m, l, acc} and, with max scores, a fourth entry: the
// rows' largest score so far, which takes the maximum of `best` (the partials' own, natural units;
// -inf for an absent one). Returns the next state, of the same length.
std::vector<dsl::Tile> foldPartialsAndMaxima(const std::vector<dsl::Tile>& state, const std::vector<dsl::Tile>& lse,
                                             const std::vector<dsl::Tile>& part, const std::vector<dsl::Tile>& best);

// Entry `entry` of a BlockMask list row that starts at `rowStart` and holds `capacity` entries, of
// which the first `length` are live: 0 past the length. The read is masked by the capacity, not by
// the length, so that it does not wait for the length's read (a walk's first block index is then
// one list read away); the value is zeroed past the length because the pipeline's look-ahead
// still turns the index of a step that never runs into addresses (a paged K/V's page-table read
// would follow a stale entry).
dsl::Tile listEntry(const dsl::Tile& list, const dsl::Tile& rowStart, const dsl::Tile& entry, const dsl::Tile& length,
                    const dsl::Tile& capacity);

// A kernel that does not depend on the mods (a merge, a preprocess, a cast), made once per key
// for the process and kept.
dsl::Kernel& sharedKernel(const std::string& key, const std::function<dsl::Kernel()>& make);

// The head dim a template's tiles use: D rounded up to a power of two (aranges are powers of two).
inline int64_t paddedHeadDim(int64_t D) {
  int64_t p = 1;
  while (p < D) p *= 2;
  return p;
}

// Where the forward and the backward's kernels split a head dim, Q's and K's or V's (the decode
// pads them): tiles are powers of two wide, so D = 192 padded to 256 spends a quarter of Q·Kᵀ's
// tensor-core work, and of K's ring, on zero columns. Two chunks [0, first) and [first, first +
// paddedHeadDim(D − first)), both powers of two, cover 192 as 128 + 64 (96 as 64 + 32, 80 as
// 64 + 16); Q·Kᵀ is the sum of their products, and P·V a product a chunk of the accumulator.
// Returns `first`, or 0 where the chunks would be no narrower than the padded tile (a power of two,
// 112, 224). FLEXTILE_SPLIT_HEAD_DIM=0 keeps the padded tile.
int64_t headDimSplit(int64_t D);
// V's split (headDimSplit of DV), which FLEXTILE_SPLIT_VALUE_DIM=0 alone turns off; none where the
// second chunk would be narrower than `minChunk` columns (the forward's P·V: 64).
int64_t valueDimSplit(int64_t DV, int64_t minChunk = 16);
// The columns of the tiles over a head dim (Q's and K's, or V's): the two chunks' where it is split
// at `first`, else the padded width.
inline int64_t tileColumns(int64_t D, int64_t first) {
  return first ? first + paddedHeadDim(D - first) : paddedHeadDim(D);
}
inline int64_t tileColumns(int64_t D) { return tileColumns(D, headDimSplit(D)); }
// One chunk of a split head dim in a traced template: its columns arange(first, first + width) and,
// where it reaches past D, which of them are live.
struct HeadDimChunk {
  int64_t first;
  dsl::Tile offs, live;
  // The [rows, width] load/store mask of `rows` (live rows).
  dsl::Tile rowsBy(const dsl::Tile& rows) const {
    dsl::Tile m = rows.expand(1);
    return live.valid() ? m & live.expand(0) : m;
  }
};
// The chunks of D split at `first` (headDimSplit), traced; none where `first` is 0.
std::vector<HeadDimChunk> headDimChunks(int64_t D, int64_t first);

// A head dim the templates take (q's, k's or v's): a multiple of 16 up to 256.
inline bool supportedHeadDim(int64_t d) { return d >= 16 && d <= 256 && d % 16 == 0; }

// V's columns in a traced template, beside Q's and K's (`offsD`, arange(0, DP)): V, the
// accumulator, the output (and dO, dV) are DV wide, padded to DVP. Where DV and its padding are
// D's, every tile and mask is D's own, so such a kernel traces exactly the ops it did before v's
// head dim could differ.
struct ValueColumns {
  bool own;       // DV or its padding differs from D's
  bool padded;    // DVP != DV: the columns past DV are masked
  dsl::Tile offs;  // arange(0, DVP), or offsD
  dsl::Tile live;  // offs < DV, where own and padded
  ValueColumns(int64_t D, int64_t DP, int64_t DV, int64_t DVP, const dsl::Tile& offsD)
      : own(DVP != DP || DV != D), padded(DVP != DV), offs(own ? dsl::arange(0, DVP) : offsD) {
    if (own && padded) live = offs < DV;
  }
  // The [rows, DVP] load/store mask of `rows` (live rows); `byD(rows)`, D's own mask, where the
  // dims agree.
  template <class ByD>
  dsl::Tile rowsBy(const dsl::Tile& rows, const ByD& byD) const {
    if (!own) return byD(rows);
    dsl::Tile m = rows.expand(1);
    return padded ? m & live.expand(0) : m;
  }
};

// Why `config` cannot run an attention template over `mask` (nullptr: no mask), or nullopt: the
// one check of a tile config that the forward, its config resolver and both backward kernels use.
// BLOCK_M and BLOCK_N powers of two in [16, 256], num_warps 1-16 (a power of two), num_stages 1-4,
// and the tiles dividing the mask's blocks (BLOCK_M | Q_BLOCK_SIZE, BLOCK_N | KV_BLOCK_SIZE).
std::optional<std::string> configProblem(const FlexAttentionConfig& config, const BlockMask* mask);

// untunedFlexAttentionConfig for a head dim of the caller's choosing: where v's head dim differs
// from q's, the larger of the two sizes the tile.
FlexAttentionConfig untunedConfig(const dsl::Tensor& q, int64_t headDim, const ScoreMod& scoreMod,
                                  const std::optional<BlockMask>& blockMask, std::optional<codegen::Target> target);

// The target a call's defaults are chosen for: the given one, else the current device's for device
// tensors, else none (host tensors run on the interpreter: the portable default).
std::optional<codegen::Target> defaultsTarget(dsl::MemorySpace space, const std::optional<codegen::Target>& target);

// What a config resolver sees of a call (FlexAttentionProblem): its shapes, the mods' names, captures
// and structural hashes, the BlockMask's block sizes.
// `DV`: v's head dim (kept only where it differs from D).
FlexAttentionProblem attentionProblem(dsl::DType dtype, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S,
                                      int64_t D, dsl::MemorySpace space, const ScoreMod& scoreMod,
                                      const std::optional<BlockMask>& blockMask, int64_t DV = 0);

// The process-wide hook of one template's config resolver (setFlexAttentionConfigResolver, the
// backward's and the decode's): set under a lock, read as a copy, so a resolver runs without the
// lock held (it may compile, time, or set another resolver). `mayAnswer`, when set, says cheaply
// whether the resolver could answer at all, so a call whose problem (the mods' names and hashes)
// would cost more than its own host path skips building it.
template <class Config>
class ResolverSlot {
 public:
  using Resolver = std::function<std::optional<Config>(const FlexAttentionProblem&)>;

  static ResolverSlot& instance() {
    static ResolverSlot slot;
    return slot;
  }
  void set(Resolver resolver, std::function<bool()> mayAnswer = {}) {
    std::lock_guard lock(mutex_);
    resolver_ = std::move(resolver);
    mayAnswer_ = std::move(mayAnswer);
  }
  // The resolver's config for the problem `problem()` builds (called only when a resolver is set
  // and may answer), or nullopt. A mod that the resolver's probe tiles do not fit (its structural
  // hash traces it) throws Error there: the call then runs its default, and the real trace reports
  // anything truly wrong with the mod.
  template <class MakeProblem>
  std::optional<Config> ask(MakeProblem&& problem) const {
    Resolver resolver;
    {
      std::lock_guard lock(mutex_);
      if (!resolver_ || (mayAnswer_ && !mayAnswer_())) return std::nullopt;
      resolver = resolver_;
    }
    try {
      return resolver(problem());
    } catch (const Error&) {
      return std::nullopt;
    }
  }

 private:
  mutable std::mutex mutex_;
  Resolver resolver_;
  std::function<bool()> mayAnswer_;
};

// FLEXTILE_<switch>=1 or =0: a choice forced for every call; nullopt when unset or anything else.
// Both keep their answers per thread until the environment changes (codegen::environmentGeneration),
// so a launch reads no environment; `names` are string literals (kept by address).
std::optional<bool> forcedBySwitch(const char* name);
// The same for several switches at once. values[i] is names[i]'s.
void forcedBySwitches(std::span<const char* const> names, std::span<std::optional<bool>> values);

// A config's text form (FlexAttentionConfig::parse, FlexDecodeConfig::parse): its comma-separated
// items, and one item as a whole integer (nullopt for anything else: a sign-only, a suffix, a word).
std::vector<std::string> configItems(std::string_view text);
std::optional<int64_t> configInteger(const std::string& item);

// Whether a mod of the call reads a captured tensor once per score (ScoreMod/MaskMod::
// gathersPerElement). A mod the probe tiles do not fit counts as gathering: the smaller tile is the
// safe guess, and the real trace reports anything truly wrong with it.
bool modsGatherPerElement(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask);

// Why the backward cannot run tile `c` as its dkdv or dq kernel's on `mask` (nullptr: no mask), or
// nullopt: configProblem's rules and the forward-only schedules.
std::optional<std::string> backwardTileProblem(const FlexAttentionConfig& c, const BlockMask* mask);
// The backward's config for a call that gives none and has no tuned one: the default for its dtype,
// head dims (q's D, v's DV), target and mods, narrowed to tile a mask of smaller blocks (the
// autotuner's baseline too).
FlexAttentionBackwardConfig untunedBackwardConfig(dsl::DType dtype, int64_t D, int64_t DV, dsl::MemorySpace space,
                                                  std::optional<codegen::Target> target, const ScoreMod& scoreMod,
                                                  const std::optional<BlockMask>& blockMask, DqAccumulation dq);
// Whether the forward takes the warp-specialized schedule (a producer warpgroup for the TMA rings,
// Q resident in shared memory): FLEXTILE_WARP_SPECIALIZE=1/0 decides, else the config's choice,
// else (Auto) every call whose mods read no captured tensor per key (ModBase::gathersAlongKeys), and
// those that read one per key but not per score when the offline ptxas assembles specialized kernels
// (codegen/Ptxas.h): JIT-compiled, the document ids measured 7.5 % slower specialized on the H200.
bool warpSpecializeWanted(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                          WarpSpecialization choice = WarpSpecialization::Auto);
// Whether a specialized 8-warp forward with a score_mod has its two consumer warpgroups take turns
// issuing their products (pass "pingpong"), so that one's score arithmetic runs under the other's
// products: mods that gather nothing per score or per key. ALiBi ran 4.7-7.5 % faster so (376 ->
// 404 TFLOP/s, H200, 2026-12-03); without a score_mod the turns were 2.5 % slower, and a per-key
// gather (document ids) much slower. Applied by default since racecheck ran clean on the turns
// (2026-12-03: ALiBi 410 -> 444 TFLOP/s, soft-cap unchanged); FLEXTILE_PINGPONG=1/0 forces the pass
// on or off.
bool pingpongWanted(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask);
// Whether a forward that takes the turns runs persistent programs (FlexAttentionConfig::persistent)
// by default: where no mod reads a captured tensor. On the H200 (2026-12-04) they gave causal
// +2.1 %, sliding window +6 %, prefix LM +1.8 %, no mask and soft-cap level; ALiBi's slopes (a
// captured tensor read per tile) took its consumers past their 240 registers (84 bytes spilled,
// -5 %); the document mask (a captured tensor per key, no turns) lost 15 % to its uneven rows.
bool persistentWanted(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask);
// Whether a score_mod changes the scores: by identity with noop_score(), not by name (a user's mod
// may be called "noop" and still change them).
bool changesScores(const ScoreMod& scoreMod);

// Whether a call runs the decode template (options.kernel, else L <= kDecodeMaxQueries or a
// query_offset, which only decode takes).
bool usesDecodeTemplate(const dsl::Tensor& q, const FlexAttentionOptions& options);
// flex_attention_into's decode path (FlexAttentionDecode.cpp); out and lse already checked.
void flexDecodeInto(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v, const ScoreMod& scoreMod,
                    const std::optional<BlockMask>& blockMask, dsl::Tensor& out, dsl::Tensor* lse,
                    const FlexAttentionOptions& options);
void flexDecodeInto(const dsl::Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                    const std::optional<BlockMask>& blockMask, dsl::Tensor& out, dsl::Tensor* lse,
                    const FlexAttentionOptions& options);

// Where a template's kernel is kept in the mask mod's state: "<kind>/<score mod state>/<dtype>".
// The score mod's state (which the kernel's tracer keeps alive, so the address is never reused)
// names the pair of mods; `kind` names the template ("flex_fwd", "flex_decode_paged", ...).
std::string templateKernelKey(const char* kind, const ScoreMod& scoreMod, dsl::DType dtype);

// A kernel name from a template's and the mods' names: anything but letters and digits becomes '_'.
std::string kernelName(const std::string& name);

// A template's own scratch, kept between calls so that a call does not allocate (cuMemFree
// synchronizes the device, which would make every call blocking): one buffer per thread, memory
// space and (on the device) stream, for each kind of buffer `Kind`. Per thread, so that one
// thread's growth never frees what another's views point into; per stream, because a call on
// another stream may still be using its own. Reuse is safe because one slot's launches all go to
// one stream in order.
template <class Kind>
dsl::Tensor& perStreamSlot(dsl::MemorySpace space, runtime::Stream* stream) {
  thread_local dsl::Tensor host;
  thread_local std::map<void*, dsl::Tensor> device;  // by CUstream (null: the legacy default stream)
  return space == dsl::MemorySpace::Device ? device[runtime::streamHandle(stream)] : host;
}

// Puts `replacement` in a slot. Once the process has captured a CUDA graph (runtime/Graph.h), what
// the slot held is kept alive for the thread's lifetime instead of freed: a graph that captured a
// call holds the old buffer's address, and replays it after a later call outgrew it. Slots grow by
// doubling, so what is kept is less than what is in use.
inline void replaceSlot(dsl::Tensor& slot, dsl::Tensor replacement) {
  thread_local std::vector<dsl::Tensor> retired;
  if (slot.defined() && runtime::anyGraphCaptured()) retired.push_back(std::move(slot));
  slot = std::move(replacement);
}

// A view of shape `shape` (contiguous f32) at element `offset` of Kind's grow-only f32 buffer
// (grown, by reallocation, to twice what is needed when it is too small): a call takes all its
// views before launching anything, the far end first, since a later view may reallocate the buffer.
template <class Kind>
dsl::Tensor f32Scratch(dsl::MemorySpace space, runtime::Stream* stream, int64_t offset, const dsl::Shape& shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  dsl::Tensor& slot = perStreamSlot<Kind>(space, stream);
  const int64_t needed = offset + count;
  if (!slot.defined() || slot.numel() < needed)
    replaceSlot(slot, dsl::Tensor::empty(dsl::DType::F32, {std::max<int64_t>(2 * needed, int64_t(1) << 16)}, space));
  if (space == dsl::MemorySpace::Device)
    return dsl::Tensor::deviceView(slot.deviceAddress() + uint64_t(offset) * 4, dsl::DType::F32, shape);
  return dsl::Tensor::hostView(static_cast<float*>(slot.hostData()) + offset, dsl::DType::F32, shape);
}

}  // namespace flextile::attention::detail
