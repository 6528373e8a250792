// Scale folding (pass "fold-scales"): a product of an f32 tile by a uniform factor (a constant or
// a splatted scalar) is pushed into the value it scales, as far as the factor is absorbed without
// new full-tile work:
//
//   (s * scale + slope * (bcast(kv) - bcast(q))) * log2e
//     ==>  s * (scale * log2e) + (bcast(kv * slope') - bcast(q * slope'))   slope' = slope * log2e
//
// Full-tile ops before: sub, mul, mul, add, mul (five per score); after: mul, sub, add (three, two
// instructions once the NVPTX backend contracts the mul into the add). The factors meet in scalar
// products and the broadcast operands in products of their own, smaller tiles ([1, N] or [M, 1]).
// That is the arithmetic an attention template adds around a score_mod (the scale before it, the
// exp2 domain's log2e after it), and what a mod like ALiBi adds itself.
//
// What a factor is absorbed by, for a value used only by the product (so nothing else sees the
// change) and defined in the product's block (so nothing moves into a loop):
//   - a uniform value (constant, splat): the factors multiply as scalars;
//   - a broadcast of a smaller tile: the smaller tile is scaled (recursively where it qualifies,
//     else by one product on the smaller tile);
//   - a product by a uniform factor: the factors multiply, and the other operand is scaled
//     (recursively where it qualifies, else by one product);
//   - a sum or difference whose two operands are absorbed; a negation whose operand is; an
//     expand_dims or reshape of a value that is;
//   - where asked (function attribute fold_invariant_terms = 1), on a row, column or vector, a sum
//     or difference of an absorbed operand and a loop-invariant one (LocalRewriter::invariantIn):
//     that operand gets a product of its own, which LLVM's LICM moves out of the loop with it.
//     ALiBi's key positions after regroup-sums' castTerms, splat(f32(start)) + f32(arange), scaled
//     by the slope: the step's product of the [1, N] positions becomes a scalar one (32 multiplies
//     a thread a step fewer at 128 × 128 on 8 warps). That is why the pipeline runs fold-scales
//     again after regroup-sums. Only where asked: in ALiBi's dkdv the invariant product costs
//     ptxas 128 bytes of spills (the forward asks).
// Anything else stops the rewrite at the product, which then stays as it is. Every rewrite
// removes at least one full-tile product and adds none.
//
// This reassociates: a * (b + c) becomes a*b + a*c, whose rounding differs in the last bits. It
// runs only on functions that allow it (attribute reassociate = 1, set by the attention
// templates, whose outputs are compared to float64 within bf16 tolerances), after canonicalize
// and before cse and dce, on IR without layouts (new values take their replaced values' types).
#include "ir/Elementwise.h"
#include "ir/passes/LocalRewriter.h"

namespace flextile::ir {

namespace {

// A uniform factor: a compile-time constant, or a scalar value splatted over a tile.
struct Factor {
  Value* scalar = nullptr;  // rank 0; null when constant
  double constant = 1;
};

class ScaleFolder : LocalRewriter {
 public:
  ScaleFolder(Function& f, bool invariantTerms) : LocalRewriter(f), invariantTerms_(invariantTerms) {}

  bool run() {
    return untilDone([&] {
      for (Op* mul : opsWhere([](const Op& op) { return op.kind() == OpKind::Mul && isF32Tile(op.result()); }))
        if (fold(*mul)) return true;
      return false;
    });
  }

 private:
  std::optional<Factor> uniform(const Value* v) const {
    const Op* d = v->definingOp();
    if (!d || v->type().dtype() != DType::F32) return std::nullopt;
    if (d->kind() == OpKind::Splat && d->operand(0)->type().isScalar() &&
        d->operand(0)->type().dtype() == DType::F32)
      return Factor{d->operand(0), 1};
    if (d->kind() == OpKind::Constant && d->hasAttr("value")) {
      const Attr& a = d->attrs().at("value");
      if (auto* x = std::get_if<double>(&a)) return Factor{nullptr, toFloatDType(*x, DType::F32)};
      if (auto* y = std::get_if<int64_t>(&a)) return Factor{nullptr, toFloatDType(double(*y), DType::F32)};
    }
    return std::nullopt;
  }

  // The one operand of a product by a uniform factor that is not the factor, with the factor.
  std::optional<std::pair<Value*, Factor>> scaledOperand(const Op& mul) const {
    if (mul.kind() != OpKind::Mul || mul.numOperands() != 2) return std::nullopt;
    if (auto g = uniform(mul.operand(1))) return std::make_pair(mul.operand(0), *g);
    if (auto g = uniform(mul.operand(0))) return std::make_pair(mul.operand(1), *g);
    return std::nullopt;
  }

