#include "attention_templates/BlockMask.h"

#include "runtime/Stream.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

namespace flextile::attention {

using namespace flextile::dsl;

struct BlockMask::TensorCache {
  std::mutex mutex;
  // Per space (0 host, 1 device): the forward lists (kvTensors; views of the parent's for a slice)
  // and all eight (tensors).
  std::optional<BlockMaskTensors> kv[2], all[2];
  // Per space: heaviestTilesFirstTensor by (B, H, length, block, keys, G).
  std::map<std::array<int64_t, 6>, Tensor> tileOrders[2];
};

namespace {

bool isPow2(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

std::string lengths(int64_t q, int64_t kv) { return "Q_LEN=" + std::to_string(q) + " KV_LEN=" + std::to_string(kv); }

void validate(const char* what, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes) {
  auto fail = [&](const std::string& m) { throw Error(std::string(what) + ": " + m); };
  if (B < 1 || H < 1)
    fail("B and H must be at least 1 (1 broadcasts), got B=" + std::to_string(B) + " H=" + std::to_string(H));
  if (qLen < 1 || kvLen < 1) fail("lengths must be at least 1, got " + lengths(qLen, kvLen));
  if (qLen > INT32_MAX || kvLen > INT32_MAX) fail("lengths must be below 2^31, got " + lengths(qLen, kvLen));
  if (!isPow2(sizes.q) || !isPow2(sizes.kv))
    fail("Q_BLOCK_SIZE and KV_BLOCK_SIZE must be powers of two (tile sizes), got " + std::to_string(sizes.q) + " and " +
         std::to_string(sizes.kv));
  const int64_t nQ = (qLen + sizes.q - 1) / sizes.q, nKv = (kvLen + sizes.kv - 1) / sizes.kv;
  // The padded lists hold B * H * nQ * nKV entries, indexed in i32 by kernels.
  if (double(B) * double(H) * double(nQ) * double(nKv) >= double(INT32_MAX))
    fail("B * H * (Q_LEN / Q_BLOCK_SIZE) * (KV_LEN / KV_BLOCK_SIZE) = " +
         std::to_string(double(B) * double(H) * double(nQ) * double(nKv)) + " blocks is too many; use larger blocks");
}

MemorySpace chooseSpace(const std::optional<MemorySpace>& where, const std::optional<MemorySpace>& captures) {
  if (where) return *where;
  if (captures) return *captures;
  return deviceAvailable() ? MemorySpace::Device : MemorySpace::Host;
}

// Runs a kernel on the GPU (on options.stream) or through the interpreter.
template <class... A>
void launch(Kernel& k, MemorySpace space, const LaunchOptions& options, A&&... args) {
  if (space == MemorySpace::Device) k.run(options, std::forward<A>(args)...);
  else k.interpret(options, std::forward<A>(args)...);
}

// A captured tensor a builder makes: later calls on any stream read it, so an upload on the
// builder's stream is waited for.
Tensor uploadCapture(const std::vector<int32_t>& values, Shape shape, MemorySpace space, runtime::Stream* stream) {
  Tensor t = Tensor::fromHost(values, std::move(shape), space, stream);
  if (stream && space == MemorySpace::Device) stream->synchronize();
  return t;
}

// One state byte per block: 0 no allowed in-range pair, 1 some, 2 all.
// The kernels hold a detached copy of the mod (see MaskMod::detached): the same source line, so
// an error in what the user's mod returns points at the user's code, not at this file.
Kernel makeStateKernel(const MaskMod& mod) {
  return kernel("block_mask_states", [mask = mod.detached()](Ptr<i8> states, Int H, Int qLen, Int kvLen, Int numQ,
                                                             Int numKv, Const<int> BQ, Const<int> BKV) {
    auto qb = program_id(0), kb = program_id(1), bh = program_id(2);
    auto q = (qb * BQ + arange(0, BQ)).expand(1);    // [BQ, 1]
    auto kv = (kb * BKV + arange(0, BKV)).expand(0);  // [1, BKV]
    auto live = mask(bh / H, bh % H, q, kv) & (q < qLen) & (kv < kvLen);
    auto allowed = sum(sum(live, 1), 0);
    auto inRange = minimum(qLen - qb * BQ, BQ) * minimum(kvLen - kb * BKV, BKV);
    auto state = where(allowed == 0, 0, where(allowed == inRange, 2, 1));
    store(states + (bh * numQ + qb) * numKv + kb, state);
  });
}

// Lists from block states where the states are (createBlockMask with `hostLists = false`, and the
// transposes of a mask without host lists): one program per list row. Row p of bh = p / rowsPerBh
// walks `walk` states at bh * bhStride + (p % rowsPerBh) * rowStride + k * stepStride (the forward
// lists: rows are q blocks, steps kv blocks; the transposes: the other way round). A block's slot
// in its list is the number of blocks of its kind before it: per chunk of CHUNK steps, a
// [CHUNK, CHUNK] comparison summed along its rows (an exclusive prefix count) plus the count of the
// chunks before. So the lists come out ascending, as the host compaction makes them; the index
// tensors are zeroed before (padding).
Kernel makeCompactKernel() {
  return kernel("block_mask_compact", [](Ptr<i8> states, Ptr<i32> partialNum, Ptr<i32> partialIndices,
                                         Ptr<i32> fullNum, Ptr<i32> fullIndices, Int walk, Int rowsPerBh,
                                         Int bhStride, Int rowStride, Int stepStride, Const<int> CHUNK) {
    auto row = program_id(0);
    auto base = (row / rowsPerBh) * bhStride + (row % rowsPerBh) * rowStride;
    auto out = row * walk;
    auto j = arange(0, CHUNK);
    auto before = j.expand(0) < j.expand(1);  // [a, b]: step b of the chunk comes before step a
    auto chunks = (walk + (CHUNK - 1)) / CHUNK;
    auto [partials, fulls] = for_range(0, chunks, 1, std::tuple{scalar(0, DType::I32), scalar(0, DType::I32)},
                                       [&](Tile c, Tile partialsBefore, Tile fullsBefore) {
      Tile step = c * CHUNK + j;
      Tile state = load(states + (base + step * stepStride), step < walk, 0).to(DType::I32);
      Tile isPartial = state == 1, isFull = state == 2;
      Tile partialSlot = partialsBefore + sum(where(before & isPartial.expand(0), 1, 0), 1);
      Tile fullSlot = fullsBefore + sum(where(before & isFull.expand(0), 1, 0), 1);
      store(partialIndices + (out + partialSlot), step, isPartial);
      store(fullIndices + (out + fullSlot), step, isFull);
      return std::tuple{partialsBefore + sum(where(isPartial, 1, 0), 0), fullsBefore + sum(where(isFull, 1, 0), 0)};
    });
    store(partialNum + row, partials);
    store(fullNum + row, fulls);
  });
}

// The block states [B*H, nQ, nKV] of forward lists (the inverse of the compaction): one program per
// row of the mask, reading its lists at b * bStride + h * hStride + r (a slice's strides), writing
// 1 for each partial block and 2 for each full one into zeroed states.
Kernel makeStatesFromListsKernel() {
  return kernel("block_mask_states_from_lists", [](Ptr<i32> partialNum, Ptr<i32> partialIndices, Ptr<i32> fullNum,
                                                   Ptr<i32> fullIndices, Ptr<i8> states, Int H, Int numQ,
                                                   Int numKv, Int bStride, Int hStride, Const<int> CHUNK) {
    auto row = program_id(0);
    auto bh = row / numQ;
    auto listRow = (bh / H) * bStride + (bh % H) * hStride + row % numQ;
    auto j = arange(0, CHUNK);
    auto mark = [&](const Tile& num, const Tile& indices, int kind) {
      Tile count = load(num + listRow);
      for_range(0, (count + (CHUNK - 1)) / CHUNK, 1, [&](Tile c) {
        Tile entry = c * CHUNK + j;
        Tile live = entry < count;
        Tile block = load(indices + (listRow * numKv + entry), live, 0);
        store(states + (row * numKv + block), (block * 0 + kind).to(DType::I8), live);
      });
    };
    mark(partialNum, partialIndices, 1);
    mark(fullNum, fullIndices, 2);
  });
}

BlockMaskTensors compactStates(const MaskMod& mod, const Tensor& states, const Shape& rowShape, int64_t walk,
                               int64_t rowsPerBh, int64_t bhStride, int64_t rowStride, int64_t stepStride,
                               MemorySpace space, runtime::Stream* stream) {
  Shape cellShape = rowShape;
  cellShape.push_back(walk);
  int64_t rows = 1;
  for (int64_t d : rowShape) rows *= d;
  BlockMaskTensors out;
  out.kvNum = Tensor::zeros(DType::I32, rowShape, space, stream);
  out.kvIndices = Tensor::zeros(DType::I32, cellShape, space, stream);
  out.fullKvNum = Tensor::zeros(DType::I32, rowShape, space, stream);
  out.fullKvIndices = Tensor::zeros(DType::I32, cellShape, space, stream);
  Kernel& compact = mod.state().kernel("block_mask_compact", [] { return makeCompactKernel(); });
  launch(compact, space, LaunchOptions{.grid = {rows, 1, 1}, .constants = {64}, .num_warps = 4, .stream = stream},
         states, out.kvNum, out.kvIndices, out.fullKvNum, out.fullKvIndices, walk, rowsPerBh, bhStride, rowStride,
         stepStride);
  return out;
}

// The element mask of listed blocks: (bh, q block, kv block) triples.
Kernel makeDenseKernel(const MaskMod& mod) {
  return kernel("block_mask_dense", [mask = mod.detached()](Ptr<i32> blocks, Ptr<i8> dense, Int H, Int qLen,
                                                            Int kvLen, Int rowStart, Int qOffset, Const<int> BQ,
                                                            Const<int> BKV) {
    auto e = program_id(0) * 3;
    auto bh = load(blocks + e), qb = load(blocks + e + 1), kb = load(blocks + e + 2);
    auto g = (rowStart + qb * BQ + arange(0, BQ)).expand(1);  // global query positions
    auto local = g - qOffset;
    auto kv = (kb * BKV + arange(0, BKV)).expand(0);
    auto in = (local >= 0) & (local < qLen) & (kv < kvLen);
    store(dense + (bh * qLen + local) * kvLen + kv, mask(bh / H, bh % H, g, kv) & in, in);
  });
}

int spaceSlot(MemorySpace space) { return space == MemorySpace::Device ? 1 : 0; }

std::span<const int32_t> row(const BlockLists& l, int64_t rowIndex, int64_t stride) {
  return {l.indices.data() + rowIndex * stride, size_t(l.num[size_t(rowIndex)])};
}

}  // namespace

// Builds masks; a friend of BlockMask.
struct BlockMaskBuilder {
  // `hostLists`: false makes a mask whose lists are tensors only (fromListTensors): no host storage.
  static BlockMask init(MaskMod mod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                        const char* what, bool hostLists = true) {
    validate(what, B, H, qLen, kvLen, sizes);
    if (!mod.defined()) throw Error(std::string(what) + ": the mask_mod is empty");
    BlockMask m;
    m.mask_ = std::move(mod);
    m.B_ = B;
    m.H_ = H;
    m.qLen_ = qLen;
    m.kvLen_ = kvLen;
    m.sizes_ = sizes;
    m.nQ_ = (qLen + sizes.q - 1) / sizes.q;
    m.nKv_ = (kvLen + sizes.kv - 1) / sizes.kv;
    m.tensors_ = std::make_shared<BlockMask::TensorCache>();
    m.hostLists_ = hostLists;
    if (!hostLists) return m;
    const size_t rowsQ = size_t(B * H * m.nQ_), rowsKv = size_t(B * H * m.nKv_), cells = rowsQ * size_t(m.nKv_);
    for (BlockLists* l : {&m.lists_->partialKv, &m.lists_->fullKv}) {
      l->num.assign(rowsQ, 0);
      l->indices.assign(cells, 0);
    }
    for (BlockLists* l : {&m.lists_->partialQ, &m.lists_->fullQ}) {
      l->num.assign(rowsKv, 0);
      l->indices.assign(cells, 0);
    }
    return m;
  }

