// The GPU a kernel is compiled for. Owned by codegen; no LLVM types here so
// that every layer may name a target.
#pragma once

#include <string>

namespace flextile::codegen {

struct Target {
  int capability = 90;       // major * 10 + minor: 80, 86, 89, 90
  bool archSpecific = true;  // sm_90a rather than sm_90 (wgmma, setmaxnreg); only for capability 90

  static Target sm80() { return Target{80, false}; }
  static Target sm90a() { return Target{90, true}; }
  static Target fromCapability(int major, int minor) { return Target{major * 10 + minor, major == 9}; }

  // "sm_80", "sm_90a": the name ptxas and LLVM's NVPTX backend use.
  std::string smName() const {
    return "sm_" + std::to_string(capability) + (archSpecific && capability == 90 ? "a" : "");
  }
  // Shared memory one block may use after opting in (bytes).
  int maxSharedBytesPerBlock() const { return capability >= 90 ? 227 * 1024 : capability == 80 ? 163 * 1024 : 99 * 1024; }
  bool operator==(const Target&) const = default;
};

}  // namespace flextile::codegen
