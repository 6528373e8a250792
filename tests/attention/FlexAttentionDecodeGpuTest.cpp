// The decode template on the GPU against the float64 reference and the prefill template: every
// variant at the decode shapes (L 1, 2, 5, 16; GQA 1:1, 4:1, 8:1, MQA; KV lengths 1, 127, 128,
// 129, 4097 with the default 128-blocks), one split and many, and a serving-like sequence of steps.
// Budget (gpu/TestBudget.h, docs/testing.md): every shape and variant runs each time, with a
// random sample of the split counts (each a kernel to build; all with FLEXTILE_GPU_TESTS_FULL=1).
#include <gtest/gtest.h>

#include "FlexAttentionDecodeCheck.h"
#include "ListTensorMaskCheck.h"
#include "MaskTestUtil.h"
#include "gpu/GpuTest.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"

#include <chrono>
#include <cstdio>

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
constexpr MemorySpace kDevice = MemorySpace::Device;
const DecodeCheck kDefaultBlocks{.splits = {0, 1, 5}, .blocks = {128, 128}, .prefillConfig = {64, 64, 4, 2}};

}  // namespace

// One test per variant (FlexDecodeGpuVariant/AtTheDecodeShapes/<variant>), so that gtest's shards
// (scripts/gpu_run.sh) share the 100 s this takes for all seven.
class FlexDecodeGpuVariant : public ::testing::TestWithParam<std::string> {};

TEST_P(FlexDecodeGpuVariant, AtTheDecodeShapes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& v = variant(GetParam());
  const std::vector<AttentionCase> cases = {
      {.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 1, .D = 128, .dtype = DType::BF16},
      {.B = 2, .Hq = 8, .Hkv = 2, .L = 2, .S = 127, .D = 64, .dtype = DType::F16},
      {.B = 1, .Hq = 8, .Hkv = 1, .L = 5, .S = 128, .D = 128, .dtype = DType::BF16},
      {.B = 2, .Hq = 4, .Hkv = 4, .L = 16, .S = 129, .D = 64, .dtype = DType::BF16},
      {.B = 2, .Hq = 16, .Hkv = 2, .L = 1, .S = 4097, .D = 128, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 1, .L = 16, .S = 4097, .D = 64, .dtype = DType::F16},
      {.B = 1, .Hq = 4, .Hkv = 2, .L = 3, .S = 300, .D = 256, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 4, .L = 2, .S = 300, .D = 64, .dtype = DType::F32},
      {.B = 2, .Hq = 10, .Hkv = 2, .L = 3, .S = 1000, .D = 80, .dtype = DType::F16},  // D padded, GQA 5:1
  };
  ConfigSample splits(kDefaultBlocks.splits, 1, rng);
  for (const AttentionCase& c : cases) {
    if (!inScope(c.B * c.Hq * c.L * c.S)) continue;
    DecodeCheck how = kDefaultBlocks;
    how.splits = splits.next();
    const auto start = std::chrono::steady_clock::now();
    const bool ok = checkDecodeVariant(rng, v, c, kDevice, how);
    // Progress, so a slow or stuck case shows in the log.
    std::printf("  %-16s %s: %.2f s\n", v.name.c_str(), c.describe().c_str(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
    if (!ok) return;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryVariant, FlexDecodeGpuVariant, ::testing::ValuesIn(variantNames()), variantParamName);

TEST(FlexDecodeGpu, ManySplitsOverALongCache) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  AttentionCase c{.B = 2, .Hq = 32, .Hkv = 8, .L = 1, .S = 20000, .D = 128, .dtype = DType::BF16};
  ConfigSample splits(std::vector<int64_t>{0, 64, 128}, 2, rng, /*alwaysFirst=*/true);  // the template's choice, and one
  for (const char* name : {"full", "sliding_window", "document"})
    if (!checkDecodeVariant(rng, variant(name), c, kDevice, {.splits = splits.next(), .blocks = {128, 128},
                                                                 .prefillConfig = {64, 64, 4, 2}}))
      return;
}

// The fused merge on the GPU: many splits (up to 128, more than the steps of some rows), the split
// count changing from call to call on one scratch, so a ticket counter not reset to 0 by the last
// program of its group, or a merge that read another program's partials before they were visible,
// shows as a wrong or poisoned output; fully masked rows beside live ones, GQA 4:1 and 8:1, L > 1,
// 128 rows a program, KV lengths off the block; the window decode's shape (4096 keys: 4 splits,
// its count since 2026-12-05, and 6, the one before). Each way of ordering the merge: fences
// around the ticket, and the ticket as its own release and acquire (the default: one thread's
// atom.acq_rel after a barrier).
TEST(FlexDecodeGpu, FusedMergeOverManySplitsCallAfterCall) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<FusedMergeCase> cases = {
      {.B = 3, .Hq = 32, .Hkv = 8, .L = 1, .S = 5000, .D = 128, .blocks = {128, 128}, .blockN = 64,
       .splits = {64, 7, 128, 7, 33, 2}},
      {.B = 3, .Hq = 32, .Hkv = 8, .L = 1, .S = 5000, .D = 128, .window = 4096, .blocks = {128, 128}, .blockN = 64,
       .splits = {4, 64, 6, 128, 33, 2}},
      {.B = 2, .Hq = 32, .Hkv = 8, .L = 4, .S = 4097, .D = 128, .window = 1000, .blindOddQueries = true,
       .blocks = {128, 128}, .blockN = 64, .splits = {16, 3, 40, 3}},
      {.B = 1, .Hq = 8, .Hkv = 1, .L = 16, .S = 3000, .D = 64, .dtype = DType::F16, .blindOddQueries = true,
       .blocks = {128, 128}, .blockN = 64, .splits = {20, 9, 47}},
  };
  for (const char* acqRel : {"0", "1"}) {
    SCOPED_TRACE(std::string("FLEXTILE_DECODE_ACQREL_TICKET=") + acqRel);
    ScopedSetenv ticket("FLEXTILE_DECODE_ACQREL_TICKET", acqRel);
    for (int round = 0; round < 3; ++round)  // more launches, more interleavings of the programs
      for (const FusedMergeCase& c : cases)
        if (!checkFusedMergeCalls(rng, c, kDevice)) return;
  }
}

// FlexAttentionOptions::decode_timeline on the GPU: %globaltimer at every program's phases, in
// order, one merger per group (checkDecodeTimeline).
TEST(FlexDecodeGpu, TimelinesRecordEveryProgramsPhasesInOrder) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  checkDecodeTimeline(rng, kDevice);
}

