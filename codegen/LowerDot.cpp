// dot(a[M,K], b[K,N], acc[M,N]) -> f32[M,N], two lowerings.
//
// Tensor cores (isMmaDot: the result is an mma accumulator layout and a, b
// are its dot-operand layouts, codegen/TensorCores.h): one
//   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
// (or m16n8k8 .tf32 for f32 inputs, rounded with cvt.rna.tf32.f32) per
// (M, N, K) repetition, entirely in registers: the operands were staged by
// the convert_layout that produced them (ldmatrix), and the accumulator
// registers flow from one mma to the next (and around a for loop as phis).
// Which registers an instruction reads is found from the layouts'
// coordinates (Layout::registerOf), not assumed: for repetition (m0, n0, k0)
// the accumulator's c_i is the register at (m0 ^ 8*(i>>1), n0 ^ (i&1)), A's a_i
// at (m0 ^ 8*((i>>1)&1), k0 ^ (i&1) ^ 8*(i>>2)), B's b_i at (k0 ^ (i&1) ^ 8*(i>>1),
// n0); the lane parts (groupID, threadID_in_group) are in the lane bases. Two
// 16-bit registers are packed into each 32-bit operand, low half first.
// K repetitions are the outer loop so that consecutive mmas are independent.
//
// Hopper (wgmmaPlan, TensorCores.h): one inline-asm block per dot that
// fences, issues one wgmma.mma_async m64nNk16 per 16 of K (A words from
// registers as for mma.sync, B as a matrix descriptor of the pipelined ring
// slot advanced by the k-step's byte offset) and commits the group. The wait
// is an op of its own, `wgmma_wait {pending = N}` placed by the "wgmma" pass
// (codegen/passes/Wgmma.cpp) before the first op that reads the accumulator,
// or that needs shared-memory scratch or is control flow: `wgmma.wait_group
// N`, N the groups that may stay in flight (groups complete in commit order),
// so products that do not depend on each other, and the element-wise work
// between them, overlap. A wgmma dot without `async = 1` is waited at once. A loop-invariant A kept in shared memory (wgmmaResidentA) is a
// second descriptor instead of the A words: its convert wrote the resident
// tile once before the loop; the descriptor of k-step 0 goes in and the
// others are formed inside the block. The accumulators go in and out of the
// issue as tied "+f" operands in the fragment order d[4i + j] = (8*(j>>1),
// 8i + (j&1)) of n-block i, and through the wait the same way: every read of
// them depends on the wait's outputs, so nothing the compiler schedules
// touches a register still in flight (ptxas would serialize the wgmmas and
// say so; the backward's PTX assembles without that warning).
//
// FMA (everything else): a and b are staged row-major through shared memory
// (codegen/SharedMemory.h: a at the scratch base, b at dotScratchBOffset),
// then each thread updates its own accumulator registers with one f32 FMA
// per k, in increasing k (f16/bf16 inputs are extended to f32 exactly). The
// k loop is an LLVM loop; per iteration a thread loads a[m, k] once per
// distinct row m of its registers and b[k, n] once per distinct column n.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/InlineAsm.h>

#include <map>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"
#include "codegen/TensorCores.h"

