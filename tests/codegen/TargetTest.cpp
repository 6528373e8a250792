// The target descriptions: what each supported architecture has, how targets are named, and that a
// target without a description fails with an error naming it and the supported ones wherever its
// description is asked for (code generation, the templates' defaults), never by falling back.
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "codegen/Compiler.h"
#include "codegen/Target.h"
#include "ir/Parser.h"

namespace flextile::codegen {
namespace {

using F = Feature;
const std::vector<Feature> kAllFeatures{F::Ldmatrix, F::MmaSync, F::CpAsync, F::TensorMemoryAccelerator, F::BulkReduce, F::Wgmma,
                                        F::SetMaxNReg};

std::set<Feature> featuresOf(const Target& t) {
  std::set<Feature> out;
  for (Feature f : kAllFeatures)
    if (t.has(f)) out.insert(f);
  return out;
}

TEST(TargetDescription, EachArchitectureHasItsFeatures) {
  EXPECT_EQ(featuresOf(Target{75, false}), (std::set<Feature>{F::Ldmatrix}));
  const std::set<Feature> ampere{F::Ldmatrix, F::MmaSync, F::CpAsync};
  EXPECT_EQ(featuresOf(Target::sm80()), ampere);
  EXPECT_EQ(featuresOf(Target{86, false}), ampere);
  EXPECT_EQ(featuresOf(Target{89, false}), ampere);
  // sm_90 has TMA; wgmma and setmaxnreg are sm_90a's only (PTX: "requires sm_90a").
  EXPECT_EQ(featuresOf(Target{90, false}), (std::set<Feature>{F::Ldmatrix, F::MmaSync, F::CpAsync, F::TensorMemoryAccelerator, F::BulkReduce}));
  EXPECT_EQ(featuresOf(Target::sm90a()), (std::set<Feature>{F::Ldmatrix, F::MmaSync, F::CpAsync,
                                                            F::TensorMemoryAccelerator, F::BulkReduce, F::Wgmma, F::SetMaxNReg}));
  for (Feature f : kAllFeatures) EXPECT_STRNE(featureName(f), "?");
}

TEST(TargetDescription, EachArchitectureHasItsLimits) {
  struct Expected {
    Target target;
    int64_t perBlock, perSm;
    int threadsPerSm;
  };
  const int64_t KiB = 1024;
  for (const Expected& e : {Expected{{75, false}, 64 * KiB, 64 * KiB, 1024}, Expected{Target::sm80(), 163 * KiB, 164 * KiB, 2048},
                            Expected{{86, false}, 99 * KiB, 100 * KiB, 1536}, Expected{{89, false}, 99 * KiB, 100 * KiB, 1536},
                            Expected{{90, false}, 227 * KiB, 228 * KiB, 2048}, Expected{Target::sm90a(), 227 * KiB, 228 * KiB, 2048}}) {
    SCOPED_TRACE(e.target.smName());
    const TargetDescription& d = e.target.description();
    EXPECT_EQ(d.sharedBytesPerBlock, e.perBlock);
    EXPECT_EQ(e.target.maxSharedBytesPerBlock(), e.perBlock);
    EXPECT_EQ(d.sharedBytesPerSm, e.perSm);
    EXPECT_EQ(e.target.sharedBytesPerSm(), e.perSm);
    EXPECT_EQ(d.maxThreadsPerSm, e.threadsPerSm);
    EXPECT_EQ(d.registersPerSm, 65536);
    EXPECT_EQ(d.registersPerThread, 255);
    EXPECT_EQ(d.ptxVersion, 80);
    // One block at its largest still fits beside the system's reservation.
    EXPECT_LE(d.sharedBytesPerBlock + d.reservedSharedBytesPerBlock, d.sharedBytesPerSm);
    EXPECT_GT(d.part.multiprocessors, 0);
    EXPECT_FALSE(d.part.name.empty());
  }
  EXPECT_EQ(Target::sm90a().description().part.multiprocessors, 132);
}

TEST(TargetDescription, TensorCoreShapes) {
  for (const Target& t : {Target::sm80(), Target{86, false}, Target{89, false}, Target{90, false}, Target::sm90a()}) {
    SCOPED_TRACE(t.smName());
    EXPECT_EQ(t.description().mmaSyncShape(16), (MmaShape{16, 8, 16}));
    EXPECT_EQ(t.description().mmaSyncShape(32), (MmaShape{16, 8, 8}));
    EXPECT_FALSE(t.description().mmaSyncShape(8));
  }
  EXPECT_FALSE((Target{75, false}.description().mmaSyncShape(16)));
  const TargetDescription& hopper = Target::sm90a().description();
  for (int64_t n = 0; n <= 264; ++n) {
    const bool takes = n >= 8 && n <= 256 && n % 8 == 0;
    EXPECT_EQ(hopper.wgmmaTakesN(n), takes) << n;
    EXPECT_EQ(hopper.wgmmaShape(n).has_value(), takes) << n;
    if (takes) {
      EXPECT_EQ(*hopper.wgmmaShape(n), (MmaShape{64, int(n), 16}));
    }
  }
  for (const Target& t : {Target::sm80(), Target{90, false}}) {
    EXPECT_FALSE(t.description().wgmmaTakesN(64)) << t.smName();
    EXPECT_FALSE(t.description().wgmmaShape(64)) << t.smName();
  }
}

TEST(TargetDescription, NamesAndCapabilities) {
  std::set<std::string> names;
  for (const TargetDescription& d : supportedTargets()) {
    EXPECT_TRUE(names.insert(std::string(d.name)).second) << d.name << " twice";
    const std::optional<Target> t = Target::fromName(d.name);
    ASSERT_TRUE(t) << d.name;
    EXPECT_EQ(t->smName(), d.name);
    EXPECT_EQ(&t->description(), &d);
    EXPECT_EQ(Target::fromName(std::string(d.name).substr(3)), t);  // "90a"
  }
  EXPECT_EQ(supportedTargetNames(), "sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a");
  EXPECT_EQ(Target::fromName("sm_90a"), Target::sm90a());
  EXPECT_EQ(Target::fromName("sm_80"), Target::sm80());
  for (const char* bad : {"sm_70", "sm_80a", "sm_120", "sm_100a", "90b", "", "sm_", "ampere"})
    EXPECT_FALSE(Target::fromName(bad)) << bad;
  // A GPU is compiled for at its most capable: Hopper's arch-specific variant, the others plain.
  EXPECT_EQ(Target::fromCapability(9, 0), Target::sm90a());
  EXPECT_EQ(Target::fromCapability(8, 0), Target::sm80());
  EXPECT_EQ(Target::fromCapability(8, 6), (Target{86, false}));
  EXPECT_EQ(Target::fromCapability(8, 9), (Target{89, false}));
  // Unknown capabilities are kept as they are, for the error where code is generated.
  EXPECT_EQ(Target::fromCapability(12, 0), (Target{120, false}));
}

void expectUnknownTargetError(const std::function<void()>& run, const std::string& name, const std::string& capability) {
  try {
    run();
    ADD_FAILURE() << name << " did not fail";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << m;
    EXPECT_NE(m.find(name), std::string::npos) << m;
    EXPECT_NE(m.find("compute capability " + capability), std::string::npos) << m;
    EXPECT_NE(m.find(supportedTargetNames()), std::string::npos) << m;
  }
}

TEST(TargetDescription, UnknownTargetsAreAnErrorNamingThemAndTheSupportedOnes) {
  expectUnknownTargetError([] { Target{120, false}.description(); }, "sm_120", "12.0");
  expectUnknownTargetError([] { Target{70, false}.has(Feature::MmaSync); }, "sm_70", "7.0");
  expectUnknownTargetError([] { Target{100, true}.maxSharedBytesPerBlock(); }, "sm_100a", "10.0");
  expectUnknownTargetError([] { Target{80, true}.description(); }, "sm_80a", "8.0");  // no arch-specific Ampere
}

const char* kCopyKernel = R"(
func @copy(%x: ptr<f32>, %y: ptr<f32>) attributes {num_warps = 1} {
  %range = arange {start = 0, end = 32} : i32[32]
  %xs = splat %x : ptr<f32>[32]
  %px = addptr %xs, %range : ptr<f32>[32]
  %v = load %px : f32[32]
  %ys = splat %y : ptr<f32>[32]
  %py = addptr %ys, %range : ptr<f32>[32]
  store %py, %v
  return
}
)";

TEST(TargetDescription, CodeIsGeneratedForEverySupportedTargetAndForNoOther) {
  const ir::Module m = ir::parseModule(kCopyKernel);
  const ir::Function& f = *m.functions.at(0);
  for (const TargetDescription& d : supportedTargets()) {
    const Target t{d.capability, d.archSpecific};
    CompiledKernel k;
    ASSERT_NO_THROW(k = compile(f, {t})) << d.name;
    EXPECT_NE(k.ptx.find(".target " + std::string(d.name) + "\n"), std::string::npos) << k.ptx;
    EXPECT_NE(k.ptx.find(".version 8.0\n"), std::string::npos) << k.ptx;
  }
  expectUnknownTargetError([&] { compile(f, {Target{120, false}}); }, "sm_120", "12.0");
  expectUnknownTargetError([&] { compile(f, {Target{75, true}}); }, "sm_75a", "7.5");
}

}  // namespace
}  // namespace flextile::codegen
