// Layout assignment: from shape-only tile IR to IR in which every tile value
// says which thread holds which element (ir/Layout.h), with as few layout
// conversions (a round trip through shared memory each) as we can manage.
//
// The problem. Each op constrains the layouts of its operands and results
// (the table in codegen/Passes.h). Some values have a layout they *should*
// have: a load wants the layout in which each thread reads a 16-byte vector
// and a warp reads consecutive memory; a dot produces its accumulator in the
// layout its lowering computes. Everything else can follow. When two
// constraints disagree on one value, the value must be converted.
//
// The key observation (shared with Triton's RemoveLayoutConversions): much of
// a kernel is index arithmetic built from aranges, splats of scalars and
// constants. Such a value costs a few integer instructions per element to
// compute in *any* layout, far less than moving it through shared memory. So
// we never convert it: we recompute it, in the layout each user needs.
//
// Vocabulary: every value falls in one of four classes.
//   scalar    rank 0, uniform across the program's threads: no layout at all.
//   cheap     a tile computed only from constant, arange, splat (of any
//             scalar) and element-wise / broadcast / expand_dims / reshape /
//             trans ops over cheap tiles. Rematerialized on demand.
//   view      broadcast / expand_dims / reshape / trans whose operand is not
//             cheap, or an element-wise op over views and cheap tiles only.
//             Also given the layout its user demands; its non-cheap leaves
//             are converted if they do not already have the implied layout.
//             (A view of a row maximum used against the tile it came from
//             implies exactly the maximum's own layout: no conversion.)
//   computed  loads, reductions, dots, loop-carried values and loop results,
//             and element-wise ops with at least one computed operand. Each
//             has one layout for its whole life.
//
// Phase 1, plan (program order, loops iterated to a fixpoint). Give every
// computed value its layout:
//   load       the layout of its pointer when that is computed (a pointer
//              carried by a loop), else the coalesced layout of the access
//              (codegen::coalescedLayout: contiguous dim fastest, as many
//              elements per thread as a 16-byte vector, alignment, contiguity
//              and mask constancy allow; an address that repeats along the
//              whole fastest dim — a row's value read for every column — is
//              laid out as a contiguous access of its shape would be, so that
//              it lines up with the tiles it is combined with).
//   dot        on tensor cores (codegen/TensorCores.h: a target with mma.sync,
//              f16/bf16/f32 operands, M >= 16, N >= 8, K >= 16 or 8): the mma
//              accumulator layout with the warp split of mmaWarpsPerCTA
//              (chained dots, as in attention, and on wgmma targets dots in a
//              loop whose B is loop-invariant, or whose B is loaded in a
//              pipelined loop with 16 rows a warp — a GEMM's K loop — put all
//              warps along M); its
//              a and b must be Layout::dotOperand of it (a convert_layout
//              from their producers, lowered through a swizzled shared tile
//              and ldmatrix; none at all when the producer is already in
//              that layout, as P = softmax(S) is for P.V). Otherwise the
//              accumulator's layout when it is computed, else a default
//              blocked layout of the result shape (the FMA lowering).
//              Element-wise ops, reductions (sliced mma layouts: row max and
//              sum in quads), expand/broadcast views and loop-carried values
//              then follow the mma layout by the rules below, so a softmax
//              over an accumulator never leaves registers.
//   reduce     operand layout sliced along the axis (a cheap or view operand
//              is materialized in the layout its computed leaves imply, see
//              store, or else in the default blocked layout).
//   elementwise  the layout of its first computed operand whose layout is
//              known.
//   for        a carried value takes its init's layout when the init is
//              computed, else the layout of what the body yields; but when
//              the body yields an mma dot's result, that accumulator layout
//              wins (the init is converted once, before the loop). The body is
//              planned with such carried values unknown; once the yielded
//              value's layout is known, the carried value takes it and the
//              body is planned again, until nothing changes. A carried value
//              still unknown then (it only feeds itself, like a pointer
//              advanced each iteration) takes the layout its users in the
//              body require (a load through it: that load's coalesced layout),
//              found by walking requirements backwards through element-wise
//              ops; failing that the coalesced layout of a pointer, or the
//              default blocked layout.
//   atomic_add like a store, and its old values keep that layout; its
//              default is one element per thread (atomics do not vectorize).
//              Never cheap or a view, even over cheap operands: it must run
//              once, so it is never cloned into another layout.
//   store      (no result) takes the layout of its value if computed, else of
//              its pointer if computed, else its coalesced layout. A view
//              value counts as computed when its layout follows from its
//              computed leaves (expand_dims, reshape, trans of a laid-out
//              value: a transposed tile is stored in the transposed layout);
//              the same holds for the operands of reduce and dot, which accept
//              any layout.
//
// Phase 2, rewrite (program order). Every op that is not cheap or a view
// demands a layout of each tile operand (its own layout for element-wise ops;
// the store's layout for a store's pointer, value and mask; the carried
// value's layout for a loop init or a yield operand). Materializing value v
// in layout L:
//   computed v   itself if its layout is L, else one convert_layout placed
//                right after v's definition (so a conversion of a value
//                defined before a loop happens before the loop), memoized per
//                (v, L).
//   cheap/view v the operand layouts that L implies (projected for a
//                broadcast, sliced for expand_dims, ...) are materialized
//                first; the first demand takes over v's own op, a demand for
//                another layout clones the op right after the original.
//                Memoized per (v, L), so a chain is computed once per layout.
//
// Phase 3, cleanup: a convert of a convert reads the original value; identity
// converts disappear; ops left without uses (the cheap originals that every
// user got a clone of) are erased. Finally every tile value must have a
// layout.
//
//   small load  a vector load ([N], [N, 1] or [1, N], at most 64 elements
//                per warp) whose address, mask and `other` are cheap is not
//                converted: it is issued again in the demanded layout
//                (reloadInLayout), and the original disappears when nothing
//                else reads it. Index tiles read by mods (document ids at the
//                query and key positions) and bias rows broadcast over a tile
//                then cost a few replicated cached loads, not a shared-memory
//                round trip with two barriers.
//
// What this does not do yet: it never reloads a larger tile in another
// layout, and it does not move conversions out of loops beyond placing them
// at definitions.

