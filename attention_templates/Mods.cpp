#include "attention_templates/Mods.h"

#include <filesystem>

#include <climits>
#include <cmath>

#include "ir/Hash.h"

namespace flextile::attention {

using namespace flextile::dsl;

dsl::Kernel& detail::ModState::kernel(const std::string& key, const std::function<dsl::Kernel()>& make) {
  return kernelFor(key, std::nullopt, make);
}

dsl::Kernel& detail::ModState::kernel(const std::string& key, std::weak_ptr<const void> partner,
                                      const std::function<dsl::Kernel()>& make) {
  return kernelFor(key, std::move(partner), make);
}

dsl::Kernel* detail::ModState::find(const std::string& key) {
  std::lock_guard lock(mutex);
  auto it = kernels.find(key);
  return it != kernels.end() && it->second.live() ? it->second.kernel.get() : nullptr;
}

// make() runs outside the lock: a kernel's factory detaches the mods it holds, which reads their
// probe facts under their states' locks (this one's included). Two threads that both miss make two
// kernels; the first stored is kept. Making a Kernel traces nothing, so the loser costs little.
dsl::Kernel& detail::ModState::kernelFor(const std::string& key, std::optional<std::weak_ptr<const void>> partner,
                                         const std::function<dsl::Kernel()>& make) {
  if (dsl::Kernel* found = find(key)) return *found;
  auto made = std::make_unique<dsl::Kernel>(make());
  std::lock_guard lock(mutex);
  // Drop the entries whose partner is gone (a caller holds this one's: it is making a kernel for
  // it), among them one found under this key with an expired partner (its address reused by a new mod).
  std::erase_if(kernels, [](const auto& entry) { return !entry.second.live(); });
  auto it = kernels.emplace(key, KernelEntry{std::move(made), std::move(partner)}).first;
  return *it->second.kernel;
}

const detail::ModState::ProbeFacts& detail::ModState::probeOnce(const std::function<ProbeFacts()>& compute) {
  std::lock_guard lock(mutex);
  // A mod that cannot be traced on the probe tiles fails the same way every time: remember why, so
  // the calls that ask (every untuned flex_attention call does) do not trace it again.
  if (probeError) throw *probeError;
  if (!probe) {
    try {
      probe = compute();
    } catch (const Error& e) {
      probeError = e;
      throw;
    }
  }
  return *probe;
}

namespace {
// The probe every mod is traced on for its structural hash: scalar b and h,
// 16-row and 16-column index tiles (the shapes a template passes, smaller),
// and for score mods an f32 score tile. One kernel name for all, so only the
// mod's body decides the hash.
constexpr int kProbe = 16;

// The facts of a probe trace; `ownLoads` is how many full-tile loads the probe itself makes (the
// score probe reads its scores).
detail::ModState::ProbeFacts probeFacts(Kernel& probe, int ownLoads, const std::vector<CapturedTensor>& given) {
  const auto traced = probe.trace();  // owns the function
  const ir::Function& f = *traced;
  int fullTileLoads = 0, keyLoads = 0;
  f.walk([&](const ir::Op& op) {
    if (op.kind() == ir::OpKind::Load && op.result()->type().shape() == ir::Shape{kProbe, kProbe}) ++fullTileLoads;
    if (op.kind() == ir::OpKind::Load && op.result()->type().shape() == ir::Shape{1, kProbe}) ++keyLoads;
  });
  std::vector<CapturedTensor> captures = given;
  for (const auto& slot : probe.captures()) {
    bool known = false;
    for (const CapturedTensor& c : captures) known = known || c.slot() == slot;
    if (!known) captures.push_back(CapturedTensor::fromSlot(slot));
  }
  return {ir::structuralHash(f), fullTileLoads > ownLoads, keyLoads > 0 || fullTileLoads > ownLoads, std::move(captures)};
}


// `what()` names the mod in the error; called only then.
template <class What>
std::optional<MemorySpace> spaceOf(const What& what, const std::vector<CapturedTensor>& captures) {
  std::optional<MemorySpace> space;
  const CapturedTensor* first = nullptr;
  for (const auto& c : captures) {
    MemorySpace s = c.tensor().space();
    if (space && *space != s)
      throw Error(what() + ": captured tensors '" + first->name() + "' and '" + c.name() +
                  "' are in different memory spaces (one host, one device)");
    if (!space) first = &c;
    space = s;
  }
  return space;
}

Shape broadcastShape(const Shape& a, const Shape& b) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1;
    int64_t db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    out[i] = std::max(da, db);
  }
  return out;
}

