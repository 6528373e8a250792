// Shared-memory layouts: where each element of a tile lives in a shared-memory
// buffer, and the ldmatrix plan that reads tensor-core operands from it.
//
// A SharedLayout stores a tile of power-of-two `shape` with `order` listing
// dimensions fastest first: order[0] is the contiguous dimension (a "row" is
// one line along it), the remaining dimensions, in order, number the rows.
// Within a row, elements are grouped in chunks of `vec` elements (16 bytes
// for the layouts forDotOperand chooses), and chunks are permuted by an XOR
// swizzle that depends on the row:
//
//     phase       = (row / perPhase) % maxPhase
//     chunk'      = (col / vec) XOR phase
//     offset      = row * rowLength + chunk' * vec + col % vec      (elements)
//
// maxPhase = 1 is the plain row-major layout.
//
// Panels (`panel` < the contiguous dimension's size): the contiguous
// dimension is cut into panels of `panel` elements; a panel holds its slice
// of every row, one after the other, and the panels follow each other:
//
//     offset      = (col / panel) * (rows * panel) + row * panel
//                   + (((col % panel) / vec) XOR phase) * vec + col % vec
//
// This is the layout Hopper's wgmma reads through a matrix descriptor
// (128-byte panels with the 128-byte swizzle; codegen/TensorCores.h). A
// panel equal to the whole row is the layout above. The swizzle is the one ldmatrix
// and cp.async want: the 8 rows an ldmatrix matrix reads (16 bytes each) land
// in 8 different 16-byte bank groups, while every 16-byte chunk stays
// contiguous for vector stores. All of it is linear over GF(2) in the bits of
// the offset, like Layout: offsetBases() gives the coordinate of each offset
// bit, and coordOf(offset) is the XOR of those of its set bits.
//
// Printed and parsed as
//     #ft.shared<[64, 32], order=[1,0], vec=8, perPhase=1, maxPhase=8, bytes=2>
// (with `, panel=64` before `>` when the rows are cut into panels).
// Pictures in docs/layouts.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/Layout.h"
#include "ir/Types.h"

namespace flextile::ir {

class SharedLayout {
 public:
  using Coord = Layout::Coord;

  // Throws flextile::Error when the parameters are malformed (see verify()).
  SharedLayout(Shape shape, std::vector<int> order, int64_t vec, int64_t perPhase, int64_t maxPhase,
               int64_t elemBytes, int64_t panel = 0);  // panel 0: the whole row

  // Unswizzled (vec = 1, perPhase = 1, maxPhase = 1) storage in `order`.
  static SharedLayout plain(const Shape& shape, const std::vector<int>& order, int64_t elemBytes);

  // Layout for staging the A ([M, K], operandIndex 0) or B ([K, N],
  // operandIndex 1) operand of an mma. `shape` is the operand's logical shape.
  // Not transposed means the natural row-major storage, dimension 1
  // contiguous (A: K contiguous, B: N contiguous); transposed means
  // dimension 0 contiguous (A stored as [K, M], B stored as [N, K]). A
  // operand whose contiguous dimension is not K is read with ldmatrix.trans.
  // The swizzle: 16-byte chunks (vec = 16 / elemBytes), and rows grouped so
  // that 8 consecutive rows cover 8 distinct 16-byte slots of a 128-byte bank
  // line: perPhase = max(1, 128 / rowBytes), maxPhase = min(8, rowBytes / 16).
  static SharedLayout forDotOperand(const Shape& shape, int64_t elemBytes, int operandIndex, bool transposed);

  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  const std::vector<int>& order() const { return order_; }
  int64_t vec() const { return vec_; }
  int64_t perPhase() const { return perPhase_; }
  int64_t maxPhase() const { return maxPhase_; }
  int64_t elemBytes() const { return elemBytes_; }
  int64_t numElements() const;
  int64_t sizeBytes() const { return numElements() * elemBytes_; }
  int64_t rowLength() const { return panel_; }  // elements per stored row: one panel of a tile row
  int64_t panel() const { return panel_; }
  int64_t numPanels() const { return shape_[order_[0]] / panel_; }
  int64_t rowsPerPanel() const { return numElements() / shape_[order_[0]]; }