#include <algorithm>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "codegen/AxisInfo.h"
#include "codegen/Passes.h"
#include "codegen/TensorCores.h"
#include "ir/Builder.h"

namespace flextile::codegen {

using ir::Block;
using ir::Layout;
using ir::LayoutPtr;
using ir::Op;
using ir::OpKind;
using ir::Shape;
using ir::Value;

namespace {
int64_t floorPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
bool isPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }
}  // namespace

Layout blockedLayout(const Shape& shape, int numWarps, int fastDim, int64_t vec) {
  const int r = int(shape.size());
  std::vector<int> perm;  // fastDim last, the others in order
  for (int d = 0; d < r; ++d)
    if (d != fastDim) perm.push_back(d);
  perm.push_back(fastDim);
  Shape permuted(r);
  std::vector<int> inverse(r);
  for (int i = 0; i < r; ++i) {
    permuted[i] = shape[perm[i]];
    inverse[perm[i]] = i;
  }
  return Layout::defaultBlocked(permuted, numWarps, vec).transposed(inverse);
}

namespace {
Layout coalescedLayoutFor(const Value* ptr, const Value* mask, const AxisInfoAnalysis& axis, int numWarps) {
  const Shape& shape = ptr->type().shape();
  int dim = fastestDim(ptr, axis);
  int64_t vec = vectorWidth(ptr, axis, mask, dim);
  // One address along the whole fastest dim (a row's value read for every column, as the decode
  // merge reads each partial's lse beside the partial): laid out as a contiguous access of that
  // shape and type would be, so that it meets the tiles it is combined with in their layout
  // instead of through a conversion apiece. Its lowering still accesses one element at a time
  // (memoryAccessWidth follows the contiguity, not the layout).
  const AxisInfo& info = axis.get(ptr);
  if (shape[dim] > 1 && info.contiguity[dim] == 1 && info.constancy[dim] == shape[dim])
    vec = std::max<int64_t>(1, 16 / ir::byteWidth(ptr->type().pointee()));
  // With fewer elements than threads x vec, wide vectors would leave threads
  // idle (replicated); prefer spreading the tile over all threads.
  vec = std::min(vec, floorPow2(std::max<int64_t>(1, ir::numElements(shape) / (32 * numWarps))));
  return blockedLayout(shape, numWarps, dim, vec);
}

// The mask that goes with pointer operand `i` of a memory op (null: none).
const Value* maskOf(const Op& op, size_t i) {
  switch (op.kind()) {
    case OpKind::Load: return op.numOperands() > 1 ? op.operand(1) : nullptr;
    case OpKind::StoreTagged: return op.numOperands() > 3 ? op.operand(3) : nullptr;
    case OpKind::LoadTagged: return ir::loadTaggedMaskIndex(op, i) ? op.operand(ir::loadTaggedMaskIndex(op, i)) : nullptr;
    default: return op.numOperands() > 2 ? op.operand(2) : nullptr;
  }
}
}  // namespace

Layout coalescedLayout(const Op& op, const AxisInfoAnalysis& axis, int numWarps) {
  return coalescedLayoutFor(op.operand(0), maskOf(op, 0), axis, numWarps);
}

namespace {

enum class Class { Scalar, Cheap, View, Computed };

bool isViewOp(OpKind k) {
  return k == OpKind::Broadcast || k == OpKind::ExpandDims || k == OpKind::Reshape || k == OpKind::Trans;
}

class LayoutAssigner {
 public:
  LayoutAssigner(ir::Function& f, const Target& target) : f_(f), target_(target), numWarps_(f.numWarps()) {}

  void run() {
    prepare();
    axis_ = std::make_unique<AxisInfoAnalysis>(f_);
    classify();
    findMmaDots();
    planBlock(f_.body());
    rewrite();
    cleanup();
    checkAllLaidOut();
  }

 private:
  // ---- preparation ----------------------------------------------------------

  void prepare() {
    if (numWarps_ < 1 || !isPow2(numWarps_))
      throw Error("function '" + f_.name() + "': num_warps must be a power of two, got " + std::to_string(numWarps_));
    // Start from shape-only IR: drop earlier layouts and conversions.
    std::vector<Op*> converts;
    auto strip = [](Value* v) { v->setType(v->type().withShape(v->type().shape())); };
    for (Value* p : f_.params()) strip(p);
    f_.walk([&](Op& op) {
      for (Value* r : op.results()) strip(r);
      for (auto& region : op.regions())
        for (Value* a : region->args()) strip(a);
      if (op.kind() == OpKind::ConvertLayout) converts.push_back(&op);
      for (Value* r : op.results())
        for (int64_t d : r->type().shape())
          if (!isPow2(d))
            throw Error(op.describe() + ": tile shape " + ir::shapeString(r->type().shape()) +
                        " has a dimension that is not a power of two; layouts need powers of two");
    });
    for (Op* c : converts) {
      f_.replaceAllUsesWith(c->result(), c->operand(0));
      c->parentBlock()->erase(c);
    }
  }

