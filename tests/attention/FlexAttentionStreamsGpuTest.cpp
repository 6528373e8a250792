// flex_attention on user-created streams on the GPU: calls on two non-blocking streams (as a
// framework's side streams are), enqueued interleaved from one thread without waiting, give the
// float64 reference's results (prefill and decode, whose partial scratch is per stream), and two
// independent decode calls on two streams run at the same time (their event intervals overlap).
// The speedup this gives is measured by bench/streams.cpp, not asserted here.
#include <gtest/gtest.h>

#include "FlexAttentionCheck.h"
#include "gpu/GpuTest.h"
#include "runtime/Device.h"
#include "runtime/Event.h"
#include "runtime/Stream.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

constexpr MemorySpace kDevice = MemorySpace::Device;

// One independent problem: inputs, its reference, outputs poisoned on the stream it runs on.
struct Problem {
  Tensor q, k, v, out, lse;
  std::optional<BlockMask> mask;
  ReferenceResult ref;
  std::string what;

  Problem(std::mt19937_64& rng, const AttentionCase& c, bool causal, runtime::Stream* stream) : what(c.describe()) {
    q = randomTensor(rng, c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
    k = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
    v = randomTensor(rng, c.dtype, {c.B, c.Hkv, c.S, c.D}, kDevice);
    out = Tensor::empty(c.dtype, {c.B, c.Hq, c.L, c.D}, kDevice);
    lse = Tensor::empty(DType::F32, {c.B, c.Hq, c.L}, kDevice);
    RefMaskFn refMask;
    if (causal) {
      // Queries at the end of the keys (offset S - L), as in decoding: the mask is built on the
      // stream too (its placement), for S queries, and sliced to q's rows.
      const int64_t offset = c.S - c.L;
      BlockMask whole = causalBlockMask(1, 1, c.S, c.S, {64, 64}, {kDevice, stream});
      mask = whole.sliceRows(offset / 64, (offset + c.L - 1) / 64 - offset / 64 + 1, offset, c.L);
      refMask = [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; };
    }
    ref = referenceAttention(q, k, v, nullptr, refMask, 1.0 / std::sqrt(double(c.D)), mask ? mask->qOffset() : 0);
  }

  void enqueue(runtime::Stream* stream) {
    out.fillBytes(0xFF, stream);  // NaN: an element the kernel skips fails the check
    lse.fillBytes(0xFF, stream);
    flex_attention_into(q, k, v, noop_score(), mask, out, &lse, {.stream = stream});
  }

  bool check() const {
    SCOPED_TRACE(what);
    return compareWithReference(out, lse, ref, q.size(3), q.dtype());
  }
};

}  // namespace

TEST(FlexAttentionStreamsGpu, CallsOnTwoNonBlockingStreamsGiveTheReferenceResults) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  runtime::Stream first = runtime::Stream::nonBlocking(), second = runtime::Stream::nonBlocking();
  // The second stream as a framework hands it over: a CUstream FlexTile borrows.
  runtime::Stream borrowed = runtime::Stream::borrow(second.handle());
  std::vector<std::pair<AttentionCase, bool>> cases = {
      {{.B = 1, .Hq = 8, .Hkv = 2, .L = 1, .S = 4097, .D = 128, .dtype = DType::BF16}, false},  // decode, splits
      {{.B = 2, .Hq = 4, .Hkv = 4, .L = 3, .S = 1000, .D = 64, .dtype = DType::F16}, true},     // decode, causal
      {{.B = 1, .Hq = 4, .Hkv = 1, .L = 200, .S = 333, .D = 64, .dtype = DType::BF16}, false},  // prefill
  };
  for (const auto& [c, causal] : cases) {
    Problem a(rng, c, causal, &first), b(rng, c, causal, &borrowed);
    runtime::synchronize();  // the inputs' uploads (legacy-stream copies, which these streams do not wait for)
    // Interleaved, nothing waited for in between: shared scratch would be overwritten mid-call.
    for (int round = 0; round < 3; ++round) {
      a.enqueue(&first);
      b.enqueue(&borrowed);
    }
    first.synchronize();
    borrowed.synchronize();
    if (!a.check() || !b.check()) return;
  }
}

TEST(FlexAttentionStreamsGpu, IndependentDecodeCallsOnTwoStreamsOverlapInTime) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  // B = 1 and one split: 8 programs, far from filling the GPU, each reading a long KV row.
  const AttentionCase c{.B = 1, .Hq = 8, .Hkv = 8, .L = 1, .S = 65536, .D = 128, .dtype = DType::BF16};
  runtime::Stream first = runtime::Stream::nonBlocking(), second = runtime::Stream::nonBlocking();
  Problem a(rng, c, false, &first), b(rng, c, false, &second);
  runtime::synchronize();
  const FlexDecodeConfig oneSplit{.splits = 1};
  auto call = [&](Problem& p, runtime::Stream* s) {
    flex_attention_into(p.q, p.k, p.v, noop_score(), std::nullopt, p.out, &p.lse,
                        {.decode_config = oneSplit, .stream = s});
  };
  call(a, &first);  // compile, load and size the scratch before timing
  call(b, &second);
  first.synchronize();
  second.synchronize();

  constexpr int kCalls = 20;
  runtime::Event origin, startA, endA, startB, endB;
  origin.record(&first);
  first.synchronize();
  startA.record(&first);
  startB.record(&second);
  for (int i = 0; i < kCalls; ++i) {
    call(a, &first);
    call(b, &second);
  }
  endA.record(&first);
  endB.record(&second);
  const double a0 = runtime::elapsedMs(origin, startA), a1 = runtime::elapsedMs(origin, endA);
  const double b0 = runtime::elapsedMs(origin, startB), b1 = runtime::elapsedMs(origin, endB);
  std::printf("  stream 1: [%.3f, %.3f] ms, stream 2: [%.3f, %.3f] ms\n", a0, a1, b0, b1);
  const double overlap = std::min(a1, b1) - std::max(a0, b0);
  EXPECT_GT(overlap, 0.5 * std::min(a1 - a0, b1 - b0))
      << "the two streams' work should run mostly at the same time";
  ASSERT_TRUE(a.check());
  ASSERT_TRUE(b.check());
}
