#include "autotune/Autotune.h"

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>

#include "attention_templates/FlexAttentionCommon.h"
#include "autotune/Sweep.h"
#include "autotune/TuneCache.h"
#include "codegen/CompileCache.h"
#include "codegen/Ptxas.h"
#include "runtime/Device.h"

namespace flextile::autotune {

using attention::FlexAttentionProblem;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

std::vector<FlexAttentionConfig> ConfigSpace::configs() const {
  std::vector<FlexAttentionConfig> out;
  for (int64_t m : blockM)
    for (int64_t n : blockN)
      for (int w : warps)
        for (int s : stages)
          for (attention::WarpSpecialization ws : specialize)
            for (attention::LoopSchedule t : turns)
              for (attention::LoopSchedule d : defer)
                for (attention::LoopSchedule p : persistent)
                  for (attention::LoopSchedule k : skew)
                    for (attention::LoopSchedule o : overlap) {
                  using attention::LoopSchedule;
                  const bool schedulable = w == 8 && m == 128 && s > 1;
                  const bool specializable = schedulable && ws != attention::WarpSpecialization::Off;
                  // (defer with persistent programs or with skew is refused: attention::configProblem)
                  if ((t == LoopSchedule::On && !specializable) || (d == LoopSchedule::On && !schedulable) ||
                      (p == LoopSchedule::On && (!specializable || d == LoopSchedule::On)) ||
                      (k == LoopSchedule::On && (!schedulable || d == LoopSchedule::On)) ||
                      // (no-skew differs from Auto only where the turns may overlap the walks)
                      (k == LoopSchedule::Off && (!specializable || d == LoopSchedule::On)) ||
                      (o == LoopSchedule::On && k != LoopSchedule::On))  // overlap refines skew
                    continue;
                  out.push_back({m, n, w, s, ws, t, d, p, k, o});
                  }
  return out;
}

ConfigSpace defaultSpace(DType dtype, int64_t headDim) {
  ConfigSpace s{{64, 128}, {32, 64, 128}, {4, 8}, {1, 2, 3}, {attention::WarpSpecialization::Auto, attention::WarpSpecialization::Off}};
  s.turns = {attention::LoopSchedule::Auto, attention::LoopSchedule::On};
  s.defer = {attention::LoopSchedule::Auto, attention::LoopSchedule::On};
  s.persistent = {attention::LoopSchedule::Auto, attention::LoopSchedule::On};
  // Skew: Auto (the overlapped walks where the warpgroups take turns, unskewed elsewhere) or Off
  // (the unskewed walks on the turns); the plain skew (−15 % on the H200) and an explicit overlap
  // (Auto's kernel wherever it differs from Off) are left out.
  s.skew = {attention::LoopSchedule::Auto, attention::LoopSchedule::Off};
  s.overlap = {attention::LoopSchedule::Auto};
  if (headDim > 128 || ir::byteWidth(dtype) == 4) s.blockN = {32, 64};
  return s;
}

DeviceLimits DeviceLimits::of(const codegen::Target& t) {
  DeviceLimits l;
  l.sharedBytesPerBlock = t.maxSharedBytesPerBlock();
  return l;
}

DeviceLimits DeviceLimits::ofCurrentDevice() {
  runtime::Device& d = runtime::Device::current();
  DeviceLimits l;
  l.sharedBytesPerBlock = int64_t(d.maxSharedBytesPerBlockOptin());
  l.threadsPerBlock = d.maxThreadsPerBlock();
  return l;
}

const char* statusName(CandidateStatus s) {
  switch (s) {
    case Candidate::Status::Pruned: return "pruned";
    case Candidate::Status::Failed: return "failed";
    case Candidate::Status::Compiled: return "compiled";
    case Candidate::Status::Wrong: return "wrong";
    case Candidate::Status::Timed: return "timed";
    case Candidate::Status::Skipped: return "skipped";
  }
  return "?";
}

namespace {
constexpr int kMaxSpillBytes = 1024;

bool pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }
}  // namespace

