// Element-wise ops: one LLVM instruction sequence per register.
//
// Numerics (the interpreter computes the same way):
//   * f16/bf16 arithmetic extends to f32, computes, and rounds back to nearest even.
//   * add/sub/mul/div/sqrt of f32 and f64 are correctly rounded (LLVM's fdiv
//     and llvm.sqrt lower to div.rn / sqrt.rn: no fast-math flags are set).
//   * exp2 and log2 use ex2.approx / lg2.approx (about 2 ulp on f32);
//     exp(x) = ex2(x * log2(e)), log(x) = lg2(x) * ln(2); tanh uses
//     tanh.approx.f32 and rsqrt rsqrt.approx: the fast-path instructions
//     attention kernels want. These have no f64 form here (error).
//   * maximum/minimum propagate NaN and order -0 < +0 (llvm.maximum/minimum,
//     PTX max.NaN / min.NaN), as the interpreter does.
//   * Integer div/rem truncate toward zero (C). Where C has undefined
//     behaviour the result is defined but unspecified: x/0 and x%0 give x and 0
//     here (never LLVM poison), INT_MIN/-1 wraps. Shifts by the bit width or
//     more give 0 (shl) or the sign (shr), as PTX's clamped shifts do.
//   * cast float->int truncates toward zero and saturates (NaN -> 0); i1 is
//     unsigned (true -> 1); casts to i1 test x != 0.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>

#include <numbers>

#include "codegen/LowerToLLVMImpl.h"

