// atomic_add: one `atomicrmw fadd/add ... syncscope("device") monotonic` per
// element on its global (addrspace 1) pointer; NVPTX (LLVM 22) prints
// `atom.global.add.{f32,u32,u64}` whether or not the old value is used (it
// selects no `red`; an unused destination is left for ptxas to drop).
//
// One adder per element. A layout may give an element to several threads:
// lanes or warps whose basis is zero (Layout::replicatedLaneMask /
// replicatedWarpMask; the layout rules allow no other kind of replica), as in
// a [1, N] row or a tile smaller than the warps. A replicated store is
// harmless, a replicated atomic adds twice. So, as for stores, an element is
// added only by the thread whose replicated lane and warp bits are all clear
// (the lowest replica), and a scalar by thread 0 alone: each register's
// atomic runs under `owner && mask`, in a branch of its own.
//
// Old values. The adder has the element's old value (0 where the mask is
// off); the other holders have none. When the result is used
// (codegen::atomicOldValuesShared) the adders write the old values to the
// op's scratch and every holder reads its elements back, with the two
// barriers of the scratch rule (codegen/SharedMemory.h). A non-replicated
// tile needs nothing: each element has exactly one holder.
//
// Whole rows (`bulk_rows = 1`, codegen/passes/BulkReduce.cpp). The rows of the tile are
// contiguous runs of f32 in global memory and the result is unused, so the bulk-copy engine adds
// them: the owners store the values into the op's scratch row by row (rows padded by 32 bytes; two
// registers that hold neighbouring columns go as one 8-byte store), and each register that can
// hold column 0 stores its pointer, or 0 where the mask is off, into its row's address slot — or,
// when this thread's element of that register is not in column 0, into the thread's own dump
// slot, which keeps the stores free of branches (codegen/SharedMemory.h has the layout). Then
// `fence.proxy.async.shared::cta` (the engine reads through the async proxy) and a barrier;
// lane r / W of warp r % W (W warps) adds row r with
// `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32` when its address is not 0, and
// every thread commits its group. The op does not wait for the engine's
// reads: that wait (`cp.async.bulk.wait_group.read 0`) opens the op's next execution, before its
// barrier, and closes the kernel (every return), and the planner keeps the rows' bytes the op's
// own in between (codegen/SharedMemory.h). So the reads overlap whatever follows the op — in the
// backward's dkdv, dK's product and the next step's — instead of stalling the issuing warps. The
// additions in L2 finish asynchronously; a later kernel on the stream sees them.
//
// fence: `bar.sync 0; fence.acq_rel.gpu; bar.sync 0` (LLVM `fence syncscope("device")
// acq_rel`), every thread. The IR's fence orders the accesses of the whole program, but
// fence.acq_rel.gpu orders only its own thread's, and the atomic that follows it (a ticket)
// is one thread's. In the PTX memory model (PTX ISA, "Memory Consistency Model") a release
// pattern is a fence followed *in program order* by a strong write, and bar.sync makes the
// threads of a CTA synchronize. So:
//   release — thread T's stores, bar.sync, thread 0's fence, thread 0's atomic: T's stores
//     precede the fence in causality order (through the barrier), and fence + atomic are
//     thread 0's release pattern;
//   acquire — thread 0's atomic, thread 0's fence, bar.sync, thread T's loads: atomic +
//     fence are thread 0's acquire pattern, and the barrier puts T's loads after it.
// The first barrier serves the release, the second the acquire; causality order is
// transitive, so a writer program's stores happen before the reader program's loads. Each
// thread fences (not only thread 0) because the op does not know which thread a later
// atomic runs on (a tile atomic runs on many).
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <algorithm>
#include <set>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorMaps.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

