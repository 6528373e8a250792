// The decode template of flex_attention (FlexAttention.h, "decode"): split-KV attention for a few
// queries per head against a long KV.
//
// Split kernel: one program per (split s, group of HP query heads sharing one KV head, batch).
// Its BM rows are the HP heads' L queries (row r: head hg*HP + r / L, query r % L; rows past HP*L
// repeat the last real row and are never stored), so each K/V tile is loaded once for the whole
// group. The program walks its share of the row's live blocks — the partial list's inner steps,
// then the full list's, laid end to end and cut into `splits` equal contiguous runs, so the order is
// stable and no program has more than its share — with the forward's online softmax in the exp2
// domain.
// With one split it writes out and lse itself; otherwise a partial (out_s = acc / l, lse_s =
// m + log2 l) per (row, split), and the last of a group's programs to finish merges them.
//
// The merge, fused: each program of a (group, batch) writes its partials, then takes a ticket
// from the group's counter (atomic_add); the program that draws ticket splits - 1 knows every
// other program's partials are written, merges the group's rows and resets the counter to 0
// (self-cleaning: the counters are zeroed once, when allocated). Per row, in split order, it
// folds the partials by the online-softmax rule: LSE = log2 sum_s 2^lse_s and out = sum_s
// 2^(lse_s - LSE) out_s — exact, never an average of softmaxes, and independent of which program
// came last. Empty splits have lse_s = -inf and weigh nothing; a row with no live key anywhere
// ends with out 0, lse -inf.
//
// Why the last program sees the others' partials (the PTX memory model's release/acquire, the
// pattern of CUDA's grid synchronization): a writer's partial stores come before a barrier of the
// program, and the barrier before thread 0's ticket, an atom.acq_rel.gpu (codegen/LowerAtomic.cpp):
// its release is cumulative, so it covers every thread's stores. The last program's ticket reads a
// value that every writer's ticket precedes (the model's observation order runs along the chain of
// atomics on one counter), and its acquire, passed to the program's other threads by the barrier
// that shares the ticket's value, orders the merge's loads after every writer's stores.
// (FLEXTILE_DECODE_ACQREL_TICKET=0 takes the older form: a fence of every thread — bar.sync,
// fence.acq_rel.gpu, bar.sync — on each side of a relaxed ticket, as in CUDA's
// threadFenceReduction sample.)
// Those loads are plain ld.global (LowerMemory never emits ld.global.nc, and the pointers are
// not noalias), coherent at L2 once ordered by the acquire. The ticket reaches all of the
// program's threads through shared memory (one uniform value), so the merge's branch is taken
// by the whole program or by none of it.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>

#include "attention_templates/DecodeLists.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/TemplateParams.h"
#include "runtime/Device.h"
#include "runtime/Stream.h"

namespace flextile::attention {

using namespace flextile::dsl;
using namespace flextile::attention::tmpl;

std::string FlexDecodeConfig::describe() const {
  return "BN" + std::to_string(block_n) + " w" + std::to_string(num_warps) + " s" + std::to_string(num_stages) +
         " splits " + (splits > 0 ? std::to_string(splits) : std::string("auto")) +
         (programs_per_sm > 0 ? " per-sm " + std::to_string(programs_per_sm) : std::string()) +
         (cluster_merge == LoopSchedule::On ? " cluster" : cluster_merge == LoopSchedule::Off ? " no-cluster" : "") +
         (warp_specialize == WarpSpecialization::On ? " ws" : warp_specialize == WarpSpecialization::Off ? " no-ws" : "");
}

std::string FlexDecodeConfig::text() const {
  return std::to_string(block_n) + "," + std::to_string(num_warps) + "," + std::to_string(num_stages) + "," +
         std::to_string(splits) + (programs_per_sm > 0 ? ",per-sm=" + std::to_string(programs_per_sm) : "") +
         (cluster_merge == LoopSchedule::On ? ",cluster" : cluster_merge == LoopSchedule::Off ? ",no-cluster" : "") +
         (warp_specialize == WarpSpecialization::On ? ",ws" : warp_specialize == WarpSpecialization::Off ? ",no-ws" : "");
}

FlexDecodeConfig FlexDecodeConfig::parse(std::string_view text) {
  const std::string usage = "decode config '" + std::string(text) +
                            "': expects BN,W,S (three positive integers), then optionally SPLITS (0 chooses), then "
                            "optionally ,per-sm=N (1 to 8), ,cluster or ,no-cluster and ,ws or ,no-ws";
  std::vector<std::string> items = detail::configItems(text);
  FlexDecodeConfig c;
  bool clusterSaid = false, wsSaid = false, perSmSaid = false;
  while (!items.empty() && items.back().find_first_not_of("0123456789") != std::string::npos) {
    const std::string& word = items.back();
    if (word.starts_with("per-sm=") && !perSmSaid) {
      const std::optional<int64_t> n = detail::configInteger(word.substr(7));
      if (!n || *n < 1 || *n > 8) throw Error(usage);
      c.programs_per_sm = int(*n);
      perSmSaid = true;
    } else if ((word == "cluster" || word == "no-cluster") && !clusterSaid) {
      c.cluster_merge = word == "cluster" ? LoopSchedule::On : LoopSchedule::Off;
      clusterSaid = true;
    } else if ((word == "ws" || word == "no-ws") && !wsSaid) {
      c.warp_specialize = word == "ws" ? WarpSpecialization::On : WarpSpecialization::Off;
      wsSaid = true;
    } else {
      throw Error(usage);
    }
    items.pop_back();
  }
  if (items.size() < 3 || items.size() > 4) throw Error(usage);
  std::vector<int64_t> v;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::optional<int64_t> x = detail::configInteger(items[i]);
    if (!x || *x < (i == 3 ? 0 : 1) || *x > (1 << 20)) throw Error(usage);
    v.push_back(*x);
  }
  c.block_n = v[0], c.num_warps = int(v[1]), c.num_stages = int(v[2]), c.splits = v.size() > 3 ? v[3] : 0;
  return c;
}

FlexDecodeConfig defaultFlexDecodeConfig(DType dtype, int64_t headDim) {
  // A decode program waits on its K/V loads: what matters is bytes in flight per SM. Warps beyond
  // BM / 16 compute the same rows again (the chained-dot warp split puts warps along M only) but
  // issue their share of the loads.
  // Past D = 128, 32-key steps keep the ring at D = 128's 64 KB; the H100 read the same bytes at D = 256 as fast as
  // at 128 (3.11 against 3.13 TB/s, bench/RESULTS.md 2026-12-07) and its tuner kept this point.
  if (headDim > 128 || ir::byteWidth(dtype) == 4) return {32, 4, 2, 0};
  // The H200 sweep (bench/RESULTS.md, 2026-12-01; B=8 Hq=32 Hkv=8 S=32768 D=128): 64-key steps on
  // one warpgroup with two stages in flight (a 64 KB ring, three programs per SM) led at 4.37 TB/s,
  // 128-key steps on two warpgroups (one 128 KB ring per SM) reached 4.31; both need the split
  // count to fill whole waves (decodeSplitCount). No other GPU has been measured: the same point
  // serves every target until one is.
  return {64, 4, 2, 0};
}

int64_t decodeProgramsPerSm(int64_t ringBytes, int numWarps, const codegen::TargetDescription& arch,
                            int producerWarps) {
  // The rest of a decode program's shared memory (the cross-warp reductions) is small. 128 registers
  // a thread is the template's floor, well under the architecture's ceiling (registersPerThread);
  // a producer keeps the warp-specialize pass's 24.
  constexpr int64_t kRegistersPerThread = 128, kProducerRegisters = 24;
  const int64_t perProgram = std::max<int64_t>(1, ringBytes) + arch.reservedSharedBytesPerBlock;
  const int64_t byShared = std::clamp<int64_t>(arch.sharedBytesPerSm / perProgram, 1, 8);
  const int64_t registers =
      32 * (kRegistersPerThread * std::max(1, numWarps) + kProducerRegisters * std::max(0, producerWarps));
  const int64_t byRegisters = std::max<int64_t>(1, arch.registersPerSm / registers);
  return std::min(byShared, byRegisters);
}

int64_t decodeSplitCount(int64_t programsPerSplit, int64_t liveSteps, int multiprocessors, int64_t programsPerSm,
                         int64_t aimedPerSm) {
  if (multiprocessors <= 0 || liveSteps <= 1 || programsPerSplit < 1) return 1;
  // At most 128 splits: the last program of a group folds them all.
  constexpr int64_t kMinStepsPerSplit = 4;
  // Two programs an SM, not every slot the ring allows: with two stages in flight each, two keep an
  // SM's share of the bandwidth busy, and a third only adds partials and merge work (H100,
  // 2026-12-05, two processes each: at three an SM the window took 53.9-54.2 µs against 52.8-52.9
  // at two, the long decode 356.4 against 352.1-352.4, B = 1 55.6 against 53.3, S = 2048 31.5
  // against 31.0; five splits, three programs on some SMs and two on others, lost 3.5 %; on the
  // H200 four splits of the window were level with six, and led on the long decode, 2026-12-01/04).
  // (FLEXTILE_DECODE_FILL_SLOTS=1 aims at every slot again, for the A/B on other GPUs.)
  const int64_t slots = int64_t(multiprocessors) * std::clamp<int64_t>(programsPerSm, 1, std::max<int64_t>(1, aimedPerSm));
  const int64_t most = std::clamp<int64_t>(liveSteps / kMinStepsPerSplit, 1, 128);
  // The time of a grid is about its waves times the steps of one program; a split more costs its
  // partials and a round of the merge, so ties (within 3 %) go to fewer splits.
  int64_t best = 1;
  double bestCost = INFINITY;
  for (int64_t s = 1; s <= most; ++s) {
    const double waves = double(cdiv(programsPerSplit * s, slots));
    const double cost = waves * double(cdiv(liveSteps, s)) * (1.0 + 0.002 * double(s));
    if (cost < bestCost * 0.97) best = s, bestCost = cost;
  }
  return best;
}

