// Paged K/V on the GPU (label gpu; every test skips without one): device page tables, storage and
// caches, against the float64 reference over the logical K/V. Page sizes 16 to 256 under the
// default configs (BLOCK_N narrowed to the page) and the tuner's usual points (a page smaller than
// BLOCK_N gathers per key), GQA, causal / window / document masks with per-batch lengths up to a
// few thousand, prefill and decode steps through the cache's write kernel, shared prefix pages and
// erased sequences.
// Budget (gpu/TestBudget.h, docs/testing.md): every page size and mask runs each time, with a
// random sample of the configs (all of them with FLEXTILE_GPU_TESTS_FULL=1).
#include <gtest/gtest.h>

#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "gpu/GpuTest.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

constexpr MemorySpace kDevice = MemorySpace::Device;

const std::vector<std::optional<FlexAttentionConfig>> kConfigs = {
    std::nullopt, FlexAttentionConfig{128, 64, 8, 2}, FlexAttentionConfig{64, 64, 4, 2},
    FlexAttentionConfig{64, 128, 4, 2}};

FlexAttentionOptions withConfig(const std::optional<FlexAttentionConfig>& c) {
  FlexAttentionOptions o;
  o.config = c;
  return o;
}

std::vector<int64_t> randomLengths(std::mt19937_64& rng, int64_t B, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> u(lo, hi);
  std::vector<int64_t> l;
  for (int64_t b = 0; b < B; ++b) l.push_back(u(rng));
  return l;
}

}  // namespace

// Decode-shaped (a few query rows against long fragmented caches, one sequence empty): every page
// size x every config, one reference per case.
TEST(PagedKVGpu, DecodeShapesEveryPageSizeEveryConfig) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  ConfigSample configs(kConfigs, 1, rng);  // the five page sizes cover all four
  int i = 0;
  for (int64_t ps : {16, 32, 64, 128, 256}) {
    const DType dt = i++ % 2 ? DType::F16 : DType::BF16;  // rotating: each page size is a kernel per config
    PagedCase c{.B = 4, .Hq = 16, .Hkv = 4, .L = 3, .D = 128, .pageSize = ps,
                .lengths = randomLengths(rng, 4, 1, 3000), .dtype = dt, .context = "decode"};
    c.lengths[1] = 0;  // an empty sequence: out 0, lse -inf
    c.S = 3000;
    const PagedInputs in = makePagedInputs(rng, c, kDevice);
    const Tensor q = randomTensor(rng, dt, {c.B, c.Hq, c.L, c.D}, kDevice);
    for (const auto& config : configs.next())
      if (!checkPagedOn(q, in.kv, in.kLogical, in.vLogical, in.lengths, c.describe(), noop_score(), std::nullopt,
                        nullptr, nullptr, withConfig(config), rng()))
        return;
  }
}

// Prefill-shaped: causal, sliding-window and document masks over fragmented pages with lengths
// that are not multiples of the blocks, D 64 and 128.
TEST(PagedKVGpu, MasksOverFragmentedPages) {
  FLEXTILE_REQUIRE_GPU();
  FLEXTILE_SKIP_WHEN_SMALL("only L=S=1000 prefills");
  SeededRandom rng;
  const int64_t S = 1000;
  for (int64_t ps : {16, 64, 128}) {
    for (int64_t D : {64, 128}) {
      PagedCase c{.B = 2, .Hq = 4, .Hkv = 1, .L = S, .D = D, .pageSize = ps, .lengths = {S, 777}, .S = S,
                  .context = "causal"};
      if (!checkPaged(rng, c, kDevice, noop_score(), causalBlockMask(1, 1, S, S), nullptr, refCausal())) return;
    }
    PagedCase w{.B = 2, .Hq = 4, .Hkv = 1, .L = S, .D = 128, .pageSize = ps, .lengths = {901, S}, .S = S,
                .context = "window 256"};
    if (!checkPaged(rng, w, kDevice, noop_score(), slidingWindowBlockMask(1, 1, S, S, {256}, {}, kDevice), nullptr,
                    refWindow({256}), withConfig(FlexAttentionConfig{128, 64, 8, 2})))
      return;
    const std::vector<int64_t> offsets{0, 100, 420, 421, 1000};
    PagedCase d{.B = 2, .Hq = 4, .Hkv = 4, .L = S, .D = 64, .pageSize = ps, .lengths = {S, 500}, .S = S,
                .dtype = DType::F16, .context = "documents + causal"};
    RefMaskFn ref = refAnd(refDocuments({idsFromOffsets(offsets, S)}), refCausal());
    if (!checkPaged(rng, d, kDevice, noop_score(), documentBlockMask(1, 1, S, S, {offsets}, true, {}, kDevice),
                    nullptr, ref))
      return;
  }
}

