// Packed variable-length sequences: the tables, the wrapped mods and their BlockMasks.
#include "attention_templates/Varlen.h"

#include <algorithm>
#include <climits>
#include <string>

#include "runtime/Stream.h"

namespace flextile::attention {

using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

std::vector<int64_t> startsOf(const std::vector<int64_t>& lengths, const char* what, const char* which) {
  if (lengths.empty()) throw Error(std::string(what) + ": no sequences (" + which + " lengths are empty)");
  std::vector<int64_t> starts{0};
  for (size_t s = 0; s < lengths.size(); ++s) {
    if (lengths[s] < 0)
      throw Error(std::string(what) + ": " + which + " length of sequence " + std::to_string(s) + " is " +
                  std::to_string(lengths[s]) + ", below 0");
    starts.push_back(starts.back() + lengths[s]);
    if (starts.back() > INT32_MAX)
      throw Error(std::string(what) + ": the " + which + " lengths add up past 2^31 - 1 by sequence " +
                  std::to_string(s));
  }
  return starts;
}

void checkStarts(const std::vector<int64_t>& o, const char* what, const char* which) {
  if (o.size() < 2)
    throw Error(std::string(what) + ": " + which + " starts need at least 2 entries (0 and the total), got " +
                std::to_string(o.size()));
  if (o.front() != 0)
    throw Error(std::string(what) + ": " + which + " starts must begin at 0, got " + std::to_string(o.front()));
  for (size_t s = 1; s < o.size(); ++s)
    if (o[s] < o[s - 1])
      throw Error(std::string(what) + ": " + which + " starts must not decrease, got " + std::to_string(o[s - 1]) +
                  " then " + std::to_string(o[s]) + " at entry " + std::to_string(s));
  if (o.back() < 1 || o.back() > INT32_MAX)
    throw Error(std::string(what) + ": the " + which + " total must be in [1, 2^31), got " + std::to_string(o.back()));
}

int64_t positionIn(QueryPositions positions, int64_t i, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  return i - q0 + (positions == QueryPositions::AtEnd ? (k1 - k0) - (q1 - q0) : 0);
}

template <class Mod>
const void* identity(const Mod& m) { return &m.state(); }

// Whether `inner` is `standard` or a mod of the same body (a user's own causal mask, say).
bool sameBody(const MaskMod& inner, const MaskMod& standard) {
  if (identity(inner) == identity(standard)) return true;
  try {
    return inner.structuralHash() == standard.structuralHash();
  } catch (const Error&) {
    return false;  // whoever traces it next reports why it cannot be
  }
}

}  // namespace

PackedSequences PackedSequences::fromLengths(const std::vector<int64_t>& queryLengths,
                                             const std::vector<int64_t>& keyLengths,
                                             const PackedSequencesOptions& options) {
  const char* what = "PackedSequences::fromLengths";
  return fromStarts(startsOf(queryLengths, what, "query"),
                    keyLengths.empty() ? std::vector<int64_t>{} : startsOf(keyLengths, what, "key"), options);
}

PackedSequences PackedSequences::fromStarts(const std::vector<int64_t>& queryStarts,
                                            const std::vector<int64_t>& keyStarts,
                                            const PackedSequencesOptions& options) {
  auto state = std::make_shared<State>();
  state->options = options;
  state->space = options.space ? *options.space : (dsl::deviceAvailable() ? MemorySpace::Device : MemorySpace::Host);
  PackedSequences seqs(std::move(state));
  seqs.assignStarts(queryStarts, keyStarts);
  return seqs;
}

PackedSequences PackedSequences::fromStarts(const Tensor& queryStarts, const Tensor& keyStarts,
                                            const PackedSequencesOptions& options) {
  auto read = [&](const Tensor& t, const char* which) {
    if (t.rank() != 1 || (t.dtype() != DType::I32 && t.dtype() != DType::I64))
      throw Error(std::string("PackedSequences::fromStarts: the ") + which +
                  " starts must be an i32 or i64 tensor [S + 1] (cu_seqlens), got " + t.describe());
    if (t.dtype() == DType::I64) return t.toHost<int64_t>(options.stream);
    const std::vector<int32_t> v = t.toHost<int32_t>(options.stream);
    return std::vector<int64_t>(v.begin(), v.end());
  };
  if (!queryStarts.defined()) throw Error("PackedSequences::fromStarts: the query starts tensor is empty");
  return fromStarts(read(queryStarts, "query"), keyStarts.defined() ? read(keyStarts, "key") : std::vector<int64_t>{},
                    options);
}