namespace flextile::codegen {

using ir::DType;
using ir::OpKind;

namespace {

bool isHalfLike(DType t) { return t == DType::F16 || t == DType::BF16; }

}  // namespace

void Lowering::lowerElementwise(const ir::Op& op) {
  const ir::Value* res = op.result();
  const ir::Type& rt = res->type();
  size_t n = 1;
  if (rt.isTile()) {
    const ir::Layout& l = layoutOf(res, op);
    n = size_t(l.numRegisters());
    for (const ir::Value* v : op.operands()) {
      if (v->type().shape() != rt.shape())
        fail(op, "operand " + v->type().str() + " and result " + rt.str() + " differ in shape");
      if (layoutOf(v, op) != l)
        fail(op, "operand layout " + v->type().layout()->str() + " differs from the result layout " + l.str() +
                     " (element-wise operands share one layout)");
    }
  } else {
    for (const ir::Value* v : op.operands())
      if (!v->type().isScalar()) fail(op, "mixes the scalar result " + rt.str() + " with the tile " + v->type().str());
  }

  const DType t = op.operand(0)->type().dtype();  // operand element type (cmp, cast: differs from the result)
  const bool fp = ir::isFloat(t);
  auto operandRegs = [&](size_t i) -> const Regs& { return get(op.operand(i)); };

  auto floatOnlyF32 = [&](const char* what) {
    if (t == DType::F64) fail(op, std::string(what) + " of f64 is not supported (no approximate f64 instruction)");
  };
  auto needFloat = [&]() {
    if (!fp) fail(op, "needs a float operand, got " + op.operand(0)->type().str());
  };
  auto needInt = [&]() {
    if (!ir::isInteger(t)) fail(op, "needs an integer operand, got " + op.operand(0)->type().str());
  };

  // Applies f to the compute-type (f32 for f16/bf16) value of each register.
  auto unaryFloat = [&](auto f) {
    const Regs& x = operandRegs(0);
    set(res, mapRegs(n, [&](size_t r) { return fromCompute(f(toCompute(x[r], t)), t); }));
  };
  auto ex2 = [&](llvm::Value* v) { return b.CreateIntrinsic(llvm::Intrinsic::nvvm_ex2_approx, {v->getType()}, {v}); };
  auto lg2 = [&](llvm::Value* v) { return b.CreateIntrinsic(llvm::Intrinsic::nvvm_lg2_approx_f, llvm::ArrayRef<llvm::Value*>{v}); };
  llvm::Type* f32 = b.getFloatTy();

  switch (op.kind()) {
    case OpKind::Neg: {
      const Regs& x = operandRegs(0);
      set(res, mapRegs(n, [&](size_t r) { return fp ? b.CreateFNeg(x[r]) : b.CreateNeg(x[r]); }));
      return;
    }
    case OpKind::Not: {
      needInt();
      const Regs& x = operandRegs(0);
      set(res, mapRegs(n, [&](size_t r) { return b.CreateNot(x[r]); }));
      return;
    }
    case OpKind::Abs: {
      const Regs& x = operandRegs(0);
      set(res, mapRegs(n, [&](size_t r) -> llvm::Value* {
            if (fp) return b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x[r]);
            if (t == DType::I1) return x[r];
            return b.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x[r], b.getFalse());
          }));
      return;
    }
    case OpKind::Exp2:
      needFloat();
      floatOnlyF32("exp2");
      unaryFloat(ex2);
      return;
    case OpKind::Exp:
      needFloat();
      floatOnlyF32("exp");
      unaryFloat([&](llvm::Value* v) { return ex2(b.CreateFMul(v, llvm::ConstantFP::get(f32, std::numbers::log2e))); });
      return;
    case OpKind::Log2:
      needFloat();
      floatOnlyF32("log2");
      unaryFloat(lg2);
      return;
    case OpKind::Log:
      needFloat();
      floatOnlyF32("log");
      unaryFloat([&](llvm::Value* v) { return b.CreateFMul(lg2(v), llvm::ConstantFP::get(f32, std::numbers::ln2)); });
      return;
    case OpKind::Tanh: {
      needFloat();
      floatOnlyF32("tanh");
      auto* asmTy = llvm::FunctionType::get(f32, {f32}, false);
      auto* tanhAsm = llvm::InlineAsm::get(asmTy, "tanh.approx.f32 $0, $1;", "=f,f", /*hasSideEffects=*/false);
      unaryFloat([&](llvm::Value* v) { return b.CreateCall(asmTy, tanhAsm, {v}); });
      return;
    }
    case OpKind::Sqrt:
      needFloat();
      unaryFloat([&](llvm::Value* v) { return b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, v); });
      return;
    case OpKind::Rsqrt:
      needFloat();
      unaryFloat([&](llvm::Value* v) {
        return b.CreateIntrinsic(v->getType()->isDoubleTy() ? llvm::Intrinsic::nvvm_rsqrt_approx_d
                                                             : llvm::Intrinsic::nvvm_rsqrt_approx_f,
                                 llvm::ArrayRef<llvm::Value*>{v});
      });
      return;
    default: break;
  }

  if (op.kind() == OpKind::Cast) {
    const Regs& x = operandRegs(0);
    DType to = rt.dtype();
    llvm::Type* toTy = llvmType(to);
    if (t == DType::Ptr || to == DType::Ptr) fail(op, "casts of pointers are not supported");
    set(res, mapRegs(n, [&](size_t r) -> llvm::Value* {
          llvm::Value* v = x[r];
          if (t == to) return v;
          if (to == DType::I1)
            return fp ? b.CreateFCmpUNE(v, llvm::ConstantFP::get(v->getType(), 0.0))
                      : b.CreateICmpNE(v, llvm::ConstantInt::get(v->getType(), 0));
          if (fp && ir::isFloat(to)) {
            // f16 <-> bf16 goes through f32, which holds both exactly.
            if (isHalfLike(t) && isHalfLike(to)) return b.CreateFPTrunc(b.CreateFPExt(v, f32), toTy);
            return ir::bitWidth(to) > ir::bitWidth(t) ? b.CreateFPExt(v, toTy) : b.CreateFPTrunc(v, toTy);
          }
          if (fp) {  // float -> int: truncate toward zero, saturating
            if (isHalfLike(t)) v = b.CreateFPExt(v, f32);
            return b.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {toTy, v->getType()}, {v});
          }
          if (ir::isFloat(to)) return t == DType::I1 ? b.CreateUIToFP(v, toTy) : b.CreateSIToFP(v, toTy);
          // int -> int
          if (ir::bitWidth(to) < ir::bitWidth(t)) return b.CreateTrunc(v, toTy);
          return t == DType::I1 ? b.CreateZExt(v, toTy) : b.CreateSExt(v, toTy);
        }));
    return;
  }

  if (op.kind() == OpKind::AddPtr) {
    const Regs& p = operandRegs(0);
    const Regs& off = operandRegs(1);
    DType offT = op.operand(1)->type().dtype();
    if (t != DType::Ptr || (offT != DType::I32 && offT != DType::I64))
      fail(op, "addptr takes a pointer and an i32/i64 offset, got " + op.operand(0)->type().str() + " and " +
                   op.operand(1)->type().str());
    // Not inbounds: masked-off lanes may form addresses outside any object.
    llvm::Type* elem = memoryType(op.operand(0)->type().pointee());
    set(res, mapRegs(n, [&](size_t r) {
          llvm::Value* o = offT == DType::I32 ? b.CreateSExt(off[r], b.getInt64Ty()) : off[r];
          return b.CreateGEP(elem, p[r], o);
        }));
    return;
  }

  if (op.kind() == OpKind::Select) {
    const Regs& c = operandRegs(0);
    const Regs& x = operandRegs(1);
    const Regs& y = operandRegs(2);
    if (op.operand(0)->type().dtype() != DType::I1) fail(op, "the condition must be i1");
    set(res, mapRegs(n, [&](size_t r) { return b.CreateSelect(c[r], x[r], y[r]); }));
    return;
  }

  if (op.kind() == OpKind::Cmp) {
    const Regs& x = operandRegs(0);
    const Regs& y = operandRegs(1);
    const std::string& pred = op.strAttr("pred");
    using P = llvm::CmpInst::Predicate;
    P p;
    bool unsignedInts = t == DType::I1 || t == DType::Ptr;
    if (fp) {
      p = pred == "eq" ? P::FCMP_OEQ : pred == "ne" ? P::FCMP_UNE : pred == "lt" ? P::FCMP_OLT
        : pred == "le" ? P::FCMP_OLE : pred == "gt" ? P::FCMP_OGT : pred == "ge" ? P::FCMP_OGE : P::BAD_FCMP_PREDICATE;
    } else {
      p = pred == "eq" ? P::ICMP_EQ : pred == "ne" ? P::ICMP_NE
        : pred == "lt" ? (unsignedInts ? P::ICMP_ULT : P::ICMP_SLT) : pred == "le" ? (unsignedInts ? P::ICMP_ULE : P::ICMP_SLE)
        : pred == "gt" ? (unsignedInts ? P::ICMP_UGT : P::ICMP_SGT) : pred == "ge" ? (unsignedInts ? P::ICMP_UGE : P::ICMP_SGE)
        : P::BAD_ICMP_PREDICATE;
    }
    if (p == P::BAD_FCMP_PREDICATE || p == P::BAD_ICMP_PREDICATE) fail(op, "unknown predicate '" + pred + "'");
    // f16/bf16 compare exactly in f32.
    set(res, mapRegs(n, [&](size_t r) { return b.CreateCmp(p, toCompute(x[r], t), toCompute(y[r], t)); }));
    return;
  }

  // Binary arithmetic and bitwise ops.
  const Regs& x = operandRegs(0);
  const Regs& y = operandRegs(1);
  if (op.operand(1)->type().dtype() != t) fail(op, "operands differ in dtype");
  if (t == DType::Ptr) fail(op, "arithmetic on pointers: use addptr");
  if (fp) {
    auto floatBinary = [&](auto f) {
      set(res, mapRegs(n, [&](size_t r) { return fromCompute(f(toCompute(x[r], t), toCompute(y[r], t)), t); }));
    };
    switch (op.kind()) {
      case OpKind::Add: floatBinary([&](auto* a, auto* c) { return b.CreateFAdd(a, c); }); return;
      case OpKind::Sub: floatBinary([&](auto* a, auto* c) { return b.CreateFSub(a, c); }); return;
      case OpKind::Mul: floatBinary([&](auto* a, auto* c) { return b.CreateFMul(a, c); }); return;
      case OpKind::Div: floatBinary([&](auto* a, auto* c) { return b.CreateFDiv(a, c); }); return;
      case OpKind::Rem: floatBinary([&](auto* a, auto* c) { return b.CreateFRem(a, c); }); return;
      case OpKind::Maximum:
        floatBinary([&](auto* a, auto* c) { return b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, a, c); });
        return;
      case OpKind::Minimum:
        floatBinary([&](auto* a, auto* c) { return b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, a, c); });
        return;
      default: fail(op, "is not defined on float operands (" + op.operand(0)->type().str() + ")");
    }
  }

  const bool isBool = t == DType::I1;
  llvm::Type* ty = llvmType(t);
  const unsigned bits = unsigned(ir::bitWidth(t));
  auto cst = [&](int64_t v) { return llvm::ConstantInt::get(ty, uint64_t(v), true); };
  set(res, mapRegs(n, [&](size_t r) -> llvm::Value* {
        llvm::Value* a = x[r];
        llvm::Value* c = y[r];
        switch (op.kind()) {
          case OpKind::Add: return b.CreateAdd(a, c);
          case OpKind::Sub: return b.CreateSub(a, c);
          case OpKind::Mul: return b.CreateMul(a, c);
          case OpKind::Div:
          case OpKind::Rem: {
            bool div = op.kind() == OpKind::Div;
            if (isBool) {  // x / true = x, x % true = 0; by false as by zero below
              llvm::Value* q = div ? a : b.getFalse();
              return b.CreateSelect(c, q, div ? a : b.getFalse());
            }
            // Guard the divisor so LLVM never sees division by zero or the
            // overflowing INT_MIN / -1 (both are poison in LLVM).
            llvm::Value* isZero = b.CreateICmpEQ(c, cst(0));
            llvm::Value* isMinusOne = b.CreateICmpEQ(c, cst(-1));
            llvm::Value* safe = b.CreateSelect(b.CreateOr(isZero, isMinusOne), cst(1), c);
            llvm::Value* q = div ? b.CreateSDiv(a, safe) : b.CreateSRem(a, safe);
            llvm::Value* byMinusOne = div ? b.CreateNeg(a) : cst(0);
            llvm::Value* byZero = div ? a : cst(0);
            return b.CreateSelect(isZero, byZero, b.CreateSelect(isMinusOne, byMinusOne, q));
          }
          case OpKind::Maximum:
            return b.CreateBinaryIntrinsic(isBool ? llvm::Intrinsic::umax : llvm::Intrinsic::smax, a, c);
          case OpKind::Minimum:
            return b.CreateBinaryIntrinsic(isBool ? llvm::Intrinsic::umin : llvm::Intrinsic::smin, a, c);
          case OpKind::And: return b.CreateAnd(a, c);
          case OpKind::Or: return b.CreateOr(a, c);
          case OpKind::Xor: return b.CreateXor(a, c);
          case OpKind::Shl: {
            if (isBool) return b.CreateAnd(a, b.CreateNot(c));  // shifting a bit by 1 drops it
            llvm::Value* big = b.CreateICmpUGE(c, cst(bits));
            return b.CreateSelect(big, cst(0), b.CreateShl(a, b.CreateSelect(big, cst(0), c)));
          }
          case OpKind::Shr: {
            if (isBool) return a;  // arithmetic shift of a 1-bit value keeps its sign bit
            llvm::Value* amount = b.CreateBinaryIntrinsic(llvm::Intrinsic::umin, c, cst(bits - 1));
            return b.CreateAShr(a, amount);
          }
          default: fail(op, "is not defined on integer operands (" + op.operand(0)->type().str() + ")");
        }
      }));
}

}  // namespace flextile::codegen
