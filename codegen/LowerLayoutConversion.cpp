// convert_layout, and the shared-memory helpers that reduce and dot use too.
//
// Scratch follows codegen/SharedMemory.h: row-major by tile coordinate,
// element c of a T[s] tile at byte base + flatIndex(s, c) * bytes(T) of the
// dynamic shared memory (i1 as one byte), and the barrier rule there: a
// bar.sync before an op's first write to its scratch (an earlier op, or the
// same op one loop iteration earlier, may still be reading those bytes) and
// one between its writes and its reads.
// A conversion that is only a renaming of registers (same lane and warp
// bases) stays in registers. A conversion of 16-bit elements to a layout
// ldmatrix can read (a dot operand: codegen/TensorCores.h ldmatrixPlan) goes
// through a swizzled shared tile: barrier, each owning thread stores its
// contiguous registers as vectors of up to 16 bytes, barrier, every warp
// issues ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (the NVVM
// intrinsic) per 8 registers of
// the destination (one A fragment, or two B fragments). Any other goes
// through a swizzled scratch tile chosen by measurement
// (codegen/ConversionPlan.h chooseConversionPlan): every order, chunk width
// vec (up to 16 bytes) and XOR swizzle (perPhase, maxPhase) is scored by the
// wavefronts that the source's stores and the destination's loads take on
// their real per-warp address patterns (ir::sharedBankConflicts), and the
// cheapest wins (ties: fewer instructions, then the smaller swizzle; the plain
// row-major tile is a candidate, so it never loses to it). Barrier, owning
// source threads store vectors of plan.storeVec, barrier, every thread loads
// vectors of plan.loadVec. The swizzle permutes the same slots, so the scratch
// size is the planner's. i1 and pointer tiles keep one element per access.
//
// Addresses use the linearity of both maps: a thread's part of the offset
// (from its lane and warp bits) is computed once per kernel, and each
// register or ldmatrix access XORs in a compile-time constant.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include "codegen/ConversionPlan.h"
#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

namespace {
const std::function<Layout::Coord(const Layout::Coord&)> kIdentity = [](const Layout::Coord& c) { return c; };

// Warp bits of `l` whose basis lies along `axis` alone: their partial results
// must be combined through shared memory when reducing along axis.
uint32_t warpBitsAlong(const Layout& l, int axis) {
  uint32_t m = 0;
  for (size_t i = 0; i < l.warpBases().size(); ++i) {
    const auto& basis = l.warpBases()[i];
    bool along = basis[size_t(axis)] != 0;
    for (size_t d = 0; d < basis.size(); ++d)
      if (int(d) != axis && basis[d] != 0) along = false;
    if (along) m |= 1u << i;
  }
  return m;
}
}  // namespace

uint32_t reduceWarpMask(const Layout& l, int axis) { return warpBitsAlong(l, axis); }

llvm::Value* Lowering::sharedAddress(int64_t offset, llvm::Value* elementIndex, DType t) {
  return sharedAddress(i32(offset), elementIndex, t);
}

llvm::Value* Lowering::sharedAddress(llvm::Value* offset, llvm::Value* elementIndex, DType t) {
  llvm::Value* byteOffset = b.CreateAdd(offset, b.CreateMul(elementIndex, i32(ir::byteWidth(t))));
  return b.CreateGEP(b.getInt8Ty(), sharedBase, byteOffset);
}

void Lowering::storeShared(llvm::Value* addr, llvm::Value* v, DType t) {
  if (t == DType::I1) v = b.CreateZExt(v, b.getInt8Ty());
  b.CreateAlignedStore(v, addr, llvm::Align(ir::byteWidth(t)));
}

llvm::Value* Lowering::loadShared(llvm::Value* addr, DType t) {
  llvm::Value* v = b.CreateAlignedLoad(memoryType(t), addr, llvm::Align(ir::byteWidth(t)));
  return t == DType::I1 ? b.CreateICmpNE(v, b.getInt8(0)) : v;
}

void Lowering::onlyWhere(llvm::Value* predicate, const char* name, const std::function<void()>& body) {
  if (!predicate) return body();
  auto* then = llvm::BasicBlock::Create(ctx, name, kernel);
  auto* done = llvm::BasicBlock::Create(ctx, std::string(name) + ".done", kernel);
  b.CreateCondBr(predicate, then, done);
  b.SetInsertPoint(then);
  body();
  b.CreateBr(done);
  b.SetInsertPoint(done);
}

