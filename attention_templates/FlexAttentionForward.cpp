// The forward template of flex_attention (attention_templates/FlexAttention.h).
//
// One program per (query tile of BLOCK_M rows, query head, batch). It keeps
// its Q tile in registers and walks the KV tiles the BlockMask lists for its
// mask row: first the full blocks (score_mod only), then the partial ones
// (score_mod, then mask_mod before the running max). A mask block of
// KV_BLOCK_SIZE keys is KV_BLOCK_SIZE / BLOCK_N inner steps; step t of a list
// reads the block index at t / R, so K/V addresses depend on one scalar load,
// which the pipeline pass recomputes for the iterations it prefetches.
//
// Paged K/V (flex_attention(q, PagedKV, ...)) is a kernel of its own (key "flex_fwd_paged"), so the
// contiguous kernel's IR is unchanged: its parameters and constants are followed by PagedKvParams
// and PagedKvConstants, the loop's key positions stay logical for the mods and the masks, and only
// the K/V rows go through the page table (detail::kvStorageRows). Keys at or past the batch's
// length are masked like keys past S.
//
// Online softmax in the exp2 domain (scores are scaled by log2 e once), with
// the running max clamped to 0 while a row has seen nothing but -inf, so a
// fully masked row ends with l = 0: out 0, lse -inf.
#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <numbers>
#include <string_view>
#include <utility>

#include <unistd.h>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "codegen/CompileCache.h"
#include "codegen/Ptxas.h"
#include "attention_templates/TemplateParams.h"
#include "dsl/Capture.h"
#include "ir/Hash.h"
#include "ir/Printer.h"
#include "runtime/Device.h"
#include "runtime/Stream.h"

#include <cctype>
#include <climits>
#include <cstdio>
#include <mutex>

