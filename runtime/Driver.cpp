#include "runtime/Driver.h"

#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <type_traits>

namespace flextile::runtime {

namespace {

constexpr const char* kConsequence = ": FlexTile can trace, compile to PTX and interpret, but not launch";

// What loading one library as a driver produced.
struct LoadOutcome {
  std::unique_ptr<cu::Api> api;  // set when usable
  int version = 0;
  int deviceCount = 0;
  std::string whyNot;  // set when not usable
};

template <class Fn>
bool resolve(void* library, Fn& slot, std::initializer_list<const char*> symbols, std::string* missing) {
  for (const char* symbol : symbols) {
    if (void* address = dlsym(library, symbol)) {
      slot = reinterpret_cast<Fn>(address);
      return true;
    }
  }
  *missing = *symbols.begin();
  return false;
}

// Names the symbols to look for (preferred first) for every entry point of cu::Api.
bool resolveAll(void* library, cu::Api& api, std::string* missing) {
  return resolve(library, api.init, {"cuInit"}, missing) &&
         resolve(library, api.driverGetVersion, {"cuDriverGetVersion"}, missing) &&
         resolve(library, api.getErrorName, {"cuGetErrorName"}, missing) &&
         resolve(library, api.getErrorString, {"cuGetErrorString"}, missing) &&
         resolve(library, api.deviceGetCount, {"cuDeviceGetCount"}, missing) &&
         resolve(library, api.deviceGet, {"cuDeviceGet"}, missing) &&
         resolve(library, api.deviceGetName, {"cuDeviceGetName"}, missing) &&
         resolve(library, api.deviceGetAttribute, {"cuDeviceGetAttribute"}, missing) &&
         resolve(library, api.deviceTotalMem, {"cuDeviceTotalMem_v2"}, missing) &&
         resolve(library, api.devicePrimaryCtxRetain, {"cuDevicePrimaryCtxRetain"}, missing) &&
         resolve(library, api.ctxSetCurrent, {"cuCtxSetCurrent"}, missing) &&
         resolve(library, api.ctxSynchronize, {"cuCtxSynchronize"}, missing) &&
         resolve(library, api.memGetInfo, {"cuMemGetInfo_v2"}, missing) &&
         resolve(library, api.memAlloc, {"cuMemAlloc_v2"}, missing) &&
         resolve(library, api.memFree, {"cuMemFree_v2"}, missing) &&
         resolve(library, api.memcpyHtoD, {"cuMemcpyHtoD_v2"}, missing) &&
         resolve(library, api.memcpyDtoH, {"cuMemcpyDtoH_v2"}, missing) &&
         resolve(library, api.memcpyDtoD, {"cuMemcpyDtoD_v2"}, missing) &&
         resolve(library, api.memsetD8, {"cuMemsetD8_v2"}, missing) &&
         resolve(library, api.memcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, missing) &&
         resolve(library, api.memcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, missing) &&
         resolve(library, api.memsetD8Async, {"cuMemsetD8Async"}, missing) &&
         resolve(library, api.linkCreate, {"cuLinkCreate_v2"}, missing) &&
         resolve(library, api.linkAddData, {"cuLinkAddData_v2"}, missing) &&
         resolve(library, api.linkComplete, {"cuLinkComplete"}, missing) &&
         resolve(library, api.linkDestroy, {"cuLinkDestroy"}, missing) &&
         resolve(library, api.moduleLoadDataEx, {"cuModuleLoadDataEx"}, missing) &&
         resolve(library, api.moduleGetFunction, {"cuModuleGetFunction"}, missing) &&
         resolve(library, api.moduleUnload, {"cuModuleUnload"}, missing) &&
         resolve(library, api.funcGetAttribute, {"cuFuncGetAttribute"}, missing) &&
         resolve(library, api.funcSetAttribute, {"cuFuncSetAttribute"}, missing) &&
         resolve(library, api.launchKernel, {"cuLaunchKernel"}, missing) &&
         resolve(library, api.streamCreate, {"cuStreamCreate"}, missing) &&
         resolve(library, api.streamSynchronize, {"cuStreamSynchronize"}, missing) &&
         resolve(library, api.streamDestroy, {"cuStreamDestroy_v2"}, missing) &&
         resolve(library, api.eventCreate, {"cuEventCreate"}, missing) &&
         resolve(library, api.eventRecord, {"cuEventRecord"}, missing) &&
         resolve(library, api.eventSynchronize, {"cuEventSynchronize"}, missing) &&
         // CUDA 12.8 added cuEventElapsedTime_v2 (same signature) and cuda.h maps the name to it.
         resolve(library, api.eventElapsedTime, {"cuEventElapsedTime_v2", "cuEventElapsedTime"}, missing) &&
         resolve(library, api.eventDestroy, {"cuEventDestroy_v2"}, missing);
}

// The name and description of `result` as the library being loaded spells them.
std::string describeWith(const cu::Api& api, cu::Result result) {
  const char* name = nullptr;
  const char* description = nullptr;
  if (api.getErrorName(result, &name) == cu::kSuccess && name &&
      api.getErrorString(result, &description) == cu::kSuccess && description)
    return std::string(name) + " (" + description + ")";
  return describeResult(result);
}

std::string formatVersion(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// A library that ran cuInit is never closed, even when unusable: the driver may have started
// threads and registered exit handlers.
LoadOutcome load(const std::string& path) {
  LoadOutcome outcome;
  dlerror();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* detail = dlerror();
    std::string text = detail ? detail : "";
    if (text.empty() || text.find("No such file") != std::string::npos)
      outcome.whyNot = "no CUDA driver (" + path + " not found)" + kConsequence;
    else
      outcome.whyNot = "no CUDA driver (" + path + " could not be loaded: " + text + ")" + kConsequence;
    return outcome;
  }
  auto api = std::make_unique<cu::Api>();  // value-initialised: optional entry points start null
  std::string missing;
  if (!resolveAll(library, *api, &missing)) {
    dlclose(library);  // nothing was called: safe to unload
    outcome.whyNot = "no usable CUDA driver (" + path + " has no " + missing +
                     "; FlexTile needs the driver of CUDA 12 or newer)" + kConsequence;
    return outcome;
  }
  // Optional entry points: their users say what is missing (runtime/TensorMap.cpp).
  auto optional = [&](auto& entry, const char* name) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
  };
  optional(api->tensorMapEncodeTiled, "cuTensorMapEncodeTiled");
  optional(api->launchKernelEx, "cuLaunchKernelEx");
  optional(api->streamBeginCapture, "cuStreamBeginCapture_v2");
  optional(api->streamEndCapture, "cuStreamEndCapture");
  optional(api->graphInstantiate, "cuGraphInstantiateWithFlags");
  optional(api->graphLaunch, "cuGraphLaunch");
  optional(api->graphExecDestroy, "cuGraphExecDestroy");
  optional(api->graphDestroy, "cuGraphDestroy");
  if (cu::Result result = api->init(0); result != cu::kSuccess) {
    outcome.whyNot = "no usable CUDA driver (cuInit failed: " + describeWith(*api, result) + ")" + kConsequence;
    return outcome;
  }
  if (cu::Result result = api->driverGetVersion(&outcome.version); result != cu::kSuccess) {
    outcome.whyNot =
        "no usable CUDA driver (cuDriverGetVersion failed: " + describeWith(*api, result) + ")" + kConsequence;
    return outcome;
  }
  cu::Result result = api->deviceGetCount(&outcome.deviceCount);
  if (result != cu::kSuccess || outcome.deviceCount <= 0) {
    outcome.whyNot = "no CUDA device (driver " + formatVersion(outcome.version) +
                     (result != cu::kSuccess ? ": cuDeviceGetCount failed: " + describeWith(*api, result)
                                             : std::string(" reports none")) +
                     ")" + kConsequence;
    return outcome;
  }
  outcome.api = std::move(api);
  return outcome;
}

std::atomic<const cu::Api*> gLoadedApi{nullptr};

}  // namespace

