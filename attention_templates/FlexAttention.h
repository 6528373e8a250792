// flex_attention: the fused forward template. score_mod, mask_mod and the
// tile loop trace into one kernel (attention_templates/FlexAttentionForward.cpp).
//
//   Tensor q = Tensor::deviceView(qPtr, DType::BF16, {B, Hq, L, D});   // also k, v: [B, Hkv, S, D]
//   BlockMask mask = causalBlockMask(1, 1, L, S);                      // B, H broadcast
//   auto [out, lse] = flex_attention(q, k, v, noop_score(), mask, {.return_lse = true});
//
// Semantics, per (b, hq, i) with hkv = hq / (Hq / Hkv):
//   s_j   = score_mod(scale * <q_i, k_j>, b, hq, i + qOffset, j)   for j with mask_mod(b, hq, i + qOffset, j)
//   out_i = sum_j softmax(s)_j v_j,   lse_i = log(sum_j exp(s_j))   (natural log)
// A row with no allowed key (or whose scores are all -inf) gives out 0 and
// lse -inf, never NaN.
//
// Inputs: q [B, Hq, L, D], k [B, Hkv, S, D] and v [B, Hkv, S, DV] (out is
// [B, Hq, L, DV]; DV = D but for models such as MLA's 192 / 128 — the forward,
// the decode, the backward and a paged K/V take it), one dtype
// (bf16, f16 or f32; f32 dots run on tf32 tensor cores), Hq a multiple of Hkv
// (GQA; MQA is Hkv = 1), D and DV multiples of 16 up to 256, any L and S >= 1. The last dim of
// each tensor must be contiguous; other strides are free (views of another
// framework's buffers pass without a copy). All tensors live in one memory
// space: device tensors run on the GPU, host tensors run through the IR
// interpreter (same kernel, for tests and machines without a GPU).
//
// The BlockMask decides which KV tiles are visited (docs/blockmask.md): full
// blocks skip mask_mod, partial blocks apply it before the running max,
// empty blocks are never loaded. Its lengths must equal L and S, its B and H
// be 1 or the inputs' B and Hq, and its block sizes be multiples of the
// config's BLOCK_M and BLOCK_N. Without a mask every pair is allowed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/Mods.h"

