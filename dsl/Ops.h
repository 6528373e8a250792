// Operations of the tile language. Binary operations follow NumPy
// broadcasting (missing leading dimensions are prepended, size-1 dimensions
// repeat) and these dtype rules:
//   * a C++ number adopts the tile's dtype (an integer literal next to a float
//     tile becomes a float; a floating literal next to an integer tile makes
//     the result f32);
//   * float beats integer; between floats the wider wins, and f16 with bf16
//     gives f32; between integers the wider wins;
//   * comparisons give i1; `&`, `|`, `^`, `~` are bitwise (logical on i1).
// Each operation checks shapes and dtypes while tracing and reports mistakes
// with the user's file and line.
#pragma once

#include <functional>
#include <tuple>
#include <type_traits>
#include <optional>
#include <vector>

#include "dsl/Tile.h"

namespace flextile::dsl {

Tile operator+(Operand a, Operand b);
Tile operator-(Operand a, Operand b);
Tile operator*(Operand a, Operand b);
Tile operator/(Operand a, Operand b);  // integers: truncating division
Tile operator%(Operand a, Operand b);
Tile operator&(Operand a, Operand b);
Tile operator|(Operand a, Operand b);
Tile operator^(Operand a, Operand b);
Tile operator<<(Operand a, Operand b);
Tile operator>>(Operand a, Operand b);
Tile operator<(Operand a, Operand b);
Tile operator<=(Operand a, Operand b);
Tile operator>(Operand a, Operand b);
Tile operator>=(Operand a, Operand b);
Tile operator==(Operand a, Operand b);
Tile operator!=(Operand a, Operand b);
Tile operator-(Operand a);
Tile operator~(Operand a);
Tile operator!(Operand a);

// Program instance queries (axis 0..2).
Tile program_id(int axis, SourceLoc loc = SourceLoc::current());
Tile num_programs(int axis, SourceLoc loc = SourceLoc::current());

// [start, end) as i32; end - start must be a power of two.
Tile arange(int64_t start, int64_t end, SourceLoc loc = SourceLoc::current());
// A tile of `shape` filled with `value` (of dtype `dtype`).
Tile full(const Shape& shape, double value, DType dtype, SourceLoc loc = SourceLoc::current());
Tile zeros(const Shape& shape, DType dtype, SourceLoc loc = SourceLoc::current());
// A scalar constant of the given dtype.
Tile scalar(double value, DType dtype, SourceLoc loc = SourceLoc::current());

// Memory. `ptr` is a tile of pointers (a pointer parameter plus an offset
// tile); `mask` (i1, broadcast to ptr's shape) turns lanes off; masked-off
// lanes of a load read `other` (0 when not given) and touch no memory.
Tile load(Operand ptr, SourceLoc loc = SourceLoc::current());
Tile load(Operand ptr, Operand mask, SourceLoc loc = SourceLoc::current());
Tile load(Operand ptr, Operand mask, Operand other, SourceLoc loc = SourceLoc::current());
void store(Operand ptr, Operand value, SourceLoc loc = SourceLoc::current());
void store(Operand ptr, Operand value, Operand mask, SourceLoc loc = SourceLoc::current());
// The same elements as one box of a tensor, for a load that names them both ways: the tensor's
// element (i0, .., iR-1) is at `base + sum i_k * strides_k` (strides in elements, R-1 of them: the
// last dim is contiguous), `dims` bound it (outermost first, rank 1 to 5) and the box, the load's
// tile padded with leading 1s to rank R, starts at `coords`. All are i32 scalars (or numbers).
// The load must read exactly the box: its pointers are the box's elements and its mask holds
// exactly inside [0, dims) (the interpreter checks both). On sm_90a a pipelined loop may then copy
// the box with TMA instead (codegen/passes/Pipeline.cpp); elsewhere it is an ordinary load.
struct TensorBox {
  Operand base;
  std::vector<Operand> dims, strides, coords;
};
Tile load(Operand ptr, Operand mask, const TensorBox& box, SourceLoc loc = SourceLoc::current());
Tile load(Operand ptr, const TensorBox& box, SourceLoc loc = SourceLoc::current());  // every element inside
// `loaded` (a tile a load returned), its load marked to stay where it is: the pipeline pass gives
// it no ring even in a loop where it would qualify (a tile the loop reads once an iteration, too
// large to double-buffer beside the rings of the loops it holds: a persistent forward's Q at D = 256).
Tile unpipelined(const Tile& loaded, SourceLoc loc = SourceLoc::current());
// `*ptr += value` atomically per element (where `mask` holds); returns the old
// values (0 where masked off). The pointee is f32, i32 or i64; `value` is
// broadcast to ptr's shape and must have the pointee's dtype (a C++ number
// adopts it). Each element is added exactly once per program, even where
// several threads hold it. Across programs the order is unspecified: f32 sums
// may differ in their last bits from run to run, integer sums never.
Tile atomic_add(Operand ptr, Operand value, SourceLoc loc = SourceLoc::current());
Tile atomic_add(Operand ptr, Operand value, Operand mask, SourceLoc loc = SourceLoc::current());
// The same where the tile is also one box of a tensor (TensorBox, as for load: the pointers are
// the box's elements, the mask holds exactly inside [0, dims), checked by the interpreter). When
// the old values go unused, an f32 rank-2 tile may then be added on sm_90a by a few TMA reductions
// from one thread, instead of an atomic per element or a bulk reduction per row
// (codegen/passes/BulkReduce.cpp).
Tile atomic_add(Operand ptr, Operand value, Operand mask, const TensorBox& box, SourceLoc loc = SourceLoc::current());
Tile atomic_add(Operand ptr, Operand value, const TensorBox& box, SourceLoc loc = SourceLoc::current());
// A program's one ticket that also releases everything the program did before it and acquires
// for everything after (AcqRel; a scalar pointer): the pattern "write partials, fence, take a
// ticket; the last holder fences, then reads" with the two fences folded into the add, which one
// thread issues after a barrier of the program (ir/Ops.def atomic_add {order = "acq_rel"}).
enum class MemoryOrder { Relaxed, AcqRel };
Tile atomic_add(Operand ptr, Operand value, MemoryOrder order, SourceLoc loc = SourceLoc::current());
// Tagged words: a value handed to another program without a fence. store_tagged writes each f32
// element with a 32-bit tag into one i64 (one relaxed 64-bit store, so value and tag arrive
// together); load_tagged waits until every element it reads carries the tag, then gives the
// values. A reader needs one round trip instead of fence, flag and load; the tag (a call's
// number, say) tells this call's words from a previous call's. The writer must already be running
// when a reader waits for it (a program that took its ticket after it, say): a wait for a program
// that cannot start until the reader ends never ends (on the GPU it traps after ~10 s).
void store_tagged(Operand ptr, Operand value, Operand tag, SourceLoc loc = SourceLoc::current());
void store_tagged(Operand ptr, Operand value, Operand tag, Operand mask, SourceLoc loc = SourceLoc::current());
Tile load_tagged(Operand ptr, Operand tag, SourceLoc loc = SourceLoc::current());
Tile load_tagged(Operand ptr, Operand tag, Operand mask, SourceLoc loc = SourceLoc::current());
// Several tiles, one wait: every word of every tile is loaded, then the round repeats until all
// carry the tag (one round trip where a load_tagged per tile waits one after the other). `masks`
// is empty or has one mask per pointer.
std::vector<Tile> load_tagged(const std::vector<Tile>& ptrs, Operand tag, const std::vector<Tile>& masks = {},
                              SourceLoc loc = SourceLoc::current());
// An acq_rel memory fence at GPU scope for the whole program: every load and store of the
// program before it (all of its threads') is ordered before every one after it, for any other
// program that synchronizes with this one through an atomic_add (ir/Ops.def). The pattern it
// serves: write partials, fence, take a ticket; the last ticket's holder fences, then reads
// everyone's partials (attention_templates/FlexAttentionDecode.cpp).
void fence(SourceLoc loc = SourceLoc::current());
// Programmatic dependent launch (sm_90+; elsewhere nothing). A kernel that calls
// wait_for_prior_grids is launched so that it may start while the stream's previous kernel
// finishes; the call waits until that kernel has completed and its writes are visible, so put it
// before the first read of anything the previous kernel may write (in practice: before any global
// access). release_dependent_grids lets the stream's next such kernel start launching.
void wait_for_prior_grids(SourceLoc loc = SourceLoc::current());
// The GPU's global clock in nanoseconds (an i64 scalar; the interpreter reads the host's steady
// clock), read when the program gets there: for timelines of a kernel's phases, stored to a buffer
// the caller reads back. A read waits for nothing in flight: place it after an op that consumes
// what the phase waited for.
Tile global_timer(SourceLoc loc = SourceLoc::current());
// The multiprocessor the program runs on (an i32 scalar >= 0, %smid, whose numbering may skip
// disabled SMs; the interpreter: 0): beside global_timer in a timeline, which SMs hold the late
// programs.
Tile sm_id(SourceLoc loc = SourceLoc::current());
void release_dependent_grids(SourceLoc loc = SourceLoc::current());
// Thread block clusters (sm_90+): the `size` programs C * c .. C * c + C - 1 along grid axis 0
// (2 <= size <= 8; the grid's axis 0 a multiple of size) hand `values` to each other through
// distributed shared memory. Returns, for each value in order, its copy from every program of the
// cluster by rank (program_id(0) % size): result[i * size + r] is values[i] of rank r. Every
// program of a cluster must make the same calls in the same order (it is a barrier of the
// cluster); a kernel has one cluster size. Values only: no pointers.
std::vector<Tile> cluster_all_gather(const std::vector<Tile>& values, int64_t size, SourceLoc loc = SourceLoc::current());
// The same moving fewer bytes: only rank `to` receives (in every other program each result is its
// own value), and, when `rows` > 0 (a power of two), only rows [0, rows) of the tiles cross (the
// received tiles' other rows are 0): e.g. the real rows of a tile padded to the mma's 16.
struct ClusterGatherOptions {
  std::optional<int64_t> to;
  int64_t rows = 0;
};
std::vector<Tile> cluster_all_gather(const std::vector<Tile>& values, int64_t size, const ClusterGatherOptions& options,
                                     SourceLoc loc = SourceLoc::current());

// Reductions along `axis` (negative counts from the end); the axis is removed.
Tile max(Operand x, int axis, SourceLoc loc = SourceLoc::current());
Tile min(Operand x, int axis, SourceLoc loc = SourceLoc::current());
Tile sum(Operand x, int axis, SourceLoc loc = SourceLoc::current());

// Element-wise math.
Tile exp(Operand x, SourceLoc loc = SourceLoc::current());
Tile exp2(Operand x, SourceLoc loc = SourceLoc::current());
Tile log(Operand x, SourceLoc loc = SourceLoc::current());
Tile log2(Operand x, SourceLoc loc = SourceLoc::current());
Tile tanh(Operand x, SourceLoc loc = SourceLoc::current());
Tile sqrt(Operand x, SourceLoc loc = SourceLoc::current());
Tile rsqrt(Operand x, SourceLoc loc = SourceLoc::current());
Tile abs(Operand x, SourceLoc loc = SourceLoc::current());
Tile maximum(Operand a, Operand b, SourceLoc loc = SourceLoc::current());
Tile minimum(Operand a, Operand b, SourceLoc loc = SourceLoc::current());
// cond ? a : b, element-wise with broadcasting; cond must be i1.
Tile where(Operand cond, Operand a, Operand b, SourceLoc loc = SourceLoc::current());
Tile cast(Operand x, DType to, SourceLoc loc = SourceLoc::current());

// acc + a @ b with a [M, K], b [K, N]; the result is f32 [M, N]. a and b are
// f16, bf16 or f32 of one dtype.
Tile dot(Operand a, Operand b, SourceLoc loc = SourceLoc::current());
Tile dot(Operand a, Operand b, Operand acc, SourceLoc loc = SourceLoc::current());
// How f32 operands are multiplied: TF32 (the default, as in Triton) rounds
// them to tf32 for the tensor cores (relative error near 1e-3); IEEE keeps
// exact f32 products (FMA path, slower). f16/bf16 operands are unaffected.
enum class InputPrecision { TF32, IEEE };
Tile dot(Operand a, Operand b, Operand acc, InputPrecision precision, SourceLoc loc = SourceLoc::current());

// A run-time loop: for (i = lo; i < hi; i += step) with loop-carried tiles.
// `body(i, carried...)` returns the next carried values as a std::tuple of
// tiles (or one Tile), each with the same shape and dtype as its initial
// value; for_range returns the final values the same way.
//
//   auto [m, l] = for_range(0, n, 64, std::tuple{m0, l0}, [&](Tile i, Tile m, Tile l) {
//     ...
//     return std::tuple{m2, l2};
//   });
std::vector<Tile> forRangeImpl(Operand lo, Operand hi, Operand step, const std::vector<Tile>& init,
                               const std::function<std::vector<Tile>(Tile, const std::vector<Tile>&)>& body,
                               SourceLoc loc);

namespace detail {
template <class Tuple, size_t... I>
std::vector<Tile> toVector(const Tuple& t, std::index_sequence<I...>) {
  return {Tile(std::get<I>(t))...};
}
template <size_t N, size_t... I>
auto toTuple(const std::vector<Tile>& v, std::index_sequence<I...>) {
  return std::tuple{((void)I, v[I])...};
}
}  // namespace detail

template <class... T, class Body>
std::tuple<std::conditional_t<true, Tile, T>...> for_range(Operand lo, Operand hi, Operand step,
                                                           const std::tuple<T...>& init, Body&& body,
                                                           SourceLoc loc = SourceLoc::current()) {
  constexpr size_t N = sizeof...(T);
  auto seq = std::index_sequence_for<T...>{};
  auto initVec = detail::toVector(init, seq);
  auto out = forRangeImpl(lo, hi, step, initVec,
                          [&](Tile iv, const std::vector<Tile>& carried) {
                            auto args = std::tuple_cat(std::tuple{iv}, detail::toTuple<N>(carried, seq));
                            auto next = std::apply(body, args);
                            if constexpr (std::is_same_v<std::decay_t<decltype(next)>, Tile>)
                              return std::vector<Tile>{next};
                            else
                              return detail::toVector(next, std::make_index_sequence<std::tuple_size_v<decltype(next)>>{});
                          },
                          loc);
  return detail::toTuple<N>(out, seq);
}

// A loop with one carried tile.
template <class Body>
Tile for_range(Operand lo, Operand hi, Operand step, const Tile& init, Body&& body,
               SourceLoc loc = SourceLoc::current()) {
  return forRangeImpl(lo, hi, step, {init},
                      [&](Tile iv, const std::vector<Tile>& c) { return std::vector<Tile>{body(iv, c[0])}; }, loc)[0];
}

// A loop whose carried tiles are a vector, their number chosen while tracing (a template's chunks of
// a split head dim): `body(i, carried)` returns the next ones, as many, in the same order.
template <class Body>
std::vector<Tile> for_range(Operand lo, Operand hi, Operand step, const std::vector<Tile>& init, Body&& body,
                            SourceLoc loc = SourceLoc::current()) {
  return forRangeImpl(lo, hi, step, init,
                      [&](Tile iv, const std::vector<Tile>& carried) { return std::vector<Tile>(body(iv, carried)); },
                      loc);
}

// A loop with no carried values (its body only stores).
template <class Body>
void for_range(Operand lo, Operand hi, Operand step, Body&& body, SourceLoc loc = SourceLoc::current()) {
  forRangeImpl(lo, hi, step, {},
               [&](Tile iv, const std::vector<Tile>&) {
                 body(iv);
                 return std::vector<Tile>{};
               },
               loc);
}

}  // namespace flextile::dsl
