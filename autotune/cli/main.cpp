// main() of the `flextile` tool, also the `flextile_main` library a user links
// next to their own variant registrations to get the same tool.
#include <iostream>

#include "autotune/cli/Cli.h"

int main(int argc, char** argv) { return flextile::cli::flextileMain(argc, argv, std::cout, std::cerr); }
