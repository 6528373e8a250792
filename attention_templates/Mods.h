// score_mod and mask_mod: the two small functions an attention variant is
// made of, as C++ callables over DSL tiles.
//
//   mask_mod(b, h, q_idx, kv_idx) -> i1      true: the pair (q_idx, kv_idx) takes part
//   score_mod(score, b, h, q_idx, kv_idx)     the score after scaling, modified
//
// b and h are i32 scalars (the query head under GQA); inside a template q_idx
// is an i32 [BM, 1] tile and kv_idx an i32 [1, BN] tile of *global* positions,
// so one call evaluates a whole [BM, BN] tile — the same function as the
// element-wise definition, vectorized. A mod is traced into whatever kernel
// calls it (the forward template, the BlockMask builder), so it costs a few
// inlined instructions and no call.
//
// Tensors a mod reads are captured explicitly (dsl/Capture.h): they become
// parameters of the kernel being traced, so new values never recompile.
// Index tiles may reach past the sequence in tail tiles; captured reads there
// give 0 and the template discards those lanes.
//
// The standard masks use 0-based positions and PyTorch's conventions:
//   causal           kv <= q (top-left aligned when Q_LEN != KV_LEN: query i
//                    sees keys 0..i, whatever the lengths)
//   sliding window W kv <= q and q - kv < W (W counts the query itself)
//   prefix LM P      kv < P or kv <= q (the first P keys are seen by everyone)
//   documents        doc(q) == doc(kv), no causality (combine with causal_mask)
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dsl/DSL.h"

namespace flextile::attention {

using dsl::CapturedTensor;
using dsl::SourceLoc;
using dsl::Tile;

namespace detail {
// Kernels made for one mod (the BlockMask builders), shared by its copies, so
// building a second mask with the same mod neither retraces nor recompiles.
struct ModState {
  std::mutex mutex;
  // A kernel and, for one made for a pair of mods (a template's kernel, kept in the mask mod's
  // state), the other mod's lifetime (ModBase::lifetime): the entry goes once that mod is gone.
  struct KernelEntry {
    std::unique_ptr<dsl::Kernel> kernel;
    std::optional<std::weak_ptr<const void>> partner;
    bool live() const { return !partner || !partner->expired(); }
  };
  std::map<std::string, KernelEntry> kernels;
  // What the probe trace of the mod shows, computed once (MaskMod/ScoreMod::structuralHash).
  struct ProbeFacts {
    uint64_t structuralHash;
    bool gathersPerElement;  // loads a tile of the index tiles' full shape (a value per score)
    bool gathersAlongKeys;   // loads a value per key column ([1, kv] or per score)
    // The captures the mod was given followed by those it reads without having been given them.
    std::vector<dsl::CapturedTensor> captures;
  };
  std::optional<ProbeFacts> probe;
  std::optional<Error> probeError;  // why the probe trace failed, once it has
  dsl::Kernel& kernel(const std::string& key, const std::function<dsl::Kernel()>& make);
  // The kernel of `key` made for this mod together with the mod whose lifetime is `partner`. The
  // kernel must not hold that mod (it holds a detached copy): once the partner and its copies are
  // gone, its entries are dropped at the next insertion, so a long-lived mask used with a fresh
  // score mod per call (one per request, say) keeps a bounded number of kernels, not one per mod
  // for the life of the process. A key found with an expired partner (its address reused by a new
  // mod) is made again.
  dsl::Kernel& kernel(const std::string& key, std::weak_ptr<const void> partner,
                      const std::function<dsl::Kernel()>& make);
  // The live kernel of `key`, or nullptr (nothing is made).
  dsl::Kernel* find(const std::string& key);
  const ProbeFacts& probeOnce(const std::function<ProbeFacts()>& compute);