namespace {

// The shared memory of a decode program's K/V ring.
int64_t ringBytes(const FlexDecodeConfig& c, int64_t paddedD, DType dt) {
  return int64_t(c.num_stages) * 2 * c.block_n * paddedD * ir::byteWidth(dt);
}

// ---- kernel parameters -------------------------------------------------------

template <template <class> class P>
struct DecodeParams {
  BOOST_HANA_DEFINE_STRUCT(DecodeParams, (P<Data>, q), (P<Data>, k), (P<Data>, v), (P<Data>, out), (P<F32Ptr>, lse),
                           (P<F32Ptr>, part_out), (P<F32Ptr>, part_lse), (P<I32Ptr>, merge_counters),
                           (P<I32Ptr>, kv_num),
                           (P<I32Ptr>, kv_indices), (P<I32Ptr>, full_kv_num), (P<I32Ptr>, full_kv_indices),
                           (P<I32>, list_b_stride), (P<I32>, list_h_stride), (P<I32>, list_row),
                           (P<I32>, list_kv_blocks), (P<I32Ptr>, q_offsets), (P<I32>, mask_row_start),
                           (P<I32>, mask_q_blocks),
                           (P<I32>, q_len), (P<I32>, kv_len), (P<I32>, q_offset), (P<I32>, q_stride_b),
                           (P<I32>, q_stride_h), (P<I32>, q_stride_m), (P<I32>, k_stride_b), (P<I32>, k_stride_h),
                           (P<I32>, k_stride_n), (P<I32>, v_stride_b), (P<I32>, v_stride_h), (P<I32>, v_stride_n),
                           (P<I32>, out_stride_b), (P<I32>, out_stride_h), (P<I32>, out_stride_m),
                           (P<I32>, q_heads), (P<F32>, scale),
                           (P<I64Ptr>, timeline), (P<F32Ptr>, max_scores), (P<F32Ptr>, part_max));
};

struct DecodeConstants {
  BOOST_HANA_DEFINE_STRUCT(DecodeConstants, (int64_t, BM), (int64_t, BN), (int64_t, D), (int64_t, DP), (int64_t, G),
                           (int64_t, HP), (int64_t, LQ), (int64_t, KVBS), (int64_t, hasScoreMod), (int64_t, hasLse),
                           (int64_t, kvDivisible), (int64_t, hasFull), (int64_t, hasPartial), (int64_t, split),
                           (int64_t, QBS), (int64_t, perSequenceOffsets), (int64_t, PPSM),
                           (int64_t, programmaticLaunch), (int64_t, partialFirst), (int64_t, clusterMerge),
                           (int64_t, clusterTickets), (int64_t, warpSpecialize),
                           (int64_t, timeline), (int64_t, acqRelTicket), (int64_t, DV), (int64_t, DVP),
                           (int64_t, hasMaxScores), (int64_t, hasSinks));
};

// ---- traced kernels ----------------------------------------------------------

// The merge, run by the last program of a (group, batch): its HP * L real rows, MC at a time, each
// folding the `splits` partials in split order by the online-softmax rule (running maximum,
// rescaled sum and accumulator). A round loads `perRound` splits' partials at once, so the program
// waits on one L2 round trip per that many splits, not one per split: the loaded partials of a
// round take about 64 registers a thread, so few rows (GQA 4:1 at L = 1 has four) load many splits
// a round — B = 1 over 32768 keys has 47 splits, three rounds of 16 — and 16 rows load four.
void mergeGroupRows(const DecodeConstants& k, const DecodeParams<Traced>& p, const SinkParams<Traced>* sinks,
                    const Tile& b, const Tile& group, const Tile& splits, DType dt, int numWarps) {
  const int64_t realRows = k.HP * k.LQ;
  int64_t MC = 4;
  while (MC < std::min<int64_t>(realRows, 16)) MC *= 2;
  const int64_t perRound = std::clamp<int64_t>(64 * 32 * numWarps / (MC * k.DVP), 1, 16);
  Tile offsD = arange(0, k.DVP);  // the partials' and the output's columns: v's head dim
  Tile dLive = offsD < k.DV;
  for_range(0, cdiv(realRows, MC), 1, [&](Tile chunk) {
    Tile rows = chunk * MC + arange(0, MC);
    Tile rowLive = rows < realRows;
    Tile r = minimum(rows, realRows - 1);  // rows past the real ones: valid addresses, never read
    Tile head = group * k.HP + r / k.LQ, query = r % k.LQ;
    Tile rowId = (b * p.q_heads + head) * p.q_len + query;
    Tile firstSlot = rowId.to(DType::I64) * splits;
    // The running max and sum, and each partial's lse, are [MC, DP] with the row's value along D:
    // every thread reads the lse of the rows it holds (a warp's repeated addresses are one
    // transaction), so a weight never crosses threads. As [MC] tiles each partial's weight met its
    // partial through a shared-memory conversion, two barriers apiece, 16 a round; without them the
    // window was level and B = 1 (two rounds) 1 % faster (H100, 2026-12-06): the merge's time is its
    // L2 round trip.
    const Shape byRowAndD{MC, k.DVP};
    Tile m0 = full(byRowAndD, -INFINITY, DType::F32), l0 = zeros(byRowAndD, DType::F32), a0 = zeros(byRowAndD, DType::F32);
    Tile rounds = (splits + (perRound - 1)) / perRound;
    // (With max scores the splits' maxima ride along, [MC, DP] as the lses are; -inf where none.)
    std::vector<Tile> st{m0, l0, a0};
    if (k.hasMaxScores) st.push_back(full(byRowAndD, -INFINITY, DType::F32));
    st = for_range(0, rounds, 1, st, [&](Tile round, const std::vector<Tile>& c) {
      // Every load of the round first (independent of each other and of the fold), then the fold.
      std::vector<Tile> lse, part, best;
      for (int64_t u = 0; u < perRound; ++u) {
        Tile s = round * perRound + u;
        // Past the last split or the real rows: lse -inf, weight 0, nothing read.
        Tile live = rowLive & (s < splits);
        Tile slot = firstSlot + s.to(DType::I64);
        lse.push_back(load(p.part_lse + slot.expand(1).broadcast_to(byRowAndD), live.expand(1), -INFINITY));
        part.push_back(load(p.part_out + (slot.expand(1) * k.DVP + offsD.expand(0)), live.expand(1), 0.0));
        if (k.hasMaxScores)
          best.push_back(load(p.part_max + slot.expand(1).broadcast_to(byRowAndD), live.expand(1), -INFINITY));
      }
      return detail::foldPartialsAndMaxima(c, lse, part, best);
    });
    Tile m = st[0], l = st[1];
    std::vector<Tile> acc{st[2]};
    if (k.hasSinks) detail::foldSink(m, l, acc, (load(sinks->sinks + head) * std::numbers::log2e).expand(1));
    Tile empty = l == 0.0;
    Tile out = acc[0] * (1.0 / where(empty, 1.0, l));
    Tile oRows = b.to(DType::I64) * p.out_stride_b + head.to(DType::I64) * p.out_stride_h +
                 (query * p.out_stride_m).to(DType::I64);
    Tile oMask = k.DVP != k.DV ? rowLive.expand(1) & dLive.expand(0) : rowLive.expand(1);
    store(p.out + (oRows.expand(1) + offsD.expand(0)), out.to(dt), oMask);
    if (k.hasLse)  // one store a row: column 0's
      store(p.lse + rowId.to(DType::I64).expand(1).broadcast_to(byRowAndD), detail::rowLse(m, l, empty, /*natural=*/true),
            rowLive.expand(1) & (offsD == 0).expand(0));
    if (k.hasMaxScores)  // (already natural: each split's is)
      store(p.max_scores + rowId.to(DType::I64).expand(1).broadcast_to(byRowAndD), st[3],
            rowLive.expand(1) & (offsD == 0).expand(0));
  });
}

// `paged`: K/V are read through a page table (PagedKvParams and PagedKvConstants follow the
// template's own); the mods and the lists keep seeing logical key positions.
void traceDecode(ir::Function& f, const std::vector<int64_t>& constants, DType dt, const ScoreMod& scoreMod,
                 const MaskMod& maskMod, bool paged) {
  // Q stays in registers as the A operand of Q·Kᵀ, as in the forward (codegen/TensorCores.h).
  f.attrs()["wgmma_register_a"] = int64_t(1);
  f.attrs()["reassociate"] = int64_t(1);  // fold-scales: the scale and log2e meet the mod's factors
  const size_t own = constantCount<DecodeConstants>();
  const auto k = constantsFrom<DecodeConstants>(std::vector<int64_t>(constants.begin(), constants.begin() + std::ptrdiff_t(own)));
  // A decode program waits on memory: the residency its ring allows on the target (PPSM, from
  // decodeProgramsPerSm) is what keeps the SM's loads in flight, so registers must not lower it (the
  // driver's JIT otherwise may). 0: planned for no GPU (the interpreter), nothing to ask. Asked for
  // programs of one mma tile of rows (16: GQA up to 16 heads x queries), whose registers fit it
  // with room to spare (offline ptxas: 114-157 at D = 64 and 128); more rows need more registers
  // than three programs leave (32 rows at D = 128 spilled 112 bytes at 168, 128 rows 4 KB), so
  // those keep ptxas's own choice.
  if (k.PPSM > 0 && k.BM <= 16) f.attrs()["min_programs_per_sm"] = k.PPSM;
  if (k.warpSpecialize) {
    // The full walk's rings by TMA from a producer warpgroup. Its loop reduces rows and converts P
    // across warps through shared memory, which the pipeline gives TMA only with a producer.
    f.attrs()["tma"] = int64_t(1);
    f.attrs()["warp_specialize"] = int64_t(1);
    f.attrs()["tma_in_staging_loops"] = int64_t(1);
  }
  const auto p = declareParams<DecodeParams>(f, dt);
  std::optional<PagedKvConstants> pc;
  std::optional<PagedKvParams<Traced>> pp;
  if (paged) {
    pc = constantsFrom<PagedKvConstants>(std::vector<int64_t>(constants.begin() + std::ptrdiff_t(own), constants.end()));
    pp = declareParams<PagedKvParams>(f, dt);
  }
  std::optional<SinkParams<Traced>> sinks;
  if (k.hasSinks) sinks = declareParams<SinkParams>(f, dt);
  const double log2e = std::numbers::log2e;

  // Programmatic dependent launch: the program waits here, before its first global access, for
  // the stream's previous kernel (which may write the cache, the queries or the lists), and lets
  // the next kernel start launching once its walk is done (below).
  if (k.programmaticLaunch) wait_for_prior_grids();
  // FlexAttentionOptions::decode_timeline: the clock at the program's phases (kTimeline* slots),
  // stored at its end.
  std::optional<Tile> stamps[kTimelineSlots];
  if (k.timeline) stamps[kTimelineStart] = global_timer(), stamps[kTimelineSm] = sm_id().to(DType::I64);
  Tile split = program_id(0), group = program_id(1), b = program_id(2);
  Tile splits = num_programs(0);
  Tile b64 = b.to(DType::I64);
  const int64_t realRows = k.HP * k.LQ;
  Tile rows = arange(0, k.BM);
  Tile rowLive = rows < realRows;
  Tile r = minimum(rows, realRows - 1);  // padding rows repeat the last real one: valid addresses
  Tile head = group * k.HP + r / k.LQ;   // [BM] query head of each row
  Tile query = r % k.LQ;                 // [BM] query index of each row
  Tile hkv = (group * k.HP) / k.G;
  Tile offsD = arange(0, k.DP);
  Tile dLive = offsD < k.D;
  auto byD = [&](const Tile& rowMask) {
    Tile m = rowMask.expand(1);
    return k.DP != k.D ? m & dLive.expand(0) : m;
  };
  const detail::ValueColumns vc(k.D, k.DP, k.DV, k.DVP, offsD);  // V, the accumulator, partials, output
  const Tile& offsDV = vc.offs;
  auto byDV = [&](const Tile& rowMask) { return vc.rowsBy(rowMask, byD); };

  Tile qRows = head.to(DType::I64) * p.q_stride_h + (query * p.q_stride_m).to(DType::I64);
  Tile qPtrs = p.q + b64 * p.q_stride_b + (qRows.expand(1) + offsD.expand(0));
  Tile q = k.DP == k.D ? load(qPtrs) : load(qPtrs, byD(rows >= 0));
  Tile kBase = p.k + (b64 * p.k_stride_b + hkv.to(DType::I64) * p.k_stride_h);
  Tile vBase = p.v + (b64 * p.v_stride_b + hkv.to(DType::I64) * p.v_stride_h);
  std::optional<detail::PagedKvRows> pagedRows;
  Tile keyEnd = p.kv_len;  // keys at or past it are dead (S, or a paged batch's own length)
  if (paged) {
    pagedRows = detail::pagedKvRows(*pp, *pc, b);
    keyEnd = detail::pagedKeyEnd(*pp, *pc, b, p.kv_len);
  }
  const bool keysMayEnd = !k.kvDivisible || (paged && pc->hasLengths);

  // The mods see the row's own head (a scalar when the program holds one head) and global positions.
  Tile modHead = k.HP == 1 ? group : head.expand(1);
  // Where this sequence's queries are: one offset for the call, or its own (query_offsets), whose
  // mask row is then found here (clamped into the mask: the host checks what it can see).
  Tile qStart = p.q_offset, row = p.list_row;
  if (k.perSequenceOffsets) {
    qStart = load(p.q_offsets + b);
    row = minimum(maximum((qStart - p.mask_row_start) / k.QBS, 0), p.mask_q_blocks - 1);
  }
  Tile qPos = (query + qStart).expand(1);
  Tile listRow = b * p.list_b_stride + group * p.list_h_stride + row;
  const int64_t R = k.KVBS / k.BN;
  constexpr int64_t kLiveBits = 64;

  // The row's inner steps, the partial list's then the full list's, cut into `splits` equal
  // contiguous runs: this program walks run `split` (steps [first, last) of the two lists laid end
  // to end). One cut over both lists, not one per list: per list, a sliding window of 4096 (62 full
  // steps and 4 partial ones over 6 splits) gave four programs 12 steps where 11 is the most needed.
  // Partial steps first: a program whose run holds both drains its ring and refills it between the
  // two walks, and decides which partial steps to skip before the partial walk (one list read);
  // the first split, which carries that, also skips the steps of a window's left edge, while the
  // last split, which carried it when the full list came first, is the one the merge waits for.
  // Level on the H200 (window 4096: 39.6 against 39.7-40.0 us, 2026-12-04); partialFirst = 0
  // (FLEXTILE_DECODE_PARTIAL_FIRST=0) takes the full list's steps first.
  Tile fullCount = k.hasFull ? load(p.full_kv_num + listRow) : zeros({}, DType::I32);
  Tile partialCount = k.hasPartial ? load(p.kv_num + listRow) : zeros({}, DType::I32);
  Tile fullSteps = fullCount * R, partialSteps = partialCount * R;
  Tile rowSteps = fullSteps + partialSteps;
  Tile share = (rowSteps + splits - 1) / splits;
  Tile first = minimum(split * share, rowSteps);
  Tile last = minimum(first + share, rowSteps);

  // The logical position of step t's first key in a list of `count` entries. (Each user forms
  // listBase = listRow · list_kv_blocks where it starts, so that the default kernel's instructions
  // stay in the order they were measured in.)
  auto stepStartIn = [&](const Tile& count, const Tile& indices, const Tile& listBase, const Tile& t) {
    Tile entry = t / R;
    Tile block = load(indices + (listBase + entry), entry < count, 0);
    return block * k.KVBS + (t % R) * k.BN;
  };
  // Whether each of the four partial steps t .. t + 3 holds an allowed pair for these queries (1 or
  // 0, i64; 0 at or past `limit`), handed to use(step, live) in order: mask_mod alone decides, no
  // K/V is read, and the four block indices are loaded together (one list read a round).
  auto testPartialSteps = [&](const Tile& listBase, const Tile& limit, const Tile& t, const auto& use) {
    constexpr int64_t kRound = 4;
    std::vector<Tile> starts;
    for (int64_t i = 0; i < kRound; ++i) starts.push_back(stepStartIn(partialCount, p.kv_indices, listBase, t + i));
    for (int64_t i = 0; i < kRound; ++i) {
      Tile ti = t + i;
      Tile offsN = starts[size_t(i)] + arange(0, k.BN);
      Tile allowed = maskMod(b, modHead, qPos, offsN.expand(0)) & (offsN < keyEnd).expand(0);
      use(ti, max(max(allowed.to(DType::I32), 1), 0).to(DType::I64) * (ti < limit).to(DType::I64));
    }
  };
  // The partial steps [begin, limit) (at most kLiveBits) as bits from `begin` on: set where live.
  auto livePartialBits = [&](const Tile& listBase, const Tile& begin, const Tile& limit) {
    return for_range(begin, limit, 4, zeros({}, DType::I64), [&](Tile t, Tile bits) {
      testPartialSteps(listBase, limit, t, [&](const Tile& ti, const Tile& live) {
        bits = bits | (live << minimum(ti - begin, kLiveBits - 1).to(DType::I64));
      });
      return bits;
    });
  };
  // Steps [begin, end) of one list of `count` entries.
  auto walk = [&](const Tile& count, const Tile& indices, bool partial, const Tile& begin, const Tile& end, Tile m,
                  Tile l, Tile acc) {
    Tile listBase = listRow * p.list_kv_blocks;
    auto stepStart = [&](const Tile& t) { return stepStartIn(count, indices, listBase, t); };
    // A partial block of the mask row may hold no allowed pair for this call's few queries (a
    // sliding window's left edge, say): its steps are never loaded (their scores are -inf anyway,
    // but a NaN in their V would reach the output through 0 * NaN). Only the program's first
    // kLiveBits partial steps are decided so; the window decode's sit at the start of a walk.
    Tile liveBits;
    if (partial) liveBits = livePartialBits(listBase, begin, minimum(end, begin + kLiveBits));
    const bool sumAfterProduct = detail::sumAfterProductWanted(false);  // (level on the decode)
    auto [m2, l2, acc2] = for_range(begin, end, 1, std::tuple{m, l, acc}, [&](Tile t, Tile mi, Tile li, Tile ai) {
      Tile start = stepStart(t);
      Tile offsN = start + arange(0, k.BN);
      Tile colLive = offsN < keyEnd;
      Tile rows = paged ? detail::kvStorageRows(*pagedRows, start, k.BN, keyEnd) : offsN;
      Tile kOffs = rows.expand(1) * p.k_stride_n + offsD.expand(0);
      Tile vOffs = rows.expand(1) * p.v_stride_n + offsDV.expand(0);
      Tile loadCols = colLive;
      if (partial) {
        Tile step = (t - begin).to(DType::I64);
        loadCols = colLive & ((step >= kLiveBits) | (((liveBits >> step) & 1) != 0));
      }
      const bool exact = !partial && !keysMayEnd && k.DP == k.D && k.DVP == k.DV;
      Tile kt, vt;
      if (k.warpSpecialize && !partial) {
        // Full steps as tensor boxes of K and V (`paged` never specializes): TMA zero-fills the
        // keys past kv_len and the columns past D, as the masked copies do. The partial walk keeps
        // its copies: it skips steps by liveBits, which come from mask_mod's tiles, and a
        // producer runs scalars only.
        auto box = [&](const Tile& base, const Tile& strideB, const Tile& strideH, const Tile& strideN, int64_t dim) {
          return TensorBox{base, {detail::kUnboundedDim, detail::kUnboundedDim, p.kv_len, dim},
                           {strideB, strideH, strideN}, {b, hkv, start, 0}};
        };
        const TensorBox kBox = box(p.k, p.k_stride_b, p.k_stride_h, p.k_stride_n, k.D);
        const TensorBox vBox = box(p.v, p.v_stride_b, p.v_stride_h, p.v_stride_n, k.DV);
        kt = exact ? load(kBase + kOffs, kBox) : load(kBase + kOffs, byD(loadCols), kBox);
        vt = exact ? load(vBase + vOffs, vBox) : load(vBase + vOffs, byDV(loadCols), vBox);
      } else {
        kt = exact ? load(kBase + kOffs) : load(kBase + kOffs, byD(loadCols));
        vt = exact ? load(vBase + vOffs) : load(vBase + vOffs, byDV(loadCols));
      }
      Tile s = dot(q, kt.trans());
      Tile kvPos = offsN.expand(0);
      if (k.hasScoreMod)
        s = scoreMod(s * p.scale, b, modHead, qPos, kvPos) * log2e;
      else
        s = s * p.scale;  // the host folded log2 e into the scale
      if (partial) s = where(maskMod(b, modHead, qPos, kvPos), s, -INFINITY);
      if (keysMayEnd) s = where(colLive.expand(0), s, -INFINITY);
      return detail::onlineSoftmaxStep(mi, li, ai, s, vt, dt, nullptr, sumAfterProduct);
    });
    return std::tuple{m2, l2, acc2};
  };

  Tile m = full({k.BM}, -INFINITY, DType::F32);
  Tile l = zeros({k.BM}, DType::F32);
  Tile acc = zeros({k.BM, k.DVP}, DType::F32);
  // The steps [first, last) of the run that fall in one list, laid `before` steps into the row.
  auto walkList = [&](bool partial, const Tile& before) {
    if (!(partial ? k.hasPartial : k.hasFull)) return;
    const Tile& steps = partial ? partialSteps : fullSteps;
    Tile from = minimum(maximum(first - before, 0), steps), to = minimum(maximum(last - before, 0), steps);
    std::tie(m, l, acc) = walk(partial ? partialCount : fullCount, partial ? p.kv_indices : p.full_kv_indices, partial,
                               from, to, m, l, acc);
  };
  const Tile none = zeros({}, DType::I32);
  walkList(k.partialFirst != 0, none);
  walkList(k.partialFirst == 0, k.partialFirst ? partialSteps : fullSteps);

  if (k.timeline) stamps[kTimelineWalked] = global_timer();
  auto storeTimeline = [&] {
    if (!k.timeline) return;
    stamps[kTimelineEnd] = global_timer();
    Tile program = (b * num_programs(1) + group) * splits + split;
    for (int64_t e = 0; e < kTimelineSlots; ++e)
      store(p.timeline + (program.to(DType::I64) * kTimelineSlots + e), stamps[e] ? *stamps[e] : zeros({}, DType::I64));
  };

  if (k.programmaticLaunch) release_dependent_grids();
  // Each row's head's sink (FlexAttentionOptions::sinks) in the exp2 domain, where a row's whole
  // state is folded: never into a split's partial.
  auto rowSinks = [&] { return load(sinks->sinks + head) * std::numbers::log2e; };
  Tile empty = l == 0.0;
  Tile out = acc * (1.0 / where(empty, 1.0, l)).expand(1);  // a division per row, not per element
  Tile rowId = (b * p.q_heads + head) * p.q_len + query;  // [BM] flat (b, head, query)
  // The fused merge: the partial (normalized output and lse, log2 domain) goes to slot `index` of
  // the row's `count`, then a ticket; the last of the group merges (the ordering argument is in
  // the file's header). There is no `if` in the IR: a loop of 0 or 1 trips is one.
  // (The partial's state m, l, none: its lse is traced after the output's store, as it always was.)
  // (`best`: the partial's largest score, natural units, with max scores; an empty tile without.)
  auto ticketMerge = [&](const Tile& partial, const Tile& pm, const Tile& pl, const Tile& pNone, const Tile& best,
                         const Tile& index, const Tile& count) {
    Tile slot = rowId.to(DType::I64) * count + index;
    store(p.part_out + (slot.expand(1) * k.DVP + offsDV.expand(0)), partial, rowLive.expand(1));
    store(p.part_lse + slot, detail::rowLse(pm, pl, pNone, /*natural=*/false), rowLive);
    if (k.hasMaxScores) store(p.part_max + slot, best, rowLive);
    // acqRelTicket (the default; FLEXTILE_DECODE_ACQREL_TICKET=0 takes the fences): the ticket itself
    // releases the partials and acquires the others' (one thread's atom.acq_rel after a barrier of
    // the program, as CUDA's grid sync does) instead of a fence of every thread on each side.
    if (!k.acqRelTicket) fence();  // release the partials
    if (k.timeline) stamps[kTimelineReleased] = global_timer();
    Tile counter = p.merge_counters + (b * num_programs(1) + group);
    Tile ticket = k.acqRelTicket ? atomic_add(counter, 1, MemoryOrder::AcqRel) : atomic_add(counter, 1);
    Tile merging = (ticket == count - 1).to(DType::I32);
    auto merge = [&] {
      if (!k.acqRelTicket) fence();  // acquire: the other programs' partials are visible from here on
      Tile start = k.timeline ? global_timer() : Tile();
      mergeGroupRows(k, p, sinks ? &*sinks : nullptr, b, group, count, dt, f.numWarps());
      store(counter, zeros({}, DType::I32));  // every other program of the group has added
      return start;
    };
    if (k.timeline)
      stamps[kTimelineMerging] = for_range(0, merging, 1, zeros({}, DType::I64), [&](Tile, Tile) { return merge(); });
    else
      for_range(0, merging, 1, [&](Tile) { merge(); });
  };
  if (k.split && k.clusterMerge) {
    // The splits of a (group, batch) are thread block clusters of clusterMerge programs along axis
    // 0: each cluster's split 0 reads the others' partials from their shared memory and folds them.
    // Only the real rows cross (the padding rows repeat the last real one), so a group of 4 heads
    // moves a quarter of the 16-row tile. One cluster a group: it stores the result, with no
    // global round trip, fence or ticket. Several (clusterTickets: more than 8 splits): each
    // cluster's fold is one partial of the fused merge, which then folds splits / 8 of them.
    int64_t crossing = 1;  // the real rows, rounded up to a power of two (at most BM)
    while (crossing < realRows) crossing *= 2;
    std::vector<Tile> mine{detail::rowLse(m, l, empty, /*natural=*/false), out};
    if (k.hasMaxScores) mine.push_back(detail::rowMaxScore(m, empty));
    std::vector<Tile> all =
        cluster_all_gather(mine, k.clusterMerge, {.to = 0, .rows = crossing < k.BM ? crossing : 0});
    auto part = [&](size_t i) {  // the cluster's values of `mine`'s entry i
      return std::vector<Tile>(all.begin() + std::ptrdiff_t(i * k.clusterMerge),
                               all.begin() + std::ptrdiff_t((i + 1) * k.clusterMerge));
    };
    std::vector<Tile> st{full({k.BM}, -INFINITY, DType::F32), zeros({k.BM}, DType::F32),
                         zeros({k.BM, k.DVP}, DType::F32)};
    if (k.hasMaxScores) st.push_back(full({k.BM}, -INFINITY, DType::F32));
    st = detail::foldPartialsAndMaxima(st, part(0), part(1), k.hasMaxScores ? part(2) : std::vector<Tile>{});
    Tile mm = st[0], ll = st[1];
    const Tile merged = st[2], best = k.hasMaxScores ? st[3] : Tile();
    Tile none = ll == 0.0;
    Tile folded = merged * (1.0 / where(none, 1.0, ll)).expand(1);
    if (k.clusterTickets) {
      for_range(0, (split % k.clusterMerge == 0).to(DType::I32), 1, [&](Tile) {
        ticketMerge(folded, mm, ll, none, best, split / k.clusterMerge, splits / k.clusterMerge);
      });
      stamps[kTimelineReleased].reset();  // read inside the loop above: not values after it
      stamps[kTimelineMerging].reset();
      storeTimeline();
      return;
    }
    if (k.hasSinks) {  // the cluster's fold is the row's whole: the sink joins it here
      std::vector<Tile> a{merged};
      detail::foldSink(mm, ll, a, rowSinks());
      none = ll == 0.0;
      folded = a[0] * (1.0 / where(none, 1.0, ll)).expand(1);
    }
    Tile stores = rowLive & (split == 0);
    Tile oRows = head.to(DType::I64) * p.out_stride_h + (query * p.out_stride_m).to(DType::I64);
    store(p.out + b64 * p.out_stride_b + (oRows.expand(1) + offsDV.expand(0)), folded.to(dt), byDV(stores));
    if (k.hasLse) store(p.lse + rowId.to(DType::I64), detail::rowLse(mm, ll, none, /*natural=*/true), stores);
    if (k.hasMaxScores) store(p.max_scores + rowId.to(DType::I64), best, stores);
    storeTimeline();
    return;
  }
  if (k.split) {
    ticketMerge(out, m, l, empty, k.hasMaxScores ? detail::rowMaxScore(m, empty) : Tile(), split, splits);
    storeTimeline();
    return;
  }
  const Tile best = k.hasMaxScores ? detail::rowMaxScore(m, empty) : Tile();  // over the keys alone
  if (k.hasSinks) {  // one split: its state is the row's whole
    std::vector<Tile> a{acc};
    detail::foldSink(m, l, a, rowSinks());
    empty = l == 0.0;
    out = a[0] * (1.0 / where(empty, 1.0, l)).expand(1);
  }
  Tile oRows = head.to(DType::I64) * p.out_stride_h + (query * p.out_stride_m).to(DType::I64);
  store(p.out + b64 * p.out_stride_b + (oRows.expand(1) + offsDV.expand(0)), out.to(dt), byDV(rowLive));
  if (k.hasLse) {
    Tile lse = detail::rowLse(m, l, empty, /*natural=*/true);
    store(p.lse + rowId.to(DType::I64), lse, rowLive);
  }
  if (k.hasMaxScores) store(p.max_scores + rowId.to(DType::I64), best, rowLive);
  storeTimeline();
}

// ---- the block lists of the call's queries -------------------------------------

// One list row per (b, h) of the mask, covering all of the call's queries: row (b, h) of the lists
// is at b * bStride + h * hStride + row (in list rows of numKvBlocks entries).
struct DecodeLists {
  // The mask's own list tensors (alive as long as the mask, which outlives the call), or those of
  // `made` for this call: pointed at, not copied (four tensor copies were eight allocations a call).
  const Tensor *fullNum = nullptr, *fullIndices = nullptr, *partialNum = nullptr, *partialIndices = nullptr;
  std::shared_ptr<const DecodeBlockLists> made;
  int64_t bStride = 0, hStride = 0, row = 0, numKvBlocks = 1;
  int64_t maxLiveBlocks = 0;  // of any (b, h) row, full + partial
  bool anyFull = false, anyPartial = false;
};

// The mask row that holds the queries [start, start + count) (global), or -1 when they straddle two.
int64_t onlyRow(const BlockMask& mask, int64_t start, int64_t count) {
  const int64_t rowStart = mask.qOffset() - mask.qPhase();  // global position of row 0's first query
  const int64_t r0 = (start - rowStart) / mask.qBlockSize(), r1 = (start + count - 1 - rowStart) / mask.qBlockSize();
  return r0 == r1 ? r0 : -1;
}

// The mask's own lists at one row: nothing is built or uploaded (the mask keeps its tensors; a
// row slice's are views of its parent's, with the parent's row strides).
DecodeLists maskRowLists(const BlockMask& mask, int64_t row, MemorySpace space, runtime::Stream* stream) {
  const BlockMaskTensors& t = mask.kvTensors(space, stream);
  DecodeLists lists{&t.fullKvNum, &t.fullKvIndices, &t.kvNum, &t.kvIndices};
  lists.bStride = t.kvBatchStride;
  lists.hStride = t.kvHeadStride;
  lists.row = row;
  lists.numKvBlocks = mask.numKvBlocks();
  if (!mask.hasHostLists()) {  // lists as tensors only: the mask's bounds (BlockMask::fromListTensors)
    lists.maxLiveBlocks = mask.maxLiveBlocksPerRow();
    lists.anyFull = mask.mayHaveFullBlocks();
    lists.anyPartial = mask.mayHavePartialBlocks();
    return lists;
  }
  for (int64_t b = 0; b < mask.batch(); ++b)
    for (int64_t h = 0; h < mask.heads(); ++h) {
      const int64_t nf = int64_t(mask.fullKvBlocks(b, h, row).size()), np = int64_t(mask.partialKvBlocks(b, h, row).size());
      lists.maxLiveBlocks = std::max(lists.maxLiveBlocks, nf + np);
      lists.anyFull |= nf > 0;
      lists.anyPartial |= np > 0;
    }
  return lists;
}

// The mask's own lists for a row each sequence's kernel program finds itself (query_offsets): the
// host bounds are those of the whole mask.
DecodeLists maskListsForAnyRow(const BlockMask& mask, MemorySpace space, runtime::Stream* stream) {
  DecodeLists lists = maskRowLists(mask, 0, space, stream);
  if (!mask.hasHostLists()) return lists;
  lists.maxLiveBlocks = 0;
  for (int64_t b = 0; b < mask.batch(); ++b)
    for (int64_t h = 0; h < mask.heads(); ++h)
      for (int64_t r = 0; r < mask.numQBlocks(); ++r)
        lists.maxLiveBlocks = std::max<int64_t>(
            lists.maxLiveBlocks, int64_t(mask.fullKvBlocks(b, h, r).size() + mask.partialKvBlocks(b, h, r).size()));
  lists.anyFull = mask.numFullBlocks() > 0;
  lists.anyPartial = mask.numPartialBlocks() > 0;
  return lists;
}

// Exact lists for queries that straddle mask rows, made on the device (DecodeLists.h).
DecodeLists straddlingLists(const BlockMask& mask, int64_t start, int64_t count, MemorySpace space,
                            runtime::Stream* stream) {
  auto made = std::make_shared<const DecodeBlockLists>(decodeBlockLists(mask, start, count, space, stream));
  const DecodeBlockLists& d = *made;
  DecodeLists lists{&d.fullNum, &d.fullIndices, &d.partialNum, &d.partialIndices, made};
  lists.bStride = d.batch > 1 ? d.heads : 0;
  lists.hStride = d.heads > 1 ? 1 : 0;
  lists.numKvBlocks = d.numKvBlocks;
  lists.maxLiveBlocks = d.maxLiveBlocks;
  lists.anyFull = d.mayHaveFull;
  lists.anyPartial = d.mayHavePartial;
  return lists;
}

// ---- host side ---------------------------------------------------------------

// The partials' grow-only f32 scratch (detail::f32Scratch): a decode step must not allocate
// (cuMemFree synchronizes), and the next call's kernel on the stream cannot start before this
// call's last programs have read.
struct PartialsSlot;
struct MergeCountersSlot;

// The fused merge's ticket counters, one i32 per (batch, head group), grow-only and zeroed when
// allocated, per thread, memory space and stream like the partials. Every call leaves them at 0 again (the
// last program of each group resets its own), so a step neither clears nor allocates them. A call
// that fails part-way may leave tickets behind: resetMergeCounters clears them (the host path does
// on an error; a device kernel that faults leaves the context unusable anyway).
Tensor mergeCounters(MemorySpace space, runtime::Stream* stream, int64_t count) {
  Tensor& slot = detail::perStreamSlot<MergeCountersSlot>(space, stream);
  // Zeroed on the call's own stream, so the first launch on it sees zeros.
  if (!slot.defined() || slot.numel() < count)
    detail::replaceSlot(slot, Tensor::zeros(DType::I32, {std::max<int64_t>(2 * count, 1024)}, space, stream));
  if (space == MemorySpace::Device) return Tensor::deviceView(slot.deviceAddress(), DType::I32, {count});
  return Tensor::hostView(slot.hostData(), DType::I32, {count});
}

void resetMergeCounters(MemorySpace space) {
  Tensor& slot = detail::perStreamSlot<MergeCountersSlot>(space, nullptr);
  if (slot.defined()) detail::replaceSlot(slot, Tensor::zeros(DType::I32, {slot.numel()}, space));
}

// The decode's switches (docs/performance.md, "Tuning knobs"), read once a call: nine getenv
// walks of the environment took 8 % of a decode step's host time.
struct DecodeSwitches {
  std::optional<bool> clusterMerge, warpSpecialize, fillSlots, programmaticLaunch, partialFirst, acqRelTicket;

