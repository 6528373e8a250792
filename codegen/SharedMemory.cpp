#include "codegen/SharedMemory.h"

#include "codegen/TensorCores.h"
#include "codegen/TensorMaps.h"

#include <algorithm>
#include <array>
#include <functional>
#include <tuple>
#include <vector>

namespace flextile::codegen {

using ir::Op;
using ir::OpKind;

namespace {
constexpr int64_t kAlign = 16;
// Buffers of 1 KB and more start at multiples of 1 KB: the 128-byte swizzle
// that wgmma and TMA apply is a function of the absolute shared address, so
// its 8-row pattern (1024 bytes) must start aligned.
constexpr int64_t kWideAlign = 1024;
int64_t alignmentOf(int64_t bytes) { return bytes >= kWideAlign ? kWideAlign : kAlign; }
int64_t alignUp(int64_t v, int64_t a) { return (v + a - 1) / a * a; }
int64_t tileBytes(const ir::Value* v) { return v->type().numElements() * ir::byteWidth(v->type().dtype()); }
}  // namespace

bool reduceNeedsScratch(const Op& reduce) {
  const auto& layout = reduce.operand(0)->type().layout();
  if (!layout) throw Error(reduce.describe() + ": shared-memory planning needs layouts (run assignLayouts first)");
  int axis = int(reduce.intAttr("axis"));
  for (const auto& b : layout->warpBases())
    if (b[size_t(axis)] != 0) return true;
  return false;
}

bool atomicOldValuesShared(const Op& atomic) {
  const ir::Value* old = atomic.result();
  if (old->type().isTile()) {
    const auto& layout = old->type().layout();
    if (!layout) throw Error(atomic.describe() + ": shared-memory planning needs layouts (run assignLayouts first)");
    if (layout->replicatedLaneMask() == 0 && layout->replicatedWarpMask() == 0) return false;
  }
  return atomic.function()->hasUses(old);
}

int64_t sharedSlotBytes(const ir::Type& buffer) {
  return alignUp(ir::numElements(buffer.shape()) * ir::byteWidth(buffer.dtype()), kAlign);
}

namespace {
int64_t countOps(const Op& op) {
  int64_t n = 0;
  for (const auto& r : op.regions())
    for (const auto& o : r->ops()) n += 1 + countOps(*o);
  return n;
}
}  // namespace

bool addsRowsInBulk(const Op& atomic) { return atomic.hasAttr("bulk_rows") && atomic.intAttr("bulk_rows") != 0; }
bool addsTensorInBulk(const Op& atomic) { return atomic.hasAttr("bulk_tensor") && atomic.intAttr("bulk_tensor") != 0; }
bool addsInBulk(const Op& atomic) { return addsRowsInBulk(atomic) || addsTensorInBulk(atomic); }

namespace {
// Shared-memory wavefronts of the stores of a tile in `l` into `s` as storeToSwizzledTile issues
// them (codegen/LowerLayoutConversion.cpp): v registers along the row a store, the lanes in phases
// of 128 bytes, each phase as many wavefronts as the most distinct words one of the 32 banks gets.
int64_t sharedStoreWavefronts(const ir::Layout& l, const ir::SharedLayout& s) {
  int64_t v = std::min<int64_t>(l.contiguousRegisters(s.order()[0]), s.vec());
  for (const ir::Layout::Bases* bases : {&l.laneBases(), &l.warpBases()})
    for (const auto& basis : *bases)
      while (v > 1 && s.offsetOf(basis) % v != 0) v /= 2;
  const int64_t lanesPerPhase = std::max<int64_t>(1, 32 / v);
  int64_t total = 0;
  for (int64_t r = 0; r < l.numRegisters(); r += v)
    for (int64_t first = 0; first < 32; first += lanesPerPhase) {
      std::array<std::vector<int64_t>, 32> byBank;
      for (int64_t lane = first; lane < first + lanesPerPhase; ++lane)
        for (int64_t i = 0; i < v; ++i) {
          const int64_t word = s.offsetOf(l.apply(r + i, lane, 0));
          std::vector<int64_t>& words = byBank[size_t(word % 32)];
          if (std::find(words.begin(), words.end(), word) == words.end()) words.push_back(word);
        }
      size_t most = 0;
      for (const auto& words : byBank) most = std::max(most, words.size());
      total += int64_t(most);
    }
  return total;
}
}  // namespace

ir::SharedLayout bulkTensorStaging(const Op& atomic) {
  const ir::Type& t = atomic.operand(0)->type();
  const ir::Shape& shape = t.shape();
  const int64_t rowBytes = shape.back() * 4;
  if (rowBytes < 32) return ir::SharedLayout::plain(shape, {1, 0}, 4);
  // TMA's swizzled spans of 128, 64 and 32 bytes: the one whose stores meet the fewest bank
  // conflicts, the widest of equals (fewer panels, fewer reductions). wgmma's transposed
  // accumulator (the specialized atomic dQ) is conflict-free at 128; the mma accumulator, four
  // lanes a row, at 32 only (its 8-byte stores cover rows r and r ^ 1 alike in a 128-byte span).
  std::optional<ir::SharedLayout> best;
  int64_t bestWavefronts = 0;
  for (int64_t span = std::min<int64_t>(128, rowBytes); span >= 32; span /= 2) {
    ir::SharedLayout s(shape, {1, 0}, 4, 128 / span, span / 16, 4, span / 4);
    if (!t.hasLayout()) return s;
    const int64_t wavefronts = sharedStoreWavefronts(*t.layout(), s);
    if (!best || wavefronts < bestWavefronts) best = s, bestWavefronts = wavefronts;
  }
  return *best;
}

bool bulkStoresPaired(const ir::Layout& l) {
  if (l.numRegisters() < 2 || l.regCoord(1) != ir::Layout::Coord{0, 1}) return false;
  // Every thread's own column part even: the lanes' and warps' column bits are all even.
  for (const ir::Layout::Bases* bases : {&l.laneBases(), &l.warpBases()})
    for (const auto& basis : *bases)
      if (basis[1] % 2 != 0) return false;
  return true;
}

namespace {
// Shared-memory wavefronts of one warp's stores of the tile in `l` into rows of `strideWords`
// 4-byte words: per store instruction, the lanes go in phases of 128 bytes (32 lanes of 4 bytes, 16
// of 8), and a phase takes as many wavefronts as the most distinct words one of the 32 banks holds.
int64_t bulkStagingWavefronts(const ir::Layout& l, int64_t strideWords, bool pairs) {
  const int64_t words = pairs ? 2 : 1, lanesPerPhase = 32 / words;
  int64_t total = 0;
  for (int64_t r = 0; r < l.numRegisters(); r += words)
    for (int64_t first = 0; first < 32; first += lanesPerPhase) {
      std::array<std::array<int64_t, 32>, 32> byBank;  // the distinct words of each bank (32 accesses a phase)
      std::array<int64_t, 32> distinct{};
      for (int64_t lane = first; lane < first + lanesPerPhase; ++lane) {
        const ir::Layout::Coord c = l.apply(r, lane, 0);
        for (int64_t w = 0; w < words; ++w) {
          const int64_t word = c[0] * strideWords + c[1] + w, bank = word % 32;
          auto* end = byBank[size_t(bank)].begin() + distinct[size_t(bank)];
          if (std::find(byBank[size_t(bank)].begin(), end, word) == end) *end = word, ++distinct[size_t(bank)];
        }
      }
      total += *std::max_element(distinct.begin(), distinct.end());
    }
  return total;
}
}  // namespace

int64_t bulkRowStride(const Op& atomic) {
  const ir::Type& t = atomic.operand(0)->type();
  const int64_t rowBytes = t.shape().back() * ir::byteWidth(t.pointee());
  if (!t.hasLayout()) return rowBytes + 32;
  // The pad (a multiple of the engine's 16 bytes) that leaves the owners' stores the fewest bank
  // conflicts; the smallest such. wgmma's accumulator stored row by row wants 32 bytes, the same
  // transposed (the specialized atomic dQ: lanes along rows 0, 2, 4, 6) 16: at 32 its rows 0 and 4
  // meet in the same banks, two wavefronts a store instead of one.
  const ir::Layout& l = *t.layout();
  const bool pairs = bulkStoresPaired(l);
  int64_t best = 0, bestWavefronts = -1;
  for (int64_t pad = 0; pad < 128; pad += 16) {
    const int64_t wavefronts = bulkStagingWavefronts(l, (rowBytes + pad) / 4, pairs);
    if (bestWavefronts < 0 || wavefronts < bestWavefronts) {
      best = pad;
      bestWavefronts = wavefronts;
    }
  }
  return rowBytes + best;
}

int64_t dotScratchBOffset(const Op& dot) { return alignUp(tileBytes(dot.operand(0)), kAlign); }

int64_t clusterGatherOffset(const Op& gather, size_t operand) {
  int64_t offset = 0;
  for (size_t i = 0; i < operand; ++i) offset += alignUp(tileBytes(gather.operand(i)), kAlign);
  return offset;
}

int64_t scratchBytes(const Op& op) {
  switch (op.kind()) {
    case OpKind::ConvertLayout: return tileBytes(op.operand(0));
    case OpKind::LocalAlloc: return op.result()->type().slots() * sharedSlotBytes(op.result()->type());
    case OpKind::Reduce:
      if (!op.operand(0)->type().isTile() || !reduceNeedsScratch(op)) return 0;
      return int64_t(op.function()->numWarps()) * op.result()->type().numElements() *
             ir::byteWidth(op.result()->type().dtype());
    case OpKind::AtomicAdd:
      if (addsRowsInBulk(op)) {
        const int64_t rows = op.operand(0)->type().shape()[0];
        return rows * bulkRowStride(op) + rows * 8 + int64_t(op.function()->numWarps()) * 32 * 8;
      }
      if (addsTensorInBulk(op)) return tileBytes(op.operand(1));
      return atomicOldValuesShared(op) ? tileBytes(op.result()) : 0;
    case OpKind::Dot:
      if (isMmaDot(op)) return 0;  // operands arrive in registers (dot-operand layouts)
      return dotScratchBOffset(op) + tileBytes(op.operand(1));
    case OpKind::ClusterAllGather: return clusterGatherOffset(op, op.numOperands());
    default:
      return 0;
  }
}

namespace {
// A convert that would keep its tile resident (placeBuffers' `resident`): its scratch lives from
// the convert to the end of the last loop whose dots read it as A.
SharedPlan placeBuffers(const ir::Function& f, const std::set<const Op*>& resident) {
  // Live ranges in program order: a buffer lives at its op, except a shared
  // buffer (from its alloc to its last use, through the loops that use it).
  struct Buffer {
    const Op* owner;
    int64_t bytes;
    int start, end;
    int64_t offset = 0;
  };
  std::vector<Buffer> buffers;
  int position = 0;
  std::map<const Op*, std::pair<int, int>> span;  // positions of each op and its last nested op
  auto requireLayout = [&](const ir::Value* v, const Op& op) {
    if (v->type().isTile() && !v->type().hasLayout())
      throw Error("shared-memory planning of '" + f.name() + "': " + op.describe() + " has a tile without a layout (" +
                  v->type().str() + "); run assignLayouts first");
  };
  f.walk([&](const Op& op) {
    for (const ir::Value* v : op.operands()) requireLayout(v, op);
    for (const ir::Value* v : op.results()) requireLayout(v, op);
    span[&op] = {position, position + int(countOps(op))};
    int64_t b = scratchBytes(op);
    if (b > 0) buffers.push_back(Buffer{&op, alignUp(b, kAlign), position, position});
    ++position;
  });
  // The end of `buf` grows to cover `op`: the op itself, or, when it sits in a loop that does
  // not hold the buffer's op, the whole of that loop (the op of the owner's block holding it).
  auto cover = [&](Buffer& buf, const Op& op) {
    const ir::Block* home = buf.owner->parentBlock();
    const Op* outer = &op;
    while (outer && outer->parentBlock() != home) outer = outer->parentBlock() ? outer->parentBlock()->parentOp() : nullptr;
    if (outer) buf.end = std::max(buf.end, span.at(outer).second);
  };
  auto uses = [](const Op& op, const ir::Value* v) {
    return std::find(op.operands().begin(), op.operands().end(), v) != op.operands().end();
  };
  for (Buffer& buf : buffers) {
    if (buf.owner->kind() == OpKind::LocalAlloc) {
      // A shared buffer lives until its last use, and until the last use of every tile read
      // from it: a local_load that a wgmma reads through a descriptor is the buffer's bytes.
      const ir::Value* v = buf.owner->result();
      std::set<const ir::Value*> reads;
      f.walk([&](const Op& op) {
        if (op.kind() == OpKind::LocalLoad && op.operand(0) == v) reads.insert(op.result());
      });
      f.walk([&](const Op& op) {
        bool touches = uses(op, v);
        for (const ir::Value* r : reads) touches = touches || uses(op, r);
        if (touches) cover(buf, op);
      });
    } else if (buf.owner->kind() == OpKind::AtomicAdd && addsInBulk(*buf.owner)) {
      // The engine may still read the rows after the op: its bytes are its own from the start of
      // the outermost loop around it (its next iteration, which waits first) to the kernel's end.
      const Op* top = buf.owner;
      while (top->parentBlock() && top->parentBlock()->parentOp()) top = top->parentBlock()->parentOp();
      buf.start = span.at(top).first;
      buf.end = position;
    } else if (resident.count(buf.owner)) {
      f.walk([&](const Op& op) {
        if (op.kind() == OpKind::Dot && (op.operand(0) == buf.owner->result() || op.operand(1) == buf.owner->result()))
          cover(buf, op);
      });
    }
  }
  // Shared buffers may be TMA destinations; a bulk_tensor atomic_add's tile is a TMA source, its
  // swizzle a function of the address.
  auto alignmentOfBuffer = [](const Buffer& b) {
    if (b.owner->kind() == OpKind::LocalAlloc) return std::max(kTmaPlainAlignment, alignmentOf(b.bytes));
    if (b.owner->kind() == OpKind::AtomicAdd && addsTensorInBulk(*b.owner))
      return std::max(alignmentOf(b.bytes), tmaSlotAlignment(bulkTensorStaging(*b.owner)));
    return alignmentOf(b.bytes);
  };
  // Greedy by size (largest first): each buffer takes the lowest aligned
  // offset not used by an already placed buffer whose live range overlaps.
  std::vector<Buffer*> order;
  for (auto& b : buffers) order.push_back(&b);
  std::stable_sort(order.begin(), order.end(), [](const Buffer* a, const Buffer* b) { return a->bytes > b->bytes; });
  std::vector<const Buffer*> placed;
  int64_t total = 0;
  for (Buffer* b : order) {
    std::vector<std::pair<int64_t, int64_t>> busy;
    for (const Buffer* p : placed)
      if (p->start <= b->end && b->start <= p->end) busy.push_back({p->offset, p->offset + p->bytes});
    std::sort(busy.begin(), busy.end());
    int64_t off = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (auto [lo, hi] : busy)
        if (off + b->bytes > lo && off < hi) {
          off = alignUp(hi, alignmentOfBuffer(*b));
          moved = true;
        }
    }
    b->offset = off;
    placed.push_back(b);
    total = std::max(total, off + b->bytes);
  }
  SharedPlan plan;
  for (const auto& b : buffers) {
    if (b.offset + b.bytes > int64_t(1) << 30)
      throw Error(b.owner->describe() + ": needs " + std::to_string(b.bytes) + " bytes of shared memory",
                  ErrorKind::ResourceLimit);
    plan.offset[b.owner] = int(b.offset);
    plan.bytes[b.owner] = int(b.bytes);
  }
  plan.totalBytes = int(total);
  return plan;
}
}  // namespace

