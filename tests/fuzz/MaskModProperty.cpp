#include "MaskModProperty.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "AttentionComparison.h"
#include "BlockMaskExactness.h"
#include "VarlenCheck.h"
#include "attention_templates/BlockMask.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"
#include "attention_templates/Varlen.h"
#include "dsl/Capture.h"

namespace flextile::fuzz {
namespace {

using attention::MaskMod;
using dsl::Tile;
using testing::RefMask;

struct Piece {
  MaskMod mod;
  RefMask ref;
  std::string name;
};

// Random mask trees over the lengths and the mask's B and H (mB, mH).
class MaskModGenerator {
 public:
  MaskModGenerator(Choices& c, int64_t mB, int64_t mH, int64_t Q, int64_t KV)
      : c_(c), mB_(mB), mH_(mH), Q_(Q), KV_(KV), L_(std::max(Q, KV)) {}

  Piece tree(int depth) {
    if (depth < 3 && c_.percent(depth == 0 ? 70 : 40)) {
      const int kind = c_.below(3);
      if (kind == 0) {
        Piece p = tree(depth + 1);
        RefMask r = p.ref;
        return {attention::not_mask(p.mod), [r](int64_t b, int64_t h, int64_t q, int64_t kv) { return !r(b, h, q, kv); },
                "!(" + p.name + ")"};
      }
      std::vector<Piece> parts;
      for (int i = 0, n = 2 + c_.below(2); i < n; ++i) parts.push_back(tree(depth + 1));
      std::vector<MaskMod> mods;
      std::vector<RefMask> refs;
      std::string name;
      for (const Piece& p : parts) {
        mods.push_back(p.mod);
        refs.push_back(p.ref);
        name += (name.empty() ? "" : kind == 1 ? " & " : " | ") + p.name;
      }
      if (kind == 1)
        return {attention::and_masks(mods),
                [refs](int64_t b, int64_t h, int64_t q, int64_t kv) {
                  for (const auto& r : refs)
                    if (!r(b, h, q, kv)) return false;
                  return true;
                },
                "(" + name + ")"};
      return {attention::or_masks(mods),
              [refs](int64_t b, int64_t h, int64_t q, int64_t kv) {
                for (const auto& r : refs)
                  if (r(b, h, q, kv)) return true;
                return false;
              },
              "(" + name + ")"};
    }
    return piece();
  }

 private:
  int64_t upTo(int64_t n) { return int64_t(c_.below(int(n) + 1)); }  // 0..n
  dsl::CapturedTensor capture(const std::vector<int32_t>& values, dsl::Shape shape, const std::string& name) {
    return dsl::capture(dsl::Tensor::fromHost(values, std::move(shape)), name);
  }
  // Start offsets 0 = o_0 < ... < o_D = L (+ up to 2: the last document may run past both lengths).
  std::vector<int32_t> offsets() {
    std::vector<int32_t> o{0};
    for (int d = 0, docs = c_.below(6); d < docs; ++d) o.push_back(int32_t(1 + upTo(L_ - 1)));
    o.push_back(int32_t(L_ + upTo(2)));
    std::sort(o.begin(), o.end());
    o.erase(std::unique(o.begin(), o.end()), o.end());
    return o;
  }
  static int32_t docOf(const std::vector<int32_t>& o, int64_t i) {
    int32_t d = 0;
    for (size_t k = 1; k + 1 < o.size(); ++k) d += o[k] <= i;
    return d;
  }

