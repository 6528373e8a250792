#include "attention_templates/Variants.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>

namespace flextile::attention {

using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {

std::vector<Variant> builtins();

// The built-ins are in place before any registration (a function-local
// static: no dependence on the order of static initializers across files).
// A deque: registering appends without moving the variants already there, so the references
// variant() handed out stay valid while another thread registers.
std::deque<Variant>& registry() {
  static std::deque<Variant> r = [] {
    std::vector<Variant> b = builtins();
    return std::deque<Variant>(std::make_move_iterator(b.begin()), std::make_move_iterator(b.end()));
  }();
  return r;
}
std::mutex& registryMutex() {
  static std::mutex m;
  return m;
}

RefMaskFn refCausal() {
  return [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
}

std::vector<Variant> builtins() {
  std::vector<Variant> v;
  v.push_back({"full", "no mask: every query sees every key", [](const VariantInputs&) { return VariantInstance{}; }});
  v.push_back({"causal", "causal: kv <= q", [](const VariantInputs& in) {
                 VariantInstance r;
                 r.mask = causalBlockMask(1, 1, in.L, in.S, in.blocks);
                 r.refMask = refCausal();
                 return r;
               }});
  v.push_back({"sliding_window", "sliding window 1024: kv <= q < kv + 1024", [](const VariantInputs& in) {
                 VariantInstance r;
                 r.mask = slidingWindowBlockMask(1, 1, in.L, in.S, {kYardstickWindow}, in.blocks, in.space);
                 r.refMask = [](int64_t, int64_t, int64_t q, int64_t kv) {
                   return kv <= q && q - kv < kYardstickWindow;
                 };
                 r.parameters = "window " + std::to_string(kYardstickWindow);
                 return r;
               }});
  v.push_back({"document", "documents (8 per sequence, random cuts, ids captured) + causal",
               [](const VariantInputs& in) {
                 VariantInstance r;
                 const int64_t len = std::max(in.L, in.S);
                 std::vector<std::vector<int64_t>> offsets;
                 std::vector<std::vector<int32_t>> ids;
                 if (!in.documentOffsets.empty() && int64_t(in.documentOffsets.size()) != in.B)
                   throw Error("document variant: " + std::to_string(in.documentOffsets.size()) +
                               " offset lists for a batch of " + std::to_string(in.B));
                 for (int64_t b = 0; b < in.B; ++b) {
                   offsets.push_back(in.documentOffsets.empty()
                                         ? randomDocumentOffsets(len, kYardstickDocuments, in.seed + uint64_t(b))
                                         : in.documentOffsets[size_t(b)]);
                   if (offsets.back().empty() || offsets.back().front() != 0 || offsets.back().back() < len)
                     throw Error("document variant: offsets of batch " + std::to_string(b) +
                                 " must start at 0 and reach the length " + std::to_string(len));
                   std::vector<int32_t> row(static_cast<size_t>(len), 0);
                   for (size_t d = 0; d + 1 < offsets.back().size(); ++d)
                     for (int64_t i = offsets.back()[d]; i < offsets.back()[d + 1]; ++i) row[size_t(i)] = int32_t(d);
                   ids.push_back(std::move(row));
                 }
                 r.mask = documentBlockMask(in.B, 1, in.L, in.S, offsets, true, in.blocks, in.space);
                 r.refMask = [ids](int64_t b, int64_t, int64_t q, int64_t kv) {
                   return kv <= q && ids[size_t(b)][size_t(q)] == ids[size_t(b)][size_t(kv)];
                 };
                 r.parameters = std::to_string(kYardstickDocuments) + " documents per sequence";
                 return r;
               }});
  v.push_back({"prefix_lm", "prefix LM 2048: kv < 2048 or kv <= q", [](const VariantInputs& in) {
                 VariantInstance r;
                 r.mask = prefixLmBlockMask(1, 1, in.L, in.S, kYardstickPrefix, in.blocks);
                 r.refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv < kYardstickPrefix || kv <= q; };
                 r.parameters = "prefix " + std::to_string(kYardstickPrefix);
                 return r;
               }});
  v.push_back({"alibi", "ALiBi (per-head slopes captured) + causal", [](const VariantInputs& in) {
                 VariantInstance r;
                 std::vector<float> slopes(size_t(in.H));
                 for (int64_t h = 0; h < in.H; ++h) slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(in.H));
                 r.score = alibi(dsl::capture(Tensor::fromHost(slopes, {in.H}, in.space), "alibi_slopes"));
                 r.mask = causalBlockMask(1, 1, in.L, in.S, in.blocks);
                 r.refMask = refCausal();
                 r.refScore = [slopes](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
                   return s + double(slopes[size_t(h)]) * double(kv - q);
                 };
                 return r;
               }});
  v.push_back({"softcap", "soft-cap 20 (cap * tanh(s / cap)) + causal", [](const VariantInputs& in) {
                 VariantInstance r;
                 r.score = soft_cap(kYardstickSoftCap);
                 r.mask = causalBlockMask(1, 1, in.L, in.S, in.blocks);
                 r.refMask = refCausal();
                 r.refScore = [](double s, int64_t, int64_t, int64_t, int64_t) {
                   return kYardstickSoftCap * std::tanh(s / kYardstickSoftCap);
                 };
                 r.refScoreGrad = [](double s, int64_t, int64_t, int64_t, int64_t) {
                   const double t = std::tanh(s / kYardstickSoftCap);
                   return 1 - t * t;
                 };
                 r.parameters = "cap 20";
                 return r;
               }});
  v.push_back({"bias", "a captured bias table [H, L, S] added to the scores, no mask", [](const VariantInputs& in) {
                 // The table is materialized on the host (and copied to the device): a yardstick shape
                 // of 32 heads over 32768 positions would ask for 128 GiB and die of std::bad_alloc.
                 const double gib = double(in.H) * double(in.L) * double(in.S) * sizeof(float) / double(1 << 30);
                 if (gib > 4) {
                   char size[32];
                   std::snprintf(size, sizeof size, "%.1f", gib);
                   throw Error("variant 'bias': its table [H, L, S] = [" + std::to_string(in.H) + ", " +
                                   std::to_string(in.L) + ", " + std::to_string(in.S) + "] of f32 would take " + size +
                                   " GiB, over the variant's 4 GiB; use a smaller shape",
                               ErrorKind::InvalidArgument);
                 }
                 VariantInstance r;
                 std::mt19937_64 rng(in.seed);
                 std::uniform_real_distribution<float> u(-2, 2);
                 std::vector<float> table(size_t(in.H * in.L * in.S));
                 for (auto& x : table) x = u(rng);
                 r.score = bias_table(dsl::capture(Tensor::fromHost(table, {in.H, in.L, in.S}, in.space), "bias"));
                 const int64_t L = in.L, S = in.S;
                 r.refScore = [table = std::move(table), L, S](double s, int64_t, int64_t h, int64_t q, int64_t kv) {
                   return s + double(table[size_t((h * L + q) * S + kv)]);
                 };
                 return r;
               }});
  return v;
}

}  // namespace

