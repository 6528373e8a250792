// BlockMask: a mask_mod lifted to blocks, the work list of the attention
// templates (docs/blockmask.md has the pictures and the proofs).
//
// The Q_LEN x KV_LEN plane is cut into blocks of Q_BLOCK_SIZE x KV_BLOCK_SIZE
// (the last row and column of blocks may be cut short by the lengths). For
// every (b, h, query block) the mask lists
//   * the FULL kv blocks:    every in-range pair allowed — the template runs
//                            them without evaluating mask_mod;
//   * the PARTIAL kv blocks: some but not all in-range pairs allowed — the
//                            template applies mask_mod before the softmax;
// and every other block is EMPTY (no allowed pair): never loaded. The lists
// are exact: a block with one live pair is never dropped, a block with one
// forbidden in-range pair is never full, and (for masks built by this file)
// a partial block has at least one allowed pair. Pairs past Q_LEN or KV_LEN
// are outside the mask, so a tail block is full when every in-range pair is
// allowed.
//
// Storage (host, int32, row-major, padded to the block count; entries past a
// row's count are 0, a valid index, so a prefetching template may read them):
//   partialKv().num [B, H, nQ]   partialKv().indices [B, H, nQ, nKV]   (ascending)
//   fullKv()    ...same shapes...
//   partialQ().num  [B, H, nKV]  partialQ().indices  [B, H, nKV, nQ]   (the transposes:
//   fullQ()     ...same shapes...                      per kv block, its q blocks; backward)
// B or H equal to 1 broadcast over the batch or the heads. A mask of fromListTensors (or of
// createBlockMask without host lists) has no host storage: its lists are those tensors alone.
//
// A mask describes queries [qOffset, qOffset + qLen) of the global position
// space (qOffset is 0 unless the mask is a slice, see sliceRows) and keys
// [0, kvLen). Templates evaluate the mods at global query positions. A mask
// used with inputs of other lengths is an error (checkInputs), never cropped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "attention_templates/Mods.h"