namespace flextile::attention {

using namespace flextile::dsl;
using namespace flextile::attention::tmpl;

std::string FlexAttentionConfig::describe() const {
  auto choice = [](auto c, const char* name) {  // WarpSpecialization or LoopSchedule: Auto says nothing
    using C = decltype(c);
    return c == C::On ? std::string(" ") + name : c == C::Off ? std::string(" no-") + name : std::string();
  };
  return "BM" + std::to_string(block_m) + " BN" + std::to_string(block_n) + " w" + std::to_string(num_warps) + " s" +
         std::to_string(num_stages) + choice(warp_specialize, "ws") + choice(turns, "turns") + choice(defer, "defer") +
         choice(persistent, "persistent") + choice(skew, "skew") + choice(overlap, "overlap");
}

FlexAttentionConfig FlexAttentionConfig::parse(std::string_view text) {
  const std::string usage = "config '" + std::string(text) +
                            "': expects BM,BN,W,S (four positive integers), then optionally ,ws or ,no-ws, ,turns or "
                            ",no-turns, ,defer or ,no-defer, ,persistent or ,no-persistent, ,skew or ,no-skew, "
                            ",overlap or ,no-overlap";
  const std::vector<std::string> items = detail::configItems(text);
  if (items.size() < 4) throw Error(usage);
  FlexAttentionConfig c;
  std::vector<int64_t> v;
  for (size_t i = 0; i < 4; ++i) {
    const std::optional<int64_t> x = detail::configInteger(items[i]);
    if (!x || *x < 1) throw Error(usage);
    v.push_back(*x);
  }
  if (v[2] > 1024 || v[3] > 1024) throw Error(usage);
  c.block_m = v[0], c.block_n = v[1], c.num_warps = int(v[2]), c.num_stages = int(v[3]);
  bool ws = false, turns = false, defer = false, persistent = false, skew = false, overlap = false;  // each at most once
  for (size_t i = 4; i < items.size(); ++i) {
    const std::string& w = items[i];
    if ((w == "ws" || w == "no-ws") && !std::exchange(ws, true))
      c.warp_specialize = w == "ws" ? WarpSpecialization::On : WarpSpecialization::Off;
    else if ((w == "turns" || w == "no-turns") && !std::exchange(turns, true))
      c.turns = w == "turns" ? LoopSchedule::On : LoopSchedule::Off;
    else if ((w == "defer" || w == "no-defer") && !std::exchange(defer, true))
      c.defer = w == "defer" ? LoopSchedule::On : LoopSchedule::Off;
    else if ((w == "persistent" || w == "no-persistent") && !std::exchange(persistent, true))
      c.persistent = w == "persistent" ? LoopSchedule::On : LoopSchedule::Off;
    else if ((w == "skew" || w == "no-skew") && !std::exchange(skew, true))
      c.skew = w == "skew" ? LoopSchedule::On : LoopSchedule::Off;
    else if ((w == "overlap" || w == "no-overlap") && !std::exchange(overlap, true))
      c.overlap = w == "overlap" ? LoopSchedule::On : LoopSchedule::Off;
    else
      throw Error(usage);
  }
  return c;
}

FlexAttentionConfig defaultFlexAttentionConfig(DType dtype, int64_t headDim, std::optional<codegen::Target> target,
                                               int64_t queryTiles, bool gathersPerElement) {
  // 64 x 64 tiles on one warpgroup: the portable point, small enough for three programs per SM and
  // the fastest untuned one on small grids.
  FlexAttentionConfig c{64, 64, 4, 2};
  const bool wgmma = target && target->has(codegen::Feature::Wgmma);
  if (headDim > 128 || ir::byteWidth(dtype) == 4) {
    c.block_n = 32;
    // Heads past 128 (MLA's 192, 256) on wgmma, where the grid is large: 128 x 64 on two warpgroups
    // ran 1.53-1.88x the 64 x 32 point on an H100 at B=2 H=16 N=8192 (2048 query tiles; no mask,
    // causal, window 1024 at D = 192 and 256, and D = 192 or 256 with v's head dim 128: 504-657
    // TFLOP/s against 268-444; three stages level or far slower, 128 x 128 no faster than 64 x 32;
    // bench/RESULTS.md, 2026-12-06). Small grids and per-element captures keep the measured-nowhere
    // point, as at D = 128.
    if (wgmma && ir::byteWidth(dtype) == 2 && queryTiles >= kManyQueryTiles && !gathersPerElement) c = {128, 64, 8, 2};
    return c;
  }
  // The H200 figures behind the wgmma points (bench/RESULTS.md, 2026-11-29): at D <= 64, 64 x 128
  // beats 64 x 64 by 6-10 % on every variant measured; at D = 128, 128 x 128 on two warpgroups is
  // 1.05x over the seven variants when the grid holds 2048 tiles of 128 rows (causal and prefix LM
  // 1.14x, no mask 0.98x), but no better at 512 tiles and worse below. Measured with the products on
  // wgmma, so a target without it (sm_90 rather than sm_90a, too) keeps the portable point.
  if (wgmma) {
    if (headDim <= 64) c.block_n = 128;
    else if (queryTiles >= kManyQueryTiles && !gathersPerElement) c = {128, 128, 8, 2};
  }
  return c;
}

namespace detail {

void expectSinks(const char* op, const Tensor& sinks, int64_t Hq, MemorySpace space) {
  if (!sinks.defined()) throw Error(std::string(op) + ": sinks is an empty tensor");
  if (sinks.dtype() != DType::F32 || sinks.shape() != Shape{Hq})
    throw Error(std::string(op) + ": sinks must be f32[" + std::to_string(Hq) + "] (a logit per query head), got " +
                sinks.describe());
  if (!sinks.isContiguous() || sinks.space() != space)
    throw Error(std::string(op) + ": sinks must be contiguous and in q's memory space, got " + sinks.describe());
}

void expectAttentionInput(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is an empty tensor");
  if (t.rank() != 4)
    throw Error(std::string(op) + ": " + what + " must be [B, H, len, D], got " + t.describe());
  if (t.strides()[3] != 1)
    throw Error(std::string(op) + ": the last dim of " + what + " must be contiguous (stride 1), got " +
                t.describe());
  for (int i = 0; i < 4; ++i)
    if (t.strides()[size_t(i)] > INT32_MAX)
      throw Error(std::string(op) + ": " + what + "'s strides exceed int32: " + t.describe());
  // The templates offset by batch and head in 64 bits but by row and column within one head in
  // 32 (row * row stride + d: i32 tiles, the fast path on the GPU), so one head's rows must lie
  // within 2^31 - 1 elements of its first.
  const Shape& s = t.shape();
  const double headSpan = double(s[2] - 1) * double(t.strides()[2]) + double(s[3] - 1);
  if (s[2] > 0 && s[3] > 0 && headSpan > double(INT32_MAX))
    throw Error(std::string(op) + ": " + what + " " + t.describe() + ": one head's rows span " +
                std::to_string(int64_t(headSpan) + 1) + " elements ((len - 1) * row stride + D), more than the " +
                "32-bit row offsets of the kernels reach (2^31 - 1 = 2147483647); split the sequence");
}

void checkAttentionInputs(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod, bool sameBatch) {
  expectAttentionInput("flex_attention", "q", q);
  expectAttentionInput("flex_attention", "k", k);
  expectAttentionInput("flex_attention", "v", v);
  // Every call checks: the sizes are read from the shapes (rank 4 is checked above), not through
  // Tensor::size's range check, two dozen times.
  struct Sizes {
    const Shape& s;
    int64_t size(int d) const { return s[size_t(d)]; }
  } qs{q.shape()}, ks{k.shape()}, vs{v.shape()};
  auto shapeStr = [](const Tensor& t) { return t.describe(); };
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    throw Error("flex_attention: q, k and v must have one dtype, got q " + shapeStr(q) + ", k " + shapeStr(k) +
                ", v " + shapeStr(v));
  if (q.dtype() != DType::BF16 && q.dtype() != DType::F16 && q.dtype() != DType::F32)
    throw Error("flex_attention: dtype must be bf16, f16 or f32, got " + shapeStr(q));
  if (sameBatch && (ks.size(0) != qs.size(0) || vs.size(0) != qs.size(0)))
    throw Error("flex_attention: batch sizes differ: q " + shapeStr(q) + ", k " + shapeStr(k) + ", v " + shapeStr(v));
  if (vs.size(1) != ks.size(1) || vs.size(2) != ks.size(2))
    throw Error("flex_attention: k and v must have the same heads and length: k " + shapeStr(k) + ", v " +
                shapeStr(v));
  if (ks.size(3) != qs.size(3))
    throw Error("flex_attention: q and k must have the same head dim D: q " + shapeStr(q) + ", k " + shapeStr(k) +
                ", v " + shapeStr(v));
  if (ks.size(1) < 1 || qs.size(1) % ks.size(1) != 0)
    throw Error("flex_attention: the query heads (" + std::to_string(qs.size(1)) + ") must be a multiple of the kv heads (" +
                std::to_string(ks.size(1)) + ")");
  if (!detail::supportedHeadDim(qs.size(3)))
    throw Error("flex_attention: head dim D = " + std::to_string(qs.size(3)) + " is not supported (a multiple of 16 up to 256)",
                ErrorKind::Unsupported);
  if (!detail::supportedHeadDim(vs.size(3)))
    throw Error("flex_attention: v's head dim DV = " + std::to_string(vs.size(3)) +
                    " is not supported (a multiple of 16 up to 256): v " + shapeStr(v),
                ErrorKind::Unsupported);
  if (qs.size(2) < 1 || ks.size(2) < 1 || qs.size(0) < 1)
    throw Error("flex_attention: empty input: q " + shapeStr(q) + ", k " + shapeStr(k));
  // The kernels number the rows of lse and the (batch, head) pairs in i32 (b * Hq + h).
  if (double(qs.size(0)) * double(qs.size(1)) > double(INT32_MAX))
    throw Error("flex_attention: B * Hq = " + std::to_string(qs.size(0)) + " * " + std::to_string(qs.size(1)) +
                " passes the kernels' 32-bit (batch, head) index (2^31 - 1 = 2147483647): q " + shapeStr(q));
  if (k.space() != q.space() || v.space() != q.space())
    throw Error("flex_attention: q, k and v must be in one memory space (all host or all device)");
  if (scoreMod.defined() && scoreMod.captureSpace() && *scoreMod.captureSpace() != q.space())
    throw Error("flex_attention: score_mod '" + scoreMod.name() + "' captures tensors in the other memory space");
}

// A mask that lists every block as full (no mask given). Kept per (L, S,
// block sizes), so repeated calls neither rebuild nor re-upload its lists
// (BlockMask keeps its tensors); a few shapes at a time.
BlockMask denseBlockMask(int64_t L, int64_t S, BlockSizes sizes) {
  static std::mutex mutex;
  static std::map<std::array<int64_t, 4>, BlockMask> cache;
  const std::array<int64_t, 4> key{L, S, sizes.q, sizes.kv};
  std::lock_guard lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 16) cache.clear();
  const int64_t nQ = cdiv(L, sizes.q), nKv = cdiv(S, sizes.kv);
  BlockLists partial{std::vector<int32_t>(size_t(nQ), 0), std::vector<int32_t>(size_t(nQ * nKv), 0)};
  BlockLists fullLists{std::vector<int32_t>(size_t(nQ), int32_t(nKv)), std::vector<int32_t>(size_t(nQ * nKv))};
  for (int64_t i = 0; i < nQ; ++i)
    for (int64_t j = 0; j < nKv; ++j) fullLists.indices[size_t(i * nKv + j)] = int32_t(j);
  return cache.emplace(key, BlockMask::fromKvLists(noop_mask(), 1, 1, L, S, sizes, std::move(partial),
                                                    std::move(fullLists)))
      .first->second;
}

std::optional<std::string> configProblem(const FlexAttentionConfig& c, const BlockMask* mask) {
  auto pow2 = [](int64_t x) { return x >= 16 && x <= 256 && (x & (x - 1)) == 0; };
  if (!pow2(c.block_m) || !pow2(c.block_n)) return "BLOCK_M and BLOCK_N must be powers of two in [16, 256]";
  if (c.num_warps < 1 || c.num_warps > 16 || (c.num_warps & (c.num_warps - 1)) != 0)
    return "num_warps must be 1, 2, 4, 8 or 16";
  if (c.num_stages < 1 || c.num_stages > 4) return "num_stages must be 1, 2, 3 or 4";
  if (c.turns == LoopSchedule::On && c.num_warps != 8)
    return "turns need two consumer warpgroups (8 warps), not " + std::to_string(c.num_warps);
  if (c.defer == LoopSchedule::On && c.persistent == LoopSchedule::On)
    return "asks for defer and persistent together, which is not supported yet (compute-sanitizer's racecheck "
           "reports hazards in that kernel; docs/reliability.md)";
  if (c.defer == LoopSchedule::On && (c.skew == LoopSchedule::On || c.overlap == LoopSchedule::On))
    return std::string("asks for defer and ") + (c.skew == LoopSchedule::On ? "skew" : "overlap") +
           " together: both rotate the loop's products, choose one";
  if (c.overlap == LoopSchedule::On && c.skew == LoopSchedule::Off)
    return "asks for overlap without skew: the overlap is an order of the skewed walks";
  if (mask && (mask->qBlockSize() % c.block_m != 0 || mask->kvBlockSize() % c.block_n != 0))
    return "does not tile the BlockMask's blocks (" + std::to_string(mask->qBlockSize()) + " x " +
           std::to_string(mask->kvBlockSize()) + "): BLOCK_M must divide Q_BLOCK_SIZE and BLOCK_N must divide KV_BLOCK_SIZE";
  return std::nullopt;
}

std::optional<codegen::Target> defaultsTarget(MemorySpace space, const std::optional<codegen::Target>& target) {
  if (target) return target;
  if (space != MemorySpace::Device) return std::nullopt;
  runtime::Device& device = runtime::Device::current();
  return codegen::Target::fromCapability(device.capabilityMajor(), device.capabilityMinor());
}

namespace {
std::optional<bool> switchValue(const char* text) {
  if (text && !std::strcmp(text, "1")) return true;
  if (text && !std::strcmp(text, "0")) return false;
  return std::nullopt;
}
}  // namespace

// Both are asked on every call (a dozen switches a forward call): their answers are kept per thread
// while codegen::environmentGeneration() stays, so a launch reads no environment.
std::optional<bool> forcedBySwitch(const char* name) {
  struct Known {
    const char* name;
    std::optional<bool> value;
  };
  thread_local codegen::KeptWhileEnvironmentStays<std::vector<Known>> kept;
  std::vector<Known>& known = kept.get();
  for (const Known& k : known)
    if (k.name == name || !std::strcmp(k.name, name)) return k.value;
  const std::optional<bool> value = switchValue(std::getenv(name));
  if (known.size() < 64) known.push_back({name, value});  // names are literals; a bound in case they are not
  return value;
}

void forcedBySwitches(std::span<const char* const> names, std::span<std::optional<bool>> values) {
  for (std::optional<bool>& v : values) v.reset();
  if (names.size() > 64) throw Error("forcedBySwitches: at most 64 switches a walk");
  // One walk's answer a list of names (the decode's), kept as forcedBySwitch keeps its own.
  // Keyed by the names' addresses: callers pass string literals.
  struct Walk {
    std::vector<const char*> names;
    std::vector<std::optional<bool>> values;
  };
  thread_local codegen::KeptWhileEnvironmentStays<std::vector<Walk>> kept;
  std::vector<Walk>& walks = kept.get();
  for (const Walk& w : walks)
    if (std::ranges::equal(w.names, names) && values.size() == w.values.size()) {
      std::ranges::copy(w.values, values.begin());
      return;
    }
  uint64_t found = 0;  // the first entry of a name counts, as for getenv
  std::array<size_t, 64> lengths;
  for (size_t i = 0; i < names.size(); ++i) lengths[i] = std::strlen(names[i]);
  for (char** e = environ; e && *e; ++e) {
    const char* entry = *e;
    if (entry[0] != 'F' || std::strncmp(entry, "FLEXTILE_", 9) != 0) continue;
    for (size_t i = 0; i < names.size(); ++i) {
      const size_t n = lengths[i];
      if (!(found >> i & 1) && std::strncmp(entry, names[i], n) == 0 && entry[n] == '=') {
        values[i] = switchValue(entry + n + 1);
        found |= uint64_t(1) << i;
      }
    }
  }
  if (walks.size() < 8) walks.push_back({{names.begin(), names.end()}, {values.begin(), values.end()}});
}

std::vector<std::string> configItems(std::string_view text) {
  std::vector<std::string> items;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find(',', start), text.size());
    items.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

std::optional<int64_t> configInteger(const std::string& item) {
  size_t used = 0;
  long long x = 0;
  try {
    x = std::stoll(item, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != item.size()) return std::nullopt;
  return x;
}

namespace {

// Whether the score mod or the mask's mod has a fact of its probe trace (ModBase::gathersPerElement,
// gathersAlongKeys). A mod the probe tiles do not fit counts as having it: the cautious choice, and
// the real trace reports anything truly wrong with the mod.
bool modsShow(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask, bool (ScoreMod::*scoreFact)() const,
              bool (MaskMod::*maskFact)() const) {
  auto shows = [](const auto& mod, auto fact) {
    try {
      return mod.defined() && (mod.*fact)();
    } catch (const Error&) {
      return true;
    }
  };
  return shows(scoreMod, scoreFact) || (blockMask && shows(blockMask->maskMod(), maskFact));
}
}  // namespace

bool warpSpecializeWanted(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                          WarpSpecialization choice) {
  if (const std::optional<bool> forced = forcedBySwitch("FLEXTILE_WARP_SPECIALIZE")) return *forced;
  if (choice != WarpSpecialization::Auto) return choice == WarpSpecialization::On;
  // Measured with the driver's JIT, the document mask's per-key gather made the specialized
  // forward 7.5 % slower; assembled by ptxas it is 8 % faster (316 against 293 TFLOP/s, H200,
  // 2026-12-03).
  if (!modsShow(scoreMod, blockMask, &ScoreMod::gathersAlongKeys, &MaskMod::gathersAlongKeys)) return true;
  return codegen::offlineAssembly() != codegen::OfflineAssembly::Never &&
         !modsShow(scoreMod, blockMask, &ScoreMod::gathersPerElement, &MaskMod::gathersPerElement);
}

bool pingpongWanted(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask) {
  return !modsShow(scoreMod, blockMask, &ScoreMod::gathersPerElement, &MaskMod::gathersPerElement) &&
         !modsShow(scoreMod, blockMask, &ScoreMod::gathersAlongKeys, &MaskMod::gathersAlongKeys);
}

bool persistentWanted(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask) {
  auto captures = [](const auto& mod) {
    try {
      return mod.defined() && !mod.captures().empty();
    } catch (const Error&) {
      return true;
    }
  };
  return !captures(scoreMod) && !(blockMask && captures(blockMask->maskMod()));
}

bool changesScores(const ScoreMod& scoreMod) {
  return scoreMod.defined() && &scoreMod.state() != &noop_score().state();
}

bool modsGatherPerElement(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask) {
  return modsShow(scoreMod, blockMask, &ScoreMod::gathersPerElement, &MaskMod::gathersPerElement);
}

std::string templateKernelKey(const char* kind, const ScoreMod& scoreMod, DType dtype) {
  // Formed on every call (without snprintf, which took 4 % of a decode step's host time).
  char address[2 * sizeof(uintptr_t)];
  const auto [end, ec] = std::to_chars(std::begin(address), std::end(address),
                                       reinterpret_cast<uintptr_t>(&scoreMod.state()), 16);
  std::string key(kind);
  key.reserve(key.size() + sizeof address + 8);
  key += '/';
  key.append(address, end);
  key += '/';
  key += ir::dtypeName(dtype);
  return key;
}

std::string kernelName(const std::string& name) {
  std::string clean;
  for (char ch : name) clean += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return clean;
}

}  // namespace detail

namespace {

// ---- kernel parameters -------------------------------------------------------

// The order is the kernel's ABI and the names are the IR parameters' (dumps and golden tests show
// them); changing either changes the traced IR, its structural hash and every compile cache key.
template <template <class> class P>
struct ForwardParams {
  BOOST_HANA_DEFINE_STRUCT(ForwardParams, (P<Data>, q), (P<Data>, k), (P<Data>, v), (P<Data>, out), (P<F32Ptr>, lse),
                           (P<I32Ptr>, kv_num), (P<I32Ptr>, kv_indices), (P<I32Ptr>, full_kv_num),
                           (P<I32Ptr>, full_kv_indices), (P<I32>, q_len), (P<I32>, kv_len), (P<I32>, q_offset),
                           (P<I32>, q_phase), (P<I32>, mask_q_blocks), (P<I32>, mask_kv_blocks),
                           (P<I32>, mask_b_stride), (P<I32>, mask_h_stride), (P<I32>, q_stride_b),
                           (P<I32>, q_stride_h), (P<I32>, q_stride_m), (P<I32>, k_stride_b), (P<I32>, k_stride_h),
                           (P<I32>, k_stride_n), (P<I32>, v_stride_b), (P<I32>, v_stride_h), (P<I32>, v_stride_n),
                           (P<I32>, out_stride_b), (P<I32>, out_stride_h), (P<I32>, out_stride_m),
                           (P<I32>, q_heads), (P<F32>, scale), (P<I32>, tiles), (P<F32Ptr>, part_out),
                           (P<F32Ptr>, part_lse), (P<I32>, tile_steps), (P<F32Ptr>, max_scores),
                           (P<F32Ptr>, part_max));
};

// The compile-time constants; their order is that of LaunchOptions::constants (part of the hash).
struct ForwardConstants {
  BOOST_HANA_DEFINE_STRUCT(ForwardConstants, (int64_t, BM), (int64_t, BN), (int64_t, D), (int64_t, DP), (int64_t, G),
                           (int64_t, QBS), (int64_t, KVBS), (int64_t, hasScoreMod), (int64_t, hasLse),
                           (int64_t, qDivisible), (int64_t, kvDivisible), (int64_t, hasFull), (int64_t, hasPartial),
                           (int64_t, tma), (int64_t, warpSpecialize), (int64_t, pingpong), (int64_t, defer),
                           (int64_t, positiveScale), (int64_t, persistent), (int64_t, splitLastRound),
                           (int64_t, skew), (int64_t, tileOrder), (int64_t, DV), (int64_t, DVP), (int64_t, DS),
                           (int64_t, DVS), (int64_t, qUnpipelined), (int64_t, hasMaxScores),
                           (int64_t, hasSinks));
};

// The forward's `skew` constant: which walks are skewed (the full ones, or every one), and whether
// their softmax overlaps the previous step's P·V (FLEXTILE_SKEW_OVERLAP=1).
constexpr int64_t kSkewFullWalks = 1, kSkewEveryWalk = 2, kSkewOverlap = 4;

// A split last round's cut (Stream-K), the same arithmetic in the forward and the merge kernel: the
// last round's tiles' steps laid end to end (`units` of them), program q's run is steps
// [runStart(q), runStart(q + 1)), and its pieces go to slots 2q and 2q + 1 (a run shorter than a
// tile holds pieces of at most two). Tile j's pieces are those of programs firstProgramOf(j) ..
// lastProgramOf(j): floor((x · P + P − 1) / units) for x = the tile's first and last step.
struct LastRoundCut {
  Tile programs, tileSteps, wholeRounds, units;
  LastRoundCut(const Tile& tiles, const Tile& programs, const Tile& tileSteps)
      : programs(programs), tileSteps(tileSteps), wholeRounds(tiles / programs),
        units((tiles - wholeRounds * programs) * tileSteps) {}
  Tile runStart(const Tile& q) const { return q * units / programs; }
  Tile slot(const Tile& q, const Tile& j) const { return q * 2 + (j - runStart(q) / tileSteps); }
  Tile firstProgramOf(const Tile& j) const { return (j * tileSteps * programs + programs - 1) / units; }
  Tile lastProgramOf(const Tile& j) const { return ((j * tileSteps + tileSteps - 1) * programs + programs - 1) / units; }
};

// ---- traced kernel -----------------------------------------------------------

// The traced program. `scoreMod` and `maskMod` are inlined where they are called. `paged`: the
// kernel reads a paged K/V (its constants follow ForwardConstants, its parameters ForwardParams).
void traceForward(ir::Function& f, const std::vector<int64_t>& constants, DType dt, const ScoreMod& scoreMod,
                  const MaskMod& maskMod, bool paged) {
  const size_t ownConstants = constantCount<ForwardConstants>();
  const auto k = constantsFrom<ForwardConstants>(
      std::vector<int64_t>(constants.begin(), constants.begin() + std::ptrdiff_t(ownConstants)));
  // Warp-specialized (codegen/passes/WarpSpecialize.cpp): a producer warpgroup fills the K and V
  // rings, and Q stays resident in shared memory as wgmma's A operand (with Q in registers the
  // specialized forward ran 8-11 % slower on the H200). Otherwise Q stays in registers: resident
  // in shared memory it made that schedule 3-6 % slower (bench/RESULTS.md).
  if (k.warpSpecialize) f.attrs()["warp_specialize"] = int64_t(1);
  else f.attrs()["wgmma_register_a"] = int64_t(1);
  if (k.tma) f.attrs()["tma"] = int64_t(1);  // the pipeline may fill the K and V rings with TMA
  if (k.pingpong) f.attrs()["pingpong"] = int64_t(1);  // the consumers take turns issuing products
  // exp2 keeps ex2's non-ftz form where the warpgroups take turns on unoverlapped walks: with ftz
  // (fewer instructions a score) no mask, causal and prefix LM ran 2 % slower and ALiBi 4 % (it
  // spills 16-44 bytes), the window level; without turns (document) or overlapped (soft-cap) ftz
  // gained 2-3 % (H200, 2026-12-05; codegen/Exp2Emulation.h, exp2FlushesSubnormals).
  if (k.pingpong && !(k.skew & kSkewOverlap)) f.attrs()["exp2_ftz"] = int64_t(0);
  if (k.defer) f.attrs()["defer_accumulation"] = int64_t(1);  // P·V of step t after Q·Kᵀ of step t+1
  // A persistent program's walks share their rings across its tiles (pipeline pass, shared rings),
  // so its producer issues the next tile's K and V during this tile's epilogue: without that the
  // persistent forward ran 0-14 % slower than a program per tile (H200, 2026-12-04).
  // A persistent program's producer carries its peeled walks' bounds and ring state from tile to
  // tile: at the default 24 registers it spills 16-52 bytes (152 where the last round splits), at
  // 32 nothing (offline ptxas). Yet 24 ran faster: its consumers keep 240 registers instead of 232
  // (H100, 2026-12-05: no mask +1.5 %, prefix LM +1.5 %, the window +0.9 %, soft-cap −0.6 to −1.9 %).
  // A peeled walk's three loops share their rings too, or each would set up, fill and invalidate
  // a ring of its own with the loads' latency exposed at every loop's start.
  if (k.persistent || k.skew) f.attrs()["share_rings"] = int64_t(1);
  f.attrs()["reassociate"] = int64_t(1);  // fold-scales: the scale and log2e meet the mod's factors
  // ... and a mod's key positions, start + arange, are scaled as a scalar plus a loop-invariant
  // product (ALiBi: 32 multiplies a thread a step fewer at 128 x 128 on 8 warps; +2.1 % on the H200).
  f.attrs()["fold_invariant_terms"] = int64_t(1);
  // Loads a mod repeats in every step leave the walks (per-row ids, a head's slope), and a mod's
  // per-key reads (the document ids) are issued a step early, off the block index's chain:
  // document +2.4 %, ALiBi +1.1 % on the H200 (bench/RESULTS.md, 2026-12-04).
  f.attrs()["hoist_invariant_loads"] = int64_t(1);
  f.attrs()["prefetch_loads"] = int64_t(1);
  const auto p = declareParams<ForwardParams>(f, dt);
  std::optional<PagedKvConstants> pc;
  std::optional<PagedKvParams<Traced>> pp;
  if (paged) {
    pc = constantsFrom<PagedKvConstants>(
        std::vector<int64_t>(constants.begin() + std::ptrdiff_t(ownConstants), constants.end()));
    pp = declareParams<PagedKvParams>(f, dt);
  }
  std::optional<TileOrderParams<Traced>> order;
  if (k.tileOrder) order = declareParams<TileOrderParams>(f, dt);
  std::optional<SinkParams<Traced>> sinks;
  if (k.hasSinks) sinks = declareParams<SinkParams>(f, dt);

  const double log2e = std::numbers::log2e;
  // A piece of a split last round's tile (splitLastRound): steps [from, to) of the tile's walk,
  // and the slot its partial goes to.
  struct Piece {
    Tile from, to, slot;
  };
  // One query tile: (mBlock, h, b); `piece` only when the program splits its last round.
  auto tile = [&](const Tile& mBlock, const Tile& h, const Tile& b, const Piece* piece = nullptr) {
    Tile hkv = h / k.G;
    Tile offsM = mBlock * k.BM + arange(0, k.BM);
    Tile offsD = arange(0, k.DP);
    Tile b64 = b.to(DType::I64);
    Tile rowLive = offsM < p.q_len;
    Tile dLive = offsD < k.D;
    auto rowsByD = [&](const Tile& rows) {  // [rows, DP] load/store mask
      Tile m = rows.expand(1);
      if (k.DP != k.D) m = m & dLive.expand(0);
      return m;
    };
    const detail::ValueColumns vc(k.D, k.DP, k.DV, k.DVP, offsD);  // V, the accumulator, the output
    const Tile& offsDV = vc.offs;
    auto rowsByDV = [&](const Tile& rows) { return vc.rowsBy(rows, rowsByD); };
    // A split head dim (k.DS, detail::headDimSplit): Q's and K's columns in two power-of-two chunks,
    // Q·Kᵀ the sum of their products; otherwise one tile DP wide (no chunks here). V's own (k.DVS)
    // the same way: V's chunks, an accumulator a chunk (P·V a product each), the output's columns.
    const std::vector<detail::HeadDimChunk> chunks = detail::headDimChunks(k.D, k.DS);
    const std::vector<detail::HeadDimChunk> vChunks = detail::headDimChunks(k.DV, k.DVS);
    const size_t vParts = std::max<size_t>(1, vChunks.size());
    // The walks carry the softmax state as one vector: m, l, then the accumulator's chunks.
    auto state = [](const Tile& m, const Tile& l, const std::vector<Tile>& acc) {
      std::vector<Tile> st{m, l};
      st.insert(st.end(), acc.begin(), acc.end());
      return st;
    };
    auto accOf = [&](const std::vector<Tile>& st) {
      return std::vector<Tile>(st.begin() + 2, st.begin() + 2 + std::ptrdiff_t(vParts));
    };

    auto loadQ = [&](const Tile& offs, bool exact, const auto& live) {  // Q's columns `offs`
      Tile qPtrs = p.q + (b64 * p.q_stride_b + h.to(DType::I64) * p.q_stride_h) +
                  (offsM.expand(1) * p.q_stride_m + offs.expand(0));
      Tile t = exact ? load(qPtrs) : load(qPtrs, live());
      return k.qUnpipelined ? unpipelined(t) : t;
    };
    std::vector<Tile> q;  // Q's tile, or its chunks
    if (chunks.empty()) q.push_back(loadQ(offsD, k.qDivisible && k.DP == k.D, [&] { return rowsByD(rowLive); }));
    for (const detail::HeadDimChunk& c : chunks)
      q.push_back(loadQ(c.offs, k.qDivisible && !c.live.valid(), [&] { return c.rowsBy(rowLive); }));
    Tile kBase = p.k + (b64 * p.k_stride_b + hkv.to(DType::I64) * p.k_stride_h);
    Tile vBase = p.v + (b64 * p.v_stride_b + hkv.to(DType::I64) * p.v_stride_h);
    // Paged: the batch's row of the page table, and where its keys end (kv_len, or its length).
    std::optional<detail::PagedKvRows> pagedRows;
    Tile keyEnd = p.kv_len;
    if (paged) {
      pagedRows = detail::pagedKvRows(*pp, *pc, b);
      keyEnd = detail::pagedKeyEnd(*pp, *pc, b, p.kv_len);
    }
    // Keys past the end may be visited (the last mask block reaching past S, a batch shorter than S):
    // their loads are masked and their scores set to -inf.
    const bool keysMayEnd = !k.kvDivisible || (paged && pc->hasLengths);

    // The mask row of this query tile (B and H broadcast through zero strides).
    Tile maskRow = minimum((mBlock * k.BM + p.q_phase) / k.QBS, p.mask_q_blocks - 1);
    Tile rowBase = b * p.mask_b_stride + h * p.mask_h_stride + maskRow;
    Tile qPos = (offsM + p.q_offset).expand(1);  // global query positions, for the mods
    const int64_t R = k.KVBS / k.BN;

    Tile m0 = full({k.BM}, -INFINITY, DType::F32);
    Tile l0 = zeros({k.BM}, DType::F32);
    std::vector<Tile> acc0;
    if (vChunks.empty()) acc0.push_back(zeros({k.BM, k.DVP}, DType::F32));
    for (const detail::HeadDimChunk& c : vChunks) acc0.push_back(zeros({k.BM, c.offs.shape()[0]}, DType::F32));

    // Both lists' lengths are read before the first walk: the second walk's first block index then
    // waits only for the first walk's end, not for a dependent read of its length after it.
    Tile fullCount = k.hasFull ? load(p.full_kv_num + rowBase) : Tile();
    Tile partialCount = k.hasPartial ? load(p.kv_num + rowBase) : Tile();
    auto walk = [&](const Tile& count, const Tile& indices, bool partial, const std::vector<Tile>& st) {
      Tile listBase = rowBase * p.mask_kv_blocks;
      // Step t's keys: their positions, which are live, and the K/V offsets.
      struct Keys {
        Tile start, offsN, colLive, kvOffs, vOffs, live, vLive;
        Tile kRowOffs, vRowOffs;  // [BN, 1]: K's and V's rows, for their chunks where a head dim is split
      };
      // Skewed walks (below): the full ones (kSkewFullWalks) or every one (kSkewEveryWalk).
      const bool skewWalk = (k.skew & kSkewEveryWalk) || ((k.skew & kSkewFullWalks) && !partial);
      // K's and V's loads need no mask where no key ends and no column is padding (each chunk's
      // own, where the head dim is split).
      const bool kExact = !keysMayEnd && k.DP == k.D, vExact = !keysMayEnd && k.DVP == k.DV;
      auto keysAt = [&](const Tile& t) {
        Tile entry = t / R;
        Tile block = detail::listEntry(indices, listBase, entry, count, p.mask_kv_blocks);
        Keys ks;
        ks.start = block * k.KVBS + (t % R) * k.BN;
        ks.offsN = ks.start + arange(0, k.BN);
        if (!paged) {
          ks.colLive = ks.offsN < p.kv_len;
          if (chunks.empty()) ks.kvOffs = ks.offsN.expand(1) * p.k_stride_n + offsD.expand(0);
          else ks.kRowOffs = ks.offsN.expand(1) * p.k_stride_n;
          if (vChunks.empty()) ks.vOffs = ks.offsN.expand(1) * p.v_stride_n + offsDV.expand(0);
          else ks.vRowOffs = ks.offsN.expand(1) * p.v_stride_n;
        } else {
          // Logical positions for the mods and the masks; physical rows for the loads.
          ks.colLive = ks.offsN < keyEnd;
          Tile rows = detail::kvStorageRows(*pagedRows, ks.start, k.BN, keyEnd);
          if (chunks.empty()) ks.kvOffs = rows.expand(1) * p.k_stride_n + offsD.expand(0);
          else ks.kRowOffs = rows.expand(1) * p.k_stride_n;
          if (vChunks.empty()) ks.vOffs = rows.expand(1) * p.v_stride_n + offsDV.expand(0);
          else ks.vRowOffs = rows.expand(1) * p.v_stride_n;
        }
        if (!kExact && chunks.empty()) ks.live = rowsByD(ks.colLive);
        if (!vExact && vChunks.empty())
          ks.vLive = vc.own ? rowsByDV(ks.colLive) : ks.live.valid() ? ks.live : rowsByD(ks.colLive);
        return ks;
      };
      auto loadK = [&](const Keys& ks) {  // K's tile, or its chunks
        const detail::StreamedRows rows{p.k, p.kv_len, p.k_stride_b, p.k_stride_h, p.k_stride_n};
        if (chunks.empty())
          return std::vector<Tile>{detail::loadStreamedRows(kBase + ks.kvOffs, kExact, ks.live, rows, b, hkv, ks.start,
                                                            k.D, k.tma)};
        return detail::loadStreamedChunks(kBase, ks.kRowOffs, chunks, !keysMayEnd, ks.colLive, rows, b, hkv, ks.start,
                                          k.D, k.tma);
      };
      auto loadV = [&](const Keys& ks) {  // V's tile, or its chunks
        const detail::StreamedRows rows{p.v, p.kv_len, p.v_stride_b, p.v_stride_h, p.v_stride_n};
        if (vChunks.empty())
          return std::vector<Tile>{detail::loadStreamedRows(vBase + ks.vOffs, vExact, ks.vLive, rows, b, hkv, ks.start,
                                                            k.DV, k.tma)};
        return detail::loadStreamedChunks(vBase, ks.vRowOffs, vChunks, !keysMayEnd, ks.colLive, rows, b, hkv, ks.start,
                                          k.DV, k.tma);
      };
      // Without a score_mod and with a positive scale, the scale applies after the row max.
      const bool scaleLater = !k.hasScoreMod && k.positiveScale;
      auto scoresOf = [&](const Keys& ks, Tile s) {  // the mods and masks on the products Q·Kᵀ
        Tile kvPos = ks.offsN.expand(0);
        if (k.hasScoreMod) {
          s = scoreMod(s * p.scale, b, h, qPos, kvPos) * log2e;
        } else if (!k.positiveScale) {
          s = s * p.scale;  // the host folded log2 e into the scale
        }
        if (partial) s = where(maskMod(b, h, qPos, kvPos), s, -INFINITY);
        if (keysMayEnd) s = where(ks.colLive.expand(0), s, -INFINITY);
        return s;
      };
      auto product = [&](const std::vector<Tile>& kt) {  // Q·Kᵀ, chunk by chunk into one accumulator
        Tile s = dot(q[0], kt[0].trans());
        for (size_t i = 1; i < kt.size(); ++i) s = dot(q[i], kt[i].trans(), s);
        return s;
      };
      auto scores = [&](const Keys& ks, const std::vector<Tile>& kt) { return scoresOf(ks, product(kt)); };
      const bool sumAfterProduct = detail::sumAfterProductWanted(!k.hasScoreMod);
      // The next state from state `c` (m, l, the accumulator's chunks), scores `s` and V's chunks.
      auto softmaxStep = [&](const std::vector<Tile>& c, const Tile& s, const std::vector<Tile>& vt) {
        auto [mn, ln, an] =
            detail::onlineSoftmaxStep(c[0], c[1], accOf(c), s, vt, dt, scaleLater ? &p.scale : nullptr, sumAfterProduct);
        return state(mn, ln, an);
      };
      // A piece walks its steps [lo, hi) of the list; a whole tile, all of them.
      const bool pieceWalk = piece && !partial;
      if (!skewWalk) {
        auto step = [&](Tile t, const std::vector<Tile>& c) {
          Keys ks = keysAt(t);
          std::vector<Tile> kt = loadK(ks);
          std::vector<Tile> vt = loadV(ks);
          return softmaxStep(c, scores(ks, kt), vt);
        };
        if (pieceWalk) return for_range(piece->from, minimum(piece->to, count * R), 1, st, step);
        return for_range(0, count * R, 1, st, step);
      }
      const Operand lo = pieceWalk ? Operand(piece->from) : Operand(0);
      Tile hi = pieceWalk ? minimum(piece->to, count * R) : count * R;
      // Skewed: iteration t issues Q·K_t and P·V_{t−1} in one warpgroup turn (one wait), its ring
      // stage holding K_t and V_{t−1}; the walk as FlashAttention-3 writes it — a prologue issuing
      // Q·K_lo alone, steps lo+1 .. hi−1, an epilogue issuing P·V_{hi−1} alone. The prologue and
      // the epilogue are loops of at most one iteration whose stages hold K alone and V alone, on
      // the walk's rings (the pipeline pass's shared rings).
      const Tile headEnd = pieceWalk ? minimum(hi, piece->from + 1) : minimum(hi, 1);
      const Tile tailEnd = where(hi > lo, hi + 1, hi);
      auto stageK = [&](const Tile& t) {
        Keys ks = keysAt(t);
        return std::pair{ks, loadK(ks)};
      };
      // (Clamped: the pipeline computes a stage's addresses even where the loop has no iteration,
      // and an empty walk's step lo − 1 would read its list before the row.)
      auto stageV = [&](const Tile& t) { return loadV(keysAt(maximum(t - 1, lo))); };
      if (!(k.skew & kSkewOverlap)) {
        Tile s0 = full({k.BM, k.BN}, -INFINITY, DType::F32);
        Tile s1 = for_range(lo, headEnd, 1, s0, [&](Tile t, Tile) {
          auto [ks, kt] = stageK(t);
          return scores(ks, kt);
        });
        std::vector<Tile> withScores = st;  // the state, then the scores of the step ahead
        withScores.push_back(s1);
        std::vector<Tile> body = for_range(headEnd, hi, 1, withScores, [&](Tile t, const std::vector<Tile>& c) {
          auto [ks, kt] = stageK(t);
          std::vector<Tile> vt = stageV(t);
          std::vector<Tile> next = softmaxStep(c, c.back(), vt);
          next.push_back(scores(ks, kt));
          return next;
        });
        const Tile sb = body.back();
        body.pop_back();
        return for_range(hi, tailEnd, 1, body,
                         [&](Tile t, const std::vector<Tile>& c) { return softmaxStep(c, sb, stageV(t)); });
      }
      // Overlapped (kSkewOverlap; FlashAttention-3's intra-warpgroup order): iteration t issues
      // Q·Kᵀ of step t, then P·V of step t − 1 with P carried from the previous iteration, and runs
      // the softmax of step t while that P·V is in flight; the rescale of O waits for it.
      auto weigh = [&](const Keys& ks, const Tile& raw, const Tile& mi, const Tile& li) {
        const detail::SoftmaxWeights w = detail::softmaxWeights(mi, scoresOf(ks, raw), scaleLater ? &p.scale : nullptr);
        return std::pair{w, li * w.alpha + sum(w.p, 1)};
      };
      // The prologue hands its rescale of O out rather than applying it: a loop that only scales
      // O would get O in another layout than the products' accumulator (assign-layouts), and
      // O would be converted through shared memory around the steps' loop.
      Tile p0 = zeros({k.BM, k.BN}, dt);
      Tile alpha0 = full({k.BM}, 1.0, DType::F32);
      auto [mh, lh, ph, alphaH] = for_range(lo, headEnd, 1, std::tuple{st[0], st[1], p0, alpha0},
                                            [&](Tile t, Tile mi, Tile li, Tile, Tile) {
                                              auto [ks, kt] = stageK(t);
                                              auto [w, ln] = weigh(ks, product(kt), mi, li);
                                              return std::tuple{w.m, ln, w.p.to(dt), w.alpha};
                                            });
      std::vector<Tile> ah;  // the state, P carried last
      for (const Tile& a : accOf(st)) ah.push_back(a * alphaH.expand(1));
      std::vector<Tile> carried = state(mh, lh, ah);
      carried.push_back(ph);
      std::vector<Tile> body = for_range(headEnd, hi, 1, carried, [&](Tile t, const std::vector<Tile>& c) {
        auto [ks, kt] = stageK(t);
        std::vector<Tile> vt = stageV(t);
        Tile raw = product(kt);
        std::vector<Tile> o;
        for (size_t i = 0; i < vParts; ++i) o.push_back(dot(c.back(), vt[i], c[2 + i]));
        auto [w, ln] = weigh(ks, raw, c[0], c[1]);
        Tile pn = w.p.to(dt);
        std::vector<Tile> next{w.m, ln};
        for (const Tile& oi : o) next.push_back(oi * w.alpha.expand(1));
        next.push_back(pn);
        return next;
      });
      const Tile pb = body.back();
      body.pop_back();
      return for_range(hi, tailEnd, 1, body, [&](Tile t, const std::vector<Tile>& c) {
        std::vector<Tile> vt = stageV(t), next{c[0], c[1]};
        for (size_t i = 0; i < vParts; ++i) next.push_back(dot(pb, vt[i], c[2 + i]));
        return next;
      });
    };

    std::vector<Tile> st = state(m0, l0, acc0);
    if (k.hasFull) st = walk(fullCount, p.full_kv_indices, false, st);
    if (k.hasPartial) st = walk(partialCount, p.kv_indices, true, st);
    Tile m = st[0], l = st[1];
    std::vector<Tile> acc = accOf(st);
    Tile empty = l == 0.0;
    // The largest score is over the keys alone, before a sink joins them.
    const Tile best = k.hasMaxScores ? detail::rowMaxScore(m, empty) : Tile();
    // A piece's partial holds its keys alone: the merge adds the sink, once.
    if (k.hasSinks && !piece) {
      detail::foldSink(m, l, acc, load(sinks->sinks + h) * std::numbers::log2e);
      empty = l == 0.0;
    }
    const Tile rowScale = (1.0 / where(empty, 1.0, l)).expand(1);  // a division per row, not per element
    std::vector<Tile> out;  // the output's tile, or its chunks
    for (const Tile& a : acc) out.push_back(a * rowScale);
    if (piece) {
      // A piece: its partial (the normalized output and m + log2 l, as the decode template's splits
      // write theirs) goes to its slot, for the merge kernel (DVP columns a row: a split v's chunks
      // at their columns, the padding past them never read into the output).
      Tile slotRows = piece->slot.to(DType::I64) * k.BM + arange(0, k.BM);
      for (size_t i = 0; i < vParts; ++i)
        store(p.part_out + (slotRows.expand(1) * k.DVP + (vChunks.empty() ? offsDV : vChunks[i].offs).expand(0)),
              out[i]);
      store(p.part_lse + slotRows, detail::rowLse(m, l, empty, /*natural=*/false));
      if (k.hasMaxScores) store(p.part_max + slotRows, best);
      return;
    }
    // (Each operand named first: the ops are traced in this order, whatever order C++ gives a
    // call's arguments.)
    Tile oRows = p.out + (b64 * p.out_stride_b + h.to(DType::I64) * p.out_stride_h);
    Tile lseRows = p.lse + ((b * p.q_heads + h).to(DType::I64) * p.q_len);
    for (size_t i = 0; i < vParts; ++i) {
      const detail::HeadDimChunk* c = vChunks.empty() ? nullptr : &vChunks[i];
      Tile oPtrs = oRows + (offsM.expand(1) * p.out_stride_m + (c ? c->offs : offsDV).expand(0));
      if (k.qDivisible && (c ? !c->live.valid() : k.DVP == k.DV))
        store(oPtrs, out[i].to(dt));
      else
        store(oPtrs, out[i].to(dt), c ? c->rowsBy(rowLive) : rowsByDV(rowLive));
    }
    auto storeRows = [&](const Tile& ptrs, const Tile& values) {  // a value a row (lse, max scores)
      if (k.qDivisible)
        store(ptrs, values);
      else
        store(ptrs, values, rowLive);
    };
    if (k.hasLse) {
      Tile lse = detail::rowLse(m, l, empty, /*natural=*/true);
      storeRows(lseRows + offsM, lse);
    }
    if (k.hasMaxScores) storeRows(p.max_scores + ((b * p.q_heads + h).to(DType::I64) * p.q_len + offsM), best);
  };
  // Query tiles in reverse launch order: under causal-like masks the last rows have the most
  // blocks, and starting them first shortens the tail of the grid. Persistent (opt-in): a program
  // per SM takes its share of the tiles in that same order, as below.
  // (Each operand named first: the ops are traced in this order, whatever order C++ gives a call's
  // arguments.)
  // With a tile order (tileOrder: BlockMask::heaviestTilesFirst, longest first), the n-th tile
  // handed out is the order's n-th: t = (b·H + h)·mBlocks + m.
  auto orderedTile = [&](const Tile& n, const Tile& mBlocks, const Piece* piece) {
    auto [mBlock, h, b] = detail::tileFromOrder(order->tile_order, n, mBlocks, p.q_heads);
    tile(mBlock, h, b, piece);
  };
  if (!k.persistent) {
    if (k.tileOrder) {
      orderedTile(detail::launchIndex(), num_programs(0), nullptr);
      return;
    }
    Tile mBlock = num_programs(0) - 1 - program_id(0), h = program_id(1), b = program_id(2);
    tile(mBlock, h, b);
    return;
  }
  // Persistent: round r hands tiles r·P .. r·P + P − 1 (launch order) to the P programs, forwards in
  // even rounds and backwards in odd ones, so a program that took a long row (causal: the first of
  // each head) takes a short one next. Modelled on the H200's causal yardstick (2048 tiles, 132
  // programs, 5.2 µs + 1.72 µs a step): 2 % over its dynamic dispatch of one program a tile, where
  // plain striding would be 2 % under.
  Tile mBlocks = (p.q_len + (k.BM - 1)) / k.BM;
  Tile programs = num_programs(0), pid = program_id(0);
  auto tileAt = [&](const Tile& t, const Piece* piece) {
    if (k.tileOrder) return orderedTile(t, mBlocks, piece);
    Tile mBlock = mBlocks - 1 - t % mBlocks, rest = t / mBlocks;
    Tile h = rest % p.q_heads, b = rest / p.q_heads;
    tile(mBlock, h, b, piece);
  };
  auto roundTile = [&](const Tile& r) { return r * programs + where(r % 2 == 1, programs - 1 - pid, pid); };
  if (!k.splitLastRound) {
    Tile rounds = (p.tiles + programs - 1) / programs;
    Tile inLast = p.tiles - (rounds - 1) * programs;  // tiles in the last round
    Tile lastBackwards = (rounds - 1) % 2 == 1;
    Tile lastIndex = where(lastBackwards, programs - 1 - pid, pid);
    Tile mine = rounds - 1 + (lastIndex < inLast).to(DType::I32);
    for_range(0, mine, 1, [&](Tile r) { tileAt(roundTile(r), nullptr); });
    return;
  }
  // Splitting the last round (lastRoundSplits: where every tile walks the same tile_steps steps,
  // there are whole rounds before it and a program's share is a few steps): its tiles' steps, laid
  // end to end, are cut into P equal runs, one a program, as Stream-K cuts a GEMM's K loop
  // (LastRoundCut). A run is shorter than a tile, so it holds pieces of at most two tiles. The
  // pieces are walked in a loop of their own after the whole rounds (whose walks the pipeline then
  // gives rings of their own: on the tile loop's shared rings they cost 7 %) and store partials;
  // the merge kernel (traceLastRoundMerge) folds them. No mask on the H200's yardstick: 2048 tiles
  // on 132 programs are 15 whole rounds and 68 tiles, which take a 16th round of tile time unsplit
  // and 68/132 of one split.
  const LastRoundCut cut(p.tiles, programs, p.tile_steps);
  for_range(0, cut.wholeRounds, 1, [&](Tile r) { tileAt(roundTile(r), nullptr); });
  Tile u0 = cut.runStart(pid), u1 = cut.runStart(pid + 1);
  Tile firstPiece = u0 / p.tile_steps, endPiece = (u1 + p.tile_steps - 1) / p.tile_steps;
  for_range(firstPiece, endPiece, 1, [&](Tile j) {
    Tile tileStart = j * p.tile_steps;
    Piece piece{maximum(u0 - tileStart, 0), minimum(u1 - tileStart, p.tile_steps),
                cut.slot(pid, j)};
    tileAt(cut.wholeRounds * programs + j, &piece);
  });
}

// The merge of a split last round's pieces (a second kernel, after the forward on its stream):
// program (j, c) folds rows [c·MC, (c+1)·MC) of the round's tile j from the partials its pieces
// stored, by the online-softmax rule, and writes them as the forward would have. A separate kernel
// and not a ticket taken by the forward's last piece: with the tickets and the fold in the forward
// kernel, never run (a condition false at run time), the forward took 50 µs longer on the H200
// (ptxas schedules the whole kernel differently), more than the split gains (bench/RESULTS.md,
// 2026-12-04).
template <template <class> class P>
struct LastRoundMergeParams {
  BOOST_HANA_DEFINE_STRUCT(LastRoundMergeParams, (P<Data>, out), (P<F32Ptr>, lse), (P<F32Ptr>, part_out),
                           (P<F32Ptr>, part_lse), (P<I32>, q_len), (P<I32>, q_heads), (P<I32>, out_stride_b),
                           (P<I32>, out_stride_h), (P<I32>, out_stride_m), (P<I32>, tiles), (P<I32>, programs),
                           (P<I32>, tile_steps), (P<F32Ptr>, max_scores), (P<F32Ptr>, part_max));
};
// D and DP: the output's head dim (v's) and its padded width.
struct LastRoundMergeConstants {
  BOOST_HANA_DEFINE_STRUCT(LastRoundMergeConstants, (int64_t, BM), (int64_t, MC), (int64_t, D), (int64_t, DP),
                           (int64_t, hasLse), (int64_t, programmaticLaunch), (int64_t, hasMaxScores),
                           (int64_t, hasSinks));
};

void traceLastRoundMerge(ir::Function& f, const std::vector<int64_t>& constants, DType dt) {
  const auto k = constantsFrom<LastRoundMergeConstants>(constants);
  const auto p = declareParams<LastRoundMergeParams>(f, dt);
  std::optional<SinkParams<Traced>> sinks;
  if (k.hasSinks) sinks = declareParams<SinkParams>(f, dt);
  // Programmatic dependent launch (opt-in, FLEXTILE_PROGRAMMATIC_LAUNCH=1, not yet timed): the
  // merge is launched while the forward's last programs finish and waits here for the forward's
  // partials; the forward itself signals nothing (code added to it changes its schedule).
  if (k.programmaticLaunch) wait_for_prior_grids();
  const LastRoundCut cut(p.tiles, p.programs, p.tile_steps);
  Tile j = program_id(0), chunk = program_id(1);
  Tile firstProgram = cut.firstProgramOf(j), lastProgram = cut.lastProgramOf(j);
  Tile t = cut.wholeRounds * p.programs + j;  // the tile, numbered as the forward's tileAt numbers them
  Tile mBlocks = (p.q_len + (k.BM - 1)) / k.BM;
  Tile mBlock = mBlocks - 1 - t % mBlocks, rest = t / mBlocks;
  Tile h = rest % p.q_heads, b = rest / p.q_heads;
  Tile rows = chunk * k.MC + arange(0, k.MC);
  Tile offsD = arange(0, k.DP);
  // A round loads kPiecesPerRound pieces at once (one L2 round trip for them), masked past the
  // tile's last piece; the yardstick's tiles have two or three.
  constexpr int64_t kPiecesPerRound = 4;
  Tile m0 = full({k.MC}, -INFINITY, DType::F32), l0 = zeros({k.MC}, DType::F32), a0 = zeros({k.MC, k.DP}, DType::F32);
  Tile rounds = (lastProgram - firstProgram + kPiecesPerRound) / kPiecesPerRound;
  std::vector<Tile> st{m0, l0, a0};  // (and the pieces' largest score, with max scores)
  if (k.hasMaxScores) st.push_back(full({k.MC}, -INFINITY, DType::F32));
  st = for_range(0, rounds, 1, st, [&](Tile round, const std::vector<Tile>& c) {
    std::vector<Tile> lse, part, best;
    for (int64_t u = 0; u < kPiecesPerRound; ++u) {
      Tile q = firstProgram + round * kPiecesPerRound + u;
      Tile live = (q <= lastProgram).broadcast_to({k.MC});
      Tile slotRows = cut.slot(q, j).to(DType::I64) * k.BM + rows;
      lse.push_back(load(p.part_lse + slotRows, live, -INFINITY));
      part.push_back(load(p.part_out + (slotRows.expand(1) * k.DP + offsD.expand(0)), live.expand(1), 0.0));
      if (k.hasMaxScores) best.push_back(load(p.part_max + slotRows, live, -INFINITY));
    }
    return detail::foldPartialsAndMaxima(c, lse, part, best);
  });
  Tile m = st[0], l = st[1];
  std::vector<Tile> acc{st[2]};
  if (k.hasSinks) detail::foldSink(m, l, acc, load(sinks->sinks + h) * std::numbers::log2e);
  Tile empty = l == 0.0;
  Tile offsM = mBlock * k.BM + rows;
  Tile live = offsM < p.q_len;
  Tile out = acc[0] * (1.0 / where(empty, 1.0, l)).expand(1);
  Tile oPtrs = p.out + (b.to(DType::I64) * p.out_stride_b + h.to(DType::I64) * p.out_stride_h) +
               (offsM.expand(1) * p.out_stride_m + offsD.expand(0));
  store(oPtrs, out.to(dt), k.DP != k.D ? live.expand(1) & (offsD < k.D).expand(0) : live.expand(1));
  if (k.hasLse)
    store(p.lse + ((b * p.q_heads + h).to(DType::I64) * p.q_len + offsM),
          detail::rowLse(m, l, empty, /*natural=*/true), live);
  if (k.hasMaxScores) store(p.max_scores + ((b * p.q_heads + h).to(DType::I64) * p.q_len + offsM), st[3], live);
}

// ---- host side ---------------------------------------------------------------

struct Prepared {
  int64_t B, Hq, Hkv, L, S, D;
  int64_t DV;  // v's head dim: the output's (D unless v's differs)
  DType dtype;
  MemorySpace space;
  FlexAttentionConfig config;
  ForwardConstants constants;
  double scale;
  const BlockMask* mask;
  std::optional<BlockMask> ownedMask;  // the dense mask when none was given
  const PagedKV* paged = nullptr;      // the paged K/V, or null for contiguous k and v
  PagedKvConstants pagedConstants{};
  runtime::Stream* stream = nullptr;   // options.stream
  int64_t programs = 0;                // the persistent grid (constants.persistent): a program per SM
  int64_t tileSteps = 0;               // uniformTileSteps, read once (a user's mask is scanned for it)
  std::optional<Tensor> maxScores;     // options.max_scores (constants.hasMaxScores)
  std::optional<Tensor> sinks;         // options.sinks (constants.hasSinks)
};

int64_t forwardTiles(const Prepared& p) { return cdiv(p.L, p.config.block_m) * p.Hq * p.B; }

// The steps of one tile's walk when every tile walks the same, else 0: the dense mask built for a
// call without one (every block full), or a user's mask whose host lists hold rows of full blocks
// only, all of one length (an explicit all-full mask then runs, and rounds, exactly as no mask).
int64_t uniformTileSteps(const Prepared& p) {
  if (p.paged || p.constants.hasPartial) return 0;
  const int64_t blocks = p.ownedMask ? p.mask->numKvBlocks() : p.mask->uniformFullRowLength();
  return blocks > 0 ? blocks * (p.mask->kvBlockSize() / p.config.block_n) : 0;
}

// Whether a persistent forward cuts its last round's steps evenly over its programs (the traced
// program's splitLastRound; the merge kernel then folds the pieces): where the tiles walk the same
// steps, at least one whole round comes first, a program's run holds a few steps (a piece's start,
// its partial and the merge cost about one step) and the run's arithmetic fits the kernels' 32-bit
// scalars. By default only without a score_mod, the case measured (H200, 2026-12-04: +1.2 to +5.9 %
// without a mask); a score_mod's kernel changes with the pieces' loop and has not been timed
// (soft-cap is the one persistent such kernel). FLEXTILE_SPLIT_LAST_ROUND=0 or 1 turns it off or on
// wherever it applies.
bool lastRoundSplits(const Prepared& p) {
  const int64_t steps = p.tileSteps, tiles = forwardTiles(p), programs = p.programs;
  if (steps == 0 || programs < 1 || tiles <= programs || tiles % programs == 0) return false;
  const int64_t units = (tiles % programs) * steps;
  if ((units + steps) * (programs + 1) >= (int64_t(1) << 31) || tiles >= (int64_t(1) << 30)) return false;
  constexpr int64_t kMinStepsPerRun = 4;
  if (units / programs < kMinStepsPerRun) return false;
  return detail::forcedBySwitch("FLEXTILE_SPLIT_LAST_ROUND").value_or(!p.constants.hasScoreMod);
}

void expectRank4(const char* what, const Tensor& t) { detail::expectAttentionInput("flex_attention", what, t); }
BlockMask denseMask(int64_t L, int64_t S, BlockSizes sizes) { return detail::denseBlockMask(L, S, sizes); }

// The resolver's config when it gives a usable one, else the default.
FlexAttentionConfig resolveConfig(const Prepared& p, const Tensor& q, const ScoreMod& scoreMod,
                                  const std::optional<BlockMask>& blockMask, std::optional<codegen::Target> target) {
  const FlexAttentionConfig fallback = detail::untunedConfig(q, std::max(p.D, p.DV), scoreMod, blockMask, target);
  const std::optional<FlexAttentionConfig> c = detail::ResolverSlot<FlexAttentionConfig>::instance().ask([&] {
    return detail::attentionProblem(p.dtype, p.B, p.Hq, p.Hkv, p.L, p.S, p.D, p.space, scoreMod, blockMask, p.DV);
  });
  if (!c || detail::configProblem(*c, blockMask ? &*blockMask : nullptr)) return fallback;
  return *c;
}

void finishPrepare(Prepared& p, const Tensor& q, const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                   const FlexAttentionOptions& options, std::optional<codegen::Target> target);

// Whether a persistent forward's rings fit one block's shared memory. The pipeline gives the tile
// loop's Q ring as many slots as the walks' K and V rings have stages, so they take
// stages × (BM + 2·BN) × DP × element bytes (Q's and K's rows tileColumns wide, V's its own),
// plus their barriers: at D = 128 and 128 × 128 tiles, three stages need 288 KB, past sm_90a's
// 227 KB, where a program per tile needs 224 KB. Unknown limit (no target, host memory): true.
bool persistentRingsFit(const Prepared& p, const std::optional<codegen::Target>& target) {
  const int64_t limit = target                              ? target->maxSharedBytesPerBlock()
                        : p.space == MemorySpace::Device ? int64_t(runtime::Device::current().maxSharedBytesPerBlockOptin())
                                                            : 0;
  if (limit <= 0) return true;
  constexpr int64_t kBarrierBytes = 1024;
  const int64_t rings = int64_t(p.config.num_stages) *
                        ((p.config.block_m + p.config.block_n) * detail::tileColumns(p.D, p.constants.DS) +
                         p.config.block_n * detail::tileColumns(p.DV, p.constants.DVS)) *
                        int64_t(ir::byteWidth(p.dtype));
  return rings + kBarrierBytes <= limit;
}

Prepared prepare(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                 const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                 std::optional<codegen::Target> target = std::nullopt) {
  expectRank4("q", q);
  expectRank4("k", k);
  expectRank4("v", v);
  Prepared p{};
  p.B = q.size(0), p.Hq = q.size(1), p.L = q.size(2), p.D = q.size(3);
  p.Hkv = k.size(1), p.S = k.size(2), p.DV = v.size(3);
  p.dtype = q.dtype();
  detail::checkAttentionInputs(q, k, v, scoreMod);
  p.space = q.space();
  p.stream = options.stream;
  finishPrepare(p, q, scoreMod, blockMask, options, target);
  p.constants.tma = detail::tmaBoxesFor({&k, &v}, p.config.num_stages, true);
  p.constants.warpSpecialize =
      p.constants.tma && detail::warpSpecializeWanted(scoreMod, blockMask, p.config.warp_specialize);
  // The turns: the config's choice, else the rule (detail::pingpongWanted) on the specialized
  // 8-warp tile; FLEXTILE_PINGPONG=0 turns them off, =1 on for every loop (the pass reads it too).
  // racecheck is clean on them with the hoisted barrier inits (2026-12-03). Until 2026-12-04 the
  // rule also asked for a score_mod: without one the turns cost 2.5 % then; with the cheaper
  // softmax (tree reductions, the max before the scale) they gave causal +1 %, window +2.8 %.
  const bool turnsOff = detail::forcedBySwitch("FLEXTILE_PINGPONG") == false;
  p.constants.pingpong = p.config.turns == LoopSchedule::On ||
                         (p.config.turns == LoopSchedule::Auto && !turnsOff && p.constants.warpSpecialize &&
                          p.config.num_warps == 8 && detail::pingpongWanted(scoreMod, blockMask));
  p.constants.defer = p.config.defer == LoopSchedule::On;
  // Persistent programs: the config's choice, else the rule (detail::persistentWanted) where the
  // turns are and nothing defers the accumulation; FLEXTILE_FORWARD_PERSISTENT=0 or =1 overrides
  // both. With deferred accumulation, compute-sanitizer's racecheck reported hazards on the
  // persistent kernel's in-loop conversion through shared memory (H200, 2026-12-04; none on the
  // persistent kernels without it): configProblem refuses a config that asks for both. Nor where
  // its rings would not fit (persistentRingsFit): a config of three 128 × 128 stages at D = 128
  // runs a program per tile rather than a kernel the shared-memory planner refuses.
  // Nor where the warpgroups split the tile's keys (BM < 64 a warpgroup, as 64 × 64 on 8 warps): the
  // products then trade P through shared memory inside each step, which keeps TMA off the walks'
  // rings, so they are not shared across tiles — persistent programs without shared rings lost up to
  // 14 % (H200, 2026-12-04) — and at D = 256 the unshared rings do not fit (270 KB). Not timed.
  // A persistent kernel asked for (config or environment) whose Q ring would not fit beside the walks'
  // rings reads Q with a plain load at each tile's start (dsl::unpipelined), as a program per tile
  // does, rather than being refused; FLEXTILE_FORWARD_Q_RING=0 or =1 forces either. The rule does not
  // choose it: at D = 256 on 128 × 64 tiles (H100, 2026-12-07) it lost 1 % causal and 5 % on the
  // window to a program per tile (each tile then waits for its Q), the no-mask figure within noise.
  const bool deferred = p.constants.defer || detail::forcedBySwitch("FLEXTILE_DEFER_ACCUMULATION") == true;
  const std::optional<bool> persistentForced = detail::forcedBySwitch("FLEXTILE_FORWARD_PERSISTENT");
  const bool warpgroupsOwnRows = p.config.block_m >= 64 * std::max(1, p.config.num_warps / 4);
  p.constants.persistent = persistentForced ? *persistentForced
                           : p.config.persistent != LoopSchedule::Auto
                               ? p.config.persistent == LoopSchedule::On
                               : p.constants.pingpong && !deferred && detail::persistentWanted(scoreMod, blockMask) &&
                                     warpgroupsOwnRows && persistentRingsFit(p, target);
  if (p.constants.persistent) {
    const std::optional<bool> qRing = detail::forcedBySwitch("FLEXTILE_FORWARD_Q_RING");
    p.constants.qUnpipelined = !(qRing ? *qRing : persistentRingsFit(p, target));
  }
  // The skewed walks (Q·Kᵀ of step t and P·V of step t − 1 in one iteration, the first and last
  // products peeled): the config's `skew` skews the full walks and its `overlap` (which implies
  // them) runs each step's softmax during the previous step's P·V; FLEXTILE_SKEW=0, =1 or =all
  // (every walk) and FLEXTILE_SKEW_OVERLAP=0 or =1 override them. Auto: no plain skew (−15 % on the
  // H200, 2026-12-05), overlapped where the turns are: with exp2's ftz form (which the overlapped
  // kernels take) no mask +1.7 to +2.0 %, causal +3.4 to +3.6 %, prefix LM +2.5 %, ALiBi +0.6 %,
  // soft-cap +2.5 to +2.8 % (H200, 2026-12-05, each walk then paying a phantom step: one loop of
  // n + 1 iterations whose first V and last K were zero-filled); peeled instead, ALiBi +3 %,
  // soft-cap +3 to +5 %, no mask +2.4 %, prefix LM +1.6 % more, and the window's 10-step walks,
  // which the phantom step had kept unoverlapped, +1.3 to +2.3 % (H100, 2026-12-05, two calls).
  // Not with deferred accumulation (which rotates the same products its own way) or a paged K/V.
  const char* skewSwitch = std::getenv("FLEXTILE_SKEW");
  const bool overlap = detail::forcedBySwitch("FLEXTILE_SKEW_OVERLAP")
                           .value_or(p.config.overlap == LoopSchedule::On ||
                                     (p.config.overlap == LoopSchedule::Auto && p.config.skew != LoopSchedule::Off &&
                                      p.constants.pingpong));
  p.constants.skew = skewSwitch && !std::strcmp(skewSwitch, "all") ? kSkewEveryWalk
                     : detail::forcedBySwitch("FLEXTILE_SKEW").value_or(p.config.skew == LoopSchedule::On || overlap)
                         ? kSkewFullWalks
                         : 0;
  if (overlap && p.constants.skew) p.constants.skew |= kSkewOverlap;
  if (deferred) p.constants.skew = 0;
  if (p.constants.persistent) {  // (every call prepares: ask for the SM count only when it is used)
    const int sms = target ? target->description().part.multiprocessors
                           : p.space == MemorySpace::Device ? runtime::Device::current().multiprocessorCount() : 0;
    p.programs = sms > 0 ? sms : 3;
    p.tileSteps = uniformTileSteps(p);
    p.constants.splitLastRound = lastRoundSplits(p);
  }
  // The tiles handed out heaviest first (BlockMask::heaviestTilesFirst, uploaded once a mask and
  // shape): FLEXTILE_TILE_ORDER=1, opt-in until timed. A model of the document yardstick's grid
  // (2048 tiles on 132 SMs, 5.2 µs + 1.72 µs a step, each tile's steps from its mask row) puts
  // the default order 9 % behind longest-first, which is within 1.2 % of a perfect split. Needs
  // the mask's host lists; a split last round (tiles that walk alike) keeps its own dealing.
  p.constants.tileOrder = detail::forcedBySwitch("FLEXTILE_TILE_ORDER").value_or(false) && p.mask->hasHostLists() &&
                          !p.constants.splitLastRound;
  return p;
}

// A paged K/V: q as for contiguous inputs; B, Hkv, S and the dtype from the PagedKV (checked).
Prepared preparePaged(const Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                      const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                      std::optional<codegen::Target> target = std::nullopt) {
  expectRank4("q", q);
  Prepared p{};
  p.B = q.size(0), p.Hq = q.size(1), p.L = q.size(2), p.D = q.size(3);
  p.dtype = q.dtype();
  p.space = q.space();
  p.stream = options.stream;
  if (p.dtype != DType::BF16 && p.dtype != DType::F16 && p.dtype != DType::F32)
    throw Error("flex_attention: dtype must be bf16, f16 or f32, got " + q.describe());
  detail::expectPagedKvFor("flex_attention", kv, p.B, p.D, p.dtype, p.space);
  p.Hkv = kv.kvHeads(), p.S = kv.length, p.DV = kv.valueHeadDim();
  if (p.Hkv < 1 || p.Hq % p.Hkv != 0)
    throw Error("flex_attention: the query heads (" + std::to_string(p.Hq) + ") must be a multiple of the kv heads (" +
                std::to_string(p.Hkv) + ")");
  if (!detail::supportedHeadDim(p.D))
    throw Error("flex_attention: head dim D = " + std::to_string(p.D) + " is not supported (a multiple of 16 up to 256)",
                ErrorKind::Unsupported);
  if (!detail::supportedHeadDim(p.DV))
    throw Error("flex_attention: the paged KV's value head dim DV = " + std::to_string(p.DV) +
                    " is not supported (a multiple of 16 up to 256): v " + kv.v.describe(),
                ErrorKind::Unsupported);
  if (p.L < 1) throw Error("flex_attention: empty input: q " + q.describe());
  p.paged = &kv;
  p.pagedConstants = detail::pagedKvConstants(kv);
  finishPrepare(p, q, scoreMod, blockMask, options, target);
  return p;
}

// What contiguous and paged inputs share once the shapes are known: the config, the mask and the
// constants.
void finishPrepare(Prepared& p, const Tensor& q, const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                   const FlexAttentionOptions& options, std::optional<codegen::Target> target) {
  if (scoreMod.defined() && scoreMod.captureSpace() && *scoreMod.captureSpace() != p.space)
    throw Error("flex_attention: score_mod '" + scoreMod.name() + "' captures tensors in the other memory space");

  p.config = options.config ? *options.config : resolveConfig(p, q, scoreMod, blockMask, target);
  // A paged K/V streams through the pipeline only when an inner step's keys lie in one page
  // (detail::kvStorageRows): a chosen config narrows BLOCK_N to the page size. A config the
  // caller gave is kept (it gathers per key, unpipelined, when its BLOCK_N is larger).
  if (p.paged && !options.config) p.config.block_n = std::min(p.config.block_n, p.paged->pageSize);
  const FlexAttentionConfig& c = p.config;
  if (auto why = detail::configProblem(c, nullptr)) throw Error("flex_attention: config " + c.describe() + ": " + *why);

  if (blockMask) {
    p.mask = &*blockMask;
  } else {
    p.ownedMask = denseMask(p.L, p.S, {std::max<int64_t>(128, c.block_m), std::max<int64_t>(128, c.block_n)});
    p.mask = &*p.ownedMask;
  }
  const BlockMask& mask = *p.mask;
  mask.checkInputs(p.B, p.Hq, p.L, p.S);
  if (auto why = detail::configProblem(c, &mask)) throw Error("flex_attention: config " + c.describe() + " " + *why);
  if (mask.qPhase() != 0 && mask.numQBlocks() != 1)
    throw Error("flex_attention: a BlockMask slice starting mid-block must have one row");
  if (mask.maskMod().captureSpace() && *mask.maskMod().captureSpace() != p.space)
    throw Error("flex_attention: mask_mod '" + mask.maskMod().name() + "' captures tensors in the other memory space");

  p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(double(p.D));
  if (!std::isfinite(p.scale) || p.scale == 0)
    throw Error("flex_attention: scale must be finite and non-zero, got " + std::to_string(p.scale));
  const bool hasScoreMod = detail::changesScores(scoreMod);
  p.constants = ForwardConstants{c.block_m,
                                 c.block_n,
                                 p.D,
                                 detail::paddedHeadDim(p.D),
                                 p.Hq / p.Hkv,
                                 mask.qBlockSize(),
                                 mask.kvBlockSize(),
                                 hasScoreMod,
                                 options.return_lse,
                                 p.L % c.block_m == 0,
                                 // Every inner step of every listed block inside the keys: BLOCK_N
                                 // dividing S is not enough when the last mask block reaches past S.
                                 // With per-batch lengths the keys are masked anyway: not a constant
                                 // then, so decode steps across a block boundary share one kernel.
                                 !(p.paged && p.pagedConstants.hasLengths) && p.S % mask.kvBlockSize() == 0,
                                 mask.mayHaveFullBlocks(),
                                 mask.mayHavePartialBlocks()};
  p.constants.DV = p.DV;
  p.constants.DVP = detail::paddedHeadDim(p.DV);
  p.maxScores = options.max_scores;
  p.constants.hasMaxScores = p.maxScores.has_value();
  if (options.sinks) detail::expectSinks("flex_attention", *options.sinks, p.Hq, p.space);
  p.sinks = options.sinks;
  p.constants.hasSinks = p.sinks.has_value();
  p.constants.DS = detail::headDimSplit(p.D);
  // V's split only where its second chunk is 64 columns or more: P·V a product a chunk, each a
  // wgmma per 16 keys, and on a 32-column chunk that cost more than the quarter of the work it saved
  // (H100, 2026-12-06: D = DV = 96 no mask 529.0 → 435.6 TFLOP/s, causal 467.4 → 404.1; at
  // 192 = 128 + 64 no mask 444.2 → 582.5, causal 416.4 → 552.2).
  p.constants.DVS = detail::valueDimSplit(p.DV, 64);
  // A sign of the scale, not its value: one kernel per sign. FLEXTILE_SCALE_AFTER_MAX=0 scales
  // every score before the max, as before (to measure the difference).
  p.constants.positiveScale = p.scale > 0 && detail::forcedBySwitch("FLEXTILE_SCALE_AFTER_MAX") != false;
}

// Where a forward kernel is kept: in the mask mod's state, under a key naming
// the score mod's state (an entry whose score mod is gone is never found:
// ModState::kernel watches its lifetime) and the dtype.
// The paged kernel is a kernel of its own ("flex_fwd_paged/..."), so the contiguous one keeps its IR.
std::string forwardKernelKey(const ScoreMod& scoreMod, DType dtype, bool paged = false) {
  return detail::templateKernelKey(paged ? "flex_fwd_paged" : "flex_fwd", scoreMod, dtype);
}

Kernel& forwardKernel(const Prepared& p, const ScoreMod& scoreMod) {
  const MaskMod& maskMod = p.mask->maskMod();
  const ScoreMod sm = scoreMod.defined() ? scoreMod : noop_score();
  const DType dt = p.dtype;
  const bool paged = p.paged != nullptr;
  return maskMod.state().kernel(forwardKernelKey(sm, dt, paged), sm.lifetime(), [&] {
    // The kernel lives in the mask mod's state and holds detached copies of both mods: no cycle, and
    // the entry goes with the score mod (ModState::kernel).
    return Kernel(detail::kernelName((paged ? "flex_fwd_paged_" : "flex_fwd_") + sm.name() + "_" + maskMod.name()),
                  [dt, score = sm.detached(), held = maskMod.detached(), paged](ir::Function& f,
                                                                               const std::vector<int64_t>& c) {
                    traceForward(f, c, dt, score, held, paged);
                  },
                  constantCount<ForwardConstants>() + (paged ? constantCount<PagedKvConstants>() : 0));
  });
}

LaunchOptions launchOptions(const Prepared& p) {
  LaunchOptions o;
  o.grid = {cdiv(p.L, p.config.block_m), p.Hq, p.B};
  if (p.constants.persistent) o.grid = {std::min(p.programs, forwardTiles(p)), 1, 1};
  o.constants = constantList(p.constants);
  if (p.paged) {
    const std::vector<int64_t> paged = constantList(p.pagedConstants);
    o.constants.insert(o.constants.end(), paged.begin(), paged.end());
  }
  o.num_warps = p.config.num_warps;
  o.num_stages = p.config.num_stages;
  return o;
}

struct SplitRoundPartialsSlot;  // a split last round's partials (detail::f32Scratch)

// A split last round's partials (outputs, then lses, then with max scores the pieces' largest
// scores, in one scratch): two slots a program (its run holds pieces of at most two tiles), BLOCK_M
// rows a slot. The far end is asked for first: a scratch that must grow grows then, before the
// other views into it are taken.
struct SplitPartials {
  Tensor out, lse, max;  // max: with constants.hasMaxScores only
};
SplitPartials lastRoundPartials(const Prepared& p) {
  const int64_t rows = 2 * p.programs * p.config.block_m, outElems = rows * p.constants.DVP;
  SplitPartials s;
  if (p.constants.hasMaxScores)
    s.max = detail::f32Scratch<SplitRoundPartialsSlot>(p.space, p.stream, outElems + rows, {rows});
  s.lse = detail::f32Scratch<SplitRoundPartialsSlot>(p.space, p.stream, outElems, {rows});
  s.out = detail::f32Scratch<SplitRoundPartialsSlot>(p.space, p.stream, 0, {outElems});
  return s;
}

Kernel& lastRoundMergeKernel(DType dt) {
  const std::string name = "flex_fwd_last_round_merge_" + std::string(ir::dtypeName(dt));
  return detail::sharedKernel(name, [&] {
    return Kernel(name, [dt](ir::Function& f, const std::vector<int64_t>& c) { traceLastRoundMerge(f, c, dt); },
                  constantCount<LastRoundMergeConstants>());
  });
}

std::vector<KernelArg> arguments(const Prepared& p, const Kernel& kernel, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor* lse) {
  const BlockMask& mask = *p.mask;
  const BlockMaskTensors& lists = mask.kvTensors(p.space, p.stream);  // a slice's are views of its parent's
  const auto& qs = q.strides();
  const auto& ks = k.strides();
  const auto& vs = v.strides();
  const auto& os = out.strides();
  const double scale = p.constants.hasScoreMod ? p.scale : p.scale * std::numbers::log2e;
  const int64_t maskB = lists.kvBatchStride, maskH = lists.kvHeadStride;
  const bool split = p.constants.splitLastRound;
  const SplitPartials parts = split ? lastRoundPartials(p) : SplitPartials{};
  std::vector<KernelArg> args = bindParams<ForwardParams>(
      {.q = q, .k = k, .v = v, .out = out,
       .lse = lse ? *lse : lists.kvNum,  // unused without return_lse
       .kv_num = lists.kvNum, .kv_indices = lists.kvIndices, .full_kv_num = lists.fullKvNum,
       .full_kv_indices = lists.fullKvIndices, .q_len = p.L, .kv_len = p.S, .q_offset = mask.qOffset(),
       .q_phase = mask.qPhase(), .mask_q_blocks = mask.numQBlocks(), .mask_kv_blocks = mask.numKvBlocks(),
       .mask_b_stride = maskB, .mask_h_stride = maskH, .q_stride_b = qs[0], .q_stride_h = qs[1], .q_stride_m = qs[2],
       // A paged storage is one [1, Hkv, rows, D] pool for the whole batch: batch stride 0.
       .k_stride_b = p.paged ? 0 : ks[0], .k_stride_h = ks[1], .k_stride_n = ks[2],
       .v_stride_b = p.paged ? 0 : vs[0], .v_stride_h = vs[1],
       .v_stride_n = vs[2], .out_stride_b = os[0], .out_stride_h = os[1], .out_stride_m = os[2], .q_heads = p.Hq,
       .scale = scale, .tiles = forwardTiles(p), .part_out = split ? parts.out : lists.kvNum,
       .part_lse = split ? parts.lse : lists.kvNum, .tile_steps = split ? p.tileSteps : 0,
       .max_scores = p.maxScores ? *p.maxScores : lists.kvNum,
       .part_max = parts.max.defined() ? parts.max : lists.kvNum},
      kernel.name());
  if (p.paged) {
    const std::vector<KernelArg> paged = bindParams<PagedKvParams>(detail::pagedKvArguments(*p.paged), kernel.name());
    args.insert(args.end(), paged.begin(), paged.end());
  }
  if (p.constants.tileOrder) {
    const Tensor& order = mask.heaviestTilesFirstTensor(p.B, p.Hq, p.L, p.config.block_m, p.space, p.stream);
    const std::vector<KernelArg> ordered = bindParams<TileOrderParams>({.tile_order = order}, kernel.name());
    args.insert(args.end(), ordered.begin(), ordered.end());
  }
  if (p.constants.hasSinks) {
    const std::vector<KernelArg> sinks = bindParams<SinkParams>({.sinks = *p.sinks}, kernel.name());
    args.insert(args.end(), sinks.begin(), sinks.end());
  }
  return args;
}

// The forward's launches: the forward, then, with a split last round, the merge of its pieces.
std::vector<Launch> forwardLaunches(const Prepared& p, Kernel& kernel, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor* lse) {
  std::vector<Launch> launches{{&kernel, launchOptions(p), arguments(p, kernel, q, k, v, out, lse)}};
  if (!p.constants.splitLastRound) return launches;
  constexpr int64_t kMergeRows = 16;  // rows a merge program folds: 8 × 68 programs at the yardstick
  const int64_t MC = std::min<int64_t>(kMergeRows, p.config.block_m);
  LaunchOptions lo;
  lo.grid = {forwardTiles(p) % p.programs, p.config.block_m / MC, 1};
  lo.constants = constantList(LastRoundMergeConstants{
      p.config.block_m, MC, p.DV, p.constants.DVP, lse != nullptr,
      detail::forcedBySwitch("FLEXTILE_PROGRAMMATIC_LAUNCH").value_or(false), p.constants.hasMaxScores,
      p.constants.hasSinks});
  lo.num_warps = 4;
  lo.num_stages = 1;
  const SplitPartials parts = lastRoundPartials(p);
  const auto& os = out.strides();
  Kernel& merge = lastRoundMergeKernel(p.dtype);
  launches.push_back({&merge, lo,
                      bindParams<LastRoundMergeParams>(
                          {.out = out, .lse = lse ? *lse : parts.lse, .part_out = parts.out, .part_lse = parts.lse,
                           .q_len = p.L, .q_heads = p.Hq, .out_stride_b = os[0], .out_stride_h = os[1],
                           .out_stride_m = os[2], .tiles = forwardTiles(p), .programs = p.programs,
                           .tile_steps = p.tileSteps, .max_scores = p.maxScores ? *p.maxScores : parts.lse,
                           .part_max = parts.max.defined() ? parts.max : parts.lse},
                          merge.name())});
  if (p.constants.hasSinks) {
    const std::vector<KernelArg> sinks = bindParams<SinkParams>({.sinks = *p.sinks}, merge.name());
    launches.back().args.insert(launches.back().args.end(), sinks.begin(), sinks.end());
  }
  return launches;
}

}  // namespace

const dsl::Kernel* cachedForwardKernel(const MaskMod& maskMod, const ScoreMod& scoreMod, DType dtype, bool paged) {
  if (!maskMod.defined()) return nullptr;
  return maskMod.state().find(forwardKernelKey(scoreMod.defined() ? scoreMod : noop_score(), dtype, paged));
}

FlexAttentionProblem flexAttentionProblem(const Tensor& q, const Tensor& k, const ScoreMod& scoreMod,
                                          const std::optional<BlockMask>& blockMask) {
  expectRank4("q", q);
  expectRank4("k", k);
  return detail::attentionProblem(q.dtype(), q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3),
                                  q.space(), scoreMod, blockMask);
}

