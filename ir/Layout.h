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
//   * mma, dot-operand and shared layouts are further constructors (issue 3).
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

 private:
  Shape shape_;
  Bases reg_, lane_, warp_;
};

using LayoutPtr = std::shared_ptr<const Layout>;
inline LayoutPtr makeLayout(Layout l) { return std::make_shared<const Layout>(std::move(l)); }

}  // namespace flextile::ir
