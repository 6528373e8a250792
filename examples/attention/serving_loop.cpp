// Serving: a batch of requests decoding on a paged KV cache (docs/paged-kv.md, docs/decode.md).
//
//   prefill   each request's prompt K/V written into its pages (cache.write, ragged prompts), the
//             prompts attended with the prefill template over the paged view (the causal mask
//             built once at the maximum length, its first rows sliced to the prompts' length)
//   decode    per step one new token per request (cache.append) and one query per head (L = 1:
//             flex_attention picks the decode template by itself), at the newest position of the
//             longest request, the same pre-built mask addressed through options.query_offset;
//             requests of other lengths see their own keys only (the cache's per-sequence lengths)
//   halfway   one request finishes (cache.erase) and a new one takes its slot, sharing the whole
//             pages of request 0's prompt prefix (cache.sharePrefix): only its own prompt tail is
//             written and prefilled
//
// Every step checks the outputs of a sample of (request, head) rows (all of them on the small
// shape) against the float64 reference over cache.materialize(), with each request's keys cut at
// its length and the causal mask at the request's *own* newest position, and prints one line.
// Any error above the bf16 tolerance exits 1. On the GPU a decode step is timed too, called and
// replayed from a CUDA graph (runtime/Graph.h).
//
//   attention_serving_loop [--require-gpu] [--small] [--interpret] [--steps N] [--seed S] [--sinks]
//
// --sinks: GPT-OSS's attention sinks, a logit per head (FlexAttentionOptions::sinks) in every
// call, prefill and decode, and in the reference.
//
// Small shape (the interpreter, or --small): 4 requests, Hq=8 Hkv=2 D=64, pages of 16 tokens,
// at most 256 tokens. GPU: 8 requests, Hq=8 Hkv=2 D=128, pages of 128, at most 8192 tokens.
// FLEXTILE_EXAMPLE_WRONG_REFERENCE=1 puts the reference's query one position too early (the newest
// key is dropped), so the check must fail.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/PagedKVCache.h"
#include "attention_templates/Reference.h"
#include "runtime/Device.h"
#include "runtime/Event.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;

namespace {

constexpr int kSkipped = 77;
constexpr double kOutTolerance = 1.6e-2;  // |out - reference| per element, bf16

struct Setup {
  int64_t Hq = 8, Hkv = 2, D = 64, pageSize = 16, maxLen = 256;
  std::vector<int64_t> prompts;    // per request (the batch is prompts.size())
  int64_t finishing = 2;           // the request that finishes halfway
  int64_t sharedPages = 2;         // whole pages of request 0's prompt the new request shares
  int64_t newPromptTail = 12;      // the new request's own prompt tokens after the shared prefix
  int64_t B() const { return int64_t(prompts.size()); }
};

// Host data and the copy a call runs on (the same tensor on the interpreter): the reference reads
// the host one.
struct Pair {
  Tensor host, run;
};

// Random bf16 data on the host (rounded once, so both copies agree) and, on the GPU, a device copy.
// q and k are normal, q at twice k's scale, so that the scores have a standard deviation of about
// 2 and the softmax is peaked as a trained model's is: on near-uniform weights a wrong or missing
// key moves the output by less than the tolerance, and the check would prove little. v is uniform
// in [-1, 1], so |out| <= 1 and bf16's rounding of out stays well inside the tolerance.
template <class Distribution>
Pair randomTensor(std::mt19937_64& rng, Shape shape, Distribution dist, MemorySpace space) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> data(static_cast<size_t>(n));
  for (float& x : data) x = dist(rng);
  Pair p;
  p.host = Tensor::fromHost(data, DType::BF16, shape);
  p.run = space == MemorySpace::Host ? p.host : p.host.to(space);
  return p;
}
Pair queries(std::mt19937_64& rng, Shape shape, MemorySpace space) {
  return randomTensor(rng, std::move(shape), std::normal_distribution<float>(0.0f, 2.0f), space);
}
Pair keys(std::mt19937_64& rng, Shape shape, MemorySpace space) {
  return randomTensor(rng, std::move(shape), std::normal_distribution<float>(0.0f, 1.0f), space);
}
Pair values(std::mt19937_64& rng, Shape shape, MemorySpace space) {
  return randomTensor(rng, std::move(shape), std::uniform_real_distribution<float>(-1.0f, 1.0f), space);
}

