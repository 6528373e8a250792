#include "dsl/Tile.h"

#include <filesystem>

#include "dsl/Ops.h"

namespace flextile::dsl {

namespace {
thread_local TraceContext* gCurrent = nullptr;

ir::Location toLocation(const SourceLoc& loc) {
  return ir::Location{std::filesystem::path(loc.file_name()).filename().string(), int(loc.line())};
}
}  // namespace

void traceError(const SourceLoc& loc, const std::string& op, const std::string& message) {
  throw Error(std::filesystem::path(loc.file_name()).filename().string() + ":" + std::to_string(loc.line()) +
              ": error: " + op + ": " + message);
}

TraceContext::TraceContext(ir::Function& f) : function_(&f), builder_(f), previous_(gCurrent) {
  if (gCurrent) throw Error("tracing: a kernel trace started inside another trace on the same thread");
  gCurrent = this;
}

TraceContext::~TraceContext() { gCurrent = previous_; }

bool TraceContext::active() { return gCurrent != nullptr; }

TraceContext& TraceContext::current(const SourceLoc& loc, const char* op) {
  if (!gCurrent) traceError(loc, op, "used outside a kernel trace (tiles exist only while a kernel is traced)");
  return *gCurrent;
}

ir::Builder& TraceContext::at(const SourceLoc& loc) {
  builder_.setLoc(toLocation(loc));
  return builder_;
}

const ir::Type& Tile::type() const {
  if (!value_) throw Error("tracing: use of an empty Tile (default-constructed, never assigned)");
  return value_->type();
}

namespace {
int normalizeAxis(int axis, int rank, const SourceLoc& loc, const char* op, int extra = 0) {
  int n = rank + extra;
  int a = axis < 0 ? axis + n : axis;
  if (a < 0 || a >= n)
    traceError(loc, op, "axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  return a;
}
}  // namespace

Tile Tile::expand(int axis, SourceLoc loc) const {
  auto& b = TraceContext::current(loc, "expand").at(loc);
  if (isScalar()) traceError(loc, "expand", "cannot expand a scalar; use broadcast_to or full");
  int a = normalizeAxis(axis, rank(), loc, "expand", 1);
  return Tile(b.expandDims(value_, a));
}


Tile Tile::reshape(const Shape& shape, SourceLoc loc) const {
  auto& b = TraceContext::current(loc, "reshape").at(loc);
  if (ir::numElements(shape) != type().numElements() || isScalar())
    traceError(loc, "reshape", "cannot reshape " + type().str() + " to " + ir::shapeString(shape) +
                                   " (element counts differ)");
  for (auto d : shape)
    if (d <= 0 || (d & (d - 1)))
      traceError(loc, "reshape", "tile dimensions must be powers of two, got " + ir::shapeString(shape));
  return Tile(b.reshape(value_, shape));
}

Tile Tile::trans(SourceLoc loc) const {
  if (rank() != 2) traceError(loc, "trans", "expects a rank-2 tile, got " + type().str());
  return permute({1, 0}, loc);
}

Tile Tile::permute(const std::vector<int64_t>& perm, SourceLoc loc) const {
  auto& b = TraceContext::current(loc, "permute").at(loc);
  std::vector<bool> seen(size_t(rank()), false);
  bool ok = int(perm.size()) == rank();
  for (auto p : perm) {
    if (!ok || p < 0 || p >= rank() || seen[size_t(p)]) {
      ok = false;
      break;
    }
    seen[size_t(p)] = true;
  }
  if (!ok) traceError(loc, "permute", "permutation " + ir::shapeString(perm) + " is invalid for " + type().str());
  return Tile(b.trans(value_, perm));
}

Tile Tile::to(DType dtype, SourceLoc loc) const { return cast(*this, dtype, loc); }

}  // namespace flextile::dsl