void Lowering::lowerAtomicAddBulkRows(const ir::Op& op) {
  const ir::Value* ptrV = op.operand(0);
  if (!target.has(Feature::BulkReduce)) fail(op, "has bulk_rows = 1, but " + target.smName() + " has no cp.reduce.async.bulk");
  const Layout& l = layoutOf(ptrV, op);
  const int64_t rows = ptrV->type().shape()[0], width = ptrV->type().shape()[1];
  const int64_t stride = bulkRowStride(op), threads = int64_t(func.numWarps()) * 32;
  const int64_t base = scratchOffset(op, scratchBytes(op));
  const int64_t addressesAt = base + rows * stride, dumpAt = addressesAt + rows * 8;
  const Regs& ptrs = get(ptrV);
  const Regs& vals = get(op.operand(1));
  const Regs* mask = ir::operandsBeforeBox(op) == 3 ? &get(op.operand(2)) : nullptr;
  auto byteAt = [&](int64_t at, llvm::Value* byteOffset) {
    return b.CreateGEP(b.getInt8Ty(), sharedBase, b.CreateAdd(i32(at), byteOffset));
  };
  // The columns a thread's part of the layout can reach: register r may hold column 0 only when
  // its own column is among them.
  std::set<int64_t> threadColumns{0};
  for (const Layout::Bases* bases : {&l.laneBases(), &l.warpBases()})
    for (const auto& basis : *bases) {
      std::set<int64_t> more = threadColumns;
      for (int64_t c : threadColumns) more.insert(c ^ basis[1]);
      threadColumns = std::move(more);
    }
  const bool pairs = bulkStoresPaired(l);  // registers 2k and 2k + 1 as one 8-byte store
  // When the registers' and the threads' coordinate bits are disjoint (as in mma and wgmma
  // layouts), XOR is addition: one thread offset plus a constant per register, which PTX takes as
  // an immediate (no address register per store).
  auto bitsOf = [](const Layout::Bases& bases, size_t dim) {
    int64_t m = 0;
    for (const auto& basis : bases) m |= basis[dim];
    return m;
  };
  const Layout::Bases regBases = [&] {
    Layout::Bases out;
    for (int64_t bit = 1; bit < l.numRegisters(); bit <<= 1) out.push_back(l.regCoord(bit));
    return out;
  }();
  bool disjoint = true;
  for (size_t d = 0; d < 2; ++d)
    disjoint = disjoint && ((bitsOf(l.laneBases(), d) | bitsOf(l.warpBases(), d)) & bitsOf(regBases, d)) == 0;
  const std::vector<llvm::Value*>& own = threadCoordinate(l);
  llvm::Value* threadPart = b.CreateAdd(b.CreateMul(own[0], i32(stride)), b.CreateMul(own[1], i32(4)));
  // The engine may still be reading this op's rows from its previous execution (the bytes are
  // the op's own: SharedMemory.h); wait for those reads first, then the barrier lets every
  // thread write.
  asmStatement("cp.async.bulk.wait_group.read 0;");
  barrier();
  onlyWhere(ownerPredicate(l), "bulk.stage", [&] {
    for (int64_t r = 0; r < l.numRegisters(); r += pairs ? 2 : 1) {
      const Layout::Coord rc = l.regCoord(r);
      llvm::Value* at;
      if (disjoint) {
        at = byteAt(base + rc[0] * stride + rc[1] * 4, threadPart);
      } else {
        const std::vector<llvm::Value*> c = coordinate(l, r);
        at = byteAt(base, b.CreateAdd(b.CreateMul(c[0], i32(stride)), b.CreateMul(c[1], i32(4))));
      }
      if (!pairs) {
        storeShared(at, vals[size_t(r)], DType::F32);
        continue;
      }
      llvm::Value* two = llvm::PoisonValue::get(llvm::FixedVectorType::get(b.getFloatTy(), 2));
      two = b.CreateInsertElement(two, vals[size_t(r)], uint64_t(0));
      two = b.CreateInsertElement(two, vals[size_t(r + 1)], uint64_t(1));
      b.CreateAlignedStore(two, at, llvm::Align(8));
    }
    // The address stores only matter in the warps that can hold column 0: when the warps' column
    // bits are single bits of their own (disjoint from the lanes' and registers'), the others skip
    // them in a branch that no warp diverges on (the specialized dkdv's dQ: one warp of eight stores).
    int64_t columnWarpBits = 0, seen = 0;
    bool warpsBySingleBits = disjoint;
    for (size_t i = 0; i < l.warpBases().size(); ++i)
      if (const int64_t c = l.warpBases()[i][1]; c != 0) {
        warpsBySingleBits = warpsBySingleBits && (c & (c - 1)) == 0 && (seen & c) == 0;
        seen |= c;
        columnWarpBits |= int64_t(1) << i;
      }
    llvm::Value* holdsColumn0 = warpsBySingleBits && columnWarpBits != 0
                                    ? b.CreateICmpEQ(b.CreateAnd(warp, i32(columnWarpBits)), i32(0))
                                    : nullptr;
    onlyWhere(holdsColumn0, "bulk.addresses", [&] {
      for (int64_t r = 0; r < l.numRegisters(); ++r) {
        if (!threadColumns.count(l.regCoord(r)[1])) continue;
        const std::vector<llvm::Value*> c = coordinate(l, r);
        llvm::Value* address = b.CreatePtrToInt(ptrs[size_t(r)], b.getInt64Ty());
        if (mask) address = b.CreateSelect((*mask)[size_t(r)], address, b.getInt64(0));
        llvm::Value* slot = b.CreateSelect(b.CreateICmpEQ(c[1], i32(0)),
                                           b.CreateAdd(i32(addressesAt), b.CreateMul(c[0], i32(8))),
                                           b.CreateAdd(i32(dumpAt), b.CreateMul(tid, i32(8))));
        b.CreateAlignedStore(address, b.CreateGEP(b.getInt8Ty(), sharedBase, slot), llvm::Align(8));
      }
    });
  });
  asmStatement("fence.proxy.async.shared::cta;");
  barrier();
  llvm::Value* smem = b.CreatePtrToInt(sharedBase, b.getInt32Ty());
  const std::string reduce = "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [$0], [$1], " +
                             std::to_string(width * 4) + ";";
  // Row first + lane * warps + warp: every warp issues an equal share. ptxas issues a warp's bulk
  // ops one lane at a time, so rows by thread id (warps 0 and 1 issuing all 64 of dQ's) left the
  // other warpgroup waiting at the next barrier (ncu, H100: 11 % of the specialized dkdv's samples).
  llvm::Value* spread = b.CreateAdd(b.CreateMul(lane, i32(func.numWarps())), warp);
  for (int64_t first = 0; first < rows; first += threads) {
    llvm::Value* row = b.CreateAdd(spread, i32(first));
    llvm::Value* inRange = rows - first >= threads ? nullptr : b.CreateICmpULT(row, i32(rows));
    onlyWhere(inRange, "bulk.row", [&] {
      llvm::Value* address = b.CreateAlignedLoad(b.getInt64Ty(), byteAt(addressesAt, b.CreateMul(row, i32(8))), llvm::Align(8));
      onlyWhere(b.CreateICmpNE(address, b.getInt64(0)), "bulk.reduce", [&] {
        llvm::Value* source = b.CreateAdd(smem, b.CreateAdd(i32(base), b.CreateMul(row, i32(stride))));
        asmStatement(reduce, "l,r,~{memory}", {address, source});
      });
    });
  }
  asmStatement("cp.async.bulk.commit_group;");
  set(op.result(), Regs(size_t(l.numRegisters()), llvm::Constant::getNullValue(b.getFloatTy())));
}

