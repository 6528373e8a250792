// Mask and score mods: each standard mod, run through the interpreter on whole
// tiles, equals an independent C++ definition; the algebra composes; mods run
// inside a run-time KV loop with captured tensors the way the forward template
// will call them; mistakes are reported with the mod's name.
#include <gtest/gtest.h>

#include <cmath>

#include "attention_templates/Mods.h"
#include "gpu/GpuTest.h"
#include "MaskTestUtil.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
using flextile::testing::expectError;
using flextile::testing::RefMask;
using flextile::testing::SeededRandom;
namespace ft = flextile::testing;

namespace {

constexpr int64_t kTile = 32;

// mask_mod over the whole [B, H, Q, KV] plane, [kTile, kTile] tiles per
// program, through the interpreter.
std::vector<uint8_t> evaluateMask(const MaskMod& mod, int64_t B, int64_t H, int64_t Q, int64_t KV) {
  Kernel k = kernel("evaluate_mask", [mod](Ptr<i8> out, Int Hn, Int Qn, Int KVn, Const<int> T) {
    auto bh = program_id(2);
    auto q = (program_id(0) * T + arange(0, T)).expand(1);
    auto kv = (program_id(1) * T + arange(0, T)).expand(0);
    auto in = (q < Qn) & (kv < KVn);
    store(out + (bh * Qn + q) * KVn + kv, mod(bh / Hn, bh % Hn, q, kv), in);
  });
  std::vector<uint8_t> out(size_t(B * H * Q * KV), 7);
  k.interpret({.grid = {cdiv(Q, kTile), cdiv(KV, kTile), B * H}, .constants = {kTile}}, out, H, Q, KV);
  return out;
}

void expectMaskEquals(const MaskMod& mod, const RefMask& ref, int64_t B, int64_t H, int64_t Q, int64_t KV) {
  auto got = evaluateMask(mod, B, H, Q, KV);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Q; ++i)
        for (int64_t j = 0; j < KV; ++j) {
          uint8_t g = got[size_t(((b * H + h) * Q + i) * KV + j)];
          if (g != uint8_t(ref(b, h, i, j))) {
            ADD_FAILURE() << mod.name() << " at (b " << b << ", h " << h << ", q " << i << ", kv " << j << "): got "
                          << int(g) << ", want " << ref(b, h, i, j);
            return;
          }
        }
}

std::vector<int64_t> randomOffsets(std::mt19937_64& rng, int64_t L, int maxDocs) {
  std::vector<int64_t> o{0};
  int docs = 1 + int(rng() % uint64_t(maxDocs));
  for (int d = 1; d < docs; ++d) o.push_back(1 + int64_t(rng() % uint64_t(std::max<int64_t>(L - 1, 1))));
  o.push_back(L);
  std::sort(o.begin(), o.end());
  o.erase(std::unique(o.begin(), o.end()), o.end());
  return o;
}

TEST(Mods, StandardMasksMatchTheirDefinitions) {
  SeededRandom rng;
  const int64_t Q = 45 + int64_t(rng() % 40), KV = 30 + int64_t(rng() % 60);
  expectMaskEquals(causal_mask(), ft::refCausal(), 1, 1, Q, KV);
  expectMaskEquals(noop_mask(), [](auto...) { return true; }, 1, 1, Q, KV);
  int64_t w = 1 + int64_t(rng() % 20), p = int64_t(rng() % 50);
  expectMaskEquals(sliding_window_mask(w), ft::refWindow({w}), 1, 1, Q, KV);
  expectMaskEquals(prefix_lm_mask(p), ft::refPrefix(p), 1, 1, Q, KV);
  // Per-head windows, captured.
  std::vector<int32_t> windows{1, int32_t(2 + rng() % 30), int32_t(1 + rng() % 90)};
  auto wTensor = capture(Tensor::fromHost(windows, {3}), "window");
  expectMaskEquals(sliding_window_mask(wTensor), ft::refWindow({windows[0], windows[1], windows[2]}), 2, 3, Q, KV);
  // Documents from ids [L] and [B, L], and from offsets.
  const int64_t L = std::max(Q, KV);
  std::vector<std::vector<int32_t>> ids;
  std::vector<int32_t> flat;
  std::vector<std::vector<int64_t>> offsets;
  for (int b = 0; b < 2; ++b) {
    offsets.push_back(randomOffsets(rng, L, 6));
    ids.push_back(ft::idsFromOffsets(offsets.back(), L));
    flat.insert(flat.end(), ids.back().begin(), ids.back().end());
  }
  expectMaskEquals(document_mask(capture(Tensor::fromHost(ids[0], {L}), "ids")), ft::refDocuments({ids[0]}), 2, 1, Q, KV);
  expectMaskEquals(document_mask(capture(Tensor::fromHost(flat, {2, L}), "ids")), ft::refDocuments(ids), 2, 2, Q, KV);
  std::vector<int32_t> o32(offsets[1].begin(), offsets[1].end());
  expectMaskEquals(document_mask_from_offsets(capture(Tensor::fromHost(o32, {int64_t(o32.size())}), "offsets")),
                   ft::refDocuments({ids[1]}), 1, 1, Q, KV);
}

