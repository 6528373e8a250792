// The lowering's shared state, used by codegen/Lower*.cpp only. It names
// LLVM types but includes no LLVM header: LLVM headers belong in codegen/*.cpp
// (tests/layering), so each including .cpp first includes
// <llvm/IR/IRBuilder.h>, <llvm/IR/LLVMContext.h> and <llvm/IR/Module.h>.
// Nothing outside codegen/Lower*.cpp includes this header. One Lowering object lowers one function; each op family has
// its own file:
//   LowerToLLVM.cpp            driver, kernel ABI, thread coordinates, shape ops
//   LowerElementwise.cpp       unary/binary math, cmp, select, cast, addptr
//   LowerMemory.cpp            global load/store (predicated, vectorized)
//   LowerAtomic.cpp            atomic_add (one adder per replicated element), fence
//   LowerReduce.cpp            reduce: registers, warp shuffles, shared memory
//   LowerDot.cpp               dot: mma.sync on tensor cores, or f32 FMAs through shared memory
//   LowerControlFlow.cpp       for/yield
//   LowerAsync.cpp             the memory/async level: shared buffers, cp.async, barriers
//   LowerLayoutConversion.cpp  convert_layout and the shared-memory helpers
#pragma once

#include <functional>

#include <string>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "codegen/LowerToLLVM.h"
#include "codegen/TensorMaps.h"
#include "ir/SharedLayout.h"

namespace flextile::codegen {

using Regs = std::vector<llvm::Value*>;
struct LdmatrixPlan;  // codegen/TensorCores.h
struct WgmmaPlan;     // codegen/TensorCores.h

class Lowering {
 public:
  Lowering(const ir::Function& f, const Target& target, const LoweringPlan& plan, llvm::LLVMContext& ctx);
  std::unique_ptr<llvm::Module> run();

  // ---- shared helpers (LowerToLLVM.cpp) ----
  llvm::Type* llvmType(ir::DType t);           // element type in registers (i1 for I1)
  llvm::Type* memoryType(ir::DType t);         // element type in memory (i8 for I1)
  llvm::Type* llvmType(const ir::Type& t);     // element type; pointee-aware for pointers
  const Regs& get(const ir::Value* v) const;
  void set(const ir::Value* v, Regs regs);
  const ir::Layout& layoutOf(const ir::Value* v, const ir::Op& user) const;  // throws when absent
  [[noreturn]] void fail(const ir::Op& op, const std::string& what) const;

  // Coordinate (one i32 per dim) of register `reg` of this thread.
  std::vector<llvm::Value*> coordinate(const ir::Layout& l, int64_t reg);
  // The thread-dependent part of a layout's coordinates (one i32 per dim),
  // computed once per layout in the entry block.
  const std::vector<llvm::Value*>& threadCoordinate(const ir::Layout& l);
  // True in exactly one thread of every group of threads holding the same
  // elements of `l` (see Layout::replicatedLaneMask); null when no thread is
  // replicated. `extraLaneMask`/`extraWarpMask` add bits treated as replicated.
  llvm::Value* ownerPredicate(const ir::Layout& l) {
    return threadsWithBitsClear(l.replicatedLaneMask(), l.replicatedWarpMask());
  }
  // Emits `body` so that it runs only where `predicate` is true (always when
  // it is null): how replicated threads leave a shared write to one owner.
  // The blocks are named `name` and `name`.done.
  void onlyWhere(llvm::Value* predicate, const char* name, const std::function<void()>& body);
  // (lane & laneMask) == 0 && (warp & warpMask) == 0, computed once in the
  // entry block; null when both masks are 0.
  llvm::Value* threadsWithBitsClear(uint32_t laneMask, uint32_t warpMask);
  // Flat row-major index of a coordinate (i32).
  llvm::Value* flatIndex(const ir::Shape& shape, const std::vector<llvm::Value*>& coord);
  llvm::Value* i32(int64_t v) { return b.getInt32(uint32_t(v)); }
  // One PTX statement with side effects and no results (a fence, a bulk copy, a group wait).
  void asmStatement(const std::string& text, const std::string& constraints = "~{memory}",
                    const std::vector<llvm::Value*>& args = {});
  // One PTX statement with side effects and one result of type `result` ($0 in `text`).
  llvm::Value* asmValue(llvm::Type* result, const std::string& text, const std::string& constraints,
                        const std::vector<llvm::Value*>& args = {});

  // Converts between a register value and f32 for f16/bf16 arithmetic.
  llvm::Value* toCompute(llvm::Value* v, ir::DType t);
  llvm::Value* fromCompute(llvm::Value* v, ir::DType t);
  // One step of a reduction (kind: sum, max, min) on register values of t.
  llvm::Value* combine(const std::string& kind, llvm::Value* a, llvm::Value* b, ir::DType t);
  // shfl.sync.bfly over the full warp, for a value of any register type.
  llvm::Value* shuffleXor(llvm::Value* v, int laneMask);