 private:
  dsl::Kernel& kernelFor(const std::string& key, std::optional<std::weak_ptr<const void>> partner,
                         const std::function<dsl::Kernel()>& make);
};
}  // namespace detail

class MaskMod;
class ScoreMod;

namespace detail {
using MaskModFn = std::function<Tile(const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx)>;
using ScoreModFn = std::function<Tile(const Tile& score, const Tile& b, const Tile& h, const Tile& q_idx,
                                      const Tile& kv_idx)>;

// What a MaskMod and a ScoreMod are, but for their signature and what they must return: a name, the
// function, the captures, the kernels kept for it (ModState) and the facts of its probe trace.
// `Mod` is the derived class; it gives the kind's names (kKind "mask_mod", kClass "MaskMod") and
// its probe kernel (probeKernel), and checks what its function returns in operator().
template <class Mod, class Fn>
class ModBase {
 public:
  bool defined() const { return fn_ != nullptr; }
  const std::string& name() const { return name_; }
  const Fn& fn() const { return fn_; }
  // Every tensor the mod reads: those it was given, then those its probe trace reads without having
  // been given them (a capture is declared once, where the lambda reads it). A mod the probe tiles
  // cannot trace reports the given ones.
  const std::vector<CapturedTensor>& captures() const;
  // Where the captured tensors live; nullopt without captures. Mixed spaces are an error.
  std::optional<dsl::MemorySpace> captureSpace() const;
  // Kernels made for this mod (the BlockMask builders, the templates), shared by its copies.
  ModState& state() const { return *state_; }
  // Expires when this mod and all its copies are gone (not its detached copies): what a kernel
  // kept in another mod's state for this one watches (ModState::kernel with a partner).
  std::weak_ptr<const void> lifetime() const { return state_; }
  // The same function, captures, name, source line and probe facts with a state of its own: what a
  // kernel kept in a mod's state holds. Holding the mod itself would be a cycle (state -> kernel -> tracer
  // -> mod -> state) that keeps the mod and every kernel traced with it alive for ever.
  Mod detached() const;
  // The structural hash of what the mod computes: the IR it traces to on probe index tiles (and,
  // for a score mod, an f32 probe score), captured tensors as parameters (their dtype and rank, not
  // their values). Two mods with one name but different bodies differ; the same body under two
  // names agrees. Traced once per mod (and its copies). The autotuner keys its per-GPU cache by it.
  uint64_t structuralHash() const;
  // Whether the mod reads a captured tensor once per (q, kv) pair (a gather of the whole tile),
  // from the same probe trace; such mods keep the smaller default tile. Throws as structuralHash.
  bool gathersPerElement() const;
  // Whether it reads a captured tensor per key (a [1, kv] tile, such as document ids, or per score),
  // from the same probe trace: the forward keeps such mods off the warp-specialized schedule, which
  // measured slower for them (bench/RESULTS.md, 2026-12-03). Throws as structuralHash.
  bool gathersAlongKeys() const;

 protected:
  ModBase() = default;
  ModBase(std::string name, Fn fn, std::vector<CapturedTensor> captures, SourceLoc defined);
  // "mask_mod 'causal'": how errors name the mod.
  std::string describe() const { return std::string(Mod::kKind) + " '" + name_ + "'"; }

  std::string name_;
  Fn fn_;
  std::vector<CapturedTensor> captures_;
  std::shared_ptr<ModState> state_;
  SourceLoc defined_;  // where the user made the mod: errors about what it returns point there

 private:
  const ModState::ProbeFacts& probe() const;
  Mod withOwnState() const;  // detached() without the probe facts (what the probe itself traces)
};
}  // namespace detail

class MaskMod : public detail::ModBase<MaskMod, detail::MaskModFn> {
 public:
  using Fn = detail::MaskModFn;

  MaskMod() = default;  // empty; use noop_mask() for "everything allowed"
  // `captures` may list the tensors `fn` reads; a capture `fn` reads without being listed is found
  // by tracing it (captures()), so listing them is optional. They decide where the mask is built
  // (host or GPU) and are validated before a launch.
  // `defined` is where the mod is made (the caller's line by default): errors about what the
  // mod returns point there rather than into the template that called it.
  MaskMod(std::string name, Fn fn, std::vector<CapturedTensor> captures = {},
          SourceLoc defined = SourceLoc::current());

  // Traces the mod; the result is i1 of the broadcast shape of q_idx and
  // kv_idx. A result of another dtype or shape is an error naming the mod.
  Tile operator()(const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx,
                  SourceLoc loc = SourceLoc::current()) const;

