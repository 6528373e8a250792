#include "runtime/DriverError.h"

#include "runtime/Driver.h"
#include "runtime/DriverApi.h"

#include <string_view>

namespace flextile::runtime {
namespace {

struct KnownResult {
  int code;
  std::string_view name;
  std::string_view description;
};

// Used when no driver is loaded (so cuGetErrorName is not callable) or the driver does not
// know the code. The names are the CUresult enumerators; the descriptions are our own words.
constexpr KnownResult kKnownResults[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of device memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "driver not initialized"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "the stub libcuda was loaded instead of the real driver"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "device busy or unavailable"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "invalid kernel image"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid context"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image for this device"},
    {218, "CUDA_ERROR_INVALID_PTX", "PTX JIT compilation failed"},
    {221, "CUDA_ERROR_JIT_COMPILER_NOT_FOUND", "PTX JIT compiler library not found"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "PTX version not supported by this driver"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "operating system call failed"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "work not yet complete"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "kernel accessed an illegal address"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "kernel timed out"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "illegal instruction"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "driver and kernel module versions differ"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

}  // namespace

std::string describeResult(int result) {
  if (const cu::Api* api = Driver::loadedApi()) {
    const char* name = nullptr;
    const char* description = nullptr;
    if (api->getErrorName(result, &name) == cu::kSuccess && name &&
        api->getErrorString(result, &description) == cu::kSuccess && description)
      return std::string(name) + " (" + description + ")";
  }
  for (const KnownResult& known : kKnownResults)
    if (known.code == result) return std::string(known.name) + " (" + std::string(known.description) + ")";
  return "CUDA_ERROR_" + std::to_string(result) + " (unknown CUresult)";
}

std::string DriverError::format(const std::string& function, int result, const std::string& context) {
  std::string message = function + " failed: " + describeResult(result);
  if (!context.empty()) message += "; " + context;
  return message;
}

}  // namespace flextile::runtime
