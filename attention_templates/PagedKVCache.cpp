// Paged KV (attention_templates/PagedKVCache.h): the checks of a PagedKV, the trace-side row
// mapping the attention templates share (FlexAttentionCommon.h), the host gather for tests, and
// the serving cache with its write kernel.
#include "attention_templates/PagedKVCache.h"

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>

#include "attention_templates/FlexAttentionCommon.h"
#include "attention_templates/TemplateParams.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"
#include "runtime/Stream.h"

namespace flextile::attention {

using namespace flextile::dsl;
using namespace flextile::attention::tmpl;

namespace {

bool isPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }
int64_t log2Exact(int64_t x) {
  int64_t s = 0;
  while ((int64_t(1) << s) < x) ++s;
  return s;
}
std::string str(int64_t x) { return std::to_string(x); }

// The largest offset (in elements) a kernel forms inside one head of the storage: row offsets
// are i32 tiles (rows * stride_n + d), so the last row's must fit.
bool rowOffsetsFitInt32(const Tensor& storage) {
  const int64_t rows = storage.size(2), d = storage.size(3);
  return (rows - 1) * storage.strides()[2] + d <= INT32_MAX;
}

}  // namespace

// ---- checks ----------------------------------------------------------------------------------

void checkPagedKV(const PagedKV& kv, const std::string& op) {
  auto fail = [&](const std::string& why) { throw Error(op + ": paged KV: " + why); };
  if (!kv.k.defined() || !kv.v.defined()) fail("the k and v storage must be defined tensors");
  for (const auto& [name, t] : {std::pair{"k", &kv.k}, std::pair{"v", &kv.v}}) {
    if (t->rank() != 4 || t->size(0) != 1)
      fail(std::string(name) + " storage must be [1, Hkv, numPages * pageSize, D], got " + t->describe());
    if (t->strides()[3] != 1)
      fail(std::string("the last dim of the ") + name + " storage must be contiguous, got " + t->describe());
    for (int i = 1; i < 4; ++i)
      if (t->strides()[size_t(i)] > INT32_MAX)
        fail(std::string(name) + " storage strides exceed int32: " + t->describe());
  }
  const Shape& ks = kv.k.shape();
  const Shape& vs = kv.v.shape();
  if (ks[1] != vs[1] || ks[2] != vs[2] || kv.k.dtype() != kv.v.dtype() || kv.k.space() != kv.v.space())
    fail("k and v storage must have one dtype, memory space and shape but for the head dim, got k " + kv.k.describe() +
         ", v " + kv.v.describe());
  if (kv.pageSize < 16 || !isPowerOfTwo(kv.pageSize) || kv.pageSize > (int64_t(1) << 20))
    fail("pageSize must be a power of two in [16, 2^20], got " + str(kv.pageSize));
  const int64_t rows = kv.k.size(2);
  if (rows < kv.pageSize || rows % kv.pageSize != 0)
    fail("the storage's " + str(rows) + " rows are not a whole number of pages of " + str(kv.pageSize) +
         " tokens: " + kv.k.describe());
  for (const Tensor* t : {&kv.k, &kv.v})
    if (!rowOffsetsFitInt32(*t))
      fail("the storage's row offsets exceed int32 (" + str(rows) + " rows of stride " + str(t->strides()[2]) +
           "): use fewer pages per pool");
  const int64_t numPages = rows / kv.pageSize;

  const Tensor& table = kv.pageTable;
  if (!table.defined()) fail("the page table must be a defined i32 [B, maxPages] tensor");
  if (table.dtype() != DType::I32 || table.rank() != 2 || table.size(0) < 1 || table.size(1) < 1)
    fail("the page table must be i32 [B, maxPages], got " + table.describe());
  if (table.strides()[1] != 1 || table.strides()[0] > INT32_MAX)
    fail("the page table's last dim must be contiguous and its row stride fit int32, got " + table.describe());
  if (table.space() != kv.k.space()) fail("the page table and the storage must be in one memory space");
  const int64_t B = table.size(0), maxPages = table.size(1);
  if (kv.length < 1) fail("length must be >= 1, got " + str(kv.length));
  if (kv.length > maxPages * kv.pageSize)
    fail("length " + str(kv.length) + " needs " + str((kv.length + kv.pageSize - 1) / kv.pageSize) +
         " pages of " + str(kv.pageSize) + " tokens, but the page table holds " + str(maxPages) + " per sequence");
  if (kv.lengths.defined()) {
    kv.lengths.expect(op + ": paged KV lengths", DType::I32, {B});
    if (!kv.lengths.isContiguous() || kv.lengths.space() != kv.k.space())
      fail("lengths must be contiguous and in the storage's memory space, got " + kv.lengths.describe());
  }

  // Host-visible entries are checked (the interpreter's inputs, a caller's host tables); device
  // ones are not read back.
  std::vector<int32_t> lengths(size_t(B), int32_t(kv.length));
  if (kv.lengths.defined()) {
    if (!kv.lengths.isHost()) return;
    lengths = kv.lengths.toHost<int32_t>();
    for (int64_t b = 0; b < B; ++b)
      if (lengths[size_t(b)] < 0 || lengths[size_t(b)] > kv.length)
        fail("lengths[" + str(b) + "] = " + str(lengths[size_t(b)]) + " is outside [0, length = " + str(kv.length) +
             "]");
  }
  if (!table.isHost()) return;
  const std::vector<int32_t> entries = table.toHost<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t used = (lengths[size_t(b)] + kv.pageSize - 1) / kv.pageSize;
    for (int64_t j = 0; j < used; ++j) {
      const int32_t page = entries[size_t(b * maxPages + j)];
      if (page < 0 || page >= numPages)
        fail("page table entry [" + str(b) + ", " + str(j) + "] = " + str(page) + " is outside the pool of " +
             str(numPages) + " pages (it holds keys [" + str(j * kv.pageSize) + ", " +
             str(std::min<int64_t>((j + 1) * kv.pageSize, lengths[size_t(b)])) + ") of batch " + str(b) + ")");
    }
  }
}