SharedPlan planSharedMemory(const ir::Function& f) { return placeBuffers(f, {}); }

std::vector<const Op*> residentAConverts(const ir::Function& f, const Target& target) {
  std::vector<const Op*> resident;
  f.walk([&](const Op& op) {
    if (op.kind() == OpKind::ConvertLayout && (wgmmaResidentA(op, target) || wgmmaResidentB(op, target)))
      resident.push_back(&op);
  });
  // Resident tiles add their bytes to every loop that reads them: when that no longer fits,
  // the kernel keeps register A (it compiled so before). The plan counts one buffer per convert,
  // also where the wgmma pass lets two converts of one tile share a buffer: an upper bound.
  if (!resident.empty() &&
      placeBuffers(f, std::set<const Op*>(resident.begin(), resident.end())).totalBytes > target.maxSharedBytesPerBlock())
    return {};
  return resident;
}

std::vector<const Op*> stagedAConverts(const ir::Function& f, const Target& target) {
  std::vector<const Op*> staged;
  f.walk([&](const Op& op) {
    if (op.kind() == OpKind::ConvertLayout && wgmmaStagedA(op, target)) staged.push_back(&op);
  });
  if (staged.empty()) return {};
  std::vector<const Op*> all = residentAConverts(f, target);
  all.insert(all.end(), staged.begin(), staged.end());
  if (placeBuffers(f, std::set<const Op*>(all.begin(), all.end())).totalBytes > target.maxSharedBytesPerBlock())
    return {};
  return staged;
}