// The paged K/V of one sequence of a view (its page-table row and its length, views: no copy).
PagedKV oneSequence(const PagedKV& kv, int64_t b) {
  PagedKV one = kv;
  const int64_t maxPages = kv.pageTable.size(1);
  one.pageTable = Tensor::viewOf(kv.pageTable, b * maxPages, {1, maxPages});
  one.lengths = Tensor::viewOf(kv.lengths, b, {1});
  return one;
}

struct CheckResult {
  double outErr = 0, lseErr = 0;
  bool ok = true;
  std::string firstProblem;
};

// Compares rows [row0, row0 + rows) of out[qb, h] (q's batch qb; the cache's sequence `seq`) with
// the float64 reference over the logical K/V `logical` (cache.materialize()): causal at the
// rows' own positions firstPos.., keys at or past the sequence's length `length` excluded.
// `sinks`: each head's attention sink, or empty.
void checkRows(CheckResult& r, const Tensor& qHost, const FlexAttentionResult& got, int64_t qb, int64_t h,
               int64_t row0, int64_t rows, const LogicalKV& logical, int64_t seq, int64_t length, int64_t firstPos,
               int64_t Hq, int64_t Hkv, const std::vector<double>& sinks) {
  const int64_t L = qHost.size(2), D = qHost.size(3), S = logical.k.size(2), hk = h / (Hq / Hkv);
  const Tensor q = Tensor::viewOf(qHost, ((qb * Hq + h) * L + row0) * D, {1, 1, rows, D});
  const Tensor k = Tensor::viewOf(logical.k, (seq * Hkv + hk) * S * D, {1, 1, S, D});
  const Tensor v = Tensor::viewOf(logical.v, (seq * Hkv + hk) * S * D, {1, 1, S, D});
  static const bool wrong = std::getenv("FLEXTILE_EXAMPLE_WRONG_REFERENCE") != nullptr;
  const int64_t refPos = wrong ? firstPos - 1 : firstPos;
  const RefMaskFn causalWithinLength = [length](int64_t, int64_t, int64_t qi, int64_t kv) {
    return kv <= qi && kv < length;
  };
  const std::vector<double> sink = sinks.empty() ? std::vector<double>() : std::vector<double>{sinks[size_t(h)]};
  const ReferenceResult ref = referenceAttention(q, k, v, nullptr, causalWithinLength, 1.0 / std::sqrt(double(D)),
                                                 refPos, sink.empty() ? nullptr : &sink);
  const std::vector<double> out = toDoubles(Tensor::viewOf(got.out, ((qb * Hq + h) * L + row0) * D, {rows, D}));
  const std::vector<double> lse = toDoubles(Tensor::viewOf(got.lse, (qb * Hq + h) * L + row0, {rows}));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t d = 0; d < D; ++d) {
      const double e = std::abs(out[size_t(i * D + d)] - ref.out[size_t(i * D + d)]);
      r.outErr = std::max(r.outErr, std::isfinite(e) ? e : INFINITY);
      if (!(e <= kOutTolerance) && r.ok) {
        r.ok = false;
        r.firstProblem = "request " + std::to_string(seq) + " head " + std::to_string(h) + " position " +
                         std::to_string(firstPos + i) + ": out[" + std::to_string(d) + "] = " +
                         std::to_string(out[size_t(i * D + d)]) + ", reference " +
                         std::to_string(ref.out[size_t(i * D + d)]);
      }
    }
    const double want = ref.lse[size_t(i)], have = lse[size_t(i)], e = std::abs(have - want);
    r.lseErr = std::max(r.lseErr, std::isfinite(e) ? e : INFINITY);
    if (!(e <= 2e-2 + 1e-3 * std::abs(want)) && r.ok) {
      r.ok = false;
      r.firstProblem = "request " + std::to_string(seq) + " head " + std::to_string(h) + " position " +
                       std::to_string(firstPos + i) + ": lse " + std::to_string(have) + ", reference " +
                       std::to_string(want);
    }
  }
}

std::string joined(const std::vector<int64_t>& xs) {
  std::string s;
  for (int64_t x : xs) s += (s.empty() ? "" : " ") + std::to_string(x);
  return s;
}

}  // namespace