LogicalKV materializePagedKV(const PagedKV& kv, MemorySpace space) {
  checkPagedKV(kv, "materializePagedKV");
  const int64_t B = kv.batch(), H = kv.kvHeads(), S = kv.length, ps = kv.pageSize;
  const int64_t rows = kv.k.size(2), maxPages = kv.maxPagesPerSequence(), numPages = kv.numPages();
  const std::vector<int32_t> table = kv.pageTable.toHost<int32_t>();
  const std::vector<int32_t> lengths =
      kv.lengths.defined() ? kv.lengths.toHost<int32_t>() : std::vector<int32_t>(size_t(B), int32_t(S));
  LogicalKV out;
  for (const auto& [storage, result] : {std::pair{&kv.k, &out.k}, std::pair{&kv.v, &out.v}}) {
    // bf16 and f16 values are exact in float, so the round trip through float is lossless.
    const int64_t D = storage->size(3);
    const std::vector<float> phys = storage->toHost<float>();  // [1, H, rows, D] row-major
    std::vector<float> logical(size_t(B * H * S * D), 0.0f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < std::min<int64_t>(S, lengths[size_t(b)]); ++s) {
        const int32_t page = table[size_t(b * maxPages + s / ps)];
        if (page < 0 || page >= numPages)  // a device table is not checked by checkPagedKV
          throw Error("materializePagedKV: page table entry [" + str(b) + ", " + str(s / ps) + "] = " + str(page) +
                      " is outside the pool of " + str(numPages) + " pages");
        const int64_t row = int64_t(page) * ps + s % ps;
        for (int64_t h = 0; h < H; ++h)
          std::copy_n(phys.begin() + (h * rows + row) * D, D, logical.begin() + ((b * H + h) * S + s) * D);
      }
    *result = Tensor::fromHost(logical, kv.k.dtype(), {B, H, S, D}, space);
  }
  return out;
}

// ---- trace side (FlexAttentionCommon.h) ------------------------------------------------------

