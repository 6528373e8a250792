// What the loop-rewriting passes (pipeline, defer-accumulation, pingpong) may recompute for
// another iteration of a `for` loop, and what they ask of a loop body.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <vector>

#include "ir/IR.h"

namespace flextile::codegen {

// Whether `v`, used in the loop body `body`, can be recomputed for another iteration: it is the
// induction variable, defined outside the body, or computed by pure region-free ops of the body
// from such values, and, when `readOnlyLoop` (nothing in the loop writes memory that a load of
// the body could read), by scalar loads of the body too. No loop-carried value and no tile load
// qualifies. `seen` collects the values already visited (pass an empty set).
bool recomputableInLoop(const ir::Value* v, const ir::Block& body, bool readOnlyLoop, std::set<const ir::Value*>& seen);

// The ops directly in `body` that compute `values`, transitively through operands defined there,
// in body order (what cloning those values for another iteration must clone).
std::vector<ir::Op*> bodySlice(const std::vector<const ir::Value*>& values, ir::Block& body);

// The value of an integer scalar constant (a loop's bound or step), or none.
std::optional<int64_t> scalarConstant(const ir::Value* v);

// The most iterations a `for` loop can run, where its bounds prove one: a constant step s > 0 and
// an upper bound at most lb + d, for ub = lb + d (d constant), both constants, minimum(x, y) with
// one side so bounded, or a select of two sides so bounded; then ceil(d / s) (0 for d <= 0).
// A peeled skewed walk's prologue (lb, minimum(hi, lb + 1)) and epilogue (hi, select(hi > lo,
// hi + 1, hi)) run at most once.
std::optional<int64_t> staticTripBound(const ir::Op& forOp);

// Inserts ops before `pos` of one block.
struct Inserter {
  ir::Function& f;
  ir::Block& block;
  ir::Block::OpList::iterator pos;
  ir::Location loc;

  ir::Op* op(ir::OpKind k, std::vector<ir::Value*> operands, std::vector<ir::Type> results, ir::Attrs attrs = {}) {
    return block.insert(pos, f.createOp(k, std::move(operands), std::move(results), std::move(attrs), loc));
  }
  ir::Value* value(ir::OpKind k, std::vector<ir::Value*> operands, ir::Type result, ir::Attrs attrs = {}) {
    return op(k, std::move(operands), {std::move(result)}, std::move(attrs))->result();
  }
  ir::Value* constant(int64_t v, ir::DType t) { return value(ir::OpKind::Constant, {}, ir::Type(t), {{"value", v}}); }
};

// Clones `ops` (of a loop body, in order) before `at`, their operands mapped through `clone`,
// which starts with the induction variable's value and collects the clones' results.
void cloneAt(Inserter& at, const std::vector<ir::Op*>& ops, std::map<const ir::Value*, ir::Value*>& clone);

// Whether something in `body` (nested regions too) waits for every thread of the program: a
// `barrier` op, or an op with shared-memory scratch, whose lowering brackets it with CTA barriers
// (codegen/SharedMemory.h), other than the ops in `except`. Needs layouts.
bool waitsForTheCta(const ir::Block& body, const std::set<const ir::Op*>& except = {});

}  // namespace flextile::codegen
