// Layouts: which thread holds which element of a tile.
//
// Canonical form. Every layout is a *linear layout* (the form Triton adopted in
// 2024): a map from a hardware index, the bits of (register r, lane l, warp w),
// to a tile coordinate, that is linear over GF(2):
//
//     coord(r, l, w) = XOR_i [bit i of r] * reg[i]
//                    ^ XOR_i [bit i of l] * lane[i]
//                    ^ XOR_i [bit i of w] * warp[i]
//
// where each basis vector holds one coordinate per tile dimension and XOR acts
// component-wise. Tile dimensions are powers of two, so a coordinate is a bit
// string and the XOR never leaves the tile.
//
// Each named family is a constructor of this form:
//   * blocked   (sizePerThread, threadsPerWarp, warpsPerCTA, order): each thread
//                owns a small contiguous block, lanes then warps tile the rest,
//                registers repeat the pattern when the tile is larger.
//   * sliced    (reduction results): drop one coordinate; register bases that
//                become zero merge, lane/warp bases that become zero replicate.
//   * mmaAccumulator and dotOperand (tensor cores): see the section
//                at the end of the class and docs/layouts.md. Shared-memory
//                tiles have their own class, SharedLayout (ir/SharedLayout.h).
//
// Rules kept by every Layout:
//   * lane has exactly 5 bases (32 lanes); warp has log2(num_warps) bases.
//   * register bases are non-zero and linearly independent (no duplicate
//     registers); lane and warp bases may be zero, which means replication:
//     several threads hold the same element.
//   * the image covers the whole tile (surjective).
//
// Example: f32[64, 64] with 4 warps, 4 contiguous elements per thread along
// dim 1, 16 lanes across dim 1, 2 lanes x 4 warps down dim 0:
//
//   #ft.linear<[64, 64], reg=[[0,1],[0,2],[8,0],[16,0],[32,0]],
//              lane=[[0,4],[0,8],[0,16],[0,32],[1,0]], warp=[[2,0],[4,0]]>
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Types.h"

namespace flextile::ir {

class Layout {
 public:
  using Coord = std::vector<int64_t>;
  using Bases = std::vector<Coord>;

  Layout(Shape shape, Bases reg, Bases lane, Bases warp);

  // sizePerThread, threadsPerWarp (product 32), warpsPerCTA (product
  // numWarps) and order (fastest dimension first) as in Triton's blocked
  // encoding. Tile dimensions smaller than the pattern replicate; larger ones
  // repeat in registers.
  static Layout blocked(const Shape& shape, const std::vector<int64_t>& sizePerThread,
                        const std::vector<int64_t>& threadsPerWarp,
                        const std::vector<int64_t>& warpsPerCTA, const std::vector<int>& order);

  // The default blocked layout for a tile: up to `vector` contiguous elements
  // per thread along the last dimension, lanes filling the last dimension
  // first, warps filling the first dimension first.
  static Layout defaultBlocked(const Shape& shape, int numWarps, int64_t vector = 1);

  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  const Bases& regBases() const { return reg_; }
  const Bases& laneBases() const { return lane_; }
  const Bases& warpBases() const { return warp_; }
  int64_t numRegisters() const { return int64_t(1) << reg_.size(); }
  int numWarps() const { return 1 << warp_.size(); }

  Coord apply(int64_t reg, int64_t lane, int64_t warp) const;
  Coord regCoord(int64_t reg) const { return apply(reg, 0, 0); }

  // The register of this layout whose register-part coordinate is `c`
  // (coordinates with lane = warp = 0), or -1.
  int64_t registerOf(const Coord& c) const;

  // Derived layouts.
  Layout sliced(int axis) const;                 // reduce along axis: drop dim
  Layout expanded(int axis) const;               // insert a size-1 dim at axis
  Layout projected(const Shape& smaller) const;  // operand of a broadcast to this
  Layout reshaped(const Shape& shape) const;     // row-major reinterpretation
  Layout transposed(const std::vector<int>& perm) const;

  // Number of leading registers that are consecutive along `dim` (1, 2, 4...):
  // the widest vector a thread can load or store along that dimension.
  int64_t contiguousRegisters(int dim) const;
  // Lane/warp bits whose basis is zero: threads differing only in those bits
  // hold identical data. Stores and scratch writes use only the thread with
  // those bits clear.
  uint32_t replicatedLaneMask() const;
  uint32_t replicatedWarpMask() const;

  bool operator==(const Layout& o) const;
  bool operator!=(const Layout& o) const { return !(*this == o); }

  std::string str() const;  // "#ft.linear<...>"
  // Parses what str() prints; throws flextile::Error on malformed text.
  static Layout parse(std::string_view text);

  // Checks the rules above; returns an empty string when they hold.
  std::string verify() const;

