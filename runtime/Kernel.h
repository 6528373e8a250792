// One kernel of a loaded module, and its launch.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>

namespace flextile::runtime {

class Device;
class Stream;

// What the compiled kernel uses (cuFuncGetAttribute), fixed once it is loaded.
struct KernelAttributes {
  int registersPerThread = 0;
  int localBytesPerThread = 0;  // local memory: register spills and stack
  int staticSharedBytes = 0;    // `.shared` arrays declared in the PTX
  int constBytes = 0;
  int maxThreadsPerBlock = 0;  // after registers: may be below the device's 1024
  int ptxVersion = 0;          // 80 for PTX ISA 8.0
  int binaryVersion = 0;       // the SASS target: 90 for sm_90
};

// The limits a launch is checked against before it reaches the driver.
struct LaunchLimits {
  std::string deviceName;
  std::array<unsigned, 3> maxGrid{2147483647u, 65535u, 65535u};
  unsigned maxThreadsPerBlock = 1024;  // the kernel's own (registers included)
  int registersPerThread = 0;          // only to explain a thread limit below the device's
  size_t staticSharedBytes = 0;
  size_t maxSharedBytesPerBlockOptin = 48 * 1024;
};

// Throws DriverError, naming the kernel and the numbers, unless a launch of `grid` blocks of
// `threads` threads with `dynamicSharedBytes` of dynamic shared memory fits `limits`.
void validateLaunch(const std::string& kernelName, const LaunchLimits& limits, std::array<unsigned, 3> grid,
                    unsigned threads, size_t dynamicSharedBytes);

// A handle to one `.entry` of a Module (cheap to copy; keeps the module loaded).
class Kernel {
 public:
  const std::string& name() const { return name_; }
  const KernelAttributes& attributes() const { return attributes_; }
  const LaunchLimits& limits() const { return limits_; }

  // Queues a launch of grid[0] x grid[1] x grid[2] blocks of `threads` threads (one dimension)
  // with `sharedBytes` of dynamic shared memory, on `stream` (the legacy default stream when null).
  // `args` points to one pointer per kernel parameter, each to the argument's value (the
  // cuLaunchKernel convention). Raises the kernel's dynamic shared memory limit when it needs
  // more than the default 48 KiB and refuses, with the need and the limit in the message, what
  // the device cannot give. Errors inside the kernel surface at the next synchronizing call.
  // `programmaticLaunch`: the kernel waits for its prior grids itself (griddepcontrol.wait, before
  // its first global access), so it is launched with programmatic stream serialization and may
  // start while the stream's previous kernel finishes; a driver without cuLaunchKernelEx launches
  // it the ordinary way (then the wait returns at once).
  void launch(std::array<unsigned, 3> grid, unsigned threads, unsigned sharedBytes, void** args,
              Stream* stream = nullptr, bool programmaticLaunch = false) const;

  void* handle() const { return function_; }  // the CUfunction
  Device* device() const { return device_; }

 private:
  friend class Module;
  Kernel() = default;
  LaunchLimits computeLimits() const;

  std::shared_ptr<const void> module_;  // keeps the module loaded
  void* function_ = nullptr;
  Device* device_ = nullptr;
  std::string name_;
  KernelAttributes attributes_;
  LaunchLimits limits_;
  // The dynamic shared memory the driver currently allows this function, shared by copies.
  std::shared_ptr<std::atomic<int>> dynamicSharedLimit_;
};

}  // namespace flextile::runtime