  Piece piece() {
    switch (c_.below(14)) {
      case 0: return {attention::causal_mask(), [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; }, "causal"};
      case 1: {
        const int64_t w = c_.of({int64_t(1), int64_t(2), int64_t(5), int64_t(17), int64_t(64), int64_t(200)});
        return {attention::sliding_window_mask(w),
                [w](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q && q - kv < w; },
                "window " + std::to_string(w)};
      }
      case 2: {
        if (mH_ == 1) break;
        std::vector<int32_t> w;
        for (int64_t h = 0; h < mH_; ++h) w.push_back(int32_t(1 + upTo(100)));
        return {attention::sliding_window_mask(capture(w, {mH_}, "windows")),
                [w](int64_t, int64_t h, int64_t q, int64_t kv) { return kv <= q && q - kv < w[size_t(h)]; },
                "window per head"};
      }
      case 3: {
        const int64_t p = upTo(L_ + 5);
        return {attention::prefix_lm_mask(p), [p](int64_t, int64_t, int64_t q, int64_t kv) { return kv < p || kv <= q; },
                "prefix " + std::to_string(p)};
      }
      case 4: {  // document ids, one row or one per batch
        const int64_t rows = mB_ > 1 && c_.percent(50) ? mB_ : 1;
        std::vector<int32_t> ids;
        for (int64_t b = 0; b < rows; ++b) {
          auto o = offsets();
          for (int64_t i = 0; i < L_; ++i) ids.push_back(docOf(o, i));
        }
        const int64_t L = L_;
        auto t = rows == 1 ? capture(ids, {L}, "ids") : capture(ids, {rows, L}, "ids");
        return {attention::document_mask(t),
                [ids, rows, L](int64_t b, int64_t, int64_t q, int64_t kv) {
                  const int64_t row = rows == 1 ? 0 : b;
                  return ids[size_t(row * L + q)] == ids[size_t(row * L + kv)];
                },
                "documents[" + std::to_string(rows) + "]"};
      }
      case 5: {  // document start offsets, one list or one per batch (padded to one length)
        const int64_t rows = mB_ > 1 && c_.percent(50) ? mB_ : 1;
        std::vector<std::vector<int32_t>> lists;
        size_t width = 0;
        for (int64_t b = 0; b < rows; ++b) {
          lists.push_back(offsets());
          width = std::max(width, lists.back().size());
        }
        std::vector<int32_t> flat;
        for (auto& o : lists) {
          while (o.size() < width) o.push_back(o.back() + 1);  // more empty-past-the-end documents
          flat.insert(flat.end(), o.begin(), o.end());
        }
        const int64_t W = int64_t(width);
        auto t = rows == 1 ? capture(flat, {W}, "offsets") : capture(flat, {rows, W}, "offsets");
        return {attention::document_mask_from_offsets(t),
                [lists, rows](int64_t b, int64_t, int64_t q, int64_t kv) {
                  const auto& o = lists[size_t(rows == 1 ? 0 : b)];
                  return docOf(o, q) == docOf(o, kv);
                },
                "document offsets[" + std::to_string(rows) + "]"};
      }
      case 6: {  // kv < limit[h]
        if (mH_ == 1) break;
        std::vector<int32_t> lim;
        for (int64_t h = 0; h < mH_; ++h) lim.push_back(int32_t(upTo(KV_ + 3)));
        auto t = capture(lim, {mH_}, "limit");
        return {MaskMod("kv < limit[h]", [t](const Tile&, const Tile& h, const Tile&, const Tile& kv) { return kv < t(h); },
                        {t}),
                [lim](int64_t, int64_t h, int64_t, int64_t kv) { return kv < lim[size_t(h)]; }, "kv < limit[h]"};
      }
      case 7: {  // (q + kv) % m[b, h] != 0, over the mask's dims (a broadcast one reads index 0)
        if (mB_ == 1 && mH_ == 1) break;
        std::vector<int32_t> m;
        for (int64_t i = 0; i < mB_ * mH_; ++i) m.push_back(int32_t(2 + upTo(7)));
        auto t = capture(m, {mB_, mH_}, "modulus");
        const int64_t H = mH_;
        const bool byB = mB_ > 1, byH = mH_ > 1;
        return {MaskMod("(q + kv) % modulus[b, h] != 0",
                        [t, byB, byH](const Tile& b, const Tile& h, const Tile& q, const Tile& kv) {
                          return (q + kv) % t(byB ? b : b * 0, byH ? h : h * 0) != 0;
                        },
                        {t}),
                [m, H, byB, byH](int64_t b, int64_t h, int64_t q, int64_t kv) {
                  return (q + kv) % m[size_t((byB ? b : 0) * H + (byH ? h : 0))] != 0;
                },
                "(q + kv) % modulus[b, h] != 0"};
      }
      case 8: {  // a dense table: allowed where table[q, kv] != 0, at a random density
        const int density = c_.of({2, 50, 98});
        std::vector<int32_t> table(size_t(Q_ * KV_));
        Choices data(c_.bits());
        for (auto& x : table) x = data.percent(density) ? int32_t(1 + data.below(3)) : 0;
        auto t = capture(table, {Q_, KV_}, "table");
        const int64_t KV = KV_;
        return {MaskMod("table[q, kv] != 0",
                        [t](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return t(q, kv) != 0; }, {t}),
                [table, KV](int64_t, int64_t, int64_t q, int64_t kv) { return table[size_t(q * KV + kv)] != 0; },
                "table " + std::to_string(density) + "%"};
      }
      case 9: {  // index stripes
        const int64_t a = upTo(3), cq = upTo(3), m = 2 + upTo(9), r = 1 + upTo(m - 1);
        return {MaskMod("stripes",
                        [a, cq, m, r](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
                          return (kv * a + q * cq) % m < r;
                        }),
                [a, cq, m, r](int64_t, int64_t, int64_t q, int64_t kv) { return (kv * a + q * cq) % m < r; },
                "stripes (" + std::to_string(a) + " kv + " + std::to_string(cq) + " q) % " + std::to_string(m) + " < " +
                    std::to_string(r)};
      }
      case 10: {  // a rectangle
        const int64_t lo = upTo(Q_), hi = upTo(KV_ + 1);
        return {MaskMod("rectangle",
                        [lo, hi](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return (q >= lo) & (kv < hi); }),
                [lo, hi](int64_t, int64_t, int64_t q, int64_t kv) { return q >= lo && kv < hi; },
                "q >= " + std::to_string(lo) + " & kv < " + std::to_string(hi)};
      }
      case 11: {  // a shifted diagonal
        const int64_t shift = upTo(100) - 50;
        return {MaskMod("shifted causal",
                        [shift](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return kv <= q + shift; }),
                [shift](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q + shift; },
                "kv <= q + " + std::to_string(shift)};
      }
      case 12: return {attention::noop_mask(), [](int64_t, int64_t, int64_t, int64_t) { return true; }, "noop"};
      default: break;
    }
    return {attention::or_masks(std::vector<MaskMod>{}), [](int64_t, int64_t, int64_t, int64_t) { return false; },
            "nothing"};
  }