// The whole tile by TMA (`bulk_tensor = 1`): the owners store it into the op's scratch in
// bulkTensorStaging's swizzled panels (for wgmma's transposed accumulator, as the atomic dQ holds
// it, each store instruction's 32 lanes meet 32 distinct banks), then, after the same proxy fence
// and barrier as the rows', one thread issues a `cp.reduce.async.bulk.tensor` per panel at the
// box's coordinates and commits the group. The tensor map clips what lies outside the tensor's
// dims, which is where the mask is off (ir/Ops.def). The engine's reads are waited for as the
// rows' are: at the op's next execution and at every return.
void Lowering::lowerAtomicAddBulkTensor(const ir::Op& op) {
  if (const std::string why = bulkTensorRefusal(op, target); !why.empty())
    fail(op, "has bulk_tensor = 1, but " + why);
  const ir::SharedLayout staging = bulkTensorStaging(op);
  const TmaCopyPlan tma = tmaCopyPlan(op, func, tensorMaps_);
  const int64_t base = scratchOffset(op, scratchBytes(op));
  if (base % tma.alignment != 0)
    fail(op, "its staging starts at byte " + std::to_string(base) +
                 " of shared memory; TMA with its layout needs a multiple of " + std::to_string(tma.alignment));
  const ir::TensorBox box = *ir::tensorBoxOf(op);
  const size_t rank = box.dims.size();
  std::vector<llvm::Value*> coords;  // innermost first
  for (size_t k = rank; k-- > 0;) coords.push_back(get(box.coords[k])[0]);
  asmStatement("cp.async.bulk.wait_group.read 0;");
  barrier();
  const Layout& l = layoutOf(op.operand(1), op);
  storeToSwizzledTile(get(op.operand(1)), l, staging, DType::F32, i32(base));
  asmStatement("fence.proxy.async.shared::cta;");
  barrier();
  static const llvm::Intrinsic::ID ids[] = {llvm::Intrinsic::nvvm_cp_async_bulk_tensor_reduce_add_tile_1d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_reduce_add_tile_2d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_reduce_add_tile_3d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_reduce_add_tile_4d,
                                            llvm::Intrinsic::nvvm_cp_async_bulk_tensor_reduce_add_tile_5d};
  onlyWhere(threadsWithBitsClear(31, uint32_t(func.numWarps() - 1)), "tma.reduce", [&] {
    for (int64_t p = 0; p < tma.numPanels; ++p) {
      llvm::Value* at = b.CreateGEP(b.getInt8Ty(), sharedBase, i32(base + p * tma.panelBytes));
      std::vector<llvm::Value*> args{b.CreateAddrSpaceCast(at, b.getPtrTy(3)), tensorMapArgs_[tma.map]};
      for (size_t k = 0; k < rank; ++k)
        args.push_back(k == 0 && p ? b.CreateAdd(coords[0], i32(p * tma.panel)) : coords[k]);
      args.insert(args.end(), {b.getInt64(0), b.getFalse()});
      b.CreateIntrinsic(ids[rank - 1], llvm::ArrayRef<llvm::Value*>(args));
    }
    asmStatement("cp.async.bulk.commit_group;");
  });
  set(op.result(), Regs(size_t(l.numRegisters()), llvm::Constant::getNullValue(b.getFloatTy())));
}

