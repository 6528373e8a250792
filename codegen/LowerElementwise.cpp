// Element-wise ops: one LLVM instruction sequence per register.
//
// Numerics (the interpreter computes the same way):
//   * f16/bf16 arithmetic extends to f32, computes, and rounds back to nearest even.
//   * add/sub/mul/div/sqrt of f32 and f64 are correctly rounded (LLVM's fdiv
//     and llvm.sqrt lower to div.rn / sqrt.rn: no fast-math flags are set).
//   * exp2 and log2 use ex2.approx.ftz / lg2.approx (about 2 ulp on f32; exp2 flushes a
//     subnormal result to +0, which the interpreter models);
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

#include <cstdlib>
#include <cstring>
#include <numbers>

#include "codegen/Exp2Emulation.h"
#include "codegen/LowerToLLVMImpl.h"

namespace flextile::codegen {

using ir::DType;
using ir::OpKind;
// The trait names Ops.def writes unqualified.
using ir::kCommutative;
using ir::kFloatOnly;
using ir::kIntOnly;

namespace {

bool isHalfLike(DType t) { return t == DType::F16 || t == DType::BF16; }

// ---- arithmetic ops -------------------------------------------------------------
//
// ArithmeticLowering<K> is the LLVM code of the arithmetic op K (FT_ARITHMETIC_OP
// in ir/Ops.def), one register at a time:
//   onFloat(f, a[, c])     for float dtypes (unless the op is kIntOnly), on
//                          values of the compute type: f32 for f16/bf16 (the
//                          caller extends and rounds back), unless
//                          kFloatOnStorageType, where the register is used as is;
//                          f is a FloatOperands, which most lowerings take as the
//                          builder it converts to
//   kF64                   false where there is no f64 instruction (an error)
//   onInt(ints, a[, c])    for integer dtypes (unless the op is kFloatOnly)
// The static_asserts after the table make an op without its lowering, or with
// one that disagrees with the table's traits, a compile error.

// What a float lowering may need besides the builder: the function's choices of instruction form.
struct FloatOperands {
  llvm::IRBuilder<>& b;
  bool ex2Ftz;  // exp2FlushesSubnormals of the function being lowered
  operator llvm::IRBuilder<>&() const { return b; }
};
struct IntOperands {
  llvm::IRBuilder<>& b;
  DType t;
  bool isBool() const { return t == DType::I1; }
  unsigned bits() const { return unsigned(ir::bitWidth(t)); }
  llvm::ConstantInt* cst(llvm::Type* ty, int64_t v) const { return llvm::ConstantInt::get(llvm::cast<llvm::IntegerType>(ty), uint64_t(v), true); }
};

template <OpKind K>
struct ArithmeticLowering {
  static constexpr bool kDefined = false;
};

struct UnaryLowering {
  static constexpr bool kDefined = true;
  static constexpr int kOperands = 1;
  static constexpr bool kFloatOnStorageType = false;
  static constexpr bool kF64 = true;
};
struct BinaryLowering {
  static constexpr bool kDefined = true;
  static constexpr int kOperands = 2;
  static constexpr bool kFloatOnStorageType = false;
  static constexpr bool kF64 = true;
};
struct FloatsAndInts {
  static constexpr bool kOnFloats = true, kOnInts = true;
};
struct FloatsOnly {
  static constexpr bool kOnFloats = true, kOnInts = false;
};
struct IntsOnly {
  static constexpr bool kOnFloats = false, kOnInts = true;
};
// The approximate instructions attention kernels want: no f64 form.
struct ApproximateF32Only : UnaryLowering, FloatsOnly {
  static constexpr bool kF64 = false;
};

// The ftz form: without it ptxas wraps every MUFU.EX2 in a compare with -126 and two predicated
// multiplies (to make subnormal results), a third of the forward's softmax instructions; the
// subnormals it keeps are below 2^-126, nothing a softmax's sum or a bf16 P can hold.
llvm::Value* ex2(llvm::IRBuilder<>& b, llvm::Value* v, bool ftz) {
  return b.CreateIntrinsic(ftz ? llvm::Intrinsic::nvvm_ex2_approx_ftz : llvm::Intrinsic::nvvm_ex2_approx,
                           {v->getType()}, {v});
}
// codegen/Exp2Emulation.h's sequence, one f32 register.
llvm::Value* exp2OnFmaPipes(llvm::IRBuilder<>& b, llvm::Value* x) {
  auto f32 = [&](float v) { return llvm::ConstantFP::get(b.getFloatTy(), v); };
  // max.NaN / min.NaN: a NaN stays NaN (and stays one through the product below).
  llvm::Value* xc = b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum,
                                            b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, x, f32(kExp2Low)),
                                            f32(kExp2High));
  llvm::Value* t = b.CreateFAdd(xc, f32(kExp2RoundingMagic));
  llvm::Value* f = b.CreateFSub(xc, b.CreateFSub(t, f32(kExp2RoundingMagic)));
  llvm::Value* p = f32(kExp2Coefficients[3]);
  for (int i = 2; i >= 0; --i) p = b.CreateIntrinsic(llvm::Intrinsic::fma, {b.getFloatTy()}, {p, f, f32(kExp2Coefficients[i])});
  p = b.CreateIntrinsic(llvm::Intrinsic::fma, {b.getFloatTy()}, {p, f, f32(1.0f)});
  llvm::Value* bits = b.CreateShl(b.CreateAdd(b.CreateBitCast(t, b.getInt32Ty()), b.getInt32(127)), 23);
  return b.CreateFMul(p, b.CreateBitCast(bits, b.getFloatTy()));
}