namespace flextile::attention {

struct BlockSizes {
  int64_t q = 128;   // Q_BLOCK_SIZE, a power of two
  int64_t kv = 128;  // KV_BLOCK_SIZE, a power of two
};

enum class BlockState : uint8_t { Empty = 0, Partial = 1, Full = 2 };

// The distribution of live (full + partial) blocks over query-block rows. Percentiles are
// nearest-rank: P95 is the smallest count that at least 95 % of the rows do not exceed.
struct RowLengthStats {
  double mean = 0;
  int64_t p50 = 0, p95 = 0, max = 0;
};

// The statistics of one (b, h) of a mask, or of all of them (BlockMask::stats).
struct BlockMaskHeadStats {
  int64_t b = -1, h = -1;     // the mask's (b, h); -1, -1 for the overall entry
  int64_t rows = 0;           // query-block rows
  int64_t fullBlocks = 0, partialBlocks = 0;
  int64_t emptyRows = 0;      // rows without a live block: their queries see no key
  RowLengthStats live;        // live blocks per row
  int64_t allowedPairs = 0;   // in-range (q, kv) pairs the mask allows, counted exactly
  int64_t computedPairs = 0;  // in-range pairs of the kernel tiles that touch a live block
  // computedPairs / allowedPairs: 1 when every computed score is used. +inf when work is done for
  // no allowed pair (a list that says more than its mod), NaN when nothing is allowed or computed.
  double gamma = 0;
};

// Bytes of the lists, int32 as stored (padded to the block count, see BlockLists).
struct BlockMaskMetadataBytes {
  int64_t forward = 0;      // partial and full kv lists: counts and padded indices
  int64_t transposes = 0;   // partial and full q lists (the backward's)
  int64_t liveForward = 0;  // what the forward loop reads: the counts and the live indices only
};

struct BlockMaskStats {
  BlockSizes tile;                        // the kernel tile (BLOCK_M x BLOCK_N) gamma counts with
  std::vector<BlockMaskHeadStats> heads;  // one per (b, h) of the mask, b-major
  BlockMaskHeadStats overall;             // over every row of every (b, h)
  BlockMaskMetadataBytes metadata;
};

// One list kind: per row a count, and the row's indices padded to a stride.
struct BlockLists {
  std::vector<int32_t> num;      // [B, H, rows]
  std::vector<int32_t> indices;  // [B, H, rows, stride]
};

// The lists as tensors (shapes as above), for kernels.
struct BlockMaskTensors {
  dsl::Tensor kvNum, kvIndices, fullKvNum, fullKvIndices;
  dsl::Tensor qNum, qIndices, fullQNum, fullQIndices;
  // Where row (b, h, q block) of the forward lists is: its count at kvNum + b * kvBatchStride +
  // h * kvHeadStride + q block, its indices at that row index times numKvBlocks() (the same for
  // the full lists). 0 on a broadcast dimension (B or H of 1), so that any b or h reads row 0. A
  // mask's own lists are contiguous (H * nQ and nQ); a slice's are views of its parent's tensors
  // and keep the parent's strides, which is why kernels must take them from here.
  int64_t kvBatchStride = 0, kvHeadStride = 0;
};

// What the host may assume of a mask whose lists exist only as tensors (BlockMask::fromListTensors):
// bounds that choose the kernels and the decode split count without reading the lists. The
// defaults assume nothing (every row may list every block, of either kind). The kernels read the
// real counts on the device, so maxLiveBlocksPerRow only sizes the decode split count: one too
// high or too low costs speed, never correctness (a sliding window of W keys lists at most
// W / KV_BLOCK_SIZE + 2 blocks a row). The two flags choose which walks the kernels have:
// mayHaveFull = false for lists with full blocks would skip them, the caller's error.
struct ListBounds {
  int64_t maxLiveBlocksPerRow = -1;  // full + partial blocks of any row; -1: the number of kv blocks
  bool mayHaveFull = true, mayHavePartial = true;
};

class BlockMask {
 public:
  // A mask from given forward lists (from a selector, say). The transposes
  // are derived, and the result is checked (check()).
  static BlockMask fromKvLists(MaskMod maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                               BlockLists partialKv, BlockLists fullKv);
  // The same with the transposes given too (they are checked against the
  // forward lists, not derived).
  static BlockMask fromLists(MaskMod maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes,
                             BlockLists partialKv, BlockLists fullKv, BlockLists partialQ, BlockLists fullQ);

  // A mask whose forward lists are the given tensors and nothing else: no host copy, nothing read
  // back. For lists that another kernel, or another framework, made on the device (PyTorch's
  // BlockMask holds the same four tensors: kv_num_blocks, kv_indices, full_kv_num_blocks,
  // full_kv_indices), or host tensors for the interpreter. `lists`: kvNum and fullKvNum i32
  // [B, H, nQ], kvIndices and fullKvIndices i32 [B, H, nQ, nKV], contiguous, all in one memory space,
  // as BlockMask documents them (ascending indices, entries past a row's count valid block indices,
  // e.g. 0); the strides are set here. The contents are trusted (reading them would be the host
  // round trip this avoids): toHost().check() checks them. The forward, decode and backward
  // templates and sliceRows work on such a mask (tensors() derives the transposes where the lists
  // are); what needs the host lists (stats, pictures, dense views, checks, the list accessors)
  // throws, naming toHost().
  static BlockMask fromListTensors(MaskMod maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                                   BlockSizes sizes, const BlockMaskTensors& lists, ListBounds bounds = {});
  // Whether the host keeps the lists (every mask but fromListTensors' and its slices).
  bool hasHostLists() const { return hostLists_; }
  // A copy with host lists (and transposes) of a fromListTensors mask or of a slice of one, read back
  // on `stream` (one synchronization) and checked (check()); a mask with host lists returns itself.
  BlockMask toHost(runtime::Stream* stream = nullptr) const;
  // Exact where the host has the lists, the ListBounds otherwise: the most live blocks of a row,
  // and whether any row may list full / partial blocks.
  int64_t maxLiveBlocksPerRow() const;
  bool mayHaveFullBlocks() const;
  bool mayHavePartialBlocks() const;
  // The number of blocks every row lists when the host lists show no partial block and the same
  // count of full blocks in every row (an all-full mask, or block-sparse rows of equal length):
  // then every query tile walks alike. -1 otherwise, and without host lists.
  int64_t uniformFullRowLength() const;

