#include "ir/Layout.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>

#include "ir/AttrScanner.h"
#include "ir/IR.h"

namespace flextile::ir {

namespace {

int log2Exact(int64_t v) {
  int k = 0;
  while ((int64_t(1) << k) < v) ++k;
  return k;
}

bool isPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

// Coordinates of a power-of-two shape are bit strings; concatenating them
// (row-major) gives the flat index, and XOR of coordinates is XOR of indices.
uint64_t flatten(const Shape& shape, const Layout::Coord& c) {
  uint64_t idx = 0;
  for (size_t d = 0; d < shape.size(); ++d) idx = idx * uint64_t(shape[d]) + uint64_t(c[d]);
  return idx;
}

Layout::Coord unflatten(const Shape& shape, uint64_t idx) {
  Layout::Coord c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = int64_t(idx % uint64_t(shape[d]));
    idx /= uint64_t(shape[d]);
  }
  return c;
}

// Gaussian elimination over GF(2): adds v to the basis unless it is in its
// span; returns whether it was independent.
bool addIndependent(std::vector<uint64_t>& basis, uint64_t v) {
  for (uint64_t b : basis) v = std::min(v, v ^ b);
  if (v == 0) return false;
  basis.push_back(v);
  std::sort(basis.begin(), basis.end(), std::greater<>());
  return true;
}

// Keeps the register bases that are non-zero and independent of earlier ones.
Layout::Bases cleanRegisters(const Shape& shape, const Layout::Bases& reg) {
  std::vector<uint64_t> span;
  Layout::Bases out;
  for (const auto& b : reg)
    if (addIndependent(span, flatten(shape, b))) out.push_back(b);
  return out;
}

std::string basesStr(const Layout::Bases& bs) {
  std::string s = "[";
  for (size_t i = 0; i < bs.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t d = 0; d < bs[i].size(); ++d) s += (d ? "," : "") + std::to_string(bs[i][d]);
    s += "]";
  }
  return s + "]";
}

}  // namespace

Layout::Layout(Shape shape, Bases reg, Bases lane, Bases warp)
    : shape_(std::move(shape)), reg_(std::move(reg)), lane_(std::move(lane)), warp_(std::move(warp)) {
  // A malformed basis (wrong rank) is reported by validate(); flatten only what is well formed.
  auto flat = [&](const Bases& bases) {
    std::vector<uint64_t> out;
    for (const Coord& b : bases) out.push_back(b.size() == shape_.size() ? flatten(shape_, b) : 0);
    return out;
  };
  regFlat_ = flat(reg_), laneFlat_ = flat(lane_), warpFlat_ = flat(warp_);
  bool pow2 = true;
  for (int64_t d : shape_) pow2 = pow2 && isPow2(d);
  if (pow2)
    for (int64_t d : shape_) dimBits_.push_back(std::countr_zero(uint64_t(d)));
}

Layout Layout::blocked(const Shape& shape, const std::vector<int64_t>& spt, const std::vector<int64_t>& tpw,
                       const std::vector<int64_t>& wpc, const std::vector<int>& order) {
  const size_t r = shape.size();
  // Malformed parameters would index out of bounds below; say what is wrong instead.
  auto fail = [&](const std::string& what) { throw Error("blocked layout for " + shapeString(shape) + ": " + what); };
  if (r == 0) fail("a scalar has no layout");
  if (spt.size() != r || tpw.size() != r || wpc.size() != r || order.size() != r)
    fail("sizePerThread, threadsPerWarp, warpsPerCTA and order need one entry per dimension");
  std::vector<int> sortedOrder = order;
  std::sort(sortedOrder.begin(), sortedOrder.end());
  int64_t lanes = 1;
  for (size_t d = 0; d < r; ++d) {
    if (sortedOrder[d] != int(d)) fail("order is not a permutation of the dimensions");
    if (!isPow2(shape[d]) || !isPow2(spt[d]) || !isPow2(tpw[d]) || !isPow2(wpc[d]))
      fail("shape and all parameters must be powers of two");
    lanes *= tpw[d];
  }
  if (lanes != 32) fail("threadsPerWarp must multiply to 32, got " + std::to_string(lanes));
  auto unit = [&](size_t d, int64_t v) {
    Coord c(r, 0);
    c[d] = shape[d] > 0 ? v % shape[d] : 0;  // past the tile wraps to 0: replication
    return c;
  };
  Bases reg, lane, warp;
  for (int d : order)
    for (int i = 0; i < log2Exact(spt[d]); ++i) reg.push_back(unit(d, int64_t(1) << i));
  for (int d : order)
    for (int i = 0; i < log2Exact(tpw[d]); ++i) lane.push_back(unit(d, spt[d] << i));
  for (int d : order)
    for (int i = 0; i < log2Exact(wpc[d]); ++i) warp.push_back(unit(d, spt[d] * tpw[d] << i));
  for (int d : order) {
    int64_t tile = spt[d] * tpw[d] * wpc[d];
    for (int64_t step = tile; step < shape[d]; step *= 2) reg.push_back(unit(d, step));
  }
  return Layout(shape, cleanRegisters(shape, reg), lane, warp);
}

