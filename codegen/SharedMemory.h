// Shared-memory planning: which byte range of the kernel's dynamic shared
// memory each op that needs scratch uses. Runs after layout assignment; the
// lowering reads the plan and must follow the formulas below exactly.
//
// Scratch, per op (elemBytes = ir::byteWidth: i1 is 1 byte, pointers 8):
//   convert_layout  one tile of the source: numElements * elemBytes.
//                   Element (i0, ..., ik) lives at base + rowMajorIndex * elemBytes
//                   (rowMajorIndex = ((i0 * s1 + i1) * s2 + ...) + ik; no padding).
//                   A conversion to a layout ldmatrix can read (a 16-bit dot
//                   operand: codegen/TensorCores.h ldmatrixStaging) stores the
//                   tile in that swizzled SharedLayout instead: element c at
//                   base + offsetOf(c) * elemBytes. The swizzle permutes the same
//                   numElements slots, so the size is the same.
//   reduce          only when the operand layout has a warp basis with a non-zero
//                   coordinate along the reduced axis (warps hold different parts
//                   of one reduction): numWarps * numElements(result) * elemBytes.
//                   The partial of warp w (the full warp id, 0..numWarps-1) for
//                   result element i (row-major index; 0 for a scalar result)
//                   lives at base + (w * numElements(result) + i) * elemBytes.
//                   Warps that replicate (differ only in bits whose warp basis is
//                   zero) write identical partials; readers combine the partials
//                   of the warps that differ only in the axis bits.
//   dot             FMA dots: a and b staged row-major: a [M, K] at base, b [K, N]
//                   at base + dotScratchBOffset(op) (a's bytes rounded up to 16).
//                   mma dots (isMmaDot) need none: their operands arrive in
//                   registers, staged by the convert_layout that produced them.
//   local_alloc     a shared buffer (the memory/async level): its S slots of
//                   sharedSlotBytes each, slot s at base + s * sharedSlotBytes,
//                   each in the buffer type's SharedLayout. Live from the alloc
//                   to its last use, and through the whole of every loop that
//                   uses it without containing the alloc (copies issued in one
//                   iteration land in the next), so a ring never shares bytes
//                   with a scratch used inside its loop. Its async_copy and
//                   local_load ops need no scratch of their own.
//   atomic_add      only when its old values are used and more than one thread
//                   holds an element (a scalar, or a layout with replicated lane
//                   or warp bits; atomicOldValuesShared): one tile of the result,
//                   row-major as for convert_layout (a scalar: one element at
//                   base). The one thread that added an element writes its old
//                   value there and every holder reads it back.
//   atomic_add      with `bulk_rows` (codegen/passes/BulkReduce.cpp; tile [R, W] of f32):
//                   R rows of bulkRowStride(op) = W * 4 + pad bytes (row r at base + r *
//                   bulkRowStride, row-major within; the pad, a multiple of 16 bytes below 128,
//                   is the smallest that gives the stores of the op's layout the fewest bank
//                   conflicts: 32 for an mma or wgmma accumulator, 16 for wgmma's transposed),
//                   then R row addresses of
//                   8 bytes (the global address of the row's first element, 0 for a row the mask
//                   leaves out), then one 8-byte slot per thread that takes the address stores of
//                   registers that are not in column 0 (branch-free stores). The bulk copies read
//                   the rows asynchronously and the op does not wait for those reads: it
//                   waits for the previous execution's (`cp.async.bulk.wait_group.read 0`)
//                   before it writes, and every return waits for the last. So its bytes are its
//                   own from the start of the outermost loop around it to the kernel's end.
//   atomic_add      with `bulk_tensor` (tile [R, W] of f32): the tile in bulkTensorStaging(op),
//                   R * W * 4 bytes at a multiple of 1024 (the swizzle's period). Its bytes are
//                   its own as a bulk_rows op's are, for the same reason.
//   cluster_all_gather  each operand row-major as for convert_layout (a scalar: one element),
//                   operand i at base + clusterGatherOffset(op, i) (each rounded up to 16
//                   bytes). Every program of the cluster has the same plan, so rank r's copy of
//                   operand i is at the same offset in r's shared memory (read through mapa).
//                   Two cluster barriers bracket the reads: the other programs' writes are
//                   visible after the first, and no program writes the bytes again (or exits)
//                   before every program has passed the second.
//   anything else   none.
// Every base offset is a multiple of 16 bytes.
//
// Reuse rule. Each op's scratch is live only while that op executes: it is
// written and read inside the op's own lowering. Buffers whose live ranges do
// not overlap may share bytes; today that is all of them, so every scratch
// starts at 0 and the total is the largest one. The lowering keeps this safe
// with two barriers per scratch-using op:
//   1. bar.sync before its first write to scratch (an earlier op, or the same
//      op in the previous loop iteration, may still be reading the bytes), and
//   2. bar.sync between its writes and its reads.
// Nothing follows the reads: the next user's barrier 1. protects them (the
// golden test tests/lit/codegen/ptx.ftir checks this order in the PTX).
// Buffers that live longer (the shared buffers of the async level, such as the
// K/V rings of a software-pipelined loop, resident wgmma A tiles and the rows of a
// bulk_rows atomic_add, which the engine reads after the op) have
// longer live ranges, and the allocator gives overlapping ranges disjoint
// bytes; their ordering is the IR's barriers and waits (codegen/passes/Pipeline.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "codegen/Target.h"
#include "ir/IR.h"
#include "ir/SharedLayout.h"

