// decodeBlockLists through the interpreter: exact against a brute-force reference for every
// standard mask, slices, straddling ranges and boundary lengths; a window query at the end of a row; no
// retrace from step to step; buffers reused; clear errors.
#include <gtest/gtest.h>

#include "DecodeListsCheck.h"
#include "codegen/Ptxas.h"
#include "gpu/GpuTest.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
using flextile::testing::expectError;
namespace ft = flextile::testing;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;

TEST(DecodeLists, ExactAgainstBruteForce) {
  ft::SeededRandom rng;
  ft::runDecodeListsSuite(rng, kHost);
}

// One query at the end of a row of a sliding window must not keep the row's leftmost
// partial block when none of its keys is in the window (and blocks partial for the row become full).
TEST(DecodeLists, WindowQueryAtTheEndOfARowDropsTheRowsLeftEdge) {
  BlockMask m = slidingWindowBlockMask(1, 1, 1024, 1024, {256}, {128, 128}, kHost);
  // Row 7 (queries 896..1023) reaches back to key 641: block 5 partial, 6 full, 7 the diagonal.
  ASSERT_EQ(std::vector<int32_t>(m.partialKvBlocks(0, 0, 7).begin(), m.partialKvBlocks(0, 0, 7).end()),
            (std::vector<int32_t>{5, 7}));
  // Query 1023 sees keys 768..1023: blocks 6 and 7, both whole.
  DecodeBlockLists last = decodeBlockLists(m, 1023, 1, kHost);
  EXPECT_EQ(last.fullNum.toHost<int32_t>(), std::vector<int32_t>{2});
  EXPECT_EQ(last.fullIndices.toHost<int32_t>(), (std::vector<int32_t>{6, 7, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(last.partialNum.toHost<int32_t>(), std::vector<int32_t>{0});
  EXPECT_EQ(last.maxLiveBlocks, 3);  // the row's three blocks, from the host lists
  // Query 900 sees keys 645..900: 5 partial, 6 full, 7 partial.
  DecodeBlockLists early = decodeBlockLists(m, 900, 1, kHost);
  EXPECT_EQ(early.fullNum.toHost<int32_t>(), std::vector<int32_t>{1});
  EXPECT_EQ(early.partialNum.toHost<int32_t>(), std::vector<int32_t>{2});
  EXPECT_EQ(early.partialIndices.toHost<int32_t>(), (std::vector<int32_t>{5, 7, 0, 0, 0, 0, 0, 0}));
  ASSERT_TRUE(ft::expectDecodeListsExact(m, ft::refWindow({256}), 1023, 1, kHost, "window 256"));
}

// A decode loop: one kernel trace for every step of one query count, and the two buffers of
// consecutive steps reused.
TEST(DecodeLists, StepsNeitherRetraceNorAllocate) {
  BlockMask m = slidingWindowBlockMask(2, 2, 700, 700, {100}, {128, 128}, kHost);
  DecodeBlockLists lists = decodeBlockLists(m, 300, 2, kHost);
  const DecodeListsPoolStats base = decodeListsPoolStats();
  for (int64_t t = 301; t < 320; ++t) {
    lists = decodeBlockLists(m, t, 2, kHost);
    ASSERT_TRUE(ft::expectDecodeListsExact(m, ft::refWindow({100}), t, 2, kHost, "step"));
  }
  const Kernel* k = nullptr;
  {
    std::lock_guard lock(m.maskMod().state().mutex);
    k = m.maskMod().state().kernels.at("decode_block_lists").kernel.get();
  }
  EXPECT_EQ(k->numTraces(), 1u);
  EXPECT_LE(decodeListsPoolStats().buffers, base.buffers + 1);  // step t's and step t + 1's
  // Lists kept alive together have buffers of their own.
  DecodeBlockLists a = decodeBlockLists(m, 100, 1, kHost), b = decodeBlockLists(m, 600, 1, kHost);
  EXPECT_NE(a.fullIndices.hostData(), b.fullIndices.hostData());
  EXPECT_EQ(a.fullIndices.toHost<int32_t>(), decodeBlockLists(m, 100, 1, kHost).fullIndices.toHost<int32_t>());
}

TEST(DecodeLists, BadRangesAreErrors) {
  BlockMask m = causalBlockMask(1, 1, 300, 300, {128, 128}, kHost);
  expectError([&] { (void)decodeBlockLists(m, 299, 2, kHost); }, {"queries [299, 301)", "mask's queries [0, 300)"});
  expectError([&] { (void)decodeBlockLists(m, -1, 1, kHost); }, {"queries [-1, 0)", "[0, 300)"});
  expectError([&] { (void)decodeBlockLists(m, 10, 0, kHost); }, {"queryCount must be at least 1, got 0"});
  expectError([&] { (void)decodeBlockLists(m, 0, 200, kHost); }, {"200 queries", "sliceRows"});
  BlockMask slice = m.sliceRows(1, 1, 130, 5);
  expectError([&] { (void)decodeBlockLists(slice, 129, 1, kHost); }, {"queries [129, 130)", "[130, 135)"});
  BlockMask small = causalBlockMask(1, 1, 300, 300, {2, 16}, kHost);
  expectError([&] { (void)decodeBlockLists(small, 0, 32, kHost); }, {"17 block rows", "larger query blocks"});
  BlockMask docs = documentBlockMask(1, 1, 100, 100, {{0, 50, 100}}, true, {32, 32}, kHost);
  expectError([&] { (void)decodeBlockLists(docs, 0, 1, MemorySpace::Device); }, {"captures host tensors", "device"});
}

}  // namespace

// The kernel lowers to PTX for both targets the GPU tests run on (no GPU needed), for one query
// and for a straddling step of 16 with a mod that captures a tensor, and ptxas accepts it where
// ptxas exists.
TEST(DecodeLists, KernelCompilesForTheGpuTargets) {
  BlockMask window = slidingWindowBlockMask(2, 4, 3000, 3000, {700}, {128, 128}, kHost);
  BlockMask docs = documentBlockMask(2, 1, 1000, 1000, {{0, 100, 1000}, {0, 600, 1000}}, true, {128, 64}, kHost);
  for (auto target : {codegen::Target::sm80(), codegen::Target::sm90a()}) {
    for (auto [mask, count] : {std::pair{&window, int64_t(1)}, std::pair{&docs, int64_t(16)}}) {
      const codegen::CompiledKernel& k = compileDecodeBlockLists(*mask, 120, count, target);
      EXPECT_NE(k.ptx.find(".entry"), std::string::npos);
      // ptxas throws with its output when it rejects the PTX. (It spills 8 bytes of the straddling
      // sm_90a variant at 48 registers, its own choice: no register cap is set; not asserted.)
      if (codegen::findPtxas()) (void)codegen::runPtxas(k.ptx, target);
    }
  }
}