  // Element offset of a tile coordinate and its inverse. Both throw
  // flextile::Error outside the tile / buffer.
  int64_t offsetOf(const Coord& coord) const;
  Coord coordOf(int64_t offset) const;

  // Coordinate of offset 2^i for each bit i of an offset (log2(numElements)
  // of them): the linear-layout view of this shared layout.
  std::vector<Coord> offsetBases() const;

  // Whether the ldmatrix operand of a dot layout (see ldmatrixAccesses) needs
  // .trans: the contiguous dimension is not the operand's K dimension.
  bool needsTransposedLdmatrix(int operandIndex) const;

  bool operator==(const SharedLayout& o) const;
  bool operator!=(const SharedLayout& o) const { return !(*this == o); }

  std::string str() const;  // "#ft.shared<...>"
  static SharedLayout parse(std::string_view text);

  // Empty when the rules hold: power-of-two shape and parameters, order a
  // permutation, the swizzle inside a row (maxPhase * vec <= rowLength when
  // maxPhase > 1), element size 1, 2, 4 or 8 bytes.
  std::string verify() const;

 private:
  int64_t rowOf(const Coord& coord) const;
  Shape shape_;
  std::vector<int> order_;
  int64_t vec_, perPhase_, maxPhase_, elemBytes_, panel_;
};

// ---------------------------------------------------------------------------
// Bank conflicts, for tests and for choosing swizzles. Shared memory has 32
// banks of 4 bytes. An access of `accessBytes` (4, 8 or 16) per lane is served
// in phases of 128 / accessBytes lanes (a warp's 16-byte accesses in 4 phases
// of 8 lanes, ldmatrix's 8 row addresses of a matrix in one phase); a phase
// takes as many wavefronts as the largest number of distinct 4-byte words that
// fall in one bank. Returns the total number of extra wavefronts (0 when
// conflict-free). `byteAddresses` holds one address per lane (in lane order,
// any multiple of the phase size); addresses must be aligned to accessBytes.
int64_t sharedBankConflicts(const std::vector<int64_t>& byteAddresses, int accessBytes);

// ---------------------------------------------------------------------------
// ldmatrix plan: how one warp fills the registers of a 16-bit dot-operand
// layout (Layout::dotOperand) from a tile stored with a SharedLayout.
//
// ldmatrix.x{1,2,4}[.trans].b16 loads 1, 2 or 4 matrices of 8x8 16-bit
// elements; lane i supplies the address of row i%8 of matrix i/8 (16
// contiguous bytes). Without .trans, lane l receives elements (row l/4,
// columns 2*(l%4), 2*(l%4)+1) of each matrix, one 32-bit destination register
// per matrix; with .trans it receives (rows 2*(l%4), 2*(l%4)+1, column l/4).
//
// Each access covers registers whose index differs only in bits 0..2 of the
// dot layout (bit 0 is the pair within a 32-bit register, bits 1-2 choose the
// matrix), i.e. one A fragment (a0..a7) or two B fragments: matrix j of
// access q fills layout registers registers[2j] (low half) and
// registers[2j+1] (high half).
struct LdmatrixAccess {
  int numMatrices = 4;  // 1, 2 or 4: the .x suffix
  bool trans = false;
  std::vector<int64_t> laneRowOffset;  // 32 element offsets; lanes >= 8*numMatrices repeat lane % (8*numMatrices)
  std::vector<int64_t> registers;      // 2 * numMatrices dot-layout register indices
};

// All accesses of warp `warp`, covering every register of `dotLayout` once.
// Throws flextile::Error when the layouts do not fit ldmatrix: the dot layout
// is not a 16-bit mma operand layout (register bit 0 and the lanes must form
// 8x8 matrices), or a matrix row is not 16 contiguous bytes in `smem` (for
// example vec < 8 with a swizzle, or 4-byte elements).
std::vector<LdmatrixAccess> ldmatrixAccesses(const Layout& dotLayout, const SharedLayout& smem, int warp);

}  // namespace flextile::ir