  static DecodeSwitches read() {
    static constexpr std::array<const char*, 6> kNames = {
        "FLEXTILE_DECODE_CLUSTER_MERGE", "FLEXTILE_DECODE_WARP_SPECIALIZE", "FLEXTILE_DECODE_FILL_SLOTS",
        "FLEXTILE_PROGRAMMATIC_LAUNCH",  "FLEXTILE_DECODE_PARTIAL_FIRST",   "FLEXTILE_DECODE_ACQREL_TICKET"};
    std::array<std::optional<bool>, kNames.size()> v;
    detail::forcedBySwitches(kNames, v);
    return {v[0], v[1], v[2], v[3], v[4], v[5]};
  }
};

struct DecodePrepared {
  int64_t B, Hq, Hkv, L, S, D, G, HP, BM, queryStart;
  int64_t DV;             // v's head dim: the output's (D unless v's differs)
  int64_t programsPerSm;  // resident on one SM of the GPU planned for (decodeProgramsPerSm); 0: none
  DType dtype;
  MemorySpace space;
  FlexDecodeConfig config;
  double scale;
  bool hasScoreMod;
  const BlockMask* mask;
  std::optional<BlockMask> ownedMask;
  DecodeLists lists;
  std::optional<Tensor> queryOffsets;  // i32 [B]: each sequence's own position (options.query_offsets)
  runtime::Stream* stream = nullptr;    // options.stream
  const PagedKV* paged = nullptr;  // the paged K/V, or null for contiguous k and v
  PagedKvConstants pagedConstants{};
  bool clustersAvailable = false;  // the GPU planned for has thread block clusters (or none: the interpreter)
  bool kvBoxes = false;            // TMA can describe K and V (detail::tmaBoxesFor)
  bool warpSpecialized = false;    // decodeWarpSpecialized
  int64_t clusterSize = 0;         // clusterMergeSize, once the split count is known
  std::optional<Tensor> timeline;  // options.decode_timeline, checked
  std::optional<Tensor> maxScores;  // options.max_scores
  std::optional<Tensor> sinks;      // options.sinks, checked
  DecodeSwitches switches;
};

// BLOCK_N as a mask's blocks take it: no wider than a KV block (at least 16).
int64_t narrowedBlockN(int64_t blockN, const BlockMask& mask) {
  return std::min(blockN, std::max<int64_t>(16, mask.kvBlockSize()));
}

// Why a decode of BM-row programs over `mask` cannot run `c` (its BLOCK_N narrowed), or nullopt.
std::optional<std::string> decodeConfigProblem(const FlexDecodeConfig& c, const BlockMask& mask, int64_t BM) {
  if (auto why = detail::configProblem({BM, c.block_n, c.num_warps, c.num_stages}, nullptr)) return why;
  if (mask.kvBlockSize() % c.block_n != 0)
    return "BLOCK_N must divide the BlockMask's KV_BLOCK_SIZE (" + std::to_string(mask.kvBlockSize()) + ")";
  if (c.splits < 0) return "splits must be >= 0 (0 chooses)";
  if (c.programs_per_sm < 0 || c.programs_per_sm > 8) return "programs_per_sm must be in [0, 8] (0 chooses)";
  return std::nullopt;
}

// The resolver's config (a tuned one) when there is one the call can take, else the default.
FlexDecodeConfig tunedOrDefaultConfig(const DecodePrepared& p, const ScoreMod& scoreMod, const BlockMask& mask) {
  const FlexDecodeConfig fallback = defaultFlexDecodeConfig(p.dtype, std::max(p.D, p.DV));
  const std::optional<FlexDecodeConfig> c = detail::ResolverSlot<FlexDecodeConfig>::instance().ask([&] {
    return detail::attentionProblem(p.dtype, p.B, p.Hq, p.Hkv, p.L, p.S, p.D, p.space, scoreMod, mask, p.DV);
  });
  if (!c) return fallback;
  FlexDecodeConfig narrowed = *c;
  narrowed.block_n = narrowedBlockN(c->block_n, mask);
  return decodeConfigProblem(narrowed, mask, p.BM) ? fallback : *c;
}

void finishPrepare(DecodePrepared& p, const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                   const FlexAttentionOptions& options, const std::optional<codegen::Target>& target);

// The merge through thread block clusters, where the GPU has them; opt-in (the config's
// cluster_merge = On, or FLEXTILE_DECODE_CLUSTER_MERGE=1, which overrides the config): 19-22 %
// slower on the H200's long decodes (2026-12-05). Up to 8 splits (the portable cluster size) are
// one cluster; more, when a multiple of 8 (finishPrepare rounds a chosen count up to one), are
// clusters of 8 whose folds the fused merge takes as its partials. 0: the fused ticket merge alone,
// or no split.
constexpr int64_t kMaxClusterSize = 8;
bool clusterMergeWanted(const DecodePrepared& p) {
  const LoopSchedule asked = p.config.cluster_merge;
  return p.clustersAvailable && p.switches.clusterMerge.value_or(asked == LoopSchedule::On);
}
int64_t clusterMergeSize(const DecodePrepared& p) {
  const int64_t splits = p.config.splits;
  if (splits < 2 || !clusterMergeWanted(p)) return 0;
  if (splits <= kMaxClusterSize) return splits;
  return splits % kMaxClusterSize == 0 ? kMaxClusterSize : 0;
}

DecodePrepared prepare(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                       const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                       const std::optional<codegen::Target>& target = std::nullopt) {
  detail::checkAttentionInputs(q, k, v, scoreMod);
  DecodePrepared p{};
  p.B = q.size(0), p.Hq = q.size(1), p.L = q.size(2), p.D = q.size(3), p.Hkv = k.size(1), p.S = k.size(2);
  p.DV = v.size(3);
  p.dtype = q.dtype();
  p.space = q.space();
  p.kvBoxes = detail::tmaBoxesFor({&k, &v}, 2, true);
  finishPrepare(p, scoreMod, blockMask, options, target);
  return p;
}

// A paged K/V: B, Hkv, S and the dtype checked against q by the PagedKV.
DecodePrepared preparePaged(const Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                            const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                            const std::optional<codegen::Target>& target = std::nullopt) {
  detail::expectAttentionInput("flex_attention (decode)", "q", q);
  detail::expectPagedKvFor("flex_attention (decode)", kv, q.size(0), q.size(3), q.dtype(), q.space());
  detail::checkAttentionInputs(q, kv.k, kv.v, scoreMod, /*sameBatch=*/false);
  DecodePrepared p{};
  p.B = q.size(0), p.Hq = q.size(1), p.L = q.size(2), p.D = q.size(3), p.Hkv = kv.kvHeads(), p.S = kv.length;
  p.DV = kv.valueHeadDim();
  p.dtype = q.dtype();
  p.space = q.space();
  p.paged = &kv;
  p.pagedConstants = detail::pagedKvConstants(kv);
  finishPrepare(p, scoreMod, blockMask, options, target);
  return p;
}

// Whether the decode's full walk takes TMA rings and a producer warpgroup: the config's (or
// FLEXTILE_DECODE_WARP_SPECIALIZE's) On, for a contiguous K/V that TMA can describe, at 2 stages or
// more, on a GPU with TMA and setmaxnreg (or none named: the interpreter, whose passes decide).
// Not with the cluster merge, which asks it: every thread of a cluster meets at its barriers,
// and a producer's threads leave once their copies are issued.
bool decodeWarpSpecialized(const DecodePrepared& p, const std::optional<codegen::Target>& gpu) {
  const bool wanted = p.switches.warpSpecialize.value_or(p.config.warp_specialize == WarpSpecialization::On);
  const bool hopper = !gpu || (gpu->has(codegen::Feature::TensorMemoryAccelerator) &&
                               gpu->has(codegen::Feature::SetMaxNReg));
  return wanted && hopper && !p.paged && p.kvBoxes && !clusterMergeWanted(p) && p.config.num_stages >= 2 &&
         (p.config.num_warps == 4 || p.config.num_warps == 8);
}

void finishPrepare(DecodePrepared& p, const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                   const FlexAttentionOptions& options, const std::optional<codegen::Target>& target) {
  const char* me = "flex_attention (decode)";
  auto fail = [&](const std::string& m) { throw Error(std::string(me) + ": " + m); };
  p.switches = DecodeSwitches::read();
  p.maxScores = options.max_scores;  // (checked with the outputs by flex_attention_into)
  if (options.sinks) detail::expectSinks(me, *options.sinks, p.Hq, p.space);
  p.sinks = options.sinks;
  if (p.L > 128) fail("the decode template takes at most 128 queries per head, got L = " + std::to_string(p.L));
  p.G = p.Hq / p.Hkv;

  if (blockMask) {
    p.mask = &*blockMask;
  } else {
    p.ownedMask = detail::denseBlockMask(p.L, p.S, {128, 128});
    p.mask = &*p.ownedMask;
  }
  const BlockMask& mask = *p.mask;
  p.stream = options.stream;
  if (options.query_offset && options.query_offsets)
    fail("give query_offset (one position for the call) or query_offsets (one per sequence), not both");
  if (options.query_offsets) {
    // Each sequence's own position in a mask pre-built for more queries: an i32 [B] tensor in q's
    // space, read by the kernel. Host values are checked here; device values cannot be without a
    // round trip (the kernel clamps the mask row, so a bad one reads a wrong row, never past the lists).
    const Tensor& t = *options.query_offsets;
    t.expect(std::string(me) + ": query_offsets", DType::I32, {p.B});
    if (t.space() != p.space || !t.isContiguous())
      fail("query_offsets must be contiguous and in q's memory space, got " + t.describe());
    mask.checkInputs(p.B, p.Hq, mask.qLen(), p.S);
    const int64_t rowStart = mask.qOffset() - mask.qPhase();
    if (t.space() == MemorySpace::Host) {
      const std::vector<int32_t> offsets = t.toHost<int32_t>();
      for (int64_t b = 0; b < p.B; ++b) {
        const int64_t o = offsets[size_t(b)];
        if (o < mask.qOffset() || o + p.L > mask.qOffset() + mask.qLen())
          fail("sequence " + std::to_string(b) + "'s queries [" + std::to_string(o) + ", " + std::to_string(o + p.L) +
               ") lie outside the BlockMask's queries [" + std::to_string(mask.qOffset()) + ", " +
               std::to_string(mask.qOffset() + mask.qLen()) + "): " + mask.describe());
        if ((o - rowStart) / mask.qBlockSize() != (o + p.L - 1 - rowStart) / mask.qBlockSize())
          fail("sequence " + std::to_string(b) + "'s queries [" + std::to_string(o) + ", " + std::to_string(o + p.L) +
               ") straddle two rows of the BlockMask (Q_BLOCK_SIZE " + std::to_string(mask.qBlockSize()) +
               "): with query_offsets each sequence's queries must lie in one row");
      }
    } else if (p.L > 1 && p.L > mask.qBlockSize()) {
      fail("with query_offsets each sequence's L = " + std::to_string(p.L) + " queries must fit one BlockMask row");
    }
    p.queryOffsets = t;
    p.queryStart = mask.qOffset();
  } else if (options.query_offset) {
    // A mask pre-built for more queries: q's rows are [query_offset, query_offset + L) of its positions.
    const int64_t first = mask.qOffset(), end = mask.qOffset() + mask.qLen();
    if (*options.query_offset < first || *options.query_offset + p.L > end)
      fail("queries [" + std::to_string(*options.query_offset) + ", " + std::to_string(*options.query_offset + p.L) +
           ") (query_offset " + std::to_string(*options.query_offset) + ", L " + std::to_string(p.L) +
           ") lie outside the BlockMask's queries [" + std::to_string(first) + ", " + std::to_string(end) +
           "): " + mask.describe());
    mask.checkInputs(p.B, p.Hq, mask.qLen(), p.S);
    p.queryStart = *options.query_offset;
  } else {
    mask.checkInputs(p.B, p.Hq, p.L, p.S);
    p.queryStart = mask.qOffset();
  }
  if (mask.maskMod().captureSpace() && *mask.maskMod().captureSpace() != p.space)
    fail("mask_mod '" + mask.maskMod().name() + "' captures tensors in the other memory space");

  // Heads per program: the whole GQA group when the mask is the same for all heads, else one head
  // (each head then walks its own list); never more than 128 rows.
  p.HP = mask.heads() > 1 ? 1 : p.G;
  while (p.HP > 1 && p.HP * p.L > 128) p.HP /= 2;
  while (p.G % p.HP != 0) --p.HP;
  p.BM = 16;
  while (p.BM < p.HP * p.L) p.BM *= 2;

  p.config = options.decode_config ? *options.decode_config : tunedOrDefaultConfig(p, scoreMod, mask);
  FlexDecodeConfig& c = p.config;
  c.block_n = narrowedBlockN(c.block_n, mask);
  // Paged: an inner step's keys must lie in one page for the K/V to stream through the pipeline
  // (detail::kvStorageRows); a config the caller gave is kept (it gathers per key).
  if (p.paged && !options.decode_config) c.block_n = std::min(c.block_n, p.paged->pageSize);
  if (auto why = decodeConfigProblem(c, mask, p.BM)) fail("config " + c.describe() + ": " + *why);

  if (p.queryOffsets) {
    p.lists = maskListsForAnyRow(mask, p.space, p.stream);
  } else {
    const int64_t row = onlyRow(mask, p.queryStart, p.L);
    p.lists = row >= 0 ? maskRowLists(mask, row, p.space, p.stream)
                       : straddlingLists(mask, p.queryStart, p.L, p.space, p.stream);
  }
  // The GPU the programs are sized for: the target's, else the current device's (device tensors),
  // else none (the interpreter: one split, no residency).
  const std::optional<codegen::Target> gpu = detail::defaultsTarget(p.space, target);
  p.clustersAvailable = !gpu || gpu->description().has(codegen::Feature::ThreadBlockClusters);
  p.warpSpecialized = decodeWarpSpecialized(p, gpu);
  // Planned as for the wider of q's and v's head dims: a program's registers grow with both (Q's
  // rows, the accumulator's), and the narrower ring would ask for more programs than they leave
  // room for (D = 128, DV = 64: four an SM, 36 bytes spilled at 128 registers).
  p.programsPerSm = gpu ? decodeProgramsPerSm(ringBytes(c, detail::paddedHeadDim(std::max(p.D, p.DV)), p.dtype),
                                              c.num_warps, gpu->description(), p.warpSpecialized ? 4 : 0)
                        : 0;
  if (c.splits == 0) {
    // A plan for a target counts the SMs of the part its description names (an H100/H200 for sm_90a).
    const int sms = target ? target->description().part.multiprocessors
                    : p.space == MemorySpace::Device ? runtime::Device::current().multiprocessorCount() : 0;
    c.splits = decodeSplitCount(p.B * (p.Hq / p.HP), p.lists.maxLiveBlocks * (mask.kvBlockSize() / c.block_n),
                                sms, std::max<int64_t>(1, p.programsPerSm),
                                c.programs_per_sm > 0 ? c.programs_per_sm
                                : p.switches.fillSlots.value_or(false)
                                    ? p.programsPerSm
                                    : kDecodeProgramsPerSmAimedAt);
    // Clusters of 8 over more splits need a multiple of 8 (B = 1 over 32768 keys: 47 -> 48).
    if (clusterMergeWanted(p) && c.splits > kMaxClusterSize)
      c.splits = (c.splits + kMaxClusterSize - 1) / kMaxClusterSize * kMaxClusterSize;
  }
  p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(p.D));
  if (!std::isfinite(p.scale) || p.scale == 0)
    fail("scale must be finite and non-zero, got " + std::to_string(p.scale));
  p.hasScoreMod = detail::changesScores(scoreMod);
  p.clusterSize = clusterMergeSize(p);
  if (options.decode_timeline) {
    const Tensor& t = *options.decode_timeline;
    const int64_t programs = p.config.splits * (p.Hq / p.HP) * p.B;
    t.expect(std::string(me) + ": decode_timeline", DType::I64, {programs, kTimelineSlots});
    if (t.space() != p.space || !t.isContiguous())
      fail("decode_timeline must be contiguous and in q's memory space, got " + t.describe());
    p.timeline = t;
  }
}