FlexAttentionProblem flexAttentionProblem(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                                          const std::optional<BlockMask>& blockMask) {
  expectRank4("v", v);
  FlexAttentionProblem p = flexAttentionProblem(q, k, scoreMod, blockMask);
  if (v.size(3) != p.D) p.DV = v.size(3);
  return p;
}

void setFlexAttentionConfigResolver(FlexAttentionConfigResolver resolver) {
  detail::ResolverSlot<FlexAttentionConfig>::instance().set(std::move(resolver));
}

namespace detail {

namespace {
std::string captureSignature(const std::vector<CapturedTensor>& captures) {
  std::string s;
  for (const CapturedTensor& c : captures) {
    if (!s.empty()) s += ' ';
    s.append(ir::dtypeName(c.dtype())).append("[").append(std::to_string(c.rank())).append("]");
  }
  return s;
}
}  // namespace

FlexAttentionProblem attentionProblem(DType dtype, int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t D,
                                      MemorySpace space, const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask,
                                      int64_t DV) {
  const MaskMod mask = blockMask ? blockMask->maskMod() : noop_mask();
  const ScoreMod score = scoreMod.defined() ? scoreMod : noop_score();
  return FlexAttentionProblem{dtype, B, Hq, Hkv, L, S, D,
                              score.name(), mask.name(),
                              captureSignature(score.captures()) + "|" + captureSignature(mask.captures()),
                              ir::hashText(std::to_string(score.structuralHash()), mask.structuralHash()),
                              blockMask ? blockMask->qBlockSize() : 0, blockMask ? blockMask->kvBlockSize() : 0, space,
                              DV > 0 && DV != D ? DV : 0};
}

bool tmaBoxesFor(std::initializer_list<const Tensor*> tensors, int numStages, bool byDefault) {
  const bool wanted = forcedBySwitch("FLEXTILE_TMA").value_or(byDefault);
  if (!wanted || numStages < 2) return false;
  for (const Tensor* t : tensors) {
    const uint64_t base = t->isDevice() ? t->deviceAddress() : uint64_t(reinterpret_cast<uintptr_t>(t->hostData()));
    if (base % 16 != 0 || t->rank() != 4 || t->strides()[3] != 1) return false;
    for (size_t d = 0; d < 3; ++d)
      if (t->strides()[d] <= 0 || (t->strides()[d] * t->elementBytes()) % 16 != 0) return false;
  }
  return true;
}
SoftmaxWeights softmaxWeights(const Tile& m, Tile s, const Tile* rowScale) {
  Tile mNew = maximum(m, rowScale ? max(s, 1) * *rowScale : max(s, 1));
  Tile mSafe = where(mNew == -INFINITY, 0.0, mNew);
  if (rowScale) s = s * *rowScale;
  Tile p = exp2(s - mSafe.expand(1));
  Tile alpha = exp2(m - mSafe);
  return {mNew, p, alpha};
}

bool sumAfterProductWanted(bool byDefault) {
  return forcedBySwitch("FLEXTILE_SUM_AFTER_PRODUCT").value_or(byDefault);
}

std::tuple<Tile, Tile, std::vector<Tile>> onlineSoftmaxStep(const Tile& m, const Tile& l, const std::vector<Tile>& acc,
                                                             Tile s, const std::vector<Tile>& v, DType dt,
                                                             const Tile* rowScale, bool sumAfterProduct) {
  auto [mNew, p, alpha] = softmaxWeights(m, std::move(s), rowScale);
  auto products = [&] {
    std::vector<Tile> aNew;
    for (size_t i = 0; i < acc.size(); ++i) aNew.push_back(dot(p.to(dt), v[i], acc[i] * alpha.expand(1)));
    return aNew;
  };
  if (sumAfterProduct) {
    std::vector<Tile> aNew = products();
    Tile lNew = l * alpha + sum(p, 1);
    return std::tuple{mNew, lNew, aNew};
  }
  Tile lNew = l * alpha + sum(p, 1);
  return std::tuple{mNew, lNew, products()};
}

std::tuple<Tile, Tile, Tile> onlineSoftmaxStep(const Tile& m, const Tile& l, const Tile& acc, Tile s, const Tile& v,
                                               DType dt, const Tile* rowScale, bool sumAfterProduct) {
  auto [mNew, lNew, aNew] = onlineSoftmaxStep(m, l, std::vector<Tile>{acc}, std::move(s), std::vector<Tile>{v}, dt,
                                              rowScale, sumAfterProduct);
  return std::tuple{mNew, lNew, aNew[0]};
}

std::tuple<Tile, Tile, Tile> tileFromOrder(const Tile& order, const Tile& n, const Tile& nx, const Tile& ny) {
  Tile t = load(order + n);
  return {t % nx, (t / nx) % ny, t / (nx * ny)};
}

Tile launchIndex() { return program_id(0) + num_programs(0) * (program_id(1) + num_programs(1) * program_id(2)); }

Tile rowLse(const Tile& m, const Tile& l, const Tile& empty, bool natural) {
  Tile log2Lse = m + log2(where(empty, 1.0, l));
  return where(empty, -INFINITY, natural ? log2Lse * std::numbers::ln2 : log2Lse);
}

Tile rowMaxScore(const Tile& m, const Tile& empty) { return where(empty, -INFINITY, m * std::numbers::ln2); }

void foldSink(Tile& m, Tile& l, std::vector<Tile>& acc, const Tile& sinkLog2) {
  Tile mNew = maximum(m, sinkLog2);
  Tile mSafe = where(mNew == -INFINITY, 0.0, mNew);  // a sink of -inf on a row without keys
  Tile alpha = exp2(m - mSafe);
  Tile kept = l * alpha;  // (each operand named first: traced in this order on every compiler)
  l = kept + exp2(sinkLog2 - mSafe);
  for (Tile& a : acc) a = a * (a.shape().size() == alpha.shape().size() ? alpha : alpha.expand(1));
  m = mNew;
}

std::tuple<Tile, Tile, Tile> foldPartials(const Tile& m, const Tile& l, const Tile& acc, const std::vector<Tile>& lse,
                                          const std::vector<Tile>& part) {
  auto perRow = [&](const Tile& x) { return x.shape().size() == acc.shape().size() ? x : x.expand(1); };
  Tile mNew = m;
  for (const Tile& x : lse) mNew = maximum(mNew, x);
  Tile mSafe = where(mNew == -INFINITY, 0.0, mNew);
  Tile alpha = exp2(m - mSafe);
  Tile lNew = l * alpha, aNew = acc * perRow(alpha);
  for (size_t u = 0; u < lse.size(); ++u) {
    Tile w = exp2(lse[u] - mSafe);
    lNew = lNew + w;
    aNew = aNew + part[u] * perRow(w);
  }
  return std::tuple{mNew, lNew, aNew};
}

std::vector<Tile> foldPartialsAndMaxima(const std::vector<Tile>& state, const std::vector<Tile>& lse,
                                        const std::vector<Tile>& part, const std::vector<Tile>& best) {
  auto [m, l, acc] = foldPartials(state[0], state[1], state[2], lse, part);
  std::vector<Tile> next{m, l, acc};
  if (state.size() > 3) {
    Tile top = state[3];
    for (const Tile& x : best) top = maximum(top, x);
    next.push_back(top);
  }
  return next;
}

Kernel& sharedKernel(const std::string& key, const std::function<Kernel()>& make) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Kernel>> kernels;
  std::lock_guard lock(mutex);
  auto it = kernels.find(key);
  if (it == kernels.end()) it = kernels.emplace(key, std::make_unique<Kernel>(make())).first;
  return *it->second;
}

