// Warp specialization (pass "warp-specialize"): a producer warpgroup of its own fills the TMA rings
// that the pipeline pass wrote, and the program's num_warps warps become consumers that only wait
// for their data, compute and release the slots (FlashAttention-3's producer/consumer split).
//
// Before it, thread 0 of the consumers issued the copies itself: its warpgroup stopped at every
// refill to wait until the slowest warp had released the slot, so the two consumer warpgroups ran
// in step. After it, the producer waits on the `empty` barriers and issues the copies while the
// consumers compute, and the consumers take the registers the producer gives back (setmaxnreg).
//
// The pass rewrites no op; it marks which warps run each one, and the lowering emits the function
// twice, once per role, behind a branch on the thread index (codegen/LowerToLLVM.cpp):
//
//   function attribute producer_warps = 4    the launch adds a warpgroup (threads num_warps * 32 ..
//                                            num_warps * 32 + 127); every layout keeps num_warps
//   op attribute ws = "producer"             the ring's issuer ops: tma_copy, mbarrier_expect_tx and
//                                            mbarrier_wait {issuer = 1}; only the producer runs them
//   op attribute ws = "both"                 what the producer needs to run them: the scalar ops
//                                            their operands come from (bounds, block indices read
//                                            from the BlockMask lists, coordinates, slots and
//                                            parities), the loops around them, their yields, the
//                                            return, the CTA barriers both roles meet at, and a
//                                            grid_dependency wait ahead of the first copy
//   op attribute ws = "all"                  the rings' barrier buffers and their mbarrier_init, moved
//                                            to the top of the function and followed by a barrier
//                                            there: every thread runs them before the roles part
//   for attribute producer_carried = [i..]   the carried values the producer's copy of a loop keeps
//   (no ws attribute)                        only the consumers run it
//
// The producer meets the consumers at two CTA barriers per ring (bar.sync 0 over all threads): the
// first `barrier` after the ring's mbarrier_init (the barriers are initialized, and the bytes the
// ring reuses are no longer read) and the last `barrier` before its mbarrier_inval (no copy is in
// flight and no producer thread waits on the barriers any more). Every other barrier, those of the
// IR and those the lowering adds around shared-memory scratch, is the consumers' alone: named
// barrier 3 over num_warps * 32 threads. The `empty` barriers still count the consumers' arrivals
// (num_warps * 32), the `full` ones the producer's expect_tx.
//
// The producer's ops are scalar and read-only: what it recomputes (a block index loaded from a
// list, a coordinate) the consumers compute too, from the same memory, which nothing in the program
// writes before the producer reads it (the pipeline pass asked the same of the loads it re-reads
// iterations ahead). A function whose issuer ops need anything else (a tile, a store, a loop-carried
// tile) is left as it was.
//
// Runs last (after "pingpong": the warpgroup turns are the consumers' business). Opt-in: function
// attribute warp_specialize = 1, or FLEXTILE_WARP_SPECIALIZE=1 (=0 turns it off everywhere); needs
// TMA and setmaxnreg (sm_90a) and 4 or 8 consumer warps.
#include "codegen/Passes.h"
#include "codegen/Target.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

bool issuesForTheRing(const Op& op) {
  switch (op.kind()) {
    case OpKind::TmaCopy:
    case OpKind::MbarrierExpectTx: return true;
    case OpKind::MbarrierWait: return op.hasAttr("issuer") && op.intAttr("issuer") != 0;
    default: return false;
  }
}

WarpRole warpRole(const Op& op) {
  auto it = op.attrs().find("ws");
  if (it == op.attrs().end()) return WarpRole::Consumer;
  const auto* s = std::get_if<std::string>(&it->second);
  if (s && *s == "producer") return WarpRole::Producer;
  if (s && *s == "both") return WarpRole::Both;
  if (s && *s == "all") return WarpRole::All;
  throw Error(op.describe() + ": ws must be \"producer\", \"both\" or \"all\", got " + ir::attrString(it->second));
}

int producerWarps(const ir::Function& f) { return int(f.intAttrOr("producer_warps", 0)); }

