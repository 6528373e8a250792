// The codegen pipeline, in order:
//   1. clone the function (the caller's IR is never changed)
//   2. IR passes (verified after each; FLEXTILE_DUMP=passes shows them):
//      canonicalize, cse, dce, assign-layouts, defer-accumulation, pipeline (num_stages), bulk-reduce, wgmma
//   3. shared-memory plan (SharedMemory.h) and access widths (AxisInfo.h)
//   4. lower to LLVM IR (LowerToLLVM.cpp)
//   5. LLVM O3 for nvptx64 (NVPTXTarget)
//   6. PTX emission (NVPTXTarget), optionally ptxas -v (Ptxas.h)
// FLEXTILE_DUMP stages: ir (after step 2), llvm-lowered (after step 4), llvm (after step 5), ptx.
#include "codegen/Compiler.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include "codegen/LowerToLLVM.h"
#include "codegen/NVPTXTarget.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"
#include "ir/Dump.h"
#include "ir/Pass.h"
#include "ir/Passes.h"
#include "ir/Printer.h"

namespace flextile::codegen {

namespace {

// Wall time of the compile's steps, printed with FLEXTILE_TIMING=1.
class StepTimer {
 public:
  void step(std::string name) {
    auto now = std::chrono::steady_clock::now();
    steps_.emplace_back(std::move(name), std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  const std::vector<std::pair<std::string, double>>& steps() const { return steps_; }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, double>> steps_;
};

}  // namespace

bool passSwitch(const ir::Function& f, const char* env, const char* attr, bool byDefault) {
  const char* e = std::getenv(env);
  if (e && std::strcmp(e, "0") == 0) return false;
  if (e && std::strcmp(e, "1") == 0) return true;
  return f.intAttrOr(attr, byDefault ? 1 : 0) != 0;
}

ir::PassPipeline tilePassPipeline(const Target& target) {
  ir::PassPipeline pipeline;
  pipeline.add(ir::canonicalizePass())
      .add({"fold-scales", [](ir::Function& f) {
              if (passSwitch(f, "FLEXTILE_FOLD_SCALES", "reassociate"))
                ir::foldScales(f, passSwitch(f, "FLEXTILE_FOLD_INVARIANT_TERMS", "fold_invariant_terms"));
            }})
      .add({"regroup-sums", [](ir::Function& f) {
              if (passSwitch(f, "FLEXTILE_REGROUP_SUMS", "reassociate")) ir::regroupSums(f);
            }})
      // Again where invariant terms are folded: regroup-sums turns f32(start + arange) into
      // f32(start) + f32(arange), whose scaling fold-scales then splits into a scalar product and
      // a loop-invariant one.
      .add({"fold-scales", [](ir::Function& f) {
              if (passSwitch(f, "FLEXTILE_FOLD_SCALES", "reassociate") &&
                  passSwitch(f, "FLEXTILE_FOLD_INVARIANT_TERMS", "fold_invariant_terms"))
                ir::foldScales(f, true);
            }})
      .add(ir::csePass())
      .add(ir::dcePass())
      .add(hoistInvariantLoadsPass())
      .add(assignLayoutsPass(target))
      .add(deferAccumulationPass(target))
      .add(pipelinePass(target))
      .add(bulkReducePass(target))
      .add(wgmmaPass(target))
      .add(pingpongPass(target))
      .add(prefetchLoadsPass())
      .add(warpSpecializePass(target));
  return pipeline;
}

void runTilePasses(ir::Function& f, const Target& target) { tilePassPipeline(target).run(f); }

CompiledKernel compile(const ir::Function& input, const CompileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  StepTimer timer;
  const Target& target = options.target;
  NVPTXTarget nvptx(target);  // rejects an unsupported target before any work
  std::unique_ptr<ir::Function> f = input.clone();

  tilePassPipeline(target).run(*f);
  timer.step("IR passes (verified after each)");

  CompiledKernel k;
  k.name = f->name();
  k.target = target;
  k.numWarps = f->numWarps();
  k.producerWarps = producerWarps(*f);
  k.ir = ir::printFunction(*f);
  ir::dump("ir", f->name(), k.ir);
  timer.step("print IR");

  checkSharedMemoryFits(planSharedMemory(*f), *f, target);
  LoweringPlan plan = planLowering(*f);
  timer.step("shared-memory and access plan");

  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = lowerToLLVM(*f, target, plan, ctx);
  timer.step("lower to LLVM IR");
  if (ir::dumpEnabled("llvm-lowered")) {
    std::string lowered;
    llvm::raw_string_ostream os(lowered);
    module->print(os, nullptr);
    ir::dump("llvm-lowered", f->name(), lowered);
  }
  nvptx.optimize(*module);
  timer.step("LLVM O3");
  {
    llvm::raw_string_ostream os(k.llvmIR);
    module->print(os, nullptr);
  }
  timer.step("print LLVM IR");
  k.ptx = nvptx.emitPTX(*module, {.keepBlockOrder = hasWgmmaDots(*f, target)});
  timer.step("NVPTX backend (PTX)");

  k.sharedBytes = int(plan.sharedBytes);
  for (const ir::Value* p : f->params()) k.params.push_back(p->type());
  k.tensorMaps = tensorMapRecipes(*f);
  ir::dump("llvm", f->name(), k.llvmIR);
  ir::dump("ptx", f->name(), k.ptx);
  if (options.runPtxas || (options.runPtxasIfWarpSpecialized && k.producerWarps > 0)) {
    PtxasReport report = runPtxas(k.ptx, target);
    k.ptxasInfo = std::move(report.log);
    k.cubin = std::move(report.cubin);
    timer.step("ptxas");
  }
  k.compileMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ir::reportTimings("compile of @" + k.name + " for " + target.smName(), timer.steps());
  return k;
}

}  // namespace flextile::codegen