void Lowering::barrier() {
  if (specialized && !producerRole) {
    b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_count,
                      llvm::ArrayRef<llvm::Value*>{i32(kConsumerBarrier), i32(32 * func.numWarps())});
    return;
  }
  programBarrier();
}

void Lowering::programBarrier() {
  // In a warp-specialized program the producer and the consumers meet at barrier 0 from two
  // different instructions (and the producer's issuing lane may arrive apart from its warp), which
  // `.aligned` forbids: compute-sanitizer's synccheck reported "divergent threads" there and
  // racecheck the races that followed. The unaligned form allows both.
  b.CreateIntrinsic(specialized ? llvm::Intrinsic::nvvm_barrier_cta_sync_all
                                : llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_all,
                    llvm::ArrayRef<llvm::Value*>{i32(0)});
}

void Lowering::storeTileToShared(const Regs& regs, const Layout& l, DType t, int64_t offset) {
  // Replicated threads hold the same values: only the owner writes, under
  // one branch for the whole tile.
  onlyWhere(ownerPredicate(l), "smem", [&] {
    for (int64_t r = 0; r < l.numRegisters(); ++r)
      storeShared(sharedAddress(offset, flatIndex(l.shape(), coordinate(l, r)), t), regs[size_t(r)], t);
  });
}

llvm::Value* Lowering::sharedThreadOffset(const Layout& l, const ir::SharedLayout& s) {
  llvm::IRBuilder<> eb(entry->getTerminator());
  llvm::Value* off = eb.getInt32(0);
  auto addBits = [&](llvm::Value* index, const Layout::Bases& bases) {
    for (size_t i = 0; i < bases.size(); ++i) {
      const int64_t o = s.offsetOf(bases[i]);
      if (o == 0) continue;
      llvm::Value* bit = eb.CreateAnd(eb.CreateLShr(index, uint64_t(i)), 1);
      off = eb.CreateXor(off, eb.CreateMul(bit, eb.getInt32(uint32_t(o))));
    }
  };
  addBits(lane, l.laneBases());
  addBits(warp, l.warpBases());
  return off;
}

namespace {
// Offsets of a layout's lane/warp bits in a linear plan, as an i32 in `eb`.
llvm::Value* linearThreadPart(llvm::IRBuilder<>& eb, llvm::Value* lane, llvm::Value* warp,
                              const std::vector<int64_t>& laneTerm, const std::vector<int64_t>& warpTerm) {
  llvm::Value* off = eb.getInt32(0);
  auto addBits = [&](llvm::Value* index, const std::vector<int64_t>& terms) {
    for (size_t i = 0; i < terms.size(); ++i) {
      if (terms[i] == 0) continue;
      llvm::Value* bit = eb.CreateAnd(eb.CreateLShr(index, uint64_t(i)), 1);
      off = eb.CreateXor(off, eb.CreateMul(bit, eb.getInt32(uint32_t(terms[i]))));
    }
  };
  addBits(lane, laneTerm);
  addBits(warp, warpTerm);
  return off;
}
}  // namespace

Regs Lowering::loadTileFromShared(const Layout& to, DType t, int64_t offset) {
  return mapRegs(size_t(to.numRegisters()), [&](size_t r) {
    return loadShared(sharedAddress(offset, flatIndex(to.shape(), coordinate(to, int64_t(r))), t), t);
  });
}

