// The code flex_attention's forward template compiles to, without a GPU: on
// sm_90a both products run on wgmma straight from the pipelined K and V ring
// slots (Q K^T K-major, P V MN-major), on sm_80 on mma.sync; ptxas accepts
// both without spills.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>
#include <regex>
#include <sstream>
#include <vector>

#include "tests/TextCount.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
#include "gpu/GpuTest.h"
#include "ir/Parser.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using flextile::testing::ScopedSetenv;
using flextile::testing::assemblesInThisBuild;
using flextile::testing::expectError;

namespace {
using flextile::testing::count;

// Branches from above a loop into its middle: a loop spans from a label to the last branch back to
// it, and an entry below that label means the layout that LLVM's block placement makes when it
// rotates a loop (the header after the latch, entered by a jump), under which ptxas loses a
// wgmma's loop-invariant A registers (NVPTXTarget::EmitOptions::keepBlockOrder).
std::vector<std::string> jumpsIntoLoops(const std::string& ptx) {
  std::map<std::string, size_t> labelLine;
  std::vector<std::pair<size_t, std::string>> branches;  // (line, target label)
  std::istringstream in(ptx);
  size_t n = 0;
  const std::regex label(R"(^\$(L__BB\w+):)"), branch(R"(\bbra(\.uni)?\s+\$(L__BB\w+);)");
  for (std::string line; std::getline(in, line); ++n) {
    std::smatch m;
    if (std::regex_search(line, m, label)) labelLine[m[1]] = n;
    if (std::regex_search(line, m, branch)) branches.push_back({n, m[2].str()});
  }
  std::vector<std::string> out;
  for (const auto& [back, header] : branches) {
    if (!labelLine.count(header) || labelLine[header] > back) continue;  // not a back edge
    const size_t top = labelLine[header];
    for (const auto& [from, target] : branches)
      if (labelLine.count(target) && from < top && labelLine[target] > top && labelLine[target] <= back)
        out.push_back("line " + std::to_string(from) + " jumps to " + target + " inside the loop of " + header);
  }
  return out;
}

// The causal forward for a config. The tests below read the kernel of one program per tile: a
// config that leaves persistent programs to the rule gets none (FLEXTILE_FORWARD_PERSISTENT=1
// still forces them, as the persistent tests do).
const codegen::CompiledKernel& compileFor(codegen::Target target, FlexAttentionConfig config, int64_t D = 128) {
  if (config.persistent == LoopSchedule::Auto) config.persistent = LoopSchedule::Off;
  if (config.overlap == LoopSchedule::Auto) config.overlap = LoopSchedule::Off;  // the walk these tests read
  Tensor q = Tensor::empty(DType::BF16, {1, 2, 1024, D}, MemorySpace::Host);
  Tensor k = Tensor::empty(DType::BF16, {1, 2, 1024, D}, MemorySpace::Host);
  static std::optional<BlockMask> mask;
  mask = causalBlockMask(1, 1, 1024, 1024);
  auto plan = plan_flex_attention(q, k, k, noop_score(), mask, {.config = config}, true, target);
  return *plan.compiled;
}
// A yardstick variant's forward at the H200's shape (B=2 H=16 N=8192 D=128), compiled for sm_90a
// with `config` (the default when none): its IR and PTX, copied (the kernel lives as long as the
// variant's mods).
struct KernelText {
  std::string ir, ptx;
};
KernelText yardstickKernel(const char* name, std::optional<FlexAttentionConfig> config = std::nullopt) {
  const int64_t B = 2, H = 16, L = 8192, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  VariantInstance v = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  const codegen::CompiledKernel& k =
      *plan_flex_attention(q, q, q, v.score, v.mask, {.config = config}, true, codegen::Target::sm90a()).compiled;
  return {k.ir, k.ptx};
}
// A warp-specialized kernel spills at most `atMost` bytes, and what it spills is its producer's:
// compiled again (`compile`, under the caller's switches) with 8 registers more for the producer
// and so 8 fewer for the consumers (FLEXTILE_PRODUCER_REGISTERS=32), it spills nothing. Returns
// ptxas's report of the kernel as compiled first.
codegen::PtxasReport expectOnlyTheProducerSpills(const std::function<const codegen::CompiledKernel*()>& compile,
                                                 int64_t atMost) {
  const codegen::PtxasReport r = codegen::runPtxas(compile()->ptx, codegen::Target::sm90a());
  EXPECT_LE(r.spillStoreBytes, atMost) << r.log;
  ScopedSetenv roomier("FLEXTILE_PRODUCER_REGISTERS", "32");
  const codegen::PtxasReport at32 = codegen::runPtxas(compile()->ptx, codegen::Target::sm90a());
  EXPECT_EQ(at32.spillStoreBytes, 0) << at32.log;
  return r;
}
// FLEXTILE_TMA for one scope: "0" keeps the cp.async rings on sm_90a (the schedule the tests
// below check), "1" the default's TMA rings.
struct TmaScope {
  explicit TmaScope(const char* value) { ::setenv("FLEXTILE_TMA", value, 1); }
  ~TmaScope() { ::unsetenv("FLEXTILE_TMA"); }
};
}  // namespace

TEST(FlexAttentionCodegen, HopperRunsBothProductsOnWgmmaFromTheRing) {
  TmaScope cpAsync("0");
  for (FlexAttentionConfig c : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 64, 8, 3}}) {
    SCOPED_TRACE(c.describe());
    const auto& k = compileFor(codegen::Target::sm90a(), c);
    // Two loops (full and partial blocks), each: 8 k-steps of Q K^T (m64n64,
    // K-major; the first with scale-d false, S starts at zero) and 4 of P V
    // (m64n128, MN-major, accumulating).
    EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.bf16\\.bf16[^;]*z, 1, 1, 0;"), 2);
    EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n64k16\\.f32\\.bf16\\.bf16[^;]*p, 1, 1, 0;"), 14);
    EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16[^;]*p, 1, 1, 1;"), 8);
    EXPECT_EQ(count(k.ptx, "mma\\.sync"), 0);
    EXPECT_EQ(count(k.ptx, "fence\\.proxy\\.async"), 2);
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
  }
}

// Without warp specialization the forward asks for register A (wgmma_register_a): Q stays in
// registers for Q·Kᵀ, which ran 3-6 % faster on the H200 than Q in a resident shared tile (the
// backward keeps its resident tiles: FlexAttentionBackwardCodegen.LoopInvariantOperandsAreReadFromSharedMemory).
// Warp-specialized (the default where the mods read nothing per key), Q is resident in shared
// memory and both operands of Q·Kᵀ are descriptors: 8-11 % faster there than Q in registers.
TEST(FlexAttentionCodegen, ForwardKeepsQInRegisters) {
  const std::string qk = "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16\\.f32\\.bf16\\.bf16 \\{[^}]*\\}, ";
  const std::string fromRegisters = qk + "\\{%r[0-9]+, %r[0-9]+, %r[0-9]+, %r[0-9]+\\}, bd[0-9]+, [pz], 1, 1, 0;";
  {
    const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
    EXPECT_EQ(k.producerWarps, 4);
    EXPECT_EQ(count(k.ptx, fromRegisters), 0);
    EXPECT_EQ(count(k.ptx, qk + "ad[0-9]+, bd[0-9]+"), 16);  // A and B descriptors
  }
  ScopedSetenv off("FLEXTILE_WARP_SPECIALIZE", "0");
  const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
  EXPECT_EQ(k.producerWarps, 0);
  EXPECT_EQ(count(k.ptx, qk + "ad[0-9]+"), 0);
  EXPECT_EQ(count(k.ptx, fromRegisters), 16);
}

// Regression (a GPU race seen on the H200 in the document variant): the
// second loop's ring may reuse the bytes the first loop's last wgmma reads
// (or Q's staging tile), so every prologue starts after a barrier.
TEST(FlexAttentionCodegen, EveryRingPrologueWaitsForTheCtaFirst) {
  TmaScope cpAsync("0");  // (the TMA rings' prologues: TmaFillsTheKAndVRings)
  for (auto target : {codegen::Target::sm90a(), codegen::Target::sm80()}) {
    const std::string& ptx = compileFor(target, {64, 64, 4, 2}).ptx;
    // Loop 1's prologue: after Q's staging reads (its last ldmatrix) a barrier
    // comes before the first copy; loop 2's: after loop 1's final wait (for no
    // pending group). Every wait for none (the loops' final waits, and at 2
    // stages the in-loop waits too) has a barrier before the next copy.
    const size_t firstCopy = ptx.find("cp.async.cg.shared.global");
    ASSERT_NE(firstCopy, std::string::npos);
    const size_t qReads = ptx.rfind("ldmatrix", firstCopy);
    ASSERT_NE(qReads, std::string::npos) << target.smName();
    EXPECT_NE(ptx.substr(qReads, firstCopy - qReads).find("bar.sync"), std::string::npos) << target.smName();
    int waitsBeforeACopy = 0;
    for (size_t w = ptx.find("cp.async.wait_group \t0;", firstCopy); w != std::string::npos;
         w = ptx.find("cp.async.wait_group \t0;", w + 1)) {
      const size_t nextCopy = ptx.find("cp.async.cg.shared.global", w);
      if (nextCopy == std::string::npos) continue;  // the last loop's final wait
      ++waitsBeforeACopy;
      EXPECT_NE(ptx.substr(w, nextCopy - w).find("bar.sync"), std::string::npos) << target.smName() << " at " << w;
    }
    EXPECT_GE(waitsBeforeACopy, 1) << target.smName();  // loop 1's final wait, before loop 2's prologue
  }
}

