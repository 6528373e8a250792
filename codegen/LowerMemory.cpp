// Global loads and stores.
//
// Every access is one inline-PTX instruction over a group of v consecutive
// registers (v from the plan's vector width, limited by the layout's
// contiguous registers and 16 bytes), so a contiguous f32 row becomes
// `ld.global.v4.b32`. The group's address is its first register's pointer and
// its predicate its first register's mask: the plan only asks for v > 1 where
// the axis analysis proved the pointers consecutive, 16-byte aligned and the
// mask constant over the group.
//
//   load : the destination registers start out holding `other` (tied
//          operands), then `@p ld.global` overwrites them where p holds.
//   store: `@p st.global` with p = mask && this thread owns the element, so a
//          replicated element (Layout::replicatedLaneMask) is written once;
//          a scalar store is done by thread 0.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/InlineAsm.h>

#include "codegen/LowerToLLVMImpl.h"

namespace flextile::codegen {

using ir::DType;

namespace {

// The PTX view of a group of `bytes` bytes: `words` registers of type `ptxType`
// with inline-asm constraint `constraint`.
struct AccessShape {
  int words;
  const char* ptxType;
  const char* constraint;
  llvm::Type* wordTy;
};

AccessShape accessShape(int64_t bytes, llvm::IRBuilder<>& b) {
  if (bytes >= 4) return {int(bytes / 4), "b32", "r", b.getInt32Ty()};
  if (bytes == 2) return {1, "b16", "h", b.getInt16Ty()};
  return {1, "b8", "h", b.getInt16Ty()};  // ld/st.b8 use a 16-bit register
}

std::string operandList(int first, int count) {
  if (count == 1) return "$" + std::to_string(first);
  std::string s = "{";
  for (int i = 0; i < count; ++i) s += (i ? ", $" : "$") + std::to_string(first + i);
  return s + "}";
}

std::string vectorSuffix(int words) { return words == 1 ? "" : ".v" + std::to_string(words); }

}  // namespace

namespace {

// Vector width for an access of `op` on layout l (1 for scalars).
int64_t accessWidth(const LoweringPlan& plan, const ir::Op& op, const ir::Layout* l, DType elem) {
  if (!l) return 1;
  auto it = plan.vectorWidth.find(&op);
  int64_t want = it == plan.vectorWidth.end() ? 1 : it->second;
  if (want <= 1 || l->regBases().empty()) return 1;
  // The fastest dimension of the layout is that of its first register basis.
  const auto& first = l->regBases()[0];
  int dim = 0;
  for (size_t d = 0; d < first.size(); ++d)
    if (first[d] != 0) dim = int(d);
  int64_t v = std::min({want, l->contiguousRegisters(dim), int64_t(16 / ir::byteWidth(elem))});
  int64_t p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}

}  // namespace

void Lowering::lowerLoad(const ir::Op& op) {
  const ir::Value* res = op.result();
  const ir::Type& rt = res->type();
  // A tensor box (ir/Ops.def) only names the same elements again: the load reads through its pointers.
  const size_t own = ir::operandsBeforeBox(op);
  if (own < 1 || own > 3) fail(op, "load takes (ptr [, mask [, other]])");
  const ir::Layout* l = nullptr;
  if (rt.isTile()) {
    l = &layoutOf(res, op);
    for (size_t i = 0; i < own; ++i)
      if (const ir::Value* v = op.operand(i); layoutOf(v, op) != *l)
        fail(op, "operand layout " + v->type().layout()->str() + " differs from the result layout " + l->str() +
                     " (ptr, mask and other share one layout)");
  }
  const DType t = rt.dtype();
  const size_t n = l ? size_t(l->numRegisters()) : 1;
  const Regs& ptrs = get(op.operand(0));
  const Regs* mask = own >= 2 ? &get(op.operand(1)) : nullptr;
  const Regs* other = own >= 3 ? &get(op.operand(2)) : nullptr;

  const int64_t v = accessWidth(plan, op, l, t);
  llvm::Type* memTy = memoryType(t);
  const AccessShape shape = accessShape(v * ir::byteWidth(t), b);
  auto* vecTy = llvm::FixedVectorType::get(memTy, unsigned(v));
  // The group's bits as `words` integers (i8, i16 or i32 each).
  auto* packTy = llvm::FixedVectorType::get(b.getIntNTy(unsigned(v * ir::byteWidth(t) * 8 / shape.words)),
                                            unsigned(shape.words));

  Regs out(n);
  for (size_t r0 = 0; r0 < n; r0 += size_t(v)) {
    std::string text = std::string(mask ? "@$" + std::to_string(shape.words + 1) + " " : "") + "ld.global" +
                       vectorSuffix(shape.words) + "." + shape.ptxType + " " + operandList(0, shape.words) + ", [$" +
                       std::to_string(shape.words) + "];";
    std::string constraints;
    for (int w = 0; w < shape.words; ++w) constraints += std::string(w ? "," : "") + "=" + shape.constraint;
    constraints += ",l";
    std::vector<llvm::Value*> args{ptrs[r0]};
    std::vector<llvm::Type*> argTys{ptrs[r0]->getType()};
    if (mask) {
      constraints += ",b";
      args.push_back((*mask)[r0]);
      argTys.push_back(b.getInt1Ty());
      // The registers start out holding `other` (0 by default).
      llvm::Value* packed = llvm::PoisonValue::get(vecTy);
      for (int64_t i = 0; i < v; ++i) {
        llvm::Value* o = other ? (*other)[r0 + size_t(i)] : llvm::Constant::getNullValue(llvmType(t));
        if (t == DType::I1) o = b.CreateZExt(o, memTy);
        packed = b.CreateInsertElement(packed, o, uint64_t(i));
      }
      llvm::Value* words = b.CreateBitCast(packed, packTy);
      for (int w = 0; w < shape.words; ++w) {
        llvm::Value* word = b.CreateExtractElement(words, uint64_t(w));
        if (word->getType() != shape.wordTy) word = b.CreateZExt(word, shape.wordTy);  // a byte in a b16 register
        constraints += "," + std::to_string(w);
        args.push_back(word);
        argTys.push_back(shape.wordTy);
      }
    }
    std::vector<llvm::Type*> outTys(size_t(shape.words), shape.wordTy);
    llvm::Type* retTy = shape.words == 1 ? shape.wordTy : llvm::StructType::get(ctx, outTys);
    auto* asmTy = llvm::FunctionType::get(retTy, argTys, false);
    // The backend derives "may load" for inline asm from memory constraints
    // only, never from call attributes: without side effects, machine CSE
    // merges a load after a store with the load before it (lit test
    // codegen/memory_order.ftir). Side effects keep each load in program
    // order against the stores; memory(read) still tells IR-level passes that
    // it writes nothing.
    auto* call = b.CreateCall(asmTy, llvm::InlineAsm::get(asmTy, text, constraints, /*hasSideEffects=*/true), args);
    call->setOnlyReadsMemory();
    call->addFnAttr(llvm::Attribute::NoUnwind);

    llvm::Value* words = llvm::PoisonValue::get(packTy);
    for (int w = 0; w < shape.words; ++w) {
      llvm::Value* word = shape.words == 1 ? static_cast<llvm::Value*>(call) : b.CreateExtractValue(call, unsigned(w));
      if (word->getType() != packTy->getElementType()) word = b.CreateTrunc(word, packTy->getElementType());
      words = b.CreateInsertElement(words, word, uint64_t(w));
    }
    llvm::Value* elems = b.CreateBitCast(words, vecTy);
    for (int64_t i = 0; i < v; ++i) {
      llvm::Value* e = b.CreateExtractElement(elems, uint64_t(i));
      if (t == DType::I1) e = b.CreateICmpNE(e, llvm::ConstantInt::get(memTy, 0));
      out[r0 + size_t(i)] = e;
    }
  }
  set(res, std::move(out));
}

void Lowering::lowerStore(const ir::Op& op) {
  if (op.numOperands() < 2 || op.numOperands() > 3) fail(op, "store takes (ptr, value [, mask])");
  const ir::Value* ptrV = op.operand(0);
  const ir::Value* valV = op.operand(1);
  const ir::Type& pt = ptrV->type();
  const ir::Layout* l = nullptr;
  if (pt.isTile()) {
    l = &layoutOf(ptrV, op);
    for (const ir::Value* v : op.operands())
      if (layoutOf(v, op) != *l)
        fail(op, "operand layout " + v->type().layout()->str() + " differs from the pointer layout " + l->str() +
                     " (ptr, value and mask share one layout)");
  } else {
    for (const ir::Value* v : op.operands())
      if (!v->type().isScalar()) fail(op, "stores the tile " + v->type().str() + " through a scalar pointer");
  }
  const DType t = valV->type().dtype();
  if (pt.pointee() != t) fail(op, "stores " + valV->type().str() + " through " + pt.str());
  const size_t n = l ? size_t(l->numRegisters()) : 1;
  const Regs& ptrs = get(ptrV);
  const Regs& vals = get(valV);
  const Regs* mask = op.numOperands() == 3 ? &get(op.operand(2)) : nullptr;
  // One writer per element: replicated threads stay silent; a scalar is
  // stored by thread 0 alone.
  llvm::Value* owner = l ? ownerPredicate(*l) : nullptr;
  if (!l) {
    llvm::IRBuilder<> eb(entry->getTerminator());
    owner = eb.CreateICmpEQ(tid, eb.getInt32(0), "thread0");
  }

  const int64_t v = accessWidth(plan, op, l, t);
  llvm::Type* memTy = memoryType(t);
  const AccessShape shape = accessShape(v * ir::byteWidth(t), b);
  auto* vecTy = llvm::FixedVectorType::get(memTy, unsigned(v));
  auto* packTy = llvm::FixedVectorType::get(b.getIntNTy(unsigned(v * ir::byteWidth(t) * 8 / shape.words)),
                                            unsigned(shape.words));
  for (size_t r0 = 0; r0 < n; r0 += size_t(v)) {
    llvm::Value* pred = owner;
    if (mask) pred = pred ? b.CreateAnd(pred, (*mask)[r0]) : (*mask)[r0];
    llvm::Value* packed = llvm::PoisonValue::get(vecTy);
    for (int64_t i = 0; i < v; ++i) {
      llvm::Value* e = vals[r0 + size_t(i)];
      if (t == DType::I1) e = b.CreateZExt(e, memTy);
      packed = b.CreateInsertElement(packed, e, uint64_t(i));
    }
    llvm::Value* words = b.CreateBitCast(packed, packTy);
    std::string text = std::string(pred ? "@$" + std::to_string(shape.words + 1) + " " : "") + "st.global" +
                       vectorSuffix(shape.words) + "." + shape.ptxType + " [$0], " + operandList(1, shape.words) + ";";
    std::string constraints = "l";
    std::vector<llvm::Value*> args{ptrs[r0]};
    for (int w = 0; w < shape.words; ++w) {
      llvm::Value* word = b.CreateExtractElement(words, uint64_t(w));
      if (word->getType() != shape.wordTy) word = b.CreateZExt(word, shape.wordTy);
      constraints += std::string(",") + shape.constraint;
      args.push_back(word);
    }
    if (pred) {
      constraints += ",b";
      args.push_back(pred);
    }
    constraints += ",~{memory}";
    std::vector<llvm::Type*> argTys;
    for (auto* a : args) argTys.push_back(a->getType());
    auto* asmTy = llvm::FunctionType::get(b.getVoidTy(), argTys, false);
    auto* call = b.CreateCall(asmTy, llvm::InlineAsm::get(asmTy, text, constraints, /*hasSideEffects=*/true), args);
    call->addFnAttr(llvm::Attribute::NoUnwind);
  }
}

}  // namespace flextile::codegen
