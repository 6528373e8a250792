// Optional dumps of every stage's text, for humans and bug reports.
//
// FLEXTILE_DUMP is a comma list of stages, read once:
//   ir      the final tile IR handed to codegen (with layouts)
//   passes  the IR after every pass, headed by the pass name
//   llvm-lowered  the LLVM IR module as lowered, before O3
//   llvm    the LLVM IR module before the NVPTX backend
//   ptx     the PTX text
//   all     every stage
// Dumps go to stderr, or, when FLEXTILE_DUMP_DIR names a folder, into one file
// per dump there: "<seq>-<stage>-<title>.<ext>" (seq orders them; ext is ftir,
// ll or ptx), so a run's stages can be diffed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flextile::ir {

bool dumpEnabled(std::string_view stage);

// Writes `text` for `stage` if that stage is enabled; safe from several
// threads (the autotuner compiles in parallel).
void dump(std::string_view stage, std::string_view title, std::string_view text);

// FLEXTILE_TIMING=1 (read once): the pass pipeline and codegen::compile
// print the wall time of each step to stderr.
bool timingEnabled();
// Prints "flextile: <title>" and one line per (step, ms) with their total to
// stderr when timing is enabled; one write, so threads do not interleave.
void reportTimings(std::string_view title, const std::vector<std::pair<std::string, double>>& steps);

// Overrides the environment (for command-line flags and tests): `stages` is
// a comma list as in FLEXTILE_DUMP, `dir` as FLEXTILE_DUMP_DIR ("" = stderr).
void setDumpConfig(std::string stages, std::string dir);

}  // namespace flextile::ir
