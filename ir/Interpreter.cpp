// The tile-IR interpreter. The rules it implements are written at the top of
// Interpreter.h; this file keeps to them.
//
// Shape of the implementation: the function is verified once (ir::verify),
// arguments are bound once, then every program instance walks the op list with
// one dispatch per op; each op runs a tight typed loop over whole tiles. Values
// are immutable, reference-counted arrays indexed by Value::id, so reshape,
// expand_dims, convert_layout and loop-carried values cost no copy.
#include "ir/Interpreter.h"

#include "ir/Elementwise.h"
#include "ir/Verifier.h"

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace flextile::ir {

// ---- InterpArg --------------------------------------------------------------

InterpArg InterpArg::buffer(void* base, size_t bytes, std::string name) {
  InterpArg a;
  a.kind_ = Kind::Buffer;
  a.base_ = base;
  a.bytes_ = bytes;
  a.name_ = std::move(name);
  return a;
}

InterpArg InterpArg::integer(int64_t v) {
  InterpArg a;
  a.kind_ = Kind::Integer;
  a.int_ = v;
  return a;
}

InterpArg InterpArg::real(double v) {
  InterpArg a;
  a.kind_ = Kind::Real;
  a.real_ = v;
  return a;
}

std::string InterpArg::describe() const {
  std::ostringstream os;
  switch (kind_) {
    case Kind::Buffer: os << "buffer '" << name_ << "' (" << bytes_ << " bytes)"; break;
    case Kind::Integer: os << "integer " << int_; break;
    case Kind::Real: os << "real " << real_; break;
  }
  return os.str();
}

namespace {

// ---- storage ----------------------------------------------------------------

// How a dtype is held while interpreting (see "Values and storage").
enum class Storage : uint8_t { F32, F64, Int, Ptr };

Storage storageOf(DType t) {
  switch (t) {
    case DType::F16:
    case DType::BF16:
    case DType::F32: return Storage::F32;
    case DType::F64: return Storage::F64;
    case DType::Ptr: return Storage::Ptr;
    default: return Storage::Int;
  }
}

// A pointer keeps the argument it was derived from: that is what lets an
// access be checked against the right allocation.
// A box of a rank-R tensor (tma_copy, or a load's tensor box) read as a tile of `shape` (the box,
// padded with leading 1s): where element i of the tile lies, and whether inside [0, dims).
struct BoxElements {
  std::vector<int64_t> dims, strides, coords;  // rank entries each, outermost first (the last stride 1)
  struct Element {
    bool inside = true;
    int64_t offset = 0;  // in elements from the tensor's base
  };
  // The tile's elements in order (row-major over `shape`): element() is tile element i after i
  // calls of next(), its index kept as a counter per dimension rather than divided out of i.
  class Walk {
   public:
    Walk(const BoxElements& box, const Shape& shape) : box_(box), shape_(shape), at_(shape.size(), 0) {}
    Element element() const {
      const size_t rank = box_.dims.size(), lead = rank - shape_.size();
      Element e;
      for (size_t k = 0; k < rank; ++k) {
        const int64_t idx = box_.coords[k] + (k >= lead ? at_[k - lead] : 0);
        e.inside = e.inside && idx >= 0 && idx < box_.dims[k];
        e.offset += idx * box_.strides[k];
      }
      return e;
    }
    void next() {
      for (size_t d = shape_.size(); d-- > 0;) {
        if (++at_[d] < shape_[d]) return;
        at_[d] = 0;
      }
    }

   private:
    const BoxElements& box_;
    const Shape& shape_;
    std::vector<int64_t> at_;  // the element's index in each dimension of the tile
  };
};

struct PtrVal {
  int64_t offset = 0;  // bytes from the buffer's base
  int64_t buffer = 0;  // argument index
};

struct Data {
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<int64_t> ints;
  std::vector<PtrVal> ptrs;

  template <class T>
  std::vector<T>& vec() {
    if constexpr (std::is_same_v<T, float>) return f32;
    else if constexpr (std::is_same_v<T, double>) return f64;
    else if constexpr (std::is_same_v<T, int64_t>) return ints;
    else return ptrs;
  }
  template <class T>
  const std::vector<T>& vec() const {
    return const_cast<Data*>(this)->vec<T>();
  }
};
using DataRef = std::shared_ptr<const Data>;

template <class T>
std::shared_ptr<Data> alloc(size_t n) {
  auto d = std::make_shared<Data>();
  d->vec<T>().resize(n);
  return d;
}

// Calls f with a value of the C++ type that holds storage s.
template <class F>
decltype(auto) withStorage(Storage s, F&& f) {
  switch (s) {
    case Storage::F32: return f(float{});
    case Storage::F64: return f(double{});
    case Storage::Int: return f(int64_t{});
    case Storage::Ptr: break;
  }
  return f(PtrVal{});
}

// ---- rounding (ir/Elementwise.h) ----------------------------------------------

// Rounds float-held results to their dtype (a no-op for f32).
void roundFloats(float* v, size_t n, DType t) {
  if (t == DType::F32) return;
  for (size_t i = 0; i < n; ++i) v[i] = roundToDType(v[i], t);
}

void wrapInts(int64_t* v, size_t n, DType t) {
  if (t == DType::I64) return;
  for (size_t i = 0; i < n; ++i) v[i] = wrapToWidth(v[i], t);
}

template <class T>
T maxNaN(T a, T b) {
  return elementwise::Semantics<OpKind::Maximum>::onFloat(a, b);
}

template <class T>
T minNaN(T a, T b) {
  return elementwise::Semantics<OpKind::Minimum>::onFloat(a, b);
}

std::string coordString(const Shape& shape, int64_t linear) {
  if (shape.empty()) return "[] (scalar)";
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = linear % shape[d];
    linear /= shape[d];
  }
  return shapeString(c);
}

Shape rowMajorStrides(const Shape& s) {
  Shape st(s.size(), 1);
  for (size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// dst[i] = src[sum_d idx_d * srcStrides[d]] over dst's row-major index space:
// broadcast (stride 0) and transpose (permuted strides) in one loop nest.
template <class T>
void gather(const T* src, T* dst, const Shape& shape, const Shape& srcStrides) {
  if (shape.empty()) {
    dst[0] = src[0];
    return;
  }
  size_t rank = shape.size();
  int64_t inner = shape[rank - 1], innerStride = srcStrides[rank - 1];
  int64_t outer = numElements(shape) / std::max<int64_t>(inner, 1);
  Shape idx(rank, 0);
  int64_t base = 0;
  for (int64_t o = 0; o < outer; ++o) {
    const T* s = src + base;
    if (innerStride == 1)
      std::copy(s, s + inner, dst);
    else
      for (int64_t i = 0; i < inner; ++i) dst[i] = s[i * innerStride];
    dst += inner;
    for (size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dims
      base += srcStrides[d];
      if (++idx[d] < shape[d]) break;
      base -= srcStrides[d] * shape[d];
      idx[d] = 0;
    }
  }
}

// ---- memory element access --------------------------------------------------

template <DType D>
struct Mem;
template <>
struct Mem<DType::F32> {
  using Held = float;
  static float read(const void* p) { float v; std::memcpy(&v, p, 4); return v; }
  static void write(void* p, float v) { std::memcpy(p, &v, 4); }
};
template <>
struct Mem<DType::F16> {
  using Held = float;
  static float read(const void* p) {
    uint16_t b; std::memcpy(&b, p, 2);
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(b));
  }
  static void write(void* p, float v) {
    uint16_t b = Eigen::numext::bit_cast<uint16_t>(Eigen::half(v));
    std::memcpy(p, &b, 2);
  }
};
template <>
struct Mem<DType::BF16> {
  using Held = float;
  static float read(const void* p) {
    uint16_t b; std::memcpy(&b, p, 2);
    return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(b));
  }
  static void write(void* p, float v) {
    uint16_t b = Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(v));
    std::memcpy(p, &b, 2);
  }
};
template <>
struct Mem<DType::F64> {
  using Held = double;
  static double read(const void* p) { double v; std::memcpy(&v, p, 8); return v; }
  static void write(void* p, double v) { std::memcpy(p, &v, 8); }
};
template <>
struct Mem<DType::I1> {
  using Held = int64_t;
  static int64_t read(const void* p) { return *static_cast<const uint8_t*>(p) != 0; }
  static void write(void* p, int64_t v) { *static_cast<uint8_t*>(p) = uint8_t(v != 0); }
};
template <>
struct Mem<DType::I8> {
  using Held = int64_t;
  static int64_t read(const void* p) { return *static_cast<const int8_t*>(p); }
  static void write(void* p, int64_t v) { *static_cast<int8_t*>(p) = int8_t(v); }
};
template <>
struct Mem<DType::I32> {
  using Held = int64_t;
  static int64_t read(const void* p) { int32_t v; std::memcpy(&v, p, 4); return v; }
  static void write(void* p, int64_t v) { int32_t w = int32_t(v); std::memcpy(p, &w, 4); }
};
template <>
struct Mem<DType::I64> {
  using Held = int64_t;
  static int64_t read(const void* p) { int64_t v; std::memcpy(&v, p, 8); return v; }
  static void write(void* p, int64_t v) { std::memcpy(p, &v, 8); }
};

