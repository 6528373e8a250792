// Software pipelining of dot-operand loads (pass "pipeline"): the loads of a
// `for` loop that stage dot operands become a ring of shared tiles filled
// iterations ahead by async copies, written out in the memory/async level of
// the IR (ir/Ops.def: local_alloc, async_copy, async_commit, async_wait,
// local_load, barrier, fence_async_shared).
//
// Which loads. In each loop, every load that only stages a dot operand and
// can be issued iterations ahead:
//   * the load sits directly in the loop body and has a tile result,
//   * its uses are convert_layouts (in the same body) to layouts that
//     ldmatrix reads (codegen/TensorCores.h ldmatrixPlan) from one and the
//     same swizzled tile: the staging of mma operands (the backward reads Q
//     as the B operand of K·Qᵀ and of dSᵀ·Q from one ring slot),
//   * `other` is absent or a constant zero (cp.async zero-fills masked bytes),
//   * each thread's global accesses are at least 4 bytes wide and land as
//     whole vectors in the swizzled shared tile (asyncCopyWidth >= 2 elements),
//   * nothing in the loop writes the memory it reads: no store or atomic of the
//     loop goes through its pointer parameter (or through a pointer the pass
//     cannot trace to a parameter); distinct pointer parameters are taken not to
//     overlap, as the templates' tensors do not (a kernel that writes a buffer it
//     also streams keeps those loads where they are),
//   * its pointer and mask are computed from the induction variable, values
//     defined outside the loop, pure region-free ops of the body and, when
//     the loop stores nothing, scalar loads of the body (no loop-carried
//     value): so the pass can recompute them for a later iteration.
//     The scalar loads are what block-sparse loops need (the block index of
//     step t is read from a list at t): re-reading them ahead is safe
//     because nothing in the loop writes memory (writes through the
//     function's `private_params` do not count: no other parameter reaches
//     that memory), and the template masks the list reads past the row's count,
//   * it carries no `no_ring` attribute (dsl::unpipelined: a tile the
//     template keeps out of the rings, such as a persistent forward's Q
//     where its two slots would not fit beside the walks' rings).
// S = the function's num_stages; 1 (or no attribute) pipelines nothing.
//
// The ring's layout. A load whose tile a dot reads with wgmma (TensorCores.h
// wgmmaPlan, sm_90a) is stored in wgmmaSharedLayout and its converts become
// local_loads that the dot reads as a descriptor; any other is stored in the
// swizzled layout its converts' ldmatrix plans share.
//
// The schedule written (per loop with marked loads L1..Lk, in body order):
//
//   %buf_j = local_alloc : smem<S x T[...], #ft.shared<...>>     (each Lj)
//   barrier                       the ring may reuse bytes a slower warp still
//                                 reads (an earlier convert's tile, a previous
//                                 loop's ring)
//   for s in 0 .. S-2:            the prologue: iteration s into slot s
//     the address ops of every Lj cloned at iv = lb + s*step,
//     async_copy %buf_j[s] (mask and (iv < ub)) {vec}; async_commit
//   for ... (iv, ..., %slot = 0):
//     %write = %slot == 0 ? S-1 : %slot - 1     (the slot of iteration i+S-1)
//     ... up to the first convert of a marked load:
//     async_wait {pending = S-2}  the group of iteration i is complete
//     fence_async_shared          (only when wgmma reads a ring: cp.async
//                                 wrote through the generic proxy)
//     barrier                     every thread's copies are visible, and every
//                                 thread finished reading slot %write in
//                                 iteration i-1
//     the address ops cloned at iv + (S-1)*step,
//     async_copy %buf_j[%write] ...; async_commit
//     local_load %buf_j[%slot]    in place of each convert_layout of Lj
//     ...
//     yield ..., (%slot + 1 == S ? 0 : %slot + 1)
//   async_wait {pending = 0}      no copy (of the zero-filled stages past the
//                                 end) lands in bytes a later op reuses
//
// With TMA (the target has it, the function asks: attribute tma = 1 or FLEXTILE_TMA=1, and every
// ring of the loop has a tensor box, ir/Ops.def "load {tensor_rank}", and a wgmma layout or an
// ldmatrix layout TMA writes (TensorMaps.h tmaSlotRefusal), the rings are filled by one thread
// instead and synchronized by barriers in shared memory; no cp.async and no CTA barrier are left
// in the loop:
//
//   %buf_j = local_alloc ...; %full, %empty = local_alloc : smem<S x i64[1]>
//   mbarrier_init %full {arrivals = 1}; mbarrier_init %empty; barrier
//   mbarrier_arrive %empty[s] for every s          each slot starts released
//   for s in 0 .. S-2:                              the prologue
//     mbarrier_expect_tx %full[s], exists {bytes}   thread 0 announces the stage's bytes
//     tma_copy %buf_j[s], %full[s], exists, box_j at iv = lb + s*step
//   for ... (iv, ..., %slot, %k):
//     (the boxes' coordinates at iv + (S-1)*step: first, so that a block index read from a list
//      travels during the wait below)
//     mbarrier_wait %empty[%write] {issuer = 1}     thread 0 alone: every thread released the
//                                                   slot in iteration i-1
//     mbarrier_expect_tx, tma_copy ... at iv + (S-1)*step into %write
//     mbarrier_wait %full[%slot]                    every thread: its data has landed
//     local_load %buf_j[%slot] ... (wgmma reads the slot)
//     mbarrier_wait %empty[%slot]; mbarrier_arrive %empty[%slot]   release (below)
//   barrier; mbarrier_inval %full, %empty; barrier
// The parities follow the iteration count k: iteration k's data is fill k/S of its slot. No proxy
// fence: TMA writes through the async proxy that wgmma reads through, ordered by the barrier.
// A loop whose bounds prove at most S-1 iterations (LoopValues.h staticTripBound) has all its
// stages in the prologue: its body issues nothing (no release wait, no expect_tx, no copy).
// (The barrier schedule without TMA, ring_barriers, has every thread copy and arrive.)
//
// Row rings. In a loop filled by TMA, a rank-1 load with a tensor box and a zero `other` that is
// not a dot operand (read by anything: the backward's per-query LSE and delta) gets a ring too:
// unswizzled (SharedLayout::plain), a tma_copy in every stage next to the dot operands' (its bytes
// in the stage's expect_tx), and a local_load in the load's own layout right after the stage's
// `full` wait, so every use of the load must come after the loop's first ring read. Where the loop
// has no TMA, or a use comes earlier, the load is left alone. The lowering reads such a slot
// element by element (codegen/LowerAsync.cpp); a warp-specialized producer issues its copies with
// the others.
//
// One barrier per iteration instead of the staged path's two per operand.
// Groups are committed uniformly (possibly empty), so the wait count is the
// constant S-2. The loads, their converts and their now unused address ops
// are erased. The lowering (codegen/LowerAsync.cpp) turns each op into its
// instruction and follows nothing else: the schedule is the IR's.
//
// Rings past their loop (TMA only; docs/architecture.md). Unshared, every loop owns its rings,
// and the barrier and inval after it part it from the next. Shared (share_rings): the TMA loops of
// a block whose rings fit one set (a loop may use some of its buffers) share it, allocated before
// them — or before the loop of the function's body that holds them, which then carries the slot
// and count — and each loop issues its own first stages into the next slots once released;
// stages past a loop's end arrive on nothing (mbarrier_expect_tx {only_on = 1}).
#include "codegen/AxisInfo.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"
#include "codegen/TensorMaps.h"
#include "codegen/Target.h"
#include "codegen/passes/LoopValues.h"
#include "ir/Passes.h"

