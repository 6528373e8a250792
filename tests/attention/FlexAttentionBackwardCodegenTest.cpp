// The backward's kernels compile for sm_90a and sm_80 and assemble with ptxas without spills,
// at the configs the defaults and the bench use; their products run on tensor cores.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "tests/TextCount.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "ir/Parser.h"
#include "gpu/GpuTest.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

using flextile::testing::count;

namespace {
// The shared-memory wavefronts, beyond one per phase, of the owners' stores into the staging of
// every bulk_tensor atomic_add in a kernel's IR (codegen::bulkTensorStaging). A store instruction
// writes `v` registers that are neighbours along the row (8 bytes for pairs), its lanes in phases
// of 128 bytes; a phase takes as many wavefronts as the most distinct words one bank gets.
int64_t excessStagingWavefronts(const std::string& irText) {
  const std::unique_ptr<ir::Function> f = ir::parseFunction(irText);
  int64_t excess = 0, ops = 0;
  f->walk([&](const ir::Op& op) {
    if (op.kind() != ir::OpKind::AtomicAdd || !codegen::addsTensorInBulk(op)) return;
    ++ops;
    const ir::Layout& l = *op.operand(1)->type().layout();
    const ir::SharedLayout staging = codegen::bulkTensorStaging(op);
    const int64_t v = std::min<int64_t>(l.contiguousRegisters(1), staging.vec()), lanesPerPhase = 32 / v;
    for (int64_t warp = 0; warp < l.numWarps(); ++warp)
      for (int64_t r = 0; r < l.numRegisters(); r += v)
        for (int64_t first = 0; first < 32; first += lanesPerPhase) {
          std::map<int64_t, std::set<int64_t>> wordsByBank;
          for (int64_t lane = first; lane < first + lanesPerPhase; ++lane)
            for (int64_t i = 0; i < v; ++i) {
              const int64_t word = staging.offsetOf(l.apply(r + i, lane, warp));
              wordsByBank[word % 32].insert(word);
            }
          size_t most = 0;
          for (const auto& [bank, words] : wordsByBank) most = std::max(most, words.size());
          excess += int64_t(most) - 1;
        }
  });
  EXPECT_GT(ops, 0) << "no bulk_tensor atomic_add in the kernel";
  return excess;
}
}  // namespace

// The compiled kernels live in the mask mod's state, so the plan keeps the variant (its mods) alive.
struct VariantPlan : FlexAttentionBackwardPlan {
  VariantInstance instance;
};

VariantPlan planFor(codegen::Target target, const std::optional<FlexAttentionBackwardConfig>& config,
                    const std::string& variantName, int64_t D = 128, DType dt = DType::BF16) {
  const int64_t B = 1, H = 2, L = 1024;
  Tensor q = Tensor::empty(dt, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantPlan p;
  p.instance = variant(variantName).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  static_cast<FlexAttentionBackwardPlan&>(p) = plan_flex_attention_backward(
      q, q, q, q, lse, q, p.instance.score, p.instance.mask, {.config = config}, target);
  return p;
}

}  // namespace

TEST(FlexAttentionBackwardCodegen, EveryVariantAssemblesWithoutSpills) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found";
  for (const Variant& var : variants())
    for (auto target : {codegen::Target::sm90a(), codegen::Target::sm80()}) {
      SCOPED_TRACE(var.name + " " + target.smName());
      // The default config (what the call picks with no config given).
      VariantPlan plan = planFor(target, std::nullopt, var.name);
      SCOPED_TRACE(plan.config.describe());
      ASSERT_GE(plan.compiled.size(), 3u);
      for (size_t i = 0; i < plan.compiled.size(); ++i) {
        codegen::PtxasReport r = codegen::runPtxas(plan.compiled[i]->ptx, target);
        // A score_mod's live values may spill a few words on sm_90a at the measured-best default
        // (64 x 64: faster on the H200 than the narrower tile that does not spill).
        // The specialized dkdv's consumers spill 20-250 bytes (ptxas 13.0: 24 without a mod, 112 for
        // documents, 244 with the soft-cap) and were measured 2-11 % faster than the unspecialized
        // tile that does not (H200, 2026-12-03).
        const bool scoreMod = var.name == "alibi" || var.name == "softcap";
        const int allowed = plan.compiled[i]->producerWarps > 0 && i == 1 ? 256
                            : scoreMod && target.has(codegen::Feature::Wgmma) ? 96
                                                                               : 0;
        EXPECT_LE(r.spillStoreBytes, allowed) << plan.kernelNames[i] << ": " << r.log;
      }
      // dkdv: four products per step (K·Qᵀ, Pᵀ·dO, V·dOᵀ, dSᵀ·Q); dq: three (Q·Kᵀ, dO·Vᵀ, dS·K).
      const std::string& dkdv = plan.compiled[1]->ptx;
      const std::string& dq = plan.compiled[2]->ptx;
      const std::string mma = target.has(codegen::Feature::Wgmma) ? "wgmma\\.mma_async|mma\\.sync" : "mma\\.sync";
      EXPECT_GT(count(dkdv, mma), 0) << plan.kernelNames[1];
      EXPECT_GT(count(dq, mma), 0) << plan.kernelNames[2];
    }
}

