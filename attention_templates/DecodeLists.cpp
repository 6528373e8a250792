#include "attention_templates/DecodeLists.h"

#include "runtime/Stream.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace flextile::attention {

using namespace flextile::dsl;

namespace {

// ---- the kernel ----------------------------------------------------------------
//
// One program per (b, h) row of the mask. It walks the entries of the covering mask rows (the
// block rows that hold some of the queries, at most ROWS of them) in ascending block order: the
// full and the partial list of every covering row are sorted, so a merge with one cursor per list
// visits each candidate block once, lowest first, and consuming every list whose head is that
// block drops the duplicates between rows. For the candidate it knows the block's state in each
// covering row (full: its list had it at the head; partial; else empty), and it counts, over the
// [QT, KV_BLOCK_SIZE] tile of (query, key) pairs with the query in the range and the key below
// KV_LEN, the allowed ones: a pair whose row lists the block full is allowed, one whose row lists it
// empty is not, one whose row lists it partial asks mask_mod at the global positions. None allowed:
// dropped; all: appended to the full list; else to the partial list. Appending in visiting order
// keeps both lists ascending.
//
// The IR has no branches, so every step evaluates mask_mod on its tile; a block full in every
// covering row ignores the result (its pairs are all allowed by the first rule), which is the
// "full stays full without mask_mod" of the definition. The loop runs once per entry of the
// covering rows; when rows share blocks the merge finishes early and the remaining steps find
// every cursor exhausted and write nothing.
//
// Stores: the entries of a row are written by the loop below its final count, then the padding
// from the count to the end by a second loop, so no address is written twice in one program (two
// threads of a program are not ordered on the GPU).
constexpr int64_t kClearTile = 64;

Kernel makeDecodeListsKernel(const MaskMod& held) {
  return kernel("decode_block_lists", [held](Ptr<i32> fullNum, Ptr<i32> fullIndices, Ptr<i32> partialNum,
                                             Ptr<i32> partialIndices, Ptr<i32> outFullNum, Ptr<i32> outFullIndices,
                                             Ptr<i32> outPartialNum, Ptr<i32> outPartialIndices, Int heads,
                                             Int listBStride, Int listHStride, Int numKv, Int kvLen,
                                             Int maskRowStart, Int queryStart, Int queryCount, Const<int> QBS,
                                             Const<int> KVBS, Const<int> ROWS, Const<int> QT) {
    const int rows = ROWS.value;
    Tile bh = program_id(0);
    Tile b = bh / heads, h = bh % heads;
    // Global position of the first query of mask row 0 is maskRowStart; the covering rows are
    // firstRow .. lastRow (at most ROWS of them, the host checked).
    Tile firstRow = (queryStart - maskRowStart) / QBS;
    Tile lastRow = (queryStart + queryCount - 1 - maskRowStart) / QBS;
    Tile rowsCovered = lastRow - firstRow + 1;
    Tile listRow0 = b * listBStride + h * listHStride + firstRow;

    // Per covering row k: its list counts and where its indices start. A row index past the
    // covering rows (k >= rowsCovered) reads nothing and counts 0.
    std::vector<Tile> fullCount, partialCount, listBase;
    Tile steps = scalar(0, DType::I32);
    for (int k = 0; k < rows; ++k) {
      Tile covering = rowsCovered > k;
      fullCount.push_back(load(fullNum + (listRow0 + k), covering, 0));
      partialCount.push_back(load(partialNum + (listRow0 + k), covering, 0));
      listBase.push_back((listRow0 + k) * numKv);
      steps = steps + fullCount.back() + partialCount.back();
    }

    Tile outBase = bh * numKv;
    Tile qLocal = arange(0, QT).expand(1);  // [QT, 1]
    Tile qPos = queryStart + qLocal;        // global query positions
    Tile qIn = qLocal < queryCount;
    Tile qRow = (qPos - maskRowStart) / QBS - firstRow;  // which covering row holds the query
    Tile kvOffs = arange(0, KVBS).expand(0);             // [1, KVBS]

    // Carried: one cursor per list (full k at 2k, partial k at 2k + 1), then the two output counts.
    std::vector<Tile> init;
    for (int k = 0; k < 2 * rows + 2; ++k) init.push_back(scalar(0, DType::I32));
    std::vector<Tile> done = forRangeImpl(
        0, steps, 1, init,
        [&](Tile, const std::vector<Tile>& carried) {
          std::vector<Tile> fullHead, partialHead;
          for (int k = 0; k < rows; ++k) {
            const Tile& fc = carried[size_t(2 * k)];
            const Tile& pc = carried[size_t(2 * k + 1)];
            // numKv, past every block index, marks an exhausted list.
            fullHead.push_back(load(fullIndices + (listBase[size_t(k)] + fc), fc < fullCount[size_t(k)], numKv));
            partialHead.push_back(
                load(partialIndices + (listBase[size_t(k)] + pc), pc < partialCount[size_t(k)], numKv));
          }
          Tile block = fullHead[0];
          for (int k = 0; k < rows; ++k) block = minimum(minimum(block, fullHead[size_t(k)]), partialHead[size_t(k)]);
          Tile valid = block < numKv;

          // The block's state in the row of each query: full, partial (ask mask_mod) or empty.
          std::vector<Tile> isFull, isPartial;
          Tile rowFull = full({QT.value, 1}, 0, DType::I1), rowPartial = rowFull;
          for (int k = 0; k < rows; ++k) {
            isFull.push_back(fullHead[size_t(k)] == block);
            isPartial.push_back(partialHead[size_t(k)] == block);
            Tile inRow = qRow == k;
            rowFull = rowFull | (inRow & isFull.back());
            rowPartial = rowPartial | (inRow & isPartial.back());
          }
          Tile kvPos = block * KVBS + kvOffs;
          Tile pairIn = qIn & (kvPos < kvLen);
          Tile live = pairIn & (rowFull | (rowPartial & held(b, h, qPos, kvPos)));
          Tile allowed = sum(sum(live, 1), 0);
          Tile inRange = sum(sum(pairIn, 1), 0);
          Tile toFull = valid & (allowed == inRange);
          Tile toPartial = valid & (allowed > 0) & (allowed < inRange);

          const Tile& fullOut = carried[size_t(2 * rows)];
          const Tile& partialOut = carried[size_t(2 * rows + 1)];
          store(outFullIndices + (outBase + fullOut), block, toFull);
          store(outPartialIndices + (outBase + partialOut), block, toPartial);

          std::vector<Tile> next;
          for (int k = 0; k < rows; ++k) {
            next.push_back(carried[size_t(2 * k)] + (valid & isFull[size_t(k)]).to(DType::I32));
            next.push_back(carried[size_t(2 * k + 1)] + (valid & isPartial[size_t(k)]).to(DType::I32));
          }
          next.push_back(fullOut + toFull.to(DType::I32));
          next.push_back(partialOut + toPartial.to(DType::I32));
          return next;
        },
        SourceLoc::current());
    Tile fullWritten = done[size_t(2 * rows)], partialWritten = done[size_t(2 * rows + 1)];
    store(outFullNum + bh, fullWritten);
    store(outPartialNum + bh, partialWritten);
    // Padding: 0 from each count to the end of the row (the buffers are reused, so it is written
    // every time).
    for_range(0, numKv, kClearTile, [&](Tile start) {
      Tile slot = start + arange(0, kClearTile);
      Tile inRow = slot < numKv;
      store(outFullIndices + (outBase + slot), 0, inRow & (slot >= fullWritten));
      store(outPartialIndices + (outBase + slot), 0, inRow & (slot >= partialWritten));
    });
  });
}

// ---- output buffers --------------------------------------------------------------
//
// One i32 allocation per entry holds the four lists, each part starting at a multiple of 16
// elements so that every part has the same (64-byte) alignment in every entry: the alignment is
// part of a compiled kernel's specialization, and a consumer must not recompile because it was
// handed another buffer.
struct ListBuffers {
  Tensor storage;
  bool inUse = false;
};

// Keyed by the stream as well as the shape: a buffer goes back to the pool before the kernels that
// read it have run, which is safe only for the next user on the same stream (see DecodeLists.h).
struct Pool {
  std::mutex mutex;
  std::map<std::tuple<int, void*, int64_t, int64_t, int64_t>, std::vector<std::unique_ptr<ListBuffers>>> entries;
};

// Destroyed at exit, after the last lease (each holds the pool), so that every device buffer is
// freed while the driver is still there (its loader and the devices are never destroyed):
// compute-sanitizer's memcheck counted the pool's buffers as leaks when it was never destroyed.
const std::shared_ptr<Pool>& pool() {
  static const std::shared_ptr<Pool> p = std::make_shared<Pool>();
  return p;
}

// A key keeps at most this many buffers; lists kept alive beyond it get buffers of their own
// (allocated and freed with them, which synchronizes on the GPU).
constexpr size_t kPoolBuffersPerShape = 8;

int64_t roundUp16(int64_t n) { return (n + 15) / 16 * 16; }

void acquire(DecodeBlockLists& out, MemorySpace space, runtime::Stream* stream) {
  const int64_t rows = out.batch * out.heads, cells = rows * out.numKvBlocks;
  const int64_t cellsPadded = roundUp16(cells), rowsPadded = roundUp16(rows);
  const int64_t total = 2 * cellsPadded + 2 * rowsPadded;
  const std::shared_ptr<Pool>& owner = pool();
  Pool& p = *owner;
  ListBuffers* entry = nullptr;
  std::shared_ptr<const void> lease;
  {
    std::lock_guard lock(p.mutex);
    void* queue = space == MemorySpace::Device ? runtime::streamHandle(stream) : nullptr;
    auto& list = p.entries[{int(space), queue, out.batch, out.heads, out.numKvBlocks}];
    for (auto& e : list)
      if (!e->inUse) {
        entry = e.get();
        break;
      }
    if (!entry && list.size() < kPoolBuffersPerShape) {
      list.push_back(std::make_unique<ListBuffers>());
      list.back()->storage = Tensor::empty(DType::I32, {total}, space);
      entry = list.back().get();
    }
    if (entry) {
      entry->inUse = true;
      // The lease goes back to the pool with the last view of this entry.
      lease = std::shared_ptr<const void>(entry, [owner](const void* e) {
        std::lock_guard lock(owner->mutex);
        const_cast<ListBuffers*>(static_cast<const ListBuffers*>(e))->inUse = false;
      });
    }
  }
  const Tensor storage = entry ? entry->storage : Tensor::empty(DType::I32, {total}, space);
  const Shape rowShape{out.batch, out.heads}, cellShape{out.batch, out.heads, out.numKvBlocks};
  out.fullIndices = Tensor::viewOf(storage, 0, cellShape, {}, lease);
  out.partialIndices = Tensor::viewOf(storage, cellsPadded, cellShape, {}, lease);
  out.fullNum = Tensor::viewOf(storage, 2 * cellsPadded, rowShape, {}, lease);
  out.partialNum = Tensor::viewOf(storage, 2 * cellsPadded + rowsPadded, rowShape, {}, lease);
}

// ---- host bounds ---------------------------------------------------------------------

// maxLiveBlocks, mayHaveFull and mayHavePartial from the covering rows' host lists.
void hostBounds(const BlockMask& mask, int64_t firstRow, int64_t lastRow, DecodeBlockLists& out) {
  const int64_t nKv = mask.numKvBlocks();
  if (!mask.hasHostLists()) {  // lists as tensors only: the mask's bounds, for each covering row
    out.maxLiveBlocks = std::min(nKv, mask.maxLiveBlocksPerRow() * (lastRow - firstRow + 1));
    out.mayHaveFull = mask.mayHaveFullBlocks() || mask.mayHavePartialBlocks();
    out.mayHavePartial = mask.mayHavePartialBlocks() || (firstRow != lastRow && out.maxLiveBlocks > 0);
    return;
  }
  std::vector<uint8_t> seen;  // per block: bit 0 listed full by some row, bit 1 partial, bits 2+: rows listing it
  for (int64_t b = 0; b < mask.batch(); ++b)
    for (int64_t h = 0; h < mask.heads(); ++h) {
      if (firstRow == lastRow) {
        // One row: its full blocks stay full, its partial ones may become anything.
        const auto full = mask.fullKvBlocks(b, h, firstRow), partial = mask.partialKvBlocks(b, h, firstRow);
        out.maxLiveBlocks = std::max<int64_t>(out.maxLiveBlocks, int64_t(full.size() + partial.size()));
        out.mayHaveFull |= !full.empty() || !partial.empty();
        out.mayHavePartial |= !partial.empty();
        continue;
      }
      // Several rows: a block is a candidate when some row lists it; it can only be full when
      // every covering row lists it (an empty row contributes forbidden pairs), and it can only be
      // partial when some row lists it partial or some row does not list it at all.
      seen.assign(size_t(nKv), 0);
      std::vector<int32_t> rowsListing(size_t(nKv), 0);
      for (int64_t r = firstRow; r <= lastRow; ++r) {
        for (int32_t c : mask.fullKvBlocks(b, h, r)) seen[size_t(c)] |= 1, ++rowsListing[size_t(c)];
        for (int32_t c : mask.partialKvBlocks(b, h, r)) seen[size_t(c)] |= 2, ++rowsListing[size_t(c)];
      }
      const int32_t coveringRows = int32_t(lastRow - firstRow + 1);
      int64_t live = 0;
      for (int64_t c = 0; c < nKv; ++c) {
        if (!seen[size_t(c)]) continue;
        ++live;
        const bool everyRow = rowsListing[size_t(c)] == coveringRows;
        out.mayHaveFull |= everyRow;
        out.mayHavePartial |= (seen[size_t(c)] & 2) != 0 || !everyRow;
      }
      out.maxLiveBlocks = std::max(out.maxLiveBlocks, live);
    }
}

int64_t nextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

constexpr int64_t kMaxTileElements = 128 * 128;
constexpr int64_t kMaxCoveringRows = 8;

}  // namespace