#include <functional>
#include <map>
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

// Whether a store or atomic writes only through a pointer parameter that the function's
// `private_params` attribute lists: memory no other parameter reaches (a buffer the template
// allocated for itself, such as the backward's gradients of captured tensors). Such writes cannot
// change what a scalar load of another parameter reads, so the loop still counts as read-only for
// re-reading block indices ahead.
bool writesOnlyPrivateMemory(const Op& op, const ir::Function& f) {
  if (!ir::writesGlobalMemory(op)) return false;
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

// Whether `v`, used in `body`, can be recomputed for another iteration.
bool recomputableInLoop(const ir::Value* v, const ir::Block& body, bool readOnlyLoop, std::set<const ir::Value*>& seen) {
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
    if (!recomputableInLoop(o, body, readOnlyLoop, seen)) return false;
  return true;
}

bool waitsForTheCta(const ir::Block& body, const std::set<const Op*>& except) {
  for (const auto& op : body.ops()) {
    if (except.count(op.get())) continue;
    if (op->kind() == OpKind::Barrier || scratchBytes(*op) > 0) return true;
    for (const auto& r : op->regions())
      if (waitsForTheCta(*r, except)) return true;
  }
  return false;
}

// wgmma's 128-byte swizzled panels (TensorCores.h wgmmaSharedLayout) for an ldmatrix ring whose
// rows are wider than a TMA swizzle spans, when every convert of the ring reads the tile from them
// by ldmatrix; none otherwise. The panels hold the same 16-byte chunks as the row layout, only
// split at 128 bytes, so ldmatrix's eight rows a matrix still fall in eight distinct banks.
std::optional<ir::SharedLayout> ldmatrixPanels(const Op& load, const ir::SharedLayout& rows,
                                               const std::vector<Op*>& converts) {
  const ir::Type& t = load.result()->type();
  if (t.shape().size() != 2) return std::nullopt;
  const ir::SharedLayout panels = wgmmaSharedLayout(t.shape(), rows.order()[0], ir::byteWidth(t.dtype()));
  if (!tmaSlotRefusal(panels, t.shape(), t.dtype()).empty()) return std::nullopt;
  for (const Op* cvt : converts)
    if (cvt->operand(0) == load.result() && !ldmatrixReadPlan(panels, *cvt->result()->type().layout(), t.dtype()))
      return std::nullopt;
  return panels;
}

std::vector<Op*> bodySlice(const std::vector<const ir::Value*>& values, ir::Block& body) {
  std::set<const Op*> need;
  std::vector<const ir::Value*> work = values;
  while (!work.empty()) {
    const ir::Value* v = work.back();
    work.pop_back();
    const Op* d = v->definingOp();
    if (!d || d->parentBlock() != &body || !need.insert(d).second) continue;
    for (const ir::Value* o : d->operands()) work.push_back(o);
  }
  std::vector<Op*> out;
  for (auto& op : body.ops())
    if (need.count(op.get())) out.push_back(op.get());
  return out;
}

void cloneAt(Inserter& at, const std::vector<Op*>& ops, std::map<const ir::Value*, ir::Value*>& clone) {
  auto mapped = [&](ir::Value* v) {
    auto it = clone.find(v);
    return it == clone.end() ? v : it->second;
  };
  for (Op* op : ops) {
    if (clone.count(op->result())) continue;
    std::vector<ir::Value*> operands;
    for (ir::Value* o : op->operands()) operands.push_back(mapped(o));
    std::vector<ir::Type> types;
    for (ir::Value* r : op->results()) types.push_back(r->type());
    Op* copy = at.block.insert(at.pos, at.f.createOp(op->kind(), std::move(operands), std::move(types), op->attrs(), op->loc()));
    for (size_t i = 0; i < op->numResults(); ++i) clone[op->result(i)] = copy->result(i);
  }
}

bool ringBarriersWanted(const ir::Function& f) { return passSwitch(f, "FLEXTILE_RING_BARRIERS", "ring_barriers"); }

bool tmaInStagingLoopsWanted(const ir::Function& f) {
  return passSwitch(f, "FLEXTILE_TMA_IN_STAGING_LOOPS", "tma_in_staging_loops");
}

bool tmaWanted(const ir::Function& f, const Target& target) {
  return target.has(Feature::TensorMemoryAccelerator) && passSwitch(f, "FLEXTILE_TMA", "tma");
}

int64_t asyncCopyWidth(const ir::Layout& from, const ir::SharedLayout& smem, int64_t globalWidth, ir::DType t) {
  const int fast = smem.order()[0];
  int64_t v = std::min({globalWidth, from.contiguousRegisters(fast), smem.vec(), int64_t(16 / ir::byteWidth(t))});
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  for (const ir::Layout::Bases* bases : {&from.laneBases(), &from.warpBases()})
    for (const auto& basis : *bases)
      while (p > 1 && smem.offsetOf(basis) % p != 0) p /= 2;
  // The register groups must also start at multiples of p in shared memory.
  for (int64_t r0 = 0; r0 < from.numRegisters(); r0 += p)
    if (smem.offsetOf(from.regCoord(r0)) % p != 0) return 1;
  return p;
}

namespace {

// The ops of `body` that compute the load's pointer and mask, in body order.
std::vector<Op*> addressSlice(const Op& load, ir::Block& body) {
  std::vector<const ir::Value*> address;
  for (size_t i = 0; i < std::min<size_t>(2, load.numOperands()); ++i) address.push_back(load.operand(i));
  return bodySlice(address, body);
}

// One ring of the schedule: a marked load, its buffer and its copy width.
struct Ring {
  Op* load;
  ir::Value* buffer = nullptr;
  int64_t vec = 0;
  bool wgmma = false;
  bool rows = false;  // a row ring: a boxed vector load of any use, only ever filled by TMA (below)
  std::optional<ir::TensorBox> box;  // the load's tensor box, when the ring is filled by TMA
};

// A loop's rings as the schedule will write them: which loads, the converts that read them, each
// ring's shared layout, and whether TMA fills them.
struct LoopPlan {
  Op* forOp = nullptr;
  std::vector<Ring> rings;
  std::vector<Op*> converts;  // (in body order)
  std::map<const Op*, ir::SharedLayout> layoutOf;
  bool tma = false;
  bool readOnly = false;
};

// What a loop's schedule hands the next loop that shares its rings (shared rings, below): the ring
// buffers (in ring order), the barriers, and the slot and iteration count it ended on.
struct RingChain {
  std::vector<ir::Value*> buffers;
  ir::Value* full = nullptr;
  ir::Value* empty = nullptr;
  ir::Value* slot = nullptr;
  ir::Value* count = nullptr;
};

// A buffer of `slots` mbarriers.
ir::Value* barrierBuffer(Inserter& at, int64_t slots) {
  return at.value(OpKind::LocalAlloc, {},
                  ir::Type::sharedBuffer(ir::DType::I64, slots, std::make_shared<const ir::SharedLayout>(ir::Shape{1}, std::vector<int>{0}, 1, 1, 1, 8)));
}

// The parity of the phase that is fill (or release) n / S of a slot: (n / S) & 1.
ir::Value* phaseParity(Inserter& at, ir::Value* n, int64_t stages) {
  const ir::Type i32(ir::DType::I32);
  ir::Value* phase = at.value(OpKind::Div, {n, at.constant(stages, ir::DType::I32)}, i32);
  return at.value(OpKind::And, {phase, at.constant(1, ir::DType::I32)}, i32);
}

// A loop's (or a group of loops') ring buffers and, `withBarriers`, their `full` and `empty`
// barriers, allocated and initialized before `at`, then a CTA barrier (the
// bytes may be another tile's that a slower warp still reads), then every slot released once up
// front. The slot and count are left to the caller.
RingChain allocateRings(Inserter& at, const LoopPlan& plan, int64_t stages, bool withBarriers) {
  RingChain rings;
  for (const Ring& ring : plan.rings) {
    const ir::Type& t = ring.load->result()->type();
    rings.buffers.push_back(at.value(OpKind::LocalAlloc, {},
                                     ir::Type::sharedBuffer(t.dtype(), stages, std::make_shared<const ir::SharedLayout>(plan.layoutOf.at(ring.load)))));
  }
  if (withBarriers) {
    rings.full = barrierBuffer(at, stages);
    rings.empty = barrierBuffer(at, stages);
    // With TMA, `full` counts thread 0's expect_tx (and the bytes); else every thread's copies.
    at.op(OpKind::MbarrierInit, {rings.full}, {}, plan.tma ? ir::Attrs{{"arrivals", int64_t(1)}} : ir::Attrs{});
    at.op(OpKind::MbarrierInit, {rings.empty}, {});
  }
  at.op(OpKind::Barrier, {}, {});
  if (withBarriers)
    for (int64_t s = 0; s < stages; ++s) at.op(OpKind::MbarrierArrive, {rings.empty, at.constant(s, ir::DType::I32)}, {});
  return rings;
}

// After the last loop that uses them: once every thread has left it, no thread waits on the
// barriers any more; thread 0 invalidates them, and their bytes may then be reused.
void releaseRings(Inserter& at, const RingChain& rings) {
  at.op(OpKind::Barrier, {}, {});
  at.op(OpKind::MbarrierInval, {rings.full}, {});
  at.op(OpKind::MbarrierInval, {rings.empty}, {});
  at.op(OpKind::Barrier, {}, {});
}

// A TMA ring's box operands: base, dims, strides, coords (as the tma_copy takes them).
std::vector<ir::Value*> boxOperands(const Ring& ring) {
  std::vector<ir::Value*> v{ring.box->base};
  for (const auto* part : {&ring.box->dims, &ring.box->strides, &ring.box->coords}) v.insert(v.end(), part->begin(), part->end());
  return v;
}

// The ops of `body` that compute a TMA ring's box operands (the coordinates, and constants the
// body defines), in body order.
std::vector<Op*> boxSlice(const Ring& ring, ir::Block& body) {
  const std::vector<ir::Value*> operands = boxOperands(ring);
  return bodySlice(std::vector<const ir::Value*>(operands.begin(), operands.end()), body);
}

// TMA: thread 0 announces the stage's bytes on full[slot] and issues every ring's box at
// induction value `iv` into `slot` (nothing past the loop's end: the announcement is then of 0
// bytes, and no copy is issued).
// `whenSlotFree` (the loop's wait for the slot's release) comes after the coordinates: a block
// index read from a list then travels while the issuer waits, instead of after it.
// `noPhantom`: a stage past the end does not arrive on `full` at all (mbarrier_expect_tx
// {only_on = 1}): with shared rings a later loop fills that slot and phase.
void issueStageTma(Inserter& at, ir::Block& body, std::vector<Ring>& rings, ir::Value* iv, ir::Value* ub,
                   ir::Value* slot, ir::Value* full, const std::function<void()>& whenSlotFree = {},
                   bool noPhantom = false) {
  std::map<const ir::Value*, ir::Value*> clone{{body.arg(0), iv}};
  ir::Value* exists = at.value(OpKind::Cmp, {iv, ub}, ir::Type(ir::DType::I1), {{"pred", std::string("lt")}});
  int64_t bytes = 0;
  for (Ring& ring : rings) {
    cloneAt(at, boxSlice(ring, body), clone);
    bytes += ring.load->result()->type().numElements() * ir::byteWidth(ring.load->result()->type().dtype());
  }
  if (whenSlotFree) whenSlotFree();
  ir::Attrs txAttrs{{"bytes", bytes}};
  if (noPhantom) txAttrs["only_on"] = int64_t(1);
  at.op(OpKind::MbarrierExpectTx, {full, slot, exists}, {}, std::move(txAttrs));
  for (Ring& ring : rings) {
    std::vector<ir::Value*> operands{ring.buffer, slot, full, slot, exists};
    for (ir::Value* v : boxOperands(ring)) operands.push_back(clone.count(v) ? clone.at(v) : v);
    at.op(OpKind::TmaCopy, std::move(operands), {});
  }
}

// Clones the address ops of every ring's load at induction value `iv` and issues their copies
// into `slot`, then commits the group (the prologue's stages and each iteration's issue).
void issueStage(Inserter& at, ir::Block& body, std::vector<Ring>& rings, ir::Value* iv, ir::Value* ub,
                ir::Value* slot) {
  std::map<const ir::Value*, ir::Value*> clone{{body.arg(0), iv}};
  auto mapped = [&](ir::Value* v) {
    auto it = clone.find(v);
    return it == clone.end() ? v : it->second;
  };
  ir::Value* exists = at.value(OpKind::Cmp, {iv, ub}, ir::Type(ir::DType::I1), {{"pred", std::string("lt")}});
  for (Ring& ring : rings) {
    cloneAt(at, addressSlice(*ring.load, body), clone);
    const ir::Type& ptr = ring.load->operand(0)->type();
    ir::Type maskType = ir::Type(ir::DType::I1, ptr.shape()).withLayout(ptr.layout());
    ir::Value* on = at.value(OpKind::Splat, {exists}, maskType);
    if (ring.load->numOperands() >= 2) on = at.value(OpKind::And, {mapped(ring.load->operand(1)), on}, maskType);
    at.op(OpKind::AsyncCopy, {ring.buffer, slot, mapped(ring.load->operand(0)), on}, {}, {{"vec", ring.vec}});
  }
  at.op(OpKind::AsyncCommit, {}, {});
}

// The loop's plan, or none when it has no loads to pipeline.
std::optional<LoopPlan> planLoop(ir::Function& f, Op& forOp, const std::map<const Op*, int64_t>& globalWidth,
                                 const Target& target, bool readOnlyLoop) {
  ir::Block& body = forOp.region(0);
  std::vector<Ring> rings;
  for (auto& op : body.ops())
    if (op->kind() == OpKind::Load && op->hasAttr("async_stages"))
      rings.push_back({op.get(), nullptr, 0, false, op->hasAttr("ring_rows")});
  if (rings.empty()) return std::nullopt;
  // Loads whose slot a wgmma reads take its layout; the converts that are those dots' operands.
  std::map<const Op*, ir::SharedLayout> wgmmaLayouts;
  std::set<const Op*> wgmmaConverts;
  for (auto& op : body.ops())
    if (op->kind() == OpKind::Dot)
      if (auto w = wgmmaPlan(*op, target)) {
        wgmmaLayouts.emplace(w->load, w->b.smem);
        const Op* first = op->operand(1)->definingOp();
        wgmmaConverts.insert(first->kind() == OpKind::Trans ? first->operand(0)->definingOp() : first);
      }
  // Each ring's layout, and the converts that read it (in body order).
  std::vector<Op*> converts;
  std::map<const Op*, Ring*> ringOfLoad;
  for (Ring& ring : rings) ringOfLoad[ring.load] = &ring;
  std::map<const Op*, ir::SharedLayout> layoutOf;
  for (auto& op : body.ops()) {
    if (op->kind() != OpKind::ConvertLayout) continue;
    auto it = ringOfLoad.find(op->operand(0)->definingOp());
    if (it == ringOfLoad.end()) continue;
    Ring& ring = *it->second;
    const bool wgmma = wgmmaLayouts.count(ring.load) != 0;
    if (wgmma != (wgmmaConverts.count(op.get()) != 0))
      throw Error(op->describe() + ": reads a ring tile that another product reads with wgmma, but its own product "
                  "cannot run on wgmma (one slot cannot hold both layouts)", ErrorKind::Internal);
    ring.wgmma = wgmma;
    if (!layoutOf.count(ring.load)) {
      const ir::Layout& from = *ring.load->result()->type().layout();
      const ir::DType t = ring.load->result()->type().dtype();
      std::optional<ir::SharedLayout> smem;
      if (wgmma) smem = wgmmaLayouts.at(ring.load);
      else if (auto plan = ldmatrixPlan(from, *op->result()->type().layout(), t)) smem = plan->smem;
      if (!smem) throw Error(op->describe() + ": is marked for pipelining but ldmatrix cannot read its layout", ErrorKind::Internal);
      ring.vec = asyncCopyWidth(from, *smem, globalWidth.at(ring.load), t);
      if (ring.vec < 2)
        throw Error(ring.load->describe() + ": is marked for pipelining but its accesses are narrower than 4 bytes",
                    ErrorKind::Internal);
      layoutOf.emplace(ring.load, *smem);
    }
    converts.push_back(op.get());
  }
  for (Ring& ring : rings)
    if (!ring.rows && !layoutOf.count(ring.load))
      throw Error(ring.load->describe() + ": is marked for pipelining but no convert_layout reads it", ErrorKind::Internal);

  // TMA fills every ring of the loop, or none: the stage's `full` barrier then counts one arrival
  // (thread 0's expect_tx) and the bytes. Each ring must have a tensor box whose coordinates can
  // be recomputed ahead, and a layout TMA writes (128-, 64- or 32-byte swizzled panels: wgmma's, or
  // an ldmatrix ring's such as a GEMM's A).
  // And the body must not wait for the CTA (a layout conversion or reduction through shared
  // memory): such a loop computed wrong rows on the H200 with TMA rings
  // (FlexAttentionGpu.WgmmaInLoopsWithSharedConversions, 2026-12-02, not understood yet), so it
  // keeps the cp.async ring and its barrier. That run predates warp specialization, where those
  // barriers are the consumers' own and the producer alone issues the copies: opt-in there
  // (tmaInStagingLoopsWanted) until a GPU run shows such a loop right.
  const bool staging = waitsForTheCta(body, std::set<const Op*>(converts.begin(), converts.end()));
  bool tma = tmaWanted(f, target) &&
             (!staging || (tmaInStagingLoopsWanted(f) && warpSpecializationWanted(f)));
  // A row ring rides along with the dot operands' TMA stages: it is read from the slot right after
  // the stage's wait, so every use of its load must come after the first ring convert; a loop
  // without TMA (or whose row loads are used earlier) keeps those loads as they are.
  auto position = [&](const Op* op) { return std::distance(body.ops().begin(), body.find(op)); };
  auto rowRingFits = [&](const Ring& ring) {
    if (converts.empty() || !tma) return false;
    // An unswizzled TMA destination starts at a multiple of 128 bytes, so every slot must be one
    // (16 f32 rows, 64 bytes, failed to lower: FlexAttentionBackwardGpu, 2026-12-03).
    const ir::Type& t = ring.load->result()->type();
    if (t.numElements() * ir::byteWidth(t.dtype()) % kTmaPlainAlignment != 0) return false;
    const auto first = position(converts.front());
    bool fits = true;
    std::function<void(const ir::Block&, const Op*)> visit = [&](const ir::Block& blk, const Op* top) {
      for (const auto& user : blk.ops()) {
        const Op* at = top ? top : user.get();
        for (const ir::Value* o : user->operands())
          if (o == ring.load->result()) fits = fits && position(at) > first;
        for (const auto& r : user->regions()) visit(*r, at);
      }
    };
    visit(body, nullptr);
    return fits;
  };
  // Leaves the row rings `drop` picks as the loads they were.
  auto dropRowRings = [&](const std::function<bool(const Ring&)>& drop) {
    std::erase_if(rings, [&](const Ring& ring) {
      if (!ring.rows || !drop(ring)) return false;
      ring.load->attrs().erase("async_stages");
      ring.load->attrs().erase("ring_rows");
      return true;
    });
  };
  dropRowRings([&](const Ring& ring) { return !rowRingFits(ring); });
  if (rings.empty()) return std::nullopt;
  std::map<const Op*, ir::SharedLayout> inPanels;  // ldmatrix rings TMA can fill only in panels
  for (Ring& ring : rings) {
    ring.box = ir::tensorBoxOf(*ring.load);
    std::set<const ir::Value*> seen;
    bool coordsOk = ring.box.has_value();
    if (coordsOk)
      for (const ir::Value* v : boxOperands(ring)) coordsOk = coordsOk && recomputableInLoop(v, body, readOnlyLoop, seen);
    // A ring read by ldmatrix (not wgmma) qualifies when its layout is one TMA writes (the GEMM's
    // A: 128-byte rows in the 128-byte swizzle), or when ldmatrix reads the tile from 128-byte
    // panels as well (rows wider than TMA's swizzle span: the decode's K and V at D = 128).
    const ir::Type& t = ring.load->result()->type();
    bool writable = ring.wgmma || ring.rows || tmaSlotRefusal(layoutOf.at(ring.load), t.shape(), t.dtype()).empty();
    if (!writable && tma && coordsOk)
      if (auto panels = ldmatrixPanels(*ring.load, layoutOf.at(ring.load), converts)) {
        inPanels.emplace(ring.load, *panels);
        writable = true;
      }
    // Each slot must start where TMA may write its layout (a small swizzled tile, 16 x 16 f16 in
    // 512 bytes, would put every other slot off the 1024-byte swizzle pattern). A row ring's
    // plain layout is checked in rowRingFits.
    if (writable && !ring.rows) {
      const auto panels = inPanels.find(ring.load);
      const ir::SharedLayout& slot = panels != inPanels.end() ? panels->second : layoutOf.at(ring.load);
      writable = t.numElements() * ir::byteWidth(t.dtype()) % tmaSlotAlignment(slot) == 0;
    }
    tma = tma && coordsOk && writable;
  }
  if (tma)
    for (auto& [load, panels] : inPanels) layoutOf.insert_or_assign(load, panels);
  if (!tma) {
    dropRowRings([](const Ring&) { return true; });
    for (Ring& ring : rings) ring.box.reset();
  }
  for (Ring& ring : rings)
    if (ring.rows) {
      const ir::Type& t = ring.load->result()->type();
      layoutOf.emplace(ring.load, ir::SharedLayout::plain(t.shape(), {0}, ir::byteWidth(t.dtype())));
    }
  return LoopPlan{&forOp, std::move(rings), std::move(converts), std::move(layoutOf), tma, readOnlyLoop};
}

// How a loop's schedule meets its neighbours' (shared rings, below). By default (all unset) the
// loop owns its rings: allocated, initialized and prologued before it, invalidated after.
struct ScheduleLinks {
  const RingChain* from = nullptr;  // the rings, barriers, slot and count this loop continues
  bool keepAlive = false;           // a later loop continues the rings: no barrier or inval after
  const std::vector<size_t>* buffers = nullptr;  // which of `from`'s buffers each ring is (else the same order)
};

// Writes the loop's schedule, linked to its neighbours by `links`; returns its rings, barriers and
// the slot and count they end on, for a loop that continues them.
RingChain writeSchedule(ir::Function& f, LoopPlan& plan, int64_t stages, const Target& target, const ScheduleLinks& links) {
  // Shared rings: a stage past a loop's end must not arrive on `full` (the next loop's prologue
  // fills that slot and phase), and each of this loop's first stages waits for its slot's release.
  const RingChain* from = links.from;
  const bool shared = from != nullptr;
  Op& forOp = *plan.forOp;
  ir::Block& body = forOp.region(0);
  std::vector<Ring>& rings = plan.rings;
  const std::vector<Op*>& converts = plan.converts;
  const bool tma = plan.tma;
  std::map<const Op*, Ring*> ringOfLoad;
  for (Ring& ring : rings) ringOfLoad[ring.load] = &ring;

  ir::Block& outer = *forOp.parentBlock();
  const ir::Location loc = forOp.loc();
  const ir::Type ivType = body.arg(0)->type();
  ir::Value* lb = forOp.operand(0);
  ir::Value* ub = forOp.operand(1);
  ir::Value* step = forOp.operand(2);
  Inserter before{f, outer, outer.find(&forOp), loc};  // (the verifier gives lb, ub, step and iv one dtype)
  // With barriers in shared memory (ringBarriersWanted): `full[s]` completes when every thread's
  // copies into slot s have landed, `empty[s]` when every thread is done reading slot s.
  // With TMA, `full[s]` counts thread 0's expect_tx and the bytes of the stage's copies instead.
  const bool withBarriers = tma || ringBarriersWanted(f);
  const RingChain own = from ? *from : allocateRings(before, plan, stages, withBarriers);
  for (size_t i = 0; i < rings.size(); ++i) rings[i].buffer = own.buffers[links.buffers ? links.buffers->at(i) : i];
  ir::Value* full = own.full;
  ir::Value* empty = own.empty;
  const ir::Type i32(ir::DType::I32);
  for (int64_t s = 0; s + 1 < stages; ++s) {
    ir::Value* iv = before.value(OpKind::Add, {lb, before.value(OpKind::Mul, {step, before.constant(s, ivType.dtype())}, ivType)}, ivType);
    if (tma && from) {
      // Stage count+s into slot (slot+s) mod S, once the iteration that read it last released it.
      ir::Value* g = before.value(OpKind::Add, {from->count, before.constant(s, ir::DType::I32)}, i32);
      ir::Value* raw = before.value(OpKind::Add, {from->slot, before.constant(s, ir::DType::I32)}, i32);
      ir::Value* wraps = before.value(OpKind::Cmp, {raw, before.constant(stages, ir::DType::I32)}, ir::Type(ir::DType::I1),
                                      {{"pred", std::string("ge")}});
      ir::Value* slotS = before.value(OpKind::Select, {wraps, before.value(OpKind::Sub, {raw, before.constant(stages, ir::DType::I32)}, i32), raw}, i32);
      ir::Value* parity = phaseParity(before, g, stages);
      issueStageTma(before, body, rings, iv, ub, slotS, full,
                    [&] { before.op(OpKind::MbarrierWait, {empty, slotS, parity}, {}, {{"issuer", int64_t(1)}}); }, true);
      continue;
    }
    if (tma) {
      issueStageTma(before, body, rings, iv, ub, before.constant(s, ir::DType::I32), full);
      continue;
    }
    issueStage(before, body, rings, iv, ub, before.constant(s, ir::DType::I32));
    if (withBarriers) before.op(OpKind::AsyncCopyArrive, {full, before.constant(s, ir::DType::I32)}, {});
  }

  // The slot read in iteration i (carried), and the one its issue writes.
  forOp.addOperand(from ? from->slot : before.constant(0, ir::DType::I32));
  ir::Value* slot = body.addArg(i32, "slot");
  forOp.addResult(i32);
  Inserter top{f, body, body.ops().begin(), loc};
  ir::Value* isFirst = top.value(OpKind::Cmp, {slot, top.constant(0, ir::DType::I32)}, ir::Type(ir::DType::I1), {{"pred", std::string("eq")}});
  ir::Value* writeSlot = top.value(
      OpKind::Select, {isFirst, top.constant(stages - 1, ir::DType::I32), top.value(OpKind::Sub, {slot, top.constant(1, ir::DType::I32)}, i32)}, i32);

  // The iteration count k (for the barriers' phase parities: the data of iteration k is the k/S-th
  // fill of its slot, and the slot it overwrites was released for the (k+S-1)/S-th time).
  ir::Value* count = nullptr;
  if (withBarriers) {
    forOp.addOperand(from ? from->count : before.constant(0, ir::DType::I32));
    count = body.addArg(i32, "iteration");
    forOp.addResult(i32);
  }
  Inserter issue{f, body, body.find(converts.front()), loc};
  // The data of iteration k is the k/S-th fill of its slot; the slot iteration k refills was
  // released for the (k+S-1)/S-th time in iteration k-1.
  auto waitFull = [&] { issue.op(OpKind::MbarrierWait, {full, slot, phaseParity(issue, count, stages)}, {}); };
  auto waitReleased = [&](ir::Attrs attrs) {
    ir::Value* released = issue.value(OpKind::Add, {count, issue.constant(stages - 1, ir::DType::I32)}, i32);
    issue.op(OpKind::MbarrierWait, {empty, writeSlot, phaseParity(issue, released, stages)}, {}, std::move(attrs));
  };
  auto ahead = [&] {  // the induction value of iteration i+S-1, whose copies this iteration issues
    return issue.value(OpKind::Add, {body.arg(0), issue.value(OpKind::Mul, {step, issue.constant(stages - 1, ivType.dtype())}, ivType)}, ivType);
  };
  // A loop of at most S - 1 iterations (staticTripBound) had every stage issued before it: its
  // refills would all lie past its end. With TMA they are left out (no copy, and with shared rings
  // no arrival either; without sharing the rings die with the loop): the peeled walks' one-step
  // loops then cost the producer no issue path.
  const std::optional<int64_t> trips = staticTripBound(forOp);
  const bool refills = !(tma && trips && *trips <= stages - 1);
  if (tma) {
    // Thread 0 alone waits until every thread has released slot %write (in iteration i-1), then
    // refills it; the other threads only wait for their data. Issued before this iteration's
    // wait, so the copy has the longest lead; the copies' coordinates before the release wait.
    // (H200, 2026-12-03: the backward without a mask 416.4 against 400.6 TFLOP/s the other way,
    // its dq's producer reading each block index from the list.)
    if (refills)
      issueStageTma(issue, body, rings, ahead(), ub, writeSlot, full, [&] { waitReleased({{"issuer", int64_t(1)}}); },
                    shared);
    waitFull();
  } else {
    if (withBarriers)
      waitFull();
    else
      issue.op(OpKind::AsyncWait, {}, {}, {{"pending", stages - 2}});
    if (std::any_of(rings.begin(), rings.end(), [](const Ring& r) { return r.wgmma; })) issue.op(OpKind::FenceAsyncShared, {}, {});
    if (withBarriers)
      waitReleased({});
    else
      issue.op(OpKind::Barrier, {}, {});
    issueStage(issue, body, rings, ahead(), ub, writeSlot);
    if (withBarriers) issue.op(OpKind::AsyncCopyArrive, {full, writeSlot}, {});
  }

  for (Ring& ring : rings)
    if (ring.rows) f.replaceAllUsesWith(ring.load->result(), issue.value(OpKind::LocalLoad, {ring.buffer, slot}, ring.load->result()->type()));
  for (Op* cvt : converts) {
    Ring& ring = *ringOfLoad.at(cvt->operand(0)->definingOp());
    Inserter at{f, body, body.find(cvt), cvt->loc()};
    ir::Value* tile = at.value(OpKind::LocalLoad, {ring.buffer, slot}, cvt->result()->type());
    f.replaceAllUsesWith(cvt->result(), tile);
    body.erase(cvt);
  }
  Op* yield = body.terminator();
  Inserter end{f, body, body.find(yield), loc};
  ir::Value* nextSlot = end.value(OpKind::Add, {slot, end.constant(1, ir::DType::I32)}, i32);
  ir::Value* wraps = end.value(OpKind::Cmp, {nextSlot, end.constant(stages, ir::DType::I32)}, ir::Type(ir::DType::I1), {{"pred", std::string("eq")}});
  yield->addOperand(end.value(OpKind::Select, {wraps, end.constant(0, ir::DType::I32), nextSlot}, i32));
  if (withBarriers) {
    // Every read of this iteration's slot is done here (the wgmma pass waits for the groups
    // before an arrive): release it. Each thread first waits for the slot's previous release (of
    // iteration i-S, or the one up front), which has completed (the fill it read came after it),
    // so that no thread arrives on a barrier twice without a wait between: compute-sanitizer's
    // synccheck reports that as a missing wait, and the wait returns at its first probe.
    end.op(OpKind::MbarrierWait, {empty, slot, phaseParity(end, count, stages)}, {});
    end.op(OpKind::MbarrierArrive, {empty, slot}, {});
    yield->addOperand(end.value(OpKind::Add, {count, end.constant(1, ir::DType::I32)}, i32));
  }

  RingChain chain = own;
  chain.slot = forOp.result(forOp.numResults() - (withBarriers ? 2 : 1));
  chain.count = withBarriers ? forOp.result(forOp.numResults() - 1) : nullptr;

  Inserter after{f, outer, std::next(outer.find(&forOp)), loc};
  if (!tma) after.op(OpKind::AsyncWait, {}, {}, {{"pending", int64_t(0)}});  // (every TMA copy issued was waited for)
  if (withBarriers && !links.keepAlive) releaseRings(after, chain);

  // The loads; their address ops, now unused, go with the function's dead code (ir::dce, after
  // every loop is rewritten).
  for (Ring& ring : rings) body.erase(ring.load);
  return chain;
}

}  // namespace

std::optional<int64_t> scalarConstant(const ir::Value* v) {
  const Op* d = v->definingOp();
  if (!d || d->kind() != OpKind::Constant || v->type().isTile()) return std::nullopt;
  const auto* x = std::get_if<int64_t>(&d->attrs().at("value"));
  return x ? std::optional<int64_t>(*x) : std::nullopt;
}

namespace {
// The most `ub` can exceed `lb` by, where the ops defining `ub` prove it.
std::optional<int64_t> distanceBound(const ir::Value* ub, const ir::Value* lb) {
  if (ub == lb) return 0;
  if (auto u = scalarConstant(ub), l = scalarConstant(lb); u && l) return *u - *l;
  const Op* d = ub->definingOp();
  if (!d || ub->type().isTile()) return std::nullopt;
  switch (d->kind()) {
    case OpKind::Add:
      for (int i = 0; i < 2; ++i)
        if (d->operand(size_t(i)) == lb)
          if (auto k = scalarConstant(d->operand(size_t(1 - i)))) return *k;
      return std::nullopt;
    case OpKind::Minimum: {
      auto a = distanceBound(d->operand(0), lb), b = distanceBound(d->operand(1), lb);
      if (a && b) return std::min(*a, *b);
      return a ? a : b;
    }
    case OpKind::Select: {
      auto a = distanceBound(d->operand(1), lb), b = distanceBound(d->operand(2), lb);
      if (a && b) return std::max(*a, *b);
      return std::nullopt;
    }
    default: return std::nullopt;
  }
}
}  // namespace

std::optional<int64_t> staticTripBound(const Op& forOp) {
  const auto step = scalarConstant(forOp.operand(2));
  if (!step || *step <= 0) return std::nullopt;
  const auto d = distanceBound(forOp.operand(1), forOp.operand(0));
  if (!d) return std::nullopt;
  return *d <= 0 ? 0 : (*d + *step - 1) / *step;
}

bool shareRingsWanted(const ir::Function& f) { return passSwitch(f, "FLEXTILE_SHARE_RINGS", "share_rings"); }

namespace {

// Which of `set`'s rings each ring of `loop` can be (an index per ring of `loop`, each used once):
// the same tile type, shared layout and kind (dot operand or row ring, wgmma's or ldmatrix's), both
// filled by TMA; none where some ring has no free match. A loop may use fewer rings than the set: a
// skewed walk's peeled first and last steps stage K alone and V alone (attention_templates/
// FlexAttentionForward.cpp), and their stages leave the other buffers' slots unwritten.
std::optional<std::vector<size_t>> ringsInto(const LoopPlan& set, const LoopPlan& loop) {
  if (!set.tma || !loop.tma || loop.rings.size() > set.rings.size()) return std::nullopt;
  std::vector<size_t> into;
  std::vector<bool> taken(set.rings.size(), false);
  for (const Ring& y : loop.rings) {
    size_t i = 0;
    for (; i < set.rings.size(); ++i) {
      const Ring& x = set.rings[i];
      if (!taken[i] && x.rows == y.rows && x.wgmma == y.wgmma && x.load->result()->type() == y.load->result()->type() &&
          set.layoutOf.at(x.load) == loop.layoutOf.at(y.load))
        break;
    }
    if (i == set.rings.size()) return std::nullopt;
    taken[i] = true;
    into.push_back(i);
  }
  return into;
}

// Loops that share one set of rings (shared rings, below), in program order, and the loop around
// them that carries the rings' slot and count from one of its iterations to the next, if any.
struct SharedRings {
  std::vector<size_t> loops;  // indices into the plans
  Op* outer = nullptr;
  size_t widest = 0;                      // the loop whose rings are the set (the most rings)
  std::vector<std::vector<size_t>> into;  // per loop: ringsInto(the widest, it)
};

// The TMA loops of one block whose rings fit one set (ringsInto the widest loop's): two or more
// side by side (the forward's, dkdv's and dq's two walks, a peeled skewed walk's three loops), or
// any number directly in the body of a loop of the function's body (the persistent forward's tile
// loop, whose iterations then pass the rings on to each other).
std::vector<SharedRings> sharedRingGroups(const ir::Function& f, const std::vector<std::optional<LoopPlan>>& plans) {
  std::map<const ir::Block*, std::vector<size_t>> byBlock;
  std::vector<const ir::Block*> order;
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i] || !plans[i]->tma) continue;
    const ir::Block* block = plans[i]->forOp->parentBlock();
    if (!byBlock.count(block)) order.push_back(block);
    byBlock[block].push_back(i);
  }
  std::vector<SharedRings> groups;
  for (const ir::Block* block : order) {
    const std::vector<size_t>& loops = byBlock.at(block);
    SharedRings group{loops, nullptr, loops.front(), {}};
    for (size_t i : loops)
      if (plans[i]->rings.size() > plans[group.widest]->rings.size()) group.widest = i;
    bool fit = true;
    for (size_t i : loops) {
      std::optional<std::vector<size_t>> into = ringsInto(*plans[group.widest], *plans[i]);
      if (!into) fit = false;
      else group.into.push_back(std::move(*into));
    }
    if (!fit) continue;
    Op* owner = block->parentOp();
    const bool carried = owner && owner->kind() == OpKind::For && owner->parentBlock() == &f.body();
    if (carried) group.outer = owner;
    if (carried || (loops.size() >= 2 && !owner)) groups.push_back(std::move(group));
  }
  return groups;
}