namespace detail {

PagedKvRows pagedKvRows(const PagedKvParams<Traced>& params, const PagedKvConstants& constants, const Tile& batch) {
  return {params.page_table + batch * params.page_table_stride_b, constants.PAGE};
}

Tile pagedKeyEnd(const PagedKvParams<Traced>& params, const PagedKvConstants& constants, const Tile& batch,
                 const Tile& kvLen) {
  if (!constants.hasLengths) return kvLen;
  return minimum(kvLen, load(params.kv_lengths + batch));
}

Tile kvStorageRows(const PagedKvRows& paged, const Tile& start, int64_t blockN, const Tile& keyEnd) {
  // Powers of two: the page of a key is a shift, its place in the page a mask (no divisions).
  const int64_t shift = log2Exact(paged.pageSize), within = paged.pageSize - 1;
  if (paged.pageSize >= blockN) {
    // [start, start + blockN) lies in one page (start is a multiple of blockN, which divides the
    // page size): one scalar read of the table, which the pipeline re-reads for the steps ahead.
    Tile page = load(paged.batchTable + (start >> shift), start < keyEnd, 0);
    Tile first = page * paged.pageSize + (start & within);
    return first + arange(0, blockN);
  }
  Tile keys = start + arange(0, blockN);
  Tile pages = load(paged.batchTable + (keys >> shift), keys < keyEnd, 0);
  return pages * paged.pageSize + (keys & within);
}

void expectPagedKvFor(const char* op, const PagedKV& kv, int64_t B, int64_t D, DType dtype, MemorySpace space) {
  checkPagedKV(kv, op);
  if (kv.batch() != B)
    throw Error(std::string(op) + ": the paged KV's page table has " + str(kv.batch()) +
                " sequences, the query batch is " + str(B));
  if (kv.headDim() != D)
    throw Error(std::string(op) + ": the paged KV's head dim " + str(kv.headDim()) + " differs from q's " + str(D));
  if (kv.k.dtype() != dtype)
    throw Error(std::string(op) + ": the paged KV storage is " + std::string(ir::dtypeName(kv.k.dtype())) +
                ", q is " + std::string(ir::dtypeName(dtype)) + ": q, k and v must have one dtype");
  if (kv.k.space() != space)
    throw Error(std::string(op) + ": q and the paged KV must be in one memory space (all host or all device)");
}

PagedKvParams<Bound> pagedKvArguments(const PagedKV& kv) {
  return {.page_table = kv.pageTable,
          .page_table_stride_b = kv.pageTable.strides()[0],
          .kv_lengths = kv.lengths.defined() ? kv.lengths : kv.pageTable};  // unused without lengths
}

PagedKvConstants pagedKvConstants(const PagedKV& kv) { return {kv.pageSize, kv.lengths.defined() ? 1 : 0}; }

}  // namespace detail

// ---- the write kernel --------------------------------------------------------------------------

namespace {

// One program per (token tile, kv head, written row). Row i of the new K/V goes to sequence
// plan[0][i], starting at logical position plan[1][i], plan[2][i] tokens. The page table is read
// per token (a token tile may straddle pages); nothing else depends on the host's bookkeeping.
template <template <class> class P>
struct PagedWriteParams {
  BOOST_HANA_DEFINE_STRUCT(PagedWriteParams, (P<Data>, k_new), (P<Data>, v_new), (P<Data>, k_cache),
                           (P<Data>, v_cache), (P<I32Ptr>, page_table), (P<I32>, page_table_stride_b),
                           (P<I32Ptr>, write_plan), (P<I32>, plan_stride), (P<I32>, k_new_stride_b),
                           (P<I32>, k_new_stride_h), (P<I32>, k_new_stride_t), (P<I32>, v_new_stride_b),
                           (P<I32>, v_new_stride_h), (P<I32>, v_new_stride_t), (P<I32>, k_cache_stride_h),
                           (P<I32>, k_cache_stride_n), (P<I32>, v_cache_stride_h), (P<I32>, v_cache_stride_n));
};
struct PagedWriteConstants {
  BOOST_HANA_DEFINE_STRUCT(PagedWriteConstants, (int64_t, BT), (int64_t, D), (int64_t, DP), (int64_t, PAGE),
                           (int64_t, DV), (int64_t, DVP));
};

void traceWrite(ir::Function& f, const std::vector<int64_t>& constants, DType dt) {
  const auto c = constantsFrom<PagedWriteConstants>(constants);
  const auto p = declareParams<PagedWriteParams>(f, dt);
  Tile tileIndex = program_id(0), h = program_id(1), row = program_id(2);
  Tile seq = load(p.write_plan + row);
  Tile start = load(p.write_plan + (p.plan_stride + row));
  Tile count = load(p.write_plan + (p.plan_stride * 2 + row));
  Tile tok = tileIndex * c.BT + arange(0, c.BT);
  Tile live = tok < count;
  Tile pos = start + tok;
  Tile page = load(p.page_table + (seq * p.page_table_stride_b + (pos >> log2Exact(c.PAGE))), live, 0);
  Tile dst = page * c.PAGE + (pos & (c.PAGE - 1));
  Tile offsD = arange(0, c.DP);
  Tile m = live.expand(1);
  if (c.DP != c.D) m = m & (offsD < c.D).expand(0);
  const detail::ValueColumns vc(c.D, c.DP, c.DV, c.DVP, offsD);  // V's rows: DV wide
  const Tile& offsDV = vc.offs;
  const Tile mV = vc.rowsBy(live, [&](const Tile&) { return m; });
  Tile row64 = row.to(DType::I64), h64 = h.to(DType::I64);
  auto copy = [&](const Tile& src, const Tile& sb, const Tile& sh, const Tile& st, const Tile& cache, const Tile& ch,
                  const Tile& cn, const Tile& cols, const Tile& mask) {
    Tile from = src + (row64 * sb + h64 * sh) + (tok.expand(1) * st + cols.expand(0));
    Tile to = cache + h64 * ch + (dst.expand(1) * cn + cols.expand(0));
    store(to, load(from, mask), mask);
  };
  copy(p.k_new, p.k_new_stride_b, p.k_new_stride_h, p.k_new_stride_t, p.k_cache, p.k_cache_stride_h,
       p.k_cache_stride_n, offsD, m);
  copy(p.v_new, p.v_new_stride_b, p.v_new_stride_h, p.v_new_stride_t, p.v_cache, p.v_cache_stride_h,
       p.v_cache_stride_n, offsDV, mV);
}

// One write kernel per dtype, shared by the caches of that dtype and freed with the last one.
std::shared_ptr<Kernel> writeKernelFor(DType dt) {
  static std::mutex mutex;
  static std::map<DType, std::weak_ptr<Kernel>> kernels;
  std::lock_guard lock(mutex);
  if (auto k = kernels[dt].lock()) return k;
  auto k = std::make_shared<Kernel>(
      "paged_kv_write_" + std::string(ir::dtypeName(dt)),
      [dt](ir::Function& f, const std::vector<int64_t>& c) { traceWrite(f, c, dt); },
      constantCount<PagedWriteConstants>());
  kernels[dt] = k;
  return k;
}

}  // namespace

