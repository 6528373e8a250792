// The property of random tile programs (TileProgramGenerator.h), shared by the libFuzzer target
// (tile_program_fuzzer.cpp) and the deterministic gtest (tests/codegen/RandomTileProgramsTest.cpp):
//
//   * the generated program verifies and runs in the interpreter without an error;
//   * each tile-level pass of the compiler on its own (canonicalize, cse, dce, assign-layouts for
//     sm_80, assign-layouts + pipeline for sm_90a) and the compiler's whole tile pipeline
//     (codegen::tilePassPipeline, and sm_90a's whatever the target drawn: its TMA rings and
//     producer warpgroup) keep it verified, and the interpreter then leaves every buffer
//     with the same contents: bit for bit, integers and floats alike, except that any NaN equals
//     any NaN;
//   * codegen::compile lowers it to PTX (sm_80 or sm_90a) without an error, and ptxas (where
//     there is one) assembles that PTX — unless it holds an op
//     the lowering refuses by design with a clear error (GeneratedProgram::lowerable: f64 dots).
//
// Why floats are compared bitwise and not to a tolerance: none of these passes may reassociate.
// canonicalize folds with the interpreter's own arithmetic and applies only the float identities
// that are exact (x * 1, x - 0, ...: ir/Passes.h); cse and dce only remove ops; layouts and
// convert_layout mean nothing to the interpreter, whose reduce and dot sum in double in index
// order whatever the layout. So any difference is a pass changing the program. A NaN's sign and
// payload are not part of the semantics (IEEE 754 and PTX leave them open), so they may differ.
#pragma once

#include <cstdint>
#include <string>

#include "Choices.h"

namespace flextile::fuzz {

struct TileProgramOutcome {
  std::string broken;   // empty: the property holds; else what broke
  std::string program;  // the generated program (ir::printFunction), for the report
  int64_t changedBytes = 0;  // bytes of the buffers the original program changed
  int ops = 0;               // ops in the generated program
  bool compiled = false;     // it was lowered to PTX (see GeneratedProgram::lowerable)
  // What sm_90a's passes made of its streamed dots (TileProgramGenerator.h), so that a test can
  // ask that the TMA paths were reached at all: TMA rings, ldmatrix rings in 128-byte panels, a
  // producer warpgroup, rings shared by loops.
  bool tmaRings = false, panelRings = false, producer = false;
  bool sharedRings = false;  // one ring buffer refilled by TMA in two loops (share_rings)
  bool turns = false;        // warpgroup turns (pingpong)
  bool bulkTensor = false;   // an atomic_add the bulk-reduce pass gave TMA reductions (bulk_tensor)
};

TileProgramOutcome checkTileProgram(Choices& choices);

}  // namespace flextile::fuzz