  void classify() {
    for (Value* p : f_.params()) cls_[p] = p->type().isTile() ? Class::Computed : Class::Scalar;
    f_.walk([&](Op& op) {
      for (auto& region : op.regions())
        for (Value* a : region->args()) cls_[a] = a->type().isTile() ? Class::Computed : Class::Scalar;
      for (Value* r : op.results()) cls_[r] = classOf(op, r);
    });
  }

  Class classOf(const Op& op, const Value* r) const {
    if (r->type().isScalar()) return Class::Scalar;
    OpKind k = op.kind();
    if (k == OpKind::Constant || k == OpKind::Arange || k == OpKind::Splat) return Class::Cheap;
    if (isViewOp(k) || op.hasTrait(ir::kElementwise)) {
      bool anyView = false, anyComputed = false;
      for (Value* o : op.operands()) {
        Class c = cls_.at(o);
        anyView |= c == Class::View;
        anyComputed |= c == Class::Computed;
      }
      if (anyComputed) return isViewOp(k) ? Class::View : Class::Computed;
      return anyView ? Class::View : Class::Cheap;
    }
    return Class::Computed;
  }

  bool flexible(const Value* v) const {
    Class c = cls_.at(v);
    return c == Class::Cheap || c == Class::View;
  }
  // The planned layout of a computed value, or null while unknown.
  LayoutPtr known(const Value* v) const {
    if (cls_.at(v) != Class::Computed) return nullptr;
    auto it = layout_.find(v);
    return it == layout_.end() ? nullptr : it->second;
  }

  // ---- layouts we choose ------------------------------------------------------

  LayoutPtr defaultLayout(const Shape& shape) const {
    // Up to 4 consecutive elements per thread along the last dimension (one
    // 16-byte f32 vector when the tile is stored), unless that would leave
    // threads without elements.
    int64_t vec = std::min<int64_t>(4, floorPow2(std::max<int64_t>(1, ir::numElements(shape) / (32 * numWarps_))));
    return ir::makeLayout(Layout::defaultBlocked(shape, numWarps_, vec));
  }

  LayoutPtr coalesced(const Op& op) const { return ir::makeLayout(coalescedLayout(op, *axis_, numWarps_)); }

  // The layout in which a view needs no conversion of its computed leaves,
  // when that follows from them: expand_dims, reshape and trans of a laid-out
  // value have exactly one such layout, an element-wise view takes its first
  // operand's. Null for cheap values and broadcasts (many layouts project
  // onto one operand layout: the user decides).
  LayoutPtr forwardLayout(const Value* v) const {
    if (auto l = known(v)) return l;
    if (cls_.at(v) != Class::View) return nullptr;
    const Op& op = *v->definingOp();
    switch (op.kind()) {
      case OpKind::ExpandDims:
        if (auto l = forwardLayout(op.operand(0))) return ir::makeLayout(l->expanded(int(op.intAttr("axis"))));
        return nullptr;
      case OpKind::Reshape:
        if (auto l = forwardLayout(op.operand(0))) return ir::makeLayout(l->reshaped(v->type().shape()));
        return nullptr;
      case OpKind::Trans:
        if (auto l = forwardLayout(op.operand(0))) {
          std::vector<int> perm;
          for (int64_t p : op.intsAttr("perm")) perm.push_back(int(p));
          return ir::makeLayout(l->transposed(perm));
        }
        return nullptr;
      case OpKind::Broadcast:
        return nullptr;
      default:
        for (const Value* o : op.operands())
          if (o->type().isTile())
            if (auto l = forwardLayout(o)) return l;
        return nullptr;
    }
  }

  // The layout for a tile that an op accepts in any layout (a reduce's
  // operand, a dot's a and b): its own when it has one, else the one its
  // computed leaves imply, else the default.
  LayoutPtr anyLayoutFor(const Value* v) const {
    if (!flexible(v)) return known(v);
    if (auto l = forwardLayout(v)) return l;
    return defaultLayout(v->type().shape());
  }

  LayoutPtr storeLayout(const Op& store) const {
    if (store.operand(1)->type().isScalar()) return nullptr;
    if (auto l = forwardLayout(store.operand(1))) return l;
    if (auto l = known(store.operand(0))) return l;
    return coalesced(store);
  }

  // An atomic_add's pointer, value, mask and old values share one layout: the
  // value's when it is computed (a dQ tile adds from its accumulator layout),
  // else the pointer's, else one element per thread along the contiguous
  // dimension. Atomics are issued one element at a time, so a warp's 32
  // lanes on 32 consecutive addresses is what coalesces them; wider
  // per-thread vectors would only stride each instruction.
  LayoutPtr atomicLayout(const Op& atomic) const {
    if (auto l = forwardLayout(atomic.operand(1))) return l;
    if (auto l = known(atomic.operand(0))) return l;
    const Value* ptr = atomic.operand(0);
    return ir::makeLayout(blockedLayout(ptr->type().shape(), numWarps_, fastestDim(ptr, *axis_), 1));
  }

  // What a reduce's operand is laid out in (its result is this, sliced).
  LayoutPtr reduceOperandLayout(const Op& reduce) const { return anyLayoutFor(reduce.operand(0)); }

  // ---- tensor cores -------------------------------------------------------------