  // ---- shared memory (LowerLayoutConversion.cpp) ----
  llvm::Value* sharedAddress(int64_t scratchOffset, llvm::Value* elementIndex, ir::DType t);
  llvm::Value* sharedAddress(llvm::Value* byteOffset, llvm::Value* elementIndex, ir::DType t);
  void storeShared(llvm::Value* addr, llvm::Value* v, ir::DType t);
  llvm::Value* loadShared(llvm::Value* addr, ir::DType t);
  // The barrier of every thread that runs this code: bar.sync 0 over the program, or, in the
  // consumers of a warp-specialized program, named barrier kConsumerBarrier over num_warps * 32.
  void barrier();
  // bar.sync 0 over every thread of the program, producer warps included.
  void programBarrier();
  static constexpr int kConsumerBarrier = 3;  // 0: the program's; 1 and 2: the warpgroup turns

  int64_t scratchOffset(const ir::Op& op, int64_t needed);
  // Writes the tile `regs` (layout l) row-major into scratch at `offset`, by
  // one thread per element group; reads it back in layout `to`. No barriers.
  void storeTileToShared(const Regs& regs, const ir::Layout& l, ir::DType t, int64_t offset);
  Regs loadTileFromShared(const ir::Layout& to, ir::DType t, int64_t offset);
  // Element offset, in the swizzled shared tile `s`, of the thread part
  // (lane and warp bases) of layout `l`: SharedLayout offsets are linear over
  // GF(2), so element (reg, lane, warp) lives at this ^ s.offsetOf(l.regCoord(reg)).
  // Computed once per pair in the entry block.
  llvm::Value* sharedThreadOffset(const ir::Layout& l, const ir::SharedLayout& s);
  // The same in the swizzled shared tile `s`, with accesses of `vec` elements
  // (codegen/ConversionPlan.h sharedAccessVector says which fit). The store
  // writes from the owning (non-replicated) threads only. No barriers.
  void storeTileToSharedLayout(const Regs& regs, const ir::Layout& l, const ir::SharedLayout& s, int64_t vec,
                               ir::DType t, int64_t offset);
  // `byteOffset`: where the tile starts in shared memory (a scratch offset, or a ring slot's).
  Regs loadTileFromSharedLayout(const ir::Layout& to, const ir::SharedLayout& s, int64_t vec, ir::DType t,
                                llvm::Value* byteOffset);
  // Register i of `to` taken from register map[i] of the operand when the two
  // layouts differ only by a renaming of registers under `coordMap` (which
  // maps a coordinate of `to` to one of `from`); empty when they don't.
  static std::vector<int64_t> registerRenaming(const ir::Layout& from, const ir::Layout& to,
                                        const std::function<ir::Layout::Coord(const ir::Layout::Coord&)>& coordMap);