 private:
  friend class detail::ModBase<MaskMod, Fn>;
  static constexpr const char* kKind = "mask_mod";
  static constexpr const char* kClass = "MaskMod";
  static constexpr int kProbeOwnLoads = 0;  // full-tile loads the probe kernel makes itself
  static dsl::Kernel probeKernel(const MaskMod& self);
};

class ScoreMod : public detail::ModBase<ScoreMod, detail::ScoreModFn> {
 public:
  using Fn = detail::ScoreModFn;

  ScoreMod() = default;
  // As MaskMod's.
  ScoreMod(std::string name, Fn fn, std::vector<CapturedTensor> captures = {},
           SourceLoc defined = SourceLoc::current());

  // Traces the mod; the result has the score's shape and dtype (float results
  // are converted to it). A non-float result is an error naming the mod.
  Tile operator()(const Tile& score, const Tile& b, const Tile& h, const Tile& q_idx, const Tile& kv_idx,
                  SourceLoc loc = SourceLoc::current()) const;

 private:
  friend class detail::ModBase<ScoreMod, Fn>;
  static constexpr const char* kKind = "score_mod";
  static constexpr const char* kClass = "ScoreMod";
  static constexpr int kProbeOwnLoads = 1;  // the probe reads its scores
  static dsl::Kernel probeKernel(const ScoreMod& self);
};

extern template class detail::ModBase<MaskMod, detail::MaskModFn>;
extern template class detail::ModBase<ScoreMod, detail::ScoreModFn>;

// ---- mask algebra ----------------------------------------------------------
// Intersection and union of the allowed sets (captures are merged). and_masks
// of nothing is noop_mask; or_masks of nothing allows nothing.
MaskMod and_masks(const std::vector<MaskMod>& masks);
MaskMod or_masks(const std::vector<MaskMod>& masks);
inline MaskMod and_masks(const MaskMod& a, const MaskMod& b) { return and_masks(std::vector<MaskMod>{a, b}); }
inline MaskMod or_masks(const MaskMod& a, const MaskMod& b) { return or_masks(std::vector<MaskMod>{a, b}); }
// Every pair allowed. The mods without captures (noop_mask, causal_mask,
// noop_score, and sliding_window_mask / prefix_lm_mask per parameter value)
// return one shared instance, so kernels traced with them are found again on
// the next call instead of retraced.
MaskMod noop_mask();
// The complement (for tests and for writing "everything but").
MaskMod not_mask(const MaskMod& m);

// ---- standard masks --------------------------------------------------------
MaskMod causal_mask();
// kv <= q < kv + window; window >= 1.
MaskMod sliding_window_mask(int64_t window);
// The same with a per-head window read from a captured i32 tensor [H].
MaskMod sliding_window_mask(CapturedTensor windowPerHead);
// kv < prefixLength or kv <= q.
MaskMod prefix_lm_mask(int64_t prefixLength);
// Same document: ids(q) == ids(kv) for an integer tensor [L], or
// ids(b, q) == ids(b, kv) for [B, L].
MaskMod document_mask(CapturedTensor documentIds);
// Same document with documents given by start offsets, an i32 tensor [D + 1]
// (or [B, D + 1]): 0 = o_0 < o_1 < ... < o_D, document d is [o_d, o_{d+1}).
// Each evaluation loops over the D - 1 inner boundaries; prefer
// document_mask(ids) inside attention when D is large (the structural
// BlockMask builder takes offsets directly).
MaskMod document_mask_from_offsets(CapturedTensor offsets);

// ---- score mods ------------------------------------------------------------
ScoreMod noop_score();
// score + slope[h] * (kv - q), slopes a captured float tensor [H] (ALiBi).
ScoreMod alibi(CapturedTensor slopes);
// cap * tanh(score / cap).
ScoreMod soft_cap(double cap);
// score + table[q, kv] ([Lq, Lkv]), table[h, q, kv] ([H, Lq, Lkv]) or
// table[b, h, q, kv] ([B, H, Lq, Lkv]), any float dtype.
ScoreMod bias_table(CapturedTensor table);

}  // namespace flextile::attention
