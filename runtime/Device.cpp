#include "runtime/Device.h"

#include "runtime/Driver.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

namespace flextile::runtime {

namespace {

std::string formatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

int parseDeviceOrdinal(const char* text, int count) {
  char* end = nullptr;
  long ordinal = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || ordinal < 0 || ordinal >= count)
    throw DriverError("FLEXTILE_DEVICE='" + std::string(text) + "' is not a device ordinal: the driver reports " +
                      std::to_string(count) + (count == 1 ? " device (ordinal 0)" : " devices (ordinals 0 to " +
                                               std::to_string(count - 1) + ")"));
  return static_cast<int>(ordinal);
}

}  // namespace

Device::Device(int ordinal) : ordinal_(ordinal) {
  const cu::Api& api = cu::api();
  std::string where = "device " + std::to_string(ordinal);
  cu::check(api.deviceGet(&handle_, ordinal), "cuDeviceGet", where);
  char name[256] = {};
  cu::check(api.deviceGetName(name, sizeof name - 1, handle_), "cuDeviceGetName", where);
  name_ = name;

  auto attribute = [&](cu::DeviceAttribute which, const char* what) {
    int value = 0;
    cu::check(api.deviceGetAttribute(&value, which, handle_), "cuDeviceGetAttribute", where + ", " + what);
    return value;
  };
  capabilityMajor_ = attribute(cu::kAttrComputeCapabilityMajor, "compute capability major");
  capabilityMinor_ = attribute(cu::kAttrComputeCapabilityMinor, "compute capability minor");
  multiprocessorCount_ = attribute(cu::kAttrMultiprocessorCount, "multiprocessor count");
  maxThreadsPerBlock_ = attribute(cu::kAttrMaxThreadsPerBlock, "max threads per block");
  maxGrid_ = {attribute(cu::kAttrMaxGridDimX, "max grid x"), attribute(cu::kAttrMaxGridDimY, "max grid y"),
              attribute(cu::kAttrMaxGridDimZ, "max grid z")};
  warpSize_ = attribute(cu::kAttrWarpSize, "warp size");
  maxSharedBytesPerBlock_ = attribute(cu::kAttrMaxSharedMemoryPerBlock, "max shared memory per block");
  maxSharedBytesPerBlockOptin_ =
      attribute(cu::kAttrMaxSharedMemoryPerBlockOptin, "max shared memory per block (opt-in)");
  maxSharedBytesPerMultiprocessor_ =
      attribute(cu::kAttrMaxSharedMemoryPerMultiprocessor, "max shared memory per multiprocessor");
  l2CacheBytes_ = attribute(cu::kAttrL2CacheSize, "L2 cache size");
  clockRateKHz_ = attribute(cu::kAttrClockRate, "clock rate");
  memoryClockRateKHz_ = attribute(cu::kAttrMemoryClockRate, "memory clock rate");
  memoryBusWidthBits_ = attribute(cu::kAttrGlobalMemoryBusWidth, "memory bus width");
  cu::check(api.deviceTotalMem(&totalMemoryBytes_, handle_), "cuDeviceTotalMem_v2", where);
  driverVersion_ = Driver::get().version();

  // The primary context is the one the CUDA runtime (and so PyTorch) uses too: sharing it lets
  // device pointers pass between FlexTile and those libraries. It is retained for the life of
  // the process and never released, so no static destructor can outlive it.
  cu::Context context = nullptr;
  cu::check(api.devicePrimaryCtxRetain(&context, handle_), "cuDevicePrimaryCtxRetain", where);
  context_ = context;
  makeCurrent();
}

Device& Device::get(int ordinal) {
  // Devices live for the whole process (objects elsewhere hold references to them).
  static std::mutex mutex;
  static auto* devices = new std::vector<std::unique_ptr<Device>>();
  int total = count();
  if (ordinal < 0 || ordinal >= total)
    throw DriverError("no CUDA device " + std::to_string(ordinal) + ": the driver reports " + std::to_string(total) +
                      " device(s)");
  std::lock_guard lock(mutex);
  if (devices->empty()) devices->resize(total);
  auto& slot = (*devices)[ordinal];
  if (!slot) slot.reset(new Device(ordinal));
  return *slot;
}

Device& Device::current() {
  static Device* chosen = [] {
    const char* fromEnvironment = std::getenv("FLEXTILE_DEVICE");
    int ordinal = fromEnvironment && *fromEnvironment ? parseDeviceOrdinal(fromEnvironment, count()) : 0;
    return &get(ordinal);
  }();
  chosen->makeCurrent();
  return *chosen;
}

int Device::count() { return Driver::get().deviceCount(); }

std::string Device::codeIdentity() const {
  return name_ + " sm_" + std::to_string(capability()) + "; driver " + std::to_string(driverVersion_);
}

void Device::makeCurrent() {
  // cuCtxSetCurrent only stores a thread-local pointer in the driver; calling it every time
  // is cheaper than tracking whether some other library switched contexts since.
  // (The context of an error is formed only for one: every launch comes here.)
  cu::checkLazy(cu::api().ctxSetCurrent(static_cast<cu::Context>(context_)), "cuCtxSetCurrent",
                [&] { return "device " + std::to_string(ordinal_); });
}

std::array<size_t, 2> Device::memoryInfo() {
  makeCurrent();
  size_t freeBytes = 0, totalBytes = 0;
  cu::check(cu::api().memGetInfo(&freeBytes, &totalBytes), "cuMemGetInfo_v2", "device " + std::to_string(ordinal_));
  return {freeBytes, totalBytes};
}

void Device::synchronize() {
  makeCurrent();
  cu::check(cu::api().ctxSynchronize(), "cuCtxSynchronize",
            "waiting for device " + std::to_string(ordinal_) + " (an earlier kernel launch or copy failed)");
}

std::string Device::describe() const {
  return "device " + std::to_string(ordinal_) + ": " + name_ + " (sm_" + std::to_string(capability()) + ", " +
         std::to_string(multiprocessorCount_) + " SMs, " + formatBytes(double(totalMemoryBytes_)) + ", L2 " +
         formatBytes(double(l2CacheBytes_)) + ", smem/block " + formatBytes(double(maxSharedBytesPerBlockOptin_)) +
         ", " + std::to_string(clockRateKHz_ / 1000) + " MHz, driver " + std::to_string(driverVersion_ / 1000) + "." +
         std::to_string(driverVersion_ % 1000 / 10) + ")";
}

void synchronize() { Device::current().synchronize(); }

}  // namespace flextile::runtime