  // Chooses the accumulator layout of every dot that runs on tensor cores
  // (codegen/TensorCores.h has the eligibility and warp-split rules). A dot is
  // chained when its result reaches, through element-wise ops and loop-carried
  // values, the A operand of another mma dot; both ends of a chain put their
  // warps along M so that the first accumulator is the second's A layout.
  void findMmaDots() {
    std::vector<Op*> dots;
    std::unordered_map<const Value*, std::vector<std::pair<Op*, size_t>>> uses;
    f_.walk([&](Op& op) {
      if (op.kind() == OpKind::Dot && mmaEligible(op, target_)) dots.push_back(&op);
      for (size_t i = 0; i < op.numOperands(); ++i) uses[op.operand(i)].emplace_back(&op, i);
    });
    std::unordered_set<const Op*> chained;
    for (Op* dot : dots) {
      std::vector<const Value*> work{dot->result()};
      std::unordered_set<const Value*> seen{dot->result()};
      auto reach = [&](const Value* v) {
        if (seen.insert(v).second) work.push_back(v);
      };
      while (!work.empty()) {
        const Value* v = work.back();
        work.pop_back();
        for (auto [user, i] : uses[v]) {
          if (user->kind() == OpKind::Dot && i == 0 && mmaEligible(*user, target_)) {
            chained.insert(dot);
            chained.insert(user);
          } else if (user->hasTrait(ir::kElementwise) && user->numResults() == 1) {
            reach(user->result());
          } else if (user->kind() == OpKind::For && i >= 3) {
            reach(user->region().arg(i - 2));
          } else if (user->kind() == OpKind::Yield && user->parentBlock()->parentOp()) {
            const Op* loop = user->parentBlock()->parentOp();
            reach(loop->region().arg(1 + i));
            reach(loop->result(i));
          }
        }
      }
    }
    // On a wgmma target, a dot in a loop whose B is loop-invariant (the backward's atomic dS·K
    // reads K so) reads B from a resident shared tile (TensorCores.h wgmmaResidentB) when its
    // warps lie along M, as wgmma's accumulator needs: give it that split.
    if (target_.has(Feature::Wgmma))
      for (Op* dot : dots) {
        const Op* loop = dot->parentBlock() ? dot->parentBlock()->parentOp() : nullptr;
        const Op* b = dot->operand(1)->definingOp();
        if (loop && loop->kind() == OpKind::For && b && dot->operand(0)->type().dtype() != ir::DType::F32) {
          auto inLoop = [&](const Op* d) {  // whether op d sits in `loop` (its regions included)
            while (d && d != loop) d = d->parentBlock() ? d->parentBlock()->parentOp() : nullptr;
            return d != nullptr;
          };
          const bool bInLoop = inLoop(b);
          if (!bInLoop) chained.insert(dot);  // B is defined outside the loop
          // A product of a pipelined loop whose B is loaded in it (a GEMM's K loop) and whose M
          // gives every warp 16 rows (a 128-row tile on 8 warps) runs on wgmma, B read from the
          // ring slot, when its warps lie along M; split in 2D it runs on mma.sync.
          const Shape& s = dot->result()->type().shape();
          const bool fits = wgmmaShapeFits(s[0], s[1], dot->operand(0)->type().shape()[1], numWarps_, target_);
          if (bInLoop && b->kind() == OpKind::Load && dot->function()->intAttrOr("num_stages", 1) > 1 && fits)
            chained.insert(dot);
          // A product whose A is the transpose of a loop-invariant tile (the specialized atomic
          // dQ's Kᵀ dSᵀ): A resident M-major, B staged each iteration (TensorCores.h), when every
          // warp gets 16 rows.
          const Op* a = dot->operand(0)->definingOp();
          const Op* x = a && a->kind() == OpKind::Trans ? a->operand(0)->definingOp() : nullptr;
          if (x && !inLoop(x) && fits) chained.insert(dot);
        }
      }
    // A dot whose accumulator is another dot's result (the forward's Q·Kᵀ over a split head dim,
    // chunk by chunk) adds into that dot's registers: both take one warp split.
    for (bool grew = true; grew;) {
      grew = false;
      for (Op* dot : dots) {
        const Op* first = dot->numOperands() > 2 ? dot->operand(2)->definingOp() : nullptr;
        if (!first || first->kind() != OpKind::Dot || !mmaEligible(*first, target_)) continue;
        if (chained.count(dot) != chained.count(first)) {
          chained.insert(dot);
          chained.insert(first);
          grew = true;
        }
      }
    }
    const std::unordered_map<const Op*, WarpgroupSplit> groups = groupsAlongN(dots, chained);
    for (Op* dot : dots) {
      const Shape& s = dot->result()->type().shape();
      const WarpgroupSplit g = groups.at(dot);
      mma_[dot] = ir::makeLayout(g.groups * g.replicas > 1
                                     ? Layout::wgmmaAccumulator(s, numWarps_, g.groups, g.replicas)
                                     : Layout::mmaAccumulator(s, numWarps_,
                                                              mmaWarpsPerCTA(s[0], s[1], numWarps_, chained.count(dot) != 0)));
    }
  }

  struct WarpgroupSplit {
    int64_t groups = 1, replicas = 1;  // along N; computing the same tile
    bool operator==(const WarpgroupSplit&) const = default;
  };