TEST(Mods, AlgebraOnRandomCombinations) {
  SeededRandom rng;
  const int64_t Q = 70, KV = 53;
  std::vector<int32_t> ids = ft::idsFromOffsets(randomOffsets(rng, 70, 5), 70);
  auto idTensor = capture(Tensor::fromHost(ids, {70}), "ids");
  for (int trial = 0; trial < 12; ++trial) {
    // A random expression tree of depth up to 3 over the standard masks.
    std::function<std::pair<MaskMod, RefMask>(int)> make = [&](int depth) -> std::pair<MaskMod, RefMask> {
      int pick = int(rng() % (depth >= 2 ? 5 : 8));
      int64_t w = 1 + int64_t(rng() % 30), p = int64_t(rng() % 40);
      switch (pick) {
        case 0: return {causal_mask(), ft::refCausal()};
        case 1: return {sliding_window_mask(w), ft::refWindow({w})};
        case 2: return {prefix_lm_mask(p), ft::refPrefix(p)};
        case 3: return {document_mask(idTensor), ft::refDocuments({ids})};
        case 4: return {noop_mask(), [](auto...) { return true; }};
        case 5: {
          auto [m, r] = make(depth + 1);
          return {not_mask(m), ft::refNot(r)};
        }
        default: {
          auto [a, ra] = make(depth + 1);
          auto [b, rb] = make(depth + 1);
          if (pick == 6) return {and_masks(a, b), ft::refAnd(ra, rb)};
          return {or_masks(a, b), ft::refOr(ra, rb)};
        }
      }
    };
    auto [mod, ref] = make(0);
    SCOPED_TRACE(mod.name());
    expectMaskEquals(mod, ref, 1, 1, Q, KV);
  }
  // Identities of the algebra.
  expectMaskEquals(and_masks({}), [](auto...) { return true; }, 1, 1, 9, 9);
  expectMaskEquals(or_masks({}), [](auto...) { return false; }, 1, 1, 9, 9);
  auto three = and_masks({causal_mask(), sliding_window_mask(5), document_mask(idTensor)});
  EXPECT_EQ(three.name(), "and(causal, sliding_window(5), document(ids))");
  EXPECT_EQ(three.captures().size(), 1u);
  EXPECT_EQ(and_masks(three, document_mask(idTensor)).captures().size(), 1u);  // one capture, merged
}

// score_mod applied to a score tile: out = mod(score, b, h, q, kv).
std::vector<float> applyScore(const ScoreMod& mod, const std::vector<float>& score, int64_t b, int64_t h, int64_t Q,
                              int64_t KV) {
  Kernel k = kernel("apply_score", [mod](Ptr<f32> s, Ptr<f32> out, Int bn, Int hn, Int Qn, Int KVn, Const<int> T) {
    auto q = arange(0, T).expand(1), kv = arange(0, T).expand(0);
    auto in = (q < Qn) & (kv < KVn);
    store(out + q * KVn + kv, mod(load(s + q * KVn + kv, in), bn, hn, q, kv), in);
  });
  std::vector<float> in = score, out(score.size(), NAN);
  k.interpret({.constants = {64}}, in, out, b, h, Q, KV);
  return out;
}