TEST(PagedKVGpu, SharedPrefixPages) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  PagedCase c{.B = 3, .Hq = 8, .Hkv = 2, .L = 17, .D = 128, .pageSize = 64, .lengths = {1500, 2000, 64},
              .sharedPrefixPages = 20, .context = "shared prefix"};
  checkPaged(rng, c, kDevice, noop_score(), std::nullopt, nullptr, nullptr);
}

// Sequence `done` finishes and a new request takes its slot, sharing the first `pages` pages of
// sequence `from` (in the cache and in the test's history).
static void replaceWithSharedPrefix(PagedKVCache& cache, LogicalHistory& hist, int64_t done, int64_t from, int64_t pages,
                                    int64_t pageSize, int64_t Hkv, int64_t D) {
  cache.erase(done);
  cache.sharePrefix(done, from, pages);
  const int64_t values = pages * pageSize * Hkv * D;
  hist.k[size_t(done)].assign(hist.k[size_t(from)].begin(), hist.k[size_t(from)].begin() + values);
  hist.v[size_t(done)].assign(hist.v[size_t(from)].begin(), hist.v[size_t(from)].begin() + values);
}

// A decode step's new token for each of the first B sequences, in the cache and the history.
static void appendOneToken(std::mt19937_64& rng, PagedKVCache& cache, LogicalHistory& hist, int64_t B, int64_t Hkv, int64_t D,
                           DType dt) {
  NewTokens n = randomTokens(rng, dt, B, Hkv, 1, D, kDevice);
  cache.append(n.k, n.v);
  for (int64_t b = 0; b < B; ++b) hist.append(b, n.kHost, n.vHost, b, 1, 1);
}

// A serving loop on the device: ragged prefill through the write kernel, then decode steps of one
// token per sequence, checked every step; sequence 1 finishes (erased) halfway and a new request
// takes its slot sharing sequence 0's prefix pages.
TEST(PagedKVCacheGpu, ServingLoopMatchesReference) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  for (int64_t ps : {16, 128}) {
    SCOPED_TRACE("page size " + std::to_string(ps));
    const int64_t B = 3, Hq = 8, Hkv = 2, D = 128, T = 700;
    const DType dt = DType::BF16;
    PagedKVCache cache(dt, Hkv, D, /*numPages*/ 4096 / ps * 3, ps, /*maxBatch*/ 4, /*maxPages*/ 4096 / ps,
                       kDevice);
    LogicalHistory hist(B, Hkv, D);
    const std::vector<int64_t> order{1, 2, 0}, prompt{333, 700, 650};
    NewTokens p = randomTokens(rng, dt, B, Hkv, T, D, kDevice);
    cache.write(order, p.k, p.v, prompt);
    for (int64_t i = 0; i < B; ++i) hist.append(order[size_t(i)], p.kHost, p.vHost, i, T, prompt[size_t(i)]);
    for (int step = 0; step < 12; ++step) {
      SCOPED_TRACE("decode step " + std::to_string(step));
      if (step == 6) replaceWithSharedPrefix(cache, hist, 1, 0, 4, ps, Hkv, D);
      appendOneToken(rng, cache, hist, B, Hkv, D, dt);
      const std::vector<int64_t> lengths = hist.lengths(B);
      const int64_t S = *std::max_element(lengths.begin(), lengths.end());
      const Tensor q = randomTensor(rng, dt, {B, Hq, 1, D}, kDevice);
      const PagedKV kv = cache.view({.batches = B});
      auto [k, v] = hist.tensors(B, S, dt);
      const BlockMask row = causalBlockMask(1, 1, S, S).sliceRows((S - 1) / 128, 1, S - 1, 1);
      if (!checkPagedOn(q, kv, k, v, lengths, "serving loop", noop_score(), row, nullptr, refCausal())) return;
      if (step % 4 == 3) {
        const LogicalKV m = cache.materialize(B);
        EXPECT_EQ(m.k.toHost<float>(), k.toHost<float>());
        EXPECT_EQ(m.v.toHost<float>(), v.toHost<float>());
      }
    }
  }
}