void Lowering::lowerConvertLayout(const ir::Op& op) {
  const ir::Value* x = op.operand(0);
  const ir::Value* res = op.result();
  if (!x->type().isTile() || !res->type().sameShapeAndElement(x->type()))
    fail(op, "converts " + x->type().str() + " to " + res->type().str() + "; it needs one tile type on both sides");
  const Layout& from = layoutOf(x, op);
  const Layout& to = layoutOf(res, op);
  const Regs& xs = get(x);
  std::vector<int64_t> map = registerRenaming(from, to, kIdentity);
  if (!map.empty()) {
    set(res, mapRegs(map.size(), [&](size_t r) { return xs[size_t(map[r])]; }));
    return;
  }
  const DType t = x->type().dtype();
  int64_t offset = scratchOffset(op, scratchBytes(op));
  if (auto plan = ldmatrixPlan(from, to, t)) {
    set(res, convertThroughLdmatrix(xs, from, to, *plan, t, offset));
    return;
  }
  // A measured swizzle and vector width (ConversionPlan.h); i1 and pointer
  // tiles keep one element per access (i1 is stored widened to a byte).
  const bool vectorize = t != DType::I1 && t != DType::Ptr;
  const ConversionPlan plan = chooseConversionPlan(from, to, ir::byteWidth(t), vectorize);
  barrier();
  storeTileToSharedLayout(xs, from, plan.smem, plan.storeVec, t, offset);
  barrier();
  set(res, loadTileFromSharedLayout(to, plan.smem, plan.loadVec, t, i32(offset)));
}

void Lowering::storeTileToSharedLayout(const Regs& regs, const Layout& l, const ir::SharedLayout& s, int64_t vec,
                                       DType t, int64_t offset) {
  onlyWhere(ownerPredicate(l), "smem", [&] {
    llvm::Value* threadOff = sharedThreadOffset(l, s);
    auto* vecTy = llvm::FixedVectorType::get(memoryType(t), unsigned(vec));
    for (int64_t r0 = 0; r0 < l.numRegisters(); r0 += vec) {
      llvm::Value* elem = b.CreateXor(threadOff, i32(s.offsetOf(l.regCoord(r0))));
      llvm::Value* addr = sharedAddress(offset, elem, t);
      if (vec == 1) {
        storeShared(addr, regs[size_t(r0)], t);
        continue;
      }
      llvm::Value* packed = llvm::PoisonValue::get(vecTy);
      for (int64_t i = 0; i < vec; ++i) packed = b.CreateInsertElement(packed, regs[size_t(r0 + i)], uint64_t(i));
      b.CreateAlignedStore(packed, addr, llvm::Align(uint64_t(vec * ir::byteWidth(t))));
    }
  });
}

Regs Lowering::loadTileFromSharedLayout(const Layout& to, const ir::SharedLayout& s, int64_t vec, DType t,
                                        llvm::Value* offset) {
  llvm::Value* threadOff = sharedThreadOffset(to, s);
  auto* vecTy = llvm::FixedVectorType::get(memoryType(t), unsigned(vec));
  Regs out(size_t(to.numRegisters()), nullptr);
  for (int64_t r0 = 0; r0 < to.numRegisters(); r0 += vec) {
    llvm::Value* elem = b.CreateXor(threadOff, i32(s.offsetOf(to.regCoord(r0))));
    llvm::Value* addr = sharedAddress(offset, elem, t);
    if (vec == 1) {
      out[size_t(r0)] = loadShared(addr, t);
      continue;
    }
    llvm::Value* packed = b.CreateAlignedLoad(vecTy, addr, llvm::Align(uint64_t(vec * ir::byteWidth(t))));
    for (int64_t i = 0; i < vec; ++i) out[size_t(r0 + i)] = b.CreateExtractElement(packed, uint64_t(i));
  }
  return out;
}

}  // namespace flextile::codegen

