// The tile-IR interpreter: runs any program of ir/Ops.def on host memory over
// a whole launch grid. It is the semantic oracle of FlexTile — GPU results are
// compared against it — so this comment is the precise definition of what each
// op computes. Where the GPU lowering differs (approximate exp2, a different
// summation order inside dot/reduce), tests use tolerances; everything else
// must match bit for bit.
//
// Execution
//   * One program instance per grid point (x, y, z); instances are independent
//     and run in parallel on a thread pool (InterpOptions::threads, 0 = all
//     cores), in no particular order. Their stores are applied to memory as
//     they run; programs that race on one address are the program's bug and
//     are not detected, except through atomic_add, which is atomic here too.
//   * Before anything runs, the function is verified once with ir::verify
//     (ir/Verifier.h, the rules of docs/ir-reference.md), and the arguments
//     are checked against the parameters (count, kind, integer range). A
//     malformed program is one flextile::Error listing every problem, each
//     naming its op and source line; never a crash. So the programs run here
//     are exactly those the compiler accepts.
//   * A run-time error (out-of-bounds access, integer division by zero, a
//     non-positive loop step) stops further programs from starting; the error
//     of the lowest-numbered failing program (x fastest, then y, then z) is
//     rethrown. Stores done before it stay done.
//   * Thread block clusters: a function with cluster_all_gather {size = C}
//     runs the C programs of each cluster (consecutive along axis 0; axis 0
//     must be a multiple of C, else an Error) at once, on threads of their
//     own, as the GPU co-schedules a cluster; clusters are claimed like
//     programs. A gather waits until every program of its cluster has reached
//     its own gather of the same count, then hands each the operands of all
//     (result i * C + r is operand i of rank r). A program that returns while
//     another of its cluster waits at a gather it will never reach (the GPU
//     would hang) is an Error naming both; so is a gather in a program whose
//     cluster mate failed (the mate's error is the one reported). With {to},
//     only that rank receives (the others' results are their own operands);
//     with {rows = R}, the received tiles' rows >= R (along dim 0) are 0.
//   * Layouts on types are ignored; convert_layout is the identity.
//
// Values and storage
//   * Scalars are rank-0 values; tiles are dense row-major arrays.
//   * f16, bf16 and f32 are held in float (every f16/bf16 value is exactly a
//     float); f64 in double; i1, i8, i32 and i64 in int64 (i1 as 0 or 1, i8 and
//     i32 sign-extended); pointers as (argument index, byte offset).
//   * Every op result of an f16/bf16 dtype is computed in float and rounded once
//     to the dtype, to nearest even (Eigen::half / Eigen::bfloat16). For
//     add/sub/mul/div/sqrt this equals the correctly rounded f16/bf16 result
//     (float has more than 2p+2 bits). f32 ops are IEEE float ops; f64 ops are
//     IEEE double ops.
//   * Integer results wrap to their width (two's complement); i1 results are
//     reduced modulo 2 (bitwise ops on i1 are the logical ops).
//
// Element-wise ops (operands have identical shapes and dtypes; the code of
// each rule is in ir/Elementwise.h, which constant folding calls too)
//   * neg, abs: wrap for integers (abs(INT_MIN) == INT_MIN). not: bitwise
//     complement on integers, logical on i1; not on floats is an error.
//   * exp exp2 log log2 tanh sqrt rsqrt: std:: functions in float (double for
//     f64); rsqrt(x) = 1 / sqrt(x); exp and exp2 flush a subnormal float result
//     to +0 (the GPU's ex2.approx.ftz).
//   * div, rem on integers truncate toward zero (as in C); a zero divisor is an
//     Error naming the op, the program and the element; INT_MIN / -1 wraps to
//     INT_MIN and INT_MIN % -1 is 0. Ops run on every lane of a tile, masked
//     or not, so a divisor loaded under a mask needs `other` != 0 (the default
//     0 would be a division by zero). On floats div is IEEE and rem is fmod
//     (the sign of the dividend).
//   * maximum, minimum: signed on integers. On floats they propagate NaN and
//     order -0 < +0 (IEEE 754-2019 maximum/minimum, PTX max.NaN/min.NaN).
//   * shl, shr: the shift amount is read as unsigned; amounts >= the bit width
//     give 0 for shl and the sign fill for shr (as PTX clamps). shr is
//     arithmetic.
//   * cmp {pred in eq ne lt le gt ge}: signed for integers (i1: 0 < 1), ordered
//     for floats (false with a NaN) except ne, which is unordered (true with a
//     NaN). Pointers compare only with eq/ne: equal when same buffer and offset.
//   * select (c, a, b): c ? a : b, any dtype including pointers.
//   * cast (x) -> U:
//       float -> float: exact when widening; narrowing rounds to nearest even
//         (f64 -> f16/bf16 rounds once, not through f32).
//       float -> integer: truncates toward zero and saturates to the target's
//         range, NaN -> 0 (as PTX cvt.rzi.sat). float -> i1 is x != 0 (NaN -> 1).
//       integer -> float: rounds to nearest even, once.
//       integer -> integer: wraps (truncates) to the target width; i1 sources
//         are 0 or 1 (zero-extended); any -> i1 is x != 0.
//       Pointers are never cast (the verifier refuses it).
//   * addptr (p, off): byte offset += off * sizeof(pointee); off is i32 or i64.
//     The pointer keeps its buffer (provenance); it may leave the buffer, only
//     an access outside it is an error.
//
// Memory
//   * load (p [, mask [, other]]), store (p, v [, mask]): mask and other have
//     p's shape. For every active element (mask true, or no
//     mask) the access must lie inside its argument buffer ([offset, offset +
//     size) within [0, bytes)) and be aligned to the element size in host
//     memory; otherwise it is an Error naming the op, the program id, the tile
//     coordinate of the element, the buffer and the offset. Inactive elements
//     are never touched; load gives `other` there (0 without it). i1 is one
//     byte in memory (loads read != 0, stores write 0 or 1); f16/bf16 are their
//     IEEE/bfloat bit patterns. Loads and stores of pointers are errors.
//   * atomic_add (p, v [, mask]) -> T, T in f32 i32 i64: for every active
//     element in row-major order, old = *p; *p = old + v (IEEE float add;
//     integers wrap), as one host atomic (std::atomic_ref), so programs on
//     other threads may add to the same address; the result is old, and 0 for
//     inactive elements, which touch no memory. Addresses are checked as for a
//     store. Several elements of one tile may name one address: each sees the
//     sum of the ones before it. The final memory of f32 additions depends on
//     the order programs run in (float addition is not associative); integer
//     sums do not.
//   * fence: a host std::atomic_thread_fence(acq_rel). With the atomic_add
//     above (itself sequentially consistent) it orders a program's stores
//     before a ticket it takes, and another program's loads after the ticket
//     it got, as the GPU's fence.acq_rel.gpu does.
//
// Shapes
//   * arange {start, end}: i32 start..end-1. splat: scalar -> tile.
//     broadcast: size-1 dims repeated to the result shape (of the same rank).
//     expand_dims, reshape: the same row-major elements with another shape.
//     trans {perm}: result dim i is x's dim perm[i].
//   * reduce (x) {axis, kind in sum max min}: drops dim `axis`. Integer sums
//     wrap. Float sums accumulate in double in index order, whatever the
//     dtype, and round once to the dtype: closer to the exact sum than any f32
//     summation order a GPU tree reduction may use (compare with tolerances).
//     max/min follow the element-wise maximum/minimum (NaN propagates).
//   * dot (a, b, acc): a[M, K] @ b[K, N] + acc[M, N]. Float inputs of any float
//     dtype: products and sums in double (f16/bf16/f32 products are exact
//     there), then + acc in double, rounded once to acc's dtype. i8 inputs with
//     an i32 acc: int64 arithmetic wrapped to i32.
//
// Control flow
//   * for (lb, ub, step, init...) {iv, carried... ; yield v...}: integer
//     scalar bounds; iv takes lb, lb+step, ... while iv < ub, in lb's dtype; a
//     step <= 0 is an Error (a loop would never end). The results are the last
//     carried values (the inits when the body never runs).
//   * return ends the program.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace flextile::ir {