  static void append(BlockLists& l, int64_t rowIndex, int64_t stride, int32_t value) {
    int32_t& n = l.num[size_t(rowIndex)];
    l.indices[size_t(rowIndex * stride + n)] = value;
    ++n;
  }

  // Allowed kv positions of query row i: [lo(i), hi(i)] before clipping to
  // [0, kvLen). The rules of the structural builders satisfy:
  //   lo and hi are nondecreasing in i;
  //   consecutive live rows overlap or touch: lo(i + 1) <= hi(i) + 1;
  //   the rows left empty by clipping form a suffix of all rows.
  // Then the allowed kv set of a block of rows [a, e] with last live row e' is
  // the interval [lo(a), hi(e')] (a union of touching intervals), and a kv
  // block is full exactly when every row is live and it lies inside the
  // intersection [lo(e), hi(a)] of the rows' intervals.
  struct RowRule {
    std::function<int64_t(int64_t)> lo, hi;
  };

  static void fillFromRule(BlockMask& m, int64_t b, int64_t h, const RowRule& rule) {
    const int64_t BQ = m.sizes_.q, BKV = m.sizes_.kv;
    auto lo = [&](int64_t i) { return std::max<int64_t>(rule.lo(i), 0); };
    auto hi = [&](int64_t i) { return std::min<int64_t>(rule.hi(i), m.kvLen_ - 1); };
    auto live = [&](int64_t i) { return lo(i) <= hi(i); };
    for (int64_t r = 0; r < m.nQ_; ++r) {
      const int64_t a = r * BQ, e = std::min(a + BQ, m.qLen_) - 1;
      if (!live(a)) continue;
      int64_t first = a, last = e;  // the last live row, by bisection (dead rows are a suffix)
      while (first < last) {
        int64_t mid = first + (last - first + 1) / 2;
        if (live(mid)) first = mid;
        else last = mid - 1;
      }
      const int64_t lastLive = first;
      const int64_t unionLo = lo(a), unionHi = hi(lastLive);
      const int64_t interLo = lo(e), interHi = hi(a);
      const int64_t rowIndex = (b * m.H_ + h) * m.nQ_ + r;
      for (int64_t c = unionLo / BKV; c <= unionHi / BKV; ++c) {
        const int64_t c0 = c * BKV, c1 = std::min(c0 + BKV, m.kvLen_) - 1;
        const bool full = lastLive == e && interLo <= c0 && c1 <= interHi;
        append(full ? m.lists_->fullKv : m.lists_->partialKv, rowIndex, m.nKv_, int32_t(c));
      }
    }
  }

  // Block states [B*H, nQ, nKV] into the lists.
  static void compact(BlockMask& m, const std::vector<int8_t>& states, MemorySpace space) {
    m.space_ = space;
    for (int64_t rowIndex = 0; rowIndex < m.B_ * m.H_ * m.nQ_; ++rowIndex)
      for (int64_t c = 0; c < m.nKv_; ++c) {
        const int8_t s = states[size_t(rowIndex * m.nKv_ + c)];
        if (s == 1) append(m.lists_->partialKv, rowIndex, m.nKv_, int32_t(c));
        else if (s == 2) append(m.lists_->fullKv, rowIndex, m.nKv_, int32_t(c));
        else if (s != 0) throw Error("createBlockMask: the builder kernel wrote block state " + std::to_string(s));
      }
    m.deriveTransposes();
  }

