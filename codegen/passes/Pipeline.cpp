// Software pipelining of dot-operand loads (pass "pipeline").
//
// Decides, the lowering does. The pass marks, in each `for` loop, every load
// that only stages a dot operand and can be issued iterations ahead:
//   * the load sits directly in the loop body and has a tile result,
//   * its uses are convert_layouts (in the same body) to layouts that
//     ldmatrix reads (codegen/TensorCores.h ldmatrixPlan) from one and the
//     same swizzled tile: the staging of mma operands (the backward reads Q
//     as the B operand of K·Qᵀ and of dSᵀ·Q from one ring slot),
//   * `other` is absent or a constant zero (cp.async zero-fills masked bytes),
//   * each thread's global accesses are at least 4 bytes wide and land as
//     whole vectors in the swizzled shared tile (asyncCopyWidth >= 2 elements),
//   * its pointer and mask are computed from the induction variable, values
//     defined outside the loop, pure region-free ops of the body and, when
//     the loop stores nothing, scalar loads of the body (no loop-carried
//     value): so the lowering can recompute them for a later iteration.
//     The scalar loads are what block-sparse loops need (the block index of
//     step t is read from a list at t): re-reading them ahead is safe
//     because nothing in the loop writes memory (writes through the
//     function's `private_params` do not count: no other parameter reaches
//     that memory), and the template masks the list reads past the row's count.
// A marked load gets the attribute `async_stages = S` (S = the function's
// num_stages). The IR's meaning is unchanged (the interpreter ignores the
// attribute), which is why this is an annotation and not new ops: the
// schedule lives in the lowering (LowerPipeline.cpp): a ring of S swizzled
// shared tiles per marked load, a prologue issuing iterations 0..S-2 with
// cp.async + commit_group, and in iteration i: cp.async.wait_group S-2, one
// barrier, issue of iteration i+S-1, ldmatrix from slot i mod S.
// num_stages 1 (or a function without the attribute) pipelines nothing.
#include "codegen/AxisInfo.h"
#include "codegen/Passes.h"
#include "codegen/TensorCores.h"

#include <set>

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

bool isZeroConstant(const ir::Value* v) {
  const Op* d = v->definingOp();
  while (d && (d->kind() == OpKind::Splat || d->kind() == OpKind::Broadcast || d->kind() == OpKind::ConvertLayout))
    d = d->operand(0)->definingOp();
  return d && d->kind() == OpKind::Constant && d->floatAttr("value") == 0.0;
}

// Whether `v`, used in `body`, can be recomputed for another iteration.
bool recomputable(const ir::Value* v, const ir::Block& body, bool readOnlyLoop, std::set<const ir::Value*>& seen) {
  if (!seen.insert(v).second) return true;
  if (v == body.arg(0)) return true;
  const Op* d = v->definingOp();
  // Defined outside the body (an enclosing block, or a parameter): loop-invariant.
  // Inside: only the body's own ops qualify (a nested region's values do not reach the load).
  auto inside = [&](const ir::Block* blk) {
    for (; blk; blk = blk->parentOp() ? blk->parentOp()->parentBlock() : nullptr)
      if (blk == &body) return true;
    return false;
  };
  if (!d) return !inside(v->ownerBlock());  // a block argument of the body other than iv: loop-carried
  if (d->parentBlock() != &body) return !inside(d->parentBlock());
  const bool scalarLoad = d->kind() == OpKind::Load && readOnlyLoop && !d->result()->type().isTile();
  if (!scalarLoad && (!d->hasTrait(ir::kPure) || !d->regions().empty() || d->kind() == OpKind::Load)) return false;
  for (const ir::Value* o : d->operands())
    if (!recomputable(o, body, readOnlyLoop, seen)) return false;
  return true;
}

// Whether a store or atomic writes only through a pointer parameter that the function's
// `private_params` attribute lists: memory no other parameter reaches (a buffer the template
// allocated for itself, such as the backward's gradients of captured tensors). Such writes cannot
// change what a scalar load of another parameter reads, so the loop still counts as read-only for
// re-reading block indices ahead.
bool writesOnlyPrivateMemory(const Op& op, const ir::Function& f) {
  if (op.kind() != OpKind::Store && op.kind() != OpKind::AtomicAdd) return false;
  auto it = f.attrs().find("private_params");
  if (it == f.attrs().end()) return false;
  const auto* indices = std::get_if<std::vector<int64_t>>(&it->second);
  if (!indices) return false;
  const ir::Value* p = ir::pointerBase(op.operand(0));
  if (!p) return false;
  for (int64_t i : *indices)
    if (i >= 0 && size_t(i) < f.params().size() && f.params()[size_t(i)] == p) return true;
  return false;
}

}  // namespace

