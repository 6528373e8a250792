// The runtime layer's error type. runtime/ stands alone (it includes nothing from ir/),
// so it has its own exception rather than flextile::Error.
#pragma once

#include <stdexcept>
#include <string>

namespace flextile::runtime {

// Thrown for every failure in runtime/: a driver call that returned an error, a missing
// driver, or arguments the driver would reject (sizes, launch shapes).
//
// A failed driver call reads "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory);
// allocating 1073741824 bytes on device 0"; function() and result() give the parts.
class DriverError : public std::runtime_error {
 public:
  // An error that is not the result of one driver call (missing driver, bad arguments).
  explicit DriverError(const std::string& message) : std::runtime_error(message) {}

  // A driver call `function` (its exported symbol name) that returned `result`.
  DriverError(const std::string& function, int result, const std::string& context = "")
      : std::runtime_error(format(function, result, context)), function_(function), result_(result) {}

  // The symbol that failed ("" when the error is not a driver call's result).
  const std::string& function() const { return function_; }
  // The CUresult (0 when the error is not a driver call's result).
  int result() const { return result_; }

  static std::string format(const std::string& function, int result, const std::string& context);

 private:
  std::string function_;
  int result_ = 0;
};

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)": the driver's own name and description when a
// driver is loaded, else a built-in table of the common codes, else "CUDA_ERROR_<number>".
std::string describeResult(int result);

}  // namespace flextile::runtime