Tile listEntry(const Tile& list, const Tile& rowStart, const Tile& entry, const Tile& length, const Tile& capacity) {
  return where(entry < length, load(list + (rowStart + entry), entry < capacity, 0), 0);
}

std::vector<HeadDimChunk> headDimChunks(int64_t D, int64_t first) {
  std::vector<HeadDimChunk> chunks;
  if (first)
    for (const auto& [start, width] : {std::pair{int64_t(0), first}, std::pair{first, paddedHeadDim(D - first)}}) {
      HeadDimChunk& c = chunks.emplace_back(HeadDimChunk{start, arange(start, start + width), Tile()});
      if (start + width > D) c.live = c.offs < D;
    }
  return chunks;
}

int64_t valueDimSplit(int64_t DV, int64_t minChunk) {
  if (forcedBySwitch("FLEXTILE_SPLIT_VALUE_DIM") == false) return 0;
  const int64_t first = headDimSplit(DV);
  return first && paddedHeadDim(DV - first) >= minChunk ? first : 0;
}

int64_t headDimSplit(int64_t D) {
  const bool enabled = forcedBySwitch("FLEXTILE_SPLIT_HEAD_DIM") != false;
  const int64_t padded = paddedHeadDim(D), first = padded / 2;
  if (!enabled || D <= first || first < 16) return 0;
  return first + paddedHeadDim(D - first) < padded ? first : 0;
}

