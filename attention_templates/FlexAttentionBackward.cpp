// The backward template of flex_attention (attention_templates/FlexAttention.h).
//
// With p = softmax(s) per query row (s the modified scores), delta_i = rowsum(dO ∘ O)_i - dlse_i:
//   dV_j  = sum_i p_ij dO_i
//   dP_ij = <dO_i, V_j>
//   dS_ij = p_ij (dP_ij - delta_i)                  (dloss / d score_mod's output)
//   dS'   = dS · d score_mod / d (scale q·k)        (reverse mode over the mod's traced IR)
//   dQ_i  = scale sum_j dS'_ij K_j,   dK_j = scale sum_i dS'_ij Q_i
//
// Three kernels, launched in order:
//   preprocess  per query tile: delta, and the LSE in the exp2 domain (+inf for a row with no
//               allowed key, so every p of that row recomputes as exactly 0);
//   dkdv        per KV tile of BLOCK_N keys and KV head: K and V stay resident (in registers, or on
//               sm_90a in shared memory as wgmma's A, codegen/TensorCores.h) while the
//               program walks, for each query head of the GQA group, the BlockMask's transposed
//               lists (full q blocks without mask_mod, then partial ones with it), recomputing
//               pᵀ = exp2(K·Qᵀ - lse) tile by tile; dK and dV accumulate in registers and are
//               written once (no atomics). Trainable captures get their gradient here, scattered
//               with atomic adds (each (q, kv) pair is visited by exactly one dkdv program);
//   dq          per query tile and query head: Q and dO stay resident (the same way) while the program walks
//               the forward lists; dQ accumulates in registers.
// The scores are computed transposed in dkdv ([BLOCK_N, BLOCK_M]) so that pᵀ and dSᵀ are the A
// operands of their products straight from the accumulator, as P is in the forward; the mods see
// q_idx [1, BLOCK_M] and kv_idx [BLOCK_N, 1] there (they are element-wise, so this is the same
// function).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <numbers>

#include "attention_templates/FlexAttention.h"
#include "codegen/Ptxas.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/TemplateParams.h"
#include "dsl/Capture.h"
#include "dsl/DSL.h"
#include "ir/passes/ReverseMode.h"
#include "runtime/Device.h"
#include "runtime/Stream.h"

