// The attention mask side on the GPU (label gpu; skipped without one): device
// tensors, captured device tensors, and createBlockMask through Kernel::run —
// the lists equal the interpreter's and the structural builders', toDense is
// exact, and new captured values neither retrace nor recompile.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <tuple>

#include "attention_templates/BlockMask.h"
#include "gpu/GpuTest.h"
#include "MaskTestUtil.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
using flextile::testing::expectExact;
using flextile::testing::expectSameLists;
using flextile::testing::RefMask;
using flextile::testing::SeededRandom;
namespace ft = flextile::testing;

namespace {

constexpr MemorySpace kDevice = MemorySpace::Device, kHost = MemorySpace::Host;

std::vector<int64_t> randomOffsets(std::mt19937_64& rng, int64_t L, int maxDocs) {
  std::vector<int64_t> o{0};
  int docs = 1 + int(rng() % uint64_t(maxDocs));
  for (int d = 1; d < docs; ++d) o.push_back(1 + int64_t(rng() % uint64_t(std::max<int64_t>(L - 1, 1))));
  o.push_back(L);
  std::sort(o.begin(), o.end());
  o.erase(std::unique(o.begin(), o.end()), o.end());
  return o;
}

TEST(AttentionGpu, DeviceTensorsRoundTrip) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  std::vector<float> data(1000);
  for (auto& x : data) x = std::uniform_real_distribution<float>(-5, 5)(rng);
  Tensor d = Tensor::fromHost(data, {10, 100}, kDevice);
  EXPECT_TRUE(d.isDevice());
  EXPECT_EQ(d.toHost<float>(), data);
  // A view over memory another owner holds (here: d), written and read through the view.
  Tensor view = Tensor::deviceView(d.deviceAddress(), DType::F32, {1000});
  std::vector<float> other(1000, 0.25f);
  view.copyFromHost(other);
  EXPECT_EQ(d.toHost<float>(), other);
  EXPECT_EQ(d.to(kHost).toHost<float>(), other);
  EXPECT_EQ(Tensor::fromHost(data, {1000}, kHost).to(kDevice).toHost<float>(), data);
  // A strided view (every other column of rows 2..7, a broadcast dimension of stride 0) reads
  // back element by element as the host view of the same data does.
  Tensor host = Tensor::fromHost(data, {10, 100}, kHost);
  d.copyFromHost(data);
  for (const auto& [shape, strides] : std::vector<std::pair<dsl::Shape, std::vector<int64_t>>>{
           {{6, 50}, {100, 2}}, {{3, 6, 50}, {0, 100, 2}}})
    EXPECT_EQ(Tensor::viewOf(d, 200, shape, strides).toHost<float>(), Tensor::viewOf(host, 200, shape, strides).toHost<float>());
}

// Device and host builds of the same mod (captures made in each space) give
// the same lists, and the device mask is exact (toDense runs on the GPU too).
TEST(AttentionGpu, GenericBuilderMatchesInterpreterAndStructural) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<int64_t> lengths{1, 3, 127, 128, 129, 1000};
  const std::vector<BlockSizes> sizes{{16, 16}, {32, 64}, {64, 32}, {128, 128}};
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t Q = lengths[rng() % lengths.size()], KV = lengths[rng() % lengths.size()];
    const BlockSizes s = sizes[rng() % sizes.size()];
    const int64_t B = 1 + int64_t(rng() % 2), H = 1 + int64_t(rng() % 3);
    const std::string c = "Q_LEN=" + std::to_string(Q) + " KV_LEN=" + std::to_string(KV) + " blocks " +
                          std::to_string(s.q) + "x" + std::to_string(s.kv) + " B=" + std::to_string(B) +
                          " H=" + std::to_string(H);
    // causal
    BlockMask causal = createBlockMask(causal_mask(), B, H, Q, KV, s, kDevice);
    EXPECT_EQ(causal.space(), kDevice);
    if (!expectExact(causal, ft::refCausal(), "causal " + c)) return;
    if (!expectSameLists(causal, causalBlockMask(B, H, Q, KV, s), "causal " + c)) return;
    // per-head windows, captured on the device
    std::vector<int64_t> windows;
    for (int64_t h = 0; h < H; ++h) windows.push_back(1 + int64_t(rng() % 300));
    BlockMask wd = slidingWindowBlockMask(B, H, Q, KV, windows, s, kDevice);
    BlockMask wh = slidingWindowBlockMask(B, H, Q, KV, windows, s, kHost);
    BlockMask gd = createBlockMask(wd.maskMod(), B, H, Q, KV, s);  // placed where its captures live
    EXPECT_EQ(gd.space(), kDevice);
    if (!expectExact(gd, ft::refWindow(windows), "windows " + c)) return;
    if (!expectSameLists(gd, wh, "windows " + c)) return;
    if (!expectSameLists(gd, createBlockMask(wh.maskMod(), B, H, Q, KV, s), "windows host " + c)) return;
    // documents + causal, ids per batch on the device
    const int64_t L = std::max(Q, KV);
    std::vector<std::vector<int64_t>> offsets;
    std::vector<std::vector<int32_t>> ids;
    for (int64_t b = 0; b < B; ++b) {
      offsets.push_back(randomOffsets(rng, L, 9));
      ids.push_back(ft::idsFromOffsets(offsets.back(), L));
    }
    BlockMask docs = documentBlockMask(B, H, Q, KV, offsets, true, s, kDevice);
    BlockMask gdocs = createBlockMask(docs.maskMod(), B, H, Q, KV, s);
    if (!expectExact(gdocs, ft::refAnd(ft::refCausal(), ft::refDocuments(ids)), "documents " + c)) return;
    if (!expectSameLists(gdocs, docs, "documents " + c)) return;
    // prefix LM or a combination
    const int64_t P = int64_t(rng() % uint64_t(L + 1));
    MaskMod combo = or_masks(prefix_lm_mask(P), sliding_window_mask(windows[0]));
    BlockMask gc = createBlockMask(combo, B, H, Q, KV, s, kDevice);
    if (!expectExact(gc, ft::refOr(ft::refPrefix(P), ft::refWindow({windows[0]})), "prefix|window " + c)) return;
    if (!expectSameLists(gc, createBlockMask(combo, B, H, Q, KV, s, kHost), "prefix|window " + c)) return;
  }
}

