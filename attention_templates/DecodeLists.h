// Exact KV block lists for one decode step, computed where the attention runs.
//
// A decoder keeps one BlockMask for the whole context and, at each step, attends from a few
// consecutive queries (one token, or a handful under speculative decoding) at global positions
// [queryStart, queryStart + queryCount). The mask's rows list blocks for all Q_BLOCK_SIZE queries
// of a block row, which is too much for a few of them: a sliding window's leftmost partial block,
// say, may hold no key that the current token sees, and a block full for the row is still full,
// but a partial block may be full, or empty, for the step's queries. decodeBlockLists narrows the
// covering rows to exactly what the step's queries need:
//
//   a kv block is listed        iff some pair (q, kv), q in the range and kv < KV_LEN, is allowed;
//   and it is listed full       iff every such pair is allowed (the template then skips mask_mod).
//
// "Allowed" reads the mask's own lists first: a pair in a block full in its query's row is allowed,
// one in an empty block is not, and only pairs of partial blocks ask mask_mod (at global query
// positions). The result is therefore exact for the mask as listed, including masks from
// fromKvLists whose lists say more than their mod.
//
// It runs as one DSL kernel in the given memory space (Kernel::run on the GPU, the interpreter on
// the host), reading the mask's list tensors (BlockMask::tensors) and writing the lists into
// reused buffers: no host round trip, no synchronization, no allocation in steady state, and no
// retrace from one step to the next (queryStart is a run-time argument; the kernel is kept in the
// mask mod's state). docs/blockmask.md, "Decode steps", has the picture.
#pragma once

#include <cstdint>
#include <memory>

#include "attention_templates/BlockMask.h"

namespace flextile::attention {

// The KV blocks that the queries [queryStart, queryStart + queryCount) need, one row per (b, h) of
// the mask (its broadcast B and H kept: a row of a broadcast dimension serves every batch or head).
struct DecodeBlockLists {
  // i32 [Bm, Hm] counts and i32 [Bm, Hm, numKvBlocks] indices, ascending, padded with 0.
  dsl::Tensor fullNum, fullIndices;
  dsl::Tensor partialNum, partialIndices;
  int64_t batch = 1, heads = 1, numKvBlocks = 0;
  // Host-side bounds from the host lists of the covering rows (no device read): no row lists more
  // than maxLiveBlocks entries (full + partial), and a row can list a full (partial) block only
  // when mayHaveFull (mayHavePartial). maxLiveBlocks is the exact count of blocks that some
  // covering row lists, so the device lists are shorter only where mask_mod rules a block out.
  int64_t maxLiveBlocks = 0;
  bool mayHaveFull = false, mayHavePartial = false;
};

// Computes the lists on the device (space Device: launched on the GPU's stream, asynchronously) or
// through the interpreter (Host). The mask's mod must capture its tensors in `space`, if any.
//
// The queries must lie inside the mask's queries [qOffset(), qOffset() + qLen()) (any of its
// block rows, a slice's too), queryCount >= 1, queryCount rounded up to a power of two times
// KV_BLOCK_SIZE at most 16384 (one tile of queries by a kv block: 128 queries at 128 keys), and
// the queries may cover at most 8 block rows of the mask.
//
// Buffers: the tensors own their memory, which comes from a pool kept per (space, Bm, Hm,
// numKvBlocks) and goes back to it when the last handle to it is gone (copies of the struct or of
// its tensors hold it too). A decode loop that drops step t's lists after step t + 1's are made
// cycles through two buffers and never allocates after its first two steps (cuMemAlloc and
// cuMemFree synchronize). Lists kept alive together each have their own buffer, so any number can
// live at once. Reuse is safe without a synchronization because every launch goes to one stream in
// order: a buffer returns to the pool when its host handles die, which may be before the kernels
// that read it have run, but the next kernel that writes it is launched after them and runs after
// them. With streams, the pool is kept per stream (and shape), so that next kernel is always on the
// same stream; a call on another stream gets another buffer. What a caller must not do is read
// these tensors from another stream or from the host (toHost) without the stream's order in
// between: the kernel that fills them may not have run yet.
//
// `stream`: where the kernel (and a first upload of the mask's lists) goes on the device; null is
// the legacy default stream. The interpreter ignores it.
DecodeBlockLists decodeBlockLists(const BlockMask& mask, int64_t queryStart, int64_t queryCount,
                                  dsl::MemorySpace space, runtime::Stream* stream = nullptr);

// The kernel a step of these queries launches, compiled for `target` with that step's arguments
// and launched nowhere (no GPU needed): for codegen tests and ptxas checks. The kernel's
// arguments are the mask's lists in the space of its captures (host without any).
const codegen::CompiledKernel& compileDecodeBlockLists(const BlockMask& mask, int64_t queryStart, int64_t queryCount,
                                                       codegen::Target target);

// How many buffers the pool holds and how many of them are handed out now (tests).
struct DecodeListsPoolStats {
  int64_t buffers = 0, inUse = 0;
};
DecodeListsPoolStats decodeListsPoolStats();

}  // namespace flextile::attention