DecodeConstants decodeConstants(const DecodePrepared& p, bool hasLse) {
  const int64_t cluster = p.clusterSize;
  return DecodeConstants{p.BM,
                         p.config.block_n,
                         p.D,
                         detail::paddedHeadDim(p.D),
                         p.G,
                         p.HP,
                         p.L,
                         p.mask->kvBlockSize(),
                         p.hasScoreMod,
                         hasLse,
                         !(p.paged && p.pagedConstants.hasLengths) && p.S % p.mask->kvBlockSize() == 0,
                         p.lists.anyFull,
                         p.lists.anyPartial,
                         p.config.splits > 1,
                         p.mask->qBlockSize(),
                         p.queryOffsets.has_value(),
                         p.programsPerSm,
                         // Programmatic dependent launch, the default since 2026-12-06: level where a
                         // call reads past the L2, B = 1 S = 2048 10.0 / 9.5 us against 15.4 / 14.4
                         // (H100, alternating; 12.9 against 19.3 on the H200 of 2026-12-05), and back to
                         // back a call starts 0.9 us after the last one's end instead of 2.1.
                         p.switches.programmaticLaunch.value_or(true),
                         p.switches.partialFirst.value_or(true),
                         cluster,
                         cluster > 0 && p.config.splits > cluster,
                         p.warpSpecialized,
                         p.timeline.has_value(),
                         // The ticket as the merge's release and acquire (the default since the H100's
                         // A/B of 2026-12-05: +0.8-1.7 % on the window and B = 1, bench/RESULTS.md).
                         p.switches.acqRelTicket.value_or(true),
                         p.DV,
                         detail::paddedHeadDim(p.DV),
                         p.maxScores.has_value(),
                         p.sinks.has_value()};
}