Layout Layout::defaultBlocked(const Shape& shape, int numWarps, int64_t vector) {
  const int r = int(shape.size());
  if (r == 0) throw Error("default layout: a scalar has no layout");
  if (!isPow2(numWarps) || !isPow2(vector))
    throw Error("default layout for " + shapeString(shape) + ": warps (" + std::to_string(numWarps) + ") and vector (" +
                std::to_string(vector) + ") must be powers of two");
  std::vector<int64_t> spt(r, 1), tpw(r, 1), wpc(r, 1);
  std::vector<int> order(r);
  for (int i = 0; i < r; ++i) order[i] = r - 1 - i;
  spt[r - 1] = std::max<int64_t>(1, std::min(vector, shape[r - 1]));
  int64_t lanes = 32;
  for (int d = r - 1; d >= 0 && lanes > 1; --d) {
    int64_t t = std::min(lanes, std::max<int64_t>(1, shape[d] / spt[d]));
    tpw[d] = t;
    lanes /= t;
  }
  tpw[0] *= lanes;
  int64_t warps = numWarps;
  for (int d = 0; d < r && warps > 1; ++d) {
    int64_t w = std::min(warps, std::max<int64_t>(1, shape[d] / (spt[d] * tpw[d])));
    wpc[d] = w;
    warps /= w;
  }
  wpc[0] *= warps;
  return blocked(shape, spt, tpw, wpc, order);
}

Layout::Coord Layout::apply(int64_t reg, int64_t lane, int64_t warp) const {
  uint64_t idx = 0;
  for (size_t i = 0; i < regFlat_.size(); ++i)
    if (reg >> i & 1) idx ^= regFlat_[i];
  for (size_t i = 0; i < laneFlat_.size(); ++i)
    if (lane >> i & 1) idx ^= laneFlat_[i];
  for (size_t i = 0; i < warpFlat_.size(); ++i)
    if (warp >> i & 1) idx ^= warpFlat_[i];
  if (dimBits_.empty()) return unflatten(shape_, idx);
  Coord c(shape_.size());
  for (size_t d = shape_.size(); d-- > 0;) {
    c[d] = int64_t(idx & ((uint64_t(1) << dimBits_[d]) - 1));
    idx >>= dimBits_[d];
  }
  return c;
}

// Solves reg . bases = c over GF(2) by elimination instead of caching a
// table: Layouts are shared between threads (shared_ptr<const Layout> in
// types of cloned functions compiled in parallel), so a const method must not
// fill a cache unsynchronized. The register bases are independent, so the
// solution is unique.
int64_t Layout::registerOf(const Coord& c) const {
  if (c.size() != shape_.size()) return -1;
  for (size_t d = 0; d < c.size(); ++d)
    if (c[d] < 0 || c[d] >= shape_[d]) return -1;
  struct Row {
    uint64_t value, combination;
  };
  std::vector<Row> rows;  // echelon form: distinct leading bits
  auto reduce = [&](Row x) {
    for (const Row& row : rows)
      if (x.value & (uint64_t(1) << (63 - __builtin_clzll(row.value)))) {
        x.value ^= row.value;
        x.combination ^= row.combination;
      }
    return x;
  };
  for (size_t i = 0; i < reg_.size(); ++i) {
    Row x = reduce({flatten(shape_, reg_[i]), uint64_t(1) << i});
    if (x.value == 0) continue;
    // Keep rows sorted by leading bit, highest first, so one pass of reduce() clears them in order.
    auto pos = std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.value < x.value; });
    rows.insert(pos, x);
  }
  Row target = reduce({flatten(shape_, c), 0});
  return target.value == 0 ? int64_t(target.combination) : -1;
}

Layout Layout::sliced(int axis) const {
  Shape s = shape_;
  s.erase(s.begin() + axis);
  auto drop = [&](Bases bs) {
    for (auto& b : bs) b.erase(b.begin() + axis);
    return bs;
  };
  return Layout(s, cleanRegisters(s, drop(reg_)), drop(lane_), drop(warp_));
}