// Regression (wrong rows on the H200 for the document variant at D = 64, and in
// FlexAttentionGpu.WgmmaInLoopsWithSharedConversions until 38b2184): a loop that also converts a
// layout through shared memory runs both products on wgmma, and its PTX keeps the loop's blocks
// in order. The conversions' owner-only stores split the loop into blocks; LLVM's block placement
// then laid the header out after the latch, entered by a forward jump, and ptxas reused Q's
// registers after the first iteration. With wgmma the backend keeps the IR's block order.
TEST(FlexAttentionCodegen, LoopsWithSharedConversionsRunWgmmaWithTheirBlocksInOrder) {
  Tensor q = Tensor::empty(DType::BF16, {1, 8, 127, 64}, MemorySpace::Host);
  Tensor k = Tensor::empty(DType::BF16, {1, 2, 129, 64}, MemorySpace::Host);
  std::vector<int32_t> ids(129);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i / 20);
  // The ids pass through arithmetic before the comparison, so they are
  // computed values in the load's layout and must be converted (a bare load
  // would be reloaded in the comparison's layout, with no conversion).
  dsl::CapturedTensor idsT = dsl::capture(Tensor::fromHost(ids, {1, 129}), "ids");
  MaskMod docs = and_masks(causal_mask(), MaskMod("shifted_documents",
                                                  [idsT](const Tile& b, const Tile&, const Tile& q, const Tile& kv) {
                                                    return (idsT(b, q) ^ 1) == (idsT(b, kv) ^ 1);
                                                  },
                                                  {idsT}));
  BlockMask mask = createBlockMask(docs, 1, 1, 127, 129, {128, 128}, MemorySpace::Host);
  for (const FlexAttentionConfig config : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 64, 8, 2}}) {
    SCOPED_TRACE(config.describe());
    auto plan = plan_flex_attention(q, k, k, noop_score(), mask, {.config = config}, true, codegen::Target::sm90a());
    EXPECT_GT(count(plan.compiled->ir, "convert_layout %[0-9]+ : i32"), 0) << "the loop no longer converts";
    // Regression (wrong rows on the H200 with TMA rings in this loop, 2026-12-02): a loop that
    // waits for the CTA (its conversion through shared memory) keeps the cp.async ring.
    EXPECT_EQ(count(plan.compiled->ptx, "cp\\.async\\.bulk\\.tensor"), 0);
    EXPECT_GT(count(plan.compiled->ptx, "cp\\.async\\.cg"), 0);
    EXPECT_EQ(count(plan.compiled->ptx, "wgmma\\.mma_async"), 8);
    EXPECT_EQ(count(plan.compiled->ptx, "mma\\.sync"), 0);
    const std::vector<std::string> entries = jumpsIntoLoops(plan.compiled->ptx);
    EXPECT_TRUE(entries.empty()) << entries.front() << "\n" << plan.compiled->ptx;
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(plan.compiled->ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
  }
}

// The document mask reads ids at the query and key positions: small loads
// issued in the comparison's layout, so its loop converts nothing through
// shared memory and both products stay on wgmma.
TEST(FlexAttentionCodegen, DocumentIdsAreLoadedInTheLayoutTheyAreComparedIn) {
  Tensor q = Tensor::empty(DType::BF16, {1, 8, 127, 64}, MemorySpace::Host);
  Tensor k = Tensor::empty(DType::BF16, {1, 2, 129, 64}, MemorySpace::Host);
  std::vector<int32_t> ids(129);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i / 20);
  MaskMod docs = and_masks(causal_mask(), document_mask(dsl::capture(Tensor::fromHost(ids, {1, 129}), "ids")));
  BlockMask mask = createBlockMask(docs, 1, 1, 127, 129, {128, 128}, MemorySpace::Host);
  auto plan = plan_flex_attention(q, k, k, noop_score(), mask, {}, true, codegen::Target::sm90a());
  EXPECT_EQ(count(plan.compiled->ir, "convert_layout %[0-9]+ : i32"), 0) << plan.compiled->ir;
  EXPECT_GT(count(plan.compiled->ptx, "wgmma\\.mma_async"), 0);
}

TEST(FlexAttentionCodegen, AmpereRunsMmaSync) {
  const auto& k = compileFor(codegen::Target::sm80(), {64, 64, 4, 2});
  EXPECT_EQ(count(k.ptx, "wgmma"), 0);
  EXPECT_GT(count(k.ptx, "mma\\.sync\\.aligned\\.m16n8k16"), 0);
  EXPECT_GT(count(k.ptx, "ldmatrix"), 0);
  if (codegen::findPtxas()) {
    codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm80());
    EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
  }
}

// K and V named as tensor boxes (the default; FLEXTILE_TMA=0 drops them): on sm_90a the pipeline fills their rings with
// TMA — cp.async.bulk.tensor from thread 0, one per 64-element panel of a tile, completing on a
// one-arrival `full` barrier — and the loop keeps no cp.async and no CTA barrier. One tensor map
// each for K and V (the maps follow the parameters). On sm_80 the boxes are ordinary loads: the PTX
// is the one without them.
TEST(FlexAttentionCodegen, TmaFillsTheKAndVRings) {
  ScopedSetenv consumersIssue("FLEXTILE_WARP_SPECIALIZE", "0");  // (the producer's copies: WarpSpecializedForwardMovesRegistersToTheConsumers)
  std::string withoutBoxes;
  {
    TmaScope off("0");
    withoutBoxes = compileFor(codegen::Target::sm80(), {64, 64, 4, 2}).ptx;
  }
  for (FlexAttentionConfig c : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{128, 128, 8, 2}}) {
    SCOPED_TRACE(c.describe());
    const auto& k = compileFor(codegen::Target::sm90a(), c);  // TMA is the default there
    ASSERT_EQ(k.tensorMaps.size(), 2u);
    for (const codegen::TensorMapRecipe& r : k.tensorMaps) {
      EXPECT_EQ(r.box, (std::vector<int64_t>{1, 1, c.block_n, 64})) << r.str();
      EXPECT_EQ(r.swizzleBytes, 128) << r.str();
    }
    // Shared (FLEXTILE_SHARE_RINGS=1), the two walks share their rings: each still issues a
    // prologue stage and an in-loop stage (K and V, two panels each), but one set of barriers is
    // initialized and invalidated for both. Unshared (a program per tile's default), each walk has
    // its own barriers initialized and invalidated around it.
    {
      ScopedSetenv shareRings("FLEXTILE_SHARE_RINGS", "1");
      const auto& shared = compileFor(codegen::Target::sm90a(), c);
      EXPECT_EQ(count(shared.ptx, "cp\\.async\\.bulk\\.tensor\\.4d"), 2 * 2 * 2 * 2);
      EXPECT_EQ(count(shared.ptx, "mbarrier\\.arrive\\.expect_tx"), 2 * 2);
      EXPECT_EQ(count(shared.ptx, "mbarrier\\.inval"), 2 * 2);  // full and empty, two slots
    }
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.bulk\\.tensor\\.4d"), 2 * 2 * 2 * 2);
    EXPECT_EQ(count(k.ptx, "mbarrier\\.arrive\\.expect_tx"), 2 * 2);
    EXPECT_EQ(count(k.ptx, "mbarrier\\.inval"), 2 * 2 * 2);
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.cg"), 0);
    EXPECT_EQ(count(k.ptx, "fence\\.proxy\\.async"), 0);
    EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async"), c.block_m == 64 ? 24 : 32);
    // Each ring's prologue starts after a CTA barrier (the bytes may be another tile's: Q's
    // staging, the first loop's ring), as with cp.async (EveryRingPrologueWaitsForTheCtaFirst).
    for (size_t copy = k.ptx.find("cp.async.bulk.tensor"), loops = 0; copy != std::string::npos && loops < 2; ++loops) {
      const size_t init = k.ptx.rfind("mbarrier.init", copy);
      ASSERT_NE(init, std::string::npos);
      EXPECT_NE(k.ptx.substr(init, copy - init).find("bar.sync"), std::string::npos) << "loop " << loops;
      copy = k.ptx.find("cp.async.bulk.tensor", k.ptx.find("mbarrier.inval", copy));
    }
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
  }
  EXPECT_EQ(compileFor(codegen::Target::sm80(), {64, 64, 4, 2}).ptx, withoutBoxes);
}

