// Passes and the pass pipeline. A pass is a named function that rewrites a
// Function in place. The pipeline is the one readable list of what happens to
// a kernel, in the manner of Halide's Lower.cpp: each step is verified,
// optionally dumped (FLEXTILE_DUMP=passes) and timed (FLEXTILE_TIMING=1).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace flextile::ir {

struct Pass {
  std::string name;
  std::function<void(Function&)> run;
};

struct PassTiming {
  std::string pass;
  double ms = 0;
};

class PassPipeline {
 public:
  PassPipeline& add(Pass p) {
    passes_.push_back(std::move(p));
    return *this;
  }
  const std::vector<Pass>& passes() const { return passes_; }

  // Verifies the input, then runs each pass and verifies after it; a verifier
  // error (or any flextile::Error a pass throws) is rethrown naming the pass.
  // Returns the wall time of each pass; prints them to stderr when
  // FLEXTILE_TIMING=1.
  std::vector<PassTiming> run(Function& f) const;

 private:
  std::vector<Pass> passes_;
};

}  // namespace flextile::ir
