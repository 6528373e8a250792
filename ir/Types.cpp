#include "ir/Types.h"

#include <cstdint>
#include <sstream>

#include "ir/Layout.h"
#include "ir/SharedLayout.h"

namespace flextile::ir {

namespace {
struct DTypeRow {
  DType t;
  std::string_view name;
  int bits;
};
constexpr DTypeRow kDTypes[] = {
    {DType::I1, "i1", 1},     {DType::I8, "i8", 8},      {DType::I32, "i32", 32},
    {DType::I64, "i64", 64},  {DType::F16, "f16", 16},   {DType::BF16, "bf16", 16},
    {DType::F32, "f32", 32},  {DType::F64, "f64", 64},   {DType::Ptr, "ptr", 64},
};
}  // namespace

std::string_view dtypeName(DType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r.name;
  return "?";
}

std::optional<DType> parseDType(std::string_view s) {
  for (const auto& r : kDTypes)
    if (r.name == s) return r.t;
  return std::nullopt;
}

bool isFloat(DType t) { return t == DType::F16 || t == DType::BF16 || t == DType::F32 || t == DType::F64; }
bool isInteger(DType t) { return t == DType::I1 || t == DType::I8 || t == DType::I32 || t == DType::I64; }

int bitWidth(DType t) {
  for (const auto& r : kDTypes)
    if (r.t == t) return r.bits;
  return 0;
}

int byteWidth(DType t) { return t == DType::I1 ? 1 : bitWidth(t) / 8; }

std::string shapeString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Saturates at INT64_MAX rather than overflow: the verifier checks the element count of shapes
// parsed from untrusted text (f32[4611686018427387904,4]) before anything has refused them.
int64_t numElements(const Shape& s) {
  int64_t n = 1;
  for (auto d : s)
    if (__builtin_mul_overflow(n, d, &n)) return INT64_MAX;
  return n;
}

Type Type::pointer(DType pointee, Shape shape) {
  Type t(DType::Ptr, std::move(shape));
  t.pointee_ = pointee;
  return t;
}

Type Type::sharedBuffer(DType element, int64_t slots, std::shared_ptr<const SharedLayout> layout) {
  Type t(element, layout ? layout->shape() : Shape{});
  t.sharedLayout_ = std::move(layout);
  t.slots_ = slots;
  return t;
}

Type Type::withShape(Shape s) const {
  Type t = *this;
  t.shape_ = std::move(s);
  t.layout_.reset();
  t.sharedLayout_.reset();
  t.slots_ = 0;
  return t;
}

Type Type::withDType(DType d) const {
  Type t(d, shape_);
  return t;
}

Type Type::withLayout(std::shared_ptr<const Layout> l) const {
  Type t = *this;
  t.layout_ = std::move(l);
  return t;
}

Type Type::scalarType() const { return withShape({}); }

std::string Type::str() const {
  if (sharedLayout_) {
    std::string out = "smem<" + std::to_string(slots_) + " x " + std::string(dtypeName(dtype_)) + "[";
    for (size_t i = 0; i < shape_.size(); ++i) out += (i ? "," : "") + std::to_string(shape_[i]);
    return out + "], " + sharedLayout_->str() + ">";
  }
  std::string out = isPointer() ? "ptr<" + std::string(dtypeName(pointee_)) + ">" : std::string(dtypeName(dtype_));
  if (!shape_.empty()) {
    out += "[";
    for (size_t i = 0; i < shape_.size(); ++i) out += (i ? "," : "") + std::to_string(shape_[i]);
    out += "]";
  }
  return out;
}

bool Type::sameShapeAndElement(const Type& o) const {
  return dtype_ == o.dtype_ && (!isPointer() || pointee_ == o.pointee_) && shape_ == o.shape_ &&
         isSharedBuffer() == o.isSharedBuffer();
}

bool Type::operator==(const Type& o) const {
  if (!sameShapeAndElement(o)) return false;
  if (isSharedBuffer() && (slots_ != o.slots_ || !(*sharedLayout_ == *o.sharedLayout_))) return false;
  if (!layout_ || !o.layout_) return layout_ == o.layout_;
  return *layout_ == *o.layout_;
}

}  // namespace flextile::ir