void PackedSequences::assignLengths(const std::vector<int64_t>& queryLengths, const std::vector<int64_t>& keyLengths) {
  const char* what = "PackedSequences::assignLengths";
  assignStarts(startsOf(queryLengths, what, "query"),
               keyLengths.empty() ? std::vector<int64_t>{} : startsOf(keyLengths, what, "key"));
}

void PackedSequences::assignStarts(const std::vector<int64_t>& queryStarts, const std::vector<int64_t>& keyStartsIn) {
  const char* what = "PackedSequences";
  const std::vector<int64_t>& keyStarts = keyStartsIn.empty() ? queryStarts : keyStartsIn;
  checkStarts(queryStarts, what, "query");
  checkStarts(keyStarts, what, "key");
  if (queryStarts.size() != keyStarts.size())
    throw Error(std::string(what) + ": " + std::to_string(queryStarts.size() - 1) + " query sequences but " +
                std::to_string(keyStarts.size() - 1) + " key sequences");
  State& st = *state_;
  const int64_t total = queryStarts.back();
  const auto rows = size_t(total);
  std::vector<int32_t> sequence(rows), position(rows), keyStart(rows), keyEnd(rows), causalLast(rows);
  for (size_t s = 0; s + 1 < queryStarts.size(); ++s)
    for (int64_t i = queryStarts[s]; i < queryStarts[s + 1]; ++i) {
      sequence[size_t(i)] = int32_t(s);
      position[size_t(i)] = int32_t(positionIn(st.options.queryPositions, i, queryStarts[s], queryStarts[s + 1],
                                               keyStarts[s], keyStarts[s + 1]));
      keyStart[size_t(i)] = int32_t(keyStarts[s]);
      keyEnd[size_t(i)] = int32_t(keyStarts[s + 1]);
      causalLast[size_t(i)] = int32_t(std::min<int64_t>(keyStarts[s + 1] - 1, keyStarts[s] + position[size_t(i)]));
    }
  auto bind = [&](CapturedTensor& c, const std::vector<int32_t>& values, const char* name) {
    Tensor t = Tensor::fromHost(values, {total}, st.space, st.options.stream);
    if (c.defined()) c.rebind(t);
    else c = dsl::capture(t, name);
  };
  std::lock_guard lock(st.mutex);
  bind(st.rowSequence, sequence, "varlen_sequence");
  bind(st.rowPosition, position, "varlen_position");
  bind(st.rowKeyStart, keyStart, "varlen_key_start");
  bind(st.rowKeyEnd, keyEnd, "varlen_key_end");
  bind(st.rowCausalLast, causalLast, "varlen_causal_last");
  // Later calls on any stream read the tables.
  if (st.options.stream && st.space == MemorySpace::Device) st.options.stream->synchronize();
  st.queryStarts = queryStarts;
  st.keyStarts = keyStarts;
}

int64_t PackedSequences::sequenceOfQuery(int64_t i) const {
  if (i < 0 || i >= totalQueries())
    throw Error("PackedSequences::sequenceOfQuery: query " + std::to_string(i) + " is outside [0, " +
                std::to_string(totalQueries()) + ")");
  const auto& o = state_->queryStarts;
  return int64_t(std::upper_bound(o.begin(), o.end(), i) - o.begin()) - 1;
}

int64_t PackedSequences::queryPosition(int64_t i) const {
  const int64_t s = sequenceOfQuery(i);
  const auto &q = state_->queryStarts, &k = state_->keyStarts;
  return positionIn(queryPositions(), i, q[size_t(s)], q[size_t(s) + 1], k[size_t(s)], k[size_t(s) + 1]);
}