// Warpgroup ping-pong (opt-in: FLEXTILE_PINGPONG=1, codegen/passes/Pingpong.cpp): on two
// warpgroups with TMA rings (no CTA barrier left in the loops) both walks take turns: each loop is
// opened and closed, and each iteration's products are bracketed by a wait for the turn (a named
// barrier 1 or 2 of 256 threads) and its hand-over. One warpgroup, or cp.async rings (a CTA
// barrier per iteration), get no turns.
TEST(FlexAttentionCodegen, TwoWarpgroupsTakeTurnsIssuingTheirProducts) {
  ::setenv("FLEXTILE_PINGPONG", "1", 1);
  struct Unset {
    ~Unset() { ::unsetenv("FLEXTILE_PINGPONG"); }
  } unset;
  // With the two walks sharing their rings (FLEXTILE_SHARE_RINGS=1), nothing makes the warpgroups
  // meet between them: the turns run through both loops as through one, one open before the first
  // and one close after the second. (A close and an open between them let warpgroup 1 arrive twice
  // on barrier 1 before warpgroup 0 synced on it: the turns fell out of step and the forward hung
  // on the H200, 2026-12-04, with the walks then chained on one ring.)
  std::optional<ScopedSetenv> chained(std::in_place, "FLEXTILE_SHARE_RINGS", "1");
  const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
  EXPECT_EQ(count(k.ir, "warpgroup_turn \\{step = \"open\"\\}"), 1);
  EXPECT_EQ(count(k.ir, "warpgroup_turn \\{step = \"begin\"\\}"), 2);
  EXPECT_EQ(count(k.ir, "warpgroup_turn \\{step = \"end\"\\}"), 2);
  EXPECT_EQ(count(k.ir, "warpgroup_turn \\{step = \"close\"\\}"), 1);
  EXPECT_LT(k.ir.find("warpgroup_turn {step = \"open\"}"), k.ir.find(" = for "));
  EXPECT_GT(k.ir.find("warpgroup_turn {step = \"close\"}"), k.ir.rfind("warpgroup_turn {step = \"end\"}"));
  // Per loop a wait per iteration (bar.sync) and a hand-over (bar.arrive); the close, the open. No open
  // follows the close before the two warpgroups meet, so it needs no handshake
  // (FlexAttentionBackwardCodegen.TurnsClosedInsideTheHeadLoopHandTheEndBack).
  EXPECT_EQ(count(k.ir, "handshake"), 0);
  EXPECT_EQ(count(k.ptx, "bar\\.sync \t?%r[0-9]+, 256;"), 3);
  EXPECT_EQ(count(k.ptx, "bar\\.arrive \t?%r[0-9]+, 256;"), 3);
  {
    // A ring per walk: the CTA barriers around each ring part the walks, and each loop opens and
    // closes its own turns.
    chained.reset();
    const auto& apart = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
    EXPECT_EQ(count(apart.ir, "warpgroup_turn \\{step = \"open\"\\}"), 2);
    EXPECT_EQ(count(apart.ir, "warpgroup_turn \\{step = \"close\"\\}"), 2);
  }
  if (codegen::findPtxas()) {
    codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
    EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
  }
  EXPECT_EQ(count(compileFor(codegen::Target::sm90a(), {64, 64, 4, 2}).ir, "warpgroup_turn"), 0);
  TmaScope cpAsync("0");
  EXPECT_EQ(count(compileFor(codegen::Target::sm90a(), {128, 128, 8, 2}).ir, "warpgroup_turn"), 0);
}

// Warp specialization (opt-in: FLEXTILE_WARP_SPECIALIZE=1, codegen/passes/WarpSpecialize.cpp): the
// causal forward's two walks get a producer warpgroup. On two consumer warpgroups the launch is 384
// threads, ptxas caps them at 168 registers, the producer gives its registers back (24) and the
// consumers take them (240) without spilling; both walks' copies are the producer's alone. On one
// consumer warpgroup the cap is already 255 (no setmaxnreg); on sm_80 and with cp.async rings
// nothing is specialized.
// Q, resident in shared memory for the specialized forward, is stored where the walk first reads
// it: after the first walk's ring prologue. So the producer issues the first K/V stage as soon as
// it has the block index, while the consumers wait for Q's global load, instead of waiting at the
// ring's barrier for the consumers to store Q (FLEXTILE_STAGE_AT_FIRST_USE=0, the order before).
TEST(FlexAttentionCodegen, TheProducerIssuesTheFirstStageBeforeQIsStaged) {
  auto firstOf = [](const std::string& ir, const std::string& what) { return ir.find(what); };
  {
    const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
    ASSERT_EQ(k.producerWarps, 4);
    const size_t copy = firstOf(k.ir, "tma_copy "), store = firstOf(k.ir, "local_store ");
    ASSERT_NE(copy, std::string::npos);
    ASSERT_NE(store, std::string::npos);
    EXPECT_LT(copy, store) << "the first K/V stage is issued before Q is stored";
    EXPECT_LT(store, firstOf(k.ir, "= for ")) << "Q is stored before the walk";
  }
  ScopedSetenv old("FLEXTILE_STAGE_AT_FIRST_USE", "0");
  const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
  EXPECT_GT(firstOf(k.ir, "tma_copy "), firstOf(k.ir, "local_store "));
}

// Both lists' lengths are read before the first walk, so that after it the second walk's first
// block index is one list read away, not two dependent ones (the partial list's length, then the
// index). The backward's dq and dkdv do the same.
TEST(FlexAttentionCodegen, BothListLengthsAreReadBeforeTheFirstWalk) {
  const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
  const size_t firstWalk = k.ir.find("= for ");
  ASSERT_NE(firstWalk, std::string::npos);
  EXPECT_LT(k.ir.find("addptr %full_kv_num"), firstWalk);
  EXPECT_LT(k.ir.find("addptr %kv_num"), firstWalk) << "the partial list's length before the full list's walk";
  const int64_t L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  Tensor lse = Tensor::empty(DType::F32, {1, 2, L}, MemorySpace::Host);
  BlockMask mask = causalBlockMask(1, 1, L, L);
  FlexAttentionBackwardPlan plan =
      plan_flex_attention_backward(q, q, q, q, lse, q, noop_score(), mask, {}, codegen::Target::sm90a());
  for (size_t i = 0; i < plan.kernelNames.size(); ++i) {
    if (plan.kernelNames[i].find("preprocess") != std::string::npos) continue;
    const std::string& ir = plan.compiled[i]->ir;
    SCOPED_TRACE(plan.kernelNames[i]);
    const size_t walk = ir.find("= for ");
    ASSERT_NE(walk, std::string::npos);
    EXPECT_LT(ir.find("addptr %full_num"), walk);
    EXPECT_LT(ir.find("addptr %partial_num"), walk);
  }
}

// Persistent forward (the config's `persistent`, or FLEXTILE_FORWARD_PERSISTENT=1): the program
// loops over its share of the query tiles (rounds of %tiles / num_programs) around both walks; the
// pipeline pass gives Q a two-slot cp.async ring of that loop, so the next tile's Q is loaded
// during this one, and the walks share one set of K/V rings across the tiles (invalidated once,
// after the tile loop); the specialized 8-warp tile still fits 168 registers without spilling.
// Off, no such loop.
TEST(FlexAttentionCodegen, PersistentForwardLoopsOverTheTiles) {
  {
    ScopedSetenv persistent("FLEXTILE_FORWARD_PERSISTENT", "1");
    const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
    const size_t body = k.ir.find('{', k.ir.find("func @"));
    EXPECT_NE(k.ir.find("%tiles", body), std::string::npos) << "the tile count sets the program's rounds";
    const size_t loop = k.ir.find(" = for ", body);
    ASSERT_NE(loop, std::string::npos);
    EXPECT_LT(k.ir.find("async_copy"), loop) << "the first tile's Q, before the loop";
    EXPECT_NE(k.ir.find("async_copy", loop), std::string::npos) << "the next tile's Q, in the loop";
    EXPECT_EQ(count(k.ir, "mbarrier_inval"), 2) << "the walks' shared rings, once, after the tile loop";
    EXPECT_GT(k.ir.rfind("mbarrier_inval"), k.ir.rfind("yield"));
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
      EXPECT_EQ(r.registers, 168) << r.log;
    }
  }
  const std::string& plain = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2}).ir;
  EXPECT_EQ(plain.find("%tiles", plain.find('{', plain.find("func @"))), std::string::npos);
}

// The rule for persistent programs (detail::persistentWanted, FlexAttentionConfig::persistent
// Auto): the yardstick variants whose tiles take the turns and whose mods read no captured tensor
// run persistent programs at the H200's default tile, their consumers without spilling (the
// producer, at 24 registers, spills up to 52 bytes of its peeled walks' state; at 32 nothing, with
// the consumers at 232 instead of 240 — so what spills is the producer's); ALiBi (its slopes
// spilled 84 bytes persistent) and the document mask (per-key ids, no turns) keep a program per tile.
TEST(FlexAttentionCodegen, PersistentProgramsWhereTheTurnsAreAndNoModReadsACapture) {
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  for (const char* name : {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"}) {
    SCOPED_TRACE(name);
    const bool expected = std::string(name) != "alibi" && std::string(name) != "document";
    VariantInstance inst = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = FlexAttentionConfig{128, 128, 8, 2}},
                                    true, codegen::Target::sm90a());
    const std::string& ir = plan.compiled->ir;
    EXPECT_EQ(ir.find("%tiles", ir.find('{', ir.find("func @"))) != std::string::npos, expected);
    // 16 query tiles (2 heads of 1024 rows in 128-row tiles): as many programs, fewer than the SMs.
    EXPECT_EQ(plan.persistentPrograms, expected ? 16 : 0);
    if (expected && assemblesInThisBuild())
      expectOnlyTheProducerSpills([&] {
        return plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = FlexAttentionConfig{128, 128, 8, 2}}, true,
                                   codegen::Target::sm90a())
            .compiled;
      }, 52);
  }
}

// Persistent programs only where their rings fit (persistentRingsFit): their Q ring takes as many
// slots as the K/V rings have stages, so at D = 128 three 128 × 128 stages (288 KB) or four of
// 128 × 64 (256 KB) exceed sm_90a's 227 KB. Those configs used to reach the shared-memory planner's
// refusal (and the autotuner pruned them); they now run a program per tile and compile. Asked for
// explicitly, persistent programs keep Q out of the rings (a plain load at each tile's start) and
// compile; with Q's ring forced (FLEXTILE_FORWARD_Q_RING=1) they are refused with an error that
// names the shared memory.
TEST(FlexAttentionCodegen, PersistentProgramsOnlyWhereTheirRingsFit) {
  const int64_t B = 2, H = 2, L = 3000, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  VariantInstance inst = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  auto persistent = [&](FlexAttentionConfig c) {
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = c}, true, codegen::Target::sm90a());
    EXPECT_NE(plan.compiled, nullptr);
    return plan.persistentPrograms > 0;
  };
  EXPECT_TRUE(persistent({128, 128, 8, 2})) << "2 x (128 + 256) x 128 x 2 bytes: 192 KB";
  EXPECT_TRUE(persistent({128, 64, 8, 3})) << "3 x (128 + 128) x 128 x 2 bytes: 192 KB";
  EXPECT_FALSE(persistent({128, 128, 8, 3})) << "288 KB";
  EXPECT_FALSE(persistent({128, 64, 8, 4})) << "256 KB";
  // Warpgroups that split the keys (64 rows on 8 warps) trade P through shared memory in each step:
  // no TMA on the walks, so no rings shared across tiles, and a program per tile.
  EXPECT_FALSE(persistent({64, 64, 8, 2})) << "the warpgroups split N";
  FlexAttentionConfig asked{128, 128, 8, 3};
  asked.persistent = LoopSchedule::On;
  const FlexAttentionPlan plainQ =
      plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = asked}, true, codegen::Target::sm90a());
  EXPECT_GT(plainQ.persistentPrograms, 0);
  EXPECT_EQ(count(ir::printFunction(*plainQ.traced), "no_ring = 1"), 1);
  ScopedSetenv ring("FLEXTILE_FORWARD_Q_RING", "1");
  try {
    plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = asked}, true, codegen::Target::sm90a());
    ADD_FAILURE() << "a persistent config past the shared memory compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::ResourceLimit) << e.what();
    EXPECT_NE(std::string(e.what()).find("shared memory"), std::string::npos) << e.what();
  }
}

