// Simulated driver failures, for the tests of what a failure in the middle of
// a long operation (an autotune sweep, a serving loop) leaves behind: the Nth
// call at one site throws the DriverError a real failure would, once.
//
// Armed by a test (armFault) or by the environment, for runs of a whole
// program: FLEXTILE_INJECT_FAULT=<site>:<n>[,<site>:<n>...], e.g.
// FLEXTILE_INJECT_FAULT=launch:3 fails the third kernel launch of the process.
// Sites: "launch" (cuLaunchKernel), "module_load" (cuModuleLoadDataEx) and
// "autotune_compile" (one config's compile in an autotune sweep). Disarmed, a
// site costs one relaxed atomic load.
#pragma once

#include <string_view>

namespace flextile::runtime {

enum class FaultSite { Launch, ModuleLoad, AutotuneCompile };
constexpr int kFaultSites = 3;

const char* faultSiteName(FaultSite site);

// The `nth` call (1-based) from now at `site` fails; 0 disarms the site.
void armFault(FaultSite site, int nth);
// Throws DriverError (naming the site, `subject` — the kernel or module — and
// saying that it was injected) when this call is the armed one; counts the
// call otherwise. Builds no string unless it throws: it runs on every launch.
void maybeInjectFault(FaultSite site, std::string_view subject);
// How many injected faults fired at `site` so far.
int injectedFaults(FaultSite site);

}  // namespace flextile::runtime
