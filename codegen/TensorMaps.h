// The tensor maps of a kernel's TMA copies: what the host must encode (with the driver's
// cuTensorMapEncodeTiled, runtime/TensorMap.h) and pass after the kernel's own parameters.
//
// A tma_copy (ir/Ops.def) names its tensor by SSA operands: the base pointer, the dims and the
// element strides. Each must be a kernel parameter or a constant, so the launcher can read its
// value from the arguments; the box comes from the copy's slot (one panel of its shared layout
// per copy instruction) and the swizzle from that layout. Copies that describe the same tensor,
// box and swizzle share one map. A bulk_tensor atomic_add (codegen/passes/BulkReduce.cpp) names
// its tensor the same way and gets a map for its reductions. Kernel ABI (codegen/Compiler.h): after the IR function's
// parameters, one `.param .align 64 .b8 [128]` per recipe, in the order tensorMapRecipes lists them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/IR.h"

namespace flextile::codegen {

// A value the launcher knows: kernel parameter `param` (>= 0), or the constant `constant`.
struct TensorMapOperand {
  int param = -1;
  int64_t constant = 0;
  bool operator==(const TensorMapOperand&) const = default;
};

struct TensorMapRecipe {
  int baseParam = 0;                      // the pointer parameter: element [0, ..., 0]
  ir::DType dtype = ir::DType::BF16;
  std::vector<TensorMapOperand> dims;     // outermost first (rank R)
  std::vector<TensorMapOperand> strides;  // in elements, of dims 0 .. R-2 (the last is contiguous)
  std::vector<int64_t> box;               // outermost first; the innermost is one panel of the slot
  int swizzleBytes = 0;                   // 0 (none), 32, 64 or 128
  bool operator==(const TensorMapRecipe&) const = default;
  std::string str() const;                // "bf16 base %2 dims [%3, 128] strides [%5] box [64, 64] swizzle 128"
};

// How one tma_copy is issued: the map it reads and the panels of its slot (one copy each).
struct TmaCopyPlan {
  size_t map = 0;           // index into the kernel's recipes
  int64_t panel = 0;        // elements of the contiguous dimension per copy
  int64_t numPanels = 1;
  int64_t panelBytes = 0;   // bytes of the slot between panels
  int64_t alignment = 16;   // the slot's shared address must be a multiple of it (1024 with a swizzle)
};

// The operand as the launcher reads it: a kernel parameter or an integer constant; nullopt for a
// value the program computes (the host could not encode a tensor map from it).
std::optional<TensorMapOperand> launcherOperand(const ir::Value* v, const ir::Function& f);

// Why TMA cannot write a slot of this layout, shape and dtype ("" when it can): row-major, and
// unswizzled or swizzled the way TMA swizzles a 32-, 64- or 128-byte span (16-byte chunks, the
// span's phase), rows of at most 256 elements that are multiples of 16 bytes.
std::string tmaSlotRefusal(const ir::SharedLayout& layout, const ir::Shape& shape, ir::DType dtype);

// Where a TMA destination of this layout may start in shared memory: a multiple of 1024 bytes when
// swizzled (the swizzle is a function of the absolute address, its pattern 1024 bytes long), of
// kTmaPlainAlignment (128) when not. A ring's slots must each be a multiple of it.
int64_t tmaSlotAlignment(const ir::SharedLayout& layout);

// Every distinct recipe of `f`'s tma_copy ops and bulk_tensor atomic_adds, in program order.
// Throws Error (naming the op) when a copy's tensor operands are not parameters or constants, or
// its slot layout is not one TMA writes.
std::vector<TensorMapRecipe> tensorMapRecipes(const ir::Function& f);
// The plan of one tma_copy of `f`, given `recipes` = tensorMapRecipes(f); or of one bulk_tensor
// atomic_add (its staged tile, bulkTensorStaging, read panel by panel).
TmaCopyPlan tmaCopyPlan(const ir::Op& tmaCopy, const ir::Function& f, const std::vector<TensorMapRecipe>& recipes);

// The text form of a kernel's recipes, one per line (the compile cache stores it), and back.
std::string tensorMapRecipesText(const std::vector<TensorMapRecipe>& recipes);
std::vector<TensorMapRecipe> parseTensorMapRecipesText(const std::string& text);

}  // namespace flextile::codegen
