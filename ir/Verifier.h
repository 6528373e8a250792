// The verifier: checks that a Function is well-formed tile IR. It runs after
// tracing, after parsing and after every pass (PassPipeline), so a pass that
// breaks an invariant is caught at once and named.
//
// What it checks (docs/ir-reference.md lists the rules per op):
//   * structure: operand/result/region counts from Ops.def, terminators last
//     (return ends the function, yield ends a for body), SSA dominance
//     (every operand is defined earlier in its block or an enclosing one);
//   * types: element-wise operands agree in shape and dtype, float-only and
//     int-only ops, cmp predicates, select/load/store masks are i1, addptr
//     offsets are integers, load/store match the pointee, reduce/dot/for
//     shapes, tile dimensions are powers of two, parameters are scalars;
//   * layouts (once any tile has one, every tile must): each layout fits its
//     value and passes Layout::verify(), and ops relate their layouts the way
//     Layout's derived constructors say (sliced, projected, reshaped, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace flextile::ir {

// The most elements one tile may have; the verifier refuses larger tiles. A tile lives in the
// registers and shared memory of one program and is indexed by i32 aranges; FlexTile's own tiles
// are far smaller (a [128, 256] accumulator has 2^15), so 2^31 leaves room while every element
// count and byte size of a verified tile stays far inside int64.
inline constexpr int64_t kMaxTileElements = int64_t(1) << 31;

// Throws one flextile::Error listing every problem found (each naming its op
// with op->describe()).
void verify(const Function& f);

// The same checks, returning the problems instead of throwing.
std::vector<std::string> verificationProblems(const Function& f);

}  // namespace flextile::ir