template <class F>
decltype(auto) withMemDType(DType t, F&& f) {
  switch (t) {
    case DType::F16: return f(Mem<DType::F16>{});
    case DType::BF16: return f(Mem<DType::BF16>{});
    case DType::F64: return f(Mem<DType::F64>{});
    case DType::I1: return f(Mem<DType::I1>{});
    case DType::I8: return f(Mem<DType::I8>{});
    case DType::I32: return f(Mem<DType::I32>{});
    case DType::I64: return f(Mem<DType::I64>{});
    default: break;
  }
  return f(Mem<DType::F32>{});
}

// ---- execution --------------------------------------------------------------

struct Launch {
  const Function* f = nullptr;
  const std::vector<InterpArg>* args = nullptr;
  std::vector<DataRef> params;  // bound once, shared by every program
  std::array<int64_t, 3> grid{};
  const std::atomic<bool>* stopped = nullptr;  // set once a program failed: waits give up
};

// The meeting point of one cluster's programs (cluster_all_gather). Gather g of every program
// completes once all `size` programs have brought their operands to their own gather g; each then
// takes the same snapshot of everyone's operands.
class ClusterRendezvous {
 public:
  using Snapshot = std::shared_ptr<const std::vector<std::vector<DataRef>>>;  // [rank][operand]

  explicit ClusterRendezvous(int64_t size) : size_(size), slots_(size_t(size)) {}

  // Thrown to a program whose cluster mate failed: that mate's error is the one reported.
  struct MateFailed {};

  // Program `rank`'s gather number `count` (0, 1, ...). `who` names the program for errors.
  Snapshot exchange(int64_t rank, int64_t count, std::vector<DataRef> values, const std::string& who) {
    std::unique_lock<std::mutex> lock(mutex_);
    slots_[size_t(rank)] = std::move(values);
    if (++arrived_ == size_) {
      published_.push_back(std::make_shared<const std::vector<std::vector<DataRef>>>(slots_));
      arrived_ = 0;
      changed_.notify_all();
      return published_.back();
    }
    changed_.wait(lock, [&] { return int64_t(published_.size()) > count || failed_ || !returned_.empty(); });
    if (int64_t(published_.size()) > count) return published_[size_t(count)];
    if (failed_) throw MateFailed{};
    const auto& [mate, gathers] = returned_.front();
    throw Error(who + " waits at its cluster_all_gather number " + std::to_string(count + 1) + ", but " + mate +
                " of its cluster returned after " + std::to_string(gathers) +
                ": every program of a cluster must run the same gathers (on the GPU the cluster would hang)");
  }

  // A program ended: normally after `gathers` gathers, or by an error.
  void returned(const std::string& who, int64_t gathers) {
    std::lock_guard<std::mutex> lock(mutex_);
    returned_.emplace_back(who, gathers);
    changed_.notify_all();
  }
  void failed() {
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    changed_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t size_;
  int64_t arrived_ = 0;
  std::vector<std::vector<DataRef>> slots_;  // the gather in progress
  std::vector<Snapshot> published_;          // every completed gather, by count
  std::vector<std::pair<std::string, int64_t>> returned_;
  bool failed_ = false;
};

class Program {
 public:
  explicit Program(const Launch& l) : l_(l), slots_(size_t(l.f->numValues())) {}

  // The cluster this program runs in and its rank there (none: no cluster_all_gather).
  void joinCluster(ClusterRendezvous* cluster, int64_t rank) {
    cluster_ = cluster;
    rank_ = rank;
  }
  int64_t gathers() const { return gathers_; }
  std::string describeProgram() const {
    return "program (" + std::to_string(pid_[0]) + ", " + std::to_string(pid_[1]) + ", " + std::to_string(pid_[2]) + ")";
  }

  void run(std::array<int64_t, 3> pid) {
    pid_ = pid;
    gathers_ = 0;
    // A worker runs program after program on one Program: the async level's bookkeeping is each
    // program's own (the same values name another program's buffers).
    inFlight_.clear();
    openGroup_ = 0;
    expectedPhase_.clear();
    readSinceRelease_.clear();
    releases_.clear();
    asyncDots_.clear();
    slotOfLoad_.clear();
    releaseOf_.clear();
    lastReleaseWait_ = nullptr;
    for (size_t i = 0; i < l_.params.size(); ++i) slots_[size_t(l_.f->params()[i]->id())] = l_.params[i];
    runBlock(l_.f->body());
  }

 private:
  const Launch& l_;
  std::vector<DataRef> slots_;
  // The writable storage of this program's shared buffers (slots_ holds a read-only view).
  std::unordered_map<const Value*, std::shared_ptr<Data>> buffers_;
  // The barrier buffers initialized with {arrivals = 1}: only mbarrier_expect_tx arrives on them,
  // and only it may not arrive on the others (on the GPU a phase would miss its arrivals).
  std::unordered_map<const Value*, bool> oneArrival_;
  // The copies issued into shared slots that nothing has completed yet (see exec): a cp.async
  // copy is completed by an async_wait that covers its commit group, or by a wait on the barrier
  // phase an async_copy_arrive after it counts it toward; a TMA copy by a wait on the barrier
  // slot and phase its bytes count toward (that of the last expect_tx on that slot).
  struct InFlight {
    const Op* copy;
    const Value* buffer;
    size_t first, count;
    int64_t group = -1;               // cp.async: the commit group it joined (async_wait completes it); TMA: -1
    const Value* barriers = nullptr;  // the barrier whose phase counts it (a wait there completes it), if any
    int64_t barrierSlot = 0, phase = 0;
  };
  std::vector<InFlight> inFlight_;
  int64_t openGroup_ = 0;  // the cp.async group copies join until the next async_commit
  std::map<std::pair<const Value*, int64_t>, int64_t> expectedPhase_;  // barrier slot -> phase of its last expect_tx
  // The shared slots read (local_load) since every thread was last known past its reads: a CTA
  // barrier, or for ring slot s a wait on slot s of a barrier the readers release slots on
  // (mbarrier_arrive: a ring's `empty`). A copy or store into such a slot races with warps still
  // reading it.
  std::map<std::pair<const Value*, size_t>, const Op*> readSinceRelease_;
  std::set<const Value*> releases_;  // barrier buffers mbarrier_arrive arrives on
  // The async dots issued and not yet covered by a wgmma_wait, in issue order, each with the ring
  // slots it reads from shared memory (the wgmma reads them until it completes), and which release
  // barrier each ring buffer's refills wait on (learned from the wait before each copy).
  struct AsyncDot {
    const Op* dot;
    std::vector<std::pair<const Value*, size_t>> slots;
  };
  std::deque<AsyncDot> asyncDots_;
  std::map<const Value*, std::pair<const Value*, size_t>> slotOfLoad_;  // local_load result -> (buffer, slot)
  std::map<const Value*, const Value*> releaseOf_;  // ring buffer -> the barrier its refills wait on
  const Value* lastReleaseWait_ = nullptr;           // the release barrier the last wait on one was on
  std::array<int64_t, 3> pid_{};
  ClusterRendezvous* cluster_ = nullptr;
  int64_t rank_ = 0;
  int64_t gathers_ = 0;

  void clusterAllGather(const Op& op) {
    if (!cluster_) fail(op, "runs outside a cluster (internal: the launch found no cluster size)");
    std::vector<DataRef> mine;
    for (const Value* v : op.operands()) mine.push_back(slots_[size_t(v->id())]);
    auto all = cluster_->exchange(rank_, gathers_++, std::move(mine), op.describe() + " in " + describeProgram());
    const size_t size = all->size();
    const bool receives = !op.hasAttr("to") || op.intAttr("to") == rank_;
    for (size_t i = 0; i < op.numOperands(); ++i) {
      const Type& t = op.operand(i)->type();
      for (size_t r = 0; r < size; ++r) {
        if (!receives) {  // {to}: the others see only themselves
          set(op.result(i * size + r), slots_[size_t(op.operand(i)->id())]);
          continue;
        }
        DataRef got = (*all)[r][i];
        if (op.hasAttr("rows") && t.isTile() && op.intAttr("rows") < t.shape()[0]) {
          // Only rows [0, rows) crossed: the rest arrive as zeros.
          const size_t keep = size_t(op.intAttr("rows") * (t.numElements() / t.shape()[0]));
          got = withStorage(storageOf(t.dtype()), [&](auto tag) -> DataRef {
            using T = decltype(tag);
            auto d = std::make_shared<Data>();
            d->template vec<T>() = got->template vec<T>();
            std::fill(d->template vec<T>().begin() + std::ptrdiff_t(keep), d->template vec<T>().end(), T{});
            return d;
          });
        }
        set(op.result(i * size + r), std::move(got));
      }
    }
  }