// dkdv holds K and V for its whole loop, dq Q and dO: on sm_90a they are A
// operands read from resident shared tiles (K·Qᵀ, V·dOᵀ; Q·Kᵀ, dO·Vᵀ), while
// Pᵀ·dO, dSᵀ·Q and dS·K, whose A is computed in the loop, keep register A.
// That frees the registers that made 64 keys x 64 queries (4 warps) and 128 x
// 64 (8 warps) spill.
TEST(FlexAttentionBackwardCodegen, LoopInvariantOperandsAreReadFromSharedMemory) {
  for (const FlexAttentionConfig c : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{64, 128, 8, 2}}) {
    SCOPED_TRACE(c.describe());
    VariantPlan plan = planFor(codegen::Target::sm90a(), FlexAttentionBackwardConfig{c, c}, "causal");
    const std::string& dkdv = plan.compiled[1]->ptx;
    const std::string ss = "wgmma\\.mma_async[^;]*\\}, ad[0-9]+, bd[0-9]+, [pz], 1, 1, 0, 0;";
    const std::string rs = "wgmma\\.mma_async[^;]*\\}, \\{%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+\\}, bd[0-9]+, [pz], 1, 1, [01];";
    // Two loops, each 8 k-steps (D = 128) of K·Qᵀ and of V·dOᵀ from shared A, and
    // 4 (BM = 64 queries) of Pᵀ·dO and of dSᵀ·Q from register A.
    EXPECT_EQ(count(dkdv, ss), 32) << plan.kernelNames[1];
    EXPECT_EQ(count(dkdv, rs), 16) << plan.kernelNames[1];
    EXPECT_EQ(count(dkdv, "mma\\.sync"), 0);
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(dkdv, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
    // The escape hatch keeps register A everywhere.
    ::setenv("FLEXTILE_WGMMA_SMEM_A", "0", 1);
    VariantPlan off = planFor(codegen::Target::sm90a(), FlexAttentionBackwardConfig{c, c}, "causal");
    ::unsetenv("FLEXTILE_WGMMA_SMEM_A");
    EXPECT_EQ(count(off.compiled[1]->ptx, ss), 0);
    EXPECT_EQ(count(off.compiled[1]->ptx, rs), 48);
  }
}

// wgmma groups are waited for at first use (codegen/LowerDot.cpp awaitWgmmaFor): in each walk of
// dkdv (full and partial lists), Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ are in flight together and the first
// wait lets dPᵀ run on (wait_group 1); dV's group runs on while dSᵀ is computed (wait_group 1);
// each iteration ends with every group complete (wait_group 0), and ptxas does not serialize them.
TEST(FlexAttentionBackwardCodegen, IndependentProductsStayInFlight) {
  VariantPlan plan = planFor(codegen::Target::sm90a(), std::nullopt, "causal");
  const std::string& dkdv = plan.compiled[1]->ptx;
  const std::string& dq = plan.compiled[2]->ptx;
  EXPECT_EQ(count(dkdv, "wgmma\\.wait_group\\.sync\\.aligned 1;"), 4) << plan.kernelNames[1];
  EXPECT_EQ(count(dkdv, "wgmma\\.wait_group\\.sync\\.aligned 0;"), 2);
  EXPECT_EQ(count(dkdv, "wgmma\\.commit_group"), 8);
  // dq: S and dP together, then dQ's product waited at the iteration's end.
  EXPECT_EQ(count(dq, "wgmma\\.wait_group\\.sync\\.aligned 1;"), 2) << plan.kernelNames[2];
  if (codegen::findPtxas())
    for (const std::string* ptx : {&dkdv, &dq}) {
      codegen::PtxasReport r = codegen::runPtxas(*ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.log.find("serialized"), std::string::npos) << r.log;
    }
}

// Regression (learnable ALiBi ran 30x slower than ALiBi on the H200): the atomics that scatter a
// trainable capture's gradient made the loop count as writing memory, so its block-index loads
// could not be re-read ahead and nothing was pipelined (no cp.async, no wgmma). The gradient
// buffers are the template's own (private_params), and the loop keeps its pipeline.
TEST(FlexAttentionBackwardCodegen, TrainableCapturesKeepThePipeline) {
  const int64_t B = 1, H = 4, L = 512, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  for (bool deterministic : {false, true}) {
    SCOPED_TRACE(deterministic ? "deterministic" : "f32 atomics");
    dsl::CapturedTensor slopes = dsl::capture(Tensor::fromHost(std::vector<float>(size_t(H), 0.5f), {H}), "slopes",
                                              {.requires_grad = true});
    FlexAttentionBackwardPlan plan = plan_flex_attention_backward(
        q, q, q, q, lse, q, alibi(slopes), causalBlockMask(1, 1, L, L),
        {.deterministic = deterministic, .config = FlexAttentionBackwardConfig{{64, 64, 4, 2}, {64, 64, 4, 2}}},
        codegen::Target::sm90a());
    const std::string& dkdv = plan.compiled[1]->ptx;
    EXPECT_GT(count(dkdv, "cp\\.async"), 0);
    EXPECT_GT(count(dkdv, "wgmma\\.mma_async"), 0);
    EXPECT_EQ(count(dkdv, "mma\\.sync"), 0);
    EXPECT_GT(count(dkdv, "atom\\.global\\.add"), 0);
  }
}

// With FLEXTILE_TMA=1 (opt-in for the backward) dkdv's Q and dO and dq's K and V rings are filled
// by TMA on sm_90a: two tensor maps per kernel, no cp.async left in them; ptxas takes both.
TEST(FlexAttentionBackwardCodegen, TmaFillsTheWalksRingsWhenAskedFor) {
  ::setenv("FLEXTILE_TMA", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("FLEXTILE_TMA"); }
  } unset;
  VariantPlan plan = planFor(codegen::Target::sm90a(), std::nullopt, "causal");
  ASSERT_GE(plan.compiled.size(), 3u);
  for (size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(plan.kernelNames[i]);
    // A specialized dkdv's producer loads its resident K and V by TMA too.
    EXPECT_EQ(plan.compiled[i]->tensorMaps.size(), plan.compiled[i]->producerWarps > 0 && i == 1 ? 4u : 2u);
    EXPECT_GT(count(plan.compiled[i]->ptx, "cp\\.async\\.bulk\\.tensor\\.4d"), 0);
    EXPECT_EQ(count(plan.compiled[i]->ptx, "cp\\.async\\.cg"), 0);
    if (codegen::findPtxas()) {
      EXPECT_NO_THROW(codegen::runPtxas(plan.compiled[i]->ptx, codegen::Target::sm90a()));
    }
  }
}