  int64_t batch() const { return B_; }
  int64_t heads() const { return H_; }
  int64_t qLen() const { return qLen_; }
  int64_t kvLen() const { return kvLen_; }
  int64_t qBlockSize() const { return sizes_.q; }
  int64_t kvBlockSize() const { return sizes_.kv; }
  BlockSizes blockSizes() const { return sizes_; }
  int64_t numQBlocks() const { return nQ_; }
  int64_t numKvBlocks() const { return nKv_; }
  // Global position of local query 0, and its position inside block row 0
  // (non-zero only for a one-row slice that starts mid-block).
  int64_t qOffset() const { return qOffset_; }
  int64_t qPhase() const { return qPhase_; }
  // The mask_mod for partial blocks (evaluate it at global query positions).
  const MaskMod& maskMod() const { return mask_; }

  const BlockLists& partialKv() const { requireHostLists("partialKv"); return lists_->partialKv; }
  const BlockLists& fullKv() const { requireHostLists("fullKv"); return lists_->fullKv; }
  const BlockLists& partialQ() const { requireHostLists("partialQ"); return lists_->partialQ; }
  const BlockLists& fullQ() const { requireHostLists("fullQ"); return lists_->fullQ; }

  // One row of a list. b and h are the mask's (0 on a broadcast dimension).
  std::span<const int32_t> partialKvBlocks(int64_t b, int64_t h, int64_t qBlock) const;
  std::span<const int32_t> fullKvBlocks(int64_t b, int64_t h, int64_t qBlock) const;
  std::span<const int32_t> partialQBlocks(int64_t b, int64_t h, int64_t kvBlock) const;
  std::span<const int32_t> fullQBlocks(int64_t b, int64_t h, int64_t kvBlock) const;
  BlockState state(int64_t b, int64_t h, int64_t qBlock, int64_t kvBlock) const;

  // [B, H, nQ, nKV] of BlockState.
  std::vector<uint8_t> toDenseBlocks() const;
  // [B, H, qLen, kvLen] of 0/1: full blocks give 1 on their in-range pairs,
  // empty blocks 0, partial blocks mask_mod (evaluated by a kernel where the
  // mask's captured tensors live). O(qLen * kvLen) memory: for tests and
  // debugging only.
  std::vector<uint8_t> toDense() const;
  // Block picture of one (b, h): '█' full, '░' partial, ' ' empty, with a
  // header and a legend; at most maxBlocks rows and columns are drawn.
  std::string picture(int64_t b = 0, int64_t h = 0, int64_t maxBlocks = 64) const;
  // Fraction of blocks skipped: 1 - (partial + full) / (B * H * nQ * nKV).
  double sparsity() const;
  int64_t numPartialBlocks() const;
  int64_t numFullBlocks() const;

  // Row lengths, the full/partial split, the metadata bytes and the amplification gamma of a
  // kernel that computes BLOCK_M x BLOCK_N tiles (`kernelTile`, by default the mask's blocks;
  // any positive sizes). The kernel computes a tile when it touches a live block — every tile of
  // a listed block when the tile divides the block, as FlexTile's templates do, and a whole tile
  // around blocks smaller than it. Tiles start on the mask's block grid (a slice's grid starts
  // qPhase() before its first query); pairs past qLen or kvLen are counted neither as computed nor
  // as allowed. Allowed pairs are counted exactly: full blocks by their size, partial blocks by a
  // kernel that evaluates mask_mod where the mask's captured tensors live. Per (b, h) of the mask:
  // a broadcast dimension (B or H of 1) has one entry, which every batch or head shares.
  BlockMaskStats stats(std::optional<BlockSizes> kernelTile = std::nullopt) const;