namespace {

// An op the producer may run beside the consumers: scalar results, no region, nothing written.
bool producerMayRun(const Op& op) {
  if (!op.regions().empty()) return false;
  for (const ir::Value* r : op.results())
    if (r->type().isTile()) return false;
  if (op.kind() == OpKind::LocalAlloc) return true;  // an address in the shared-memory plan
  if (op.kind() == OpKind::Load) return true;        // a scalar read (results checked above)
  return op.hasTrait(ir::kPure);
}

// Why `f` cannot be specialized ("" when it can), and the marks when it can.
struct Marks {
  std::set<Op*> producer, both;
  std::vector<Op*> hoisted;  // the rings' barrier buffers and their inits, for the common prefix
  std::map<Op*, std::vector<int64_t>> carried;  // loop -> carried values the producer keeps
};

std::string plan(ir::Function& f, Marks& marks) {
  f.walk([&](Op& op) {
    if (issuesForTheRing(op)) marks.producer.insert(&op);
  });
  if (marks.producer.empty()) return "it issues no TMA copy";

  std::set<const ir::Value*> seen;
  std::vector<const ir::Value*> work;
  auto need = [&](const ir::Value* v) {
    if (seen.insert(v).second) work.push_back(v);
  };
  std::string refusal;
  std::map<Op*, std::set<int64_t>> carried;
  // The loops around `op` run in both roles, with their bounds.
  auto enclosingLoops = [&](const Op& op) {
    for (ir::Block* blk = op.parentBlock(); blk && blk->parentOp(); blk = blk->parentOp()->parentBlock()) {
      Op* loop = blk->parentOp();
      if (loop->kind() != OpKind::For) {
        refusal = op.describe() + " sits in a region of " + loop->describe() + ", not a loop";
        return;
      }
      if (marks.both.insert(loop).second) {
        for (size_t i = 0; i < 3; ++i) need(loop->operand(i));
        carried[loop];
      }
    }
  };
  auto keepCarried = [&](Op* loop, size_t i) {
    if (carried[loop].insert(int64_t(i)).second) {
      need(loop->operand(3 + i));
      need(loop->region(0).terminator()->operand(i));
    }
  };
  for (Op* p : marks.producer) {
    enclosingLoops(*p);
    for (const ir::Value* v : p->operands()) need(v);
  }
  while (!work.empty() && refusal.empty()) {
    const ir::Value* v = work.back();
    work.pop_back();
    if (Op* d = v->definingOp()) {
      if (d->kind() == OpKind::For) {  // a loop's result: the loop and that carried value
        if (marks.both.insert(d).second) {
          for (size_t i = 0; i < 3; ++i) need(d->operand(i));
          enclosingLoops(*d);
        }
        keepCarried(d, size_t(v->resultIndex()));
        continue;
      }
      if (!producerMayRun(*d)) {
        refusal = "the TMA copies need " + d->describe() + " (" + v->type().str() + "), which the producer cannot run";
        break;
      }
      if (marks.both.insert(d).second) {
        enclosingLoops(*d);
        for (const ir::Value* o : d->operands()) need(o);
      }
    } else if (ir::Block* blk = v->ownerBlock(); blk && blk->parentOp()) {  // iv or carried value
      Op* loop = blk->parentOp();
      if (loop->kind() != OpKind::For) {
        refusal = "the TMA copies need an argument of " + loop->describe();
        break;
      }
      if (marks.both.insert(loop).second) {
        for (size_t i = 0; i < 3; ++i) need(loop->operand(i));
        enclosingLoops(*loop);
      }
      const auto& args = blk->args();
      const size_t index = size_t(std::find(args.begin(), args.end(), v) - args.begin());
      if (index > 0) keepCarried(loop, index - 1);
    }  // else a function parameter
  }
  if (!refusal.empty()) return refusal;
  for (auto& [loop, keep] : carried) {
    marks.carried[loop] = std::vector<int64_t>(keep.begin(), keep.end());
    marks.both.insert(loop->region(0).terminator());
  }

  // The CTA barriers the producer meets: per mbarrier buffer its copies use, the first barrier
  // after its init and the last before its inval, in the init's block.
  // In the program order of their first copies: a set of pointers would order them as the heap
  // placed them, and the kernel's barrier layout would change with unrelated allocations.
  std::vector<const ir::Value*> ringBarriers;
  f.walk([&](Op& op) {
    if (!marks.producer.count(&op)) return;
    const ir::Value* bars = op.operand(op.kind() == OpKind::TmaCopy ? 2 : 0);
    if (std::find(ringBarriers.begin(), ringBarriers.end(), bars) == ringBarriers.end()) ringBarriers.push_back(bars);
  });
  for (const ir::Value* bars : ringBarriers) {
    const Op* alloc = bars->definingOp();
    ir::Block& block = *alloc->parentBlock();
    Op* after = nullptr;
    Op* before = nullptr;
    bool initialized = false;
    for (auto& op : block.ops()) {
      if (op->kind() == OpKind::MbarrierInit && op->operand(0) == bars) {
        initialized = true;
        if (&block == &f.body()) marks.hoisted.push_back(op.get());  // (a loop's own inits stay)
      }
      else if (op->kind() == OpKind::Barrier && initialized && !after) after = op.get();
      else if (op->kind() == OpKind::Barrier && after) before = op.get();
      else if (op->kind() == OpKind::MbarrierInval && op->operand(0) == bars) break;
    }
    if (!after || !before || after == before)
      return "the mbarriers %" + std::to_string(bars->id()) +
             " have no CTA barrier after their init and before their inval in one block";
    marks.both.insert(after);
    marks.both.insert(before);
    if (&block == &f.body()) marks.hoisted.push_back(const_cast<Op*>(alloc));
  }
  if (Op* ret = f.body().terminator(); ret && ret->kind() == OpKind::Return) marks.both.insert(ret);
  // A wait for the stream's previous grid (programmatic launch) ahead of the first copy: the
  // producer waits too, since its copies may read what that grid wrote (a decode step's cache
  // append). A wait after the copies (dq's, which only orders the grids' completion) stays the
  // consumers'.
  std::set<const Op*> issuing;  // the top-level ops that are or hold a copy
  for (const Op* p : marks.producer) {
    const Op* top = p;
    while (top->parentBlock() != &f.body()) top = top->parentBlock()->parentOp();
    issuing.insert(top);
  }
  for (auto& op : f.body().ops()) {
    if (issuing.count(op.get())) break;
    if (op->kind() == OpKind::GridDependency && op->strAttr("kind") == "wait") marks.both.insert(op.get());
  }
  for (Op* p : marks.producer) marks.both.erase(p);
  return "";
}

}  // namespace