  Choices& c_;
  int64_t mB_, mH_, Q_, KV_, L_;
};

int64_t length(Choices& c) {
  if (c.percent(10)) return c.of({int64_t(16), int64_t(32), int64_t(64), int64_t(128)});  // sometimes a block multiple
  return 1 + c.below(160);
}

}  // namespace

MaskModOutcome checkMaskMod(Choices& c) {
  MaskModOutcome out;
  // A quarter of the cases pack sequences into one row (attention_templates/Varlen.h): the random
  // mask is then the inner mask of each sequence, at its own positions, and b is the sequence.
  const bool packed = c.percent(25);
  const int64_t B = packed ? 1 : 1 + c.below(2);
  const int64_t Hq = 1 + c.below(4);
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= Hq; ++d)
    if (Hq % d == 0) divisors.push_back(d);
  const int64_t Hkv = divisors[size_t(c.below(int(divisors.size())))];
  const int64_t Q = length(c), KV = length(c);
  const attention::BlockSizes sizes{c.of({int64_t(16), int64_t(32), int64_t(64), int64_t(128)}),
                                    c.of({int64_t(16), int64_t(32), int64_t(64), int64_t(128)})};
  const int64_t mB = c.percent(50) ? B : 1;
  const int64_t mH = c.percent(50) ? Hq : 1;
  const int64_t D = c.of({int64_t(16), int64_t(32)});
  const dsl::DType dtype = c.of({dsl::DType::F32, dsl::DType::BF16, dsl::DType::F16});