// The same calls with programmatic dependent launch (FLEXTILE_PROGRAMMATIC_LAUNCH=1, set here although
// the decode's default since 2026-12-06, so that the test keeps its subject): each decode
// kernel may start while the previous one finishes, waits before its first global access (the
// merge counters the previous call's last program resets, the partials it reads), and releases
// the next after its walk.
TEST(FlexDecodeGpu, FusedMergeCallAfterCallWithProgrammaticLaunch) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ScopedSetenv programmatic("FLEXTILE_PROGRAMMATIC_LAUNCH", "1");
  const std::vector<FusedMergeCase> cases = {
      {.B = 3, .Hq = 32, .Hkv = 8, .L = 1, .S = 5000, .D = 128, .blocks = {128, 128}, .blockN = 64,
       .splits = {64, 7, 128, 7, 33, 2}},
      {.B = 2, .Hq = 32, .Hkv = 8, .L = 4, .S = 4097, .D = 128, .window = 1000, .blindOddQueries = true,
       .blocks = {128, 128}, .blockN = 64, .splits = {16, 3, 40, 3}},
  };
  for (int round = 0; round < 3; ++round)
    for (const FusedMergeCase& c : cases)
      if (!checkFusedMergeCalls(rng, c, kDevice)) return;
}

// The merge through thread block clusters (FLEXTILE_DECODE_CLUSTER_MERGE=1): 2 to 8 splits a
// group exchange their partials through distributed shared memory, 16 and 48 fold in clusters of
// 8 whose folds take tickets, 33 takes tickets alone; the split
// count moves across 8 from call to call, so a cluster that read a rank's partial before it was
// written, or a merge that mixed the two paths' scratch, shows. The window decode's shape among
// them (GQA 4:1, D = 128, 128-key blocks), fully masked rows, L > 1, and with programmatic launch.
TEST(FlexDecodeGpu, ClusterMergeCallAfterCall) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ScopedSetenv cluster("FLEXTILE_DECODE_CLUSTER_MERGE", "1");
  const std::vector<FusedMergeCase> cases = {
      {.B = 3, .Hq = 32, .Hkv = 8, .L = 1, .S = 5000, .D = 128, .window = 4096, .blocks = {128, 128}, .blockN = 64,
       .splits = {6, 8, 2, 48, 33, 6}},
      {.B = 2, .Hq = 32, .Hkv = 8, .L = 4, .S = 4097, .D = 128, .window = 1000, .blindOddQueries = true,
       .blocks = {128, 128}, .blockN = 64, .splits = {3, 16, 5, 7}},
      {.B = 1, .Hq = 8, .Hkv = 1, .L = 16, .S = 3000, .D = 64, .dtype = DType::F16, .blindOddQueries = true,
       .blocks = {128, 128}, .blockN = 64, .splits = {4, 9, 8}},
  };
  for (const char* programmatic : {"0", "1"}) {
    ScopedSetenv launch("FLEXTILE_PROGRAMMATIC_LAUNCH", programmatic);
    SCOPED_TRACE(std::string("FLEXTILE_PROGRAMMATIC_LAUNCH=") + programmatic);
    for (const FusedMergeCase& c : cases)
      if (!checkFusedMergeCalls(rng, c, kDevice)) return;
  }
  AttentionCase c{.B = 2, .Hq = 32, .Hkv = 8, .L = 1, .S = 4097, .D = 128, .dtype = DType::BF16, .context = "cluster merge"};
  for (const char* name : {"sliding_window", "document", "softcap"})
    if (!checkDecodeVariant(rng, variant(name), c, kDevice, {.splits = {6}, .blocks = {128, 128},
                                                             .prefillConfig = {64, 64, 4, 2}}))
      return;
}

