// atomic_add on the GPU, through the DSL (kernel(...).run), with exact
// counts: a histogram of random i32 keys, f32 sums of small integers (exact
// in f32 whatever the order), a scalar ticket from every program (each
// program's threads all see its one old value), and [1, N] / [N, 1] tiles
// whose elements several lanes and warps hold — any replica that adds too
// shows as a count above the number of programs. The interpreter runs the
// same launches and must agree where the order cannot matter.
#include <algorithm>
#include <array>
#include <random>

#include "GpuTest.h"
#include "IrHarness.h"
#include "examples/common.h"
#include "tests/dsl/AtomicKernels.h"

namespace flextile::testing {
namespace {

using examples::fromDevice;
using examples::toDevice;

TEST(AtomicGpu, HistogramOfRandomI32Keys) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  Kernel histogram = atomicHistogram();
  for (int bins : {1, 7, 1000}) {  // 1: every key of every program on one address
    for (int n : {1, 1000, 100003}) {
      std::vector<int32_t> keys(static_cast<size_t>(n)), want(size_t(bins), 0), counts(size_t(bins), 0);
      for (auto& k : keys) ++want[size_t(k = int32_t(rng() % uint64_t(bins)))];
      auto dkeys = toDevice(keys), dcounts = toDevice(counts);
      for (int warps : {1, 4, 8}) {
        dcounts.fillBytes(0);
        histogram.run({{cdiv(n, 512), 1, 1}, {512}, warps}, dkeys, dcounts, n);
        runtime::synchronize();
        fromDevice(dcounts, counts);
        ASSERT_EQ(counts, want) << "bins " << bins << " n " << n << " warps " << warps;
      }
      std::vector<int32_t> interpreted(size_t(bins), 0);
      histogram.interpret({{cdiv(n, 512), 1, 1}, {512}}, keys, interpreted, n);
      ASSERT_EQ(interpreted, want);
    }
  }
}

TEST(AtomicGpu, F32SumsOfSmallIntegersAreExact) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  Kernel sum = atomicBinnedSum();
  const int n = 200001;
  for (int bins : {1, 3, 64}) {
    std::vector<float> values(static_cast<size_t>(n)), want(size_t(bins), 0.0f), sums(size_t(bins), NAN);
    double check = 0;
    for (int i = 0; i < n; ++i) {
      values[size_t(i)] = float(int(rng() % 17) - 8);
      want[size_t(i % bins)] += values[size_t(i)];
      check += values[size_t(i)];
    }
    ASSERT_LT(std::abs(check), double(1 << 24)) << "the test's sums must stay exact in f32";
    auto dvalues = toDevice(values), dsums = toDevice(sums);
    for (int warps : {2, 4}) {
      dsums.fillBytes(0);
      sum.run({{cdiv(n, 1024), 1, 1}, {1024, bins}, warps}, dvalues, dsums, n);
      runtime::synchronize();
      fromDevice(dsums, sums);
      ASSERT_EQ(sums, want) << "bins " << bins << " warps " << warps;
    }
  }
}

TEST(AtomicGpu, AScalarAtomicRunsOncePerProgramAndEveryThreadSeesItsOldValue) {
  FLEXTILE_REQUIRE_GPU();
  Kernel ticket = atomicTicket();
  const int gx = 37, gy = 11, block = 256;
  for (int warps : {1, 4, 8}) {
    std::vector<int32_t> counter{0}, seen(size_t(gx * gy * block), -1);
    auto dcounter = toDevice(counter), dseen = toDevice(seen);
    dseen.fillBytes(0xFF);
    ticket.run({{gx, gy, 1}, {block}, warps}, dcounter, dseen);
    runtime::synchronize();
    fromDevice(dcounter, counter);
    fromDevice(dseen, seen);
    ASSERT_EQ(counter[0], gx * gy) << "warps " << warps << ": more than one thread per program added";
    std::vector<int32_t> tickets;
    for (int p = 0; p < gx * gy; ++p) {
      for (int i = 0; i < block; ++i)
        ASSERT_EQ(seen[size_t(p * block + i)], seen[size_t(p * block)]) << "program " << p << " slot " << i;
      tickets.push_back(seen[size_t(p * block)]);
    }
    std::sort(tickets.begin(), tickets.end());
    for (int p = 0; p < gx * gy; ++p) ASSERT_EQ(tickets[size_t(p)], p) << "warps " << warps;
  }
}

