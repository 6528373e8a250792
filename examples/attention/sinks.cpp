// Attention sinks (GPT-OSS): a learned logit per head that joins every row's softmax as a key of
// value zero, so a head can put weight "nowhere" instead of on the window's keys
// (FlexAttentionOptions::sinks). Here a sliding-window attention learns its sinks: a target output
// is made with known sinks, then sinks started at log(window) follow the gradient the backward
// returns (FlexAttentionGrads::dsinks) for loss = |out - target|^2 / 2, and must end within 0.05
// of the known ones. The forward and dsinks are checked against float64 first, on a sample of rows.
// Exits non-zero when a check fails.
//
//   attention_sinks [--require-gpu] [--small] [--n 2048] [--window 128] [--steps 60]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;

int main(int argc, char** argv) try {
  bool requireGpu = false, small = false;
  int64_t N = 2048, window = 128, steps = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--require-gpu") requireGpu = true;
    else if (a == "--small") small = true;
    else if (a == "--n" && i + 1 < argc) N = std::atoll(argv[++i]);
    else if (a == "--window" && i + 1 < argc) window = std::atoll(argv[++i]);
    else if (a == "--steps" && i + 1 < argc) steps = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: attention_sinks [--require-gpu] [--small] [--n N] [--window W] [--steps S]\n");
      return 2;
    }
  }
  if (N < 1 || window < 1 || steps < 1) throw Error("attention_sinks: --n, --window and --steps must be at least 1");
  std::string why;
  const bool gpu = deviceAvailable(&why);
  if (requireGpu && !gpu) {
    std::printf("attention_sinks: skipped, no GPU (%s)\n", why.c_str());
    return 77;
  }
  if (!gpu || small) N = std::min<int64_t>(N, 300);  // the interpreter: a small problem
  const MemorySpace space = gpu ? MemorySpace::Device : MemorySpace::Host;
  const int64_t B = 2, H = 8, Hkv = 2, D = 64;
  const double scale = 1.0 / std::sqrt(double(D));
  std::printf("attention sinks on %s: B=%lld H=%lld (kv %lld) N=%lld D=%lld bf16, sliding window %lld\n",
              gpu ? "the GPU" : "the IR interpreter", (long long)B, (long long)H, (long long)Hkv, (long long)N,
              (long long)D, (long long)window);

  std::mt19937_64 rng(2026);
  std::normal_distribution<float> normal(0, 1);
  auto random = [&](const Shape& shape) {
    std::vector<float> x(size_t(shape[0] * shape[1] * shape[2] * shape[3]));
    for (float& e : x) e = normal(rng);
    return Tensor::fromHost(x, DType::BF16, shape, space);
  };
  const Tensor q = random({B, H, N, D}), k = random({B, Hkv, N, D}), v = random({B, Hkv, N, D});
  const BlockMask mask = slidingWindowBlockMask(1, 1, N, N, std::vector<int64_t>{window}, BlockSizes{}, space);
  const RefMaskFn inWindow = [window](int64_t, int64_t, int64_t qi, int64_t kv) {
    return kv <= qi && qi - kv < window;
  };
  auto sinksTensor = [&](const std::vector<float>& s) { return Tensor::fromHost(s, {H}, space); };

  // The known sinks: around the log-sum-exp of a full window's scores, so that they take a real share.
  const double typical = std::log(double(window)) + 0.5;
  std::vector<float> known(static_cast<size_t>(H));
  for (int64_t h = 0; h < H; ++h) known[size_t(h)] = float(typical - 2.0 + 4.0 * double(h) / double(H - 1));
  FlexAttentionOptions fo{.return_lse = true};
  fo.sinks = sinksTensor(known);
  const Tensor target = flex_attention(q, k, v, noop_score(), mask, fo).out;

  // 1. The forward with sinks and its dsinks, against float64 on a sample of rows (every row on
  //    the interpreter): out and lse, and dsinks for dout = out - target at sinks of log(window).
  std::vector<float> sinks(static_cast<size_t>(H), float(std::log(double(window))));
  fo.sinks = sinksTensor(sinks);
  const FlexAttentionResult first = flex_attention(q, k, v, noop_score(), mask, fo);
  std::vector<QueryRow> rows = gpu ? std::vector<QueryRow>() : allQueryRows(B, H, N);
  for (int64_t b = 0; gpu && b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i : {int64_t(0), window - 1, N / 2, N - 1}) rows.push_back({b, h, std::min(i, N - 1)});
  const std::vector<double> sinkValues(sinks.begin(), sinks.end());
  const ReferenceRows ref = referenceAttentionRows(q, k, v, nullptr, inWindow, scale, rows, 0, 0, &sinkValues);
  const std::vector<double> out = toDoubles(first.out), lse = toDoubles(first.lse);
  double worst = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const size_t row = size_t((rows[r].b * H + rows[r].h) * N + rows[r].i);
    worst = std::max(worst, std::abs(lse[row] - ref.lse[r]) / (1 + std::abs(ref.lse[r])));
    for (int64_t d = 0; d < D; ++d)
      worst = std::max(worst, std::abs(out[row * size_t(D) + size_t(d)] - ref.out[r * size_t(D) + size_t(d)]));
  }
  bool ok = worst < 2e-2;
  std::printf("forward with sinks against float64 on %zu rows: largest error %.2e%s\n", rows.size(), worst,
              ok ? "" : "  <-- too large");

  // 2. Gradient descent on the sinks alone. dloss/dout = out - target; the backward's dsinks is
  //    dloss/dsinks, summed over every row of a head, so the rate is per row (8 converges in about
  //    20 steps here; 20 oscillates).
  const double rate = 8.0 / double(B * N);
  double firstLoss = 0, loss = 0;
  for (int64_t step = 0; step < steps; ++step) {
    fo.sinks = sinksTensor(sinks);
    const FlexAttentionResult fwd = flex_attention(q, k, v, noop_score(), mask, fo);
    const std::vector<double> o = toDoubles(fwd.out), t = toDoubles(target);
    std::vector<float> residual(o.size());
    loss = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      residual[i] = float(o[i] - t[i]);
      loss += 0.5 * double(residual[i]) * double(residual[i]);
    }
    if (step == 0) firstLoss = loss;
    const Tensor dout = Tensor::fromHost(residual, DType::BF16, {B, H, N, D}, space);
    FlexAttentionBackwardOptions bo;
    bo.sinks = fo.sinks;
    const FlexAttentionGrads g = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), mask, bo);
    const std::vector<float> dsinks = g.dsinks.toHost<float>();
    if (step == 0) {  // dsinks against float64, from the same out and dout
      // The interpreter's small problem: the whole reference backward. On the GPU that is minutes
      // of one core, so there the formula, dsinks[h] = -sum over the head's rows of
      // e^{sink - lse} <out, dout>, in float64 from the forward's lse and out (checked above).
      std::vector<double> want(static_cast<size_t>(H), 0.0);
      if (!gpu) {
        want = referenceAttentionBackward(q, k, v, dout, nullptr, nullptr, inWindow, scale, 0, nullptr, nullptr,
                                          &fwd.out, &sinkValues)
                   .dsinks;
      } else {
        const std::vector<double> lseAll = toDoubles(fwd.lse), outAll = toDoubles(fwd.out), dAll = toDoubles(dout);
        for (int64_t row = 0; row < B * H * N; ++row) {
          const int64_t h = row / N % H;
          double delta = 0;
          for (int64_t d = 0; d < D; ++d) delta += outAll[size_t(row * D + d)] * dAll[size_t(row * D + d)];
          want[size_t(h)] -= std::exp(sinkValues[size_t(h)] - lseAll[size_t(row)]) * delta;
        }
      }
      double err = 0, size = 0;
      for (int64_t h = 0; h < H; ++h) {
        err = std::max(err, std::abs(double(dsinks[size_t(h)]) - want[size_t(h)]));
        size = std::max(size, std::abs(want[size_t(h)]));
      }
      const bool good = err <= 1e-2 * size + 1e-6;
      std::printf("dsinks against float64: largest error %.2e of %.2e%s\n", err, size, good ? "" : "  <-- too large");
      ok = ok && good;
    }
    for (int64_t h = 0; h < H; ++h) sinks[size_t(h)] -= float(rate * dsinks[size_t(h)]);
    if (step % 10 == 0 || step == steps - 1) std::printf("  step %3lld: loss %.6f\n", (long long)step, loss);
  }
  double furthest = 0;
  for (int64_t h = 0; h < H; ++h) {
    const double off = std::abs(double(sinks[size_t(h)]) - double(known[size_t(h)]));
    furthest = std::max(furthest, off);
    std::printf("  head %lld: sink %7.3f, known %7.3f\n", (long long)h, sinks[size_t(h)], known[size_t(h)]);
  }
  const bool learned = furthest < 0.05 && loss < firstLoss;
  std::printf("%s: learned sinks within %.3f of the known ones (loss %.6f -> %.6f)\n",
              ok && learned ? "OK" : "FAILED", furthest, firstLoss, loss);
  return ok && learned ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_sinks: %s\n", e.what());
  return 1;
}
