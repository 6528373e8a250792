#include "ir/SharedLayout.h"

#include "ir/AttrScanner.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <set>

#include "ir/IR.h"

namespace flextile::ir {

namespace {

bool isPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

int log2Exact(int64_t v) {
  int k = 0;
  while ((int64_t(1) << k) < v) ++k;
  return k;
}

std::string intsStr(const std::vector<int64_t>& v, const char* sep) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

SharedLayout::SharedLayout(Shape shape, std::vector<int> order, int64_t vec, int64_t perPhase, int64_t maxPhase,
                           int64_t elemBytes, int64_t panel)
    : shape_(std::move(shape)),
      order_(std::move(order)),
      vec_(vec),
      perPhase_(perPhase),
      maxPhase_(maxPhase),
      elemBytes_(elemBytes),
      panel_(panel) {
  if (panel_ == 0 && !order_.empty() && order_[0] >= 0 && size_t(order_[0]) < shape_.size())
    panel_ = shape_[size_t(order_[0])];
  if (auto err = verify(); !err.empty()) throw Error("shared layout " + str() + ": " + err);
}

SharedLayout SharedLayout::plain(const Shape& shape, const std::vector<int>& order, int64_t elemBytes) {
  return SharedLayout(shape, order, 1, 1, 1, elemBytes);
}

SharedLayout SharedLayout::forDotOperand(const Shape& shape, int64_t elemBytes, int operandIndex, bool transposed) {
  if (shape.size() != 2 || (operandIndex != 0 && operandIndex != 1))
    throw Error("shared layout for dot operand " + std::to_string(operandIndex) + " of shape " + shapeString(shape) +
                ": expected a rank-2 operand and operandIndex 0 (A) or 1 (B)");
  std::vector<int> order = transposed ? std::vector<int>{0, 1} : std::vector<int>{1, 0};
  const int64_t rowLen = shape[order[0]];
  const int64_t rowBytes = rowLen * elemBytes;
  // 16-byte chunks: one ldmatrix row, one cp.async.cg copy.
  const int64_t vec = std::max<int64_t>(1, std::min<int64_t>(16 / std::max<int64_t>(1, elemBytes), rowLen));
  // 8 consecutive rows must hit 8 distinct 16-byte slots of a 128-byte line.
  // Rows shorter than 128 bytes already spread over the line (perPhase rows
  // share a phase); the phase only needs rowBytes / 16 values to reach the
  // rest. Rows of 16 bytes or less need no swizzle at all.
  int64_t maxPhase = std::max<int64_t>(1, std::min<int64_t>(8, rowBytes / 16));
  int64_t perPhase = maxPhase > 1 ? std::max<int64_t>(1, 128 / rowBytes) : 1;
  return SharedLayout(shape, order, vec, perPhase, maxPhase, elemBytes);
}

int64_t SharedLayout::numElements() const {
  int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

int64_t SharedLayout::rowOf(const Coord& c) const {
  int64_t row = 0, stride = 1;
  for (size_t k = 1; k < order_.size(); ++k) {
    row += c[order_[k]] * stride;
    stride *= shape_[order_[k]];
  }
  return row;
}

int64_t SharedLayout::offsetOf(const Coord& c) const {
  bool inside = c.size() == shape_.size();
  for (size_t d = 0; inside && d < c.size(); ++d) inside = c[d] >= 0 && c[d] < shape_[d];
  if (!inside) throw Error("shared layout " + str() + ": coordinate " + intsStr(c, ", ") + " is outside the tile");
  const int64_t row = rowOf(c), col = c[order_[0]] % panel_, panelIndex = c[order_[0]] / panel_;
  const int64_t phase = (row / perPhase_) % maxPhase_;
  return (panelIndex * rowsPerPanel() + row) * panel_ + (((col / vec_) ^ phase) * vec_) + col % vec_;
}

SharedLayout::Coord SharedLayout::coordOf(int64_t offset) const {
  if (offset < 0 || offset >= numElements())
    throw Error("shared layout " + str() + ": offset " + std::to_string(offset) + " is outside the buffer");
  int64_t row = offset / panel_;
  const int64_t panelIndex = row / rowsPerPanel();
  row %= rowsPerPanel();
  const int64_t swizzled = offset % panel_;
  const int64_t phase = (row / perPhase_) % maxPhase_;
  Coord c(shape_.size(), 0);
  c[order_[0]] = panelIndex * panel_ + (((swizzled / vec_) ^ phase) * vec_) + swizzled % vec_;
  for (size_t k = 1; k < order_.size(); ++k) {
    c[order_[k]] = row % shape_[order_[k]];
    row /= shape_[order_[k]];
  }
  return c;
}

std::vector<SharedLayout::Coord> SharedLayout::offsetBases() const {
  std::vector<Coord> bases;
  for (int i = 0; i < log2Exact(numElements()); ++i) bases.push_back(coordOf(int64_t(1) << i));
  return bases;
}

bool SharedLayout::needsTransposedLdmatrix(int operandIndex) const {
  // K is dimension 1 of A ([M, K]) and dimension 0 of B ([K, N]).
  return rank() == 2 && order_[0] != (operandIndex == 0 ? 1 : 0);
}

bool SharedLayout::operator==(const SharedLayout& o) const {
  return shape_ == o.shape_ && order_ == o.order_ && vec_ == o.vec_ && perPhase_ == o.perPhase_ &&
         maxPhase_ == o.maxPhase_ && elemBytes_ == o.elemBytes_ && panel_ == o.panel_;
}

std::string SharedLayout::str() const {
  std::string s = "#ft.shared<" + intsStr(shape_, ", ") + ", order=";
  s += intsStr(std::vector<int64_t>(order_.begin(), order_.end()), ",");
  s += ", vec=" + std::to_string(vec_) + ", perPhase=" + std::to_string(perPhase_) +
       ", maxPhase=" + std::to_string(maxPhase_) + ", bytes=" + std::to_string(elemBytes_);
  if (!shape_.empty() && order_.size() == shape_.size() && panel_ != shape_[size_t(order_[0])])
    s += ", panel=" + std::to_string(panel_);
  s += ">";
  return s;
}

std::string SharedLayout::verify() const {
  const size_t r = shape_.size();
  if (r == 0) return "a scalar has no shared layout";
  for (auto d : shape_)
    if (!isPow2(d)) return "tile dimension " + std::to_string(d) + " is not a power of two";
  if (order_.size() != r) return "order needs one entry per dimension";
  std::vector<int> sorted = order_;
  std::sort(sorted.begin(), sorted.end());
  for (size_t d = 0; d < r; ++d)
    if (sorted[d] != int(d)) return "order is not a permutation of the dimensions";
  if (!isPow2(vec_) || !isPow2(perPhase_) || !isPow2(maxPhase_))
    return "vec, perPhase and maxPhase must be powers of two";
  if (!isPow2(panel_) || panel_ > shape_[size_t(order_[0])])
    return "panel " + std::to_string(panel_) + " must be a power of two no larger than the contiguous dimension";
  if (vec_ > panel_) return "vec " + std::to_string(vec_) + " exceeds the panel of " + std::to_string(panel_);
  if (maxPhase_ > 1 && maxPhase_ * vec_ > rowLength())
    return "the swizzle leaves the row: maxPhase * vec = " + std::to_string(maxPhase_ * vec_) +
           " > row length " + std::to_string(rowLength());
  if (elemBytes_ != 1 && elemBytes_ != 2 && elemBytes_ != 4 && elemBytes_ != 8)
    return "element size must be 1, 2, 4 or 8 bytes, got " + std::to_string(elemBytes_);
  return "";
}

namespace {
struct SharedParser : AttrScanner {
  int64_t field(std::string_view name) {
    expect(",");
    expect(name);
    expect("=");
    return integer();
  }
};
}  // namespace

SharedLayout SharedLayout::parse(std::string_view text) {
  SharedParser ps{{"shared layout", text}};
  ps.expect("#ft.shared<");
  Shape shape = ps.ints();
  ps.expect(",");
  ps.expect("order");
  ps.expect("=");
  auto orderInts = ps.ints();
  for (auto o : orderInts)
    if (o < 0 || o >= int64_t(shape.size())) ps.fail("order entry " + std::to_string(o) + " is not a dimension");
  std::vector<int> order(orderInts.begin(), orderInts.end());
  int64_t vec = ps.field("vec"), perPhase = ps.field("perPhase"), maxPhase = ps.field("maxPhase");
  int64_t bytes = ps.field("bytes");
  int64_t panel = 0;
  ps.ws();
  if (ps.p < text.size() && text[ps.p] == ',') panel = ps.field("panel");
  ps.expect(">");
  ps.ws();
  if (ps.p != text.size()) ps.fail("unexpected text after the layout");
  return SharedLayout(shape, order, vec, perPhase, maxPhase, bytes, panel);  // verifies
}

// -----------------------------------------------------------------------------
// Bank conflicts.

int64_t sharedBankConflicts(const std::vector<int64_t>& byteAddresses, int accessBytes) {
  if (accessBytes != 4 && accessBytes != 8 && accessBytes != 16)
    throw Error("bank conflicts: access size must be 4, 8 or 16 bytes, got " + std::to_string(accessBytes));
  const size_t phaseLanes = size_t(128 / accessBytes);
  if (byteAddresses.size() % phaseLanes != 0)
    throw Error("bank conflicts: " + std::to_string(byteAddresses.size()) + " addresses is not a multiple of " +
                std::to_string(phaseLanes) + " lanes per phase");
  int64_t extra = 0;
  for (size_t first = 0; first < byteAddresses.size(); first += phaseLanes) {
    std::map<int64_t, std::set<int64_t>> wordsPerBank;
    for (size_t lane = first; lane < first + phaseLanes; ++lane) {
      const int64_t a = byteAddresses[lane];
      if (a < 0 || a % accessBytes != 0)
        throw Error("bank conflicts: address " + std::to_string(a) + " of lane " + std::to_string(lane) +
                    " is not aligned to " + std::to_string(accessBytes) + " bytes");
      for (int64_t w = a / 4; w < (a + accessBytes) / 4; ++w) wordsPerBank[w % 32].insert(w);
    }
    size_t wavefronts = 1;
    for (const auto& [bank, words] : wordsPerBank) wavefronts = std::max(wavefronts, words.size());
    extra += int64_t(wavefronts) - 1;
  }
  return extra;
}

// -----------------------------------------------------------------------------
// ldmatrix plan.

std::vector<LdmatrixAccess> ldmatrixAccesses(const Layout& dot, const SharedLayout& smem, int warp) {
  auto fail = [&](const std::string& what) {
    throw Error("ldmatrix of " + dot.str() + " from " + smem.str() + ": " + what);
  };
  if (smem.elemBytes() != 2) fail("ldmatrix moves 16-bit elements only");
  if (dot.shape() != smem.shape()) fail("the register and shared tiles have different shapes");
  if (dot.numRegisters() < 2) fail("the layout has fewer than the 2 registers of one matrix");
  if (warp < 0 || warp >= dot.numWarps()) fail("warp " + std::to_string(warp) + " is out of range");

  // Element offset held by (register, lane) of this warp.
  auto offset = [&](int64_t reg, int64_t lane) { return smem.offsetOf(dot.apply(reg, lane, warp)); };
  // Matrix with base register r0 (bit 0 clear), as ldmatrix sees it without
  // .trans: row q, column c is held by lane 4q + c/2, register r0 + c%2.
  // With .trans: stored row q, column c is held by lane 4c + q/2, register
  // r0 + q%2. Either way the 8 columns of a stored row must be 16 contiguous,
  // 16-byte aligned bytes; the first reading that holds is the one to use.
  auto rowAddresses = [&](int64_t r0, bool trans, std::vector<int64_t>& rows) {
    rows.assign(8, 0);
    for (int q = 0; q < 8; ++q) {
      auto at = [&](int c) { return trans ? offset(r0 + q % 2, 4 * c + q / 2) : offset(r0 + c % 2, 4 * q + c / 2); };
      rows[q] = at(0);
      if (rows[q] * smem.elemBytes() % 16 != 0) return false;
      for (int c = 1; c < 8; ++c)
        if (at(c) != rows[q] + c) return false;
    }
    return true;
  };

  const int numMatrices = int(std::min<int64_t>(4, dot.numRegisters() / 2));
  std::vector<LdmatrixAccess> out;
  bool trans = false;
  for (int64_t first = 0; first < dot.numRegisters(); first += 2 * numMatrices) {
    LdmatrixAccess access;
    access.numMatrices = numMatrices;
    access.laneRowOffset.assign(32, 0);
    for (int j = 0; j < numMatrices; ++j) {
      const int64_t r0 = first + 2 * j;
      std::vector<int64_t> rows;
      // All matrices of one layout read the same way; decide on the first.
      if (out.empty() && j == 0) {
        if (!rowAddresses(r0, false, rows)) {
          if (!rowAddresses(r0, true, rows))
            fail("register " + std::to_string(r0) + " and the lanes do not form an 8x8 matrix of 16-byte rows");
          trans = true;
        }
      } else if (!rowAddresses(r0, trans, rows)) {
        fail("register " + std::to_string(r0) + " does not form an 8x8 matrix of 16-byte rows");
      }
      for (int q = 0; q < 8; ++q) access.laneRowOffset[8 * j + q] = rows[q];
      access.registers.push_back(r0);
      access.registers.push_back(r0 + 1);
    }
    access.trans = trans;
    for (int lane = 8 * numMatrices; lane < 32; ++lane)
      access.laneRowOffset[lane] = access.laneRowOffset[lane % (8 * numMatrices)];
    out.push_back(std::move(access));
  }
  return out;
}

}  // namespace flextile::ir