namespace flextile::attention {

using namespace flextile::dsl;
using namespace flextile::attention::tmpl;
using ir::Type;

std::string FlexAttentionBackwardConfig::describe() const {
  return "dkdv " + dkdv.describe() + " / dq " + dq.describe();
}

FlexAttentionBackwardConfig defaultFlexAttentionBackwardConfig(DType dtype, int64_t qHeadDim,
                                                               std::optional<codegen::Target> target,
                                                               bool gathersPerElement,
                                                               DqAccumulation dq,
                                                               std::optional<int64_t> valueHeadDim) {
  const int64_t vHeadDim = valueHeadDim.value_or(qHeadDim), headDim = std::max(qHeadDim, vHeadDim);
  // dkdv keeps dK and dV of its BLOCK_N keys and two [BLOCK_N, BLOCK_M] score tiles in registers;
  // K and V are read by wgmma from shared memory (codegen/TensorCores.h, resident A). On sm_90a,
  // 64 keys x 64 queries on one warpgroup was the best unspecialized dkdv tile for every yardstick
  // variant on the H200 (3-20 % over 64 x 32, bench/RESULTS.md, 2026-12-01). 128 keys on two
  // consumer warpgroups fed by a producer warpgroup beat it by 2-11 % at D = 128 (ALiBi level) and
  // 5-10 % at D = 64 (H200, 2026-12-03) -- but only as the offline ptxas assembles it: the driver's
  // JIT spills its consumers and halves its speed, so without ptxas it stays unspecialized.
  // dq: 128 queries on two consumer warpgroups and a producer: 4-13 % faster for the whole backward
  // than 64 x 64 on one warpgroup, on every yardstick variant (H200, 2026-12-03). Without TMA boxes
  // both run unspecialized. At D = 64 dq's was 5 % slower than 64 x 64, so it keeps one warpgroup.
  const bool wgmma = target && target->has(codegen::Feature::Wgmma);
  const bool hopperAsync = target && target->has(codegen::Feature::SetMaxNReg) &&
                           target->has(codegen::Feature::TensorMemoryAccelerator) &&
                           target->has(codegen::Feature::Wgmma);
  // Atomic dQ (FlashAttention-3's five products) takes the specialized dkdv only where all five run
  // on wgmma, 128 tile columns of Q and V (narrower ones leave dQᵀ's rows to mma.sync and spill
  // 324-840 bytes): 1.6× its one-warpgroup dkdv on an H100 (391 against 240 TFLOP/s without a
  // mask, 365 against 232 causal, 2026-12-07, bench/RESULTS.md).
  const bool atomicDq = dq == DqAccumulation::Atomic;
  const bool dkdvSpecialized =
      hopperAsync && headDim >= 64 && codegen::offlineAssembly() != codegen::OfflineAssembly::Never &&
      (!atomicDq || (detail::tileColumns(qHeadDim) == 128 && detail::tileColumns(vHeadDim) == 128));
  // Past D = 128, 16-bit, on wgmma: dkdv 64 keys × 64 queries on 8 warps, two warpgroups each
  // holding half of dK's and dV's columns (Layout::wgmmaAccumulator), fed by a producer warpgroup
  // where the offline ptxas assembles it; dq 128 queries on two consumer warpgroups and a producer
  // where Q's, dQ's and dO's columns leave its consumers room (tile columns of Q and V ≤ 384:
  // spill-free under the offline ptxas; 256 / 256 spills 576-736 bytes there), else 64 × 64 on one
  // warpgroup. H100, 2026-12-07 (docs/backward.md has the table): 1.15× the previous default (16 × 64
  // w4 / 64 × 64 w4) at MLA's 192 / 128; 2.1-3.4× PyTorch FlexAttention and 0.91-1.26× SDPA at 192 / 128,
  // 192 / 192, 256 / 128 and 256 / 256, but for 192 / 128 causal (0.73× SDPA). The producer warpgroup
  // gained 0.1-5 % over the unspecialized tile at three of the four dims and lost 1.1 % at 192 / 128
  // causal; unspecialized, 192 / 192 spills 80-104 bytes.
  if (headDim > 128 && wgmma && ir::byteWidth(dtype) == 2 && !gathersPerElement) {
    const int64_t columns = detail::tileColumns(qHeadDim) + detail::tileColumns(vHeadDim);
    const FlexAttentionConfig dqTile = hopperAsync && columns <= 384
                                           ? FlexAttentionConfig{128, 64, 8, 2, WarpSpecialization::On}
                                           : FlexAttentionConfig{64, 64, 4, 2};
    return {FlexAttentionConfig{64, 64, 8, 2, dkdvSpecialized ? WarpSpecialization::On : WarpSpecialization::Auto},
            dqTile};
  }
  if (headDim > 128 || ir::byteWidth(dtype) == 4 || gathersPerElement) return {{16, 32, 4, 2}, {16, 32, 4, 2}};
  const FlexAttentionConfig specializedDkdv{64, 128, 8, 2, WarpSpecialization::On};
  if (headDim > 64 && hopperAsync)
    return {dkdvSpecialized ? specializedDkdv : FlexAttentionConfig{64, 64, 4, 2},
            {128, 64, 8, 2, WarpSpecialization::On}};
  if (wgmma)
    return {dkdvSpecialized ? specializedDkdv : FlexAttentionConfig{64, 64, 4, 2}, {64, 64, 4, 2}};
  return {{16, 32, 4, 2}, {64, 32, 4, 2}};
}

const Tensor& FlexAttentionGrads::grad(const CapturedTensor& capture) const {
  for (size_t i = 0; i < trainable.size(); ++i)
    if (trainable[i].slot() == capture.slot()) return captureGrads[i];
  throw Error("flex_attention_backward: capture '" + (capture.defined() ? capture.name() : std::string("<empty>")) +
              "' has no gradient: it is not a trainable capture of the score_mod (capture it with "
              "{.requires_grad = true} and list it in the mod's captures)");
}

namespace {

constexpr double kLog2e = std::numbers::log2e;
// Fixed-point scale of deterministic captured gradients.
constexpr double kFixedPointScale = 4294967296.0;  // 2^32

// ---- kernel parameters -------------------------------------------------------

template <template <class> class P>
struct PreprocessParams {
  BOOST_HANA_DEFINE_STRUCT(PreprocessParams, (P<Data>, out), (P<Data>, dout), (P<F32Ptr>, lse), (P<F32Ptr>, dlse),
                           (P<F32Ptr>, delta), (P<F32Ptr>, lse2), (P<I32>, q_len), (P<I32>, q_heads),
                           (P<I32>, out_stride_b), (P<I32>, out_stride_h), (P<I32>, out_stride_m),
                           (P<I32>, dout_stride_b), (P<I32>, dout_stride_h), (P<I32>, dout_stride_m));
};

// D and DP: the output's head dim (v's) and its padded width.
struct PreprocessConstants {
  BOOST_HANA_DEFINE_STRUCT(PreprocessConstants, (int64_t, BM), (int64_t, D), (int64_t, DP), (int64_t, hasDlse));
};

// Shared by dkdv and dq: the inputs, the preprocess results, the mask lists and the strides.
// `grad` is dK (dkdv) or dQ (dq); `grad2` is dV (dkdv) and unused by dq.
template <template <class> class P>
struct GradParams {
  BOOST_HANA_DEFINE_STRUCT(GradParams, (P<Data>, q), (P<Data>, k), (P<Data>, v), (P<Data>, dout),
                           (P<F32Ptr>, lse2), (P<F32Ptr>, delta), (P<Data>, grad), (P<Data>, grad2),
                           (P<I32Ptr>, full_num), (P<I32Ptr>, full_indices), (P<I32Ptr>, partial_num),
                           (P<I32Ptr>, partial_indices), (P<I32>, q_len), (P<I32>, kv_len), (P<I32>, q_offset),
                           (P<I32>, q_phase), (P<I32>, mask_q_blocks), (P<I32>, mask_kv_blocks),
                           (P<I32>, mask_b_stride), (P<I32>, mask_h_stride), (P<I32>, q_stride_b),
                           (P<I32>, q_stride_h), (P<I32>, q_stride_m), (P<I32>, k_stride_b), (P<I32>, k_stride_h),
                           (P<I32>, k_stride_n), (P<I32>, v_stride_b), (P<I32>, v_stride_h), (P<I32>, v_stride_n),
                           (P<I32>, dout_stride_b), (P<I32>, dout_stride_h), (P<I32>, dout_stride_m),
                           (P<I32>, q_heads), (P<F32>, scale), (P<F32>, grad_scale), (P<F32Ptr>, dq_accum),
                           (P<I32>, dq_accum_stride_h));
};

struct GradConstants {
  BOOST_HANA_DEFINE_STRUCT(GradConstants, (int64_t, BM), (int64_t, BN), (int64_t, D), (int64_t, DP), (int64_t, G),
                           (int64_t, QBS), (int64_t, KVBS), (int64_t, hasScoreMod), (int64_t, qExact),
                           (int64_t, kvExact), (int64_t, hasFull), (int64_t, hasPartial),
                           (int64_t, numTrainable), (int64_t, deterministic), (int64_t, atomicDq),
                           (int64_t, tma), (int64_t, warpSpecialize), (int64_t, rowBoxes), (int64_t, pingpong),
                           (int64_t, exponentFirst), (int64_t, maskedDpEarly),
                           (int64_t, seedFreeAdjoint), (int64_t, overlapDq), (int64_t, tileOrder),
                           (int64_t, DV), (int64_t, DVP), (int64_t, DS), (int64_t, DVS));
};

// ---- traced kernels ----------------------------------------------------------

void tracePreprocess(ir::Function& f, const std::vector<int64_t>& constants, DType dt) {
  const auto k = constantsFrom<PreprocessConstants>(constants);
  const auto p = declareParams<PreprocessParams>(f, dt);
  Tile mBlock = program_id(0), h = program_id(1), b = program_id(2);
  Tile offsM = mBlock * k.BM + arange(0, k.BM);
  Tile offsD = arange(0, k.DP);
  Tile rowLive = offsM < p.q_len;
  Tile live = rowLive.expand(1) & (offsD < k.D).expand(0);
  Tile b64 = b.to(DType::I64), h64 = h.to(DType::I64);
  Tile o = load(p.out + (b64 * p.out_stride_b + h64 * p.out_stride_h) + (offsM.expand(1) * p.out_stride_m + offsD.expand(0)), live);
  Tile dO = load(p.dout + (b64 * p.dout_stride_b + h64 * p.dout_stride_h) +
                     (offsM.expand(1) * p.dout_stride_m + offsD.expand(0)),
                 live);
  Tile delta = sum(o.to(DType::F32) * dO.to(DType::F32), 1);
  Tile rows = (b * p.q_heads + h).to(DType::I64) * p.q_len + offsM;
  if (k.hasDlse) delta = delta - load(p.dlse + rows, rowLive);
  Tile lse = load(p.lse + rows, rowLive);
  store(p.delta + rows, delta, rowLive);
  store(p.lse2 + rows, where(lse == -INFINITY, INFINITY, lse * kLog2e), rowLive);
}

// `ptr`'s computation again, from `to` instead of the base parameter `from` (same offsets: the
// gradient buffer has the captured tensor's shape and strides). Pointer results point to `to`'s
// element type.
ir::Value* rebasePointer(ir::Builder& bld, ir::Value* ptr, ir::Value* from, ir::Value* to) {
  if (ptr == from) return to;
  ir::Op* def = ptr->definingOp();
  std::vector<ir::Value*> operands = def->operands();
  operands[0] = rebasePointer(bld, operands[0], from, to);
  Type result = Type::pointer(to->type().pointee(), ptr->type().shape());
  return bld.create(def->kind(), operands, {result}, def->attrs())->result();
}

// The load/store mask of a [rows, DP] tile: its live rows, and the first D of the padded head dim.
Tile rowsByHeadDim(const Tile& rows, const Tile& dLive, const GradConstants& k) {
  Tile m = rows.expand(1);
  if (k.DP != k.D) m = m & dLive.expand(0);
  return m;
}

struct TrainableCapture {
  std::shared_ptr<CaptureSlot> slot;
  Tile grad;  // the gradient buffer's parameter: ptr<f32>, or ptr<i64> when deterministic
};

// The scores of one tile after score_mod, in the exp2 domain, and what the mod's derivative needs.
struct ModScores {
  Tile z;                      // score_mod(scale * s) * log2 e
  Tile scaled;                 // scale * s, the mod's input (when there is a mod)
  std::vector<ir::Op*> modOps; // the ops the mod traced to
  Tile modOut;
};

ModScores modScores(const GradConstants& k, const Tile& s, const Tile& scale, const ScoreMod& scoreMod,
                    const Tile& b, const Tile& h, const Tile& qPos, const Tile& kvPos) {
  ModScores r;
  if (!k.hasScoreMod) {
    r.z = s * scale;  // the host folded log2 e into the scale
    return r;
  }
  r.scaled = s * scale;
  ir::Block* block = TraceContext::current(SourceLoc::current(), "flex_attention_backward").builder().block();
  const size_t before = block->ops().size();
  r.modOut = scoreMod(r.scaled, b, h, qPos, kvPos);
  auto it = block->ops().begin();
  std::advance(it, before);
  for (; it != block->ops().end(); ++it) r.modOps.push_back(it->get());
  r.z = r.modOut * kLog2e;
  return r;
}

// dloss / d(scale * s) from dloss / d score_mod's output, through the mod's traced ops; reads of
// trainable captures scatter their adjoints into the gradient buffers when `scatter` is set.
Tile modAdjoint(const ModScores& m, const Tile& seed, const std::vector<TrainableCapture>* scatter,
                bool deterministic) {
  TraceContext& ctx = TraceContext::current(SourceLoc::current(), "flex_attention_backward");
  auto trainableOf = [&](const ir::Op& load) -> const TrainableCapture* {
    if (!scatter) return nullptr;
    ir::Value* base = ir::pointerBase(load.operand(0));
    if (!base) return nullptr;
    for (const CaptureParams& c : ctx.captures())
      if (c.data == base)
        for (const TrainableCapture& t : *scatter)
          if (t.slot == c.slot) return &t;
    return nullptr;
  };
  ir::ReverseModeRequest request;
  request.ops = m.modOps;
  request.output = m.modOut.value();
  request.seed = seed.value();
  request.wrt = {m.scaled.value()};
  request.isDifferentiableLoad = [&](const ir::Op& load) { return trainableOf(load) != nullptr; };
  request.onLoadAdjoint = [&](ir::Builder& bld, const ir::Op& load, ir::Value* adjoint) {
    const TrainableCapture* t = trainableOf(load);
    Tile gradPtr(rebasePointer(bld, load.operand(0), ir::pointerBase(load.operand(0)), t->grad.value()));
    Tile g = Tile(adjoint).to(DType::F32);
    if (deterministic) g = (g * kFixedPointScale).to(DType::I64);
    if (load.numOperands() > 1)
      atomic_add(gradPtr, g, Tile(load.operand(1)));
    else
      atomic_add(gradPtr, g);
  };
  std::vector<ir::Value*> adj = ir::emitReverseMode(ctx.builder(), request);
  return Tile(adj.at(0));
}

// Adds the gradient-buffer parameters of the trainable captures (before any mod is traced, so
// they precede the captured tensors' own parameters).
// The buffers are the template's own allocations, so the function declares them private_params
// (and atomic dQ's sums too): the atomics into them leave the block lists readable ahead, and the
// loads stay pipelined.
// `alsoPrivate`: another parameter that is the template's own buffer (atomic dQ's f32 sums).
std::vector<TrainableCapture> declareTrainable(ir::Function& f, const ScoreMod& scoreMod, bool deterministic,
                                               const ir::Value* alsoPrivate = nullptr) {
  std::vector<TrainableCapture> out;
  std::vector<int64_t> privateParams;
  for (size_t i = 0; i < f.params().size(); ++i)
    if (alsoPrivate && f.params()[i] == alsoPrivate) privateParams.push_back(int64_t(i));
  for (const CapturedTensor& c : scoreMod.captures())
    if (c.requiresGrad()) {
      privateParams.push_back(int64_t(f.params().size()));
      out.push_back({c.slot(), Tile(f.addParam(Type::pointer(deterministic ? DType::I64 : DType::F32),
                                               "grad_" + c.name()))});
    }
  if (!privateParams.empty()) f.attrs()["private_params"] = privateParams;
  return out;
}

// What dkdv and dq ask of the passes.
void setGradKernelAttributes(ir::Function& f, const GradConstants& k) {
  if (k.tma) f.attrs()["tma"] = int64_t(1);  // the pipeline may fill the rings of the walks with TMA
  f.attrs()["reassociate"] = int64_t(1);  // fold-scales: the scale and log2e meet the mod's factors
  if (k.warpSpecialize) f.attrs()["warp_specialize"] = int64_t(1);  // a producer warpgroup issues them
  if (k.pingpong) f.attrs()["pingpong"] = int64_t(1);  // the consumers take turns issuing products
  // The specialized atomic dQ's walks also wait for the consumers (dSᵀ's staging); they keep TMA
  // rings fed by the producer (codegen/Passes.h, tmaInStagingLoopsWanted), as checked on the GPU by
  // FlexAttentionBackwardGpuSchedule.SpecializedAtomicDq/*.
  if (k.atomicDq && k.warpSpecialize) f.attrs()["tma_in_staging_loops"] = int64_t(1);
  // The full and partial walks share one set of TMA rings (pipeline pass, shared rings): the
  // producer issues the partial walk's first stages as the full walk's last slots free, with no
  // CTA barrier between. Three A/Bs on the H200 (2026-12-04): causal +1.7 to +4.8 %, window +2.9
  // to +3.5 %, document +1.8 %, prefix LM and ALiBi +0 to +1 %; one walk (no mask) compiles the same.
  if (k.tma) f.attrs()["share_rings"] = int64_t(1);
  // A mod's per-step invariant loads (a head's slope) leave the walks: ALiBi +2 % on the H200
  // (2026-12-04). Prefetching the per-key reads only added spills to dkdv and measured level.
  f.attrs()["hoist_invariant_loads"] = int64_t(1);
}

void traceDkdv(ir::Function& f, const std::vector<int64_t>& constants, DType dt, const ScoreMod& scoreMod,
               const MaskMod& maskMod) {
  const auto k = constantsFrom<GradConstants>(constants);
  setGradKernelAttributes(f, k);
  const auto p = declareParams<GradParams>(f, dt);
  std::optional<TileOrderParams<Traced>> order;
  if (k.tileOrder) order = declareParams<TileOrderParams>(f, dt);
  const std::vector<TrainableCapture> trainable =
      declareTrainable(f, scoreMod, k.deterministic, k.atomicDq ? p.dq_accum.value() : nullptr);
  // dq reads nothing dkdv writes: once every dkdv program has started, dq's programs may take the
  // SMs dkdv's last wave leaves idle (programmatic dependent launch; dq waits for dkdv at its end).
  if (k.overlapDq) release_dependent_grids();
  // In launch order, or with tileOrder the key tiles heaviest first (heaviestKeyTilesFirst).
  Tile nBlock = program_id(0), hkv = program_id(1), b = program_id(2);
  if (k.tileOrder)
    std::tie(nBlock, hkv, b) =
        detail::tileFromOrder(order->tile_order, detail::launchIndex(), num_programs(0), num_programs(1));
  Tile offsN = nBlock * k.BN + arange(0, k.BN);
  Tile offsD = arange(0, k.DP);
  Tile b64 = b.to(DType::I64);
  Tile colLive = offsN < p.kv_len;
  Tile dLive = offsD < k.D;
  auto byD = [&](const Tile& rows) { return rowsByHeadDim(rows, dLive, k); };
  const detail::ValueColumns vc(k.D, k.DP, k.DV, k.DVP, offsD);  // V, dO and dV
  auto byDV = [&](const Tile& rows) { return vc.rowsBy(rows, byD); };
  // Unmasked only where the keys fill whole blocks and no column is padding: a padded D read 48
  // columns past each row at D = 80, and past the end of the last one
  // (FlexAttentionBackward.PaddedHeadDimOverWholeBlocks).
  const bool kExact = k.kvExact && k.DP == k.D, vExact = k.kvExact && k.DVP == k.DV;
  // A split head dim (k.DS, as the forward's and dq's): K's resident tile, Q's steps and dK's
  // accumulator in two chunks; Sᵀ is the sum of the chunks' products. Otherwise one tile DP wide.
  // V's own (k.DVS) the same way: V's resident tile, dO's steps and dV's accumulator, dPᵀ the sum.
  const std::vector<detail::HeadDimChunk> chunks = detail::headDimChunks(k.D, k.DS);
  const std::vector<detail::HeadDimChunk> vChunks = detail::headDimChunks(k.DV, k.DVS);
  const size_t dkParts = std::max<size_t>(1, chunks.size()), dvParts = std::max<size_t>(1, vChunks.size());
  auto chunkExact = [&](const detail::HeadDimChunk& c, bool rowsExact) { return rowsExact && !c.live.valid(); };
  Tile kvOffs = chunks.empty() ? offsN.expand(1) * p.k_stride_n + offsD.expand(0) : Tile();
  Tile kBase = p.k + (b64 * p.k_stride_b + hkv.to(DType::I64) * p.k_stride_h);
  Tile vBase = p.v + (b64 * p.v_stride_b + hkv.to(DType::I64) * p.v_stride_h);
  std::vector<Tile> kt;  // K's tile, or its chunks
  if (chunks.empty()) kt.push_back(kExact ? load(kBase + kvOffs) : load(kBase + kvOffs, byD(colLive)));
  else kt = detail::loadChunks(kBase, offsN.expand(1) * p.k_stride_n, chunks, k.kvExact, colLive);
  std::vector<Tile> vt;  // V's tile, or its chunks
  if (vChunks.empty()) {
    Tile vOffs = offsN.expand(1) * p.v_stride_n + vc.offs.expand(0);
    vt.push_back(vExact ? load(vBase + vOffs) : load(vBase + vOffs, byDV(colLive)));
  } else {
    vt = detail::loadChunks(vBase, offsN.expand(1) * p.v_stride_n, vChunks, k.kvExact, colLive);
  }
  Tile kvPos = offsN.expand(1);
  Tile maskCol = (nBlock * k.BN) / k.KVBS;
  const int64_t R = k.QBS / k.BM;

  // The carried accumulators: dK's tile (or its chunks), then dV's.
  auto headGroup = [&](const Tile& h, const std::vector<Tile>& acc) {
    Tile h64 = h.to(DType::I64);
    Tile qBase = p.q + (b64 * p.q_stride_b + h64 * p.q_stride_h);
    Tile doBase = p.dout + (b64 * p.dout_stride_b + h64 * p.dout_stride_h);
    Tile rowBase = (b * p.q_heads + h).to(DType::I64) * p.q_len;
    Tile colBase = b * p.mask_b_stride + h * p.mask_h_stride + maskCol;
    // Both lists' lengths before the first walk (as in the forward).
    Tile fullCount = k.hasFull ? load(p.full_num + colBase) : Tile();
    Tile partialCount = k.hasPartial ? load(p.partial_num + colBase) : Tile();
    auto walk = [&](const Tile& count, const Tile& indices, bool partial, const std::vector<Tile>& acc0) {
      Tile listBase = colBase * p.mask_q_blocks;
      return for_range(0, count * R, 1, acc0, [&](Tile t, const std::vector<Tile>& acci) {
        Tile entry = t / R;
        Tile block = detail::listEntry(indices, listBase, entry, count, p.mask_q_blocks);
        Tile row0 = block * k.QBS + (t % R) * k.BM;
        if (!k.qExact) row0 = row0 - p.q_phase;
        Tile offsM = row0 + arange(0, k.BM);
        Tile rowLive = offsM < p.q_len;
        if (!k.qExact) rowLive = rowLive & (offsM >= 0);
        Tile qOffs = chunks.empty() ? offsM.expand(1) * p.q_stride_m + offsD.expand(0) : Tile();
        Tile doOffs = vChunks.empty() ? offsM.expand(1) * p.dout_stride_m + vc.offs.expand(0) : Tile();
        const bool exact = k.qExact && k.DP == k.D;
        const Tile live = exact ? Tile() : byD(rowLive);
        const bool doExact = k.qExact && k.DVP == k.DV;
        const Tile doLive = !vChunks.empty() ? Tile() : !vc.own ? live : doExact ? Tile() : byDV(rowLive);
        // The step's LSE (+inf past L: p exactly 0 there) and delta. Specialized, they are boxes of
        // the [B * Hq, L] rows where L allows (rowBoxes), which the producer copies into the ring
        // with Q and dO (a row ring, codegen/passes/Pipeline.cpp) as FlashAttention-3 does: no
        // global loads in the consumers' steps. TMA zero-fills rows past L, so there the scores of
        // those rows are set to -inf below instead. Specialized without boxes, the loads come before
        // the consumers' wait for the ring, their latency behind it; unspecialized, after the ring's
        // loads (the other order costs the soft-cap dkdv 40 more bytes of spills).
        Tile lse2, delta;
        auto loadRows = [&] {
          const Tile ptrs = rowBase + offsM;
          if (k.rowBoxes) {
            auto boxOf = [&](const Tile& v) {
              return TensorBox{v, {detail::kUnboundedDim, p.q_len}, {p.q_len}, {b * p.q_heads + h, row0}};
            };
            lse2 = k.qExact ? load(p.lse2 + ptrs, boxOf(p.lse2)) : load(p.lse2 + ptrs, rowLive, boxOf(p.lse2));
            delta = k.qExact ? load(p.delta + ptrs, boxOf(p.delta)) : load(p.delta + ptrs, rowLive, boxOf(p.delta));
          } else {
            lse2 = k.qExact ? load(p.lse2 + ptrs) : load(p.lse2 + ptrs, rowLive, INFINITY);
            delta = k.qExact ? load(p.delta + ptrs) : load(p.delta + ptrs, rowLive);
          }
        };
        if (k.warpSpecialize) loadRows();
        const detail::StreamedRows qRows{p.q, p.q_len, p.q_stride_b, p.q_stride_h, p.q_stride_m};
        const std::vector<Tile> qt =  // Q's tile, or its chunks
            chunks.empty()
                ? std::vector<Tile>{detail::loadStreamedRows(qBase + qOffs, exact, live, qRows, b, h, row0, k.D, k.tma)}
                : detail::loadStreamedChunks(qBase, offsM.expand(1) * p.q_stride_m, chunks, k.qExact, rowLive, qRows, b, h,
                                             row0, k.D, k.tma);
        const detail::StreamedRows doRows{p.dout, p.q_len, p.dout_stride_b, p.dout_stride_h, p.dout_stride_m};
        const std::vector<Tile> dOt =  // dO's tile, or its chunks
            vChunks.empty()
                ? std::vector<Tile>{detail::loadStreamedRows(doBase + doOffs, doExact, doLive, doRows, b, h, row0, k.DV,
                                                             k.tma)}
                : detail::loadStreamedChunks(doBase, offsM.expand(1) * p.dout_stride_m, vChunks, k.qExact, rowLive,
                                             doRows, b, h, row0, k.DV, k.tma);
        if (!k.warpSpecialize) loadRows();
        Tile qPos = (offsM + p.q_offset).expand(0);
        // Without a score_mod both products go first: on sm_90a their wgmmas are in flight
        // together, and dPᵀ's while the scores go through the mask and exp2 (codegen/LowerDot.cpp
        // waits at first use). A score_mod's live values and dPᵀ's together spill (soft-cap: 132
        // bytes), so then dPᵀ waits for pᵀ; so it does beside the specialized atomic dQ's
        // accumulator (causal dkdv: 476 -> 408 bytes of spills).
        const bool atomicDqT = k.atomicDq && k.warpSpecialize;
        Tile sT = dot(kt[0], qt[0].trans());  // [BN, BM], chunk by chunk where the head dim is split
        for (size_t i = 1; i < kt.size(); ++i) sT = dot(kt[i], qt[i].trans(), sT);
        auto dpProduct = [&] {  // dPᵀ = V·dOᵀ, chunk by chunk where v's head dim is split
          Tile dp = dot(vt[0], dOt[0].trans());
          for (size_t i = 1; i < vt.size(); ++i) dp = dot(vt[i], dOt[i].trans(), dp);
          return dp;
        };
        std::optional<Tile> dpEarly;
        if (!k.hasScoreMod && !atomicDqT && (!partial || k.maskedDpEarly)) dpEarly = dpProduct();
        ModScores m = modScores(k, sT, p.scale, scoreMod, b, h, qPos, kvPos);
        // The exponent, then the masks: lse2 is never -inf (+inf on empty rows), so a masked score
        // gives -inf either way, and without a score_mod s · scale − lse2 stays one fma.
        Tile z = k.exponentFirst ? m.z - lse2.expand(0) : m.z;
        if (partial) z = where(maskMod(b, h, qPos, kvPos), z, -INFINITY);
        // Keys past kv_len only reach rows of dK/dV that are not stored, but their scores must
        // not reach the captured gradients, nor dQ.
        if (!k.kvExact && (k.numTrainable || k.atomicDq)) z = where(colLive.expand(1), z, -INFINITY);
        if (k.rowBoxes && !k.qExact) z = where(rowLive.expand(0), z, -INFINITY);
        Tile pT = exp2(k.exponentFirst ? z : z - lse2.expand(0));
        const Tile pLow = pT.to(dt);
        std::vector<Tile> dvNew;
        for (size_t i = 0; i < dvParts; ++i) dvNew.push_back(dot(pLow, dOt[i], acci[dkParts + i]));
        // A mod's adjoint is linear in its seed: without trainable captures (whose gradients need
        // the seed itself) it is seed · g with g the adjoint of ones, taken here, before dPᵀ's
        // wait, so that only p·g stays live across it, not the mod's intermediates (soft-cap's tanh).
        const bool seedFree = k.hasScoreMod && k.numTrainable == 0 && k.seedFreeAdjoint;
        std::optional<Tile> pg;
        if (seedFree) pg = pT * modAdjoint(m, full({k.BN, k.BM}, 1.0, DType::F32), nullptr, false);
        Tile dpT = dpEarly ? *dpEarly : dpProduct();
        Tile dsT = (pg ? *pg : pT) * (dpT - delta.expand(0));
        if (k.hasScoreMod && !seedFree) dsT = modAdjoint(m, dsT, &trainable, k.deterministic);
        Tile dsLow = dsT.to(dt);
        // dQ_i += scale sum_j dS'_ij K_j, into the f32 buffer [B, Hq, L, D]. Specialized (two
        // consumer warpgroups) as dQᵀ = Kᵀ dSᵀ: its DP rows give each warpgroup 64 of them on
        // wgmma, with Kᵀ and dSᵀ read from shared memory, where dQ's BM = 64 rows would leave it to
        // mma.sync and hold K's fragments in every thread. Its product goes before dK's (the
        // document dkdv spills 420 bytes so, 560 after dK; the others the same), and its rows are
        // added after dK's product is issued, so that they are staged and sent while it runs.
        std::vector<Tile> dqT;
        if (atomicDqT)
          for (const Tile& kc : kt) dqT.push_back(dot(kc.trans(), dsLow));
        auto accumulateDq = [&] {
          for (size_t i = 0; i < kt.size(); ++i) {
            const detail::HeadDimChunk* c = chunks.empty() ? nullptr : &chunks[i];
            Tile dq = atomicDqT ? (dqT[i] * p.grad_scale).trans()  // [BM, DP]
                                : dot(dsLow.trans(), kt[i]) * p.grad_scale;
            Tile dqPtrs = p.dq_accum + ((rowBase + offsM).expand(1) * k.D + (c ? c->offs : offsD).expand(0));
            // The same elements as a box of the [B * Hq, L, D] sums: on sm_90a a few TMA reductions
            // from one thread add the tile (codegen/passes/BulkReduce.cpp).
            const TensorBox box{p.dq_accum, {detail::kUnboundedDim, p.q_len, k.D}, {p.dq_accum_stride_h, k.D},
                                {b * p.q_heads + h, row0, c ? c->first : 0}};
            if (c ? chunkExact(*c, k.qExact) : exact)
              atomic_add(dqPtrs, dq, box);
            else
              atomic_add(dqPtrs, dq, c ? c->rowsBy(rowLive) : byD(rowLive), box);
          }
        };
        std::vector<Tile> next;
        for (size_t i = 0; i < dkParts; ++i) next.push_back(dot(dsLow, qt[i], acci[i]));
        if (k.atomicDq) accumulateDq();
        next.insert(next.end(), dvNew.begin(), dvNew.end());
        return next;
      });
    };
    std::vector<Tile> out = acc;
    if (k.hasFull) out = walk(fullCount, p.full_indices, false, out);
    if (k.hasPartial) out = walk(partialCount, p.partial_indices, true, out);
    return out;
  };

  std::vector<Tile> acc;
  if (chunks.empty()) acc.push_back(zeros({k.BN, k.DP}, DType::F32));
  for (const detail::HeadDimChunk& c : chunks) acc.push_back(zeros({k.BN, c.offs.shape()[0]}, DType::F32));
  if (vChunks.empty()) acc.push_back(zeros({k.BN, k.DVP}, DType::F32));
  for (const detail::HeadDimChunk& c : vChunks) acc.push_back(zeros({k.BN, c.offs.shape()[0]}, DType::F32));
  if (k.G == 1)
    acc = headGroup(hkv, acc);
  else
    acc = for_range(0, k.G, 1, acc,
                    [&](Tile g, const std::vector<Tile>& acci) { return headGroup(hkv * k.G + g, acci); });
  // dK (its tile or its chunks) and dV are contiguous [B, Hkv, S, D] and [B, Hkv, S, DV].
  Tile kvRows = (b * (p.q_heads / k.G) + hkv).to(DType::I64) * p.kv_len;
  Tile outOffs = kvRows * k.D + (offsN.expand(1) * k.D + offsD.expand(0));
  for (size_t i = 0; i < dkParts; ++i) {
    const detail::HeadDimChunk* c = chunks.empty() ? nullptr : &chunks[i];
    Tile offs = c ? kvRows * k.D + (offsN.expand(1) * k.D + c->offs.expand(0)) : outOffs;
    Tile dkLow = (acc[i] * p.grad_scale).to(dt);
    if (c ? chunkExact(*c, k.kvExact) : kExact)
      store(p.grad + offs, dkLow);
    else
      store(p.grad + offs, dkLow, c ? c->rowsBy(colLive) : byD(colLive));
  }
  for (size_t i = 0; i < dvParts; ++i) {
    const detail::HeadDimChunk* c = vChunks.empty() ? nullptr : &vChunks[i];
    Tile offs = c ? kvRows * k.DV + (offsN.expand(1) * k.DV + c->offs.expand(0))
                : vc.own ? kvRows * k.DV + (offsN.expand(1) * k.DV + vc.offs.expand(0)) : outOffs;
    Tile dvLow = acc[dkParts + i].to(dt);
    if (c ? chunkExact(*c, k.kvExact) : vExact)
      store(p.grad2 + offs, dvLow);
    else
      store(p.grad2 + offs, dvLow, c ? c->rowsBy(colLive) : byDV(colLive));
  }
}

void traceDq(ir::Function& f, const std::vector<int64_t>& constants, DType dt, const ScoreMod& scoreMod,
             const MaskMod& maskMod) {
  const auto k = constantsFrom<GradConstants>(constants);
  setGradKernelAttributes(f, k);
  const auto p = declareParams<GradParams>(f, dt);
  std::optional<TileOrderParams<Traced>> order;
  if (k.tileOrder) order = declareParams<TileOrderParams>(f, dt);
  // The gradient buffers exist in both kernels' signatures (one argument list); dq never writes them.
  declareTrainable(f, scoreMod, k.deterministic);
  // The query tiles in reverse launch order (causal: the longest rows first), or with tileOrder
  // heaviest first (heaviestTilesFirst).
  Tile mBlock = num_programs(0) - 1 - program_id(0), h = program_id(1), b = program_id(2);
  if (k.tileOrder)
    std::tie(mBlock, h, b) =
        detail::tileFromOrder(order->tile_order, detail::launchIndex(), num_programs(0), num_programs(1));
  Tile hkv = h / k.G;
  Tile offsM = mBlock * k.BM + arange(0, k.BM);
  Tile offsD = arange(0, k.DP);
  Tile b64 = b.to(DType::I64), h64 = h.to(DType::I64);
  Tile rowLive = offsM < p.q_len;
  Tile dLive = offsD < k.D;
  auto byD = [&](const Tile& rows) { return rowsByHeadDim(rows, dLive, k); };
  const detail::ValueColumns vc(k.D, k.DP, k.DV, k.DVP, offsD);  // V, dO and dV
  auto byDV = [&](const Tile& rows) { return vc.rowsBy(rows, byD); };
  const bool exact = k.qExact && k.DP == k.D, doExact = k.qExact && k.DVP == k.DV;
  // A split head dim (k.DS, as the forward's): Q's and K's columns, and dQ's, in two chunks; S is the
  // sum of the chunks' products and dQ an accumulator a chunk. Otherwise one tile DP wide. V's own
  // (k.DVS) the same way: dO's and V's chunks, dP the sum of their products.
  const std::vector<detail::HeadDimChunk> chunks = detail::headDimChunks(k.D, k.DS);
  const std::vector<detail::HeadDimChunk> vChunks = detail::headDimChunks(k.DV, k.DVS);
  Tile qBase = p.q + (b64 * p.q_stride_b + h64 * p.q_stride_h);
  Tile qPtrs = chunks.empty() ? qBase + (offsM.expand(1) * p.q_stride_m + offsD.expand(0)) : Tile();
  Tile doBase = p.dout + (b64 * p.dout_stride_b + h64 * p.dout_stride_h);
  Tile doPtrs = vChunks.empty() ? doBase + (offsM.expand(1) * p.dout_stride_m + vc.offs.expand(0)) : Tile();
  const std::vector<Tile> qt =  // Q's tile, or its chunks
      chunks.empty() ? std::vector<Tile>{exact ? load(qPtrs) : load(qPtrs, byD(rowLive))}
                     : detail::loadChunks(qBase, offsM.expand(1) * p.q_stride_m, chunks, k.qExact, rowLive);
  const std::vector<Tile> dOt =  // dO's tile, or its chunks
      vChunks.empty() ? std::vector<Tile>{doExact ? load(doPtrs) : load(doPtrs, byDV(rowLive))}
                      : detail::loadChunks(doBase, offsM.expand(1) * p.dout_stride_m, vChunks, k.qExact, rowLive);
  Tile rows = (b * p.q_heads + h).to(DType::I64) * p.q_len + offsM;
  Tile lse2 = k.qExact ? load(p.lse2 + rows) : load(p.lse2 + rows, rowLive, INFINITY);
  Tile delta = k.qExact ? load(p.delta + rows) : load(p.delta + rows, rowLive);
  Tile kBase = p.k + (b64 * p.k_stride_b + hkv.to(DType::I64) * p.k_stride_h);
  Tile vBase = p.v + (b64 * p.v_stride_b + hkv.to(DType::I64) * p.v_stride_h);
  Tile maskRow = minimum((mBlock * k.BM + p.q_phase) / k.QBS, p.mask_q_blocks - 1);
  Tile rowBase = b * p.mask_b_stride + h * p.mask_h_stride + maskRow;
  Tile qPos = (offsM + p.q_offset).expand(1);
  const int64_t R = k.KVBS / k.BN;

  // Both lists' lengths before the first walk (as in the forward).
  Tile fullCount = k.hasFull ? load(p.full_num + rowBase) : Tile();
  Tile partialCount = k.hasPartial ? load(p.partial_num + rowBase) : Tile();
  auto walk = [&](const Tile& count, const Tile& indices, bool partial, const std::vector<Tile>& dq0) {
    Tile listBase = rowBase * p.mask_kv_blocks;
    return for_range(0, count * R, 1, dq0, [&](Tile t, const std::vector<Tile>& dqi) {
      Tile entry = t / R;
      Tile block = detail::listEntry(indices, listBase, entry, count, p.mask_kv_blocks);
      Tile row0 = block * k.KVBS + (t % R) * k.BN;
      Tile offsN = row0 + arange(0, k.BN);
      Tile colLive = offsN < p.kv_len;
      Tile kOffs = chunks.empty() ? offsN.expand(1) * p.k_stride_n + offsD.expand(0) : Tile();
      Tile vOffs = vChunks.empty() ? offsN.expand(1) * p.v_stride_n + vc.offs.expand(0) : Tile();
      const bool kvExact = k.kvExact && k.DP == k.D, vExact = k.kvExact && k.DVP == k.DV;
      const Tile live = kvExact || !chunks.empty() ? Tile() : byD(colLive);
      const Tile vLive = vExact || !vChunks.empty() ? Tile()
                         : !vc.own                      ? (live.valid() ? live : byD(colLive))
                                                        : byDV(colLive);
      const detail::StreamedRows kRows{p.k, p.kv_len, p.k_stride_b, p.k_stride_h, p.k_stride_n};
      const std::vector<Tile> kt =  // K's tile, or its chunks
          chunks.empty()
              ? std::vector<Tile>{detail::loadStreamedRows(kBase + kOffs, kvExact, live, kRows, b, hkv, row0, k.D, k.tma)}
              : detail::loadStreamedChunks(kBase, offsN.expand(1) * p.k_stride_n, chunks, k.kvExact, colLive, kRows, b, hkv,
                                           row0, k.D, k.tma);
      const detail::StreamedRows vRows{p.v, p.kv_len, p.v_stride_b, p.v_stride_h, p.v_stride_n};
      const std::vector<Tile> vt =  // V's tile, or its chunks
          vChunks.empty()
              ? std::vector<Tile>{detail::loadStreamedRows(vBase + vOffs, vExact, vLive, vRows, b, hkv, row0, k.DV, k.tma)}
              : detail::loadStreamedChunks(vBase, offsN.expand(1) * p.v_stride_n, vChunks, k.kvExact, colLive, vRows, b,
                                           hkv, row0, k.DV, k.tma);
      Tile kvPos = offsN.expand(0);
      Tile s = dot(qt[0], kt[0].trans());  // [BM, BN], chunk by chunk where the head dim is split
      for (size_t i = 1; i < kt.size(); ++i) s = dot(qt[i], kt[i].trans(), s);
      auto dpProduct = [&] {  // dP = dO·Vᵀ, chunk by chunk where v's head dim is split
        Tile dp = dot(dOt[0], vt[0].trans());
        for (size_t i = 1; i < vt.size(); ++i) dp = dot(dOt[i], vt[i].trans(), dp);
        return dp;
      };
      std::optional<Tile> dpEarly;  // in flight with s (see dkdv)
      if (!k.hasScoreMod) dpEarly = dpProduct();
      ModScores m = modScores(k, s, p.scale, scoreMod, b, h, qPos, kvPos);
      Tile z = k.exponentFirst ? m.z - lse2.expand(1) : m.z;  // the exponent, then the masks (as in dkdv)
      if (partial) z = where(maskMod(b, h, qPos, kvPos), z, -INFINITY);
      if (!k.kvExact) z = where(colLive.expand(0), z, -INFINITY);
      Tile pr = exp2(k.exponentFirst ? z : z - lse2.expand(1));
      // The mod's adjoint as p·g before dP's wait (as in dkdv; dq scatters no captured gradient).
      std::optional<Tile> pg;
      if (k.hasScoreMod && k.seedFreeAdjoint) pg = pr * modAdjoint(m, full({k.BM, k.BN}, 1.0, DType::F32), nullptr, false);
      Tile dp = dpEarly ? *dpEarly : dpProduct();
      Tile ds = (pg ? *pg : pr) * (dp - delta.expand(1));
      if (k.hasScoreMod && !pg) ds = modAdjoint(m, ds, nullptr, false);
      Tile dsLow = ds.to(dt);
      std::vector<Tile> next;
      for (size_t i = 0; i < kt.size(); ++i) next.push_back(dot(dsLow, kt[i], dqi[i]));
      return next;
    });
  };
  std::vector<Tile> dq;
  if (chunks.empty()) dq.push_back(zeros({k.BM, k.DP}, DType::F32));
  for (const detail::HeadDimChunk& c : chunks) dq.push_back(zeros({k.BM, c.offs.shape()[0]}, DType::F32));
  if (k.hasFull) dq = walk(fullCount, p.full_indices, false, dq);
  if (k.hasPartial) dq = walk(partialCount, p.partial_indices, true, dq);
  // dQ is contiguous [B, Hq, L, D].
  for (size_t i = 0; i < dq.size(); ++i) {
    const detail::HeadDimChunk* c = chunks.empty() ? nullptr : &chunks[i];
    Tile dqScaled = (dq[i] * p.grad_scale).to(dt);
    Tile outOffs = (rows.expand(1) * k.D) + (c ? c->offs : offsD).expand(0);
    if (c ? k.qExact && !c->live.valid() : exact)
      store(p.grad + outOffs, dqScaled);
    else
      store(p.grad + outOffs, dqScaled, c ? c->rowsBy(rowLive) : byD(rowLive));
  }
  // Launched while dkdv's last programs run (overlapDq), dq reads only what the preprocess wrote
  // before dkdv started; waiting for dkdv here, at its end, keeps every later kernel of the stream
  // (the captured gradients' conversion, the user's next) after dkdv too.
  if (k.overlapDq) wait_for_prior_grids();
}

// Deterministic captured gradients: 64-bit fixed point to f32.
template <template <class> class P>
struct FixedPointParams {
  BOOST_HANA_DEFINE_STRUCT(FixedPointParams, (P<I64Ptr>, in), (P<F32Ptr>, out), (P<I32>, n));
};
// The 1-D element-wise kernels (fixed point to f32, atomic dQ's cast): BLOCK elements a program.
struct ElementwiseConstants {
  BOOST_HANA_DEFINE_STRUCT(ElementwiseConstants, (int64_t, BLOCK));
};
void traceFixedPoint(ir::Function& f, const std::vector<int64_t>& constants) {
  const auto k = constantsFrom<ElementwiseConstants>(constants);
  const auto p = declareParams<FixedPointParams>(f, DType::F32);
  Tile offs = program_id(0) * k.BLOCK + arange(0, k.BLOCK);
  Tile ok = offs < p.n;
  store(p.out + offs, load(p.in + offs, ok).to(DType::F32) * (1.0 / kFixedPointScale), ok);
}

// Attention sinks' gradient (FlexAttentionBackwardOptions::sinks): program h sums
// -e^{sink_h - lse} delta over every row of head h, batch by batch and block by block in a fixed
// order (bitwise reproducible), from what the preprocess wrote (lse2 in the exp2 domain, +inf for
// a row without keys or sink: weight 0).
template <template <class> class P>
struct SinkGradParams {
  BOOST_HANA_DEFINE_STRUCT(SinkGradParams, (P<F32Ptr>, lse2), (P<F32Ptr>, delta), (P<F32Ptr>, sinks),
                           (P<F32Ptr>, dsinks), (P<I32>, q_len), (P<I32>, q_heads), (P<I32>, batch));
};
struct SinkGradConstants {
  BOOST_HANA_DEFINE_STRUCT(SinkGradConstants, (int64_t, BM));
};
void traceSinkGrad(ir::Function& f, const std::vector<int64_t>& constants) {
  const auto k = constantsFrom<SinkGradConstants>(constants);
  const auto p = declareParams<SinkGradParams>(f, DType::F32);
  Tile h = program_id(0);
  Tile sinkLog2 = load(p.sinks + h) * kLog2e;
  Tile blocks = (p.q_len + (k.BM - 1)) / k.BM;
  Tile terms = for_range(0, p.batch * blocks, 1, zeros({k.BM}, DType::F32), [&](Tile t, Tile acc) {
    Tile b = t / blocks;
    Tile offsM = (t % blocks) * k.BM + arange(0, k.BM);
    Tile live = offsM < p.q_len;
    Tile rows = (b * p.q_heads + h).to(DType::I64) * p.q_len + offsM;
    Tile lse2 = load(p.lse2 + rows, live, INFINITY);
    Tile delta = load(p.delta + rows, live, 0.0);
    return acc + exp2(sinkLog2 - lse2) * delta;
  });
  store(p.dsinks + h, -sum(terms, 0));
}

// Atomic dQ: the f32 sums to q's dtype.
template <template <class> class P>
struct CastParams {
  BOOST_HANA_DEFINE_STRUCT(CastParams, (P<F32Ptr>, in), (P<Data>, out), (P<I32>, n));
};
void traceCast(ir::Function& f, const std::vector<int64_t>& constants, DType dt) {
  const auto k = constantsFrom<ElementwiseConstants>(constants);
  const auto p = declareParams<CastParams>(f, dt);
  Tile offs = program_id(0) * k.BLOCK + arange(0, k.BLOCK);
  Tile ok = offs < p.n;
  store(p.out + offs, load(p.in + offs, ok).to(dt), ok);
}

// ---- host side ---------------------------------------------------------------

using detail::sharedKernel;

Kernel& preprocessKernel(DType dt) {
  const std::string name = "flex_bwd_preprocess_" + std::string(ir::dtypeName(dt));
  return sharedKernel(name, [&] {
    return Kernel(name, [dt](ir::Function& f, const std::vector<int64_t>& c) { tracePreprocess(f, c, dt); },
                  constantCount<PreprocessConstants>());
  });
}

Kernel& sinkGradKernel() {
  return sharedKernel("flex_bwd_sink_grad", [] {
    return Kernel("flex_bwd_sink_grad", [](ir::Function& f, const std::vector<int64_t>& c) { traceSinkGrad(f, c); },
                  constantCount<SinkGradConstants>());
  });
}

Kernel& fixedPointKernel() {
  return sharedKernel("flex_bwd_fixed_point", [] {
    return Kernel("flex_bwd_fixed_point", [](ir::Function& f, const std::vector<int64_t>& c) { traceFixedPoint(f, c); },
                  constantCount<ElementwiseConstants>());
  });
}

// The launch of a 1-D element-wise kernel over n elements.
LaunchOptions elementwiseLaunch(int64_t n) {
  const int64_t BLOCK = 1024;
  LaunchOptions lo;
  lo.grid = {cdiv(n, BLOCK), 1, 1};
  lo.constants = constantList(ElementwiseConstants{BLOCK});
  lo.num_stages = 1;
  return lo;
}

Kernel& castKernel(DType dt) {
  const std::string name = "flex_bwd_cast_dq_" + std::string(ir::dtypeName(dt));
  return sharedKernel(name, [&] {
    return Kernel(name, [dt](ir::Function& f, const std::vector<int64_t>& c) { traceCast(f, c, dt); },
                  constantCount<ElementwiseConstants>());
  });
}

// The gradient kernels live in the mask mod's state (as the forward's), keyed by the score mod's
// state, the dtype and which of the two kernels.
Kernel& gradKernel(const char* which, const ScoreMod& scoreMod, const MaskMod& maskMod, DType dt) {
  char key[128];
  std::snprintf(key, sizeof key, "flex_bwd_%s/%p/%s", which, static_cast<const void*>(&scoreMod.state()),
                std::string(ir::dtypeName(dt)).c_str());
  return maskMod.state().kernel(key, scoreMod.lifetime(), [&] {
    const std::string name = detail::kernelName(std::string("flex_bwd_") + which + "_" + scoreMod.name() + "_" + maskMod.name());
    const bool dkdv = std::string(which) == "dkdv";
    // The kernel lives in the mask mod's state and holds detached copies of both mods: no cycle, and
    // the entry goes with the score mod (ModState::kernel).
    return Kernel(name,
                  [dt, score = scoreMod.detached(), held = maskMod.detached(), dkdv](ir::Function& f,
                                                                                    const std::vector<int64_t>& c) {
                    if (dkdv)
                      traceDkdv(f, c, dt, score, held);
                    else
                      traceDq(f, c, dt, score, held);
                  },
                  constantCount<GradConstants>());
  });
}

void checkConfig(const char* which, const FlexAttentionConfig& c, const BlockMask& mask) {
  if (auto why = detail::backwardTileProblem(c, &mask))
    throw Error(std::string("flex_attention_backward: ") + which + " config " + c.describe() + ": " + *why);
}

// The resolver's pair where it gives one this call can take; nullopt (the default) otherwise.
// `problem()` is built only when a resolver is set (a template, not a std::function: the call's
// lambda captures a dozen references, which a std::function would allocate for on every call).
template <class MakeProblem>
std::optional<FlexAttentionBackwardConfig> resolvedConfig(MakeProblem&& problem,
                                                          const std::optional<BlockMask>& blockMask) {
  const std::optional<FlexAttentionBackwardConfig> c =
      detail::ResolverSlot<FlexAttentionBackwardConfig>::instance().ask(problem);
  const BlockMask* mask = blockMask ? &*blockMask : nullptr;
  if (!c || detail::backwardTileProblem(c->dkdv, mask) || detail::backwardTileProblem(c->dq, mask))
    return std::nullopt;
  return c;
}

std::string shapeOf(int64_t a, int64_t b, int64_t c, int64_t d = -1) {
  std::string s = "[" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c);
  if (d >= 0) s += ", " + std::to_string(d);
  return s + "]";
}

}  // namespace

