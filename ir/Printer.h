// The tile IR's text form (generic, MLIR-like). One line per op:
//
//   [%results =] name [%operands] [{attrs sorted by key}] [: result types] [region] [loc("file":line)]
//
// Operand types are not printed: the parser takes them from the defining
// values. Values are renumbered %0, %1, ... in print order; function
// parameters print as %name when their name hint is a unique identifier.
// Layouts print as #Lk aliases declared at the top of the text, so a function
// after layout assignment stays readable. docs/ir-reference.md has the grammar.
#pragma once

#include <string>

#include "ir/IR.h"

namespace flextile::ir {

struct PrintOptions {
  bool locations = false;  // append loc("file":line) to ops with a known location
};

std::string printFunction(const Function& f, const PrintOptions& options = {});
std::string printModule(const Module& m, const PrintOptions& options = {});

// The text of one type with its layout spelled inline ("f32[64]#ft.linear<...>"),
// for error messages that stand alone.
std::string typeString(const Type& t);

// How an attribute value prints: ints plainly, floats always with '.', 'e',
// "inf" or "nan" so they parse back as floats (shortest round-trip digits),
// strings quoted with \" \\ \n escapes, int lists as [1, 0].
std::string printAttr(const Attr& a);

}  // namespace flextile::ir
