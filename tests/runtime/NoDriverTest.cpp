// Without a driver every GPU entry point must throw DriverError with one plain reason, never
// crash. The driver path is forced to a file that does not exist, so this holds on GPU machines too.
#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/Driver.h"
#include "runtime/DriverError.h"
#include "runtime/Event.h"
#include "runtime/Module.h"
#include "runtime/Stream.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace flextile::runtime {
namespace {

constexpr const char* kMissingLibrary = "/nonexistent/flextile-test/libcuda.so.1";

// Runs before main, so before the process-wide driver can load.
const bool kDriverForcedMissing = [] {
  setenv("FLEXTILE_CUDA_LIBRARY", kMissingLibrary, 1);
  return true;
}();

const std::string kExpectedReason = std::string("no CUDA driver (") + kMissingLibrary +
                                    " not found): FlexTile can trace, compile to PTX and interpret, but not launch";

TEST(NoDriver, AvailableIsFalseWithThePlainReason) {
  ASSERT_TRUE(kDriverForcedMissing);
  EXPECT_EQ(Driver::libraryName(), kMissingLibrary);
  std::string whyNot;
  EXPECT_FALSE(Driver::available(&whyNot));
  EXPECT_EQ(whyNot, kExpectedReason);
  EXPECT_FALSE(Driver::available());  // asking twice, without a reason, is fine
  EXPECT_EQ(Driver::loadedApi(), nullptr);
}

TEST(NoDriver, TheDefaultLibraryIsLibcuda) {
  const char* saved = std::getenv("FLEXTILE_CUDA_LIBRARY");
  std::string restore = saved ? saved : "";
  unsetenv("FLEXTILE_CUDA_LIBRARY");
  EXPECT_EQ(Driver::libraryName(), "libcuda.so.1");
  setenv("FLEXTILE_CUDA_LIBRARY", "", 1);
  EXPECT_EQ(Driver::libraryName(), "libcuda.so.1");
  setenv("FLEXTILE_CUDA_LIBRARY", restore.c_str(), 1);
}

// Expects `call` to throw DriverError whose message is exactly the no-driver reason.
void expectNoDriverError(const char* what, const std::function<void()>& call) {
  SCOPED_TRACE(what);
  try {
    call();
    ADD_FAILURE() << what << " did not throw without a driver";
  } catch (const DriverError& error) {
    EXPECT_EQ(std::string(error.what()), kExpectedReason);
    EXPECT_EQ(error.function(), "");
    EXPECT_EQ(error.result(), 0);
  } catch (const std::exception& error) {
    ADD_FAILURE() << what << " threw something other than DriverError: " << error.what();
  }
}

TEST(NoDriver, EveryGpuEntryPointThrowsTheReason) {
  // Twice each: a failed load must not turn into a crash or another message the second time.
  for (int round = 0; round < 2; ++round) {
    expectNoDriverError("Driver::get", [] { Driver::get(); });
    expectNoDriverError("Device::current", [] { Device::current(); });
    expectNoDriverError("Device::get", [] { Device::get(0); });
    expectNoDriverError("Device::count", [] { Device::count(); });
    expectNoDriverError("DeviceBuffer", [] { DeviceBuffer buffer(1024); });
    expectNoDriverError("DeviceBuffer of 0 bytes", [] { DeviceBuffer buffer(0); });
    expectNoDriverError("Module", [] { Module module(".version 8.0\n.target sm_80\n.address_size 64\n"); });
    expectNoDriverError("Stream", [] { Stream stream; });
    expectNoDriverError("Event", [] { Event event; });
    expectNoDriverError("Timer", [] { Timer timer; });
    expectNoDriverError("synchronize", [] { synchronize(); });
    expectNoDriverError("timeKernel", [] { timeKernel([] {}, 1, 3); });
  }
}

TEST(NoDriver, ManyThreadsAskingAtOnceAllGetTheReason) {
  std::vector<std::string> reasons(8);
  std::vector<int> answers(8, -1);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] { answers[i] = Driver::available(&reasons[i]) ? 1 : 0; });
  for (auto& thread : threads) thread.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(answers[i], 0);
    EXPECT_EQ(reasons[i], kExpectedReason);
  }
}

TEST(NoDriver, AnEmptyBufferNeedsNoDriver) {
  DeviceBuffer empty;
  EXPECT_EQ(empty.address(), 0u);
  EXPECT_EQ(empty.bytes(), 0u);
  EXPECT_TRUE(empty.empty());
  DeviceBuffer moved = std::move(empty);
  EXPECT_TRUE(moved.empty());
  moved.reset();
  // Range checks come before any driver call.
  char byte = 0;
  EXPECT_THROW(moved.copyFromHost(&byte, 1), DriverError);
  EXPECT_THROW(moved.copyToHost(&byte, 1), DriverError);
  EXPECT_NO_THROW(moved.copyToHost(&byte, 0));
  EXPECT_NO_THROW(moved.fillBytes(0xFF));
}

}  // namespace
}  // namespace flextile::runtime