  // Rows of any intervals (rowIntervalBlockMask): a block row's kv blocks are those some live row
  // reaches (counted by a difference array over the kv blocks); a block is full when every row of
  // the block row is live and contains it, i.e. it lies inside the rows' intersection.
  static void fillFromIntervals(BlockMask& m, int64_t b, int64_t h, const RowKeyInterval& rowKeys) {
    const int64_t BQ = m.sizes_.q, BKV = m.sizes_.kv;
    std::vector<int32_t> reach(size_t(m.nKv_ + 1));
    for (int64_t r = 0; r < m.nQ_; ++r) {
      std::fill(reach.begin(), reach.end(), 0);
      int64_t interLo = 0, interHi = m.kvLen_ - 1;
      bool anyLive = false, allLive = true;
      for (int64_t i = r * BQ; i < std::min((r + 1) * BQ, m.qLen_); ++i) {
        auto [lo, hi] = rowKeys(b, h, i);
        lo = std::max<int64_t>(lo, 0);
        hi = std::min<int64_t>(hi, m.kvLen_ - 1);
        if (lo > hi) {
          allLive = false;
          continue;
        }
        anyLive = true;
        ++reach[size_t(lo / BKV)];
        --reach[size_t(hi / BKV + 1)];
        interLo = std::max(interLo, lo);
        interHi = std::min(interHi, hi);
      }
      if (!anyLive) continue;
      const int64_t rowIndex = (b * m.H_ + h) * m.nQ_ + r;
      int32_t rows = 0;
      for (int64_t c = 0; c < m.nKv_; ++c) {
        rows += reach[size_t(c)];
        if (rows == 0) continue;
        const int64_t c0 = c * BKV, c1 = std::min(c0 + BKV, m.kvLen_) - 1;
        const bool full = allLive && interLo <= c0 && c1 <= interHi;
        append(full ? m.lists_->fullKv : m.lists_->partialKv, rowIndex, m.nKv_, int32_t(c));
      }
    }
  }

  static BlockMask fromIntervals(MaskMod mod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                                 const char* what, std::optional<MemorySpace> space, const RowKeyInterval& rowKeys) {
    BlockMask m = init(std::move(mod), B, H, qLen, kvLen, sizes, what);
    m.space_ = space;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) fillFromIntervals(m, b, h, rowKeys);
    m.deriveTransposes();
    return m;
  }

  static BlockMask structural(MaskMod mod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                              const char* what, std::optional<MemorySpace> space,
                              const std::function<RowRule(int64_t b, int64_t h)>& ruleFor) {
    BlockMask m = init(std::move(mod), B, H, qLen, kvLen, sizes, what);
    m.space_ = space;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) fillFromRule(m, b, h, ruleFor(b, h));
    m.deriveTransposes();
    return m;
  }
};

// ---- construction ----------------------------------------------------------

void BlockMask::deriveTransposes() {
  for (BlockLists* l : {&lists_->partialQ, &lists_->fullQ}) {
    std::fill(l->num.begin(), l->num.end(), 0);
    std::fill(l->indices.begin(), l->indices.end(), 0);
  }
  for (int64_t bh = 0; bh < B_ * H_; ++bh)
    for (int64_t r = 0; r < nQ_; ++r) {
      const int64_t rowIndex = bh * nQ_ + r;
      for (int32_t c : row(lists_->partialKv, rowIndex, nKv_)) BlockMaskBuilder::append(lists_->partialQ, bh * nKv_ + c, nQ_, int32_t(r));
      for (int32_t c : row(lists_->fullKv, rowIndex, nKv_)) BlockMaskBuilder::append(lists_->fullQ, bh * nKv_ + c, nQ_, int32_t(r));
    }
}

namespace {
void checkListShape(const char* what, const char* name, const BlockLists& l, size_t rows, size_t stride) {
  if (l.num.size() != rows || l.indices.size() != rows * stride)
    throw Error(std::string(what) + ": " + name + " has " + std::to_string(l.num.size()) + " counts and " +
                std::to_string(l.indices.size()) + " indices; expected " + std::to_string(rows) + " and " +
                std::to_string(rows * stride));
}

// Each row: count in range, indices in range, strictly ascending; padding 0.
void checkRows(const char* what, const char* name, const BlockLists& l, int64_t rows, int64_t stride) {
  auto fail = [&](const std::string& m) { throw Error(std::string(what) + ": " + m); };
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t n = l.num[size_t(r)];
    const std::string where = std::string(name) + " row " + std::to_string(r);
    if (n < 0 || n > stride) fail(where + " has count " + std::to_string(n) + ", outside [0, " + std::to_string(stride) + "]");
    for (int32_t k = 0; k < n; ++k) {
      const int32_t v = l.indices[size_t(r * stride + k)];
      if (v < 0 || v >= stride)
        fail(where + " entry " + std::to_string(k) + " is block " + std::to_string(v) + ", outside [0, " +
             std::to_string(stride) + ")");
      if (k > 0 && v <= l.indices[size_t(r * stride + k - 1)])
        fail(where + " is not strictly ascending (block " + std::to_string(v) + " after " +
             std::to_string(l.indices[size_t(r * stride + k - 1)]) + "): unsorted or duplicated");
    }
    for (int64_t k = n; k < stride; ++k)
      if (l.indices[size_t(r * stride + k)] != 0) fail(where + " has a non-zero padding entry at " + std::to_string(k));
  }
}
}  // namespace

BlockMask BlockMask::fromKvLists(MaskMod maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                                 BlockLists partialKv, BlockLists fullKv) {
  BlockMask m = BlockMaskBuilder::init(std::move(maskMod), B, H, qLen, kvLen, sizes, "BlockMask::fromKvLists");
  checkListShape("BlockMask::fromKvLists", "partialKv", partialKv, m.lists_->partialKv.num.size(), size_t(m.nKv_));
  checkListShape("BlockMask::fromKvLists", "fullKv", fullKv, m.lists_->fullKv.num.size(), size_t(m.nKv_));
  const int64_t rows = int64_t(m.lists_->fullKv.num.size());
  checkRows("BlockMask::fromKvLists", "partialKv", partialKv, rows, m.nKv_);
  checkRows("BlockMask::fromKvLists", "fullKv", fullKv, rows, m.nKv_);
  m.lists_->partialKv = std::move(partialKv);
  m.lists_->fullKv = std::move(fullKv);
  m.space_ = m.mask_.captureSpace();
  m.deriveTransposes();
  m.check();
  return m;
}

BlockMask BlockMask::fromLists(MaskMod maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                               BlockLists partialKv, BlockLists fullKv, BlockLists partialQ, BlockLists fullQ) {
  BlockMask m = BlockMaskBuilder::init(std::move(maskMod), B, H, qLen, kvLen, sizes, "BlockMask::fromLists");
  m.lists_->partialKv = std::move(partialKv);
  m.lists_->fullKv = std::move(fullKv);
  m.lists_->partialQ = std::move(partialQ);
  m.lists_->fullQ = std::move(fullQ);
  m.space_ = m.mask_.captureSpace();
  m.check();
  return m;
}

BlockMask createBlockMask(const MaskMod& maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                          BlockMaskPlacement where) {
  BlockMask m = BlockMaskBuilder::init(maskMod, B, H, qLen, kvLen, sizes, "createBlockMask");
  const MemorySpace space = chooseSpace(where.space, maskMod.captureSpace());
  const int64_t nQ = m.numQBlocks(), nKv = m.numKvBlocks();
  if (space == MemorySpace::Device && (nKv > 65535 || B * H > 65535))
    throw Error("createBlockMask: the grid (" + std::to_string(nQ) + ", " + std::to_string(nKv) + ", " +
                std::to_string(B * H) + ") of q blocks, kv blocks and B*H exceeds CUDA's 65535 on its last two axes; "
                "use larger blocks");
  Kernel& k = maskMod.state().kernel("block_mask_states", [&] { return makeStateKernel(maskMod); });
  Tensor states = Tensor::zeros(DType::I8, {B * H * nQ * nKv}, space, where.stream);
  // [BQ, BKV] tiles of i32 and i1: 8 warps keep it under 64 elements a thread at 128 x 128.
  const int warps = sizes.q * sizes.kv >= 128 * 64 ? 8 : 4;
  LaunchOptions options{
      .grid = {nQ, nKv, B * H}, .constants = {sizes.q, sizes.kv}, .num_warps = warps, .stream = where.stream};
  launch(k, space, options, states, H, qLen, kvLen, nQ, nKv);
  if (!where.hostLists) {
    // Compacted where the states are: nothing comes back to the host (BlockMask::fromListTensors).
    BlockMaskTensors lists =
        compactStates(maskMod, states, {B, H, nQ}, nKv, nQ, nQ * nKv, nKv, 1, space, where.stream);
    // The states stay allocated as long as the lists (freeing them now would make cuMemFree wait
    // for the kernels), so the call returns at once: the lists are ready in the stream's order.
    auto states_ = std::make_shared<const Tensor>(states);
    lists.kvNum = Tensor::viewOf(lists.kvNum, 0, lists.kvNum.shape(), {}, states_);
    return BlockMask::fromListTensors(maskMod, B, H, qLen, kvLen, sizes, lists);
  }
  BlockMaskBuilder::compact(m, states.toHost<int8_t>(where.stream), space);
  return m;
}