std::optional<std::string> pruneBeforeCompile(const FlexAttentionConfig& c, const FlexAttentionProblem& p,
                                              const DeviceLimits& limits) {
  if (!pow2(c.block_m) || !pow2(c.block_n) || c.block_m < 16 || c.block_n < 16 || c.block_m > 256 || c.block_n > 256)
    return "BLOCK_M and BLOCK_N must be powers of two in [16, 256]";
  if (c.num_stages < 1 || c.num_stages > 4) return "num_stages must be 1..4";
  if (!pow2(c.num_warps) || c.num_warps > 16) return "num_warps must be 1, 2, 4, 8 or 16";
  if (c.num_warps * 32 > limits.threadsPerBlock)
    return "threads: " + std::to_string(c.num_warps * 32) + " > " + std::to_string(limits.threadsPerBlock) + " per block";
  // The mma layout gives each warp 16-row slices of the query tile; more
  // warps than slices replicate work.
  if (c.block_m < 16 * c.num_warps)
    return "warps: BLOCK_M " + std::to_string(c.block_m) + " has fewer than 16 rows per warp for " +
           std::to_string(c.num_warps) + " warps";
  if (p.qBlockSize && p.qBlockSize % c.block_m != 0)
    return "BLOCK_M " + std::to_string(c.block_m) + " does not divide the BlockMask's Q block " +
           std::to_string(p.qBlockSize);
  if (p.kvBlockSize && p.kvBlockSize % c.block_n != 0)
    return "BLOCK_N " + std::to_string(c.block_n) + " does not divide the BlockMask's KV block " +
           std::to_string(p.kvBlockSize);
  // The K and V rings alone (num_stages tiles of BLOCK_N x D and of BLOCK_N x DV, as wide as the
  // template's tiles) are a lower bound of the kernel's shared memory.
  const int64_t ring = int64_t(std::max(1, c.num_stages)) * c.block_n *
                       (attention::detail::tileColumns(p.D) + attention::detail::tileColumns(p.valueDim())) *
                       ir::byteWidth(p.dtype);
  if (c.num_stages > 1 && ring > limits.sharedBytesPerBlock)
    return "shared memory: the K/V rings alone need " + std::to_string(ring) + " bytes > " +
           std::to_string(limits.sharedBytesPerBlock);
  return std::nullopt;
}

std::optional<std::string> pruneAfterCompile(int numWarps, int64_t sharedBytes, int registers, int spillBytes,
                                             const DeviceLimits& limits) {
  if (sharedBytes > limits.sharedBytesPerBlock)
    return "shared memory: " + std::to_string(sharedBytes) + " bytes > " + std::to_string(limits.sharedBytesPerBlock);
  if (registers > 0 && int64_t(registers) * numWarps * 32 > limits.registersPerBlock)
    return "registers: " + std::to_string(registers) + " x " + std::to_string(numWarps * 32) + " threads > " +
           std::to_string(limits.registersPerBlock);
  // A few spilled bytes can still be the fastest config; heavy spilling never is.
  if (spillBytes > kMaxSpillBytes) return "spills: " + std::to_string(spillBytes) + " bytes to local memory";
  return std::nullopt;
}

CandidateStatus statusOfCompileFailure(const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  // The shared-memory planner refuses what does not fit: a pruning, not a bug.
  return error && error->kind() == ErrorKind::ResourceLimit ? Candidate::Status::Pruned : Candidate::Status::Failed;
}

namespace sweep {

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double relativeDifference(const std::vector<float>& have, const std::vector<float>& want) {
  double worst = 0, mag = 1e-6;
  for (size_t i = 0; i < have.size(); ++i) {
    if (!std::isfinite(have[i])) return INFINITY;
    worst = std::max(worst, std::abs(double(have[i]) - double(want[i])));
    mag = std::max(mag, std::abs(double(want[i])));
  }
  return worst / mag;
}

void poison(Tensor& t) {
  // All-ones bytes are a NaN in bf16, f16 and f32 alike: a fill, no host buffer of the tensor's size
  // (the backward's scratch is hundreds of megabytes a candidate).
  if (t.isContiguous()) return t.fillBytes(0xFF);
  const size_t n = size_t(t.numel());
  switch (t.dtype()) {
    case DType::BF16: t.copyFromHost(std::vector<Eigen::bfloat16>(n, Eigen::bfloat16(NAN))); break;
    case DType::F16: t.copyFromHost(std::vector<Eigen::half>(n, Eigen::half(NAN))); break;
    default: t.copyFromHost(std::vector<float>(n, NAN)); break;
  }
}

// ptxas takes seconds per config and its answer depends only on the PTX and
// the target: its report and cubin go into the kernel's compile-cache entry,
// so a second sweep does not assemble again and later launches of the kernel
// load the very cubin whose registers and spills were judged here.
codegen::PtxasReport cachedPtxas(const codegen::CompiledKernel& kernel) {
  codegen::CompileCache& cache = codegen::CompileCache::global();
  if (!cache.enabled() || kernel.irHash == 0) return codegen::runPtxas(kernel.ptx, kernel.target);
  const codegen::CompileCacheKey key{kernel.irHash, kernel.target};
  std::optional<codegen::CompiledKernel> entry = cache.load(key);
  if (entry && entry->ptx == kernel.ptx && !entry->cubin.empty() &&
      entry->ptxasInfo.find("Used ") != std::string::npos) {
    codegen::PtxasReport r = codegen::parsePtxasLog(entry->ptxasInfo);
    r.cubin = entry->cubin;
    return r;
  }
  codegen::PtxasReport r = codegen::runPtxas(kernel.ptx, kernel.target);
  codegen::CompiledKernel stored = entry && entry->ptx == kernel.ptx ? *entry : kernel;
  stored.ptxasInfo = r.log;
  stored.cubin = r.cubin;
  cache.store(key, stored);
  return r;
}

}  // namespace sweep