bool broadcastsTo(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t i = 0; i < from.size(); ++i) {
    int64_t f = from[from.size() - 1 - i], t = to[to.size() - 1 - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

std::vector<CapturedTensor> mergeCaptures(const std::vector<MaskMod>& masks) {
  std::vector<CapturedTensor> out;
  for (const auto& m : masks)
    for (const auto& c : m.captures()) {
      bool seen = false;
      for (const auto& o : out) seen = seen || o.slot() == c.slot();
      if (!seen) out.push_back(c);
    }
  return out;
}

void requireDefined(const std::vector<MaskMod>& masks, const char* op) {
  for (size_t i = 0; i < masks.size(); ++i)
    if (!masks[i].defined()) throw Error(std::string(op) + ": mask " + std::to_string(i) + " is an empty MaskMod");
}
}  // namespace

// ---- MaskMod / ScoreMod ----------------------------------------------------

namespace {
// " (called from FlexAttentionForward.cpp:200)": where the template traced the mod, after the
// user's line where it was made.
std::string calledFrom(const SourceLoc& loc) {
  return " (called from " + std::filesystem::path(loc.file_name()).filename().string() + ":" +
         std::to_string(loc.line()) + ")";
}
}  // namespace

template <class Mod, class Fn>
detail::ModBase<Mod, Fn>::ModBase(std::string name, Fn fn, std::vector<CapturedTensor> captures, SourceLoc defined)
    : name_(std::move(name)), fn_(std::move(fn)), captures_(std::move(captures)),
      state_(std::make_shared<detail::ModState>()), defined_(defined) {
  if (!fn_) throw Error(describe() + ": the function is empty");
  for (const auto& c : captures_)
    if (!c.defined()) throw Error(describe() + ": an empty CapturedTensor in its captures");
}

template <class Mod, class Fn>
Mod detail::ModBase<Mod, Fn>::withOwnState() const {
  Mod copy = static_cast<const Mod&>(*this);
  copy.state_ = std::make_shared<detail::ModState>();
  return copy;
}

template <class Mod, class Fn>
Mod detail::ModBase<Mod, Fn>::detached() const {
  Mod copy = withOwnState();
  if (!fn_) return copy;
  // The copy knows what this mod's probe found (its captures among them), so a kernel tracing the
  // copy sees the same parameters as the host that binds them, without probing again mid-trace.
  try {
    (void)probe();
  } catch (const Error&) {
  }
  std::lock_guard lock(state_->mutex);
  copy.state_->probe = state_->probe;
  copy.state_->probeError = state_->probeError;
  return copy;
}

template <class Mod, class Fn>
uint64_t detail::ModBase<Mod, Fn>::structuralHash() const {
  return probe().structuralHash;
}
template <class Mod, class Fn>
bool detail::ModBase<Mod, Fn>::gathersPerElement() const {
  return probe().gathersPerElement;
}

template <class Mod, class Fn>
bool detail::ModBase<Mod, Fn>::gathersAlongKeys() const {
  return probe().gathersAlongKeys;
}

template <class Mod, class Fn>
const detail::ModState::ProbeFacts& detail::ModBase<Mod, Fn>::probe() const {
  if (!fn_) throw Error(std::string(Mod::kKind) + ": structuralHash of an empty " + Mod::kClass);
  return state_->probeOnce([&] {
    // A copy with its own state: the probe kernel does not keep ours alive.
    Kernel probe = Mod::probeKernel(withOwnState());
    return probeFacts(probe, Mod::kProbeOwnLoads, captures_);
  });
}

template <class Mod, class Fn>
const std::vector<CapturedTensor>& detail::ModBase<Mod, Fn>::captures() const {
  if (!fn_) return captures_;
  try {
    return probe().captures;
  } catch (const Error&) {
    return captures_;  // the probe tiles do not fit this mod: what it was given
  }
}

template <class Mod, class Fn>
std::optional<MemorySpace> detail::ModBase<Mod, Fn>::captureSpace() const {
  // Asked on every call: the mod's description is formed only for an error.
  return spaceOf([&] { return describe(); }, captures());
}

template class detail::ModBase<MaskMod, detail::MaskModFn>;
template class detail::ModBase<ScoreMod, detail::ScoreModFn>;

MaskMod::MaskMod(std::string name, Fn fn, std::vector<CapturedTensor> captures, SourceLoc defined)
    : ModBase(std::move(name), std::move(fn), std::move(captures), defined) {}

Tile MaskMod::operator()(const Tile& b, const Tile& h, const Tile& q, const Tile& kv, SourceLoc loc) const {
  if (!fn_) traceError(loc, kKind, "an empty MaskMod was called");
  const std::string what = describe();
  Tile r = fn_(b, h, q, kv);
  const Shape shape = broadcastShape(q.shape(), kv.shape());
  if (!r.valid()) traceError(defined_, what, "returned an empty Tile" + calledFrom(loc));
  if (r.dtype() != DType::I1)
    traceError(defined_, what, "must return i1 (a comparison), got " + r.type().str() + calledFrom(loc));
  if (!broadcastsTo(r.shape(), shape))
    traceError(defined_, what, "returned " + r.type().str() + ", which does not broadcast to the index tiles' shape " +
                                   ir::shapeString(shape) + calledFrom(loc));
  return r.shape() == shape ? r : r.broadcast_to(shape, loc);
}

Kernel MaskMod::probeKernel(const MaskMod& self) {
  return kernel("mod_probe", [self](Ptr<i8> out, Int b, Int h) {
    auto q = arange(0, kProbe).expand(1), kv = arange(0, kProbe).expand(0);
    store(out + q * kProbe + kv, self(b, h, q, kv));
  });
}

ScoreMod::ScoreMod(std::string name, Fn fn, std::vector<CapturedTensor> captures, SourceLoc defined)
    : ModBase(std::move(name), std::move(fn), std::move(captures), defined) {}

Tile ScoreMod::operator()(const Tile& score, const Tile& b, const Tile& h, const Tile& q, const Tile& kv,
                          SourceLoc loc) const {
  if (!fn_) traceError(loc, kKind, "an empty ScoreMod was called");
  const std::string what = describe();
  Tile r = fn_(score, b, h, q, kv);
  if (!r.valid()) traceError(defined_, what, "returned an empty Tile" + calledFrom(loc));
  if (!ir::isFloat(r.dtype()))
    traceError(defined_, what, "must return a floating-point score, got " + r.type().str() + calledFrom(loc));
  if (!broadcastsTo(r.shape(), score.shape()))
    traceError(defined_, what, "returned " + r.type().str() + ", which does not broadcast to the score " +
                                   score.type().str() + calledFrom(loc));
  if (r.dtype() != score.dtype()) r = r.to(score.dtype(), loc);
  return r.shape() == score.shape() ? r : r.broadcast_to(score.shape(), loc);
}

Kernel ScoreMod::probeKernel(const ScoreMod& self) {
  return kernel("mod_probe", [self](Ptr<f32> scores, Int b, Int h) {
    auto q = arange(0, kProbe).expand(1), kv = arange(0, kProbe).expand(0);
    auto at = scores + q * kProbe + kv;
    store(at, self(load(at), b, h, q, kv));
  });
}

// ---- algebra ---------------------------------------------------------------

MaskMod noop_mask() {
  static const MaskMod noop("noop", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return full(broadcastShape(q.shape(), kv.shape()), 1, DType::I1);
  });
  return noop;
}