std::vector<int64_t> randomDocumentOffsets(int64_t L, int docs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> o{0};
  for (int d = 1; d < docs && L > 1; ++d) o.push_back(1 + int64_t(rng() % uint64_t(L - 1)));
  o.push_back(L);
  std::sort(o.begin(), o.end());
  o.erase(std::unique(o.begin(), o.end()), o.end());
  return o;
}

std::vector<Variant> variants() {
  std::lock_guard lock(registryMutex());
  return {registry().begin(), registry().end()};
}

const Variant& variant(const std::string& name) {
  std::lock_guard lock(registryMutex());
  for (const Variant& v : registry())
    if (v.name == name) return v;
  std::string known;
  for (const Variant& v : registry()) known += (known.empty() ? "" : ", ") + v.name;
  throw Error("unknown attention variant '" + name + "' (known: " + known + ")", ErrorKind::UnknownName);
}

bool registerVariant(Variant v) {
  if (v.name.empty() || !v.make) throw Error("registerVariant: a variant needs a name and a make function");
  std::lock_guard lock(registryMutex());
  for (const Variant& o : registry())
    if (o.name == v.name) throw Error("registerVariant: a variant named '" + v.name + "' is already registered");
  registry().push_back(std::move(v));
  return true;
}

}  // namespace flextile::attention