namespace flextile::codegen {

using ir::DType;
using ir::Layout;

void Lowering::lowerDot(const ir::Op& op) {
  const ir::Value* a = op.operand(0);
  const ir::Value* bv = op.operand(1);
  const ir::Value* acc = op.operand(2);
  const ir::Value* res = op.result();
  const ir::Type &at = a->type(), &bt = bv->type(), &ct = acc->type();
  if (at.rank() != 2 || bt.rank() != 2 || ct.rank() != 2 || at.shape()[1] != bt.shape()[0] ||
      ct.shape()[0] != at.shape()[0] || ct.shape()[1] != bt.shape()[1])
    fail(op, "shapes " + at.str() + " @ " + bt.str() + " + " + ct.str() + " do not form a matrix product");
  auto supported = [](DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32; };
  if (!supported(at.dtype()) || at.dtype() != bt.dtype())
    fail(op, "operands " + at.str() + " and " + bt.str() + " must both be f16, bf16 or f32");
  if (ct.dtype() != DType::F32 || res->type().dtype() != DType::F32) fail(op, "the accumulator must be f32");
  const Layout& la = layoutOf(a, op);
  const Layout& lb = layoutOf(bv, op);
  const Layout& lc = layoutOf(res, op);
  if (layoutOf(acc, op) != lc) fail(op, "the accumulator and the result have different layouts");
  if (auto w = wgmmaPlan(op, target)) return lowerWgmmaDot(op, *w);
  if (isMmaDot(op)) return lowerMmaDot(op);

  const int64_t K = at.shape()[1], N = bt.shape()[1];
  const DType t = at.dtype();
  const int64_t offset = scratchOffset(op, scratchBytes(op));
  const int64_t offsetB = offset + dotScratchBOffset(op);
  barrier();  // an earlier user of these bytes may still be reading them
  storeTileToShared(get(a), la, t, offset);
  storeTileToShared(get(bv), lb, t, offsetB);
  barrier();

  // Distinct rows and columns among this thread's accumulator registers:
  // their register parts are compile-time constants.
  const auto& threadMN = threadCoordinate(lc);
  std::map<int64_t, llvm::Value*> rowBase, col;  // register part -> a's row offset (m*K) / column n
  std::vector<std::pair<int64_t, int64_t>> regMN;
  for (int64_t r = 0; r < lc.numRegisters(); ++r) {
    Layout::Coord c = lc.regCoord(r);
    regMN.emplace_back(c[0], c[1]);
    if (!rowBase.count(c[0])) rowBase[c[0]] = b.CreateMul(b.CreateXor(threadMN[0], i32(c[0])), i32(K));
    if (!col.count(c[1])) col[c[1]] = b.CreateXor(threadMN[1], i32(c[1]));
  }

  const Regs& init = get(acc);
  llvm::BasicBlock* pre = b.GetInsertBlock();
  auto* loop = llvm::BasicBlock::Create(ctx, "dot.k", kernel);
  auto* done = llvm::BasicBlock::Create(ctx, "dot.done", kernel);
  b.CreateBr(loop);
  b.SetInsertPoint(loop);
  llvm::PHINode* k = b.CreatePHI(b.getInt32Ty(), 2, "k");
  k->addIncoming(i32(0), pre);
  std::vector<llvm::PHINode*> phis;
  for (llvm::Value* v : init) {
    phis.push_back(b.CreatePHI(b.getFloatTy(), 2));
    phis.back()->addIncoming(v, pre);
  }
  std::map<int64_t, llvm::Value*> aVal, bVal;
  for (auto& [m, base] : rowBase)
    aVal[m] = toCompute(loadShared(sharedAddress(offset, b.CreateAdd(base, k), t), t), t);
  llvm::Value* kRow = b.CreateMul(k, i32(N));
  for (auto& [n, c] : col) bVal[n] = toCompute(loadShared(sharedAddress(offsetB, b.CreateAdd(kRow, c), t), t), t);
  Regs next(phis.size());
  for (size_t r = 0; r < phis.size(); ++r)
    next[r] = b.CreateIntrinsic(llvm::Intrinsic::fma, {b.getFloatTy()},
                                {aVal[regMN[r].first], bVal[regMN[r].second], phis[r]});
  llvm::Value* kNext = b.CreateAdd(k, i32(1), "k.next", /*HasNUW=*/true, /*HasNSW=*/true);
  k->addIncoming(kNext, loop);
  for (size_t r = 0; r < phis.size(); ++r) phis[r]->addIncoming(next[r], loop);
  b.CreateCondBr(b.CreateICmpSLT(kNext, i32(K)), loop, done);
  b.SetInsertPoint(done);
  set(res, std::move(next));
}

void Lowering::lowerMmaDot(const ir::Op& op) {
  const ir::Value* a = op.operand(0);
  const ir::Value* bv = op.operand(1);
  const Layout& la = layoutOf(a, op);
  const Layout& lb = layoutOf(bv, op);
  const Layout& lc = layoutOf(op.result(), op);
  const DType t = a->type().dtype();
  const bool tf32 = t == DType::F32;
  const std::optional<MmaShape> shape = target.description().mmaSyncShape(tf32 ? 32 : 16);
  if (!shape) fail(op, "the target " + target.smName() + " has no mma.sync for " + std::string(ir::dtypeName(t)) + " operands");
  const int64_t K = a->type().shape()[1], instrK = shape->k;

  // Repetition origins (register parts of coordinates): every XOR combination
  // of the accumulator's register bases beyond c0..c3, split by dimension.
  std::vector<int64_t> mOrigins{0}, nOrigins{0}, kOrigins;
  for (size_t i = 2; i < lc.regBases().size(); ++i) {
    const auto& basis = lc.regBases()[i];
    auto& origins = basis[0] != 0 ? mOrigins : nOrigins;
    const int64_t step = basis[0] != 0 ? basis[0] : basis[1];
    for (size_t j = 0, n = origins.size(); j < n; ++j) origins.push_back(origins[j] ^ step);
  }
  for (int64_t k0 = 0; k0 < K; k0 += instrK) kOrigins.push_back(k0);
  auto reg = [&](const Layout& l, int64_t row, int64_t col, const char* what) {
    int64_t r = l.registerOf({row, col});
    if (r < 0)
      fail(op, std::string("the ") + what + " layout " + l.str() + " has no register at (" + std::to_string(row) +
                   ", " + std::to_string(col) + ") of the mma fragment");
    return size_t(r);
  };

  const Regs& as = get(a);
  const Regs& bs = get(bv);
  Regs acc = get(op.operand(2));
  llvm::Type* elemTy = llvmType(t);
  auto* pairTy = llvm::FixedVectorType::get(elemTy, 2);
  auto pack = [&](llvm::Value* lo, llvm::Value* hi) {
    llvm::Value* v = b.CreateInsertElement(llvm::PoisonValue::get(pairTy), lo, uint64_t(0));
    return b.CreateBitCast(b.CreateInsertElement(v, hi, uint64_t(1)), b.getInt32Ty());
  };
  auto toTf32 = [&](llvm::Value* x) {
    return b.CreateIntrinsic(llvm::Intrinsic::nvvm_f2tf32_rna, llvm::ArrayRef<llvm::Value*>{x});
  };
  // A and B fragments as 32-bit words, per (m0, k0) and (k0, n0).
  auto aWords = [&](int64_t m0, int64_t k0) {
    std::vector<llvm::Value*> w;
    if (tf32) {
      for (int i = 0; i < 4; ++i) w.push_back(toTf32(as[reg(la, m0 ^ 8 * (i & 1), k0 ^ 4 * (i >> 1), "A")]));
    } else {
      auto at = [&](int i) { return as[reg(la, m0 ^ 8 * ((i >> 1) & 1), k0 ^ (i & 1) ^ 8 * (i >> 2), "A")]; };
      for (int i = 0; i < 8; i += 2) w.push_back(pack(at(i), at(i + 1)));
    }
    return w;
  };
  auto bWords = [&](int64_t k0, int64_t n0) {
    std::vector<llvm::Value*> w;
    if (tf32) {
      for (int i = 0; i < 2; ++i) w.push_back(toTf32(bs[reg(lb, k0 ^ 4 * i, n0, "B")]));
    } else {
      auto at = [&](int i) { return bs[reg(lb, k0 ^ (i & 1) ^ 8 * (i >> 1), n0, "B")]; };
      for (int i = 0; i < 4; i += 2) w.push_back(pack(at(i), at(i + 1)));
    }
    return w;
  };

  const std::string types = tf32 ? "m16n8k8.row.col.f32.tf32.tf32.f32"
                                 : std::string("m16n8k16.row.col.f32.") + (t == DType::BF16 ? "bf16.bf16" : "f16.f16") +
                                       ".f32";
  const std::string text = "mma.sync.aligned." + types +
                           " {$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};";
  llvm::Type* f32 = b.getFloatTy();
  llvm::Type* i32t = b.getInt32Ty();
  auto* retTy = llvm::StructType::get(ctx, {f32, f32, f32, f32});
  auto* asmTy = llvm::FunctionType::get(retTy, {i32t, i32t, i32t, i32t, i32t, i32t, f32, f32, f32, f32}, false);
  auto* mma = llvm::InlineAsm::get(asmTy, text, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", /*hasSideEffects=*/false);

  std::map<std::pair<int64_t, int64_t>, std::vector<llvm::Value*>> bCache;
  for (int64_t k0 : kOrigins) {
    bCache.clear();
    for (int64_t n0 : nOrigins) bCache[{k0, n0}] = bWords(k0, n0);
    for (int64_t m0 : mOrigins) {
      std::vector<llvm::Value*> aw = aWords(m0, k0);
      for (int64_t n0 : nOrigins) {
        size_t c[4];
        for (int i = 0; i < 4; ++i) c[i] = reg(lc, m0 ^ 8 * (i >> 1), n0 ^ (i & 1), "accumulator");
        const auto& bw = bCache[{k0, n0}];
        auto* call = b.CreateCall(asmTy, mma, {aw[0], aw[1], aw[2], aw[3], bw[0], bw[1], acc[c[0]], acc[c[1]],
                                                acc[c[2]], acc[c[3]]});
        call->addFnAttr(llvm::Attribute::NoUnwind);
        call->setDoesNotAccessMemory();
        for (int i = 0; i < 4; ++i) acc[c[i]] = b.CreateExtractValue(call, unsigned(i));
      }
    }
  }
  set(op.result(), std::move(acc));
}

void Lowering::lowerWgmmaDot(const ir::Op& op, const WgmmaPlan& w) {
  const ir::Value* a = op.operand(0);
  const Layout& la = layoutOf(a, op);
  const Layout& lc = layoutOf(op.result(), op);
  const DType t = a->type().dtype();
  if (w.load->kind() != ir::OpKind::LocalLoad || !localLoadsReadByWgmma_.count(w.load))
    fail(op, "is planned for wgmma but its B tile is not a slot of a shared buffer");
  // A resident in shared memory (TensorCores.h wgmmaResidentA): a slot of a buffer that the
  // "wgmma" pass wrote before the loop, read here through a descriptor.
  // Or, through a trans, the same buffer read M-major (wgmmaResidentAView).
  const std::optional<WgmmaResidentAView> aView = wgmmaResidentAView(a);
  const ir::Op* aLoad = aView ? aView->load : a->definingOp();
  std::optional<WgmmaTile> residentA;
  if (aLoad && localLoadsReadByWgmma_.count(aLoad)) {
    if (!aView) fail(op, "reads its A operand from a shared buffer wgmma cannot read as A");
    residentA = aView->tile;
  }
  auto reg = [&](const Layout& l, int64_t row, int64_t col, const char* what) {
    int64_t r = l.registerOf({row, col});
    if (r < 0)
      fail(op, std::string("the ") + what + " layout " + l.str() + " has no register at (" + std::to_string(row) +
                   ", " + std::to_string(col) + ") of the wgmma fragment");
    return size_t(r);
  };
  Regs acc = get(op.operand(2));
  const int64_t numD = w.N / 2, steps = w.K / 16;
  std::vector<size_t> dReg(static_cast<size_t>(numD));
  for (int64_t j = 0; j < numD; ++j) dReg[size_t(j)] = reg(lc, 8 * ((j % 4) >> 1), 8 * (j / 4) + (j & 1), "accumulator");

  llvm::Type* elemTy = llvmType(t);
  auto* pairTy = llvm::FixedVectorType::get(elemTy, 2);
  auto pack = [&](llvm::Value* lo, llvm::Value* hi) {
    llvm::Value* v = b.CreateInsertElement(llvm::PoisonValue::get(pairTy), lo, uint64_t(0));
    return b.CreateBitCast(b.CreateInsertElement(v, hi, uint64_t(1)), b.getInt32Ty());
  };
  // Descriptor of a tile at byte `base` (i32, shared window): start address
  // (>> 4) in bits 0-13, the leading and stride byte offsets (>> 4) in 16-29
  // and 32-45, the swizzle in 62-63.
  auto descriptor = [&](llvm::Value* base, const WgmmaTile& tile, int64_t s) {
    llvm::Value* addr = b.CreateAdd(base, i32(tile.kStepByteOffset(s)));
    llvm::Value* start = b.CreateZExt(b.CreateLShr(b.CreateAnd(addr, i32(0x3FFFF)), i32(4)), b.getInt64Ty());
    return b.CreateOr(start, b.getInt64(tile.descriptorFixedBits()));
  };
  llvm::Value* smemBase = b.CreatePtrToInt(sharedBase, b.getInt32Ty());
  // Warpgroup g's share (Layout::wgmmaAccumulator): the warp bits past the first two pick its m64
  // block of M — rows of a resident A (K-major; whole 8-row swizzle groups) or its columns
  // (M-major; whole 64-element panels) — and its N / groups columns of B, each a plain byte
  // offset into its tile, so the share's offset is the XOR of its bits' offsets; replicas read
  // what the first group reads.
  llvm::Value* bBase = b.CreateAdd(smemBase, slotByteOffset(*w.load));
  llvm::Value* aBase = residentA ? b.CreateAdd(smemBase, slotByteOffset(*aLoad)) : nullptr;
  const auto& warpBases = lc.warpBases();
  llvm::Value *aShare = i32(0), *bShare = i32(0);
  for (size_t bit = 2; bit < warpBases.size(); ++bit) {
    const bool alongM = warpBases[bit][0] != 0;
    if ((alongM && !residentA) || warpBases[bit] == Layout::Coord{0, 0}) continue;  // (a replica: no share)
    const int64_t bytes =
        alongM ? residentA->mnByteOffset(warpBases[bit][0]) : w.b.mnByteOffset(warpBases[bit][1]);
    llvm::Value* on = b.CreateAnd(b.CreateLShr(warp, i32(int64_t(bit))), i32(1));
    llvm::Value*& share = alongM ? aShare : bShare;
    share = b.CreateXor(share, b.CreateMul(on, i32(bytes)));
  }
  if (residentA) aBase = b.CreateAdd(aBase, aShare);
  bBase = b.CreateAdd(bBase, bShare);

  // A zero accumulator (S = Q K^T) is not read: the first k-step runs with
  // scale-d false.
  const ir::Op* accDef = op.operand(2)->definingOp();
  const bool zeroAcc = accDef && accDef->kind() == ir::OpKind::Constant && accDef->floatAttr("value") == 0.0;
  // Operands: numD accumulators out, the same tied in, then the A part (four
  // words per k-step from registers, or the descriptor of k-step 0), the B
  // descriptors, scale-d.
  const int64_t aCount = residentA ? 1 : 4 * steps;
  const bool bStepsAdded = wgmmaBStepsAdded();
  const int64_t aFirst = 2 * numD, bFirst = aFirst + aCount, scaleIndex = bFirst + (bStepsAdded ? 1 : steps);
  std::vector<llvm::Value*> operands;
  const std::string scaleOperand = "$" + std::to_string(scaleIndex);
  std::string constraints, text = "{\n.reg .pred p, z;\nsetp.ne.b32 p, " + scaleOperand + ", 0;\nsetp.eq.b32 z, " +
                                   scaleOperand + ", 0;\n";
  // A resident A tile's descriptor is loop-invariant: passed as LLVM values,
  // the descriptors of all k-steps were hoisted out of the loop and held two
  // registers each through it. One goes in; the others are that one plus the
  // k-step's offset (>> 4: the start-address field, which cannot carry, shared
  // addresses being below 2^18), computed here next to their wgmma.
  if (residentA) {
    text += ".reg .b64 ad<" + std::to_string(steps) + ">;\n";
    for (int64_t s = 0; s < steps; ++s)
      text += "add.s64 ad" + std::to_string(s) + ", $" + std::to_string(aFirst) + ", " +
              std::to_string((residentA->kStepByteOffset(s) - residentA->kStepByteOffset(0)) >> 4) + ";\n";
  }
  // B's descriptors the same way: the slot's k-step 0 goes in, the others are added here (one
  // add each, where LLVM computed five instructions a descriptor: 80 a loop step of the forward).
  text += ".reg .b64 bd<" + std::to_string(steps) + ">;\n";
  for (int64_t s = 0; s < steps; ++s)
    text += bStepsAdded ? "add.s64 bd" + std::to_string(s) + ", $" + std::to_string(bFirst) + ", " +
                              std::to_string((w.b.kStepByteOffset(s) - w.b.kStepByteOffset(0)) >> 4) + ";\n"
                        : "mov.b64 bd" + std::to_string(s) + ", $" + std::to_string(bFirst + s) + ";\n";
  text += "wgmma.fence.sync.aligned;\n";
  for (int64_t j = 0; j < numD; ++j) constraints += "=f,";
  for (int64_t j = 0; j < numD; ++j) {
    constraints += std::to_string(j) + ",";
    // Defined values even when scale-d makes them unread: with undefined tied
    // inputs the accumulator registers would not be live before the block,
    // and nothing in ptxas's contract for wgmma says that is safe.
    operands.push_back(acc[dReg[size_t(j)]]);
  }
  std::string dList = "{";
  for (int64_t j = 0; j < numD; ++j) dList += (j ? ", $" : "$") + std::to_string(j);
  dList += "}";
  const std::string kind = std::string("wgmma.mma_async.sync.aligned.m64n") + std::to_string(w.N) + "k16.f32." +
                           (t == DType::BF16 ? "bf16.bf16" : "f16.f16");
  auto ref = [](int64_t i) { return "$" + std::to_string(i); };
  for (int64_t s = 0; s < steps; ++s) {
    std::string aText;
    if (residentA) {
      if (s == 0) {
        operands.push_back(descriptor(aBase, *residentA, 0));
        constraints += "l,";
      }
      aText = "ad" + std::to_string(s);
    } else {
      const Regs& as = get(a);
      const int64_t k0 = 16 * s;
      auto at = [&](int i) { return as[reg(la, 8 * ((i >> 1) & 1), k0 ^ (i & 1) ^ 8 * (i >> 2), "A")]; };
      for (int i = 0; i < 8; i += 2) {
        operands.push_back(pack(at(i), at(i + 1)));
        constraints += "r,";
      }
      const int64_t first = aFirst + 4 * s;
      aText = "{" + ref(first) + ", " + ref(first + 1) + ", " + ref(first + 2) + ", " + ref(first + 3) + "}";
    }
    // Scale-d, imm-scale-a, imm-scale-b, [imm-trans-a (descriptor A only; M-major: 1),] imm-trans-b.
    text += kind + " " + dList + ", " + aText + ", bd" + std::to_string(s) + (zeroAcc && s == 0 ? ", z, 1, 1, " : ", p, 1, 1, ") +
            (residentA ? (residentA->mnMajor ? "1, " : "0, ") : "") + (w.b.mnMajor ? "1" : "0") + ";\n";
  }
  for (int64_t s = 0; s < (bStepsAdded ? 1 : steps); ++s) {
    operands.push_back(descriptor(bBase, w.b, s));
    constraints += "l,";
  }
  operands.push_back(i32(1));  // scale-d: accumulate
  constraints += "r,~{memory}";
  text += "wgmma.commit_group.sync.aligned;\n}";

  std::vector<llvm::Type*> outTys(static_cast<size_t>(numD), b.getFloatTy()), inTys;
  for (llvm::Value* v : operands) inTys.push_back(v->getType());
  auto* retTy = llvm::StructType::get(ctx, outTys);
  auto* asmTy = llvm::FunctionType::get(retTy, inTys, false);
  auto* call = b.CreateCall(asmTy, llvm::InlineAsm::get(asmTy, text, constraints, /*hasSideEffects=*/true), operands);
  call->addFnAttr(llvm::Attribute::NoUnwind);
  for (int64_t j = 0; j < numD; ++j) acc[dReg[size_t(j)]] = b.CreateExtractValue(call, unsigned(j));
  set(op.result(), std::move(acc));
  // An async dot is waited for by a wgmma_wait the "wgmma" pass placed; any other at once.
  if (!op.hasAttr("async") || op.intAttr("async") == 0) set(op.result(), waitForWgmma(get(op.result()), 0));
}

Regs Lowering::waitForWgmma(const Regs& accumulators, int64_t pending) {
  if (!target.has(Feature::Wgmma)) throw Error("wgmma_wait needs wgmma, which " + target.smName() + " does not have");
  // The accumulators go through the wait as tied operands: every read of them depends on the
  // wait's outputs, so nothing the compiler schedules reads a register still being written.
  std::string constraints;
  for (size_t i = 0; i < accumulators.size(); ++i) constraints += "=f,";
  for (size_t i = 0; i < accumulators.size(); ++i) constraints += std::to_string(i) + ",";
  constraints += "~{memory}";
  std::vector<llvm::Type*> outTys(accumulators.size(), b.getFloatTy()), inTys(accumulators.size(), b.getFloatTy());
  auto* asmTy = llvm::FunctionType::get(llvm::StructType::get(ctx, outTys), inTys, false);
  const std::string text = "wgmma.wait_group.sync.aligned " + std::to_string(pending) + ";";
  auto* call = b.CreateCall(asmTy, llvm::InlineAsm::get(asmTy, text, constraints, /*hasSideEffects=*/true), accumulators);
  call->addFnAttr(llvm::Attribute::NoUnwind);
  Regs out;
  for (size_t i = 0; i < accumulators.size(); ++i) out.push_back(b.CreateExtractValue(call, unsigned(i)));
  return out;
}

void Lowering::lowerWgmmaWait(const ir::Op& op) {
  Regs all;
  for (const ir::Value* v : op.operands()) {
    if (!v->type().isTile() || v->type().dtype() != DType::F32)
      fail(op, "passes through wgmma accumulators (f32 tiles), got " + v->type().str());
    for (llvm::Value* r : get(v)) all.push_back(r);
  }
  Regs waited = waitForWgmma(all, op.intAttr("pending"));
  size_t next = 0;
  for (size_t i = 0; i < op.numResults(); ++i) {
    const size_t n = get(op.operand(i)).size();
    set(op.result(i), Regs(waited.begin() + long(next), waited.begin() + long(next + n)));
    next += n;
  }
}

}  // namespace flextile::codegen