  // Whether v (an operand of a product in `block`) can take a factor without new full-tile work.
  bool absorbs(const Value* v, const Block* block) const {
    if (uniform(v)) return true;
    const Op* d = v->definingOp();
    if (!d || d->numResults() != 1) return false;
    if (d->kind() == OpKind::Broadcast) return d->operand(0)->type().dtype() == DType::F32;
    if (uses(v) != 1 || d->parentBlock() != block) return false;
    switch (d->kind()) {
      case OpKind::Mul:
        return scaledOperand(*d).has_value();
      case OpKind::Add:
      case OpKind::Sub: {
        if (d->operand(0)->type() != v->type() || d->operand(1)->type() != v->type()) return false;
        const bool first = absorbs(d->operand(0), block), second = absorbs(d->operand(1), block);
        if (first && second) return true;
        return invariantTerms_ && vectorLike(v->type()) &&
               ((first && invariantIn(d->operand(1), block)) || (second && invariantIn(d->operand(0), block)));
      }
      case OpKind::Neg:
      case OpKind::ExpandDims:
      case OpKind::Reshape:
        return d->operand(0)->type().dtype() == DType::F32 && absorbs(d->operand(0), block);
      default:
        return false;
    }
  }

  // A row, a column or a vector: its products are small, and one kept out of a loop costs a few
  // registers, not a full tile's.
  static bool vectorLike(const Type& t) {
    int wide = 0;
    for (int64_t extent : t.shape()) wide += extent > 1;
    return wide <= 1;
  }

  Factor times(const Factor& a, const Factor& b) {
    if (!a.scalar && !b.scalar) return Factor{nullptr, toFloatDType(a.constant * b.constant, DType::F32)};
    Value* x = a.scalar ? a.scalar : constantScalar(a.constant);
    Value* y = b.scalar ? b.scalar : constantScalar(b.constant);
    return Factor{emit(OpKind::Mul, {x, y}, Type(DType::F32)), 1};
  }
  Value* constantScalar(double value) {
    return emit(OpKind::Constant, {}, Type(DType::F32), {{"value", Attr(value)}});
  }
  // The factor as a tile of type t.
  Value* uniformTile(const Factor& g, const Type& t) {
    if (g.scalar) return emit(OpKind::Splat, {g.scalar}, t);
    return emit(OpKind::Constant, {}, t, {{"value", Attr(g.constant)}});
  }

  // v * g: through the value where it absorbs the factor, else one product.
  Value* scale(Value* v, const Factor& g, const Block* block) {
    if (absorbs(v, block)) return scaleAbsorbed(v, g, block);
    return emit(OpKind::Mul, {v, uniformTile(g, v->type())}, v->type());
  }

  Value* scaleAbsorbed(Value* v, const Factor& g, const Block* block) {
    if (auto u = uniform(v)) return uniformTile(times(*u, g), v->type());
    Op* d = v->definingOp();
    switch (d->kind()) {
      case OpKind::Broadcast: {
        Value* small = d->operand(0);
        // The smaller tile is rewritten only where it is this broadcast's alone.
        Value* scaled = uses(small) == 1 && small->definingOp() &&
                                small->definingOp()->parentBlock() == block && absorbs(small, block)
                            ? scaleAbsorbed(small, g, block)
                            : emit(OpKind::Mul, {small, uniformTile(g, small->type())}, small->type());
        return emit(OpKind::Broadcast, {scaled}, v->type());
      }
      case OpKind::Mul: {
        auto [other, factor] = *scaledOperand(*d);
        return scale(other, times(factor, g), block);
      }
      case OpKind::Add:
      case OpKind::Sub: {
        // An operand that does not absorb the factor is the loop-invariant one (absorbs): one product.
        Value* a = scale(d->operand(0), g, block);
        Value* b = scale(d->operand(1), g, block);
        return emit(d->kind(), {a, b}, v->type());
      }
      case OpKind::Neg:
        return emit(OpKind::Neg, {scaleAbsorbed(d->operand(0), g, block)}, v->type());
      case OpKind::ExpandDims:
      case OpKind::Reshape:
        return emit(d->kind(), {scaleAbsorbed(d->operand(0), g, block)}, v->type(), d->attrs());
      default:
        return nullptr;  // absorbs() said no
    }
  }

  // mul(v, g): rewritten when v absorbs g and is not itself uniform (a product of two uniform
  // values is canonicalize's to fold).
  bool fold(Op& mul) {
    auto operand = scaledOperand(mul);
    if (!operand) return false;
    auto [v, g] = *operand;
    if (uniform(v) || v->type() != mul.result()->type()) return false;
    const Block* block = mul.parentBlock();
    const Op* d = v->definingOp();
    // The rewrite starts at a sum, difference, negation or product: a broadcast by itself is
    // left to its users (the broadcast stays wherever it has other ones).
    if (!d || d->kind() == OpKind::Broadcast || !absorbs(v, block)) return false;
    at_ = &mul;
    Value* folded = scaleAbsorbed(v, g, block);
    f_.replaceAllUsesWith(mul.result(), folded);
    mul.parentBlock()->erase(&mul);
    return true;
  }

  bool invariantTerms_;  // the loop-invariant rule above
};

}  // namespace

bool foldScales(Function& f, bool invariantTerms) { return ScaleFolder(f, invariantTerms).run(); }

Pass foldScalesPass() {
  return {"fold-scales", [](Function& f) {
            if (f.intAttrOr("reassociate", 0) != 0) foldScales(f, f.intAttrOr("fold_invariant_terms", 0) != 0);
          }};
}

}  // namespace flextile::ir
