#include "ir/Verifier.h"

#include "ir/SharedLayout.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <unordered_set>

namespace flextile::ir {

namespace {

bool isPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

std::string elementString(const Type& t) { return t.scalarType().str(); }
bool sameElement(const Type& a, const Type& b) { return a.scalarType().sameShapeAndElement(b.scalarType()); }

std::string nth(std::string_view what, size_t i) { return std::string(what) + " #" + std::to_string(i); }

class Verifier {
 public:
  explicit Verifier(const Function& f) : f_(f) {}

  std::vector<std::string> run() {
    layoutsOn_ = anyTileHasLayout();
    scopes_.emplace_back();
    for (size_t i = 0; i < f_.params().size(); ++i) {
      Value* p = f_.params()[i];
      if (p->type().isTile())
        problem("function @" + f_.name() + ": " + nth("parameter", i) + " is a tile (" + p->type().str() +
                "); parameters are pointers and scalars");
      checkValue(p->type(), [&] { return "function @" + f_.name() + ": " + nth("parameter", i); });
    }
    block(f_.body(), nullptr);
    if (problems_.empty() && f_.intAttrOr("producer_warps", 0) > 0) producerSlice();
    return std::move(problems_);
  }

 private:
  void problem(std::string s) { problems_.push_back(std::move(s)); }
  void err(const Op& op, const std::string& s) {
    problem(op.describe() + ": " + s);
    opFailed_ = true;
  }

  bool anyTileHasLayout() const {
    bool any = false;
    auto note = [&](const Value* v) { any = any || (v->type().isTile() && v->type().hasLayout()); };
    for (Value* p : f_.params()) note(p);
    f_.walk([&](const Op& op) {
      for (Value* r : op.results()) note(r);
      for (const auto& region : op.regions())
        for (Value* a : region->args()) note(a);
    });
    return any;
  }

  // Rules for one value's type, independent of the op that makes it.
  // `describeWhere()` names the value in a problem: formed only when there is one (the verifier
  // runs after every pass; describing every result it checked, with a layout verified at every
  // use, made it a third of an interpreted test's time under the sanitizers).
  template <class DescribeWhere>
  void checkValue(const Type& t, const DescribeWhere& describeWhere) {
    if (t.isSharedBuffer()) {
      const SharedLayout& l = *t.sharedLayout();
      if (auto e = l.verify(); !e.empty()) problem(describeWhere() + " has an invalid shared layout " + l.str() + ": " + e);
      else if (l.shape() != t.shape() || l.elemBytes() != byteWidth(t.dtype()) || t.dtype() == DType::Ptr)
        problem(describeWhere() + " (" + t.str() + "): the shared layout must store the tile's shape and element size");
      if (t.slots() < 1 || t.slots() > 64) problem(describeWhere() + " (" + t.str() + ") must have 1 to 64 slots");
      if (t.hasLayout()) problem(describeWhere() + " (" + t.str() + ") is a shared buffer but has a register layout");
      return;
    }
    for (int64_t d : t.shape())
      if (!isPow2(d)) {
        problem(describeWhere() + " has shape " + shapeString(t.shape()) + ": tile dimensions must be powers of two");
        break;
      }
    if (t.numElements() > kMaxTileElements)  // numElements saturates: no overflow on any shape
      problem(describeWhere() + " has shape " + shapeString(t.shape()) + ": more than 2^31 elements in one tile");
    if (t.isScalar()) {
      if (t.hasLayout()) problem(describeWhere() + " is a scalar (" + t.str() + ") but has a layout; scalars never do");
      return;
    }
    if (!t.hasLayout()) {
      if (layoutsOn_) problem(describeWhere() + " (" + t.str() + ") has no layout, but other tiles do: either all tiles have "
                              "layouts or none does");
      return;
    }
    const Layout& l = *t.layout();
    if (l.shape() != t.shape()) {
      problem(describeWhere() + " (" + t.str() + ") has a layout of shape " + shapeString(l.shape()));
      return;
    }
    if (const std::string& e = layoutProblem(l); !e.empty()) problem(describeWhere() + " has an invalid layout " + l.str() + ": " + e);
    else if (l.numWarps() != f_.numWarps())
      problem(describeWhere() + " has a layout over " + std::to_string(l.numWarps()) + " warps, but the function has num_warps = " +
              std::to_string(f_.numWarps()));
  }

  bool visible(const Value* v) const {
    for (const auto& s : scopes_)
      if (s.count(v)) return true;
    return false;
  }

  void block(const Block& b, const Op* parent) {
    scopes_.emplace_back(b.args().begin(), b.args().end());
    for (size_t i = 0; i < b.args().size(); ++i)
      checkValue(b.arg(i)->type(), [&] {
        return (parent ? parent->describe() : "function @" + f_.name()) + ": region " + nth("argument", i);
      });
    for (auto it = b.ops().begin(); it != b.ops().end(); ++it) {
      const Op& op = **it;
      opFailed_ = false;
      for (size_t i = 0; i < op.numOperands(); ++i) {
        const Value* v = op.operand(i);
        if (!v) err(op, nth("operand", i) + " is null");
        else if (!visible(v))
          err(op, nth("operand", i) + " (" + v->type().str() +
                      ") is not defined before this use in this block or an enclosing one (SSA dominance)");
      }
      if (op.hasTrait(kTerminator) && std::next(it) != b.ops().end())
        err(op, "is a terminator but is not the last op of its block");
      if (op.kind() == OpKind::Return && parent) err(op, "'return' may only end the function body; use 'yield' in " + parent->describe());
      if (op.kind() == OpKind::Yield && (!parent || parent->kind() != OpKind::For))
        err(op, "'yield' may only end the body of a 'for'");
      for (size_t i = 0; i < op.numResults(); ++i)
        checkValue(op.result(i)->type(), [&] { return op.describe() + ": " + nth("result", i); });
      // Shared buffers are made by local_alloc and used by the async level's ops only: a buffer
      // carried by a loop, stored or computed on would have no meaning in registers.
      for (size_t i = 0; i < op.numResults(); ++i)
        if (op.result(i)->type().isSharedBuffer() && op.kind() != OpKind::LocalAlloc)
          err(op, nth("result", i) + " is a shared buffer (" + op.result(i)->type().str() + "); only local_alloc makes one");
      for (size_t i = 0; i < op.numOperands(); ++i)
        if (op.operand(i) && op.operand(i)->type().isSharedBuffer() &&
            !(i == 0 && (op.kind() == OpKind::AsyncCopy || op.kind() == OpKind::LocalLoad ||
                         op.kind() == OpKind::LocalStore || op.kind() == OpKind::MbarrierInit ||
                         op.kind() == OpKind::MbarrierArrive || op.kind() == OpKind::AsyncCopyArrive ||
                         op.kind() == OpKind::MbarrierWait || op.kind() == OpKind::MbarrierInval ||
                         op.kind() == OpKind::MbarrierExpectTx || op.kind() == OpKind::TmaCopy)) &&
            !(i == 2 && op.kind() == OpKind::TmaCopy))
          err(op, nth("operand", i) + " is a shared buffer (" + op.operand(i)->type().str() +
                      "); only operand 0 of async_copy, local_load, local_store and the mbarrier ops may be one");
      if (!opFailed_) this->op(op);
      for (const auto& region : op.regions()) block(*region, &op);
      for (Value* r : op.results()) scopes_.back().insert(r);
    }
    const Op* last = b.ops().empty() ? nullptr : b.ops().back().get();
    if (!parent && (!last || last->kind() != OpKind::Return))
      problem("function @" + f_.name() + ": body does not end with 'return'");
    if (parent && parent->kind() == OpKind::For && (!last || last->kind() != OpKind::Yield))
      problem(parent->describe() + ": body does not end with 'yield'");
    scopes_.pop_back();
  }

