// Training with flex_attention_backward: a learnable relative-position bias, fitted by SGD.
//
//   score_mod(s, b, h, q, kv) = s + rel[h, kv - q + N - 1]       rel: f32 [H, 2N - 1], trainable
//   mask_mod(b, h, q, kv)     = kv <= q
//
// A teacher attention with a fixed bias (ALiBi-like slopes) makes the targets; the student starts
// from rel = 0 and takes SGD steps on loss = 0.5 * mean((out - target)^2). Each step is one
// forward (with the LSE) and one backward, whose captured gradient is rel's; q, k and v are fixed
// inputs here (their gradients come out of the same call and are not used). The loss must fall
// to a fraction of its start, or the example exits non-zero.
//
//   attention_train_bias [--require-gpu] [--small] [--steps 30] [--n 512]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;

int main(int argc, char** argv) try {
  bool requireGpu = false, small = false;
  int steps = 30;
  int64_t N = 512;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--require-gpu") requireGpu = true;
    else if (a == "--small") small = true;
    else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--n" && i + 1 < argc) N = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: attention_train_bias [--require-gpu] [--small] [--steps S] [--n N]\n");
      return 2;
    }
  }
  std::string why;
  const bool gpu = deviceAvailable(&why);
  if (requireGpu && !gpu) {
    std::printf("attention_train_bias: skipped, no GPU (%s)\n", why.c_str());
    return 77;
  }
  if (!gpu || small) N = std::min<int64_t>(N, 96);  // the interpreter: a small problem
  const MemorySpace space = gpu ? MemorySpace::Device : MemorySpace::Host;
  const int64_t B = 2, H = 4, D = 64, R = 2 * N - 1;
  std::printf("training a relative-position bias [%lld, %lld] on %s: B=%lld H=%lld N=%lld D=%lld bf16, causal\n",
              (long long)H, (long long)R, gpu ? "the GPU" : "the IR interpreter", (long long)B, (long long)H,
              (long long)N, (long long)D);

  std::mt19937_64 rng(12345);
  std::normal_distribution<float> normal(0, 1);
  auto random = [&](Shape shape) {
    std::vector<float> v(size_t(shape[0] * shape[1] * shape[2] * shape[3]));
    for (auto& x : v) x = normal(rng);
    return Tensor::fromHost(v, DType::BF16, shape, space);
  };
  Tensor q = random({B, H, N, D}), k = random({B, H, N, D}), v = random({B, H, N, D});

  // The mod, written once; the teacher's table is fixed, the student's is trainable.
  auto relativeBias = [N](const CapturedTensor& table, const std::string& name) {
    return ScoreMod(name, [table, N](const Tile& s, const Tile&, const Tile& h, const Tile& q_idx, const Tile& kv_idx) {
      return s + table(h, kv_idx - q_idx + (N - 1));
    }, {table});
  };
  std::vector<float> teacherTable(size_t(H * R));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t r = 0; r < R; ++r)
      teacherTable[size_t(h * R + r)] = -std::exp2(-float(h + 1)) * std::abs(float(r - (N - 1))) * 0.25f;
  CapturedTensor teacherRel = capture(Tensor::fromHost(teacherTable, {H, R}, space), "teacher_rel");
  std::vector<float> rel(size_t(H * R), 0.0f);
  Tensor relTensor = Tensor::fromHost(rel, {H, R}, space);
  CapturedTensor studentRel = capture(relTensor, "rel", {.requires_grad = true});
  const ScoreMod teacher = relativeBias(teacherRel, "teacher_bias"), student = relativeBias(studentRel, "rel_bias");
  const BlockMask mask = causalBlockMask(1, 1, N, N);

  const std::vector<float> targetOut = flex_attention(q, k, v, teacher, mask).out.toHost<float>();  // bf16, widened
  const double numel = double(targetOut.size());
  double firstLoss = 0, loss = 0, lr = 0;
  for (int step = 0; step < steps; ++step) {
    FlexAttentionResult fwd = flex_attention(q, k, v, student, mask, {.return_lse = true});
    const std::vector<float> out = fwd.out.toHost<float>();
    std::vector<float> dout(out.size());
    loss = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const double diff = double(out[i]) - targetOut[i];
      loss += 0.5 * diff * diff / numel;
      dout[i] = float(diff / numel * 1e4);  // scaled, so that bf16 keeps its precision
    }
    FlexAttentionGrads g = flex_attention_backward(
        q, k, v, fwd.out, fwd.lse, Tensor::fromHost(dout, DType::BF16, fwd.out.shape(), space), student, mask);
    std::vector<float> grad = g.grad(studentRel).toHost<float>();
    double norm = 0;
    for (float& x : grad) {
      x *= 1e-4f;  // undo the scale of dout
      norm += double(x) * x;
    }
    norm = std::sqrt(norm);
    if (step == 0) {
      firstLoss = loss;
      lr = 0.5 / std::max(norm, 1e-30);  // the first step moves rel by 0.5 in norm; plain SGD after
    }
    std::printf("step %2d  loss %.6e  |grad| %.3e\n", step, loss, norm);
    for (size_t i = 0; i < rel.size(); ++i) rel[i] -= float(lr * grad[i]);
    relTensor.copyFromHost(rel);  // the capture sees the new values: no retrace, no recompile
  }
  const bool ok = std::isfinite(loss) && loss < 0.5 * firstLoss;
  std::printf("loss %.6e -> %.6e (%.1f%%): %s\n", firstLoss, loss, 100.0 * loss / firstLoss,
              ok ? "PASS (the loss fell below half its start)" : "FAIL (the loss did not fall to half)");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_train_bias: %s\n", e.what());
  return 1;
}
