// Driver::probe diagnoses each way a library can fail to be a usable driver.
#include "runtime/Driver.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace flextile::runtime {
namespace {

constexpr const char* kConsequence = ": FlexTile can trace, compile to PTX and interpret, but not launch";

bool fakeDriverBuilt() { return std::ifstream(FLEXTILE_FAKE_CUDA_LIBRARY).good(); }

// Probes the fake driver in one behaviour.
bool probeFake(const char* mode, std::string* whyNot) {
  setenv("FLEXTILE_FAKE_CUDA_MODE", mode, 1);
  bool usable = Driver::probe(FLEXTILE_FAKE_CUDA_LIBRARY, whyNot);
  unsetenv("FLEXTILE_FAKE_CUDA_MODE");
  return usable;
}

TEST(Probe, AMissingLibraryIsNotFound) {
  std::string whyNot;
  EXPECT_FALSE(Driver::probe("/nonexistent/libcuda.so.1", &whyNot));
  EXPECT_EQ(whyNot, std::string("no CUDA driver (/nonexistent/libcuda.so.1 not found)") + kConsequence);
}

TEST(Probe, ALibraryThatIsNotADriverLacksCuInit) {
  std::string whyNot;
  EXPECT_FALSE(Driver::probe("libm.so.6", &whyNot));
  EXPECT_EQ(whyNot, std::string("no usable CUDA driver (libm.so.6 has no cuInit; FlexTile needs the driver of CUDA "
                                "12 or newer)") +
                        kConsequence);
}

TEST(Probe, AFileThatIsNotALibraryCannotBeLoaded) {
  std::string whyNot;
  EXPECT_FALSE(Driver::probe("/proc/self/status", &whyNot));
  EXPECT_EQ(whyNot.rfind("no CUDA driver (/proc/self/status could not be loaded: ", 0), 0u) << whyNot;
}

TEST(Probe, AFailingCuInitIsReportedByTheDriversOwnErrorName) {
  if (!fakeDriverBuilt()) GTEST_SKIP() << "the fake driver " << FLEXTILE_FAKE_CUDA_LIBRARY << " is not here";
  std::string whyNot;
  EXPECT_FALSE(probeFake("init_fails", &whyNot));
  EXPECT_EQ(whyNot, std::string("no usable CUDA driver (cuInit failed: CUDA_ERROR_NO_DEVICE (reported by the fake "
                                "driver))") +
                        kConsequence);
}

TEST(Probe, NoDevicesIsItsOwnReason) {
  if (!fakeDriverBuilt()) GTEST_SKIP() << "the fake driver " << FLEXTILE_FAKE_CUDA_LIBRARY << " is not here";
  std::string whyNot;
  EXPECT_FALSE(probeFake("no_devices", &whyNot));
  EXPECT_EQ(whyNot, std::string("no CUDA device (driver 12.4 reports none)") + kConsequence);
}

TEST(Probe, AHealthyDriverWithoutTheV2ElapsedTimeIsUsable) {
  if (!fakeDriverBuilt()) GTEST_SKIP() << "the fake driver " << FLEXTILE_FAKE_CUDA_LIBRARY << " is not here";
  std::string whyNot = "unchanged";
  EXPECT_TRUE(probeFake("healthy", &whyNot));
  EXPECT_EQ(whyNot, "");
  // Probing leaves the process-wide driver alone.
  EXPECT_EQ(Driver::loadedApi(), nullptr);
}

}  // namespace
}  // namespace flextile::runtime
