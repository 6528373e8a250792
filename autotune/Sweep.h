// The sweep the autotuners run (the forward's in Autotune.cpp, the decode's in AutotuneDecode.cpp, the
// backward's in AutotuneBackward.cpp):
// compile every unpruned candidate on a thread pool (ptxas for registers and spills when present),
// prune on the compiled kernels, then on a GPU check each against the default config's output into
// a poisoned scratch tensor and time it. Internal to autotune/.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "autotune/Autotune.h"
#include "autotune/TuneCache.h"
#include "codegen/Ptxas.h"
#include "runtime/Device.h"
#include "runtime/Event.h"
#include "runtime/FaultInjection.h"

namespace flextile::autotune::sweep {

// What a kind of kernel gives the sweep.
template <class Config>
struct Hooks {
  struct Compiled {
    std::vector<const codegen::CompiledKernel*> kernels;
    // What the call would run with this config once resolved (the decode's split count); two
    // candidates with the same plan are one kernel timed twice, so the later is pruned. Empty: every
    // config is its own plan.
    std::string plan;
  };
  std::function<Compiled(const Config&)> compile;          // throws what the planner or compiler throws
  std::function<void(const Config&, dsl::Tensor& out)> run;  // one call into out
  double work = 0;                                          // FLOPs or bytes of one call (0: no rate)
  const char* unit = "TFLOP/s";                             // rate = work / ms / 1e9
};

double secondsSince(std::chrono::steady_clock::time_point t0);
// max |have - want| / max |want| (elements as floats: exact for bf16 and f16); NaN or inf in have
// counts as wrong.
double relativeDifference(const std::vector<float>& have, const std::vector<float>& want);
// NaN everywhere, so an element a candidate forgets to write fails its check.
void poison(dsl::Tensor& t);
// ptxas's report of a kernel, kept in the kernel's compile-cache entry (Autotune.cpp).
codegen::PtxasReport cachedPtxas(const codegen::CompiledKernel& kernel);

// The consumer warps a config's pruning counts: a backward pair's wider kernel.
inline int warpsOf(const attention::FlexAttentionConfig& c) { return c.num_warps; }
inline int warpsOf(const attention::FlexDecodeConfig& c) { return c.num_warps; }
inline int warpsOf(const attention::FlexAttentionBackwardConfig& c) {
  return std::max(c.dkdv.num_warps, c.dq.num_warps);
}

template <class Config>
void compileAll(TuneReportOf<Config>& report, const Hooks<Config>& hooks, const TuneOptions& options,
                const DeviceLimits& limits) {
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  const bool ptxas = options.runPtxas && codegen::findPtxas().has_value();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> plans(report.candidates.size());
  std::atomic<size_t> next{0};
  std::atomic<int> done{0};
  std::mutex sayMutex;
  const int toCompile = int(std::count_if(report.candidates.begin(), report.candidates.end(), [](const auto& c) {
    return c.status != CandidateStatus::Pruned;
  }));
  auto worker = [&] {
    for (size_t i = next++; i < report.candidates.size(); i = next++) {
      CandidateOf<Config>& c = report.candidates[i];
      if (c.status == CandidateStatus::Pruned) continue;
      const auto t0 = std::chrono::steady_clock::now();
      try {
        runtime::maybeInjectFault(runtime::FaultSite::AutotuneCompile, c.config.describe());
        typename Hooks<Config>::Compiled compiled = hooks.compile(c.config);
        plans[i] = compiled.plan;
        c.compileCached = !compiled.kernels.empty();
        for (const codegen::CompiledKernel* k : compiled.kernels) {
          if (!k) continue;
          c.sharedBytes = std::max<int64_t>(c.sharedBytes, k->sharedBytes);
          c.compileCached = c.compileCached && k->fromCache;
          if (!ptxas) continue;
          const codegen::PtxasReport r = cachedPtxas(*k);
          c.registers = std::max(c.registers, r.registers);
          c.spillBytes = std::max(c.spillBytes, r.spillStoreBytes + r.spillLoadBytes);
        }
        if (auto why = pruneAfterCompile(warpsOf(c.config), c.sharedBytes, c.registers, c.spillBytes, limits)) {
          c.status = CandidateStatus::Pruned;
          c.reason = *why;
        } else if (c.spillBytes > 0) {
          c.reason = "spills " + std::to_string(c.spillBytes) + " bytes";
        }
      } catch (const std::exception& e) {
        const std::string what = e.what();
        c.status = statusOfCompileFailure(e);
        c.reason = what.substr(0, what.find('\n'));
      }
      c.compileMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::lock_guard lock(sayMutex);
      char line[256];
      std::snprintf(line, sizeof line, "[%d/%d] compiled %-16s %-8s %8.1f ms%s", ++done, toCompile,
                    c.config.describe().c_str(), statusName(c.status), c.compileMs, c.compileCached ? " (cache)" : "");
      say(line + (c.reason.empty() ? "" : "  " + c.reason));
    }
  };
  int threads = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, std::max(1, toCompile));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  // The same plan twice: the first in the space's order stays (the default config, first, always does).
  std::map<std::string, size_t> firstOfPlan;
  for (size_t i = 0; i < report.candidates.size(); ++i) {
    CandidateOf<Config>& c = report.candidates[i];
    if (c.status != CandidateStatus::Compiled || plans[i].empty()) continue;
    auto [at, fresh] = firstOfPlan.emplace(plans[i], i);
    if (fresh) continue;
    c.status = CandidateStatus::Pruned;
    c.reason = "runs as " + report.candidates[at->second].config.describe() + " (" + plans[i] + ")";
  }
  report.compileSeconds = secondsSince(start);
}