  // ---- per-op rules ----

  bool intAttrIn(const Op& op, const std::string& key, int64_t lo, int64_t hi) {
    auto it = op.attrs().find(key);
    if (it == op.attrs().end() || !std::holds_alternative<int64_t>(it->second)) {
      err(op, "needs an integer attribute '" + key + "'");
      return false;
    }
    int64_t v = std::get<int64_t>(it->second);
    if (v < lo || v > hi) {
      err(op, "attribute " + key + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
      return false;
    }
    return true;
  }

  bool strAttrIn(const Op& op, const std::string& key, std::initializer_list<std::string_view> allowed) {
    auto it = op.attrs().find(key);
    if (it == op.attrs().end() || !std::holds_alternative<std::string>(it->second)) {
      err(op, "needs a string attribute '" + key + "'");
      return false;
    }
    const auto& v = std::get<std::string>(it->second);
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return true;
    std::string list;
    for (auto a : allowed) list += (list.empty() ? "" : " ") + std::string(a);
    err(op, key + " \"" + v + "\" is not one of: " + list);
    return false;
  }

  void expectScalarOf(const Op& op, const Type& t, DType d, const std::string& what) {
    if (!t.isScalar() || t.dtype() != d) err(op, what + " must be a scalar " + std::string(dtypeName(d)) + ", got " + t.str());
  }

  // The attributes an op carries for itself, leaving out those of the warp-specialization marks
  // (codegen/passes/WarpSpecialize.cpp): `ws` on any op, `producer_carried` on a for.
  static bool markAttr(const Op& op, const std::string& key) {
    return key == "ws" || (key == "producer_carried" && op.kind() == OpKind::For);
  }
  static size_t ownAttrCount(const Op& op) {
    size_t n = 0;
    for (const auto& [k, v] : op.attrs()) n += !markAttr(op, k);
    return n;
  }
  static std::string firstOwnAttr(const Op& op) {
    for (const auto& [k, v] : op.attrs())
      if (!markAttr(op, k)) return k;
    return "";
  }
  // A warp-specialized function (producer_warps > 0, codegen/passes/WarpSpecialize.cpp): what the
  // producer runs (ws = "producer", "both", or "all": the prefix every thread runs) may only read parameters, results of ops it runs
  // too, and the arguments its copy of a loop keeps (the induction variable, producer_carried);
  // its loops' yields run in both roles. The lowering would otherwise find a value undefined in
  // the producer's copy of the body.
  static bool producerRuns(const Op* op) {
    auto it = op->attrs().find("ws");
    const auto* s = it == op->attrs().end() ? nullptr : std::get_if<std::string>(&it->second);
    return s && (*s == "producer" || *s == "both" || *s == "all");
  }
  void producerSlice() {
    f_.walk([&](const Op& op) {
      if (!producerRuns(&op)) return;
      if (op.kind() == OpKind::For) {
        const Op* yield = op.region(0).terminator();
        if (yield && !producerRuns(yield)) err(op, "runs in the producer (ws) but its yield does not");
      }
      for (size_t i = 0; i < op.numOperands(); ++i) {
        const Value* v = op.operand(i);
        if (op.kind() == OpKind::Yield && op.parentBlock()->parentOp() &&
            !keptByProducer(*op.parentBlock()->parentOp(), i + 1))
          continue;  // a carried value the producer's copy of the loop drops
        if (op.kind() == OpKind::For && i >= 3 && !keptByProducer(op, i - 2)) continue;
        if (const Op* d = v->definingOp()) {
          if (!producerRuns(d))
            err(op, "runs in the producer (ws) but its " + nth("operand", i) + " comes from " + d->describe() +
                        ", which only the consumers run");
        } else if (const Block* b = v->ownerBlock(); b && b->parentOp()) {
          const auto& args = b->args();
          const size_t index = size_t(std::find(args.begin(), args.end(), v) - args.begin());
          if (!producerRuns(b->parentOp()) || !keptByProducer(*b->parentOp(), index))
            err(op, "runs in the producer (ws) but its " + nth("operand", i) + " is an argument of " +
                        b->parentOp()->describe() + " that the producer's copy of the loop does not keep");
        }
      }
    });
  }
  // Whether the producer's copy of loop `loop` keeps its body argument `arg` (0: the induction
  // variable, i: carried value i-1 when producer_carried lists it).
  static bool keptByProducer(const Op& loop, size_t arg) {
    if (arg == 0) return true;
    auto it = loop.attrs().find("producer_carried");
    const auto* keep = it == loop.attrs().end() ? nullptr : std::get_if<std::vector<int64_t>>(&it->second);
    return keep && std::find(keep->begin(), keep->end(), int64_t(arg - 1)) != keep->end();
  }

  void warpMarks(const Op& op) {
    if (op.hasAttr("ws")) strAttrIn(op, "ws", {"producer", "both", "all"});
    if (op.hasAttr("producer_carried") && op.kind() == OpKind::For) {
      const auto* keep = std::get_if<std::vector<int64_t>>(&op.attrs().at("producer_carried"));
      const int64_t carried = int64_t(op.numOperands()) - 3;
      if (!keep) return err(op, "producer_carried must be a list of carried-value indices");
      for (int64_t i : *keep)
        if (i < 0 || i >= carried)
          err(op, "producer_carried names carried value " + std::to_string(i) + " of " + std::to_string(carried));
    }
  }

  void op(const Op& op) {
    warpMarks(op);
    const OpInfo& info = op.info();
    if (info.numOperands >= 0 && op.numOperands() != size_t(info.numOperands))
      err(op, "expects " + std::to_string(info.numOperands) + " operands, got " + std::to_string(op.numOperands()));
    if (info.numResults >= 0 && op.numResults() != size_t(info.numResults))
      err(op, "expects " + std::to_string(info.numResults) + " results, got " + std::to_string(op.numResults()));
    size_t regions = (info.traits & kHasRegion) ? 1 : 0;
    if (op.regions().size() != regions)
      err(op, "expects " + std::to_string(regions) + " regions, got " + std::to_string(op.regions().size()));
    if (opFailed_) return;

    auto in = [&](size_t i) -> const Type& { return op.operand(i)->type(); };
    auto out = [&](size_t i = 0) -> const Type& { return op.result(i)->type(); };
    lay_ = layoutsOn_ && layoutsUsable(op);

    switch (op.kind()) {
      case OpKind::ProgramId:
      case OpKind::NumPrograms:
        intAttrIn(op, "axis", 0, 2);
        expectScalarOf(op, out(), DType::I32, "the result");
        break;
      case OpKind::Constant: constant(op); break;
      case OpKind::Arange: {
        if (!intAttrIn(op, "start", INT32_MIN, INT32_MAX) || !intAttrIn(op, "end", INT32_MIN, INT32_MAX)) break;
        int64_t start = op.intAttr("start"), end = op.intAttr("end");
        if (end <= start) err(op, "end " + std::to_string(end) + " must be greater than start " + std::to_string(start));
        else if (out() != Type(DType::I32, {end - start}).withLayout(out().layout()))
          err(op, "result must be i32[" + std::to_string(end - start) + "], got " + out().str());
        break;
      }
      case OpKind::Splat:
        if (!in(0).isScalar()) err(op, "operand must be a scalar, got " + in(0).str());
        if (!out().isTile()) err(op, "result must be a tile, got " + out().str());
        if (!sameElement(in(0), out())) err(op, "result element " + elementString(out()) + " differs from operand " + in(0).str());
        break;
      case OpKind::Broadcast: broadcast(op); break;
      case OpKind::ExpandDims: {
        if (!intAttrIn(op, "axis", 0, in(0).rank())) break;
        Shape s = in(0).shape();
        s.insert(s.begin() + op.intAttr("axis"), 1);
        if (out().shape() != s || !sameElement(in(0), out()))
          err(op, "result must be " + in(0).withShape(s).str() + ", got " + out().str());
        else if (lay_ && in(0).isTile())
          sameLayout(op, *in(0).layout(), out().layout()->sliced(int(op.intAttr("axis"))), "operand",
                     "the result's layout sliced at the axis");
        break;
      }
      case OpKind::Reshape:
        if (!in(0).isTile() || !out().isTile() || in(0).numElements() != out().numElements() || !sameElement(in(0), out()))
          err(op, "cannot reshape " + in(0).str() + " to " + out().str() + ": needs tiles of one element type and count");
        else if (lay_)
          sameLayout(op, *out().layout(), in(0).layout()->reshaped(out().shape()), "result", "the operand's layout reshaped");
        break;
      case OpKind::Trans: trans(op); break;
      case OpKind::Load:
      case OpKind::Store: memory(op); break;
      case OpKind::AtomicAdd: atomicAdd(op); break;
      case OpKind::StoreTagged:
      case OpKind::LoadTagged: tagged(op); break;
      case OpKind::Fence:
        // Its only meaning is acq_rel at GPU scope: an attribute asking for another (a scope,
        // an ordering) would otherwise be ignored without a word.
        if (ownAttrCount(op) != 0) err(op, "takes no attributes (it is acq_rel at GPU scope), got '" + firstOwnAttr(op) + "'");
        break;
      case OpKind::GridDependency:
        if (strAttrIn(op, "kind", {"wait", "release"}) && ownAttrCount(op) != 1)
          for (const auto& [k, v] : op.attrs())
            if (k != "kind" && !markAttr(op, k)) {
              err(op, "takes only the attribute kind, got '" + k + "'");
              break;
            }
        break;
      case OpKind::GlobalTimer:  // the clock, i64
      case OpKind::SmId:         // the multiprocessor, i32
        if (ownAttrCount(op) != 0) err(op, "takes no attributes, got '" + firstOwnAttr(op) + "'");
        expectScalarOf(op, out(), op.kind() == OpKind::GlobalTimer ? DType::I64 : DType::I32, "the result");
        break;
      case OpKind::ClusterAllGather: clusterAllGather(op); break;
      case OpKind::Reduce: reduce(op); break;
      case OpKind::Dot: dot(op); break;
      case OpKind::For: forLoop(op); break;
      case OpKind::Yield:
      case OpKind::Return: break;  // placement is checked in block(), yield types in forLoop()
      case OpKind::LocalAlloc:
        if (!out().isSharedBuffer()) err(op, "result must be a shared buffer smem<S x T[...], #ft.shared<...>>, got " + out().str());
        break;
      case OpKind::AsyncCopy: asyncCopy(op); break;
      case OpKind::AsyncWait: intAttrIn(op, "pending", 0, 64); break;
      case OpKind::LocalLoad:
        if (!in(0).isSharedBuffer()) {
          err(op, "operand 0 must be a shared buffer, got " + in(0).str());
          break;
        }
        expectScalarOf(op, in(1), DType::I32, "the slot");
        if (!out().isTile() || out().shape() != in(0).shape() || out().dtype() != in(0).dtype())
          err(op, "result must be a " + std::string(dtypeName(in(0).dtype())) + shapeString(in(0).shape()) +
                      " tile (one slot of " + in(0).str() + "), got " + out().str());
        break;
      case OpKind::WgmmaWait:
        if (!intAttrIn(op, "pending", 0, 64)) break;
        if (op.numOperands() != op.numResults() || op.numOperands() == 0)
          err(op, "passes its operands through: it needs as many results as operands (at least one), got " +
                      std::to_string(op.numOperands()) + " and " + std::to_string(op.numResults()));
        else
          for (size_t i = 0; i < op.numOperands(); ++i)
            if (in(i) != out(i)) err(op, nth("result", i) + " must be " + nth("operand", i) + "'s type " + in(i).str() + ", got " + out(i).str());
        break;
      case OpKind::LocalStore:
        if (!in(0).isSharedBuffer()) {
          err(op, "operand 0 must be a shared buffer, got " + in(0).str());
          break;
        }
        expectScalarOf(op, in(1), DType::I32, "the slot");
        if (!in(2).isTile() || in(2).shape() != in(0).shape() || in(2).dtype() != in(0).dtype())
          err(op, "stored value must be a " + std::string(dtypeName(in(0).dtype())) + shapeString(in(0).shape()) +
                      " tile (one slot of " + in(0).str() + "), got " + in(2).str());
        break;
      case OpKind::MbarrierInit:
      case OpKind::MbarrierInval:
      case OpKind::MbarrierArrive:
      case OpKind::AsyncCopyArrive:
      case OpKind::MbarrierWait:
      case OpKind::MbarrierExpectTx:
        if (!barrierBuffer(op, 0)) break;
        if (op.numOperands() >= 2) expectScalarOf(op, in(1), DType::I32, "the slot");
        if (op.kind() == OpKind::MbarrierExpectTx) {
          expectScalarOf(op, in(2), DType::I1, "the issue predicate");
          if (!intAttrIn(op, "bytes", 0, (int64_t(1) << 20) - 1)) break;
          if (op.hasAttr("only_on") && !intAttrIn(op, "only_on", 0, 1)) break;
          if (ownAttrCount(op) != 1 + size_t(op.hasAttr("only_on")))
            err(op, "takes only the attributes 'bytes' and 'only_on'");
        } else if (op.kind() == OpKind::MbarrierInit) {
          if (op.hasAttr("arrivals") && !intAttrIn(op, "arrivals", 1, 1)) break;
          if (ownAttrCount(op) > size_t(op.hasAttr("arrivals")))
            err(op, "takes only the attribute 'arrivals' (1: one arrival per phase), got another");
        } else if (op.kind() == OpKind::MbarrierWait) {
          expectScalarOf(op, in(2), DType::I32, "the phase parity");
          if (op.hasAttr("issuer") && !intAttrIn(op, "issuer", 1, 1)) break;
          if (ownAttrCount(op) > size_t(op.hasAttr("issuer")))
            err(op, "takes only the attribute 'issuer' (1: only the thread that issues the TMA copies waits), got another");
        } else {
          if (ownAttrCount(op) != 0) err(op, "takes no attributes, got '" + firstOwnAttr(op) + "'");
        }
        break;
      case OpKind::TmaCopy: tmaCopy(op); break;
      case OpKind::WarpgroupTurn: {
        if (!strAttrIn(op, "step", {"open", "begin", "end", "close"})) break;
        const bool handshake = op.hasAttr("handshake");
        if (handshake && (op.strAttr("step") != "close" || op.intAttr("handshake") != 1))
          err(op, "takes 'handshake = 1' on its close step only");
        if (ownAttrCount(op) != 1 + size_t(handshake)) err(op, "takes only the attributes 'step' and (on a close) 'handshake'");
        break;
      }
      case OpKind::AsyncCommit:
      case OpKind::Barrier:
      case OpKind::FenceAsyncShared:
        if (ownAttrCount(op) != 0) err(op, "takes no attributes, got '" + firstOwnAttr(op) + "'");
        break;
      case OpKind::ConvertLayout:
        if (in(0).shape() != out().shape() || !sameElement(in(0), out()))
          err(op, "result " + out().str() + " must have the operand's shape and element type " + in(0).str());
        if (!layoutsOn_) err(op, "appears before layout assignment (no tile has a layout)");
        break;
      default:
        if (op.hasTrait(kElementwise)) elementwise(op);
        break;
    }
  }

  bool barrierBuffer(const Op& op, size_t i) {
    const Type& t = op.operand(i)->type();
    if (t.isSharedBuffer() && t.dtype() == DType::I64 && numElements(t.shape()) == 1) return true;
    err(op, nth("operand", i) + " must be a buffer of barriers smem<S x i64[1], #ft.shared<...>>, got " + t.str());
    return false;
  }

  // tma_copy (buf, slot, bars, barSlot, on, base, dims[R], strides[R-1], coords[R]).
  void tmaCopy(const Op& op) {
    const size_t n = op.numOperands();
    if (n < 8 || (n - 5) % 3 != 0 || (n - 5) / 3 > 5) {
      err(op, "takes buf, slot, bars, barSlot, on, base, then R dims, R-1 strides and R coords (rank 1 to 5), got " +
                  std::to_string(n) + " operands");
      return;
    }
    const size_t rank = (n - 5) / 3;
    const Type& buf = op.operand(0)->type();
    if (!buf.isSharedBuffer()) {
      err(op, "operand 0 must be a shared buffer, got " + buf.str());
      return;
    }
    expectScalarOf(op, op.operand(1)->type(), DType::I32, "the slot");
    if (!barrierBuffer(op, 2)) return;
    expectScalarOf(op, op.operand(3)->type(), DType::I32, "the barrier slot");
    expectScalarOf(op, op.operand(4)->type(), DType::I1, "the issue predicate");
    const Type& base = op.operand(5)->type();
    if (!base.isPointer() || !base.isScalar() || base.pointee() != buf.dtype())
      err(op, "operand 5 (the tensor's base) must be a scalar pointer to " + std::string(dtypeName(buf.dtype())) +
                  " (the buffer's element), got " + base.str());
    if (buf.shape().size() > rank)
      err(op, "the slot's shape " + shapeString(buf.shape()) + " has more dimensions than the tensor's rank " +
                  std::to_string(rank));
    for (size_t i = 6; i < n; ++i) expectScalarOf(op, op.operand(i)->type(), DType::I32, nth("operand", i));
    if (ownAttrCount(op) != 0) err(op, "takes no attributes, got '" + firstOwnAttr(op) + "'");
  }

  void constant(const Op& op) {
    const Type& t = op.result()->type();
    auto it = op.attrs().find("value");
    if (it == op.attrs().end()) return err(op, "needs a 'value' attribute");
    if (t.isPointer()) return err(op, "cannot make a pointer constant");
    if (isFloat(t.dtype())) {
      if (!std::holds_alternative<double>(it->second) && !std::holds_alternative<int64_t>(it->second))
        err(op, "value of a " + t.str() + " constant must be a number");
      return;
    }
    if (!std::holds_alternative<int64_t>(it->second)) return err(op, "value of a " + t.str() + " constant must be an integer");
    int64_t v = std::get<int64_t>(it->second);
    int bits = bitWidth(t.dtype());
    bool fits = bits == 64 || (bits == 1 ? (v == 0 || v == 1)
                                         : v >= -(int64_t(1) << (bits - 1)) && v < (int64_t(1) << (bits - 1)));
    if (!fits) err(op, "value " + std::to_string(v) + " does not fit in " + elementString(t));
  }

  void broadcast(const Op& op) {
    const Type &x = op.operand(0)->type(), &r = op.result()->type();
    bool ok = x.isTile() && x.rank() == r.rank() && sameElement(x, r);
    for (int d = 0; ok && d < x.rank(); ++d) ok = x.shape()[d] == r.shape()[d] || x.shape()[d] == 1;
    if (!ok) return err(op, "cannot broadcast " + x.str() + " to " + r.str() + ": needs equal rank, and each dim equal or 1");
    if (lay_) sameLayout(op, *x.layout(), r.layout()->projected(x.shape()), "operand", "the result's layout projected");
  }

  void trans(const Op& op) {
    const Type &x = op.operand(0)->type(), &r = op.result()->type();
    auto it = op.attrs().find("perm");
    if (it == op.attrs().end() || !std::holds_alternative<std::vector<int64_t>>(it->second))
      return err(op, "needs an integer-list attribute 'perm'");
    const auto& perm = std::get<std::vector<int64_t>>(it->second);
    std::vector<int64_t> sorted = perm;
    std::sort(sorted.begin(), sorted.end());
    bool isPerm = int(perm.size()) == x.rank();
    for (size_t i = 0; isPerm && i < sorted.size(); ++i) isPerm = sorted[i] == int64_t(i);
    if (!isPerm || !x.isTile()) return err(op, "perm " + attrText(perm) + " is not a permutation of the dims of " + x.str());
    Shape s;
    for (int64_t p : perm) s.push_back(x.shape()[size_t(p)]);
    if (r.shape() != s || !sameElement(x, r)) return err(op, "result must be " + x.withShape(s).str() + ", got " + r.str());
    if (lay_)
      sameLayout(op, *r.layout(), x.layout()->transposed(std::vector<int>(perm.begin(), perm.end())), "result",
                 "the operand's layout transposed");
  }

  static std::string attrText(const std::vector<int64_t>& v) { return attrString(v); }

  void elementwise(const Op& op) {
    const Type& r = op.result()->type();
    for (size_t i = 0; i < op.numOperands(); ++i)
      if (op.operand(i)->type().shape() != r.shape())
        return err(op, "operands and result must have one shape: " + nth("operand", i) + " is " +
                           op.operand(i)->type().str() + ", result is " + r.str());
    auto in = [&](size_t i) -> const Type& { return op.operand(i)->type(); };
    switch (op.kind()) {
      case OpKind::Cmp: {
        bool predOk = strAttrIn(op, "pred", {"eq", "ne", "lt", "le", "gt", "ge"});
        if (!sameElement(in(0), in(1))) err(op, "compares " + in(0).str() + " with " + in(1).str() + "; dtypes must match");
        // Pointers of different buffers have no order (the interpreter keeps a pointer as buffer and offset).
        if (predOk && in(0).isPointer() && op.strAttr("pred") != "eq" && op.strAttr("pred") != "ne")
          err(op, "pointers compare only with eq or ne, got pred \"" + op.strAttr("pred") + "\"");
        if (r.dtype() != DType::I1) err(op, "result must be i1, got " + r.str());
        break;
      }
      case OpKind::Select:
        if (in(0).dtype() != DType::I1) err(op, "condition must be i1, got " + in(0).str());
        if (!sameElement(in(1), r) || !sameElement(in(2), r))
          err(op, "both choices must have the result's dtype " + elementString(r) + ", got " + in(1).str() + " and " +
                      in(2).str());
        break;
      case OpKind::Cast:
        if (in(0).isPointer() || r.isPointer()) err(op, "cannot cast " + in(0).str() + " to " + r.str() + ": no pointer casts");
        break;
      case OpKind::AddPtr:
        if (!in(0).isPointer()) err(op, "first operand must be a pointer, got " + in(0).str());
        if (in(1).dtype() != DType::I32 && in(1).dtype() != DType::I64)
          err(op, "offset must be i32 or i64, got " + in(1).str());
        if (!sameElement(in(0), r)) err(op, "result " + r.str() + " must have the pointer type of " + in(0).str());
        break;
      default:
        for (size_t i = 0; i < op.numOperands(); ++i)
          if (!sameElement(in(i), r))
            return err(op, "operands and result must have one dtype: " + nth("operand", i) + " is " + in(i).str() +
                               ", result is " + r.str());
        if (r.isPointer()) return err(op, "does not apply to pointers (" + r.str() + "); use addptr");
        if (op.hasTrait(kFloatOnly) && !isFloat(r.dtype())) err(op, "needs a float dtype, got " + r.str());
        if (op.hasTrait(kIntOnly) && !isInteger(r.dtype()))
          err(op, "needs an integer dtype, got " + r.str());
        break;
    }
    if (lay_ && !opFailed_ && r.isTile()) {
      for (size_t i = 0; i < op.numOperands(); ++i)
        if (!sameLayout(op, *in(i).layout(), *r.layout(), nth("operand", i), "the result")) break;
    }
  }

  void memory(const Op& op) {
    bool isLoad = op.kind() == OpKind::Load;
    size_t lo = isLoad ? 1 : 2, n = op.numOperands();
    if (isLoad && op.hasAttr("tensor_rank") && !tensorBox(op)) return;
    if (isLoad) n = operandsBeforeBox(op);  // a tensor box's operands are checked by tensorBox
    if (n < lo || n > lo + (isLoad ? 2 : 1))
      return err(op, "takes " + std::to_string(lo) + " to " + std::to_string(isLoad ? lo + 2 : lo + 1) + " operands, got " +
                         std::to_string(n));
    const Type& p = op.operand(0)->type();
    if (!p.isPointer()) return err(op, "address must be a pointer, got " + p.str());
    if (p.pointee() == DType::Ptr) return err(op, "cannot load or store pointers (address " + p.str() + ")");
    Type value = Type(p.pointee(), p.shape());
    const Type& v = isLoad ? op.result()->type() : op.operand(1)->type();
    if (!v.sameShapeAndElement(value))
      err(op, std::string(isLoad ? "result" : "stored value") + " must be " + value.str() + " to match address " + p.str() +
                  ", got " + v.str());
    size_t maskIndex = isLoad ? 1 : 2;
    if (n > maskIndex) {
      const Type& m = op.operand(maskIndex)->type();
      if (m.dtype() != DType::I1 || m.shape() != p.shape())
        err(op, "mask must be " + Type(DType::I1, p.shape()).str() + ", got " + m.str());
    }
    if (isLoad && n > 2 && !op.operand(2)->type().sameShapeAndElement(value))
      err(op, "'other' must be " + value.str() + ", got " + op.operand(2)->type().str());
    if (lay_ && !opFailed_ && p.isTile()) {
      for (size_t i = 1; i < n; ++i)
        if (!sameLayout(op, *op.operand(i)->type().layout(), *p.layout(), nth("operand", i), "the address")) return;
      if (isLoad) sameLayout(op, *v.layout(), *p.layout(), "result", "the address");
    }
  }

  // load (p, mask, other, base, dims[R], strides[R-1], coords[R]) {tensor_rank = R}, and
  // atomic_add (p, value, mask, base, ...) the same.
  bool tensorBox(const Op& op) {
    const auto& attr = op.attrs().at("tensor_rank");
    const int64_t* rank = std::get_if<int64_t>(&attr);
    if (!rank || *rank < 1 || *rank > 5) {
      err(op, "'tensor_rank' must be an integer from 1 to 5 (a TMA box's rank)");
      return false;
    }
    const size_t n = op.numOperands(), want = size_t(3 + 3 * *rank);
    if (n != want) {
      err(op, "with tensor_rank = " + std::to_string(*rank) + " takes " +
                  (op.kind() == OpKind::Load ? "p, mask, other" : "p, value, mask") + ", base, then " +
                  std::to_string(*rank) + " dims, " + std::to_string(*rank - 1) + " strides and " + std::to_string(*rank) +
                  " coords (" + std::to_string(want) + " operands), got " + std::to_string(n));
      return false;
    }
    const Type& p = op.operand(0)->type();
    const Type& base = op.operand(3)->type();
    if (p.isPointer() && (!base.isPointer() || !base.isScalar() || base.pointee() != p.pointee())) {
      err(op, "operand 3 (the tensor's base) must be a scalar pointer to " + std::string(dtypeName(p.pointee())) + ", got " +
                  base.str());
      return false;
    }
    if (p.isTile() && int64_t(p.rank()) > *rank) {
      err(op, "its tile " + shapeString(p.shape()) + " has more dimensions than the tensor's rank " + std::to_string(*rank));
      return false;
    }
    for (size_t i = 4; i < n; ++i) {
      const Type& t = op.operand(i)->type();
      if (!t.isScalar() || t.dtype() != DType::I32) {
        err(op, nth("operand", i) + " (a dim, stride or coordinate of the tensor box) must be a scalar i32, got " + t.str());
        return false;
      }
    }
    return true;
  }

  // async_copy (buf, slot, ptr [, mask]) {vec}: one slot's tile from global memory.
  void asyncCopy(const Op& op) {
    const size_t n = op.numOperands();
    if (n < 3 || n > 4) return err(op, "takes 3 to 4 operands (buf, slot, ptr [, mask]), got " + std::to_string(n));
    const Type& buf = op.operand(0)->type();
    if (!buf.isSharedBuffer()) return err(op, "operand 0 must be a shared buffer, got " + buf.str());
    expectScalarOf(op, op.operand(1)->type(), DType::I32, "the slot");
    const Type& p = op.operand(2)->type();
    if (!p.isPointer() || !p.isTile() || p.shape() != buf.shape() || p.pointee() != buf.dtype())
      return err(op, "address must be a ptr<" + std::string(dtypeName(buf.dtype())) + ">" + shapeString(buf.shape()) +
                         " tile (one slot of " + buf.str() + "), got " + p.str());
    if (n > 3) {
      const Type& m = op.operand(3)->type();
      if (m.dtype() != DType::I1 || m.shape() != p.shape()) err(op, "mask must be " + Type(DType::I1, p.shape()).str() + ", got " + m.str());
      else if (lay_ && !sameLayout(op, *m.layout(), *p.layout(), "mask", "the address")) return;
    }
    if (!intAttrIn(op, "vec", 1, 16)) return;
    const int64_t bytes = op.intAttr("vec") * byteWidth(buf.dtype());
    if (bytes != 4 && bytes != 8 && bytes != 16)
      err(op, "copies " + std::to_string(bytes) + " bytes per instruction (vec = " + std::to_string(op.intAttr("vec")) +
                  "); cp.async copies 4, 8 or 16");
    else if (lay_ && p.layout()->contiguousRegisters(buf.sharedLayout()->order()[0]) % op.intAttr("vec") != 0)
      err(op, "vec = " + std::to_string(op.intAttr("vec")) + " is wider than the address layout's contiguous registers");
  }

  // atomic_add (ptr, value [, mask]) -> T: the rules of a store, plus the
  // dtypes the hardware adds atomically and a result shaped like the value.
  void atomicAdd(const Op& op) {
    if (op.hasAttr("tensor_rank") && !tensorBox(op)) return;
    const size_t n = operandsBeforeBox(op);  // a tensor box's operands are checked by tensorBox
    if (n < 2 || n > 3) return err(op, "takes 2 to 3 operands (ptr, value [, mask]), got " + std::to_string(n));
    const Type& p = op.operand(0)->type();
    if (!p.isPointer()) return err(op, "address must be a pointer, got " + p.str());
    const DType t = p.pointee();
    if (t != DType::F32 && t != DType::I32 && t != DType::I64)
      return err(op, "adds f32, i32 or i64 atomically, not " + std::string(dtypeName(t)) + " (address " + p.str() + ")");
    Type value = Type(t, p.shape());
    const Type& v = op.operand(1)->type();
    if (!v.sameShapeAndElement(value))
      err(op, "added value must be " + value.str() + " to match address " + p.str() + ", got " + v.str());
    if (n > 2) {
      const Type& m = op.operand(2)->type();
      if (m.dtype() != DType::I1 || m.shape() != p.shape())
        err(op, "mask must be " + Type(DType::I1, p.shape()).str() + ", got " + m.str());
    }
    const Type& r = op.result()->type();
    if (!r.sameShapeAndElement(value)) err(op, "result (the old values) must be " + value.str() + ", got " + r.str());
    if (op.hasAttr("order") && strAttrIn(op, "order", {"relaxed", "acq_rel"}) && op.strAttr("order") == "acq_rel" &&
        !p.isScalar())
      err(op, "order = \"acq_rel\" is a program's one ticket: it takes a scalar address, not " + p.str());
    if (op.hasAttr("bulk_rows")) {
      // Whole rows through the bulk-copy engine (codegen/passes/BulkReduce.cpp), which returns no old values.
      if (!intAttrIn(op, "bulk_rows", 0, 1)) return;
      if (op.intAttr("bulk_rows") == 1 && (!p.isTile() || p.rank() != 2 || t != DType::F32))
        return err(op, "bulk_rows = 1 adds whole rows of an f32 rank-2 tile, not through " + p.str());
      if (op.intAttr("bulk_rows") == 1 && f_.hasUses(op.result()))
        return err(op, "bulk_rows = 1 gives no old values, but its result is used");
    }
    if (op.hasAttr("bulk_tensor")) {
      // The whole tile by one TMA reduction (codegen/passes/BulkReduce.cpp), which returns no old values.
      if (!intAttrIn(op, "bulk_tensor", 0, 1)) return;
      if (op.intAttr("bulk_tensor") == 1 &&
          (!op.hasAttr("tensor_rank") || !p.isTile() || p.rank() != 2 || t != DType::F32))
        return err(op, "bulk_tensor = 1 adds an f32 rank-2 tile that is a tensor box (tensor_rank), not " + p.str());
      if (op.intAttr("bulk_tensor") == 1 && f_.hasUses(op.result()))
        return err(op, "bulk_tensor = 1 gives no old values, but its result is used");
      if (op.intAttr("bulk_tensor") == 1 && op.hasAttr("bulk_rows") && op.intAttr("bulk_rows") == 1)
        return err(op, "bulk_tensor = 1 and bulk_rows = 1 are two lowerings: an op takes one");
    }
    if (lay_ && !opFailed_ && p.isTile()) {
      for (size_t i = 1; i < n; ++i)
        if (!sameLayout(op, *op.operand(i)->type().layout(), *p.layout(), nth("operand", i), "the address")) return;
      sameLayout(op, *r.layout(), *p.layout(), "result", "the address");
    }
  }

  // store_tagged (p, v, tag [, mask]): p ptr<i64>, v f32 of p's shape, tag an i32 scalar.
  // load_tagged (p..., tag [, mask...]) -> f32...: n pointers and n results, masks for all or none.
  void tagged(const Op& op) {
    const bool isLoad = op.kind() == OpKind::LoadTagged;
    const size_t n = op.numOperands(), tiles = isLoad ? op.numResults() : 1;
    if (isLoad ? (tiles == 0 || (n != tiles + 1 && n != 2 * tiles + 1)) : (n < 3 || n > 4))
      return err(op, isLoad ? "takes pointers, a tag and a mask for each pointer or none (one result per pointer), got " +
                                  std::to_string(n) + " operands and " + std::to_string(tiles) + " results"
                            : "takes 3 to 4 operands (ptr, value, tag [, mask]), got " + std::to_string(n));
    if (ownAttrCount(op) != 0) return err(op, "takes no attributes, got '" + firstOwnAttr(op) + "'");
    const size_t tagAt = isLoad ? tiles : 2;
    const Type& tag = op.operand(tagAt)->type();
    if (!tag.isScalar() || tag.dtype() != DType::I32) err(op, "the tag must be an i32 scalar, got " + tag.str());
    for (size_t i = 0; i < tiles; ++i) {
      const Type& p = op.operand(i)->type();
      if (!p.isPointer() || p.pointee() != DType::I64) {
        err(op, "address must be a pointer to i64 (a tagged word: tag << 32 | value bits), got " + p.str());
        continue;
      }
      const Type value(DType::F32, p.shape());
      const Type& v = isLoad ? op.result(i)->type() : op.operand(1)->type();
      if (!v.sameShapeAndElement(value))
        err(op, std::string(isLoad ? "result" : "stored value") + " must be " + value.str() + " to match address " +
                    p.str() + ", got " + v.str());
      const size_t maskAt = isLoad ? loadTaggedMaskIndex(op, i) : (n > 3 ? 3 : 0);
      const Value* mask = maskAt ? op.operand(maskAt) : nullptr;
      if (mask && (mask->type().dtype() != DType::I1 || mask->type().shape() != p.shape()))
        err(op, "mask must be " + Type(DType::I1, p.shape()).str() + ", got " + mask->type().str());
      if (lay_ && !opFailed_ && p.isTile()) {
        if (!isLoad && !sameLayout(op, *v.layout(), *p.layout(), "operand #1", "the address")) return;
        if (mask && !sameLayout(op, *mask->type().layout(), *p.layout(), nth("operand", maskAt), "the address")) return;
        if (isLoad && !sameLayout(op, *v.layout(), *p.layout(), nth("result", i), "its address")) return;
      }
    }
  }

  // cluster_all_gather (x...) {size = C} -> C results per operand, each the operand's type.
  void clusterAllGather(const Op& op) {
    if (!intAttrIn(op, "size", 2, 8)) return;
    const int64_t size = op.intAttr("size");
    for (const auto& [key, value] : op.attrs())
      if (!markAttr(op, key) && key != "size" && key != "to" && key != "rows")
        return err(op, "takes the attributes size, to and rows, got '" + key + "'");
    if (op.hasAttr("to") && !intAttrIn(op, "to", 0, size - 1)) return;
    if (op.hasAttr("rows")) {
      if (!intAttrIn(op, "rows", 1, int64_t(1) << 30)) return;
      const int64_t rows = op.intAttr("rows");
      if (!isPow2(rows)) return err(op, "rows = " + std::to_string(rows) + " is not a power of two");
      for (size_t i = 0; i < op.numOperands(); ++i) {
        const Type& x = op.operand(i)->type();
        if (x.isTile() && x.shape()[0] < rows)
          return err(op, "rows = " + std::to_string(rows) + " is more than " + nth("operand", i) + "'s dim 0 (" +
                             x.str() + ")");
      }
    }
    if (clusterSize_ && *clusterSize_ != size)
      return err(op, "gathers over clusters of " + std::to_string(size) + " programs, but an earlier cluster_all_gather of " +
                         "the function over " + std::to_string(*clusterSize_) + " (a kernel has one cluster shape)");
    clusterSize_ = size;
    const size_t n = op.numOperands();
    if (n == 0) return err(op, "needs at least one operand");
    if (op.numResults() != n * size_t(size))
      return err(op, "has " + std::to_string(n) + " operands and size = " + std::to_string(size) + ", so " +
                         std::to_string(n * size_t(size)) + " results (operand i of rank r is result i * size + r), got " +
                         std::to_string(op.numResults()));
    for (size_t i = 0; i < n; ++i) {
      const Type& x = op.operand(i)->type();
      if (x.isPointer() || x.isSharedBuffer())
        return err(op, nth("operand", i) + " is " + x.str() + ": only values cross a cluster, not addresses");
      for (int64_t r = 0; r < size; ++r) {
        const Type& got = op.result(i * size_t(size) + size_t(r))->type();
        if (!got.sameShapeAndElement(x))
          return err(op, "result " + std::to_string(i * size_t(size) + size_t(r)) + " must be operand " + std::to_string(i) +
                             "'s type " + x.str() + ", got " + got.str());
        if (lay_ && x.isTile() && !sameLayout(op, *got.layout(), *x.layout(), "result " + std::to_string(i * size_t(size) + size_t(r)), "its operand"))
          return;
      }
    }
  }

  void reduce(const Op& op) {
    const Type &x = op.operand(0)->type(), &r = op.result()->type();
    if (!x.isTile()) return err(op, "operand must be a tile, got " + x.str());
    if (!intAttrIn(op, "axis", 0, x.rank() - 1)) return;
    if (!strAttrIn(op, "kind", {"sum", "max", "min"})) return;
    if (x.isPointer()) return err(op, "cannot reduce pointers");
    int axis = int(op.intAttr("axis"));
    Shape s = x.shape();
    s.erase(s.begin() + axis);
    if (r.shape() != s || !sameElement(x, r)) return err(op, "result must be " + x.withShape(s).str() + ", got " + r.str());
    if (lay_ && r.isTile()) sameLayout(op, *r.layout(), x.layout()->sliced(axis), "result", "the operand's layout sliced at the axis");
  }

  void dot(const Op& op) {
    const Type &a = op.operand(0)->type(), &b = op.operand(1)->type(), &c = op.operand(2)->type(),
               &r = op.result()->type();
    if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2 || a.shape()[1] != b.shape()[0] || c.shape()[0] != a.shape()[0] ||
        c.shape()[1] != b.shape()[1])
      return err(op, "needs a[M,K] b[K,N] acc[M,N], got " + a.str() + ", " + b.str() + ", " + c.str());
    if (!r.sameShapeAndElement(c)) return err(op, "result must be the accumulator's type " + c.str() + ", got " + r.str());
    if (a.dtype() != b.dtype()) return err(op, "a and b must have one dtype, got " + a.str() + " and " + b.str());
    bool floatDot = isFloat(a.dtype()) && isFloat(c.dtype());
    bool intDot = a.dtype() == DType::I8 && c.dtype() == DType::I32;
    if (!floatDot && !intDot)
      return err(op, "supports float inputs with a float accumulator, or i8 inputs with i32; got " + elementString(a) +
                         " x " + elementString(b) + " + " + elementString(c));
    if (lay_) sameLayout(op, *r.layout(), *c.layout(), "result", "the accumulator");
    if (op.hasAttr("async") && !intAttrIn(op, "async", 0, 1)) return;
  }

