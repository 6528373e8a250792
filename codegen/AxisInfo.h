// Axis analysis: what codegen may assume about the *values* of integer and
// pointer tiles, per dimension, so that loads and stores become vector
// accesses and masks can be evaluated once per vector.
//
// For a value of shape [s0, ..., sk] and each dimension d, cut dimension d
// into aligned groups of G consecutive positions (positions 0..G-1, G..2G-1,
// ...; G a power of two). Then:
//
//   contiguity[d]   = the largest G such that, along d, each group holds
//                     x, x+1, ..., x+G-1 (pointers: consecutive *elements*).
//   constancy[d]    = the largest G such that each group along d holds one
//                     value repeated.
//   divisibility[d] = the largest power of two dividing the first element of
//                     every contiguity group along d (when contiguity[d] is 1:
//                     every element). For pointers it counts bytes, i.e. it
//                     is the address alignment.
//
// All three are powers of two; contiguity and constancy never exceed the
// dimension. A scalar (rank 0) is described by one entry (as if its shape
// were [1]). The facts are conservative: 1 always holds.
//
// Example: `offs = pid * 128 + arange(0, 128)` has contiguity 128 and
// divisibility 128 (the run starts at a multiple of 128); `offs < n` with n
// known divisible by 16 has constancy 16: 16 neighbours share one mask bit.
//
// Function parameters: the function attribute "arg_divisibility" (one int per
// parameter, see codegen/Compiler.h) gives the byte alignment of pointers and
// a divisor of integers; without it pointers are assumed 16-byte aligned and
// integers divisible by 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/IR.h"

namespace flextile::codegen {

struct AxisInfo {
  // The largest divisibility the analysis tracks (the divisibility of 0).
  static constexpr int64_t kMaxDivisibility = int64_t(1) << 30;

  std::vector<int64_t> contiguity, divisibility, constancy;  // one entry per dim (one for scalars)
  // The value of every element, when it is one known integer.
  std::optional<int64_t> constantValue;

  int rank() const { return int(contiguity.size()); }
  // The pessimistic fact for a value of this shape: 1 everywhere.
  static AxisInfo unknown(const ir::Shape& shape);
  // Every element equals `value` (an integer).
  static AxisInfo constant(const ir::Shape& shape, int64_t value);
  // A power of two dividing every element (not just run starts).
  int64_t elementDivisibility() const;

  bool operator==(const AxisInfo&) const = default;
  std::string str() const;  // "{contiguity=[..], divisibility=[..], constancy=[..]}"
};

// The largest power of two dividing v (kMaxDivisibility for 0).
int64_t highestPowerOf2Divisor(int64_t v);

class AxisInfoAnalysis {
 public:
  explicit AxisInfoAnalysis(const ir::Function& f);

  // Facts for any value of the function (scalars included). Float values get
  // the pessimistic contiguity/divisibility but keep their constancy.
  const AxisInfo& get(const ir::Value* v) const;
  const ir::Function& function() const { return *func_; }

 private:
  void visitBlock(const ir::Block& b);
  void visitOp(const ir::Op& op);
  void visitFor(const ir::Op& op);
  void set(const ir::Value* v, AxisInfo info);

  const ir::Function* func_;
  std::unordered_map<const ir::Value*, AxisInfo> info_;
};

// The dimension along which a pointer tile is most contiguous (ties go to
// the later dimension; the last dimension when nothing is contiguous).
int fastestDim(const ir::Value* ptr, const AxisInfoAnalysis& analysis);

// How many elements one thread may move with one vector instruction along
// `dim` (default: fastestDim) when accessing `ptr`, as far as the *values* of
// the pointers and mask allow: the minimum of the pointer's contiguity, its
// alignment in elements, 16 bytes / element size and, when a mask is given,
// the mask's constancy. Always a power of two >= 1. The layout further limits
// it: see memoryAccessWidth.
int64_t vectorWidth(const ir::Value* ptr, const AxisInfoAnalysis& analysis, const ir::Value* mask = nullptr,
                    int dim = -1);

// For a load or store *after layout assignment*: the dimension and width of
// the vector accesses the lowering should emit, i.e. vectorWidth along the
// layout's fastest register dimension, capped by the layout's contiguous
// registers along it (Layout::contiguousRegisters). Width 1 means scalar
// accesses. The lowering and the tests both use this.
struct AccessWidth {
  int dim = 0;
  int64_t width = 1;
};
AccessWidth memoryAccessWidth(const ir::Op& loadOrStore, const AxisInfoAnalysis& analysis);

}  // namespace flextile::codegen