  // Query-block rows [qBlockStart, qBlockStart + count) as a mask of their
  // own, for decode: the slice describes queries [queryOffset, queryOffset +
  // queryLength) (global positions), by default all the queries of those rows.
  // The queries must lie inside the rows; an offset that is not the start of
  // a row is allowed for a one-row slice. Full and empty stay exact for any
  // subset of a row's queries; a partial block may become conservative (its
  // mask_mod still decides), never wrong.
  // Zero-copy: the slice's forward list tensors (kvTensors) are views of the parent's, in the
  // parent's space (its placement, else where its mod's captures live, else the GPU when there is
  // one, else the host; made in the parent once if they were not yet) and in any other space where
  // the parent has them already. A decode loop that slices a row per step neither allocates nor
  // uploads lists; the slice's host lists are copies (cheap), and its transposes are its own.
  // For exact lists of a decode step's queries, see decodeBlockLists (DecodeLists.h).
  BlockMask sliceRows(int64_t qBlockStart, int64_t count, std::optional<int64_t> queryOffset = std::nullopt,
                      std::optional<int64_t> queryLength = std::nullopt) const;

  // Throws flextile::Error naming the first inconsistency: list sizes,
  // counts, indices out of range / unsorted / duplicated, a block both full
  // and partial, transposes that disagree with the forward lists.
  void check() const;
  // Throws unless the mask fits inputs of batch B, H heads (query heads),
  // qLen queries and kvLen keys; the message names both lengths.
  void checkInputs(int64_t B, int64_t H, int64_t qLen, int64_t kvLen) const;

  // The lists as tensors in `space`, made on first use and kept.
  //
  // Both return a reference into this mask's cache, so they are for lvalues only: on a temporary
  // (`m.sliceRows(2, 2).kvTensors(space)`) the reference would dangle once the statement ends
  // — ASan found a test doing that (BlockMask.SlicesViewTheParentsListTensors). Name the mask.
  //
  // `stream`: where a first use uploads them (then waits for that stream, since later calls on any
  // stream read them); null: the legacy default stream's synchronous copies.
  const BlockMaskTensors& tensors(dsl::MemorySpace space, runtime::Stream* stream = nullptr) const&;
  const BlockMaskTensors& tensors(dsl::MemorySpace space, runtime::Stream* stream = nullptr) const&& = delete;
  // The forward lists alone (kvNum, kvIndices, fullKvNum, fullKvIndices and the strides; the
  // transposes left empty): what the forward and decode kernels read. A slice's are views of its
  // parent's tensors (see sliceRows): no allocation, no upload. tensors() adds the transposes,
  // which a slice makes of its own (the backward's).
  const BlockMaskTensors& kvTensors(dsl::MemorySpace space, runtime::Stream* stream = nullptr) const&;
  const BlockMaskTensors& kvTensors(dsl::MemorySpace space, runtime::Stream* stream = nullptr) const&& = delete;