std::string decodeKernelKey(const ScoreMod& scoreMod, DType dtype, bool paged) {
  return detail::templateKernelKey(paged ? "flex_decode_paged" : "flex_decode", scoreMod, dtype);
}

Kernel& decodeKernel(const DecodePrepared& p, const ScoreMod& scoreMod) {
  const MaskMod& maskMod = p.mask->maskMod();
  static const ScoreMod noop = noop_score();  // (a copy a call was a tenth of this function's time)
  const ScoreMod& sm = scoreMod.defined() ? scoreMod : noop;
  const DType dt = p.dtype;
  const bool paged = p.paged != nullptr;
  return maskMod.state().kernel(decodeKernelKey(sm, dt, paged), sm.lifetime(), [&] {
    return Kernel(detail::kernelName((paged ? "flex_decode_paged_" : "flex_decode_") + sm.name() + "_" + maskMod.name()),
                  [dt, score = sm.detached(), held = maskMod.detached(), paged](ir::Function& f,
                                                                               const std::vector<int64_t>& c) {
                    traceDecode(f, c, dt, score, held, paged);
                  },
                  constantCount<DecodeConstants>() + (paged ? constantCount<PagedKvConstants>() : 0));
  });
}

std::vector<Launch> launches(const DecodePrepared& p, const ScoreMod& scoreMod, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor* lse) {
  const FlexDecodeConfig& c = p.config;
  const DecodeConstants constants = decodeConstants(p, lse != nullptr);
  const int64_t DP = constants.DVP;  // a partial's row: v's head dim
  const int64_t rows = p.B * p.Hq * p.L;
  const bool split = constants.split && (!constants.clusterMerge || constants.clusterTickets);  // partials in global memory
  Tensor partOut, partLse, partMax, counters;
  if (split) {
    const int64_t outElems = rows * c.splits * DP, lseElems = rows * c.splits;
    if (p.maxScores) partMax = detail::f32Scratch<PartialsSlot>(p.space, p.stream, outElems + lseElems, {lseElems});
    partLse = detail::f32Scratch<PartialsSlot>(p.space, p.stream, outElems, {lseElems});  // the far end first
    partOut = detail::f32Scratch<PartialsSlot>(p.space, p.stream, 0, {outElems});
    counters = mergeCounters(p.space, p.stream, p.B * (p.Hq / p.HP));
  }
  const Tensor& anyF32 = split ? partLse : (lse ? *lse : *p.lists.fullNum);
  Kernel& kernel = decodeKernel(p, scoreMod);
  LaunchOptions lo;
  lo.grid = {c.splits, p.Hq / p.HP, p.B};
  lo.constants = constantList(constants);
  if (p.paged) {
    const std::vector<int64_t> paged = constantList(p.pagedConstants);
    lo.constants.insert(lo.constants.end(), paged.begin(), paged.end());
  }
  lo.num_warps = c.num_warps;
  lo.num_stages = c.num_stages;
  const auto& qs = q.strides();
  const auto& ks = k.strides();
  const auto& vs = v.strides();
  const auto& os = out.strides();
  const DecodeLists& lists = p.lists;
  const double scale = p.hasScoreMod ? p.scale : p.scale * std::numbers::log2e;
  std::vector<Launch> result;
  result.push_back(
      {&kernel, lo,
       bindParams<DecodeParams>(
           {.q = q, .k = k, .v = v, .out = out, .lse = lse ? *lse : anyF32, .part_out = split ? partOut : anyF32,
            .part_lse = split ? partLse : anyF32,
            .merge_counters = split ? counters : *lists.fullNum,  // touched only with several splits
            .kv_num = *lists.partialNum, .kv_indices = *lists.partialIndices,
            .full_kv_num = *lists.fullNum, .full_kv_indices = *lists.fullIndices,
            .list_b_stride = lists.bStride, .list_h_stride = lists.hStride, .list_row = lists.row,
            .list_kv_blocks = lists.numKvBlocks,
            .q_offsets = p.queryOffsets ? *p.queryOffsets : *lists.fullNum,  // read only with per-sequence offsets
            .mask_row_start = p.mask->qOffset() - p.mask->qPhase(), .mask_q_blocks = p.mask->numQBlocks(),
            .q_len = p.L, .kv_len = p.S, .q_offset = p.queryStart,
            .q_stride_b = qs[0], .q_stride_h = qs[1], .q_stride_m = qs[2],
            // A paged storage is one [1, Hkv, rows, D] pool for the whole batch: batch stride 0.
            .k_stride_b = p.paged ? 0 : ks[0], .k_stride_h = ks[1], .k_stride_n = ks[2],
            .v_stride_b = p.paged ? 0 : vs[0], .v_stride_h = vs[1], .v_stride_n = vs[2],
            .out_stride_b = os[0], .out_stride_h = os[1], .out_stride_m = os[2], .q_heads = p.Hq, .scale = scale,
            .timeline = p.timeline ? *p.timeline : anyF32,  // written only with a timeline
            .max_scores = p.maxScores ? *p.maxScores : anyF32, .part_max = partMax.defined() ? partMax : anyF32},
           kernel.name())});
  if (p.paged) {
    const std::vector<KernelArg> paged = bindParams<PagedKvParams>(detail::pagedKvArguments(*p.paged), kernel.name());
    result.back().args.insert(result.back().args.end(), paged.begin(), paged.end());
  }
  if (p.sinks) {
    const std::vector<KernelArg> sinks = bindParams<SinkParams>({.sinks = *p.sinks}, kernel.name());
    result.back().args.insert(result.back().args.end(), sinks.begin(), sinks.end());
  }
  return result;
}

