#include "codegen/TensorCores.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include <cstdlib>
#include <cstring>
#include <functional>

namespace flextile::codegen {

using ir::DType;
using ir::Layout;
using ir::OpKind;

int mmaOperandBits(DType t) { return t == DType::F32 ? 32 : 16; }

bool mmaEligible(const ir::Op& dot, const Target& target) {
  if (dot.kind() != OpKind::Dot || !target.has(Feature::MmaSync)) return false;
  const ir::Type &at = dot.operand(0)->type(), &bt = dot.operand(1)->type(), &ct = dot.result()->type();
  if (at.rank() != 2 || bt.rank() != 2 || ct.rank() != 2) return false;
  const DType t = at.dtype();
  if (bt.dtype() != t || ct.dtype() != DType::F32 || dot.operand(2)->type().dtype() != DType::F32) return false;
  if (t != DType::F16 && t != DType::BF16 && t != DType::F32) return false;
  if (t == DType::F32 && dot.hasAttr("input_precision") && dot.strAttr("input_precision") == "ieee") return false;
  const int64_t M = at.shape()[0], K = at.shape()[1], N = bt.shape()[1];
  const MmaShape shape = *target.description().mmaSyncShape(mmaOperandBits(t));
  return M >= shape.m && N >= shape.n && K >= shape.k;
}

std::vector<int64_t> mmaWarpsPerCTA(int64_t M, int64_t N, int numWarps, bool chained) {
  int64_t wm = 1, wn = 1;
  while (wm * wn < numWarps) {
    const bool mRoom = M / (2 * wm) >= 16, nRoom = N / (2 * wn) >= 8;
    if (chained)
      (mRoom || !nRoom ? wm : wn) *= 2;
    else if (mRoom && (!nRoom || M / wm >= N / wn))
      wm *= 2;
    else if (nRoom)
      wn *= 2;
    else
      wm *= 2;  // the tile is smaller than the warps: replicate along M
  }
  return {wm, wn};
}

bool isMmaDot(const ir::Op& dot) {
  if (dot.kind() != OpKind::Dot) return false;
  const ir::Type &at = dot.operand(0)->type(), &bt = dot.operand(1)->type(), &ct = dot.result()->type();
  if (!at.hasLayout() || !bt.hasLayout() || !ct.hasLayout() || at.rank() != 2 || bt.rank() != 2) return false;
  if (at.dtype() != bt.dtype() || (at.dtype() != DType::F16 && at.dtype() != DType::BF16 && at.dtype() != DType::F32))
    return false;
  const int64_t K = at.shape()[1];
  try {
    const int bits = mmaOperandBits(at.dtype());
    return Layout::dotOperand(*ct.layout(), 0, K, bits) == *at.layout() &&
           Layout::dotOperand(*ct.layout(), 1, K, bits) == *bt.layout();
  } catch (const Error&) {
    return false;  // the result layout is not an mma accumulator
  }
}

namespace {

// The plan of reading a 16-bit dot-operand layout `to` from `stored` (the checks below).
std::optional<LdmatrixPlan> computeLdmatrixPlan(const ir::SharedLayout& stored, const Layout& to) {
  if (to.numRegisters() < 2) return std::nullopt;
  std::map<int, std::vector<ir::LdmatrixAccess>> basisWarps;
  std::optional<ir::SharedLayout> smem = stored;
  try {
    for (int w = 0, bit = -1; w < to.numWarps(); w = w ? 2 * w : 1, ++bit) {
      // A warp bit the layout ignores (the operand is replicated over those warps) reads what warp 0 reads.
      const bool replicated = bit >= 0 && std::all_of(to.warpBases()[size_t(bit)].begin(),
                                                      to.warpBases()[size_t(bit)].end(), [](int64_t x) { return x == 0; });
      basisWarps[w] = replicated ? basisWarps[0] : ir::ldmatrixAccesses(to, *smem, w);
    }
  } catch (const Error&) {
    return std::nullopt;
  }
  const auto& first = basisWarps[0];
  LdmatrixPlan plan{*smem};
  plan.numMatrices = first[0].numMatrices;
  plan.trans = first[0].trans;
  for (const auto& a : first) {
    plan.accessBase.push_back(a.laneRowOffset[0]);
    plan.registers.push_back(a.registers);
  }
  const int64_t origin = first[0].laneRowOffset[0];
  for (int i = 0; i < 5; ++i) plan.laneTerm.push_back(first[0].laneRowOffset[size_t(1) << i] ^ origin);
  for (int w = 1; w < to.numWarps(); w *= 2) {
    plan.warpTerm.push_back(basisWarps[w][0].laneRowOffset[0] ^ origin);
    // A warp term moves whole 16-byte rows, so each row stays 8 contiguous, aligned elements.
    if (plan.warpTerm.back() % 8 != 0) return std::nullopt;
  }
  auto lanePart = [&](int lane) {
    int64_t part = 0;
    for (int i = 0; i < 5; ++i)
      if (lane >> i & 1) part ^= plan.laneTerm[size_t(i)];
    return part;
  };
  auto warpPart = [&](int w) {
    int64_t part = 0;
    for (size_t i = 0; i < plan.warpTerm.size(); ++i)
      if (w >> i & 1) part ^= plan.warpTerm[i];
    return part;
  };
  // The linear form must reproduce every address the basis warps read...
  for (const auto& [w, accesses] : basisWarps) {
    if (accesses.size() != first.size()) return std::nullopt;
    for (size_t q = 0; q < first.size(); ++q) {
      const auto& a = accesses[q];
      if (a.registers != plan.registers[q] || a.trans != plan.trans || a.numMatrices != plan.numMatrices)
        return std::nullopt;
      for (int l = 0; l < 32; ++l)
        if (a.laneRowOffset[size_t(l)] != (plan.accessBase[q] ^ lanePart(l) ^ warpPart(w))) return std::nullopt;
    }
  }
  // ...and the row start of every matrix row of every other warp: the element ldmatrix reads
  // first in row q of matrix j (column 0: lane 4q and the pair's first register, or with .trans
  // lane q / 2 and register q % 2).
  for (int w = 1; w < to.numWarps(); ++w) {
    if (basisWarps.count(w)) continue;
    for (size_t q = 0; q < first.size(); ++q)
      for (int j = 0; j < plan.numMatrices; ++j)
        for (int row = 0; row < 8; ++row) {
          const int64_t r0 = plan.registers[q][size_t(2 * j)];
          const int64_t reg = plan.trans ? r0 + row % 2 : r0, lane = plan.trans ? row / 2 : 4 * row;
          if (smem->offsetOf(to.apply(reg, lane, w)) != (plan.accessBase[q] ^ lanePart(8 * j + row) ^ warpPart(w)))
            return std::nullopt;
        }
  }
  return plan;
}


// The plan is a pure function of the stored layout and the operand layout, and
// the pipeline pass, the shared-memory planner and two lowerings each ask for
// the same converts: computing it (every lane of every warp of every access)
// was ~10% of compiling the attention kernel. Memoized by the layouts' text,
// behind a mutex since the autotuner compiles on several threads.
std::optional<LdmatrixPlan> memoizedLdmatrixPlan(const ir::SharedLayout& stored, const Layout& to) {
  static std::mutex mutex;
  static std::map<std::pair<std::string, std::string>, std::optional<LdmatrixPlan>> plans;
  auto key = std::make_pair(stored.str(), to.str());
  {
    std::lock_guard lock(mutex);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
  }
  std::optional<LdmatrixPlan> plan = computeLdmatrixPlan(stored, to);
  std::lock_guard lock(mutex);
  if (plans.size() > 4096) plans.clear();  // bounded: a long autotune sweep sees many layouts
  plans.emplace(std::move(key), plan);
  return plan;
}

}  // namespace

std::optional<LdmatrixPlan> ldmatrixPlan(const Layout& from, const Layout& to, DType t) {
  if (ir::byteWidth(t) != 2 || from.rank() != 2 || to.rank() != 2 || from.shape() != to.shape()) return std::nullopt;
  // Rows along the source's contiguous dimension keep its vector registers
  // contiguous in shared memory.
  const bool dim0Contiguous = from.contiguousRegisters(0) > from.contiguousRegisters(1);
  std::optional<ir::SharedLayout> smem;
  try {
    smem = ir::SharedLayout::forDotOperand(to.shape(), 2, 0, dim0Contiguous);
  } catch (const Error&) {
    return std::nullopt;
  }
  return memoizedLdmatrixPlan(*smem, to);
}

std::optional<LdmatrixPlan> ldmatrixReadPlan(const ir::SharedLayout& stored, const Layout& to, DType t) {
  if (ir::byteWidth(t) != 2 || stored.elemBytes() != 2 || to.rank() != 2 || stored.shape() != to.shape())
    return std::nullopt;
  return memoizedLdmatrixPlan(stored, to);
}

// ---- wgmma -------------------------------------------------------------------

ir::SharedLayout wgmmaSharedLayout(const ir::Shape& shape, int contiguousDim, int64_t elemBytes) {
  if (shape.size() != 2 || (contiguousDim != 0 && contiguousDim != 1))
    throw Error("wgmma shared layout of " + ir::shapeString(shape) + ": expected a rank-2 tile");
  const std::vector<int> order = contiguousDim == 1 ? std::vector<int>{1, 0} : std::vector<int>{0, 1};
  const int64_t rowLen = shape[size_t(contiguousDim)];
  const int64_t panel = std::min<int64_t>(rowLen, 128 / elemBytes);
  const int64_t panelBytes = panel * elemBytes;
  const int64_t vec = 16 / elemBytes;
  const int64_t maxPhase = panelBytes / 16, perPhase = 128 / panelBytes;
  return ir::SharedLayout(shape, order, vec, perPhase, maxPhase, elemBytes, panel);
}

int64_t WgmmaTile::kStepByteOffset(int64_t s) const {
  const int64_t eb = smem.elemBytes(), panelBytes = smem.panel() * eb;
  const int64_t panelStride = smem.rowsPerPanel() * panelBytes;
  if (mnMajor) return 16 * s * panelBytes;  // K runs along the lines of every panel
  const int64_t kBytes = 16 * s * eb;       // K runs along the panels
  return kBytes / panelBytes * panelStride + kBytes % panelBytes;
}

bool WgmmaTile::mnBlockAligned(int64_t step) const {
  const int64_t panelBytes = smem.panel() * smem.elemBytes();
  // K-major: whole 8-line swizzle groups; MN-major: whole panels (a start inside one would read
  // across its lines).
  return mnMajor ? step * smem.elemBytes() % panelBytes == 0 : step % 8 == 0;
}

int64_t WgmmaTile::mnByteOffset(int64_t start) const {
  ir::SharedLayout::Coord at{0, 0};
  at[size_t(1 - kDim)] = start;
  return smem.offsetOf(at) * smem.elemBytes();
}

uint64_t WgmmaTile::descriptorFixedBits() const {
  return (uint64_t((leadingByteOffset >> 4) & 0x3FFF) << 16) | (uint64_t((strideByteOffset >> 4) & 0x3FFF) << 32) |
         (uint64_t(swizzleMode) << 62);
}

std::optional<WgmmaTile> wgmmaTile(const ir::Shape& shape, int contiguousDim, int kDim, int64_t elemBytes) {
  // Lines narrower than 32 bytes have no swizzle mode; refuse before building a layout for them.
  if (shape.size() != 2 || (contiguousDim != 0 && contiguousDim != 1) || shape[size_t(contiguousDim)] * elemBytes < 32)
    return std::nullopt;
  WgmmaTile tile{wgmmaSharedLayout(shape, contiguousDim, elemBytes)};
  tile.mnMajor = contiguousDim != kDim;
  tile.kDim = kDim;
  const int64_t panelBytes = tile.smem.panel() * elemBytes;
  if (panelBytes < 32 || tile.smem.rowsPerPanel() % 8 != 0) return std::nullopt;
  tile.swizzleMode = panelBytes == 128 ? 1 : panelBytes == 64 ? 2 : 3;
  const int64_t panelStride = tile.smem.rowsPerPanel() * panelBytes;
  tile.leadingByteOffset = tile.mnMajor ? panelStride : 16;  // K-major swizzled: unused
  tile.strideByteOffset = 8 * panelBytes;
  return tile;
}

const ir::Op* wgmmaSource(const ir::Op& dot) {
  if (dot.kind() != OpKind::Dot) return nullptr;
  const ir::Op* d = dot.operand(1)->definingOp();
  if (d && d->kind() == OpKind::Trans) d = d->operand(0)->definingOp();
  if (d && d->kind() == OpKind::LocalLoad) return d;
  if (!d || d->kind() != OpKind::ConvertLayout) return nullptr;
  const ir::Op* load = d->operand(0)->definingOp();
  if (!load || load->kind() != OpKind::Load || !load->hasAttr("async_stages")) return nullptr;
  return load;
}

namespace {
bool wgmmaDisabled() {
  const char* e = std::getenv("FLEXTILE_WGMMA");
  return e && std::strcmp(e, "0") == 0;
}
}  // namespace

bool wgmmaBStepsAdded() {
  const char* e = std::getenv("FLEXTILE_WGMMA_B_STEPS");
  return !(e && std::strcmp(e, "0") == 0);
}

namespace {

bool smemADisabled() {
  const char* e = std::getenv("FLEXTILE_WGMMA_SMEM_A");
  return e && std::strcmp(e, "0") == 0;
}
// Whether `v` is used only by `user` among the ops of `block` (and their regions).
bool onlyUser(const ir::Value* v, const ir::Op* user, const ir::Block& block) {
  bool ok = true;
  std::function<void(const ir::Block&)> scan = [&](const ir::Block& blk) {
    for (const auto& op : blk.ops()) {
      if (op.get() != user)
        for (const ir::Value* o : op->operands()) ok = ok && o != v;
      for (const auto& r : op->regions()) scan(*r);
    }
  };
  scan(block);
  return ok;
}

// The accumulator split wgmma needs (one m64nNk16 per warpgroup and K step: each warp of a
// warpgroup holds 16 of its 64 rows) and 16-bit operands: {N, K}, else empty.
std::optional<std::pair<int64_t, int64_t>> wgmmaAccumulator(const ir::Op& dot, const Target& target) {
  if (!target.has(Feature::Wgmma) || wgmmaDisabled() || !isMmaDot(dot)) return std::nullopt;
  const DType t = dot.operand(0)->type().dtype();
  if (t != DType::BF16 && t != DType::F16) return std::nullopt;
  const Layout& lc = *dot.result()->type().layout();
  const int numWarps = lc.numWarps();
  const int64_t M = lc.shape()[0], N = lc.shape()[1], K = dot.operand(0)->type().shape()[1];
  // Warps: 16 rows each within a warpgroup, then the warpgroups along M, then along N
  // (Layout::wgmmaAccumulator); each warpgroup's product is m64 x N / groups.
  // Replicas (zero bases) last.
  const auto& warps = lc.warpBases();
  size_t i = 0, end = warps.size();
  while (i < end && warps[i] == Layout::Coord{int64_t(16) << i, 0}) ++i;
  while (end > i && warps[end - 1] == Layout::Coord{0, 0}) --end;
  const int64_t groupsAlongN = int64_t(1) << (end - i), groupN = N / groupsAlongN;
  const int replicas = 1 << int(warps.size() - end);
  for (size_t j = i; j < end; ++j)
    if (warps[j] != Layout::Coord{0, groupN << (j - i)}) return std::nullopt;
  if (!wgmmaShapeFits(M, groupN, K, numWarps / int(groupsAlongN) / replicas, target)) return std::nullopt;
  for (const auto& basis : lc.regBases())
    if (basis[0] >= 16 || basis[1] >= groupN) return std::nullopt;  // no repetition past a warpgroup's share
  return std::pair{groupN, K};
}

// The op of `block` that holds `op` (op itself, or the op whose regions nest it); null outside.
const ir::Op* ancestorIn(const ir::Op* op, const ir::Block* block) {
  while (op && op->parentBlock() != block) op = op->parentBlock() ? op->parentBlock()->parentOp() : nullptr;
  return op;
}

// Whether `dot` sits in a loop nested in `home` (the block of a loop-invariant operand's convert).
bool inLoopBelow(const ir::Op& dot, const ir::Block* home) {
  const ir::Op* loop = dot.parentBlock() ? dot.parentBlock()->parentOp() : nullptr;
  return loop && loop->kind() == OpKind::For && home && ancestorIn(loop, home) != nullptr;
}

// The reader of `trans`'s result when it has exactly one, in the trans's block, sitting in a loop
// below `cvt` (the convert the trans reads); else null.
const ir::Op* soleLoopReader(const ir::Op& trans, const ir::Op& cvt) {
  const ir::Op* reader = nullptr;
  int readers = 0;
  cvt.function()->walk([&](const ir::Op& r) {
    if (std::find(r.operands().begin(), r.operands().end(), trans.result()) == r.operands().end()) return;
    ++readers;
    reader = &r;
  });
  return readers == 1 && reader->parentBlock() == trans.parentBlock() && inLoopBelow(*reader, cvt.parentBlock())
             ? reader
             : nullptr;
}

// The readers of a loop-invariant convert's result in loops below it, in program order, when every
// one is a dot that `accepts` (given the value it reads: the result, or with `throughTrans` a trans
// of it that only that dot reads) and every other reader is one that `outside` accepts (none when
// it is null); else none.
std::vector<const ir::Op*> loopDotReaders(const ir::Op& cvt,
                                          const std::function<bool(const ir::Op&, const ir::Value*)>& accepts,
                                          const std::function<bool(const ir::Op&)>& outside = nullptr,
                                          bool throughTrans = false) {
  std::vector<const ir::Op*> readers;
  bool ok = true;
  cvt.function()->walk([&](const ir::Op& op) {
    if (!ok || &op == &cvt) return;
    bool uses = false;
    for (const ir::Value* v : op.operands()) uses = uses || v == cvt.result();
    if (!uses) return;
    if (throughTrans && op.kind() == OpKind::Trans) {
      const ir::Op* dot = soleLoopReader(op, cvt);
      ok = dot && dot->kind() == OpKind::Dot && accepts(*dot, op.result());
      if (ok) readers.push_back(dot);
      return;
    }
    if (op.kind() == OpKind::Dot && !inLoopBelow(op, cvt.parentBlock()) && outside) {
      ok = outside(op);
      return;
    }
    ok = op.kind() == OpKind::Dot && accepts(op, cvt.result()) && inLoopBelow(op, cvt.parentBlock());
    if (ok) readers.push_back(&op);
  });
  return ok ? readers : std::vector<const ir::Op*>{};
}

// The descriptor view of the one-slot buffer a local_load reads (the resident tiles the "wgmma"
// pass writes), when it is stored as wgmma reads an operand whose K is dimension `kDim`, with the
// buffer's own contiguous dimension (`contiguousDim` < 0) or the given one; else empty.
std::optional<WgmmaTile> oneSlotWgmmaTile(const ir::Op& localLoad, int kDim, int contiguousDim) {
  if (localLoad.kind() != OpKind::LocalLoad) return std::nullopt;
  const ir::Type& buf = localLoad.operand(0)->type();
  if (!buf.isSharedBuffer() || buf.slots() != 1 || buf.rank() != 2 ||
      (buf.dtype() != DType::BF16 && buf.dtype() != DType::F16))
    return std::nullopt;
  const int contiguous = contiguousDim >= 0 ? contiguousDim : buf.sharedLayout()->order()[0];
  auto tile = wgmmaTile(buf.shape(), contiguous, kDim, ir::byteWidth(buf.dtype()));
  if (!tile || !(tile->smem == *buf.sharedLayout())) return std::nullopt;
  return tile;
}

// The source tile of a convert that may become a resident wgmma operand: 16-bit, rank 2, with a
// layout, on a wgmma target with resident tiles allowed; else null.
const ir::Type* residentCandidate(const ir::Op& cvt, const Target& target) {
  if (cvt.kind() != OpKind::ConvertLayout || smemADisabled() || wgmmaDisabled() || !target.has(Feature::Wgmma) ||
      !cvt.parentBlock())
    return nullptr;
  const ir::Type& xt = cvt.operand(0)->type();
  if (!xt.isTile() || xt.rank() != 2 || !xt.hasLayout() || (xt.dtype() != DType::BF16 && xt.dtype() != DType::F16))
    return nullptr;
  return &xt;
}

// The dimension a register tile's registers run along.
int contiguousDimOf(const ir::Type& t) {
  const Layout& l = *t.layout();
  return l.contiguousRegisters(0) > l.contiguousRegisters(1) ? 0 : 1;
}
}  // namespace

std::optional<WgmmaTile> wgmmaResidentBTile(const ir::Op& localLoad) { return oneSlotWgmmaTile(localLoad, 0, -1); }

bool wgmmaShapeFits(int64_t M, int64_t N, int64_t K, int numWarps, const Target& target) {
  const std::optional<MmaShape> shape = target.description().wgmmaShape(N);
  return shape && numWarps % 4 == 0 && M == (shape->m / 4) * numWarps && K % shape->k == 0;
}

namespace {
bool splitAlongNDisabled() {
  const char* e = std::getenv("FLEXTILE_WGMMA_SPLIT_N");
  return e && std::strcmp(e, "0") == 0;
}
}  // namespace

int64_t wgmmaGroupsAlongN(int64_t M, int64_t N, int64_t K, int numWarps, ir::DType operands, const Target& target) {
  if (!target.has(Feature::Wgmma) || wgmmaDisabled() || splitAlongNDisabled()) return 1;
  if ((operands != DType::BF16 && operands != DType::F16) || numWarps % 4 != 0 || M % 64 != 0 ||
      16 * numWarps <= M)
    return 1;
  const int64_t groups = 16 * numWarps / M;
  if (N % groups != 0 || !wgmmaShapeFits(M, N / groups, K, numWarps / int(groups), target)) return 1;
  return groups;
}

bool wgmmaAccumulatorFits(const ir::Op& dot, const Target& target) { return wgmmaAccumulator(dot, target).has_value(); }

std::optional<WgmmaPlan> wgmmaPlan(const ir::Op& dot, const Target& target) {
  const auto nk = wgmmaAccumulator(dot, target);
  if (!nk) return std::nullopt;
  const DType t = dot.operand(0)->type().dtype();
  // B resident in shared memory: a one-slot buffer the "wgmma" pass wrote before the loop
  // (wgmmaResidentB), read as it is.
  if (const ir::Op* b = dot.operand(1)->definingOp();
      b && b->kind() == OpKind::LocalLoad && inLoopBelow(dot, b->parentBlock()))
    if (auto tile = wgmmaResidentBTile(*b); tile && tile->mnBlockAligned(nk->first))
      return WgmmaPlan{b, *tile, nk->first, nk->second};
  const ir::Op* load = wgmmaSource(dot);
  if (!load || load->parentBlock() != dot.parentBlock()) return std::nullopt;
  const bool fromBuffer = load->kind() == OpKind::LocalLoad;
  // The convert (and trans) between the load and the dot feed nothing else.
  const ir::Block& body = *dot.parentBlock();
  const ir::Op* first = dot.operand(1)->definingOp();
  const bool transposed = first->kind() == OpKind::Trans;
  const ir::Op* cvt = transposed ? first->operand(0)->definingOp() : first;
  // Other converts of the same ring tile may feed other products (LowerPipeline.cpp checks that
  // each of them runs on wgmma too, since the slot then holds the wgmma layout).
  if (!onlyUser(dot.operand(1), &dot, body)) return std::nullopt;
  bool onlyConverts = true;  // (a local_load is its own convert)
  std::function<void(const ir::Block&)> scanUsers = [&](const ir::Block& blk) {
    if (fromBuffer) return;
    for (const auto& o : blk.ops()) {
      for (const ir::Value* v : o->operands())
        if (v == load->result() && o->kind() != OpKind::ConvertLayout) onlyConverts = false;
      for (const auto& r : o->regions()) scanUsers(*r);
    }
  };
  scanUsers(body);
  if (!onlyConverts) return std::nullopt;
  if (transposed && !onlyUser(cvt->result(), first, body)) return std::nullopt;
  const auto [N, K] = *nk;
  const bool splitsN = dot.result()->type().shape()[1] != N;

  // The contiguous dimension: the buffer's, or the one the load's registers run along.
  const ir::Type& source = fromBuffer ? load->operand(0)->type() : load->result()->type();
  const int contiguous = fromBuffer ? source.sharedLayout()->order()[0] : contiguousDimOf(source);
  // B = load ([K, N]) or trans(load) ([N, K]); K-major when B's K is contiguous.
  const int kDimOfLoad = transposed ? 1 : 0;
  auto tile = wgmmaTile(source.shape(), contiguous, kDimOfLoad, ir::byteWidth(t));
  if (!tile || (fromBuffer && !(tile->smem == *source.sharedLayout()))) return std::nullopt;
  if (splitsN && !tile->mnBlockAligned(N)) return std::nullopt;
  return WgmmaPlan{load, *tile, N, K};
}

namespace {
// Whether `dot` reads `a` as its A operand and nowhere else.
bool readsAsA(const ir::Op& dot, const ir::Value* a) {
  return dot.operand(0) == a && dot.operand(1) != a && dot.operand(2) != a;
}

// Whether `dot`'s A is trans(convert(x)) that wgmmaResidentA can keep in shared memory, read
// M-major: the shape of the rule, before B is known to be readable (so wgmmaStagedB can ask).
bool residentMMajorA(const ir::Op& dot, const Target& target) {
  const ir::Op* trans = dot.operand(0)->definingOp();
  const ir::Op* cvt = trans && trans->kind() == OpKind::Trans ? trans->operand(0)->definingOp() : nullptr;
  const ir::Type* xt = cvt ? residentCandidate(*cvt, target) : nullptr;
  if (!xt || contiguousDimOf(*xt) != 1 || !wgmmaTile(xt->shape(), 1, 0, ir::byteWidth(xt->dtype()))) return false;
  if (const ir::Function* f = cvt->function(); f && f->intAttrOr("wgmma_register_a", 0) != 0) return false;
  return soleLoopReader(*trans, *cvt) == &dot && readsAsA(dot, trans->result()) && wgmmaAccumulator(dot, target);
}
}  // namespace

std::optional<WgmmaResident> wgmmaResidentA(const ir::Op& cvt, const Target& target) {
  const ir::Type* xt = residentCandidate(cvt, target);
  if (!xt) return std::nullopt;
  // A kernel may keep its A operands in registers: the forward measured 3-6 % slower with Q
  // resident on the H200 (bench/RESULTS.md, 2026-12-01), the backward 15-18 % faster.
  if (const ir::Function* f = cvt.function(); f && f->intAttrOr("wgmma_register_a", 0) != 0) return std::nullopt;
  // x's dimension 1 contiguous: A = x read K-major, or A = trans(x) read M-major (imm-trans-a;
  // the atomic dQ's Kᵀ). Both store x in the same layout, so one buffer serves both.
  if (contiguousDimOf(*xt) != 1) return std::nullopt;
  auto tile = wgmmaTile(xt->shape(), 1, 1, ir::byteWidth(xt->dtype()));
  if (!tile) return std::nullopt;
  // Operand 0 of wgmma dots (directly, or through a trans that only that dot reads) and nothing
  // else of them. Dots outside the loops (the prologue of a loop that defer-accumulation rotated)
  // read the tile back into registers with ldmatrix, each from its own local_load.
  const ir::Value* a = cvt.result();
  const bool readable = ldmatrixReadPlan(tile->smem, *a->type().layout(), xt->dtype()).has_value();
  WgmmaResident out{*tile, loopDotReaders(
                               cvt,
                               [&](const ir::Op& dot, const ir::Value* read) {
                                 return readsAsA(dot, read) && wgmmaPlan(dot, target);
                               },
                               [&](const ir::Op& dot) { return readable && readsAsA(dot, a); },
                               /*throughTrans=*/true)};
  if (out.readers.empty()) return std::nullopt;
  return out;
}

std::optional<WgmmaResident> wgmmaResidentB(const ir::Op& cvt, const Target& target) {
  const ir::Type* xt = residentCandidate(cvt, target);
  if (!xt) return std::nullopt;
  auto tile = wgmmaTile(xt->shape(), contiguousDimOf(*xt), 0, ir::byteWidth(xt->dtype()));
  if (!tile) return std::nullopt;
  // Operand 1 of dots that wgmma runs once B is resident.
  const ir::Value* b = cvt.result();
  WgmmaResident out{*tile, loopDotReaders(cvt, [&](const ir::Op& dot, const ir::Value*) {
                       return dot.operand(1) == b && dot.operand(0) != b && dot.operand(2) != b &&
                              wgmmaAccumulator(dot, target) && dot.operand(0)->type().dtype() == xt->dtype();
                     })};
  if (out.readers.empty()) return std::nullopt;
  return out;
}

std::optional<WgmmaResident> wgmmaStagedB(const ir::Op& cvt, const Target& target) {
  const ir::Type* xt = residentCandidate(cvt, target);
  if (!xt) return std::nullopt;
  const ir::Block& block = *cvt.parentBlock();
  // Inside a loop only for a dot whose A is resident M-major (the atomic dQ's Kᵀ dSᵀ): its B is
  // then staged every iteration; other products computed in a loop keep their register paths.
  bool inLoop = false;
  for (const ir::Op* loop = block.parentOp(); loop; loop = loop->parentBlock() ? loop->parentBlock()->parentOp() : nullptr)
    inLoop = inLoop || loop->kind() == OpKind::For;
  // The one reader: a dot, or a trans that only a dot reads.
  auto soleReader = [&](const ir::Value* v) -> const ir::Op* {
    const ir::Op* reader = nullptr;
    for (const auto& op : block.ops())
      for (const ir::Value* o : op->operands())
        if (o == v) {
          if (reader) return nullptr;
          reader = op.get();
        }
    return reader && onlyUser(v, reader, block) ? reader : nullptr;
  };
  const ir::Op* reader = soleReader(cvt.result());
  if (!reader) return std::nullopt;
  const bool transposed = reader->kind() == OpKind::Trans;
  const ir::Op* dot = transposed ? soleReader(reader->result()) : reader;
  if (!dot) return std::nullopt;
  const ir::Value* b = transposed ? reader->result() : cvt.result();
  if (dot->kind() != OpKind::Dot || dot->operand(1) != b || dot->operand(0) == b || dot->operand(2) == b ||
      !wgmmaAccumulator(*dot, target) ||
      dot->operand(0)->type().dtype() != xt->dtype())
    return std::nullopt;
  if (inLoop && !residentMMajorA(*dot, target)) return std::nullopt;
  // B = x ([K, N]) or trans(x) (x is [N, K]).
  auto tile = wgmmaTile(xt->shape(), contiguousDimOf(*xt), transposed ? 1 : 0, ir::byteWidth(xt->dtype()));
  if (!tile) return std::nullopt;
  return WgmmaResident{*tile, {dot}};
}

std::optional<WgmmaResident> wgmmaStagedA(const ir::Op& cvt, const Target& target) {
  const ir::Type* xt = residentCandidate(cvt, target);
  if (!xt || !cvt.parentBlock()->parentOp() || cvt.parentBlock()->parentOp()->kind() != OpKind::For) return std::nullopt;
  // Every reader (in the convert's block) a wgmma dot taking it as A whose warpgroups split N or
  // replicate the tile: there A's rows are in the other warpgroup's registers too, so the
  // alternative is a conversion through shared memory anyway. (dSᵀ is the A of each chunk's dK.)
  const ir::Block& block = *cvt.parentBlock();
  auto tile = wgmmaTile(xt->shape(), 1, 1, ir::byteWidth(xt->dtype()));
  if (!tile) return std::nullopt;
  WgmmaResident out{*tile, {}};
  for (const auto& op : block.ops()) {
    if (std::find(op->operands().begin(), op->operands().end(), cvt.result()) == op->operands().end()) continue;
    if (op->kind() != OpKind::Dot || !readsAsA(*op, cvt.result()) || !wgmmaAccumulator(*op, target)) return std::nullopt;
    const ir::Type& acc = op->result()->type();
    if (acc.shape()[0] == 16 * acc.layout()->numWarps() || !wgmmaPlan(*op, target)) return std::nullopt;
    out.readers.push_back(op.get());
  }
  size_t readers = 0;  // anywhere: one in a nested region rules the tile out
  cvt.function()->walk([&](const ir::Op& op) {
    readers += size_t(std::count(op.operands().begin(), op.operands().end(), cvt.result()));
  });
  if (out.readers.empty() || readers != out.readers.size()) return std::nullopt;
  return out;
}

bool hasWgmmaDots(const ir::Function& f, const Target& target) {
  bool any = false;
  f.walk([&](const ir::Op& op) { any = any || (op.kind() == OpKind::Dot && wgmmaPlan(op, target)); });
  return any;
}

// One slot: the resident tiles the "wgmma" pass writes. An A ring of the pipeline (the matmul's,
// whose swizzle can equal wgmma's) keeps ldmatrix until A from a ring slot has been checked on
// the GPU.
std::optional<WgmmaTile> wgmmaResidentATile(const ir::Op& localLoad) { return oneSlotWgmmaTile(localLoad, 1, 1); }

std::optional<WgmmaResidentAView> wgmmaResidentAView(const ir::Value* a) {
  const ir::Op* d = a->definingOp();
  if (d && d->kind() == OpKind::LocalLoad) {
    if (auto tile = wgmmaResidentATile(*d)) return WgmmaResidentAView{d, *tile, 0};
    return std::nullopt;
  }
  const ir::Op* load = d && d->kind() == OpKind::Trans ? d->operand(0)->definingOp() : nullptr;
  if (!load || load->kind() != OpKind::LocalLoad) return std::nullopt;
  if (auto tile = oneSlotWgmmaTile(*load, 0, 1); tile && tile->mnMajor) return WgmmaResidentAView{load, *tile, 1};
  return std::nullopt;
}

std::string wgmmaSettingsIdentity() {
  std::string out;
  if (wgmmaDisabled()) out += "; FLEXTILE_WGMMA=0";
  if (smemADisabled()) out += "; FLEXTILE_WGMMA_SMEM_A=0";
  if (!wgmmaBStepsAdded()) out += "; FLEXTILE_WGMMA_B_STEPS=0";
  if (splitAlongNDisabled()) out += "; FLEXTILE_WGMMA_SPLIT_N=0";
  return out;
}

}  // namespace flextile::codegen