// ---- access ----------------------------------------------------------------

namespace {
void checkIndex(const char* what, int64_t v, int64_t n, const char* name) {
  if (v < 0 || v >= n)
    throw Error(std::string("BlockMask::") + what + ": " + name + " " + std::to_string(v) + " is outside [0, " +
                std::to_string(n) + ")");
}
}  // namespace

// Row `index` of a (b, h)'s `rows` rows of one list, each `rowLength` entries long, for accessor
// `what`: the host lists and every index checked, naming what is out of range.
std::span<const int32_t> BlockMask::listRow(const char* what, const BlockLists& lists, int64_t b, int64_t h,
                                            int64_t index, int64_t rows, const char* indexName,
                                            int64_t rowLength) const {
  requireHostLists(what);
  checkIndex(what, b, B_, "b");
  checkIndex(what, h, H_, "h");
  checkIndex(what, index, rows, indexName);
  return row(lists, (b * H_ + h) * rows + index, rowLength);
}

std::span<const int32_t> BlockMask::partialKvBlocks(int64_t b, int64_t h, int64_t qBlock) const {
  return listRow("partialKvBlocks", lists_->partialKv, b, h, qBlock, nQ_, "q block", nKv_);
}

std::span<const int32_t> BlockMask::fullKvBlocks(int64_t b, int64_t h, int64_t qBlock) const {
  return listRow("fullKvBlocks", lists_->fullKv, b, h, qBlock, nQ_, "q block", nKv_);
}

std::span<const int32_t> BlockMask::partialQBlocks(int64_t b, int64_t h, int64_t kvBlock) const {
  return listRow("partialQBlocks", lists_->partialQ, b, h, kvBlock, nKv_, "kv block", nQ_);
}

std::span<const int32_t> BlockMask::fullQBlocks(int64_t b, int64_t h, int64_t kvBlock) const {
  return listRow("fullQBlocks", lists_->fullQ, b, h, kvBlock, nKv_, "kv block", nQ_);
}

BlockState BlockMask::state(int64_t b, int64_t h, int64_t qBlock, int64_t kvBlock) const {
  requireHostLists("state");
  checkIndex("state", kvBlock, nKv_, "kv block");
  auto contains = [&](std::span<const int32_t> r) { return std::binary_search(r.begin(), r.end(), int32_t(kvBlock)); };
  if (contains(fullKvBlocks(b, h, qBlock))) return BlockState::Full;
  if (contains(partialKvBlocks(b, h, qBlock))) return BlockState::Partial;
  return BlockState::Empty;
}

int64_t BlockMask::numPartialBlocks() const {
  requireHostLists("numPartialBlocks");
  int64_t n = 0;
  for (int32_t c : lists_->partialKv.num) n += c;
  return n;
}

int64_t BlockMask::numFullBlocks() const {
  requireHostLists("numFullBlocks");
  int64_t n = 0;
  for (int32_t c : lists_->fullKv.num) n += c;
  return n;
}

double BlockMask::sparsity() const {
  const double total = double(B_) * double(H_) * double(nQ_) * double(nKv_);
  return 1.0 - double(numPartialBlocks() + numFullBlocks()) / total;
}

std::vector<uint8_t> BlockMask::toDenseBlocks() const {
  requireHostLists("toDenseBlocks");
  std::vector<uint8_t> out(size_t(B_ * H_ * nQ_ * nKv_), uint8_t(BlockState::Empty));
  for (int64_t rowIndex = 0; rowIndex < B_ * H_ * nQ_; ++rowIndex) {
    for (int32_t c : row(lists_->partialKv, rowIndex, nKv_)) out[size_t(rowIndex * nKv_ + c)] = uint8_t(BlockState::Partial);
    for (int32_t c : row(lists_->fullKv, rowIndex, nKv_)) out[size_t(rowIndex * nKv_ + c)] = uint8_t(BlockState::Full);
  }
  return out;
}

std::vector<uint8_t> BlockMask::toDense() const {
  requireHostLists("toDense");
  if (double(B_) * double(H_) * double(qLen_) * double(kvLen_) >= double(INT32_MAX))
    throw Error("BlockMask::toDense: " + std::to_string(B_ * H_) + " x " + std::to_string(qLen_) + " x " +
                std::to_string(kvLen_) + " elements is too large for a dense mask (it is a debugging aid)");
  std::vector<uint8_t> dense(size_t(B_ * H_ * qLen_ * kvLen_), 0);
  const int64_t rowStart = qOffset_ - qPhase_;  // global position of block row 0's first query
  std::vector<int32_t> partial;
  for (int64_t bh = 0; bh < B_ * H_; ++bh)
    for (int64_t r = 0; r < nQ_; ++r) {
      const int64_t rowIndex = bh * nQ_ + r;
      for (int32_t c : row(lists_->fullKv, rowIndex, nKv_)) {
        const int64_t i0 = std::max<int64_t>(rowStart + r * sizes_.q - qOffset_, 0);
        const int64_t i1 = std::min<int64_t>(rowStart + (r + 1) * sizes_.q - qOffset_, qLen_);
        const int64_t j0 = c * sizes_.kv, j1 = std::min<int64_t>(j0 + sizes_.kv, kvLen_);
        for (int64_t i = i0; i < i1; ++i)
          std::fill(dense.begin() + (bh * qLen_ + i) * kvLen_ + j0, dense.begin() + (bh * qLen_ + i) * kvLen_ + j1, 1);
      }
      for (int32_t c : row(lists_->partialKv, rowIndex, nKv_)) partial.insert(partial.end(), {int32_t(bh), int32_t(r), c});
    }
  if (partial.empty()) return dense;
  const MemorySpace space = chooseSpace(space_, mask_.captureSpace());
  Kernel& k = mask_.state().kernel("block_mask_dense", [&] { return makeDenseKernel(mask_); });
  Tensor blocks = Tensor::fromHost(partial, {int64_t(partial.size())}, space);
  Tensor out = Tensor::zeros(DType::I8, {B_ * H_ * qLen_ * kvLen_}, space);
  LaunchOptions options{.grid = {int64_t(partial.size() / 3), 1, 1}, .constants = {sizes_.q, sizes_.kv},
                        .num_warps = sizes_.q * sizes_.kv >= 128 * 64 ? 8 : 4};
  launch(k, space, options, blocks, out, H_, qLen_, kvLen_, rowStart, qOffset_);
  const std::vector<int8_t> evaluated = out.toHost<int8_t>();
  for (size_t i = 0; i < dense.size(); ++i) dense[i] |= uint8_t(evaluated[i] != 0);
  return dense;
}

std::string BlockMask::describe() const {
  std::string s = "BlockMask '" + mask_.name() + "': B=" + std::to_string(B_) + " H=" + std::to_string(H_) + " " +
                  lengths(qLen_, kvLen_);
  if (qOffset_ != 0 || qPhase_ != 0) s += " (queries from position " + std::to_string(qOffset_) + ")";
  s += ", blocks " + std::to_string(sizes_.q) + " x " + std::to_string(sizes_.kv) + " (" + std::to_string(nQ_) + " x " +
       std::to_string(nKv_) + "), ";
  if (!hostLists_)
    return s + "lists as tensors only (at most " + std::to_string(maxLiveBlocksPerRow()) + " live blocks a row)";
  char sparsityText[32];
  std::snprintf(sparsityText, sizeof sparsityText, "%.1f%%", 100.0 * sparsity());
  return s + std::to_string(numPartialBlocks()) + " partial + " + std::to_string(numFullBlocks()) + " full, sparsity " +
         sparsityText;
}