  MaskModGenerator gen(c, mB, mH, Q, KV);
  Piece mask = gen.tree(0);
  // Packed: the lengths cut into 1 to 4 sequences (empty ones too); the queries at the end of their
  // keys only where no sequence has more queries than keys (the pieces' tables take no negative
  // position).
  std::optional<attention::PackedSequences> seqs;
  if (packed) {
    const int S = 1 + c.below(4);
    auto cut = [&](int64_t total) {
      std::vector<int64_t> ends;
      for (int s = 0; s + 1 < S; ++s) ends.push_back(c.below(int(total) + 1));
      ends.push_back(total);
      std::sort(ends.begin(), ends.end());
      std::vector<int64_t> lengths;
      for (size_t s = 0; s < ends.size(); ++s) lengths.push_back(ends[s] - (s == 0 ? 0 : ends[s - 1]));
      return lengths;
    };
    const std::vector<int64_t> qLens = cut(Q);
    const std::vector<int64_t> kLens = cut(KV);
    bool keysCover = true;
    for (int s = 0; s < S; ++s) keysCover = keysCover && kLens[size_t(s)] >= qLens[size_t(s)];
    const bool atEnd = keysCover && c.percent(50);
    const auto positions = atEnd ? attention::QueryPositions::AtEnd : attention::QueryPositions::FromStart;
    seqs = attention::PackedSequences::fromLengths(qLens, kLens, {.queryPositions = positions,
                                                                  .space = dsl::MemorySpace::Host});
    const testing::PackedLayout layout(qLens, kLens, positions);
    mask.ref = testing::packedMask(layout, mask.ref);
    out.packed = true;
    mask.name = "packed " + std::to_string(S) + (atEnd ? " at end" : "") + " { " + mask.name + " }";
  }
  out.description = mask.name + ": B=" + std::to_string(B) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
                    " Q_LEN=" + std::to_string(Q) + " KV_LEN=" + std::to_string(KV) + " D=" + std::to_string(D) + " " +
                    std::string(ir::dtypeName(dtype)) + ", mask B=" + std::to_string(mB) + " H=" + std::to_string(mH) +
                    ", blocks " + std::to_string(sizes.q) + "x" + std::to_string(sizes.kv);

  std::optional<attention::BlockMask> blockMask;
  try {
    // Packed: the structural lists where the inner mask is a standard one, else the generic
    // builder of the wrapped mod; or, at random, the generic builder of the wrapped mod always.
    if (seqs && c.percent(50)) blockMask = seqs->blockMask(mask.mod, mH, sizes);
    else blockMask = attention::createBlockMask(seqs ? seqs->mask(mask.mod) : mask.mod, mB, mH, Q, KV, sizes,
                                                dsl::MemorySpace::Host);
  } catch (const std::exception& e) {
    out.broken = "createBlockMask fails: " + std::string(e.what());
    return out;
  }
  if (std::string mismatch = testing::blockMaskMismatch(*blockMask, mask.ref); !mismatch.empty()) {
    out.broken = "the BlockMask is not exact: " + mismatch;
    return out;
  }
  out.partialBlocks = blockMask->numPartialBlocks();
  out.fullBlocks = blockMask->numFullBlocks();
  out.emptyBlocks = mB * mH * blockMask->numQBlocks() * blockMask->numKvBlocks() - out.partialBlocks - out.fullBlocks;

  // The template and its tiles: the default (as a user gets it), or a random valid config of the
  // prefill template, or of the decode template for a few queries.
  attention::FlexAttentionOptions options;
  std::optional<attention::FlexAttentionBackwardConfig> backwardConfig;  // the backward's (default: none)
  const int which = c.below(3);
  auto blockUpTo = [&](int64_t limit) {
    int64_t b = c.of({int64_t(16), int64_t(32), int64_t(64)});
    while (b > limit) b /= 2;
    return b;
  };
  if (which == 1) {
    options.kernel = attention::AttentionTemplate::Prefill;
    options.config = attention::FlexAttentionConfig{blockUpTo(sizes.q), blockUpTo(sizes.kv), c.of({1, 2, 4, 8}),
                                                    c.of({1, 2, 3})};
    out.description += ", prefill " + options.config->describe();
    // dkdv: BM queries a step, BN keys a program; dq: BM queries a program, BN keys a step.
    const attention::FlexAttentionConfig dkdv{blockUpTo(sizes.q), blockUpTo(sizes.kv), 4, c.of({1, 2})};
    backwardConfig = attention::FlexAttentionBackwardConfig{dkdv, {blockUpTo(sizes.q), blockUpTo(sizes.kv), 4, c.of({1, 2})}};
    out.description += ", backward " + backwardConfig->describe();
  } else if (which == 2 && Q <= attention::kDecodeMaxQueries) {
    options.kernel = attention::AttentionTemplate::Decode;
    options.decode_config =
        attention::FlexDecodeConfig{blockUpTo(sizes.kv), c.of({1, 2, 4, 8}), c.of({1, 2, 3}), int64_t(c.below(4))};
    // The producer warpgroup where the passes below may give it one (sm_90a, 4 or 8 warps).
    if (c.percent(50)) options.decode_config->warp_specialize = attention::WarpSpecialization::On;
    out.description += ", decode " + options.decode_config->describe();
  } else {
    out.description += ", default config";
  }
  // What the interpreter runs: the traced kernels, or the IR after sm_80's or sm_90a's tile passes
  // (FLEXTILE_INTERPRET_AFTER_PASSES: rings, TMA copies, wgmma, warp specialization), so random
  // masks reach every schedule the templates take.
  const char* passes = c.of<const char*>({"", "sm_80", "sm_90a"});
  if (*passes) out.description += std::string(", interpreted after ") + passes + "'s passes";
  struct AfterPasses {
    std::optional<std::string> old;
    explicit AfterPasses(const char* target) {
      if (const char* v = std::getenv("FLEXTILE_INTERPRET_AFTER_PASSES")) old = v;
      ::setenv("FLEXTILE_INTERPRET_AFTER_PASSES", target, 1);
    }
    ~AfterPasses() {
      old ? (void)::setenv("FLEXTILE_INTERPRET_AFTER_PASSES", old->c_str(), 1) : (void)::unsetenv("FLEXTILE_INTERPRET_AFTER_PASSES");
    }
  } afterPasses(passes);

