// Deferring a loop's accumulating product by one iteration (pass "defer-accumulation"): the
// intra-warpgroup overlap of FlashAttention-3, as a loop rotation on the tile IR.
//
// The forward's loop computes, in iteration t, S_t = Q·K_tᵀ, the softmax of S_t (P_t, alpha_t)
// and then O = O·alpha_t + P_t·V_t, which needs the softmax it follows. On wgmma both products
// are asynchronous (pass "wgmma"), but within one iteration each has to wait for the work before
// it, so the tensor cores idle through the softmax unless another warpgroup fills them. Rotated,
// iteration t issues S_t, then the accumulation of iteration t-1 (O·alpha_{t-1} + P_{t-1}·V_{t-1},
// reading P and alpha from the previous iteration), and runs the softmax of S_t while that
// product is in flight; the "wgmma" pass then waits for S_t with the accumulation still pending
// (`wgmma_wait {pending = 1}`) and for the accumulation at the yield.
//
// Which loops. A `for` with a positive constant step, no nested regions and no op with side
// effects (stores, atomics, fences), whose yield operand k is a dot D that
//   * suits wgmma on the target (TensorCores.h wgmmaAccumulatorFits; nothing changes elsewhere:
//     a synchronous product has nothing to overlap with), and so does another dot of the body,
//     the one that stays (stage 0) and is issued first;
//   * is used by nothing else, and whose body argument k (the accumulator) is read only by the
//     ops between it and D (the rescale O·alpha).
// Stage 1 is D, those rescale ops and every op of the body whose results only stage 1 reads,
// except a narrowing cast (P stays bf16 across the back edge, not f32). The rest is stage 0.
// Stage 1 reads stage-0 values of the previous iteration:
//   * the induction variable and values codegen::recomputableInLoop accepts (address and index
//     math, scalar loads of block indices) are recomputed at iv - step, so that the pipeline pass
//     still recognizes the loads of stage 1 (V) as loads it can issue iterations ahead;
//   * the others (P, alpha, body arguments) become loop-carried values. A tile load cannot be one
//     (it would leave its ring), nor a value that a stage-1 load's pointer or mask needs.
//
// The rewrite, for a loop over [lo, hi):
//   first = lo < hi
//   stage 0 at iv = lo (the prologue; every load also masked by `first`)
//   the stage-0 results yielded: select(first, prologue's, init)
//   for iv in [lo + step, hi) carrying also the values of stage 1 and the previous iv:
//     stage 0 up to and including its first dot
//     stage 1 of iv - step (recomputed index math, then the deferred ops)
//     the rest of stage 0
//   stage 1 at the last iv (the epilogue; loads masked by `first`)
//   the accumulator: select(first, epilogue's, the loop's)
// So a loop that runs no iteration returns its inits, and one that runs n runs stage 0 and
// stage 1 n times each, in an order that computes what the loop did: the interpreter gives the
// same bits before and after (tests/codegen/DeferAccumulationTest.cpp). The prologue's and the
// epilogue's products are outside the loop and run without a ring (mma.sync from a shared-memory
// conversion): one step of each per loop.
//
// Runs after assign-layouts (the clones keep their layouts) and before "pipeline" (whose rings
// then hold what each iteration reads, so every wgmma group still completes in the iteration that
// issued it). The "wgmma" pass stages the prologue's and the epilogue's B in one-slot buffers
// (TensorCores.h wgmmaStagedB), so those products run on wgmma too.
//
// Opt-in: a kernel asks with the function attribute `defer_accumulation = 1`, or
// FLEXTILE_DEFER_ACCUMULATION=1 asks for every kernel (=0 turns it off everywhere). No template
// asks yet, because it did not pay on the H200 (bench/RESULTS.md, 2026-12-02): the forward at
// 128 x 128 on two warpgroups ran level without a mask (471.1 against 470.1 TFLOP/s) and 1-10 %
// slower with masks, whose kernels go from 226-251 registers to 255 with spills (P of the
// previous iteration stays live beside S and O); with Q in shared memory instead the spills
// shrink but the masked variants are still level or slower. The other warpgroup already keeps
// the tensor cores busy through one's softmax there. What should change that is a warp-
// specialized kernel whose consumers get 240 registers (setmaxnreg) and read Q from shared
// memory, as FlashAttention-3's do (issue #13).
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "codegen/Passes.h"
#include "codegen/TensorCores.h"
#include "codegen/passes/LoopValues.h"
#include "ir/Passes.h"

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

