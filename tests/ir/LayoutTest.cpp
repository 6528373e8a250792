// Host tests of the layout algebra (ir/Layout.h): every layout the
// constructors make is a valid distribution of the tile over threads, and the
// derived layouts (sliced, expanded, projected, reshaped, transposed) agree
// element by element with the layout they come from.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "ir/IR.h"
#include "ir/Layout.h"

namespace flextile::ir {
namespace {

using Coord = Layout::Coord;

struct Rng {
  unsigned seed = std::random_device{}();
  std::mt19937 gen{seed};
  int64_t pow2(int lo, int hi) { return int64_t(1) << std::uniform_int_distribution<int>(lo, hi)(gen); }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
};

// A random power-of-two shape of the given rank with at most 2^maxBits elements.
Shape randomShape(Rng& rng, int rank, int maxBits = 13) {
  Shape s;
  int left = maxBits;
  for (int d = 0; d < rank; ++d) {
    int bits = rng.uniform(0, std::min(left, 7));
    left -= bits;
    s.push_back(int64_t(1) << bits);
  }
  return s;
}

int log2i(int64_t v) {
  int k = 0;
  while ((int64_t(1) << k) < v) ++k;
  return k;
}

// The distribution rules: coordinates inside the tile, every element held,
// no thread holding an element twice, and holders of one element differing
// exactly in the replicated lane/warp bits.
void expectValidDistribution(const Layout& l, const std::string& what) {
  SCOPED_TRACE(what + ": " + l.str());
  ASSERT_EQ(l.verify(), "");
  std::map<Coord, std::vector<std::pair<int, int>>> holders;
  for (int w = 0; w < l.numWarps(); ++w)
    for (int lane = 0; lane < 32; ++lane) {
      std::set<Coord> mine;
      for (int64_t r = 0; r < l.numRegisters(); ++r) {
        Coord c = l.apply(r, lane, w);
        ASSERT_EQ(c.size(), l.shape().size());
        for (size_t d = 0; d < c.size(); ++d) ASSERT_TRUE(c[d] >= 0 && c[d] < l.shape()[d]);
        ASSERT_TRUE(mine.insert(c).second) << "thread (" << lane << "," << w << ") holds an element twice";
        holders[c].push_back({lane, w});
      }
    }
  ASSERT_EQ(int64_t(holders.size()), numElements(l.shape())) << "not every element is held";
  uint32_t repLane = l.replicatedLaneMask(), repWarp = l.replicatedWarpMask();
  size_t copies = size_t(1) << (__builtin_popcount(repLane) + __builtin_popcount(repWarp));
  for (const auto& [c, hs] : holders) {
    ASSERT_EQ(hs.size(), copies);
    for (const auto& [lane, w] : hs) {
      EXPECT_EQ(uint32_t(lane ^ hs[0].first) & ~repLane, 0u);
      EXPECT_EQ(uint32_t(w ^ hs[0].second) & ~repWarp, 0u);
    }
  }
  // registerOf inverts the register part.
  for (int64_t r = 0; r < l.numRegisters(); ++r) ASSERT_EQ(l.registerOf(l.regCoord(r)), r);
}

TEST(Layout, DefaultBlockedIsAValidDistributionForRanks1To3AndWarps1To16) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int rank = 1; rank <= 3; ++rank)
    for (int warps = 1; warps <= 16; warps *= 2)
      for (int trial = 0; trial < 6; ++trial) {
        Shape s = randomShape(rng, rank);
        int64_t vector = rng.pow2(0, 3);
        Layout l = Layout::defaultBlocked(s, warps, vector);
        EXPECT_EQ(l.shape(), s);
        EXPECT_EQ(l.numWarps(), warps);
        EXPECT_GE(l.contiguousRegisters(rank - 1), std::min(vector, s.back()));
        expectValidDistribution(l, "defaultBlocked " + shapeString(s) + " warps " + std::to_string(warps) + " vector " +
                                       std::to_string(vector));
      }
}

TEST(Layout, DefaultBlockedMatchesTheDocumentedExample) {
  Layout l = Layout::defaultBlocked({64, 64}, 4, 4);
  EXPECT_EQ(l.str(),
            "#ft.linear<[64,64], reg=[[0,1], [0,2], [8,0], [16,0], [32,0]], lane=[[0,4], [0,8], [0,16], [0,32], [1,0]], "
            "warp=[[2,0], [4,0]]>");
}

