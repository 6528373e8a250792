// The autotuner of the flex_attention forward template.
//
//   1. the config space (BLOCK_M x BLOCK_N x num_warps x num_stages; Hopper
//      knobs such as warp specialization will be more fields of the config);
//   2. static pruning: a config that cannot tile the BlockMask, needs more
//      threads than a block has, or whose K/V ring cannot fit shared memory is
//      rejected with the reason before compiling;
//   3. parallel compilation on every core (a std::thread pool over the
//      configs); a failure is recorded per config and never stops the sweep.
//      Compiled kernels are then pruned on their real shared memory, and, when
//      ptxas is present, on registers (x threads vs the 64K register file)
//      and spills;
//   4. on a GPU: every candidate writes a scratch output (never the caller's),
//      is checked against the default config's output, then timed with CUDA
//      events (warm-up, median of repetitions). Without a GPU the sweep stops
//      after step 3 (a dry run: what would compile and fit).
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "codegen/Target.h"

namespace flextile::autotune {

using attention::FlexAttentionConfig;

struct ConfigSpace {
  std::vector<int64_t> blockM, blockN;
  std::vector<int> warps, stages;
  // Auto and Off are the same kernel on a target without setmaxnreg; the tuner then keeps Auto.
  std::vector<attention::WarpSpecialization> specialize{attention::WarpSpecialization::Auto};
  // The forward's loop schedules (FlexAttentionConfig::turns, ::defer, ::persistent, ::skew,
  // ::overlap). On is only paired with the tiles it can change: 8 warps, a 128-row tile and
  // pipelined loads, turns and persistent programs only where the kernel may be specialized (not
  // with Off), and overlap only with skew On.
  std::vector<attention::LoopSchedule> turns{attention::LoopSchedule::Auto};
  std::vector<attention::LoopSchedule> defer{attention::LoopSchedule::Auto};
  std::vector<attention::LoopSchedule> persistent{attention::LoopSchedule::Auto};
  std::vector<attention::LoopSchedule> skew{attention::LoopSchedule::Auto};
  std::vector<attention::LoopSchedule> overlap{attention::LoopSchedule::Auto};  // only with skew On
  std::vector<FlexAttentionConfig> configs() const;  // the product, in a stable order
};
// The space the tuner searches by default for a dtype and head dim: every tile both with the
// template's own choice of warp specialization (Auto) and without it (Off); on the 8-warp
// 128-row tiles also with warpgroup turns, with deferred accumulation, with persistent programs and
// with skewed walks, plain or overlapped (each, and every combination but deferred accumulation with
// persistent programs or skewed walks).
ConfigSpace defaultSpace(dsl::DType dtype, int64_t headDim);

struct DeviceLimits {
  int64_t sharedBytesPerBlock = codegen::Target::sm90a().maxSharedBytesPerBlock();  // after opting in
  int threadsPerBlock = 1024;
  int registersPerBlock = 64 * 1024;
  static DeviceLimits of(const codegen::Target& target);
  static DeviceLimits ofCurrentDevice();  // throws without a GPU
};

// Before compiling: the reason `c` cannot run this problem, or nullopt.
std::optional<std::string> pruneBeforeCompile(const FlexAttentionConfig& c, const attention::FlexAttentionProblem& p,
                                              const DeviceLimits& limits);
// After compiling (registers < 0: unknown, no ptxas).
std::optional<std::string> pruneAfterCompile(int numWarps, int64_t sharedBytes, int registers, int spillBytes,
                                             const DeviceLimits& limits);
inline std::optional<std::string> pruneAfterCompile(const FlexAttentionConfig& c, int64_t sharedBytes, int registers,
                                                    int spillBytes, const DeviceLimits& limits) {
  return pruneAfterCompile(c.num_warps, sharedBytes, registers, spillBytes, limits);
}

enum class CandidateStatus { Pruned, Failed, Compiled, Wrong, Timed, Skipped };

// One config of a sweep, of the forward (FlexAttentionConfig) or the decode (FlexDecodeConfig).
template <class Config>
struct CandidateOf {
  using Status = CandidateStatus;
  Config config;
  Status status = Status::Compiled;
  std::string reason;  // why pruned, failed, wrong or skipped
  int64_t sharedBytes = 0;
  int registers = -1, spillBytes = 0;  // the most of the config's kernels
  double compileMs = 0;
  bool compileCached = false;  // from the on-disk compile cache
  // rate: TFLOP/s for the forward, TB/s of K and V read for the decode (0: not reported)
  double ms = 0, rate = 0, error = 0;
};
using Candidate = CandidateOf<FlexAttentionConfig>;
using DecodeCandidate = CandidateOf<attention::FlexDecodeConfig>;
using BackwardCandidate = CandidateOf<attention::FlexAttentionBackwardConfig>;

// How a candidate whose compile threw counts: Pruned when the error's kind says the config needs
// more of the GPU than the target has (ErrorKind::ResourceLimit: the shared-memory planner refuses
// it), Failed for anything else, whatever its message says.
CandidateStatus statusOfCompileFailure(const std::exception& e);
const char* statusName(CandidateStatus s);

struct TuneOptions {
  double budgetSeconds = 0;  // timing stops when spent (0: no limit); compiling always finishes
  int threads = 0;           // compile threads (0: every core)
  int warmup = 3, repetitions = 20;
  bool runPtxas = true;      // when ptxas is found: registers and spills
  std::optional<codegen::Target> target;  // dry runs (host inputs): what to compile for; default sm_90a
  double flops = 0;          // of one forward (or backward) call, for TFLOP/s (0: not reported)
  double bytes = 0;          // of K and V one decode call reads, for TB/s (0: not reported)
  // The winner must run at least this much faster than the default config (its time divided by the
  // winner's), else the default stays: a winner by run-to-run noise (~1.5 % between two sweeps on
  // one H100, 2026-12-07) would move the tuned config from one sweep to the next. 1: the fastest.
  double minSpeedup = 1.02;
  bool store = true;         // write the winner into the per-GPU cache
  std::function<void(const std::string&)> progress;  // one line per event
};

template <class Config>
struct TuneReportOf {
  std::vector<CandidateOf<Config>> candidates;
  int best = -1, defaultIndex = -1;  // indices into candidates (-1: none)
  double compileSeconds = 0, timingSeconds = 0;
  bool timed = false;   // false: a dry run (no GPU, or host inputs)
  std::string key;      // the per-GPU cache key (empty for dry runs)
  std::string storedIn; // the cache file the winner went to
};
using TuneReport = TuneReportOf<FlexAttentionConfig>;
using DecodeTuneReport = TuneReportOf<attention::FlexDecodeConfig>;
using BackwardTuneReport = TuneReportOf<attention::FlexAttentionBackwardConfig>;

// Tunes flex_attention(q, k, v, scoreMod, blockMask) over `space`. Device
// inputs are timed on the current GPU; host inputs give a dry run.
TuneReport tuneFlexAttention(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                             const attention::ScoreMod& scoreMod, const std::optional<attention::BlockMask>& blockMask,
                             const ConfigSpace& space, const TuneOptions& options = {});

// A text table of the report (config, status, shared memory, registers,
// compile ms, time, TFLOP/s or TB/s, reason).
std::string formatReport(const TuneReport& report);
std::string formatReport(const DecodeTuneReport& report);
std::string formatReport(const BackwardTuneReport& report);

// ---- the decode template (autotune/AutotuneDecode.cpp) ----
//
// The decode's configs: BLOCK_N x warps x stages x the programs an SM its split count aims at
// (FlexDecodeConfig::programs_per_sm; the count itself follows each call's live blocks, so a tuned
// config carries over to every length of its bucket). A config whose plan is another's (the same
// kernel and split count: an aim above what the ring lets reside) is pruned with that reason.
struct DecodeConfigSpace {
  std::vector<int64_t> blockN;
  std::vector<int> warps, stages, programsPerSm;
  std::vector<attention::FlexDecodeConfig> configs() const;  // the product, in a stable order
};
DecodeConfigSpace defaultDecodeSpace(dsl::DType dtype, int64_t headDim);

// Tunes flex_attention(q, k, v, scoreMod, blockMask, base) on the decode template (base carries
// the call's query_offset or query_offsets; its decode_config is ignored) over `space`: the same
// sweep as the forward's (compile in parallel, prune, check each against the default config's
// output, time), the winner stored under decodeTuneKey. Host inputs give a dry run.
DecodeTuneReport tuneFlexDecode(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                const attention::ScoreMod& scoreMod,
                                const std::optional<attention::BlockMask>& blockMask,
                                const attention::FlexAttentionOptions& base, const DecodeConfigSpace& space,
                                const TuneOptions& options = {});

// ---- the backward (autotune/AutotuneBackward.cpp) ----
//
// The backward's configs are (dkdv, dq) pairs: the product of two lists of tiles, each pair timed as
// the whole backward a training step runs (preprocess, dkdv, dq). Pruned before compiling: a tile
// that cannot tile the BlockMask, a forward-only schedule, too many threads; then as the forward's
// (shared memory, registers, spills; the planner's shared-memory refusal). The check compares dQ, dK
// and dV with the default pair's.
struct BackwardConfigSpace {
  std::vector<FlexAttentionConfig> dkdv, dq;
  std::vector<attention::FlexAttentionBackwardConfig> configs() const;  // the product, in a stable order
};
// The tiles the backward bench found best somewhere, for a dtype and head dim (the larger of q's
// and v's): 36 pairs for 16-bit up to D = 128, 25 past it, 9 for f32.
BackwardConfigSpace defaultBackwardSpace(dsl::DType dtype, int64_t headDim);

// Tunes flex_attention_backward(q, k, v, out, lse, dout, scoreMod, blockMask) with dQ summed by the
// dq kernel (the default; atomic dQ is not tuned) over `space`, the winner stored under
// backwardTuneKey, where flex_attention_backward without a config finds it. `out` and `lse` are the
// forward's. Host inputs give a dry run. The trainable captures' gradients are computed, not checked.
BackwardTuneReport tuneFlexAttentionBackward(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                                             const dsl::Tensor& out, const dsl::Tensor& lse, const dsl::Tensor& dout,
                                             const attention::ScoreMod& scoreMod,
                                             const std::optional<attention::BlockMask>& blockMask,
                                             const BackwardConfigSpace& space, const TuneOptions& options = {});

}  // namespace flextile::autotune
