// The measured choice of a shared-memory layout for convert_layout; the model
// is described in ConversionPlan.h.
#include "codegen/ConversionPlan.h"

#include <algorithm>
#include <optional>
#include <tuple>

#include "ir/IR.h"

namespace flextile::codegen {

using ir::Layout;
using ir::SharedLayout;

namespace {

int64_t xorOffsets(const SharedLayout& s, const Layout::Bases& bases, int64_t index) {
  int64_t off = 0;
  for (size_t i = 0; i < bases.size(); ++i)
    if ((index >> i) & 1) off ^= s.offsetOf(bases[i]);
  return off;
}

int64_t accessBytesOf(const SharedLayout& s, int64_t vec) { return vec * s.elemBytes(); }

// Extra wavefronts of one warp instruction whose lanes touch the given element
// offsets, `vec` elements each. Accesses below 4 bytes fall in one phase and
// conflict only through distinct words, so they are measured as word accesses.
int64_t instructionConflicts(const SharedLayout& s, const std::vector<int64_t>& elementOffsets, int64_t vec) {
  const int64_t bytes = accessBytesOf(s, vec);
  std::vector<int64_t> addresses;
  addresses.reserve(elementOffsets.size());
  for (int64_t e : elementOffsets) addresses.push_back(bytes < 4 ? (e * s.elemBytes()) & ~int64_t(3) : e * s.elemBytes());
  return ir::sharedBankConflicts(addresses, int(std::max<int64_t>(4, bytes)));
}

// Wavefronts one instruction of `bytes` per lane takes without conflicts.
int64_t phasesOf(int64_t bytes) { return std::max<int64_t>(1, 32 * bytes / 128); }

std::vector<int64_t> laneOffsets(const Layout& l, const SharedLayout& s, int64_t reg, int warp) {
  const int64_t base = xorOffsets(s, l.regBases(), reg) ^ xorOffsets(s, l.warpBases(), warp);
  std::vector<int64_t> out(32);
  for (int64_t lane = 0; lane < 32; ++lane) out[size_t(lane)] = base ^ xorOffsets(s, l.laneBases(), lane);
  return out;
}

void checkLanes(const Layout& l) {
  if (l.laneBases().size() != 5)
    throw Error("conversion plan: layout " + l.str() + " does not have 32 lanes");
}

}  // namespace

int64_t sharedAccessVector(const Layout& l, const SharedLayout& s, int64_t maxVec) {
  const int fast = s.order()[0];
  int64_t v = std::min({maxVec, l.contiguousRegisters(fast), s.maxPhase() > 1 ? s.vec() : s.rowLength(),
                        l.numRegisters()});
  v = std::max<int64_t>(v, 1);
  auto fits = [&](int64_t v) {
    int bits = 0;
    while ((int64_t(1) << bits) < v) ++bits;
    for (int i = 0; i < bits; ++i)
      if (s.offsetOf(l.regBases()[size_t(i)]) != (int64_t(1) << i)) return false;
    for (size_t i = size_t(bits); i < l.regBases().size(); ++i)
      if (s.offsetOf(l.regBases()[i]) % v != 0) return false;
    for (const Layout::Bases* bases : {&l.laneBases(), &l.warpBases()})
      for (const auto& b : *bases)
        if (s.offsetOf(b) % v != 0) return false;
    return true;
  };
  while (v > 1 && !fits(v)) v /= 2;
  return v;
}

int64_t layoutAccessConflicts(const Layout& l, const SharedLayout& s, int64_t vec) {
  checkLanes(l);
  if (vec != 1 && sharedAccessVector(l, s, vec) != vec)
    throw Error("conversion plan: " + l.str() + " cannot access " + s.str() + " in vectors of " + std::to_string(vec));
  int64_t extra = 0;
  for (int w = 0; w < l.numWarps(); ++w)
    for (int64_t r = 0; r < l.numRegisters(); r += vec) extra += instructionConflicts(s, laneOffsets(l, s, r, w), vec);
  return extra;
}

namespace {
// One side's numbers from the one measured instruction (see the header).
struct SideCost {
  int64_t vec, conflicts, wavefronts, instructions;
};
SideCost sideCost(const Layout& l, const SharedLayout& s, bool vectorize) {
  const int64_t vec = vectorize ? sharedAccessVector(l, s, std::max<int64_t>(1, 16 / s.elemBytes())) : 1;
  const int64_t perInstruction = instructionConflicts(s, laneOffsets(l, s, 0, 0), vec);
  const int64_t instructions = l.numWarps() * (l.numRegisters() / vec);
  return {vec, perInstruction * instructions, instructions * (phasesOf(accessBytesOf(s, vec)) + perInstruction),
          instructions};
}
}  // namespace

ConversionPlan evaluateConversion(const Layout& from, const Layout& to, const SharedLayout& s, bool vectorize) {
  checkLanes(from);
  checkLanes(to);
  SideCost st = sideCost(from, s, vectorize), ld = sideCost(to, s, vectorize);
  return ConversionPlan{s, st.vec, ld.vec, st.conflicts, ld.conflicts, st.wavefronts + ld.wavefronts};
}

ConversionPlan rowMajorConversionPlan(const Layout& from, const Layout& to, int64_t elemBytes) {
  std::vector<int> order;
  for (int d = from.rank() - 1; d >= 0; --d) order.push_back(d);
  return evaluateConversion(from, to, SharedLayout::plain(from.shape(), order, elemBytes), false);
}

ConversionPlan chooseConversionPlan(const Layout& from, const Layout& to, int64_t elemBytes, bool vectorize) {
  if (from.shape() != to.shape())
    throw Error("conversion plan: " + from.str() + " and " + to.str() + " have different shapes");
  std::optional<ConversionPlan> best;
  std::tuple<int64_t, int64_t, int64_t> bestKey;
  const int rank = from.rank();
  for (int fast = rank - 1; fast >= 0; --fast) {
    std::vector<int> order{fast};
    for (int d = rank - 1; d >= 0; --d)
      if (d != fast) order.push_back(d);
    const int64_t rowLength = from.shape()[size_t(fast)];
    int64_t numRows = 1;
    for (int d = 0; d < rank; ++d)
      if (d != fast) numRows *= from.shape()[size_t(d)];
    const int64_t maxVec = vectorize ? std::max<int64_t>(1, 16 / elemBytes) : 1;
    for (int64_t vec = 1; vec <= std::min(maxVec, rowLength); vec *= 2)
      for (int64_t maxPhase = 1; maxPhase * vec <= rowLength; maxPhase *= 2)
        for (int64_t perPhase = 1; perPhase <= (maxPhase == 1 ? 1 : numRows); perPhase *= 2) {
          SharedLayout s(from.shape(), order, vec, perPhase, maxPhase, elemBytes);
          ConversionPlan p = evaluateConversion(from, to, s, vectorize);
          const int64_t instructions =
              from.numWarps() * from.numRegisters() / p.storeVec + to.numWarps() * to.numRegisters() / p.loadVec;
          auto key = std::make_tuple(p.wavefronts, instructions, maxPhase * perPhase);
          if (!best || key < bestKey) {
            best = p;
            bestKey = key;
          }
        }
  }
  return *best;
}

}  // namespace flextile::codegen