// report.best: the fastest timed candidate, unless the default (timed) is within `minSpeedup` of it;
// then the default, and the fastest says by how much it led.
template <class Config>
void chooseBest(TuneReportOf<Config>& report, double minSpeedup) {
  int fastest = -1;
  for (size_t i = 0; i < report.candidates.size(); ++i) {
    const CandidateOf<Config>& c = report.candidates[i];
    if (c.status == CandidateStatus::Timed && (fastest < 0 || c.ms < report.candidates[size_t(fastest)].ms))
      fastest = int(i);
  }
  report.best = fastest;
  if (fastest < 0 || report.defaultIndex < 0 || fastest == report.defaultIndex) return;
  const CandidateOf<Config>& def = report.candidates[size_t(report.defaultIndex)];
  CandidateOf<Config>& lead = report.candidates[size_t(fastest)];
  if (def.status != CandidateStatus::Timed || def.ms >= minSpeedup * lead.ms) return;
  report.best = report.defaultIndex;
  char note[128];
  std::snprintf(note, sizeof note, "%.3f× the default: under the %.3f× a winner needs", def.ms / lead.ms, minSpeedup);
  lead.reason = lead.reason.empty() ? note : lead.reason + "; " + note;
}

// Checks and times every compiled candidate on the GPU, each run into a poisoned device tensor of
// `dtype` and `shape` (the call's output) against the default config's.
template <class Config>
void checkAndTime(TuneReportOf<Config>& report, const Hooks<Config>& hooks, const TuneOptions& options,
                  dsl::DType dtype, const dsl::Shape& shape, const Config& defaultConfig) {
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  using dsl::DType;
  using dsl::MemorySpace;
  using dsl::Tensor;
  report.timed = true;
  const auto start = std::chrono::steady_clock::now();
  Tensor reference = Tensor::empty(dtype, shape, MemorySpace::Device);
  Tensor scratch = Tensor::empty(dtype, shape, MemorySpace::Device);
  hooks.run(defaultConfig, reference);
  runtime::synchronize();
  const std::vector<float> expected = reference.toHost<float>();  // read once, not per candidate
  const double tolerance = dtype == DType::BF16 ? 3e-2 : 1e-2;
  for (CandidateOf<Config>& c : report.candidates) {
    if (c.status != CandidateStatus::Compiled) continue;
    if (options.budgetSeconds > 0 && secondsSince(start) > options.budgetSeconds) {
      c.status = CandidateStatus::Skipped;
      c.reason = "budget spent";
      continue;
    }
    poison(scratch);
    try {
      hooks.run(c.config, scratch);
      runtime::synchronize();
      c.error = relativeDifference(scratch.toHost<float>(), expected);
      if (!(c.error <= tolerance)) {
        c.status = CandidateStatus::Wrong;
        char buf[96];
        std::snprintf(buf, sizeof buf, "output differs from the default config's by %.2e", c.error);
        c.reason = buf;
        say(c.config.describe() + " WRONG: " + c.reason);
        continue;
      }
      const std::vector<double> samples =
          runtime::timeKernel([&] { hooks.run(c.config, scratch); }, options.warmup, options.repetitions);
      c.ms = runtime::median(samples);
      c.rate = hooks.work > 0 ? hooks.work / c.ms / 1e9 : 0;
      c.status = CandidateStatus::Timed;
      char line[192];
      std::snprintf(line, sizeof line, "timed %-16s %9.4f ms %7.2f %s", c.config.describe().c_str(), c.ms, c.rate,
                    hooks.unit);
      say(line);
    } catch (const std::exception& e) {
      c.status = CandidateStatus::Failed;
      const std::string what = e.what();
      c.reason = what.substr(0, what.find('\n'));
    }
  }
  report.timingSeconds = secondsSince(start);
  chooseBest(report, options.minSpeedup);
}

