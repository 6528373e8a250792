#include "ir/Pass.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ir/Dump.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::ir {

std::vector<PassTiming> PassPipeline::run(Function& f) const {
  try {
    verify(f);
  } catch (const Error& e) {
    throw Error("pass pipeline input: " + std::string(e.what()), e);
  }
  std::vector<PassTiming> timings;
  for (const Pass& p : passes_) {
    auto start = std::chrono::steady_clock::now();
    try {
      p.run(f);
    } catch (const Error& e) {
      throw Error("pass '" + p.name + "' failed on @" + f.name() + ": " + e.what(), e);
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    timings.push_back({p.name, ms});
    try {
      verify(f);
    } catch (const Error& e) {
      std::string msg = "pass '" + p.name + "' produced invalid IR: " + std::string(e.what());
      // When dumping, the broken IR (with locations) is the most useful thing to see.
      if (dumpEnabled("passes")) dump("passes", "invalid IR after " + p.name, printFunction(f, {.locations = true}));
      throw Error(msg, ErrorKind::Internal);  // a pass broke the IR it was given
    }
    if (dumpEnabled("passes")) dump("passes", "IR after " + p.name + " (@" + f.name() + ")", printFunction(f));
  }
  if (timingEnabled()) {
    std::vector<std::pair<std::string, double>> steps;
    for (const auto& t : timings) steps.emplace_back(t.pass, t.ms);
    reportTimings("pass timings for @" + f.name(), steps);
  }
  return timings;
}

std::optional<Pass> targetIndependentPass(std::string_view name) {
  if (name == "canonicalize") return canonicalizePass();
  if (name == "cse") return csePass();
  if (name == "dce") return dcePass();
  if (name == "canonical-order") return canonicalOrderPass();
  if (name == "fold-scales") return foldScalesPass();
  if (name == "regroup-sums") return regroupSumsPass();
  return std::nullopt;
}

}  // namespace flextile::ir
