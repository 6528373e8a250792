#include "codegen/NVPTXTarget.h"

#include <llvm/ADT/SmallString.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/OptBisect.h>
#include <llvm/IR/PassTimingInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/PassInfo.h>
#include <llvm/PassRegistry.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Passes/StandardInstrumentations.h>
#include <llvm/Support/CodeGen.h>
#include <llvm/Support/CommandLine.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "ir/IR.h"

namespace flextile::codegen {

namespace {

void initializeLLVMOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    // FLEXTILE_LLVM_ARGS="-time-passes -some-llvm-option": LLVM's own command-line options, for
    // studying the backend (they are not part of the compile cache key: use FLEXTILE_CACHE=0).
    if (const char* args = std::getenv("FLEXTILE_LLVM_ARGS"); args && *args) {
      static std::vector<std::string> words{"flextile"};
      std::istringstream in(args);
      for (std::string w; in >> w;) words.push_back(w);
      static std::vector<const char*> argv;
      for (const std::string& w : words) argv.push_back(w.c_str());
      std::string problems;
      llvm::raw_string_ostream errs(problems);
      if (!llvm::cl::ParseCommandLineOptions(int(argv.size()), argv.data(), "FLEXTILE_LLVM_ARGS", &errs))
        throw Error("FLEXTILE_LLVM_ARGS='" + std::string(args) + "' is not a list of LLVM options: " + problems);
    }
  });
}

// Refuses the passes of skippedLLVMPasses(), and with keepBlockOrder the backend's block placement
// (see emitPTX). Legacy passes ask it through skipFunction(); the IR pipeline asks it through
// OptPassGateInstrumentation. Two stateless gates, one installed on each compile's own LLVMContext
// (never LLVM's global one), so threads may compile at once.
class SkipPassesGate final : public llvm::OptPassGate {
 public:
  explicit SkipPassesGate(bool keepBlockOrder) : keepBlockOrder_(keepBlockOrder) {}
  bool shouldRunPass(llvm::StringRef pass, llvm::StringRef) const override {
    if (keepBlockOrder_ && pass == "block-placement") return false;
    for (const std::string& skipped : skippedLLVMPasses())
      if (pass == skipped) return false;
    return true;
  }
  bool isEnabled() const override { return keepBlockOrder_ || !skippedLLVMPasses().empty(); }

 private:
  bool keepBlockOrder_;
};

void installPassGate(llvm::LLVMContext& context, bool keepBlockOrder = false) {
  static SkipPassesGate gate(false), keepingBlockOrder(true);
  SkipPassesGate& chosen = keepBlockOrder ? keepingBlockOrder : gate;
  if (chosen.isEnabled()) context.setOptPassGate(chosen);
}

// A misspelt name in FLEXTILE_LLVM_SKIP_PASSES would skip nothing and say nothing, so each name must
// be a pass LLVM knows: a legacy pass (the backend's; registered once the backend has been built) or
// a pass of the new pass manager at module, function or loop level.
void checkSkippedPassNames() {
  for (const std::string& name : skippedLLVMPasses()) {
    if (llvm::PassRegistry::getPassRegistry()->getPassInfo(name)) continue;
    llvm::PassBuilder pb;
    bool known = false;
    for (const std::string& form : {name, "function(" + name + ")", "function(loop(" + name + "))"}) {
      llvm::ModulePassManager mpm;
      if (llvm::Error e = pb.parsePassPipeline(mpm, form)) {
        llvm::consumeError(std::move(e));
      } else {
        known = true;
        break;
      }
    }
    if (!known)
      throw Error("FLEXTILE_LLVM_SKIP_PASSES names '" + name +
                  "', which is not an LLVM pass (FLEXTILE_LLVM_ARGS=-opt-bisect=-1 lists the passes a compile runs)");
  }
}

// The textual form of a pass pipeline, as `opt -print-pipeline-passes` prints it.
std::string pipelineText(llvm::ModulePassManager& mpm, llvm::PassInstrumentationCallbacks& callbacks) {
  std::string text;
  llvm::raw_string_ostream os(text);
  mpm.printPipeline(os, [&](llvm::StringRef className) {
    llvm::StringRef name = callbacks.getPassNameForClassName(className);
    return name.empty() ? className : name;
  });
  return text;
}

// O3 runs InstCombine eight times, each a full walk of the kernel (about 9 ms at 128x128). On
// FlexTile's kernels (long straight-line tile code in one or two loops) the first three, before the
// loop passes, do all the work, and the last, after loop unrolling, tidies the small loops O3
// unrolls; the four between them find nothing left to combine. Left out, they change no byte of the
// PTX of any yardstick variant, config, dtype, head dim or target, nor of the golden kernels
// (tests/lit/codegen/pipeline_lean.ftir).
std::string withoutLateInstCombines(std::string text) {
  constexpr int kept = 3;  // and the last
  int seen = 0;
  for (size_t at = text.find("instcombine"); at != std::string::npos; at = text.find("instcombine", at)) {
    size_t end = at + std::string_view("instcombine").size();
    if (at > 0 && text[at - 1] != ',' && text[at - 1] != '(') {  // aggressive-instcombine is another pass
      at = end;
      continue;
    }
    if (end < text.size() && text[end] == '<') end = text.find('>', end) + 1;
    if (++seen <= kept || text.find("instcombine", end) == std::string::npos) {
      at = end;
      continue;
    }
    // Drop the pass with one neighbouring comma, so the list stays well formed.
    if (end < text.size() && text[end] == ',') ++end;
    else if (at > 0 && text[at - 1] == ',') --at;
    text.erase(at, end - at);
  }
  return text;
}

}  // namespace

