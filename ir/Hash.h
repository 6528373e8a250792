// The structural identity of a kernel: a 64-bit hash of its printed form
// without source locations. Printing renumbers values and names layouts by
// first use, so two traces of the same program hash equal, while any change
// of an op, attribute, type, layout, parameter or function attribute changes
// the hash. The compile cache keys kernels by it (plus config and target).
#pragma once

#include <cstdint>
#include <string_view>

#include "ir/IR.h"

namespace flextile::ir {

uint64_t structuralHash(const Function& f);

// The hash function itself (FNV-1a with a final avalanche), for callers that
// extend a key with more text.
uint64_t hashText(std::string_view text, uint64_t seed = 0);

}  // namespace flextile::ir