// Runs a call's launches. An interpreted call that stops on an error may have left some groups'
// tickets taken (their last program never ran): the counters are cleared so the next call starts
// from 0.
void runDecode(const std::vector<Launch>& calls, MemorySpace space, runtime::Stream* stream) {
  try {
    runInOrder(calls, space, stream);
  } catch (...) {
    if (space == MemorySpace::Host) resetMergeCounters(space);
    throw;
  }
}

}  // namespace

namespace detail {

// flex_attention_into's decode path (outputs already checked by the caller).
void flexDecodeInto(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                    const std::optional<BlockMask>& blockMask, Tensor& out, Tensor* lse,
                    const FlexAttentionOptions& options) {
  const DecodePrepared p = prepare(q, k, v, scoreMod, blockMask, options);
  runDecode(launches(p, scoreMod, q, k, v, out, lse), p.space, p.stream);
}

void flexDecodeInto(const Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                    const std::optional<BlockMask>& blockMask, Tensor& out, Tensor* lse,
                    const FlexAttentionOptions& options) {
  const DecodePrepared p = preparePaged(q, kv, scoreMod, blockMask, options);
  runDecode(launches(p, scoreMod, q, kv.k, kv.v, out, lse), p.space, p.stream);
}

}  // namespace detail

void setFlexDecodeConfigResolver(FlexDecodeConfigResolver resolver, std::function<bool()> mayAnswer) {
  detail::ResolverSlot<FlexDecodeConfig>::instance().set(std::move(resolver), std::move(mayAnswer));
}