void setFlexAttentionBackwardConfigResolver(FlexAttentionBackwardConfigResolver resolver) {
  detail::ResolverSlot<FlexAttentionBackwardConfig>::instance().set(std::move(resolver));
}

namespace detail {
std::optional<std::string> backwardTileProblem(const FlexAttentionConfig& c, const BlockMask* mask) {
  if (auto why = detail::configProblem(c, mask)) return why;
  if (c.defer == LoopSchedule::On)
    return "defer is a schedule of the forward's loop; the backward's kernels do not have it";
  if (c.persistent == LoopSchedule::On)
    return "persistent programs are a schedule of the forward; the backward's kernels launch a program per tile";
  if (c.skew == LoopSchedule::On || c.overlap == LoopSchedule::On)
    return "skew and overlap are schedules of the forward's walks; the backward's kernels do not have them";
  return std::nullopt;
}

FlexAttentionBackwardConfig untunedBackwardConfig(DType dtype, int64_t D, int64_t DV, MemorySpace space,
                                                  std::optional<codegen::Target> target, const ScoreMod& scoreMod,
                                                  const std::optional<BlockMask>& blockMask, DqAccumulation dq) {
  FlexAttentionBackwardConfig config = defaultFlexAttentionBackwardConfig(
      dtype, D, defaultsTarget(space, target), modsGatherPerElement(scoreMod, blockMask), dq,
      DV != D ? std::optional<int64_t>(DV) : std::nullopt);
  if (!blockMask) return config;
  // Narrowed to tile a mask of smaller blocks.
  for (FlexAttentionConfig* c : {&config.dkdv, &config.dq}) {
    auto rowsOf = [&](const FlexAttentionConfig& t) { return c == &config.dkdv ? t.block_n : t.block_m; };
    const int64_t rowsBefore = rowsOf(*c);
    c->block_m = std::min(c->block_m, std::max<int64_t>(16, blockMask->qBlockSize()));
    c->block_n = std::min(c->block_n, std::max<int64_t>(16, blockMask->kvBlockSize()));
    // A program's rows (dkdv: keys, dq: queries), when they shrink, keep 16 per warp, one
    // warpgroup at least. (Rows that stay keep their warps: 64 keys on 8 warps at D = 256 is the
    // default's own split of N between two warpgroups.)
    const int64_t rows = rowsOf(*c);
    if (rows == rowsBefore) continue;
    const int warps = int(std::min<int64_t>(c->num_warps, std::max<int64_t>(4, rows / 16)));
    if (warps != c->num_warps) c->warp_specialize = WarpSpecialization::Auto;  // measured at 8 warps only
    c->num_warps = warps;
  }
  return config;
}
}  // namespace detail

