// QK-clip with the max scores: each query row's largest score after score_mod, which flex_attention
// returns beside the output (FlexAttentionOptions::return_max_scores, as PyTorch's
// AuxRequest(max_scores=True)).
//
// MuonClip (Kimi K2) keeps attention logits bounded during training: after a step, any head whose
// largest logit S_h passed a threshold tau has its query and key projections rescaled by
// sqrt(tau / S_h) each, so that its logits shrink by tau / S_h. Here q and k stand for the
// projections' outputs: four of eight heads are made "hot" (q and k scaled up), the max scores
// find them, their q and k are rescaled, and a second call must show the clipped heads at tau
// (within bf16's rounding of q and k) and the others unchanged. The max scores are checked against
// float64 first, on a sample of rows. Exits non-zero when a check fails.
//
//   attention_qk_clip [--require-gpu] [--small] [--n 1024] [--tau 6]
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

namespace {
// The largest max score of each head, over its batches and rows (-inf where none is live).
std::vector<double> perHeadMax(const Tensor& maxScores) {
  const int64_t B = maxScores.size(0), H = maxScores.size(1), L = maxScores.size(2);
  const std::vector<float> all = maxScores.toHost<float>();
  std::vector<double> head(size_t(H), -INFINITY);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        head[size_t(h)] = std::max<double>(head[size_t(h)], all[size_t((b * H + h) * L + i)]);
  return head;
}
}  // namespace

int main(int argc, char** argv) try {
  bool requireGpu = false, small = false;
  int64_t N = 1024;
  double tau = 6.0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--require-gpu") requireGpu = true;
    else if (a == "--small") small = true;
    else if (a == "--n" && i + 1 < argc) N = std::atoll(argv[++i]);
    else if (a == "--tau" && i + 1 < argc) tau = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: attention_qk_clip [--require-gpu] [--small] [--n N] [--tau T]\n");
      return 2;
    }
  }
  if (N < 1 || !(tau > 0)) throw Error("attention_qk_clip: --n must be at least 1 and --tau positive");
  std::string why;
  const bool gpu = deviceAvailable(&why);
  if (requireGpu && !gpu) {
    std::printf("attention_qk_clip: skipped, no GPU (%s)\n", why.c_str());
    return 77;
  }
  if (!gpu || small) N = std::min<int64_t>(N, 160);  // the interpreter: a small problem
  const MemorySpace space = gpu ? MemorySpace::Device : MemorySpace::Host;
  const int64_t B = 2, H = 8, D = 64;
  const double scale = 1.0 / std::sqrt(double(D));
  std::printf("QK-clip at tau = %g on %s: B=%lld H=%lld N=%lld D=%lld bf16, causal\n", tau,
              gpu ? "the GPU" : "the IR interpreter", (long long)B, (long long)H, (long long)N, (long long)D);

  // q and k as a training step left them: heads 0-3 hot (their logits grown fourfold each side).
  std::mt19937_64 rng(2026);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> qHost(size_t(B * H * N * D)), kHost(qHost.size()), vHost(qHost.size());
  for (auto* t : {&qHost, &kHost, &vHost})
    for (float& x : *t) x = normal(rng);
  auto headOf = [&](size_t index) { return int64_t(index / size_t(N * D)) % H; };
  for (size_t i = 0; i < qHost.size(); ++i)
    if (headOf(i) < 4) qHost[i] *= 4, kHost[i] *= 4;
  const Shape shape{B, H, N, D};
  auto upload = [&](const std::vector<float>& x) { return Tensor::fromHost(x, DType::BF16, shape, space); };
  Tensor q = upload(qHost), k = upload(kHost), v = upload(vHost);
  const BlockMask mask = createBlockMask(causal_mask(), 1, 1, N, N, {}, space);
  const FlexAttentionOptions options{.return_max_scores = true};

  // 1. The max scores, checked against float64 on the first and last rows and a few between.
  FlexAttentionResult before = flex_attention(q, k, v, noop_score(), mask, options);
  std::vector<QueryRow> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i : {int64_t(0), N / 3, N / 2, N - 1}) rows.push_back({b, h, i});
  const RefMaskFn causal = [](int64_t, int64_t, int64_t qi, int64_t kv) { return kv <= qi; };
  const ReferenceRows ref = referenceAttentionRows(q, k, v, nullptr, causal, scale, rows);
  const std::vector<float> got = before.max_scores.toHost<float>();
  double worst = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    const double have = got[size_t((rows[r].b * H + rows[r].h) * N + rows[r].i)], want = ref.maxScores[r];
    worst = std::max(worst, std::abs(have - want) / (1 + std::abs(want)));
  }
  const bool exact = worst < 1e-3;
  std::printf("max scores against float64 on %zu rows: largest relative error %.2e%s\n", rows.size(), worst,
              exact ? "" : "  <-- too large");

  // 2. The clip: heads over tau get q and k scaled by sqrt(tau / S_h) each.
  const std::vector<double> hot = perHeadMax(before.max_scores);
  std::vector<double> factor(size_t(H), 1.0);
  for (int64_t h = 0; h < H; ++h) {
    if (hot[size_t(h)] > tau) factor[size_t(h)] = std::sqrt(tau / hot[size_t(h)]);
    std::printf("  head %lld: max score %8.3f%s\n", (long long)h, hot[size_t(h)],
                factor[size_t(h)] < 1 ? "  -> clipped" : "");
  }
  for (size_t i = 0; i < qHost.size(); ++i) {
    qHost[i] *= float(factor[size_t(headOf(i))]);
    kHost[i] *= float(factor[size_t(headOf(i))]);
  }
  q = upload(qHost), k = upload(kHost);

  // 3. After the clip: the clipped heads at tau (bf16 rounds q and k), the others as before.
  const std::vector<double> after = perHeadMax(flex_attention(q, k, v, noop_score(), mask, options).max_scores);
  bool ok = exact;
  for (int64_t h = 0; h < H; ++h) {
    const double a = after[size_t(h)];
    const bool clipped = factor[size_t(h)] < 1;
    const bool good = clipped ? std::abs(a - tau) <= 0.02 * tau : a == hot[size_t(h)];
    std::printf("  head %lld after: %8.3f%s\n", (long long)h, a, good ? "" : "  <-- wrong");
    ok = ok && good;
  }
  std::printf("%s\n", ok ? "OK: the clipped heads at tau (within bf16's rounding), the others unchanged"
                          : "FAILED");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_qk_clip: %s\n", e.what());
  return 1;
}
