// Paged K/V through the IR interpreter (host tensors): the paged forward against the float64
// reference over the logical K/V (fragmented page tables, shared prefix pages, a batch of length
// 0, page sizes below, equal to and above BLOCK_N, GQA, causal / window / document masks,
// lengths that are not multiples of the blocks), the cache's write kernel (prefill, then decode
// steps of one token re-checked each step), the cache's bookkeeping, and the errors.
//
// Sizes stay small: the interpreter runs about 2.5e8 multiply-adds a second.
#include <gtest/gtest.h>

#include <regex>

#include "MaskTestUtil.h"
#include "PagedKVCheck.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "gpu/GpuTest.h"
#include "codegen/Ptxas.h"
#include "ir/Printer.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;
constexpr BlockSizes kMaskBlocks{32, 32};

FlexAttentionOptions config(int64_t bm, int64_t bn) { return {.config = FlexAttentionConfig{bm, bn, 4, 2}}; }

}  // namespace

// Fragmented page tables (pages in random physical order) with page sizes below (gathered per
// key), equal to and above BLOCK_N, per-batch lengths that are not multiples of the block, GQA 4:1.
TEST(PagedKV, ForwardMatchesReferenceAcrossPageSizes) {
  SeededRandom rng;
  struct Point {
    int64_t pageSize;
    FlexAttentionOptions options;
  };
  const Point points[] = {{16, config(32, 16)}, {32, config(32, 32)}, {64, config(32, 32)}, {16, config(32, 32)},
                          {128, config(16, 32)}};
  for (const Point& pt : points) {
    PagedCase c{.B = 3, .Hq = 4, .Hkv = 1, .L = 37, .D = 32, .pageSize = pt.pageSize, .lengths = {37, 5, 130},
                .context = "dense"};
    if (!checkPaged(rng, c, kHost, noop_score(), std::nullopt, nullptr, nullptr, pt.options)) return;
  }
}

// Causal masks over a paged K/V: the BlockMask is logical (kvLen = S) and used as it is.
TEST(PagedKV, CausalAndGqaMatchReference) {
  SeededRandom rng;
  for (int64_t ps : {16, 32, 64}) {
    PagedCase c{.B = 2, .Hq = 8, .Hkv = 2, .L = 77, .D = 64, .pageSize = ps, .lengths = {77, 50}, .S = 77,
                .dtype = DType::F16, .context = "causal"};
    BlockMask m = causalBlockMask(1, 1, 77, 77, kMaskBlocks);
    if (!checkPaged(rng, c, kHost, noop_score(), m, nullptr, refCausal(), config(32, 16))) return;
  }
  // f32 with the default config: BLOCK_N narrowed to the 16-token pages.
  PagedCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 45, .D = 32, .pageSize = 16, .S = 45, .dtype = DType::F32,
              .context = "causal, default config"};
  checkPaged(rng, c, kHost, noop_score(), causalBlockMask(1, 1, 45, 45, kMaskBlocks), nullptr, refCausal());
}

TEST(PagedKV, SlidingWindowAndDocumentMasksMatchReference) {
  SeededRandom rng;
  {
    PagedCase c{.B = 2, .Hq = 4, .Hkv = 1, .L = 100, .D = 32, .pageSize = 32, .lengths = {100, 71}, .S = 100,
                .context = "window 20"};
    BlockMask m = slidingWindowBlockMask(1, 1, 100, 100, {20}, kMaskBlocks, kHost);
    if (!checkPaged(rng, c, kHost, noop_score(), m, nullptr, refWindow({20}), config(32, 32))) return;
  }
  {
    const int64_t len = 90;
    const std::vector<int64_t> offsets{0, 17, 40, 90};
    PagedCase c{.B = 2, .Hq = 2, .Hkv = 2, .L = len, .D = 32, .pageSize = 16, .lengths = {90, 60}, .S = len,
                .context = "documents + causal"};
    BlockMask m = documentBlockMask(1, 1, len, len, {offsets}, true, kMaskBlocks, kHost);
    RefMaskFn ref = refAnd(refDocuments({idsFromOffsets(offsets, len)}), refCausal());
    if (!checkPaged(rng, c, kHost, noop_score(), m, nullptr, ref, config(32, 16))) return;
  }
}

