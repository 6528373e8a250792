// Decode bench: a few new queries against a long KV cache, in TB/s of K and V read (the bytes of
// the KV blocks the call reads: all of them without a mask, the live ones with one) and µs per call.
//
//   flextile_attention_decode_bench              # the decode shapes below, default configs
//   flextile_attention_decode_bench --sweep      # also a config sweep on the main shape
//   flextile_attention_decode_bench --sweep-splits   # block size (32-128) x stages x split count on every shape
//   flextile_attention_decode_bench --sweep-ws   # the producer warpgroup (config `ws`) at 2 and 3 stages, BN 64 and 128
//   flextile_attention_decode_bench --timeline   # also each shape's phases from the kernel's own clock (printTimeline)
//   flextile_attention_decode_bench --timeline-csv F   # and every program's stamps of 10 calls into F (ns, SM)
//   flextile_attention_decode_bench --only decode_causal   # one shape (repeatable), e.g. under ncu
//   flextile_attention_decode_bench --config 64,4,2,4      # also this config on every shape (repeatable)
//   flextile_attention_decode_bench --tune       # also the decode autotuner's winner on every shape
//   flextile_attention_decode_bench --graph      # also 20 steps captured in a CUDA graph, per step (no host)
//   flextile_attention_decode_bench --max-scores # every call also writes the rows' largest scores
//   flextile_attention_decode_bench --sinks      # every call has attention sinks (a logit per head near log S)
//
// The main shape is ../shared/bench/torch_reference.py's `decode` (B=8, Hq=32, Hkv=8, S=32768,
// D=128, bf16, one query); bench/torch_decode.py times PyTorch FlexAttention and SDPA on every
// shape here in the same run. Before timing, every call is checked against the prefill template
// on the same inputs (itself checked against float64 by the tests); a wrong config is not timed.
//
// Timing: runtime::timeKernel, each call between two events on the legacy default stream (where
// flex_attention launches), 5 warm-up calls, then the median of 50; the calls are queued back to
// back (the host never waits between them) and the L2 is not flushed. Most shapes read far more
// than the H200's L2 (decode 1 GB, window 134 MB, S=2048 67 MB); the B=1 S=2048 call reads 8 MB,
// which stays in L2 across calls: its figure is an L2 figure.
//
// Yardstick: for each shape, a device-to-device copy (cuMemcpyDtoD) timed the same way, of half
// the bytes the call reads, so that it moves (reads + writes) as many bytes as the call reads.
// Its TB/s — bytes moved / time — is the honest ceiling for a call of that size: a short call pays
// the same launch, ramp and tail, which a 1 GB copy's 4.1-4.3 TB/s hides. `of copy` is the call's
// TB/s over the copy's.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "BenchUtil.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/PagedKVCache.h"
#include "attention_templates/Reference.h"
#include "autotune/Autotune.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/Event.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using bench::randomBf16;

namespace {

struct Shape {
  std::string name;
  int64_t B, Hq, Hkv, S, L, D;
  int64_t window = 0;  // > 0: a sliding-window mask of this many keys (causal)
  bool causalMask = false;
  int64_t pageSize = 0;  // > 0: K/V in a paged pool of pages in random physical order
  // The mask's lists only on the device (BlockMask::fromListTensors): 1 without bounds, 2 with the
  // window's bound on live blocks a row (window / KV_BLOCK_SIZE + 2).
  int deviceLists = 0;
};

// The same logical K/V as `k`, `v` in a pool of pages at random physical positions.
PagedKV pagedCopy(std::mt19937_64& rng, const Tensor& k, const Tensor& v, int64_t pageSize) {
  const int64_t B = k.size(0), H = k.size(1), S = k.size(2), D = k.size(3), perSeq = (S + pageSize - 1) / pageSize;
  std::vector<int32_t> perm(size_t(B * perSeq));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<float> kh = k.toHost<float>(), vh = v.toHost<float>();
  std::vector<float> kp(size_t(H * B * perSeq * pageSize * D)), vp(kp.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < S; ++t) {
        const int64_t phys = int64_t(perm[size_t(b * perSeq + t / pageSize)]) * pageSize + t % pageSize;
        const size_t from = size_t(((b * H + h) * S + t) * D), to = size_t((h * B * perSeq * pageSize + phys) * D);
        std::copy_n(kh.begin() + std::ptrdiff_t(from), D, kp.begin() + std::ptrdiff_t(to));
        std::copy_n(vh.begin() + std::ptrdiff_t(from), D, vp.begin() + std::ptrdiff_t(to));
      }
  PagedKV kv;
  kv.k = Tensor::fromHost(kp, DType::BF16, {1, H, B * perSeq * pageSize, D}, MemorySpace::Device);
  kv.v = Tensor::fromHost(vp, DType::BF16, {1, H, B * perSeq * pageSize, D}, MemorySpace::Device);
  kv.pageTable = Tensor::fromHost(perm, {B, perSeq}, MemorySpace::Device);
  kv.pageSize = pageSize;
  kv.length = S;
  return kv;
}

double maxAbsDiff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.toHost<float>(), y = b.toHost<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, double(std::abs(x[i] - y[i])) + (std::isfinite(x[i]) ? 0 : 1e9));
  return m;
}