const std::vector<std::string>& skippedLLVMPasses() {
  static const std::vector<std::string> passes = [] {
    const char* v = std::getenv("FLEXTILE_LLVM_SKIP_PASSES");
    std::vector<std::string> out;
    std::istringstream in(v ? v : "slsr");
    for (std::string name; std::getline(in, name, ',');)
      if (!name.empty()) out.push_back(name);
    return out;
  }();
  return passes;
}

const std::string& llvmPipeline() {
  static const std::string pipeline = [] {
    const char* v = std::getenv("FLEXTILE_LLVM_PIPELINE");
    return std::string(v && *v ? v : "o3-lean");
  }();
  return pipeline;
}

NVPTXTarget::NVPTXTarget(const Target& target)
    : target_(target), cpu_(target.description().name), ptxVersion_(target.description().ptxVersion) {}

bool fpFusionEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FLEXTILE_FP_FUSION");
    return !(v && std::string_view(v) == "0");
  }();
  return enabled;
}

llvm::TargetMachine& NVPTXTarget::machine() const {
  initializeLLVMOnce();
  thread_local std::map<std::string, std::unique_ptr<llvm::TargetMachine>> machines;
  std::string key = cpu_ + features();
  auto& tm = machines[key];
  if (!tm) {
    std::string err;
    llvm::Triple tt(triple());
    const llvm::Target* t = llvm::TargetRegistry::lookupTarget(tt, err);
    if (!t) throw Error("codegen: LLVM has no NVPTX target: " + err, ErrorKind::Compile);
    llvm::TargetOptions options;
    // Multiplies and adds may fuse into fma, as Triton does by default (enable_fp_fusion): one
    // rounding instead of two, and the softmax's scale, log2(e) and running-max subtraction become
    // one fma per score. NVPTX otherwise writes mul.rn/add.rn, which forbid ptxas to fuse.
    options.AllowFPOpFusion = fpFusionEnabled() ? llvm::FPOpFusion::Fast : llvm::FPOpFusion::Standard;
    tm.reset(t->createTargetMachine(tt, cpu_, features(), options, std::nullopt, std::nullopt,
                                    llvm::CodeGenOptLevel::Aggressive));
    if (!tm) throw Error("codegen: LLVM could not create a TargetMachine for " + cpu_ + " " + features(), ErrorKind::Compile);
  }
  return *tm;
}

void NVPTXTarget::optimize(llvm::Module& module) const {
  llvm::TargetMachine& tm = machine();
  module.setTargetTriple(llvm::Triple(triple()));
  module.setDataLayout(tm.createDataLayout());
  installPassGate(module.getContext());

  llvm::LoopAnalysisManager lam;
  llvm::FunctionAnalysisManager fam;
  llvm::CGSCCAnalysisManager cgam;
  llvm::ModuleAnalysisManager mam;
  // With FLEXTILE_LLVM_ARGS=-time-passes, the O3 passes are timed too (emitPTX prints the report).
  llvm::PassInstrumentationCallbacks callbacks;
  std::optional<llvm::StandardInstrumentations> timing;
  if (llvm::TimePassesIsEnabled) {
    timing.emplace(module.getContext(), false);
    timing->registerCallbacks(callbacks, &mam);
  }
  llvm::OptPassGateInstrumentation gate(module.getContext());
  gate.registerCallbacks(callbacks);
  llvm::PassBuilder pb(&tm, llvm::PipelineTuningOptions(), std::nullopt, &callbacks);
  pb.registerModuleAnalyses(mam);
  pb.registerCGSCCAnalyses(cgam);
  pb.registerFunctionAnalyses(fam);
  pb.registerLoopAnalyses(lam);
  pb.crossRegisterProxies(lam, fam, cgam, mam);
  const std::string& choice = llvmPipeline();
  llvm::ModulePassManager mpm;
  if (choice == "default<O3>" || choice == "o3-lean")
    mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  if (choice != "default<O3>") {
    const std::string text = choice == "o3-lean" ? withoutLateInstCombines(pipelineText(mpm, callbacks)) : choice;
    mpm = llvm::ModulePassManager();
    if (llvm::Error e = pb.parsePassPipeline(mpm, text))
      throw Error("FLEXTILE_LLVM_PIPELINE='" + llvmPipeline() + "' is not an LLVM pass pipeline: " +
                  llvm::toString(std::move(e)));
  }
  mpm.run(module, mam);
}

std::string NVPTXTarget::emitPTX(llvm::Module& module, const EmitOptions& options) const {
  llvm::TargetMachine& tm = machine();
  if (module.getDataLayout() != tm.createDataLayout()) {
    module.setTargetTriple(llvm::Triple(triple()));
    module.setDataLayout(tm.createDataLayout());
  }
  installPassGate(module.getContext(), options.keepBlockOrder);
  llvm::SmallString<0> buffer;
  llvm::raw_svector_ostream os(buffer);
  llvm::legacy::PassManager pm;
  if (tm.addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
    throw Error("codegen: the NVPTX backend cannot emit assembly for " + cpu_, ErrorKind::Compile);
  pm.run(module);
  static std::once_flag namesChecked;
  std::call_once(namesChecked, checkSkippedPassNames);
  if (llvm::TimePassesIsEnabled) llvm::reportAndResetTimings(&llvm::errs());
  return std::string(buffer.str());
}

}  // namespace flextile::codegen