// A score_mod sees logical key positions: ALiBi-like bias kv - q, which a physical position breaks.
TEST(PagedKV, ScoreModSeesLogicalPositions) {
  SeededRandom rng;
  ScoreMod relative("relative_bias", [](const dsl::Tile& s, const dsl::Tile&, const dsl::Tile&, const dsl::Tile& q,
                                        const dsl::Tile& kv) { return s + (kv - q).to(DType::F32) * 0.05f; });
  RefScoreFn ref = [](double s, int64_t, int64_t, int64_t q, int64_t kv) { return s + double(kv - q) * 0.05; };
  PagedCase c{.B = 2, .Hq = 2, .Hkv = 1, .L = 50, .D = 32, .pageSize = 16, .lengths = {50, 33}, .S = 50,
              .context = "relative bias"};
  checkPaged(rng, c, kHost, relative, causalBlockMask(1, 1, 50, 50, kMaskBlocks), ref, refCausal(), config(32, 16));
}

// Two batches point at the same physical pages (a shared prefix); a batch of length 0 gives out 0
// (exactly) and lse -inf.
TEST(PagedKV, SharedPrefixPagesAndAnEmptyBatch) {
  SeededRandom rng;
  PagedCase shared{.B = 2, .Hq = 2, .Hkv = 1, .L = 20, .D = 32, .pageSize = 16, .lengths = {70, 90},
                   .sharedPrefixPages = 3, .context = "shared prefix"};
  if (!checkPaged(rng, shared, kHost, noop_score(), std::nullopt, nullptr, nullptr, config(32, 16))) return;
  PagedCase empty{.B = 3, .Hq = 4, .Hkv = 2, .L = 33, .D = 32, .pageSize = 32, .lengths = {40, 0, 9},
                  .context = "batch 1 empty"};
  if (!checkPaged(rng, empty, kHost, noop_score(), std::nullopt, nullptr, nullptr, config(32, 32))) return;
  PagedCase allEmpty{.B = 2, .Hq = 2, .Hkv = 1, .L = 5, .D = 32, .pageSize = 16, .lengths = {0, 0}, .S = 16,
                     .context = "every batch empty"};
  checkPaged(rng, allEmpty, kHost, noop_score(), causalBlockMask(1, 1, 5, 16, kMaskBlocks), nullptr, nullptr,
             config(16, 16));
}

// Without per-batch lengths and with S a multiple of the mask blocks the loads are unmasked (the
// exact path); with S not a multiple, the tail is masked by S alone.
TEST(PagedKV, WithoutLengths) {
  SeededRandom rng;
  for (int64_t S : {64, 75}) {
    PagedCase c{.B = 2, .Hq = 2, .Hkv = 1, .L = 30, .D = 32, .pageSize = 32, .S = S, .context = "no lengths"};
    if (!checkPaged(rng, c, kHost, noop_score(), causalBlockMask(1, 1, 30, S, kMaskBlocks), nullptr, refCausal(),
                    config(16, 32)))
      return;
  }
}

// ---- the cache -------------------------------------------------------------------------------