void Lowering::returnFromKernel() {
  // The program's shared memory must outlive the engine's reads of a bulk reduction's rows.
  if (bulkReductions) asmStatement("cp.async.bulk.wait_group.read 0;");
  b.CreateRetVoid();
}

void Lowering::lowerAtomicAdd(const ir::Op& op) {
  if (const size_t n = ir::operandsBeforeBox(op); n < 2 || n > 3) fail(op, "atomic_add takes (ptr, value [, mask])");
  if (addsRowsInBulk(op)) return lowerAtomicAddBulkRows(op);
  if (addsTensorInBulk(op)) return lowerAtomicAddBulkTensor(op);
  const ir::Value* ptrV = op.operand(0);
  const ir::Value* res = op.result();
  const ir::Type& pt = ptrV->type();
  const DType t = pt.pointee();
  if (t != DType::F32 && t != DType::I32 && t != DType::I64)
    fail(op, "adds f32, i32 or i64 atomically, not through " + pt.str());
  const ir::Layout* l = nullptr;
  if (pt.isTile()) {
    l = &layoutOf(ptrV, op);
    for (const ir::Value* v : std::initializer_list<const ir::Value*>{op.operand(1), res})
      if (layoutOf(v, op) != *l)
        fail(op, "layout " + v->type().layout()->str() + " differs from the pointer layout " + l->str() +
                     " (ptr, value, mask and result share one layout)");
    if (ir::operandsBeforeBox(op) == 3 && layoutOf(op.operand(2), op) != *l)
      fail(op, "mask layout " + op.operand(2)->type().layout()->str() + " differs from the pointer layout " + l->str());
  } else {
    for (const ir::Value* v : op.operands())
      if (!v->type().isScalar()) fail(op, "adds the tile " + v->type().str() + " through a scalar pointer");
  }
  const size_t n = l ? size_t(l->numRegisters()) : 1;
  const Regs& ptrs = get(ptrV);
  const Regs& vals = get(op.operand(1));
  const Regs* mask = ir::operandsBeforeBox(op) == 3 ? &get(op.operand(2)) : nullptr;
  // The one thread per element that adds: the lowest replica, or thread 0
  // for a scalar (every bit of lane and warp "replicated").
  llvm::Value* owner = l ? ownerPredicate(*l) : threadsWithBitsClear(31u, uint32_t(func.numWarps() - 1));

  const auto rmw = ir::isFloat(t) ? llvm::AtomicRMWInst::FAdd : llvm::AtomicRMWInst::Add;
  const llvm::SyncScope::ID device = ctx.getOrInsertSyncScopeID("device");
  // {order = "acq_rel"}: the program's ticket. A barrier first, so that every thread's earlier
  // accesses precede the adding thread's release (the barrier orders them within the program, and
  // release is cumulative); after the add, the old value's way to the other threads (shared
  // memory and a barrier, or a barrier alone) carries the adder's acquire to them.
  const bool acqRel = op.hasAttr("order") && op.strAttr("order") == "acq_rel";
  if (acqRel && l) fail(op, "order = \"acq_rel\" takes a scalar address (the program's one ticket)");
  if (acqRel) barrier();
  llvm::Type* ty = llvmType(t);
  Regs old(n);
  for (size_t r = 0; r < n; ++r) {
    llvm::Value* pred = owner;
    if (mask) pred = pred ? b.CreateAnd(pred, (*mask)[r]) : (*mask)[r];
    auto add = [&]() -> llvm::Value* {
      if (acqRel) {
        // By hand: LLVM's NVPTX backend prints an acq_rel atomicrmw as a plain (relaxed) atom.
        const char* type = t == DType::F32 ? "f32" : t == DType::I32 ? "u32" : "u64";
        const char* reg = t == DType::F32 ? "f" : t == DType::I32 ? "r" : "l";
        return asmValue(ty, std::string("atom.acq_rel.gpu.global.add.") + type + " $0, [$1], $2;",
                        std::string("=") + reg + ",l," + reg + ",~{memory}", {ptrs[r], vals[r]});
      }
      return b.CreateAtomicRMW(rmw, ptrs[r], vals[r], llvm::MaybeAlign(ir::byteWidth(t)),
                               llvm::AtomicOrdering::Monotonic, device);
    };
    if (!pred) {
      old[r] = add();
      continue;
    }
    llvm::BasicBlock* before = b.GetInsertBlock();
    auto* then = llvm::BasicBlock::Create(ctx, "atomic", kernel);
    auto* done = llvm::BasicBlock::Create(ctx, "atomic.done", kernel);
    b.CreateCondBr(pred, then, done);
    b.SetInsertPoint(then);
    llvm::Value* got = add();
    b.CreateBr(done);
    b.SetInsertPoint(done);
    auto* phi = b.CreatePHI(ty, 2, "old");
    phi->addIncoming(got, then);
    phi->addIncoming(llvm::Constant::getNullValue(ty), before);  // masked off, or not the adder
    old[r] = phi;
  }

  if (atomicOldValuesShared(op)) {
    const int64_t bytes = res->type().numElements() * ir::byteWidth(t);
    const int64_t offset = scratchOffset(op, bytes);
    barrier();  // an earlier op (or this one, one iteration back) may still read the scratch
    if (l) {
      storeTileToShared(old, *l, t, offset);  // by the owners only
      barrier();
      old = loadTileFromShared(*l, t, offset);
    } else {
      onlyWhere(owner, "atomic.smem", [&] { storeShared(sharedAddress(offset, i32(0), t), old[0], t); });
      barrier();
      old = {loadShared(sharedAddress(offset, i32(0), t), t)};
    }
  } else if (acqRel) {
    barrier();
  }
  set(res, std::move(old));
}

