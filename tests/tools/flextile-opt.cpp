// flextile-opt: reads tile IR text, verifies it, runs passes, prints the result
// (the IR, or the LLVM IR or PTX that codegen makes of it).
//
//   flextile-opt [--passes=canonicalize,cse,dce,assign-layouts] [--print-locations] [--verify-only]
//                [--split-input-file] [--dump=STAGES] [--emit=ir|llvm|ptx] [--sm=80|90a] [--ptxas] FILE|-
//
// Exit status 1 with the error on stderr when the input does not parse or
// verify, or a pass fails. With --split-input-file, the input is cut at lines
// "// -----" and each piece is handled on its own (errors keep the line
// numbers of the whole file; the exit status is 1 if any piece failed), so one
// lit test can hold many small cases. The lit tests under tests/lit drive it.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/Compiler.h"
#include "codegen/Passes.h"
#include "codegen/Target.h"
#include "ir/Dump.h"
#include "ir/Parser.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "ir/passes/ReverseMode.h"

namespace {

using namespace flextile;

void usage() {
  std::fputs(
      "usage: flextile-opt [options] FILE|-\n"
      "  --passes=a,b,...     run these passes in order: canonicalize, cse, dce (ir/Passes.h),\n"
      "                       assign-layouts, defer-accumulation, pipeline, bulk-reduce, wgmma, pingpong (codegen/Passes.h, for the --sm target),\n"
      "                       reverse-mode (test-only, ir/passes/ReverseMode.h)\n"
      "  --print-locations    print loc(\"file\":line) after each op\n"
      "  --verify-only        parse and verify, print nothing\n"
      "  --split-input-file   handle each piece between '// -----' lines separately\n"
      "  --dump=STAGES        as FLEXTILE_DUMP (ir, passes, llvm, ptx, all)\n"
      "  --emit=ir|llvm|ptx   what to print (default ir): the IR after --passes, or each function\n"
      "                       compiled by codegen::compile (its own canonicalize, cse, dce,\n"
      "                       assign-layouts, lowering, NVPTX backend) after --passes\n"
      "  --sm=80|90a          target GPU (default 90a; also 75, 86, 89, 90, sm_XX)\n"
      "  --ptxas              also compile each function and assemble its PTX with ptxas;\n"
      "                       the `ptxas -v` report goes to stderr\n"
      ,
      stderr);
}

std::vector<std::string> splitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// The pass of this name. Target-independent passes come from ir/Passes.h,
// layout assignment from codegen/Passes.h.
std::optional<ir::Pass> lookupPass(const std::string& name, const codegen::Target& target) {
  if (auto p = ir::targetIndependentPass(name)) return p;
  if (name == "assign-layouts") return codegen::assignLayoutsPass(target);
  if (name == "hoist-invariant-loads") return codegen::hoistInvariantLoadsPass();
  if (name == "defer-accumulation") return codegen::deferAccumulationPass(target);
  if (name == "pipeline") return codegen::pipelinePass(target);
  if (name == "bulk-reduce") return codegen::bulkReducePass(target);
  if (name == "wgmma") return codegen::wgmmaPass(target);
  if (name == "pingpong") return codegen::pingpongPass(target);
  if (name == "prefetch-loads") return codegen::prefetchLoadsPass();
  if (name == "warp-specialize") return codegen::warpSpecializePass(target);
  if (name == "reverse-mode") return ir::reverseModeTestPass();  // test-only: differentiates per grad_* attributes
  return std::nullopt;
}

// "80", "90a", "sm_86": capability digits, then an optional 'a' (arch-specific). Only the spelling
// is checked here: whether FlexTile knows the target is codegen's to say (codegen/Target.h), so
// that its error for an unknown one can be tested through this tool.
std::optional<codegen::Target> parseTarget(std::string s) {
  if (s.rfind("sm_", 0) == 0) s = s.substr(3);
  bool arch = !s.empty() && s.back() == 'a';
  if (arch) s.pop_back();
  if (s.size() < 2 || s.size() > 3 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return codegen::Target{std::stoi(s), arch};
}

int run(int argc, char** argv) {
  std::string input;
  std::vector<std::string> passNames;
  ir::PrintOptions print;
  bool verifyOnly = false;
  bool split = false;
  std::string emit = "ir";
  codegen::CompileOptions compileOptions;  // target sm_90a unless --sm
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--passes=", 0) == 0) {
      for (auto& p : splitComma(a.substr(9))) passNames.push_back(p);
    } else if (a == "--print-locations") {
      print.locations = true;
    } else if (a == "--verify-only") {
      verifyOnly = true;
    } else if (a == "--split-input-file") {
      split = true;
    } else if (a.rfind("--dump=", 0) == 0) {
      const char* dir = std::getenv("FLEXTILE_DUMP_DIR");
      ir::setDumpConfig(a.substr(7), dir ? dir : "");
    } else if (a.rfind("--emit=", 0) == 0) {
      emit = a.substr(7);
      if (emit != "ir" && emit != "llvm" && emit != "ptx") {
        std::fprintf(stderr, "flextile-opt: --emit takes ir, llvm or ptx, got '%s'\n", emit.c_str());
        return 2;
      }
    } else if (a.rfind("--sm=", 0) == 0) {
      auto target = parseTarget(a.substr(5));
      if (!target) {
        std::fprintf(stderr, "flextile-opt: --sm takes a compute capability such as 80 or 90a, got '%s'\n",
                     a.substr(5).c_str());
        return 2;
      }
      compileOptions.target = *target;
    } else if (a == "--ptxas") {
      compileOptions.runPtxas = true;
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else if (a != "-" && a.rfind("-", 0) == 0) {
      std::fprintf(stderr, "flextile-opt: unknown option '%s'\n", a.c_str());
      usage();
      return 2;
    } else if (!input.empty()) {
      std::fprintf(stderr, "flextile-opt: more than one input file\n");
      return 2;
    } else {
      input = a;
    }
  }
  if (input.empty()) {
    usage();
    return 2;
  }

  std::string text;
  if (input == "-") {
    std::stringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  } else {
    std::ifstream f(input, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "flextile-opt: cannot open '%s'\n", input.c_str());
      return 1;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }

  ir::PassPipeline pipeline;
  for (const auto& name : passNames) {
    auto p = lookupPass(name, compileOptions.target);
    if (!p) {
      std::fprintf(stderr, "flextile-opt: unknown pass '%s'\n", name.c_str());
      return 2;
    }
    pipeline.add(*p);
  }

  const std::string source = input == "-" ? "<stdin>" : input;
  // Each piece is padded with the newlines before it, so its errors carry the
  // line numbers of the whole file.
  std::vector<std::string> pieces;
  if (split) {
    std::string piece;
    int line = 0;
    std::stringstream in(text);
    for (std::string l; std::getline(in, l);) {
      ++line;
      if (l.rfind("// -----", 0) == 0) {
        pieces.push_back(piece);
        piece = std::string(size_t(line), '\n');
      } else {
        piece += l + "\n";
      }
    }
    pieces.push_back(piece);
  } else {
    pieces.push_back(text);
  }

  int status = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (split && i) std::fputs("// -----\n", stdout);
    try {
      ir::Module m = ir::parseModule(pieces[i], source);
      for (auto& f : m.functions) pipeline.run(*f);  // verifies the input first, then after every pass
      if (verifyOnly) continue;
      if (emit == "ir" && !compileOptions.runPtxas) {
        std::fputs(ir::printModule(m, print).c_str(), stdout);
        continue;
      }
      std::string out;
      for (auto& f : m.functions) {
        codegen::CompiledKernel k = codegen::compile(*f, compileOptions);
        if (compileOptions.runPtxas)
          std::fprintf(stderr, "flextile-opt: ptxas -arch=%s -v for @%s:\n%s", k.target.smName().c_str(),
                       k.name.c_str(), k.ptxasInfo.c_str());
        out += emit == "llvm" ? k.llvmIR : emit == "ptx" ? k.ptx : "";
      }
      std::fputs(emit == "ir" ? ir::printModule(m, print).c_str() : out.c_str(), stdout);
    } catch (const Error& e) {
      if (!split) throw;
      std::fprintf(stderr, "%s\n", e.what());
      status = 1;
    }
  }
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const flextile::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