FlexAttentionGrads flex_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& lse, const Tensor& dout, const ScoreMod& scoreMod,
                                           const std::optional<BlockMask>& blockMask,
                                           const FlexAttentionBackwardOptions& options) {
  detail::expectAttentionInput("flex_attention_backward", "q", q);
  detail::expectAttentionInput("flex_attention_backward", "k", k);
  FlexAttentionGrads grads;
  grads.dq = Tensor::empty(q.dtype(), q.shape(), q.space());
  grads.dk = Tensor::empty(q.dtype(), {k.size(0), k.size(1), k.size(2), q.size(3)}, q.space());
  detail::expectAttentionInput("flex_attention_backward", "v", v);
  grads.dv = Tensor::empty(q.dtype(), {k.size(0), k.size(1), k.size(2), v.size(3)}, q.space());
  flex_attention_backward_into(q, k, v, out, lse, dout, scoreMod, blockMask, grads, options);
  return grads;
}

namespace {

// The backward's per-row scratch (delta, lse2), one buffer per thread, space and stream.
struct BackwardRowsSlot;
struct BackwardDqSlot;

// Validates the inputs and makes the launches (and the captured gradients' buffers) of one call.
// `plan` set: compiles each launch for `target` instead of running it.
void backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
              const Tensor& dout, const ScoreMod& scoreModIn, const std::optional<BlockMask>& blockMask,
              FlexAttentionGrads& grads, const FlexAttentionBackwardOptions& options,
              FlexAttentionBackwardPlan* plan, std::optional<codegen::Target> target) {
  static const char* op = "flex_attention_backward";
  detail::expectAttentionInput(op, "q", q);
  detail::expectAttentionInput(op, "k", k);
  detail::expectAttentionInput(op, "v", v);
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const DType dt = q.dtype();
  if (k.dtype() != dt || v.dtype() != dt)
    throw Error(std::string(op) + ": q, k and v must have one dtype, got q " + q.describe() + ", k " + k.describe() +
                ", v " + v.describe());
  if (dt != DType::BF16 && dt != DType::F16 && dt != DType::F32)
    throw Error(std::string(op) + ": dtype must be bf16, f16 or f32, got " + q.describe());
  const int64_t DV = v.size(3);  // v's head dim: out's, dout's and dv's
  if (k.size(0) != B || v.size(0) != B || v.size(1) != Hkv || v.size(2) != S || k.size(3) != D)
    throw Error(std::string(op) + ": k must be [B, Hkv, S, D] with q's B and D, and v [B, Hkv, S, DV] with k's B, Hkv "
                "and S: q " + q.describe() + ", k " + k.describe() + ", v " + v.describe());
  if (Hkv < 1 || Hq % Hkv != 0)
    throw Error(std::string(op) + ": the query heads (" + std::to_string(Hq) + ") must be a multiple of the kv heads (" +
                std::to_string(Hkv) + ")");
  if (!detail::supportedHeadDim(D))
    throw Error(std::string(op) + ": head dim D = " + std::to_string(D) + " is not supported (a multiple of 16 up to 256)",
                ErrorKind::Unsupported);
  if (!detail::supportedHeadDim(DV))
    throw Error(std::string(op) + ": v's head dim DV = " + std::to_string(DV) +
                    " is not supported (a multiple of 16 up to 256): v " + v.describe(),
                ErrorKind::Unsupported);
  const MemorySpace space = q.space();
  if (k.space() != space || v.space() != space)
    throw Error(std::string(op) + ": q, k and v must be in one memory space");
  auto expectLike = [&](const char* what, const Tensor& t) {
    if (!t.defined()) throw Error(std::string(op) + ": " + what + " is an empty tensor");
    if (t.dtype() != dt || t.shape() != Shape{B, Hq, L, DV})
      throw Error(std::string(op) + ": " + what + " must be " + std::string(ir::dtypeName(dt)) + shapeOf(B, Hq, L, DV) +
                  (DV == D ? " like q" : " (q's B, Hq and L; v's head dim)") + ", got " + t.describe());
    detail::expectAttentionInput(op, what, t);
    if (t.space() != space) throw Error(std::string(op) + ": " + what + " is in another memory space than q");
  };
  expectLike("out", out);
  expectLike("dout", dout);
  auto expectRows = [&](const char* what, const Tensor& t) {
    if (!t.defined())
      throw Error(std::string(op) + ": " + what + " is an empty tensor (run the forward with return_lse = true)");
    if (t.dtype() != DType::F32 || t.shape() != Shape{B, Hq, L})
      throw Error(std::string(op) + ": " + what + " must be f32" + shapeOf(B, Hq, L) + ", got " + t.describe());
    if (!t.isContiguous() || t.space() != space)
      throw Error(std::string(op) + ": " + what + " must be contiguous and in q's memory space, got " + t.describe());
  };
  expectRows("lse", lse);
  if (options.dlse) expectRows("dlse", *options.dlse);
  if (options.sinks) detail::expectSinks(op, *options.sinks, Hq, space);
  const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(D));
  if (!std::isfinite(scale) || scale == 0)
    throw Error(std::string(op) + ": scale must be finite and non-zero, got " + std::to_string(scale));

  const ScoreMod scoreMod = scoreModIn.defined() ? scoreModIn : noop_score();
  const bool hasScoreMod = detail::changesScores(scoreMod);
  if (scoreMod.captureSpace() && *scoreMod.captureSpace() != space)
    throw Error(std::string(op) + ": score_mod '" + scoreMod.name() + "' captures tensors in the other memory space");

  const std::optional<FlexAttentionBackwardConfig> tuned =
      options.config || options.dq_accumulation != DqAccumulation::Separate
          ? std::nullopt
          : resolvedConfig(
                [&] { return detail::attentionProblem(dt, B, Hq, Hkv, L, S, D, space, scoreMod, blockMask, DV); },
                blockMask);
  const FlexAttentionBackwardConfig config =
      options.config ? *options.config
      : tuned        ? *tuned
                     : detail::untunedBackwardConfig(dt, D, DV, space, target, scoreMod, blockMask,
                                                     options.dq_accumulation);
  std::optional<BlockMask> ownedMask;
  const BlockMask* maskPtr;
  if (blockMask) {
    maskPtr = &*blockMask;
  } else {
    const int64_t bq = std::max({int64_t(128), config.dkdv.block_m, config.dq.block_m});
    const int64_t bkv = std::max({int64_t(128), config.dkdv.block_n, config.dq.block_n});
    ownedMask = detail::denseBlockMask(L, S, {bq, bkv});
    maskPtr = &*ownedMask;
  }
  const BlockMask& mask = *maskPtr;
  mask.checkInputs(B, Hq, L, S);
  checkConfig("dkdv", config.dkdv, mask);
  checkConfig("dq", config.dq, mask);
  if (mask.qPhase() != 0 && mask.numQBlocks() != 1)
    throw Error(std::string(op) + ": a BlockMask slice starting mid-block must have one row");
  const BlockMaskTensors& lists = mask.tensors(space, options.stream);
  if (!lists.qNum.defined() || !lists.qIndices.defined() || !lists.fullQNum.defined())
    throw Error(std::string(op) + ": the BlockMask has no transposed (per kv block) lists: " + mask.describe());
  const MaskMod& maskMod = mask.maskMod();
  if (maskMod.captureSpace() && *maskMod.captureSpace() != space)
    throw Error(std::string(op) + ": mask_mod '" + maskMod.name() + "' captures tensors in the other memory space");

  auto expectGrad = [&](const char* what, const Tensor& t, const Shape& shape) {
    if (!t.defined() || t.dtype() != dt || t.shape() != shape || !t.isContiguous() || t.space() != space)
      throw Error(std::string(op) + ": " + what + " must be a contiguous " + std::string(ir::dtypeName(dt)) +
                  shapeOf(shape[0], shape[1], shape[2], shape[3]) + " tensor in q's memory space, got " +
                  (t.defined() ? t.describe() : std::string("an empty tensor")));
  };
  expectGrad("dq", grads.dq, q.shape());
  expectGrad("dk", grads.dk, {B, Hkv, S, D});
  expectGrad("dv", grads.dv, {B, Hkv, S, DV});
  grads.trainable.clear();
  grads.captureGrads.clear();
  for (const CapturedTensor& c : scoreMod.captures()) {
    if (!c.requiresGrad()) continue;
    const Tensor t = c.tensor();
    if (!t.isContiguous())
      throw Error(std::string(op) + ": trainable capture '" + c.name() + "' must be contiguous, got " + t.describe());
    grads.trainable.push_back(c);
  }
  const bool deterministic = options.deterministic;
  const bool atomicDq = options.dq_accumulation == DqAccumulation::Atomic;
  if (atomicDq && deterministic)
    throw Error(std::string(op) + ": dq_accumulation = Atomic sums dQ in a varying order, so it cannot be "
                "deterministic; use DqAccumulation::Separate (the default) with deterministic = true");

  // delta and the exp2-domain LSE: kept per thread and stream between calls (detail::perStreamSlot).
  // Allocating them per call made every backward blocking: their cuMemFree at return synchronized
  // the device. The next call on the stream writes them only after this call's kernels have read.
  // lse2 starts at a multiple of 16 floats, so both keep the alignment a fresh allocation has (the
  // kernels are specialized on it); the far end is taken first.
  const int64_t lse2Offset = (B * Hq * L + 15) / 16 * 16;
  Tensor lse2 = detail::f32Scratch<BackwardRowsSlot>(space, options.stream, lse2Offset, {B, Hq, L});
  Tensor delta = detail::f32Scratch<BackwardRowsSlot>(space, options.stream, 0, {B, Hq, L});
  // Atomic dQ sums into f32 [B, Hq, L, D], zeroed on the stream ahead of the kernels (the previous
  // call's cast has read it by then: one stream, in order).
  Tensor dqAccum = lse2;  // a placeholder argument when dQ has its own kernel
  if (atomicDq) {
    dqAccum = detail::f32Scratch<BackwardDqSlot>(space, options.stream, 0, q.shape());
    dqAccum.fillBytes(0, options.stream);
  }
  std::vector<Tensor> gradBuffers;
  for (const CapturedTensor& c : grads.trainable) {
    gradBuffers.push_back(
        Tensor::zeros(deterministic ? DType::I64 : DType::F32, c.tensor().shape(), space, options.stream));
  }

  std::vector<Launch> launches;
  // Preprocess.
  {
    const int64_t BMP = 64, DP = detail::paddedHeadDim(DV);  // delta = rowsum(out ∘ dout): v's head dim
    PreprocessConstants c{BMP, DV, DP, options.dlse.has_value()};
    LaunchOptions lo;
    lo.grid = {cdiv(L, BMP), Hq, B};
    lo.constants = constantList(c);
    lo.num_warps = 4;
    lo.num_stages = 1;
    const auto& os = out.strides();
    const auto& ds = dout.strides();
    Kernel& kernel = preprocessKernel(dt);
    launches.push_back({&kernel, lo,
                        bindParams<PreprocessParams>(
                            {.out = out, .dout = dout, .lse = lse, .dlse = options.dlse ? *options.dlse : lse,
                             .delta = delta, .lse2 = lse2, .q_len = L, .q_heads = Hq, .out_stride_b = os[0],
                             .out_stride_h = os[1], .out_stride_m = os[2], .dout_stride_b = ds[0],
                             .dout_stride_h = ds[1], .dout_stride_m = ds[2]},
                            kernel.name())});
  }
  if (!options.sinks) {
    grads.dsinks = Tensor();
  } else {
    // A dsinks of the right kind from the caller's last call is written again: a training loop's
    // calls allocate (and free, which would wait for the device) nothing.
    const Tensor& d = grads.dsinks;
    if (!d.defined() || d.dtype() != DType::F32 || d.shape() != Shape{Hq} || !d.isContiguous() || d.space() != space)
      grads.dsinks = Tensor::empty(DType::F32, {Hq}, space);
    LaunchOptions lo;
    lo.grid = {Hq, 1, 1};
    lo.constants = constantList(SinkGradConstants{1024});
    lo.num_warps = 4;
    lo.num_stages = 1;
    Kernel& kernel = sinkGradKernel();
    launches.push_back({&kernel, lo,
                        bindParams<SinkGradParams>({.lse2 = lse2, .delta = delta, .sinks = *options.sinks,
                                                    .dsinks = grads.dsinks, .q_len = L, .q_heads = Hq, .batch = B},
                                                   kernel.name())});
  }
  const auto& qs = q.strides();
  const auto& ks = k.strides();
  const auto& vs = v.strides();
  const auto& dos = dout.strides();
  const double kernelScale = hasScoreMod ? scale : scale * kLog2e;
  // The forward lists' row strides (a slice's lists are views of its parent's, with its strides).
  const int64_t maskB = lists.kvBatchStride, maskH = lists.kvHeadStride;
  // The transposed lists are [B, H, nKV] and [B, H, nKV, nQ]: their strides per batch and head.
  const int64_t maskBT = mask.batch() > 1 ? mask.heads() * mask.numKvBlocks() : 0;
  const int64_t maskHT = mask.heads() > 1 ? mask.numKvBlocks() : 0;
  auto gradLaunch = [&](const char* which, const FlexAttentionConfig& c, bool dkdv) {
    // Warp specialization only when the config (or FLEXTILE_WARP_SPECIALIZE) asks: Auto is off in
    // the backward until it is measured to pay. It needs the TMA rings, so asking for it turns them on.
    const bool specialize = detail::warpSpecializeWanted(
        scoreMod, blockMask, c.warp_specialize == WarpSpecialization::Auto ? WarpSpecialization::Off : c.warp_specialize);
    const bool tma = dkdv ? detail::tmaBoxesFor({&q, &dout}, c.num_stages, specialize)
                          : detail::tmaBoxesFor({&k, &v}, c.num_stages, specialize);
    GradConstants gc{c.block_m,
                     c.block_n,
                     D,
                     detail::paddedHeadDim(D),
                     Hq / Hkv,
                     mask.qBlockSize(),
                     mask.kvBlockSize(),
                     hasScoreMod,
                     L % c.block_m == 0 && mask.qPhase() == 0,
                     S % mask.kvBlockSize() == 0,
                     mask.mayHaveFullBlocks(),
                     mask.mayHavePartialBlocks(),
                     int64_t(grads.trainable.size()),
                     deterministic,
                     dkdv && atomicDq,
                     // TMA alone is opt-in here (FLEXTILE_TMA=1): on the H200 it made the dense
                     // backward 7 % slower and causal 5 % faster (bench/RESULTS.md).
                     tma,
                     tma && specialize,
                     // A specialized dkdv's LSE and delta rows as TMA boxes: their row stride (L f32)
                     // must be a multiple of 16 bytes.
                     dkdv && tma && specialize && L % 4 == 0,
                     // Turns only when the config asks: Auto is off in the backward until measured.
                     c.turns == LoopSchedule::On,
                     // P's exponent before the masks (FLEXTILE_BWD_EXPONENT_FIRST=0: after them, the
                     // form before 2026-12-04, to measure the two).
                     detail::forcedBySwitch("FLEXTILE_BWD_EXPONENT_FIRST") != false,
                     // dPᵀ issued with Sᵀ in the masked walks too (FLEXTILE_BWD_MASKED_DP_EARLY=0: after
                     // pᵀ there, which ptxas 13 assembles with fewer spills: document dkdv 84 -> 4
                     // bytes; to measure against the overlap it gives up).
                     detail::forcedBySwitch("FLEXTILE_BWD_MASKED_DP_EARLY") != false,
                     // The mod's adjoint as p·g, g taken before dP's wait (FLEXTILE_BWD_SEED_FREE_ADJOINT=0:
                     // through the seed after it, the form before 2026-12-04, to measure the two).
                     detail::forcedBySwitch("FLEXTILE_BWD_SEED_FREE_ADJOINT") != false,
                     // dkdv lets the separate dq kernel start during its last wave
                     // (FLEXTILE_BWD_OVERLAP_DQ=0: dq after dkdv has finished, as before).
                     !atomicDq && detail::forcedBySwitch("FLEXTILE_BWD_OVERLAP_DQ") != false,
                     // The tiles heaviest first (FLEXTILE_TILE_ORDER=1, as the forward's; opt-in until
                     // timed): dkdv's key tiles by their columns' live blocks, dq's query tiles by
                     // their rows'. Needs the host lists; not with the atomic dQ (its dkdv is the
                     // only kernel and keeps its order).
                     detail::forcedBySwitch("FLEXTILE_TILE_ORDER").value_or(false) && mask.hasHostLists() && !atomicDq,
                     DV,
                     detail::paddedHeadDim(DV),
                     // Both kernels split Q's and K's head dim as the forward does, and v's.
                     detail::headDimSplit(D), detail::valueDimSplit(DV)};
    if (dkdv) gc.qExact = gc.qExact && mask.qBlockSize() % c.block_m == 0 && L % mask.qBlockSize() == 0;
    LaunchOptions lo;
    lo.grid = dkdv ? std::array<int64_t, 3>{cdiv(S, c.block_n), Hkv, B} : std::array<int64_t, 3>{cdiv(L, c.block_m), Hq, B};
    lo.constants = constantList(gc);
    lo.num_warps = c.num_warps;
    lo.num_stages = c.num_stages;
    Kernel& kernel = gradKernel(which, scoreMod, maskMod, dt);
    std::vector<KernelArg> args = bindParams<GradParams>(
        {.q = q, .k = k, .v = v, .dout = dout, .lse2 = lse2, .delta = delta,
         .grad = dkdv ? grads.dk : grads.dq, .grad2 = dkdv ? grads.dv : grads.dq,
         .full_num = dkdv ? lists.fullQNum : lists.fullKvNum,
         .full_indices = dkdv ? lists.fullQIndices : lists.fullKvIndices,
         .partial_num = dkdv ? lists.qNum : lists.kvNum, .partial_indices = dkdv ? lists.qIndices : lists.kvIndices,
         .q_len = L, .kv_len = S, .q_offset = mask.qOffset(), .q_phase = mask.qPhase(),
         .mask_q_blocks = mask.numQBlocks(), .mask_kv_blocks = mask.numKvBlocks(),
         .mask_b_stride = dkdv ? maskBT : maskB, .mask_h_stride = dkdv ? maskHT : maskH, .q_stride_b = qs[0],
         .q_stride_h = qs[1], .q_stride_m = qs[2], .k_stride_b = ks[0], .k_stride_h = ks[1], .k_stride_n = ks[2],
         .v_stride_b = vs[0], .v_stride_h = vs[1], .v_stride_n = vs[2], .dout_stride_b = dos[0],
         .dout_stride_h = dos[1], .dout_stride_m = dos[2], .q_heads = Hq, .scale = kernelScale, .grad_scale = scale,
         .dq_accum = dqAccum, .dq_accum_stride_h = L * D},
        kernel.name());
    if (gc.tileOrder) {
      const Tensor& order = dkdv ? mask.heaviestTilesFirstTensor(B, Hkv, S, c.block_n, space, options.stream, true, Hq / Hkv)
                                 : mask.heaviestTilesFirstTensor(B, Hq, L, c.block_m, space, options.stream);
      const std::vector<KernelArg> ordered = bindParams<TileOrderParams>({.tile_order = order}, kernel.name());
      args.insert(args.end(), ordered.begin(), ordered.end());
    }
    for (const Tensor& g : gradBuffers) args.push_back(KernelArg(g));
    launches.push_back({&kernel, lo, std::move(args)});
  };
  gradLaunch("dkdv", config.dkdv, true);
  if (!atomicDq) {
    gradLaunch("dq", config.dq, false);
  } else {
    Kernel& kernel = castKernel(dt);
    launches.push_back({&kernel, elementwiseLaunch(q.numel()),
                        bindParams<CastParams>({.in = dqAccum, .out = grads.dq, .n = q.numel()}, kernel.name())});
  }
  for (const Tensor& g : gradBuffers) {
    if (!deterministic) {
      grads.captureGrads.push_back(g);
      continue;
    }
    Tensor f32 = Tensor::empty(DType::F32, g.shape(), space);
    Kernel& kernel = fixedPointKernel();
    launches.push_back({&kernel, elementwiseLaunch(g.numel()),
                        bindParams<FixedPointParams>({.in = g, .out = f32, .n = g.numel()}, kernel.name())});
    grads.captureGrads.push_back(f32);
  }
  if (!plan) {
    runInOrder(launches, space, options.stream);
    return;
  }
  plan->config = config;
  for (const Launch& l : launches) {
    plan->kernelNames.push_back(l.kernel->name());
    plan->compiled.push_back(&l.kernel->compile(l.options, l.args, target));
  }
}

}  // namespace