  [[noreturn]] void fail(const Op& op, const std::string& what) const {
    throw Error(op.describe() + " in program (" + std::to_string(pid_[0]) + ", " + std::to_string(pid_[1]) + ", " +
                std::to_string(pid_[2]) + "): " + what);
  }

  const Data& in(const Op& op, size_t i) const { return *slots_[size_t(op.operand(i)->id())]; }
  template <class T>
  const T* inp(const Op& op, size_t i) const {
    return in(op, i).vec<T>().data();
  }
  void set(const Value* v, DataRef d) { slots_[size_t(v->id())] = std::move(d); }
  int64_t scalarInt(const Value* v) const { return slots_[size_t(v->id())]->ints[0]; }

  // Returns the yield that ended a loop body (null for the function body).
  const Op* runBlock(const Block& b) {
    for (const auto& up : b.ops()) {
      const Op& op = *up;
      if (op.kind() == OpKind::Yield) return &op;
      if (op.kind() == OpKind::Return) return nullptr;
      exec(op);
    }
    return nullptr;
  }

  void exec(const Op& op) {
    switch (op.kind()) {
      // Every async op runs at once, in program order: a copy's bytes land when it is issued. But
      // a copy stays in flight (inFlight_) until the op that completes it on a GPU — async_wait
      // for cp.async groups, a wait on the barrier phase a TMA copy or cp.async arrive counts
      // toward — and reading or overwriting its slot before then is an error: on the GPU those
      // bytes may not have landed. Barriers and proxy fences have nothing left to do (the
      // program is one thread here).
      case OpKind::AsyncCommit: ++openGroup_; return;
      case OpKind::AsyncWait: return asyncWait(op);
      case OpKind::Barrier:  // every thread is past its reads, but not its async dots' (they read until waited)
        std::erase_if(readSinceRelease_, [&](const auto& e) {
          for (const AsyncDot& d : asyncDots_)
            if (std::find(d.slots.begin(), d.slots.end(), e.first) != d.slots.end()) return false;
          return true;
        });
        return;
      case OpKind::WarpgroupTurn:
      case OpKind::FenceAsyncShared: return;
      case OpKind::LocalAlloc: return localAlloc(op);
      case OpKind::MbarrierInit:
      case OpKind::MbarrierInval:
      case OpKind::MbarrierArrive:
      case OpKind::AsyncCopyArrive:
      case OpKind::MbarrierWait:
      case OpKind::MbarrierExpectTx: return mbarrier(op);
      case OpKind::AsyncCopy: return asyncCopy(op);
      case OpKind::TmaCopy: return tmaCopy(op);
      case OpKind::LocalLoad: return localLoad(op);
      case OpKind::LocalStore: return localStore(op);
      case OpKind::ClusterAllGather: return clusterAllGather(op);
      case OpKind::WgmmaWait:  // the accumulators pass through: an async dot was complete at issue
        for (size_t i = 0; i < op.numOperands(); ++i) set(op.result(i), slots_[size_t(op.operand(i)->id())]);
        while (asyncDots_.size() > size_t(op.intAttr("pending"))) asyncDots_.pop_front();  // all but the newest N
        return;
      default: break;
    }
    if (op.kind() == OpKind::Fence) {
      // Programs run on several host threads: their plain stores before the fence must be visible
      // to a program that learns of them through an atomic_add after its own fence.
      std::atomic_thread_fence(std::memory_order_acq_rel);
      return;
    }
    if (op.kind() == OpKind::GridDependency) return;  // one launch at a time: the prior grids are done
    const Type& rt = op.numResults() ? op.result()->type() : op.operand(0)->type();
    const size_t n = size_t(rt.numElements());
    switch (op.kind()) {
      case OpKind::ProgramId:
      case OpKind::NumPrograms: {
        auto d = alloc<int64_t>(1);
        size_t axis = size_t(op.intAttr("axis"));
        d->ints[0] = wrapToWidth(op.kind() == OpKind::ProgramId ? pid_[axis] : l_.grid[axis], rt.dtype());
        return set(op.result(), std::move(d));
      }
      case OpKind::GlobalTimer: {
        auto d = alloc<int64_t>(1);
        d->ints[0] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch()).count();
        return set(op.result(), std::move(d));
      }
      case OpKind::SmId: {  // one multiprocessor: the interpreter's
        auto d = alloc<int64_t>(1);
        d->ints[0] = 0;
        return set(op.result(), std::move(d));
      }
      case OpKind::Constant: return set(op.result(), constant(op, rt, n));
      case OpKind::Arange: {
        auto d = alloc<int64_t>(n);
        int64_t start = op.intAttr("start");
        for (size_t i = 0; i < n; ++i) d->ints[i] = wrapToWidth(start + int64_t(i), DType::I32);
        return set(op.result(), std::move(d));
      }
      case OpKind::Splat:
        return set(op.result(), withStorage(storageOf(rt.dtype()), [&](auto tag) -> DataRef {
          using T = decltype(tag);
          auto d = alloc<T>(n);
          std::fill(d->template vec<T>().begin(), d->template vec<T>().end(), inp<T>(op, 0)[0]);
          return d;
        }));
      case OpKind::Broadcast: {
        const Shape& inShape = op.operand(0)->type().shape();
        Shape strides = rowMajorStrides(inShape);  // the verifier: same rank, each dim equal or 1
        for (size_t d = 0; d < inShape.size(); ++d)
          if (inShape[d] == 1) strides[d] = 0;
        return set(op.result(), regather(op, rt, strides));
      }
      case OpKind::Trans: {
        Shape st = rowMajorStrides(op.operand(0)->type().shape());
        const auto& perm = op.intsAttr("perm");
        Shape strides(perm.size());
        for (size_t i = 0; i < perm.size(); ++i) strides[i] = st[size_t(perm[i])];
        return set(op.result(), regather(op, rt, strides));
      }
      case OpKind::ExpandDims:
      case OpKind::Reshape:
      case OpKind::ConvertLayout: return set(op.result(), slots_[size_t(op.operand(0)->id())]);
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) case OpKind::Enum:
#include "ir/Ops.def"
        return set(op.result(), arithmetic(op, rt, n));
      case OpKind::Cmp: return set(op.result(), compare(op, n));
      case OpKind::Select:
        return set(op.result(), withStorage(storageOf(rt.dtype()), [&](auto tag) -> DataRef {
          using T = decltype(tag);
          auto d = alloc<T>(n);
          const int64_t* c = inp<int64_t>(op, 0);
          const T *a = inp<T>(op, 1), *b = inp<T>(op, 2);
          T* o = d->template vec<T>().data();
          for (size_t i = 0; i < n; ++i) o[i] = c[i] ? a[i] : b[i];
          return d;
        }));
      case OpKind::Cast: return set(op.result(), cast(op, rt, n));
      case OpKind::AddPtr: {
        auto d = alloc<PtrVal>(n);
        const PtrVal* p = inp<PtrVal>(op, 0);
        const int64_t* off = inp<int64_t>(op, 1);
        int64_t w = byteWidth(rt.pointee());
        for (size_t i = 0; i < n; ++i) d->ptrs[i] = {int64_t(uint64_t(p[i].offset) + uint64_t(off[i]) * uint64_t(w)), p[i].buffer};
        return set(op.result(), std::move(d));
      }
      case OpKind::Load: return set(op.result(), load(op, rt, n));
      case OpKind::Store: return store(op, n);
      case OpKind::StoreTagged: return storeTagged(op, n);
      case OpKind::LoadTagged:
        for (size_t i = 0; i < op.numResults(); ++i) set(op.result(i), loadTagged(op, i));
        return;
      case OpKind::AtomicAdd: {
        // {order = "acq_rel"}: the program (one host thread here) releases before and acquires after.
        const bool acqRel = op.hasAttr("order") && op.strAttr("order") == "acq_rel";
        if (acqRel) std::atomic_thread_fence(std::memory_order_acq_rel);
        DataRef old = atomicAdd(op, rt, n);
        if (acqRel) std::atomic_thread_fence(std::memory_order_acq_rel);
        return set(op.result(), std::move(old));
      }
      case OpKind::Fence:  // run above: it has neither operands nor results
      case OpKind::GridDependency:
      case OpKind::ClusterAllGather:
      case OpKind::LocalAlloc:
      case OpKind::AsyncCopy:
      case OpKind::AsyncCommit:
      case OpKind::AsyncWait:
      case OpKind::LocalLoad:
      case OpKind::Barrier:
      case OpKind::FenceAsyncShared:
      case OpKind::LocalStore:
      case OpKind::MbarrierInit:
      case OpKind::MbarrierInval:
      case OpKind::MbarrierArrive:
      case OpKind::AsyncCopyArrive:
      case OpKind::MbarrierWait:
      case OpKind::MbarrierExpectTx:
      case OpKind::TmaCopy:
      case OpKind::WarpgroupTurn:
      case OpKind::WgmmaWait: return;  // the memory/async level, run above
      case OpKind::Reduce: return set(op.result(), reduce(op, rt));
      case OpKind::Dot:
        if (op.hasAttr("async") && op.intAttr("async") != 0) asyncDotIssued(op);
        return set(op.result(), dot(op, rt));
      case OpKind::For: return forLoop(op);
      case OpKind::Yield:
      case OpKind::Return: return;
    }
  }

  DataRef constant(const Op& op, const Type& rt, size_t n) {
    const Attr& a = op.attrs().at("value");
    const int64_t* iv = std::get_if<int64_t>(&a);
    double dv = iv ? double(*iv) : std::get<double>(a);
    switch (storageOf(rt.dtype())) {
      case Storage::F32: {
        auto d = alloc<float>(n);
        float v = iv ? narrowToFloat(*iv, rt.dtype()) : narrowToFloat(dv, rt.dtype());
        std::fill(d->f32.begin(), d->f32.end(), v);
        return d;
      }
      case Storage::F64: {
        auto d = alloc<double>(n);
        std::fill(d->f64.begin(), d->f64.end(), iv ? double(*iv) : dv);
        return d;
      }
      default: {
        auto d = alloc<int64_t>(n);
        int64_t v = iv ? (rt.dtype() == DType::I1 ? *iv != 0 : wrapToWidth(*iv, rt.dtype())) : floatToInt(dv, rt.dtype());
        std::fill(d->ints.begin(), d->ints.end(), v);
        return d;
      }
    }
  }

  DataRef regather(const Op& op, const Type& rt, const Shape& strides) {
    return withStorage(storageOf(rt.dtype()), [&](auto tag) -> DataRef {
      using T = decltype(tag);
      auto d = alloc<T>(size_t(rt.numElements()));
      gather(inp<T>(op, 0), d->template vec<T>().data(), rt.shape(), strides);
      return d;
    });
  }

  // One loop per op and held type, over the op's scalar semantics (ir/Elementwise.h). Each loop is
  // a template of its own, instantiated only for the storage the op is defined on (an int-only op
  // has no onFloat: clang checks a generic lambda's non-dependent names eagerly).
  template <class S, class T>
  DataRef floatLoop(const Op& op, const Type& rt, size_t n) {
    const DType t = rt.dtype();
    auto d = alloc<T>(n);
    T* o = d->template vec<T>().data();
    const T* a = inp<T>(op, 0);
    if constexpr (S::kOperands == 1) {
      for (size_t i = 0; i < n; ++i) o[i] = S::onFloat(a[i]);
    } else {
      const T* b = inp<T>(op, 1);
      for (size_t i = 0; i < n; ++i) o[i] = S::onFloat(a[i], b[i]);
    }
    if constexpr (std::is_same_v<T, float>) roundFloats(o, n, t);
    return d;
  }

  template <class S>
  DataRef intLoop(const Op& op, const Type& rt, size_t n) {
    const DType t = rt.dtype();
    auto d = alloc<int64_t>(n);
    int64_t* o = d->template vec<int64_t>().data();
    const int64_t* a = inp<int64_t>(op, 0);
    if constexpr (S::kOperands == 1) {
      for (size_t i = 0; i < n; ++i) o[i] = S::onInt(a[i], t);
    } else {
      const int64_t* b = inp<int64_t>(op, 1);
      if constexpr (S::kZeroDivisorIsError)
        for (size_t i = 0; i < n; ++i)
          if (b[i] == 0)
            fail(op, "integer division by zero at element " + coordString(rt.shape(), int64_t(i)) + " (dividend " +
                         std::to_string(a[i]) + ")");
      for (size_t i = 0; i < n; ++i) o[i] = S::onInt(a[i], b[i], t);
    }
    wrapInts(o, n, t);
    return d;
  }

  DataRef arithmetic(const Op& op, const Type& rt, size_t n) {
    return elementwise::withArithmetic(op.kind(), [&](auto sem) -> DataRef {
      using S = decltype(sem);
      const Storage storage = storageOf(rt.dtype());
      if constexpr (S::kOnFloats) {
        if (storage == Storage::F32) return this->template floatLoop<S, float>(op, rt, n);
        if (storage == Storage::F64) return this->template floatLoop<S, double>(op, rt, n);
      }
      if constexpr (S::kOnInts) {
        if (storage == Storage::Int) return this->template intLoop<S>(op, rt, n);
      }
      fail(op, "is not defined on " + rt.str());  // unreachable: the verifier checks kIntOnly/kFloatOnly
    });
  }

  template <class T>
  static void compareLoop(ComparePredicate p, const T* a, const T* b, int64_t* o, size_t n) {
    withComparePredicate(p, [&](auto pred) {
      for (size_t i = 0; i < n; ++i) o[i] = compareValues<decltype(pred)::value>(a[i], b[i]);
    });
  }

  DataRef compare(const Op& op, size_t n) {
    auto d = alloc<int64_t>(n);
    const std::string& pred = op.strAttr("pred");
    const ComparePredicate p = *parseComparePredicate(pred);  // checked by the verifier
    int64_t* o = d->ints.data();
    switch (storageOf(op.operand(0)->type().dtype())) {
      case Storage::F32: compareLoop(p, inp<float>(op, 0), inp<float>(op, 1), o, n); break;
      case Storage::F64: compareLoop(p, inp<double>(op, 0), inp<double>(op, 1), o, n); break;
      case Storage::Int: compareLoop(p, inp<int64_t>(op, 0), inp<int64_t>(op, 1), o, n); break;
      case Storage::Ptr: {
        const PtrVal *a = inp<PtrVal>(op, 0), *b = inp<PtrVal>(op, 1);
        bool eq = p == ComparePredicate::Eq;
        for (size_t i = 0; i < n; ++i) o[i] = ((a[i].buffer == b[i].buffer && a[i].offset == b[i].offset) == eq);
        break;
      }
    }
    return d;
  }

  DataRef cast(const Op& op, const Type& rt, size_t n) {
    const DType from = op.operand(0)->type().dtype(), to = rt.dtype();
    const Storage sf = storageOf(from), st = storageOf(to);
    if (sf == st && from == to) return slots_[size_t(op.operand(0)->id())];
    // Source values as one of float / double / int64; destination by storage.
    return withStorage(sf, [&](auto tag) -> DataRef {
      using S = decltype(tag);
      const S* x = inp<S>(op, 0);
      if constexpr (std::is_same_v<S, PtrVal>) {
        return nullptr;  // unreachable: the verifier refuses pointer casts
      } else {
        switch (st) {
          case Storage::F32: {
            auto d = alloc<float>(n);
            float* o = d->f32.data();
            if constexpr (std::is_same_v<S, float>) {
              // float-held to float-held: exact when widening, one rounding when narrowing.
              for (size_t i = 0; i < n; ++i) o[i] = x[i];
              roundFloats(o, n, to);
            } else {
              for (size_t i = 0; i < n; ++i) o[i] = narrowToFloat(x[i], to);
            }
            return d;
          }
          case Storage::F64: {
            auto d = alloc<double>(n);
            for (size_t i = 0; i < n; ++i) d->f64[i] = double(x[i]);
            return d;
          }
          default: {
            auto d = alloc<int64_t>(n);
            int64_t* o = d->ints.data();
            if constexpr (std::is_same_v<S, int64_t>) {
              if (to == DType::I1)
                for (size_t i = 0; i < n; ++i) o[i] = x[i] != 0;
              else
                for (size_t i = 0; i < n; ++i) o[i] = wrapToWidth(x[i], to);
            } else {
              for (size_t i = 0; i < n; ++i) o[i] = floatToInt(double(x[i]), to);
            }
            return d;
          }
        }
      }
    });
  }

  // Checks an active element's access; returns its host address.
  char* address(const Op& op, const char* verb, const Shape& shape, size_t i, const PtrVal& p, int width) const {
    const InterpArg& a = (*l_.args)[size_t(p.buffer)];
    bool inside = p.offset >= 0 && uint64_t(p.offset) + uint64_t(width) <= a.bytes();
    char* addr = static_cast<char*>(a.base()) + (inside ? p.offset : 0);
    if (inside && reinterpret_cast<uintptr_t>(addr) % uintptr_t(width) == 0) return addr;
    fail(op, std::string(inside ? "misaligned " : "out-of-bounds ") + verb + " of " + std::to_string(width) +
                 " bytes at tile element " + coordString(shape, int64_t(i)) + ": byte offset " +
                 std::to_string(p.offset) + " in buffer '" + a.name() + "' of " + std::to_string(a.bytes()) + " bytes");
  }

  DataRef load(const Op& op, const Type& rt, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const int64_t* mask = op.numOperands() > 1 ? inp<int64_t>(op, 1) : nullptr;
    const Value* other = op.numOperands() > 2 ? op.operand(2) : nullptr;
    const Shape& shape = rt.shape();
    const int width = byteWidth(rt.dtype());
    return withMemDType(rt.dtype(), [&](auto mem) -> DataRef {
      using M = decltype(mem);
      using T = typename M::Held;
      auto d = alloc<T>(n);  // zero: the default for inactive elements
      T* o = d->template vec<T>().data();
      const T* oth = other ? inp<T>(op, 2) : nullptr;
      for (size_t i = 0; i < n; ++i) {
        if (mask && !mask[i]) {
          if (oth) o[i] = oth[i];
          continue;
        }
        o[i] = M::read(address(op, "load", shape, i, p[i], width));
      }
      if (op.hasAttr("tensor_rank")) checkTensorBox(op, p, mask, o, shape, width);
      return d;
    });
  }

  // A load's or an atomic_add's tensor box must name the elements its pointers and mask do (a pass
  // may copy the box, or add it, with TMA instead): the mask holds exactly inside the tensor, every
  // pointer there is the box's element, and a loaded value is 0 outside (TMA's fill; `loaded` is
  // null for an atomic_add).
  template <class T>
  void checkTensorBox(const Op& op, const PtrVal* p, const int64_t* mask, const T* loaded, const Shape& shape,
                      int width) const {
    const TensorBox tensor = *tensorBoxOf(op);
    BoxElements box;
    for (size_t k = 0; k < tensor.dims.size(); ++k) {
      box.dims.push_back(scalarInt(tensor.dims[k]));
      box.strides.push_back(k < tensor.strides.size() ? scalarInt(tensor.strides[k]) : 1);
      box.coords.push_back(scalarInt(tensor.coords[k]));
    }
    const PtrVal origin = slots_[size_t(tensor.base->id())]->ptrs[0];
    const size_t n = size_t(numElements(shape));
    BoxElements::Walk walk(box, shape);
    for (size_t i = 0; i < n; ++i, walk.next()) {
      const BoxElements::Element e = walk.element();
      const bool on = !mask || mask[i];
      if (on != e.inside)
        fail(op, "its mask is " + std::string(on ? "on" : "off") + " at tile element " + coordString(shape, int64_t(i)) +
                     ", which its tensor box has " + (e.inside ? "inside" : "outside") + " the tensor");
      if (e.inside && p[i].buffer != origin.buffer)
        fail(op, "its pointer at tile element " + coordString(shape, int64_t(i)) +
                     " is not the tensor box's element there: it points into another buffer than the box's base");
      if (e.inside && p[i].offset != origin.offset + e.offset * width)
        fail(op, "its pointer at tile element " + coordString(shape, int64_t(i)) +
                     " is not the tensor box's element there (byte offset " + std::to_string(p[i].offset) + ", the box's " +
                     std::to_string(origin.offset + e.offset * width) + ")");
      if (loaded && !e.inside && !(loaded[i] == T{}))
        fail(op, "reads a nonzero `other` at tile element " + coordString(shape, int64_t(i)) +
                     " outside its tensor box's tensor (TMA fills 0 there)");
    }
  }

  // ---- shared buffers: one mutable array of slots * tile elements per local_alloc ----

  // The elements [first, first + count) of the buffer operand 0 that slot operand 1 names.
  struct SlotElements {
    size_t first, count;
    size_t index;  // the slot
  };
  SlotElements slotElements(const Op& op) const {
    const Type& t = op.operand(0)->type();
    const int64_t slot = scalarInt(op.operand(1)), slots = t.slots();
    if (slot < 0 || slot >= slots)
      fail(op, "slot " + std::to_string(slot) + " is outside the buffer's " + std::to_string(slots) + " slots");
    const size_t count = size_t(numElements(t.shape()));
    return {size_t(slot) * count, count, size_t(slot)};
  }

  void localAlloc(const Op& op) {
    const Type& t = op.result()->type();
    const size_t n = size_t(t.slots() * numElements(t.shape()));
    std::shared_ptr<Data> d = withStorage(storageOf(t.dtype()), [&](auto held) { return alloc<decltype(held)>(n); });
    // Contents are undefined; an i64 buffer starts as "not a barrier" (-1 completed phases) for
    // the mbarrier ops, whatever bytes it got.
    if (t.dtype() == DType::I64) std::fill(d->vec<int64_t>().begin(), d->vec<int64_t>().end(), int64_t(-1));
    buffers_[op.result()] = d;
    set(op.result(), d);
  }

  // A buffer of barriers holds, per slot, the number of phases completed (-1: not a barrier, from
  // local_alloc until mbarrier_init and after mbarrier_inval). The program is one thread here: its arrival is every
  // thread's, so each arrival completes a phase, and copies have landed when issued.
  void mbarrier(const Op& op) {
    std::vector<int64_t>& phases = buffers_.at(op.operand(0))->vec<int64_t>();
    if (op.kind() == OpKind::MbarrierInit || op.kind() == OpKind::MbarrierInval) {
      if (op.kind() == OpKind::MbarrierInval)
        for (const InFlight& c : inFlight_)
          if (c.barriers == op.operand(0))
            fail(op, "invalidates a barrier while " + c.copy->describe() + " counting toward its slot " +
                         std::to_string(c.barrierSlot) + " is in flight (no wait completed it)");
      for (size_t s = 0; s < phases.size(); ++s) {
        if (op.kind() == OpKind::MbarrierInit && phases[s] >= 0)
          fail(op, "slot " + std::to_string(s) + " is already a barrier (mbarrier_inval it first)");
        phases[s] = op.kind() == OpKind::MbarrierInit ? 0 : -1;
      }
      oneArrival_[op.operand(0)] = op.hasAttr("arrivals") && op.intAttr("arrivals") == 1;
      return;
    }
    const size_t slot = slotElements(op).index;
    if (phases[slot] < 0)
      fail(op, "slot " + std::to_string(slot) + " is not an initialized barrier (mbarrier_init first)");
    const bool one = oneArrival_[op.operand(0)];
    if (op.kind() == OpKind::MbarrierExpectTx && !one)
      fail(op, "arrives once for the program on a barrier that counts every thread's arrival (init it with "
               "{arrivals = 1}): on the GPU its phase would never complete");
    if ((op.kind() == OpKind::MbarrierArrive || op.kind() == OpKind::AsyncCopyArrive) && one)
      fail(op, "every thread arrives on a barrier that counts one arrival per phase ({arrivals = 1}): on the GPU "
               "the phases would complete early");
    if (op.kind() != OpKind::MbarrierWait) {
      // {only_on = 1}: a stage past the end arrives on nothing.
      if (op.kind() == OpKind::MbarrierExpectTx && op.hasAttr("only_on") && op.intAttr("only_on") && !scalarInt(op.operand(2)))
        return;
      if (op.kind() == OpKind::MbarrierExpectTx) expectedPhase_[{op.operand(0), int64_t(slot)}] = phases[slot];
      if (op.kind() == OpKind::MbarrierArrive) {
        releases_.insert(op.operand(0));
        releasedWhileRead(op, slot);
      }
      if (op.kind() == OpKind::AsyncCopyArrive)  // the phase completes once the program's copies so far land
        for (InFlight& c : inFlight_)
          if (c.group >= 0 && !c.barriers) c.barriers = op.operand(0), c.barrierSlot = int64_t(slot), c.phase = phases[slot];
      ++phases[slot];
      return;
    }
    const int64_t parity = scalarInt(op.operand(2));
    if (parity != 0 && parity != 1) fail(op, "the phase parity must be 0 or 1, got " + std::to_string(parity));
    // Phases 0 .. n-1 are complete; the phase in progress, n, has parity n & 1.
    if ((phases[slot] & 1) == parity)
      fail(op, "waits on slot " + std::to_string(slot) + " for the phase of parity " + std::to_string(parity) +
                   ", which has not completed (" + std::to_string(phases[slot]) +
                   " completed so far): on the GPU this wait would never return");
    if (releases_.count(op.operand(0))) {  // the readers of ring slot `slot` released it
      std::erase_if(readSinceRelease_, [&](const auto& e) { return e.first.second == slot; });
      lastReleaseWait_ = op.operand(0);
    }
    // The wait returns once the phase of that parity completed, and the phases before it did too:
    // the copies they count are complete for the waiting threads.
    std::erase_if(inFlight_, [&](const InFlight& c) {
      return c.barriers == op.operand(0) && c.barrierSlot == int64_t(slot) && c.phase < phases[slot];
    });
  }

  // async_wait {pending = N}: every committed group but the N most recent is complete.
  void asyncWait(const Op& op) {
    const int64_t complete = openGroup_ - op.intAttr("pending");
    std::erase_if(inFlight_, [&](const InFlight& c) { return c.group >= 0 && c.group < complete; });
  }

  // A copy is issued into [first, first + count) of `buffer`'s elements: it stays in flight (see exec).
  void issued(const Op& copy, SlotElements slot, int64_t group, const Value* barriers = nullptr, int64_t barrierSlot = 0,
              int64_t phase = 0) {
    touchedInFlight(copy, "writes", slot);
    writtenAfterReads(copy, slot);
    if (lastReleaseWait_) releaseOf_[copy.operand(0)] = lastReleaseWait_;
    inFlight_.push_back({&copy, copy.operand(0), slot.first, slot.count, group, barriers, barrierSlot, phase});
  }
  // An async dot reads the shared slots its operands were loaded from (through trans) until a
  // wgmma_wait covers it.
  void asyncDotIssued(const Op& dot) {
    AsyncDot d{&dot, {}};
    for (const Value* v : dot.operands()) {
      while (v->definingOp() && v->definingOp()->kind() == OpKind::Trans) v = v->definingOp()->operand(0);
      if (auto it = slotOfLoad_.find(v); it != slotOfLoad_.end()) d.slots.push_back(it->second);
    }
    if (!d.slots.empty()) asyncDots_.push_back(std::move(d));
  }
  // An mbarrier_arrive that releases ring slot `slot` while an async dot still reads that slot of
  // a buffer whose refills wait on this barrier: the next copy may overwrite what the tensor
  // cores are still reading.
  void releasedWhileRead(const Op& arrive, size_t slot) const {
    for (const AsyncDot& d : asyncDots_)
      for (const auto& [buffer, s] : d.slots) {
        const auto it = releaseOf_.find(buffer);
        if (s == slot && it != releaseOf_.end() && it->second == arrive.operand(0))
          fail(arrive, "releases slot " + std::to_string(slot) + " while " + d.dot->describe() + ", which reads slot " +
                           std::to_string(s) + " of %" + std::to_string(buffer->id()) +
                           ", is incomplete (no wgmma_wait covers it yet): on the GPU the slot's next copy may "
                           "overwrite what it still reads");
      }
  }
  // Fails when [slot] of operand 0 was read since its readers were last known done (see
  // readSinceRelease_).
  void writtenAfterReads(const Op& op, SlotElements slot) const {
    const auto it = readSinceRelease_.find({op.operand(0), slot.index});
    if (it != readSinceRelease_.end())
      fail(op, "writes slot " + std::to_string(it->first.second) + " of %" + std::to_string(op.operand(0)->id()) +
                   ", which " + it->second->describe() +
                   " read, with no barrier or wait for the slot's release between: on the GPU warps may still be "
                   "reading it");
  }
  // Fails when [slot] of operand 0 holds a copy still in flight.
  void touchedInFlight(const Op& op, const char* verb, SlotElements slot) const {
    for (const InFlight& c : inFlight_)
      if (c.buffer == op.operand(0) && c.first < slot.first + slot.count && slot.first < c.first + c.count)
        fail(op, std::string(verb) + " slot " + std::to_string(slot.index) + " of %" +
                     std::to_string(op.operand(0)->id()) + " while " + c.copy->describe() +
                     " into it is in flight: nothing completes that copy first (" +
                     (!c.barriers ? std::string("no async_wait covers its group")
                                  : "no wait on barrier %" + std::to_string(c.barriers->id()) + " slot " +
                                        std::to_string(c.barrierSlot) + " for phase " + std::to_string(c.phase)) +
                     "); on the GPU its bytes may not have landed");
  }

  void asyncCopy(const Op& op) {
    const Type& t = op.operand(0)->type();
    const auto [base, n, index] = slotElements(op);
    Data& buf = *buffers_.at(op.operand(0));
    const PtrVal* p = inp<PtrVal>(op, 2);
    const int64_t* mask = op.numOperands() > 3 ? inp<int64_t>(op, 3) : nullptr;
    const int width = byteWidth(t.dtype());
    withMemDType(t.dtype(), [&](auto mem) {
      using M = decltype(mem);
      using T = typename M::Held;
      T* o = buf.template vec<T>().data() + base;
      for (size_t i = 0; i < n; ++i) o[i] = mask && !mask[i] ? T{} : M::read(address(op, "async_copy", t.shape(), i, p[i], width));
      return 0;
    });
    issued(op, {base, n, index}, openGroup_);
  }

  // The box lands at once (the barrier's phase then needs only the expect_tx arrival).
  void tmaCopy(const Op& op) {
    const size_t rank = (op.numOperands() - 5) / 3;
    if (!scalarInt(op.operand(4))) return;
    const Type& t = op.operand(0)->type();
    const Shape& shape = t.shape();
    const int64_t barSlot = scalarInt(op.operand(3)), barSlots = op.operand(2)->type().slots();
    if (barSlot < 0 || barSlot >= barSlots)
      fail(op, "barrier slot " + std::to_string(barSlot) + " is outside the buffer's " + std::to_string(barSlots) + " slots");
    const auto [base, n, index] = slotElements(op);
    Data& buf = *buffers_.at(op.operand(0));
    const PtrVal origin = in(op, 5).ptrs[0];
    BoxElements box;
    for (size_t k = 0; k < rank; ++k) {
      box.dims.push_back(scalarInt(op.operand(6 + k)));
      box.strides.push_back(k + 1 < rank ? scalarInt(op.operand(6 + rank + k)) : 1);
      box.coords.push_back(scalarInt(op.operand(6 + 2 * rank - 1 + k)));
    }
    const int width = byteWidth(t.dtype());
    withMemDType(t.dtype(), [&](auto mem) {
      using M = decltype(mem);
      using T = typename M::Held;
      T* o = buf.template vec<T>().data() + base;
      BoxElements::Walk walk(box, shape);
      for (size_t i = 0; i < n; ++i, walk.next()) {
        const BoxElements::Element e = walk.element();
        o[i] = e.inside ? M::read(address(op, "tma_copy", shape, i, {origin.offset + e.offset * width, origin.buffer}, width)) : T{};
      }
      return 0;
    });
    const auto expected = expectedPhase_.find({op.operand(2), barSlot});
    if (expected == expectedPhase_.end())
      fail(op, "copies toward barrier %" + std::to_string(op.operand(2)->id()) + " slot " + std::to_string(barSlot) +
                   ", on which no mbarrier_expect_tx announced bytes: on the GPU no wait would account for them");
    issued(op, {base, n, index}, -1, op.operand(2), barSlot, expected->second);
  }

  void localLoad(const Op& op) {
    const Type& t = op.operand(0)->type();
    const auto [base, n, index] = slotElements(op);
    touchedInFlight(op, "reads", {base, n, index});
    readSinceRelease_[{op.operand(0), index}] = &op;
    slotOfLoad_[op.result()] = {op.operand(0), index};
    const Data& buf = in(op, 0);
    set(op.result(), withStorage(storageOf(t.dtype()), [&](auto held) -> DataRef {
          using T = decltype(held);
          auto d = alloc<T>(n);
          const T* src = buf.template vec<T>().data() + base;
          std::copy(src, src + n, d->template vec<T>().begin());
          return d;
        }));
  }

  void localStore(const Op& op) {
    const Type& t = op.operand(0)->type();
    const auto [base, n, index] = slotElements(op);
    touchedInFlight(op, "writes", {base, n, index});
    writtenAfterReads(op, {base, n, index});
    Data& buf = *buffers_.at(op.operand(0));
    const Data& v = in(op, 2);
    withStorage(storageOf(t.dtype()), [&](auto held) {
      using T = decltype(held);
      const T* src = v.template vec<T>().data();
      std::copy(src, src + n, buf.template vec<T>().begin() + long(base));
      return 0;
    });
  }

  void store(const Op& op, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const int64_t* mask = op.numOperands() > 2 ? inp<int64_t>(op, 2) : nullptr;
    const Type& vt = op.operand(1)->type();
    const int width = byteWidth(vt.dtype());
    withMemDType(vt.dtype(), [&](auto mem) {
      using M = decltype(mem);
      using T = typename M::Held;
      const T* v = inp<T>(op, 1);
      for (size_t i = 0; i < n; ++i)
        if (!mask || mask[i]) M::write(address(op, "store", vt.shape(), i, p[i], width), v[i]);
      return 0;
    });
  }

  // Tagged words: one relaxed host atomic each, as the GPU's relaxed 64-bit accesses.
  void storeTagged(const Op& op, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const float* v = inp<float>(op, 1);
    const uint64_t tag = uint64_t(uint32_t(inp<int64_t>(op, 2)[0]));
    const int64_t* mask = op.numOperands() > 3 ? inp<int64_t>(op, 3) : nullptr;
    const Shape& shape = op.operand(0)->type().shape();
    for (size_t i = 0; i < n; ++i) {
      if (mask && !mask[i]) continue;
      const uint64_t word = tag << 32 | std::bit_cast<uint32_t>(v[i]);
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(address(op, "store_tagged", shape, i, p[i], 8)))
          .store(word, std::memory_order_relaxed);
    }
  }

  // Waits for each element's tag (the writers run on other host threads; a program runs to its end
  // once started, so a writer that has started finishes). Gives up when another program failed,
  // and after a minute: a wait for a writer that never runs is the caller's bug, reported.
  // Tile `t` of the op (its pointer t, its mask tiles + 1 + t when it has masks). Waiting tile by
  // tile is the same wait: every writer is running, and each word once tagged stays so.
  DataRef loadTagged(const Op& op, size_t t) {
    const size_t tiles = op.numResults();
    const PtrVal* p = inp<PtrVal>(op, t);
    const uint32_t tag = uint32_t(inp<int64_t>(op, tiles)[0]);
    const size_t maskAt = loadTaggedMaskIndex(op, t);
    const int64_t* mask = maskAt ? inp<int64_t>(op, maskAt) : nullptr;
    const Shape& shape = op.result(t)->type().shape();
    const size_t n = size_t(ir::numElements(shape));
    auto d = alloc<float>(n);  // zero where masked off
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (size_t i = 0; i < n; ++i) {
      if (mask && !mask[i]) continue;
      std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(address(op, "load_tagged", shape, i, p[i], 8)));
      uint64_t w = word.load(std::memory_order_relaxed);
      while (uint32_t(w >> 32) != tag) {
        if (l_.stopped && l_.stopped->load(std::memory_order_relaxed))
          fail(op, "stopped waiting for tag " + std::to_string(tag) + ": another program failed");
        if (std::chrono::steady_clock::now() > deadline)
          fail(op, "waited a minute for tag " + std::to_string(tag) + " at element " + std::to_string(i) +
                       " (it holds tag " + std::to_string(w >> 32) + "): no program stores it");
        std::this_thread::yield();
        w = word.load(std::memory_order_relaxed);
      }
      d->f32[i] = std::bit_cast<float>(uint32_t(w));
    }
    return d;
  }

  // Elements in row-major order, each read-modify-write one host atomic, so
  // programs running on other threads may add to the same addresses.
  DataRef atomicAdd(const Op& op, const Type& rt, size_t n) {
    const PtrVal* p = inp<PtrVal>(op, 0);
    const int64_t* mask = operandsBeforeBox(op) > 2 ? inp<int64_t>(op, 2) : nullptr;
    const Shape& shape = rt.shape();
    const DType t = rt.dtype();
    const int width = byteWidth(t);
    if (op.hasAttr("tensor_rank")) checkTensorBox(op, p, mask, static_cast<const float*>(nullptr), shape, width);
    auto active = [&](size_t i) { return !mask || mask[i]; };
    auto at = [&](size_t i) { return address(op, "atomic_add", shape, i, p[i], width); };
    if (t == DType::F32) {
      auto d = alloc<float>(n);  // zero: the result of inactive elements
      const float* v = inp<float>(op, 1);
      for (size_t i = 0; i < n; ++i)
        if (active(i)) d->f32[i] = std::atomic_ref<float>(*reinterpret_cast<float*>(at(i))).fetch_add(v[i]);
      return d;
    }
    auto d = alloc<int64_t>(n);
    const int64_t* v = inp<int64_t>(op, 1);
    for (size_t i = 0; i < n; ++i) {
      if (!active(i)) continue;
      if (t == DType::I32)  // wraps: atomic arithmetic on signed integers is two's complement
        d->ints[i] = std::atomic_ref<int32_t>(*reinterpret_cast<int32_t*>(at(i))).fetch_add(int32_t(v[i]));
      else
        d->ints[i] = std::atomic_ref<int64_t>(*reinterpret_cast<int64_t*>(at(i))).fetch_add(v[i]);
    }
    return d;
  }

  DataRef reduce(const Op& op, const Type& rt) {
    const Shape& s = op.operand(0)->type().shape();
    const size_t axis = size_t(op.intAttr("axis"));
    int64_t outer = 1, inner = 1, len = s[axis];
    for (size_t d = 0; d < axis; ++d) outer *= s[d];
    for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
    const std::string& kind = op.strAttr("kind");
    const DType t = rt.dtype();
    return withStorage(storageOf(t), [&](auto tag) -> DataRef {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, PtrVal>) {
        return nullptr;  // the verifier refuses reductions of pointers
      } else {
        const T* x = inp<T>(op, 0);
        auto d = alloc<T>(size_t(outer * inner));
        T* o = d->template vec<T>().data();
        constexpr bool isInt = std::is_same_v<T, int64_t>;
        using Acc = std::conditional_t<isInt, uint64_t, double>;  // sums: wrapping ints, doubles for floats
        std::vector<Acc> sum(static_cast<size_t>(inner), Acc(0));
        for (int64_t a = 0; a < outer; ++a) {
          const T* blk = x + a * len * inner;
          T* out = o + a * inner;
          if (kind == "sum") {
            std::fill(sum.begin(), sum.end(), Acc(0));
            for (int64_t k = 0; k < len; ++k)
              for (int64_t i = 0; i < inner; ++i) sum[size_t(i)] += Acc(blk[k * inner + i]);
            for (int64_t i = 0; i < inner; ++i) {
              if constexpr (isInt) out[i] = wrapToWidth(int64_t(sum[size_t(i)]), t);
              else if constexpr (std::is_same_v<T, float>) out[i] = narrowToFloat(sum[size_t(i)], t);
              else out[i] = sum[size_t(i)];
            }
          } else {
            bool isMax = kind == "max";
            std::copy(blk, blk + inner, out);
            for (int64_t k = 1; k < len; ++k) {
              const T* row = blk + k * inner;
              if constexpr (isInt) {
                if (isMax) for (int64_t i = 0; i < inner; ++i) out[i] = std::max(out[i], row[i]);
                else for (int64_t i = 0; i < inner; ++i) out[i] = std::min(out[i], row[i]);
              } else {
                if (isMax) for (int64_t i = 0; i < inner; ++i) out[i] = maxNaN(out[i], row[i]);
                else for (int64_t i = 0; i < inner; ++i) out[i] = minNaN(out[i], row[i]);
              }
            }
          }
        }
        return d;
      }
    });
  }

  // A float-held or double-held operand as a double matrix (row-major input).
  Eigen::MatrixXd asDouble(const Op& op, size_t i, int64_t rows, int64_t cols) const {
    using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    using RowMajorD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    if (storageOf(op.operand(i)->type().dtype()) == Storage::F64)
      return Eigen::Map<const RowMajorD>(inp<double>(op, i), rows, cols);
    return Eigen::Map<const RowMajorF>(inp<float>(op, i), rows, cols).cast<double>();
  }

  // a[M, K] @ b[K, N] + acc[M, N]: float inputs with a float accumulator, or i8 inputs with i32 (the verifier's rule).
  DataRef dot(const Op& op, const Type& rt) {
    const int64_t m = op.operand(0)->type().shape()[0], k = op.operand(0)->type().shape()[1],
                  nn = op.operand(1)->type().shape()[1];
    const DType t = rt.dtype();
    if (isInteger(t)) {
      auto d = alloc<int64_t>(size_t(m * nn));
      const int64_t *a = inp<int64_t>(op, 0), *b = inp<int64_t>(op, 1), *c = inp<int64_t>(op, 2);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < nn; ++j) {
          uint64_t acc = uint64_t(c[i * nn + j]);
          for (int64_t p = 0; p < k; ++p) acc += uint64_t(a[i * k + p]) * uint64_t(b[p * nn + j]);
          d->ints[size_t(i * nn + j)] = wrapToWidth(int64_t(acc), t);
        }
      return d;
    }
    const bool f64 = storageOf(t) == Storage::F64;
    auto d = f64 ? alloc<double>(size_t(m * nn)) : alloc<float>(size_t(m * nn));
    Eigen::MatrixXd prod;
    prod.noalias() = asDouble(op, 0, m, k) * asDouble(op, 1, k, nn);
    prod += asDouble(op, 2, m, nn);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < nn; ++j) {
        size_t idx = size_t(i * nn + j);
        if (f64) d->f64[idx] = prod(i, j);
        else d->f32[idx] = narrowToFloat(prod(i, j), t);
      }
    return d;
  }

  void forLoop(const Op& op) {
    const int64_t lb = scalarInt(op.operand(0)), ub = scalarInt(op.operand(1)), step = scalarInt(op.operand(2));
    if (step <= 0) fail(op, "loop step " + std::to_string(step) + " is not positive");
    const Block& body = op.region(0);
    const size_t n = op.numResults();
    std::vector<DataRef> carried(n);
    for (size_t j = 0; j < n; ++j) carried[j] = slots_[size_t(op.operand(3 + j)->id())];
    for (int64_t iv = lb; iv < ub;) {
      auto ivData = alloc<int64_t>(1);
      ivData->ints[0] = iv;
      set(body.arg(0), std::move(ivData));
      for (size_t j = 0; j < n; ++j) set(body.arg(1 + j), carried[j]);
      const Op* y = runBlock(body);
      for (size_t j = 0; j < n; ++j) carried[j] = slots_[size_t(y->operand(j)->id())];
      if (uint64_t(ub) - uint64_t(iv) <= uint64_t(step)) break;  // the next iv would reach ub (or overflow)
      iv += step;
    }
    for (size_t j = 0; j < n; ++j) set(op.result(j), carried[j]);
  }
};