// Shared rings (opt-in: share_rings = 1, FLEXTILE_SHARE_RINGS=1): one set of ring buffers and
// barriers for the group, allocated and initialized once before it and invalidated once after it.
// Each loop still issues its own first stages, but into the slots that follow the previous loop's
// last (the slot and iteration count carried from loop to loop, and around the carrying loop),
// each after that slot's release. No CTA barrier parts the loops, so a producer warpgroup issues
// the next loop's first stages as soon as the consumers release slots near the end of the
// current one (and, in the persistent forward, the next tile's during this tile's epilogue). A
// stage past a loop's end arrives on nothing (mbarrier_expect_tx {only_on = 1}): the next loop's
// stage takes that slot and phase.
void writeSharedRings(ir::Function& f, std::vector<std::optional<LoopPlan>>& plans, const SharedRings& group,
                      int64_t stages, const Target& target) {
  Op* anchor = group.outer ? group.outer : plans[group.loops.front()]->forOp;
  ir::Block& home = *anchor->parentBlock();
  const ir::Location loc = anchor->loc();
  Inserter at{f, home, home.find(anchor), loc};
  RingChain chain = allocateRings(at, *plans[group.widest], stages, true);
  chain.slot = at.constant(0, ir::DType::I32);
  chain.count = at.constant(0, ir::DType::I32);
  const ir::Type i32(ir::DType::I32);
  if (group.outer) {
    ir::Block& body = group.outer->region(0);
    group.outer->addOperand(chain.slot);
    group.outer->addOperand(chain.count);
    chain.slot = body.addArg(i32, "ring_slot");
    chain.count = body.addArg(i32, "ring_count");
    group.outer->addResult(i32);
    group.outer->addResult(i32);
  }
  for (size_t k = 0; k < group.loops.size(); ++k) {
    ScheduleLinks links;
    links.from = &chain;
    links.keepAlive = group.outer || k + 1 < group.loops.size();
    links.buffers = &group.into[k];
    const RingChain after = writeSchedule(f, *plans[group.loops[k]], stages, target, links);
    chain.slot = after.slot;
    chain.count = after.count;
  }
  if (group.outer) {
    group.outer->region(0).terminator()->addOperand(chain.slot);
    group.outer->region(0).terminator()->addOperand(chain.count);
    Inserter end{f, home, std::next(home.find(group.outer)), loc};
    releaseRings(end, chain);
  }
}

}  // namespace

