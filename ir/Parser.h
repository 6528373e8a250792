// Parses the text form that Printer.h prints (and hand-written variants of it:
// any whitespace, // comments, named values, inline #ft.linear<...> layouts).
// The parser knows only the op table: operand types come from the defining
// values, result types are spelled out, attributes are generic.
//
// Errors throw flextile::Error "source:line:col: expected ..., got '<token>'".
// The parser checks what it needs to build the IR (defined values, known ops,
// operand counts of fixed-arity ops, region structure); the verifier checks the
// rest, so parse-then-verify is the way to read untrusted text.
//
// Regions nest at most kMaxRegionDepth deep: the parser, the verifier, the printer and the IR's
// destructors recurse once per level, and deeper text (a few kilobytes of "for ... {" suffice)
// would overflow the stack instead of failing with a message. Real kernels nest two or three.
#pragma once

#include <memory>
#include <string_view>

#include "ir/IR.h"

namespace flextile::ir {

inline constexpr int kMaxRegionDepth = 64;

Module parseModule(std::string_view text, std::string_view sourceName = "<input>");
// Text with exactly one function (and its layout aliases).
std::unique_ptr<Function> parseFunction(std::string_view text, std::string_view sourceName = "<input>");

}  // namespace flextile::ir
