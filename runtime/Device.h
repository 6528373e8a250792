// A CUDA device, its properties and its primary context.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace flextile::runtime {

// Properties are read once, when the device is first used. Every runtime object that talks
// to the driver belongs to one Device and makes its primary context current on the calling
// thread first, so any thread may use any object.
class Device {
 public:
  // Device 0, or the ordinal in $FLEXTILE_DEVICE. Throws DriverError without a driver.
  static Device& current();
  // Throws DriverError for an ordinal the driver does not have.
  static Device& get(int ordinal);
  static int count();

  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int ordinal() const { return ordinal_; }
  const std::string& name() const { return name_; }
  int capabilityMajor() const { return capabilityMajor_; }
  int capabilityMinor() const { return capabilityMinor_; }
  int capability() const { return capabilityMajor_ * 10 + capabilityMinor_; }  // 90 for sm_90
  int multiprocessorCount() const { return multiprocessorCount_; }
  int maxThreadsPerBlock() const { return maxThreadsPerBlock_; }
  std::array<int, 3> maxGrid() const { return maxGrid_; }
  int warpSize() const { return warpSize_; }
  // Shared memory a block gets without opting in (48 KiB), and the most it may opt in to.
  size_t maxSharedBytesPerBlock() const { return maxSharedBytesPerBlock_; }
  size_t maxSharedBytesPerBlockOptin() const { return maxSharedBytesPerBlockOptin_; }
  size_t maxSharedBytesPerMultiprocessor() const { return maxSharedBytesPerMultiprocessor_; }
  size_t l2CacheBytes() const { return l2CacheBytes_; }
  size_t totalMemoryBytes() const { return totalMemoryBytes_; }
  int clockRateKHz() const { return clockRateKHz_; }
  int memoryClockRateKHz() const { return memoryClockRateKHz_; }
  int memoryBusWidthBits() const { return memoryBusWidthBits_; }
  int driverVersion() const { return driverVersion_; }
  // What the machine code the driver's JIT makes depends on: "NVIDIA H200 sm_90; driver 13000".
  // A cubin the JIT made is reused only where this is the same (the compile cache's key for it).
  std::string codeIdentity() const;

  // Free and total device memory now (cuMemGetInfo).
  std::array<size_t, 2> memoryInfo();

  // "device 0: NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB, L2 60.0 MiB, smem/block 227 KiB, driver 13.0)"
  std::string describe() const;

  // Makes the primary context current on this thread (cheap; called before every driver call).
  void makeCurrent();
  // Waits for all work on this device and reports any error a kernel left behind.
  void synchronize();

  void* context() const { return context_; }  // the CUcontext

 private:
  explicit Device(int ordinal);

  int ordinal_ = 0;
  int handle_ = 0;  // CUdevice
  void* context_ = nullptr;
  std::string name_;
  int capabilityMajor_ = 0, capabilityMinor_ = 0;
  int multiprocessorCount_ = 0;
  int maxThreadsPerBlock_ = 0;
  std::array<int, 3> maxGrid_{};
  int warpSize_ = 0;
  size_t maxSharedBytesPerBlock_ = 0, maxSharedBytesPerBlockOptin_ = 0, maxSharedBytesPerMultiprocessor_ = 0;
  size_t l2CacheBytes_ = 0, totalMemoryBytes_ = 0;
  int clockRateKHz_ = 0, memoryClockRateKHz_ = 0, memoryBusWidthBits_ = 0;
  int driverVersion_ = 0;
};

// Device::current().synchronize(): waits for the GPU and throws DriverError naming the error
// that an earlier launch left (an illegal address, say), so callers see it where they wait.
void synchronize();

}  // namespace flextile::runtime