llvm::Value* lg2(llvm::IRBuilder<>& b, llvm::Value* v) {
  return b.CreateIntrinsic(llvm::Intrinsic::nvvm_lg2_approx_f, llvm::ArrayRef<llvm::Value*>{v});
}

template <>
struct ArithmeticLowering<OpKind::Neg> : UnaryLowering, FloatsAndInts {
  static constexpr bool kFloatOnStorageType = true;  // exact in any float type
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) { return b.CreateFNeg(x); }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x) { return i.b.CreateNeg(x); }
};
template <>
struct ArithmeticLowering<OpKind::Not> : UnaryLowering, IntsOnly {
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x) { return i.b.CreateNot(x); }
};
template <>
struct ArithmeticLowering<OpKind::Abs> : UnaryLowering, FloatsAndInts {
  static constexpr bool kFloatOnStorageType = true;  // exact in any float type
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) {
    return b.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, x);
  }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x) {
    if (i.isBool()) return x;
    return i.b.CreateBinaryIntrinsic(llvm::Intrinsic::abs, x, i.b.getFalse());
  }
};
template <>
struct ArithmeticLowering<OpKind::Exp2> : ApproximateF32Only {
  static llvm::Value* onFloat(const FloatOperands& f, llvm::Value* x) { return ex2(f.b, x, f.ex2Ftz); }
};
// exp(x) = ex2(x * log2(e))
template <>
struct ArithmeticLowering<OpKind::Exp> : ApproximateF32Only {
  static llvm::Value* onFloat(const FloatOperands& f, llvm::Value* x) {
    return ex2(f.b, f.b.CreateFMul(x, llvm::ConstantFP::get(f.b.getFloatTy(), std::numbers::log2e)), f.ex2Ftz);
  }
};
template <>
struct ArithmeticLowering<OpKind::Log2> : ApproximateF32Only {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) { return lg2(b, x); }
};
// log(x) = lg2(x) * ln(2)
template <>
struct ArithmeticLowering<OpKind::Log> : ApproximateF32Only {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) {
    return b.CreateFMul(lg2(b, x), llvm::ConstantFP::get(b.getFloatTy(), std::numbers::ln2));
  }
};
template <>
struct ArithmeticLowering<OpKind::Tanh> : ApproximateF32Only {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) {
    llvm::Type* f32 = b.getFloatTy();
    auto* asmTy = llvm::FunctionType::get(f32, {f32}, false);
    auto* tanhAsm = llvm::InlineAsm::get(asmTy, "tanh.approx.f32 $0, $1;", "=f,f", /*hasSideEffects=*/false);
    return b.CreateCall(asmTy, tanhAsm, {x});
  }
};
template <>
struct ArithmeticLowering<OpKind::Sqrt> : UnaryLowering, FloatsOnly {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) {
    return b.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, x);
  }
};
template <>
struct ArithmeticLowering<OpKind::Rsqrt> : UnaryLowering, FloatsOnly {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x) {
    return b.CreateIntrinsic(x->getType()->isDoubleTy() ? llvm::Intrinsic::nvvm_rsqrt_approx_d
                                                        : llvm::Intrinsic::nvvm_rsqrt_approx_f,
                             llvm::ArrayRef<llvm::Value*>{x});
  }
};

template <>
struct ArithmeticLowering<OpKind::Add> : BinaryLowering, FloatsAndInts {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) { return b.CreateFAdd(x, y); }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) { return i.b.CreateAdd(x, y); }
};
template <>
struct ArithmeticLowering<OpKind::Sub> : BinaryLowering, FloatsAndInts {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) { return b.CreateFSub(x, y); }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) { return i.b.CreateSub(x, y); }
};
template <>
struct ArithmeticLowering<OpKind::Mul> : BinaryLowering, FloatsAndInts {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) { return b.CreateFMul(x, y); }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) { return i.b.CreateMul(x, y); }
};