Tile loadStreamedRows(const Tile& ptrs, bool exact, const Tile& live, const StreamedRows& t, const Tile& b,
                      const Tile& h, const Tile& row0, int64_t D, bool tma, int64_t col0) {
  if (!tma) return exact ? load(ptrs) : load(ptrs, live);
  TensorBox box{t.tensor, {kUnboundedDim, kUnboundedDim, t.len, D}, {t.strideB, t.strideH, t.strideN}, {b, h, row0, col0}};
  return exact ? load(ptrs, box) : load(ptrs, live, box);
}

std::vector<Tile> loadStreamedChunks(const Tile& base, const Tile& rowOffs, const std::vector<HeadDimChunk>& chunks,
                                     bool rowsExact, const Tile& rowLive, const StreamedRows& t, const Tile& b,
                                     const Tile& h, const Tile& row0, int64_t D, bool tma) {
  std::vector<Tile> parts;
  for (const HeadDimChunk& c : chunks) {
    const bool exact = rowsExact && !c.live.valid();
    parts.push_back(loadStreamedRows(base + (rowOffs + c.offs.expand(0)), exact, exact ? Tile() : c.rowsBy(rowLive), t,
                                     b, h, row0, D, tma, c.first));
  }
  return parts;
}

std::vector<Tile> loadChunks(const Tile& base, const Tile& rowOffs, const std::vector<HeadDimChunk>& chunks,
                             bool rowsExact, const Tile& rowLive) {
  return loadStreamedChunks(base, rowOffs, chunks, rowsExact, rowLive, StreamedRows{}, Tile(), Tile(), Tile(), 0, false);
}