// Builds the process-wide Driver once (a function-local static: thread-safe initialisation).
struct DriverLoader {
  Driver driver;
  std::unique_ptr<cu::Api> api;
  std::string whyNot;

  DriverLoader() {
    driver.libraryPath_ = Driver::libraryName();
    LoadOutcome outcome = load(driver.libraryPath_);
    if (!outcome.api) {
      whyNot = std::move(outcome.whyNot);
      return;
    }
    api = std::move(outcome.api);
    driver.api_ = api.get();
    driver.version_ = outcome.version;
    driver.deviceCount_ = outcome.deviceCount;
    gLoadedApi.store(api.get(), std::memory_order_release);
  }

  static const DriverLoader& instance() {
    // Never destroyed: device memory and modules may be released from other static
    // destructors, which must still find the entry points.
    static const DriverLoader* loader = new DriverLoader();
    return *loader;
  }
};

std::string Driver::libraryName() {
  const char* override = std::getenv("FLEXTILE_CUDA_LIBRARY");
  return override && *override ? override : "libcuda.so.1";
}

bool Driver::available(std::string* whyNot) {
  const DriverLoader& loader = DriverLoader::instance();
  if (whyNot) *whyNot = loader.whyNot;
  return loader.api != nullptr;
}

const Driver& Driver::get() {
  const DriverLoader& loader = DriverLoader::instance();
  if (!loader.api) throw DriverError(loader.whyNot);
  return loader.driver;
}

bool Driver::probe(const std::string& libraryPath, std::string* whyNot) {
  LoadOutcome outcome = load(libraryPath);
  if (whyNot) *whyNot = outcome.whyNot;
  // A usable library stays loaded (dlopen reference counts; the table itself is freed).
  return outcome.api != nullptr;
}

const cu::Api* Driver::loadedApi() { return gLoadedApi.load(std::memory_order_acquire); }

std::string Driver::versionString() const { return formatVersion(version_); }

namespace cu {

const Api& api() { return Driver::get().api(); }

void check(Result result, const char* function) {
  if (result != kSuccess) throw DriverError(function, result);
}

void check(Result result, const char* function, const std::string& context) {
  if (result != kSuccess) throw DriverError(function, result, context);
}

}  // namespace cu

}  // namespace flextile::runtime
