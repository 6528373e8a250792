// Loading the CUDA driver (libcuda.so.1) at run time.
//
// FlexTile links no CUDA library, so the same binary runs with or without the NVIDIA driver:
// without it, everything up to PTX works (tracing, compiling, interpreting) and anything that
// needs a GPU throws DriverError with one plain reason. The driver is loaded once per process,
// on first use, from any thread.
//
// FLEXTILE_CUDA_LIBRARY names another library to dlopen instead of "libcuda.so.1" (a path or
// a soname). Tests set it to a path that does not exist to take the no-driver path on a GPU
// machine; it also helps when a system has several drivers.
#pragma once

#include <string>

namespace flextile::runtime {

namespace cu {
struct Api;
}

class Driver {
 public:
  // True when the driver loaded, cuInit succeeded and at least one device exists. Otherwise
  // false, with a one-line reason in *whyNot such as "no CUDA driver (libcuda.so.1 not found):
  // FlexTile can trace, compile to PTX and interpret, but not launch".
  static bool available(std::string* whyNot = nullptr);

  // The loaded driver; throws DriverError carrying the reason when it is not available.
  static const Driver& get();

  // The library that is (or would be) loaded: $FLEXTILE_CUDA_LIBRARY or "libcuda.so.1".
  static std::string libraryName();

  // Loads `libraryPath` as a driver and checks it the way get() does, without touching the
  // process-wide driver: for diagnostics and tests of the failure paths. A library that was
  // called into (cuInit) stays loaded; one that was only inspected is closed again.
  static bool probe(const std::string& libraryPath, std::string* whyNot);

  // The entry points, once the process-wide driver has loaded successfully; nullptr before
  // that or when loading failed. Never starts loading (error formatting uses it).
  static const cu::Api* loadedApi();

  int version() const { return version_; }  // cuDriverGetVersion: 12040 for CUDA 12.4
  std::string versionString() const;        // "12.4"
  int deviceCount() const { return deviceCount_; }
  const std::string& libraryPath() const { return libraryPath_; }
  const cu::Api& api() const { return *api_; }

 private:
  Driver() = default;
  friend struct DriverLoader;

  const cu::Api* api_ = nullptr;
  int version_ = 0;
  int deviceCount_ = 0;
  std::string libraryPath_;
};

}  // namespace flextile::runtime
