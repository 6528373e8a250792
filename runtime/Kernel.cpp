#include "runtime/Kernel.h"

#include <cstring>

#include "runtime/FaultInjection.h"

#include "runtime/Device.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"
#include "runtime/Stream.h"

namespace flextile::runtime {

namespace {

std::string gridString(std::array<unsigned, 3> grid) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "(" + std::string&&.
  std::string text = "(";
  text += std::to_string(grid[0]);
  text += ", ";
  text += std::to_string(grid[1]);
  text += ", ";
  text += std::to_string(grid[2]);
  text += ")";
  return text;
}

}  // namespace

void validateLaunch(const std::string& kernelName, const LaunchLimits& limits, std::array<unsigned, 3> grid,
                    unsigned threads, size_t dynamicSharedBytes) {
  // Messages are built only on failure: this runs on every launch.
  auto kernel = [&] { return "kernel '" + kernelName + "'"; };
  const char* axes = "xyz";
  for (int axis = 0; axis < 3; ++axis) {
    if (grid[axis] == 0)
      throw DriverError(kernel() + ": grid " + gridString(grid) + " has no blocks along " + axes[axis]);
    if (grid[axis] > limits.maxGrid[axis])
      throw DriverError(kernel() + ": grid " + gridString(grid) + " has " + std::to_string(grid[axis]) +
                        " blocks along " + axes[axis] + ", over the limit of " +
                        std::to_string(limits.maxGrid[axis]));
  }
  if (threads == 0) throw DriverError(kernel() + ": a block of 0 threads");
  if (threads > limits.maxThreadsPerBlock)
    throw DriverError(kernel() + ": " + std::to_string(threads) + " threads per block, but it can run at most " +
                      std::to_string(limits.maxThreadsPerBlock) +
                      (limits.registersPerThread > 0
                           ? " (it uses " + std::to_string(limits.registersPerThread) + " registers per thread)"
                           : std::string()));
  size_t total = limits.staticSharedBytes + dynamicSharedBytes;
  if (total > limits.maxSharedBytesPerBlockOptin)
    throw DriverError(kernel() + ": needs " + std::to_string(total) + " bytes of shared memory per block (" +
                      std::to_string(limits.staticSharedBytes) + " static + " + std::to_string(dynamicSharedBytes) +
                      " dynamic), but " + (limits.deviceName.empty() ? "the device" : limits.deviceName) +
                      " allows at most " + std::to_string(limits.maxSharedBytesPerBlockOptin) +
                      " bytes per block (opt-in)");
}

LaunchLimits Kernel::computeLimits() const {
  LaunchLimits limits;
  limits.deviceName = device_->name();
  auto maxGrid = device_->maxGrid();
  limits.maxGrid = {unsigned(maxGrid[0]), unsigned(maxGrid[1]), unsigned(maxGrid[2])};
  limits.maxThreadsPerBlock = unsigned(attributes_.maxThreadsPerBlock);
  limits.registersPerThread = attributes_.registersPerThread;
  limits.staticSharedBytes = size_t(attributes_.staticSharedBytes);
  limits.maxSharedBytesPerBlockOptin = device_->maxSharedBytesPerBlockOptin();
  return limits;
}

void Kernel::launch(std::array<unsigned, 3> grid, unsigned threads, unsigned sharedBytes, void** args,
                    Stream* stream, bool programmaticLaunch) const {
  if (!function_) throw DriverError("Kernel::launch: an empty kernel handle");
  validateLaunch(name_, limits_, grid, threads, sharedBytes);
  if (stream && stream->device() != device_)
    throw DriverError("kernel '" + name_ + "': launched on a stream of device " +
                      std::to_string(stream->device()->ordinal()) + " but loaded on device " +
                      std::to_string(device_->ordinal()));
  device_->makeCurrent();
  const cu::Api& api = cu::api();
  auto function = static_cast<cu::Function>(function_);
  // Above the default limit (48 KiB less static) a kernel must opt in to its dynamic shared memory.
  if (int(sharedBytes) > dynamicSharedLimit_->load(std::memory_order_relaxed)) {
    cu::checkLazy(api.funcSetAttribute(function, cu::kFuncMaxDynamicSharedSizeBytes, int(sharedBytes)),
                  "cuFuncSetAttribute", [&] {
                    return "kernel '" + name_ + "': raising its dynamic shared memory limit to " +
                           std::to_string(sharedBytes) + " bytes (" + std::to_string(attributes_.staticSharedBytes) +
                           " static)";
                  });
    dynamicSharedLimit_->store(int(sharedBytes), std::memory_order_relaxed);
  }
  maybeInjectFault(FaultSite::Launch, name_);
  const auto streamHandle = stream ? static_cast<cu::Stream>(stream->handle()) : nullptr;
  auto describe = [&] {
    return "kernel '" + name_ + "', grid " + gridString(grid) + ", " + std::to_string(threads) + " threads, " +
           std::to_string(sharedBytes) + " bytes of dynamic shared memory";
  };
  if (programmaticLaunch && api.launchKernelEx) {
    cu::LaunchAttribute overlap{};
    overlap.id = cu::kLaunchAttributeProgrammaticStreamSerialization;
    const int allowed = 1;
    std::memcpy(overlap.value, &allowed, sizeof allowed);
    const cu::LaunchConfig config{grid[0], grid[1], grid[2], threads, 1, 1, sharedBytes, streamHandle, &overlap, 1};
    cu::checkLazy(api.launchKernelEx(&config, function, args, nullptr), "cuLaunchKernelEx",
                  [&] { return describe() + ", programmatic stream serialization"; });
    return;
  }
  cu::checkLazy(api.launchKernel(function, grid[0], grid[1], grid[2], threads, 1, 1, sharedBytes, streamHandle, args,
                                 nullptr),
                "cuLaunchKernel", describe);
}

}  // namespace flextile::runtime