// A persistent forward asked for where Q's ring would not fit beside the walks' keeps Q out of the
// rings: at D = 256 and 128 × 64 tiles, Q's ring of two 64 KB slots and K's and V's of two 32 KB
// slots each need 256 KB, past sm_90a's 227 KB. The rule runs a program per tile there (measured
// faster); `persistent` in the config gets persistent programs whose Q is a plain load at each
// tile's start (traced with `no_ring`, dsl::unpipelined), read into one resident slot, the walks
// keeping their rings. FLEXTILE_FORWARD_Q_RING=1 asks for Q's ring anyway: the shared-memory planner
// refuses it. At D = 192 Q's ring fits and stays.
TEST(FlexAttentionCodegen, AskedPersistentForwardKeepsQOutOfTheRingsWhereItWouldNotFit) {
  const int64_t B = 1, H = 2, L = 3000;
  FlexAttentionConfig asked{128, 64, 8, 2};
  asked.persistent = LoopSchedule::On;
  auto plan = [&](int64_t D, const FlexAttentionConfig& config) {
    Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
    VariantInstance inst = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    return plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, codegen::Target::sm90a());
  };
  EXPECT_EQ(plan(256, FlexAttentionConfig{128, 64, 8, 2}).persistentPrograms, 0) << "the rule: a program per tile";
  // 64 × 64 on 8 warps: its walks' rings are not shared (no TMA where P crosses warpgroups), so its
  // persistent kernel needed 270 KB and was refused; a program per tile compiles.
  const FlexAttentionPlan splitN = plan(256, FlexAttentionConfig{64, 64, 8, 2});
  EXPECT_EQ(splitN.persistentPrograms, 0);
  EXPECT_NE(splitN.compiled, nullptr);
  const FlexAttentionPlan wide = plan(256, asked);
  EXPECT_GT(wide.persistentPrograms, 0);
  ASSERT_NE(wide.compiled, nullptr);
  EXPECT_EQ(count(ir::printFunction(*wide.traced), "no_ring = 1"), 1) << "Q's load, once";
  EXPECT_EQ(count(wide.compiled->ir, "local_alloc : smem<1 x bf16\\[128,256\\]"), 1) << wide.compiled->ir;
  EXPECT_EQ(count(wide.compiled->ir, "smem<2 x bf16\\[128,256\\]"), 0) << wide.compiled->ir;
  EXPECT_EQ(count(wide.compiled->ir, "local_alloc \\{ws = \"both\"\\} : smem<2 x bf16\\[64,256\\]"), 2)
      << wide.compiled->ir;
  {
    ScopedSetenv ring("FLEXTILE_FORWARD_Q_RING", "1");
    try {
      plan(256, asked);
      ADD_FAILURE() << "Q's ring of two 64 KB slots fitted beside the walks' rings";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::ResourceLimit) << e.what();
    }
  }
  const FlexAttentionPlan narrower = plan(192, FlexAttentionConfig{128, 64, 8, 2});
  EXPECT_GT(narrower.persistentPrograms, 0);
  EXPECT_EQ(count(ir::printFunction(*narrower.traced), "no_ring"), 0);
}

// The last round's split (splitLastRound; FLEXTILE_SPLIT_LAST_ROUND=0 turns it off): the no-mask
// yardstick on the H200's 132 SMs splits (2048 tiles: 15 whole rounds, 68 tiles cut into runs of 33
// steps); a causal mask's tiles do not walk alike, and 2112 tiles fill whole rounds, so neither
// splits; a soft-cap without a mask walks alike, but a score_mod's kernel splits only when asked. The split forward takes no ticket (its merge is a kernel of its own: no atomic and no
// fence in it), walks its pieces in a loop of their own after the tile loop (a second set of full
// and empty barriers); the merge kernel spills nothing, the split forward (overlapped and peeled)
// 152 bytes, its producer's (at 24 registers; none at 32, which ran 2.4 % slower on an H100).
TEST(FlexAttentionCodegen, PersistentForwardSplitsItsLastRoundWhereTilesAreAlike) {
  auto splits = [](int64_t H, const char* name) {
    const int64_t B = 2, L = 8192, D = 128;
    Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
    VariantInstance inst = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {}, true, codegen::Target::sm90a());
    EXPECT_EQ(plan.persistentPrograms, 132) << name;
    const std::string& ir = plan.compiled->ir;
    if (plan.lastRoundSplit) {
      EXPECT_EQ(ir.find("atomic_add"), std::string::npos) << ir;
      EXPECT_EQ(ir.find("fence"), std::string::npos) << ir;
      EXPECT_EQ(count(ir, "mbarrier_init "), 4) << ir;
      EXPECT_TRUE(plan.mergeCompiled) << name;
      if (codegen::findPtxas())
        for (const codegen::CompiledKernel* kernel : {plan.compiled, plan.mergeCompiled}) {
          codegen::PtxasReport r = codegen::runPtxas(kernel->ptx, codegen::Target::sm90a());
          EXPECT_EQ(r.spillStoreBytes, kernel == plan.compiled && std::string(name) == "full" ? 152 : 0) << r.log;
        }
    } else {
      EXPECT_FALSE(plan.mergeCompiled) << name;
    }
    return plan.lastRoundSplit;
  };
  EXPECT_TRUE(splits(16, "full"));
  EXPECT_FALSE(splits(16, "causal"));
  EXPECT_FALSE(splits(33, "full"));
  {
    // A score_mod without a mask: its tiles walk alike, but it splits only when asked.
    Tensor q = Tensor::empty(DType::BF16, {2, 16, 8192, 128}, MemorySpace::Host);
    auto softCapSplits = [&] {
      return plan_flex_attention(q, q, q, soft_cap(20.0), std::nullopt, {}, false, codegen::Target::sm90a())
          .lastRoundSplit;
    };
    EXPECT_FALSE(softCapSplits()) << "a score_mod's split is not timed yet: asked for only";
    ScopedSetenv on("FLEXTILE_SPLIT_LAST_ROUND", "1");
    EXPECT_TRUE(softCapSplits());
  }
  {
    // FLEXTILE_PROGRAMMATIC_LAUNCH=1: the merge waits for the forward (griddepcontrol.wait, so the
    // runtime launches it with programmatic stream serialization); the forward is unchanged.
    ScopedSetenv pdl("FLEXTILE_PROGRAMMATIC_LAUNCH", "1");
    Tensor q = Tensor::empty(DType::BF16, {2, 16, 8192, 128}, MemorySpace::Host);
    auto plan = plan_flex_attention(q, q, q, ScoreMod(), std::nullopt, {}, true, codegen::Target::sm90a());
    ASSERT_TRUE(plan.mergeCompiled);
    EXPECT_NE(plan.mergeCompiled->ptx.find("griddepcontrol.wait"), std::string::npos);
    EXPECT_EQ(plan.compiled->ptx.find("griddepcontrol"), std::string::npos);
  }
  ScopedSetenv off("FLEXTILE_SPLIT_LAST_ROUND", "0");
  EXPECT_FALSE(splits(16, "full"));
}