TEST(Mods, ScoreModsMatchTheirDefinitions) {
  SeededRandom rng;
  const int64_t Q = 37, KV = 50, H = 4;
  std::vector<float> score(size_t(Q * KV));
  for (auto& s : score) s = std::uniform_real_distribution<float>(-60, 60)(rng);
  auto near = [](double got, double want, double tol) { return std::abs(got - want) <= tol * (1 + std::abs(want)); };
  auto check = [&](const ScoreMod& mod, int64_t b, int64_t h, const std::function<double(double, int64_t, int64_t)>& ref,
                   double tol) {
    auto out = applyScore(mod, score, b, h, Q, KV);
    for (int64_t i = 0; i < Q; ++i)
      for (int64_t j = 0; j < KV; ++j) {
        double got = out[size_t(i * KV + j)], want = ref(score[size_t(i * KV + j)], i, j);
        if (!near(got, want, tol)) {
          ADD_FAILURE() << mod.name() << " at (" << i << ", " << j << "): got " << got << ", want " << want;
          return;
        }
      }
  };
  check(noop_score(), 0, 0, [](double s, int64_t, int64_t) { return s; }, 0);
  const double cap = 5 + double(rng() % 30);
  check(soft_cap(cap), 0, 0, [cap](double s, int64_t, int64_t) { return cap * std::tanh(s / cap); }, 1e-6);
  std::vector<float> slopes(H);
  for (auto& s : slopes) s = std::uniform_real_distribution<float>(0.01f, 1)(rng);
  auto slopeTensor = capture(Tensor::fromHost(slopes, {H}), "slopes");
  const int64_t h = int64_t(rng() % uint64_t(H));
  // In f32 like the kernel (score + slope * distance cancels: compare the same roundings).
  check(alibi(slopeTensor), 0, h,
        [&](double s, int64_t i, int64_t j) {
          float bias = slopes[size_t(h)] * float(j - i);
          return double(float(s) + bias);
        },
        1e-6);
  // Bias tables of rank 2 and 3.
  std::vector<float> table(size_t(H * Q * KV));
  for (auto& t : table) t = std::uniform_real_distribution<float>(-3, 3)(rng);
  check(bias_table(capture(Tensor::fromHost(table, {H, Q, KV}), "bias")), 1, h,
        [&](double s, int64_t i, int64_t j) { return double(float(s + table[size_t((h * Q + i) * KV + j)])); }, 1e-7);
  std::vector<float> table2(table.begin(), table.begin() + Q * KV);
  check(bias_table(capture(Tensor::fromHost(table2, {Q, KV}), "bias2")), 1, h,
        [&](double s, int64_t i, int64_t j) { return double(float(s + table2[size_t(i * KV + j)])); }, 1e-7);
}

// The forward template's shape: per program one query tile, a run-time loop
// over KV tiles, score_mod then mask_mod on [BM, BN] with q_idx [BM, 1] and
// kv_idx [1, BN], both reading captured tensors. Here the loop counts allowed
// pairs and sums modified scores (score = 0) per query.
TEST(Mods, ModsInsideARunTimeLoopWithCapturedTensors) {
  SeededRandom rng;
  const int64_t H = 3, Q = 70, KV = 90, L = 90;
  std::vector<int32_t> ids = ft::idsFromOffsets(randomOffsets(rng, L, 6), L);
  std::vector<float> slopes{0.5f, 0.25f, 0.125f};
  MaskMod mask = and_masks(causal_mask(), document_mask(capture(Tensor::fromHost(ids, {L}), "ids")));
  ScoreMod score = alibi(capture(Tensor::fromHost(slopes, {H}), "slopes"));
  Kernel k = kernel("kv_loop", [mask, score](Ptr<i32> count, Ptr<f32> total, Int Qn, Int KVn, Int Hn, Const<int> BM,
                                             Const<int> BN) {
    auto h = program_id(1);
    auto q = (program_id(0) * BM + arange(0, BM)).expand(1);
    auto [n, s] = for_range(0, KVn, BN, std::tuple{zeros({BM}, DType::I32), zeros({BM}, DType::F32)},
                            [&](Tile start, Tile n, Tile s) {
                              auto kv = (start + arange(0, BN)).expand(0);
                              auto b = scalar(0, DType::I32);
                              auto ok = mask(b, h, q, kv) & (kv < KVn);
                              auto modded = score(zeros({BM, BN}, DType::F32), b, h, q, kv);
                              return std::tuple{n + sum(ok, 1), s + sum(where(ok, modded, 0.0), 1)};
                            });
    auto rows = program_id(0) * BM + arange(0, BM);
    store(count + h * Qn + rows, n, rows < Qn);
    store(total + h * Qn + rows, s, rows < Qn);
  });
  std::vector<int32_t> count(size_t(H * Q), -1);
  std::vector<float> total(size_t(H * Q), NAN);
  k.interpret({.grid = {cdiv(Q, 16), H, 1}, .constants = {16, 32}}, count, total, Q, KV, H);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < Q; ++i) {
      int n = 0;
      double s = 0;
      for (int64_t j = 0; j < KV; ++j)
        if (j <= i && ids[size_t(i)] == ids[size_t(j)]) ++n, s += double(slopes[size_t(h)]) * double(j - i);
      EXPECT_EQ(count[size_t(h * Q + i)], n) << "h " << h << " q " << i;
      EXPECT_NEAR(total[size_t(h * Q + i)], s, 1e-4 * (1 + std::abs(s))) << "h " << h << " q " << i;
    }
  // The captured tensors are parameters after the kernel's own five.
  auto f = k.trace({.constants = {16, 32}});
  EXPECT_EQ(f->params().size(), 5u + 3 + 3);
}