Layout Layout::expanded(int axis) const {
  Shape s = shape_;
  s.insert(s.begin() + axis, 1);
  auto ins = [&](Bases bs) {
    for (auto& b : bs) b.insert(b.begin() + axis, 0);
    return bs;
  };
  return Layout(s, ins(reg_), ins(lane_), ins(warp_));
}

Layout Layout::projected(const Shape& smaller) const {
  auto proj = [&](Bases bs) {
    for (auto& b : bs)
      for (size_t d = 0; d < b.size(); ++d)
        if (smaller[d] == 1) b[d] = 0;
    return bs;
  };
  return Layout(smaller, cleanRegisters(smaller, proj(reg_)), proj(lane_), proj(warp_));
}

Layout Layout::reshaped(const Shape& shape) const {
  auto re = [&](const Bases& bs) {
    Bases out;
    for (const auto& b : bs) out.push_back(unflatten(shape, flatten(shape_, b)));
    return out;
  };
  return Layout(shape, re(reg_), re(lane_), re(warp_));
}

Layout Layout::transposed(const std::vector<int>& perm) const {
  Shape s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) s[i] = shape_[perm[i]];
  auto tr = [&](const Bases& bs) {
    Bases out;
    for (const auto& b : bs) {
      Coord c(perm.size());
      for (size_t i = 0; i < perm.size(); ++i) c[i] = b[perm[i]];
      out.push_back(c);
    }
    return out;
  };
  return Layout(s, tr(reg_), tr(lane_), tr(warp_));
}

int64_t Layout::contiguousRegisters(int dim) const {
  int64_t n = 1;
  for (const auto& b : reg_) {
    Coord want(shape_.size(), 0);
    want[dim] = n;
    if (b != want) break;
    n *= 2;
  }
  return n;
}

uint32_t Layout::replicatedLaneMask() const {
  uint32_t m = 0;
  for (size_t i = 0; i < lane_.size(); ++i)
    if (flatten(shape_, lane_[i]) == 0) m |= 1u << i;
  return m;
}

uint32_t Layout::replicatedWarpMask() const {
  uint32_t m = 0;
  for (size_t i = 0; i < warp_.size(); ++i)
    if (flatten(shape_, warp_[i]) == 0) m |= 1u << i;
  return m;
}

bool Layout::operator==(const Layout& o) const {
  return shape_ == o.shape_ && reg_ == o.reg_ && lane_ == o.lane_ && warp_ == o.warp_;
}

std::string Layout::str() const {
  std::string s = "#ft.linear<[";
  for (size_t d = 0; d < shape_.size(); ++d) s += (d ? "," : "") + std::to_string(shape_[d]);
  return s + "], reg=" + basesStr(reg_) + ", lane=" + basesStr(lane_) + ", warp=" + basesStr(warp_) + ">";
}

namespace {
struct LayoutParser : AttrScanner {
  Layout::Bases bases() {
    Layout::Bases bs;
    expect("[");
    if (eat("]")) return bs;
    do bs.push_back(ints());
    while (eat(","));
    expect("]");
    return bs;
  }
};
}  // namespace

Layout Layout::parse(std::string_view text) {
  LayoutParser ps{{"layout", text}};
  ps.expect("#ft.linear<");
  Shape shape = ps.ints();
  ps.expect(",");
  ps.expect("reg");
  ps.expect("=");
  auto reg = ps.bases();
  ps.expect(",");
  ps.expect("lane");
  ps.expect("=");
  auto lane = ps.bases();
  ps.expect(",");
  ps.expect("warp");
  ps.expect("=");
  auto warp = ps.bases();
  ps.expect(">");
  Layout l(shape, reg, lane, warp);
  if (auto err = l.verify(); !err.empty()) throw Error("layout: " + err + " in '" + std::string(text) + "'");
  return l;
}