// ---- the cache ---------------------------------------------------------------------------------

PagedKVCache::PagedKVCache(DType dtype, int64_t kvHeads, int64_t headDim, int64_t numPages, int64_t pageSize,
                           int64_t maxBatch, int64_t maxPagesPerSequence, MemorySpace space, int64_t valueHeadDim)
    : dtype_(dtype),
      kvHeads_(kvHeads),
      headDim_(headDim),
      valueHeadDim_(valueHeadDim > 0 ? valueHeadDim : headDim),
      numPages_(numPages),
      pageSize_(pageSize),
      maxBatch_(maxBatch),
      maxPagesPerSequence_(maxPagesPerSequence),
      space_(space) {
  auto fail = [](const std::string& why) { throw Error("PagedKVCache: " + why); };
  if (dtype != DType::BF16 && dtype != DType::F16 && dtype != DType::F32)
    fail("dtype must be bf16, f16 or f32 (the attention templates' dtypes), got " +
         std::string(ir::dtypeName(dtype)));
  if (kvHeads < 1) fail("kvHeads must be >= 1, got " + str(kvHeads));
  if (!detail::supportedHeadDim(headDim))
    fail("headDim must be a multiple of 16 up to 256 (what the attention templates take), got " + str(headDim));
  if (valueHeadDim != 0 && !detail::supportedHeadDim(valueHeadDim))
    fail("valueHeadDim must be 0 (headDim) or a multiple of 16 up to 256, got " + str(valueHeadDim));
  if (pageSize < 16 || !isPowerOfTwo(pageSize) || pageSize > (int64_t(1) << 20))
    fail("pageSize must be a power of two in [16, 2^20], got " + str(pageSize));
  if (numPages < 1) fail("numPages must be >= 1, got " + str(numPages));
  const int64_t widerDim = std::max(headDim, valueHeadDim_);
  if (numPages * pageSize * widerDim > INT32_MAX)
    fail(str(numPages) + " pages of " + str(pageSize) + " tokens at D = " + str(widerDim) +
         " exceed the kernels' 32-bit offsets within one head (at most " + str(INT32_MAX / (pageSize * widerDim)) +
         " pages)");
  if (maxBatch < 1 || maxBatch > 65535) fail("maxBatch must be in [1, 65535], got " + str(maxBatch));
  if (maxPagesPerSequence < 1 || maxPagesPerSequence * pageSize > INT32_MAX)
    fail("maxPagesPerSequence must be >= 1 and hold at most 2^31 - 1 tokens, got " + str(maxPagesPerSequence));

  const Shape storage{1, kvHeads, numPages * pageSize, headDim};
  const Shape valueStorage{1, kvHeads, numPages * pageSize, valueHeadDim_};
  // Device storage is left uninitialized: the kernels never read a row that was not written (the
  // loads of keys past a sequence's length are masked off).
  k_ = space == MemorySpace::Host ? Tensor::zeros(dtype, storage, space) : Tensor::empty(dtype, storage, space);
  v_ = space == MemorySpace::Host ? Tensor::zeros(dtype, valueStorage, space)
                                  : Tensor::empty(dtype, valueStorage, space);
  held_.resize(size_t(maxBatch));
  lengths_.assign(size_t(maxBatch), 0);
  refCount_.assign(size_t(numPages), 0);
  freeSlot_.resize(size_t(numPages));
  for (int64_t i = 0; i < numPages; ++i) {  // page 0 is handed out first
    free_.push_back(int32_t(numPages - 1 - i));
    freeSlot_[size_t(numPages - 1 - i)] = i;
  }
  tableHost_.assign(size_t(maxBatch * maxPagesPerSequence), 0);
  lengthsHost_.assign(size_t(maxBatch), 0);
  table_ = Tensor::empty(DType::I32, {maxBatch, maxPagesPerSequence}, space);
  lengthsTensor_ = Tensor::empty(DType::I32, {maxBatch}, space);
  planHost_.assign(size_t(3 * maxBatch), 0);
  plan_ = Tensor::empty(DType::I32, {3, maxBatch}, space);
  writeKernel_ = writeKernelFor(dtype);
}

