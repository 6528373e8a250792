// The `flextile` command-line tool (docs/cli.md): list, run, autotune,
// compile, bench and blockmask over the registered attention variants
// (attention_templates/Variants.h).
//
// The tool is a library function so that a user's program that registers its
// own variants with FLEXTILE_REGISTER_VARIANT gets the same tool: link the
// `flextile_main` library (it holds a main() that calls flextileMain) next to
// the file with the registrations (examples/user_variant_cli.cpp).
#pragma once

#include <iosfwd>

namespace flextile::cli {

// Runs one command line; returns the exit status (0 ok, 1 a check or run
// failed, 2 bad arguments or an unavailable resource). Output goes to `out`,
// errors and progress to `err`.
int flextileMain(int argc, const char* const* argv, std::ostream& out, std::ostream& err);

}  // namespace flextile::cli