// Binds one argument to its (verified: scalar) parameter, checking its kind and range.
DataRef bindParam(const Function& f, size_t i, InterpArg& arg) {
  const Value* p = f.params()[i];
  const Type& t = p->type();
  std::string pname = "parameter " + std::to_string(i) + (p->nameHint().empty() ? "" : " '" + p->nameHint() + "'");
  auto fail = [&](const std::string& what) -> DataRef {
    throw Error("interpret '" + f.name() + "': " + pname + " of type " + t.str() + ": " + what);
  };
  if (t.isPointer()) {
    if (arg.kind() != InterpArg::Kind::Buffer) return fail("expects a buffer, got " + arg.describe());
    if (!arg.base() && arg.bytes() != 0) return fail("null buffer of " + std::to_string(arg.bytes()) + " bytes");
    if (arg.name().empty())
      arg = InterpArg::buffer(arg.base(), arg.bytes(), p->nameHint().empty() ? "arg" + std::to_string(i) : p->nameHint());
    auto d = alloc<PtrVal>(1);
    d->ptrs[0] = {0, int64_t(i)};
    return d;
  }
  if (isInteger(t.dtype())) {
    if (arg.kind() != InterpArg::Kind::Integer) return fail("expects an integer, got " + arg.describe());
    int64_t v = arg.intValue();
    if ((t.dtype() == DType::I1 && v != 0 && v != 1) || wrapToWidth(v, t.dtype()) != v)
      return fail("value " + std::to_string(v) + " does not fit");
    auto d = alloc<int64_t>(1);
    d->ints[0] = v;
    return d;
  }
  if (arg.kind() != InterpArg::Kind::Real) return fail("expects a real, got " + arg.describe());
  if (t.dtype() == DType::F64) {
    auto d = alloc<double>(1);
    d->f64[0] = arg.realValue();
    return d;
  }
  auto d = alloc<float>(1);
  d->f32[0] = narrowToFloat(arg.realValue(), t.dtype());
  return d;
}

}  // namespace

