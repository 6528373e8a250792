// Paged KV: keys and values kept in fixed-size pages of one shared pool, found through a page
// table (docs/paged-kv.md). The attention templates read K/V through the table inside the kernel:
// the mods and the BlockMask keep seeing logical key positions, only the K/V row addresses are
// physical, so a decode step converts no mask and copies nothing back to the host.
//
//   PagedKVCache cache(DType::BF16, /*kvHeads*/ 8, /*headDim*/ 128, /*numPages*/ 4096, /*pageSize*/ 64,
//                      /*maxBatch*/ 16, /*maxPagesPerSequence*/ 512, MemorySpace::Device);
//   cache.append(kPrompt, vPrompt);                       // prefill: [B, Hkv, T, D] at each batch's length
//   auto [out, lse] = flex_attention(q, cache.view(), score, mask, {.return_lse = true});
//   cache.append(kStep, vStep);                           // decode: T = 1
//   cache.erase(3);                                       // request 3 finished: its pages are free again
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dsl/Tensor.h"

namespace flextile::dsl {
class Kernel;
}

namespace flextile::attention {

// A paged K/V as the attention templates read it.
//   k, v        physical storage [1, Hkv, numPages * pageSize, D] (v's last dim DV, its own head
//               dim, D unless it differs): token t of physical page p is row p * pageSize + t.
//               The batch dim is 1 (batch stride 0): pages are shared by the whole batch, and two
//               sequences may point at the same page (a shared prefix). The last dim must be
//               contiguous; k and v have one dtype, memory space and shape but for that dim.
//   pageTable   i32 [B, maxPages], same memory space, last dim contiguous: logical page j of
//               batch b is physical page pageTable[b, j]. Entries of pages past a batch's length
//               are never read.
//   pageSize    tokens per page: a power of two >= 16.
//   length      the logical KV length S the attention sees (the BlockMask's kvLen), >= 1, at most
//               maxPages * pageSize.
//   lengths     optional i32 [B] (undefined: every batch has `length` keys): keys at logical
//               positions >= lengths[b] are excluded for batch b exactly like keys past S, so a
//               batch of length 0 gives out 0 and lse -inf. Each entry must be in [0, length].
struct PagedKV {
  dsl::Tensor k, v;
  dsl::Tensor pageTable;
  int64_t pageSize = 0;
  int64_t length = 0;
  dsl::Tensor lengths;