namespace flextile::attention {

struct PagedKV;  // attention_templates/PagedKVCache.h

// One point of the template's tuning space.
// Whether a producer warpgroup of its own fills the K/V rings (codegen/passes/WarpSpecialize.cpp;
// sm_90a with TMA rings only, elsewhere nothing changes). Auto: where no mod reads a captured tensor
// per key (detail::warpSpecializeWanted). FLEXTILE_WARP_SPECIALIZE=1/0 overrides all three.
enum class WarpSpecialization { Auto, Off, On };
// A schedule of a template's inner loop that a config may force on or off; Auto leaves it to the
// template (FLEXTILE_PINGPONG / FLEXTILE_DEFER_ACCUMULATION =0 or =1 override the config).
enum class LoopSchedule { Auto, Off, On };

struct FlexAttentionConfig {
  int64_t block_m = 64;   // queries per program (a power of two >= 16)
  int64_t block_n = 64;   // keys per inner step (a power of two >= 16)
  int num_warps = 4;      // consumer warps (a specialized program launches 4 more)
  int num_stages = 2;     // K/V tiles in flight (1 disables pipelining)
  // Auto: the forward decides (see above); the backward's kernels stay unspecialized unless On.
  WarpSpecialization warp_specialize = WarpSpecialization::Auto;
  // `turns`: the two consumer warpgroups take turns issuing the loop's products (pass "pingpong";
  // On needs 8 warps; the forward's Auto applies them to specialized tiles with an arithmetic
  // score_mod, the backward's Auto is off). `defer`, forward only (backward and decode refuse On):
  // the product P·V of step t is issued after Q·Kᵀ of step t+1 (pass "defer-accumulation"), so the
  // softmax overlaps the tensor cores within a warpgroup.
  LoopSchedule turns = LoopSchedule::Auto;
  LoopSchedule defer = LoopSchedule::Auto;
  // `persistent`, forward only (the backward refuses On): one program per SM walks its share of
  // the query tiles (snake order), and its walks share their K/V rings across tiles, so that the
  // producer loads the next tile's keys during this tile's epilogue (that needs warp
  // specialization and TMA rings; without them the program still loops over its tiles, with
  // nothing to overlap). Auto: on where the turns are, nothing defers the accumulation, no mod
  // reads a captured tensor (detail::persistentWanted) and the rings fit the block's shared memory
  // (the Q ring takes a slot per stage); On with `defer` is refused.
  // FLEXTILE_FORWARD_PERSISTENT=0 or =1 overrides the config.
  LoopSchedule persistent = LoopSchedule::Auto;
  // `skew`, forward only: each iteration of a full walk issues P·V of step t − 1 and then Q·Kᵀ of
  // step t, back to back in one warpgroup turn, so a ring stage holds K_t and V_{t-1} and the
  // scores cross the loop's back edge (FlashAttention-3's order of the two products). The walk's
  // first Q·Kᵀ and last P·V are peeled into loops of at most one iteration; the masks' short
  // partial walks stay unskewed. Auto is off (−15 % on the H200); On with `defer` is refused; a
  // paged K/V ignores it. FLEXTILE_SKEW=0 or =1 overrides the config, =all skews every walk;
  // FLEXTILE_SKEW_OVERLAP=1 also overlaps each step's softmax with the previous step's P·V.
  LoopSchedule skew = LoopSchedule::Auto;
  // `overlap`, forward only: the skewed walks in FlashAttention-3's intra-warpgroup order (Q·Kᵀ of
  // step t, then P·V of step t − 1, the softmax of step t while that product runs). On implies
  // `skew`; with `no-skew` or `defer` it is refused. Auto: on where the warpgroups take turns: no
  // mask +2 %, causal +3.5 %, prefix LM +2.5 %, soft-cap +2.5 % (H200), a window of 1024 (10
  // steps) +1.3 to +2.3 % (H100). FLEXTILE_SKEW_OVERLAP=0 or =1 overrides the config.
  LoopSchedule overlap = LoopSchedule::Auto;
  // "BM128 BN64 w8 s2", then " ws" / " no-ws", " turns" / " no-turns", " defer" / " no-defer",
  // " persistent" / " no-persistent", " skew" / " no-skew", " overlap" / " no-overlap" for the
  // choices that are not Auto.
  std::string describe() const;
  // "BM,BN,W,S" (positive integers), then optionally, in any order, ",ws" / ",no-ws",
  // ",turns" / ",no-turns", ",defer" / ",no-defer", ",persistent" / ",no-persistent", ",skew" /
  // ",no-skew", ",overlap" / ",no-overlap": how the CLI's
  // --config and the benches spell a config. Throws flextile::Error naming the text.
  static FlexAttentionConfig parse(std::string_view text);
  bool operator==(const FlexAttentionConfig&) const = default;
};

// The untuned default for a problem: its dtype and head dim, the target GPU (none: the portable
// default; a target with wgmma takes the points measured on the H200) and how many 128-row query
// tiles the grid holds (B * Hq * ceil(L / 128)). Without a target: 64 x 64, 4 warps, 2 stages
// (BLOCK_N 32 for f32 or D > 128), which runs everywhere.
// `gathersPerElement`: a mod reads a captured tensor per (q, kv) pair (ScoreMod::gathersPerElement);
// those keep the 64-row tile, which the gathers' registers fit (the bias-table example runs 3.3x
// slower on the larger one).
FlexAttentionConfig defaultFlexAttentionConfig(dsl::DType dtype, int64_t headDim,
                                               std::optional<codegen::Target> target = std::nullopt,
                                               int64_t queryTiles = 0, bool gathersPerElement = false);
// Grids of at least this many 128-row query tiles take the larger wgmma tile at D = 128.
inline constexpr int64_t kManyQueryTiles = 1024;
// The config flex_attention runs for these inputs when neither options.config nor a resolver gives
// one (and what autotune starts from): defaultFlexAttentionConfig for the target (the current
// device's when none is given; host tensors take the portable default), narrowed to tile a
// BlockMask with smaller blocks.
FlexAttentionConfig untunedFlexAttentionConfig(const dsl::Tensor& q, const ScoreMod& scoreMod,
                                               const std::optional<BlockMask>& blockMask,
                                               std::optional<codegen::Target> target = std::nullopt);

// Which template runs a call. Auto: the decode template when options give a decode_config or a
// query_offset, or for at most kDecodeMaxQueries queries unless options give a prefill config; the
// prefill template otherwise. Both compute the same function (to rounding).
enum class AttentionTemplate { Auto, Prefill, Decode };
inline constexpr int64_t kDecodeMaxQueries = 16;

// The decode template's tiles (attention_templates/FlexAttentionDecode.cpp): one program per
// (KV split, group of query heads sharing a KV head, batch), whose rows are those heads' queries.
// The members' defaults are a starting point for a config given by hand; without one, a call
// takes defaultFlexDecodeConfig (below), which picks per dtype and head dimension.
struct FlexDecodeConfig {
  int64_t block_n = 64;  // keys per inner step (a power of two >= 16 dividing KV_BLOCK_SIZE)
  int num_warps = 4;
  int num_stages = 3;    // K/V tiles in flight
  // Programs each (batch, head group) row of live blocks is split across; 0: chosen from the
  // BlockMask's live block counts and the GPU's size (decodeSplitCount).
  int64_t splits = 0;
  // With splits 0: the programs an SM the chosen count aims at (decodeSplitCount's aimedPerSm; no
  // more than the ring lets reside). 0: kDecodeProgramsPerSmAimedAt. The best differs by GPU and
  // shape (H100: one an SM for B = 1 and for 2048 keys, two for B = 8 over 32768), which is what
  // `flextile autotune --kernel decode` tunes.
  int programs_per_sm = 0;
  // The splits' merge through thread block clusters (docs/decode.md; sm_90+): On, Off, or Auto,
  // which is Off (19-22 % slower on the H200's long decodes, 2026-12-05).
  // FLEXTILE_DECODE_CLUSTER_MERGE=0/1 overrides it.
  LoopSchedule cluster_merge = LoopSchedule::Auto;
  // The full blocks' K and V filled by TMA from a producer warpgroup of its own, the num_warps warps
  // consuming (sm_90a, a contiguous K/V that TMA can describe; a paged K/V ignores it): On, Off, or
  // Auto, which is Off until measured on a GPU. FLEXTILE_DECODE_WARP_SPECIALIZE=0/1 overrides it.
  WarpSpecialization warp_specialize = WarpSpecialization::Auto;
  // "BN64 w4 s3 splits auto", then " per-sm N", " cluster" / " no-cluster" and " ws" / " no-ws"
  // where said
  std::string describe() const;
  // "BN,W,S[,SPLITS][,per-sm=N][,cluster|,no-cluster][,ws|,no-ws]" (flextile compile --kernel
  // decode --config); throws an Error naming the text and the form. parse(c.text()) == c.
  static FlexDecodeConfig parse(std::string_view text);
  std::string text() const;
  bool operator==(const FlexDecodeConfig&) const = default;
};

// The columns of FlexAttentionOptions::decode_timeline: the GPU's nanosecond clock (%globaltimer)
// when a decode program starts, ends its walk over K/V, has released its partials (the stores
// drained by the fence), starts merging its group (the program that merges; 0 elsewhere) and ends;
// then not a time but the multiprocessor it started on (%smid; 0 on the interpreter).
inline constexpr int kTimelineStart = 0, kTimelineWalked = 1, kTimelineReleased = 2, kTimelineMerging = 3,
                     kTimelineEnd = 4, kTimelineSm = 5, kTimelineSlots = 6;

struct FlexAttentionOptions {
  std::optional<double> scale;                // default 1 / sqrt(D)
  bool return_lse = false;
  // The largest score of each query row over its allowed keys, after score_mod (natural units, the
  // scale applied; -inf for a row with no allowed key), as PyTorch's AuxRequest(max_scores=True):
  // what QK-clip watches per head. flex_attention allocates it ([B, Hq, L] f32, q's memory space)
  // into FlexAttentionResult::max_scores; the _into forms write `max_scores` below instead.
  bool return_max_scores = false;
  // The _into forms' max-scores output, [B, Hq, L] f32 contiguous in q's memory space; empty: none.
  std::optional<dsl::Tensor> max_scores;
  // Attention sinks (GPT-OSS's learned per-head logits): f32 [Hq], contiguous, in q's memory space.
  // Head h's sink joins every row's softmax as one more key, of score sinks[h] (natural units, as
  // the scores after scale and score_mod) and value zero: out = sum_j e^{s_j} v_j / (e^{sink} +
  // sum_j e^{s_j}), lse = log(e^{sink} + sum_j e^{s_j}). A row the mask leaves without keys gets out 0
  // and lse = sinks[h]. Each sink finite or -inf (no sink for that head); the values are read on
  // the device, unchecked (a NaN or +inf gives NaN rows). The backward takes the same tensor and
  // returns its gradient (dsinks).
  std::optional<dsl::Tensor> sinks;
  std::optional<FlexAttentionConfig> config;  // default: a resolver's, else untunedFlexAttentionConfig
  AttentionTemplate kernel = AttentionTemplate::Auto;
  std::optional<FlexDecodeConfig> decode_config;  // the decode template's; default defaultFlexDecodeConfig
  // The global position of q's first row inside the BlockMask's queries, for a mask built for more
  // queries than q has (decode against a mask pre-built at the maximum length, without slicing it):
  // q's L queries are [query_offset, query_offset + L) and must lie inside the mask's. Decode only.
  // Without it the mask must have exactly q's length (sliceRows makes such a mask).
  std::optional<int64_t> query_offset;
  // The same per sequence, for a batch of requests at different positions: i32 [B] in q's memory
  // space, sequence b's queries being [query_offsets[b], query_offsets[b] + L). Decode only; each
  // sequence's queries must lie in one BlockMask row (always true for L = 1). Device values are read
  // by the kernel, so a serving loop can advance them on the GPU without a host round trip.
  std::optional<dsl::Tensor> query_offsets;
  // The stream every launch and copy of the call goes to, in order (the decode template's split and
  // merge kernels, the decode lists' kernel, uploads of per-call data); null: the legacy default
  // stream, as before. A framework's CUstream goes in through runtime::Stream::borrow. Scratch the
  // call reuses from earlier calls (the decode partials, the decode lists' pool) is kept per stream,
  // so calls on two streams never share a buffer (docs/architecture.md, "Streams"). Host tensors
  // ignore it.
  runtime::Stream* stream = nullptr;
  // Diagnostics of the decode template: an i64 [programs, kTimelineSlots] tensor in q's memory
  // space, program (b * groups + group) * splits + split (plan_flex_decode gives the grid), that
  // receives each program's clock at its phases (kTimeline*; 0 in a slot a program does not pass:
  // one split has no partials, and only the last program of a group merges). A separate kernel is
  // compiled for it; the times are what a profiler's timeline shows, inside one launch. Leave it
  // empty outside a bench.
  std::optional<dsl::Tensor> decode_timeline;
};

// What a config resolver sees of a call that gave no config.
struct FlexAttentionProblem {
  dsl::DType dtype;
  int64_t B, Hq, Hkv, L, S, D;
  std::string scoreMod, maskMod;        // the mods' names ("noop", "causal", "sliding_window(1024)", ...)
  std::string captures;                 // dtype and rank of every captured tensor, e.g. "f32[1] i32[2]"
  uint64_t modHash = 0;                 // the structural hashes of both mods, combined (names are for people)
  int64_t qBlockSize, kvBlockSize;      // the BlockMask's block sizes (a config must tile them)
  dsl::MemorySpace space;
  int64_t DV = 0;                       // v's head dim where it differs from D; 0: D