MaskMod PackedSequences::mask(const MaskMod& inner) const {
  if (!inner.defined()) throw Error("PackedSequences::mask: the inner mask_mod is empty");
  State& st = *state_;
  std::lock_guard lock(st.mutex);
  auto it = st.masks.find(identity(inner));
  if (it != st.masks.end()) return it->second.second;
  // The standard two are each row's interval of keys: two compares against per-row bounds, with
  // no key position to form (for the causal mask a subtract and a compare fewer per score).
  auto make = [&]() -> MaskMod {
    if (sameBody(inner, noop_mask()))
      return MaskMod("varlen(noop)", [ks = st.rowKeyStart, ke = st.rowKeyEnd](const Tile&, const Tile&, const Tile& q,
                                                                               const Tile& kv) {
        return (kv >= ks(q)) & (kv < ke(q));
      }, {st.rowKeyStart, st.rowKeyEnd});
    if (sameBody(inner, causal_mask()))
      return MaskMod("varlen(causal)", [ks = st.rowKeyStart, last = st.rowCausalLast](
                                           const Tile&, const Tile&, const Tile& q, const Tile& kv) {
        return (kv >= ks(q)) & (kv <= last(q));
      }, {st.rowKeyStart, st.rowCausalLast});
    std::vector<CapturedTensor> captures{st.rowSequence, st.rowPosition, st.rowKeyStart, st.rowKeyEnd};
    for (const CapturedTensor& c : inner.captures()) captures.push_back(c);
    return MaskMod(
        "varlen(" + inner.name() + ")",
        [inner, seq = st.rowSequence, pos = st.rowPosition, ks = st.rowKeyStart, ke = st.rowKeyEnd](
            const Tile&, const Tile& h, const Tile& q, const Tile& kv) {
          // Only the query row's tables are read: a key belongs to the row's sequence when it lies
          // in the row's key range, so nothing is gathered per key.
          Tile start = ks(q);
          return (kv >= start) & (kv < ke(q)) & inner(seq(q), h, pos(q), kv - start);
        },
        captures);
  };
  MaskMod wrapper = make();
  st.masks.emplace(identity(inner), std::pair{inner, wrapper});
  return wrapper;
}

ScoreMod PackedSequences::score(const ScoreMod& inner) const {
  if (!inner.defined()) throw Error("PackedSequences::score: the inner score_mod is empty");
  if (identity(inner) == identity(noop_score())) return inner;
  State& st = *state_;
  std::lock_guard lock(st.mutex);
  auto it = st.scores.find(identity(inner));
  if (it != st.scores.end()) return it->second.second;
  std::vector<CapturedTensor> captures{st.rowSequence, st.rowPosition, st.rowKeyStart};
  for (const CapturedTensor& c : inner.captures()) captures.push_back(c);
  ScoreMod wrapper("varlen(" + inner.name() + ")",
                   [inner, seq = st.rowSequence, pos = st.rowPosition, ks = st.rowKeyStart](
                       const Tile& s, const Tile&, const Tile& h, const Tile& q, const Tile& kv) {
                     return inner(s, seq(q), h, pos(q), kv - ks(q));
                   },
                   captures);
  st.scores.emplace(identity(inner), std::pair{inner, wrapper});
  return wrapper;
}

BlockMask PackedSequences::blockMask(const MaskMod& inner, int64_t H, BlockSizes sizes) const {
  if (sameBody(inner, noop_mask()))
    return blockMask(inner, [](int64_t, int64_t, int64_t, int64_t keys) { return std::pair{int64_t(0), keys - 1}; }, H,
                     sizes);
  if (sameBody(inner, causal_mask()))
    return blockMask(inner, [](int64_t, int64_t, int64_t position, int64_t) { return std::pair{int64_t(0), position}; },
                     H, sizes);
  const State& st = *state_;
  return createBlockMask(mask(inner), 1, H, totalQueries(), totalKeys(), sizes, {st.space, st.options.stream});
}

BlockMask PackedSequences::blockMask(const MaskMod& inner, const SequenceRowKeys& innerKeys, int64_t H,
                                     BlockSizes sizes) const {
  if (!innerKeys) throw Error("PackedSequences::blockMask: the inner row interval function is empty");
  MaskMod wrapped = mask(inner);
  const State& st = *state_;
  // Row i of sequence s allows the packed keys k0 + [lo, hi], clipped to the sequence's [k0, k1).
  return rowIntervalBlockMask(
      wrapped, 1, H, totalQueries(), totalKeys(),
      [&](int64_t, int64_t h, int64_t i) {
        const int64_t s = sequenceOfQuery(i), k0 = st.keyStarts[size_t(s)], keys = st.keyStarts[size_t(s) + 1] - k0;
        auto [lo, hi] = innerKeys(s, h, queryPosition(i), keys);
        return std::pair{k0 + std::max<int64_t>(lo, 0), k0 + std::min<int64_t>(hi, keys - 1)};
      },
      sizes, {st.space, st.options.stream});
}

}  // namespace flextile::attention