bool usesDecodeTemplate(const Tensor& q, const FlexAttentionOptions& options) {
  switch (options.kernel) {
    case AttentionTemplate::Prefill: return false;
    case AttentionTemplate::Decode: return true;
    case AttentionTemplate::Auto: break;
  }
  // A prefill config given by the caller asks for the prefill template.
  if (options.query_offset || options.query_offsets || options.decode_config) return true;
  return !options.config && q.rank() == 4 && q.size(2) <= kDecodeMaxQueries;
}
}  // namespace detail

namespace {
// out is [B, Hq, L, DV]: v's head dim `valueDim`.
void expectOutputs(const Tensor& q, int64_t valueDim, const Tensor& out, const Tensor* lse,
                   const std::optional<Tensor>& maxScores) {
  // Checked on every call: nothing is allocated unless a check fails.
  expectRank4("q", q);
  // out is written through the same i32 strides and row offsets as q is read.
  expectRank4("out", out);
  const int64_t B = q.size(0), Hq = q.size(1), L = q.size(2), D = valueDim;
  if (out.dtype() != q.dtype()) out.expectDType("flex_attention: out", q.dtype());
  const Shape& o = out.shape();
  if (o[0] != B || o[1] != Hq || o[2] != L || o[3] != D)
    throw Error("flex_attention: out must be [" + std::to_string(B) + ", " + std::to_string(Hq) + ", " +
                std::to_string(L) + ", " + std::to_string(D) + "], got " + out.describe());
  if (out.space() != q.space()) throw Error("flex_attention: out is in another memory space than q");
  // A value a row (lse, max scores): f32 [B, Hq, L], contiguous, in q's memory space.
  auto expectRows = [&](const char* name, const Tensor& t) {
    const Shape& s = t.shape();
    if (!t.defined() || t.dtype() != DType::F32 || s.size() != 3 || s[0] != B || s[1] != Hq || s[2] != L)
      t.expect(std::string("flex_attention: ") + name, DType::F32, {B, Hq, L});
    if (!t.isContiguous() || t.space() != q.space())
      throw Error(std::string("flex_attention: ") + name + " must be contiguous and in q's memory space, got " +
                  t.describe());
  };
  if (lse) expectRows("lse", *lse);
  if (maxScores) expectRows("max_scores", *maxScores);
}

// A plan's compile: it reads the output's shape, strides and alignment only, so a contiguous
// view at a 16-byte-aligned address specializes exactly as a fresh allocation would, without
// allocating (and clearing) B*H*L*D elements per plan — the autotuner plans every config.
FlexAttentionPlan makePlan(const Prepared& p, const Tensor& q, const Tensor& k, const Tensor& v,
                           const ScoreMod& scoreMod, bool compile, std::optional<codegen::Target> target) {
  Kernel& kernel = forwardKernel(p, scoreMod);
  LaunchOptions lo = launchOptions(p);
  FlexAttentionPlan plan;
  plan.kernelName = kernel.name();
  plan.config = p.config;
  if (p.constants.persistent) plan.persistentPrograms = lo.grid[0];
  plan.lastRoundSplit = p.constants.splitLastRound != 0;
  TraceOptions to{lo.constants, lo.num_warps, lo.num_stages};
  plan.traced = &kernel.cachedTrace(to);
  if (compile) {
    alignas(16) static std::byte anyAligned[16];
    const Shape outShape{p.B, p.Hq, p.L, p.DV};
    Tensor out = p.space == MemorySpace::Host ? Tensor::hostView(anyAligned, q.dtype(), outShape)
                                              : Tensor::deviceView(uint64_t(1) << 20, q.dtype(), outShape);
    plan.compiled = &kernel.compile(lo, arguments(p, kernel, q, k, v, out, nullptr), target);
    if (p.constants.splitLastRound) {
      const Launch merge = forwardLaunches(p, kernel, q, k, v, out, nullptr).at(1);
      plan.mergeCompiled = &merge.kernel->compile(merge.options, merge.args, target);
    }
  }
  return plan;
}
// An _into call's options: what it writes is what it was given.
FlexAttentionOptions intoOptions(const FlexAttentionOptions& options, const Tensor* lse) {
  if (options.return_max_scores && !options.max_scores)
    throw Error("flex_attention_into: return_max_scores needs the output to write: give options.max_scores "
                "([B, Hq, L] f32)");
  FlexAttentionOptions o = options;
  o.return_lse = lse != nullptr;
  return o;
}

// The options of an allocating call: with return_max_scores, r.max_scores allocated and written.
FlexAttentionOptions withMaxScores(const Tensor& q, const FlexAttentionOptions& options, FlexAttentionResult& r) {
  FlexAttentionOptions o = options;
  if (options.return_max_scores) {
    r.max_scores = Tensor::empty(DType::F32, {q.size(0), q.size(1), q.size(2)}, q.space());
    o.max_scores = r.max_scores;
  }
  return o;
}

// Runs `decode` (the decode template) when the call chooses it and returns true; otherwise refuses a
// query_offset, which the prefill template does not take.
template <class Decode>
bool decodeIfChosen(const Tensor& q, int64_t valueDim, Tensor& out, Tensor* lse, const FlexAttentionOptions& o,
                    Decode&& decode) {
  if (detail::usesDecodeTemplate(q, o)) {
    expectOutputs(q, valueDim, out, lse, o.max_scores);
    decode();
    return true;
  }
  if (o.query_offset || o.query_offsets)
    throw Error("flex_attention: query_offset(s) is taken by the decode template only; slice the BlockMask "
                "(BlockMask::sliceRows) for the prefill template");
  return false;
}
}  // namespace