  // A chained product of 64 rows on 8 warps runs as two warpgroups, each half of N on wgmma
  // (TensorCores.h wgmmaGroupsAlongN), where each share of B starts where a descriptor can: B read
  // through a trans is K-major (shares of whole 8-line groups), B read as loaded is N-major (shares
  // of whole 128-byte panels). Where a share would not, the warpgroups each compute the whole tile
  // (replicas: a 64-column chunk of a split head dim, N-major), still on wgmma. The dots adding
  // into one accumulator take one split (the fewer groups), and the dots reading one B source are
  // on wgmma together or not at all (a ring tile holds one layout for wgmma or for ldmatrix).
  std::unordered_map<const Op*, WarpgroupSplit> groupsAlongN(const std::vector<Op*>& dots,
                                                             const std::unordered_set<const Op*>& chained) const {
    std::unordered_map<const Op*, WarpgroupSplit> split;
    std::unordered_map<const Op*, std::vector<const Op*>> readersOfB;
    for (Op* dot : dots) {
      const Shape& s = dot->result()->type().shape();
      const ir::Type& a = dot->operand(0)->type();
      const int64_t g =
          chained.count(dot) ? wgmmaGroupsAlongN(s[0], s[1], a.shape()[1], numWarps_, a.dtype(), target_) : 1;
      const Op* source = dot->operand(1)->definingOp();
      bool transposed = false;
      while (source && (source->kind() == OpKind::Trans || source->kind() == OpKind::ConvertLayout)) {
        transposed = transposed || source->kind() == OpKind::Trans;
        source = source->operand(0)->definingOp();
      }
      const bool whole = !transposed && (s[1] / g) * ir::byteWidth(a.dtype()) % 128 != 0;
      split[dot] = whole ? WarpgroupSplit{1, g} : WarpgroupSplit{g, 1};
      if (source) readersOfB[source].push_back(dot);
    }
    auto wgmma = [&](const Op* d) { return split[d].groups * split[d].replicas > 1; };
    for (bool changed = true; changed;) {
      changed = false;
      for (const auto& [source, readers] : readersOfB)
        for (const Op* r : readers)
          if (wgmma(r) != wgmma(readers.front())) {
            split[r] = split[readers.front()] = WarpgroupSplit{};
            changed = true;
          }
      for (Op* dot : dots) {
        const Op* first = dot->numOperands() > 2 ? dot->operand(2)->definingOp() : nullptr;
        if (!first || !split.count(first) || split[dot] == split[first]) continue;
        const WarpgroupSplit& fewer = split[dot].groups < split[first].groups ? split[dot] : split[first];
        split[dot] = split[first] = wgmma(dot) && wgmma(first) ? fewer : WarpgroupSplit{};
        changed = true;
      }
    }
    return split;
  }

  // ---- phase 1: plan ----------------------------------------------------------

  void planBlock(Block& b) {
    for (auto& op : b.ops()) planOp(*op);
  }

  void planOp(Op& op) {
    if (op.kind() == OpKind::For) return planFor(op);
    if (op.kind() == OpKind::ClusterAllGather) return planClusterAllGather(op);
    if (op.kind() == OpKind::LoadTagged) return planLoadTagged(op);
    if (op.numResults() != 1 || cls_.at(op.result()) != Class::Computed) return;
    Value* r = op.result();
    LayoutPtr l;
    switch (op.kind()) {
      case OpKind::Load:
        l = known(op.operand(0));
        if (!l) l = coalesced(op);
        break;
      case OpKind::AtomicAdd:
        l = atomicLayout(op);
        break;
      case OpKind::Dot:
        if (auto it = mma_.find(&op); it != mma_.end()) {
          l = it->second;
          break;
        }
        l = known(op.operand(2));
        if (!l) l = defaultLayout(r->type().shape());
        break;
      case OpKind::Reduce:
        if (auto x = reduceOperandLayout(op)) l = ir::makeLayout(x->sliced(int(op.intAttr("axis"))));
        break;
      default:
        if (!op.hasTrait(ir::kElementwise))
          throw Error(op.describe() + ": layout assignment does not know this op", ErrorKind::Internal);
        for (Value* o : op.operands())
          if ((l = known(o))) break;
        break;
    }
    setPlan(r, l);
  }

  // Each program's copy of a value arrives in the layout the value has here (every program of a
  // kernel lays it out alike), so each operand's results take its layout.
  void planClusterAllGather(const Op& op) {
    const size_t size = size_t(op.intAttr("size"));
    for (size_t i = 0; i < op.numOperands(); ++i) {
      const Value* x = op.operand(i);
      if (!x->type().isTile()) continue;
      LayoutPtr l = known(x);
      if (!l) l = defaultLayout(x->type().shape());
      for (size_t r = 0; r < size; ++r) setPlan(op.result(i * size + r), l);
    }
  }

  // Each result of a load_tagged as its pointer's layout (a load's rule, tile by tile).
  void planLoadTagged(const Op& op) {
    for (size_t t = 0; t < op.numResults(); ++t) {
      const Value* r = op.result(t);
      if (cls_.at(r) != Class::Computed) continue;
      LayoutPtr l = known(op.operand(t));
      if (!l) l = ir::makeLayout(coalescedLayoutFor(op.operand(t), maskOf(op, t), *axis_, numWarps_));
      setPlan(r, l);
    }
  }

  void setPlan(const Value* v, LayoutPtr l) {
    if (l)
      layout_[v] = std::move(l);
    else
      layout_.erase(v);
  }