// Integer div/rem: LLVM must never see a zero divisor or the overflowing
// INT_MIN / -1 (both are poison), so the divisor is guarded and those two
// cases are selected: x / 0 = x, x % 0 = 0, x / -1 = -x, x % -1 = 0.
llvm::Value* guardedDivRem(const IntOperands& i, llvm::Value* a, llvm::Value* c, bool div) {
  llvm::IRBuilder<>& b = i.b;
  if (i.isBool()) {  // x / true = x, x % true = 0; by false as by zero
    llvm::Value* q = div ? a : b.getFalse();
    return b.CreateSelect(c, q, div ? a : b.getFalse());
  }
  llvm::Type* ty = a->getType();
  llvm::Value* isZero = b.CreateICmpEQ(c, i.cst(ty, 0));
  llvm::Value* isMinusOne = b.CreateICmpEQ(c, i.cst(ty, -1));
  llvm::Value* safe = b.CreateSelect(b.CreateOr(isZero, isMinusOne), i.cst(ty, 1), c);
  llvm::Value* q = div ? b.CreateSDiv(a, safe) : b.CreateSRem(a, safe);
  llvm::Value* byMinusOne = div ? b.CreateNeg(a) : i.cst(ty, 0);
  llvm::Value* byZero = div ? a : i.cst(ty, 0);
  return b.CreateSelect(isZero, byZero, b.CreateSelect(isMinusOne, byMinusOne, q));
}

template <>
struct ArithmeticLowering<OpKind::Div> : BinaryLowering, FloatsAndInts {
  // fdiv lowers to div.rn: no fast-math flags are set
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) { return b.CreateFDiv(x, y); }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) {
    return guardedDivRem(i, x, y, /*div=*/true);
  }
};
template <>
struct ArithmeticLowering<OpKind::Rem> : BinaryLowering, FloatsAndInts {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) { return b.CreateFRem(x, y); }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) {
    return guardedDivRem(i, x, y, /*div=*/false);
  }
};
template <>
struct ArithmeticLowering<OpKind::Maximum> : BinaryLowering, FloatsAndInts {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
    return b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, x, y);
  }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) {
    return i.b.CreateBinaryIntrinsic(i.isBool() ? llvm::Intrinsic::umax : llvm::Intrinsic::smax, x, y);
  }
};
template <>
struct ArithmeticLowering<OpKind::Minimum> : BinaryLowering, FloatsAndInts {
  static llvm::Value* onFloat(llvm::IRBuilder<>& b, llvm::Value* x, llvm::Value* y) {
    return b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, x, y);
  }
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) {
    return i.b.CreateBinaryIntrinsic(i.isBool() ? llvm::Intrinsic::umin : llvm::Intrinsic::smin, x, y);
  }
};
template <>
struct ArithmeticLowering<OpKind::And> : BinaryLowering, IntsOnly {
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) { return i.b.CreateAnd(x, y); }
};
template <>
struct ArithmeticLowering<OpKind::Or> : BinaryLowering, IntsOnly {
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) { return i.b.CreateOr(x, y); }
};
template <>
struct ArithmeticLowering<OpKind::Xor> : BinaryLowering, IntsOnly {
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) { return i.b.CreateXor(x, y); }
};
// Shifts by the bit width or more give 0 (shl) or the sign (shr), as PTX's
// clamped shifts do; LLVM would make them poison.
template <>
struct ArithmeticLowering<OpKind::Shl> : BinaryLowering, IntsOnly {
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) {
    llvm::IRBuilder<>& b = i.b;
    if (i.isBool()) return b.CreateAnd(x, b.CreateNot(y));  // shifting a bit by 1 drops it
    llvm::Type* ty = x->getType();
    llvm::Value* big = b.CreateICmpUGE(y, i.cst(ty, i.bits()));
    return b.CreateSelect(big, i.cst(ty, 0), b.CreateShl(x, b.CreateSelect(big, i.cst(ty, 0), y)));
  }
};
template <>
struct ArithmeticLowering<OpKind::Shr> : BinaryLowering, IntsOnly {
  static llvm::Value* onInt(const IntOperands& i, llvm::Value* x, llvm::Value* y) {
    if (i.isBool()) return x;  // arithmetic shift of a 1-bit value keeps its sign bit
    llvm::Value* amount = i.b.CreateBinaryIntrinsic(llvm::Intrinsic::umin, y, i.cst(x->getType(), i.bits() - 1));
    return i.b.CreateAShr(x, amount);
  }
};