// Release/acquire through fence + ticket: 3000 programs (many waves, so writers and the last
// program run at different times on different SMs) write partials with all of their threads; the
// last sums them. A partial the last program could not see shows as a wrong sum; a counter not
// reset shows in the next launch (nobody, or the wrong program, sums). Launch after launch on one
// counter, which the host never clears.
TEST(AtomicGpu, TheLastProgramThroughAFenceSeesEveryProgramsWrites) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  Kernel lastSum = fencedLastProgramSum();
  const int programs = 3000, block = 256;
  std::vector<int32_t> zero{0};
  auto dcounter = toDevice(zero), dlast = toDevice(zero);
  auto dpartials = toDevice(std::vector<int32_t>(size_t(programs * block), 0));
  for (int warps : {1, 4, 8})
    for (int launch = 0; launch < 10; ++launch) {
      std::vector<int32_t> in(size_t(programs * block)), sums(size_t(block), 0), want(size_t(block), 0);
      for (size_t i = 0; i < in.size(); ++i) want[i % size_t(block)] += 3 * (in[i] = int32_t(rng() % 2001) - 1000);
      auto din = toDevice(in), dsums = toDevice(sums);
      dsums.fillBytes(0xFF);
      lastSum.run({{programs, 1, 1}, {block}, warps}, din, dpartials, dcounter, dsums, dlast);
      runtime::synchronize();
      std::vector<int32_t> counter{-1}, last{-1};
      fromDevice(dsums, sums);
      fromDevice(dcounter, counter);
      fromDevice(dlast, last);
      ASSERT_EQ(sums, want) << "warps " << warps << " launch " << launch;
      ASSERT_EQ(counter[0], 0) << "warps " << warps << " launch " << launch;
      ASSERT_TRUE(last[0] >= 0 && last[0] < programs) << last[0];
    }
}

// The same hand-off through tagged words: no fence, a relaxed ticket, and the last program waits for
// every word of every program (3001 programs, many waves: some writers have long finished, others
// are still running when it starts waiting). The words stay between launches with the previous
// launch's tag and values, so a word taken before it arrived shows as a wrong sum.
TEST(AtomicGpu, TheLastProgramWaitsForEveryProgramsTaggedWords) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  Kernel lastSum = taggedLastProgramSum();
  const int programs = 3001, block = 256;  // odd: pairs of programs a wait, then the last alone
  std::vector<int32_t> zero{0};
  auto dcounter = toDevice(zero);
  auto dwords = toDevice(std::vector<int64_t>(size_t(programs * block), 0));
  int tag = 0;
  for (int warps : {1, 4, 8})
    for (int launch = 0; launch < 10; ++launch) {
      std::vector<float> in(size_t(programs * block)), sums(size_t(block), 0.0f), want(size_t(block), 0.0f);
      for (size_t i = 0; i < in.size(); ++i) want[i % size_t(block)] += 3 * (in[i] = float(int(rng() % 21) - 10));
      auto din = toDevice(in), dsums = toDevice(sums);
      dsums.fillBytes(0xFF);
      lastSum.run({{programs, 1, 1}, {block}, warps}, din, dwords, dcounter, dsums, ++tag);
      runtime::synchronize();
      std::vector<int32_t> counter{-1};
      fromDevice(dsums, sums);
      fromDevice(dcounter, counter);
      ASSERT_EQ(sums, want) << "warps " << warps << " launch " << launch;
      ASSERT_EQ(counter[0], 0) << "warps " << warps << " launch " << launch;
    }
}

