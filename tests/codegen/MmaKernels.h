// Tile-IR kernels around tensor-core dots, shared by the host tests
// (tests/codegen/MmaTest.cpp: layouts, PTX) and the GPU tests
// (tests/gpu/MmaGpuTest.cpp: numbers). Shape-only IR; layout assignment
// decides the layouts.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "ir/Builder.h"

namespace flextile::testkernels {

// One block of attention without the online rescaling: for row-major
// q [BM, D], k [BN, D], v [BN, D] (bf16 or f16),
//   S = q k^T, p = exp2(S - rowmax(S)), l = rowsum(p), o = (bf16(p) v) / l
// with o [BM, D] f32. K^T is a `trans` of the loaded k (K-contiguous for the
// B operand: ldmatrix without .trans), v is B as stored (.trans), and p is
// the A operand of the second dot straight from the first one's accumulator. With `split`, S is
// summed over two column chunks of q and k, [0, split) and [split, d), the second product
// accumulating into the first's result (the forward's split head dim).
inline std::unique_ptr<ir::Function> attentionBlock(int64_t bm, int64_t bn, int64_t d, int numWarps,
                                                    ir::DType in = ir::DType::BF16, int64_t split = 0) {
  using namespace ir;
  auto f = std::make_unique<Function>("attention_block");
  Value* q = f->addParam(Type::pointer(in), "q");
  Value* kp = f->addParam(Type::pointer(in), "k");
  Value* v = f->addParam(Type::pointer(in), "v");
  Value* o = f->addParam(Type::pointer(DType::F32), "o");
  f->attrs()["num_warps"] = int64_t(numWarps);
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16};
  Builder b(*f);
  auto i32 = [&](int64_t x) { return b.constantInt(Type(DType::I32), x); };
  // Row-major [rows, cols] with stride `stride` (cols by default), from column col0.
  auto offsets = [&](int64_t rows, int64_t cols, int64_t stride = 0, int64_t col0 = 0) {
    const Shape s{rows, cols};
    Value* r = b.binary(OpKind::Mul, b.arange(0, rows), b.splat(i32(stride ? stride : cols), {rows}));
    return b.binary(OpKind::Add, b.broadcast(b.expandDims(r, 1), s),
                    b.broadcast(b.expandDims(b.arange(col0, col0 + cols), 0), s));
  };
  auto ptrs = [&](Value* base, Value* offs) { return b.addptr(b.splat(base, offs->type().shape()), offs); };
  const Shape sShape{bm, bn}, oShape{bm, d};
  Value* s = b.constant(Type(DType::F32, sShape), 0.0);
  for (auto [col0, cols] : split ? std::vector<std::pair<int64_t, int64_t>>{{0, split}, {split, d - split}}
                                 : std::vector<std::pair<int64_t, int64_t>>{{0, d}}) {
    Value* qt = b.load(ptrs(q, offsets(bm, cols, d, col0)));
    Value* kt = b.load(ptrs(kp, offsets(bn, cols, d, col0)));
    s = b.dot(qt, b.trans(kt, {1, 0}), s);
  }
  Value* vt = b.load(ptrs(v, offsets(bn, d)));
  Value* mx = b.reduce(s, 1, "max");
  Value* p = b.unary(OpKind::Exp2, b.binary(OpKind::Sub, s, b.broadcast(b.expandDims(mx, 1), sShape)));
  Value* l = b.reduce(p, 1, "sum");
  Value* pv = b.dot(b.cast(p, in), vt, b.constant(Type(DType::F32, oShape), 0.0));
  b.store(ptrs(o, offsets(bm, d)), b.binary(OpKind::Div, pv, b.broadcast(b.expandDims(l, 1), oShape)));
  b.ret();
  return f;
}

}  // namespace flextile::testkernels