// Opt-in (see the header): the function attribute, or FLEXTILE_DEFER_ACCUMULATION=1 for every
// kernel; FLEXTILE_DEFER_ACCUMULATION=0 overrides the attribute.
bool deferralWanted(const ir::Function& f) { return passSwitch(f, "FLEXTILE_DEFER_ACCUMULATION", "defer_accumulation"); }

bool narrowingCast(const Op& op) {
  return op.kind() == OpKind::Cast &&
         ir::byteWidth(op.result()->type().dtype()) < ir::byteWidth(op.operand(0)->type().dtype());
}

// The loop and what its rotation moves.
struct Deferral {
  Op* loop = nullptr;
  Op* dot = nullptr;
  size_t index = 0;                    // D is yield operand `index`; its accumulator body arg index + 1
  std::set<const Op*> stage1;
  std::vector<ir::Value*> carried;     // stage-0 values stage 1 reads from the previous iteration
  std::vector<const ir::Value*> recomputed;  // stage-0 values stage 1 recomputes at iv - step
};

std::optional<Deferral> findDeferral(Op& loop, const Target& target) {
  if (loop.regions().size() != 1) return std::nullopt;
  ir::Block& body = loop.region(0);
  if (body.args().empty() || !body.terminator()) return std::nullopt;
  const auto step = scalarConstant(loop.operand(2));
  if (!step || *step <= 0) return std::nullopt;
  std::map<const ir::Value*, std::vector<const Op*>> users;
  for (auto& op : body.ops()) {
    if (!op->regions().empty() || op->hasTrait(ir::kSideEffect)) return std::nullopt;
    for (const ir::Value* o : op->operands()) users[o].push_back(op.get());
  }
  const Op& yield = *body.terminator();
  auto inBody = [&](const ir::Value* v) { return v->definingOp() ? v->definingOp()->parentBlock() == &body : v->ownerBlock() == &body; };

  for (size_t k = 0; k < yield.numOperands(); ++k) {
    Op* dot = yield.operand(k)->definingOp();
    if (!dot || dot->kind() != OpKind::Dot || dot->parentBlock() != &body || users[dot->result()].size() != 1 ||
        !wgmmaAccumulatorFits(*dot, target))
      continue;
    const ir::Value* acc = body.arg(k + 1);
    Deferral d{&loop, dot, k};
    // The rescale: ops that read the accumulator (transitively) and feed D.
    std::set<const Op*> fromAcc;
    for (auto& op : body.ops())
      for (const ir::Value* o : op->operands())
        if (o == acc || (o->definingOp() && fromAcc.count(o->definingOp()))) fromAcc.insert(op.get());
    const std::vector<Op*> dotSlice = bodySlice({dot->operands().begin(), dot->operands().end()}, body);
    const std::set<const Op*> feedsDot(dotSlice.begin(), dotSlice.end());
    d.stage1.insert(dot);
    for (const Op* op : fromAcc)
      if (feedsDot.count(op)) d.stage1.insert(op);
    bool ok = true;
    for (const Op* u : users[acc]) ok = ok && d.stage1.count(u);
    for (const Op* op : d.stage1)
      if (op != dot)
        for (const ir::Value* r : op->results())
          for (const Op* u : users[r]) ok = ok && d.stage1.count(u);
    if (!ok) continue;
    // Producers that only stage 1 reads join it (one pass in reverse order: users come later).
    for (auto it = body.ops().rbegin(); it != body.ops().rend(); ++it) {
      const Op* op = it->get();
      if (d.stage1.count(op) || op == &yield || op->numResults() == 0 || narrowingCast(*op)) continue;
      bool only = true, used = false;
      for (const ir::Value* r : op->results())
        for (const Op* u : users[r]) {
          used = true;
          only = only && d.stage1.count(u);
        }
      if (used && only) d.stage1.insert(op);
    }
    bool overlaps = false;
    for (auto& op : body.ops())
      overlaps = overlaps || (op->kind() == OpKind::Dot && !d.stage1.count(op.get()) && wgmmaAccumulatorFits(*op, target));
    if (!overlaps) continue;
    // What stage 1 reads from stage 0.
    std::set<const ir::Value*> seenCrossing;
    for (auto& op : body.ops()) {
      if (!d.stage1.count(op.get())) continue;
      for (ir::Value* o : op->operands()) {
        if (o == acc || o == body.arg(0) || !inBody(o) || (o->definingOp() && d.stage1.count(o->definingOp())) ||
            !seenCrossing.insert(o).second)
          continue;
        std::set<const ir::Value*> seen;
        if (o->definingOp() && recomputableInLoop(o, body, true, seen))
          d.recomputed.push_back(o);
        else
          d.carried.push_back(o);
      }
    }
    // A carried tile load would leave its ring; a carried address would keep the pipeline from
    // issuing stage 1's loads ahead.
    std::set<const ir::Value*> addressInputs;
    std::vector<const ir::Value*> work;
    for (const Op* op : d.stage1)
      if (op->kind() == OpKind::Load)
        for (size_t i = 0; i < std::min<size_t>(2, op->numOperands()); ++i) work.push_back(op->operand(i));
    while (!work.empty()) {
      const ir::Value* v = work.back();
      work.pop_back();
      if (!addressInputs.insert(v).second) continue;
      if (const Op* def = v->definingOp(); def && d.stage1.count(def))
        for (const ir::Value* o : def->operands()) work.push_back(o);
    }
    for (const ir::Value* c : d.carried)
      ok = ok && !addressInputs.count(c) && !(c->definingOp() && c->definingOp()->kind() == OpKind::Load);
    if (ok) return d;
  }
  return std::nullopt;
}