// The full walk's K and V filled by TMA from a producer warpgroup (FLEXTILE_DECODE_WARP_SPECIALIZE=1:
// 4 consumer warps at 136 registers, the producer at 24; at D = 128 the rings hold 128-byte panels
// that ldmatrix reads). Every variant at the window decode's shape, and the walks that differ (no
// mask, a window's partial edge, a gathering mask) at a small head too: off-block lengths (the
// boxes zero-fill the keys past kv_len), D 64 and 128, L 1 and 4, one split and many.
TEST_P(FlexDecodeGpuVariant, WarpSpecialized) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const Variant& v = variant(GetParam());
  ScopedSetenv specialized("FLEXTILE_DECODE_WARP_SPECIALIZE", "1");
  std::vector<AttentionCase> cases = {{.B = 2, .Hq = 32, .Hkv = 8, .L = 1, .S = 4097, .D = 128, .dtype = DType::BF16}};
  if (v.name == "full" || v.name == "sliding_window" || v.name == "document")
    cases.push_back({.B = 1, .Hq = 8, .Hkv = 1, .L = 4, .S = 1000, .D = 64, .dtype = DType::F16});
  ConfigSample splits(std::vector<int64_t>{0, 1, 7}, 2, rng, /*alwaysFirst=*/true);
  for (const AttentionCase& c : cases)
    if (!checkDecodeVariant(rng, v, c, kDevice, {.splits = splits.next(), .blocks = {128, 128}, .prefillConfig = {64, 64, 4, 2}}))
      return;
}

// The specialized walk under the fused merge's calls with the split count moving, so a slot
// refilled before its readers released it, or a phase mixed up between the full walk's TMA ring
// and the partial walk's copies, shows.
TEST(FlexDecodeGpu, WarpSpecializedFusedMergeCallAfterCall) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ScopedSetenv specialized("FLEXTILE_DECODE_WARP_SPECIALIZE", "1");
  const FusedMergeCase merge{.B = 3, .Hq = 32, .Hkv = 8, .L = 1, .S = 5000, .D = 128, .window = 4096,
                             .blocks = {128, 128}, .blockN = 64, .splits = {6, 33, 2, 64, 6}};
  for (const char* programmatic : {"0", "1"}) {  // with programmatic launch both roles wait first
    ScopedSetenv launch("FLEXTILE_PROGRAMMATIC_LAUNCH", programmatic);
    SCOPED_TRACE(std::string("FLEXTILE_PROGRAMMATIC_LAUNCH=") + programmatic);
    for (int round = 0; round < 2; ++round)
      if (!checkFusedMergeCalls(rng, merge, kDevice)) return;
  }
}