namespace {
MaskMod combine(const std::vector<MaskMod>& masks, bool conjunction) {
  const char* op = conjunction ? "and_masks" : "or_masks";
  requireDefined(masks, op);
  if (masks.empty()) {
    if (conjunction) return noop_mask();
    return MaskMod("none", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
      return full(broadcastShape(q.shape(), kv.shape()), 0, DType::I1);
    });
  }
  if (masks.size() == 1) return masks[0];
  std::string name = conjunction ? "and(" : "or(";
  for (size_t i = 0; i < masks.size(); ++i) name += (i ? ", " : "") + masks[i].name();
  name += ")";
  return MaskMod(name,
                 [masks, conjunction](const Tile& b, const Tile& h, const Tile& q, const Tile& kv) {
                   Tile acc = masks[0](b, h, q, kv);
                   for (size_t i = 1; i < masks.size(); ++i)
                     acc = conjunction ? (acc & masks[i](b, h, q, kv)) : (acc | masks[i](b, h, q, kv));
                   return acc;
                 },
                 mergeCaptures(masks));
}
}  // namespace

MaskMod and_masks(const std::vector<MaskMod>& masks) { return combine(masks, true); }
MaskMod or_masks(const std::vector<MaskMod>& masks) { return combine(masks, false); }

MaskMod not_mask(const MaskMod& m) {
  requireDefined({m}, "not_mask");
  return MaskMod("not(" + m.name() + ")",
                 [m](const Tile& b, const Tile& h, const Tile& q, const Tile& kv) { return !m(b, h, q, kv); },
                 m.captures());
}

