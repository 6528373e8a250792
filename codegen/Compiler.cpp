// The codegen pipeline, in order:
//   1. clone the function (the caller's IR is never changed)
//   2. layouts: every tile value must carry one
//   3. shared-memory plan: scratch offsets for convert_layout, cross-warp
//      reduce and dot (LowerToLLVM.h: scratchBytes)
//   4. lower to LLVM IR (LowerToLLVM.cpp)
//   5. LLVM O3 for nvptx64 (NVPTXTarget)
//   6. PTX emission (NVPTXTarget), optionally ptxas -v (Ptxas.h)
#include "codegen/Compiler.h"

#include <chrono>

#include "codegen/LowerToLLVM.h"
#include "codegen/NVPTXTarget.h"
#include "codegen/Ptxas.h"

namespace flextile::codegen {

namespace {

void requireLayouts(const ir::Function& f) {
  auto check = [&](const ir::Value* v, const std::string& where) {
    if (v->type().isTile() && !v->type().hasLayout())
      throw Error("compile '" + f.name() + "': " + where + " (tile " + v->type().str() +
                  ") has no layout; layouts must be assigned before lowering");
  };
  f.walk([&](const ir::Op& op) {
    for (const ir::Value* r : op.results()) check(r, "the result of " + op.describe());
    for (const auto& region : op.regions())
      for (const ir::Value* a : region->args()) check(a, "a block argument of " + op.describe());
  });
}

}  // namespace

CompiledKernel compile(const ir::Function& input, const CompileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const Target& target = options.target;
  static_cast<void>(NVPTXTarget(target));  // rejects an unsupported target before any work
  std::unique_ptr<ir::Function> f = input.clone();

  requireLayouts(*f);

  LoweringPlan plan = overlappingScratchPlan(*f);
  if (plan.sharedBytes > target.maxSharedBytesPerBlock())
    throw Error("compile '" + f->name() + "': needs " + std::to_string(plan.sharedBytes) +
                " bytes of shared memory per block; " + target.smName() + " allows " +
                std::to_string(target.maxSharedBytesPerBlock()));

  LoweredKernel lowered = lowerAndEmit(*f, target, plan);

  CompiledKernel k;
  k.name = f->name();
  k.target = target;
  k.numWarps = f->numWarps();
  k.sharedBytes = int(plan.sharedBytes);
  for (const ir::Value* p : f->params()) k.params.push_back(p->type());
  k.llvmIR = std::move(lowered.llvmIR);
  k.ptx = std::move(lowered.ptx);
  if (options.runPtxas) k.ptxasInfo = runPtxas(k.ptx, target).log;
  k.compileMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return k;
}

}  // namespace flextile::codegen