  int64_t valueDim() const { return DV > 0 ? DV : D; }
};
// A hook consulted when options.config is empty: returns a config (e.g. a
// tuned one: autotune/ installs its per-GPU cache here) or nullopt for the
// default. A returned config that is invalid or does not tile the mask is
// ignored. Must be cheap and thread-safe: it runs on every such call.
using FlexAttentionConfigResolver = std::function<std::optional<FlexAttentionConfig>(const FlexAttentionProblem&)>;
void setFlexAttentionConfigResolver(FlexAttentionConfigResolver resolver);  // empty: none
// The same hook for the decode template, consulted when options.decode_config is empty (the
// problem's L is the call's queries; autotune/ installs its per-GPU cache of tuned decode configs).
// A returned config the call cannot take (BLOCK_N not dividing the mask's KV blocks, a bad tile) is
// ignored; a paged call still narrows its BLOCK_N to the page size. `mayAnswer`, when given, says
// cheaply whether the resolver could answer at all (a tune cache with entries): a decode step's
// host path is a few microseconds, and the problem (the mods' names and hashes) costs ~0.5 of them.
using FlexDecodeConfigResolver = std::function<std::optional<FlexDecodeConfig>(const FlexAttentionProblem&)>;
void setFlexDecodeConfigResolver(FlexDecodeConfigResolver resolver,  // empty: none
                                 std::function<bool()> mayAnswer = {});
// The problem a resolver sees for these inputs (the autotuner keys its cache by it); with `v`, its
// head dim where it differs from q's (FlexAttentionProblem::DV).
FlexAttentionProblem flexAttentionProblem(const dsl::Tensor& q, const dsl::Tensor& k, const ScoreMod& scoreMod,
                                          const std::optional<BlockMask>& blockMask);
FlexAttentionProblem flexAttentionProblem(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                          const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask);

struct FlexAttentionResult {
  dsl::Tensor out;  // [B, Hq, L, D], q's dtype, contiguous, q's memory space
  dsl::Tensor lse;  // [B, Hq, L] f32 (natural log) when return_lse, else empty
  dsl::Tensor max_scores;  // [B, Hq, L] f32 when return_max_scores, else empty
};

FlexAttentionResult flex_attention(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                   const ScoreMod& scoreMod = noop_score(),
                                   const std::optional<BlockMask>& blockMask = std::nullopt,
                                   const FlexAttentionOptions& options = {});

// The same into caller-owned outputs: out [B, Hq, L, D] of q's dtype (last
// dim contiguous), lse [B, Hq, L] f32 contiguous or nullptr. Nothing is
// allocated on a repeated call, so benchmarks time the kernel alone.
void flex_attention_into(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v, const ScoreMod& scoreMod,
                         const std::optional<BlockMask>& blockMask, dsl::Tensor& out, dsl::Tensor* lse,
                         const FlexAttentionOptions& options = {});

// The same over a paged K/V (attention_templates/PagedKVCache.h, docs/paged-kv.md): keys and
// values are read through kv.pageTable inside the kernel, never gathered into a contiguous copy.
// kv's page table has q's batch B, its storage q's dtype, head dim and memory space, and its kv
// heads divide Hq. Everything above holds with S = kv.length and the keys of batch b cut at
// kv.lengths[b] (when given) exactly as keys past S are: score_mod and mask_mod see logical key
// positions, and the BlockMask (kvLen = kv.length) is logical too: it is used as it is, never
// converted to physical blocks. Without a config, BLOCK_N is narrowed to the page size so that
// each inner step reads one page (one table load per step, pipelined like the block index); a
// given config with BLOCK_N above the page size reads the table per key, which is correct but
// keeps K and V out of the software pipeline.
FlexAttentionResult flex_attention(const dsl::Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod = noop_score(),
                                   const std::optional<BlockMask>& blockMask = std::nullopt,
                                   const FlexAttentionOptions& options = {});
void flex_attention_into(const dsl::Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                         const std::optional<BlockMask>& blockMask, dsl::Tensor& out, dsl::Tensor* lse,
                         const FlexAttentionOptions& options = {});

// What flex_attention would run, without running it: the traced IR and the
// compiled kernel (for `flextile compile`, the tests and the docs). Compiling
// needs no GPU when a target is given.
struct FlexAttentionPlan {
  std::string kernelName;
  FlexAttentionConfig config;
  // The traced tile IR, before passes (ir::printFunction prints it). Owned by the forward kernel,
  // which lives as long as the mods; not printed here, since a plan is made on every call.
  const ir::Function* traced = nullptr;
  const codegen::CompiledKernel* compiled = nullptr;  // null unless compiled (device inputs)
  // Persistent programs launched (FlexAttentionConfig::persistent as resolved for this call: one
  // per SM, at most one per query tile); 0 for a program per query tile.
  int64_t persistentPrograms = 0;
  // Whether the persistent programs cut their last round's steps evenly among them (Stream-K) and a
  // second kernel, "flex_fwd_last_round_merge_<dtype>", folds the pieces (docs/performance.md).
  bool lastRoundSplit = false;
  // That merge kernel, compiled, when the call splits and the plan compiles (null otherwise).
  const codegen::CompiledKernel* mergeCompiled = nullptr;
};
FlexAttentionPlan plan_flex_attention(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                      const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                                      const FlexAttentionOptions& options = {}, bool compile = false,
                                      std::optional<codegen::Target> target = std::nullopt);
// The plan of flex_attention over a paged K/V (its own kernel, "flex_fwd_paged_...").
FlexAttentionPlan plan_flex_attention(const dsl::Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                                      const std::optional<BlockMask>& blockMask,
                                      const FlexAttentionOptions& options = {}, bool compile = false,
                                      std::optional<codegen::Target> target = std::nullopt);

// The forward kernel flex_attention has traced for this pair of mods and
// dtype, or nullptr (it lives in the mask mod's state, keyed by the score
// mod's). `paged`: the kernel of paged K/V inputs. For tests and tools that
// count traces and compilations.
const dsl::Kernel* cachedForwardKernel(const MaskMod& maskMod, const ScoreMod& scoreMod, dsl::DType dtype,
                                       bool paged = false);

// ---- backward (attention_templates/FlexAttentionBackward.cpp) ----------------
//
//   auto fwd = flex_attention(q, k, v, score, mask, {.return_lse = true});
//   FlexAttentionGrads g = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, score, mask);
//   g.dq, g.dk, g.dv;            // q's dtype; dk/dv [B, Hkv, S, D] summed over each GQA group
//   g.grad(bias);                // f32, bias's shape: for captures made with {.requires_grad = true}
//
// The gradients of loss(out, lse) given dout = dloss/dout (and optionally dlse = dloss/dlse).
// score_mod is differentiated from its own traced IR (ir/passes/ReverseMode.h); mask_mod needs
// no derivative. Three kernels run in order: a preprocess (delta = rowsum(dout * out) - dlse), one
// program per KV tile walking the BlockMask's transposed lists for dK and dV (and the scatter of
// captured-tensor gradients), and one program per query tile walking the forward lists for dQ.
// dQ, dK and dV are bitwise deterministic (each element is written by one program, accumulated in
// a fixed order); captured gradients are f32 atomics unless `deterministic` (docs/backward.md).

// Tiles of the two gradient kernels. dkdv: block_n keys per program, block_m queries per inner
// step; dq: block_m queries per program, block_n keys per inner step. Both must tile the
// BlockMask's blocks as the forward's config does.
struct FlexAttentionBackwardConfig {
  FlexAttentionConfig dkdv{64, 64, 4, 2};
  FlexAttentionConfig dq{64, 64, 4, 2};
  std::string describe() const;  // "dkdv BM64 BN64 w4 s2 / dq BM128 BN64 w8 s2 ws"
  bool operator==(const FlexAttentionBackwardConfig&) const = default;
};

// How the backward sums dQ over the key blocks.
enum class DqAccumulation {
  // A dq kernel per query tile walks the forward lists and sums dQ in registers (it computes Q·Kᵀ
  // and dO·Vᵀ again): written once, bitwise reproducible. The default.
  Separate,
  // The dkdv programs add their dS·K to an f32 buffer with atomics, and a cast writes dQ: five
  // products instead of seven, but the order of the adds (and so the last bits of dQ) varies
  // from run to run. Not with `deterministic`. On sm_90a each step's dQ tile goes to L2 by TMA
  // reductions; at D = 128 that measured 1.00-1.07x of Separate without a mask and 1.07x causal
  // (H100, 2026-12-07; bench/RESULTS.md). Separate stays the default for its reproducibility.
  Atomic,
};

// The untuned backward config for a dtype, head dim and target GPU (none: the portable one; a
// target with wgmma takes the H200's measured point), for mods that read a captured tensor per
// score (ScoreMod::gathersPerElement), and for how dQ is summed (atomic dQ keeps the dkdv tile its
// bulk reductions were measured with). `headDim` is q's head dim, and v's too unless
// `valueHeadDim` gives v's (MLA: 192 and 128).
FlexAttentionBackwardConfig defaultFlexAttentionBackwardConfig(dsl::DType dtype, int64_t headDim,
                                                               std::optional<codegen::Target> target = std::nullopt,
                                                               bool gathersPerElement = false,
                                                               DqAccumulation dq = DqAccumulation::Separate,
                                                               std::optional<int64_t> valueHeadDim = std::nullopt);

struct FlexAttentionBackwardOptions {
  std::optional<double> scale;  // must be the forward's (default 1 / sqrt(D))
  DqAccumulation dq_accumulation = DqAccumulation::Separate;
  // Captured-tensor gradients accumulated in 64-bit fixed point (2^-32 resolution, |total| < 2^31)
  // instead of f32 atomics, so they too are bitwise identical from run to run.
  bool deterministic = false;
  std::optional<dsl::Tensor> dlse;  // dloss/dlse [B, Hq, L] f32, when the LSE output is used
  // The forward's FlexAttentionOptions::sinks, when it had them: dQ, dK and dV need nothing more
  // (its lse includes them), and FlexAttentionGrads::dsinks receives their gradient,
  // -sum over b and i of e^{sinks[h] - lse_bhi} delta_bhi, summed per head in a fixed order.
  std::optional<dsl::Tensor> sinks;
  std::optional<FlexAttentionBackwardConfig> config;
  // Where the backward's kernels, the zeroing of its gradient accumulators and its f32 conversions
  // run, in order (FlexAttentionOptions::stream).
  runtime::Stream* stream = nullptr;
};

struct FlexAttentionGrads {
  dsl::Tensor dq;  // [B, Hq, L, D]
  dsl::Tensor dk;  // [B, Hkv, S, D]
  dsl::Tensor dv;  // [B, Hkv, S, DV]: v's head dim
  // The score_mod's trainable captures (in its captures() order) and their f32 gradients.
  std::vector<dsl::CapturedTensor> trainable;
  std::vector<dsl::Tensor> captureGrads;
  // [Hq] f32 with options.sinks, else empty. The _into form writes a dsinks of that kind it is given
  // (a training loop's last), else allocates one.
  dsl::Tensor dsinks;
  // The gradient of one trainable capture; an error for a capture that is not one.
  const dsl::Tensor& grad(const dsl::CapturedTensor& capture) const;
};

// out and lse are the forward's outputs for these inputs (flex_attention with return_lse), dout
// the gradient of the loss with respect to out (q's dtype, [B, Hq, L, D]).
FlexAttentionGrads flex_attention_backward(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                           const dsl::Tensor& out, const dsl::Tensor& lse, const dsl::Tensor& dout,
                                           const ScoreMod& scoreMod = noop_score(),
                                           const std::optional<BlockMask>& blockMask = std::nullopt,
                                           const FlexAttentionBackwardOptions& options = {});
// The same into caller-owned dq [B, Hq, L, D], dk and dv [B, Hkv, S, D] (q's dtype, contiguous, in
// q's memory space: grads.dq, grads.dk, grads.dv); the captured gradients are allocated.
void flex_attention_backward_into(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                  const dsl::Tensor& out, const dsl::Tensor& lse, const dsl::Tensor& dout,
                                  const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                                  FlexAttentionGrads& grads, const FlexAttentionBackwardOptions& options = {});
// The same hook as setFlexAttentionConfigResolver for the backward: consulted when options.config
// is empty and dQ is summed by the dq kernel (DqAccumulation::Separate); autotune/ installs its
// per-GPU cache of tuned (dkdv, dq) pairs here. A pair the call cannot take (a tile that does not
// tile the mask, a forward-only schedule) is ignored, and the call runs its default.
using FlexAttentionBackwardConfigResolver =
    std::function<std::optional<FlexAttentionBackwardConfig>(const FlexAttentionProblem&)>;
void setFlexAttentionBackwardConfigResolver(FlexAttentionBackwardConfigResolver resolver);  // empty: none
// The backward's kernels compiled for `target` (the current GPU's when none), without running
// them: for `flextile compile`, the ptxas tests and the docs. Any tensors of the right shapes do.
struct FlexAttentionBackwardPlan {
  FlexAttentionBackwardConfig config;
  std::vector<std::string> kernelNames;                    // in launch order
  // One per launch; owned by the kernels, which live in the mask mod's state: valid while the mods
  // (a copy of the BlockMask or of its maskMod()) are.
  std::vector<const codegen::CompiledKernel*> compiled;
};
FlexAttentionBackwardPlan plan_flex_attention_backward(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                                       const dsl::Tensor& out, const dsl::Tensor& lse,
                                                       const dsl::Tensor& dout, const ScoreMod& scoreMod,
                                                       const std::optional<BlockMask>& blockMask,
                                                       const FlexAttentionBackwardOptions& options = {},
                                                       std::optional<codegen::Target> target = std::nullopt);

// ---- decode (attention_templates/FlexAttentionDecode.cpp) --------------------
//
// A few queries per head (decoding, L <= kDecodeMaxQueries) against a long KV: flex_attention runs
// this template by itself for small L (options.kernel overrides). The query heads of one GQA group
// share the rows of one program, so K and V are read once per group; the live KV blocks of a
// BlockMask row are split across programs, each writing a partial (lse, out) per query, and the
// last program of each group to finish (an atomic ticket) combines them exactly, in the same
// kernel: out = sum_s 2^(lse_s - LSE) out_s, LSE = log2 sum_s 2^lse_s.
// Which blocks are live is computed for the call's queries exactly (DecodeLists.h).

// The decode config for a dtype and head dim (the split count is chosen per call: splits 0).
FlexDecodeConfig defaultFlexDecodeConfig(dsl::DType dtype, int64_t headDim);
// Splits for `programsPerSplit` programs (B x head groups) over rows of at most `liveSteps` inner
// steps (live blocks x KV_BLOCK_SIZE / BLOCK_N: the BlockMask's counts, never the raw KV length),
// on a GPU of `multiprocessors` SMs (0: the interpreter, one split), `programsPerSm` of them
// resident on each (decodeProgramsPerSm), of which at most `aimedPerSm` are aimed at: the count
// whose waves x steps per program is least.
inline constexpr int64_t kDecodeProgramsPerSmAimedAt = 2;
int64_t decodeSplitCount(int64_t programsPerSplit, int64_t liveSteps, int multiprocessors, int64_t programsPerSm,
                         int64_t aimedPerSm = kDecodeProgramsPerSmAimedAt);
// Decode programs of `numWarps` warps whose K/V ring takes `ringBytes` that one SM of `arch` keeps
// resident: as many as its shared memory holds (each with the system's per-block reservation), at
// most 8, but no more than leave each thread 128 registers. The kernel asks ptxas for this
// residency (min_programs_per_sm), so registers never lower it.
// `producerWarps`: a specialized program's producer warpgroup (4 warps at the producer's 24
// registers a thread) besides its num_warps consumers.
int64_t decodeProgramsPerSm(int64_t ringBytes, int numWarps, const codegen::TargetDescription& arch,
                            int producerWarps = 0);

// What the decode template would run for these inputs (names, the split count, the configs), for
// tests, tools and the docs; nothing is launched.
struct FlexDecodePlan {
  FlexDecodeConfig config;  // with splits resolved
  int64_t headsPerProgram = 1, rowsPerProgram = 16;
  // The programs of a thread block cluster that merges the splits (docs/decode.md): 0 without one
  // (one split, or the fused ticket merge alone); with more splits than this, the clusters' folds
  // then take tickets.
  int64_t clusterSize = 0;
  std::vector<std::string> kernelNames;  // in launch order (one: the merge is fused into the kernel)
  const ir::Function* traced = nullptr;  // the split kernel's traced IR (owned by its kernel)
  // With a target: each launch compiled for it (no GPU needed), owned by the kernels.
  std::vector<const codegen::CompiledKernel*> compiled;
};
FlexDecodePlan plan_flex_decode(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                                const FlexAttentionOptions& options = {},
                                std::optional<codegen::Target> target = std::nullopt);

// FLOPs of one forward call as DESIGN.md counts them: 4 * B * Hq * D times
// the number of (query, key) pairs the mask allows per head (dense: L * S),
// counted exactly from the mask (evaluating mask_mod on the host is too slow,
// so the caller gives the count; countAllowedPairs in Reference.h makes it).
// Where v's head dim DV differs, 2 * D a pair for Q·Kᵀ and 2 * DV for P·V (DV 0: D).
inline double flexAttentionFlops(int64_t B, int64_t Hq, int64_t D, double allowedPairsPerHead, int64_t DV = 0) {
  return 2.0 * double(B) * double(Hq) * double(D + (DV > 0 ? DV : D)) * allowedPairsPerHead;
}
// The backward's FLOPs (DESIGN.md): 2.5 times the forward's, whatever the kernels recompute.
inline double flexAttentionBackwardFlops(int64_t B, int64_t Hq, int64_t D, double allowedPairsPerHead,
                                         int64_t DV = 0) {
  return 2.5 * flexAttentionFlops(B, Hq, D, allowedPairsPerHead, DV);
}

}  // namespace flextile::attention
