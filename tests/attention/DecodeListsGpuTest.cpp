// decodeBlockLists on the GPU (label gpu; skips without one): the host suite's cases with masks,
// captures and lists on the device, against the same brute-force reference; a decode loop that
// neither retraces nor allocates; the device lists equal the interpreter's. Zero-copy slices of a
// device mask: their list tensors alias the parent's device memory and give the same attention.
#include <gtest/gtest.h>

#include "DecodeListsCheck.h"
#include "FlexAttentionCheck.h"
#include "gpu/GpuTest.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ft = flextile::testing;

namespace {

constexpr MemorySpace kDevice = MemorySpace::Device, kHost = MemorySpace::Host;

TEST(DecodeListsGpu, ExactAgainstBruteForce) {
  FLEXTILE_REQUIRE_GPU();
  ft::SeededRandom rng;
  ft::runDecodeListsSuite(rng, kDevice);
}

// A long context (32K keys, 8 heads with their own windows, 2 batches of documents) step by step:
// the device lists equal the interpreter's for the same mask, one trace, no new buffers.
TEST(DecodeListsGpu, DecodeLoopMatchesTheInterpreter) {
  FLEXTILE_REQUIRE_GPU();
  FLEXTILE_SKIP_WHEN_SMALL("only a 32K context");
  const int64_t L = 32768;
  std::vector<int64_t> windows{128, 1000, 4096, 300, 129, 2048, 7, 32768};
  BlockMask device = slidingWindowBlockMask(2, 8, L, L, windows, {128, 128}, kDevice);
  BlockMask host = slidingWindowBlockMask(2, 8, L, L, windows, {128, 128}, kHost);
  DecodeBlockLists lists = decodeBlockLists(device, L - 100, 4, kDevice);
  const DecodeListsPoolStats base = decodeListsPoolStats();
  for (int64_t t = L - 99; t < L - 60; ++t) {
    lists = decodeBlockLists(device, t, 4, kDevice);
    DecodeBlockLists want = decodeBlockLists(host, t, 4, kHost);
    ASSERT_EQ(lists.fullNum.toHost<int32_t>(), want.fullNum.toHost<int32_t>()) << "t " << t;
    ASSERT_EQ(lists.fullIndices.toHost<int32_t>(), want.fullIndices.toHost<int32_t>()) << "t " << t;
    ASSERT_EQ(lists.partialNum.toHost<int32_t>(), want.partialNum.toHost<int32_t>()) << "t " << t;
    ASSERT_EQ(lists.partialIndices.toHost<int32_t>(), want.partialIndices.toHost<int32_t>()) << "t " << t;
  }
  ASSERT_TRUE(ft::expectDecodeListsExact(device, ft::refWindow(windows), L - 64, 4, kDevice, "32K per-head windows"));
  const Kernel* k = nullptr;
  {
    std::lock_guard lock(device.maskMod().state().mutex);
    k = device.maskMod().state().kernels.at("decode_block_lists").kernel.get();
  }
  EXPECT_EQ(k->numTraces(), 1u);
  EXPECT_LE(decodeListsPoolStats().buffers, base.buffers + 2);  // this loop's and the host's second
}

// A decode loop of one-row slices of a device mask: the slices' list tensors are views of the
// parent's device memory (no cuMemAlloc, no upload per step), and the attention through them
// matches the float64 reference.
TEST(DecodeListsGpu, SlicesOfADeviceMaskAliasItsMemory) {
  FLEXTILE_REQUIRE_GPU();
  ft::SeededRandom rng;
  const int64_t L = 2048;
  const std::vector<int64_t> windows{100, 700, 129, 2048};
  BlockMask parent = slidingWindowBlockMask(2, 4, L, L, windows, {128, 128}, kDevice);
  const BlockMaskTensors& p = parent.kvTensors(kDevice);
  const int64_t nKv = parent.numKvBlocks();
  for (int64_t t : {int64_t(5), int64_t(1000), L - 1}) {
    BlockMask slice = parent.sliceRows(t / 128, 1, t, 1);
    const BlockMaskTensors& s = slice.kvTensors(kDevice);
    EXPECT_EQ(s.kvNum.deviceAddress(), p.kvNum.deviceAddress() + uint64_t(t / 128) * 4);
    EXPECT_EQ(s.fullKvIndices.deviceAddress(), p.fullKvIndices.deviceAddress() + uint64_t(t / 128 * nKv) * 4);
    EXPECT_EQ(s.kvBatchStride, p.kvBatchStride);
    ft::AttentionCase c{.B = 2, .Hq = 4, .Hkv = 2, .L = 1, .S = L, .D = 128, .dtype = DType::BF16};
    c.context = "one-row slice at " + std::to_string(t);
    if (!ft::checkFlexAttention(rng, c, kDevice, noop_score(), slice, nullptr, ft::refWindow(windows))) return;
  }
}

}  // namespace
