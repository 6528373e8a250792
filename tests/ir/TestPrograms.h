// Programs built with ir::Builder that the IR tests share.
#pragma once

#include <memory>
#include <random>
#include <string>

#include "ir/Builder.h"
#include "ir/IR.h"

namespace flextile::ir::testing {

// A kernel that uses every op of Ops.def except convert_layout (which needs
// layouts), every attribute kind, function attributes and a for loop with two
// carried values. Valid before layout assignment.
std::unique_ptr<Function> everyOpProgram();

// A small stand-in for layout assignment: gives every tile a layout (default
// blocked, or the one an op's rule derives) and inserts convert_layout where an
// operand's layout does not fit, so the result satisfies the verifier's layout
// rules.
void assignTestLayouts(Function& f);

// Another valid layout of the same shape and warps as `l`.
LayoutPtr otherLayout(const Layout& l);

// The first op of this kind (walking regions too), or null.
Op* firstOp(Function& f, OpKind k);

// Seeded from std::random_device; print `seed` on failure (SCOPED_TRACE).
struct Random {
  unsigned seed = std::random_device{}();
  std::mt19937_64 gen{seed};
  std::string trace() const { return "random seed " + std::to_string(seed); }
};

}  // namespace flextile::ir::testing
