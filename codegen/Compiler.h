// Compiling one tile-IR kernel to PTX: the codegen pipeline's entry point.
// No LLVM types appear here; everything a caller needs is text and numbers.
//
// Kernel ABI: the PTX entry has the IR function's name and one parameter per
// IR function parameter, in order: pointers as 64-bit global addresses, i32
// as .s32, i64 as .s64, f32 as .f32 (f16/bf16 scalars are passed as f32).
// After them, one 128-byte tensor map per TMA recipe (CompiledKernel::tensorMaps, TensorMaps.h).
// The launch uses 32 * (num_warps + producer_warps) threads per block
// (CompiledKernel::threadsPerProgram) and `sharedBytes` of dynamic shared memory.
//
// Specialization: the IR function attribute "arg_divisibility" (one integer
// per parameter) states what the launcher promised: for a pointer, the byte
// alignment of its address; for an integer, a divisor of its value (1: none).
// The launcher sets it from the actual arguments (as Triton does with its
// divisible-by-16 specialization) so it is part of the kernel's identity.
#pragma once

#include <string>
#include <vector>

#include "codegen/Target.h"
#include "codegen/TensorMaps.h"
#include "ir/IR.h"

namespace flextile::codegen {

struct CompileOptions {
  Target target = Target::sm90a();
  // When set, ptxas assembles the PTX (a failure throws with a repro
  // command) and its -v report fills CompiledKernel::ptxasInfo.
  bool runPtxas = false;
  // When set, ptxas assembles the kernel if it is warp-specialized (producer warps), whatever
  // runPtxas says (OfflineAssembly::WarpSpecialized, codegen/Ptxas.h).
  bool runPtxasIfWarpSpecialized = false;
};

// A cubin the driver's JIT made of a kernel's PTX on one GPU, and what it is valid for:
// runtime::Device::codeIdentity() of that GPU (its name, compute capability and driver version).
struct DriverCubin {
  std::string identity;
  std::string image;
  bool operator==(const DriverCubin&) const = default;
};

struct CompiledKernel {
  std::string name;       // the PTX entry symbol
  std::string ir;         // the IR after every IR-level pass, with layouts
  std::string llvmIR;     // the LLVM module before the NVPTX backend
  std::string ptx;
  Target target;
  int numWarps = 4;       // the warps its layouts are for
  int producerWarps = 0;  // a warp-specialized kernel's producer warps, launched after them
  int threadsPerProgram() const { return 32 * (numWarps + producerWarps); }
  int sharedBytes = 0;    // dynamic shared memory per block
  std::vector<ir::Type> params;  // in launch order
  // The tensor maps the launcher encodes and passes after `params` (TensorMaps.h), in that order.
  std::vector<TensorMapRecipe> tensorMaps;
  std::string ptxasInfo;  // `ptxas -v` output when runPtxas
  std::string cubin;      // the ptxas output (an ELF) when runPtxas, else empty
  // The cubins the driver made of `ptx` on the GPUs that ran it, newest first (at most
  // kMaxDriverCubins): kept in the compile cache so a fresh process skips the JIT.
  std::vector<DriverCubin> driverCubins;
  // The image for a GPU of this codeIdentity, or nullptr.
  const DriverCubin* driverCubinFor(const std::string& identity) const;
  uint64_t irHash = 0;    // the structural hash it was compiled under (set by compileCached; 0 otherwise)
  double compileMs = 0;   // for a compile-cache hit: the time of the lookup
  bool fromCache = false; // read from the on-disk compile cache (codegen/CompileCache.h)
};

inline constexpr size_t kMaxDriverCubins = 4;
// `cubin` first, then the others of `kernel.driverCubins` except one of the same identity, at most
// kMaxDriverCubins in all.
void addDriverCubin(CompiledKernel& kernel, DriverCubin cubin);

// Runs the whole pipeline on a copy of `f`: IR passes, layout assignment,
// shared-memory planning, lowering to LLVM IR, the NVPTX backend.
// Honors FLEXTILE_DUMP (see ir/Dump.h). Throws flextile::Error on failure.
CompiledKernel compile(const ir::Function& f, const CompileOptions& options = {});

// Runs, in place, the tile-level passes compile() runs for `target` (codegen/Passes.h
// tilePassPipeline: canonicalize, cse, dce, assign-layouts, defer-accumulation, pipeline, bulk-reduce, wgmma), verifying after
// each: the IR compile() lowers, for a caller that interprets it (dsl::Kernel under
// FLEXTILE_INTERPRET_AFTER_PASSES) or prints it.
void runTilePasses(ir::Function& f, const Target& target);

}  // namespace flextile::codegen
