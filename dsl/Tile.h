// The embedded tile language: tile handles and the tracing context.
//
// A kernel is an ordinary C++ callable over tiles. Calling it with tracing
// handles (not data) records every operation into a tile IR function: C++
// control flow, loops and constants run at trace time (they are the macro
// language); run-time loops are explicit (`for_range`). Mistakes in shapes or
// dtypes are reported while tracing, naming the operation, the operands and the
// user's source line.
#pragma once

#include <memory>
#include <source_location>
#include <string>
#include <variant>

#include "ir/Builder.h"
#include "ir/IR.h"

namespace flextile::dsl {

using ir::DType;
using ir::Shape;
using SourceLoc = std::source_location;

// Element type tags, usable as template arguments (Ptr<f16>) and as values
// (x.to(f32)).
struct f32 { static constexpr DType dtype = DType::F32; };
struct f16 { static constexpr DType dtype = DType::F16; };
struct bf16 { static constexpr DType dtype = DType::BF16; };
struct f64 { static constexpr DType dtype = DType::F64; };
struct i32 { static constexpr DType dtype = DType::I32; };
struct i64 { static constexpr DType dtype = DType::I64; };
struct i8 { static constexpr DType dtype = DType::I8; };
struct i1 { static constexpr DType dtype = DType::I1; };

// A trace-time error at the user's source line.
[[noreturn]] void traceError(const SourceLoc& loc, const std::string& op, const std::string& message);

// A traced value: a scalar (rank 0, uniform per program) or a tile.
class Tile {
 public:
  Tile() = default;
  explicit Tile(ir::Value* v) : value_(v) {}

  ir::Value* value() const { return value_; }
  bool valid() const { return value_ != nullptr; }
  const ir::Type& type() const;
  DType dtype() const { return type().dtype(); }
  const Shape& shape() const { return type().shape(); }
  int rank() const { return type().rank(); }
  bool isScalar() const { return type().isScalar(); }
  bool isPointer() const { return type().isPointer(); }

  // Inserts a size-1 dimension at `axis` (negative counts from the end).
  Tile expand(int axis, SourceLoc loc = SourceLoc::current()) const;
  // Repeats size-1 dimensions (and prepends missing ones) up to `shape`.
  Tile broadcast_to(const Shape& shape, SourceLoc loc = SourceLoc::current()) const;
  // Row-major reinterpretation with the same number of elements.
  Tile reshape(const Shape& shape, SourceLoc loc = SourceLoc::current()) const;
  // Reverses the two dimensions of a rank-2 tile (or applies `perm`).
  Tile trans(SourceLoc loc = SourceLoc::current()) const;
  Tile permute(const std::vector<int64_t>& perm, SourceLoc loc = SourceLoc::current()) const;
  // Value conversion to another element type.
  Tile to(DType dtype, SourceLoc loc = SourceLoc::current()) const;
  template <class T>
  Tile to(T, SourceLoc loc = SourceLoc::current()) const { return to(T::dtype, loc); }

 private:
  ir::Value* value_ = nullptr;
};

// A compile-time constant parameter of a kernel (BLOCK sizes and the like):
// a plain C++ value while tracing, so it folds into the IR and is part of the
// kernel's identity.
template <class T>
struct Const {
  T value;
  operator T() const { return value; }
};

// An operand of a DSL operation: a tile, or a C++ number that adopts the
// other operand's dtype (like a Python literal in Triton). It records where in
// the user's source the operation was written.
struct Operand {
  std::variant<Tile, int64_t, double> v;
  SourceLoc loc;

  Operand(const Tile& t, SourceLoc l = SourceLoc::current()) : v(t), loc(l) {}
  Operand(int x, SourceLoc l = SourceLoc::current()) : v(int64_t(x)), loc(l) {}
  Operand(long x, SourceLoc l = SourceLoc::current()) : v(int64_t(x)), loc(l) {}
  Operand(long long x, SourceLoc l = SourceLoc::current()) : v(int64_t(x)), loc(l) {}
  Operand(unsigned x, SourceLoc l = SourceLoc::current()) : v(int64_t(x)), loc(l) {}
  Operand(double x, SourceLoc l = SourceLoc::current()) : v(x), loc(l) {}
  Operand(float x, SourceLoc l = SourceLoc::current()) : v(double(x)), loc(l) {}
  template <class T>
  Operand(Const<T> c, SourceLoc l = SourceLoc::current()) : Operand(c.value, l) {}

  bool isTile() const { return std::holds_alternative<Tile>(v); }
  const Tile& tile() const { return std::get<Tile>(v); }
};

class CaptureSlot;  // dsl/Capture.h

// The kernel parameters of one captured tensor in the current trace (see
// dsl/Capture.h): its data pointer, then its sizes and strides (i32 each).
struct CaptureParams {
  std::shared_ptr<CaptureSlot> slot;
  ir::Value* data = nullptr;
  std::vector<ir::Value*> sizes, strides;
};

// The function being traced on this thread. Tracing is re-entrant per thread
// (a trace may not start inside another one) and independent across threads.
class TraceContext {
 public:
  explicit TraceContext(ir::Function& f);
  ~TraceContext();
  TraceContext(const TraceContext&) = delete;
  TraceContext& operator=(const TraceContext&) = delete;

  static TraceContext& current(const SourceLoc& loc, const char* op);
  static bool active();
  ir::Builder& builder() { return builder_; }
  ir::Function& function() { return *function_; }
  // Sets the builder's location to the user's source line for the next ops.
  ir::Builder& at(const SourceLoc& loc);
  // Tensors captured by mods during this trace, in order of first use; their
  // parameters follow the kernel's own.
  std::vector<CaptureParams>& captures() { return captures_; }

 private:
  ir::Function* function_;
  ir::Builder builder_;
  TraceContext* previous_;
  std::vector<CaptureParams> captures_;
};

}  // namespace flextile::dsl