PagedKVCache::~PagedKVCache() = default;
PagedKVCache::PagedKVCache(PagedKVCache&&) noexcept = default;
PagedKVCache& PagedKVCache::operator=(PagedKVCache&&) noexcept = default;

void PagedKVCache::checkBatch(int64_t batch, const char* op) const {
  if (batch < 0 || batch >= maxBatch_)
    throw Error(std::string("PagedKVCache::") + op + ": batch index " + str(batch) + " is outside [0, maxBatch = " +
                str(maxBatch_) + ")");
}

int64_t PagedKVCache::length(int64_t batch) const {
  checkBatch(batch, "length");
  return lengths_[size_t(batch)];
}

const std::vector<int32_t>& PagedKVCache::pages(int64_t batch) const {
  checkBatch(batch, "pages");
  return held_[size_t(batch)];
}

int64_t PagedKVCache::refCount(int64_t page) const {
  if (page < 0 || page >= numPages_)
    throw Error("PagedKVCache::refCount: page " + str(page) + " is outside the pool of " + str(numPages_) + " pages");
  return refCount_[size_t(page)];
}

// One more holder of `page`; a free page leaves the free list (swapped out with the last entry).
void PagedKVCache::takePage(int32_t page) {
  if (refCount_[size_t(page)]++ > 0) return;
  const int64_t slot = freeSlot_[size_t(page)];
  const int32_t last = free_.back();
  free_[size_t(slot)] = last;
  freeSlot_[size_t(last)] = slot;
  free_.pop_back();
  freeSlot_[size_t(page)] = -1;
}

void PagedKVCache::setTableEntry(int64_t batch, int64_t slot, int32_t page) {
  int32_t& entry = tableHost_[size_t(batch * maxPagesPerSequence_ + slot)];
  if (entry != page) tableDirty_ = true;
  entry = page;
}

void PagedKVCache::reserve(int64_t batch, int64_t length) {
  checkBatch(batch, "reserve");
  if (length < 0) throw Error("PagedKVCache::reserve: length must be >= 0, got " + str(length));
  if (length > capacity())
    throw Error("PagedKVCache::reserve: sequence " + str(batch) + " cannot hold " + str(length) + " tokens: " +
                str(pagesFor(length)) + " pages of " + str(pageSize_) + ", more than maxPagesPerSequence = " +
                str(maxPagesPerSequence_));
  std::vector<int32_t>& held = held_[size_t(batch)];
  const int64_t need = pagesFor(length) - int64_t(held.size());
  if (need <= 0) return;
  if (need > numFreePages())
    throw Error("PagedKVCache::reserve: the page pool is exhausted: sequence " + str(batch) + " needs " + str(need) +
                " more pages for " + str(length) + " tokens, " + str(numFreePages()) + " of " + str(numPages_) +
                " pages are free");
  for (int64_t i = 0; i < need; ++i) {
    const int32_t page = free_.back();
    takePage(page);
    setTableEntry(batch, int64_t(held.size()), page);
    held.push_back(page);
  }
}

