// The one owner of LLVM's NVPTX target: the TargetMachine for a target's CPU
// name and PTX version (both from its TargetDescription, codegen/Target.h),
// the O3 pipeline and PTX emission.
//
// Thread safety: LLVM is initialised once (std::call_once). Each thread owns
// its TargetMachine per target, created on first use, because LLVM does not
// promise that one TargetMachine may run two code generations at once; the
// autotuner compiles candidates on several threads.
#pragma once

#include <string>
#include <vector>

#include "codegen/Target.h"

namespace llvm {
class Module;
class TargetMachine;
}  // namespace llvm

namespace flextile::codegen {

// Whether float multiplies and adds may fuse into fma (LLVM's FPOpFusion::Fast, as Triton's
// enable_fp_fusion): on unless FLEXTILE_FP_FUSION=0, read once per process. Part of the compile
// cache's compiler identity, so the two settings never share cached kernels.
bool fpFusionEnabled();

// The LLVM passes left out of every compile, by the names LLVM's pass gate reports ("slsr"; run with
// FLEXTILE_LLVM_ARGS=-opt-bisect=-1 to list them). Default: straight-line strength reduction, which
// the NVPTX backend runs before instruction selection and which is quadratic in the address
// arithmetic of an unrolled tile (100 ms of a 300 ms compile), while ptxas reduces the same
// arithmetic itself. FLEXTILE_LLVM_SKIP_PASSES="a,b" replaces the list ("" skips nothing); read once
// per process and part of the compile cache's compiler identity.
const std::vector<std::string>& skippedLLVMPasses();

// The LLVM IR pipeline run before the backend: FLEXTILE_LLVM_PIPELINE, or "o3-lean" (LLVM's O3
// without four of its eight InstCombine runs, which change nothing in FlexTile's kernels but cost
// 35 ms of a 200 ms compile); "default<O3>" is LLVM's O3 as is, and anything else a pipeline in
// `opt -passes=` syntax. Read once per process and part of the compiler identity.
const std::string& llvmPipeline();

class NVPTXTarget {
 public:
  // Throws flextile::Error for a target that has no TargetDescription.
  explicit NVPTXTarget(const Target& target);

  const Target& target() const { return target_; }
  const std::string& cpu() const { return cpu_; }          // "sm_90a"
  int ptxVersion() const { return ptxVersion_; }           // 80 = PTX ISA 8.0
  std::string features() const { return "+ptx" + std::to_string(ptxVersion_); }
  static const char* triple() { return "nvptx64-nvidia-cuda"; }

  // Sets the module's triple and data layout, then runs LLVM's O3 pipeline.
  void optimize(llvm::Module& module) const;
  struct EmitOptions {
    // Leave the machine blocks in the order of the LLVM IR (no `block-placement`). For kernels
    // that issue wgmma from registers: when block placement rotates such a loop so that its header
    // is laid out after the latch and entered by a forward branch, ptxas (CUDA 13.0, offline and
    // the driver's JIT) treats the loop-invariant A registers of a wgmma in the header as dead
    // after the first iteration and reuses them (docs/performance.md, "wrong rows with wgmma").
    bool keepBlockOrder = false;
  };
  // The NVPTX backend: PTX text of the module.
  std::string emitPTX(llvm::Module& module, const EmitOptions& options) const;

 private:
  llvm::TargetMachine& machine() const;
  Target target_;
  std::string cpu_;
  int ptxVersion_;
};

}  // namespace flextile::codegen