// ---- standard masks --------------------------------------------------------

MaskMod causal_mask() {
  static const MaskMod causal("causal", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) { return q >= kv; });
  return causal;
}

namespace {
// One MaskMod per (kind, parameter) for the standard masks that bake a number
// into their code, so a second mask with the same parameter (a new BlockMask
// for the next batch, say) finds the kernels traced for the first one.
MaskMod memoizedMask(const std::string& name, const std::function<MaskMod()>& make) {
  static std::mutex mutex;
  static std::map<std::string, MaskMod> masks;
  std::lock_guard lock(mutex);
  auto it = masks.find(name);
  if (it == masks.end()) it = masks.emplace(name, make()).first;
  return it->second;
}
}  // namespace

MaskMod sliding_window_mask(int64_t window) {
  if (window < 1) throw Error("sliding_window_mask: the window must be at least 1 (it counts the query), got " +
                              std::to_string(window));
  if (window > INT32_MAX) throw Error("sliding_window_mask: window " + std::to_string(window) + " exceeds i32");
  const std::string name = "sliding_window(" + std::to_string(window) + ")";
  return memoizedMask(name, [&] {
    return MaskMod(name, [window](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
      return (q >= kv) & (q - kv < window);
    });
  });
}

MaskMod sliding_window_mask(CapturedTensor windowPerHead) {
  if (!windowPerHead.defined()) throw Error("sliding_window_mask: an empty CapturedTensor");
  if (windowPerHead.rank() != 1 || !ir::isInteger(windowPerHead.dtype()) || windowPerHead.dtype() == DType::I1)
    throw Error("sliding_window_mask: per-head windows must be an integer tensor [H], got " +
                windowPerHead.tensor().describe());
  return MaskMod("sliding_window(" + windowPerHead.name() + "[h])",
                 [w = windowPerHead](const Tile&, const Tile& h, const Tile& q, const Tile& kv) {
                   return (q >= kv) & (q - kv < w(h));
                 },
                 {windowPerHead});
}

MaskMod prefix_lm_mask(int64_t prefixLength) {
  if (prefixLength < 0 || prefixLength > INT32_MAX)
    throw Error("prefix_lm_mask: the prefix length must be in [0, 2^31), got " + std::to_string(prefixLength));
  const std::string name = "prefix_lm(" + std::to_string(prefixLength) + ")";
  return memoizedMask(name, [&] {
    return MaskMod(name, [prefixLength](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
      return (kv < prefixLength) | (q >= kv);
    });
  });
}