namespace flextile::codegen {

// An unswizzled TMA destination (a tensor copy's slot) starts at a multiple of this many bytes;
// the planner places every shared buffer of the async level (local_alloc) so.
constexpr int64_t kTmaPlainAlignment = 128;

struct SharedPlan {
  std::map<const ir::Op*, int> offset;  // base byte offset of each op with scratch
  std::map<const ir::Op*, int> bytes;   // its size in bytes
  int totalBytes = 0;                   // dynamic shared memory the kernel needs
};

// The scratch bytes `op` needs (0: none). A reduce needs its operand's layout.
int64_t scratchBytes(const ir::Op& op);
// Whether a reduce combines partials of several warps through shared memory.
bool reduceNeedsScratch(const ir::Op& reduce);
// Bytes of one slot of a shared buffer (its tile, rounded up to 16).
int64_t sharedSlotBytes(const ir::Type& buffer);
// Whether an atomic_add hands its old values to the other holders of each
// element through scratch: its result is used and is a scalar or replicated
// (only one thread per element does the atomic; codegen/LowerAtomic.cpp).
bool atomicOldValuesShared(const ir::Op& atomic);
// Whether an atomic_add carries `bulk_rows = 1` (codegen/passes/BulkReduce.cpp).
bool addsRowsInBulk(const ir::Op& atomic);
// Whether an atomic_add carries `bulk_tensor = 1` (codegen/passes/BulkReduce.cpp).
bool addsTensorInBulk(const ir::Op& atomic);
// Either: the bulk-copy engine reads the op's staged tile after the op.
bool addsInBulk(const ir::Op& atomic);
// Where a bulk_tensor atomic_add stages its [R, W] f32 tile: row-major in panels of one of TMA's
// swizzles (128-byte spans: 32 columns, the 16-byte chunks of row r XOR r % 8; or 64 or 32 bytes),
// the one whose stores from the tile's layout meet the fewest bank conflicts, the widest of equals;
// unswizzled when a row is under 32 bytes. TMA reads it as one box per panel.
ir::SharedLayout bulkTensorStaging(const ir::Op& atomic);
// Whether a bulk_rows atomic_add of a tile in `l` stores registers 2k and 2k + 1 as one 8-byte
// store: they are neighbouring columns and every thread's own column part is even.
bool bulkStoresPaired(const ir::Layout& l);
// Bytes between rows of a bulk_rows atomic_add's staged tile.
int64_t bulkRowStride(const ir::Op& atomic);
// Offset of operand i of a cluster_all_gather from the op's scratch base.
int64_t clusterGatherOffset(const ir::Op& gather, size_t operand);
// Offset of a dot's b tile from the dot's scratch base.
int64_t dotScratchBOffset(const ir::Op& dot);

// Throws flextile::Error when a tile has no layout (run assignLayouts first).
// codegen::planLowering (LowerToLLVM.h) turns the plan into the lowering's.
SharedPlan planSharedMemory(const ir::Function& f);

// The converts whose tile may stay resident in shared memory as wgmma's A
// operand (TensorCores.h wgmmaResidentA) when the plan with all of them, each
// live from the convert to the end of the last loop whose dots read it, fits
// the target's shared memory; none when it does not. The "wgmma" pass turns
// them into shared buffers (codegen/passes/Wgmma.cpp). In program order.
std::vector<const ir::Op*> residentAConverts(const ir::Function& f, const Target& target);
// The converts of A tiles computed in loops that the "wgmma" pass stages through shared memory
// (TensorCores.h wgmmaStagedA) when the plan with them and the resident tiles fits; else none.
std::vector<const ir::Op*> stagedAConverts(const ir::Function& f, const Target& target);

// Throws flextile::Error naming the largest users when the plan does not fit
// the target's shared memory.
void checkSharedMemoryFits(const SharedPlan& plan, const ir::Function& f, const Target& target);

}  // namespace flextile::codegen
