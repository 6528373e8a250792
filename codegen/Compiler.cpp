// The codegen pipeline, in order:
//   1. clone the function (the caller's IR is never changed)
//   2. IR passes (verified after each; FLEXTILE_DUMP=passes shows them):
//      canonicalize, cse, dce, assign-layouts, pipeline (num_stages)
//   3. shared-memory plan (SharedMemory.h) and access widths (AxisInfo.h)
//   4. lower to LLVM IR (LowerToLLVM.cpp)
//   5. LLVM O3 for nvptx64 (NVPTXTarget)
//   6. PTX emission (NVPTXTarget), optionally ptxas -v (Ptxas.h)
// FLEXTILE_DUMP stages: ir (after step 2), llvm (after step 5), ptx.
#include "codegen/Compiler.h"

#include <chrono>

#include "codegen/LowerToLLVM.h"
#include "codegen/NVPTXTarget.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "ir/Dump.h"
#include "ir/Pass.h"
#include "ir/Passes.h"
#include "ir/Printer.h"

namespace flextile::codegen {

CompiledKernel compile(const ir::Function& input, const CompileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Target& target = options.target;
  static_cast<void>(NVPTXTarget(target));  // rejects an unsupported target before any work
  std::unique_ptr<ir::Function> f = input.clone();

  ir::PassPipeline pipeline;
  pipeline.add(ir::canonicalizePass())
      .add(ir::csePass())
      .add(ir::dcePass())
      .add({"assign-layouts", [&](ir::Function& fn) { assignLayouts(fn, target); }})
      .add(pipelinePass());
  pipeline.run(*f);

  CompiledKernel k;
  k.name = f->name();
  k.target = target;
  k.numWarps = f->numWarps();
  k.ir = ir::printFunction(*f);
  ir::dump("ir", f->name(), k.ir);

  checkSharedMemoryFits(planSharedMemory(*f), *f, target);
  LoweringPlan plan = planLowering(*f);
  LoweredKernel lowered = lowerAndEmit(*f, target, plan);

  k.sharedBytes = int(plan.sharedBytes);
  for (const ir::Value* p : f->params()) k.params.push_back(p->type());
  k.llvmIR = std::move(lowered.llvmIR);
  k.ptx = std::move(lowered.ptx);
  ir::dump("llvm", f->name(), k.llvmIR);
  ir::dump("ptx", f->name(), k.ptx);
  if (options.runPtxas) k.ptxasInfo = runPtxas(k.ptx, target).log;
  k.compileMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return k;
}

}  // namespace flextile::codegen
