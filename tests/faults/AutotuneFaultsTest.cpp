// A driver error in the middle of an autotune sweep (runtime/FaultInjection.h simulates one):
// the sweep goes on, the one config it hit is reported failed with the driver's message, and
// flex_attention with that config afterwards gives the right answer (the failure left nothing
// behind in the caches). On a GPU the same is checked for a failed launch in the timing loop
// (tests/autotune/AutotuneGpuTest.cpp, AutotuneGpu.InjectedLaunchFailureFailsOneCandidateOnly).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "FlexAttentionCheck.h"
#include "attention_templates/Variants.h"
#include "autotune/Autotune.h"
#include "gpu/GpuTest.h"
#include "runtime/DriverError.h"
#include "runtime/FaultInjection.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace flextile {
namespace {

using namespace flextile::attention;
using namespace flextile::autotune;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using runtime::FaultSite;

TEST(FaultInjection, TheNthCallFailsOnceWithTheDriversError) {
  runtime::armFault(FaultSite::Launch, 3);
  const int before = runtime::injectedFaults(FaultSite::Launch);
  EXPECT_NO_THROW(runtime::maybeInjectFault(FaultSite::Launch, "k"));
  EXPECT_NO_THROW(runtime::maybeInjectFault(FaultSite::Launch, "k"));
  try {
    runtime::maybeInjectFault(FaultSite::Launch, "attention");
    ADD_FAILURE() << "the third call did not fail";
  } catch (const runtime::DriverError& e) {
    EXPECT_EQ(e.function(), "cuLaunchKernel");
    EXPECT_EQ(e.result(), 719);
    EXPECT_NE(std::string(e.what()).find("injected fault"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'attention'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(runtime::maybeInjectFault(FaultSite::Launch, "k")) << "one fault, then disarmed";
  EXPECT_EQ(runtime::injectedFaults(FaultSite::Launch), before + 1);
}

TEST(FaultInjection, ExactlyOneOfManyThreadsGetsTheFault) {
  runtime::armFault(FaultSite::ModuleLoad, 17);
  std::atomic<int> thrown{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 8; ++t)
    pool.emplace_back([&] {
      for (int i = 0; i < 10; ++i) try {
          runtime::maybeInjectFault(FaultSite::ModuleLoad, "m");
        } catch (const runtime::DriverError&) {
          ++thrown;
        }
    });
  for (auto& th : pool) th.join();
  EXPECT_EQ(thrown.load(), 1);
}

TEST(AutotuneFaults, DriverErrorMidSweepFailsOneConfigAndTheResultStaysRight) {
  SeededRandom rng;
  const int64_t L = 150, D = 32;
  const VariantInstance inst = variant("causal").make({1, 2, L, L, MemorySpace::Host, {64, 64}, rng()});
  Tensor q = randomTensor(rng, DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  Tensor k = randomTensor(rng, DType::BF16, {1, 1, L, D}, MemorySpace::Host);
  Tensor v = randomTensor(rng, DType::BF16, {1, 1, L, D}, MemorySpace::Host);
  TuneOptions o;
  o.threads = 2;
  o.runPtxas = false;
  o.target = codegen::Target::sm80();
  const ConfigSpace space{{32, 64}, {32, 64}, {4}, {1, 2}};
  runtime::armFault(FaultSite::AutotuneCompile, 3);
  const TuneReport r = tuneFlexAttention(q, k, v, inst.score, inst.mask, space, o);
  runtime::armFault(FaultSite::AutotuneCompile, 0);
  int failed = 0, compiled = 0;
  const Candidate* hit = nullptr;
  for (const Candidate& c : r.candidates) {
    if (c.status == Candidate::Status::Failed) {
      ++failed;
      hit = &c;
      EXPECT_NE(c.reason.find("injected fault"), std::string::npos) << formatReport(r);
    }
    if (c.status == Candidate::Status::Compiled) ++compiled;
  }
  ASSERT_EQ(failed, 1) << formatReport(r);
  EXPECT_GE(compiled, 3) << "the sweep went on past the failure: " << formatReport(r);
  EXPECT_NE(formatReport(r).find("injected fault"), std::string::npos);
  // The failed config, run now, gives the reference's answer.
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = L, .S = L, .D = D, .dtype = DType::BF16, .context = "after the fault"};
  Tensor out = Tensor::empty(DType::BF16, {1, 2, L, D}, MemorySpace::Host);
  EXPECT_TRUE(checkFlexAttentionOn(q, k, v, out, c.describe(), inst.score, inst.mask, inst.refScore, inst.refMask,
                                   {.config = hit->config}));
}

}  // namespace
}  // namespace flextile
