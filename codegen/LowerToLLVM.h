// Lowering of layout-carrying tile IR to LLVM IR for the NVPTX backend.
//
// Input: a verified function in which every tile value carries a layout (see
// ir/Layout.h and the rules AssignLayouts establishes). Output: an LLVM module
// (triple nvptx64-nvidia-cuda) with one `ptx_kernel` function whose parameters
// follow the kernel ABI of codegen/Compiler.h.
//
// Representation. A tile value becomes one LLVM value per register of its
// layout; register r of thread (lane, warp) holds the element at
// Layout::apply(r, lane, warp). A scalar becomes one LLVM value, the same in
// every thread of the program. lane = tid % 32, warp = tid / 32.
//
// Only codegen/*.cpp see LLVM: this header names LLVM classes by forward
// declaration alone, and no header outside codegen/ includes it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <string>

#include "codegen/Target.h"
#include "ir/IR.h"

namespace llvm {
class LLVMContext;
class Module;
}  // namespace llvm

namespace flextile::codegen {

// What the lowering needs beyond the IR: where each op's shared-memory
// scratch lives and how wide each global access may be.
struct LoweringPlan {
  // Byte offset into the kernel's dynamic shared memory of the scratch of
  // each op that needs one (convert_layout, reduce across warps, dot), laid
  // out as codegen/SharedMemory.h documents.
  std::map<const ir::Op*, int64_t> scratchOffset;
  // Dynamic shared memory per block (bytes): at least every offset plus its
  // op's scratchBytes() (SharedMemory.h).
  int64_t sharedBytes = 0;
  // Elements per global access of each load/store along the layout's fastest
  // contiguous dimension (1 when absent). The lowering lowers it further when
  // the layout holds fewer contiguous registers.
  std::map<const ir::Op*, int> vectorWidth;
};

// The plan for a function that carries layouts: scratch offsets from
// planSharedMemory (codegen/SharedMemory.h, whose formulas and barrier rule
// the lowering follows) and access widths from the axis analysis
// (codegen/AxisInfo.h: memoryAccessWidth).
LoweringPlan planLowering(const ir::Function& f);

// How a warp-specialized program (codegen/passes/WarpSpecialize.cpp) shares the register file:
// ptxas caps every thread at `launch`, then setmaxnreg moves the producer to `producer` and the
// consumers to `consumer`. All zero when the launch cap is 256 or more (nothing to move).
// `producerRegisters`: what the producer keeps (24 by default; a multiple of 8 below the launch
// cap, else an Error naming the value): a producer with more scalar state than 24 registers hold
// (the peeled skewed walks' three loops) spills there, and every 8 more it keeps cost the
// consumers 8 (two consumer warpgroups).
struct RegisterSplit {
  int launch = 0, producer = 0, consumer = 0;
};
RegisterSplit registerSplit(int consumerWarps, int producerWarps, int64_t programsPerSm, int producerRegisters = 24);
// The producer's registers for `f`: FLEXTILE_PRODUCER_REGISTERS, else the function attribute
// producer_registers, else 24.
int producerRegisters(const ir::Function& f);

// Lowering, LLVM O3 and PTX emission of a function that already carries
// layouts, under a given plan: compile() without the IR passes, for tests
// and tools that want to pin the plan (e.g. vector widths).
struct LoweredKernel {
  std::string llvmIR;  // after O3, as the NVPTX backend sees it
  std::string ptx;
};
LoweredKernel lowerAndEmit(const ir::Function& f, const Target& target, const LoweringPlan& plan);

// Which row reductions combine a thread's registers as a pairwise tree (LowerReduce.cpp), from
// FLEXTILE_REDUCE_TREE: "sum" (sums only: the default, also for an unset, empty or unknown value),
// "1" (every kind), "max" (max and min only) or "0" (none). The compile cache's identity reads it too.
std::string reduceTreeSetting();

// Lowers `f` into a new module of `ctx`. Throws flextile::Error naming the op
// when the IR breaks a layout rule or uses something the lowering lacks.
std::unique_ptr<llvm::Module> lowerToLLVM(const ir::Function& f, const Target& target, const LoweringPlan& plan,
                                          llvm::LLVMContext& ctx);

}  // namespace flextile::codegen