  int64_t batch() const { return pageTable.defined() ? pageTable.size(0) : 0; }
  int64_t kvHeads() const { return k.defined() ? k.size(1) : 0; }
  int64_t headDim() const { return k.defined() ? k.size(3) : 0; }
  int64_t valueHeadDim() const { return v.defined() ? v.size(3) : 0; }
  int64_t numPages() const { return k.defined() && pageSize > 0 ? k.size(2) / pageSize : 0; }
  int64_t maxPagesPerSequence() const { return pageTable.defined() ? pageTable.size(1) : 0; }
};

// Throws flextile::Error naming `op` and the offending values unless `kv` is well-formed: the
// shapes, dtypes, strides (within the kernels' i32 offsets) and memory spaces above, a power-of-two
// page size, length <= maxPages * pageSize. Where the page table and lengths are host tensors
// (the interpreter, or a caller's host copy) every entry is checked too: each length in
// [0, length], and each table entry a key below its batch's length reaches in [0, numPages).
// Device tables are not read back (that would cost a host round trip per step): PagedKVCache
// checks its entries on its host mirror before uploading them; a hand-made device table is the
// caller's to get right.
void checkPagedKV(const PagedKV& kv, const std::string& op);

// The logical K/V of a paged one, gathered on the host (slow; for tests and debugging):
// [B, Hkv, length, D] (v: DV) in kv's dtype, zeros at positions >= lengths[b].
struct LogicalKV {
  dsl::Tensor k, v;
};
LogicalKV materializePagedKV(const PagedKV& kv, dsl::MemorySpace space = dsl::MemorySpace::Host);

// What PagedKVCache::view returns.
struct PagedViewOptions {
  // The first `batches` sequences (default: all maxBatch), the query batch B of the attention.
  std::optional<int64_t> batches;
  // The logical length S (the BlockMask's kvLen). Default: the longest of those sequences (at
  // least 1). A larger one (a bucket, say) lets one BlockMask serve several steps; it must cover
  // every sequence of the view and fit maxPagesPerSequence * pageSize.
  std::optional<int64_t> length;
};

// A serving system's KV cache: a pool of pages for K and V, a page table per sequence slot
// (batch index), reference-counted pages and a free list, and the lengths of the sequences.
//
// The host owns the bookkeeping (which pages a sequence holds, the free list, the lengths); the
// page table and the lengths live in the cache's memory space, each with a host mirror that is
// uploaded only when it changed, before the next kernel that reads it (write, or view()). New
// tokens are written by a small kernel that reads the page table on the device, so appending
// never gathers or copies the cache. Not thread-safe: one thread drives a cache.
//
// A page may be held by several sequences (sharePrefix, assign): it returns to the free list when
// its last holder is erased. A shared page is read-only: a write that would land in it is an
// error (share whole pages of a prefix; a sequence writes its own tail into pages of its own).
class PagedKVCache {
 public:
  // `valueHeadDim`: V's head dim where it differs from K's (MLA's 192 / 128); 0: headDim.
  PagedKVCache(dsl::DType dtype, int64_t kvHeads, int64_t headDim, int64_t numPages, int64_t pageSize,
               int64_t maxBatch, int64_t maxPagesPerSequence, dsl::MemorySpace space = dsl::MemorySpace::Device,
               int64_t valueHeadDim = 0);
  ~PagedKVCache();
  PagedKVCache(PagedKVCache&&) noexcept;
  PagedKVCache& operator=(PagedKVCache&&) noexcept;

  dsl::DType dtype() const { return dtype_; }
  int64_t kvHeads() const { return kvHeads_; }
  int64_t headDim() const { return headDim_; }
  int64_t valueHeadDim() const { return valueHeadDim_; }
  int64_t numPages() const { return numPages_; }
  int64_t pageSize() const { return pageSize_; }
  int64_t maxBatch() const { return maxBatch_; }
  int64_t maxPagesPerSequence() const { return maxPagesPerSequence_; }
  dsl::MemorySpace space() const { return space_; }
  // The most tokens one sequence can hold: maxPagesPerSequence * pageSize.
  int64_t capacity() const { return maxPagesPerSequence_ * pageSize_; }

  // The physical storage, [1, Hkv, numPages * pageSize, D] (values: DV).
  const dsl::Tensor& keys() const { return k_; }
  const dsl::Tensor& values() const { return v_; }

  int64_t length(int64_t batch) const;
  // The physical pages batch `batch` holds, in logical order (reserve may have taken more than its
  // length needs).
  const std::vector<int32_t>& pages(int64_t batch) const;
  // How many sequences hold `page` (0: it is free).
  int64_t refCount(int64_t page) const;
  int64_t numFreePages() const { return int64_t(free_.size()); }

  // Makes sure sequence `batch` holds pages for `length` tokens, taking them from the free list.
  // Does not change its length. Throws, taking nothing, when the pool or maxPagesPerSequence
  // cannot provide them.
  void reserve(int64_t batch, int64_t length);
  // Gives the empty sequence `batch` the pages `pages` (in logical order) and the length `length`
  // (at most pages.size() * pageSize), e.g. a cached prefix. Free pages are taken off the free
  // list; pages other sequences hold become shared (their reference counts grow).
  void assign(int64_t batch, std::span<const int32_t> pages, int64_t length);
  // The empty sequence `dstBatch` shares the first `numPages` pages of `srcBatch` (which must hold
  // that many whole pages of tokens: its length >= numPages * pageSize) and gets the length
  // numPages * pageSize. Both then append into pages of their own.
  void sharePrefix(int64_t dstBatch, int64_t srcBatch, int64_t numPages);
  // Sequence `batch` drops its pages (those no one else holds go back to the free list) and its
  // length becomes 0.
  void erase(int64_t batch);

