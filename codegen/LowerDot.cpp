// dot(a[M,K], b[K,N], acc[M,N]) -> f32[M,N], the correct-first form (tensor
// cores come with the mma layouts): a and b are staged row-major through
// shared memory (codegen/SharedMemory.h: a at the scratch base, b at
// dotScratchBOffset), then each
// thread updates its own accumulator registers with one f32 FMA per k, in
// increasing k (f16/bf16 inputs are extended to f32 exactly). The k loop is
// an LLVM loop; per iteration a thread loads a[m, k] once per distinct row m
// of its registers and b[k, n] once per distinct column n.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include <map>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/SharedMemory.h"

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

  const int64_t M = at.shape()[0], K = at.shape()[1], N = bt.shape()[1];
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

}  // namespace flextile::codegen
