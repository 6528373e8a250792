// flextile-opt: reads tile IR text, verifies it, runs passes, prints the result.
//
//   flextile-opt [--passes=canonicalize,cse,dce] [--print-locations] [--verify-only]
//                [--split-input-file] [--dump=STAGES] FILE|-
//
// Exit status 1 with the error on stderr when the input does not parse or
// verify, or a pass fails. With --split-input-file, the input is cut at lines
// "// -----" and each piece is handled on its own (errors keep the line
// numbers of the whole file; the exit status is 1 if any piece failed), so one
// lit test can hold many small cases. The lit tests under tests/lit drive it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "ir/Dump.h"
#include "ir/Parser.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace {

using namespace flextile;

void usage() {
  std::fputs(
      "usage: flextile-opt [options] FILE|-\n"
      "  --passes=a,b,...     run these passes in order (canonicalize, cse, dce)\n"
      "  --print-locations    print loc(\"file\":line) after each op\n"
      "  --verify-only        parse and verify, print nothing\n"
      "  --split-input-file   handle each piece between '// -----' lines separately\n"
      "  --dump=STAGES        as FLEXTILE_DUMP (ir, passes, llvm, ptx, all)\n"
      // CODEGEN: document --emit=llvm|ptx and codegen passes here.
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

// The pass of this name. Target-independent passes come from ir/Passes.h.
std::optional<ir::Pass> lookupPass(const std::string& name) {
  if (auto p = ir::targetIndependentPass(name)) return p;
  // ---- CODEGEN: add codegen passes here (layout assignment, ...), e.g.
  //   if (name == "assign-layouts") return codegen::assignLayoutsPass(target);
  return std::nullopt;
}

int run(int argc, char** argv) {
  std::string input;
  std::vector<std::string> passNames;
  ir::PrintOptions print;
  bool verifyOnly = false;
  bool split = false;
  // ---- CODEGEN: options for --emit=llvm|ptx (and a --target) go here.
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
    auto p = lookupPass(name);
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
      // ---- CODEGEN: with --emit=llvm|ptx, compile each function here
      //   (codegen::compile(*f, options)) and print its llvmIR / ptx instead.
      std::fputs(ir::printModule(m, print).c_str(), stdout);
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