  // ---------------------------------------------------------------------------
  // Tensor-core layouts (mma.sync and wgmma operands). Pictures in docs/layouts.md.
  //
  // Accumulator of mma.sync.aligned.m16n8k16 (and m16n8k8) with f32 C/D, for a
  // tile [M, N]. Within one 16x8 instruction tile, lane l holds rows l/4 and
  // l/4 + 8, columns 2*(l%4) and 2*(l%4) + 1, as registers c0..c3:
  //     c0 = (l/4, 2*(l%4))     c1 = (l/4, 2*(l%4) + 1)
  //     c2 = (l/4 + 8, 2*(l%4)) c3 = (l/4 + 8, 2*(l%4) + 1)
  // Warps tile the block at instruction granularity: warp bits first step N
  // by 8, 16, ... (wn of them), then M by 16, 32, ... (wm of them); warp w
  // therefore sits at instruction tile (w / wn, w % wn) of each 16*wm x 8*wn
  // super-tile. Registers then repeat that super-tile, N first, then M:
  //     register = c + 4 * (nRep + numNReps * mRep),  c in 0..3,
  //     element  = (mRep * 16 * wm + 16 * (w / wn) + row(c, l),
  //                 nRep *  8 * wn +  8 * (w % wn) + col(c, l)),
  // so the mma for (mRep, nRep) accumulates into registers 4*(nRep +
  // numNReps*mRep) .. +3, in c0..c3 order.
  // Shapes: M and N powers of two, M >= 16, N >= 8 (smaller tiles do not fit
  // the instruction and are rejected: pad or use a blocked layout). When M <
  // 16*wm or N < 8*wn, the surplus warps replicate (zero warp bases): they
  // compute the same tile, and stores use only one of them.
  // numWarps must be wm * wn; both powers of two.
  static Layout mmaAccumulator(const Shape& shape, int numWarps, const std::vector<int64_t>& warpsPerCTA);

  // Accumulator of Hopper's wgmma.m64nNk16 on numWarps warps (a multiple of 4) whose warpgroups
  // split the tile [M, N] `groupsAlongN` ways along N and M / 64 ways along M (numWarps / 4 =
  // groupsAlongN * M / 64). Each warpgroup owns the m64 block of rows its M bits pick and the
  // contiguous columns [g_n * N / groupsAlongN, (g_n + 1) * N / groupsAlongN) of its N bits, and
  // holds them as the mma accumulator of one m64 x (N / groupsAlongN) tile: warps 16 rows each,
  // registers c0..c3 then N in steps of 8 (the wgmma fragment). Warp bases: 16 and 32 rows, then
  // the M groups (64, 128, ...), then the N groups. groupsAlongN = 1 is mmaAccumulator({M, N},
  // numWarps, {numWarps, 1}) base for base. A split along N lets a 64-row product use 8 warps (the
  // backward's dK and dV at D = 256: each warpgroup a half of the columns); its A operand
  // (dotOperand) is then replicated over the N groups. `replicas` > 1 leaves that many groups
  // computing the same tile (zero warp bases after the N groups): a product whose B cannot be cut
  // along N (numWarps / 4 = M / 64 * groupsAlongN * replicas).
  static Layout wgmmaAccumulator(const Shape& shape, int numWarps, int64_t groupsAlongN, int64_t replicas = 1);

  // Register layout of the A ([M, K], operandIndex 0) or B ([K, N], operandIndex
  // 1) fragments of the mma whose accumulator is `mmaParent` (a layout made by
  // mmaAccumulator, or one of the same structure).
  //   elementBits 16 (f16, bf16; m16n8k16): per instruction, A is a0..a7 and B
  //     is b0..b3 (two elements per 32-bit register, low half first):
  //       a_i = (g + 8*((i>>1)&1), 2t + (i&1) + 8*(i>>2))
  //       b_i = (2t + (i&1) + 8*(i>>1), g)        g = lane/4, t = lane%4
  //   elementBits 32 (tf32; m16n8k8): A is a0..a3, B is b0..b1:
  //       a_i = (g + 8*(i&1), t + 4*(i>>1))     b_i = (t + 4*i, g)
  // Registers: the instruction fragment first, then K repetitions (step 16,
  // or 8 for tf32), then the parent's M (A) or N (B) repetitions in the
  // parent's order. So for A, register = a + 8*(kRep + numKReps*mRep), and for
  // B, register = b + 4*(kRep + numKReps*nRep) (8 and 4 become 4 and 2 for
  // tf32). Warps: the parent's warp bases with the other operand's dimension
  // zeroed, so A is replicated across the wn warps that share its rows and B
  // across the wm warps that share its columns.
  // With 16-bit elements and wn == 1, the accumulator of [M, N] equals the A
  // operand of [M, K = N] base for base: a P = softmax(S) tile feeds P.V
  // straight from registers (after packing to 16 bits), no shuffle needed.
  // K must be a power of two >= the instruction's K. 8-bit types (m16n8k32)
  // are future work and rejected.
  static Layout dotOperand(const Layout& mmaParent, int operandIndex, int64_t K, int elementBits);

 private:
  Shape shape_;
  Bases reg_, lane_, warp_;
  // The bases as flat row-major indices, and each dimension's bit width when every dimension is a
  // power of two (else empty): apply() is the hottest query of codegen, run for every register of
  // every lane of the tiles it plans, and these keep it to XORs and shifts.
  std::vector<uint64_t> regFlat_, laneFlat_, warpFlat_;
  std::vector<int> dimBits_;
};

using LayoutPtr = std::shared_ptr<const Layout>;
inline LayoutPtr makeLayout(Layout l) { return std::make_shared<const Layout>(std::move(l)); }

}  // namespace flextile::ir