// The serving loop as a graph replays it (runtime/Graph.h): one decode step captured after an
// eager one, then every step only writes device memory — the new tokens' K/V (the cache's write
// kernel), the page table and lengths (view() uploads them to the same tensors), each sequence's
// position and the queries — and replays. A sequence finishes halfway and a new request takes its
// slot on sequence 0's prefix pages, so the replayed kernel reads a page table that changed under
// it. Every step (poisoned first) against the float64 reference at each sequence's own position.
TEST(PagedKVCacheGpu, AServingLoopReplaysOneCapturedDecodeStep) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const int64_t B = 3, Hq = 8, Hkv = 2, D = 128, ps = 64, maxLen = 4096, T = 700;
  const DType dt = DType::BF16;
  runtime::Stream stream;
  PagedKVCache cache(dt, Hkv, D, /*numPages*/ maxLen / ps * 3, ps, /*maxBatch*/ B, /*maxPages*/ maxLen / ps, kDevice);
  cache.setStream(&stream);
  LogicalHistory hist(B, Hkv, D);
  const std::vector<int64_t> order{1, 2, 0}, prompt{333, 700, 650};
  NewTokens p = randomTokens(rng, dt, B, Hkv, T, D, kDevice);
  cache.write(order, p.k, p.v, prompt);
  for (int64_t i = 0; i < B; ++i) hist.append(order[size_t(i)], p.kHost, p.vHost, i, T, prompt[size_t(i)]);
  const BlockMask causal = causalBlockMask(1, 1, maxLen, maxLen, {128, 128}, {kDevice, &stream});
  Tensor q = Tensor::empty(dt, {B, Hq, 1, D}, kDevice);
  Tensor positions = Tensor::empty(DType::I32, {B}, kDevice);
  Tensor out = Tensor::empty(dt, q.shape(), kDevice), lse = Tensor::empty(DType::F32, {B, Hq, 1}, kDevice);
  const FlexAttentionOptions o{.query_offsets = positions, .stream = &stream};
  PagedKV kv;
  auto step = [&] { flex_attention_into(q, kv, noop_score(), causal, out, &lse, o); };
  runtime::Graph graph;
  for (int s = 0; s < 8; ++s) {
    SCOPED_TRACE("decode step " + std::to_string(s) + (s == 0 ? " (eager, then captured)" : " (replayed)"));
    if (s == 4) replaceWithSharedPrefix(cache, hist, 1, 0, 4, ps, Hkv, D);
    appendOneToken(rng, cache, hist, B, Hkv, D, dt);
    const PagedKV now = cache.view({.batches = B, .length = maxLen});  // uploads the table and lengths
    if (s == 0) kv = now;
    ASSERT_EQ(now.pageTable.deviceAddress(), kv.pageTable.deviceAddress()) << "the captured table moved";
    const std::vector<int64_t> lengths = hist.lengths(B);
    std::vector<int32_t> newest;
    for (int64_t len : lengths) newest.push_back(int32_t(len - 1));
    stream.synchronize();
    positions.copyFromHost(newest);
    fillRandom(rng, q, -1, 1);
    poison(out);
    poison(lse);
    if (s == 0) {
      step();
      graph = runtime::Graph::capture(stream, step);
    } else {
      graph.launch(stream);
    }
    stream.synchronize();
    const int64_t S = *std::max_element(lengths.begin(), lengths.end());
    auto [k, v] = hist.tensors(B, S, dt);
    if (!compareWithReference(out, lse, referenceAtPositions(q, k, v, refCausal(), newest), D, dt)) return;
  }
}