// Shared rings (opt-in, FLEXTILE_SHARE_RINGS=1) on the specialized 8-warp forward: one set of
// barriers initialized and invalidated once for both walks, each walk's first stage issued after
// its slot's release, stages past a walk's end arriving on nothing, the warpgroups' turns running
// through both walks (one open, one close: no CTA barrier parts them), and the producer meeting the
// consumers at two CTA barriers in all; persistent, the same around the tile loop. No spill.
TEST(FlexAttentionCodegen, SharedRingsSpanTheWalks) {
  ScopedSetenv shared("FLEXTILE_SHARE_RINGS", "1");
  for (const char* persistent : {"0", "1"}) {
    SCOPED_TRACE(std::string("persistent ") + persistent);
    ScopedSetenv tiles("FLEXTILE_FORWARD_PERSISTENT", persistent);
    const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
    EXPECT_EQ(count(k.ir, "mbarrier_init "), 2);
    EXPECT_EQ(count(k.ir, "mbarrier_inval "), 2);
    EXPECT_EQ(count(k.ir, "barrier \\{ws = \"both\"\\}"), 2);
    EXPECT_EQ(count(k.ir, "mbarrier_expect_tx "), count(k.ir, "mbarrier_expect_tx [^\\n]*only_on = 1"));
    EXPECT_EQ(count(k.ir, "mbarrier_expect_tx "), 4) << "a prologue stage and an in-loop stage a walk";
    EXPECT_EQ(count(k.ir, "mbarrier_wait [^\\n]*issuer = 1"), 4) << "each stage waits for its slot's release";
    EXPECT_EQ(count(k.ir, "warpgroup_turn \\{step = \"open\"\\}"), 1);
    EXPECT_EQ(count(k.ir, "warpgroup_turn \\{step = \"close\"\\}"), 1);
    if (codegen::findPtxas()) {
      codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
  }
}

TEST(FlexAttentionCodegen, WarpSpecializedForwardMovesRegistersToTheConsumers) {
  ScopedSetenv specialized("FLEXTILE_WARP_SPECIALIZE", "1");
  ScopedSetenv shared("FLEXTILE_SHARE_RINGS", "1");
  const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
  EXPECT_EQ(k.producerWarps, 4);
  EXPECT_EQ(k.threadsPerProgram(), 384);
  EXPECT_EQ(codegen::warpSpecializeRefusal(*ir::parseFunction(k.ir, "forward"), codegen::Target::sm90a()), "");
  EXPECT_EQ(count(k.ptx, "\\.maxntid 384"), 1);
  EXPECT_EQ(count(k.ptx, "setmaxnreg\\.dec\\.sync\\.aligned\\.u32 24;"), 1);
  EXPECT_EQ(count(k.ptx, "setmaxnreg\\.inc\\.sync\\.aligned\\.u32 240;"), 1);
  // Every issuer op is the producer's: two walks sharing one set of rings (a prologue stage and
  // a loop each, each stage after its slot's release), K and V per stage.
  EXPECT_EQ(count(k.ir, "tma_copy [^\\n]*ws = \"producer\""), count(k.ir, "tma_copy "));
  EXPECT_EQ(count(k.ir, "tma_copy "), 8);
  EXPECT_EQ(count(k.ir, "mbarrier_wait [^\\n]*issuer = 1, ws = \"producer\""), 4);
  // The ring's two CTA barriers (after its init, before its inval) are met by both roles, and
  // nothing parts the walks; the consumers' own barriers are named barrier 3.
  EXPECT_EQ(count(k.ir, "barrier \\{ws = \"both\"\\}"), 2);
  EXPECT_GE(count(k.ptx, "bar\\.sync \t?3, 256;"), 1);
  if (codegen::findPtxas()) {
    codegen::PtxasReport r = codegen::runPtxas(k.ptx, codegen::Target::sm90a());
    EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    EXPECT_EQ(r.registers, 168) << r.log;
  }
  const auto& one = compileFor(codegen::Target::sm90a(), {64, 64, 4, 2});
  EXPECT_EQ(one.producerWarps, 4);
  EXPECT_EQ(count(one.ptx, "\\.maxntid 256"), 1);
  EXPECT_EQ(count(one.ptx, "setmaxnreg"), 0);
  EXPECT_EQ(compileFor(codegen::Target::sm80(), {64, 64, 4, 2}).producerWarps, 0);
  TmaScope cpAsync("0");
  EXPECT_EQ(compileFor(codegen::Target::sm90a(), {128, 128, 8, 2}).producerWarps, 0);
}

// By default the specialized 8-warp forward whose mods gather nothing (ALiBi, soft-cap, causal,
// no mask)
// has its two consumer warpgroups take turns issuing products (pass "pingpong"; ALiBi 410 -> 444
// TFLOP/s on the H200); with a mod that gathers per key (document) it does not.
// FLEXTILE_PINGPONG unset, empty or "auto": that rule; =0: no turns anywhere.
TEST(FlexAttentionCodegen, ModsWithoutGathersTakeWarpgroupTurns) {
  const auto target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  for (const char* name : {"alibi", "softcap", "causal", "full", "document"}) {
    SCOPED_TRACE(name);
    VariantInstance inst = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    const FlexAttentionConfig config{128, 128, 8, 2, WarpSpecialization::On};
    const bool turns = std::string(name) != "document";
    for (const char* rule : {"auto", ""}) {
      ScopedSetenv setting("FLEXTILE_PINGPONG", rule);
      auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, target);
      EXPECT_EQ(count(plan.compiled->ir, "warpgroup_turn") > 0, turns) << plan.compiled->name << " '" << rule << "'";
      EXPECT_EQ(plan.compiled->producerWarps, 4);
    }
    {
      ScopedSetenv setting("FLEXTILE_PINGPONG", "0");
      auto plain = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, target);
      EXPECT_EQ(count(plain.compiled->ir, "warpgroup_turn"), 0) << "FLEXTILE_PINGPONG=0";
    }
    FlexAttentionConfig off = config;
    off.turns = LoopSchedule::Off;
    auto plain = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = off}, true, target);
    EXPECT_EQ(count(plain.compiled->ir, "warpgroup_turn"), 0) << "config no-turns";
  }
}

// The forward asks for hoist-invariant-loads and prefetch-loads: ALiBi's slope of the head is
// read before the walks, and the document ids of a step's keys are read a step early (a second
// read of them before each walk, the step's own carried into the next), off the chain from the
// block index (document +3 %, ALiBi +1.5 % on the H200, 2026-12-04).
// FLEXTILE_HOIST_INVARIANT_LOADS=0 / FLEXTILE_PREFETCH_LOADS=0 leave them in the walks.
TEST(FlexAttentionCodegen, ModReadsLeaveTheStepsCriticalPath) {
  const auto target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  const FlexAttentionConfig config{128, 128, 8, 2};
  auto irOf = [&](const char* name) {
    VariantInstance inst = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    return plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, target).compiled->ir;
  };
  auto slopeReadBeforeFirstLoop = [](const std::string& ir) {
    const size_t slope = ir.find("addptr %alibi_slopes"), loop = ir.find(" for ");
    return slope != std::string::npos && loop != std::string::npos && slope < loop;
  };
  const std::string alibi = irOf("alibi"), document = irOf("document");
  EXPECT_TRUE(slopeReadBeforeFirstLoop(alibi));
  const int idReads = count(document, "= load [^\\n]*: i32\\[1,128\\]");
  {
    ScopedSetenv off("FLEXTILE_HOIST_INVARIANT_LOADS", "0");
    EXPECT_FALSE(slopeReadBeforeFirstLoop(irOf("alibi")));
  }
  ScopedSetenv off("FLEXTILE_PREFETCH_LOADS", "0");
  const int plainIdReads = count(irOf("document"), "= load [^\\n]*: i32\\[1,128\\]");
  EXPECT_GE(plainIdReads, 1);
  EXPECT_GT(idReads, plainIdReads) << "the ids of the first step are read before the walk";
}

// Regression: warp-specialize hoisted the rings' barriers in the order of their addresses on the
// heap (a std::set of pointers), so the kernel's barrier layout changed with unrelated allocations
// (a pass that allocated a little more upstream swapped the two walks' barriers). They are hoisted
// in the program order of their first copies: the first walk's `full` barrier is the first one
// initialized.
TEST(FlexAttentionCodegen, RingBarriersAreHoistedInProgramOrder) {
  for (const char* name : {"causal", "alibi", "document"}) {
    SCOPED_TRACE(name);
    const int64_t B = 1, H = 2, L = 1024, D = 128;
    Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
    VariantInstance inst = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    const FlexAttentionConfig config{128, 128, 8, 2, WarpSpecialization::On};
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, codegen::Target::sm90a());
    const std::string& ir = plan.compiled->ir;
    std::smatch init, expect;
    ASSERT_TRUE(std::regex_search(ir, init, std::regex("mbarrier_init (%[0-9]+) \\{arrivals = 1")));
    ASSERT_TRUE(std::regex_search(ir, expect, std::regex("mbarrier_expect_tx (%[0-9]+),")));
    EXPECT_EQ(init[1], expect[1]) << "the first walk's copies complete on the first full barrier";
  }
}

// The forward asks fold-scales for invariant terms (fold_invariant_terms = 1): ALiBi's key positions,
// f32(start) + f32(arange) after regroup-sums, are scaled by the slope as a scalar product plus a
// loop-invariant [BN] one, so no [1, BN] product is left in the walks (LLVM hoists the invariant
// one: 32 multiplies a thread a step fewer). FLEXTILE_FOLD_INVARIANT_TERMS=0 leaves the product.
TEST(FlexAttentionCodegen, KeyPositionsAreScaledOutsideTheWalks) {
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  VariantInstance inst = variant("alibi").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  auto positionProducts = [&] {
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = FlexAttentionConfig{128, 128, 8, 2}}, true,
                                    codegen::Target::sm90a());
    return count(plan.compiled->ir, "= mul [^\\n]*: f32\\[1,128\\]");
  };
  EXPECT_EQ(positionProducts(), 0);
  ScopedSetenv off("FLEXTILE_FOLD_INVARIANT_TERMS", "0");
  EXPECT_GE(positionProducts(), 2) << "one per walk";
}

// The epilogue normalizes O by one reciprocal per row and a product per element: a correctly
// rounded division per element (div.rn.f32, a dozen instructions and a slow path each) cost a
// thread 64 of them at 128 x 128 on 8 warps, once per program, where a short row (document,
// window) runs only a few steps.
TEST(FlexAttentionCodegen, TheEpilogueDividesOncePerRow) {
  const auto& k = compileFor(codegen::Target::sm90a(), {128, 128, 8, 2});
  EXPECT_EQ(count(k.ptx, "div\\.rn\\.f32"), 0);
  EXPECT_EQ(count(k.ptx, "rcp\\.rn\\.f32"), 2) << "two rows a thread";
}