  void planFor(Op& op) {
    Block& body = op.region();
    const size_t n = op.numResults();
    std::vector<LayoutPtr> carried(n);
    for (size_t i = 0; i < n; ++i)
      if (op.result(i)->type().isTile()) carried[i] = known(op.operand(3 + i));
    auto planBody = [&] {
      for (size_t i = 0; i < n; ++i) setPlan(body.arg(1 + i), carried[i]);
      planBlock(body);
    };
    // Each round fixes at least one more carried value or stops.
    for (;;) {
      planBody();
      bool changed = false;
      const Op* yield = body.terminator();
      for (size_t i = 0; i < n; ++i)
        if (!carried[i] && op.result(i)->type().isTile())
          if (auto l = known(yield->operand(i))) {
            carried[i] = l;
            changed = true;
          }
      if (!changed) break;
    }
    // An accumulator carried around the loop stays in the layout its dot
    // computes in, even when its init has another one: the init is converted
    // once before the loop rather than the accumulator twice per iteration.
    bool replan = false;
    const Op* yield = body.terminator();
    for (size_t i = 0; i < n; ++i) {
      const Op* def = yield->operand(i)->definingOp();
      if (!def || def->kind() != OpKind::Dot || !mma_.count(def)) continue;
      if (!carried[i] || *carried[i] != *mma_.at(def)) {
        carried[i] = mma_.at(def);
        replan = true;
      }
    }
    if (replan) planBody();
    bool fellBack = false;
    for (size_t i = 0; i < n; ++i) {
      if (carried[i] || !op.result(i)->type().isTile()) continue;
      Value* arg = body.arg(1 + i);
      carried[i] = requiredBy(body, arg);
      if (!carried[i] && arg->type().isPointer()) {
        const Shape& s = arg->type().shape();
        int dim = fastestDim(arg, *axis_);
        int64_t vec = vectorWidth(arg, *axis_, nullptr, dim);
        vec = std::min(vec, floorPow2(std::max<int64_t>(1, ir::numElements(s) / (32 * numWarps_))));
        carried[i] = ir::makeLayout(blockedLayout(s, numWarps_, dim, vec));
      }
      if (!carried[i]) carried[i] = defaultLayout(arg->type().shape());
      fellBack = true;
    }
    if (fellBack) planBody();
    for (size_t i = 0; i < n; ++i) setPlan(op.result(i), carried[i]);
  }

  // The layout that the ops of `body` require of `v` (a computed value whose
  // layout is still unknown), looking through element-wise ops and views
  // whose layouts are unknown too; null if nothing requires one.
  LayoutPtr requiredBy(Block& body, Value* v) {
    std::vector<Op*> ops;
    std::function<void(Block&)> collect = [&](Block& b) {
      for (auto& op : b.ops()) {
        ops.push_back(op.get());
        for (auto& region : op->regions()) collect(*region);
      }
    };
    collect(body);
    std::unordered_map<const Value*, LayoutPtr> wish;
    auto unknownValue = [&](const Value* x) { return x->type().isTile() && !known(x) && cls_.at(x) != Class::Cheap; };
    for (Op* op : ops) {
      if (op->numResults() && flexible(op->result())) continue;
      auto req = operandRequirements(*op);
      for (size_t i = 0; i < op->numOperands(); ++i)
        if (req[i] && unknownValue(op->operand(i))) wish.emplace(op->operand(i), req[i]);
    }
    // Backwards through element-wise ops (all operands share the result's
    // layout) and views (the operand layout follows from the result's).
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      Op* op = *it;
      if (op->numResults() != 1) continue;
      auto w = wish.find(op->result());
      if (w == wish.end()) continue;
      LayoutPtr want = w->second;
      if (op->hasTrait(ir::kElementwise) && (cls_.at(op->result()) == Class::View || !known(op->result()))) {
        for (Value* o : op->operands())
          if (unknownValue(o)) wish.emplace(o, want);
      } else if (isViewOp(op->kind()) && cls_.at(op->result()) == Class::View) {
        auto req = viewOperandLayouts(*op, *want);
        if (req[0] && unknownValue(op->operand(0))) wish.emplace(op->operand(0), req[0]);
      }
    }
    auto it = wish.find(v);
    return it == wish.end() ? nullptr : it->second;
  }

  // ---- requirements -------------------------------------------------------------

  // The layout each operand of a non-cheap, non-view op must have (null: no
  // requirement, e.g. a scalar, or not yet known while planning).
  std::vector<LayoutPtr> operandRequirements(const Op& op) const {
    std::vector<LayoutPtr> req(op.numOperands());
    auto tile = [&](size_t i) { return op.operand(i)->type().isTile(); };
    switch (op.kind()) {
      case OpKind::Load:
        if (op.result()->type().isTile()) {
          LayoutPtr l = known(op.result());
          for (size_t i = 0; i < op.numOperands(); ++i) req[i] = tile(i) ? l : nullptr;
        }
        break;
      case OpKind::LoadTagged:
        for (size_t t = 0; t < op.numResults(); ++t) {
          if (!op.result(t)->type().isTile()) continue;
          req[t] = known(op.result(t));
          if (const size_t m = ir::loadTaggedMaskIndex(op, t)) req[m] = req[t];
        }
        break;
      case OpKind::StoreTagged:
      case OpKind::Store:
        if (LayoutPtr l = storeLayout(op))
          for (size_t i = 0; i < op.numOperands(); ++i) req[i] = tile(i) ? l : nullptr;
        break;
      case OpKind::AtomicAdd:
        if (op.result()->type().isTile()) {
          LayoutPtr l = known(op.result());
          for (size_t i = 0; i < op.numOperands(); ++i) req[i] = tile(i) ? l : nullptr;
        }
        break;
      case OpKind::Reduce:
        if (tile(0)) req[0] = reduceOperandLayout(op);
        break;
      case OpKind::ClusterAllGather:
        for (size_t i = 0; i < op.numOperands(); ++i)
          if (tile(i)) req[i] = known(op.result(i * size_t(op.intAttr("size"))));
        break;
      case OpKind::Dot:
        if (auto it = mma_.find(&op); it != mma_.end()) {
          const int64_t K = op.operand(0)->type().shape()[1];
          const int bits = mmaOperandBits(op.operand(0)->type().dtype());
          for (int i = 0; i < 2; ++i) req[size_t(i)] = ir::makeLayout(Layout::dotOperand(*it->second, i, K, bits));
        } else {
          for (size_t i = 0; i < 2; ++i) req[i] = anyLayoutFor(op.operand(i));
        }
        req[2] = known(op.result());
        break;
      case OpKind::For:
        for (size_t i = 3; i < op.numOperands(); ++i)
          if (tile(i)) req[i] = known(op.region().arg(i - 2));
        break;
      case OpKind::Yield: {
        const Op* loop = op.parentBlock()->parentOp();
        if (!loop || loop->kind() != OpKind::For) throw Error(op.describe() + ": yield outside a for loop");
        for (size_t i = 0; i < op.numOperands(); ++i)
          if (tile(i)) req[i] = known(loop->region().arg(1 + i));
        break;
      }
      case OpKind::Return:
        break;
      default:
        if (op.hasTrait(ir::kElementwise) && op.numResults() == 1 && op.result()->type().isTile()) {
          LayoutPtr l = known(op.result());
          for (size_t i = 0; i < op.numOperands(); ++i) req[i] = tile(i) ? l : nullptr;
        }
        break;
    }
    return req;
  }

