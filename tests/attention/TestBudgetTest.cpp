// The GPU test budget's sampler and seed parsing (gpu/TestBudget.h), on the host: a sampled sweep
// must still visit every config, and a bad FLEXTILE_TEST_SEED must be refused, not misread.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "FlexAttentionCheck.h"
#include "gpu/GpuTest.h"

using namespace flextile::testing;

TEST(TestBudget, SampleDealsEveryConfigBeforeAnyTwice) {
  if (fullSweeps()) GTEST_SKIP() << "FLEXTILE_GPU_TESTS_FULL=1: the sample is everything";
  SeededRandom rng;
  const std::vector<int> all{10, 11, 12, 13, 14, 15, 16};
  for (size_t perShape : {1, 2, 3}) {
    ConfigSample sample(all, perShape, rng);
    std::map<int, int> seen;
    const size_t shapes = (all.size() + perShape - 1) / perShape;  // enough shapes for one pass
    for (size_t n = 0; n < shapes; ++n) {
      const std::vector<int> picked = sample.next();
      ASSERT_EQ(picked.size(), perShape);
      EXPECT_TRUE(std::is_sorted(picked.begin(), picked.end()));
      EXPECT_EQ(std::set<int>(picked.begin(), picked.end()).size(), picked.size()) << "a config twice in one shape";
      for (int c : picked) ++seen[c];
    }
    EXPECT_EQ(seen.size(), all.size()) << "per shape " << perShape << ": a config was never dealt";
  }
}

TEST(TestBudget, SampleCanPinTheFirstConfig) {
  if (fullSweeps()) GTEST_SKIP() << "FLEXTILE_GPU_TESTS_FULL=1: the sample is everything";
  SeededRandom rng;
  ConfigSample sample(std::vector<int>{0, 64, 128}, 2, rng, /*alwaysFirst=*/true);
  std::set<int> others;
  for (int n = 0; n < 2; ++n) {
    const std::vector<int> picked = sample.next();
    ASSERT_EQ(picked.size(), 2u);
    EXPECT_EQ(picked[0], 0);
    others.insert(picked[1]);
  }
  EXPECT_EQ(others, (std::set<int>{64, 128}));
  // More per shape than there are configs: each once.
  ConfigSample wide(std::vector<int>{1, 2}, 5, rng);
  EXPECT_EQ(wide.next(), (std::vector<int>{1, 2}));
}

TEST(TestBudget, TheSameSeedDealsTheSameConfigs) {
  std::mt19937_64 a(42), b(42);
  ConfigSample x(std::vector<int>{1, 2, 3, 4, 5}, 2, a), y(std::vector<int>{1, 2, 3, 4, 5}, 2, b);
  for (int n = 0; n < 6; ++n) EXPECT_EQ(x.next(), y.next());
}

TEST(TestBudget, SeedsParseOrAreRefused) {
  EXPECT_EQ(detail::parseSeed("42"), 42u);
  EXPECT_EQ(detail::parseSeed("18446744073709551615"), 18446744073709551615ull);
  for (const char* bad : {"", "12x", "-1", "seed", "18446744073709551616"})
    EXPECT_THROW(detail::parseSeed(bad), std::invalid_argument) << "'" << bad << "'";
  try {
    detail::parseSeed("12x");
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("FLEXTILE_TEST_SEED='12x'"), std::string::npos) << e.what();
  }
  std::mt19937_64 rng(1);
  EXPECT_THROW(ConfigSample(std::vector<int>{}, 1, rng), std::invalid_argument);
}

TEST(TestBudget, EachTestGetsItsOwnSeed) {
  // The same run seed, another test name: another seed (testSeed mixes in the name).
  EXPECT_NE(detail::mix(runSeed() ^ detail::hashName("A.b")), detail::mix(runSeed() ^ detail::hashName("A.c")));
  EXPECT_EQ(testSeed(), testSeed());
}

// The comparison a GPU check of a large problem makes against a sampled reference (rows left out
// have lse NaN): exact where sampled, and every other element must still have been written.
TEST(TestBudget, ASampledReferenceStillCatchesAnUnwrittenElement) {
  using flextile::dsl::DType;
  using flextile::dsl::MemorySpace;
  using flextile::dsl::Tensor;
  SeededRandom rng;
  const int64_t B = 1, H = 2, L = 40, S = 30, D = 16;
  const Tensor q = randomTensor(rng, DType::F32, {B, H, L, D}, MemorySpace::Host);
  const Tensor k = randomTensor(rng, DType::F32, {B, H, S, D}, MemorySpace::Host);
  const Tensor v = randomTensor(rng, DType::F32, {B, H, S, D}, MemorySpace::Host);
  // Row 7 of each head sees no key: out 0, lse -inf.
  const flextile::attention::RefMaskFn mask = [](int64_t, int64_t, int64_t i, int64_t j) { return i != 7 && j <= i; };
  const flextile::attention::ReferenceResult full = flextile::attention::referenceAttention(q, k, v, nullptr, mask, 0.25);
  flextile::attention::ReferenceResult sampled = full;
  for (int64_t row = 0; row < B * H * L; ++row)
    if (row % 5 != 0 && row % L != 7) {  // keep every fifth row and the masked ones
      sampled.lse[size_t(row)] = NAN;
      std::fill_n(sampled.out.begin() + row * D, D, NAN);
    }
  auto asTensors = [&](std::vector<float> out, std::vector<float> lse) {
    return std::pair{Tensor::fromHost(out, {B, H, L, D}, MemorySpace::Host),
                     Tensor::fromHost(lse, {B, H, L}, MemorySpace::Host)};
  };
  const std::vector<float> goodOut(full.out.begin(), full.out.end()), goodLse(full.lse.begin(), full.lse.end());
  {
    auto [out, lse] = asTensors(goodOut, goodLse);
    EXPECT_TRUE(compareWithReference(out, lse, sampled, D, DType::F32));
  }
  {  // an element of a row outside the sample never written (still the poison)
    std::vector<float> out = goodOut;
    out[size_t(3 * D + 5)] = NAN;
    auto [o, l] = asTensors(out, goodLse);
    EXPECT_NONFATAL_FAILURE(compareWithReference(o, l, sampled, D, DType::F32), "outside the reference's sample");
  }
  {  // an lse outside the sample never written
    std::vector<float> lse = goodLse;
    lse[3] = NAN;
    auto [o, l] = asTensors(goodOut, lse);
    EXPECT_NONFATAL_FAILURE(compareWithReference(o, l, sampled, D, DType::F32), "lse[3]");
  }
  {  // a wrong value in a sampled row, and a masked row that is not 0
    std::vector<float> out = goodOut;
    out[size_t(5 * D + 2)] += 0.1f;
    auto [o, l] = asTensors(out, goodLse);
    EXPECT_NONFATAL_FAILURE(compareWithReference(o, l, sampled, D, DType::F32), "out[82]");
    std::vector<float> masked = goodOut;
    masked[size_t(7 * D)] = 1e-3f;
    auto [m, ml] = asTensors(masked, goodLse);
    EXPECT_NONFATAL_FAILURE(compareWithReference(m, ml, sampled, D, DType::F32), "a row with no allowed key");
  }
}
