// Assembling PTX with NVIDIA's ptxas: the check that generated PTX is valid
// for a GPU, and the source of register, spill and shared-memory counts.
#pragma once

#include <optional>
#include <string>

#include "codegen/Target.h"

namespace flextile::codegen {

// What `ptxas -v` reports for the (one) kernel of a module.
struct PtxasReport {
  int registers = 0;        // per thread
  int spillStoreBytes = 0;
  int spillLoadBytes = 0;
  int stackBytes = 0;       // stack frame
  int staticSharedBytes = 0;  // .shared the PTX declares (dynamic shared memory is not counted)
  std::string log;          // the full -v output
  std::string cubin;        // the assembled module (an ELF image)
};

// The ptxas executable: on PATH, else /usr/local/cuda/bin/ptxas; nullopt if neither.
std::optional<std::string> findPtxas();

// Assembles `ptx` for the target in a fresh temporary directory with
// `ptxas -arch=<sm> -v`. Throws flextile::Error when ptxas is missing (saying
// so), or when it fails: the message holds ptxas's output and a command line
// that repeats the failure on a saved copy of the PTX.
PtxasReport runPtxas(const std::string& ptx, const Target& target);

// Which kernels the offline ptxas assembles for a launch (the launch then loads its cubin instead
// of letting the driver JIT-compile the PTX). The driver's JIT and ptxas of the same CUDA release
// allocate registers differently for a warp-specialized kernel: on the H200 (driver 580, CUDA 13.0,
// 2026-12-03) the JIT spilled the consumers of the warp-specialized dkdv (572 bytes a thread) where
// ptxas spilled 24, and the backward ran at 229 TFLOP/s against 462 (docs/performance.md).
enum class OfflineAssembly {
  Never,            // the driver JIT-compiles every kernel
  WarpSpecialized,  // ptxas assembles the kernels with a producer warpgroup; the JIT the rest
  Always,           // ptxas assembles every kernel
};
// FLEXTILE_PTXAS: "0" (or "off") Never, "1" (or "all") Always, unset or "auto" WarpSpecialized;
// Never whatever it says when no ptxas is found. Read once per process; another value is reported
// on stderr once and read as "auto".
OfflineAssembly offlineAssembly();
// The policy for a FLEXTILE_PTXAS value (nullptr: unset) when ptxas is found or not (for tests);
// `unknown` is set for a value it does not know.
OfflineAssembly offlineAssemblyFor(const char* value, bool ptxasFound, bool* unknown = nullptr);

// Parses the -v output (exposed for tests).
PtxasReport parsePtxasLog(const std::string& log);

}  // namespace flextile::codegen
