// Reverse-mode differentiation of a straight-line slice of tile IR.
//
// The attention backward needs the derivative of the user's score_mod. Its
// template traces the mod inline: the mod's ops are a contiguous run of ops of
// one block (usually a loop body), ending in the modified score `y`. Right
// after that run, emitReverseMode emits the ops that compute the adjoints:
// given a seed g = dLoss/dy it emits dLoss/dx for every requested x (the
// score, or any other value), and for every float load in the run that reads a
// trainable tensor it hands dLoss/d(load) to a callback, which emits the
// scatter-add into that tensor's gradient. Nothing is emitted inside the run;
// the forward values it computed are reused (y for exp and tanh, x for log).
//
// What gets an adjoint (activity analysis)
//   A value is *varied* when it depends, through differentiable operands, on a
//   `wrt` value or on a differentiable load of the slice; it is *useful* when
//   the output depends on it. Only values that are both — *active* — get an
//   adjoint. Everything else is a constant of the derivative and emits nothing:
//   q/kv index arithmetic, integer ops, comparisons, select conditions, casts
//   from or to integers, loads of non-trainable data. A mod that ignores the
//   score gets a zero adjoint for it; a load the output does not depend on gets
//   no callback. Adjoints of a value used several times are summed in the order
//   the uses are visited (last use first), including two uses by one op (x*x).
//
// Rules (g is the adjoint of the result y; a, b, c are the operands)
//   neg           da = -g
//   exp           da = g*y                  exp2   da = g*y*ln2
//   log           da = g/a                  log2   da = g/a*log2(e)
//   tanh          da = g*(1 - y*y)          sqrt   da = g/(y + y)
//   rsqrt         da = g*(y/a)*(-0.5)       abs    da = a > 0 ? g : a < 0 ? -g : 0
//   add, sub      da = g; db = g or -g      mul    da = g*b; db = g*a (x*x: t = g*x; t + t)
//   div           da = g/b; db = -(da*y)    rem    da = g; db = -(g*((a - y)/b))  (floats)
//   maximum       da = a > b ? g : a == b ? g*0.5 : 0; db = g - da   (minimum: a < b)
//   select        db = c ? g : 0; dc = c ? 0 : g   (the condition gets none)
//   cast          float -> float: cast g back; anything with an integer: none
//   splat         da = g summed over every dim (to the scalar)
//   broadcast     da = g summed over the broadcast dims, then shaped back to a's
//                 shape (expand_dims for one dim, reshape for more, splat when
//                 everything was summed)
//   expand_dims, reshape   da = reshape(g) back (a reduce for a [1] of a scalar)
//   trans         da = trans(g) by the inverse permutation
//   reduce sum    da = broadcast(expand_dims(g)) (a splat when a was rank 1)
//   reduce max/min  da = (a == y ? g/count : 0) broadcast along the axis, where
//                 count is how many elements tie for the extremum
//   dot           da = g·bᵀ, db = aᵀ·g, dacc = g; g is cast to a's dtype for the
//                 products (which keep the dot's attributes, input_precision),
//                 and each result back to its operand's dtype
//   load          only a differentiable load gets an adjoint, and only through
//                 onLoadAdjoint; `other` gets c ? 0 : g (c the load's mask)
//   cmp, not, and, or, xor, shl, shr, integer arithmetic: zero derivative
//   constant, arange, program_id, num_programs, addptr: no adjoint
//   for, yield, store, return: a flextile::Error naming the op (describe())
//
// Ties: maximum and minimum split g evenly between equal operands, and a
// max/min reduction splits it evenly between the tied elements, as PyTorch and
// JAX do. The derivative then does not depend on the operand order of a
// commutative op, and the sum of the parts is g. abs takes 0 at 0 (sign(0)).
//
// Fewest ops: a zero adjoint is never materialized (a value without an
// adjoint is zero), multiplication by a constant 1 is skipped, a negated
// contribution is subtracted instead of negated and added, constants are made
// once per type and value, and every emitted op carries the location of the op
// it differentiates (a callback's ops: the load's). Run canonicalize and cse
// afterwards for the rest.
//
// The slice must be before layout assignment (no layouts on its types). The
// adjoint computation is emitted at the builder's insertion point, which must
// come after the slice in a block where the slice's values are visible.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/Builder.h"
#include "ir/IR.h"
#include "ir/Pass.h"

namespace flextile::ir {

struct ReverseModeRequest {
  // The slice, in program order: ops of one block.
  std::vector<Op*> ops;
  // The differentiated result, a float tile or scalar; normally defined in the
  // slice (a value from outside it, as an identity mod returns, is allowed).
  Value* output = nullptr;
  // dLoss/d(output): a value of the output's type, visible at the insertion point.
  Value* seed = nullptr;
  // The values whose adjoints are returned; they may be defined outside the
  // slice (the score) or inside it.
  std::vector<Value*> wrt;
  // Which float loads of the slice have an adjoint (reads of a trainable
  // captured tensor). Unset: none.
  std::function<bool(const Op& load)> isDifferentiableLoad;
  // Called once per active differentiable load, in reverse program order, with
  // its adjoint (the load's result type; every lane, masked or not: lanes the
  // mask turns off read `other`, so the scatter-add should use the load's
  // mask). The builder is at the insertion point with the load's location.
  std::function<void(Builder&, const Op& load, Value* adjoint)> onLoadAdjoint;
  // How errors name the slice: "score_mod cannot be differentiated: ...".
  std::string subject = "score_mod";
};

// Emits the adjoint computation at the builder's insertion point and returns
// one adjoint per wrt value, in order: a zero constant of the value's type
// where the output does not depend on it. Throws flextile::Error for an op it
// cannot differentiate (for, yield, store, return), a slice that is not a run
// of ops of one block, a seed of another type than the output, a non-float
// output, or a pointer wrt value.
std::vector<Value*> emitReverseMode(Builder& b, const ReverseModeRequest& r);

// The test-only pass "reverse-mode" (flextile-opt --passes=reverse-mode). For
// each function with the attribute `grad_output`, it differentiates a slice of
// its body and stores the adjoints. Attributes name values by their names in
// the IR text (%s is "s"); lists are comma-separated:
//   grad_output = "y"        the output
//   grad_seed   = "g"        the seed (the output's type)
//   grad_wrt    = "s,t"      the wrt values
//   grad_store  = "ds,dt"    one pointer per wrt value (a tile of pointers of
//                            its shape, or a scalar pointer for a scalar):
//                            where the adjoint is stored
//   grad_loads  = "w:dw"     optional: differentiable loads (by result name),
//                            each with the pointer its adjoint is stored to
//                            (a stand-in for the scatter-add)
// The slice is the run of body ops after the last op defining a wrt value (the
// start of the body when they are all parameters) up to the op defining the
// output; the adjoint ops and stores go right after it. The grad_*
// attributes are removed.
Pass reverseModeTestPass();

}  // namespace flextile::ir