// griddepcontrol: each thread that runs it waits (every thread reads what the prior grids wrote),
// or signals that the next grid may launch (the grid's signal counts once every program has
// given it or exited). A target without it runs the kernel as an ordinary launch: nothing to do.
void Lowering::lowerGridDependency(const ir::Op& op) {
  if (!target.has(Feature::GridDependencyControl)) return;
  const bool wait = op.strAttr("kind") == "wait";
  auto* fnTy = llvm::FunctionType::get(b.getVoidTy(), false);
  b.CreateCall(fnTy, llvm::InlineAsm::get(fnTy, wait ? "griddepcontrol.wait;" : "griddepcontrol.launch_dependents;",
                                          "~{memory}", /*hasSideEffects=*/true));
}

void Lowering::lowerFence(const ir::Op& op) {
  if (op.numOperands() != 0 || op.numResults() != 0) fail(op, "fence takes no operands and gives no results");
  barrier();
  b.CreateFence(llvm::AtomicOrdering::AcquireRelease, ctx.getOrInsertSyncScopeID("device"));
  barrier();
}

// Tagged words (ir/Ops.def): one relaxed GPU-scope 64-bit access per element, by inline PTX with
// the element's predicate (LLVM would branch around each), so that value and tag land and are
// seen together; no fence anywhere. A pointer tile, its value or result and its mask share one
// layout; the tag is a scalar.
namespace {
// The layout of the pointer operand `ptr` of a tagged op, checked against `others` (null: a
// scalar pointer, whose companions must be scalars too).
const ir::Layout* taggedLayout(Lowering& lo, const ir::Op& op, const ir::Value* ptr,
                               std::initializer_list<const ir::Value*> others) {
  if (!ptr->type().isTile()) {
    for (const ir::Value* v : others)
      if (v && !v->type().isScalar()) lo.fail(op, "takes the tile " + v->type().str() + " through a scalar pointer");
    return nullptr;
  }
  const ir::Layout* l = &lo.layoutOf(ptr, op);
  for (const ir::Value* v : others)
    if (v && lo.layoutOf(v, op) != *l)
      lo.fail(op, "layout " + v->type().layout()->str() + " differs from its pointer's layout " + l->str() +
                      " (a pointer, its value or result and its mask share one layout)");
  return l;
}
}  // namespace

