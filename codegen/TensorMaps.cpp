#include "codegen/TensorMaps.h"

#include "codegen/SharedMemory.h"

#include <algorithm>
#include <sstream>

#include "ir/SharedLayout.h"

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {

TensorMapOperand launcherValue(const Op& copy, const ir::Function& f, size_t operand, const std::string& what) {
  if (const std::optional<TensorMapOperand> known = launcherOperand(copy.operand(operand), f)) return *known;
  throw Error(copy.describe() + ": " + what + " (operand " + std::to_string(operand) +
                      ") must be a kernel parameter or an integer constant: the host encodes the tensor map from it "
                      "before the launch",
                  ErrorKind::InvalidArgument);
}

struct SlotGeometry {
  std::vector<int64_t> box;
  int swizzle = 0;
  int64_t panel = 0, numPanels = 1, panelBytes = 0;
};

}  // namespace

std::optional<TensorMapOperand> launcherOperand(const ir::Value* v, const ir::Function& f) {
  const auto& params = f.params();
  if (auto it = std::find(params.begin(), params.end(), v); it != params.end())
    return TensorMapOperand{int(it - params.begin()), 0};
  const Op* d = v->definingOp();
  if (d && d->kind() == OpKind::Constant && std::holds_alternative<int64_t>(d->attrs().at("value")))
    return TensorMapOperand{-1, std::get<int64_t>(d->attrs().at("value"))};
  return std::nullopt;
}

// TMA writes each box row by row, 16-byte chunks permuted by the swizzle of its span: a
// SharedLayout with row-major order, 16-byte chunks and the span's phase (codegen/TensorCores.h
// wgmmaSharedLayout has the same three cases).
std::string tmaSlotRefusal(const ir::SharedLayout& l, const ir::Shape& shape, ir::DType dtype) {
  const int64_t eb = ir::byteWidth(dtype);
  const size_t r = shape.size();
  for (size_t k = 0; k < r; ++k)
    if (l.order()[k] != int(r - 1 - k)) return "its order must be row-major (the last dimension contiguous)";
  const int64_t spanBytes = l.panel() * eb;
  if (l.maxPhase() != 1) {
    if (l.vec() * eb != 16) return "a swizzled layout must permute 16-byte chunks";
    if (spanBytes != 32 && spanBytes != 64 && spanBytes != 128) return "swizzled panels must be 32, 64 or 128 bytes";
    if (l.maxPhase() != spanBytes / 16 || l.perPhase() != 128 / spanBytes)
      return "the swizzle of a " + std::to_string(spanBytes) + "-byte panel must have maxPhase " +
             std::to_string(spanBytes / 16) + " and perPhase " + std::to_string(128 / spanBytes);
  }
  if (spanBytes % 16 != 0) return "a box row must be a multiple of 16 bytes";
  if (l.panel() > 256) return "a box row holds at most 256 elements";
  for (size_t k = 0; k + 1 < r; ++k)
    if (shape[k] > 256) return "a box dimension holds at most 256 elements";
  return "";
}

int64_t tmaSlotAlignment(const ir::SharedLayout& layout) { return layout.maxPhase() != 1 ? 1024 : kTmaPlainAlignment; }

namespace {

// The boxes of a tile of `shape` in shared layout `l`, in a tensor of rank `rank`: a tma_copy's slot
// or a bulk_tensor atomic_add's staging.
SlotGeometry slotGeometry(const Op& op, const ir::SharedLayout& l, const ir::Shape& shape, ir::DType dtype,
                          size_t rank) {
  const int64_t eb = ir::byteWidth(dtype);
  const size_t r = shape.size();
  if (const std::string why = tmaSlotRefusal(l, shape, dtype); !why.empty())
    throw Error(op.describe() +
                    (op.kind() == OpKind::TmaCopy ? ": TMA cannot write the slot layout "
                                                  : ": TMA cannot read the staging layout ") +
                    l.str() + ": " + why,
                ErrorKind::InvalidArgument);
  SlotGeometry g;
  g.panel = l.panel();
  const int64_t spanBytes = g.panel * eb;
  g.swizzle = l.maxPhase() == 1 ? 0 : int(spanBytes);
  g.numPanels = l.numPanels();
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < r; ++k) rows *= shape[k];
  g.panelBytes = rows * spanBytes;
  g.box.assign(rank - r, 1);
  for (size_t k = 0; k + 1 < r; ++k) g.box.push_back(shape[k]);
  g.box.push_back(g.panel);
  return g;
}

SlotGeometry geometryOf(const Op& op, size_t rank) {
  if (op.kind() == OpKind::TmaCopy) {
    const ir::Type& buf = op.operand(0)->type();
    return slotGeometry(op, *buf.sharedLayout(), buf.shape(), buf.dtype(), rank);
  }
  const ir::Type& tile = op.operand(1)->type();
  return slotGeometry(op, bulkTensorStaging(op), tile.shape(), tile.dtype(), rank);
}