  // For a cheap or view op whose result must be laid out as `l`: the layouts
  // its tile operands must have.
  std::vector<LayoutPtr> viewOperandLayouts(const Op& op, const Layout& l) const {
    std::vector<LayoutPtr> req(op.numOperands());
    if (op.numOperands() == 0 || op.kind() == OpKind::Splat) return req;
    auto tile = [&](size_t i) { return op.operand(i)->type().isTile(); };
    switch (op.kind()) {
      case OpKind::Broadcast:
        if (tile(0)) req[0] = ir::makeLayout(l.projected(op.operand(0)->type().shape()));
        break;
      case OpKind::ExpandDims:
        if (tile(0)) req[0] = ir::makeLayout(l.sliced(int(op.intAttr("axis"))));
        break;
      case OpKind::Reshape:
        if (tile(0)) req[0] = ir::makeLayout(l.reshaped(op.operand(0)->type().shape()));
        break;
      case OpKind::Trans: {
        const auto& perm = op.intsAttr("perm");
        std::vector<int> inverse(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int(i);
        if (tile(0)) req[0] = ir::makeLayout(l.transposed(inverse));
        break;
      }
      default: {
        auto shared = ir::makeLayout(l);
        for (size_t i = 0; i < op.numOperands(); ++i) req[i] = tile(i) ? shared : nullptr;
        break;
      }
    }
    return req;
  }

  // ---- phase 2: rewrite ---------------------------------------------------------

  void rewrite() {
    // Computed values take their planned layouts.
    for (auto& [v, l] : layout_) const_cast<Value*>(v)->setType(v->type().withLayout(l));
    // Requirements are read off the original program before anything
    // changes: materializing rewires operands of the cheap and view ops it
    // takes over, and the layout implied by a view must not depend on that.
    std::vector<std::pair<Op*, std::vector<LayoutPtr>>> work;  // clones and converts need no visit
    f_.walk([&](Op& op) {
      if (op.numResults() && flexible(op.result())) return;
      work.emplace_back(&op, operandRequirements(op));
    });
    for (auto& [op, req] : work)
      for (size_t i = 0; i < op->numOperands(); ++i)
        if (req[i]) op->setOperand(i, materialize(op->operand(i), req[i]));
  }

  // Where something computed from v goes: right after v's definition.
  void insertAfterDefinition(ir::Builder& b, Value* v) {
    if (Op* def = v->definingOp()) {
      b.setInsertionPointAfter(def);
    } else {
      Block* block = v->ownerBlock();
      b.setInsertionPoint(block, block->ops().begin());
    }
  }

  Value* materialize(Value* v, const LayoutPtr& l) {
    if (v->type().isScalar()) return v;
    auto key = std::make_pair(static_cast<const Value*>(v), l->str());
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    ir::Builder b(f_);
    Value* out = nullptr;
    if (cls_.at(v) == Class::Computed) {
      if (!v->type().hasLayout())
        throw Error("layout assignment: value %" + std::to_string(v->id()) + " (" + v->type().str() +
                    ") has no planned layout");
      if (*v->type().layout() == *l) return v;
      if (Value* again = reloadInLayout(v, l)) {
        memo_[key] = again;
        return again;
      }
      insertAfterDefinition(b, v);
      if (v->definingOp()) b.setLoc(v->definingOp()->loc());
      out = b.create1(OpKind::ConvertLayout, {v}, v->type().withLayout(l));
      out->setNameHint(v->nameHint());
      cls_[out] = Class::Computed;
    } else {
      Op* def = v->definingOp();
      auto req = viewOperandLayouts(*def, *l);
      std::vector<Value*> operands = def->operands();
      for (size_t i = 0; i < operands.size(); ++i)
        if (req[i]) operands[i] = materialize(operands[i], req[i]);
      if (!v->type().hasLayout()) {
        // The first demand takes over the original op.
        def->setOperands(std::move(operands));
        v->setType(v->type().withLayout(l));
        out = v;
      } else {
        insertAfterDefinition(b, v);
        b.setLoc(def->loc());
        out = b.create1(def->kind(), std::move(operands), v->type().withLayout(l), def->attrs());
        out->setNameHint(v->nameHint());
        cls_[out] = cls_.at(v);
      }
    }
    memo_[key] = out;
    return out;
  }

  // A small load whose address, mask and `other` are cheap (index tiles: a
  // mod reading document ids at the query and key positions) is issued again
  // in the layout its user needs instead of converted: a few more loads of
  // cached elements cost far less than a shared-memory round trip with two
  // barriers, in a loop body above all. The original load is erased in
  // cleanup when nothing else reads it.
  Value* reloadInLayout(Value* v, const LayoutPtr& l) {
    Op* load = v->definingOp();
    if (!load || load->kind() != OpKind::Load || v->type().numElements() > int64_t(64) * numWarps_) return nullptr;
    int64_t nonUnit = 0;  // vectors only ([N], [N, 1], [1, N]): never a dot operand's staging
    for (int64_t d : v->type().shape()) nonUnit += d > 1;
    if (nonUnit > 1) return nullptr;
    for (Value* o : load->operands())
      if (o->type().isTile() && (!flexible(o) || o->type().shape() != v->type().shape())) return nullptr;
    std::vector<Value*> operands = load->operands();
    for (Value*& o : operands)
      if (o->type().isTile()) o = materialize(o, l);
    ir::Builder b(f_);
    insertAfterDefinition(b, v);
    b.setLoc(load->loc());
    Value* out = b.create1(OpKind::Load, std::move(operands), v->type().withLayout(l), load->attrs());
    out->setNameHint(v->nameHint());
    cls_[out] = Class::Computed;
    reloaded_.insert(load);
    return out;
  }

  // ---- phase 3: cleanup -----------------------------------------------------------

  void cleanup() {
    std::vector<Op*> converts;
    f_.walk([&](Op& op) {
      if (op.kind() == OpKind::ConvertLayout) converts.push_back(&op);
    });
    for (Op* c : converts) {
      Value* src = c->operand(0);
      while (src->definingOp() && src->definingOp()->kind() == OpKind::ConvertLayout) src = src->definingOp()->operand(0);
      c->setOperand(0, src);
    }
    for (Op* c : converts)
      if (*c->operand(0)->type().layout() == *c->result()->type().layout()) {
        f_.replaceAllUsesWith(c->result(), c->operand(0));
        c->parentBlock()->erase(c);
      }
    eraseDeadOps();
    // A load issued again for every user is dead: loads are not pure (they
    // must not be merged across stores), so eraseDeadOps keeps them.
    std::unordered_map<const Value*, int> uses;
    f_.walk([&](Op& op) {
      for (Value* o : op.operands()) ++uses[o];
    });
    for (const Op* load : reloaded_)
      if (!uses.count(load->result())) const_cast<Op*>(load)->parentBlock()->erase(const_cast<Op*>(load));
    eraseDeadOps();
  }

  void eraseDeadOps() {
    for (bool changed = true; changed;) {
      changed = false;
      std::unordered_map<const Value*, int> uses;
      f_.walk([&](Op& op) {
        for (Value* o : op.operands()) ++uses[o];
      });
      std::vector<Op*> dead;
      f_.walk([&](Op& op) {
        if (!op.hasTrait(ir::kPure) || op.numResults() == 0) return;
        for (Value* r : op.results())
          if (uses.count(r)) return;
        dead.push_back(&op);
      });
      // Erase inner-most last-defined first so erased ops never hold uses.
      for (auto it = dead.rbegin(); it != dead.rend(); ++it) (*it)->parentBlock()->erase(*it);
      changed = !dead.empty();
    }
  }

  void checkAllLaidOut() {
    auto check = [&](const Value* v, const std::string& where) {
      if (v->type().isTile() && !v->type().hasLayout())
        throw Error(where + ": value %" + std::to_string(v->id()) + " of type " + v->type().str() +
                    " got no layout (layout assignment bug)");
    };
    for (Value* p : f_.params()) check(p, "function '" + f_.name() + "' parameter");
    f_.walk([&](Op& op) {
      for (Value* r : op.results()) check(r, op.describe());
      for (auto& region : op.regions())
        for (Value* a : region->args()) check(a, op.describe() + " region argument");
    });
  }

  ir::Function& f_;
  const Target& target_;
  int numWarps_;
  std::unique_ptr<AxisInfoAnalysis> axis_;
  std::unordered_map<const Value*, Class> cls_;
  std::unordered_map<const Value*, LayoutPtr> layout_;
  std::map<std::pair<const Value*, std::string>, Value*> memo_;
  std::unordered_set<const Op*> reloaded_;  // loads issued again in another layout (reloadInLayout)
  std::unordered_map<const Op*, LayoutPtr> mma_;  // dots on tensor cores -> accumulator layout
};

}  // namespace