std::string BlockMask::picture(int64_t b, int64_t h, int64_t maxBlocks) const {
  requireHostLists("picture");
  checkIndex("picture", b, B_, "b");
  checkIndex("picture", h, H_, "h");
  if (maxBlocks < 1) throw Error("BlockMask::picture: maxBlocks must be at least 1");
  const std::vector<uint8_t> blocks = toDenseBlocks();
  const int64_t rows = std::min(nQ_, maxBlocks), cols = std::min(nKv_, maxBlocks);
  const int width = int(std::to_string(nQ_ - 1).size());
  std::string s = describe() + "\n";
  s += "b=" + std::to_string(b) + " h=" + std::to_string(h) + ": one character per block, rows = q blocks, columns = kv blocks";
  if (cols < nKv_ || rows < nQ_) s += " (first " + std::to_string(rows) + " x " + std::to_string(cols) + " shown)";
  s += "\n";
  for (int64_t r = 0; r < rows; ++r) {
    std::string label = std::to_string(r);
    s += std::string(size_t(width) - label.size() + 2, ' ') + label + " |";
    for (int64_t c = 0; c < cols; ++c) {
      switch (BlockState(blocks[size_t(((b * H_ + h) * nQ_ + r) * nKv_ + c)])) {
        case BlockState::Full: s += "█"; break;
        case BlockState::Partial: s += "░"; break;
        case BlockState::Empty: s += " "; break;
      }
    }
    s += cols < nKv_ ? "…\n" : "|\n";
  }
  if (rows < nQ_) s += std::string(size_t(width) + 2, ' ') + "…\n";
  s += "█ full (no mask_mod)   ░ partial (mask_mod applied)   ' ' empty (never loaded)\n";
  return s;
}

// ---- slicing -----------------------------------------------------------------

BlockMask BlockMask::sliceRows(int64_t qBlockStart, int64_t count, std::optional<int64_t> queryOffset,
                               std::optional<int64_t> queryLength) const {
  auto fail = [&](const std::string& m) { throw Error("BlockMask::sliceRows: " + m + " (" + describe() + ")"); };
  if (count < 1 || qBlockStart < 0 || qBlockStart + count > nQ_)
    fail("rows [" + std::to_string(qBlockStart) + ", " + std::to_string(qBlockStart + count) +
         ") are not a non-empty range inside [0, " + std::to_string(nQ_) + ")");
  const int64_t rowStart = qOffset_ - qPhase_ + qBlockStart * sizes_.q;  // global start of the first row
  const int64_t first = std::max(rowStart, qOffset_);                     // first query inside these rows
  const int64_t end = std::min(rowStart + count * sizes_.q, qOffset_ + qLen_);
  const int64_t offset = queryOffset.value_or(first);
  const int64_t length = queryLength.value_or(end - offset);
  if (offset < first || length < 1 || offset + length > end)
    fail("queries [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
         ") are not a non-empty range inside the rows' queries [" + std::to_string(first) + ", " + std::to_string(end) + ")");
  const int64_t phase = offset - rowStart;
  if (phase >= sizes_.q) fail("query offset " + std::to_string(offset) + " is not in the first sliced row; start the slice at its row");
  if (phase != 0 && count != 1)
    fail("a slice whose queries start mid-row (offset " + std::to_string(offset) +
         ") must be a single row, so that every query tile maps to one mask row");
  if ((phase + length + sizes_.q - 1) / sizes_.q != count)
    fail("queries [" + std::to_string(offset) + ", " + std::to_string(offset + length) + ") leave some of the " +
         std::to_string(count) + " rows without queries");
  BlockMask m = BlockMaskBuilder::init(mask_, B_, H_, length, kvLen_, sizes_, "BlockMask::sliceRows", hostLists_);
  m.qOffset_ = offset;
  m.qPhase_ = phase;
  m.space_ = space_;
  m.bounds_ = bounds_;
  if (hostLists_) {
    for (int64_t bh = 0; bh < B_ * H_; ++bh)
      for (int64_t r = 0; r < count; ++r) {
        const int64_t from = (bh * nQ_ + qBlockStart + r), to = bh * count + r;
        for (auto [src, dst] : {std::pair{&lists_->partialKv, &m.lists_->partialKv}, std::pair{&lists_->fullKv, &m.lists_->fullKv}}) {
          dst->num[size_t(to)] = src->num[size_t(from)];
          std::copy_n(src->indices.begin() + from * nKv_, nKv_, dst->indices.begin() + to * nKv_);
        }
      }
    m.deriveTransposes();
  }
  // The forward list tensors: views of this mask's rows [qBlockStart, qBlockStart + count), with
  // this mask's strides (rows of a (b, h) stay nQ apart in the parent's storage).
  auto viewRows = [&](const BlockMaskTensors& p) {
    BlockMaskTensors v;
    const int64_t bStride = p.kvBatchStride, hStride = p.kvHeadStride;
    const Shape rows{B_, H_, count}, cells{B_, H_, count, nKv_};
    const std::vector<int64_t> rowStrides{bStride, hStride, 1}, cellStrides{bStride * nKv_, hStride * nKv_, nKv_, 1};
    v.kvNum = Tensor::viewOf(p.kvNum, qBlockStart, rows, rowStrides);
    v.fullKvNum = Tensor::viewOf(p.fullKvNum, qBlockStart, rows, rowStrides);
    v.kvIndices = Tensor::viewOf(p.kvIndices, qBlockStart * nKv_, cells, cellStrides);
    v.fullKvIndices = Tensor::viewOf(p.fullKvIndices, qBlockStart * nKv_, cells, cellStrides);
    v.kvBatchStride = bStride;
    v.kvHeadStride = hStride;
    return v;
  };
  if (hostLists_) (void)kvTensors(chooseSpace(space_, mask_.captureSpace()));  // made once in this mask, shared by every slice
  std::lock_guard lock(tensors_->mutex);
  for (int s = 0; s < 2; ++s)
    if (tensors_->kv[s]) m.tensors_->kv[s] = viewRows(*tensors_->kv[s]);
  return m;
}

// ---- masks whose lists are tensors only ----------------------------------------

void BlockMask::requireHostLists(const char* what) const {
  if (!hostLists_)
    throw Error(std::string("BlockMask::") + what + " needs the host lists, and " + describe() +
                " has its lists as tensors only (fromListTensors): copy them with toHost() first");
}

BlockMask BlockMask::fromListTensors(MaskMod maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                                     BlockSizes sizes, const BlockMaskTensors& lists, ListBounds bounds) {
  const char* what = "BlockMask::fromListTensors";
  validate(what, B, H, qLen, kvLen, sizes);
  const int64_t nQ = (qLen + sizes.q - 1) / sizes.q, nKv = (kvLen + sizes.kv - 1) / sizes.kv;
  auto fail = [&](const std::string& m) { throw Error(std::string(what) + ": " + m); };
  const Tensor* first = nullptr;
  for (auto [t, name, shape] : {std::tuple{&lists.kvNum, "kvNum (partial counts)", Shape{B, H, nQ}},
                                std::tuple{&lists.kvIndices, "kvIndices (partial blocks)", Shape{B, H, nQ, nKv}},
                                std::tuple{&lists.fullKvNum, "fullKvNum (full counts)", Shape{B, H, nQ}},
                                std::tuple{&lists.fullKvIndices, "fullKvIndices (full blocks)", Shape{B, H, nQ, nKv}}}) {
    if (!t->defined()) fail(std::string(name) + " is empty");
    t->expect(std::string(what) + " " + name, DType::I32, shape);
    if (!t->isContiguous()) fail(std::string(name) + " must be contiguous, got " + t->describe());
    if (first && t->space() != first->space())
      fail("the four list tensors must be in one memory space; " + std::string(name) + " is " + t->describe() +
           " but kvNum is " + first->describe());
    first = first ? first : t;
  }
  if (bounds.maxLiveBlocksPerRow > nKv)
    fail("ListBounds::maxLiveBlocksPerRow is " + std::to_string(bounds.maxLiveBlocksPerRow) + " but a row has only " +
         std::to_string(nKv) + " kv blocks");
  if (bounds.maxLiveBlocksPerRow < -1)
    fail("ListBounds::maxLiveBlocksPerRow must be -1 (no bound) or a block count, got " +
         std::to_string(bounds.maxLiveBlocksPerRow));
  BlockMask m = BlockMaskBuilder::init(std::move(maskMod), B, H, qLen, kvLen, sizes, what, /*hostLists=*/false);
  m.bounds_ = bounds;
  m.space_ = first->space();
  BlockMaskTensors t = lists;
  t.qNum = t.qIndices = t.fullQNum = t.fullQIndices = Tensor();
  t.kvBatchStride = B > 1 ? H * nQ : 0;
  t.kvHeadStride = H > 1 ? nQ : 0;
  m.tensors_->kv[spaceSlot(first->space())] = std::move(t);
  return m;
}