void flex_attention_into(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                         const std::optional<BlockMask>& blockMask, Tensor& out, Tensor* lse,
                         const FlexAttentionOptions& options) {
  FlexAttentionOptions o = intoOptions(options, lse);
  if (decodeIfChosen(q, v.rank() == 4 ? v.size(3) : 0, out, lse, o,
                     [&] { detail::flexDecodeInto(q, k, v, scoreMod, blockMask, out, lse, o); }))
    return;
  Prepared p = prepare(q, k, v, scoreMod, blockMask, o);
  expectOutputs(q, p.DV, out, lse, o.max_scores);
  Kernel& kernel = forwardKernel(p, scoreMod);
  runInOrder(forwardLaunches(p, kernel, q, k, v, out, lse), p.space, p.stream);
}

void flex_attention_into(const Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                         const std::optional<BlockMask>& blockMask, Tensor& out, Tensor* lse,
                         const FlexAttentionOptions& options) {
  FlexAttentionOptions o = intoOptions(options, lse);
  if (decodeIfChosen(q, kv.valueHeadDim(), out, lse, o,
                     [&] { detail::flexDecodeInto(q, kv, scoreMod, blockMask, out, lse, o); }))
    return;
  Prepared p = preparePaged(q, kv, scoreMod, blockMask, o);
  expectOutputs(q, p.DV, out, lse, o.max_scores);
  Kernel& kernel = forwardKernel(p, scoreMod);
  runInOrder({{&kernel, launchOptions(p), arguments(p, kernel, q, kv.k, kv.v, out, lse)}}, p.space, p.stream);
}