// Bytes of K and V in the blocks the call reads: every key without a mask; with one, the listed
// blocks that hold a key the query at `pos` may see (the template skips a listed partial block
// without one: a window's left edge).
double kvBytesRead(const Shape& s, const std::optional<BlockMask>& mask, int64_t pos) {
  const double perKey = double(s.B) * double(s.Hkv) * double(s.D) * 2 /*bytes*/ * 2 /*K and V*/;
  if (!mask) return perKey * double(s.S);
  const int64_t row = (pos - mask->qOffset()) / mask->qBlockSize(), kvbs = mask->kvBlockSize();
  const int64_t firstKey = s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
  double keys = 0;
  for (auto list : {mask->fullKvBlocks(0, 0, row), mask->partialKvBlocks(0, 0, row)})
    for (int32_t j : list)
      if ((j + 1) * kvbs > firstKey && j * kvbs <= pos) keys += double(std::min<int64_t>(kvbs, s.S - j * kvbs));
  return perKey * keys;
}

double emptyKernelMicroseconds(int64_t programs);

// --graph: 20 steps of the call captured in a CUDA graph on a stream of their own (runtime/Graph.h),
// as a serving loop replays its decode steps: the events around one replay, over 20, give a step's
// time without the host's per-call work. The replay's output is checked against the eager call's.
void printGraphSteps(const std::string& name, double bytes, double callUs, FlexAttentionOptions o,
                     const std::function<void(const FlexAttentionOptions&)>& run, Tensor& out, const Tensor& want) {
  constexpr int kSteps = 20;
  runtime::Stream stream;
  o.stream = &stream;
  run(o);  // this stream's scratch, before the capture
  runtime::Graph graph = runtime::Graph::capture(stream, [&] {
    for (int i = 0; i < kSteps; ++i) run(o);
  });
  out.copyFromHost(std::vector<float>(size_t(out.numel()), NAN));
  graph.launch(stream);
  stream.synchronize();
  const double err = maxAbsDiff(out, want);
  if (!(err < 2e-2)) {
    std::printf("%-18s graph of %d steps WRONG (max |graph - prefill| %.2e)\n", name.c_str(), kSteps, err);
    return;
  }
  runtime::TimingOptions timing;
  timing.warmup = 3;
  timing.reps = 20;
  timing.stream = &stream;
  const double us = runtime::median(runtime::timeKernel([&] { graph.launch(stream); }, timing)) * 1e3 / kSteps;
  std::printf("%-18s graph of %d steps %17.1f us %6.2f TB/s a step  (%.1f us a call without the graph)\n",
              name.c_str(), kSteps, us, bytes / us / 1e6, callUs);
}