  // Writes new tokens at the end of the given sequences and advances their lengths: row i of
  // kNew and vNew ([Bw, Hkv, T, D], the cache's dtype, head count, head dim and memory space; last
  // dim contiguous, other strides free) goes to sequence batches[i]. `tokenCounts` (empty: T for
  // every row) writes only the first tokenCounts[i] tokens of row i (ragged prefill). Pages are
  // reserved on the host first; the copy is one kernel that reads the page table on the device.
  // The batches must be distinct; nothing is changed when a check fails.
  void write(std::span<const int64_t> batches, const dsl::Tensor& kNew, const dsl::Tensor& vNew,
             std::span<const int64_t> tokenCounts = {});
  // write() to sequences 0 .. B-1 (B = kNew.size(0)): prefill with T = the prompt length, a
  // decode step with T = 1.
  void append(const dsl::Tensor& kNew, const dsl::Tensor& vNew);

  // The paged K/V of the first `batches` sequences for the attention templates. Uploads pending
  // changes of the page table and the lengths first. The view's tensors alias the cache's: they
  // stay valid while the cache lives, and show its later writes (take a new view per step).
  PagedKV view(const PagedViewOptions& options = {});

  // The logical K/V of the first `batches` sequences (default all), [B, Hkv, S, D] with S = the
  // view's default length (or `length`), zeros past each sequence's length (host gather; tests).
  LogicalKV materialize(std::optional<int64_t> batches = std::nullopt, std::optional<int64_t> length = std::nullopt,
                        dsl::MemorySpace space = dsl::MemorySpace::Host);

  // The stream the cache's uploads (page table, lengths, a write's plan) and write kernels go to,
  // in order; null (the default) is the legacy default stream. The attention calls that read a
  // view() should run on the same stream (FlexAttentionOptions::stream), or be ordered after it by
  // the caller. Changing it first waits for the previous stream, since the cache reuses its plan
  // and table buffers from one write to the next. Host caches ignore it.
  void setStream(runtime::Stream* stream);
  runtime::Stream* stream() const { return stream_; }

  // "PagedKVCache bf16 Hkv=8 D=128: 4096 pages of 64 tokens (4000 free), 16 sequences of at most 512 pages"
  std::string describe() const;

 private:
  void checkBatch(int64_t batch, const char* op) const;
  int64_t pagesFor(int64_t tokens) const { return (tokens + pageSize_ - 1) / pageSize_; }
  void takePage(int32_t page);
  void setTableEntry(int64_t batch, int64_t slot, int32_t page);
  void uploadPending();
  int64_t longest(int64_t batches) const;

  dsl::DType dtype_;
  int64_t kvHeads_, headDim_, valueHeadDim_, numPages_, pageSize_, maxBatch_, maxPagesPerSequence_;
  dsl::MemorySpace space_;
  dsl::Tensor k_, v_;
  std::vector<std::vector<int32_t>> held_;  // per sequence, its pages in logical order
  std::vector<int64_t> lengths_;            // per sequence
  std::vector<int32_t> refCount_;           // per page
  std::vector<int32_t> free_;               // a stack: the next page handed out is free_.back()
  std::vector<int64_t> freeSlot_;           // per page, its index in free_ (-1: not free)
  std::vector<int32_t> tableHost_;          // [maxBatch, maxPagesPerSequence], unused entries 0
  std::vector<int32_t> lengthsHost_;        // i32 mirror of lengths_
  dsl::Tensor table_, lengthsTensor_;       // in space_
  bool tableDirty_ = true, lengthsDirty_ = true;
  // The write kernel of this dtype, shared by every cache of it (kept while one lives).
  std::shared_ptr<dsl::Kernel> writeKernel_;
  // A write's plan, i32 [3, maxBatch]: per written row its sequence, start position and token
  // count (uploaded per write; allocated once).
  std::vector<int32_t> planHost_;
  dsl::Tensor plan_;
  runtime::Stream* stream_ = nullptr;
};

}  // namespace flextile::attention