int main(int argc, char** argv) try {
  bool requireGpu = false, small = false, interpret = false, withSinks = false;
  int steps = 8;
  uint64_t seed = std::random_device{}();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--require-gpu") requireGpu = true;
    else if (a == "--small") small = true;
    else if (a == "--interpret") interpret = true;
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--sinks") withSinks = true;
    else {
      std::fprintf(stderr, "usage: attention_serving_loop [--require-gpu] [--small] [--interpret] [--steps N] "
                           "[--seed S] [--sinks]\n");
      return 2;
    }
  }
  std::string why;
  const bool haveGpu = deviceAvailable(&why);
  if (requireGpu && !haveGpu) {
    std::printf("attention_serving_loop: skipped, no GPU (%s)\n", why.c_str());
    return kSkipped;
  }
  const bool gpu = haveGpu && !interpret;
  const MemorySpace space = gpu ? MemorySpace::Device : MemorySpace::Host;
  Setup s;
  s.prompts = {75, 40, 58, 23};
  if (gpu && !small) {
    s.D = 128, s.pageSize = 128, s.maxLen = 8192, s.sharedPages = 8, s.newPromptTail = 100;
    s.prompts = {3000, 1200, 4500, 700, 2600, 3900, 1800, 5100};
  }
  if (steps < 2 || *std::max_element(s.prompts.begin(), s.prompts.end()) + steps > s.maxLen) {
    std::fprintf(stderr, "attention_serving_loop: --steps must be in [2, %lld]\n",
                 (long long)(s.maxLen - *std::max_element(s.prompts.begin(), s.prompts.end())));
    return 2;
  }
  const int64_t B = s.B(), Hq = s.Hq, Hkv = s.Hkv, D = s.D;
  const bool checkAllHeads = !gpu || small;
  std::printf("serving loop on %s: %lld requests, Hq=%lld Hkv=%lld D=%lld bf16, causal, pages of %lld tokens; "
              "seed %llu\n",
              gpu ? ("the GPU (" + runtime::Device::current().name() + ")").c_str()
                  : (haveGpu ? "the IR interpreter (--interpret)" : ("the IR interpreter (no GPU: " + why + ")").c_str()),
              (long long)B, (long long)Hq, (long long)Hkv, (long long)D, (long long)s.pageSize,
              (unsigned long long)seed);
  std::mt19937_64 rng(seed);
  // Every call's options: the attention sinks with --sinks (near the log of a prompt's keys).
  FlexAttentionOptions withOptions;
  std::vector<double> sinks;
  if (withSinks) {
    std::uniform_real_distribution<double> near(std::log(double(s.prompts[0])) - 2, std::log(double(s.prompts[0])) + 2);
    for (int64_t h = 0; h < s.Hq; ++h) sinks.push_back(near(rng));
    withOptions.sinks = Tensor::fromHost(std::vector<float>(sinks.begin(), sinks.end()), {s.Hq}, space);
    std::printf("with attention sinks\n");
  }
  auto options = [&](std::optional<int64_t> queryOffset, bool returnLse = true) {
    FlexAttentionOptions o = withOptions;
    o.return_lse = returnLse;
    o.query_offset = queryOffset;
    return o;
  };

  // One cache (a model has one per layer). The pool holds half of what reserving the maximum
  // length for every request would take: pages are handed out as the sequences grow.
  const int64_t maxPagesPerSequence = s.maxLen / s.pageSize;
  PagedKVCache cache(DType::BF16, Hkv, D, /*numPages*/ B * maxPagesPerSequence / 2, s.pageSize, /*maxBatch*/ B,
                     maxPagesPerSequence, space);
  // The mask, built once at the maximum length: every step below addresses it, none rebuilds it.
  const BlockMask causal = causalBlockMask(1, 1, s.maxLen, s.maxLen);
  bool ok = true;
  auto report = [&](const std::string& what, const CheckResult& r) {
    std::printf("%s  max |out err| %.2e  max |lse err| %.2e  %s\n", what.c_str(), r.outErr, r.lseErr,
                r.ok ? "ok" : "FAILED");
    if (!r.ok) std::printf("  FAILED: %s\n", r.firstProblem.c_str());
    ok = ok && r.ok;
  };
  // The (request, head) rows a step checks: every head on the small shape, else the first and the
  // last head (two KV heads) and a random one.
  auto headsToCheck = [&] {
    std::set<int64_t> hs{0, Hq - 1, int64_t(rng() % uint64_t(Hq))};
    if (checkAllHeads)
      for (int64_t h = 0; h < Hq; ++h) hs.insert(h);
    return hs;
  };

  // ---- prefill ------------------------------------------------------------------------------
  // The prompts padded to the longest, T; cache.write takes each request's real token count.
  const int64_t T = *std::max_element(s.prompts.begin(), s.prompts.end());
  {
    Pair kPrompt = keys(rng, {B, Hkv, T, D}, space), vPrompt = values(rng, {B, Hkv, T, D}, space);
    Pair qPrompt = queries(rng, {B, Hq, T, D}, space);
    std::vector<int64_t> all(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) all[size_t(b)] = b;
    cache.write(all, kPrompt.run, vPrompt.run, s.prompts);
    // The view's length is the mask's KV length (the bucket maxLen): one mask serves every call.
    // The prefill template takes a mask of exactly q's T queries: the first rows of the big one.
    const PagedKV kv = cache.view({.length = s.maxLen});
    const BlockMask firstRows = causal.sliceRows(0, (T + causal.qBlockSize() - 1) / causal.qBlockSize(), 0, T);
    const FlexAttentionResult r = flex_attention(qPrompt.run, kv, noop_score(), firstRows, options(std::nullopt));
    const FlexAttentionResult rHost{r.out.to(MemorySpace::Host), r.lse.to(MemorySpace::Host)};
    // The last (up to) 16 prompt positions of each request: the last one makes its first token.
    const LogicalKV logical = cache.materialize();
    CheckResult c;
    for (int64_t b = 0; b < B; ++b) {
      const int64_t rows = std::min<int64_t>(16, s.prompts[size_t(b)]), row0 = s.prompts[size_t(b)] - rows;
      for (int64_t h : headsToCheck())
        checkRows(c, qPrompt.host, rHost, b, h, row0, rows, logical, b, s.prompts[size_t(b)], row0, Hq, Hkv, sinks);
    }
    report("prefill  prompts " + joined(s.prompts) + " (T=" + std::to_string(T) + ")", c);
    std::printf("  %s\n", cache.describe().c_str());
  }

  // ---- decode steps -----------------------------------------------------------------------
  // The last step's inputs, for the timing below.
  Tensor lastQ;
  PagedKV lastKv;
  int64_t lastPos = 0;
  for (int step = 0; step < steps; ++step) {
    if (step == steps / 2) {
      // Request `finishing` is done: its pages go back to the pool. A new request takes its slot
      // and starts with request 0's first sharedPages whole pages (a common system prompt, say):
      // those pages are now held by two sequences and are not written again.
      const int64_t slot = s.finishing, before = cache.numFreePages();
      cache.erase(slot);
      const int64_t freed = cache.numFreePages() - before;
      cache.sharePrefix(slot, /*srcBatch*/ 0, s.sharedPages);
      const int64_t prefix = cache.length(slot);
      // Its own prompt tail, after the shared prefix: written into pages of its own and attended
      // from its positions [prefix, prefix + tail) through the same mask (L <= 128 with a
      // query_offset: the decode template), over a view of this one sequence.
      Pair kTail = keys(rng, {1, Hkv, s.newPromptTail, D}, space);
      Pair vTail = values(rng, {1, Hkv, s.newPromptTail, D}, space);
      Pair qTail = queries(rng, {1, Hq, s.newPromptTail, D}, space);
      cache.write(std::vector<int64_t>{slot}, kTail.run, vTail.run);
      const PagedKV kv = oneSequence(cache.view({.length = s.maxLen}), slot);
      const FlexAttentionResult r = flex_attention(qTail.run, kv, noop_score(), causal, options(prefix));
      const FlexAttentionResult rHost{r.out.to(MemorySpace::Host), r.lse.to(MemorySpace::Host)};
      const LogicalKV logical = cache.materialize();
      CheckResult c;
      for (int64_t h : headsToCheck())
        checkRows(c, qTail.host, rHost, 0, h, 0, s.newPromptTail, logical, slot, cache.length(slot), prefix, Hq, Hkv,
                  sinks);
      std::printf("request %lld finished (%lld pages freed); a new request in its slot shares request 0's first "
                  "%lld page(s) (held by %lld sequences now) and writes %lld prompt tokens of its own\n",
                  (long long)slot, (long long)freed, (long long)s.sharedPages,
                  (long long)cache.refCount(cache.pages(0)[0]), (long long)s.newPromptTail);
      report("prefill  new request " + std::to_string(slot) + " positions " + std::to_string(prefix) + ".." +
                 std::to_string(cache.length(slot) - 1),
             c);
    }

    // One new token per request: its K/V appended at each sequence's own end.
    Pair kStep = keys(rng, {B, Hkv, 1, D}, space), vStep = values(rng, {B, Hkv, 1, D}, space);
    Pair qStep = queries(rng, {B, Hq, 1, D}, space);
    cache.append(kStep.run, vStep.run);
    std::vector<int64_t> lengths(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b) lengths[size_t(b)] = cache.length(b);
    // All requests query at the longest one's newest position: causal allows every key below it,
    // and each request's length cuts its own keys, so each sees exactly its keys 0..length-1.
    const int64_t pos = *std::max_element(lengths.begin(), lengths.end()) - 1;
    const PagedKV kv = cache.view({.length = s.maxLen});
    const FlexAttentionResult r = flex_attention(qStep.run, kv, noop_score(), causal, options(pos));

    const FlexAttentionResult rHost{r.out.to(MemorySpace::Host), r.lse.to(MemorySpace::Host)};
    const LogicalKV logical = cache.materialize();
    CheckResult c;
    // The reference puts each request's query at its own newest position, lengths[b] - 1.
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h : headsToCheck())
        checkRows(c, qStep.host, rHost, b, h, 0, 1, logical, b, lengths[size_t(b)], lengths[size_t(b)] - 1, Hq, Hkv,
                  sinks);
    char head[64];
    std::snprintf(head, sizeof head, "step %2d  query_offset %4lld  lengths ", step, (long long)pos);
    report(head + joined(lengths), c);
    lastQ = qStep.run, lastKv = kv, lastPos = pos;
  }
  std::printf("  %s\n", cache.describe().c_str());

  // ---- timing (GPU) -------------------------------------------------------------------------
  if (gpu) {
    Tensor out = Tensor::empty(DType::BF16, lastQ.shape(), space), lse = Tensor::empty(DType::F32, {B, Hq, 1}, space);
    const FlexAttentionOptions o = options(lastPos, /*returnLse=*/false);
    const double ms = runtime::median(runtime::timeKernel(
        [&] { flex_attention_into(lastQ, lastKv, noop_score(), causal, out, &lse, o); }, 3, 20));
    int64_t totalKeys = 0;
    for (int64_t b = 0; b < B; ++b) totalKeys += cache.length(b);
    const double bytes = double(totalKeys) * double(Hkv * D) * 2 /*K and V*/ * 2 /*bf16*/;
    std::printf("decode step (the attention call, B=%lld, %lld keys in all): %.1f us (median of 20), %.2f TB/s "
                "of K/V\n",
                (long long)B, (long long)totalKeys, ms * 1e3, bytes / (ms * 1e-3) * 1e-12);
    // The same step as a serving loop would issue it without the host's per-call work: captured
    // into a CUDA graph (runtime/Graph.h) on a stream, after one eager call on that stream, and
    // replayed. A real loop keeps what changes per step in device memory (query_offsets, the
    // cache's page table and lengths) so that one captured step serves every step.
    runtime::Stream stream;
    FlexAttentionOptions onStream = o;
    onStream.stream = &stream;
    auto step = [&] { flex_attention_into(lastQ, lastKv, noop_score(), causal, out, &lse, onStream); };
    step();
    constexpr int kStepsAGraph = 20;
    const runtime::Graph graph = runtime::Graph::capture(stream, [&] {
      for (int i = 0; i < kStepsAGraph; ++i) step();
    });
    const double graphMs =
        runtime::median(runtime::timeKernel([&] { graph.launch(stream); }, {.warmup = 2, .reps = 10, .stream = &stream})) /
        kStepsAGraph;
    std::printf("the same step replayed from a CUDA graph (%d steps a graph): %.1f us, %.2f TB/s of K/V\n",
                kStepsAGraph, graphMs * 1e3, bytes / (graphMs * 1e-3) * 1e-12);
  }
  std::printf("serving loop: %s\n", ok ? "passed" : "FAILED (an output is off the float64 reference by more "
                                                   "than the bf16 tolerance)");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_serving_loop: %s\n", e.what());
  return 1;
}
