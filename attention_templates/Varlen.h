// Packed variable-length sequences (FlashAttention's varlen, PyTorch's create_varlen_block_mask):
// a batch of sequences of different lengths laid end to end in one batch row, without padding.
//
//   PackedSequences seqs = PackedSequences::fromLengths({37, 0, 300, 129});   // queries = keys
//   // q [1, Hq, 466, D], k and v [1, Hkv, 466, D]: sequence s at rows [start(s), start(s + 1))
//   BlockMask mask = seqs.blockMask(causal_mask());          // causal within each sequence
//   auto fwd = flex_attention(q, k, v, seqs.score(alibi(slopes)), mask);
//
// Sequence s owns queries [queryStart(s), queryStart(s + 1)) and keys [keyStart(s), keyStart(s + 1));
// a query attends to its own sequence's keys only. The mods a user gives describe one sequence:
// they see the sequence's own positions, not packed ones —
//   inner mask_mod(b = s, h, q_pos, kv_pos),  inner score_mod(score, b = s, h, q_pos, kv_pos)
// where kv_pos = packed key - keyStart(s) and q_pos = packed query - queryStart(s) (or, with
// QueryPositions::AtEnd, counted back from the sequence's last key: the queries are the newest
// tokens of a longer sequence, as in chunked prefill and speculative decoding, and causal is
// bottom-right aligned). b is a [BM, 1] tile here (each query row's sequence), not a scalar.
//
// Everything the wrappers read is per query row (i32 tables of the packed queries: the row's
// sequence, position and key range): nothing is gathered per key, so the forward keeps the
// schedules that a per-key gather turns off (the producer warpgroup, the turns), and the
// wrapped pair test (key inside the row's range) is two compares; for all pairs and causal
// inside each sequence it is the whole mask (causal with the row's last key). The BlockMask is
// what keeps the sequences apart in the blocks it calls full: use seqs.score() with a mask of
// seqs.blockMask() (or of seqs.mask()), never alone. The backward, a captured tensor's gradient and GQA work as for
// any mod; the decode template runs packed queries too (each of its rows is one query).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/Mods.h"

namespace flextile::attention {

// Where a sequence's queries sit among its keys.
enum class QueryPositions {
  FromStart,  // query j of a sequence is position j (FlashAttention's top-left alignment)
  AtEnd,      // its last query is its last key's position: query j is kvLen - qLen + j (bottom-right)
};

struct PackedSequencesOptions {
  QueryPositions queryPositions = QueryPositions::FromStart;
  // Where the tables the mods read are made (default: the device when there is one).
  std::optional<dsl::MemorySpace> space;
  runtime::Stream* stream = nullptr;
};

class PackedSequences {
 public:
  // Sequence lengths (queries and keys per sequence; zeros allowed: a sequence without keys gives
  // its queries out 0 and lse -inf). keyLengths empty: the same as queryLengths (self-attention).
  static PackedSequences fromLengths(const std::vector<int64_t>& queryLengths,
                                     const std::vector<int64_t>& keyLengths = {},
                                     const PackedSequencesOptions& options = {});
  // Start offsets with the total last (cu_seqlens): 0 = o_0 <= o_1 <= ... <= o_S, one entry more than
  // there are sequences; keyStarts empty: the same as queryStarts.
  static PackedSequences fromStarts(const std::vector<int64_t>& queryStarts, const std::vector<int64_t>& keyStarts = {},
                                    const PackedSequencesOptions& options = {});
  // The same from cu_seqlens tensors another framework holds (i32 or i64 [S + 1], either space;
  // keyStarts undefined: the same as queryStarts), read back once on options.stream.
  static PackedSequences fromStarts(const dsl::Tensor& queryStarts, const dsl::Tensor& keyStarts = {},
                                    const PackedSequencesOptions& options = {});

  // New lengths (or starts) for this object and its copies: the tables that every mod made from it
  // reads are rebound, so kernels traced for those mods are found again (no retrace, no compile) —
  // what a training or serving loop whose batch changes every step wants. Masks built before read
  // the new tables with their old lists: build the step's BlockMask after assigning. Not while
  // another thread uses this object or its copies (a call still in flight on a stream is fine:
  // freeing the old tables waits for it, as cuMemFree does).
  void assignLengths(const std::vector<int64_t>& queryLengths, const std::vector<int64_t>& keyLengths = {});
  void assignStarts(const std::vector<int64_t>& queryStarts, const std::vector<int64_t>& keyStarts = {});

  int64_t count() const { return int64_t(state_->queryStarts.size()) - 1; }
  int64_t totalQueries() const { return state_->queryStarts.back(); }
  int64_t totalKeys() const { return state_->keyStarts.back(); }
  const std::vector<int64_t>& queryStarts() const { return state_->queryStarts; }
  const std::vector<int64_t>& keyStarts() const { return state_->keyStarts; }
  QueryPositions queryPositions() const { return state_->options.queryPositions; }
  dsl::MemorySpace space() const { return state_->space; }
  // The sequence of packed query i, and its position there (AtEnd: negative for queries placed
  // before the sequence's first key, which see nothing under a causal mask).
  int64_t sequenceOfQuery(int64_t i) const;
  int64_t queryPosition(int64_t i) const;

  // The pair test of packed positions: the key is in the query's sequence and `inner` allows the
  // pair at the sequence's positions. The same `inner` gives the same mod (its kernels are kept).
  MaskMod mask(const MaskMod& inner = noop_mask()) const;
  // `inner` at the sequence's positions (noop_score() stays itself: nothing to read).
  ScoreMod score(const ScoreMod& inner) const;
  // The BlockMask of mask(inner) over the packed lengths, B = 1 and H heads (1 broadcasts). For
  // noop_mask() and causal_mask() (or a mod of the same body) the lists come from the starts alone
  // (rowIntervalBlockMask: no kernel, no plane scan); any other mod is evaluated on the whole packed
  // plane (createBlockMask), whose cost grows with totalQueries * totalKeys like any generic mask.
  BlockMask blockMask(const MaskMod& inner = noop_mask(), int64_t H = 1, BlockSizes sizes = {}) const;
  // The same from the inner mask's own key interval per row, at the sequence's positions:
  // innerKeys(sequence, h, query position, the sequence's key count) -> [lo, hi] (lo > hi: none),
  // which must be exactly the keys `inner` allows. A window of W, say: {pos - W + 1, pos}. No
  // kernel and no plane scan, for any inner mask whose rows are intervals.
  using SequenceRowKeys = std::function<std::pair<int64_t, int64_t>(int64_t sequence, int64_t h, int64_t position,
                                                                    int64_t keys)>;
  BlockMask blockMask(const MaskMod& inner, const SequenceRowKeys& innerKeys, int64_t H = 1,
                      BlockSizes sizes = {}) const;

 private:
  struct State {
    std::vector<int64_t> queryStarts, keyStarts;
    PackedSequencesOptions options;
    dsl::MemorySpace space = dsl::MemorySpace::Host;
    // Per packed query: its sequence, its position there, its sequence's keys [keyStart, keyEnd),
    // and the last key a causal row sees (keyStart + position, within the sequence's keys).
    CapturedTensor rowSequence, rowPosition, rowKeyStart, rowKeyEnd, rowCausalLast;
    // The wrappers made so far, by the inner mod's state, so a mod keeps its kernels.
    std::mutex mutex;
    std::map<const void*, std::pair<MaskMod, MaskMod>> masks;     // inner, wrapper
    std::map<const void*, std::pair<ScoreMod, ScoreMod>> scores;  // inner, wrapper
  };
  explicit PackedSequences(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace flextile::attention
