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

// Parses the -v output (exposed for tests).
PtxasReport parsePtxasLog(const std::string& log);

}  // namespace flextile::codegen
