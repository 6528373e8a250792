// Packed variable-length sequences (FlashAttention's varlen): a batch of sequences of different
// lengths laid end to end in one row, q [1, H, total, D], with no padding. Each token attends
// causally within its own sequence, with an ALiBi bias on its distance.
//
// The mods are written for one sequence, at its own positions (0 is the sequence's first token);
// PackedSequences runs them over the packed layout:
//   mask_mod(s, h, q, kv) = kv <= q                       (causal_mask())
//   score_mod(score, s, h, q, kv) = score + slope[h] * (kv - q)   (alibi(slopes))
// and its BlockMask keeps the sequences apart. The next batch (other lengths) rebinds the tables
// the wrapped mods read: no retrace, no recompile.
#include "attention_templates/Varlen.h"
#include "examples/attention/common.h"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::dsl;
namespace ex = flextile::examples::attention;

int main(int argc, char** argv) try {
  const std::string summary = "packed sequences: causal + ALiBi within each sequence, at its own positions";
  ex::Options opt = ex::parseOptions(argc, argv, "varlen", summary,
                                     {{"docs", "sequences per batch row of the shape, cut at random places (8)"}});
  const int64_t docs = opt.intParam("docs", kYardstickDocuments);
  if (docs < 1) throw Error("--docs must be at least 1");
  // The shape's B rows of N tokens become one packed row of B * N tokens, B * docs sequences.
  const int64_t rows = opt.B;
  opt.N *= opt.B;
  opt.B = 1;
  ex::printHeader(opt, summary, std::to_string(rows * docs) + " sequences packed into one row");
  std::mt19937_64 rng(opt.seed);
  ex::Inputs in = ex::randomInputs(opt, rng);

  // Sequence lengths from random cuts of each of the B rows.
  auto randomLengths = [&](uint64_t seed) {
    std::vector<int64_t> lengths;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int64_t> cuts = randomDocumentOffsets(opt.N / rows, int(docs), seed + uint64_t(r));
      for (size_t d = 0; d + 1 < cuts.size(); ++d) lengths.push_back(cuts[d + 1] - cuts[d]);
    }
    return lengths;
  };

  // 1. The sequences (queries and keys alike here) and the mods of one sequence.
  PackedSequences seqs = PackedSequences::fromLengths(randomLengths(opt.seed), {}, {.space = opt.space()});
  std::vector<float> slopes(static_cast<size_t>(opt.H));
  for (int64_t h = 0; h < opt.H; ++h) slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(opt.H));
  ScoreMod bias = alibi(capture(Tensor::fromHost(slopes, {opt.H}, opt.space()), "slopes"));

  // The float64 reference over the packed positions, from the starts (not the library's tables).
  auto reference = [&](const PackedSequences& p) {
    auto local = [starts = p.queryStarts()](int64_t q, int64_t kv) {
      const size_t s = size_t(std::upper_bound(starts.begin(), starts.end(), q) - starts.begin()) - 1;
      return std::tuple{starts[s], starts[s + 1], q - starts[s], kv - starts[s]};
    };
    RefMaskFn mask = [local](int64_t, int64_t, int64_t q, int64_t kv) {
      auto [start, end, i, j] = local(q, kv);
      return j >= 0 && kv < end && j <= i;
    };
    RefScoreFn score = [local, slopes](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
      auto [start, end, i, j] = local(q, kv);
      return s + double(slopes[size_t(h)]) * double(j - i);
    };
    return std::pair{mask, score};
  };

  // 2. The BlockMask: causal_mask() inside each sequence, its lists from the starts alone.
  BlockMask mask = ex::buildTwice("PackedSequences::blockMask(causal_mask())", [&] {
    return seqs.blockMask(causal_mask(), 1);
  });
  ex::printMask(mask);

  // 3. The call, and its check.
  FlexAttentionOptions options;
  options.return_lse = true;
  FlexAttentionResult result = ex::firstCall(opt, [&] {
    return flex_attention(in.q, in.k, in.v, seqs.score(bias), mask, options);
  });
  auto [refMask, refScore] = reference(seqs);
  const int first = ex::checkReportAndFinish(opt, in, result, seqs.score(bias), mask, refScore, refMask, rng);

  // 4. The next batch: other lengths, the same mods (their kernels are found again), checked too.
  seqs.assignLengths(randomLengths(opt.seed + 1000));
  BlockMask next = seqs.blockMask(causal_mask(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  FlexAttentionResult again = flex_attention(in.q, in.k, in.v, seqs.score(bias), next, options);
  if (opt.gpu) runtime::synchronize();
  std::printf("\nthe next batch (%lld sequences, other lengths): its first call (no trace, no compile) %.1f ms\n",
              (long long)seqs.count(), ex::millisecondsSince(t0));
  auto [nextMask, nextScore] = reference(seqs);
  const int second = ex::checkReportAndFinish(opt, in, again, seqs.score(bias), next, nextScore, nextMask, rng);
  return first != 0 ? first : second;
} catch (const std::exception& e) {
  std::fprintf(stderr, "attention_varlen: %s\n", e.what());
  return 1;
}
