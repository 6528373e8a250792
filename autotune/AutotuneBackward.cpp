// The backward's autotuner: (dkdv, dq) pairs swept as the forward's configs are (Sweep.h), each pair
// timed as the whole backward a training step runs (preprocess, dkdv, dq).
#include <algorithm>

#include "attention_templates/FlexAttentionCommon.h"
#include "autotune/Autotune.h"
#include "autotune/Sweep.h"
#include "autotune/TuneCache.h"
#include "runtime/Device.h"

namespace flextile::autotune {

using attention::FlexAttentionBackwardConfig;
using attention::LoopSchedule;
using attention::WarpSpecialization;
using dsl::MemorySpace;
using dsl::Tensor;

std::vector<FlexAttentionBackwardConfig> BackwardConfigSpace::configs() const {
  std::vector<FlexAttentionBackwardConfig> out;
  for (const FlexAttentionConfig& a : dkdv)
    for (const FlexAttentionConfig& b : dq) out.push_back({a, b});
  return out;
}

BackwardConfigSpace defaultBackwardSpace(dsl::DType dtype, int64_t headDim) {
  constexpr auto ws = WarpSpecialization::On;
  constexpr auto turns = LoopSchedule::On;
  if (ir::byteWidth(dtype) == 4)  // f32: mma.sync tiles, registers bound (docs/backward.md)
    return {{{16, 32, 4, 2}, {32, 32, 4, 2}, {16, 64, 4, 2}}, {{16, 32, 4, 2}, {32, 32, 4, 2}, {64, 32, 4, 2}}};
  // Past D = 128 the one-warpgroup dkdv tiles hold too few of dK's and dV's columns or spill; the
  // 8-warp tiles split N between two warpgroups.
  if (headDim > 128)
    return {{{64, 64, 8, 2}, {64, 64, 8, 2, ws}, {32, 64, 8, 2, ws}, {16, 64, 4, 2}, {16, 32, 4, 2}},
            {{64, 64, 4, 2}, {128, 64, 8, 2, ws}, {128, 64, 8, 3, ws}, {128, 64, 8, 2, ws, turns}, {16, 32, 4, 2}}};
  // The tiles the backward bench's sweeps found best somewhere (bench/RESULTS.md, 2026-12-01..07).
  return {{{64, 64, 4, 2}, {32, 64, 4, 2}, {64, 128, 8, 2}, {64, 128, 8, 2, ws}, {64, 128, 8, 2, ws, turns},
           {64, 64, 8, 2, ws}},
          {{64, 64, 4, 2}, {64, 32, 4, 2}, {128, 64, 8, 2}, {128, 64, 8, 2, ws}, {128, 64, 8, 3, ws},
           {128, 64, 8, 2, ws, turns}}};
}

namespace {

// Before compiling: what the backward would refuse for either kernel, said as the tuner's reason.
std::optional<std::string> pruneBackwardBeforeCompile(const FlexAttentionBackwardConfig& c,
                                                      const attention::BlockMask* mask, const DeviceLimits& limits) {
  for (const auto& [which, tile] : {std::pair{"dkdv", &c.dkdv}, std::pair{"dq", &c.dq}}) {
    if (auto why = attention::detail::backwardTileProblem(*tile, mask)) return std::string(which) + ": " + *why;
    const int threads = (tile->num_warps + (tile->warp_specialize == WarpSpecialization::On ? 4 : 0)) * 32;
    if (threads > limits.threadsPerBlock)
      return std::string(which) + ": threads: " + std::to_string(threads) + " > " +
             std::to_string(limits.threadsPerBlock) + " per block";
  }
  return std::nullopt;
}

}  // namespace

BackwardTuneReport tuneFlexAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                             const Tensor& lse, const Tensor& dout,
                                             const attention::ScoreMod& scoreMod,
                                             const std::optional<attention::BlockMask>& blockMask,
                                             const BackwardConfigSpace& space, const TuneOptions& options) {
  const attention::FlexAttentionProblem problem = attention::flexAttentionProblem(q, k, v, scoreMod, blockMask);
  const bool device = problem.space == MemorySpace::Device;
  const std::optional<codegen::Target> target =
      device ? std::nullopt : std::optional(options.target.value_or(codegen::Target::sm90a()));
  const DeviceLimits limits = device ? DeviceLimits::ofCurrentDevice() : DeviceLimits::of(*target);
  // What a call runs untuned (never a pair stored by an earlier sweep).
  const FlexAttentionBackwardConfig defaultConfig = attention::detail::untunedBackwardConfig(
      q.dtype(), q.size(3), v.size(3), problem.space, target, scoreMod, blockMask, attention::DqAccumulation::Separate);

  BackwardTuneReport report;
  sweep::addCandidates(report, space.configs(), defaultConfig, [&](const FlexAttentionBackwardConfig& c) {
    return pruneBackwardBeforeCompile(c, blockMask ? &*blockMask : nullptr, limits);
  });

  // dQ, dK and dV of a run side by side in one flat tensor: the sweep checks and poisons one output.
  const int64_t dqCount = q.numel(), dkCount = k.size(0) * k.size(1) * k.size(2) * q.size(3),
                dvCount = k.size(0) * k.size(1) * k.size(2) * v.size(3);
  sweep::Hooks<FlexAttentionBackwardConfig> hooks;
  hooks.compile = [&](const FlexAttentionBackwardConfig& c) {
    const attention::FlexAttentionBackwardPlan plan = attention::plan_flex_attention_backward(
        q, k, v, out, lse, dout, scoreMod, blockMask, {.config = c}, target);
    return sweep::Hooks<FlexAttentionBackwardConfig>::Compiled{plan.compiled, {}};
  };
  hooks.run = [&](const FlexAttentionBackwardConfig& c, Tensor& flat) {
    attention::FlexAttentionGrads grads;
    grads.dq = Tensor::viewOf(flat, 0, q.shape());
    grads.dk = Tensor::viewOf(flat, dqCount, {k.size(0), k.size(1), k.size(2), q.size(3)});
    grads.dv = Tensor::viewOf(flat, dqCount + dkCount, {k.size(0), k.size(1), k.size(2), v.size(3)});
    attention::flex_attention_backward_into(q, k, v, out, lse, dout, scoreMod, blockMask, grads, {.config = c});
  };
  hooks.work = options.flops;
  sweep::compileAll(report, hooks, options, limits);
  if (!device) {
    if (options.progress)
      options.progress("dry run: host inputs, nothing is timed (time on a GPU with device tensors)");
    return report;
  }
  sweep::checkAndTime(report, hooks, options, q.dtype(), {dqCount + dkCount + dvCount}, defaultConfig);
  sweep::storeWinner(report, options, sweep::problemShape(problem),
                     [&](const GpuIdentity& gpu) { return backwardTuneKey(problem, gpu); }, &TuneCache::putBackward);
  return report;
}

std::string formatReport(const BackwardTuneReport& r) { return sweep::format(r, "TFLOP/s"); }

}  // namespace flextile::autotune