void pipelineLoads(ir::Function& f, const Target& target) {
  const int64_t stages = f.intAttrOr("num_stages", 1);
  if (stages < 1 || stages > 4)
    throw Error("function '" + f.name() + "': num_stages must be 1, 2, 3 or 4, got " + std::to_string(stages));
  if (stages == 1) return;
  AxisInfoAnalysis axis(f);
  std::map<const Op*, int64_t> globalWidth;
  std::vector<Op*> loops;
  std::map<const Op*, bool> readOnly;
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
    // The pointer parameters the loop writes through (private ones aside); null: a write whose
    // pointer comes from elsewhere (anything may be written).
    std::set<const ir::Value*> written;
    std::function<void(ir::Block&)> findStores = [&](ir::Block& blk) {
      for (auto& op : blk.ops()) {
        if (op->hasTrait(ir::kSideEffect) && !writesOnlyPrivateMemory(*op, f)) {
          readOnlyLoop = false;
          if (ir::writesGlobalMemory(*op))
            written.insert(ir::pointerBase(op->operand(0)));
        }
        for (auto& r : op->regions()) findStores(*r);
      }
    };
    findStores(body);
    for (auto& opPtr : body.ops()) {
      Op& load = *opPtr;
      if (load.kind() != OpKind::Load || !load.result()->type().isTile() || !load.result()->type().hasLayout()) continue;
      if (load.hasAttr("no_ring")) continue;  // dsl::unpipelined: the template keeps it a plain load
      const auto& us = users[load.result()];
      if (us.empty()) continue;
      // Read iterations ahead, the tile must not be written by the iterations between: no store
      // or atomic of the loop goes through the load's parameter, or through a pointer of unknown
      // origin. (Distinct pointer parameters are taken not to overlap.)
      const ir::Value* base = ir::pointerBase(load.operand(0));
      if (!base || written.count(base) || written.count(nullptr)) continue;
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
      if (!readable) {
        // A row ring (TMA only, decided per loop in writeSchedule): a vector the template named as
        // a box, such as the backward's per-query LSE and delta, whatever reads it. TMA zero-fills
        // what lies outside the box, so its `other` must be zero too.
        const ir::Type& rt = load.result()->type();
        if (rt.shape().size() == 1 && ir::tensorBoxOf(load) &&
            (ir::operandsBeforeBox(load) < 3 || isZeroConstant(load.operand(2)))) {
          load.setAttr("async_stages", stages);
          load.setAttr("ring_rows", int64_t(1));
        }
        continue;
      }
      if (load.numOperands() >= 3 && !isZeroConstant(load.operand(2))) continue;
      const int64_t width = memoryAccessWidth(load, axis).width;
      if (asyncCopyWidth(*load.result()->type().layout(), plan->smem, width, t) < 2) continue;
      std::set<const ir::Value*> seen;
      bool ok = true;
      for (size_t i = 0; i < std::min<size_t>(2, load.numOperands()); ++i)
        ok = ok && recomputableInLoop(load.operand(i), body, readOnlyLoop, seen);
      if (!ok) continue;
      load.setAttr("async_stages", stages);
      globalWidth[&load] = width;
    }
    loops.push_back(&forOp);
    readOnly[&forOp] = readOnlyLoop;
  });
  std::vector<std::optional<LoopPlan>> plans;
  for (Op* forOp : loops) plans.push_back(planLoop(f, *forOp, globalWidth, target, readOnly.at(forOp)));
  bool rewritten = false;
  std::set<size_t> done;
  if (shareRingsWanted(f))
    for (const SharedRings& group : sharedRingGroups(f, plans)) {
      writeSharedRings(f, plans, group, stages, target);
      done.insert(group.loops.begin(), group.loops.end());
      rewritten = true;
    }
  for (size_t i = 0; i < plans.size(); ++i) {
    if (!plans[i] || done.count(i)) continue;
    writeSchedule(f, *plans[i], stages, target, {});
    rewritten = true;
  }
  if (rewritten) ir::dce(f);
}

ir::Pass pipelinePass(const Target& target) {
  return {"pipeline", [target](ir::Function& f) { pipelineLoads(f, target); }};
}

}  // namespace flextile::codegen