// Regression (the atomic-dQ dkdv kept two copies of K in shared memory, 148 KB at 64 x 64, one
// program per SM): K is the A of K·Qᵀ and the B of dS·K in the same swizzled layout, so the
// wgmma pass keeps one resident tile for both. What the atomic mode adds to the default dkdv is
// then only the bulk reduction's staging (64 rows of 544 bytes, 64 row addresses, 128 dump slots)
// and the loop's dSᵀ conversion (bf16 [64, 64]), which no longer shares the staging's bytes: the
// engine reads them after the op, so they are the op's own (codegen/SharedMemory.h). A second
// copy of K would add 16 KB more.
TEST(FlexAttentionBackwardCodegen, AtomicDqKeepsOneResidentCopyOfK) {
  const auto target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantInstance inst = variant("full").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  const FlexAttentionBackwardConfig config{{64, 64, 4, 2}, {64, 64, 4, 2}};
  auto separate = plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, {.config = config}, target);
  FlexAttentionBackwardOptions atomicOptions{.config = config};
  atomicOptions.dq_accumulation = DqAccumulation::Atomic;
  auto atomic = plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, atomicOptions, target);
  ASSERT_EQ(separate.kernelNames[1], atomic.kernelNames[1]);  // both dkdv
  const int staging = 64 * 128 * 4, dsConversion = 64 * 64 * 2;
  EXPECT_LE(atomic.compiled[1]->sharedBytes, separate.compiled[1]->sharedBytes + staging + dsConversion + 1024);
  // The row-major accumulator staged in 128-byte swizzled panels: its stores meet no bank twice.
  EXPECT_EQ(excessStagingWavefronts(atomic.compiled[1]->ir), 0);
}

// Atomic dQ in the specialized dkdv (TMA rings and a producer warpgroup beside the staging of dSᵀ:
// FLEXTILE_TMA_IN_STAGING_LOOPS=1 here, the kernel's own attribute by default, as the next test
// checks): all five products on wgmma, dQᵀ = Kᵀ dSᵀ
// reading Kᵀ M-major (imm-trans-a) from the one buffer K·Qᵀ reads K from, and dSᵀ from a one-slot
// buffer stored every step; its rows go out by bulk reductions.
TEST(FlexAttentionBackwardCodegen, SpecializedAtomicDqRunsEveryProductOnWgmma) {
  flextile::testing::ScopedSetenv staging("FLEXTILE_TMA_IN_STAGING_LOOPS", "1");
  const auto target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantInstance inst = variant("full").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  FlexAttentionBackwardOptions options{.config = FlexAttentionBackwardConfig{{64, 128, 8, 2, WarpSpecialization::On},
                                                                            {64, 64, 4, 2}}};
  options.dq_accumulation = DqAccumulation::Atomic;
  auto plan = plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, options, target);
  const codegen::CompiledKernel& dkdv = *plan.compiled[1];
  EXPECT_EQ(dkdv.producerWarps, 4);
  EXPECT_EQ(count(dkdv.ptx, "mma\\.sync"), 0);
  EXPECT_EQ(count(dkdv.ptx, "wgmma\\.mma_async[^\\n]*m64n64k16[^\\n]*, 1, 1, 1, 1;"), 8) << "dQᵀ: A and B read M-major";
  EXPECT_EQ(count(dkdv.ir, "local_alloc : smem<1 x bf16\\[128,128\\]"), 2) << "K and V resident, once each";
  EXPECT_EQ(count(dkdv.ir, "local_alloc : smem<1 x bf16\\[128,64\\]"), 1) << "dSᵀ's staging buffer";
  EXPECT_EQ(count(dkdv.ir, "bulk_tensor = 1"), 1);
  EXPECT_EQ(count(dkdv.ptx, "cp\\.reduce\\.async\\.bulk\\.tensor\\.3d"), 4) << "dQ's 128 columns: four panels";
  // Regression (H100, 2026-12-07: 79 million shared-memory bank conflicts in one launch, 29 times the
  // separate dkdv's, when rows 0 and 4 of the transposed accumulator met in the same banks): the
  // swizzled staging of dQ, lanes along rows 0, 2, 4 and 6, meets every bank once a store.
  EXPECT_EQ(excessStagingWavefronts(dkdv.ir), 0);
  if (codegen::findPtxas()) {
    EXPECT_NO_THROW(codegen::runPtxas(dkdv.ptx, target));
  }
}

// The atomic dQ's default at D = 128 is the specialized dkdv with TMA rings in its staging loops,
// without the environment switch the opt-in needed: the same kernel as the explicit config with
// FLEXTILE_TMA_IN_STAGING_LOOPS=1 (the kernel SpecializedAtomicDq/* checks on the GPU).
TEST(FlexAttentionBackwardCodegen, AtomicDqDefaultsToTheSpecializedDkdvAtD128) {
  if (codegen::offlineAssembly() == codegen::OfflineAssembly::Never)
    GTEST_SKIP() << "no offline ptxas: the specialized dkdv is not the default";
  const auto target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  for (const char* name : {"full", "causal"}) {
    VariantInstance inst = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    FlexAttentionBackwardOptions byDefault;
    byDefault.dq_accumulation = DqAccumulation::Atomic;
    auto plan = plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, byDefault, target);
    ASSERT_EQ(plan.config.dkdv, (FlexAttentionConfig{64, 128, 8, 2, WarpSpecialization::On})) << plan.config.describe();
    const codegen::CompiledKernel& dkdv = *plan.compiled[1];
    EXPECT_EQ(dkdv.producerWarps, 4) << name;
    EXPECT_EQ(count(dkdv.ptx, "mma\\.sync"), 0) << name;
    EXPECT_GE(count(dkdv.ptx, "cp\\.async\\.bulk\\.tensor"), 1) << name << ": the walks' rings are TMA ones";
    flextile::testing::ScopedSetenv staging("FLEXTILE_TMA_IN_STAGING_LOOPS", "1");
    FlexAttentionBackwardOptions optIn{.config = plan.config};
    optIn.dq_accumulation = DqAccumulation::Atomic;
    auto explicitPlan = plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, optIn, target);
    EXPECT_EQ(explicitPlan.compiled[1]->ptx, dkdv.ptx) << name;
  }
}