void Lowering::lowerStoreTagged(const ir::Op& op) {
  if (op.numOperands() < 3 || op.numOperands() > 4) fail(op, "store_tagged takes (ptr, value, tag [, mask])");
  const ir::Value* maskV = op.numOperands() == 4 ? op.operand(3) : nullptr;
  const ir::Layout* l = taggedLayout(*this, op, op.operand(0), {op.operand(1), maskV});
  const size_t n = l ? size_t(l->numRegisters()) : 1;
  const Regs& ptrs = get(op.operand(0));
  const Regs& vals = get(op.operand(1));
  const Regs* mask = maskV ? &get(maskV) : nullptr;
  llvm::Value* tagHigh = b.CreateShl(b.CreateZExt(get(op.operand(2))[0], b.getInt64Ty()), 32);
  // One writer per element: replicated threads stay silent; a scalar is stored by thread 0.
  llvm::Value* owner = l ? ownerPredicate(*l) : threadsWithBitsClear(31u, uint32_t(func.numWarps() - 1));
  for (size_t r = 0; r < n; ++r) {
    llvm::Value* pred = owner;
    if (mask) pred = pred ? b.CreateAnd(pred, (*mask)[r]) : (*mask)[r];
    if (!pred) pred = b.getTrue();
    llvm::Value* word = b.CreateOr(tagHigh, b.CreateZExt(b.CreateBitCast(vals[r], b.getInt32Ty()), b.getInt64Ty()));
    asmStatement("@$2 st.relaxed.gpu.global.b64 [$0], $1;", "l,l,b,~{memory}", {ptrs[r], word, pred});
  }
}

