// The decode template's autotuner: its config space and the sweep of Sweep.h over it.
#include <algorithm>

#include "autotune/Autotune.h"
#include "autotune/Sweep.h"
#include "autotune/TuneCache.h"
#include "runtime/Device.h"

namespace flextile::autotune {

using attention::FlexDecodeConfig;
using dsl::MemorySpace;
using dsl::Tensor;

std::vector<FlexDecodeConfig> DecodeConfigSpace::configs() const {
  std::vector<FlexDecodeConfig> out;
  for (int64_t n : blockN)
    for (int w : warps)
      for (int s : stages)
        for (int a : programsPerSm) {
          FlexDecodeConfig c;
          c.block_n = n, c.num_warps = w, c.num_stages = s, c.programs_per_sm = a;
          out.push_back(c);
        }
  return out;
}

DecodeConfigSpace defaultDecodeSpace(dsl::DType dtype, int64_t headDim) {
  // A decode program waits on its loads: the knobs are the bytes in flight (BLOCK_N x stages) and
  // how many programs share an SM (the split count's aim). 8 warps only issue more loads of the
  // same tile; they stay in for GPUs where that pays.
  DecodeConfigSpace s{{32, 64, 128}, {4, 8}, {2, 3, 4}, {1, 2, 3}};
  if (headDim > 128 || ir::byteWidth(dtype) == 4) s.blockN = {16, 32, 64};
  return s;
}

namespace {

// Before compiling: what the decode planner would refuse, said as the tuner's reason.
std::optional<std::string> pruneDecodeBeforeCompile(const FlexDecodeConfig& c, const attention::BlockMask* mask,
                                                    int64_t headDim, dsl::DType dtype, const DeviceLimits& limits) {
  if (c.block_n < 16 || (c.block_n & (c.block_n - 1)) != 0 || c.block_n > 256)
    return "BLOCK_N must be a power of two in [16, 256]";
  if (c.num_stages < 1 || c.num_stages > 4) return "num_stages must be 1..4";
  if (c.num_warps < 1 || (c.num_warps & (c.num_warps - 1)) != 0 || c.num_warps > 16)
    return "num_warps must be 1, 2, 4, 8 or 16";
  if (c.num_warps * 32 > limits.threadsPerBlock)
    return "threads: " + std::to_string(c.num_warps * 32) + " > " + std::to_string(limits.threadsPerBlock) + " per block";
  if (mask && c.block_n > mask->kvBlockSize())
    return "BLOCK_N " + std::to_string(c.block_n) + " is wider than the BlockMask's KV block " +
           std::to_string(mask->kvBlockSize());
  if (mask && mask->kvBlockSize() % c.block_n != 0)
    return "BLOCK_N " + std::to_string(c.block_n) + " does not divide the BlockMask's KV block " +
           std::to_string(mask->kvBlockSize());
  int64_t paddedD = 16;
  while (paddedD < headDim) paddedD *= 2;
  const int64_t ring = 2 * int64_t(c.num_stages) * c.block_n * paddedD * ir::byteWidth(dtype);
  if (ring > limits.sharedBytesPerBlock)
    return "shared memory: the K/V ring alone needs " + std::to_string(ring) + " bytes > " +
           std::to_string(limits.sharedBytesPerBlock);
  return std::nullopt;
}

}  // namespace

DecodeTuneReport tuneFlexDecode(const Tensor& q, const Tensor& k, const Tensor& v, const attention::ScoreMod& scoreMod,
                                const std::optional<attention::BlockMask>& blockMask,
                                const attention::FlexAttentionOptions& base, const DecodeConfigSpace& space,
                                const TuneOptions& options) {
  const bool device = q.space() == MemorySpace::Device;
  // A device sweep plans and compiles for the current GPU (the plan then counts its SMs).
  const codegen::Target target =
      device ? codegen::Target::fromCapability(runtime::Device::current().capabilityMajor(),
                                               runtime::Device::current().capabilityMinor())
             : options.target.value_or(codegen::Target::sm90a());
  const DeviceLimits limits = device ? DeviceLimits::ofCurrentDevice() : DeviceLimits::of(target);
  attention::FlexAttentionOptions call = base;
  call.kernel = attention::AttentionTemplate::Decode;
  call.decode_config.reset();
  call.decode_timeline.reset();
  auto with = [&](const FlexDecodeConfig& c) {
    attention::FlexAttentionOptions o = call;
    o.decode_config = c;
    return o;
  };
  const FlexDecodeConfig defaultConfig = attention::defaultFlexDecodeConfig(q.dtype(), q.size(3));

  DecodeTuneReport report;
  sweep::addCandidates(report, space.configs(), defaultConfig, [&](const FlexDecodeConfig& c) {
    return pruneDecodeBeforeCompile(c, blockMask ? &*blockMask : nullptr, q.size(3), q.dtype(), limits);
  });

  sweep::Hooks<FlexDecodeConfig> hooks;
  hooks.compile = [&](const FlexDecodeConfig& c) {
    const attention::FlexDecodePlan plan = attention::plan_flex_decode(q, k, v, scoreMod, blockMask, with(c), target);
    FlexDecodeConfig resolved = plan.config;  // its split count chosen: the aim has done its part
    resolved.programs_per_sm = 0;
    return sweep::Hooks<FlexDecodeConfig>::Compiled{plan.compiled, resolved.describe()};
  };
  hooks.run = [&](const FlexDecodeConfig& c, Tensor& out) {
    attention::flex_attention_into(q, k, v, scoreMod, blockMask, out, nullptr, with(c));
  };
  hooks.work = options.bytes;
  hooks.unit = "TB/s";
  sweep::compileAll(report, hooks, options, limits);
  if (!device) {
    if (options.progress) options.progress("dry run: host inputs, nothing is timed (time on a GPU with device tensors)");
    return report;
  }
  sweep::checkAndTime(report, hooks, options, q.dtype(), q.shape(), defaultConfig);
  sweep::storeWinner(report, options,
                     "B=" + std::to_string(q.size(0)) + " Hq=" + std::to_string(q.size(1)) +
                         " Hkv=" + std::to_string(k.size(1)) + " L=" + std::to_string(q.size(2)) +
                         " S=" + std::to_string(k.size(2)) + " D=" + std::to_string(q.size(3)) +
                         (v.size(3) != q.size(3) ? " DV=" + std::to_string(v.size(3)) : std::string()),
                     [&](const GpuIdentity& gpu) {
                       return decodeTuneKey(attention::flexAttentionProblem(q, k, v, scoreMod, blockMask), gpu);
                     },
                     &TuneCache::putDecode);
  return report;
}

std::string formatReport(const DecodeTuneReport& r) { return sweep::format(r, "TB/s"); }

}  // namespace flextile::autotune