  void forLoop(const Op& op) {
    if (op.numOperands() < 3) return err(op, "needs lower bound, upper bound and step operands");
    const Type& lb = op.operand(0)->type();
    for (size_t i = 0; i < 3; ++i) {
      const Type& t = op.operand(i)->type();
      if (!t.isScalar() || !isInteger(t.dtype()) || t.dtype() == DType::I1 || t.dtype() != lb.dtype())
        return err(op, "bounds and step must be integer scalars of one dtype, got " + lb.str() + ", " +
                           op.operand(1)->type().str() + ", " + op.operand(2)->type().str());
    }
    size_t carried = op.numOperands() - 3;
    if (op.numResults() != carried)
      return err(op, "has " + std::to_string(carried) + " carried values but " + std::to_string(op.numResults()) + " results");
    const Block& body = op.region();
    if (body.args().size() != carried + 1)
      return err(op, "body must have " + std::to_string(carried + 1) + " arguments (iv, carried...), got " +
                         std::to_string(body.args().size()));
    if (body.arg(0)->type() != lb) err(op, "induction variable is " + body.arg(0)->type().str() + ", bounds are " + lb.str());
    const Op* yield = body.terminator();
    if (yield && yield->kind() == OpKind::Yield && yield->numOperands() != carried)
      err(op, "body yields " + std::to_string(yield->numOperands()) + " values for " + std::to_string(carried) +
                  " carried values");
    for (size_t i = 0; i < carried; ++i) {
      const Type& init = op.operand(3 + i)->type();
      std::vector<std::pair<std::string, const Type*>> others = {{"region argument", &body.arg(1 + i)->type()},
                                                                 {"result", &op.result(i)->type()}};
      if (yield && yield->kind() == OpKind::Yield && i < yield->numOperands() && yield->operand(i))
        others.push_back({"yielded value", &yield->operand(i)->type()});
      for (const auto& [what, t] : others) {
        if (*t == init) continue;
        bool layoutOnly = t->sameShapeAndElement(init);
        err(op, "carried value #" + std::to_string(i) + ": " + what + " " + t->str() + " differs from init " + init.str() +
                    (layoutOnly ? " in its layout" : ""));
      }
    }
  }

