#include "runtime/FaultInjection.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "runtime/DriverError.h"

namespace flextile::runtime {

namespace {

// CUresults a real failure at each site gives.
constexpr int kLaunchFailed = 719;  // CUDA_ERROR_LAUNCH_FAILED
constexpr int kInvalidPtx = 218;    // CUDA_ERROR_INVALID_PTX

struct SiteState {
  std::atomic<int> remaining{0};  // calls until the fault (1: the next one); 0: disarmed
  std::atomic<int> fired{0};
};

std::array<SiteState, kFaultSites>& sites() {
  static std::array<SiteState, kFaultSites> s;
  return s;
}

SiteState& state(FaultSite site) { return sites()[size_t(site)]; }

// FLEXTILE_INJECT_FAULT, read once before the first armed check.
void armFromEnvironment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* spec = std::getenv("FLEXTILE_INJECT_FAULT");
    if (!spec || !*spec) return;
    std::string_view rest = spec;
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      const size_t colon = item.find(':');
      bool known = false;
      if (colon != std::string_view::npos) {
        const std::string_view name = item.substr(0, colon);
        const int nth = std::atoi(std::string(item.substr(colon + 1)).c_str());
        for (int s = 0; s < kFaultSites; ++s)
          if (name == faultSiteName(FaultSite(s)) && nth > 0) {
            state(FaultSite(s)).remaining = nth;
            known = true;
          }
      }
      if (!known)
        throw DriverError("FLEXTILE_INJECT_FAULT: '" + std::string(item) +
                          "' is not <site>:<n> with n >= 1 and site launch, module_load or autotune_compile");
    }
  });
}

}  // namespace

const char* faultSiteName(FaultSite site) {
  switch (site) {
    case FaultSite::Launch: return "launch";
    case FaultSite::ModuleLoad: return "module_load";
    case FaultSite::AutotuneCompile: return "autotune_compile";
  }
  return "?";
}

void armFault(FaultSite site, int nth) {
  armFromEnvironment();
  state(site).remaining = nth > 0 ? nth : 0;
}

void maybeInjectFault(FaultSite site, std::string_view subject) {
  armFromEnvironment();
  SiteState& s = state(site);
  if (s.remaining.load(std::memory_order_relaxed) == 0) return;
  // Exactly one caller sees the count reach zero, even from many threads.
  int left = s.remaining.load();
  while (left > 0 && !s.remaining.compare_exchange_weak(left, left - 1)) {
  }
  if (left != 1) return;
  ++s.fired;
  const std::string what = "injected fault (FLEXTILE_INJECT_FAULT / armFault) at " +
                           std::string(faultSiteName(site)) + " of '" + std::string(subject) + "'";
  switch (site) {
    case FaultSite::Launch: throw DriverError("cuLaunchKernel", kLaunchFailed, what);
    case FaultSite::ModuleLoad: throw DriverError("cuModuleLoadDataEx", kInvalidPtx, what);
    case FaultSite::AutotuneCompile: throw DriverError(what);
  }
}

int injectedFaults(FaultSite site) { return state(site).fired; }

}  // namespace flextile::runtime