void PagedKVCache::assign(int64_t batch, std::span<const int32_t> pages, int64_t length) {
  checkBatch(batch, "assign");
  const std::vector<int32_t>& held = held_[size_t(batch)];
  if (!held.empty() || lengths_[size_t(batch)] != 0)
    throw Error("PagedKVCache::assign: sequence " + str(batch) + " is not empty (it holds " + str(int64_t(held.size())) +
                " pages, length " + str(lengths_[size_t(batch)]) + "): erase it first");
  if (int64_t(pages.size()) > maxPagesPerSequence_)
    throw Error("PagedKVCache::assign: " + str(int64_t(pages.size())) + " pages exceed maxPagesPerSequence = " +
                str(maxPagesPerSequence_));
  if (length < 0 || length > int64_t(pages.size()) * pageSize_)
    throw Error("PagedKVCache::assign: length " + str(length) + " does not fit " + str(int64_t(pages.size())) +
                " pages of " + str(pageSize_) + " tokens");
  std::vector<bool> seen(size_t(numPages_), false);
  for (int32_t page : pages) {
    if (page < 0 || page >= numPages_)
      throw Error("PagedKVCache::assign: page " + str(page) + " is outside the pool of " + str(numPages_) + " pages");
    if (seen[size_t(page)]) throw Error("PagedKVCache::assign: page " + str(page) + " is listed twice");
    seen[size_t(page)] = true;
  }
  for (size_t j = 0; j < pages.size(); ++j) {
    takePage(pages[j]);
    setTableEntry(batch, int64_t(j), pages[j]);
  }
  held_[size_t(batch)].assign(pages.begin(), pages.end());
  lengths_[size_t(batch)] = length;
  lengthsDirty_ = true;
}

void PagedKVCache::sharePrefix(int64_t dstBatch, int64_t srcBatch, int64_t numPages) {
  checkBatch(dstBatch, "sharePrefix");
  checkBatch(srcBatch, "sharePrefix");
  if (dstBatch == srcBatch) throw Error("PagedKVCache::sharePrefix: a sequence cannot share with itself");
  if (numPages < 0 || numPages * pageSize_ > lengths_[size_t(srcBatch)])
    throw Error("PagedKVCache::sharePrefix: sequence " + str(srcBatch) + " has " + str(lengths_[size_t(srcBatch)]) +
                " tokens, not " + str(numPages) + " whole pages of " + str(pageSize_) +
                " (only whole pages are shared: a partly filled page would be written by both)");
  const std::vector<int32_t> prefix(held_[size_t(srcBatch)].begin(), held_[size_t(srcBatch)].begin() + numPages);
  assign(dstBatch, prefix, numPages * pageSize_);
}

void PagedKVCache::erase(int64_t batch) {
  checkBatch(batch, "erase");
  std::vector<int32_t>& held = held_[size_t(batch)];
  for (size_t j = 0; j < held.size(); ++j) {
    const int32_t page = held[j];
    if (--refCount_[size_t(page)] == 0) {
      freeSlot_[size_t(page)] = int64_t(free_.size());
      free_.push_back(page);
    }
    setTableEntry(batch, int64_t(j), 0);
  }
  held.clear();
  if (lengths_[size_t(batch)] != 0) lengthsDirty_ = true;
  lengths_[size_t(batch)] = 0;
}

void PagedKVCache::setStream(runtime::Stream* stream) {
  if (stream == stream_) return;
  if (space_ == MemorySpace::Device) {
    if (stream_) stream_->synchronize();
    else runtime::Device::current().synchronize();  // the legacy default stream's work
  }
  stream_ = stream;
}

void PagedKVCache::uploadPending() {
  runtime::Stream* stream = space_ == MemorySpace::Device ? stream_ : nullptr;
  if (tableDirty_) table_.copyFromHost(tableHost_, stream);
  if (lengthsDirty_) {
    for (int64_t b = 0; b < maxBatch_; ++b) lengthsHost_[size_t(b)] = int32_t(lengths_[size_t(b)]);
    lengthsTensor_.copyFromHost(lengthsHost_, stream);
  }
  tableDirty_ = lengthsDirty_ = false;
}

