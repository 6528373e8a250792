#include "attention_templates/Reference.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "attention_templates/BlockMask.h"
#include "ir/IR.h"

namespace flextile::attention {

using dsl::DType;
using dsl::Tensor;

std::vector<double> toDoubles(const Tensor& t) {
  auto widen = [](const auto& v) { return std::vector<double>(v.begin(), v.end()); };
  switch (t.dtype()) {
    case DType::F32: return widen(t.toHost<float>());
    case DType::F64: return t.toHost<double>();
    case DType::F16: {
      auto v = t.toHost<Eigen::half>();
      std::vector<double> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = double(float(v[i]));
      return out;
    }
    case DType::BF16: {
      auto v = t.toHost<Eigen::bfloat16>();
      std::vector<double> out(v.size());
      for (size_t i = 0; i < v.size(); ++i) out[i] = double(float(v[i]));
      return out;
    }
    default: throw Error("toDoubles: expected a float tensor, got " + t.describe());
  }
}

namespace {

using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// The tensor itself when its memory is the host's (any strides), else a host copy.
Tensor onHost(const Tensor& t) { return t.isHost() ? t : t.to(dsl::MemorySpace::Host); }

inline double widen(float x) { return x; }
inline double widen(double x) { return x; }
inline double widen(Eigen::half x) { return double(float(x)); }
inline double widen(Eigen::bfloat16 x) { return double(float(x)); }

// Rows rowOf(0..n-1) of t[b, h] ([B, H, N, D], host memory, any strides) as doubles, row-major
// into dst [n, D].
template <class T, class RowOf>
void gatherRowsAs(const Tensor& t, int64_t b, int64_t h, int64_t n, const RowOf& rowOf, double* dst) {
  const T* base = static_cast<const T*>(t.hostData());
  const std::vector<int64_t>& st = t.strides();
  const int64_t D = t.size(3);
  for (int64_t r = 0; r < n; ++r) {
    const T* row = base + b * st[0] + h * st[1] + rowOf(r) * st[2];
    for (int64_t d = 0; d < D; ++d) dst[r * D + d] = widen(row[d * st[3]]);
  }
}
template <class RowOf>
void gatherRows(const Tensor& t, int64_t b, int64_t h, int64_t n, const RowOf& rowOf, double* dst) {
  switch (t.dtype()) {
    case DType::F32: return gatherRowsAs<float>(t, b, h, n, rowOf, dst);
    case DType::F64: return gatherRowsAs<double>(t, b, h, n, rowOf, dst);
    case DType::F16: return gatherRowsAs<Eigen::half>(t, b, h, n, rowOf, dst);
    case DType::BF16: return gatherRowsAs<Eigen::bfloat16>(t, b, h, n, rowOf, dst);
    default: throw Error("referenceAttention: expected a float tensor, got " + t.describe());
  }
}

int threadCount(int requested, size_t tasks) {
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  return int(std::min<size_t>(size_t(requested > 0 ? requested : cores), std::max<size_t>(tasks, 1)));
}

// Runs task(0..count-1) on `threads` threads (the caller's alone for one); the first exception a
// task throws is rethrown here, after every thread has stopped.
void parallelFor(size_t count, int threads, const std::function<void(size_t)>& task) {
  if (threads <= 1) {
    for (size_t i = 0; i < count; ++i) task(i);
    return;
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex errorMutex;
  auto worker = [&] {
    for (size_t i; !failed && (i = next++) < count;) {
      try {
        task(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(errorMutex);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// The work of one (batch, kv head) of a reference on some rows or keys: up to kHeadTaskItems
// items (indices into the caller's rows or keys), so that a task converts that head's tensors once
// and a score block of kHeadTaskItems x length doubles bounds the memory of each thread.
constexpr size_t kHeadTaskItems = 64;
struct HeadTask {
  int64_t b, hk;
  std::vector<size_t> items;
};
using HeadGroups = std::map<std::pair<int64_t, int64_t>, std::vector<size_t>>;  // (b, hk) -> items
std::vector<HeadTask> headTasks(const HeadGroups& groups) {
  std::vector<HeadTask> tasks;
  for (const auto& [key, items] : groups)
    for (size_t first = 0; first < items.size(); first += kHeadTaskItems) {
      const size_t last = std::min(items.size(), first + kHeadTaskItems);
      tasks.push_back({key.first, key.second,
                       std::vector<size_t>(items.begin() + std::ptrdiff_t(first), items.begin() + std::ptrdiff_t(last))});
    }
  return tasks;
}

}  // namespace

std::vector<QueryRow> allQueryRows(int64_t B, int64_t H, int64_t L) {
  std::vector<QueryRow> rows;
  rows.reserve(size_t(B * H * L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) rows.push_back({b, h, i});
  return rows;
}

ReferenceRows referenceAttentionRows(const Tensor& qIn, const Tensor& kIn, const Tensor& vIn, const RefScoreFn& score,
                                     const RefMaskFn& mask, double scale, std::span<const QueryRow> rows,
                                     int64_t qOffset, int threads, const std::vector<double>* sinks) {
  const Tensor q = onHost(qIn), k = onHost(kIn), v = onHost(vIn);
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t DV = v.size(3);  // the output's head dim (v's may differ from q's and k's)
  for (const QueryRow& r : rows)
    if (r.b < 0 || r.b >= B || r.h < 0 || r.h >= Hq || r.i < 0 || r.i >= L)
      throw Error("referenceAttentionRows: row (" + std::to_string(r.b) + ", " + std::to_string(r.h) + ", " +
                  std::to_string(r.i) + ") is outside q " + q.describe());
  // Tasks of rows that share a kv head: its K and V are converted once per task.
  HeadGroups byKvHead;
  for (size_t n = 0; n < rows.size(); ++n) byKvHead[{rows[n].b, rows[n].h / (Hq / Hkv)}].push_back(n);
  const std::vector<HeadTask> tasks = headTasks(byKvHead);

  ReferenceRows r;
  r.out.assign(rows.size() * size_t(DV), 0.0);
  r.lse.assign(rows.size(), -INFINITY);
  r.maxScores.assign(rows.size(), -INFINITY);
  std::atomic<int64_t> allowedPairs{0};
  parallelFor(tasks.size(), threadCount(threads, tasks.size()), [&](size_t t) {
    const HeadTask& task = tasks[t];
    const int64_t n = int64_t(task.items.size());
    Mat K(S, D), V(S, DV), Q(n, D);
    gatherRows(k, task.b, task.hk, S, [](int64_t j) { return j; }, K.data());
    gatherRows(v, task.b, task.hk, S, [](int64_t j) { return j; }, V.data());
    for (int64_t x = 0; x < n; ++x) {  // the task's rows may belong to different query heads
      const QueryRow& row = rows[task.items[size_t(x)]];
      gatherRows(q, row.b, row.h, 1, [&](int64_t) { return row.i; }, Q.data() + x * D);
    }
    Mat s = (Q * K.transpose()) * scale;
    int64_t pairs = 0;
    for (int64_t x = 0; x < n; ++x) {
      const size_t index = task.items[size_t(x)];
      const QueryRow& row = rows[index];
      const int64_t qPos = row.i + qOffset;
      double m = -INFINITY;
      for (int64_t j = 0; j < S; ++j) {
        const bool ok = !mask || mask(row.b, row.h, qPos, j);
        pairs += ok;
        const double y = ok ? (score ? score(s(x, j), row.b, row.h, qPos, j) : s(x, j)) : -INFINITY;
        s(x, j) = y;
        m = std::max(m, y);
      }
      r.maxScores[index] = m;  // over the keys: a sink is not one
      const double sink = sinks ? (*sinks)[size_t(row.h)] : -INFINITY;
      m = std::max(m, sink);
      if (m == -INFINITY) continue;  // no allowed key (and no sink): out 0, lse -inf
      double l = sinks ? std::exp(sink - m) : 0.0;  // the sink's weight; its value is 0
      for (int64_t j = 0; j < S; ++j) l += s(x, j) = std::exp(s(x, j) - m);
      Eigen::Map<Eigen::RowVectorXd>(r.out.data() + index * size_t(DV), DV) = (s.row(x) * V) / l;
      r.lse[index] = m + std::log(l);
    }
    allowedPairs += pairs;
  });
  r.allowedPairs = allowedPairs;
  return r;
}

ReferenceResult referenceAttention(const Tensor& q, const Tensor& k, const Tensor& v, const RefScoreFn& score,
                                   const RefMaskFn& mask, double scale, int64_t qOffset,
                                   const std::vector<double>* sinks) {
  // One thread: callers of this form may pass mods that are not safe to call concurrently.
  const std::vector<QueryRow> rows = allQueryRows(q.size(0), q.size(1), q.size(2));
  ReferenceRows rr = referenceAttentionRows(q, k, v, score, mask, scale, rows, qOffset, /*threads=*/1, sinks);
  ReferenceResult r;
  r.out = std::move(rr.out);  // rows in [B, Hq, L] order: the [B, Hq, L, D] layout
  r.lse = std::move(rr.lse);
  r.maxScores = std::move(rr.maxScores);
  r.allowedPairs = rr.allowedPairs;
  return r;
}

ReferenceGradRows referenceAttentionBackwardRows(const Tensor& qIn, const Tensor& kIn, const Tensor& vIn,
                                                 const Tensor& outIn, const Tensor& lseIn, const Tensor& doutIn,
                                                 const RefScoreFn& score, const RefScoreGradFn& scoreGrad,
                                                 const RefMaskFn& mask, double scale,
                                                 std::span<const QueryRow> queryRows, std::span<const KeyRow> keyRows,
                                                 int64_t qOffset, int threads) {
  const Tensor q = onHost(qIn), k = onHost(kIn), v = onHost(vIn), out = onHost(outIn), dout = onHost(doutIn);
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t DV = v.size(3), G = Hq / Hkv;
  if (lseIn.dtype() != DType::F32 || lseIn.shape() != dsl::Shape{B, Hq, L})
    throw Error("referenceAttentionBackwardRows: lse must be f32 [B, Hq, L], got " + lseIn.describe());
  const std::vector<float> lse = onHost(lseIn).toHost<float>();
  for (const QueryRow& r : queryRows)
    if (r.b < 0 || r.b >= B || r.h < 0 || r.h >= Hq || r.i < 0 || r.i >= L)
      throw Error("referenceAttentionBackwardRows: row (" + std::to_string(r.b) + ", " + std::to_string(r.h) + ", " +
                  std::to_string(r.i) + ") is outside q " + q.describe());
  for (const KeyRow& r : keyRows)
    if (r.b < 0 || r.b >= B || r.h < 0 || r.h >= Hkv || r.j < 0 || r.j >= S)
      throw Error("referenceAttentionBackwardRows: key (" + std::to_string(r.b) + ", " + std::to_string(r.h) + ", " +
                  std::to_string(r.j) + ") is outside k " + k.describe());
  // The score gradient dS of an allowed pair (0 where masked or where the row's lse is -inf), and p.
  struct Pair {
    double p = 0, ds = 0;
  };
  auto pairAt = [&](int64_t b, int64_t h, int64_t i, int64_t j, double s, double dP, double delta) {
    const int64_t qPos = i + qOffset;
    const double rowLse = lse[size_t((b * Hq + h) * L + i)];
    if (rowLse == -INFINITY || (mask && !mask(b, h, qPos, j))) return Pair{};
    const double p = std::exp((score ? score(s, b, h, qPos, j) : s) - rowLse);
    return Pair{p, p * (dP - delta) * (scoreGrad ? scoreGrad(s, b, h, qPos, j) : 1.0)};
  };
  // Tasks of query rows (dq), then of keys (dk, dv), each of one (batch, kv head).
  HeadGroups rowGroups, keyGroups;
  for (size_t n = 0; n < queryRows.size(); ++n) rowGroups[{queryRows[n].b, queryRows[n].h / G}].push_back(n);
  for (size_t n = 0; n < keyRows.size(); ++n) keyGroups[{keyRows[n].b, keyRows[n].h}].push_back(n);
  const std::vector<HeadTask> rowTasks = headTasks(rowGroups), keyTasks = headTasks(keyGroups);
  const size_t taskCount = rowTasks.size() + keyTasks.size();

  ReferenceGradRows r;
  r.dq.assign(queryRows.size() * size_t(D), 0.0);
  r.dk.assign(keyRows.size() * size_t(D), 0.0);
  r.dv.assign(keyRows.size() * size_t(DV), 0.0);
  parallelFor(taskCount, threadCount(threads, taskCount), [&](size_t t) {
    const bool keys = t >= rowTasks.size();
    const HeadTask& task = keys ? keyTasks[t - rowTasks.size()] : rowTasks[t];
    const int64_t n = int64_t(task.items.size());
    if (!keys) {  // rows of dq: each row against every key of its kv head
      Mat K(S, D), V(S, DV), Q(n, D), dO(n, DV), O(n, DV);
      gatherRows(k, task.b, task.hk, S, [](int64_t j) { return j; }, K.data());
      gatherRows(v, task.b, task.hk, S, [](int64_t j) { return j; }, V.data());
      for (int64_t x = 0; x < n; ++x) {
        const QueryRow& row = queryRows[task.items[size_t(x)]];
        gatherRows(q, row.b, row.h, 1, [&](int64_t) { return row.i; }, Q.data() + x * D);
        gatherRows(dout, row.b, row.h, 1, [&](int64_t) { return row.i; }, dO.data() + x * DV);
        gatherRows(out, row.b, row.h, 1, [&](int64_t) { return row.i; }, O.data() + x * DV);
      }
      const Mat s = (Q * K.transpose()) * scale, dP = dO * V.transpose();
      for (int64_t x = 0; x < n; ++x) {
        const QueryRow& row = queryRows[task.items[size_t(x)]];
        const double delta = O.row(x).dot(dO.row(x));
        Eigen::Map<Eigen::RowVectorXd> dq(r.dq.data() + task.items[size_t(x)] * size_t(D), D);
        for (int64_t j = 0; j < S; ++j) {
          const Pair g = pairAt(row.b, row.h, row.i, j, s(x, j), dP(x, j), delta);
          if (g.ds != 0) dq += (scale * g.ds) * K.row(j);
        }
      }
      return;
    }
    // keys of dk and dv: each against every query row of the kv head's group
    Mat Kj(n, D), Vj(n, DV), Q(L, D), dO(L, DV), O(L, DV), dK = Mat::Zero(n, D), dV = Mat::Zero(n, DV);
    for (int64_t x = 0; x < n; ++x) {
      const int64_t j = keyRows[task.items[size_t(x)]].j;
      gatherRows(k, task.b, task.hk, 1, [&](int64_t) { return j; }, Kj.data() + x * D);
      gatherRows(v, task.b, task.hk, 1, [&](int64_t) { return j; }, Vj.data() + x * DV);
    }
    for (int64_t h = task.hk * G; h < (task.hk + 1) * G; ++h) {
      gatherRows(q, task.b, h, L, [](int64_t i) { return i; }, Q.data());
      gatherRows(dout, task.b, h, L, [](int64_t i) { return i; }, dO.data());
      gatherRows(out, task.b, h, L, [](int64_t i) { return i; }, O.data());
      const Mat s = (Q * Kj.transpose()) * scale, dP = dO * Vj.transpose();
      for (int64_t i = 0; i < L; ++i) {
        const double delta = O.row(i).dot(dO.row(i));
        for (int64_t x = 0; x < n; ++x) {
          const Pair g = pairAt(task.b, h, i, keyRows[task.items[size_t(x)]].j, s(i, x), dP(i, x), delta);
          if (g.p == 0) continue;
          dK.row(x) += (scale * g.ds) * Q.row(i);
          dV.row(x) += g.p * dO.row(i);
        }
      }
    }
    for (int64_t x = 0; x < n; ++x) {
      const size_t item = task.items[size_t(x)];
      Eigen::Map<Eigen::RowVectorXd>(r.dk.data() + item * size_t(D), D) = dK.row(x);
      Eigen::Map<Eigen::RowVectorXd>(r.dv.data() + item * size_t(DV), DV) = dV.row(x);
    }
  });
  return r;
}

double countAllowedPairs(const BlockMask& m, const RefMaskFn& refMask, int64_t B, int64_t Hq) {
  if ((m.batch() != 1 && m.batch() != B) || (m.heads() != 1 && m.heads() != Hq))
    throw Error("countAllowedPairs: the mask (" + m.describe() + ") does not fit batch " + std::to_string(B) + " and " +
                std::to_string(Hq) + " query heads");
  double total = 0;
  for (int64_t b = 0; b < m.batch(); ++b)
    for (int64_t h = 0; h < m.heads(); ++h)
      for (int64_t r = 0; r < m.numQBlocks(); ++r) {
        // Global query positions of row block r (a slice's first block may start mid-block).
        const int64_t q0 = std::max(m.qOffset(), m.qOffset() - m.qPhase() + r * m.qBlockSize());
        const int64_t q1 = std::min(m.qOffset() - m.qPhase() + (r + 1) * m.qBlockSize(), m.qOffset() + m.qLen());
        for (int32_t c : m.fullKvBlocks(b, h, r)) {
          const int64_t k0 = c * m.kvBlockSize(), k1 = std::min(k0 + m.kvBlockSize(), m.kvLen());
          total += double(q1 - q0) * double(k1 - k0);
        }
        for (int32_t c : m.partialKvBlocks(b, h, r)) {
          const int64_t k0 = c * m.kvBlockSize(), k1 = std::min(k0 + m.kvBlockSize(), m.kvLen());
          if (!refMask) {
            total += double(q1 - q0) * double(k1 - k0);
            continue;
          }
          for (int64_t i = q0; i < q1; ++i)
            for (int64_t j = k0; j < k1; ++j) total += refMask(b, h, i, j) ? 1 : 0;
        }
      }
  return total * double(B / m.batch()) * double(Hq / m.heads());
}

std::vector<QueryRow> sampleQueryRows(int64_t B, int64_t H, int64_t L, const BlockMask* mask, const RefMaskFn& refMask,
                                      const RowSample& o) {
  std::vector<QueryRow> rows;
  if (B <= 0 || H <= 0 || L <= 0) return rows;
  std::mt19937_64 rng(o.seed);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      rows.push_back({b, h, 0});
      rows.push_back({b, h, L - 1});
      for (int64_t n = 0; n < o.randomPerHead; ++n) rows.push_back({b, h, int64_t(rng() % uint64_t(L))});
    }

  // First rows of blocks: of the kernel's tiles (which start at row 0) and of the mask's blocks
  // (which a one-row slice may enter mid-block: qPhase).
  std::set<int64_t> boundaries;
  if (o.boundaryBlock > 0)
    for (int64_t x = o.boundaryBlock; x < L; x += o.boundaryBlock) boundaries.insert(x);
  if (mask)
    for (int64_t x = mask->qBlockSize() - mask->qPhase(); x < L; x += mask->qBlockSize())
      if (x > 0) boundaries.insert(x);
  const std::vector<int64_t> firstRows(boundaries.begin(), boundaries.end());
  const int64_t heads = B * H, nb = int64_t(firstRows.size());
  for (int64_t t = 0; nb > 0 && t < std::max(nb, heads); ++t) {
    const int64_t x = firstRows[size_t(t % nb)], bh = t % heads;
    rows.push_back({bh / H, bh % H, x - 1});
    rows.push_back({bh / H, bh % H, x});
  }

  // Rows with no allowed key, per (b, h) of the mask (0 on a broadcast dimension).
  if (mask) {
    const int64_t mB = mask->batch(), mH = mask->heads(), nQ = mask->numQBlocks(), BQ = mask->qBlockSize();
    const int64_t BKV = mask->kvBlockSize(), S = mask->kvLen();
    std::vector<std::vector<int64_t>> maskedRows(size_t(mB * mH * nQ));  // per row block, ascending
    parallelFor(maskedRows.size(), threadCount(o.threads, maskedRows.size()), [&](size_t task) {
      const int64_t mb = int64_t(task) / (mH * nQ), mh = int64_t(task) / nQ % mH, r = int64_t(task) % nQ;
      if (!mask->fullKvBlocks(mb, mh, r).empty()) return;  // every row of the block sees its full block
      const std::span<const int32_t> partial = mask->partialKvBlocks(mb, mh, r);
      if (!partial.empty() && !refMask) return;  // cannot tell without the element mask
      for (int64_t i = std::max<int64_t>(0, r * BQ - mask->qPhase()); i < std::min(L, (r + 1) * BQ - mask->qPhase());
           ++i) {
        bool anyKey = false;
        for (size_t c = 0; c < partial.size() && !anyKey; ++c)
          for (int64_t j = int64_t(partial[c]) * BKV; j < std::min(S, (int64_t(partial[c]) + 1) * BKV) && !anyKey; ++j)
            anyKey = refMask(mb, mh, i + mask->qOffset(), j);
        if (!anyKey) maskedRows[task].push_back(i);
      }
    });
    for (int64_t mb = 0; mb < mB; ++mb)
      for (int64_t mh = 0; mh < mH; ++mh) {
        std::vector<int64_t> ends;  // first and last row of each run, up to kMaxMaskedRunsPerHead runs
        int64_t runStart = -1, previous = -2;
        auto closeRun = [&] {
          if (runStart >= 0 && int64_t(ends.size()) < 2 * kMaxMaskedRunsPerHead) ends.insert(ends.end(), {runStart, previous});
        };
        for (int64_t r = 0; r < nQ; ++r)
          for (int64_t i : maskedRows[size_t((mb * mH + mh) * nQ + r)]) {
            if (i != previous + 1) closeRun(), runStart = i;
            previous = i;
          }
        closeRun();
        for (int64_t b = 0; b < B; ++b)
          for (int64_t h = 0; h < H; ++h)
            if ((mB == 1 || b == mb) && (mH == 1 || h == mh))
              for (int64_t i : ends) rows.push_back({b, h, i});
      }
  }
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

ReferenceGrads referenceAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                          const RefScoreFn& score, const RefScoreGradFn& scoreGrad,
                                          const RefMaskFn& mask, double scale, int64_t qOffset,
                                          const std::vector<double>* dlse, const RefScoreGradSink& sink,
                                          const Tensor* out, const std::vector<double>* sinks) {
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  const int64_t DV = v.size(3);  // v's, out's and dout's head dim
  const std::vector<double> qd = toDoubles(q), kd = toDoubles(k), vd = toDoubles(v), dod = toDoubles(dout);
  const std::vector<double> od = out ? toDoubles(*out) : std::vector<double>();
  ReferenceGrads g;
  g.dq.assign(size_t(B * Hq * L * D), 0.0);
  g.dk.assign(size_t(B * Hkv * S * D), 0.0);
  g.dv.assign(size_t(B * Hkv * S * DV), 0.0);
  if (sinks) g.dsinks.assign(size_t(Hq), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / (Hq / Hkv);
      Eigen::Map<const Mat> Q(qd.data() + (b * Hq + h) * L * D, L, D);
      Eigen::Map<const Mat> dO(dod.data() + (b * Hq + h) * L * DV, L, DV);
      Eigen::Map<const Mat> K(kd.data() + (b * Hkv + hk) * S * D, S, D);
      Eigen::Map<const Mat> V(vd.data() + (b * Hkv + hk) * S * DV, S, DV);
      Eigen::Map<Mat> dQ(g.dq.data() + (b * Hq + h) * L * D, L, D);
      Eigen::Map<Mat> dK(g.dk.data() + (b * Hkv + hk) * S * D, S, D);
      Eigen::Map<Mat> dV(g.dv.data() + (b * Hkv + hk) * S * DV, S, DV);
      const Mat s = (Q * K.transpose()) * scale;
      const Mat dP = dO * V.transpose();
      Mat P = Mat::Zero(L, S), dS = Mat::Zero(L, S);
      for (int64_t i = 0; i < L; ++i) {
        double m = -INFINITY;
        std::vector<char> ok(static_cast<size_t>(S));
        for (int64_t j = 0; j < S; ++j) {
          ok[size_t(j)] = !mask || mask(b, h, i + qOffset, j);
          const double x = ok[size_t(j)] ? (score ? score(s(i, j), b, h, i + qOffset, j) : s(i, j)) : -INFINITY;
          P(i, j) = x;
          m = std::max(m, x);
        }
        const double sinkScore = sinks ? (*sinks)[size_t(h)] : -INFINITY;
        m = std::max(m, sinkScore);
        if (m == -INFINITY) {  // no allowed key (and no sink): the row's gradients are 0
          P.row(i).setZero();
          continue;
        }
        double l = sinks ? std::exp(sinkScore - m) : 0.0;
        for (int64_t j = 0; j < S; ++j) l += P(i, j) = ok[size_t(j)] ? std::exp(P(i, j) - m) : 0.0;
        P.row(i) /= l;
        const double pSink = sinks ? std::exp(sinkScore - m) / l : 0.0;
        double delta = 0;
        if (out)
          for (int64_t d = 0; d < DV; ++d)
            delta += od[size_t(((b * Hq + h) * L + i) * DV + d)] * dod[size_t(((b * Hq + h) * L + i) * DV + d)];
        else
          delta = P.row(i).dot(dP.row(i));
        if (dlse) delta -= (*dlse)[size_t((b * Hq + h) * L + i)];
        // The sink's dP is 0 (its value is): dS_sink = p_sink (0 - delta).
        if (sinks) g.dsinks[size_t(h)] -= pSink * delta;
        for (int64_t j = 0; j < S; ++j) {
          if (!ok[size_t(j)]) continue;
          const double gOut = P(i, j) * (dP(i, j) - delta);
          if (sink) sink(gOut, s(i, j), b, h, i + qOffset, j);
          dS(i, j) = gOut * (scoreGrad ? scoreGrad(s(i, j), b, h, i + qOffset, j) : 1.0);
        }
      }
      dQ += scale * dS * K;
      dK += scale * dS.transpose() * Q;
      dV += P.transpose() * dO;
    }
  return g;
}

}  // namespace flextile::attention