MaskMod document_mask(CapturedTensor ids) {
  if (!ids.defined()) throw Error("document_mask: an empty CapturedTensor");
  if ((ids.rank() != 1 && ids.rank() != 2) || !ir::isInteger(ids.dtype()) || ids.dtype() == DType::I1)
    throw Error("document_mask: document ids must be an integer tensor [L] or [B, L], got " + ids.tensor().describe());
  return MaskMod("document(" + ids.name() + ")",
                 [ids](const Tile& b, const Tile&, const Tile& q, const Tile& kv) {
                   if (ids.rank() == 1) return ids(q) == ids(kv);
                   return ids(b, q) == ids(b, kv);
                 },
                 {ids});
}

MaskMod document_mask_from_offsets(CapturedTensor offsets) {
  if (!offsets.defined()) throw Error("document_mask_from_offsets: an empty CapturedTensor");
  if ((offsets.rank() != 1 && offsets.rank() != 2) || offsets.dtype() != DType::I32)
    throw Error("document_mask_from_offsets: offsets must be an i32 tensor [D + 1] or [B, D + 1], got " +
                offsets.tensor().describe());
  return MaskMod("document_offsets(" + offsets.name() + ")",
                 [o = offsets](const Tile& b, const Tile&, const Tile& q, const Tile& kv) {
                   // doc(i) = #{k in 1..D-1 : o_k <= i}: count the inner boundaries at or before i.
                   auto boundary = [&](const Tile& k) { return o.rank() == 1 ? o(k) : o(b, k); };
                   auto [dq, dk] = for_range(1, o.size(-1) - 1, 1,
                                             std::tuple{zeros(q.shape(), DType::I32), zeros(kv.shape(), DType::I32)},
                                             [&](Tile k, Tile countQ, Tile countKv) {
                                               Tile at = boundary(k);
                                               return std::tuple{countQ + (at <= q), countKv + (at <= kv)};
                                             });
                   return dq == dk;
                 },
                 {offsets});
}

// ---- score mods ------------------------------------------------------------

ScoreMod noop_score() {
  static const ScoreMod noop("noop", [](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile&) { return s; });
  return noop;
}

ScoreMod alibi(CapturedTensor slopes) {
  if (!slopes.defined()) throw Error("alibi: an empty CapturedTensor");
  if (slopes.rank() != 1 || !ir::isFloat(slopes.dtype()))
    throw Error("alibi: slopes must be a float tensor [H], got " + slopes.tensor().describe());
  return ScoreMod("alibi(" + slopes.name() + ")",
                  [slopes](const Tile& s, const Tile&, const Tile& h, const Tile& q, const Tile& kv) {
                    // Positions convert on the [BM, 1] and [1, BN] tiles, then one subtract and one
                    // fma per score (exactly (kv - q) converted, for positions below 2^24).
                    return s + slopes(h).to(s.dtype()) * (kv.to(s.dtype()) - q.to(s.dtype()));
                  },
                  {slopes});
}

ScoreMod soft_cap(double cap) {
  if (!(cap > 0) || !std::isfinite(cap)) throw Error("soft_cap: the cap must be a positive number, got " + std::to_string(cap));
  return ScoreMod("soft_cap(" + std::to_string(cap) + ")",
                  [cap](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile&) {
                    return cap * tanh(s * (1.0 / cap));
                  });
}

ScoreMod bias_table(CapturedTensor table) {
  if (!table.defined()) throw Error("bias_table: an empty CapturedTensor");
  if (table.rank() < 2 || !ir::isFloat(table.dtype()))
    throw Error("bias_table: the table must be a float tensor [Lq, Lkv], [H, Lq, Lkv] or [B, H, Lq, Lkv], got " +
                table.tensor().describe());
  return ScoreMod("bias_table(" + table.name() + ")",
                  [table](const Tile& s, const Tile& b, const Tile& h, const Tile& q, const Tile& kv) {
                    Tile bias = table.rank() == 2 ? table(q, kv) : table.rank() == 3 ? table(h, q, kv) : table(b, h, q, kv);
                    return s + bias.to(s.dtype());
                  },
                  {table});
}

}  // namespace flextile::attention