// The report's candidates: `configs` with the default first (moved there, or added where the space
// lacks it, so that a later config planned the same as it is the one pruned), each pruned before
// compiling where `prune` gives a reason.
template <class Config, class Prune>
void addCandidates(TuneReportOf<Config>& report, std::vector<Config> configs, const Config& defaultConfig,
                   Prune prune) {
  if (auto at = std::find(configs.begin(), configs.end(), defaultConfig); at == configs.end())
    configs.insert(configs.begin(), defaultConfig);
  else
    std::rotate(configs.begin(), at, at + 1);
  for (const Config& c : configs) {
    CandidateOf<Config> cand;
    cand.config = c;
    if (std::optional<std::string> why = prune(c)) {
      cand.status = CandidateStatus::Pruned;
      cand.reason = *why;
    }
    report.candidates.push_back(cand);
    if (c == defaultConfig) report.defaultIndex = int(report.candidates.size() - 1);
  }
}

// "B=2 H=16 L=8192 S=8192 D=128" (and " DV=.." where v's head dim differs): what an entry was tuned at.
inline std::string problemShape(const attention::FlexAttentionProblem& p) {
  return "B=" + std::to_string(p.B) + " H=" + std::to_string(p.Hq) + " L=" + std::to_string(p.L) + " S=" +
         std::to_string(p.S) + " D=" + std::to_string(p.D) + (p.DV ? " DV=" + std::to_string(p.DV) : std::string());
}

// Stores the timed winner in the current GPU's cache (when asked to and there is one) under
// keyOf(gpu), through TuneCache's `put` for its kind of entry; `shape` says what it was tuned at.
template <class Tuned, class Config, class KeyOf>
void storeWinner(TuneReportOf<Config>& report, const TuneOptions& options, std::string shape, KeyOf keyOf,
                 bool (TuneCache::*put)(const std::string&, const Tuned&)) {
  if (report.best < 0 || !options.store) return;
  const std::optional<GpuIdentity> gpu = currentGpu();
  TuneCache* cache = gpu ? TuneCache::forCurrentGpu() : nullptr;
  if (!cache) return;
  Tuned t;
  t.config = report.candidates[size_t(report.best)].config;
  t.ms = report.candidates[size_t(report.best)].ms;
  t.defaultMs = report.defaultIndex >= 0 ? report.candidates[size_t(report.defaultIndex)].ms : 0;
  t.shape = std::move(shape);
  report.key = keyOf(*gpu);
  if ((cache->*put)(report.key, t)) report.storedIn = cache->file().string();
}

// The report as a table; `unit` names the rate column.
template <class Config>
std::string format(const TuneReportOf<Config>& r, const char* unit) {
  std::string out;
  char line[512];
  int width = 18;  // the config column fits the longest description
  for (const CandidateOf<Config>& c : r.candidates) width = std::max(width, int(c.config.describe().size()));
  std::snprintf(line, sizeof line, "%-*s %-9s %8s %5s %10s %10s %9s  %s\n", width, "config", "status", "smem KB",
                "regs", "compile ms", "time ms", unit, "note");
  out += line;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const CandidateOf<Config>& c = r.candidates[i];
    std::string note = c.reason;
    if (int(i) == r.best) note = "BEST" + (note.empty() ? "" : "; " + note);
    if (int(i) == r.defaultIndex) note = "default" + (note.empty() ? "" : "; " + note);
    const std::string regs = c.registers >= 0 ? std::to_string(c.registers) : "-";
    const std::string ms = c.status == CandidateStatus::Timed ? std::to_string(c.ms).substr(0, 8) : "-";
    char rate[32] = "-";
    if (c.status == CandidateStatus::Timed && c.rate > 0) std::snprintf(rate, sizeof rate, "%.2f", c.rate);
    std::snprintf(line, sizeof line, "%-*s %-9s %8.1f %5s %10.1f %10s %9s  %s\n", width, c.config.describe().c_str(),
                  statusName(c.status), double(c.sharedBytes) / 1024.0, regs.c_str(), c.compileMs, ms.c_str(), rate,
                  note.c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "compile: %.2f s for %zu configs; timing: %.2f s%s\n", r.compileSeconds,
                r.candidates.size(), r.timingSeconds, r.timed ? "" : " (dry run: no GPU timing)");
  out += line;
  if (r.timed && r.best >= 0 && r.defaultIndex >= 0 &&
      r.candidates[size_t(r.defaultIndex)].status == CandidateStatus::Timed) {
    const CandidateOf<Config>&best = r.candidates[size_t(r.best)], &def = r.candidates[size_t(r.defaultIndex)];
    std::snprintf(line, sizeof line, "winner: %s %.4f ms %.2f %s; default %s %.4f ms %.2f %s; speedup %.3f\n",
                  best.config.describe().c_str(), best.ms, best.rate, unit, def.config.describe().c_str(), def.ms,
                  def.rate, unit, def.ms / best.ms);
    out += line;
  }
  if (!r.storedIn.empty()) out += "stored the winner in " + r.storedIn + "\n";
  return out;
}

}  // namespace flextile::autotune::sweep
