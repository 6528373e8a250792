// The example kernels, shared by the example programs, the tests (interpreter,
// ptxas, GPU) and the benchmarks, so that what a newcomer reads is what is
// tested and timed.
#pragma once

#include <cmath>

#include "dsl/DSL.h"

namespace flextile::examples {

using namespace flextile::dsl;

// out[i] = x[i] + y[i] for i < n, BLOCK elements per program.
inline Kernel vectorAdd() {
  return kernel("vector_add", [](Ptr<f32> x, Ptr<f32> y, Ptr<f32> out, Int n, Const<int> BLOCK) {
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto ok = offs < n;
    store(out + offs, load(x + offs, ok) + load(y + offs, ok), ok);
  });
}

// y[r, :] = softmax(x[r, :]) for a row-major [rows, cols] matrix of element
// type T. Each program owns ROWS rows held in one [ROWS, BLOCK] tile
// (BLOCK >= cols): max, exp2, sum and divide are fused, computed in f32, and
// each element is read once and written once.
template <class T>
Kernel rowSoftmax() {
  return kernel("row_softmax", [](Ptr<T> x, Ptr<T> y, Int rows, Int cols, Const<int> ROWS, Const<int> BLOCK) {
    auto r = (program_id(0) * ROWS + arange(0, ROWS)).expand(1);  // [ROWS, 1]
    auto c = arange(0, BLOCK).expand(0);                          // [1, BLOCK]
    auto ok = (r < rows) & (c < cols);
    auto v = load(x + r * cols + c, ok, -INFINITY).to(f32{});
    auto e = exp2((v - max(v, 1).expand(1)) * 1.4426950408889634);  // exp(x) = exp2(x * log2 e)
    store(y + r * cols + c, e / sum(e, 1).expand(1), ok);
  });
}

// c = a @ b for row-major a [M, K], b [K, N], c [M, N] in element type T with
// f32 accumulation; one BM x BN tile of c per program, K in steps of BK. The tiles of a and b
// are also named as boxes of the two tensors, so that a launch with `tma` (and
// `warp_specialize`) may copy them by TMA on sm_90a; elsewhere they are ordinary loads.
template <class T>
Kernel matmul() {
  return kernel("matmul", [](Ptr<T> a, Ptr<T> b, Ptr<f32> c, Int M, Int N, Int K, Const<int> BM, Const<int> BN,
                             Const<int> BK) {
    auto m0 = program_id(0) * BM, n0 = program_id(1) * BN;
    auto rm = (m0 + arange(0, BM)).expand(1);  // [BM, 1]
    auto rn = (n0 + arange(0, BN)).expand(0);  // [1, BN]
    auto rk = arange(0, BK);
    auto acc = for_range(0, K, BK, zeros({BM, BN}, DType::F32), [&](Tile k, Tile acc) {
      auto ka = (k + rk).expand(0);  // [1, BK]
      auto kb = (k + rk).expand(1);  // [BK, 1]
      auto ta = load(a + rm * K + ka, (rm < M) & (ka < K), TensorBox{a, {M, K}, {K}, {m0, k}});
      auto tb = load(b + kb * N + rn, (kb < K) & (rn < N), TensorBox{b, {K, N}, {N}, {k, n0}});
      return dot(ta, tb, acc);
    });
    store(c + rm * N + rn, acc, (rm < M) & (rn < N));
  });
}

}  // namespace flextile::examples