BlockMask BlockMask::toHost(runtime::Stream* stream) const {
  if (hostLists_) return *this;
  const char* what = "BlockMask::toHost";
  std::optional<BlockMaskTensors> t;
  for (int s = 0; s < 2 && !t; ++s) t = tensors_->kv[s];
  if (!t) throw Error(std::string(what) + ": " + describe() + " holds no list tensors", ErrorKind::Internal);
  // A slice's tensors are strided views of its parent's (broadcast dimensions have stride 0): read
  // through the views, each row comes back once per (b, h) of this mask, as the host lists hold it.
  const Shape rows{B_, H_, nQ_}, cells{B_, H_, nQ_, nKv_};
  const std::vector<int64_t> rowStrides{t->kvBatchStride, t->kvHeadStride, 1},
      cellStrides{t->kvBatchStride * nKv_, t->kvHeadStride * nKv_, nKv_, 1};
  auto read = [&](const Tensor& v, const Shape& shape, const std::vector<int64_t>& strides) {
    return Tensor::viewOf(v, 0, shape, strides).toHost<int32_t>(stream);
  };
  BlockMask m = BlockMaskBuilder::init(mask_, B_, H_, qLen_, kvLen_, sizes_, what);
  m.qOffset_ = qOffset_;
  m.qPhase_ = qPhase_;
  m.space_ = space_;
  m.lists_->partialKv = {read(t->kvNum, rows, rowStrides), read(t->kvIndices, cells, cellStrides)};
  m.lists_->fullKv = {read(t->fullKvNum, rows, rowStrides), read(t->fullKvIndices, cells, cellStrides)};
  if (stream) stream->synchronize();
  m.deriveTransposes();
  m.check();
  return m;
}

int64_t BlockMask::maxLiveBlocksPerRow() const {
  if (!hostLists_) return bounds_.maxLiveBlocksPerRow < 0 ? nKv_ : bounds_.maxLiveBlocksPerRow;
  int64_t most = 0;
  for (size_t r = 0; r < lists_->partialKv.num.size(); ++r) most = std::max<int64_t>(most, lists_->partialKv.num[r] + lists_->fullKv.num[r]);
  return most;
}

int64_t BlockMask::uniformFullRowLength() const {
  if (!hostLists_ || lists_->fullKv.num.empty()) return -1;
  const int32_t first = lists_->fullKv.num.front();
  for (size_t r = 0; r < lists_->fullKv.num.size(); ++r)
    if (lists_->partialKv.num[r] != 0 || lists_->fullKv.num[r] != first) return -1;
  return first;
}

bool BlockMask::mayHaveFullBlocks() const { return hostLists_ ? numFullBlocks() > 0 : bounds_.mayHaveFull; }
bool BlockMask::mayHavePartialBlocks() const { return hostLists_ ? numPartialBlocks() > 0 : bounds_.mayHavePartial; }

// ---- checks ----------------------------------------------------------------

void BlockMask::check() const {
  requireHostLists("check");
  auto fail = [&](const std::string& m) { throw Error("BlockMask::check: " + m); };
  const size_t rowsQ = size_t(B_ * H_ * nQ_), rowsKv = size_t(B_ * H_ * nKv_);
  checkListShape("BlockMask::check", "partialKv", lists_->partialKv, rowsQ, size_t(nKv_));
  checkListShape("BlockMask::check", "fullKv", lists_->fullKv, rowsQ, size_t(nKv_));
  checkListShape("BlockMask::check", "partialQ", lists_->partialQ, rowsKv, size_t(nQ_));
  checkListShape("BlockMask::check", "fullQ", lists_->fullQ, rowsKv, size_t(nQ_));
  if (qPhase_ < 0 || qPhase_ >= sizes_.q || (qPhase_ + qLen_ + sizes_.q - 1) / sizes_.q != nQ_)
    fail("query phase " + std::to_string(qPhase_) + " and length " + std::to_string(qLen_) + " do not give " +
         std::to_string(nQ_) + " block rows");
  checkRows("BlockMask::check", "partialKv", lists_->partialKv, int64_t(rowsQ), nKv_);
  checkRows("BlockMask::check", "fullKv", lists_->fullKv, int64_t(rowsQ), nKv_);
  checkRows("BlockMask::check", "partialQ", lists_->partialQ, int64_t(rowsKv), nQ_);
  checkRows("BlockMask::check", "fullQ", lists_->fullQ, int64_t(rowsKv), nQ_);
  // No block both full and partial; the transposes list exactly the same blocks.
  std::vector<uint8_t> forward(size_t(B_ * H_ * nQ_ * nKv_), 0), backward(forward.size(), 0);
  for (int64_t bh = 0; bh < B_ * H_; ++bh) {
    for (int64_t r = 0; r < nQ_; ++r) {
      for (int32_t c : row(lists_->partialKv, bh * nQ_ + r, nKv_)) forward[size_t((bh * nQ_ + r) * nKv_ + c)] |= 1;
      for (int32_t c : row(lists_->fullKv, bh * nQ_ + r, nKv_)) {
        uint8_t& cell = forward[size_t((bh * nQ_ + r) * nKv_ + c)];
        if (cell & 1)
          fail("block (bh " + std::to_string(bh) + ", q " + std::to_string(r) + ", kv " + std::to_string(c) +
               ") is listed both partial and full");
        cell |= 2;
      }
    }
    for (int64_t c = 0; c < nKv_; ++c) {
      for (int32_t r : row(lists_->partialQ, bh * nKv_ + c, nQ_)) backward[size_t((bh * nQ_ + r) * nKv_ + c)] |= 1;
      for (int32_t r : row(lists_->fullQ, bh * nKv_ + c, nQ_)) backward[size_t((bh * nQ_ + r) * nKv_ + c)] |= 2;
    }
  }
  for (size_t i = 0; i < forward.size(); ++i)
    if (forward[i] != backward[i]) {
      const int64_t c = int64_t(i) % nKv_, r = int64_t(i) / nKv_ % nQ_, bh = int64_t(i) / nKv_ / nQ_;
      auto name = [](uint8_t v) { return v == 0 ? "empty" : v == 1 ? "partial" : v == 2 ? "full" : "partial and full"; };
      fail("the transposed lists disagree with the forward lists at block (bh " + std::to_string(bh) + ", q " +
           std::to_string(r) + ", kv " + std::to_string(c) + "): forward says " + name(forward[i]) + ", transposed says " +
           name(backward[i]));
    }
}

void BlockMask::checkInputs(int64_t B, int64_t H, int64_t qLen, int64_t kvLen) const {
  // Every call checks: the mask's description is formed only for a message.
  auto me = [&] { return "block mask (" + describe() + ")"; };
  if (qLen != qLen_ || kvLen != kvLen_)
    throw Error("the " + me() + " was built for " + lengths(qLen_, kvLen_) + " but the inputs have " +
                lengths(qLen, kvLen) + "; build a mask for these lengths (a mask is never cropped or padded silently)");
  if (B_ != 1 && B_ != B)
    throw Error("the " + me() + " has batch " + std::to_string(B_) + " but the inputs have batch " + std::to_string(B) +
                " (a mask's B is 1, to broadcast, or the batch)");
  if (H_ != 1 && H_ != H)
    throw Error("the " + me() + " has " + std::to_string(H_) + " heads but the inputs have " + std::to_string(H) +
                " query heads (a mask's H is 1, to broadcast, or the number of query heads)");
}


namespace {
// Kept list tensors are read by later calls on any stream, so an upload on a call's stream is
// waited for before the tensors are published: a stall at a mask's first use on the device only.
void finishUpload(MemorySpace space, runtime::Stream* stream) {
  if (stream && space == MemorySpace::Device) stream->synchronize();
}
}  // namespace