FlexAttentionResult flex_attention(const Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                                   const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options) {
  // Before allocating the outputs: a shape past the kernels' limits is refused, not allocated.
  detail::expectAttentionInput("flex_attention", "q", q);
  FlexAttentionResult r;
  r.out = Tensor::empty(q.dtype(), {q.size(0), q.size(1), q.size(2), kv.valueHeadDim()}, q.space());
  if (options.return_lse) r.lse = Tensor::empty(DType::F32, {q.size(0), q.size(1), q.size(2)}, q.space());
  flex_attention_into(q, kv, scoreMod, blockMask, r.out, options.return_lse ? &r.lse : nullptr,
                      withMaxScores(q, options, r));
  return r;
}

FlexAttentionPlan plan_flex_attention(const Tensor& q, const PagedKV& kv, const ScoreMod& scoreMod,
                                      const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                                      bool compile, std::optional<codegen::Target> target) {
  Prepared p = preparePaged(q, kv, scoreMod, blockMask, options, target);
  return makePlan(p, q, kv.k, kv.v, scoreMod, compile, target);
}

FlexAttentionResult flex_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                                   const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options) {
  // Before allocating the outputs (and before asking a GPU for its defaults): a shape past the
  // kernels' limits is refused, not allocated (faults/LimitsTest.cpp).
  detail::checkAttentionInputs(q, k, v, scoreMod);
  FlexAttentionResult r;
  r.out = Tensor::empty(q.dtype(), {q.size(0), q.size(1), q.size(2), v.size(3)}, q.space());
  if (options.return_lse) r.lse = Tensor::empty(DType::F32, {q.size(0), q.size(1), q.size(2)}, q.space());
  flex_attention_into(q, k, v, scoreMod, blockMask, r.out, options.return_lse ? &r.lse : nullptr,
                      withMaxScores(q, options, r));
  return r;
}

FlexAttentionPlan plan_flex_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ScoreMod& scoreMod,
                                      const std::optional<BlockMask>& blockMask, const FlexAttentionOptions& options,
                                      bool compile, std::optional<codegen::Target> target) {
  Prepared p = prepare(q, k, v, scoreMod, blockMask, options, target);
  return makePlan(p, q, k, v, scoreMod, compile, target);
}

FlexAttentionConfig untunedFlexAttentionConfig(const Tensor& q, const ScoreMod& scoreMod,
                                               const std::optional<BlockMask>& blockMask,
                                               std::optional<codegen::Target> target) {
  expectRank4("q", q);
  return detail::untunedConfig(q, q.size(3), scoreMod, blockMask, target);
}

FlexAttentionConfig detail::untunedConfig(const Tensor& q, int64_t headDim, const ScoreMod& scoreMod,
                                          const std::optional<BlockMask>& blockMask,
                                          std::optional<codegen::Target> target) {
  const int64_t queryTiles = q.size(0) * q.size(1) * ((q.size(2) + 127) / 128);
  FlexAttentionConfig c = defaultFlexAttentionConfig(q.dtype(), headDim, detail::defaultsTarget(q.space(), target), queryTiles,
                                                     detail::modsGatherPerElement(scoreMod, blockMask));
  if (blockMask) {  // narrowed to tile a mask with smaller blocks, keeping 16 query rows per warp
    c.block_m = std::min(c.block_m, std::max<int64_t>(16, blockMask->qBlockSize()));
    c.block_n = std::min(c.block_n, std::max<int64_t>(16, blockMask->kvBlockSize()));
    c.num_warps = int(std::min<int64_t>(c.num_warps, std::max<int64_t>(1, c.block_m / 16)));
  }
  return c;
}

}  // namespace flextile::attention
