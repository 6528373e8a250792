// Whole-row atomic sums through the bulk-copy engine (pass "bulk-reduce").
//
// An atomic_add of an f32 tile [R, W] whose rows are contiguous in global memory can leave the
// threads' registers through shared memory and reach L2 as R bulk reductions
// (`cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32`, one per row of W * 4 bytes)
// instead of R * W atomics. The backward's atomic dQ is such a sum: a [64, 128] f32 tile per
// inner step of every dK/dV program, 16 384 `atom.global.add.f32` that made it 3.4x slower than
// the separate dQ kernel (bench/RESULTS.md, 2026-12-02). The engine moves each row as one request,
// and the threads wait only until it has read the shared copy (`wait_group.read`), not for L2.
//
// The pass marks such an atomic_add with `bulk_rows = 1`; shared-memory planning gives it scratch
// (codegen/SharedMemory.h) and codegen/LowerAtomic.cpp lowers it. An op qualifies when
// (bulkReduceRefusal):
//   * the target has Feature::BulkReduce (sm_90 and later; checked by the pass and the lowering);
//   * it adds f32 through a rank-2 pointer tile with a layout, and its old values are unused
//     (the engine returns none);
//   * the axis analysis proves each row one contiguous run: contiguity along dim 1 of the whole
//     width, 16-byte alignment of the run's start, and W * 4 a multiple of 16 (the engine's unit);
//   * a mask, if any, is constant along each row (constancy along dim 1 of the whole width): the
//     engine adds whole rows, so a masked row is left out whole;
//   * the kernel's shared memory still fits the target with the op's scratch.
// Everything else keeps one atomic per element. FLEXTILE_BULK_REDUCE=0 marks nothing.
#include <cstdlib>
#include <cstring>
#include <string>

#include "codegen/AxisInfo.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"

namespace flextile::codegen {

using ir::DType;
using ir::Op;
using ir::OpKind;

std::string bulkReduceRefusal(const Op& atomic, const AxisInfoAnalysis& axis) {
  if (atomic.kind() != OpKind::AtomicAdd) return "it is not an atomic_add";
  const ir::Value* ptr = atomic.operand(0);
  const ir::Type& pt = ptr->type();
  if (!pt.isTile() || pt.rank() != 2) return "its address is not a rank-2 tile";
  if (pt.pointee() != DType::F32) return "it does not add f32";
  if (!pt.hasLayout()) return "its tiles have no layout";
  if (atomic.function()->hasUses(atomic.result())) return "its old values are used";
  const int64_t width = pt.shape()[1];
  if (width * 4 % 16 != 0) return "a row of " + std::to_string(width) + " f32 is not a multiple of 16 bytes";
  const AxisInfo& p = axis.get(ptr);
  if (p.contiguity[1] < width) return "its rows are not proven contiguous";
  if (p.divisibility[1] < 16) return "its rows are not proven 16-byte aligned";
  if (atomic.numOperands() == 3 && axis.get(atomic.operand(2)).constancy[1] < width)
    return "its mask is not proven constant along each row";
  return "";
}

void selectBulkReduce(ir::Function& f, const Target& target) {
  if (const char* env = std::getenv("FLEXTILE_BULK_REDUCE"); env && std::strcmp(env, "0") == 0) return;
  if (!target.has(Feature::BulkReduce)) return;
  const AxisInfoAnalysis axis(f);
  std::vector<Op*> chosen;
  f.walk([&](Op& op) {
    if (op.kind() == OpKind::AtomicAdd && !op.hasAttr("bulk_rows") && bulkReduceRefusal(op, axis).empty())
      chosen.push_back(&op);
  });
  for (Op* op : chosen) {
    op->setAttr("bulk_rows", int64_t(1));
    if (planSharedMemory(f).totalBytes > target.maxSharedBytesPerBlock()) op->attrs().erase("bulk_rows");
  }
}

ir::Pass bulkReducePass(const Target& target) {
  return {"bulk-reduce", [target](ir::Function& f) { selectBulkReduce(f, target); }};
}

}  // namespace flextile::codegen
