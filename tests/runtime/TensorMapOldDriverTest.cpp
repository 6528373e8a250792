// A CUDA 11.8 driver (the recording fake built without cuTensorMapEncodeTiled): FlexTile still
// loads it (nothing else needs CUDA 12), and a tensor map is refused with the reason, naming the
// driver and its version, instead of a null call or a bare "symbol not found". Without
// cuLaunchKernelEx, a kernel that waits for its prior grids is launched the ordinary way. Without
// stream capture, a graph is refused with the entry points it needs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <unistd.h>

#include "dsl/DSL.h"

#include "runtime/Driver.h"
#include "runtime/DriverError.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"
#include "runtime/TensorMap.h"

namespace flextile::runtime {
namespace {

const bool kOldDriver = [] {
  setenv("FLEXTILE_CUDA_LIBRARY", FLEXTILE_OLD_RECORDING_CUDA_LIBRARY, 1);
  return true;
}();

TEST(TensorMapOldDriver, AMissingEncoderIsAClearError) {
  ASSERT_TRUE(kOldDriver);
  std::string whyNot;
  ASSERT_TRUE(Driver::available(&whyNot)) << "the old driver must still load: " << whyNot;
  EXPECT_EQ(Driver::get().versionString(), "11.8");
  TensorMapDesc desc;
  desc.globalAddress = 0x7f0000001000;
  desc.dtype = TensorMapDType::BF16;
  desc.globalDims = {64, 6000};
  desc.globalStrides = {128};
  desc.boxDims = {64, 128};
  std::string msg;
  try {
    TensorMap map(desc);
  } catch (const DriverError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("cuTensorMapEncodeTiled is missing from the CUDA driver"), std::string::npos) << msg;
  EXPECT_NE(msg.find(FLEXTILE_OLD_RECORDING_CUDA_LIBRARY), std::string::npos) << msg;
  EXPECT_NE(msg.find("(version 11.8)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("need the driver of CUDA 12.0 or newer"), std::string::npos) << msg;

  // A bad argument is still named first: validation needs no driver.
  desc.boxDims = {64, 300};
  try {
    TensorMap map(desc);
    msg = "(encoded)";
  } catch (const DriverError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("boxDims[1] = 300 is outside 1..256"), std::string::npos) << msg;
}

TEST(TensorMapOldDriver, AKernelThatWaitsForItsPriorGridsLaunchesTheOrdinaryWay) {
  ASSERT_TRUE(kOldDriver);
  char path[] = "/tmp/flextile_old_driver_log_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  setenv("FLEXTILE_FAKE_CUDA_LOG", path, 1);
  using namespace flextile::dsl;
  Tensor y = Tensor::empty(DType::F32, {256}, MemorySpace::Device);
  Kernel k = kernel("fill_after_prior_grids", [](Ptr<f32> y, Const<int> BLOCK) {
    wait_for_prior_grids();
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    store(y + offs, offs.to(DType::F32));
  });
  k.run({.grid = {2, 1, 1}, .constants = {128}}, y);
  unsetenv("FLEXTILE_FAKE_CUDA_LOG");
  std::ifstream in(path);
  std::stringstream log;
  log << in.rdbuf();
  std::remove(path);
  EXPECT_NE(log.str().find("launch fill_after_prior_grids stream"), std::string::npos) << log.str();
  EXPECT_EQ(log.str().find("launchex"), std::string::npos) << log.str();
}

TEST(TensorMapOldDriver, ADriverWithoutStreamCaptureRefusesAGraphByName) {
  ASSERT_TRUE(kOldDriver);
  Stream s;
  std::string msg;
  try {
    Graph::capture(s, [] {});
  } catch (const DriverError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("no stream capture or graph launch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuStreamBeginCapture_v2"), std::string::npos) << msg;
}

}  // namespace
}  // namespace flextile::runtime