// Prefill through the write kernel (ragged prompt lengths, rows written to sequences in another
// order), then decode steps of one token each: after every step the single query row is checked
// against the reference over what the test appended, and materialize() against the same logical
// K/V. Even steps view the cache at its longest length with a causal mask sliced to the query
// row; odd steps view it at a fixed bucket length with no mask (the lengths cut the keys), so
// one mask would serve every step.
TEST(PagedKVCache, PrefillThenDecodeStepsMatchReference) {
  SeededRandom rng;
  for (int64_t ps : {16, 64}) {
    SCOPED_TRACE("page size " + std::to_string(ps));
    const int64_t B = 3, Hq = 4, Hkv = 2, D = 32, T = 45, bucket = 128;
    const DType dt = DType::BF16;
    PagedKVCache cache(dt, Hkv, D, /*numPages*/ 40, ps, /*maxBatch*/ 4, /*maxPagesPerSequence*/ 8, kHost);
    LogicalHistory hist(B, Hkv, D);
    const std::vector<int64_t> order{2, 0, 1}, prompt{30, 45, 13};  // row i -> sequence order[i]
    NewTokens p = randomTokens(rng, dt, B, Hkv, T, D, kHost);
    cache.write(order, p.k, p.v, prompt);
    for (int64_t i = 0; i < B; ++i) hist.append(order[size_t(i)], p.kHost, p.vHost, i, T, prompt[size_t(i)]);
    for (int64_t b = 0; b < B; ++b) ASSERT_EQ(cache.length(b), hist.length(b));
    const FlexAttentionOptions opts = config(16, std::min<int64_t>(ps, 32));
    for (int step = 0; step < 20; ++step) {
      SCOPED_TRACE("decode step " + std::to_string(step));
      NewTokens n = randomTokens(rng, dt, B, Hkv, 1, D, kHost);
      cache.append(n.k, n.v);
      for (int64_t b = 0; b < B; ++b) hist.append(b, n.kHost, n.vHost, b, 1, 1);
      const Tensor q = randomTensor(rng, dt, {B, Hq, 1, D}, kHost);
      const std::vector<int64_t> lengths = hist.lengths(B);
      const int64_t S = *std::max_element(lengths.begin(), lengths.end());
      if (step % 2 == 0) {
        const PagedKV kv = cache.view({.batches = B});
        ASSERT_EQ(kv.length, S);
        auto [k, v] = hist.tensors(B, S, dt);
        const BlockMask row = causalBlockMask(1, 1, S, S, kMaskBlocks).sliceRows((S - 1) / 32, 1, S - 1, 1);
        if (!checkPagedOn(q, kv, k, v, hist.lengths(B), "sliced causal row", noop_score(), row, nullptr,
                          refCausal(), opts))
          return;
        const LogicalKV m = cache.materialize(B);
        EXPECT_EQ(m.k.toHost<float>(), k.toHost<float>());
        EXPECT_EQ(m.v.toHost<float>(), v.toHost<float>());
      } else {
        const PagedKV kv = cache.view({.batches = B, .length = bucket});
        auto [k, v] = hist.tensors(B, bucket, dt);
        if (!checkPagedOn(q, kv, k, v, hist.lengths(B), "bucket length", noop_score(), std::nullopt, nullptr,
                          nullptr, opts))
          return;
      }
    }
  }
}

// A chunked prefill: a 48-token prompt, then a chunk of 22 tokens whose queries attend to the
// whole cache through the causal mask's rows of the chunk (sliceRows with the chunk's offset).
TEST(PagedKVCache, ChunkedPrefillMatchesReference) {
  SeededRandom rng;
  const int64_t Hq = 2, Hkv = 1, D = 64, ps = 16, S = 70;
  const DType dt = DType::F16;
  PagedKVCache cache(dt, Hkv, D, 12, ps, 1, 10, kHost);
  LogicalHistory hist(1, Hkv, D);
  for (int64_t chunk : {48, 22}) {
    NewTokens n = randomTokens(rng, dt, 1, Hkv, chunk, D, kHost);
    cache.append(n.k, n.v);
    hist.append(0, n.kHost, n.vHost, 0, chunk, chunk);
  }
  const Tensor q = randomTensor(rng, dt, {1, Hq, 22, D}, kHost);
  auto [k, v] = hist.tensors(1, S, dt);
  const BlockMask chunk = causalBlockMask(1, 1, S, S, {16, 16}).sliceRows(48 / 16, 2, 48, 22);
  checkPagedOn(q, cache.view(), k, v, {S}, "chunked prefill", noop_score(), chunk, nullptr, refCausal(),
               config(16, 16));
}