  // The query tiles of a forward over B batches, H query heads and qLen queries in tiles of
  // blockM rows, heaviest first: tile t = (b·H + h)·mTiles + m (m the tile's first query over
  // blockM; the order a program per tile is launched in) ordered by the live blocks, full and
  // partial, of the mask row the tile reads (the kernel's row, qPhase() included), most first;
  // ties keep the launch order. The forward's FLEXTILE_TILE_ORDER=1 hands tiles out in this order
  // (longest processing time first), so that a mask whose long rows are not the last ones (the
  // document mask) does not end on a long tile alone. Needs the host lists.
  std::vector<int32_t> heaviestTilesFirst(int64_t B, int64_t H, int64_t qLen, int64_t blockM) const;
  // The backward's key tiles the same way: tile t = (b·Hkv + g)·nTiles + n (n the tile's first key
  // over blockN) of a program that walks the columns of the G query heads hkv·G .. hkv·G + G − 1,
  // ordered by their live blocks (the transposed lists), most first, ties in launch order.
  std::vector<int32_t> heaviestKeyTilesFirst(int64_t B, int64_t Hkv, int64_t G, int64_t kvLen, int64_t blockN) const;
  // The same as an i32 tensor in `space`, made on first use for those sizes and kept (a
  // reference into this mask's cache: lvalues only, as tensors()); `keys` for heaviestKeyTilesFirst
  // (H is then Hkv, `length` kvLen, `block` blockN, and G the query heads a key tile walks).
  const dsl::Tensor& heaviestTilesFirstTensor(int64_t B, int64_t H, int64_t length, int64_t block,
                                              dsl::MemorySpace space, runtime::Stream* stream = nullptr,
                                              bool keys = false, int64_t G = 1) const&;
  const dsl::Tensor& heaviestTilesFirstTensor(int64_t B, int64_t H, int64_t length, int64_t block,
                                              dsl::MemorySpace space, runtime::Stream* stream = nullptr,
                                              bool keys = false, int64_t G = 1) const&& = delete;

  // Where partial-block kernels of this mask run: where its captured tensors
  // live (set by the builder).
  std::optional<dsl::MemorySpace> space() const { return space_; }

  // "BlockMask 'causal': B=1 H=1 Q_LEN=100 KV_LEN=100, blocks 32 x 32 (4 x 4), ..."
  std::string describe() const;

 private:
  friend struct BlockMaskBuilder;
  BlockMask() = default;
  // Throws, naming `what` and toHost(), for a mask without host lists.
  void requireHostLists(const char* what) const;
  std::span<const int32_t> listRow(const char* what, const BlockLists& lists, int64_t b, int64_t h, int64_t index,
                                   int64_t rows, const char* indexName, int64_t rowLength) const;
  void deriveTransposes();

  MaskMod mask_;
  int64_t B_ = 1, H_ = 1, qLen_ = 0, kvLen_ = 0, nQ_ = 0, nKv_ = 0, qOffset_ = 0, qPhase_ = 0;
  BlockSizes sizes_;
  std::optional<dsl::MemorySpace> space_;
  bool hostLists_ = true;
  ListBounds bounds_;  // without host lists
  // The host lists, shared by a mask's copies: a mask is immutable once built (every write is to a
  // mask that a builder has just made), so passing one by value, or where a std::optional<BlockMask>
  // is taken, copies no list.
  struct HostLists {
    BlockLists partialKv, fullKv, partialQ, fullQ;
  };
  std::shared_ptr<HostLists> lists_ = std::make_shared<HostLists>();
  struct TensorCache;
  std::shared_ptr<TensorCache> tensors_;
};

// ---- builders --------------------------------------------------------------
// `where`: Device builds on the GPU (Kernel::run), Host through the
// interpreter (Kernel::interpret). By default: where the mod's captured
// tensors live, else the GPU when one is present, else the host.
// Its stream (device only; null: the legacy default stream): where the builder's kernel, its
// copies and the uploads of the tensors it captures go, in order. The builder returns once the
// mask is on the host, having waited for that stream only; tensors it uploads for later calls are
// waited for too, since those calls may run on any stream.
struct BlockMaskPlacement {
  std::optional<dsl::MemorySpace> space;
  runtime::Stream* stream = nullptr;
  // createBlockMask only. false: the lists are compacted by a second kernel where the states are
  // and never reach the host: a mask of BlockMask::fromListTensors (no host lists, default
  // ListBounds; what needs host lists asks for toHost()). The call does not wait: the lists are
  // ready in `stream`'s order (the legacy default stream's when null), so a call on another
  // non-blocking stream must wait for that one first.
  bool hostLists = true;
  BlockMaskPlacement() = default;
  BlockMaskPlacement(std::nullopt_t) {}
  BlockMaskPlacement(dsl::MemorySpace s) : space(s) {}
  BlockMaskPlacement(std::optional<dsl::MemorySpace> s, runtime::Stream* st = nullptr) : space(s), stream(st) {}
};

// The generic builder: a kernel evaluates mask_mod on one [BQ, BKV] tile per
// program (grid: q blocks x kv blocks x B*H), reduces it to none / some / all
// of the in-range pairs allowed, and writes one state byte per block; the
// host compacts the states into the lists. The element mask is never stored.
// The kernel is cached in the mod: a second call with the same mod (new
// captured values, other lengths) neither retraces nor recompiles.
BlockMask createBlockMask(const MaskMod& maskMod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                          BlockSizes sizes = {}, BlockMaskPlacement where = {});

// Structural builders: the same lists as createBlockMask with the matching
// standard mod, computed from each row block's interval end-points without
// scanning the plane (O(1) per listed block). Each returns a mask whose
// maskMod() is that standard mod.
// `where` (every structural builder takes it): where the mask's own tensors are made and its
// partial blocks are evaluated (space()); causal and prefix masks capture nothing, so by default
// they follow the call that uses them.
BlockMask causalBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen, BlockSizes sizes = {},
                          BlockMaskPlacement where = {});