TuneReport tuneFlexAttention(const Tensor& q, const Tensor& k, const Tensor& v, const attention::ScoreMod& scoreMod,
                             const std::optional<attention::BlockMask>& blockMask, const ConfigSpace& space,
                             const TuneOptions& options) {
  auto say = [&](const std::string& line) {
    if (options.progress) options.progress(line);
  };
  const FlexAttentionProblem problem = attention::flexAttentionProblem(q, k, v, scoreMod, blockMask);
  const bool device = problem.space == MemorySpace::Device;
  const std::optional<codegen::Target> target =
      device ? std::nullopt : std::optional(options.target.value_or(codegen::Target::sm90a()));
  const DeviceLimits limits = device ? DeviceLimits::ofCurrentDevice() : DeviceLimits::of(*target);
  // What the call runs untuned: the default for the wider of q's and v's head dims.
  const FlexAttentionConfig defaultConfig =
      attention::detail::untunedConfig(q, std::max(problem.D, problem.valueDim()), scoreMod, blockMask, target);

  TuneReport report;
  std::vector<FlexAttentionConfig> configs = space.configs();
  // Without setmaxnreg no kernel is specialized: Off and On would only time Auto's kernel again.
  const codegen::Target arch = target ? *target
                                      : codegen::Target::fromCapability(runtime::Device::current().capabilityMajor(),
                                                                        runtime::Device::current().capabilityMinor());
  // Without wgmma there are no turns and nothing to defer behind: On would time Auto's kernel too.
  if (!arch.has(codegen::Feature::SetMaxNReg) || !arch.has(codegen::Feature::Wgmma)) {
    std::vector<FlexAttentionConfig> kept;
    for (FlexAttentionConfig c : configs) {
      if (!arch.has(codegen::Feature::SetMaxNReg)) c.warp_specialize = attention::WarpSpecialization::Auto;
      if (!arch.has(codegen::Feature::Wgmma)) c.turns = c.defer = c.persistent = c.skew = c.overlap = attention::LoopSchedule::Auto;
      if (std::find(kept.begin(), kept.end(), c) == kept.end()) kept.push_back(c);
    }
    configs = std::move(kept);
  }
  if (std::find(configs.begin(), configs.end(), defaultConfig) == configs.end()) configs.insert(configs.begin(), defaultConfig);
  for (const FlexAttentionConfig& c : configs) {
    Candidate cand;
    cand.config = c;
    if (auto why = pruneBeforeCompile(c, problem, limits)) {
      cand.status = Candidate::Status::Pruned;
      cand.reason = *why;
    }
    report.candidates.push_back(cand);
    if (c == defaultConfig) report.defaultIndex = int(report.candidates.size() - 1);
  }

  sweep::Hooks<FlexAttentionConfig> hooks;
  hooks.compile = [&](const FlexAttentionConfig& c) {
    attention::FlexAttentionOptions o;
    o.config = c;
    const attention::FlexAttentionPlan plan = attention::plan_flex_attention(q, k, v, scoreMod, blockMask, o, true, target);
    return sweep::Hooks<FlexAttentionConfig>::Compiled{{plan.compiled}, {}};
  };
  hooks.run = [&](const FlexAttentionConfig& c, Tensor& out) {
    attention::FlexAttentionOptions o;
    o.config = c;
    attention::flex_attention_into(q, k, v, scoreMod, blockMask, out, nullptr, o);
  };
  hooks.work = options.flops;
  sweep::compileAll(report, hooks, options, limits);
  if (!device) {
    say("dry run: host inputs, nothing is timed (time on a GPU with device tensors)");
    return report;
  }
  sweep::checkAndTime(report, hooks, options, q.dtype(), q.shape(), defaultConfig);
  sweep::storeWinner(report, options, sweep::problemShape(problem),
                     [&](const GpuIdentity& gpu) { return tuneKey(problem, gpu); }, &TuneCache::put);
  return report;
}

std::string formatReport(const TuneReport& r) { return sweep::format(r, "TFLOP/s"); }

}  // namespace flextile::autotune