namespace {
// The target's and the function's conditions, then plan().
std::string refusal(ir::Function& f, const Target& target, Marks& marks) {
  if (!target.has(Feature::TensorMemoryAccelerator) || !target.has(Feature::SetMaxNReg))
    return target.smName() + " has no TMA or no setmaxnreg";
  if (f.numWarps() != 4 && f.numWarps() != 8)
    return "it has " + std::to_string(f.numWarps()) + " warps (4 or 8 consumer warps are supported)";
  return plan(f, marks);
}
}  // namespace

std::string warpSpecializeRefusal(const ir::Function& f, const Target& target) {
  Marks marks;  // plan() only collects ops; nothing of `f` changes
  return refusal(const_cast<ir::Function&>(f), target, marks);
}

bool warpSpecializationWanted(const ir::Function& f) {
  return passSwitch(f, "FLEXTILE_WARP_SPECIALIZE", "warp_specialize");
}

void specializeWarps(ir::Function& f, const Target& target) {
  if (producerWarps(f) > 0 || !warpSpecializationWanted(f)) return;
  Marks marks;
  if (!refusal(f, target, marks).empty()) return;
  for (Op* op : marks.producer) op->setAttr("ws", std::string("producer"));
  for (Op* op : marks.both) op->setAttr("ws", std::string("both"));
  // The rings' barriers are allocated and initialized once, first, by thread 0, and every thread
  // of both roles passes one CTA barrier at the same instruction before the roles part, so the
  // producer's first wait is ordered after the init without relying on the meeting barrier reached
  // from two instructions, which compute-sanitizer's racecheck did not pair (197 hazards on the
  // specialized forward without the hoist, none with it: H200, 2026-12-03; docs/reliability.md).
  // Allocs first, then inits. hoist_barrier_inits = 0 or FLEXTILE_HOIST_BARRIER_INITS=0 keeps the
  // inits inside the roles (the form racecheck flags), for comparison.
  if (!passSwitch(f, "FLEXTILE_HOIST_BARRIER_INITS", "hoist_barrier_inits", true)) marks.hoisted.clear();
  std::stable_sort(marks.hoisted.begin(), marks.hoisted.end(),
                   [](const Op* a, const Op* b) { return a->kind() == OpKind::LocalAlloc && b->kind() != OpKind::LocalAlloc; });
  ir::Block& body = f.body();
  auto at = body.ops().begin();
  for (Op* op : marks.hoisted) {
    ir::Block& from = *op->parentBlock();
    auto it = from.find(op);
    std::unique_ptr<Op> moved = std::move(*it);
    from.ops().erase(it);
    moved->setAttr("ws", std::string("all"));
    body.insert(at, std::move(moved));
  }
  if (!marks.hoisted.empty()) body.insert(at, f.createOp(OpKind::Barrier, {}, {}, {{"ws", std::string("all")}}));
  for (auto& [loop, keep] : marks.carried) loop->setAttr("producer_carried", keep);
  f.attrs()["producer_warps"] = int64_t(4);
}

ir::Pass warpSpecializePass(const Target& target) {
  return {"warp-specialize", [target](ir::Function& f) { specializeWarps(f, target); }};
}

}  // namespace flextile::codegen