// dkdv at D = 256 on two warpgroups of 64 keys each splitting N (Layout::wgmmaAccumulator): every
// product on wgmma — Sᵀ and dPᵀ as m64n32 shares of the 64 queries, dK and dV as m64n128 shares of
// the 256 columns — and dK's and dV's accumulators in registers without spills (one warpgroup of 64
// keys spills kilobytes). FLEXTILE_WGMMA_SPLIT_N=0 gives the mma.sync split back.
TEST(FlexAttentionBackwardCodegen, WarpgroupsSplitDkAndDvColumnsAtD256) {
  const auto target = codegen::Target::sm90a();
  for (WarpSpecialization ws : {WarpSpecialization::Off, WarpSpecialization::On}) {
    const FlexAttentionBackwardConfig config{{64, 64, 8, 2, ws}, {64, 64, 4, 2}};
    const VariantPlan plan = planFor(target, config, "causal", 256);
    const codegen::CompiledKernel& dkdv = *plan.compiled[1];
    ASSERT_NE(plan.kernelNames[1].find("dkdv"), std::string::npos);
    EXPECT_EQ(count(dkdv.ptx, "mma\\.sync"), 0);
    // Per query step and walk: Sᵀ's and dPᵀ's 16 k-steps each, dK's and dV's 4 (64 queries).
    EXPECT_EQ(count(dkdv.ptx, "wgmma\\.mma_async[^\\n]*m64n32k16"), 2 * 32) << "causal: two walks";
    EXPECT_EQ(count(dkdv.ptx, "wgmma\\.mma_async[^\\n]*m64n128k16"), 2 * 8);
    // Pᵀ and dSᵀ, each warpgroup's half of the queries, are staged in shared memory every step and
    // read by dV's and dK's products through a descriptor (TensorCores.h wgmmaStagedA): no ldmatrix.
    EXPECT_EQ(count(dkdv.ptx, "m64n128k16[^\\n]*\\}, ad[0-9]+, bd"), 2 * 8);
    EXPECT_EQ(count(dkdv.ptx, "ldmatrix"), 0);
    if (flextile::testing::assemblesInThisBuild()) {
      const codegen::PtxasReport report = codegen::runPtxas(dkdv.ptx, target);
      EXPECT_EQ(report.spillStoreBytes, 0) << report.log;
    }
  }
  // MLA's 192 / 128, the head dim split 128 + 64: dK's 64-column chunk reads the N-major 64
  // columns of Q's second chunk, which a warpgroup's half would cut inside a 128-byte panel, so
  // both warpgroups compute all of it (replicas); the rest splits. Still every product on wgmma.
  {
    Tensor q = Tensor::empty(DType::BF16, {1, 2, 1024, 192}, MemorySpace::Host);
    Tensor v = Tensor::empty(DType::BF16, {1, 2, 1024, 128}, MemorySpace::Host);
    Tensor lse = Tensor::empty(DType::F32, {1, 2, 1024}, MemorySpace::Host);
    VariantInstance inst = variant("causal").make({1, 2, 1024, 1024, MemorySpace::Host, BlockSizes{}, 1});
    const FlexAttentionBackwardPlan mla = plan_flex_attention_backward(
        q, q, v, v, lse, v, inst.score, inst.mask, {.config = FlexAttentionBackwardConfig{{64, 64, 8, 2}, {64, 64, 4, 2}}},
        target);
    const std::string& ptx = mla.compiled[1]->ptx;
    EXPECT_EQ(count(ptx, "mma\\.sync"), 0);
    EXPECT_EQ(count(ptx, "ldmatrix"), 0);
    // Per step and walk: Sᵀ 8 + 4 and dPᵀ 8 k-steps as m64n32; dV, dK's first chunk (halves) and its
    // second (whole, replicated) 4 each as m64n64.
    EXPECT_EQ(count(ptx, "wgmma\\.mma_async[^\\n]*m64n32k16"), 2 * 20);
    EXPECT_EQ(count(ptx, "wgmma\\.mma_async[^\\n]*m64n64k16"), 2 * 12);
    if (flextile::testing::assemblesInThisBuild()) {
      const codegen::PtxasReport report = codegen::runPtxas(ptx, target);
      EXPECT_EQ(report.spillStoreBytes, 0) << report.log;
    }
  }
  flextile::testing::ScopedSetenv off("FLEXTILE_WGMMA_SPLIT_N", "0");
  const VariantPlan mmaSync = planFor(target, FlexAttentionBackwardConfig{{64, 64, 8, 2}, {64, 64, 4, 2}}, "causal", 256);
  EXPECT_GT(count(mmaSync.compiled[1]->ptx, "mma\\.sync"), 0);
  EXPECT_EQ(count(mmaSync.compiled[1]->ptx, "m64n128k16"), 0);
}

