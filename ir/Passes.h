// Target-independent passes over the tile IR. Each is a Pass for a
// PassPipeline and a plain function (returning whether it changed anything)
// for tests and for other passes.
//
//   canonicalize  folds constants (scalars and uniform constant tiles, incl.
//                 cmp, select and cast) exactly as the interpreter computes
//                 them, simplifies algebra (x+0, x*1, x*0 for integers, x/1,
//                 x|0, x^0, x<<0, neg(neg x), not(not x); for floats only the
//                 exact identities), turns splats of constants into constant
//                 tiles and shape ops of splats into splats, drops identity
//                 shape ops, casts and conversions, resolves selects with a
//                 constant condition or equal choices, removes for loops that
//                 provably run zero times, and finally runs dce on what it
//                 left unused.
//   cse           merges pure region-free ops with equal kind, operands (in
//                 any order when commutative), attributes and result types;
//                 an op inside a loop body may reuse one from an enclosing
//                 block, never the reverse.
//   fold-scales   (functions with attribute reassociate = 1) pushes a product of an f32 tile by a
//                 uniform factor into the sums, products and broadcasts it scales, so that the
//                 factors meet as scalars and smaller tiles (ir/passes/FoldScales.cpp); it
//                 reassociates, and removes a full-tile product per rewrite.
//   regroup-sums  (functions with attribute reassociate = 1) adds the broadcasts of one smaller
//                 shape within a sum of f32 tiles on that shape first, broadcasting once
//                 (ir/passes/RegroupSums.cpp); applied where it saves full-tile ops. It also
//                 takes per-row shifts out of max/min reductions and converts integer sums of
//                 splats and loop-invariant values to f32 term by term.
//   dce           erases ops whose results are unused and that have no effect:
//                 pure ops, loads, and for loops whose bodies have no stores.
//   canonical-order  places each block's pure ops and loads just before the first op with
//                 effects, product or reduction that needs them, operands first in operand order
//                 (loads never past an op with effects), so the order no longer depends on the
//                 order a C++ compiler evaluated a template's operands in; erases what nothing
//                 needs (ir/passes/CanonicalOrder.cpp). The others keep their order.
#pragma once

#include <optional>
#include <string_view>

#include "ir/Pass.h"

namespace flextile::ir {

bool canonicalize(Function& f);
bool cse(Function& f);
bool dce(Function& f);
bool canonicalOrder(Function& f);
// fold-scales on any function, whatever its attributes (the pass checks reassociate = 1).
// `invariantTerms`: a row, column or vector sum of an absorbing and a loop-invariant term takes the
// factor too, the invariant term by a product of its own (FoldScales.cpp; function attribute
// fold_invariant_terms = 1 for the pass).
bool foldScales(Function& f, bool invariantTerms = false);
// regroup-sums on any function, whatever its attributes (the pass checks reassociate = 1).
bool regroupSums(Function& f);

Pass canonicalizePass();
Pass csePass();
Pass dcePass();
Pass canonicalOrderPass();
Pass foldScalesPass();
Pass regroupSumsPass();

// The pass of this name ("canonicalize", "cse", "dce", "canonical-order", "fold-scales", "regroup-sums"),
// for command lines.
std::optional<Pass> targetIndependentPass(std::string_view name);

}  // namespace flextile::ir