  std::mt19937_64 rng(c.bits());
  // Attention sinks in some (a logit per head around the log of the keys, one head's -inf).
  std::vector<double> sinks;
  if (c.percent(25)) {
    std::uniform_real_distribution<double> near(std::log(double(KV)) - 3, std::log(double(KV)) + 3);
    for (int64_t h = 0; h < Hq; ++h) sinks.push_back(h == 1 ? -INFINITY : near(rng));
    options.sinks = dsl::Tensor::fromHost(std::vector<float>(sinks.begin(), sinks.end()), {Hq});
    out.description += ", sinks";
  }
  const double scale = 1.0 / std::sqrt(double(D));
  const char* stage = "flex_attention";
  try {
    dsl::Tensor q = testing::randomTensor(rng, dtype, {B, Hq, Q, D}, dsl::MemorySpace::Host);
    dsl::Tensor k = testing::randomTensor(rng, dtype, {B, Hkv, KV, D}, dsl::MemorySpace::Host);
    dsl::Tensor v = testing::randomTensor(rng, dtype, {B, Hkv, KV, D}, dsl::MemorySpace::Host);
    dsl::Tensor o = dsl::Tensor::empty(dtype, {B, Hq, Q, D}, dsl::MemorySpace::Host);
    dsl::Tensor lse = dsl::Tensor::empty(dsl::DType::F32, {B, Hq, Q}, dsl::MemorySpace::Host);
    testing::poison(o);
    testing::poison(lse);
    attention::flex_attention_into(q, k, v, attention::noop_score(), blockMask, o, &lse, options);
    const attention::ReferenceResult ref =
        attention::referenceAttention(q, k, v, {}, mask.ref, scale, 0, sinks.empty() ? nullptr : &sinks);
    if (std::string mismatch = testing::attentionMismatch(o, lse, ref, D, dtype); !mismatch.empty()) {
      out.broken = "flex_attention differs from the float64 reference: " + mismatch;
      return out;
    }
    // The backward of that forward (the mask's transposed lists, the dkdv and dq kernels): dq, dk,
    // dv and dsinks against float64, exactly 0 on rows without keys and keys no query sees.
    stage = "flex_attention_backward";
    dsl::Tensor dout = testing::randomTensor(rng, dtype, {B, Hq, Q, D}, dsl::MemorySpace::Host);
    attention::FlexAttentionBackwardOptions bo{.config = backwardConfig};
    bo.sinks = options.sinks;
    const attention::FlexAttentionGrads g =
        attention::flex_attention_backward(q, k, v, o, lse, dout, attention::noop_score(), blockMask, bo);
    const attention::ReferenceGrads want = attention::referenceAttentionBackward(
        q, k, v, dout, {}, {}, mask.ref, scale, 0, nullptr, nullptr, &o, sinks.empty() ? nullptr : &sinks);
    std::vector<char> deadRows(ref.maxScores.size());  // rows without an allowed key
    for (size_t i = 0; i < deadRows.size(); ++i) deadRows[i] = std::isinf(ref.maxScores[i]);
    const std::string mismatch = testing::gradsMismatch(g, want, deadRows, mask.ref, 0, dtype);
    if (!mismatch.empty()) out.broken = "flex_attention_backward differs from the float64 reference: " + mismatch;
  } catch (const std::exception& e) {
    out.broken = std::string(stage) + " fails: " + e.what();
  }
  return out;
}

}  // namespace flextile::fuzz
