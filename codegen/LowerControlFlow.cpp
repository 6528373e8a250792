// for (lb, ub, step, init...) {region}: an LLVM loop
//
//   header: iv and one phi per register of each carried value;
//           iv < ub (signed) ? body : exit
//   body:   the region, whose arguments are (iv, carried...); the yield's
//           values feed the phis; iv += step
//
// Bounds are scalars, so every thread runs the same iterations (the shuffles
// and barriers inside stay convergent). The step must be positive. A carried
// value keeps its layout around the loop: init, region argument, yield
// operand and result must have one type (with layout).
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include "codegen/LowerToLLVMImpl.h"

#include <algorithm>

namespace flextile::codegen {

void Lowering::lowerFor(const ir::Op& op) {
  if (op.numOperands() < 3 || op.regions().size() != 1) fail(op, "for takes (lb, ub, step, init...) and one region");
  const ir::Block& body = op.region(0);
  const size_t numCarried = op.numOperands() - 3;
  const ir::Op* yield = body.terminator();
  if (!yield || yield->kind() != ir::OpKind::Yield || yield->numOperands() != numCarried ||
      body.args().size() != numCarried + 1 || op.numResults() != numCarried)
    fail(op, "the body must take (iv, carried...) and end in a yield of the " + std::to_string(numCarried) +
                 " carried values");
  for (size_t i = 0; i < 3; ++i)
    if (!op.operand(i)->type().isScalar() || !ir::isInteger(op.operand(i)->type().dtype()))
      fail(op, "loop bounds and step must be integer scalars, got " + op.operand(i)->type().str());
  for (size_t i = 0; i < numCarried; ++i) {
    const ir::Type& t = op.operand(3 + i)->type();
    if (t != body.arg(1 + i)->type() || t != yield->operand(i)->type() || t != op.result(i)->type())
      fail(op, "carried value " + std::to_string(i) + " changes its type or layout around the loop (" + t.str() +
                   (t.hasLayout() ? " " + t.layout()->str() : "") + ")");
  }

  // The producer's copy of a loop in a warp-specialized program keeps only the carried values its
  // copies need (producer_carried, codegen/passes/WarpSpecialize.cpp): slots, parities, counters.
  std::vector<bool> kept(numCarried, true);
  if (specialized && producerRole) {
    std::fill(kept.begin(), kept.end(), false);
    if (op.hasAttr("producer_carried"))
      for (int64_t i : op.intsAttr("producer_carried")) {
        if (i < 0 || size_t(i) >= numCarried) fail(op, "producer_carried names carried value " + std::to_string(i));
        kept[size_t(i)] = true;
      }
  }

  llvm::Value* lb = get(op.operand(0))[0];
  llvm::Type* ivTy = lb->getType();
  auto asIv = [&](llvm::Value* v) { return v->getType() == ivTy ? v : b.CreateSExtOrTrunc(v, ivTy); };
  llvm::Value* ub = asIv(get(op.operand(1))[0]);
  llvm::Value* step = asIv(get(op.operand(2))[0]);

  llvm::BasicBlock* pre = b.GetInsertBlock();
  auto* header = llvm::BasicBlock::Create(ctx, "for.header", kernel);
  auto* bodyBB = llvm::BasicBlock::Create(ctx, "for.body", kernel);
  auto* exit = llvm::BasicBlock::Create(ctx, "for.exit", kernel);
  b.CreateBr(header);
  b.SetInsertPoint(header);
  llvm::PHINode* iv = b.CreatePHI(ivTy, 2, "iv");
  iv->addIncoming(lb, pre);
  std::vector<std::vector<llvm::PHINode*>> phis(numCarried);
  for (size_t i = 0; i < numCarried; ++i) {
    if (!kept[i]) continue;
    Regs regs;
    for (llvm::Value* v : get(op.operand(3 + i))) {
      llvm::PHINode* phi = b.CreatePHI(v->getType(), 2);
      phi->addIncoming(v, pre);
      phis[i].push_back(phi);
      regs.push_back(phi);
    }
    set(body.arg(1 + i), regs);
    set(op.result(i), std::move(regs));
  }
  b.CreateCondBr(b.CreateICmpSLT(iv, ub), bodyBB, exit);

  b.SetInsertPoint(bodyBB);
  set(body.arg(0), {iv});
  lowerBlock(body);
  llvm::BasicBlock* latch = b.GetInsertBlock();
  for (size_t i = 0; i < numCarried; ++i) {
    if (!kept[i]) continue;
    const Regs& next = get(yield->operand(i));
    for (size_t r = 0; r < next.size(); ++r) phis[i][r]->addIncoming(next[r], latch);
  }
  iv->addIncoming(b.CreateAdd(iv, step, "iv.next"), latch);
  b.CreateBr(header);
  b.SetInsertPoint(exit);
}

}  // namespace flextile::codegen