TEST(PagedKVCache, ReserveEraseShareAndRefCounts) {
  SeededRandom rng;
  PagedKVCache cache(DType::BF16, 1, 32, /*numPages*/ 6, /*pageSize*/ 16, /*maxBatch*/ 3, /*maxPages*/ 4, kHost);
  EXPECT_EQ(cache.numFreePages(), 6);
  EXPECT_EQ(cache.capacity(), 64);
  cache.reserve(0, 33);  // 3 pages
  EXPECT_EQ(cache.pages(0), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(cache.length(0), 0);  // reserve does not change the length
  EXPECT_EQ(cache.numFreePages(), 3);
  cache.reserve(0, 20);  // already held: nothing taken
  EXPECT_EQ(cache.numFreePages(), 3);
  EXPECT_EQ(cache.refCount(1), 1);
  EXPECT_EQ(cache.refCount(5), 0);

  // A prefix of whole pages needs a length that covers them.
  expectError([&] { cache.sharePrefix(1, 0, 2); }, {"sequence 0 has 0 tokens", "whole pages"});
  NewTokens n = randomTokens(rng, DType::BF16, 1, 1, 40, 32, kHost);
  cache.write(std::vector<int64_t>{0}, n.k, n.v);
  EXPECT_EQ(cache.length(0), 40);
  cache.sharePrefix(1, 0, 2);
  EXPECT_EQ(cache.pages(1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(cache.length(1), 32);
  EXPECT_EQ(cache.refCount(0), 2);
  EXPECT_EQ(cache.refCount(2), 1);
  // Sequence 1 writes past the shared pages into a page of its own.
  NewTokens one = randomTokens(rng, DType::BF16, 1, 1, 1, 32, kHost);
  cache.write(std::vector<int64_t>{1}, one.k, one.v);
  EXPECT_EQ(cache.pages(1).size(), 3u);
  EXPECT_EQ(cache.refCount(cache.pages(1)[2]), 1);
  EXPECT_EQ(cache.numFreePages(), 2);
  // Erasing the source keeps the shared pages for sequence 1 and frees page 2.
  cache.erase(0);
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_TRUE(cache.pages(0).empty());
  EXPECT_EQ(cache.refCount(0), 1);
  EXPECT_EQ(cache.refCount(2), 0);
  EXPECT_EQ(cache.numFreePages(), 3);
  // The shared pages' contents survive: sequence 1 still reads the first 32 tokens of the prompt.
  const LogicalKV m = cache.materialize(2);
  const std::vector<float> mk = m.k.toHost<float>(), nk = n.k.toHost<float>();
  for (int64_t t = 0; t < 32; ++t)
    for (int64_t d = 0; d < 32; ++d)
      ASSERT_EQ(mk[size_t((1 * m.k.size(2) + t) * 32 + d)], nk[size_t(t * 32 + d)]) << "token " << t;
  cache.erase(1);
  EXPECT_EQ(cache.numFreePages(), 6);
  for (int64_t page = 0; page < 6; ++page) EXPECT_EQ(cache.refCount(page), 0);

  // assign: explicit pages, shared with a sequence that already holds them.
  cache.assign(0, std::vector<int32_t>{4, 1}, 20);
  cache.assign(2, std::vector<int32_t>{4}, 16);
  EXPECT_EQ(cache.refCount(4), 2);
  EXPECT_EQ(cache.numFreePages(), 4);
  expectError([&] { cache.assign(0, std::vector<int32_t>{3}, 1); }, {"sequence 0 is not empty", "erase it first"});
  // A write that would land in a shared page (sequence 2 at length 10 shares page 4) is an error.
  cache.erase(2);
  cache.assign(2, std::vector<int32_t>{4}, 10);
  expectError([&] { cache.write(std::vector<int64_t>{2}, one.k, one.v); },
              {"sequence 2 would write into page 4", "2 sequences share", "read-only"});
  EXPECT_EQ(cache.length(2), 10);
}

TEST(PagedKVCache, ExhaustionAndBadWritesChangeNothing) {
  std::mt19937_64 rng(11);
  PagedKVCache cache(DType::BF16, 2, 32, /*numPages*/ 4, /*pageSize*/ 16, /*maxBatch*/ 2, /*maxPages*/ 3, kHost);
  expectError([&] { cache.reserve(0, 49); }, {"cannot hold 49 tokens", "maxPagesPerSequence = 3"});
  cache.reserve(0, 48);
  expectError([&] { cache.reserve(1, 17); }, {"pool is exhausted", "needs 2 more pages", "1 of 4 pages are free"});
  EXPECT_TRUE(cache.pages(1).empty());
  EXPECT_EQ(cache.numFreePages(), 1);

  NewTokens two = randomTokens(rng, DType::BF16, 2, 2, 20, 32, kHost);
  // Two rows that together need 2 pages for sequence 1 but 1 is free: nothing is written or taken.
  expectError([&] { cache.append(two.k, two.v); }, {"pool is exhausted", "needs 2 more pages", "1 of 4"});
  EXPECT_EQ(cache.length(0), 0);
  EXPECT_EQ(cache.numFreePages(), 1);

  NewTokens one = randomTokens(rng, DType::BF16, 1, 2, 20, 32, kHost);
  expectError([&] { cache.write(std::vector<int64_t>{2}, one.k, one.v); }, {"batch index 2", "[0, maxBatch = 2)"});
  expectError([&] { cache.write(std::vector<int64_t>{0, 0}, two.k, two.v); }, {"sequence 0 is listed twice"});
  expectError([&] { cache.write(std::vector<int64_t>{0}, two.k, two.v); }, {"1 batch indices for 2 rows"});
  expectError([&] { cache.write(std::vector<int64_t>{0}, one.k, one.v, std::vector<int64_t>{21}); },
              {"token count 21", "[0, T = 20]"});
  const Tensor f32 = Tensor::zeros(DType::F32, {1, 2, 4, 32}, kHost);
  expectError([&] { cache.write(std::vector<int64_t>{0}, f32, f32); }, {"kNew is f32[1, 2, 4, 32]", "holds bf16"});
  const Tensor heads = Tensor::zeros(DType::BF16, {1, 4, 4, 32}, kHost);
  expectError([&] { cache.write(std::vector<int64_t>{0}, heads, heads); }, {"[B, Hkv = 2, T, D = 32]"});
  const Tensor k4 = Tensor::zeros(DType::BF16, {1, 2, 4, 32}, kHost), k5 = Tensor::zeros(DType::BF16, {1, 2, 5, 32}, kHost);
  expectError([&] { cache.write(std::vector<int64_t>{0}, k4, k5); }, {"one shape"});
  // Past the sequence's capacity (3 pages of 16).
  NewTokens many = randomTokens(rng, DType::BF16, 1, 2, 49, 32, kHost);
  expectError([&] { cache.write(std::vector<int64_t>{0}, many.k, many.v); },
              {"sequence 0 at length 0 cannot take 49 more tokens", "at most 48"});
  EXPECT_EQ(cache.length(0), 0);
  // What fits does go in.
  cache.write(std::vector<int64_t>{0}, one.k, one.v);
  EXPECT_EQ(cache.length(0), 20);
}

TEST(PagedKVCache, ConstructorAndIndexErrors) {
  expectError([] { PagedKVCache(DType::BF16, 1, 32, 4, 24, 1, 1, kHost); }, {"pageSize must be a power of two", "24"});
  expectError([] { PagedKVCache(DType::BF16, 1, 32, 4, 8, 1, 1, kHost); }, {"pageSize", "8"});
  expectError([] { PagedKVCache(DType::I32, 1, 32, 4, 16, 1, 1, kHost); }, {"dtype must be bf16, f16 or f32"});
  expectError([] { PagedKVCache(DType::BF16, 1, 40, 4, 16, 1, 1, kHost); }, {"headDim", "40"});
  expectError([] { PagedKVCache(DType::BF16, 1, 32, 0, 16, 1, 1, kHost); }, {"numPages must be >= 1"});
  expectError([] { PagedKVCache(DType::BF16, 1, 128, int64_t(1) << 20, 64, 1, 1, kHost); },
              {"exceed the kernels' 32-bit offsets"});
  PagedKVCache cache(DType::F16, 1, 32, 4, 16, 2, 2, kHost);
  expectError([&] { (void)cache.length(-1); }, {"batch index -1"});
  expectError([&] { cache.erase(2); }, {"PagedKVCache::erase", "batch index 2"});
  expectError([&] { (void)cache.refCount(4); }, {"page 4 is outside the pool of 4 pages"});
  expectError([&] { cache.assign(0, std::vector<int32_t>{4}, 1); }, {"page 4 is outside the pool of 4 pages"});
  expectError([&] { cache.assign(0, std::vector<int32_t>{1, 1}, 1); }, {"page 1 is listed twice"});
  expectError([&] { cache.assign(0, std::vector<int32_t>{1}, 17); }, {"length 17 does not fit 1 pages"});
  expectError([&] { cache.sharePrefix(1, 1, 0); }, {"cannot share with itself"});
  expectError([&] { (void)cache.view({.batches = 3}); }, {"batches must be in [1, maxBatch = 2]"});
  cache.assign(0, std::vector<int32_t>{2}, 10);
  expectError([&] { (void)cache.view({.length = 9}); }, {"length 9 must cover the longest sequence", "10 tokens"});
  expectError([&] { (void)cache.view({.length = 33}); }, {"capacity of 32 tokens"});
  EXPECT_NE(cache.describe().find("4 pages of 16 tokens (3 free)"), std::string::npos) << cache.describe();
}

// ---- bad paged inputs to the attention -----------------------------------------------------------

TEST(PagedKV, BadInputsAreNamed) {
  SeededRandom rng;
  PagedCase c{.B = 2, .Hq = 2, .Hkv = 1, .L = 4, .D = 32, .pageSize = 16, .lengths = {20, 30}};
  const PagedInputs good = makePagedInputs(rng, c, kHost);
  const Tensor q = randomTensor(rng, DType::BF16, {2, 2, 4, 32}, kHost);
  auto run = [&](const PagedKV& kv, const Tensor& query) { (void)flex_attention(query, kv); };
  ASSERT_NO_THROW(run(good.kv, q));

  // A page table entry past the pool, within a batch's length.
  {
    PagedKV kv = good.kv;
    std::vector<int32_t> table = good.table;
    table[size_t(1 * kv.maxPagesPerSequence() + 1)] = int32_t(kv.numPages());
    kv.pageTable = Tensor::fromHost(table, {2, kv.maxPagesPerSequence()}, kHost);
    expectError([&] { run(kv, q); }, {"page table entry [1, 1] = " + std::to_string(kv.numPages()),
                                      "outside the pool of " + std::to_string(kv.numPages()) + " pages",
                                      "keys [16, 30) of batch 1"});
    table[size_t(1 * kv.maxPagesPerSequence() + 1)] = -3;
    kv.pageTable = Tensor::fromHost(table, {2, kv.maxPagesPerSequence()}, kHost);
    expectError([&] { run(kv, q); }, {"page table entry [1, 1] = -3"});
  }
  // A batch longer than the view's length, and a length the table's pages cannot hold.
  {
    PagedKV kv = good.kv;
    kv.lengths = Tensor::fromHost(std::vector<int32_t>{20, 31}, {2}, kHost);
    expectError([&] { run(kv, q); }, {"lengths[1] = 31 is outside [0, length = 30]"});
    kv = good.kv;
    kv.length = kv.maxPagesPerSequence() * 16 + 1;
    expectError([&] { run(kv, q); }, {"needs", "but the page table holds " + std::to_string(kv.maxPagesPerSequence())});
  }
  // Dtypes, shapes and sizes.
  {
    const Tensor q16 = randomTensor(rng, DType::F16, {2, 2, 4, 32}, kHost);
    expectError([&] { run(good.kv, q16); }, {"paged KV storage is bf16, q is f16"});
    const Tensor q3 = randomTensor(rng, DType::BF16, {3, 2, 4, 32}, kHost);
    expectError([&] { run(good.kv, q3); }, {"page table has 2 sequences, the query batch is 3"});
    const Tensor q64 = randomTensor(rng, DType::BF16, {2, 2, 4, 64}, kHost);
    expectError([&] { run(good.kv, q64); }, {"head dim 32 differs from q's 64"});
    PagedKV kv = good.kv;
    kv.pageSize = 24;
    expectError([&] { run(kv, q); }, {"pageSize must be a power of two", "24"});
    kv = good.kv;
    kv.pageSize = 32;
    expectError([&] { run(kv, q); }, {"not a whole number of pages of 32 tokens"});
    kv = good.kv;
    kv.pageTable = Tensor::zeros(DType::I64, {2, 4}, kHost);
    expectError([&] { run(kv, q); }, {"page table must be i32 [B, maxPages]"});
    kv = good.kv;
    kv.k = Tensor::zeros(DType::BF16, {2, 1, kv.k.size(2), 32}, kHost);
    expectError([&] { run(kv, q); }, {"k storage must be [1, Hkv, numPages * pageSize, D]"});
    kv = good.kv;
    kv.lengths = Tensor::fromHost(std::vector<int32_t>{20}, {1}, kHost);
    expectError([&] { run(kv, q); }, {"lengths"});
  }
}

// ---- the kernel -------------------------------------------------------------------------------------

// The paged kernel is a kernel of its own: the contiguous one keeps its parameters (pinned by
// FlexAttention.ForwardParametersKeepTheirNamesAndOrder), the paged one appends the page table's.
TEST(PagedKV, PagedKernelAppendsItsParameters) {
  SeededRandom rng;
  PagedCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 64, .D = 32, .pageSize = 16, .lengths = {64}};
  const PagedInputs in = makePagedInputs(rng, c, kHost);
  const Tensor q = Tensor::zeros(DType::BF16, {1, 2, 64, 32}, kHost);
  const BlockMask mask = causalBlockMask(1, 1, 64, 64);
  const FlexAttentionPlan plan = plan_flex_attention(q, in.kv, noop_score(), mask);
  ASSERT_NE(plan.traced, nullptr);
  EXPECT_EQ(plan.kernelName, "flex_fwd_paged_noop_causal");
  EXPECT_EQ(plan.config.block_n, 16) << "the default BLOCK_N is narrowed to the page size";
  const std::string text = ir::printFunction(*plan.traced);
  const std::string params = text.substr(0, text.find(')') + 1);
  EXPECT_NE(params.find("%q_heads: i32, %scale: f32, %tiles: i32, %part_out: ptr<f32>, %part_lse: ptr<f32>, "
                        "%tile_steps: i32, %max_scores: ptr<f32>, %part_max: ptr<f32>, %page_table: ptr<i32>, "
                        "%page_table_stride_b: i32, "
                        "%kv_lengths: ptr<i32>)"),
            std::string::npos)
      << params;
  EXPECT_NE(cachedForwardKernel(mask.maskMod(), noop_score(), DType::BF16, true), nullptr);
  const Tensor kc = Tensor::zeros(DType::BF16, {1, 1, 64, 32}, kHost);
  const FlexAttentionPlan contiguous = plan_flex_attention(q, kc, kc, noop_score(), mask);
  EXPECT_EQ(contiguous.kernelName, "flex_fwd_noop_causal");
  EXPECT_NE(contiguous.traced, plan.traced);
}

// Decode steps reuse one trace: with per-batch lengths, whether S is a multiple of the mask's KV
// block is not a constant of the paged kernel (the lengths mask the keys either way), so S = 126
// .. 129 across the 128-key block boundary runs one kernel.
TEST(PagedKV, DecodeStepsDoNotRetrace) {
  SeededRandom rng;
  PagedKVCache cache(DType::BF16, 1, 32, 20, 16, 2, 10, kHost);
  NewTokens prompt = randomTokens(rng, DType::BF16, 2, 1, 125, 32, kHost);
  cache.append(prompt.k, prompt.v);
  const Tensor q = randomTensor(rng, DType::BF16, {2, 2, 1, 32}, kHost);
  size_t traces = 0;  // the kernel of the noop mask is shared with the other tests of this process
  for (int step = 0; step < 4; ++step) {
    NewTokens n = randomTokens(rng, DType::BF16, 2, 1, 1, 32, kHost);
    cache.append(n.k, n.v);
    (void)flex_attention(q, cache.view(), noop_score(), std::nullopt, config(16, 16));
    const dsl::Kernel* k = cachedForwardKernel(noop_mask(), noop_score(), DType::BF16, true);
    ASSERT_NE(k, nullptr);
    if (step == 0) traces = k->numTraces();
    EXPECT_EQ(k->numTraces(), traces) << "S = " << cache.length(0);
  }
}

// On sm_90a the paged kernel streams K and V through the cp.async ring and wgmma as the contiguous
// one does without TMA (FLEXTILE_TMA=0; a paged K/V has no tensor box) when the pages hold whole
// inner steps (one scalar table load per step, re-read by the pipeline for the steps ahead); pages
// smaller than BLOCK_N gather per key and are not pipelined.
TEST(PagedKV, WholePageStepsArePipelinedOnSm90a) {
  ::setenv("FLEXTILE_TMA", "0", 1);
  struct Unset {
    ~Unset() { ::unsetenv("FLEXTILE_TMA"); }
  } unset;
  SeededRandom rng;
  auto count = [](const std::string& text, const std::string& re) {
    std::regex r(re);
    return int(std::distance(std::sregex_iterator(text.begin(), text.end(), r), std::sregex_iterator()));
  };
  const int64_t B = 1, H = 2, S = 1024, D = 128;
  const Tensor q = Tensor::zeros(DType::BF16, {B, H, S, D}, kHost);
  const Tensor kc = Tensor::zeros(DType::BF16, {B, H, S, D}, kHost);
  const BlockMask mask = causalBlockMask(1, 1, S, S);
  const FlexAttentionOptions opts = config(64, 64);
  const codegen::CompiledKernel& contiguous =
      *plan_flex_attention(q, kc, kc, noop_score(), mask, opts, true, codegen::Target::sm90a()).compiled;
  const std::string copy = "cp\\.async\\.cg\\.shared\\.global";
  const std::string wgmma = "wgmma\\.mma_async";
  for (int64_t ps : {64, 256}) {
    SCOPED_TRACE("page size " + std::to_string(ps));
    PagedCase c{.B = B, .Hq = H, .Hkv = H, .L = 1, .D = D, .pageSize = ps, .lengths = {S}};
    const PagedInputs in = makePagedInputs(rng, c, kHost);
    const FlexAttentionPlan plan = plan_flex_attention(q, in.kv, noop_score(), mask, opts, true, codegen::Target::sm90a());
    ASSERT_NE(plan.compiled, nullptr);
    EXPECT_GT(count(plan.compiled->ptx, copy), 0);
    EXPECT_EQ(count(plan.compiled->ptx, copy), count(contiguous.ptx, copy));
    EXPECT_EQ(count(plan.compiled->ptx, wgmma), count(contiguous.ptx, wgmma));
    if (codegen::findPtxas()) {
      codegen::PtxasReport report;
      ASSERT_NO_THROW(report = codegen::runPtxas(plan.compiled->ptx, codegen::Target::sm90a()));
      EXPECT_EQ(report.spillStoreBytes, 0) << report.log;
    }
  }
  PagedCase small{.B = B, .Hq = H, .Hkv = H, .L = 1, .D = D, .pageSize = 32, .lengths = {S}};
  const PagedInputs in = makePagedInputs(rng, small, kHost);
  const FlexAttentionPlan gathered = plan_flex_attention(q, in.kv, noop_score(), mask, opts, true, codegen::Target::sm90a());
  EXPECT_EQ(count(gathered.compiled->ptx, copy), 0);
  if (codegen::findPtxas()) {
    EXPECT_NO_THROW(codegen::runPtxas(gathered.compiled->ptx, codegen::Target::sm90a()));
  }
}