// Inserts clones of ops before `pos`, mapping operands through `map` (and adding the clones'
// results to it); loads get `guard` (a scalar i1, or null) and-ed into their mask.
struct Cloner {
  ir::Function& f;
  ir::Block& block;
  ir::Block::OpList::iterator pos;
  ir::Location loc;
  std::map<const ir::Value*, ir::Value*>& map;
  ir::Value* guard = nullptr;
  std::vector<Op*> made;

  ir::Value* mapped(ir::Value* v) const {
    auto it = map.find(v);
    return it == map.end() ? v : it->second;
  }
  Op* make(OpKind k, std::vector<ir::Value*> operands, std::vector<ir::Type> types, ir::Attrs attrs = {}) {
    Op* op = block.insert(pos, f.createOp(k, std::move(operands), std::move(types), std::move(attrs), loc));
    made.push_back(op);
    return op;
  }
  // `cond` (a scalar i1) as a mask of `like`'s shape and layout.
  ir::Value* maskLike(ir::Value* cond, const ir::Type& like) {
    if (!like.isTile()) return cond;
    return make(OpKind::Splat, {cond}, {ir::Type(ir::DType::I1, like.shape()).withLayout(like.layout())})->result();
  }
  ir::Value* select(ir::Value* cond, ir::Value* a, ir::Value* b) {
    return make(OpKind::Select, {maskLike(cond, a->type()), a, b}, {a->type()})->result();
  }
  void clone(const Op& op) {
    std::vector<ir::Value*> operands;
    for (ir::Value* o : op.operands()) operands.push_back(mapped(o));
    if (guard && op.kind() == OpKind::Load) {
      ir::Value* on = maskLike(guard, op.operand(0)->type());
      if (operands.size() >= 2)
        operands[1] = make(OpKind::And, {operands[1], on}, {operands[1]->type()})->result();
      else
        operands.push_back(on);
    }
    ir::Attrs attrs = op.attrs();
    if (guard && op.kind() == OpKind::Load && attrs.erase("tensor_rank"))
      operands.resize(ir::operandsBeforeBox(op));  // the guarded mask is no longer the box's: an ordinary load
    std::vector<ir::Type> types;
    for (const ir::Value* r : op.results()) types.push_back(r->type());
    Op* copy = make(op.kind(), std::move(operands), std::move(types), std::move(attrs));
    copy->setLoc(op.loc());
    for (size_t i = 0; i < op.numResults(); ++i) map[op.result(i)] = copy->result(i);
  }
};