namespace {

// One step's launch: the checked inputs, the output buffers and the kernel's arguments.
struct StepLaunch {
  DecodeBlockLists out;
  Kernel* kernel = nullptr;
  LaunchOptions options;
  std::vector<KernelArg> args;
};

StepLaunch prepareStep(const BlockMask& mask, int64_t queryStart, int64_t queryCount, MemorySpace space,
                       runtime::Stream* stream) {
  auto fail = [&](const std::string& m) { throw Error("decodeBlockLists: " + m + " (" + mask.describe() + ")"); };
  const int64_t maskFirst = mask.qOffset(), maskEnd = mask.qOffset() + mask.qLen();
  if (queryCount < 1) fail("queryCount must be at least 1, got " + std::to_string(queryCount));
  if (queryStart < maskFirst || queryStart + queryCount > maskEnd)
    fail("queries [" + std::to_string(queryStart) + ", " + std::to_string(queryStart + queryCount) +
         ") are not inside the mask's queries [" + std::to_string(maskFirst) + ", " + std::to_string(maskEnd) + ")");
  const int64_t QBS = mask.qBlockSize(), KVBS = mask.kvBlockSize();
  const int64_t queryTile = nextPow2(queryCount);
  if (queryTile * KVBS > kMaxTileElements)
    fail(std::to_string(queryCount) + " queries by KV_BLOCK_SIZE " + std::to_string(KVBS) +
         " is more than one tile of " + std::to_string(kMaxTileElements) +
         " pairs; a step of that many queries is a prefill: slice the rows (sliceRows) and use flex_attention");
  const int64_t rowStart = mask.qOffset() - mask.qPhase();  // global position of mask row 0's first query
  const int64_t firstRow = (queryStart - rowStart) / QBS, lastRow = (queryStart + queryCount - 1 - rowStart) / QBS;
  // The most rows any range of queryCount queries covers: the kernel is the same for every step.
  const int64_t maxRows = std::min((queryCount - 2 + QBS) / QBS + 1, mask.numQBlocks());
  if (maxRows > kMaxCoveringRows)
    fail(std::to_string(queryCount) + " queries can cover " + std::to_string(maxRows) + " block rows of " +
         std::to_string(QBS) + " queries, more than " + std::to_string(kMaxCoveringRows) +
         "; use a mask with larger query blocks");
  const MaskMod& mod = mask.maskMod();
  if (auto captures = mod.captureSpace(); captures && *captures != space)
    fail("mask_mod '" + mod.name() + "' captures " + (*captures == MemorySpace::Device ? "device" : "host") +
         " tensors but the lists were asked for on the " + (space == MemorySpace::Device ? "device" : "host"));

  StepLaunch step;
  DecodeBlockLists& out = step.out;
  out.batch = mask.batch();
  out.heads = mask.heads();
  out.numKvBlocks = mask.numKvBlocks();
  hostBounds(mask, firstRow, lastRow, out);
  acquire(out, space, stream);

  const BlockMaskTensors& lists = mask.kvTensors(space, stream);
  step.kernel = &mod.state().kernel("decode_block_lists", [&] { return makeDecodeListsKernel(mod.detached()); });
  step.options = LaunchOptions{.grid = {out.batch * out.heads, 1, 1},
                               .constants = {QBS, KVBS, maxRows, queryTile},
                               .num_warps = queryTile * KVBS >= 8192 ? 8 : 4,
                               .num_stages = 1,
                               .stream = stream};
  // Row strides from the list tensors: 0 on a broadcast dimension reads the same row for every
  // b (or h), which is right there, and a slice's lists keep its parent's strides.
  step.args = {lists.fullKvNum, lists.fullKvIndices, lists.kvNum,         lists.kvIndices,     out.fullNum,
               out.fullIndices, out.partialNum,      out.partialIndices,  out.heads,           lists.kvBatchStride,
               lists.kvHeadStride, out.numKvBlocks,  mask.kvLen(),        rowStart,            queryStart,
               queryCount};
  return step;
}

}  // namespace

DecodeBlockLists decodeBlockLists(const BlockMask& mask, int64_t queryStart, int64_t queryCount, MemorySpace space,
                                  runtime::Stream* stream) {
  StepLaunch step = prepareStep(mask, queryStart, queryCount, space, stream);
  if (space == MemorySpace::Device) step.kernel->runArgs(step.options, step.args);
  else step.kernel->interpretArgs(step.options, step.args);
  return std::move(step.out);
}

const codegen::CompiledKernel& compileDecodeBlockLists(const BlockMask& mask, int64_t queryStart, int64_t queryCount,
                                                       codegen::Target target) {
  const MemorySpace space = mask.maskMod().captureSpace().value_or(MemorySpace::Host);
  StepLaunch step = prepareStep(mask, queryStart, queryCount, space, nullptr);
  return step.kernel->compile(step.options, step.args, target);
}

DecodeListsPoolStats decodeListsPoolStats() {
  Pool& p = *pool();
  std::lock_guard lock(p.mutex);
  DecodeListsPoolStats s;
  for (const auto& [key, list] : p.entries)
    for (const auto& e : list) {
      ++s.buffers;
      s.inUse += e->inUse ? 1 : 0;
    }
  return s;
}

}  // namespace flextile::attention