int64_t asyncCopyWidth(const ir::Layout& from, const LdmatrixPlan& plan, int64_t globalWidth, ir::DType t) {
  const int fast = plan.smem.order()[0];
  int64_t v = std::min({globalWidth, from.contiguousRegisters(fast), plan.smem.vec(), int64_t(16 / ir::byteWidth(t))});
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  for (const ir::Layout::Bases* bases : {&from.laneBases(), &from.warpBases()})
    for (const auto& basis : *bases)
      while (p > 1 && plan.smem.offsetOf(basis) % p != 0) p /= 2;
  // The register groups must also start at multiples of p in shared memory.
  for (int64_t r0 = 0; r0 < from.numRegisters(); r0 += p)
    if (plan.smem.offsetOf(from.regCoord(r0)) % p != 0) return 1;
  return p;
}

void pipelineLoads(ir::Function& f) {
  const int64_t stages = f.intAttrOr("num_stages", 1);
  if (stages < 1 || stages > 4)
    throw Error("function '" + f.name() + "': num_stages must be 1, 2, 3 or 4, got " + std::to_string(stages));
  if (stages == 1) return;
  AxisInfoAnalysis axis(f);
  f.walk([&](Op& forOp) {
    if (forOp.kind() != OpKind::For || forOp.regions().size() != 1) return;
    ir::Block& body = forOp.region(0);
    if (body.args().empty()) return;
    // Uses of each value in the body (the IR keeps no use lists).
    std::map<const ir::Value*, std::vector<Op*>> users;
    std::function<void(ir::Block&)> collect = [&](ir::Block& blk) {
      for (auto& op : blk.ops()) {
        for (const ir::Value* o : op->operands()) users[o].push_back(op.get());
        for (auto& r : op->regions()) collect(*r);
      }
    };
    collect(body);
    bool readOnlyLoop = true;
    std::function<void(ir::Block&)> findStores = [&](ir::Block& blk) {
      for (auto& op : blk.ops()) {
        if (op->hasTrait(ir::kSideEffect) && !writesOnlyPrivateMemory(*op, f)) readOnlyLoop = false;
        for (auto& r : op->regions()) findStores(*r);
      }
    };
    findStores(body);
    for (auto& opPtr : body.ops()) {
      Op& load = *opPtr;
      if (load.kind() != OpKind::Load || !load.result()->type().isTile() || !load.result()->type().hasLayout()) continue;
      const auto& us = users[load.result()];
      if (us.empty()) continue;
      // Every reader stages a dot operand from the one ring tile: all of them must read the same
      // swizzled layout (a tile used as Kᵀ in one product and as K in another, say).
      const ir::DType t = load.result()->type().dtype();
      std::optional<LdmatrixPlan> plan;
      bool readable = true;
      for (const Op* cvt : us) {
        if (cvt->kind() != OpKind::ConvertLayout || cvt->parentBlock() != &body) {
          readable = false;
          break;
        }
        auto p = ldmatrixPlan(*load.result()->type().layout(), *cvt->result()->type().layout(), t);
        if (!p || (plan && !(p->smem == plan->smem))) {
          readable = false;
          break;
        }
        if (!plan) plan = p;
      }
      if (!readable) continue;
      if (load.numOperands() >= 3 && !isZeroConstant(load.operand(2))) continue;
      const int64_t width = memoryAccessWidth(load, axis).width;
      if (asyncCopyWidth(*load.result()->type().layout(), *plan, width, t) < 2) continue;
      std::set<const ir::Value*> seen;
      bool ok = true;
      for (size_t i = 0; i < std::min<size_t>(2, load.numOperands()); ++i)
        ok = ok && recomputable(load.operand(i), body, readOnlyLoop, seen);
      if (!ok) continue;
      load.setAttr("async_stages", stages);
    }
  });
}

ir::Pass pipelinePass() { return {"pipeline", [](ir::Function& f) { pipelineLoads(f); }}; }

}  // namespace flextile::codegen