const BlockMaskTensors& BlockMask::kvTensors(MemorySpace space, runtime::Stream* stream) const& {
  std::lock_guard lock(tensors_->mutex);
  auto& slot = tensors_->kv[spaceSlot(space)];
  if (!slot && !hostLists_) {
    const char* other = space == MemorySpace::Device ? "host" : "device";
    throw Error("BlockMask::kvTensors: the lists of " + describe() + " exist only as " + other +
                " tensors (fromListTensors), and the host keeps no copy to make " +
                (space == MemorySpace::Device ? "device" : "host") + " ones from; run the call where the lists are");
  }
  if (!slot) {
    BlockMaskTensors t;
    const Shape rowsQ{B_, H_, nQ_}, cellsQ{B_, H_, nQ_, nKv_};
    t.kvNum = Tensor::fromHost(lists_->partialKv.num, rowsQ, space, stream);
    t.kvIndices = Tensor::fromHost(lists_->partialKv.indices, cellsQ, space, stream);
    t.fullKvNum = Tensor::fromHost(lists_->fullKv.num, rowsQ, space, stream);
    t.fullKvIndices = Tensor::fromHost(lists_->fullKv.indices, cellsQ, space, stream);
    t.kvBatchStride = B_ > 1 ? H_ * nQ_ : 0;
    t.kvHeadStride = H_ > 1 ? nQ_ : 0;
    finishUpload(space, stream);
    slot = std::move(t);
  }
  return *slot;
}

namespace {
// Tiles t = (b·H + h)·tiles + i, sorted by workOf(b, h, i), most first, ties in index order.
std::vector<int32_t> mostWorkFirst(const char* what, int64_t B, int64_t H, int64_t tiles,
                                   const std::function<int64_t(int64_t, int64_t, int64_t)>& workOf) {
  if (double(B) * double(H) * double(tiles) > double(INT32_MAX))
    throw Error(std::string("BlockMask::") + what + ": " + std::to_string(B * H * tiles) + " tiles do not fit i32");
  std::vector<int64_t> work(size_t(B * H * tiles));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < tiles; ++i) work[size_t((b * H + h) * tiles + i)] = workOf(b, h, i);
  std::vector<int32_t> order(work.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return work[size_t(x)] > work[size_t(y)]; });
  return order;
}
}  // namespace

std::vector<int32_t> BlockMask::heaviestTilesFirst(int64_t B, int64_t H, int64_t qLen, int64_t blockM) const {
  requireHostLists("heaviestTilesFirst");
  if (B < 1 || H < 1 || qLen < 1 || blockM < 1)
    throw Error("BlockMask::heaviestTilesFirst: B, H, qLen and blockM must be positive, got B=" + std::to_string(B) +
                " H=" + std::to_string(H) + " qLen=" + std::to_string(qLen) + " blockM=" + std::to_string(blockM));
  checkInputs(B, H, qLen, kvLen_);
  return mostWorkFirst("heaviestTilesFirst", B, H, (qLen + blockM - 1) / blockM, [&](int64_t b, int64_t h, int64_t m) {
    // The row the kernel reads (FlexAttentionForward.cpp's maskRow), B and H broadcast.
    const int64_t maskRow = std::min((m * blockM + qPhase_) / sizes_.q, nQ_ - 1);
    const size_t r = size_t(((B_ > 1 ? b : 0) * H_ + (H_ > 1 ? h : 0)) * nQ_ + maskRow);
    return int64_t(lists_->partialKv.num[r]) + lists_->fullKv.num[r];
  });
}

std::vector<int32_t> BlockMask::heaviestKeyTilesFirst(int64_t B, int64_t Hkv, int64_t G, int64_t kvLen,
                                                      int64_t blockN) const {
  requireHostLists("heaviestKeyTilesFirst");
  if (B < 1 || Hkv < 1 || G < 1 || kvLen < 1 || blockN < 1)
    throw Error("BlockMask::heaviestKeyTilesFirst: B, Hkv, G, kvLen and blockN must be positive, got B=" +
                std::to_string(B) + " Hkv=" + std::to_string(Hkv) + " G=" + std::to_string(G) + " kvLen=" +
                std::to_string(kvLen) + " blockN=" + std::to_string(blockN));
  checkInputs(B, Hkv * G, qLen_, kvLen);
  return mostWorkFirst("heaviestKeyTilesFirst", B, Hkv, (kvLen + blockN - 1) / blockN,
                       [&](int64_t b, int64_t hkv, int64_t n) {
                         // The column the kernel walks, over the group's query heads (transposed lists).
                         const int64_t column = std::min(n * blockN / sizes_.kv, nKv_ - 1);
                         int64_t w = 0;
                         for (int64_t h = hkv * G; h < (hkv + 1) * G; ++h) {
                           const size_t r = size_t(((B_ > 1 ? b : 0) * H_ + (H_ > 1 ? h : 0)) * nKv_ + column);
                           w += int64_t(lists_->partialQ.num[r]) + lists_->fullQ.num[r];
                         }
                         return w;
                       });
}

const Tensor& BlockMask::heaviestTilesFirstTensor(int64_t B, int64_t H, int64_t length, int64_t block,
                                                  MemorySpace space, runtime::Stream* stream, bool keys,
                                                  int64_t G) const& {
  std::lock_guard lock(tensors_->mutex);
  auto& cache = tensors_->tileOrders[spaceSlot(space)];
  const std::array<int64_t, 6> key{B, H, length, block, keys, G};
  auto it = cache.find(key);
  if (it == cache.end()) {
    const std::vector<int32_t> order =
        keys ? heaviestKeyTilesFirst(B, H, G, length, block) : heaviestTilesFirst(B, H, length, block);
    Tensor t = Tensor::fromHost(order, {int64_t(order.size())}, space, stream);
    finishUpload(space, stream);  // kept for later calls on any stream
    it = cache.emplace(key, std::move(t)).first;
  }
  return it->second;
}

const BlockMaskTensors& BlockMask::tensors(MemorySpace space, runtime::Stream* stream) const& {
  const BlockMaskTensors& kv = kvTensors(space, stream);
  std::lock_guard lock(tensors_->mutex);
  auto& slot = tensors_->all[spaceSlot(space)];
  if (!slot && !hostLists_) {
    // No host lists to transpose: the forward lists become block states and the states are
    // compacted along the other axis, both where the lists are.
    Tensor states = Tensor::zeros(DType::I8, {B_ * H_ * nQ_ * nKv_}, space, stream);
    Kernel& scatter = mask_.state().kernel("block_mask_states_from_lists", [] { return makeStatesFromListsKernel(); });
    launch(scatter, space, LaunchOptions{.grid = {B_ * H_ * nQ_, 1, 1}, .constants = {64}, .num_warps = 4, .stream = stream},
           kv.kvNum, kv.kvIndices, kv.fullKvNum, kv.fullKvIndices, states, H_, nQ_, nKv_, kv.kvBatchStride,
           kv.kvHeadStride);
    const BlockMaskTensors byKv =
        compactStates(mask_, states, {B_, H_, nKv_}, nQ_, nKv_, nQ_ * nKv_, 1, nKv_, space, stream);
    BlockMaskTensors t = kv;
    t.qNum = byKv.kvNum;
    t.qIndices = byKv.kvIndices;
    t.fullQNum = byKv.fullKvNum;
    t.fullQIndices = byKv.fullKvIndices;
    finishUpload(space, stream);  // kept for later calls on any stream, as uploads are
    slot = std::move(t);
  }
  if (!slot) {
    BlockMaskTensors t = kv;
    const Shape rowsKv{B_, H_, nKv_}, cellsKv{B_, H_, nKv_, nQ_};
    t.qNum = Tensor::fromHost(lists_->partialQ.num, rowsKv, space, stream);
    t.qIndices = Tensor::fromHost(lists_->partialQ.indices, cellsKv, space, stream);
    t.fullQNum = Tensor::fromHost(lists_->fullQ.num, rowsKv, space, stream);
    t.fullQIndices = Tensor::fromHost(lists_->fullQ.indices, cellsKv, space, stream);
    finishUpload(space, stream);
    slot = std::move(t);
  }
  return *slot;
}

