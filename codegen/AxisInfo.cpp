#include "codegen/AxisInfo.h"

#include <algorithm>
#include <sstream>

#include "ir/Elementwise.h"

namespace flextile::codegen {

using ir::DType;
using ir::Op;
using ir::OpKind;
using ir::Shape;
using ir::Value;

namespace {

constexpr int64_t kMaxDiv = AxisInfo::kMaxDivisibility;

// Scalars are described as if their shape were [1].
Shape factShape(const Shape& s) { return s.empty() ? Shape{1} : s; }

int64_t clampDiv(int64_t v) { return std::clamp<int64_t>(v, 1, kMaxDiv); }

// The largest power of two <= v (v >= 1).
int64_t floorPow2(int64_t v) {
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

// Divisibility of x at positions that start runs of length `runLength` of a
// result built from x: a run start of x if x's runs are no longer, else a
// position inside one of x's runs at a multiple of runLength from its start.
int64_t alignedDiv(const AxisInfo& x, int d, int64_t runLength) {
  return x.contiguity[d] > runLength ? std::min(x.divisibility[d], runLength) : x.divisibility[d];
}

// The join of two facts about one value (the loop fixpoint): what holds for both.
AxisInfo join(const AxisInfo& a, const AxisInfo& b) {
  AxisInfo r = a;
  for (int d = 0; d < a.rank(); ++d) {
    r.contiguity[d] = std::min(a.contiguity[d], b.contiguity[d]);
    r.divisibility[d] = std::min(a.divisibility[d], b.divisibility[d]);
    r.constancy[d] = std::min(a.constancy[d], b.constancy[d]);
  }
  if (a.constantValue != b.constantValue) r.constantValue.reset();
  return r;
}

// Constants fold as the interpreter computes them (ir/Elementwise.h): wrapped
// to the dtype's width; nullopt for a zero divisor.
std::optional<int64_t> foldConstants(const Op& op, int64_t a, int64_t b = 0) {
  return ir::evaluateIntArithmetic(op.kind(), op.result()->type().dtype(), a, b);
}

std::string vecStr(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

int64_t highestPowerOf2Divisor(int64_t v) {
  if (v == 0) return kMaxDiv;
  uint64_t u = v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v);
  return std::min<int64_t>(kMaxDiv, int64_t(u & (~u + 1)));
}

AxisInfo AxisInfo::unknown(const Shape& shape) {
  AxisInfo a;
  size_t r = factShape(shape).size();
  a.contiguity.assign(r, 1);
  a.divisibility.assign(r, 1);
  a.constancy.assign(r, 1);
  return a;
}

AxisInfo AxisInfo::constant(const Shape& shape, int64_t value) {
  AxisInfo a = unknown(shape);
  a.constancy = factShape(shape);
  a.divisibility.assign(a.rank(), highestPowerOf2Divisor(value));
  a.constantValue = value;
  return a;
}

int64_t AxisInfo::elementDivisibility() const {
  if (constantValue) return highestPowerOf2Divisor(*constantValue);
  int64_t v = kMaxDiv;
  for (int d = 0; d < rank(); ++d) v = std::min(v, contiguity[d] > 1 ? 1 : divisibility[d]);
  return v;
}

std::string AxisInfo::str() const {
  std::ostringstream os;
  os << "{contiguity=" << vecStr(contiguity) << ", divisibility=" << vecStr(divisibility)
     << ", constancy=" << vecStr(constancy);
  if (constantValue) os << ", value=" << *constantValue;
  os << "}";
  return os.str();
}

// ---- the analysis -----------------------------------------------------------

AxisInfoAnalysis::AxisInfoAnalysis(const ir::Function& f) : func_(&f) {
  const auto& params = f.params();
  std::vector<int64_t> divs;
  if (auto it = f.attrs().find("arg_divisibility"); it != f.attrs().end()) {
    auto* list = std::get_if<std::vector<int64_t>>(&it->second);
    if (!list || list->size() != params.size())
      throw Error("function '" + f.name() + "': attribute 'arg_divisibility' must list one integer per parameter (" +
                  std::to_string(params.size()) + " parameters)");
    divs = *list;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ir::Type& t = params[i]->type();
    AxisInfo a = AxisInfo::unknown(t.shape());
    int64_t dflt = t.isPointer() ? 16 : 1;
    int64_t div = divs.empty() ? dflt : divs[i];
    if (div <= 0) throw Error("function '" + f.name() + "': arg_divisibility of parameter " + std::to_string(i) +
                              " is " + std::to_string(div) + "; it must be positive");
    if (t.isPointer() || ir::isInteger(t.dtype())) a.divisibility.assign(a.rank(), highestPowerOf2Divisor(div));
    set(params[i], a);
  }
  visitBlock(f.body());
}

const AxisInfo& AxisInfoAnalysis::get(const Value* v) const {
  auto it = info_.find(v);
  if (it == info_.end())
    throw Error("axis info: value %" + std::to_string(v->id()) + " of function '" + func_->name() +
                "' was not analysed (created after the analysis ran?)");
  return it->second;
}

void AxisInfoAnalysis::set(const Value* v, AxisInfo info) {
  // Keep the invariants whatever a rule computed: powers of two, runs no
  // longer than the dimension.
  Shape s = factShape(v->type().shape());
  for (int d = 0; d < info.rank(); ++d) {
    info.contiguity[d] = std::clamp<int64_t>(floorPow2(std::max<int64_t>(1, info.contiguity[d])), 1, s[d]);
    info.constancy[d] = std::clamp<int64_t>(floorPow2(std::max<int64_t>(1, info.constancy[d])), 1, s[d]);
    info.divisibility[d] = floorPow2(clampDiv(info.divisibility[d]));
  }
  info_[v] = std::move(info);
}

void AxisInfoAnalysis::visitBlock(const ir::Block& b) {
  for (const auto& op : b.ops()) visitOp(*op);
}

void AxisInfoAnalysis::visitFor(const Op& op) {
  ir::Block& body = op.region();
  const AxisInfo& lb = get(op.operand(0));
  const AxisInfo& step = get(op.operand(2));
  AxisInfo iv = AxisInfo::unknown({});
  iv.divisibility[0] = std::min(lb.elementDivisibility(), step.elementDivisibility());
  set(body.arg(0), iv);

  const size_t n = op.numOperands() - 3;
  std::vector<AxisInfo> carried;
  for (size_t i = 0; i < n; ++i) carried.push_back(get(op.operand(3 + i)));
  // Every fact only decreases (powers of two down to 1), so this ends; the
  // bound is a guard against a bug, after which we give up on the facts.
  for (int iteration = 0;; ++iteration) {
    for (size_t i = 0; i < n; ++i) set(body.arg(1 + i), carried[i]);
    visitBlock(body);
    const Op* yield = body.terminator();
    if (!yield || yield->kind() != OpKind::Yield || yield->numOperands() != n)
      throw Error(op.describe() + ": loop body must end in a yield of " + std::to_string(n) + " values");
    bool changed = false;
    for (size_t i = 0; i < n; ++i) {
      AxisInfo j = join(carried[i], get(yield->operand(i)));
      if (!(j == carried[i])) {
        carried[i] = std::move(j);
        changed = true;
      }
    }
    if (!changed) break;
    if (iteration > 64) {
      for (size_t i = 0; i < n; ++i) carried[i] = AxisInfo::unknown(op.operand(3 + i)->type().shape());
      for (size_t i = 0; i < n; ++i) set(body.arg(1 + i), carried[i]);
      visitBlock(body);
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) set(op.result(i), carried[i]);
}

void AxisInfoAnalysis::visitOp(const Op& op) {
  if (op.kind() == OpKind::For) return visitFor(op);
  if (op.numResults() != 1) {  // store, yield, return; a wgmma_wait of several accumulators
    for (const Value* r : op.results()) set(r, AxisInfo::unknown(r->type().shape()));
    return;
  }
  const Value* res = op.result();
  const ir::Type& type = res->type();
  const Shape shape = factShape(type.shape());
  const int rank = int(shape.size());
  auto in = [&](size_t i) -> const AxisInfo& { return get(op.operand(i)); };
  const bool intLike = ir::isInteger(type.dtype()) && type.dtype() != DType::I1;
  const bool pointer = type.isPointer();

  // Constancy survives every element-wise op: equal inputs give equal outputs.
  auto constancyOf = [&](std::initializer_list<size_t> operands) {
    AxisInfo r = AxisInfo::unknown(type.shape());
    for (int d = 0; d < rank; ++d) {
      r.constancy[d] = shape[d];
      for (size_t i : operands) r.constancy[d] = std::min(r.constancy[d], in(i).constancy[d]);
    }
    return r;
  };

  AxisInfo r = AxisInfo::unknown(type.shape());
  switch (op.kind()) {
    case OpKind::ProgramId:
    case OpKind::NumPrograms:
      break;
    case OpKind::Constant:
      if (auto* iv = std::get_if<int64_t>(&op.attrs().at("value")); iv && ir::isInteger(type.dtype()))
        r = AxisInfo::constant(type.shape(), *iv);
      else
        r.constancy = shape;
      break;
    case OpKind::Arange: {
      int64_t start = op.intAttr("start"), end = op.intAttr("end");
      if (end - start == 1) {
        r = AxisInfo::constant(type.shape(), start);
      } else {
        r.contiguity[0] = end - start;
        r.divisibility[0] = highestPowerOf2Divisor(start);
      }
      break;
    }
    case OpKind::Splat: {
      const AxisInfo& s = in(0);
      for (int d = 0; d < rank; ++d) {
        r.constancy[d] = shape[d];
        r.divisibility[d] = s.elementDivisibility();
      }
      r.constantValue = s.constantValue;
      break;
    }
    case OpKind::Broadcast: {
      const AxisInfo& x = in(0);
      const Shape& xs = op.operand(0)->type().shape();
      r = x;
      for (int d = 0; d < rank; ++d)
        if (xs[d] == 1 && shape[d] > 1) {
          r.contiguity[d] = 1;
          r.divisibility[d] = x.elementDivisibility();
          r.constancy[d] = shape[d];
        }
      break;
    }
    case OpKind::ExpandDims: {
      const AxisInfo& x = in(0);
      int axis = int(op.intAttr("axis"));
      r = x;
      if (op.operand(0)->type().isScalar()) break;  // [] -> [1]: the scalar's one entry
      r.contiguity.insert(r.contiguity.begin() + axis, 1);
      r.divisibility.insert(r.divisibility.begin() + axis, x.elementDivisibility());
      r.constancy.insert(r.constancy.begin() + axis, 1);
      break;
    }
    case OpKind::Reshape: {
      // Exact only when the reshape inserts or removes size-1 dimensions;
      // otherwise only a fully constant tile stays constant.
      const AxisInfo& x = in(0);
      Shape xs = factShape(op.operand(0)->type().shape());
      std::vector<int> xDims, rDims;
      for (int d = 0; d < int(xs.size()); ++d)
        if (xs[d] != 1) xDims.push_back(d);
      for (int d = 0; d < rank; ++d)
        if (shape[d] != 1) rDims.push_back(d);
      bool squeezeOnly = xDims.size() == rDims.size();
      for (size_t i = 0; squeezeOnly && i < xDims.size(); ++i) squeezeOnly = xs[xDims[i]] == shape[rDims[i]];
      if (squeezeOnly) {
        for (int d = 0; d < rank; ++d) r.divisibility[d] = x.elementDivisibility();
        for (size_t i = 0; i < xDims.size(); ++i) {
          r.contiguity[rDims[i]] = x.contiguity[xDims[i]];
          r.divisibility[rDims[i]] = x.divisibility[xDims[i]];
          r.constancy[rDims[i]] = x.constancy[xDims[i]];
        }
      } else {
        bool allConstant = true;
        for (size_t d = 0; d < xs.size(); ++d) allConstant &= x.constancy[d] == xs[d];
        if (allConstant) r.constancy = shape;
        for (int d = 0; d < rank; ++d) r.divisibility[d] = x.elementDivisibility();
      }
      r.constantValue = x.constantValue;
      break;
    }
    case OpKind::Trans: {
      const AxisInfo& x = in(0);
      const auto& perm = op.intsAttr("perm");
      for (int d = 0; d < rank; ++d) {
        r.contiguity[d] = x.contiguity[perm[d]];
        r.divisibility[d] = x.divisibility[perm[d]];
        r.constancy[d] = x.constancy[perm[d]];
      }
      r.constantValue = x.constantValue;
      break;
    }
    case OpKind::ConvertLayout:
      r = in(0);
      break;

    case OpKind::Add:
    case OpKind::Sub:
    case OpKind::AddPtr: {
      const AxisInfo &a = in(0), &b = in(1);
      // AddPtr counts contiguity in elements and divisibility in bytes.
      int64_t scaleB = op.kind() == OpKind::AddPtr ? ir::byteWidth(type.pointee()) : 1;
      r = constancyOf({0, 1});
      for (int d = 0; d < rank; ++d) {
        int64_t c = std::min(a.contiguity[d], b.constancy[d]);
        if (op.kind() != OpKind::Sub) c = std::max(c, std::min(a.constancy[d], b.contiguity[d]));
        r.contiguity[d] = c;
        r.divisibility[d] = std::min(alignedDiv(a, d, c), clampDiv(alignedDiv(b, d, c) * scaleB));
      }
      if (op.kind() != OpKind::AddPtr && a.constantValue && b.constantValue)
        r = AxisInfo::constant(type.shape(), *foldConstants(op, *a.constantValue, *b.constantValue));
      if (!intLike && !pointer) r = constancyOf({0, 1});
      break;
    }
    case OpKind::Mul: {
      const AxisInfo &a = in(0), &b = in(1);
      if (!intLike) {
        r = constancyOf({0, 1});
      } else if (a.constantValue && b.constantValue) {
        r = AxisInfo::constant(type.shape(), *foldConstants(op, *a.constantValue, *b.constantValue));
      } else if ((a.constantValue && *a.constantValue == 0) || (b.constantValue && *b.constantValue == 0)) {
        r = AxisInfo::constant(type.shape(), 0);
      } else if (b.constantValue && *b.constantValue == 1) {
        r = a;
      } else if (a.constantValue && *a.constantValue == 1) {
        r = b;
      } else {
        r = constancyOf({0, 1});
        for (int d = 0; d < rank; ++d) r.divisibility[d] = clampDiv(alignedDiv(a, d, 1) * alignedDiv(b, d, 1));
      }
      break;
    }
    case OpKind::Div:
    case OpKind::Rem: {
      // Only divisibility and constancy: with truncation toward zero, x / c
      // and x % c are not piecewise constant/contiguous for negative x, and
      // we track no ranges.
      const AxisInfo &a = in(0), &b = in(1);
      r = constancyOf({0, 1});
      if (!intLike) break;
      if (a.constantValue && b.constantValue) {
        if (auto v = foldConstants(op, *a.constantValue, *b.constantValue)) r = AxisInfo::constant(type.shape(), *v);
        break;
      }
      if (op.kind() == OpKind::Div && b.constantValue && *b.constantValue == 1) {
        r = a;
        break;
      }
      for (int d = 0; d < rank; ++d) {
        int64_t da = alignedDiv(a, d, 1), db = alignedDiv(b, d, 1);
        if (op.kind() == OpKind::Rem) {
          r.divisibility[d] = std::min(da, db);  // a % b = a - q * b
        } else if (b.constantValue && *b.constantValue > 0 && highestPowerOf2Divisor(*b.constantValue) == *b.constantValue &&
                   da >= *b.constantValue && da < kMaxDiv) {
          r.divisibility[d] = da / *b.constantValue;  // exact division
        }
      }
      break;
    }
    case OpKind::Shl:
    case OpKind::Shr: {
      const AxisInfo &a = in(0), &b = in(1);
      r = constancyOf({0, 1});
      if (!intLike) break;
      if (a.constantValue && b.constantValue) {
        if (auto v = foldConstants(op, *a.constantValue, *b.constantValue)) r = AxisInfo::constant(type.shape(), *v);
        break;
      }
      std::optional<int64_t> s = b.constantValue;
      if (s && (*s < 0 || *s > 40)) s.reset();
      if (s && *s == 0) {
        r = a;
        break;
      }
      for (int d = 0; d < rank; ++d) {
        int64_t da = alignedDiv(a, d, 1);
        if (op.kind() == OpKind::Shl) {
          r.divisibility[d] = s ? clampDiv(da << *s) : da;
        } else if (s) {
          // An arithmetic shift floors, also for negative values: within an
          // aligned group of g <= 2^s consecutive values starting at a
          // multiple of g, x >> s does not change.
          int64_t p = int64_t(1) << *s;
          int64_t g = std::min({a.contiguity[d], a.divisibility[d], p});
          r.constancy[d] = std::max(r.constancy[d], g);
          r.divisibility[d] = da >= p && da < kMaxDiv ? da / p : 1;
        }
      }
      break;
    }
    case OpKind::And:
    case OpKind::Or:
    case OpKind::Xor:
    case OpKind::Maximum:
    case OpKind::Minimum: {
      const AxisInfo &a = in(0), &b = in(1);
      r = constancyOf({0, 1});
      if (!intLike) break;
      if (a.constantValue && b.constantValue) {
        r = AxisInfo::constant(type.shape(), *foldConstants(op, *a.constantValue, *b.constantValue));
        break;
      }
      int64_t ea = a.elementDivisibility(), eb = b.elementDivisibility();
      // x & y has at least the trailing zero bits of either; the others keep the common ones.
      int64_t div = op.kind() == OpKind::And ? std::max(ea, eb) : std::min(ea, eb);
      for (int d = 0; d < rank; ++d) r.divisibility[d] = div;
      break;
    }
    case OpKind::Neg:
    case OpKind::Abs: {
      r = constancyOf({0});
      if (!intLike) break;
      const AxisInfo& a = in(0);
      if (a.constantValue) {
        r = AxisInfo::constant(type.shape(), *foldConstants(op, *a.constantValue));
        break;
      }
      for (int d = 0; d < rank; ++d) r.divisibility[d] = a.elementDivisibility();
      break;
    }
    case OpKind::Cmp: {
      const AxisInfo &a = in(0), &b = in(1);
      r = constancyOf({0, 1});
      const std::string& pred = op.strAttr("pred");
      if (ir::isInteger(op.operand(0)->type().dtype()) && op.operand(0)->type().isTile()) {
        // x < y and x >= y (or y > x, y <= x) with x contiguous and y constant
        // over an aligned group of g values where both x's group start and y
        // are multiples of g: every x + i, 0 <= i < g, compares like x.
        auto groupFor = [&](const AxisInfo& x, const AxisInfo& y, int d) {
          int64_t yDiv = y.contiguity[d] == 1 ? y.divisibility[d] : 1;
          return std::min({x.contiguity[d], x.divisibility[d], y.constancy[d], yDiv});
        };
        for (int d = 0; d < rank; ++d) {
          int64_t g = 1;
          if (pred == "lt" || pred == "ge") g = groupFor(a, b, d);
          if (pred == "gt" || pred == "le") g = groupFor(b, a, d);
          r.constancy[d] = std::max(r.constancy[d], g);
        }
      }
      break;
    }
    case OpKind::Select: {
      const AxisInfo &c = in(0), &a = in(1), &b = in(2);
      if (c.constantValue) {
        r = *c.constantValue ? a : b;
        break;
      }
      r = constancyOf({0, 1, 2});
      if (!intLike && !pointer) break;
      for (int d = 0; d < rank; ++d) {
        int64_t cont = std::min({c.constancy[d], a.contiguity[d], b.contiguity[d]});
        r.contiguity[d] = cont;
        r.divisibility[d] = std::min(alignedDiv(a, d, cont), alignedDiv(b, d, cont));
      }
      break;
    }
    case OpKind::Cast: {
      DType from = op.operand(0)->type().dtype();
      bool intToInt = ir::isInteger(from) && from != DType::I1 && intLike;
      if (intToInt && ir::bitWidth(type.dtype()) >= ir::bitWidth(from)) {
        r = in(0);  // widening keeps every value
      } else {
        r = constancyOf({0});
      }
      break;
    }
    case OpKind::Load: {
      // The same address gives the same value within one load.
      std::initializer_list<size_t> all0{0}, all1{0, 1}, all2{0, 1, 2};
      const size_t own = ir::operandsBeforeBox(op);  // a tensor box's scalars add nothing
      r = constancyOf(own == 1 ? all0 : own == 2 ? all1 : all2);
      break;
    }
    case OpKind::AtomicAdd:
      // Unlike a load, equal addresses do not give equal values: each element
      // that adds to one address sees the sums before it. Nothing is known.
      break;
    case OpKind::Reduce: {
      const AxisInfo& x = in(0);
      int axis = int(op.intAttr("axis"));
      if (type.isScalar()) break;
      for (int d = 0, xd = 0; d < rank; ++d, ++xd) {
        if (xd == axis) ++xd;
        r.constancy[d] = x.constancy[xd];
      }
      break;
    }
    default:
      // Any other element-wise op (exp, not, ...) keeps constancy; dot and
      // anything unknown get the pessimistic facts.
      if (op.hasTrait(ir::kElementwise)) {
        r = AxisInfo::unknown(type.shape());
        for (int d = 0; d < rank; ++d) {
          r.constancy[d] = shape[d];
          for (size_t i = 0; i < op.numOperands(); ++i) r.constancy[d] = std::min(r.constancy[d], in(i).constancy[d]);
        }
      }
      break;
  }
  set(res, std::move(r));
}

// ---- vector widths ----------------------------------------------------------

int fastestDim(const Value* ptr, const AxisInfoAnalysis& analysis) {
  const AxisInfo& p = analysis.get(ptr);
  int best = p.rank() - 1;
  for (int d = p.rank() - 1; d >= 0; --d)
    if (p.contiguity[d] > p.contiguity[best]) best = d;
  return best;
}

int64_t vectorWidth(const Value* ptr, const AxisInfoAnalysis& analysis, const Value* mask, int dim) {
  if (!ptr->type().isPointer()) throw Error("vectorWidth: value %" + std::to_string(ptr->id()) + " is not a pointer");
  if (ptr->type().isScalar()) return 1;
  if (dim < 0) dim = fastestDim(ptr, analysis);
  const AxisInfo& p = analysis.get(ptr);
  const int64_t elemBytes = ir::byteWidth(ptr->type().pointee());
  int64_t w = std::min({p.contiguity[dim], std::max<int64_t>(1, p.divisibility[dim] / elemBytes),
                        std::max<int64_t>(1, 16 / elemBytes)});
  if (mask && mask->type().isTile()) w = std::min(w, analysis.get(mask).constancy[dim]);
  return floorPow2(std::max<int64_t>(1, w));
}

AccessWidth memoryAccessWidth(const Op& op, const AxisInfoAnalysis& analysis) {
  if (op.kind() != OpKind::Load && op.kind() != OpKind::Store)
    throw Error(op.describe() + ": memoryAccessWidth expects a load or store");
  const Value* ptr = op.operand(0);
  const Value* mask = op.kind() == OpKind::Load ? (op.numOperands() > 1 ? op.operand(1) : nullptr)
                                                : (op.numOperands() > 2 ? op.operand(2) : nullptr);
  if (ptr->type().isScalar()) return {0, 1};
  const auto& layout = ptr->type().layout();
  if (!layout) throw Error(op.describe() + ": memoryAccessWidth needs layouts (run assignLayouts first)");
  // The layout's first register basis says along which dimension a thread's
  // registers are consecutive.
  int dim = fastestDim(ptr, analysis);
  if (!layout->regBases().empty()) {
    const auto& b0 = layout->regBases()[0];
    for (int d = 0; d < int(b0.size()); ++d)
      if (b0[d] == 1) {
        bool unit = true;
        for (int e = 0; e < int(b0.size()); ++e) unit &= e == d || b0[e] == 0;
        if (unit) dim = d;
      }
  }
  int64_t w = std::min(vectorWidth(ptr, analysis, mask, dim), layout->contiguousRegisters(dim));
  return {dim, std::max<int64_t>(1, w)};
}

}  // namespace flextile::codegen