#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits)                                                           \
  static_assert(ArithmeticLowering<OpKind::Enum>::kDefined, "codegen: no ArithmeticLowering for the op " name); \
  static_assert(ArithmeticLowering<OpKind::Enum>::kOperands == (nops), "lowering of " name ": operand count");  \
  static_assert(ArithmeticLowering<OpKind::Enum>::kOnFloats == (((traits) & ir::kIntOnly) == 0),             \
                "lowering of " name ": kOnFloats must match kIntOnly in Ops.def");                           \
  static_assert(ArithmeticLowering<OpKind::Enum>::kOnInts == (((traits) & ir::kFloatOnly) == 0),             \
                "lowering of " name ": kOnInts must match kFloatOnly in Ops.def");
#include "ir/Ops.def"

// Calls f(ArithmeticLowering<K>{}) for the arithmetic op k.
template <class F>
void withArithmeticLowering(const ir::Op& op, F&& f) {
  switch (op.kind()) {
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) \
  case OpKind::Enum:                               \
    return f(ArithmeticLowering<OpKind::Enum>{});
#include "ir/Ops.def"
    default: break;
  }
  throw Error(op.describe() + ": internal: not an arithmetic op", ErrorKind::Internal);
}

}  // namespace

bool exp2FlushesSubnormals(const ir::Function& f) {
  if (const char* e = std::getenv("FLEXTILE_EXP2_FTZ"); e && (!std::strcmp(e, "0") || !std::strcmp(e, "1")))
    return e[0] == '1';
  return f.intAttrOr("exp2_ftz", 1) != 0;
}

int64_t exp2EmulationPeriod(const ir::Function& f) {
  if (const char* e = std::getenv("FLEXTILE_EXP2_EMULATION"); e && *e) {
    char* end = nullptr;
    const long long v = std::strtoll(e, &end, 10);
    if (*end == 0) return v;
  }
  return f.intAttrOr("exp2_emulation", 0);
}

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
  const FloatOperands floats{b, (op.kind() == OpKind::Exp2 || op.kind() == OpKind::Exp) && exp2FlushesSubnormals(func)};

  // Every N-th register of an f32 exp2 tile off the SFU (codegen/Exp2Emulation.h).
  if (op.kind() == OpKind::Exp2 && t == DType::F32 && rt.isTile()) {
    const int64_t period = exp2EmulationPeriod(func);
    if (period >= 2) {
      const Regs& x = operandRegs(0);
      set(res, mapRegs(n, [&](size_t r) {
            return int64_t(r) % period == period - 1 ? exp2OnFmaPipes(b, x[r]) : ex2(b, x[r], floats.ex2Ftz);
          }));
      return;
    }
  }

  if (op.hasTrait(ir::kArithmetic)) {
    withArithmeticLowering(op, [&](auto lowering) {
      using L = decltype(lowering);
      if (t == DType::Ptr) fail(op, "arithmetic on pointers: use addptr");
      for (const ir::Value* v : op.operands())
        if (v->type().dtype() != t) fail(op, "operands differ in dtype");
      if (!L::kOnInts && !fp) fail(op, "needs a float operand, got " + op.operand(0)->type().str());
      if (!L::kOnFloats && fp) fail(op, "needs an integer operand, got " + op.operand(0)->type().str());
      if (!L::kF64 && t == DType::F64)
        fail(op, std::string(op.name()) + " of f64 is not supported (no approximate f64 instruction)");
      if constexpr (L::kOnFloats) {
        if (fp) {
          if constexpr (L::kOperands == 1) {
            const Regs& x = operandRegs(0);
            if constexpr (L::kFloatOnStorageType)
              set(res, mapRegs(n, [&](size_t r) { return L::onFloat(floats, x[r]); }));
            else
              set(res, mapRegs(n, [&](size_t r) { return fromCompute(L::onFloat(floats, toCompute(x[r], t)), t); }));
          } else {
            const Regs& x = operandRegs(0);
            const Regs& y = operandRegs(1);
            set(res, mapRegs(n, [&](size_t r) {
                  return fromCompute(L::onFloat(floats, toCompute(x[r], t), toCompute(y[r], t)), t);
                }));
          }
          return;
        }
      }
      if constexpr (L::kOnInts) {
        const IntOperands ints{b, t};
        const Regs& x = operandRegs(0);
        if constexpr (L::kOperands == 1) {
          set(res, mapRegs(n, [&](size_t r) { return L::onInt(ints, x[r]); }));
        } else {
          const Regs& y = operandRegs(1);
          set(res, mapRegs(n, [&](size_t r) { return L::onInt(ints, x[r], y[r]); }));
        }
      }
    });
    return;
  }
  llvm::Type* f32 = b.getFloatTy();

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
  fail(op, "is not an element-wise op");
}

}  // namespace flextile::codegen