// ---- structural builders ---------------------------------------------------

namespace {
MemorySpace defaultSpace(const BlockMaskPlacement& where) {
  return where.space ? *where.space : (deviceAvailable() ? MemorySpace::Device : MemorySpace::Host);
}
}  // namespace

BlockMask causalBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                          BlockMaskPlacement where) {
  return BlockMaskBuilder::structural(causal_mask(), B, H, qLen, kvLen, sizes, "causalBlockMask", where.space,
                                      [](int64_t, int64_t) {
                                        return BlockMaskBuilder::RowRule{[](int64_t) { return int64_t(0); },
                                                                         [](int64_t i) { return i; }};
                                      });
}

BlockMask slidingWindowBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                                 const std::vector<int64_t>& windows, BlockSizes sizes,
                                 BlockMaskPlacement where) {
  const char* what = "slidingWindowBlockMask";
  if (windows.size() != 1 && int64_t(windows.size()) != H)
    throw Error(std::string(what) + ": give one window or one per head (H=" + std::to_string(H) + "), got " +
                std::to_string(windows.size()));
  for (int64_t w : windows)
    if (w < 1 || w > INT32_MAX)
      throw Error(std::string(what) + ": windows must be in [1, 2^31) (a window counts the query), got " + std::to_string(w));
  MaskMod mod;
  std::optional<MemorySpace> space = where.space;
  if (windows.size() == 1) {
    mod = sliding_window_mask(windows[0]);
  } else {
    space = defaultSpace(where);
    std::vector<int32_t> w(windows.begin(), windows.end());
    mod = sliding_window_mask(capture(uploadCapture(w, {H}, *space, where.stream), "window"));
  }
  return BlockMaskBuilder::structural(mod, B, H, qLen, kvLen, sizes, what, space, [&](int64_t, int64_t h) {
    const int64_t w = windows.size() == 1 ? windows[0] : windows[size_t(h)];
    return BlockMaskBuilder::RowRule{[w](int64_t i) { return i - w + 1; }, [](int64_t i) { return i; }};
  });
}

BlockMask slidingWindowBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                                 const CapturedTensor& windowPerHead, BlockSizes sizes,
                                 BlockMaskPlacement placement) {
  const std::optional<MemorySpace> where = placement.space;
  const std::string what = "slidingWindowBlockMask";
  MaskMod mod = sliding_window_mask(windowPerHead);  // checks it is a defined integer tensor [H]
  const Tensor t = windowPerHead.tensor();
  if (t.size(0) != H)
    throw Error(what + ": the windows '" + windowPerHead.name() + "' must have one entry per head (H=" +
                std::to_string(H) + "), got " + t.describe());
  if (where && *where != t.space())
    throw Error(what + ": the windows '" + windowPerHead.name() + "' are in " +
                (t.space() == MemorySpace::Host ? "host" : "device") + " memory, but the placement asks for " +
                (*where == MemorySpace::Host ? "host" : "device") +
                " memory (the mask's partial blocks read the tensor where it is)");
  std::vector<int64_t> windows;
  switch (t.dtype()) {
    case DType::I8: for (int8_t w : t.toHost<int8_t>(placement.stream)) windows.push_back(w); break;
    case DType::I32: for (int32_t w : t.toHost<int32_t>(placement.stream)) windows.push_back(w); break;
    case DType::I64: windows = t.toHost<int64_t>(placement.stream); break;
    default: throw Error(what + ": the windows must be i8, i32 or i64, got " + t.describe());
  }
  for (size_t h = 0; h < windows.size(); ++h)
    if (windows[h] < 1 || windows[h] > INT32_MAX)
      throw Error(what + ": the window of head " + std::to_string(h) + " in '" + windowPerHead.name() +
                  "' must be in [1, 2^31) (a window counts the query), got " + std::to_string(windows[h]));
  return BlockMaskBuilder::structural(mod, B, H, qLen, kvLen, sizes, what.c_str(), t.space(), [&](int64_t, int64_t h) {
    const int64_t w = windows[size_t(h)];
    return BlockMaskBuilder::RowRule{[w](int64_t i) { return i - w + 1; }, [](int64_t i) { return i; }};
  });
}

BlockMask prefixLmBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen, int64_t prefixLength, BlockSizes sizes,
                            BlockMaskPlacement where) {
  MaskMod mod = prefix_lm_mask(prefixLength);
  return BlockMaskBuilder::structural(mod, B, H, qLen, kvLen, sizes, "prefixLmBlockMask", where.space,
                                      [prefixLength](int64_t, int64_t) {
                                        return BlockMaskBuilder::RowRule{
                                            [](int64_t) { return int64_t(0); },
                                            [prefixLength](int64_t i) { return std::max(prefixLength - 1, i); }};
                                      });
}

BlockMask documentBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                            const std::vector<std::vector<int64_t>>& offsetsPerBatch, bool causal, BlockSizes sizes,
                            BlockMaskPlacement where) {
  const char* what = "documentBlockMask";
  validate(what, B, H, qLen, kvLen, sizes);
  if (offsetsPerBatch.size() != 1 && int64_t(offsetsPerBatch.size()) != B)
    throw Error(std::string(what) + ": give one offset list or one per batch (B=" + std::to_string(B) + "), got " +
                std::to_string(offsetsPerBatch.size()));
  const int64_t L = std::max(qLen, kvLen);
  for (size_t b = 0; b < offsetsPerBatch.size(); ++b) {
    const auto& o = offsetsPerBatch[b];
    const std::string list = "offsets of batch " + std::to_string(b);
    if (o.size() < 2 || o.front() != 0)
      throw Error(std::string(what) + ": " + list + " must start at 0 and end a document (at least 2 entries)");
    for (size_t k = 1; k < o.size(); ++k)
      if (o[k] <= o[k - 1])
        throw Error(std::string(what) + ": " + list + " must be strictly increasing, got " + std::to_string(o[k - 1]) +
                    " then " + std::to_string(o[k]));
    if (o.back() < L)
      throw Error(std::string(what) + ": " + list + " end at " + std::to_string(o.back()) +
                  ", before max(Q_LEN, KV_LEN) = " + std::to_string(L) + ": every position needs a document");
  }
  // The mod reads document ids: [L] when one list serves every batch, else [B, L].
  const MemorySpace space = defaultSpace(where);
  std::vector<int32_t> ids;
  for (const auto& o : offsetsPerBatch)
    for (size_t d = 0; d + 1 < o.size() && o[d] < L; ++d)
      for (int64_t i = o[d]; i < std::min(o[d + 1], L); ++i) ids.push_back(int32_t(d));
  Shape idShape = offsetsPerBatch.size() == 1 ? Shape{L} : Shape{B, L};
  MaskMod docs = document_mask(capture(uploadCapture(ids, idShape, space, where.stream), "document_ids"));
  MaskMod mod = causal ? and_masks(causal_mask(), docs) : docs;
  return BlockMaskBuilder::structural(mod, B, H, qLen, kvLen, sizes, what, space, [&](int64_t b, int64_t) {
    const std::vector<int64_t>* o = &offsetsPerBatch[offsetsPerBatch.size() == 1 ? 0 : size_t(b)];
    auto doc = [o](int64_t i) { return size_t(std::upper_bound(o->begin(), o->end(), i) - o->begin() - 1); };
    auto start = [o, doc](int64_t i) { return (*o)[doc(i)]; };
    if (causal) return BlockMaskBuilder::RowRule{start, [](int64_t i) { return i; }};
    return BlockMaskBuilder::RowRule{start, [o, doc](int64_t i) { return (*o)[doc(i) + 1] - 1; }};
  });
}

BlockMask rowIntervalBlockMask(MaskMod mod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                               const RowKeyInterval& rowKeys, BlockSizes sizes, BlockMaskPlacement where) {
  const char* what = "rowIntervalBlockMask";
  if (!rowKeys) throw Error(std::string(what) + ": the row interval function is empty");
  return BlockMaskBuilder::fromIntervals(std::move(mod), B, H, qLen, kvLen, sizes, what, where.space, rowKeys);
}

}  // namespace flextile::attention
