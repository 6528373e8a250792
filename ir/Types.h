// Tile IR types: an element dtype (or a pointer to one), a static shape, and
// after layout assignment a layout attribute.
//
// A value of rank 0 is a *scalar*: one value per program instance, uniform
// across its threads (program ids, kernel parameters, loop bounds). A value of
// rank >= 1 is a *tile*: a block of elements distributed over the program's
// threads. Tile dimensions are powers of two (as in Triton); that is what lets
// layouts be linear maps over bits (see Layout.h).
//
// A value of a *shared buffer* type (the memory/async level, below the tile
// level: only passes after layout assignment create them) is neither: it is a
// ring of `slots` tiles of `shape` in the program's shared memory, stored in a
// SharedLayout, written by async_copy and read by local_load (ir/Ops.def).
// Printed `smem<3 x bf16[64,64], #ft.shared<...>>`.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flextile::ir {

class Layout;
class SharedLayout;

enum class DType : uint8_t { I1, I8, I32, I64, F16, BF16, F32, F64, Ptr };

std::string_view dtypeName(DType t);
std::optional<DType> parseDType(std::string_view s);
bool isFloat(DType t);
bool isInteger(DType t);  // I1 counts as integer (a bool)
int bitWidth(DType t);    // Ptr is 64
int byteWidth(DType t);   // I1 is stored as one byte in memory

using Shape = std::vector<int64_t>;
std::string shapeString(const Shape& s);  // "[64, 32]"; "[]" for scalars
int64_t numElements(const Shape& s);

class Type {
 public:
  Type() = default;
  Type(DType dtype, Shape shape = {}) : dtype_(dtype), shape_(std::move(shape)) {}
  static Type pointer(DType pointee, Shape shape = {});
  // A ring of `slots` tiles of `element`[layout.shape()] stored in `layout`.
  static Type sharedBuffer(DType element, int64_t slots, std::shared_ptr<const SharedLayout> layout);

  DType dtype() const { return dtype_; }
  DType pointee() const { return pointee_; }  // meaningful only when isPointer()
  bool isPointer() const { return dtype_ == DType::Ptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return int(shape_.size()); }
  bool isScalar() const { return shape_.empty() && !sharedLayout_; }
  bool isTile() const { return !shape_.empty() && !sharedLayout_; }
  // A shared buffer: shape() is one slot's tile shape, dtype() its element.
  bool isSharedBuffer() const { return sharedLayout_ != nullptr; }
  int64_t slots() const { return slots_; }  // meaningful only when isSharedBuffer()
  const std::shared_ptr<const SharedLayout>& sharedLayout() const { return sharedLayout_; }
  int64_t numElements() const { return ir::numElements(shape_); }

  const std::shared_ptr<const Layout>& layout() const { return layout_; }
  bool hasLayout() const { return layout_ != nullptr; }

  Type withShape(Shape s) const;      // drops the layout
  Type withDType(DType d) const;      // keeps shape, drops layout, clears pointee
  Type withLayout(std::shared_ptr<const Layout> l) const;
  Type scalarType() const;            // same element, rank 0
  Type elementType() const { return scalarType(); }

  // "f32", "ptr<f16>", "i32[64, 32]", with a layout alias appended by the printer;
  // a shared buffer prints whole, its SharedLayout inline.
  std::string str() const;

  bool operator==(const Type& o) const;
  bool operator!=(const Type& o) const { return !(*this == o); }
  bool sameShapeAndElement(const Type& o) const;

 private:
  DType dtype_ = DType::F32;
  DType pointee_ = DType::F32;
  Shape shape_;
  std::shared_ptr<const Layout> layout_;
  std::shared_ptr<const SharedLayout> sharedLayout_;
  int64_t slots_ = 0;
};

}  // namespace flextile::ir