// --timeline: where one call's time goes, from the kernel's own clock (FlexAttentionOptions::
// decode_timeline): each phase's time after the first program started, over the programs
// (median and last), three warm calls after the timed ones. `end` of the last program against the
// events' figure is what the launch and the events cost around the kernel.
void printTimeline(const std::string& name, const Tensor& q, const Tensor& k, const Tensor& v,
                   const std::optional<BlockMask>& mask, FlexAttentionOptions o,
                   const std::function<void(const FlexAttentionOptions&)>& run, std::FILE* csv) {
  const FlexDecodePlan plan = plan_flex_decode(q, k, v, noop_score(), mask, o);
  const int64_t programs = plan.config.splits * (q.shape()[1] / plan.headsPerProgram) * q.shape()[0];
  Tensor stamps = Tensor::zeros(DType::I64, {programs, kTimelineSlots}, MemorySpace::Device);
  o.decode_timeline = stamps;
  const char* phases[kTimelineSm] = {"start", "walked", "released", "merging", "end"};
  for (int call = 0; call < (csv ? 10 : 3); ++call) {
    run(o);
    runtime::synchronize();
    const std::vector<int64_t> t = stamps.toHost<int64_t>();
    int64_t zero = INT64_MAX;
    for (int64_t p = 0; p < programs; ++p) zero = std::min(zero, t[size_t(p * kTimelineSlots + kTimelineStart)]);
    if (csv) {
      for (int64_t p = 0; p < programs; ++p) {
        std::fprintf(csv, "%s,%d,%lld,%lld", name.c_str(), call, static_cast<long long>(p),
                     static_cast<long long>(t[size_t(p * kTimelineSlots + kTimelineSm)]));
        for (int e = 0; e < kTimelineSm; ++e) {
          const int64_t x = t[size_t(p * kTimelineSlots + e)];
          std::fprintf(csv, ",%lld", static_cast<long long>(x ? x - zero : -1));
        }
        std::fprintf(csv, "\n");
      }
      std::fflush(csv);
      if (call >= 3) continue;
    }
    std::printf("%-18s timeline call %d, %lld programs (us after the first start, median / last):", name.c_str(), call,
                static_cast<long long>(programs));
    for (int e = 0; e < kTimelineSm; ++e) {
      std::vector<double> at;
      for (int64_t p = 0; p < programs; ++p)
        if (const int64_t x = t[size_t(p * kTimelineSlots + e)]; x != 0) at.push_back(double(x - zero) / 1e3);
      if (at.empty()) continue;
      std::sort(at.begin(), at.end());
      std::printf("  %s %.2f / %.2f", phases[e], at[at.size() / 2], at.back());
    }
    std::printf("\n");
    // Where the late walks ran: the SMs of the eight last (call after call: the same SMs, or
    // others?), and the walk end by how many of the call's programs shared the SM.
    auto walked = [&](int64_t p) { return t[size_t(p * kTimelineSlots + kTimelineWalked)]; };
    auto smOf = [&](int64_t p) { return t[size_t(p * kTimelineSlots + kTimelineSm)]; };
    std::vector<int64_t> order(static_cast<size_t>(programs));
    for (int64_t p = 0; p < programs; ++p) order[size_t(p)] = p;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return walked(a) > walked(b); });
    std::printf("%-18s SMs of the 8 last walks:", name.c_str());
    for (size_t i = 0; i < std::min<size_t>(8, order.size()); ++i)
      std::printf(" %lld", static_cast<long long>(smOf(order[i])));
    std::map<int64_t, int> onSm;
    for (int64_t p = 0; p < programs; ++p) ++onSm[smOf(p)];
    std::map<int, std::vector<double>> bySharing;
    for (int64_t p = 0; p < programs; ++p) bySharing[onSm[smOf(p)]].push_back(double(walked(p) - zero) / 1e3);
    std::printf(";  walk end by programs on the SM (count: median / last):");
    for (auto& [sharing, at] : bySharing) {
      std::sort(at.begin(), at.end());
      std::printf("  %d (%zu): %.2f / %.2f", sharing, at.size(), at[at.size() / 2], at.back());
    }
    std::printf("\n");
    // Which runs of the row end last: each split's walk end, median / last over its programs.
    const int64_t splits = plan.config.splits;
    if (call == 2 && splits > 1 && splits <= 16) {
      std::printf("%-18s walk end by split (median / last):", name.c_str());
      for (int64_t s = 0; s < splits; ++s) {
        std::vector<double> at;
        for (int64_t p = s; p < programs; p += splits)
          at.push_back(double(t[size_t(p * kTimelineSlots + kTimelineWalked)] - zero) / 1e3);
        std::sort(at.begin(), at.end());
        std::printf("  s%lld %.2f / %.2f", static_cast<long long>(s), at[at.size() / 2], at.back());
      }
      std::printf("\n");
    }
  }
  // The gap between calls: one call's last program end to the next call's first program start,
  // the two queued back to back, then with a timing event pair around each (as the bench times):
  // what the launch and the completion cost beside the kernel's own span.
  Tensor next = Tensor::zeros(DType::I64, {programs, kTimelineSlots}, MemorySpace::Device);
  for (bool events : {false, true}) {
    std::vector<double> gaps, spans;
    for (int rep = 0; rep < 9; ++rep) {
      runtime::Event a0, a1, b0, b1;
      for (const Tensor* into : {&stamps, &next}) {
        o.decode_timeline = *into;
        if (events) (into == &stamps ? a0 : b0).record();
        run(o);
        if (events) (into == &stamps ? a1 : b1).record();
      }
      runtime::synchronize();
      const std::vector<int64_t> ta = stamps.toHost<int64_t>(), tb = next.toHost<int64_t>();
      int64_t aStart = INT64_MAX, aEnd = 0, bStart = INT64_MAX;
      for (int64_t p = 0; p < programs; ++p) {
        aStart = std::min(aStart, ta[size_t(p * kTimelineSlots + kTimelineStart)]);
        aEnd = std::max(aEnd, ta[size_t(p * kTimelineSlots + kTimelineEnd)]);
        bStart = std::min(bStart, tb[size_t(p * kTimelineSlots + kTimelineStart)]);
      }
      gaps.push_back(double(bStart - aEnd) / 1e3);
      spans.push_back(double(aEnd - aStart) / 1e3);
    }
    std::printf("%-18s between calls%s: the kernel's span %.2f us, the gap to the next call's first start %.2f us "
                "(medians of 9)\n",
                name.c_str(), events ? " (an event pair around each)" : " (back to back)", runtime::median(spans),
                runtime::median(gaps));
  }
  std::printf("%-18s an empty kernel of %lld programs: %.2f us by the same events\n", name.c_str(),
              static_cast<long long>(programs), emptyKernelMicroseconds(programs));
}

