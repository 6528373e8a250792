// Decode bench: a few new queries against a long KV cache, in TB/s of K and V read (the bytes of
// the KV blocks the call reads: all of them without a mask, the live ones with one) and µs per call.
//
//   flextile_attention_decode_bench              # the shapes, default configs
//   flextile_attention_decode_bench --sweep      # also a config sweep on the main shape
//
// The main shape is ../shared/bench/torch_reference.py's `decode` (B=8, Hq=32, Hkv=8, S=32768,
// D=128, bf16, one query); bench/torch_decode.py times PyTorch FlexAttention and SDPA on every
// shape here in the same run. Before timing, every call is checked against the prefill template
// on the same inputs (itself checked against float64 by the tests); a wrong config is not timed.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"
#include "runtime/Event.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

struct Shape {
  std::string name;
  int64_t B, Hq, Hkv, S, L, D;
  int64_t window = 0;  // > 0: a sliding-window mask of this many keys (causal)
  bool causalMask = false;
};

Tensor randomBf16(std::mt19937_64& rng, dsl::Shape shape) {
  std::normal_distribution<float> n(0.f, 1.f);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  std::vector<float> host(static_cast<size_t>(count));
  for (float& x : host) x = n(rng);
  return Tensor::fromHost(host, DType::BF16, shape, MemorySpace::Device);
}

double maxAbsDiff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.toHost<float>(), y = b.toHost<float>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, double(std::abs(x[i] - y[i])) + (std::isfinite(x[i]) ? 0 : 1e9));
  return m;
}

// Bytes of K and V in the blocks the decode lists hold for the queries at `pos`.
double kvBytesRead(const Shape& s, const std::optional<BlockMask>& mask, int64_t pos) {
  const double perKey = double(s.B) * double(s.Hkv) * double(s.D) * 2 /*bytes*/ * 2 /*K and V*/;
  if (!mask) return perKey * double(s.S);
  const int64_t row = (pos - mask->qOffset()) / mask->qBlockSize();
  double keys = 0;
  for (auto list : {mask->fullKvBlocks(0, 0, row), mask->partialKvBlocks(0, 0, row)})
    for (int32_t j : list) keys += double(std::min<int64_t>(mask->kvBlockSize(), s.S - j * mask->kvBlockSize()));
  return perKey * keys;
}

}  // namespace

int main(int argc, char** argv) {
  bool sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sweep")) sweep = true;
    else {
      std::fprintf(stderr, "usage: %s [--sweep]\n", argv[0]);
      return 2;
    }
  }
  runtime::Device& device = runtime::Device::current();
  std::printf("decode bench on %s (sm_%d, %d SMs)\n", device.name().c_str(), device.capability(),
              device.multiprocessorCount());
  std::mt19937_64 rng(7);
  const std::vector<Shape> shapes = {
      {"decode", 8, 32, 8, 32768, 1, 128},
      {"decode_causal", 8, 32, 8, 32768, 1, 128, 0, true},
      {"decode_window4096", 8, 32, 8, 32768, 1, 128, 4096},
      {"decode_b1", 1, 32, 8, 32768, 1, 128},
      {"decode_s2048", 8, 32, 8, 2048, 1, 128},
      {"decode_b1_s2048", 1, 32, 8, 2048, 1, 128},
      {"decode_l4", 8, 32, 8, 32768, 4, 128},
  };
  struct Row {
    std::string shape, config;
    double us, tbps, dflt;
  };
  std::vector<Row> rows;
  for (const Shape& s : shapes) {
    Tensor q = randomBf16(rng, {s.B, s.Hq, s.L, s.D});
    Tensor k = randomBf16(rng, {s.B, s.Hkv, s.S, s.D});
    Tensor v = randomBf16(rng, {s.B, s.Hkv, s.S, s.D});
    Tensor out = Tensor::empty(DType::BF16, q.shape(), MemorySpace::Device);
    Tensor lse = Tensor::empty(DType::F32, {s.B, s.Hq, s.L}, MemorySpace::Device);
    Tensor want = Tensor::empty(DType::BF16, q.shape(), MemorySpace::Device);
    std::optional<BlockMask> mask;
    const int64_t pos = s.S - s.L;  // the newest queries of a cache of S keys
    if (s.window > 0) mask = slidingWindowBlockMask(1, 1, s.S, s.S, {s.window}, {128, 128}, MemorySpace::Device);
    else if (s.causalMask) mask = causalBlockMask(1, 1, s.S, s.S, {128, 128}, MemorySpace::Device);
    FlexAttentionOptions base;
    if (mask) base.query_offset = pos;
    // The prefill template on the same queries, as the check.
    {
      std::optional<BlockMask> slice;
      if (mask) slice = mask->sliceRows(pos / 128, 1, pos, s.L);
      flex_attention_into(q, k, v, noop_score(), slice, want, nullptr, {.kernel = AttentionTemplate::Prefill});
    }
    const double bytes = kvBytesRead(s, mask, pos);
    std::vector<FlexDecodeConfig> configs = {FlexDecodeConfig{}};
    if (sweep && s.name == "decode")
      for (int64_t bn : {64, 128})
        for (int w : {1, 2, 4, 8})
          for (int st : {2, 3, 4})
            for (int64_t sp : {0, 4, 8, 16, 32}) configs.push_back({bn, w, st, sp});
    double dfltTbps = 0;
    Row best{s.name, "", INFINITY, 0, 0};
    for (size_t ci = 0; ci < configs.size(); ++ci) {
      FlexAttentionOptions o = base;
      o.kernel = AttentionTemplate::Decode;
      if (ci > 0) o.decode_config = configs[ci];
      std::string label = ci == 0 ? "default" : configs[ci].describe();
      try {
        out.copyFromHost(std::vector<float>(size_t(out.numel()), NAN));
        flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o);
        runtime::synchronize();
        const double err = maxAbsDiff(out, want);
        if (!(err < 2e-2)) {
          std::printf("%-18s %-28s WRONG (max |decode - prefill| %.2e): not timed\n", s.name.c_str(), label.c_str(), err);
          continue;
        }
        if (ci == 0) label = "default " + plan_flex_decode(q, k, v, noop_score(), mask, o).config.describe();
        const double ms = runtime::median(
            runtime::timeKernel([&] { flex_attention_into(q, k, v, noop_score(), mask, out, &lse, o); }, 5, 50));
        const double tbps = bytes / ms / 1e9;
        if (ci == 0) dfltTbps = tbps;
        std::printf("%-18s %-34s %9.1f us %6.2f TB/s\n", s.name.c_str(), label.c_str(), ms * 1e3, tbps);
        std::fflush(stdout);
        if (ms * 1e3 < best.us) best = {s.name, label, ms * 1e3, tbps, 0};
      } catch (const std::exception& e) {
        std::printf("%-18s %-28s refused: %s\n", s.name.c_str(), label.c_str(), e.what());
      }
    }
    best.dflt = dfltTbps;
    rows.push_back(best);
  }
  std::printf("\n%-18s %10s %10s %10s  %s\n", "shape", "best us", "best TB/s", "dflt TB/s", "best config");
  for (const Row& r : rows)
    std::printf("%-18s %10.1f %10.2f %10.2f  %s\n", r.shape.c_str(), r.us, r.tbps, r.dflt, r.config.c_str());
  return 0;
}
