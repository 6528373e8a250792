// The dangling-reference check's probe (tests/tools/CMakeLists.txt): a function returning a
// container by value, as attention::variants() does.
#pragma once
#include <string>
#include <vector>

inline std::vector<std::string> names() { return {"full", "causal"}; }