TEST(Layout, BlockedPlacesEachElementWhereTritonsBlockedEncodingDoes) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 40; ++trial) {
    int rank = rng.uniform(1, 3);
    std::vector<int64_t> spt(rank), tpw(rank, 1), wpc(rank, 1);
    for (auto& v : spt) v = rng.pow2(0, 2);
    for (int lanesLeft = 5; lanesLeft > 0; --lanesLeft) tpw[rng.uniform(0, rank - 1)] *= 2;
    int warps = int(rng.pow2(0, 3));
    for (int k = 1; k < warps; k *= 2) wpc[rng.uniform(0, rank - 1)] *= 2;
    std::vector<int> order(rank);
    for (int i = 0; i < rank; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng.gen);
    Shape s(rank);
    for (int d = 0; d < rank; ++d) s[d] = spt[d] * tpw[d] * wpc[d] * rng.pow2(0, 1);  // no replication
    Layout l = Layout::blocked(s, spt, tpw, wpc, order);
    SCOPED_TRACE(l.str());
    ASSERT_EQ(l.verify(), "");
    // Lane and warp ids split into per-dimension parts, fastest dimension (order[0]) first.
    auto split = [&](int id, const std::vector<int64_t>& radix) {
      std::vector<int64_t> part(rank);
      for (int d : order) {
        part[d] = id % radix[d];
        id /= int(radix[d]);
      }
      return part;
    };
    for (int w = 0; w < warps; ++w)
      for (int lane = 0; lane < 32; ++lane) {
        auto lp = split(lane, tpw), wp = split(w, wpc);
        std::set<Coord> expected;
        // Element c belongs to this thread iff each coordinate's lane and warp parts match.
        std::function<void(int, Coord&)> enumerate = [&](int d, Coord& c) {
          if (d == rank) {
            expected.insert(c);
            return;
          }
          for (int64_t x = 0; x < s[d]; ++x)
            if ((x / spt[d]) % tpw[d] == lp[d] && (x / (spt[d] * tpw[d])) % wpc[d] == wp[d]) {
              c[d] = x;
              enumerate(d + 1, c);
            }
        };
        Coord c(rank);
        enumerate(0, c);
        std::set<Coord> got;
        for (int64_t r = 0; r < l.numRegisters(); ++r) got.insert(l.apply(r, lane, w));
        ASSERT_EQ(got, expected) << "lane " << lane << " warp " << w;
      }
  }
}

// Random valid layouts for the derived-layout tests: blocked ones with random
// parameters, including replication (tiles smaller than the thread pattern).
Layout randomLayout(Rng& rng, int rank, int warps) {
  Shape s = randomShape(rng, rank, 12);
  if (rng.uniform(0, 1)) return Layout::defaultBlocked(s, warps, rng.pow2(0, 2));
  std::vector<int64_t> spt(rank), tpw(rank, 1), wpc(rank, 1);
  for (auto& v : spt) v = rng.pow2(0, 2);
  for (int k = 0; k < 5; ++k) tpw[rng.uniform(0, rank - 1)] *= 2;
  for (int k = 1; k < warps; k *= 2) wpc[rng.uniform(0, rank - 1)] *= 2;
  std::vector<int> order(rank);
  for (int i = 0; i < rank; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng.gen);
  return Layout::blocked(s, spt, tpw, wpc, order);
}

TEST(Layout, RandomBlockedLayoutsAreValidDistributions) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 30; ++trial) {
    Layout l = randomLayout(rng, rng.uniform(1, 3), int(rng.pow2(0, 3)));
    expectValidDistribution(l, "random blocked");
  }
}

std::set<Coord> threadElements(const Layout& l, int lane, int w) {
  std::set<Coord> out;
  for (int64_t r = 0; r < l.numRegisters(); ++r) out.insert(l.apply(r, lane, w));
  return out;
}

TEST(Layout, SlicedDropsTheAxisFromEveryCoordinate) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 30; ++trial) {
    int rank = rng.uniform(2, 3);
    Layout parent = randomLayout(rng, rank, int(rng.pow2(0, 3)));
    int axis = rng.uniform(0, rank - 1);
    Layout s = parent.sliced(axis);
    SCOPED_TRACE(parent.str() + " sliced at " + std::to_string(axis));
    expectValidDistribution(s, "sliced");
    for (int w = 0; w < parent.numWarps(); ++w)
      for (int lane = 0; lane < 32; ++lane) {
        Coord base = parent.apply(0, lane, w);
        base.erase(base.begin() + axis);
        ASSERT_EQ(s.apply(0, lane, w), base);
        std::set<Coord> dropped;
        for (Coord c : threadElements(parent, lane, w)) {
          c.erase(c.begin() + axis);
          dropped.insert(c);
        }
        ASSERT_EQ(threadElements(s, lane, w), dropped) << "lane " << lane << " warp " << w;
      }
  }
}