// The sm_90a default: dq on two consumer warpgroups and a producer above D = 64, one warpgroup at
// D = 64; dkdv on two consumer warpgroups and a producer from D = 64 when the offline ptxas
// assembles warp-specialized kernels (the driver JIT spills it), one warpgroup otherwise. A mask of
// 64-row blocks narrows the dq tile to 64 queries, and with it to 4 warps and no specialization
// (the point measured at 8 warps does not hold there).
// Past D = 128 on wgmma: dkdv 64 × 64 on two warpgroups that split N (fed by a producer warpgroup
// where the offline ptxas assembles it and dQ is not atomic), and dq 128 × 64 specialized where Q's
// and V's tile columns reach at most 384 (64 × 64 on one warpgroup past that, where the specialized
// one spills). H100, 2026-12-07: 192 / 128 +15 % over 16 × 64 / 64 × 64 w4, 256 1.9× over 16 × 32.
// f32, per-score gathers and GPUs without wgmma keep 16 × 32 for both.
TEST(FlexAttentionBackwardCodegen, DefaultsPastHeadDim128) {
  const auto sm90a = codegen::Target::sm90a();
  const bool offline = codegen::offlineAssembly() != codegen::OfflineAssembly::Never;
  const FlexAttentionConfig narrow{16, 32, 4, 2}, dq64{64, 64, 4, 2}, splitN{64, 64, 8, 2},
      splitNws{64, 64, 8, 2, WarpSpecialization::On}, dkdv = offline ? splitNws : splitN,
      dqSpecialized{128, 64, 8, 2, WarpSpecialization::On};
  auto check = [&](const FlexAttentionBackwardConfig& c, const FlexAttentionConfig& dkdv,
                   const FlexAttentionConfig& dq, const char* what) {
    EXPECT_EQ(c.dkdv, dkdv) << what << ": " << c.describe();
    EXPECT_EQ(c.dq, dq) << what << ": " << c.describe();
  };
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 192, sm90a, false, DqAccumulation::Separate, 128), dkdv,
        dqSpecialized, "192 / 128");
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 128, sm90a, false, DqAccumulation::Separate, 192), dkdv,
        dqSpecialized, "128 / 192");
  check(defaultFlexAttentionBackwardConfig(DType::F16, 192, sm90a), dkdv, dqSpecialized, "192 / 192");
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 256, sm90a), dkdv, dq64, "256");
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 256, sm90a, false, DqAccumulation::Separate, 128), dkdv,
        dqSpecialized, "256 / 128");
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 192, sm90a, false, DqAccumulation::Atomic, 128), splitN,
        dqSpecialized, "192 / 128, atomic dQ");
  check(defaultFlexAttentionBackwardConfig(DType::F32, 192, sm90a), narrow, narrow, "f32");
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 192, sm90a, true), narrow, narrow, "a per-score gather");
  check(defaultFlexAttentionBackwardConfig(DType::BF16, 192, codegen::Target::sm80()), narrow, narrow, "sm_80");
  {
    flextile::testing::ScopedSetenv padded("FLEXTILE_SPLIT_HEAD_DIM", "0");  // 256 + 256 columns
    check(defaultFlexAttentionBackwardConfig(DType::BF16, 192, sm90a), dkdv, dq64, "192 / 192 padded");
  }
  // A BlockMask whose blocks hold the tile keeps its 8 warps (the narrowing keeps 16 rows a warp only
  // where it cut the rows; it once turned this default into 64 keys on 4 warps, which spills), and
  // one of 32-key blocks narrows it to 32 keys on one warpgroup.
  const VariantPlan plan = planFor(sm90a, std::nullopt, "causal", 256);
  EXPECT_EQ(plan.config.dkdv, dkdv) << plan.config.describe();
  {
    Tensor q = Tensor::empty(DType::BF16, {1, 2, 1024, 256}, MemorySpace::Host);
    Tensor lse = Tensor::empty(DType::F32, {1, 2, 1024}, MemorySpace::Host);
    VariantInstance inst = variant("causal").make({1, 2, 1024, 1024, MemorySpace::Host, BlockSizes{64, 32}, 1});
    const FlexAttentionBackwardPlan narrowed =
        plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, {}, sm90a);
    EXPECT_EQ(narrowed.config.dkdv, (FlexAttentionConfig{64, 32, 4, 2})) << narrowed.config.describe();
  }
}