void PagedKVCache::write(std::span<const int64_t> batches, const Tensor& kNew, const Tensor& vNew,
                         std::span<const int64_t> tokenCounts) {
  const std::string op = "PagedKVCache::write";
  // (By name, not address: one tensor may be passed as both.)
  struct NewRows {
    const char* name;
    const Tensor* t;
    const char* dimName;
    int64_t dim;
  };
  for (const auto& [name, t, dimName, dim] :
       {NewRows{"kNew", &kNew, "D", headDim_}, NewRows{"vNew", &vNew, "DV", valueHeadDim_}}) {
    detail::expectAttentionInput(op.c_str(), name, *t);
    if (t->dtype() != dtype_)
      throw Error(op + ": " + name + " is " + t->describe() + ", but the cache holds " +
                  std::string(ir::dtypeName(dtype_)));
    if (t->size(1) != kvHeads_ || t->size(3) != dim)
      throw Error(op + ": " + name + " must be [B, Hkv = " + str(kvHeads_) + ", T, " + dimName + " = " + str(dim) +
                  "], got " + t->describe());
    if (t->space() != space_) throw Error(op + ": " + name + " is in another memory space than the cache");
  }
  if (kNew.size(0) != vNew.size(0) || kNew.size(2) != vNew.size(2))
    throw Error(op + ": kNew and vNew must have one shape but for the head dim, got " + kNew.describe() + " and " +
                vNew.describe());
  const int64_t rows = kNew.size(0), T = kNew.size(2);
  if (int64_t(batches.size()) != rows)
    throw Error(op + ": " + str(int64_t(batches.size())) + " batch indices for " + str(rows) + " rows of kNew");
  if (!tokenCounts.empty() && int64_t(tokenCounts.size()) != rows)
    throw Error(op + ": " + str(int64_t(tokenCounts.size())) + " token counts for " + str(rows) + " rows of kNew");

  // Every check before any change, so a failed write leaves the cache as it was.
  std::vector<bool> seen(size_t(maxBatch_), false);
  int64_t newPages = 0, maxCount = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t b = batches[size_t(i)];
    checkBatch(b, "write");
    if (seen[size_t(b)]) throw Error(op + ": sequence " + str(b) + " is listed twice");
    seen[size_t(b)] = true;
    const int64_t n = tokenCounts.empty() ? T : tokenCounts[size_t(i)];
    if (n < 0 || n > T)
      throw Error(op + ": token count " + str(n) + " of row " + str(i) + " is outside [0, T = " + str(T) + "]");
    const int64_t len = lengths_[size_t(b)];
    if (len + n > capacity())
      throw Error(op + ": sequence " + str(b) + " at length " + str(len) + " cannot take " + str(n) +
                  " more tokens: it holds at most " + str(capacity()) + " (" + str(maxPagesPerSequence_) +
                  " pages of " + str(pageSize_) + ")");
    const std::vector<int32_t>& held = held_[size_t(b)];
    if (n > 0)
      for (int64_t j = len / pageSize_; j < std::min<int64_t>(int64_t(held.size()), pagesFor(len + n)); ++j)
        if (refCount_[size_t(held[size_t(j)])] > 1)
          throw Error(op + ": sequence " + str(b) + " would write into page " + str(held[size_t(j)]) + ", which " +
                      str(refCount_[size_t(held[size_t(j)])]) +
                      " sequences share (shared pages are read-only: share whole pages only)");
    newPages += std::max<int64_t>(0, pagesFor(len + n) - int64_t(held.size()));
    maxCount = std::max(maxCount, n);
  }
  if (newPages > numFreePages())
    throw Error(op + ": the page pool is exhausted: the write needs " + str(newPages) + " more pages, " +
                str(numFreePages()) + " of " + str(numPages_) + " pages are free");

  for (int64_t i = 0; i < rows; ++i) {
    const int64_t b = batches[size_t(i)], n = tokenCounts.empty() ? T : tokenCounts[size_t(i)];
    reserve(b, lengths_[size_t(b)] + n);
    planHost_[size_t(i)] = int32_t(b);
    planHost_[size_t(maxBatch_ + i)] = int32_t(lengths_[size_t(b)]);
    planHost_[size_t(2 * maxBatch_ + i)] = int32_t(n);
  }
  if (maxCount > 0) {
    uploadPending();
    plan_.copyFromHost(planHost_, space_ == MemorySpace::Device ? stream_ : nullptr);
    const int64_t BT = maxCount <= 16 ? 16 : 32;
    LaunchOptions lo;
    lo.grid = {cdiv(maxCount, BT), kvHeads_, rows};
    lo.constants = constantList(PagedWriteConstants{BT, headDim_, detail::paddedHeadDim(headDim_), pageSize_,
                                                    valueHeadDim_, detail::paddedHeadDim(valueHeadDim_)});
    lo.num_warps = 4;
    lo.num_stages = 1;
    const auto& ks = kNew.strides();
    const auto& vs = vNew.strides();
    const std::vector<KernelArg> args = bindParams<PagedWriteParams>(
        {.k_new = kNew, .v_new = vNew, .k_cache = k_, .v_cache = v_, .page_table = table_,
         .page_table_stride_b = maxPagesPerSequence_, .write_plan = plan_, .plan_stride = maxBatch_,
         .k_new_stride_b = ks[0], .k_new_stride_h = ks[1], .k_new_stride_t = ks[2], .v_new_stride_b = vs[0],
         .v_new_stride_h = vs[1], .v_new_stride_t = vs[2], .k_cache_stride_h = k_.strides()[1],
         .k_cache_stride_n = k_.strides()[2], .v_cache_stride_h = v_.strides()[1],
         .v_cache_stride_n = v_.strides()[2]},
        writeKernel_->name());
    runInOrder({{writeKernel_.get(), lo, args}}, space_, stream_);
  }
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t b = batches[size_t(i)], n = tokenCounts.empty() ? T : tokenCounts[size_t(i)];
    if (n > 0) lengthsDirty_ = true;
    lengths_[size_t(b)] += n;
  }
}