void checkSharedMemoryFits(const SharedPlan& plan, const ir::Function& f, const Target& target) {
  if (plan.totalBytes <= target.maxSharedBytesPerBlock()) return;
  // The largest users first (at most three), so the message says where the bytes go.
  std::vector<const Op*> users;
  for (const auto& [op, bytes] : plan.bytes) users.push_back(op);
  std::stable_sort(users.begin(), users.end(), [&](const Op* a, const Op* b) {
    return plan.bytes.at(a) != plan.bytes.at(b) ? plan.bytes.at(a) > plan.bytes.at(b) : a->describe() < b->describe();
  });
  bool hinted = false;  // the advice once, at the first ring named
  auto describeUser = [&](const Op* op) {
    std::string s = op->describe() + " with " + std::to_string(plan.bytes.at(op)) + " bytes";
    if (op->kind() == OpKind::LocalAlloc) {
      s += " (" + std::to_string(op->result()->type().slots()) + " pipeline stages";
      s += hinted ? ")" : ": lower num_stages or the tile sizes)";
      hinted = true;
    }
    return s;
  };
  std::string where;
  if (!users.empty()) where = "; the largest user is " + describeUser(users[0]);
  for (size_t i = 1; i < std::min<size_t>(3, users.size()); ++i)
    where += (i == 1 ? "; then " : ", ") + describeUser(users[i]);
  if (users.size() > 3) where += " (" + std::to_string(users.size()) + " buffers in all)";
  throw Error("function '" + f.name() + "' needs " + std::to_string(plan.totalBytes) + " bytes of shared memory, " +
                  target.smName() + " allows " + std::to_string(target.maxSharedBytesPerBlock()) + where,
              ErrorKind::ResourceLimit);
}

}  // namespace flextile::codegen