FlexDecodePlan plan_flex_decode(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                                const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                                std::optional<codegen::Target> target) {
  const DecodePrepared p = prepare(q, k, v, scoreMod, blockMask, options, target);
  FlexDecodePlan plan;
  plan.config = p.config;
  plan.headsPerProgram = p.HP;
  plan.rowsPerProgram = p.BM;
  plan.clusterSize = p.clusterSize;
  // Compiling reads shapes, strides and alignment only: a 16-byte-aligned view stands in for out.
  alignas(16) static std::byte anyAligned[16];
  const Shape outShape{p.B, p.Hq, p.L, p.DV};
  Tensor out = p.space == MemorySpace::Host ? Tensor::hostView(anyAligned, q.dtype(), outShape)
                                            : Tensor::deviceView(uint64_t(1) << 20, q.dtype(), outShape);
  for (const Launch& l : launches(p, scoreMod, q, k, v, out, nullptr)) {
    plan.kernelNames.push_back(l.kernel->name());
    if (target) plan.compiled.push_back(&l.kernel->compile(l.options, l.args, target));
  }
  Kernel& kernel = decodeKernel(p, scoreMod);
  plan.traced = &kernel.cachedTrace(TraceOptions{constantList(decodeConstants(p, false)), p.config.num_warps,
                                                 p.config.num_stages});
  return plan;
}

}  // namespace flextile::attention