// The floor of what a launch costs inside the events: a kernel of `programs` programs of four
// warps that each store one word, timed as the decode calls are.
double emptyKernelMicroseconds(int64_t programs) {
  static dsl::Kernel empty = dsl::kernel("empty", [](dsl::Ptr<dsl::i32> out) {
    dsl::store(out + dsl::program_id(0), dsl::program_id(0));
  });
  Tensor out = Tensor::zeros(DType::I32, {programs}, MemorySpace::Device);
  dsl::LaunchOptions o;
  o.grid = {programs, 1, 1};
  o.num_stages = 1;
  return runtime::median(runtime::timeKernel([&] { empty.run(o, out); }, 5, 50)) * 1e3;
}

// The yardstick: microseconds of a device-to-device copy that moves `bytesMoved` bytes (reads half,
// writes half), timed as the decode calls are.
double copyMicroseconds(double bytesMoved) {
  const size_t half = size_t(bytesMoved / 2) / 16 * 16;
  runtime::DeviceBuffer from(half), to(half);
  from.fillBytes(1);
  const double ms = runtime::median(runtime::timeKernel(
      [&] { runtime::copyDeviceToDevice(to.address(), from.address(), half, "the bench's copy yardstick"); }, 5, 50));
  return ms * 1e3;
}

}  // namespace