namespace flextile::codegen {

void Lowering::storeToSwizzledTile(const Regs& xs, const Layout& from, const ir::SharedLayout& smem, DType t,
                                   llvm::Value* byteBase) {
  llvm::Type* elemTy = llvmType(t);
  const int64_t eb = ir::byteWidth(t);
  // Groups of v registers consecutive along the shared rows are one vector
  // store of v elements (a 16-byte chunk holds vec elements and the swizzle
  // permutes whole chunks, so a group never straddles two).
  const int fast = smem.order()[0];
  int64_t v = std::min<int64_t>(from.contiguousRegisters(fast), smem.vec());
  // A vector store needs its first element v-aligned in every thread: no
  // lane or warp basis may move the low bits of the offset.
  for (const Layout::Bases* bases : {&from.laneBases(), &from.warpBases()})
    for (const auto& basis : *bases)
      while (v > 1 && smem.offsetOf(basis) % v != 0) v /= 2;
  onlyWhere(ownerPredicate(from), "ldm", [&] {
    llvm::Value* threadOff = sharedThreadOffset(from, smem);
    auto* vecTy = llvm::FixedVectorType::get(elemTy, unsigned(v));
    for (int64_t r0 = 0; r0 < from.numRegisters(); r0 += v) {
      llvm::Value* elem = b.CreateXor(threadOff, i32(smem.offsetOf(from.regCoord(r0))));
      llvm::Value* addr = b.CreateGEP(b.getInt8Ty(), sharedBase, b.CreateAdd(byteBase, b.CreateMul(elem, i32(eb))));
      llvm::Value* packed = llvm::PoisonValue::get(vecTy);
      for (int64_t i = 0; i < v; ++i) packed = b.CreateInsertElement(packed, xs[size_t(r0 + i)], uint64_t(i));
      b.CreateAlignedStore(v == 1 ? xs[size_t(r0)] : packed, addr, llvm::Align(uint64_t(eb * v)));
    }
  });
}

Regs Lowering::convertThroughLdmatrix(const Regs& xs, const Layout& from, const Layout& to, const LdmatrixPlan& plan,
                                      DType t, int64_t offset) {
  barrier();  // an earlier user of these bytes may still be reading them
  // 1. Store (storeToSwizzledTile).
  storeToSwizzledTile(xs, from, plan.smem, t, i32(offset));
  barrier();
  return ldmatrixFromShared(to, plan, t, i32(offset));
}

Regs Lowering::ldmatrixFromShared(const Layout& to, const LdmatrixPlan& plan, DType t, llvm::Value* byteBase) {
  llvm::Type* elemTy = llvmType(t);
  // 2. ldmatrix: lane l supplies the address of row l % 8 of matrix l / 8.
  llvm::Value* laneOff;
  {
    llvm::IRBuilder<> eb(entry->getTerminator());
    laneOff = linearThreadPart(eb, lane, warp, plan.laneTerm, plan.warpTerm);
  }
  // The NVVM intrinsics, not inline asm: they take the shared pointer, so
  // LLVM knows what they read and never merges two loads of the same
  // addresses across the stores between them (with inline asm it did: a
  // second staging of an equal-shaped tile reused the first one's registers).
  const int n = plan.numMatrices;
  static const llvm::Intrinsic::ID ids[2][3] = {
      {llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x1_b16, llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x2_b16,
       llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_b16},
      {llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x1_trans_b16,
       llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x2_trans_b16,
       llvm::Intrinsic::nvvm_ldmatrix_sync_aligned_m8n8_x4_trans_b16}};
  const llvm::Intrinsic::ID id = ids[plan.trans][n == 1 ? 0 : n == 2 ? 1 : 2];
  auto* pairTy = llvm::FixedVectorType::get(elemTy, 2);
  Regs out(size_t(to.numRegisters()), nullptr);
  for (size_t q = 0; q < plan.accessBase.size(); ++q) {
    llvm::Value* elem = b.CreateXor(laneOff, i32(plan.accessBase[q]));
    llvm::Value* addr = b.CreateGEP(b.getInt8Ty(), sharedBase, b.CreateAdd(byteBase, b.CreateShl(elem, 1)));
    std::vector<llvm::Type*> overload;
    if (llvm::Intrinsic::isOverloaded(id)) overload.push_back(addr->getType());  // the pointer type, in newer LLVMs
    llvm::Value* call = b.CreateIntrinsic(id, overload, {addr});
    for (int j = 0; j < n; ++j) {
      llvm::Value* word = n == 1 ? call : b.CreateExtractValue(call, unsigned(j));
      llvm::Value* pair = b.CreateBitCast(word, pairTy);
      out[size_t(plan.registers[q][size_t(2 * j)])] = b.CreateExtractElement(pair, uint64_t(0));
      out[size_t(plan.registers[q][size_t(2 * j + 1)])] = b.CreateExtractElement(pair, uint64_t(1));
    }
  }
  for (size_t r = 0; r < out.size(); ++r)
    if (!out[r]) throw Error("ldmatrix plan leaves register " + std::to_string(r) + " of " + to.str() + " unset");
  return out;
}

}  // namespace flextile::codegen