std::string Layout::verify() const {
  for (auto d : shape_)
    if (!isPow2(d)) return "tile dimension " + std::to_string(d) + " is not a power of two";
  if (lane_.size() != 5) return "expected 5 lane bases (32 lanes), got " + std::to_string(lane_.size());
  auto checkBase = [&](const Coord& b) -> std::string {
    if (b.size() != shape_.size()) return "basis " + basesStr({b}) + " has the wrong rank";
    for (size_t d = 0; d < b.size(); ++d)
      if (b[d] < 0 || b[d] >= shape_[d]) return "basis " + basesStr({b}) + " is outside the tile";
    return "";
  };
  std::vector<uint64_t> span;
  for (const auto& b : reg_) {
    if (auto e = checkBase(b); !e.empty()) return e;
    if (!addIndependent(span, flatten(shape_, b))) return "register basis " + basesStr({b}) + " is zero or dependent";
  }
  for (const Bases* bs : {&lane_, &warp_})
    for (const auto& b : *bs) {
      if (auto e = checkBase(b); !e.empty()) return e;
      uint64_t v = flatten(shape_, b);
      if (v != 0 && !addIndependent(span, v))
        return "lane/warp basis " + basesStr({b}) + " is dependent (only zero bases may replicate)";
    }
  int bits = 0;
  for (auto d : shape_) bits += log2Exact(d);
  if (int(span.size()) != bits) return "layout does not cover the whole tile";
  return "";
}


// =============================================================================
// Tensor-core layouts: mma.sync accumulators and dot operands.
// The formulas and the register order are documented in Layout.h; pictures
// are in docs/layouts.md.
// =============================================================================

namespace {

Layout::Coord at2(int64_t row, int64_t col) { return {row, col}; }

// Lane bases shared by the accumulator and the 16-bit A fragment: lane bits
// 0-1 are threadID_in_group (t, column pair 2t), bits 2-4 are groupID (g, row).
Layout::Bases quadLanes(int64_t colStep) {
  return {at2(0, colStep), at2(0, 2 * colStep), at2(1, 0), at2(2, 0), at2(4, 0)};
}

}  // namespace

Layout Layout::mmaAccumulator(const Shape& shape, int numWarps, const std::vector<int64_t>& warpsPerCTA) {
  auto fail = [&](const std::string& what) {
    throw Error("mma accumulator layout for " + shapeString(shape) + " with " + std::to_string(numWarps) +
                " warps: " + what);
  };
  if (shape.size() != 2) fail("the tile must have rank 2 ([M, N])");
  if (warpsPerCTA.size() != 2) fail("warpsPerCTA needs two entries ({wm, wn})");
  const int64_t M = shape[0], N = shape[1], wm = warpsPerCTA[0], wn = warpsPerCTA[1];
  if (!isPow2(M) || !isPow2(N)) fail("M and N must be powers of two");
  if (M < 16 || N < 8) fail("the tile is smaller than one m16n8 instruction tile (M >= 16, N >= 8 needed)");
  if (!isPow2(numWarps) || !isPow2(wm) || !isPow2(wn)) fail("warp counts must be powers of two");
  if (wm * wn != numWarps)
    fail("warpsPerCTA {" + std::to_string(wm) + ", " + std::to_string(wn) + "} does not multiply to the warp count");

  // A step past the tile wraps to zero: for warps that means replication,
  // for registers it never happens (repetitions start at the warp tile).
  auto along = [&](int dim, int64_t step) {
    Coord c{0, 0};
    c[dim] = step % shape[dim];
    return c;
  };
  Bases reg{at2(0, 1), at2(8, 0)};
  for (int64_t step = 8 * wn; step < N; step *= 2) reg.push_back(at2(0, step));
  for (int64_t step = 16 * wm; step < M; step *= 2) reg.push_back(at2(step, 0));
  Bases warp;
  for (int64_t i = 1; i < wn; i *= 2) warp.push_back(along(1, 8 * i));
  for (int64_t i = 1; i < wm; i *= 2) warp.push_back(along(0, 16 * i));
  return Layout(shape, reg, quadLanes(2), warp);
}

Layout Layout::wgmmaAccumulator(const Shape& shape, int numWarps, int64_t groupsAlongN, int64_t replicas) {
  auto fail = [&](const std::string& what) {
    throw Error("wgmma accumulator layout for " + shapeString(shape) + " with " + std::to_string(numWarps) +
                " warps, " + std::to_string(groupsAlongN) + " warpgroups along N, " + std::to_string(replicas) +
                " replicas: " + what);
  };
  if (shape.size() != 2) fail("the tile must have rank 2 ([M, N])");
  const int64_t M = shape[0], N = shape[1];
  if (!isPow2(M) || !isPow2(N) || !isPow2(numWarps) || !isPow2(groupsAlongN) || !isPow2(replicas))
    fail("M, N, the warps, the groups and the replicas must be powers of two");
  if (numWarps < 4 || M < 64 || M * groupsAlongN * replicas != 16 * numWarps)
    fail("the warpgroups (numWarps / 4) must be M / 64 along M times groupsAlongN along N times the replicas");
  const int64_t groupN = N / groupsAlongN;
  if (groupN < 8) fail("each warpgroup needs 8 columns or more");
  Bases reg{at2(0, 1), at2(8, 0)};
  for (int64_t step = 8; step < groupN; step *= 2) reg.push_back(at2(0, step));
  Bases warp{at2(16, 0), at2(32, 0)};
  for (int64_t step = 64; step < M; step *= 2) warp.push_back(at2(step, 0));
  for (int64_t step = groupN; step < N; step *= 2) warp.push_back(at2(0, step));
  for (int64_t r = 1; r < replicas; r *= 2) warp.push_back(at2(0, 0));
  return Layout(shape, reg, quadLanes(2), warp);
}