// query_offsets on the device: a batch of requests at different positions of a window mask, each
// against a reference run at its own position (the offsets are never read by the host).
TEST(FlexDecodeGpu, EverySequenceAtItsOwnPosition) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 4, Hq = 32, Hkv = 8, S = 4097, D = 128, W = 1000;
  const std::vector<int32_t> positions = {0, 1500, 2900, 4096};
  const BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {W}, {128, 128}, kDevice);
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, D}, kDevice);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kDevice), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kDevice);
  const ReferenceResult ref = referenceAtPositions(q, k, v, refWindow({W}), positions);
  const Tensor offsets = Tensor::fromHost(positions, {B}, kDevice);
  for (int64_t splits : {0, 1, 7}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    FlexAttentionOptions o{.decode_config = FlexDecodeConfig{.splits = splits}, .query_offsets = offsets};
    Tensor out = Tensor::empty(DType::BF16, q.shape(), kDevice), lse = Tensor::empty(DType::F32, {B, Hq, 1}, kDevice);
    poison(out);
    poison(lse);
    flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
    if (!compareWithReference(out, lse, ref, D, DType::BF16)) return;
  }
}

// A decode step captured into a CUDA graph (runtime/Graph.h) after one eager call, then replayed
// as a serving loop would: between replays the new queries and every sequence's position change in
// device memory only, and each replay's output (poisoned first) matches the reference at the new
// positions.
TEST(FlexDecodeGpu, StepsReplayedFromAGraphFollowTheDevicePositions) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 4, Hq = 32, Hkv = 8, S = 4097, D = 128, W = 1000;
  runtime::Stream stream;
  const BlockMask mask = slidingWindowBlockMask(1, 1, S, S, {W}, {128, 128}, {kDevice, &stream});
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, D}, kDevice);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kDevice), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kDevice);
  std::vector<int32_t> positions = {0, 1500, 2900, 4096};
  Tensor offsets = Tensor::fromHost(positions, {B}, kDevice);
  Tensor out = Tensor::empty(DType::BF16, q.shape(), kDevice), lse = Tensor::empty(DType::F32, {B, Hq, 1}, kDevice);
  const FlexAttentionOptions o{.query_offsets = offsets, .stream = &stream};
  auto step = [&] { flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o); };
  step();  // compiles, loads and makes the scratch: the capture only launches
  runtime::Graph graph = runtime::Graph::capture(stream, step);
  std::uniform_int_distribution<int32_t> position(0, int32_t(S - 1));
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("replay " + std::to_string(round));
    if (round > 0) {
      for (int32_t& p : positions) p = position(rng);
      fillRandom(rng, q, -1, 1);
    }
    stream.synchronize();
    offsets.copyFromHost(positions);
    poison(out);
    poison(lse);
    graph.launch(stream);
    stream.synchronize();
    if (!compareWithReference(out, lse, referenceAtPositions(q, k, v, refWindow({W}), positions), D, DType::BF16)) return;
  }
}

// Lists that exist only on the device (BlockMask::fromListTensors over device tensors, as a serving
// system's own kernel or another framework would make them): decode, its row slices and a causal
// prefill agree with the host-list mask (bitwise with exact bounds) and the reference.
TEST(FlexDecodeGpu, ListsOnlyOnTheDevice) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  checkListTensorMask(rng, kDevice);
}

// createBlockMask with hostLists = false: the states compacted by a second kernel on the device,
// nothing copied back. Read back (toHost), the lists equal the host compaction's; a decode step on
// the mask agrees with one on the host-list mask.
TEST(FlexDecodeGpu, CreateBlockMaskWithoutHostLists) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 2, Hq = 8, Hkv = 2, qLen = 9001, S = 9000, D = 64;
  BlockMaskPlacement where{kDevice};
  where.hostLists = false;
  for (const MaskMod& mod : {sliding_window_mask(300), causal_mask(), prefix_lm_mask(37)}) {
    SCOPED_TRACE(mod.name());
    BlockMask want = createBlockMask(mod, B, 1, qLen, S, {64, 64}, kDevice);
    BlockMask got = createBlockMask(mod, B, 1, qLen, S, {64, 64}, where);
    ASSERT_FALSE(got.hasHostLists());
    expectSameLists(got.toHost(), want, "device compaction");
    Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, D}, kDevice);
    Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kDevice), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, kDevice);
    Tensor out = Tensor::empty(DType::BF16, q.shape(), kDevice), ref = Tensor::empty(DType::BF16, q.shape(), kDevice);
    poison(out);
    const FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .query_offset = S - 1};
    flex_attention_into(q, k, v, noop_score(), got, out, nullptr, o);
    flex_attention_into(q, k, v, noop_score(), want, ref, nullptr, o);
    if (!templatesAgree(out, ref, DType::BF16, "decode on the device-compacted mask")) return;
  }
}