  // ---- op families ----
  void lowerBlock(const ir::Block& block);
  void lowerOp(const ir::Op& op);
  void lowerShapeOp(const ir::Op& op);         // constant arange splat broadcast expand_dims reshape trans
  void lowerElementwise(const ir::Op& op);     // LowerElementwise.cpp
  void lowerLoad(const ir::Op& op);            // LowerMemory.cpp
  void lowerStore(const ir::Op& op);
  void lowerAtomicAdd(const ir::Op& op);       // LowerAtomic.cpp
  void lowerAtomicAddBulkRows(const ir::Op& op);  // bulk_rows = 1: cp.reduce.async.bulk per row
  void lowerAtomicAddBulkTensor(const ir::Op& op);  // bulk_tensor = 1: TMA reductions of the tile
  void lowerFence(const ir::Op& op);
  void lowerStoreTagged(const ir::Op& op);  // LowerAtomic.cpp
  void lowerLoadTagged(const ir::Op& op);
  void lowerGridDependency(const ir::Op& op);
  void lowerClusterAllGather(const ir::Op& op);  // LowerCluster.cpp
  // barrier.cluster arrive (release) and wait (acquire) by every thread of the program.
  void clusterArrive();
  void clusterWait();
  // A gather's closing wait is put off while the ops after it touch no shared memory and leave
  // no block (LowerCluster.cpp): the wait then overlaps what the program does with the values.
  bool clusterWaitPending = false;
  static bool clusterWaitNeededBefore(const ir::Op& op);
  llvm::Value* rowsCross(const ir::Op& gather, const ir::Layout& l, int64_t reg, llvm::Value* row);
  llvm::Value* predicatedClusterLoad(llvm::Value* addr, llvm::Value* crosses, ir::DType t);
  void lowerReduce(const ir::Op& op);          // LowerReduce.cpp
  void lowerDot(const ir::Op& op);             // LowerDot.cpp
  void lowerFor(const ir::Op& op);             // LowerControlFlow.cpp
  void lowerConvertLayout(const ir::Op& op);   // LowerLayoutConversion.cpp
  void lowerMmaDot(const ir::Op& op);          // LowerDot.cpp: mma.sync
  void lowerWgmmaDot(const ir::Op& op, const WgmmaPlan& plan);  // LowerDot.cpp: wgmma (sm_90a)
  // wgmma.wait_group `pending` with the accumulators tied through it (LowerDot.cpp): the
  // registers to read them from afterwards.
  Regs waitForWgmma(const Regs& accumulators, int64_t pending);
  void lowerWgmmaWait(const ir::Op& op);          // LowerDot.cpp
  // The memory/async level (LowerAsync.cpp).
  void lowerAsyncOp(const ir::Op& op);
  void lowerAsyncCopy(const ir::Op& op);
  void lowerTmaCopy(const ir::Op& op);
  void lowerWarpgroupTurn(const ir::Op& op);
  // The kernel's tensor maps (TensorMaps.h): their recipes, and the byval parameter of each.
  std::vector<TensorMapRecipe> tensorMaps_;
  std::vector<llvm::Value*> tensorMapArgs_;
  llvm::Value* barrierAddress(const ir::Op& op);  // shared address (u32) of an mbarrier op's slot
  void lowerLocalLoad(const ir::Op& op);
  void lowerLocalStore(const ir::Op& op);
  // Byte offset (i32) of slot operand(1) of the buffer operand(0) of an async_copy or local_load.
  // (Or of buffer operand `bufferOperand` and the slot after it: a tma_copy's barriers.)
  llvm::Value* slotByteOffset(const ir::Op& op, size_t bufferOperand = 0);
  int64_t bufferByteOffset(const ir::Op& op, size_t bufferOperand);  // the planned start of that buffer
  // The local_loads whose slot a wgmma dot reads itself (no registers).
  std::set<const ir::Op*> localLoadsReadByWgmma_;
  // convert_layout through a swizzled shared tile and ldmatrix (LowerLayoutConversion.cpp).
  Regs ldmatrixFromShared(const ir::Layout& to, const LdmatrixPlan& plan, ir::DType t, llvm::Value* byteBase);

  // Stores `xs` (layout `from`) into the swizzled tile `smem` at byte
  // `byteBase` (i32), from the owning threads, in vectors as wide as the registers'
  // contiguity, the tile's chunks and every thread's alignment allow. No barriers.
  void storeToSwizzledTile(const Regs& xs, const ir::Layout& from, const ir::SharedLayout& smem, ir::DType t,
                           llvm::Value* byteBase);

  Regs convertThroughLdmatrix(const Regs& xs, const ir::Layout& from, const ir::Layout& to,
                              const LdmatrixPlan& plan, ir::DType t, int64_t offset);

  const ir::Function& func;
  const Target& target;
  const LoweringPlan& plan;
  llvm::LLVMContext& ctx;
  std::unique_ptr<llvm::Module> module;
  llvm::IRBuilder<> b;
  llvm::Function* kernel = nullptr;
  llvm::BasicBlock* entry = nullptr;  // thread coordinates live here, before its branch
  llvm::GlobalVariable* sharedBase = nullptr;
  llvm::Value* tid = nullptr;
  llvm::Value* lane = nullptr;
  llvm::Value* warp = nullptr;
  // Warp specialization (codegen/passes/WarpSpecialize.cpp): the function is lowered once per
  // role; `producerRole` says which copy is being emitted.
  bool specialized = false;
  bool producerRole = false;
  // Whether the function has an atomic_add with `bulk_rows`, whose last reads of shared memory
  // every return waits for (LowerAtomic.cpp).
  bool bulkReductions = false;
  // `ret void`, after that wait where bulkReductions.
  void returnFromKernel();
  // Whether this copy of the function runs `op` (its `ws` attribute against the role).
  bool runsInThisRole(const ir::Op& op) const;
  // Emits both copies of a warp-specialized function (LowerToLLVM.cpp).
  void lowerSpecialized(int64_t programsPerSm);

 private:
  std::unordered_map<const ir::Value*, Regs> values_;
  std::unordered_map<std::string, std::vector<llvm::Value*>> threadCoords_;
  std::unordered_map<std::string, llvm::Value*> ownerPreds_;
};

// Warp bits of `l` whose basis lies along `axis` alone (LowerLayoutConversion.cpp).
uint32_t reduceWarpMask(const ir::Layout& l, int axis);

// The LLVM values of a tile are per register; elementwise maps are common.
template <class F>
Regs mapRegs(size_t n, F&& f) {
  Regs out(n);
  for (size_t i = 0; i < n; ++i) out[i] = f(i);
  return out;
}

}  // namespace flextile::codegen