// fold-scales (ir/passes/FoldScales.cpp) on the forward of ALiBi: the scale, the slope and log2 e
// meet as scalars and the positions are scaled as [1, BN] and [BM, 1] tiles, so each score costs
// fewer full-tile ops (f32 mul, fma, add and sub in the PTX at 128 x 128: 908 -> 659);
// FLEXTILE_FOLD_SCALES=0 leaves them. The result is checked against float64 by the GPU and
// interpreted-after-passes tests of every variant.
TEST(FlexAttentionCodegen, ScoreModFactorsFoldIntoTheScale) {
  const auto target = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  VariantInstance inst = variant("alibi").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  FlexAttentionConfig config{128, 128, 8, 2};
  config.skew = LoopSchedule::Off;  // two walks, one score computation each (a peeled walk has two)
  const std::string fullTile = "f32\\[128,128\\]";
  auto tileOps = [&](const std::string& ir, const char* op) { return count(ir, std::string("= ") + op + " %[^\\n]*: " + fullTile); };
  std::string folded, plain;
  {
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, target);
    folded = plan.compiled->ir;
  }
  {
    ScopedSetenv off("FLEXTILE_FOLD_SCALES", "0");
    auto plan = plan_flex_attention(q, q, q, inst.score, inst.mask, {.config = config}, true, target);
    plain = plan.compiled->ir;
  }
  // Per loop (full and partial blocks): the mul by log2 e and the slope's full-tile mul are gone.
  EXPECT_EQ(tileOps(plain, "mul") - tileOps(folded, "mul"), 2 * 2) << folded;
  // (The kv positions' row is scaled as a scalar and a loop-invariant product: KeyPositionsAreScaledOutsideTheWalks.)
  EXPECT_EQ(count(plain, "mul %[^\\n]*: f32\\[1,128\\]"), 0) << "without fold-scales nothing is scaled as a row";
  EXPECT_EQ(count(folded, "mul %[^\\n]*: f32\\[128,1\\]"), 2) << "query positions scaled as a column";
}

// The loop schedules a config can ask for: turns (pass "pingpong") and deferred accumulation reach
// the kernel as function attributes and change its loop; Auto leaves both off (without the
// environment's switches); turns on 4 warps, defer with persistent programs, and defer or
// persistent programs in the backward are refused by name.
TEST(FlexAttentionCodegen, ConfigsChooseTheForwardLoopSchedule) {
  const auto sm90a = codegen::Target::sm90a();
  const int64_t B = 1, H = 2, L = 1024, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  VariantInstance alibi = variant("alibi").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
  auto planFor = [&](FlexAttentionConfig c) {
    return plan_flex_attention(q, q, q, alibi.score, alibi.mask, {.config = c}, true, sm90a);
  };
  FlexAttentionConfig base{128, 128, 8, 2, WarpSpecialization::On};
  base.turns = LoopSchedule::Off;  // ALiBi's Auto is turns (ScoreArithmeticTakesWarpgroupTurns)
  auto plain = planFor(base);
  EXPECT_EQ(plain.compiled->ir.find("warpgroup_turn"), std::string::npos);
  EXPECT_EQ(plain.compiled->ir.find("pending = 1"), std::string::npos) << "no product left in flight across steps";

  FlexAttentionConfig turns = base;
  turns.turns = LoopSchedule::On;
  auto withTurns = planFor(turns);
  EXPECT_NE(withTurns.compiled->ir.find("pingpong = 1"), std::string::npos);
  EXPECT_NE(withTurns.compiled->ir.find("warpgroup_turn"), std::string::npos);

  FlexAttentionConfig defer = base;
  defer.defer = LoopSchedule::On;
  auto deferred = planFor(defer);
  EXPECT_NE(deferred.compiled->ir.find("defer_accumulation = 1"), std::string::npos);
  EXPECT_NE(deferred.compiled->ir.find("pending = 1"), std::string::npos) << "P·V of the last step stays in flight";
  EXPECT_NE(plain.compiled, deferred.compiled) << "the schedule is part of the compiled kernel's key";

  FlexAttentionConfig narrow{64, 64, 4, 2};
  narrow.turns = LoopSchedule::On;
  expectError([&] { planFor(narrow); }, {"turns need two consumer warpgroups (8 warps), not 4"});
  // Deferred accumulation in persistent programs: racecheck reported hazards on the H200
  // (2026-12-04), so a config asking for both is refused by name, and the rule gives a deferred
  // kernel a program per tile.
  FlexAttentionConfig both = defer;
  both.persistent = LoopSchedule::On;
  expectError([&] { planFor(both); }, {"defer and persistent together"});
  FlexAttentionConfig deferSkew = defer;
  deferSkew.skew = LoopSchedule::On;
  expectError([&] { planFor(deferSkew); }, {"defer and skew together"});
  FlexAttentionConfig deferOverlap = defer;
  deferOverlap.overlap = LoopSchedule::On;
  expectError([&] { planFor(deferOverlap); }, {"defer and overlap together"});
  FlexAttentionConfig overlapped = base;  // overlap implies skew
  overlapped.overlap = LoopSchedule::On;
  EXPECT_NE(planFor(overlapped).compiled->ir.find("pending = 1"), std::string::npos)
      << "the softmax waits for its scores with the previous P·V in flight";
  FlexAttentionConfig overlapUnskewed = base;
  overlapUnskewed.skew = LoopSchedule::Off;
  overlapUnskewed.overlap = LoopSchedule::On;
  expectError([&] { planFor(overlapUnskewed); }, {"asks for overlap without skew"});
  {
    VariantInstance causal = variant("causal").make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
    auto persistentFor = [&](FlexAttentionConfig c) {
      const std::string& ir =
          plan_flex_attention(q, q, q, causal.score, causal.mask, {.config = c}, true, sm90a).compiled->ir;
      return ir.find("%tiles", ir.find('{', ir.find("func @"))) != std::string::npos;
    };
    FlexAttentionConfig causalDefault{128, 128, 8, 2}, causalDeferred{128, 128, 8, 2};
    causalDeferred.defer = LoopSchedule::On;
    EXPECT_TRUE(persistentFor(causalDefault)) << "the rule's persistent programs";
    EXPECT_FALSE(persistentFor(causalDeferred)) << "deferred: a program per tile";
    ScopedSetenv deferAll("FLEXTILE_DEFER_ACCUMULATION", "1");
    EXPECT_FALSE(persistentFor(causalDefault)) << "deferred by the environment: a program per tile";
  }
  Tensor lse = Tensor::empty(DType::F32, {B, H, L}, MemorySpace::Host);
  expectError(
      [&] {
        plan_flex_attention_backward(q, q, q, q, lse, q, alibi.score, alibi.mask,
                                     {.config = FlexAttentionBackwardConfig{defer, {64, 64, 4, 2}}}, sm90a);
      },
      {"dkdv config BM128 BN128 w8 s2 ws no-turns defer: defer is a schedule of the forward's loop"});
  FlexAttentionConfig persistentDq{128, 64, 8, 2};
  persistentDq.persistent = LoopSchedule::On;
  expectError(
      [&] {
        plan_flex_attention_backward(q, q, q, q, lse, q, alibi.score, alibi.mask,
                                     {.config = FlexAttentionBackwardConfig{{64, 128, 8, 2}, persistentDq}}, sm90a);
      },
      {"dq config BM128 BN64 w8 s2 persistent: persistent programs are a schedule of the forward"});
  FlexAttentionConfig skewedDkdv{64, 128, 8, 2};
  skewedDkdv.skew = LoopSchedule::On;
  expectError(
      [&] {
        plan_flex_attention_backward(q, q, q, q, lse, q, alibi.score, alibi.mask,
                                     {.config = FlexAttentionBackwardConfig{skewedDkdv, {128, 64, 8, 2}}}, sm90a);
      },
      {"dkdv config BM64 BN128 w8 s2 skew: skew and overlap are schedules of the forward's walks"});
}

// The skewed walks (FlexAttentionConfig::skew: the full walks; FLEXTILE_SKEW=all: every walk) on
// the H200's default tile: a skewed walk is three loops — Q·K_lo alone, the steps, P·V_{hi−1}
// alone — whose middle one issues P·V and then Q·Kᵀ in one warpgroup turn and waits once for both
// before it releases the stage (an unskewed walk waits twice, for S and then at the yield); skewed
// and unskewed walks still share one ring (its barriers initialized once), and the kernel compiles
// for the no-mask and causal variants with no spill but its producer's (the persistent programs'
// producer, at 24 registers, spills 52-56 bytes of the walks' state, as clang or gcc built the
// library; none at 32) and no serialized wgmma. A different kernel, so a different cache key.
TEST(FlexAttentionCodegen, SkewedWalksIssueBothProductsInOneTurn) {
  const auto sm90a = codegen::Target::sm90a();
  const int64_t B = 2, H = 16, L = 8192, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  ScopedSetenv whole("FLEXTILE_SPLIT_LAST_ROUND", "0");
  for (const char* mode : {"config", "all"})
    for (const char* name : {"full", "causal"}) {
      SCOPED_TRACE(std::string(name) + ", skew " + mode);
      const bool every = mode == std::string("all");
      VariantInstance v = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
      FlexAttentionConfig c{128, 128, 8, 2}, skewed{128, 128, 8, 2};
      c.skew = LoopSchedule::Off;
      skewed.skew = LoopSchedule::On;
      skewed.overlap = LoopSchedule::Off;  // the plain skew's order (the overlapped one is the default)
      ScopedSetenv asked("FLEXTILE_SKEW", every ? "all" : "");
      auto skew = plan_flex_attention(q, q, q, v.score, v.mask, {.config = skewed}, true, sm90a);
      ScopedSetenv off("FLEXTILE_SKEW", "0");
      auto plain = plan_flex_attention(q, q, q, v.score, v.mask, {.config = c}, true, sm90a);
      EXPECT_NE(plain.compiled, skew.compiled);
      const std::string& ir = skew.compiled->ir;
      // Each loop's turn: its products between turn begin and end; the products of the turns in
      // order, 1 2 1 for a skewed walk (then one wait for both of the middle one's), 1 for an
      // unskewed walk (P·V after the turn).
      std::string turns;
      for (size_t at = ir.find("warpgroup_turn {step = \"begin\"}"); at != std::string::npos;
           at = ir.find("warpgroup_turn {step = \"begin\"}", at + 1)) {
        const size_t end = ir.find("warpgroup_turn {step = \"end\"}", at);
        ASSERT_NE(end, std::string::npos);
        const int products = count(ir.substr(at, end - at), "= dot [^\\n]*async = 1");
        turns += std::to_string(products);
        if (products != 2) continue;
        const size_t wait = ir.find("wgmma_wait", end), yield = ir.find("yield", end);
        EXPECT_LT(wait, yield);
        EXPECT_EQ(count(ir.substr(wait, yield - wait), "wgmma_wait"), 1) << "one wait for both";
      }
      const bool causal = std::string(name) == "causal";
      // The full walk, and causal's partial one; the config skews the full walk, =all both.
      EXPECT_EQ(turns, !causal ? "121" : every ? "121121" : "1211");
      const int walks = causal ? 2 : 1, skewedWalks = causal && !every ? 1 : walks;
      EXPECT_EQ(count(ir, "wgmma_wait "), 3 * skewedWalks + 2 * (walks - skewedWalks));
      EXPECT_EQ(count(plain.compiled->ir, "wgmma_wait "), 2 * walks) << "unskewed: S, then at the yield";
      EXPECT_EQ(count(ir, "mbarrier_init "), 2) << "one ring for all the walks' loops";
      if (assemblesInThisBuild()) {
        ScopedSetenv again("FLEXTILE_SKEW", every ? "all" : "");
        const codegen::PtxasReport r = expectOnlyTheProducerSpills(
            [&] { return plan_flex_attention(q, q, q, v.score, v.mask, {.config = skewed}, true, sm90a).compiled; }, 64);
        // ptxas keeps the wgmmas overlapped (no C7515). A predicated wgmma (or a branch around
        // one) made ptxas serialize every wgmma of the kernel.
        EXPECT_EQ(r.log.find("serialized"), std::string::npos) << r.log;
      }
    }
}