TEST(AtomicGpu, ReplicatedRowsAndColumnsAddOncePerElement) {
  FLEXTILE_REQUIRE_GPU();
  Kernel replicated = atomicReplicated();
  const int programs = 293;
  for (int row : {1, 0}) {
    for (int N : {1, 8, 16, 64}) {  // all smaller than 4 or 8 warps of 32 lanes: replicated lanes and warps
      for (int warps : {1, 4, 8}) {
        SCOPED_TRACE((row ? "[1, " : "[") + std::to_string(N) + (row ? "]" : ", 1]") + ", warps " +
                     std::to_string(warps));
        const int live = std::max(1, N - 3);
        std::vector<float> acc(size_t(N), 0.0f), old(size_t(programs * N), NAN);
        auto dacc = toDevice(acc), dold = toDevice(old);
        dold.fillBytes(0xFF);
        replicated.run({{programs, 1, 1}, {N, row}, warps}, dacc, dold, live);
        runtime::synchronize();
        fromDevice(dacc, acc);
        fromDevice(dold, old);
        for (int j = 0; j < N; ++j) {
          ASSERT_EQ(acc[size_t(j)], j < live ? float(programs) : 0.0f) << "element " << j;
          // The old values of element j over the programs: 0..programs-1 once each (0 where masked).
          std::vector<float> seen;
          for (int p = 0; p < programs; ++p) seen.push_back(old[size_t(p * N + j)]);
          std::sort(seen.begin(), seen.end());
          for (int p = 0; p < programs; ++p) ASSERT_EQ(seen[size_t(p)], j < live ? float(p) : 0.0f) << "element " << j;
        }
      }
    }
  }
}

// atomic_add of whole rows (the bulk-reduce pass: one cp.reduce.async.bulk per row on sm_90, or, the
// tile named as a tensor box, TMA reductions of its panels on sm_90a) against the same sums on the
// host, exact: rows shared by several programs and by consecutive steps of one loop (the staging
// scratch reused), masked rows past the end (clipped by the tensor map for a box), a blocked layout
// (loaded values) and an mma/wgmma accumulator (DOT), and the per-element atomics
// (FLEXTILE_BULK_REDUCE=0) for the same launch.
TEST(AtomicGpu, WholeRowsAddOncePerElement) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  Kernel rowSums = atomicRowSums();
  for (int dotTile : {0, 1}) {
    for (auto [BM, W, warps] : std::vector<std::array<int, 3>>{{64, 128, 4}, {16, 32, 1}, {128, 64, 8}}) {
      for (auto [bulk, box] : std::vector<std::pair<bool, int>>{{true, 0}, {false, 0}, {true, 1}}) {
        ScopedSetenv env("FLEXTILE_BULK_REDUCE", bulk ? "1" : "0");
        const int programs = 37, steps = 3, rows = (programs + steps) * BM / 2 - BM / 3;  // the last rows masked
        SCOPED_TRACE("BM " + std::to_string(BM) + " W " + std::to_string(W) + " warps " + std::to_string(warps) +
                     (dotTile ? " dot" : " loaded") + (bulk ? " bulk" : " per element") + (box ? " box" : ""));
        std::vector<float> values(size_t(programs * steps * BM * W));
        for (float& x : values) x = float(int(rng() % 9) - 4);
        std::vector<double> want(size_t(rows * W), 0.0);
        for (int p = 0; p < programs; ++p)
          for (int st = 0; st < steps; ++st)
            for (int i = 0; i < BM; ++i) {
              const int row = (p + st) * (BM / 2) + i;
              if (row >= rows) continue;
              for (int j = 0; j < W; ++j)
                want[size_t(row * W + j)] += values[size_t(((p * steps + st) * BM + i) * W + (dotTile ? j % 16 : j))];
            }
        std::vector<float> acc(size_t(rows * W), 0.0f);
        auto dvalues = toDevice(values), dacc = toDevice(acc);
        const LaunchOptions launch{{programs, 1, 1}, {BM, W, dotTile, box}, warps};
        const std::string ptx = rowSums.compile(launch, {dvalues, dacc, rows, steps}).ptx;
        EXPECT_EQ(ptx.find("cp.reduce.async.bulk") != std::string::npos, bulk && currentTarget().has(codegen::Feature::BulkReduce));
        EXPECT_EQ(ptx.find("cp.reduce.async.bulk.tensor") != std::string::npos,
                  box && currentTarget().has(codegen::Feature::TensorMemoryAccelerator));
        rowSums.run(launch, dvalues, dacc, rows, steps);
        runtime::synchronize();
        fromDevice(dacc, acc);
        for (size_t e = 0; e < acc.size(); ++e) ASSERT_EQ(double(acc[e]), want[e]) << "row " << e / size_t(W) << " column " << e % size_t(W);
      }
    }
  }
}

}  // namespace
}  // namespace flextile::testing