// A tma_copy's recipe, or a bulk_tensor atomic_add's: the box operands start at `base`'s index.
TensorMapRecipe recipeOf(const Op& op, const ir::Function& f) {
  const bool copy = op.kind() == OpKind::TmaCopy;
  const size_t first = copy ? 5 : 3, rank = (op.numOperands() - first) / 3;
  TensorMapRecipe rec;
  rec.baseParam = launcherValue(op, f, first, "the tensor's base").param;
  if (rec.baseParam < 0)
    throw Error(op.describe() + ": the tensor's base must be a pointer parameter of the kernel",
                ErrorKind::InvalidArgument);
  rec.dtype = copy ? op.operand(0)->type().dtype() : op.operand(1)->type().dtype();
  for (size_t k = 0; k < rank; ++k) rec.dims.push_back(launcherValue(op, f, first + 1 + k, "dim " + std::to_string(k)));
  for (size_t k = 0; k + 1 < rank; ++k)
    rec.strides.push_back(launcherValue(op, f, first + 1 + rank + k, "the stride of dim " + std::to_string(k)));
  const SlotGeometry g = geometryOf(op, rank);
  rec.box = g.box;
  rec.swizzleBytes = g.swizzle;
  return rec;
}

bool usesTensorMap(const Op& op) {
  return op.kind() == OpKind::TmaCopy || (op.kind() == OpKind::AtomicAdd && addsTensorInBulk(op));
}

std::string operandText(const TensorMapOperand& o) {
  return o.param >= 0 ? "%" + std::to_string(o.param) : std::to_string(o.constant);
}

}  // namespace

std::string TensorMapRecipe::str() const {
  std::ostringstream s;
  auto list = [&](const auto& xs, auto text) {
    s << "[";
    for (size_t i = 0; i < xs.size(); ++i) s << (i ? ", " : "") << text(xs[i]);
    s << "]";
  };
  s << ir::dtypeName(dtype) << " base %" << baseParam << " dims ";
  list(dims, operandText);
  s << " strides ";
  list(strides, operandText);
  s << " box ";
  list(box, [](int64_t v) { return std::to_string(v); });
  s << " swizzle " << swizzleBytes;
  return s.str();
}

std::vector<TensorMapRecipe> tensorMapRecipes(const ir::Function& f) {
  std::vector<TensorMapRecipe> out;
  f.walk([&](const Op& op) {
    if (!usesTensorMap(op)) return;
    TensorMapRecipe r = recipeOf(op, f);
    if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(std::move(r));
  });
  return out;
}

TmaCopyPlan tmaCopyPlan(const Op& copy, const ir::Function& f, const std::vector<TensorMapRecipe>& recipes) {
  const TensorMapRecipe r = recipeOf(copy, f);
  auto it = std::find(recipes.begin(), recipes.end(), r);
  if (it == recipes.end()) throw Error(copy.describe() + ": no tensor map was planned for it", ErrorKind::Internal);
  const SlotGeometry g = geometryOf(copy, r.dims.size());
  const ir::SharedLayout staged =
      copy.kind() == OpKind::TmaCopy ? *copy.operand(0)->type().sharedLayout() : bulkTensorStaging(copy);
  return {size_t(it - recipes.begin()), g.panel, g.numPanels, g.panelBytes, tmaSlotAlignment(staged)};
}

// One recipe per line: dtype base R dims... strides... box... swizzle, operands as p<N> or c<N>.
std::string tensorMapRecipesText(const std::vector<TensorMapRecipe>& recipes) {
  std::ostringstream s;
  auto put = [&](const TensorMapOperand& o) { s << ' ' << (o.param >= 0 ? 'p' : 'c') << (o.param >= 0 ? o.param : o.constant); };
  for (const TensorMapRecipe& r : recipes) {
    s << ir::dtypeName(r.dtype) << ' ' << r.baseParam << ' ' << r.dims.size();
    for (const auto& d : r.dims) put(d);
    for (const auto& d : r.strides) put(d);
    for (int64_t b : r.box) s << ' ' << b;
    s << ' ' << r.swizzleBytes << '\n';
  }
  return s.str();
}

std::vector<TensorMapRecipe> parseTensorMapRecipesText(const std::string& text) {
  std::vector<TensorMapRecipe> out;
  std::istringstream lines(text);
  std::string line;
  auto bad = [&] { return Error("malformed tensor map recipe '" + line + "'", ErrorKind::Internal); };
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::istringstream s(line);
    std::string dtype, tok;
    size_t rank = 0;
    TensorMapRecipe r;
    if (!(s >> dtype >> r.baseParam >> rank) || rank < 1 || rank > 5) throw bad();
    auto dt = ir::parseDType(dtype);
    if (!dt) throw bad();
    r.dtype = *dt;
    auto operand = [&]() {
      if (!(s >> tok) || tok.size() < 2 || (tok[0] != 'p' && tok[0] != 'c')) throw bad();
      const int64_t v = std::stoll(tok.substr(1));
      return tok[0] == 'p' ? TensorMapOperand{int(v), 0} : TensorMapOperand{-1, v};
    };
    for (size_t k = 0; k < rank; ++k) r.dims.push_back(operand());
    for (size_t k = 0; k + 1 < rank; ++k) r.strides.push_back(operand());
    r.box.resize(rank);
    for (auto& b : r.box)
      if (!(s >> b)) throw bad();
    if (!(s >> r.swizzleBytes)) throw bad();
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace flextile::codegen
