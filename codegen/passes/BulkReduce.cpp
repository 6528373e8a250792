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
//
// Whole tiles through TMA (`bulk_tensor = 1`). Row requests still go out one by one: a warp's
// lanes issue their cp.reduce.async.bulk in turn, each holding its registers until the engine
// takes it, and the dkdv's 64 rows a step were a quarter of its consumers' samples (ncu, H100,
// bench/RESULTS.md 2026-12-07). An atomic_add that also names its tile as one box of a tensor
// (ir/Ops.def atomic_add {tensor_rank}, as the backward's atomic dQ does) is instead staged in a
// TMA layout (codegen/SharedMemory.h bulkTensorStaging: panels of 128, 64 or 32 bytes) and added
// by one `cp.reduce.async.bulk.tensor` per panel, issued by one thread; the engine clips rows and
// columns outside the tensor, so the mask costs nothing. It qualifies (bulkTensorRefusal) where
// the target has TMA, the tile is f32 [R, W] with unused old values, R and W are powers of two up
// to 256, the box's base is a pointer parameter and its dims and strides are parameters or
// constants (the host encodes a tensor map from them), constant strides are multiples of 16 bytes,
// and the kernel's shared memory still fits. It is tried before the rows; FLEXTILE_BULK_TENSOR=0
// leaves such ops to the rows.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "codegen/AxisInfo.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorMaps.h"

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
  if (ir::operandsBeforeBox(atomic) == 3 && axis.get(atomic.operand(2)).constancy[1] < width)
    return "its mask is not proven constant along each row";
  return "";
}

std::string bulkTensorRefusal(const Op& atomic, const Target& target) {
  if (atomic.kind() != OpKind::AtomicAdd) return "it is not an atomic_add";
  if (!target.has(Feature::TensorMemoryAccelerator)) return target.smName() + " has no TMA";
  const std::optional<ir::TensorBox> box = ir::tensorBoxOf(atomic);
  if (!box) return "it names no tensor box (tensor_rank)";
  const ir::Type& pt = atomic.operand(0)->type();
  if (!pt.isTile() || pt.rank() != 2) return "its address is not a rank-2 tile";
  if (pt.pointee() != DType::F32) return "it does not add f32";
  if (!pt.hasLayout()) return "its tiles have no layout";
  if (atomic.function()->hasUses(atomic.result())) return "its old values are used";
  for (int64_t n : pt.shape())
    if (n > 256 || (n & (n - 1)) != 0) return "its tile " + pt.str() + " is not a TMA box (powers of two up to 256)";
  if (const std::string why = tmaSlotRefusal(bulkTensorStaging(atomic), pt.shape(), DType::F32); !why.empty())
    return why;
  const ir::Function& f = *atomic.function();
  const std::optional<TensorMapOperand> base = launcherOperand(box->base, f);
  if (!base || base->param < 0) return "its tensor's base is not a pointer parameter";
  for (const auto* part : {&box->dims, &box->strides})
    for (const ir::Value* v : *part)
      if (!launcherOperand(v, f)) return "its tensor's dims and strides are not all parameters or constants";
  for (const ir::Value* v : box->strides)
    if (const TensorMapOperand s = *launcherOperand(v, f); s.param < 0 && s.constant % 4 != 0)
      return "a stride of its tensor is not a multiple of 16 bytes";
  return "";
}

void selectBulkReduce(ir::Function& f, const Target& target) {
  if (const char* env = std::getenv("FLEXTILE_BULK_REDUCE"); env && std::strcmp(env, "0") == 0) return;
  if (!target.has(Feature::BulkReduce)) return;
  const char* tensorEnv = std::getenv("FLEXTILE_BULK_TENSOR");
  const bool tensors = !tensorEnv || std::strcmp(tensorEnv, "0") != 0;
  const AxisInfoAnalysis axis(f);
  std::vector<std::pair<Op*, const char*>> chosen;  // the op and its attribute
  f.walk([&](Op& op) {
    if (op.kind() != OpKind::AtomicAdd || op.hasAttr("bulk_rows") || op.hasAttr("bulk_tensor")) return;
    if (tensors && bulkTensorRefusal(op, target).empty())
      chosen.push_back({&op, "bulk_tensor"});
    else if (bulkReduceRefusal(op, axis).empty())
      chosen.push_back({&op, "bulk_rows"});
  });
  for (auto [op, attr] : chosen) {
    op->setAttr(attr, int64_t(1));
    if (planSharedMemory(f).totalBytes <= target.maxSharedBytesPerBlock()) continue;
    op->attrs().erase(attr);
    // The rows' staging is larger than the tile's (row pads, addresses), so it fits no better.
  }
}

ir::Pass bulkReducePass(const Target& target) {
  return {"bulk-reduce", [target](ir::Function& f) { selectBulkReduce(f, target); }};
}

}  // namespace flextile::codegen
