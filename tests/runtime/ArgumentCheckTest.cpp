// The checks that run before the driver is called: copy ranges, launch shapes, shared memory,
// PTX entry names and the median of timing samples.
#include "runtime/DeviceBuffer.h"
#include "runtime/DriverError.h"
#include "runtime/Event.h"
#include "runtime/Kernel.h"
#include "runtime/Module.h"
#include "tests/ThrownMessage.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>

namespace flextile::runtime {
namespace {

unsigned freshSeed() {
  std::random_device device;
  return device();
}

// The message of the DriverError that `call` throws ("" and a test failure when none).
template <class Call>
std::string errorOf(Call&& call) { return testing::requiredMessage<DriverError>(call); }

TEST(CopyRange, AcceptsExactlyTheRangesInsideTheBuffer) {
  unsigned seed = freshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  char host = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    // Mix small sizes (edges) with huge ones (overflow of offset + bytes).
    auto draw = [&]() -> size_t {
      switch (random() % 3) {
        case 0: return random() % 8;
        case 1: return random() % 100000;
        default: return std::numeric_limits<size_t>::max() - random() % 8;
      }
    };
    size_t capacity = draw(), offset = draw(), bytes = draw();
    bool fits = static_cast<unsigned __int128>(offset) + bytes <= capacity;
    SCOPED_TRACE("capacity " + std::to_string(capacity) + " offset " + std::to_string(offset) + " bytes " +
                 std::to_string(bytes));
    if (fits) {
      EXPECT_NO_THROW(checkCopyRange("copy", &host, bytes, offset, capacity));
    } else {
      std::string message = errorOf([&] { checkCopyRange("copy", &host, bytes, offset, capacity); });
      EXPECT_NE(message.find(std::to_string(bytes) + " bytes at offset " + std::to_string(offset)), std::string::npos)
          << message;
      EXPECT_NE(message.find("buffer of " + std::to_string(capacity) + " bytes"), std::string::npos) << message;
    }
  }
}

TEST(CopyRange, RefusesANullHostPointer) {
  std::string message = errorOf([] { checkCopyRange("DeviceBuffer::copyToHost", nullptr, 16, 0, 64); });
  EXPECT_EQ(message, "DeviceBuffer::copyToHost: the host pointer is null for a copy of 16 bytes");
  EXPECT_NO_THROW(checkCopyRange("copy", nullptr, 0, 0, 64));  // copying nothing needs no pointer
}

LaunchLimits h200Limits() {
  LaunchLimits limits;
  limits.deviceName = "NVIDIA H200";
  limits.maxGrid = {2147483647u, 65535u, 65535u};
  limits.maxThreadsPerBlock = 512;  // as if registers limited the kernel
  limits.registersPerThread = 128;
  limits.staticSharedBytes = 4096;
  limits.maxSharedBytesPerBlockOptin = 232448;
  return limits;
}

TEST(LaunchChecks, AcceptsLaunchesInsideTheLimits) {
  unsigned seed = freshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 random(seed);
  LaunchLimits limits = h200Limits();
  for (int trial = 0; trial < 200; ++trial) {
    auto upTo = [&](unsigned limit) { return unsigned(1 + random() % limit); };
    std::array<unsigned, 3> grid = {upTo(limits.maxGrid[0]), upTo(65535), upTo(65535)};
    unsigned threads = upTo(limits.maxThreadsPerBlock);
    size_t shared = random() % (limits.maxSharedBytesPerBlockOptin - limits.staticSharedBytes + 1);
    EXPECT_NO_THROW(validateLaunch("k", limits, grid, threads, shared));
  }
  EXPECT_NO_THROW(validateLaunch("k", limits, {2147483647u, 65535u, 65535u}, 512, 232448 - 4096));
}

TEST(LaunchChecks, RefusesAnEmptyOrOversizeGrid) {
  LaunchLimits limits = h200Limits();
  EXPECT_EQ(errorOf([&] { validateLaunch("softmax", limits, {4, 0, 1}, 128, 0); }),
            "kernel 'softmax': grid (4, 0, 1) has no blocks along y");
  EXPECT_EQ(errorOf([&] { validateLaunch("softmax", limits, {1, 1, 65536}, 128, 0); }),
            "kernel 'softmax': grid (1, 1, 65536) has 65536 blocks along z, over the limit of 65535");
}

TEST(LaunchChecks, RefusesBlocksTheKernelCannotRun) {
  LaunchLimits limits = h200Limits();
  EXPECT_EQ(errorOf([&] { validateLaunch("attn", limits, {1, 1, 1}, 0, 0); }),
            "kernel 'attn': a block of 0 threads");
  EXPECT_EQ(errorOf([&] { validateLaunch("attn", limits, {1, 1, 1}, 513, 0); }),
            "kernel 'attn': 513 threads per block, but it can run at most 512 (it uses 128 registers per thread)");
}

TEST(LaunchChecks, RefusesSharedMemoryOverTheOptInLimitNamingNeedAndLimit) {
  LaunchLimits limits = h200Limits();
  size_t dynamic = 232448 - 4096 + 1;
  EXPECT_EQ(errorOf([&] { validateLaunch("attn", limits, {1, 1, 1}, 128, dynamic); }),
            "kernel 'attn': needs 232449 bytes of shared memory per block (4096 static + 228353 dynamic), but "
            "NVIDIA H200 allows at most 232448 bytes per block (opt-in)");
}

TEST(PtxEntryNames, FindsEveryEntryAndNoFunction) {
  std::string ptx = R"(
.version 8.0
.target sm_80
.address_size 64
.func (.reg .b32 r) helper(.reg .b32 x) { ret; }
.visible .entry axpy(.param .u64 out) { ret; }
.entry   scale_rows_$1 (
  .param .u64 out) { ret; }
// .entry_not_a_kernel
)";
  EXPECT_EQ(ptxEntryNames(ptx), (std::vector<std::string>{"axpy", "scale_rows_$1"}));
  EXPECT_TRUE(ptxEntryNames("").empty());
}

TEST(Median, OfOddAndEvenCounts) {
  EXPECT_DOUBLE_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_DOUBLE_EQ(median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_DOUBLE_EQ(median({7.5}), 7.5);
  EXPECT_THROW(median({}), DriverError);

  unsigned seed = freshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 random(seed);
  std::vector<double> samples(1 + random() % 50);
  for (double& sample : samples) sample = std::uniform_real_distribution<double>(0, 10)(random);
  double middle = median(samples);
  size_t below = 0, above = 0;
  for (double sample : samples) {
    below += sample < middle;
    above += sample > middle;
  }
  EXPECT_LE(below, samples.size() / 2);
  EXPECT_LE(above, samples.size() / 2);
}

}  // namespace
}  // namespace flextile::runtime
