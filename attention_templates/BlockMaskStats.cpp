// BlockMask::stats(): row lengths, the full/partial split, metadata bytes and the amplification
// gamma of a kernel tile (docs/blockmask.md, "Statistics").
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention_templates/BlockMask.h"

namespace flextile::attention {

using namespace flextile::dsl;

namespace {

// Allowed in-range pairs of listed blocks, one program per (bh, q block, kv block) triple. Query
// positions are global (a slice's rows start qPhase before its first query), as in toDense().
Kernel makeAllowedCountKernel(const MaskMod& mod) {
  MaskMod::Fn fn = mod.fn();
  std::string name = mod.name();
  return kernel("block_mask_allowed_pairs", [fn, name](Ptr<i32> blocks, Ptr<i32> counts, Int H, Int qLen, Int kvLen,
                                                       Int rowStart, Int qOffset, Const<int> BQ, Const<int> BKV) {
    MaskMod mask(name, fn);
    auto t = program_id(0);
    auto bh = load(blocks + t * 3), qb = load(blocks + t * 3 + 1), kb = load(blocks + t * 3 + 2);
    auto g = (rowStart + qb * BQ + arange(0, BQ)).expand(1);
    auto local = g - qOffset;
    auto kv = (kb * BKV + arange(0, BKV)).expand(0);
    auto live = mask(bh / H, bh % H, g, kv) & (local >= 0) & (local < qLen) & (kv < kvLen);
    store(counts + t, sum(sum(live, 1), 0));
  });
}

// Nearest-rank percentiles and the mean of per-row counts in [0, maxValue], from their histogram.
RowLengthStats rowLengths(const std::vector<int64_t>& histogram, int64_t rows) {
  RowLengthStats s;
  if (rows == 0) return s;
  auto percentile = [&](int64_t percent) {
    const int64_t rank = std::max<int64_t>(1, (percent * rows + 99) / 100);  // ceil(p / 100 * rows)
    int64_t seen = 0;
    for (size_t v = 0; v < histogram.size(); ++v)
      if ((seen += histogram[v]) >= rank) return int64_t(v);
    return int64_t(histogram.size()) - 1;
  };
  double sum = 0;
  for (size_t v = 0; v < histogram.size(); ++v) {
    sum += double(v) * double(histogram[v]);
    if (histogram[v] > 0) s.max = int64_t(v);
  }
  s.mean = sum / double(rows);
  s.p50 = percentile(50);
  s.p95 = percentile(95);
  return s;
}

double ratio(int64_t computed, int64_t allowed) {
  if (allowed > 0) return double(computed) / double(allowed);
  return computed > 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

BlockMaskStats BlockMask::stats(std::optional<BlockSizes> kernelTile) const {
  requireHostLists("stats");
  const BlockSizes tile = kernelTile.value_or(sizes_);
  if (tile.q < 1 || tile.kv < 1)
    throw Error("BlockMask::stats: the kernel tile must be at least 1 x 1, got " + std::to_string(tile.q) + " x " +
                std::to_string(tile.kv) + " (" + describe() + ")");
  const int64_t BQ = sizes_.q, BKV = sizes_.kv, heads = B_ * H_;
  // Row-grid coordinates: u = local query + qPhase, so block row r is u in [r BQ, (r + 1) BQ) and
  // the queries are u in [qPhase, qPhase + qLen).
  const int64_t uBegin = qPhase_, uEnd = qPhase_ + qLen_;
  auto rowQueries = [&](int64_t r) { return std::min((r + 1) * BQ, uEnd) - std::max(r * BQ, uBegin); };
  auto colKeys = [&](int64_t c) { return std::min((c + 1) * BKV, kvLen_) - c * BKV; };

  // Allowed pairs of the partial blocks, one count per listed block, in list order.
  std::vector<int32_t> partialTriples;
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t h = 0; h < H_; ++h)
      for (int64_t r = 0; r < nQ_; ++r)
        for (int32_t c : partialKvBlocks(b, h, r))
          partialTriples.insert(partialTriples.end(), {int32_t(b * H_ + h), int32_t(r), c});
  std::vector<int32_t> partialAllowed;
  if (!partialTriples.empty()) {
    const MemorySpace space = space_ ? *space_ : mask_.captureSpace().value_or(deviceAvailable() ? MemorySpace::Device
                                                                                                  : MemorySpace::Host);
    Kernel& k = mask_.state().kernel("block_mask_allowed_pairs", [&] { return makeAllowedCountKernel(mask_); });
    const int64_t n = int64_t(partialTriples.size() / 3);
    Tensor blocks = Tensor::fromHost(partialTriples, {n * 3}, space);
    Tensor counts = Tensor::zeros(DType::I32, {n}, space);
    LaunchOptions options{.grid = {n, 1, 1}, .constants = {BQ, BKV}, .num_warps = BQ * BKV >= 128 * 64 ? 8 : 4};
    if (space == MemorySpace::Device) k.run(options, blocks, counts, H_, qLen_, kvLen_, qOffset_ - qPhase_, qOffset_);
    else k.interpret(options, blocks, counts, H_, qLen_, kvLen_, qOffset_ - qPhase_, qOffset_);
    partialAllowed = counts.toHost<int32_t>();
  }

  BlockMaskStats out;
  out.tile = tile;
  std::vector<int64_t> overallHistogram(size_t(nKv_) + 1, 0);
  size_t nextPartial = 0;
  const int64_t tileRows = (uEnd + tile.q - 1) / tile.q, tileCols = (kvLen_ + tile.kv - 1) / tile.kv;
  std::vector<uint8_t> live(size_t(nQ_ * nKv_)), columnLive(size_t(nKv_), 0);
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t h = 0; h < H_; ++h) {
      BlockMaskHeadStats s;
      s.b = b;
      s.h = h;
      s.rows = nQ_;
      std::vector<int64_t> histogram(size_t(nKv_) + 1, 0);
      std::fill(live.begin(), live.end(), 0);
      for (int64_t r = 0; r < nQ_; ++r) {
        const auto full = fullKvBlocks(b, h, r), partial = partialKvBlocks(b, h, r);
        s.fullBlocks += int64_t(full.size());
        s.partialBlocks += int64_t(partial.size());
        const size_t n = full.size() + partial.size();
        ++histogram[n];
        ++overallHistogram[n];
        if (n == 0) ++s.emptyRows;
        for (int32_t c : full) {
          live[size_t(r * nKv_ + c)] = 1;
          s.allowedPairs += rowQueries(r) * colKeys(c);
        }
        for (int32_t c : partial) {
          live[size_t(r * nKv_ + c)] = 1;
          s.allowedPairs += partialAllowed[nextPartial++];
        }
      }
      s.live = rowLengths(histogram, nQ_);
      // A tile row computes the tile columns that touch a kv block live in any block row it spans.
      for (int64_t m = uBegin / tile.q; m < tileRows; ++m) {
        const int64_t u0 = std::max(m * tile.q, uBegin), u1 = std::min((m + 1) * tile.q, uEnd);
        std::fill(columnLive.begin(), columnLive.end(), 0);
        for (int64_t r = u0 / BQ; r <= (u1 - 1) / BQ; ++r)
          for (int64_t c = 0; c < nKv_; ++c) columnLive[size_t(c)] |= live[size_t(r * nKv_ + c)];
        int64_t keys = 0;
        for (int64_t t = 0; t < tileCols; ++t) {
          const int64_t k0 = t * tile.kv, k1 = std::min(k0 + tile.kv, kvLen_);
          bool touches = false;
          for (int64_t c = k0 / BKV; c <= (k1 - 1) / BKV && !touches; ++c) touches = columnLive[size_t(c)] != 0;
          if (touches) keys += k1 - k0;
        }
        s.computedPairs += (u1 - u0) * keys;
      }
      s.gamma = ratio(s.computedPairs, s.allowedPairs);
      out.overall.rows += s.rows;
      out.overall.fullBlocks += s.fullBlocks;
      out.overall.partialBlocks += s.partialBlocks;
      out.overall.emptyRows += s.emptyRows;
      out.overall.allowedPairs += s.allowedPairs;
      out.overall.computedPairs += s.computedPairs;
      out.heads.push_back(s);
    }
  out.overall.live = rowLengths(overallHistogram, out.overall.rows);
  out.overall.gamma = ratio(out.overall.computedPairs, out.overall.allowedPairs);

  const int64_t rowsQ = heads * nQ_, rowsKv = heads * nKv_, cells = heads * nQ_ * nKv_;
  out.metadata.forward = 4 * 2 * (rowsQ + cells);
  out.metadata.transposes = 4 * 2 * (rowsKv + cells);
  out.metadata.liveForward = 4 * (2 * rowsQ + out.overall.fullBlocks + out.overall.partialBlocks);
  return out;
}

}  // namespace flextile::attention