void rotate(ir::Function& f, Deferral& d) {
  Op& loop = *d.loop;
  ir::Block& body = loop.region(0);
  ir::Block& outer = *loop.parentBlock();
  Op& yield = *body.terminator();
  const ir::Location loc = loop.loc();
  const ir::Type ivType = body.arg(0)->type();
  ir::Value* iv = body.arg(0);
  ir::Value* lo = loop.operand(0);
  ir::Value* hi = loop.operand(1);
  ir::Value* step = loop.operand(2);
  const size_t numCarriedBefore = yield.numOperands();

  // The prologue: stage 0 at lo.
  std::map<const ir::Value*, ir::Value*> pro{{iv, lo}};
  for (size_t j = 0; j < numCarriedBefore; ++j) pro[body.arg(j + 1)] = loop.operand(3 + j);
  Cloner before{f, outer, outer.find(&loop), loc, pro};
  ir::Value* first = before.make(OpKind::Cmp, {lo, hi}, {ir::Type(ir::DType::I1)}, {{"pred", std::string("lt")}})->result();
  before.guard = first;
  for (auto& op : body.ops())
    if (op.get() != &yield && !d.stage1.count(op.get())) before.clone(*op);
  before.guard = nullptr;
  std::vector<ir::Value*> newInits;
  for (size_t j = 0; j < numCarriedBefore; ++j)
    newInits.push_back(j == d.index ? loop.operand(3 + j) : before.select(first, before.mapped(yield.operand(j)), loop.operand(3 + j)));
  for (size_t j = 0; j < numCarriedBefore; ++j) loop.setOperand(3 + j, newInits[j]);
  loop.setOperand(0, before.make(OpKind::Add, {lo, step}, {ivType})->result());

  // The carried values of stage 1, and the previous iv.
  std::map<const ir::Value*, ir::Value*> argOf;
  std::map<const ir::Value*, size_t> resultOf;
  for (ir::Value* c : d.carried) {
    resultOf[c] = loop.numResults();
    loop.addOperand(before.mapped(c));
    argOf[c] = body.addArg(c->type(), c->nameHint().empty() ? "prev" : c->nameHint() + "_prev");
    loop.addResult(c->type());
    yield.addOperand(c);
  }
  const size_t prevIvResult = loop.numResults();
  loop.addOperand(lo);
  body.addArg(ivType, "prev_iv");
  loop.addResult(ivType);
  yield.addOperand(iv);

  std::vector<Op*> stage1Ops;
  for (auto& op : body.ops())
    if (d.stage1.count(op.get())) stage1Ops.push_back(op.get());
  const std::vector<Op*> recomputeOps = bodySlice(d.recomputed, body);  // stage-0 ops: they stay put

  // The epilogue: stage 1 at the last iv (built from the body's ops before they move).
  ir::Value* accResult = loop.result(d.index);
  std::map<const ir::Value*, ir::Value*> epi{{iv, loop.result(prevIvResult)}, {body.arg(d.index + 1), accResult}};
  for (ir::Value* c : d.carried) epi[c] = loop.result(resultOf.at(c));
  Cloner after{f, outer, std::next(outer.find(&loop)), loc, epi, first};
  for (const Op* op : recomputeOps) after.clone(*op);
  for (const Op* op : stage1Ops) after.clone(*op);
  after.guard = nullptr;
  ir::Value* final = after.select(first, after.mapped(d.dot->result()), accResult);
  // Every later use of the accumulator reads the selected one (the epilogue's own stay).
  std::vector<std::pair<Op*, size_t>> keep;
  for (Op* op : after.made)
    for (size_t i = 0; i < op->numOperands(); ++i)
      if (op->operand(i) == accResult) keep.push_back({op, i});
  f.replaceAllUsesWith(accResult, final);
  for (auto [op, i] : keep) op->setOperand(i, accResult);

  // In the body: stage 1 of iv - step, right after stage 0's first dot. The stage-1 ops are taken
  // out first, so that the recomputed index math goes in front of all of them.
  ir::Block::OpList moved;
  for (Op* op : stage1Ops) moved.splice(moved.end(), body.ops(), body.find(op));
  auto anchor = std::find_if(body.ops().begin(), body.ops().end(), [](const auto& op) { return op->kind() == OpKind::Dot; });
  std::map<const ir::Value*, ir::Value*> prev(argOf.begin(), argOf.end());
  Cloner in{f, body, std::next(anchor), loc, prev};
  prev[iv] = in.make(OpKind::Sub, {iv, step}, {ivType})->result();
  for (const Op* op : recomputeOps) in.clone(*op);
  for (Op* op : stage1Ops)
    for (size_t i = 0; i < op->numOperands(); ++i) op->setOperand(i, in.mapped(op->operand(i)));
  body.ops().splice(in.pos, moved);
}

}  // namespace

void deferAccumulation(ir::Function& f, const Target& target) {
  if (!deferralWanted(f)) return;
  std::vector<Op*> loops;
  f.walk([&](Op& op) {
    if (op.kind() == OpKind::For) loops.push_back(&op);
  });
  bool changed = false;
  for (Op* loop : loops)
    if (auto d = findDeferral(*loop, target)) {
      rotate(f, *d);
      changed = true;
    }
  if (changed) ir::dce(f);
}

ir::Pass deferAccumulationPass(const Target& target) {
  return {"defer-accumulation", [target](ir::Function& f) { deferAccumulation(f, target); }};
}

}  // namespace flextile::codegen