TEST(Layout, ExpandedInsertsAZeroCoordinate) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 20; ++trial) {
    int rank = rng.uniform(1, 2);
    Layout parent = randomLayout(rng, rank, int(rng.pow2(0, 3)));
    int axis = rng.uniform(0, rank);
    Layout e = parent.expanded(axis);
    SCOPED_TRACE(parent.str() + " expanded at " + std::to_string(axis));
    expectValidDistribution(e, "expanded");
    EXPECT_EQ(e.sliced(axis), parent);
    for (int w = 0; w < parent.numWarps(); ++w)
      for (int lane = 0; lane < 32; ++lane)
        for (int64_t r = 0; r < parent.numRegisters(); ++r) {
          Coord c = parent.apply(r, lane, w);
          c.insert(c.begin() + axis, 0);
          ASSERT_EQ(e.apply(r, lane, w), c);
        }
  }
}

TEST(Layout, ProjectedIsWhatEachThreadNeedsOfABroadcastOperand) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 30; ++trial) {
    int rank = rng.uniform(1, 3);
    Layout full = randomLayout(rng, rank, int(rng.pow2(0, 3)));
    Shape smaller = full.shape();
    for (auto& d : smaller)
      if (rng.uniform(0, 1)) d = 1;
    Layout p = full.projected(smaller);
    SCOPED_TRACE(full.str() + " projected to " + shapeString(smaller));
    expectValidDistribution(p, "projected");
    for (int w = 0; w < full.numWarps(); ++w)
      for (int lane = 0; lane < 32; ++lane) {
        std::set<Coord> needed;
        for (Coord c : threadElements(full, lane, w)) {
          for (size_t d = 0; d < c.size(); ++d)
            if (smaller[d] == 1) c[d] = 0;
          needed.insert(c);
        }
        ASSERT_EQ(threadElements(p, lane, w), needed) << "lane " << lane << " warp " << w;
      }
  }
}

uint64_t flatIndex(const Shape& s, const Coord& c) {
  uint64_t i = 0;
  for (size_t d = 0; d < s.size(); ++d) i = i * uint64_t(s[d]) + uint64_t(c[d]);
  return i;
}

TEST(Layout, ReshapedKeepsEveryElementsRowMajorIndex) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 30; ++trial) {
    Layout l = randomLayout(rng, rng.uniform(1, 3), int(rng.pow2(0, 3)));
    // A random shape with the same number of elements: redistribute the bits.
    int bits = log2i(numElements(l.shape()));
    int rank = rng.uniform(1, 3);
    Shape s(rank, 1);
    for (int b = 0; b < bits; ++b) s[rng.uniform(0, rank - 1)] *= 2;
    Layout r = l.reshaped(s);
    SCOPED_TRACE(l.str() + " reshaped to " + shapeString(s));
    expectValidDistribution(r, "reshaped");
    for (int w = 0; w < l.numWarps(); ++w)
      for (int lane = 0; lane < 32; ++lane)
        for (int64_t reg = 0; reg < l.numRegisters(); ++reg)
          ASSERT_EQ(flatIndex(s, r.apply(reg, lane, w)), flatIndex(l.shape(), l.apply(reg, lane, w)));
  }
}

TEST(Layout, TransposedPermutesEveryCoordinate) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 30; ++trial) {
    int rank = rng.uniform(1, 3);
    Layout l = randomLayout(rng, rank, int(rng.pow2(0, 3)));
    std::vector<int> perm(rank);
    for (int i = 0; i < rank; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    Layout t = l.transposed(perm);
    expectValidDistribution(t, "transposed");
    for (int w = 0; w < l.numWarps(); ++w)
      for (int lane = 0; lane < 32; ++lane)
        for (int64_t reg = 0; reg < l.numRegisters(); ++reg) {
          Coord c = l.apply(reg, lane, w), want(rank);
          for (int i = 0; i < rank; ++i) want[i] = c[perm[i]];
          ASSERT_EQ(t.apply(reg, lane, w), want);
        }
    std::vector<int> inverse(rank);
    for (int i = 0; i < rank; ++i) inverse[perm[i]] = i;
    EXPECT_EQ(t.transposed(inverse), l);
  }
}