int main(int argc, char** argv) try {
  bool sweep = false, sweepSplits = false, sweepWs = false, timeline = false, tune = false, graph = false;
  bool maxScores = false;  // --max-scores: every call also writes each row's largest score
  bool withSinks = false;  // --sinks: every call has attention sinks (a logit per head near log S)
  std::FILE* timelineCsv = nullptr;
  std::vector<std::string> only;
  std::vector<FlexDecodeConfig> extraConfigs;  // --config: timed after the default on every shape
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sweep")) sweep = sweepSplits = true;
    else if (!std::strcmp(argv[i], "--sweep-splits")) sweepSplits = true;
    else if (!std::strcmp(argv[i], "--sweep-ws")) sweepWs = true;
    else if (!std::strcmp(argv[i], "--timeline")) timeline = true;
    else if (!std::strcmp(argv[i], "--timeline-csv") && i + 1 < argc) {
      timeline = true;
      if (!(timelineCsv = std::fopen(argv[++i], "w"))) {
        std::fprintf(stderr, "--timeline-csv: cannot write %s\n", argv[i]);
        return 2;
      }
      std::fprintf(timelineCsv, "shape,call,program,sm,start,walked,released,merging,end\n");
    } else if (!std::strcmp(argv[i], "--tune")) tune = true;
    else if (!std::strcmp(argv[i], "--graph")) graph = true;
    else if (!std::strcmp(argv[i], "--max-scores")) maxScores = true;
    else if (!std::strcmp(argv[i], "--sinks")) withSinks = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only.push_back(argv[++i]);
    else if (!std::strcmp(argv[i], "--config") && i + 1 < argc) extraConfigs.push_back(FlexDecodeConfig::parse(argv[++i]));
    else {
      std::fprintf(stderr,
                   "usage: %s [--sweep | --sweep-splits] [--sweep-ws] [--timeline | --timeline-csv FILE] [--tune] "
                   "[--graph] [--max-scores] [--sinks] [--only SHAPE]... [--config BN,W,S[,SPLITS]]...\n",
                   argv[0]);
      return 2;
    }
  }
  std::string why;
  if (!dsl::deviceAvailable(&why)) {
    std::fprintf(stderr, "flextile_attention_decode_bench: needs a GPU (%s)\n", why.c_str());
    return 2;
  }
  runtime::Device& device = runtime::Device::current();
  std::printf("decode bench on %s (sm_%d, %d SMs)\n", device.name().c_str(), device.capability(),
              device.multiprocessorCount());
  std::mt19937_64 rng(7);
  const std::vector<Shape> shapes = {
      {"decode", 8, 32, 8, 32768, 1, 128},
      {"decode_causal", 8, 32, 8, 32768, 1, 128, 0, true},
      {"decode_window4096", 8, 32, 8, 32768, 1, 128, 4096},
      {"window_devlists", 8, 32, 8, 32768, 1, 128, 4096, false, 0, 1},
      {"window_devlists_b", 8, 32, 8, 32768, 1, 128, 4096, false, 0, 2},
      {"decode_b1", 1, 32, 8, 32768, 1, 128},
      {"decode_s2048", 8, 32, 8, 2048, 1, 128},
      {"decode_s4096", 8, 32, 8, 4096, 1, 128},  // the window's bytes without a mask or its lists
      {"decode_b1_s2048", 1, 32, 8, 2048, 1, 128},
      {"decode_l4", 8, 32, 8, 32768, 4, 128},
      {"decode_paged128", 8, 32, 8, 32768, 1, 128, 0, false, 128},
      {"decode_paged64", 8, 32, 8, 32768, 1, 128, 0, false, 64},
      {"decode_d256", 8, 32, 8, 16384, 1, 256},  // the main shape's bytes at D = 256
  };
  struct Row {
    std::string shape, config;
    double us, tbps, dflt, copyUs, copyTbps, megabytes;
  };
  std::vector<Row> rows;
  std::map<std::array<int64_t, 4>, std::pair<Tensor, Tensor>> caches;  // (B, Hkv, S, D) -> K, V
  for (const Shape& s : shapes) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.name) == only.end()) continue;
    Tensor q = randomBf16(rng, {s.B, s.Hq, s.L, s.D});
    // Shapes of one cache size share its K and V: drawing 2 x 268M normals on the host for each of
    // the eight B=8 S=32768 shapes took most of this bench's two and a half minutes.
    const std::array<int64_t, 4> cacheKey{s.B, s.Hkv, s.S, s.D};
    auto cached = caches.find(cacheKey);
    if (cached == caches.end()) {
      Tensor kNew = randomBf16(rng, {s.B, s.Hkv, s.S, s.D});
      Tensor vNew = randomBf16(rng, {s.B, s.Hkv, s.S, s.D});
      cached = caches.emplace(cacheKey, std::pair{std::move(kNew), std::move(vNew)}).first;
    }
    const Tensor& k = cached->second.first;
    const Tensor& v = cached->second.second;
    Tensor out = Tensor::empty(DType::BF16, q.shape(), MemorySpace::Device);
    Tensor lse = Tensor::empty(DType::F32, {s.B, s.Hq, s.L}, MemorySpace::Device);
    Tensor want = Tensor::empty(DType::BF16, q.shape(), MemorySpace::Device);
    std::optional<BlockMask> mask;
    const int64_t pos = s.S - s.L;  // the newest queries of a cache of S keys
    if (s.window > 0) mask = slidingWindowBlockMask(1, 1, s.S, s.S, {s.window}, {128, 128}, MemorySpace::Device);
    else if (s.causalMask) mask = causalBlockMask(1, 1, s.S, s.S, {128, 128}, MemorySpace::Device);
    const std::optional<BlockMask> hostListMask = mask;  // for the bytes the call reads
    if (s.deviceLists) {
      const BlockMaskTensors& t = mask->kvTensors(MemorySpace::Device);
      BlockMaskTensors lists{t.kvNum.to(MemorySpace::Device), t.kvIndices.to(MemorySpace::Device),
                             t.fullKvNum.to(MemorySpace::Device), t.fullKvIndices.to(MemorySpace::Device)};
      ListBounds bounds;
      if (s.deviceLists == 2) bounds.maxLiveBlocksPerRow = s.window / 128 + 2;
      mask = BlockMask::fromListTensors(mask->maskMod(), 1, 1, s.S, s.S, {128, 128}, lists, bounds);
    }
    FlexAttentionOptions base;
    if (mask) base.query_offset = pos;
    if (maxScores) base.max_scores = Tensor::empty(DType::F32, {s.B, s.Hq, s.L}, MemorySpace::Device);
    if (withSinks)
      base.sinks = Tensor::fromHost(flextile::bench::sinksNear(rng, s.Hq, s.S), {s.Hq}, MemorySpace::Device);
    // The prefill template on the same queries, as the check.
    {
      std::optional<BlockMask> slice;
      if (mask) slice = mask->sliceRows(pos / 128, 1, pos, s.L);
      FlexAttentionOptions prefill{.kernel = AttentionTemplate::Prefill};
      prefill.sinks = base.sinks;
      flex_attention_into(q, k, v, noop_score(), slice, want, nullptr, prefill);
    }
    const double bytes = kvBytesRead(s, hostListMask, pos);
    std::optional<PagedKV> paged;
    if (s.pageSize > 0) paged = pagedCopy(rng, k, v, s.pageSize);
    auto run = [&](const FlexAttentionOptions& o) {
      if (paged) flex_attention_into(q, *paged, noop_score(), mask, out, &lse, o);
      else flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
    };
    std::vector<FlexDecodeConfig> configs = {FlexDecodeConfig{}};
    configs.insert(configs.end(), extraConfigs.begin(), extraConfigs.end());
    if (sweepSplits && (s.name != "decode" || !sweep)) {
      for (int64_t bn : {64, 128})
        for (int st : {2, 3})
          for (int64_t sp : {0, 2, 4, 8, 16}) configs.push_back({bn, bn == 64 ? 4 : 8, st, sp});
      for (int st : {2, 3, 4})  // 32-key steps: finer runs, deeper rings
        for (int64_t sp : {0, 6, 8, 12}) configs.push_back({32, 4, st, sp});
    }
    if (sweep && s.name == "decode")
      for (int64_t bn : {64, 128})
        for (int w : {4, 8})
          for (int st : {2, 3})
            for (int64_t sp : {0, 1, 2, 3, 4, 6, 8, 16}) configs.push_back({bn, w, st, sp});
    if (sweepWs && !paged)  // the producer warpgroup: the default tile, a third stage, 128-key steps
      for (FlexDecodeConfig c : {FlexDecodeConfig{64, 4, 2, 0}, FlexDecodeConfig{64, 4, 3, 0}, FlexDecodeConfig{128, 4, 2, 0}}) {
        c.warp_specialize = WarpSpecialization::On;
        configs.push_back(c);
      }
    if (tune && !paged) {
      // The autotuner's sweep (autotune/AutotuneDecode.cpp) in this process, nothing stored: its
      // winner is then timed below like any config, beside the default in the same loop.
      autotune::TuneOptions to;
      to.bytes = bytes;
      to.store = false;
      FlexAttentionOptions tb = base;
      tb.kernel = AttentionTemplate::Decode;
      const autotune::DecodeTuneReport r = autotune::tuneFlexDecode(
          q, k, v, noop_score(), mask, tb, autotune::defaultDecodeSpace(DType::BF16, s.D), to);
      const std::string table = autotune::formatReport(r);
      const size_t at = table.find("winner:");
      std::printf("%-18s tuned over %zu configs in %.1f s: %s", s.name.c_str(), r.candidates.size(),
                  r.compileSeconds + r.timingSeconds,
                  at == std::string::npos ? "no winner\n" : table.substr(at, table.find('\n', at) + 1 - at).c_str());
      if (r.best >= 0 && r.best != r.defaultIndex) configs.push_back(r.candidates[size_t(r.best)].config);
    }
    double dfltTbps = 0;
    Row best{s.name, "", INFINITY, 0, 0, 0, 0, 0};
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      FlexAttentionOptions o = base;
      o.kernel = AttentionTemplate::Decode;
      if (ci > 0) o.decode_config = configs[ci];
      std::string label = ci == 0 ? "default" : configs[ci].describe();
      try {
        out.copyFromHost(std::vector<float>(size_t(out.numel()), NAN));
        run(o);
        runtime::synchronize();
        const double err = maxAbsDiff(out, want);
        if (!(err < 2e-2)) {
          std::printf("%-18s %-28s WRONG (max |decode - prefill| %.2e): not timed\n", s.name.c_str(), label.c_str(), err);
          continue;
        }
        if (ci == 0) label = "default " + plan_flex_decode(q, k, v, noop_score(), mask, o).config.describe();
        if (ci == 0 && paged) label = "default (paged)";
        const double ms = runtime::median(runtime::timeKernel([&] { run(o); }, 5, 50));
        const double tbps = bytes / ms / 1e9;
        if (ci == 0) dfltTbps = tbps;
        // The host's own time a call (planning, launch), the GPU never waited for: a call that
        // takes the host longer than the GPU leaves the GPU idle between calls, and the events'
        // figure above is then the host's, not the kernel's.
        const auto hostStart = std::chrono::steady_clock::now();
        for (int i = 0; i < 20; ++i) run(o);
        const double hostUs =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - hostStart).count() / 20;
        runtime::synchronize();
        std::printf("%-18s %-34s %9.1f us %6.2f TB/s  (host %.1f us a call)\n", s.name.c_str(), label.c_str(), ms * 1e3,
                    tbps, hostUs);
        std::fflush(stdout);
        if (ms * 1e3 < best.us) best = {s.name, label, ms * 1e3, tbps, 0, 0, 0, 0};
        if (timeline && ci == 0 && !paged) printTimeline(s.name, q, k, v, mask, o, run, timelineCsv);
        if (graph && ci == 0) printGraphSteps(s.name, bytes, ms * 1e3, o, run, out, want);
      } catch (const std::exception& e) {
        std::printf("%-18s %-28s refused: %s\n", s.name.c_str(), label.c_str(), e.what());
      }
    }
    best.dflt = dfltTbps;
    best.megabytes = bytes / 1e6;
    best.copyUs = copyMicroseconds(bytes);
    best.copyTbps = bytes / (best.copyUs * 1e-6) / 1e12;
    std::printf("%-18s %-34s %9.1f us %6.2f TB/s  (copy of the same %.0f MB moved)\n", s.name.c_str(), "yardstick",
                best.copyUs, best.copyTbps, bytes / 1e6);
    rows.push_back(best);
  }
  std::printf("\n%-18s %8s %10s %10s %10s %10s %10s %8s  %s\n", "shape", "MB read", "best us", "best TB/s", "dflt TB/s",
              "copy us", "copy TB/s", "of copy", "best config");
  for (const Row& r : rows)
    std::printf("%-18s %8.0f %10.1f %10.2f %10.2f %10.1f %10.2f %7.0f%%  %s\n", r.shape.c_str(),
                r.megabytes, r.us, r.tbps, r.dflt, r.copyUs, r.copyTbps, 100 * r.tbps / r.copyTbps,
                r.config.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_attention_decode_bench: %s\n", e.what());
  return 1;
}
