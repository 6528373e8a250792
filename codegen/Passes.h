// Codegen passes over tile IR (see each .cpp for what it does and why).
#pragma once

#include <cstdint>
#include <string>

#include "codegen/Target.h"
#include "ir/IR.h"
#include "ir/Pass.h"

namespace flextile::codegen {

class AxisInfoAnalysis;

// Layout assignment (codegen/passes/AssignLayouts.cpp): turns shape-only IR
// into IR where every tile value carries a layout, inserting convert_layout
// only where a value computed in one layout is needed in another. The rules
// the result satisfies (checked by the verifier, relied on by the lowering):
//   element-wise op        all tile operands and the result share one layout
//   constant/arange/splat  any layout
//   broadcast              operand == result.projected(operand shape)
//   expand_dims            operand == result.sliced(axis)
//   reshape / trans        result == operand.reshaped(shape) / .transposed(perm)
//   reduce                 result == operand.sliced(axis) (a scalar result has none)
//   load / store           ptr, mask, other and value share one layout
//   atomic_add             ptr, value, mask and result share one layout
//   dot                    acc and result share one layout; a, b any layout
//   for                    init i, body arg i+1, result i, yield operand i share one
//   convert_layout         any -> any
// Input layouts and convert_layout ops are dropped first, so the pass may run
// on its own output. IR with ops of the memory/async level (the output of
// "pipeline" and "wgmma", or hand-written at that level) is kept as written:
// every tile must carry its layout, else an error names the first without. Throws flextile::Error for IR it cannot lay out (a tile
// dimension that is not a power of two).
void assignLayouts(ir::Function& f, const Target& target);
ir::Pass assignLayoutsPass(const Target& target);  // "assign-layouts"

// Hoisting loop-invariant loads (codegen/passes/HoistInvariantLoads.cpp): in a loop that writes no
// memory, a masked load of a scalar, a row or a column whose operands do not change between
// iterations moves before the loop, with the pure ops its operands come from (the document mask's
// per-row ids, re-read for every key block otherwise). Opt-in: function attribute
// hoist_invariant_loads = 1, or FLEXTILE_HOIST_INVARIANT_LOADS=1 (=0 for none); not yet measured on
// a GPU. Runs before assign-layouts.
void hoistInvariantLoads(ir::Function& f);
ir::Pass hoistInvariantLoadsPass();  // "hoist-invariant-loads"

// Deferring a loop's accumulating product by one iteration (codegen/passes/DeferAccumulation.cpp):
// where a loop yields a wgmma-suited dot whose accumulator only a rescale reads (the forward's
// O = O * alpha + P V) and another wgmma-suited dot stays in the body (S = Q K^T), the loop is
// rotated so that iteration t issues S_t, then the accumulation of t-1, then runs the softmax of
// S_t while that product is in flight (FlashAttention-3's intra-warpgroup overlap), with a
// prologue and an epilogue guarded for a loop of no iterations. Runs after assignLayouts, before
// pipelineLoads. Opt-in: function attribute defer_accumulation = 1, or
// FLEXTILE_DEFER_ACCUMULATION=1 for every kernel (=0 for none); no template asks yet (it measured
// no faster on the H200: DeferAccumulation.cpp says why).
void deferAccumulation(ir::Function& f, const Target& target);
ir::Pass deferAccumulationPass(const Target& target);  // "defer-accumulation"

// A pass's switch: FLEXTILE_<env>=1 or =0 forces it on or off for every kernel (and is part of the
// compile cache's identity, CompileCache.cpp), else the function attribute `attr` decides, and
// `byDefault` where the function does not say.
bool passSwitch(const ir::Function& f, const char* env, const char* attr, bool byDefault = false);

// Software pipelining (codegen/passes/Pipeline.cpp): the loads of a for loop
// that stage dot operands become a ring of num_stages shared tiles (function
// attribute; absent means 1, nothing pipelined) filled iterations ahead, in
// the memory/async level of the IR: local_alloc, async_copy, async_commit,
// async_wait, local_load, barrier and fence_async_shared (ir/Ops.def). The
// ring takes the layout wgmma reads where a dot reads it on wgmma (target
// sm_90a), else the one its ldmatrix readers share. Runs after assignLayouts.
void pipelineLoads(ir::Function& f, const Target& target);
// Whether the rings of `f` synchronize through barriers in shared memory (a `full` and an `empty`
// mbarrier per slot: each iteration waits for its slot's copies and, before it overwrites a slot,
// for every thread's release of it) instead of one CTA barrier per iteration. Opt-in: function
// attribute ring_barriers = 1, or FLEXTILE_RING_BARRIERS=1 (=0 turns it off everywhere).
bool ringBarriersWanted(const ir::Function& f);
// Whether a loop that also waits for the CTA (a conversion or reduction staged through shared
// memory) may take TMA rings when the function asks for warp specialization. Opt-in: function
// attribute tma_in_staging_loops = 1, or FLEXTILE_TMA_IN_STAGING_LOOPS=1 (such a loop gave wrong
// rows on the H200 with TMA before warp specialization existed: docs/reliability.md).
bool tmaInStagingLoopsWanted(const ir::Function& f);
// Whether TMA loops whose rings fit one set share its ring buffers and barriers, each loop issuing
// its own first stages into the slots after the previous loop's (pipeline pass, "shared rings"):
// two walks side by side, or the walks of a loop of the function's body, whose iterations pass the
// rings on (the persistent forward). Opt-in: function attribute share_rings = 1, or
// FLEXTILE_SHARE_RINGS=1 (=0 turns it off everywhere).
bool shareRingsWanted(const ir::Function& f);
ir::Pass pipelinePass(const Target& target);  // "pipeline"

// Hopper warpgroup MMA (codegen/passes/Wgmma.cpp): every dot that runs on
// wgmma for the target (TensorCores.h wgmmaPlan) becomes asynchronous
// (attribute async = 1), and wgmma_wait ops pass its accumulator through
// where it is first needed (or before control flow, fences and shared-memory
// scratch users), with `pending` the groups that may stay in flight. Runs
// after "pipeline".
void selectWgmma(ir::Function& f, const Target& target);
ir::Pass wgmmaPass(const Target& target);  // "wgmma"

// Warpgroup ping-pong (codegen/passes/Pingpong.cpp): in an 8-warp program on a wgmma target, the
// two warpgroups take turns issuing a loop's async dots (warpgroup_turn ops), so that one's
// tensor-core work overlaps the other's element-wise work. Only loops with no CTA-wide barrier in
// their body. Opt-in: function attribute pingpong = 1, or FLEXTILE_PINGPONG=1. Runs after "wgmma".
void scheduleWarpgroupTurns(ir::Function& f, const Target& target);
ir::Pass pingpongPass(const Target& target);  // "pingpong"

// Load prefetching (codegen/passes/PrefetchLoads.cpp): a small tile load in a loop (a row or
// column vector, e.g. the document mask's per-key ids) whose address the loop can compute for the
// next iteration is issued one iteration early, after the iteration's async products, and carried.
// Opt-in: function attribute prefetch_loads = 1, or FLEXTILE_PREFETCH_LOADS=1 (=0 off everywhere).
// Runs after "pingpong", before "warp-specialize".
bool prefetchLoadsWanted(const ir::Function& f);
void prefetchLoads(ir::Function& f);
ir::Pass prefetchLoadsPass();  // "prefetch-loads"

// Warp specialization (codegen/passes/WarpSpecialize.cpp): a producer warpgroup of its own
// (function attribute producer_warps = 4, threads num_warps * 32 and up) issues the TMA copies of
// the rings the pipeline pass wrote and waits for their release; the num_warps consumer warps wait
// for their data and compute. The pass marks ops with `ws` ("producer": the issuer ops; "both": the
// scalar ops, loops and CTA barriers the producer needs too; absent: the consumers alone) and the
// lowering emits the function once per role, with setmaxnreg. Opt-in: function attribute
// warp_specialize = 1, or FLEXTILE_WARP_SPECIALIZE=1 (=0 for none). Runs after "pingpong".
// All: a prefix of the function's body that every thread runs before the roles part (the rings'
// barrier buffers and their inits, then a barrier).
enum class WarpRole { Consumer, Producer, Both, All };
// The role an op's `ws` attribute gives it (Consumer when absent). Throws on another value.
WarpRole warpRole(const ir::Op& op);
// The function's producer_warps attribute (0: not specialized).
int producerWarps(const ir::Function& f);
// The ops a warp-specialized program's producer runs alone: tma_copy, mbarrier_expect_tx and
// mbarrier_wait {issuer = 1}.
bool issuesForTheRing(const ir::Op& op);
// Why the pass would leave `f` as it is ("" when it would specialize it, switch aside).
std::string warpSpecializeRefusal(const ir::Function& f, const Target& target);
// Whether `f` asks for warp specialization (attribute warp_specialize, FLEXTILE_WARP_SPECIALIZE).
bool warpSpecializationWanted(const ir::Function& f);
void specializeWarps(ir::Function& f, const Target& target);
ir::Pass warpSpecializePass(const Target& target);  // "warp-specialize"

// Whole-row atomic sums (codegen/passes/BulkReduce.cpp): an atomic_add of an f32 [R, W] tile
// whose rows are proven contiguous and 16-byte aligned, whose mask is constant along each row and
// whose old values are unused gets `bulk_rows = 1` on targets with Feature::BulkReduce: the
// lowering adds each row with one cp.reduce.async.bulk from shared memory instead of W atomics
// (codegen/LowerAtomic.cpp; scratch in codegen/SharedMemory.h). One that names its tile as a
// tensor box gets `bulk_tensor = 1` instead where the target has TMA: the whole tile added by one
// TMA reduction per panel of its staging (bulkTensorStaging). Runs after "pipeline", before "wgmma" (which waits for wgmma
// groups before every op with scratch).
void selectBulkReduce(ir::Function& f, const Target& target);
ir::Pass bulkReducePass(const Target& target);  // "bulk-reduce"
// Why `atomic` may not be lowered as bulk row reductions on a target that has them ("" when it
// may). planLowering checks every `bulk_rows` op with it (hand-written IR may carry the attribute).
std::string bulkReduceRefusal(const ir::Op& atomic, const AxisInfoAnalysis& axis);
// Why `atomic` may not be lowered as TMA reductions of its whole tile (`bulk_tensor = 1`) on
// `target` ("" when it may); the lowering checks every `bulk_tensor` op with it.
std::string bulkTensorRefusal(const ir::Op& atomic, const Target& target);

// The tile-level passes compile() runs (codegen/Compiler.cpp), in order: canonicalize, fold-scales, regroup-sums, cse, dce,
// hoist-invariant-loads, assign-layouts, defer-accumulation, pipeline, bulk-reduce, wgmma, pingpong, prefetch-loads, warp-specialize. The one list, so that what tests run is what the compiler runs.
ir::PassPipeline tilePassPipeline(const Target& target);

// The layout a load or store "wants" for coalesced, vectorized accesses: a
// blocked layout whose fastest dimension is the pointer's most contiguous
// one, with vectorWidth(ptr, mask) elements per thread along it (fewer when
// the tile has fewer elements than threads times that). Exposed for tests and
// for the lowering's diagnostics.
ir::Layout coalescedLayout(const ir::Op& loadOrStore, const AxisInfoAnalysis& axis, int numWarps);

// A blocked layout of `shape` with `vec` contiguous elements per thread
// along `fastDim`, lanes filling fastDim first then the other dimensions from
// the last to the first, warps filling the slowest dimensions first.
ir::Layout blockedLayout(const ir::Shape& shape, int numWarps, int fastDim, int64_t vec);

}  // namespace flextile::codegen