TEST(FlexAttentionBackwardCodegen, DefaultDqIsSpecializedWhereItWasMeasuredToPay) {
  const auto sm90a = codegen::Target::sm90a();
  const bool offline = codegen::offlineAssembly() != codegen::OfflineAssembly::Never;
  const FlexAttentionConfig dkdv = offline ? FlexAttentionConfig{64, 128, 8, 2, WarpSpecialization::On}
                                           : FlexAttentionConfig{64, 64, 4, 2};
  const FlexAttentionBackwardConfig d128 = defaultFlexAttentionBackwardConfig(DType::BF16, 128, sm90a);
  EXPECT_EQ(d128.dq, (FlexAttentionConfig{128, 64, 8, 2, WarpSpecialization::On})) << d128.describe();
  EXPECT_EQ(d128.dkdv, dkdv) << d128.describe();
  EXPECT_EQ(defaultFlexAttentionBackwardConfig(DType::BF16, 64, sm90a).dq, (FlexAttentionConfig{64, 64, 4, 2}));
  EXPECT_EQ(defaultFlexAttentionBackwardConfig(DType::BF16, 64, sm90a).dkdv, dkdv);
  // Atomic dQ: the specialized dkdv where all five products run on wgmma (128 tile columns), else
  // the one-warpgroup dkdv.
  EXPECT_EQ(defaultFlexAttentionBackwardConfig(DType::BF16, 128, sm90a, false, DqAccumulation::Atomic).dkdv, dkdv);
  for (int64_t d : {64, 96})
    EXPECT_EQ(defaultFlexAttentionBackwardConfig(DType::BF16, d, sm90a, false, DqAccumulation::Atomic).dkdv,
              (FlexAttentionConfig{64, 64, 4, 2}))
        << "D = " << d << ": dQᵀ's rows would leave wgmma";
  EXPECT_EQ(defaultFlexAttentionBackwardConfig(DType::BF16, 128, codegen::Target::sm80()).dkdv,
            (FlexAttentionConfig{16, 32, 4, 2}));
  EXPECT_EQ(defaultFlexAttentionBackwardConfig(DType::BF16, 128, codegen::Target::sm80()).dq.warp_specialize,
            WarpSpecialization::Auto);

  const int64_t B = 1, H = 2, L = 256, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantInstance wide = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{128, 128}, 1});
  FlexAttentionBackwardPlan plan = plan_flex_attention_backward(q, q, q, q, lse, q, wide.score, wide.mask, {}, sm90a);
  EXPECT_EQ(plan.config.dq, d128.dq) << plan.config.describe();
  ASSERT_EQ(plan.compiled.size(), 3u);
  EXPECT_NE(plan.compiled[2]->ir.find("producer_warps = 4"), std::string::npos);
  EXPECT_EQ(plan.compiled[2]->producerWarps, 4);

  VariantInstance narrow = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{64, 64}, 1});
  plan = plan_flex_attention_backward(q, q, q, q, lse, q, narrow.score, narrow.mask, {}, sm90a);
  EXPECT_EQ(plan.config.dq, (FlexAttentionConfig{64, 64, 4, 2})) << plan.config.describe();
  EXPECT_EQ(plan.compiled[2]->ir.find("producer_warps"), std::string::npos);
}

// A specialized dkdv copies its per-query LSE and delta rows into the ring by TMA with Q and dO
// (row rings), where the row stride (L f32) allows a tensor map; otherwise it loads them itself.
TEST(FlexAttentionBackwardCodegen, SpecializedDkdvCopiesItsRowsByTma) {
  const auto sm90a = codegen::Target::sm90a();
  for (int64_t L : {1000, 1001}) {
    SCOPED_TRACE("L " + std::to_string(L));
    const int64_t B = 1, H = 2, D = 128;
    Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
    Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
    VariantInstance causal = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{128, 128}, 1});
    const FlexAttentionBackwardConfig config{{64, 128, 8, 2, WarpSpecialization::On}, {64, 64, 4, 2}};
    FlexAttentionBackwardPlan plan =
        plan_flex_attention_backward(q, q, q, q, lse, q, causal.score, causal.mask, {.config = config}, sm90a);
    ASSERT_EQ(plan.compiled.size(), 3u);
    const std::string& ir = plan.compiled[1]->ir;
    EXPECT_NE(ir.find("producer_warps = 4"), std::string::npos);
    const bool boxed = L % 4 == 0;
    EXPECT_EQ(count(ir, "tma_copy [^\\n]*%lse2"), boxed ? 4 : 0) << "the prologue's and the loop's, in each of the two walks";
    EXPECT_EQ(count(ir, "tma_copy [^\\n]*%delta"), boxed ? 4 : 0);
    EXPECT_EQ(count(ir, "local_load [^\\n]*: f32\\[64\\]"), boxed ? 4 : 0);
    EXPECT_EQ(count(plan.compiled[1]->ptx, "cp\\.async\\.bulk\\.tensor\\.2d"), boxed ? 8 : 0);
    EXPECT_EQ(plan.compiled[1]->tensorMaps.size(), boxed ? 4u : 2u);
    if (codegen::findPtxas()) {
      EXPECT_NO_THROW(codegen::runPtxas(plan.compiled[1]->ptx, sm90a));
    }
  }
}

// Regression (FlexAttentionBackwardGpu.WarpgroupTurnsEveryVariant stalled under the parallel GPU
// suite, 2026-12-05 and -06): dkdv opens and closes its warpgroup turns once a head of the GQA group,
// in its loop over the heads, with nothing between a close and the next head's open where the two
// warpgroups meet — so warpgroup 1 could arrive on named barrier 1 for the next open before
// warpgroup 0 synced there for the close, and two arrivals of one warpgroup complete the barrier.
// Its close hands the end of the turns to warpgroup 1 (handshake = 1: one more bar.arrive and
// bar.sync on a named barrier of 256 threads); dq closes once a program and keeps the plain close.
TEST(FlexAttentionBackwardCodegen, TurnsClosedInsideTheHeadLoopHandTheEndBack) {
  FlexAttentionConfig dkdvTile{64, 128, 8, 2, WarpSpecialization::On}, dqTile{128, 64, 8, 2, WarpSpecialization::On};
  dkdvTile.turns = dqTile.turns = LoopSchedule::On;
  const int64_t B = 2, Hq = 8, Hkv = 2, L = 129, S = 1000, D = 64;
  Tensor q = Tensor::empty(DType::F16, {B, Hq, L, D}, MemorySpace::Host);
  Tensor kv = Tensor::empty(DType::F16, {B, Hkv, S, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, Hq, L}, MemorySpace::Host);
  VariantInstance documents = variant("document").make({B, Hq, L, S, MemorySpace::Host, BlockSizes{128, 128}, 1});
  FlexAttentionBackwardPlan plan = plan_flex_attention_backward(q, kv, kv, q, lse, q, documents.score, documents.mask,
                                                                {.config = FlexAttentionBackwardConfig{dkdvTile, dqTile}},
                                                                codegen::Target::sm90a());
  ASSERT_EQ(plan.compiled.size(), 3u);
  const codegen::CompiledKernel& dkdv = *plan.compiled[1];
  const codegen::CompiledKernel& dq = *plan.compiled[2];
  EXPECT_EQ(count(dkdv.ir, "warpgroup_turn \\{handshake = 1, step = \"close\"\\}"), 1) << dkdv.ir;
  EXPECT_EQ(count(dq.ir, "warpgroup_turn \\{step = \"close\"\\}"), 1) << dq.ir;
  EXPECT_EQ(count(dq.ir, "handshake"), 0);
  // Named barriers of 256 threads: an end's arrive and a begin's sync a walk with turns, the open's
  // arrive and the close's sync, and in dkdv the handshake's arrive and sync.
  const std::string arrive = "bar\\.arrive \t?%r[0-9]+, 256;", sync = "bar\\.sync \t?%r[0-9]+, 256;";
  for (const auto* k : {&dkdv, &dq}) {
    const int walks = count(k->ir, "warpgroup_turn \\{step = \"end\"\\}"), handshake = k == &dkdv ? 1 : 0;
    EXPECT_GE(walks, 1);
    EXPECT_EQ(count(k->ptx, arrive), walks + 1 + handshake) << (k == &dkdv ? "dkdv" : "dq");
    EXPECT_EQ(count(k->ptx, sync), walks + 1 + handshake) << (k == &dkdv ? "dkdv" : "dq");
  }
  if (codegen::findPtxas()) {
    EXPECT_NO_THROW(codegen::runPtxas(dkdv.ptx, codegen::Target::sm90a()));
  }
}