Layout Layout::dotOperand(const Layout& parent, int operandIndex, int64_t K, int elementBits) {
  auto fail = [&](const std::string& what) {
    throw Error("dot operand " + std::string(operandIndex == 0 ? "A" : operandIndex == 1 ? "B" : "?") + " (K = " +
                std::to_string(K) + ", " + std::to_string(elementBits) + "-bit elements) of parent " + parent.str() +
                ": " + what);
  };
  if (operandIndex != 0 && operandIndex != 1) fail("operandIndex must be 0 (A) or 1 (B)");
  if (elementBits != 16 && elementBits != 32)
    fail("only 16-bit (f16/bf16, m16n8k16) and 32-bit (tf32, m16n8k8) operands are supported");
  const int64_t instrK = elementBits == 16 ? 16 : 8;
  if (!isPow2(K) || K < instrK) fail("K must be a power of two >= " + std::to_string(instrK));

  // Recognise the accumulator structure: c0..c3 and quad lanes first, then
  // axis-aligned repetitions; the operand keeps the repetitions of its own
  // non-K dimension in the parent's order.
  if (parent.rank() != 2) fail("the parent is not a rank-2 mma accumulator");
  const Bases& preg = parent.regBases();
  if (preg.size() < 2 || preg[0] != at2(0, 1) || preg[1] != at2(8, 0) || parent.laneBases() != quadLanes(2))
    fail("the parent is not an mma accumulator layout (c0..c3 and quad lanes expected first)");
  const int64_t M = parent.shape()[0], N = parent.shape()[1];
  Bases mReps, nReps;
  for (size_t i = 2; i < preg.size(); ++i) {
    const Coord& b = preg[i];
    if (b[0] != 0 && b[1] != 0) fail("the parent has a register basis that is not axis-aligned");
    (b[0] != 0 ? mReps : nReps).push_back(b);
  }
  for (const auto& b : parent.warpBases())
    if (b[0] != 0 && b[1] != 0) fail("the parent has a warp basis that is not axis-aligned");

  const bool isA = operandIndex == 0;
  // Operand coordinates: A is [M, K] (K = dim 1), B is [K, N] (K = dim 0).
  auto op = [&](int64_t kStep, int64_t other) { return isA ? at2(other, kStep) : at2(kStep, other); };
  Bases reg, lane;
  if (elementBits == 16) {
    if (isA) {
      reg = {op(1, 0), op(0, 8), op(8, 0)};  // a0/a1: col+1, a2/a3: row+8, a4..a7: col+8
      lane = quadLanes(2);
    } else {
      reg = {op(1, 0), op(8, 0)};  // b0/b1: k+1, b2/b3: k+8
      lane = {op(2, 0), op(4, 0), op(0, 1), op(0, 2), op(0, 4)};
    }
  } else {
    if (isA) {
      reg = {op(0, 8), op(4, 0)};  // a1: row+8, a2: col+4
      lane = quadLanes(1);
    } else {
      reg = {op(4, 0)};  // b1: k+4
      lane = {op(1, 0), op(2, 0), op(0, 1), op(0, 2), op(0, 4)};
    }
  }
  for (int64_t step = instrK; step < K; step *= 2) reg.push_back(op(step, 0));
  for (const auto& b : isA ? mReps : nReps) reg.push_back(op(0, isA ? b[0] : b[1]));
  Bases warp;
  for (const auto& b : parent.warpBases()) warp.push_back(op(0, isA ? b[0] : b[1]));
  Layout result(isA ? Shape{M, K} : Shape{K, N}, reg, lane, warp);
  if (auto err = result.verify(); !err.empty()) fail("the result is malformed: " + err);
  return result;
}

}  // namespace flextile::ir