// The row sum after P·V (detail::sumAfterProductWanted): on wgmma its adds and shuffles follow
// the product's issue instead of delaying it. In the PTX of the walk: between the first Q·Kᵀ and
// the first P·V, the row max's four shuffles only, not also the sum's. By default without a
// score_mod; ALiBi (a score_mod) keeps the sum first; FLEXTILE_SUM_AFTER_PRODUCT forces either.
// The results are those of the reference (the order changes no value).
TEST(FlexAttentionCodegen, TheRowSumFollowsTheProductWithoutAScoreMod) {
  auto shufflesBeforeTheFirstPv = [](const std::string& ptx) {
    size_t at = 0;
    std::vector<size_t> wgmma;
    while ((at = ptx.find("wgmma.mma_async", at)) != std::string::npos) wgmma.push_back(at++);
    if (wgmma.size() < 9) return -1;  // 8 k-steps of Q·Kᵀ, then P·V's
    int n = 0;
    for (size_t p = ptx.find("shfl.sync", wgmma[0]); p != std::string::npos && p < wgmma[8]; p = ptx.find("shfl.sync", p + 1))
      ++n;
    return n;
  };
  const auto sm90a = codegen::Target::sm90a();
  EXPECT_EQ(shufflesBeforeTheFirstPv(compileFor(sm90a, {128, 128, 8, 2}).ptx), 4) << "the max's: two rows a thread, two shuffles each";
  {
    Tensor q = Tensor::empty(DType::BF16, {2, 16, 1024, 128}, MemorySpace::Host);
    VariantInstance v = variant("alibi").make({2, 16, 1024, 1024, MemorySpace::Host, BlockSizes{}, 1});
    FlexAttentionConfig c{128, 128, 8, 2};
    c.persistent = LoopSchedule::Off;
    c.overlap = LoopSchedule::Off;
    EXPECT_EQ(shufflesBeforeTheFirstPv(plan_flex_attention(q, q, q, v.score, v.mask, {.config = c}, true, sm90a).compiled->ptx), 8)
        << "a score_mod's kernel: the max's and the sum's";
  }
  ScopedSetenv before("FLEXTILE_SUM_AFTER_PRODUCT", "0");
  // Read when a kernel is traced: another head dim is another trace of the cached kernel.
  EXPECT_EQ(shufflesBeforeTheFirstPv(compileFor(sm90a, {128, 128, 8, 2}, 64).ptx), 8);
  flextile::testing::SeededRandom rng;
  for (const char* order : {"0", "1"}) {
    ScopedSetenv forced("FLEXTILE_SUM_AFTER_PRODUCT", order);
    flextile::testing::AttentionCase c{.B = 1, .Hq = 2, .Hkv = 2, .L = 70, .S = 90, .D = 64, .dtype = DType::BF16,
                                       .context = std::string("sum after P·V: ") + order};
    BlockMask m = causalBlockMask(1, 1, c.L, c.S, {32, 32}, MemorySpace::Host);
    EXPECT_TRUE(flextile::testing::checkFlexAttention(rng, c, MemorySpace::Host, noop_score(), m, nullptr,
                                                      flextile::testing::refCausal(), {.config = FlexAttentionConfig{32, 32, 4, 2}}));
  }
}