// Regression (FlexAttentionBackwardGpu under FLEXTILE_WARP_SPECIALIZE=1, 2026-12-03: "its slots start
// at byte 57344 + s * 64 ...; TMA with this layout needs multiples of 128"): a row ring's slot is an
// unswizzled TMA destination, 128-byte aligned. 16 query rows (64 bytes of f32) are loaded by the
// consumers instead; 32 rows (128 bytes) ride in the ring, and the plan places the ring on a
// multiple of 128 bytes.
TEST(FlexAttentionBackwardCodegen, RowRingsOnlyTakeSlotsTmaCanWrite) {
  const auto sm90a = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1000, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantInstance window = variant("sliding_window").make({B, H, L, L, MemorySpace::Host, BlockSizes{128, 128}, 1});
  for (int64_t rows : {16, 32}) {
    SCOPED_TRACE("dkdv of " + std::to_string(rows) + " queries");
    const FlexAttentionBackwardConfig config{{rows, 64, 4, 2, WarpSpecialization::On}, {64, 64, 4, 2}};
    FlexAttentionBackwardPlan plan;
    ASSERT_NO_THROW(plan = plan_flex_attention_backward(q, q, q, q, lse, q, window.score, window.mask,
                                                        {.config = config}, sm90a));
    ASSERT_EQ(plan.compiled.size(), 3u);
    const std::string& ir = plan.compiled[1]->ir;
    EXPECT_NE(ir.find("producer_warps = 4"), std::string::npos);
    EXPECT_EQ(count(ir, "tma_copy [^\\n]*%lse2") > 0, rows * 4 % 128 == 0) << ir;
    if (codegen::findPtxas()) {
      EXPECT_NO_THROW(codegen::runPtxas(plan.compiled[1]->ptx, sm90a));
    }
  }
}

// The backward's kernels ask for hoist-invariant-loads: ALiBi's slope of the head is read once,
// before the walks, not once a step (ALiBi's backward +2 % on the H200, 2026-12-04);
// FLEXTILE_HOIST_INVARIANT_LOADS=0 leaves it in the walks. Correctness: every GPU backward test.
TEST(FlexAttentionBackwardCodegen, HeadSlopeIsReadBeforeTheWalks) {
  auto slopeReadBeforeFirstLoop = [](const std::string& ir) {
    const size_t slope = ir.find("addptr %alibi_slopes"), loop = ir.find(" for ");
    return slope != std::string::npos && loop != std::string::npos && slope < loop;
  };
  const FlexAttentionBackwardConfig config{{64, 128, 8, 2, WarpSpecialization::On}, {128, 64, 8, 2, WarpSpecialization::On}};
  VariantPlan hoisted = planFor(codegen::Target::sm90a(), config, "alibi");
  ASSERT_EQ(hoisted.compiled.size(), 3u);
  for (size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(hoisted.kernelNames[i]);
    EXPECT_TRUE(slopeReadBeforeFirstLoop(hoisted.compiled[i]->ir));
  }
  flextile::testing::ScopedSetenv off("FLEXTILE_HOIST_INVARIANT_LOADS", "0");
  VariantPlan inLoops = planFor(codegen::Target::sm90a(), config, "alibi");
  for (size_t i = 1; i < 3; ++i) EXPECT_FALSE(slopeReadBeforeFirstLoop(inLoops.compiled[i]->ir)) << inLoops.kernelNames[i];
}

// P's exponent, s·scale − lse2, is taken before the masks set -inf (lse2 is never -inf), so without
// a score_mod the masked walks compute it as one fma, not a multiply, a select and a subtraction
// (causal dkdv and dq at 128 keys: 32 instructions a thread a step fewer, and ptxas's spills 24 ->
// 4 bytes). FLEXTILE_BWD_EXPONENT_FIRST=0 brings back the old order. Values: every interpreted and
// GPU backward test (masked rows, empty rows, keys past the length).
TEST(FlexAttentionBackwardCodegen, MaskedWalksTakeTheExponentAsOneFma) {
  auto fmas = [](const VariantPlan& plan, size_t i) {
    return count(plan.compiled[i]->ptx, "fma\\.rn\\.f32");
  };
  const FlexAttentionBackwardConfig config{{64, 128, 8, 2, WarpSpecialization::On}, {128, 64, 8, 2, WarpSpecialization::On}};
  VariantPlan first = planFor(codegen::Target::sm90a(), config, "causal");
  flextile::testing::ScopedSetenv after("FLEXTILE_BWD_EXPONENT_FIRST", "0");
  VariantPlan last = planFor(codegen::Target::sm90a(), config, "causal");
  for (size_t i = 1; i < 3; ++i) EXPECT_GT(fmas(first, i), fmas(last, i)) << first.kernelNames[i];
}