// windowPerHead: one window (broadcast) or one per head (H entries; the mod
// then reads a captured i32 [H] tensor made in `where`).
BlockMask slidingWindowBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                                 const std::vector<int64_t>& windowPerHead, BlockSizes sizes = {},
                                 BlockMaskPlacement where = {});
// The same with the per-head windows in a capture of the caller's (an integer tensor [H], in
// either space): the mask's mod, sliding_window_mask(windowPerHead), reads that very tensor, so a
// user's own mod can read it too and the two share one capture (and one set of kernel
// parameters). The lists are made from the tensor's values now (a device tensor is read back
// once): build a new mask after changing them. `where` defaults to the tensor's space; another
// space is an error, since the mask's partial blocks read the tensor where it is.
BlockMask slidingWindowBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                                 const CapturedTensor& windowPerHead, BlockSizes sizes = {},
                                 BlockMaskPlacement where = {});
BlockMask prefixLmBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen, int64_t prefixLength,
                            BlockSizes sizes = {}, BlockMaskPlacement where = {});
// Documents by start offsets, one list for all batches or one per batch:
// 0 = o_0 < o_1 < ... < o_D with o_D >= max(qLen, kvLen). causal adds kv <= q.
// The mod reads document ids (i32 [L] or [B, L], L = o_D) made in `where`.
BlockMask documentBlockMask(int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                            const std::vector<std::vector<int64_t>>& offsetsPerBatch, bool causal,
                            BlockSizes sizes = {}, BlockMaskPlacement where = {});

// A mask whose every query row allows one interval of keys: row i of (b, h) allows [lo, hi] =
// rowKeys(b, h, i), before clipping to [0, kvLen); lo > hi allows none. The lists come from the
// intervals in O(qLen + nQ * nKV) per (b, h), with no kernel, and the rows need not be monotone (the
// other structural builders' rules are): an interval may jump back or be empty anywhere, as in
// packed sequences (attention_templates/Varlen.h). `mod` must allow exactly those pairs: the
// templates evaluate it on the partial blocks, which the intervals alone decide (a test compares
// such a mask with createBlockMask of its mod).
using RowKeyInterval = std::function<std::pair<int64_t, int64_t>(int64_t b, int64_t h, int64_t i)>;
BlockMask rowIntervalBlockMask(MaskMod mod, int64_t B, int64_t H, int64_t qLen, int64_t kvLen,
                               const RowKeyInterval& rowKeys, BlockSizes sizes = {}, BlockMaskPlacement where = {});

}  // namespace flextile::attention