void Lowering::lowerLoadTagged(const ir::Op& op) {
  const size_t tiles = op.numResults();
  if (tiles == 0 || (op.numOperands() != tiles + 1 && op.numOperands() != 2 * tiles + 1))
    fail(op, "load_tagged takes (ptr..., tag [, mask...]), one result per pointer");
  llvm::Value* tag = get(op.operand(tiles))[0];
  // Every thread that holds an element reads it (replicas too) and waits for its own elements, of
  // every tile of the op: all loads of a round in flight together, then one test, then the next
  // round only if a tag was missing, after a short sleep so that a waiting program does not flood
  // the L2. A wait that has not ended after 2^24 rounds (10 s and more) traps, so a writer that
  // never comes fails the launch instead of hanging it.
  constexpr uint32_t kMaxRounds = 1u << 24;
  llvm::BasicBlock* pre = b.GetInsertBlock();
  auto* round = llvm::BasicBlock::Create(ctx, "tagged.round", kernel);
  auto* retry = llvm::BasicBlock::Create(ctx, "tagged.retry", kernel);
  auto* done = llvm::BasicBlock::Create(ctx, "tagged.done", kernel);
  b.CreateBr(round);
  b.SetInsertPoint(round);
  llvm::PHINode* rounds = b.CreatePHI(b.getInt32Ty(), 2, "rounds");
  rounds->addIncoming(b.getInt32(0), pre);
  std::vector<Regs> words(tiles);
  std::vector<const Regs*> masks(tiles, nullptr);
  llvm::Value* arrived = b.getTrue();
  for (size_t t = 0; t < tiles; ++t) {
    const size_t maskAt = ir::loadTaggedMaskIndex(op, t);
    const ir::Value* maskV = maskAt ? op.operand(maskAt) : nullptr;
    const ir::Layout* l = taggedLayout(*this, op, op.operand(t), {op.result(t), maskV});
    const Regs& ptrs = get(op.operand(t));
    if (maskV) masks[t] = &get(maskV);
    words[t].resize(l ? size_t(l->numRegisters()) : 1);
    for (size_t r = 0; r < words[t].size(); ++r) {
      llvm::Value* pred = masks[t] ? (*masks[t])[r] : b.getTrue();
      words[t][r] = asmValue(b.getInt64Ty(), "@$2 ld.relaxed.gpu.global.b64 $0, [$1];", "=l,l,b,~{memory}",
                             {ptrs[r], pred});
      llvm::Value* tagged = b.CreateICmpEQ(b.CreateTrunc(b.CreateLShr(words[t][r], 32), b.getInt32Ty()), tag);
      arrived = b.CreateAnd(arrived, masks[t] ? b.CreateOr(b.CreateNot(pred), tagged) : tagged);
    }
  }
  b.CreateCondBr(arrived, done, retry);
  b.SetInsertPoint(retry);
  llvm::Value* next = b.CreateAdd(rounds, b.getInt32(1));
  asmStatement("nanosleep.u32 64;");
  onlyWhere(b.CreateICmpUGE(next, b.getInt32(kMaxRounds)), "tagged.trap", [&] { asmStatement("trap;"); });
  rounds->addIncoming(next, b.GetInsertBlock());
  b.CreateBr(round);
  b.SetInsertPoint(done);
  for (size_t t = 0; t < tiles; ++t) {
    Regs values(words[t].size());
    for (size_t r = 0; r < values.size(); ++r) {
      llvm::Value* v = b.CreateBitCast(b.CreateTrunc(words[t][r], b.getInt32Ty()), b.getFloatTy());
      values[r] = masks[t] ? b.CreateSelect((*masks[t])[r], v, llvm::ConstantFP::get(b.getFloatTy(), 0.0)) : v;
    }
    set(op.result(t), std::move(values));
  }
}

}  // namespace flextile::codegen