// Without a score_mod, dkdv issues dPᵀ together with Sᵀ in both walks (Sᵀ is then waited with dPᵀ
// still in flight: a wait with one group pending per walk and product pair);
// FLEXTILE_BWD_MASKED_DP_EARLY=0 issues it after pᵀ in the masked walk, which ptxas assembles with
// fewer spills (document dkdv 84 -> 4 bytes), to be measured against the overlap it gives up.
TEST(FlexAttentionBackwardCodegen, MaskedWalkIssuesDpWithTheScoresUnlessAsked) {
  const FlexAttentionBackwardConfig config{{64, 128, 8, 2, WarpSpecialization::On}, {128, 64, 8, 2, WarpSpecialization::On}};
  auto pendingWaits = [&] {
    VariantPlan plan = planFor(codegen::Target::sm90a(), config, "causal");
    return count(plan.compiled[1]->ir, "wgmma_wait [^\\n]*pending = 1");
  };
  const int early = pendingWaits();
  flextile::testing::ScopedSetenv late("FLEXTILE_BWD_MASKED_DP_EARLY", "0");
  EXPECT_LT(pendingWaits(), early);
}

// A score_mod's adjoint is linear in its seed, so without trainable captures dkdv and dq take it as
// p·g, g the adjoint of ones, before dP's wait: the mod's intermediates (soft-cap's tanh) need not
// stay live across it, and the chain rule runs once on g instead of on dS (soft-cap: 128 PTX lines
// fewer in each kernel; dkdv's spills 248 -> 120 bytes with ptxas 13). FLEXTILE_BWD_SEED_FREE_ADJOINT=0
// goes through dS as before. Values: FiniteDifferences and every backward test with a score_mod.
TEST(FlexAttentionBackwardCodegen, ScoreModAdjointIsTakenBeforeTheProductWait) {
  auto instructions = [](const std::string& ptx) { return count(ptx, "\\n\\t[a-z]"); };
  const FlexAttentionBackwardConfig config{{64, 128, 8, 2, WarpSpecialization::On}, {128, 64, 8, 2, WarpSpecialization::On}};
  VariantPlan seedFree = planFor(codegen::Target::sm90a(), config, "softcap");
  flextile::testing::ScopedSetenv throughTheSeed("FLEXTILE_BWD_SEED_FREE_ADJOINT", "0");
  VariantPlan seeded = planFor(codegen::Target::sm90a(), config, "softcap");
  for (size_t i = 1; i < 3; ++i)
    EXPECT_LT(instructions(seedFree.compiled[i]->ptx), instructions(seeded.compiled[i]->ptx)) << seedFree.kernelNames[i];
}

// dq reads nothing dkdv writes, so dkdv lets it launch once every dkdv program has started
// (griddepcontrol.launch_dependents first thing) and dq, launched with programmatic stream
// serialization (dsl/Kernel.cpp: its PTX waits), waits for dkdv only at its end, after its stores,
// so that whatever follows on the stream still follows dkdv. FLEXTILE_BWD_OVERLAP_DQ=0 and the
// atomic-dQ mode (its cast reads what dkdv accumulates) keep the kernels strictly in order.
TEST(FlexAttentionBackwardCodegen, DqMayStartDuringDkdvsLastWave) {
  const auto target = codegen::Target::sm90a();
  auto kernelPtx = [](const FlexAttentionBackwardPlan& p, const std::string& which) {
    for (size_t i = 0; i < p.kernelNames.size(); ++i)
      if (p.kernelNames[i].starts_with("flex_bwd_" + which + "_")) return p.compiled[i]->ptx;
    ADD_FAILURE() << "no " << which << " kernel";
    return std::string();
  };
  {
    VariantPlan p = planFor(target, std::nullopt, "document");
    const std::string dkdv = kernelPtx(p, "dkdv"), dq = kernelPtx(p, "dq");
    const size_t release = dkdv.find("griddepcontrol.launch_dependents;");
    ASSERT_NE(release, std::string::npos);
    EXPECT_LT(release, dkdv.find("ld.global")) << "released before the program's first load";
    EXPECT_EQ(dkdv.find("griddepcontrol.wait"), std::string::npos);
    const size_t wait = dq.find("griddepcontrol.wait;");
    ASSERT_NE(wait, std::string::npos);
    EXPECT_GT(wait, dq.rfind("st.global")) << "dq waits for dkdv after its last store";
    EXPECT_EQ(kernelPtx(p, "preprocess").find("griddepcontrol"), std::string::npos);
  }
  {
    flextile::testing::ScopedSetenv off("FLEXTILE_BWD_OVERLAP_DQ", "0");
    VariantPlan p = planFor(target, std::nullopt, "causal");
    EXPECT_EQ(kernelPtx(p, "dkdv").find("griddepcontrol"), std::string::npos);
    EXPECT_EQ(kernelPtx(p, "dq").find("griddepcontrol"), std::string::npos);
  }
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  VariantInstance inst = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  FlexAttentionBackwardOptions atomicOptions;
  atomicOptions.dq_accumulation = DqAccumulation::Atomic;
  auto atomic = plan_flex_attention_backward(q, q, q, q, lse, q, inst.score, inst.mask, atomicOptions, target);
  for (const codegen::CompiledKernel* k : atomic.compiled)
    EXPECT_EQ(k->ptx.find("griddepcontrol"), std::string::npos) << "the atomic mode keeps its kernels in order";
}
