// A program that uses FlexTile as an installed library: causal flex_attention on host tensors
// (FlexTile's IR interpreter runs the same kernel the GPU would), checked against FlexTile's
// float64 reference. Exits 0 when they agree, 1 when they do not.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"

using flextile::dsl::Tensor;
namespace attention = flextile::attention;

int main() {
  // L is not a multiple of the 128-row mask blocks nor of the 64-row tiles: tails are exercised.
  const int64_t B = 1, H = 2, L = 200, D = 32;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto randomTensor = [&](flextile::dsl::Shape shape) {
    std::vector<float> data(size_t(shape[0] * shape[1] * shape[2] * shape[3]));
    for (float& x : data) x = normal(rng);
    return Tensor::fromHost(data, shape);  // f32, host memory
  };
  const Tensor q = randomTensor({B, H, L, D}), k = randomTensor({B, H, L, D}), v = randomTensor({B, H, L, D});

  const attention::BlockMask mask = attention::causalBlockMask(1, 1, L, L);  // broadcast over B and H
  const attention::FlexAttentionResult result =
      attention::flex_attention(q, k, v, attention::noop_score(), mask, {.return_lse = true});

  const double scale = 1.0 / std::sqrt(double(D));
  const attention::ReferenceResult ref = attention::referenceAttention(
      q, k, v, /*score=*/nullptr, [](int64_t, int64_t, int64_t i, int64_t j) { return j <= i; }, scale);
  const std::vector<float> out = result.out.toHost<float>(), lse = result.lse.toHost<float>();
  double num = 0, den = 0, lseError = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    num += (out[i] - ref.out[i]) * (out[i] - ref.out[i]);
    den += ref.out[i] * ref.out[i];
  }
  for (size_t i = 0; i < lse.size(); ++i) lseError = std::max(lseError, std::abs(lse[i] - ref.lse[i]));
  const double relative = std::sqrt(num / den);
  // The interpreter computes f32 in f32 (the GPU's tf32 dots would need 4e-3).
  const bool ok = std::isfinite(relative) && relative <= 1e-4 && lseError <= 1e-4;
  std::printf("causal flex_attention B=%lld H=%lld L=%lld D=%lld on the interpreter: relative error %.2e, "
              "max |lse error| %.2e: %s\n",
              (long long)B, (long long)H, (long long)L, (long long)D, relative, lseError, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