  // Layout::verify's verdict on `l` (empty: valid), once per layout object a run: types share
  // their layouts, and each op asks about every operand's.
  const std::string& layoutProblem(const Layout& l) {
    auto [it, fresh] = layoutProblems_.try_emplace(&l);
    if (fresh) it->second = l.verify();
    return it->second;
  }

  // Whether every tile operand and result has a well-formed layout of its
  // shape; only then do the per-op layout rules apply (checkValue reports the
  // rest once, at the definition).
  bool layoutsUsable(const Op& op) {
    auto ok = [&](const Type& t) {
      return t.isScalar() || (t.hasLayout() && t.layout()->shape() == t.shape() && layoutProblem(*t.layout()).empty());
    };
    for (const Value* v : op.operands())
      if (!ok(v->type())) return false;
    for (const Value* v : op.results())
      if (!ok(v->type())) return false;
    return true;
  }

  // Layout equality with a message; returns whether they are equal.
  bool sameLayout(const Op& op, const Layout& got, const Layout& want, const std::string& what, const std::string& rule) {
    if (got == want) return true;
    err(op, "layout of " + what + " " + got.str() + " must equal " + rule + " " + want.str());
    return false;
  }

  const Function& f_;
  std::vector<std::string> problems_;
  std::vector<std::unordered_set<const Value*>> scopes_;
  std::unordered_map<const Layout*, std::string> layoutProblems_;  // layoutProblem's verdicts
  bool layoutsOn_ = false;
  bool lay_ = false;  // layout rules apply to the op being checked
  bool opFailed_ = false;
  std::optional<int64_t> clusterSize_;  // the first cluster_all_gather's size
};

}  // namespace

std::vector<std::string> verificationProblems(const Function& f) { return Verifier(f).run(); }

void verify(const Function& f) {
  auto problems = verificationProblems(f);
  if (problems.empty()) return;
  std::string msg = "invalid IR in function @" + f.name() + " (" + std::to_string(problems.size()) + " problem" +
                    (problems.size() == 1 ? "" : "s") + "):";
  for (const auto& p : problems) msg += "\n  " + p;
  throw Error(msg);
}

}  // namespace flextile::ir