void PagedKVCache::append(const Tensor& kNew, const Tensor& vNew) {
  detail::expectAttentionInput("PagedKVCache::append", "kNew", kNew);
  if (kNew.size(0) > maxBatch_)
    throw Error("PagedKVCache::append: kNew has " + str(kNew.size(0)) + " rows, more than maxBatch = " +
                str(maxBatch_) + ": " + kNew.describe());
  std::vector<int64_t> batches(size_t(kNew.size(0)));
  for (size_t i = 0; i < batches.size(); ++i) batches[i] = int64_t(i);
  write(batches, kNew, vNew);
}

int64_t PagedKVCache::longest(int64_t batches) const {
  int64_t m = 0;
  for (int64_t b = 0; b < batches; ++b) m = std::max(m, lengths_[size_t(b)]);
  return m;
}

PagedKV PagedKVCache::view(const PagedViewOptions& options) {
  const int64_t B = options.batches.value_or(maxBatch_);
  if (B < 1 || B > maxBatch_)
    throw Error("PagedKVCache::view: batches must be in [1, maxBatch = " + str(maxBatch_) + "], got " + str(B));
  const int64_t longestLength = longest(B);
  const int64_t S = options.length.value_or(std::max<int64_t>(1, longestLength));
  if (S < std::max<int64_t>(1, longestLength) || S > capacity())
    throw Error("PagedKVCache::view: length " + str(S) + " must cover the longest sequence of the view (" +
                str(longestLength) + " tokens) and fit the capacity of " + str(capacity()) + " tokens");
  uploadPending();
  PagedKV kv;
  kv.k = k_;
  kv.v = v_;
  kv.pageSize = pageSize_;
  kv.length = S;
  if (B == maxBatch_) {
    kv.pageTable = table_;
    kv.lengths = lengthsTensor_;
  } else if (space_ == MemorySpace::Host) {  // the first B rows, in place
    kv.pageTable = Tensor::hostView(table_.hostData(), DType::I32, {B, maxPagesPerSequence_});
    kv.lengths = Tensor::hostView(lengthsTensor_.hostData(), DType::I32, {B});
  } else {
    kv.pageTable = Tensor::deviceView(table_.deviceAddress(), DType::I32, {B, maxPagesPerSequence_});
    kv.lengths = Tensor::deviceView(lengthsTensor_.deviceAddress(), DType::I32, {B});
  }
  return kv;
}

LogicalKV PagedKVCache::materialize(std::optional<int64_t> batches, std::optional<int64_t> length,
                                    MemorySpace space) {
  PagedKV kv = view({.batches = batches, .length = length});
  // The gather reads with the legacy default stream's copies: the cache's stream's work first.
  if (stream_ && space_ == MemorySpace::Device) stream_->synchronize();
  return materializePagedKV(kv, space);
}

std::string PagedKVCache::describe() const {
  return "PagedKVCache " + std::string(ir::dtypeName(dtype_)) + " Hkv=" + str(kvHeads_) + " D=" + str(headDim_) +
         (valueHeadDim_ != headDim_ ? " DV=" + str(valueHeadDim_) : std::string()) + ": " + str(numPages_) +
         " pages of " + str(pageSize_) + " tokens (" + str(numFreePages()) + " free), " + str(maxBatch_) + " sequences of at most " + str(maxPagesPerSequence_) + " pages";
}

}  // namespace flextile::attention