TEST(Layout, ParsePrintRoundTrip) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed));
  for (int trial = 0; trial < 30; ++trial) {
    Layout l = randomLayout(rng, rng.uniform(1, 3), int(rng.pow2(0, 4)));
    Layout back = Layout::parse(l.str());
    EXPECT_EQ(back, l);
    EXPECT_EQ(back.str(), l.str());
  }
  // Whitespace is free.
  EXPECT_EQ(Layout::parse("#ft.linear< [ 4 ] , reg = [ [1] , [2] ] , lane = [[0],[0],[0],[0],[0]] , warp = [ ] >"),
            Layout({4}, {{1}, {2}}, {{0}, {0}, {0}, {0}, {0}}, {}));
}

TEST(Layout, VerifyRejectsBrokenLayouts) {
  const Layout::Bases lanes = {{1}, {2}, {4}, {8}, {16}};
  auto rejects = [](const Layout& l, const std::string& words) {
    std::string e = l.verify();
    EXPECT_NE(e.find(words), std::string::npos) << "verify() said '" << e << "' for " << l.str();
  };
  EXPECT_EQ(Layout({32}, {}, lanes, {}).verify(), "");
  rejects(Layout({48}, {}, lanes, {}), "not a power of two");
  rejects(Layout({32}, {}, {{1}, {2}, {4}, {8}}, {}), "expected 5 lane bases");
  rejects(Layout({64}, {{0}}, lanes, {{32}}), "zero or dependent");
  rejects(Layout({128}, {{32}, {32}}, lanes, {{64}}), "zero or dependent");
  rejects(Layout({64}, {{64}}, lanes, {}), "outside the tile");
  rejects(Layout({64}, {{32, 0}}, lanes, {}), "wrong rank");
  rejects(Layout({64}, {{32}}, lanes, {{16}}), "dependent");
  rejects(Layout({64}, {}, lanes, {}), "does not cover");
  EXPECT_THROW(Layout::parse("#ft.linear<[64], reg=[], lane=[[1],[2],[4],[8],[16]], warp=[]>"), Error);
  EXPECT_THROW(Layout::parse("#ft.linear<[64], reg=[[32]], lane=[[1],[2],[4],[8],[16]]>"), Error);
  EXPECT_THROW(Layout::parse("#ft.linear<[64], reg=[[x]]"), Error);
}

TEST(Layout, ReplicationMasksNameTheZeroBases) {
  // An 8-element tile over 32 lanes and 2 warps: lanes 8..31 and the warp repeat data.
  Layout l = Layout::defaultBlocked({8}, 2);
  EXPECT_EQ(l.replicatedLaneMask(), 0b11000u);
  EXPECT_EQ(l.replicatedWarpMask(), 0b1u);
  expectValidDistribution(l, "replicated");
}

TEST(Layout, RegisterOfIsSafeFromSeveralThreads) {
  // Layouts are shared (shared_ptr<const Layout>) between clones of a function
  // that the autotuner compiles in parallel, so const methods must be thread-safe.
  auto l = makeLayout(Layout::defaultBlocked({128, 128}, 4, 4));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int64_t r = 0; r < l->numRegisters(); ++r)
        if (l->registerOf(l->regCoord(r)) != r) ++wrong;
      if (l->registerOf({1, 0}) != -1) ++wrong;  // held by warp 1, not by a register of thread 0
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Regression: these used to index out of bounds (a scalar) or build garbage
// silently (malformed blocked parameters); now they are errors that say why.
TEST(Layout, MalformedConstructorArgumentsAreErrors) {
  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message([] { Layout::defaultBlocked({}, 4); }).find("a scalar has no layout"), std::string::npos);
  EXPECT_NE(message([] { Layout::defaultBlocked({64}, 3); }).find("must be powers of two"), std::string::npos);
  EXPECT_NE(message([] { Layout::blocked({64}, {1}, {16}, {1}, {0}); }).find("threadsPerWarp must multiply to 32, got 16"),
            std::string::npos);
  EXPECT_NE(message([] { Layout::blocked({64, 4}, {1}, {32}, {1}, {0}); }).find("one entry per dimension"),
            std::string::npos);
  EXPECT_NE(message([] { Layout::blocked({64, 4}, {1, 1}, {32, 1}, {1, 1}, {0, 0}); }).find("not a permutation"),
            std::string::npos);
  EXPECT_NE(message([] { Layout::blocked({48}, {1}, {32}, {1}, {0}); }).find("powers of two"), std::string::npos);
}

}  // namespace
}  // namespace flextile::ir