void flex_attention_backward_into(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, const Tensor& dout, const ScoreMod& scoreMod,
                                  const std::optional<BlockMask>& blockMask, FlexAttentionGrads& grads,
                                  const FlexAttentionBackwardOptions& options) {
  backward(q, k, v, out, lse, dout, scoreMod, blockMask, grads, options, nullptr, std::nullopt);
}

FlexAttentionBackwardPlan plan_flex_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                       const Tensor& out, const Tensor& lse, const Tensor& dout,
                                                       const ScoreMod& scoreMod,
                                                       const std::optional<BlockMask>& blockMask,
                                                       const FlexAttentionBackwardOptions& options,
                                                       std::optional<codegen::Target> target) {
  detail::expectAttentionInput("flex_attention_backward", "k", k);
  FlexAttentionGrads grads;
  grads.dq = Tensor::empty(q.dtype(), q.shape(), q.space());
  grads.dk = Tensor::empty(q.dtype(), {k.size(0), k.size(1), k.size(2), q.size(3)}, q.space());
  detail::expectAttentionInput("flex_attention_backward", "v", v);
  grads.dv = Tensor::empty(q.dtype(), {k.size(0), k.size(1), k.size(2), v.size(3)}, q.space());
  FlexAttentionBackwardPlan plan;
  backward(q, k, v, out, lse, dout, scoreMod, blockMask, grads, options, &plan, target);
  return plan;
}

}  // namespace flextile::attention