// The seven yardstick variants at the H200's shape, as the forward compiles them unskewed, with
// skewed walks and with skewed walks overlapped (FLEXTILE_SKEW_OVERLAP=1, the default where the
// turns are), peeled (no phantom product, and no predicate or branch in a group): ptxas (offline)
// keeps every kernel's wgmma groups overlapped — no C7515 "wgmma.mma_async instructions are
// serialized" (which a predicated wgmma, or a register another instruction defines between a
// group's fence and its wait, would cause) — and spills only what the table says.
TEST(FlexAttentionCodegen, YardstickKernelsKeepTheirWgmmaGroupsOverlapped) {
  const bool assemble = assemblesInThisBuild();
  const auto sm90a = codegen::Target::sm90a();
  const int64_t B = 2, H = 16, L = 8192, D = 128;
  Tensor q = Tensor::empty(DType::BF16, {B, H, L, D}, MemorySpace::Host);
  const flextile::testing::SeededRandom rng;
  size_t skewIndex = 0;
  for (const char* skew : {"0", "1", "overlap"}) {
    // Under the sanitizers (no ptxas: the kernels are only planned) one schedule of the three a run.
    if (!flextile::testing::runsInThisBuild(rng.seed(), skewIndex++, 3)) continue;
    for (const char* name : {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"}) {
      SCOPED_TRACE(std::string(name) + ", skew " + skew);
      const bool skewed = std::string(skew) != "0", overlap = std::string(skew) == "overlap";
      ScopedSetenv skewSwitch("FLEXTILE_SKEW", skewed ? "1" : "0");
      ScopedSetenv overlapSwitch("FLEXTILE_SKEW_OVERLAP", overlap ? "1" : "0");
      VariantInstance v = variant(name).make({B, H, L, L, MemorySpace::Host, BlockSizes{}, 1});
      auto plan = plan_flex_attention(q, q, q, v.score, v.mask, {}, true, sm90a);
      if (!assemble) continue;
      codegen::PtxasReport r = codegen::runPtxas(plan.compiled->ptx, sm90a);
      EXPECT_EQ(r.log.find("serialized"), std::string::npos) << r.log;
      // Skewed: the persistent kernels' producer, at 24 registers, carries the peeled walks'
      // bounds and ring state from tile to tile and spills 52 bytes (152 where the no-mask kernel
      // splits its last round; at 32 registers none, but the consumers' 240 registers ran faster,
      // H100 2026-12-05); overlapped ALiBi (a program per tile) spills 28 bytes (44 unpeeled).
      const std::map<std::string, int64_t> skewedSpills = {
          {"full", 152},     {"causal", 52},  {"sliding_window", 52}, {"document", 0},
          {"prefix_lm", 52}, {"alibi", overlap ? 28 : 0}, {"softcap", 52}};
      // Overlapped: the softmax waits for its scores with the previous step's P·V still in flight.
      if (overlap) {
        EXPECT_GE(count(plan.compiled->ptx, "wgmma\\.wait_group\\.sync\\.aligned 1;"), 1);
      }
      EXPECT_EQ(r.spillStoreBytes, skewed ? skewedSpills.at(name) : 0) << r.log;
    }
  }
}

// The skewed walks as the forward compiles them by default (overlapped, peeled): three loops a
// full walk on one set of rings, in a persistent program (causal) and in a program per tile
// (ALiBi) alike; the producer keeps the default 24 registers either way.
TEST(FlexAttentionCodegen, SkewedWalksShareTheirRingsAndKeepTheProducerAt24) {
  auto producerRegisters = [](const std::string& ptx) {
    std::smatch m;
    return std::regex_search(ptx, m, std::regex("setmaxnreg\\.dec\\.sync\\.aligned\\.u32 ([0-9]+);")) ? std::stoi(m[1]) : 0;
  };
  auto loops = [](const std::string& ir) { return count(ir, " = for "); };
  std::optional<ScopedSetenv> unskewed(std::in_place, "FLEXTILE_SKEW", "0");
  const KernelText causalBefore = yardstickKernel("causal"), alibiBefore = yardstickKernel("alibi");
  unskewed.reset();
  const KernelText causal = yardstickKernel("causal"), alibi = yardstickKernel("alibi");
  EXPECT_EQ(producerRegisters(causal.ptx), 24);
  EXPECT_EQ(producerRegisters(alibi.ptx), 24);
  EXPECT_EQ(loops(causal.ir), loops(causalBefore.ir) + 2) << "the full walk's prologue and epilogue loops";
  EXPECT_EQ(loops(alibi.ir), loops(alibiBefore.ir) + 2);
  for (const KernelText* k : {&causal, &alibi}) {
    EXPECT_EQ(count(k->ir, "mbarrier_inval"), 2) << "one set of rings: its full and empty barriers";
    EXPECT_NE(k->ir.find("share_rings = 1"), std::string::npos);
  }
}

// The tiles handed out heaviest first (FLEXTILE_TILE_ORDER=1): the kernel takes the order as a
// parameter after its own (before the mods' captured tensors) and reads each tile from it, a program per tile (document) and
// persistent (causal) alike; the default kernels have no such parameter. No mask with a split
// last round deals its tiles its own way and takes no order.
TEST(FlexAttentionCodegen, TheTileOrderIsAParameterOnlyWhenAskedFor) {
  for (const char* name : {"document", "causal", "full"})
    EXPECT_EQ(yardstickKernel(name).ir.find("%tile_order"), std::string::npos) << name;
  ScopedSetenv ordered("FLEXTILE_TILE_ORDER", "1");
  for (const char* name : {"document", "causal"}) {
    const std::string ir = yardstickKernel(name).ir;
    EXPECT_NE(ir.find("%tile_order: ptr<i32>"), std::string::npos) << name;
    EXPECT_NE(ir.find("addptr %tile_order"), std::string::npos) << name;
  }
  EXPECT_EQ(yardstickKernel("full").ir.find("%tile_order"), std::string::npos);
}

// exp2's ftz form (codegen::exp2FlushesSubnormals) everywhere but where the warpgroups take turns
// on unoverlapped walks (ftz measured 2-4 % slower there): at the H200's shape every default
// forward takes ex2.approx.ftz.f32 (the turns' walks are overlapped, the window's short ones too,
// the document mask has no turns); a config with the turns and `no-overlap` keeps ex2.approx.f32,
// one without turns not.
TEST(FlexAttentionCodegen, Exp2FlushesSubnormalsExceptOnUnoverlappedTurns) {
  auto ftz = [&](const char* name, std::optional<FlexAttentionConfig> config = std::nullopt) {
    const std::string ptx = yardstickKernel(name, config).ptx;
    EXPECT_NE(ptx.find("ex2.approx"), std::string::npos) << name;
    return ptx.find("ex2.approx.ftz.f32") != std::string::npos;
  };
  for (const char* name : {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"})
    EXPECT_TRUE(ftz(name)) << name;
  FlexAttentionConfig noOverlap{128, 128, 8, 2}, noTurns{128, 128, 8, 2};
  noOverlap.overlap = LoopSchedule::Off;
  noTurns.turns = LoopSchedule::Off;
  EXPECT_FALSE(ftz("causal", noOverlap));
  EXPECT_FALSE(ftz("alibi", noOverlap));
  EXPECT_TRUE(ftz("causal", noTurns));
  ScopedSetenv forced("FLEXTILE_EXP2_FTZ", "1");
  EXPECT_TRUE(ftz("prefix_lm", noOverlap));
}

// The rule for overlapped skewed walks (FlexAttentionConfig::overlap Auto): where the warpgroups
// take turns (H200, 2026-12-05, with exp2's ftz form: no mask +2 %, causal +3.5 %, prefix LM
// +2.5 %, ALiBi +0.6 %, soft-cap +2.5 % at 64 steps), short walks too (the window's 10 steps, a
// causal mask over 1024 keys: the peeled walks waste no step; H100, window +1.3 to +2.3 %); the
// document mask, which takes no turns, walks unskewed. The config's `no-overlap` or `no-skew`,
// FLEXTILE_SKEW_OVERLAP=0 and FLEXTILE_PINGPONG=0 turn it off.
TEST(FlexAttentionCodegen, OverlapRuleFollowsTheTurns) {
  auto overlapped = [&](const char* name, std::optional<FlexAttentionConfig> config = std::nullopt) {
    return yardstickKernel(name, config).ir.find("pending = 1") != std::string::npos;
  };
  for (const char* name : {"full", "causal", "sliding_window", "prefix_lm", "alibi", "softcap"})
    EXPECT_TRUE(overlapped(name)) << name;
  EXPECT_FALSE(overlapped("document"));
  {
    Tensor q = Tensor::empty(DType::BF16, {1, 16, 1024, 128}, MemorySpace::Host);
    VariantInstance v = variant("causal").make({1, 16, 1024, 1024, MemorySpace::Host, BlockSizes{}, 1});
    auto shortCausal = [&](std::optional<FlexAttentionConfig> c) {
      return plan_flex_attention(q, q, q, v.score, v.mask, {.config = c}, true, codegen::Target::sm90a())
                 .compiled->ir.find("pending = 1") != std::string::npos;
    };
    FlexAttentionConfig asked{128, 128, 8, 2};
    asked.overlap = LoopSchedule::On;
    EXPECT_TRUE(shortCausal(FlexAttentionConfig{128, 128, 8, 2})) << "8 steps";
    EXPECT_TRUE(shortCausal(asked));
  }
  FlexAttentionConfig noOverlap{128, 128, 8, 2}, noSkew{128, 128, 8, 2};
  noOverlap.overlap = LoopSchedule::Off;
  noSkew.skew = LoopSchedule::Off;
  EXPECT_FALSE(overlapped("softcap", noOverlap));
  EXPECT_FALSE(overlapped("full", noSkew));
  {
    ScopedSetenv off("FLEXTILE_SKEW_OVERLAP", "0");
    EXPECT_FALSE(overlapped("causal"));
  }
  ScopedSetenv noTurns("FLEXTILE_PINGPONG", "0");
  EXPECT_FALSE(overlapped("prefix_lm"));
}

namespace {

// Whether `user` (or an op inside its regions) reads a result of `def`.
bool reads(const ir::Op& user, const ir::Op& def) {
  for (const ir::Value* v : user.operands())
    if (v->definingOp() == &def) return true;
  for (const auto& region : user.regions())
    for (const auto& inner : region->ops())
      if (reads(*inner, def)) return true;
  return false;
}

// Another order a compiler could have traced `f` in: random swaps of neighbours that do not
// depend on each other, never two ops with effects or products, never a load and such an op (a
// load stays between the same ones), never the terminator.
void traceInAnotherOrder(ir::Block& b, std::mt19937_64& rng) {
  auto effects = [](const ir::Op& op) {
    return (!op.hasTrait(ir::kPure) && op.kind() != ir::OpKind::Load) || op.kind() == ir::OpKind::Dot ||
           op.kind() == ir::OpKind::Reduce;
  };
  for (auto& op : b.ops())
    for (auto& region : op->regions()) traceInAnotherOrder(*region, rng);
  std::vector<std::unique_ptr<ir::Op>*> ops;
  for (auto& op : b.ops()) ops.push_back(&op);
  if (ops.size() < 3) return;
  for (size_t round = 0; round < 20 * ops.size(); ++round) {
    const size_t i = size_t(rng() % (ops.size() - 2));  // the last op (the terminator) stays
    ir::Op& x = **ops[i];
    ir::Op& y = **ops[i + 1];
    if (reads(y, x) || (effects(x) && effects(y))) continue;
    if ((x.kind() == ir::OpKind::Load && effects(y)) || (y.kind() == ir::OpKind::Load && effects(x))) continue;
    std::swap(*ops[i], *ops[i + 1]);  // the unique_ptrs trade places in the list
  }
}

}  // namespace

// ir/passes/CanonicalOrder.cpp (FLEXTILE_CANONICAL_ORDER=1): the order a compiler evaluates a
// template's operands in no longer shows in the IR. Each yardstick forward's and the decode's
// traced IR, reordered at random as another compiler could have traced it (pure ops and loads
// moved past what they do not depend on), comes out of the pass exactly as the original does.
TEST(FlexAttentionCodegen, TheCanonicalOrderDoesNotDependOnTheTracedOrder) {
  std::mt19937_64 rng(20261205);
  const auto sm90a = codegen::Target::sm90a();
  Tensor q = Tensor::empty(DType::BF16, {2, 16, 1000, 128}, MemorySpace::Host);
  Tensor q1 = Tensor::empty(DType::BF16, {2, 16, 1, 128}, MemorySpace::Host);
  Tensor kv = Tensor::empty(DType::BF16, {2, 4, 1000, 128}, MemorySpace::Host);
  for (const char* name : {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"}) {
    SCOPED_TRACE(name);
    VariantInstance v = variant(name).make({2, 16, 1000, 1000, MemorySpace::Host, BlockSizes{}, 1});
    const ir::Function* forward = plan_flex_attention(q, kv, kv, v.score, v.mask, {}, false, sm90a).traced;
    VariantInstance d = variant(name).make({2, 16, 1000, 1000, MemorySpace::Host, BlockSizes{}, 1});
    FlexAttentionOptions at;
    if (d.mask && d.mask->qLen() > 1) at.query_offset = 999;  // a mask for every query: the last one's row
    const ir::Function* decode = plan_flex_decode(q1, kv, kv, d.score, d.mask, at, sm90a).traced;
    for (const ir::Function* traced : {forward, decode}) {
      ASSERT_NE(traced, nullptr);
      std::unique_ptr<ir::Function> canonical = traced->clone();
      ir::canonicalOrder(*canonical);
      ASSERT_NO_THROW(ir::verify(*canonical));
      const std::string want = ir::printFunction(*canonical);
      for (int trial = 0; trial < 3; ++trial) {
        std::unique_ptr<ir::Function> other = traced->clone();
        traceInAnotherOrder(other->body(), rng);
        ASSERT_NO_THROW(ir::verify(*other));
        EXPECT_NE(ir::printFunction(*other), ir::printFunction(*traced)) << "the shuffle moved nothing";
        ir::canonicalOrder(*other);
        EXPECT_EQ(ir::printFunction(*other), want) << "trial " << trial;
      }
    }
  }
}
