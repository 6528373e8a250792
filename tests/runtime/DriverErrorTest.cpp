// DriverError names the failed entry point, the CUresult by name and description, and context.
#include "runtime/DriverError.h"

#include <gtest/gtest.h>

#include <random>

namespace flextile::runtime {
namespace {

TEST(DriverError, NamesTheFunctionTheResultAndTheContext) {
  DriverError error("cuMemAlloc_v2", 2, "allocating 1024 bytes on device 0");
  EXPECT_STREQ(error.what(),
               "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of device memory); allocating 1024 bytes on "
               "device 0");
  EXPECT_EQ(error.function(), "cuMemAlloc_v2");
  EXPECT_EQ(error.result(), 2);
}

TEST(DriverError, OmitsAnEmptyContext) {
  DriverError error("cuCtxSynchronize", 700);
  EXPECT_STREQ(error.what(), "cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS (kernel accessed an illegal address)");
}

TEST(DriverError, KnowsTheCommonResultsWithoutADriver) {
  EXPECT_EQ(describeResult(1).rfind("CUDA_ERROR_INVALID_VALUE (", 0), 0u);
  EXPECT_EQ(describeResult(218).rfind("CUDA_ERROR_INVALID_PTX (", 0), 0u);
  EXPECT_EQ(describeResult(209).rfind("CUDA_ERROR_NO_BINARY_FOR_GPU (", 0), 0u);
  EXPECT_EQ(describeResult(719).rfind("CUDA_ERROR_LAUNCH_FAILED (", 0), 0u);
  EXPECT_EQ(describeResult(34).rfind("CUDA_ERROR_STUB_LIBRARY (", 0), 0u);
}

TEST(DriverError, GivesTheNumberOfAnUnknownResult) {
  std::random_device device;
  unsigned seed = device();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 random(seed);
  // 1000..1999 holds no CUresult.
  int code = std::uniform_int_distribution<int>(1000, 1999)(random);
  DriverError error("cuLaunchKernel", code, "kernel 'k'");
  EXPECT_EQ(std::string(error.what()),
            "cuLaunchKernel failed: CUDA_ERROR_" + std::to_string(code) + " (unknown CUresult); kernel 'k'");
  EXPECT_EQ(error.result(), code);
}

TEST(DriverError, APlainMessageHasNoFunction) {
  DriverError error("kernel 'k': a block of 0 threads");
  EXPECT_STREQ(error.what(), "kernel 'k': a block of 0 threads");
  EXPECT_EQ(error.function(), "");
  EXPECT_EQ(error.result(), 0);
  // It is a std::runtime_error, so callers that know nothing of the runtime still catch it.
  EXPECT_THROW(throw DriverError("x"), std::runtime_error);
}

}  // namespace
}  // namespace flextile::runtime