TEST(Mods, MistakesNameTheMod) {
  MaskMod returnsInt("counts", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return q - kv; });
  expectError([&] { evaluateMask(returnsInt, 1, 1, 4, 4); },
              {"ModsTest.cpp:", "mask_mod 'counts'", "must return i1", "i32[32,32]"});
  MaskMod wrongShape("wide", [](const Tile&, const Tile&, const Tile&, const Tile&) {
    return full({64, 64}, 1, DType::I1);
  });
  expectError([&] { evaluateMask(wrongShape, 1, 1, 4, 4); }, {"mask_mod 'wide'", "does not broadcast", "[32, 32]"});
  ScoreMod intScore("int", [](const Tile&, const Tile&, const Tile&, const Tile& q, const Tile&) { return q; });
  expectError([&] { applyScore(intScore, std::vector<float>(4), 0, 0, 2, 2); }, {"score_mod 'int'", "floating-point"});
  expectError([&] { (void)sliding_window_mask(0); }, {"sliding_window_mask", "at least 1"});
  expectError([&] { (void)prefix_lm_mask(-1); }, {"prefix_lm_mask"});
  expectError([&] { (void)soft_cap(0); }, {"soft_cap", "positive"});
  expectError([&] { (void)and_masks(causal_mask(), MaskMod()); }, {"and_masks", "mask 1", "empty"});
  expectError([&] { (void)document_mask(capture(Tensor::zeros(DType::F32, {4}, MemorySpace::Host), "f")); },
              {"document_mask", "integer", "f32[4]"});
  expectError([&] { (void)alibi(capture(Tensor::zeros(DType::I32, {4}, MemorySpace::Host), "s")); },
              {"alibi", "float", "i32[4]"});
  expectError([&] { (void)bias_table(capture(Tensor::zeros(DType::F32, {4}, MemorySpace::Host), "t")); },
              {"bias_table", "f32[4]"});
  auto host = capture(Tensor::zeros(DType::I32, {4}, MemorySpace::Host), "host_ids");
  auto device = capture(Tensor::deviceView(0x1000, DType::I32, {4}), "device_ids");
  expectError([&] { (void)and_masks(document_mask(host), document_mask(device)).captureSpace(); },
              {"host_ids", "device_ids", "different memory spaces"});
}

}  // namespace

// A capture is declared once, where the lambda reads it: a mod finds the tensors it reads by
// tracing itself, so one left out of the captures list still decides where a BlockMask is built
// and is validated before a launch. Given captures keep their order, read ones follow.
TEST(Mods, CapturesReadButNotListedAreFoundByTracing) {
  CapturedTensor ids = capture(Tensor::fromHost(std::vector<int32_t>(64, 0), {64}, MemorySpace::Host), "ids");
  CapturedTensor listed = capture(Tensor::fromHost(std::vector<int32_t>(64, 1), {64}, MemorySpace::Host), "listed");
  MaskMod sameDoc("same_doc_unlisted", [ids](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return ids(q) == ids(kv);
  });
  ASSERT_EQ(sameDoc.captures().size(), 1u);
  EXPECT_EQ(sameDoc.captures()[0].slot(), ids.slot());
  EXPECT_EQ(sameDoc.captureSpace(), MemorySpace::Host);
  // Built where the capture lives (the GPU would be chosen for a mod without captures).
  EXPECT_EQ(createBlockMask(sameDoc, 1, 1, 64, 64, {16, 16}).space(), MemorySpace::Host);
  MaskMod both("both", [ids, listed](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (ids(q) == ids(kv)) & (listed(q) > 0);
  }, {listed});
  ASSERT_EQ(both.captures().size(), 2u);
  EXPECT_EQ(both.captures()[0].slot(), listed.slot());
  EXPECT_EQ(both.captures()[1].slot(), ids.slot());
  // The algebra merges what its parts read.
  EXPECT_EQ(and_masks({sameDoc, causal_mask()}).captures().size(), 1u);
  ScoreMod bias("bias_unlisted", [listed](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile&) {
    return s + listed(q).to(DType::F32);
  });
  ASSERT_EQ(bias.captures().size(), 1u);
  EXPECT_EQ(bias.captureSpace(), MemorySpace::Host);
}
