// Two independent flex_attention calls on two streams against the same two calls one after the
// other on one stream: GPU time from the first call's start to the last one's end (events on the
// streams), median of many rounds. The calls are decode steps that do not fill the GPU (B = 1,
// one split: Hq programs), where running them side by side should take well under the serialized
// time; a prefill shape that fills the GPU is printed for contrast.
//
//   flextile_streams_bench
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"
#include "runtime/Event.h"
#include "runtime/Stream.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

struct Call {
  Tensor q, k, v, out;
  FlexAttentionOptions options;
};

Call makeCall(std::mt19937_64& rng, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t D) {
  std::uniform_real_distribution<float> dist(-1, 1);
  auto random = [&](dsl::Shape shape) {
    std::vector<float> host(size_t(shape[0] * shape[1] * shape[2] * shape[3]));
    for (float& x : host) x = dist(rng);
    return Tensor::fromHost(host, DType::BF16, shape, MemorySpace::Device);
  };
  Call c{random({B, Hq, L, D}), random({B, Hkv, S, D}), random({B, Hkv, S, D}),
         Tensor::empty(DType::BF16, {B, Hq, L, D}, MemorySpace::Device), {}};
  if (L == 1) c.options.decode_config = FlexDecodeConfig{.splits = 1};
  return c;
}

void run(Call& c, runtime::Stream* s) {
  FlexAttentionOptions o = c.options;
  o.stream = s;
  flex_attention_into(c.q, c.k, c.v, noop_score(), std::nullopt, c.out, nullptr, o);
}

// Milliseconds from the earliest start to the latest end of `calls` rounds of a and b, with b on
// `sb` (== sa: serialized on one stream).
double span(Call& a, Call& b, runtime::Stream* sa, runtime::Stream* sb, int calls) {
  runtime::synchronize();
  runtime::Event origin, startA, startB, endA, endB;
  origin.record(sa);
  startA.record(sa);
  startB.record(sb);
  for (int i = 0; i < calls; ++i) {
    run(a, sa);
    run(b, sb);
  }
  endA.record(sa);
  endB.record(sb);
  const double start = std::min(runtime::elapsedMs(origin, startA), runtime::elapsedMs(origin, startB));
  const double end = std::max(runtime::elapsedMs(origin, endA), runtime::elapsedMs(origin, endB));
  return end - start;
}

void measure(const char* name, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t D) {
  std::mt19937_64 rng(7);
  Call a = makeCall(rng, B, Hq, Hkv, L, S, D), b = makeCall(rng, B, Hq, Hkv, L, S, D);
  runtime::Stream first = runtime::Stream::nonBlocking(), second = runtime::Stream::nonBlocking();
  constexpr int kCalls = 10, kRounds = 15;
  span(a, b, &first, &second, 2);  // compile, load, size the scratch of both streams
  span(a, b, &first, &first, 2);
  std::vector<double> one, two;
  for (int r = 0; r < kRounds; ++r) {
    one.push_back(span(a, b, &first, &first, kCalls));
    two.push_back(span(a, b, &first, &second, kCalls));
  }
  const double serial = runtime::median(one) / (2 * kCalls), side = runtime::median(two) / (2 * kCalls);
  std::printf("%-22s B=%lld Hq=%lld Hkv=%lld L=%lld S=%lld D=%lld   one stream %8.1f us/call   two streams "
              "%8.1f us/call   serialized / side by side %.2fx\n",
              name, (long long)B, (long long)Hq, (long long)Hkv, (long long)L, (long long)S, (long long)D,
              serial * 1e3, side * 1e3, serial / side);
}

}  // namespace

int main() {
  std::string whyNot;
  if (!dsl::deviceAvailable(&whyNot)) {
    std::printf("streams bench: skipped: %s\n", whyNot.c_str());
    return 0;
  }
  try {
    std::printf("%s\n", runtime::Device::current().describe().c_str());
    measure("decode_b1_one_split", 1, 8, 8, 1, 65536, 128);
    measure("decode_b1_gqa", 1, 32, 8, 1, 32768, 128);
    measure("prefill_fills_the_gpu", 4, 32, 8, 2048, 2048, 128);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "streams bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