void interpret(const Function& f, const std::vector<InterpArg>& argsIn, std::array<int64_t, 3> grid,
               const InterpOptions& options) {
  for (int a = 0; a < 3; ++a)
    if (grid[size_t(a)] < 0)
      throw Error("interpret '" + f.name() + "': grid dimension " + std::to_string(a) + " is " +
                  std::to_string(grid[size_t(a)]));
  if (argsIn.size() != f.params().size()) {
    std::string which;
    if (argsIn.size() < f.params().size()) {
      const Value* p = f.params()[argsIn.size()];
      which = "; first missing: parameter " + std::to_string(argsIn.size()) +
              (p->nameHint().empty() ? "" : " '" + p->nameHint() + "'") + " of type " + p->type().str();
    }
    throw Error("interpret '" + f.name() + "': " + std::to_string(argsIn.size()) + " arguments for " +
                std::to_string(f.params().size()) + " parameters" + which);
  }
  verify(f);

  std::vector<InterpArg> args = argsIn;  // gets default buffer names
  Launch launch;
  launch.f = &f;
  launch.args = &args;
  launch.grid = grid;
  for (size_t i = 0; i < args.size(); ++i) launch.params.push_back(bindParam(f, i, args[i]));

  const int64_t total = grid[0] * grid[1] * grid[2];
  // The cluster shape: every cluster_all_gather of a function has the same size (ir::verify).
  const int64_t clusterSize = ir::clusterSize(f);
  if (grid[0] % clusterSize != 0)
    throw Error("interpret '" + f.name() + "': grid axis 0 is " + std::to_string(grid[0]) +
                ", not a multiple of the cluster size " + std::to_string(clusterSize) +
                " (its cluster_all_gather): the programs are launched in clusters of that many along axis 0");
  if (total == 0) return;
  const int64_t units = total / clusterSize;  // programs, or clusters of consecutive programs
  int64_t threads = options.threads > 0 ? options.threads : std::max(1u, std::thread::hardware_concurrency());
  threads = std::min(threads, units);
  auto gridPoint = [&](int64_t l) -> std::array<int64_t, 3> {
    return {l % grid[0], (l / grid[0]) % grid[1], l / (grid[0] * grid[1])};
  };

  // Programs are claimed in increasing order; after a failure no new program
  // starts, so every program numbered below a failing one has run, and the
  // lowest failure reported is the same whatever the scheduling.
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  launch.stopped = &stop;
  std::mutex errorMutex;
  int64_t errorProgram = total;
  std::exception_ptr error;  // the first failing program's, rethrown as it was
  auto record = [&](int64_t l, std::exception_ptr e) {
    // An Error goes on as it is (its kind intact); anything else was a bug of the interpreter's.
    try {
      std::rethrow_exception(e);
    } catch (const Error&) {
    } catch (const std::exception& other) {
      e = std::make_exception_ptr(Error(other.what(), ErrorKind::Internal));
    }
    std::lock_guard<std::mutex> lock(errorMutex);
    if (l < errorProgram) {
      errorProgram = l;
      error = e;
    }
    stop = true;
  };
  // One cluster: its programs at once, each on a thread (the first on the caller's).
  auto runCluster = [&](int64_t unit) {
    ClusterRendezvous rendezvous(clusterSize);
    std::vector<std::exception_ptr> errors(static_cast<size_t>(clusterSize));
    auto member = [&](int64_t rank) {
      Program program(launch);
      program.joinCluster(&rendezvous, rank);
      try {
        program.run(gridPoint(unit * clusterSize + rank));
        rendezvous.returned(program.describeProgram(), program.gathers());
      } catch (const ClusterRendezvous::MateFailed&) {
        // The mate's error is reported.
      } catch (...) {
        errors[size_t(rank)] = std::current_exception();
        rendezvous.failed();
      }
    };
    std::vector<std::thread> mates;
    for (int64_t rank = 1; rank < clusterSize; ++rank) mates.emplace_back(member, rank);
    member(0);
    for (auto& t : mates) t.join();
    for (int64_t rank = 0; rank < clusterSize; ++rank)
      if (errors[size_t(rank)]) record(unit * clusterSize + rank, errors[size_t(rank)]);
  };
  auto worker = [&] {
    Program program(launch);
    for (;;) {
      if (stop.load(std::memory_order_relaxed)) return;
      int64_t u = next.fetch_add(1);
      if (u >= units) return;
      if (clusterSize > 1) {
        runCluster(u);
        continue;
      }
      try {
        program.run(gridPoint(u));
      } catch (...) {
        record(u, std::current_exception());
      }
    }
  };
  if (threads == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (errorProgram < total) std::rethrow_exception(error);
}

}  // namespace flextile::ir
