// A module of kernels: PTX text JIT-compiled by the driver, or a ptxas cubin loaded as it is.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/Kernel.h"

namespace flextile::runtime {

class Device;

// PTX loaded with cuModuleLoadDataEx. Copies share one loaded module, which is unloaded when the
// last copy and the last Kernel taken from it are gone.
class Module {
 public:
  // JIT-compiles `ptx` for `device` (Device::current() when null). On failure throws DriverError
  // whose message carries the JIT error log ("ptxas application ptx input, line 12; error : ...").
  // `name` only labels messages (a kernel or file name).
  explicit Module(const std::string& ptx, const std::string& name = "module", Device* device = nullptr);

  // Loads `cubin` (a ptxas ELF image for this device's architecture) when it is not empty, so the
  // driver runs exactly the binary ptxas reported registers and spills for and no JIT runs; falls
  // back to JIT-compiling `ptx` when the driver refuses the image (another architecture, a ptxas
  // newer than the driver). `ptx` is always required: it names the entries and is the fallback.
  // With `keepJitImage`, a JIT (no cubin given, or the driver refused it) runs through the driver's
  // linker (cuLinkCreate/cuLinkAddData/cuLinkComplete), which compiles the same PTX the same way
  // and hands back the cubin it made: jitImage(). The compile cache keeps it so that the next
  // process loads it in milliseconds instead of paying the JIT again.
  static Module fromCompiled(const std::string& ptx, const std::string& cubin, const std::string& name = "module",
                             Device* device = nullptr, bool keepJitImage = false);
  // The PTX JIT-compiled through the driver's linker, its cubin kept (jitImage()).
  static Module jitKeepingImage(const std::string& ptx, const std::string& name = "module", Device* device = nullptr);
  // Whether the loaded code is the cubin (false: the driver JIT-compiled the PTX), and why a given
  // cubin was not used (empty when it was, or when none was given).
  bool loadedFromCubin() const;
  const std::string& cubinFallbackReason() const;
  // The cubin the driver's JIT made for this device (jitKeepingImage, or fromCompiled with
  // keepJitImage when it had to JIT), else empty.
  const std::string& jitImage() const;
  // Why the linker could not keep the image when fromCompiled was asked to (its DriverError's
  // message; the module was then JIT-compiled the plain way), else empty.
  const std::string& jitImageFailure() const;

  // The kernel `.entry name`; throws DriverError listing the module's entries when absent.
  Kernel function(const std::string& name) const;

  const std::string& name() const;
  // The JIT's info log (verbose: registers, spills, shared memory per kernel) and its wall time.
  const std::string& infoLog() const;
  double jitMilliseconds() const;
  // The `.entry` names found in the PTX text.
  const std::vector<std::string>& entryNames() const;

  struct State;  // shared with Kernel, which keeps the module loaded

 private:
  Module() = default;
  std::shared_ptr<State> state_;
};

// The names of the `.entry` functions in PTX text, in order.
std::vector<std::string> ptxEntryNames(const std::string& ptx);

}  // namespace flextile::runtime