void assignLayouts(ir::Function& f, const Target& target) {
  // IR of the memory/async level (what "pipeline" and "wgmma" print, or a hand-written kernel of
  // that level) comes laid out: its buffers' layouts were chosen for their readers, so they are
  // kept, and every tile must already have one.
  const ir::Op* asyncOp = nullptr;
  f.walk([&](const ir::Op& op) {
    if (!asyncOp && op.hasTrait(ir::kMemoryAsyncLevel)) asyncOp = &op;
  });
  if (!asyncOp) {
    LayoutAssigner(f, target).run();
    return;
  }
  f.walk([&](const ir::Op& op) {
    auto check = [&](const ir::Value* v) {
      if (v->type().isTile() && !v->type().hasLayout())
        throw Error("function '" + f.name() + "' has ops of the memory/async level (" + asyncOp->describe() +
                    "), so its layouts are kept as written, but " + op.describe() + " has a tile without one (" +
                    v->type().str() + "): give every tile a layout");
    };
    for (const ir::Value* v : op.operands()) check(v);
    for (const ir::Value* v : op.results()) check(v);
    for (const auto& region : op.regions())
      for (const ir::Value* a : region->args()) check(a);
  });
}

ir::Pass assignLayoutsPass(const Target& target) {
  return {"assign-layouts", [target](ir::Function& f) { assignLayouts(f, target); }};
}

}  // namespace flextile::codegen