TEST(AttentionGpu, CapturedValuesChangeWithoutRecompiling) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t L = 1000;
  CapturedTensor ids = capture(Tensor::zeros(DType::I32, {L}, kDevice), "document_ids");
  MaskMod mod = and_masks(causal_mask(), document_mask(ids));
  for (int round = 0; round < 4; ++round) {
    std::vector<int32_t> row = ft::idsFromOffsets(randomOffsets(rng, L, 12), L);
    ids.tensor().copyFromHost(row);
    BlockMask m = createBlockMask(mod, 1, 2, L, L, {64, 64});
    if (!expectExact(m, ft::refAnd(ft::refCausal(), ft::refDocuments({row})), "round " + std::to_string(round))) return;
  }
  Kernel& k = *mod.state().kernels.at("block_mask_states").kernel;
  EXPECT_EQ(k.numTraces(), 1u);
  EXPECT_EQ(k.numCompiled(), 1u);
}

// Not a benchmark (bench/ will have one): prints the time of a large build,
// and checks it against the structural builder.
TEST(AttentionGpu, LargeMaskBuildsOnTheGpu) {
  FLEXTILE_REQUIRE_GPU();
  FLEXTILE_SKIP_WHEN_SMALL("only an 8192 x 8192 mask of 16 heads");
  const int64_t B = 2, H = 16, N = 8192;
  MaskMod mod = sliding_window_mask(1024);
  BlockMask first = createBlockMask(mod, B, H, N, N);  // compiles
  auto t0 = std::chrono::steady_clock::now();
  BlockMask m = createBlockMask(mod, B, H, N, N);
  auto t1 = std::chrono::steady_clock::now();
  BlockMask s = slidingWindowBlockMask(B, H, N, N, {1024});
  auto t2 = std::chrono::steady_clock::now();
  std::printf("createBlockMask(sliding_window(1024), B=2, H=16, N=8192) on the GPU: %.3f ms; structural: %.3f ms\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count(),
              std::chrono::duration<double, std::milli>(t2 - t1).count());
  std::printf("%s\n", m.describe().c_str());
  EXPECT_TRUE(expectSameLists(m, s, "window 1024 at 8192"));
  EXPECT_NO_THROW(m.check());
}

}  // namespace

// BlockMask::stats() counts the allowed pairs of partial blocks with a kernel where the mask's
// captures live: on the GPU it must give the host's counts and the reference mask's, pair by pair.
TEST(AttentionGpu, StatsCountAllowedPairsOnTheGpu) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 2, H = 3, Q = 1000, KV = 777;
  const BlockSizes s{64, 32};
  const int64_t L = std::max(Q, KV);
  std::vector<std::vector<int64_t>> offsets;
  std::vector<std::vector<int32_t>> ids;
  for (int64_t b = 0; b < B; ++b) {
    offsets.push_back(randomOffsets(rng, L, 9));
    ids.push_back(ft::idsFromOffsets(offsets.back(), L));
  }
  std::vector<int64_t> windows{1, 1 + int64_t(rng() % 300), 500};
  const RefMask refDocs = ft::refAnd(ft::refCausal(), ft::refDocuments(ids)), refWindows = ft::refWindow(windows);
  const BlockMask docs = documentBlockMask(B, 1, Q, KV, offsets, true, s, kDevice);
  const BlockMask docsHost = documentBlockMask(B, 1, Q, KV, offsets, true, s, kHost);
  const BlockMask win = slidingWindowBlockMask(1, H, Q, KV, windows, s, kDevice);
  const BlockMask winHost = slidingWindowBlockMask(1, H, Q, KV, windows, s, kHost);
  for (auto [m, host, ref, name] : {std::tuple{&docs, &docsHost, refDocs, "documents"},
                                    std::tuple{&win, &winHost, refWindows, "windows"}}) {
    ASSERT_EQ(m->space(), kDevice);
    const BlockMaskStats st = m->stats(BlockSizes{128, 16}), hostSt = host->stats(BlockSizes{128, 16});
    ASSERT_EQ(st.heads.size(), hostSt.heads.size()) << name;
    for (size_t i = 0; i < st.heads.size(); ++i) {
      const BlockMaskHeadStats& e = st.heads[i];
      int64_t allowed = 0;
      for (int64_t q = 0; q < Q; ++q)
        for (int64_t kv = 0; kv < KV; ++kv) allowed += ref(e.b, e.h, q, kv) ? 1 : 0;
      EXPECT_EQ(e.allowedPairs, allowed) << name << " (b " << e.b << ", h " << e.h << ")";
      EXPECT_EQ(e.allowedPairs, hostSt.heads[i].allowedPairs) << name;
      EXPECT_EQ(e.computedPairs, hostSt.heads[i].computedPairs) << name;
      EXPECT_GE(e.gamma, 1.0) << name;
    }
  }
}
