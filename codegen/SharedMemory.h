// Shared-memory planning: which byte range of the kernel's dynamic shared
// memory each op that needs scratch uses. Runs after layout assignment.
//
// How much scratch an op needs, and how the op lays it out, belongs to its
// lowering: codegen::scratchBytes (codegen/LowerToLLVM.h) is the one source
// of truth. In short (elemBytes = ir::byteWidth: i1 is 1 byte, pointers 8;
// no padding and no swizzle until issue #3 adds swizzled shared layouts):
//   convert_layout  one tile, row-major: element (i0, ..., ik) of T[s0..sk] at
//                   base + ((i0 * s1 + i1) * s2 + ... + ik) * elemBytes; none when
//                   the conversion only renames registers (same lanes and warps).
//   reduce          when warps hold different parts of one reduction (warp bases
//                   along the reduced axis): numElements(result) * 2^(those warp
//                   bits) * elemBytes of partials.
//   dot             a [M, K] row-major at base, b [K, N] row-major right after it.
// This file decides where each op's scratch goes.
//
// Reuse rule. Each op's scratch is live only while that op executes: it is
// written and read inside the op's own lowering, which brackets the use with
// barriers (write, bar.sync, read, bar.sync: the trailing barrier is what lets
// the next op, or the same op in the next loop iteration, overwrite the
// bytes). Buffers whose live ranges do not overlap may share bytes; today
// every live range is a single op, so every scratch starts at 0 and the total
// is the largest one. Buffers that live longer (pipelined K/V stages, issue
// #3) get live ranges spanning their loop, and the allocator below gives
// overlapping ranges disjoint bytes (first fit, largest first, 16-byte
// aligned).
#pragma once

#include <cstdint>
#include <map>

#include "codegen/LowerToLLVM.h"
#include "codegen/Target.h"
#include "ir/IR.h"

namespace flextile::codegen {

struct SharedPlan {
  std::map<const ir::Op*, int> offset;  // base byte offset of each op with scratch
  std::map<const ir::Op*, int> bytes;   // its size in bytes
  int totalBytes = 0;                   // dynamic shared memory the kernel needs
};

// Throws flextile::Error when a tile has no layout (run assignLayouts first).
SharedPlan planSharedMemory(const ir::Function& f);

// Everything the lowering needs beyond the IR: the scratch offsets of
// planSharedMemory and, for each load and store, the vector width the axis
// analysis and the layout allow (memoryAccessWidth in codegen/AxisInfo.h).
LoweringPlan makeLoweringPlan(const ir::Function& f);

// Throws flextile::Error naming the largest users when the plan does not fit
// the target's shared memory.
void checkSharedMemoryFits(const SharedPlan& plan, const ir::Function& f, const Target& target);

}  // namespace flextile::codegen