// One argument per function parameter, in order: a host buffer for each
// ptr<T> parameter, an integer for each integer scalar, a real for each float
// scalar.
class InterpArg {
 public:
  enum class Kind { Buffer, Integer, Real };

  // A host allocation of `bytes` bytes. The interpreter reads and writes it in
  // place; `name` appears in out-of-bounds errors (the parameter's name when
  // empty).
  static InterpArg buffer(void* base, size_t bytes, std::string name = "");
  static InterpArg integer(int64_t v);
  static InterpArg real(double v);

  Kind kind() const { return kind_; }
  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  int64_t intValue() const { return int_; }
  double realValue() const { return real_; }
  std::string describe() const;  // "buffer 'x' (4000 bytes)", "integer 7", "real 0.5"

 private:
  Kind kind_ = Kind::Integer;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  int64_t int_ = 0;
  double real_ = 0;
};

struct InterpOptions {
  int threads = 0;  // 0: std::thread::hardware_concurrency()
};

// Runs `f` once per point of `grid` (each entry >= 0; a 0 runs nothing).
// Throws flextile::Error for a malformed program, wrong arguments, or the first
// run-time error (see the rules above).
void interpret(const Function& f, const std::vector<InterpArg>& args, std::array<int64_t, 3> grid,
               const InterpOptions& options = {});

}  // namespace flextile::ir
