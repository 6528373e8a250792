// An autotune of a small shape end to end on the GPU (label gpu; skipped
// without one): every candidate checked against the default, the best no
// slower than the default.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <random>

#include "attention_templates/Variants.h"
#include "autotune/Autotune.h"
#include "gpu/GpuTest.h"

namespace flextile {
namespace {

using namespace flextile::attention;
using namespace flextile::autotune;
using dsl::MemorySpace;
using dsl::Tensor;

TEST(AutotuneGpu, SmallShapeEndToEnd) {
  FLEXTILE_REQUIRE_GPU();
  flextile::testing::SeededRandom rng;
  const int64_t L = 1000, D = 64;
  std::normal_distribution<float> g(0, 1);
  std::vector<Eigen::bfloat16> h(size_t(2 * 4 * L * D));
  for (auto& x : h) x = Eigen::bfloat16(g(rng));
  Tensor q = Tensor::fromHost(h, {2, 4, L, D}, MemorySpace::Device);
  VariantInstance inst = variant("causal").make({2, 4, L, L, MemorySpace::Device, {128, 128}, 1});
  TuneOptions o;
  o.store = false;
  o.repetitions = 5;
  TuneReport r = tuneFlexAttention(q, q, q, inst.score, inst.mask, ConfigSpace{{64, 128}, {32, 64}, {4, 8}, {2}}, o);
  EXPECT_TRUE(r.timed);
  ASSERT_GE(r.best, 0) << formatReport(r);
  for (const Candidate& c : r.candidates) EXPECT_NE(c.status, Candidate::Status::Wrong) << formatReport(r);
  EXPECT_LE(r.candidates[size_t(r.best)].ms, r.candidates[size_t(r.defaultIndex)].ms);
}

}  // namespace
}  // namespace flextile
