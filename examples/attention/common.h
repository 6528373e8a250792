// Scaffolding shared by the attention examples (examples/attention/*.cpp):
// options, random inputs, the check against the float64 reference, BlockMask
// cross-checks and GPU timing. What a model author writes for a variant — the
// mods, the BlockMask, the flex_attention call — stays in each example; this
// file holds only what is the same for all of them.
//
// Every example takes
//   --b B --h H --hkv HKV --n N --d D --dtype bf16|f16|f32
//   --small        the small shape even with a GPU (B=1 H=2 N=256 D=64)
//   --interpret    run through the IR interpreter even with a GPU
//   --require-gpu  exit 77 (ctest: skipped) when there is no GPU
//   --reps R       timed runs (median; default 20)
//   --seed S       the random seed (default: fresh, printed)
// plus its own parameters (--window, --prefix, ...). With a GPU the default
// shape is the yardstick of DESIGN.md (B=2 H=16 N=8192 D=128 bf16); without
// one it is the small shape, run through the interpreter.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"
#include "attention_templates/Variants.h"
#include "runtime/Device.h"
#include "runtime/Event.h"

namespace flextile::examples::attention {

using flextile::attention::BlockMask;
using flextile::attention::FlexAttentionResult;
using flextile::attention::RefMaskFn;
using flextile::attention::RefScoreFn;
using flextile::attention::ScoreMod;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

// Exit status of --require-gpu without a GPU (ctest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

struct ParamInfo {
  std::string name;  // "window" for --window
  std::string help;
};

struct Options {
  std::string example;
  int64_t B = 1, H = 2, Hkv = 2, N = 256, D = 64;
  DType dtype = DType::BF16;
  bool gpu = false;        // run on the GPU; otherwise through the interpreter
  std::string where;       // "the GPU (NVIDIA H200)" or "the IR interpreter (no GPU: ...)"
  int reps = 20;
  uint64_t seed = 0;
  std::map<std::string, std::string> params;

  MemorySpace space() const { return gpu ? MemorySpace::Device : MemorySpace::Host; }

  // A variant parameter given on the command line, or `fallback`.
  int64_t intParam(const std::string& name, int64_t fallback) const {
    auto it = params.find(name);
    if (it == params.end()) return fallback;
    char* end = nullptr;
    long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (*end != '\0') throw Error("--" + name + " expects an integer, got '" + it->second + "'");
    return v;
  }
  double realParam(const std::string& name, double fallback) const {
    auto it = params.find(name);
    if (it == params.end()) return fallback;
    char* end = nullptr;
    double v = std::strtod(it->second.c_str(), &end);
    if (*end != '\0') throw Error("--" + name + " expects a number, got '" + it->second + "'");
    return v;
  }
  // The yardstick's parameter (a window of 1024 at N = 8192) at this length:
  // itself from N = 8192 on, scaled with N below, so a short run keeps the
  // yardstick's shape (a window of 1/8 of the sequence, ...).
  int64_t scaledParam(const std::string& name, int64_t yardstick) const {
    return intParam(name, N >= 8192 ? yardstick : std::max<int64_t>(1, yardstick * N / 8192));
  }
};

inline void printUsage(const char* example, const std::string& summary, const std::vector<ParamInfo>& params) {
  std::printf("%s: %s\n\nusage: attention_%s [options]\n", example, summary.c_str(), example);
  std::printf("  --b B --h H --hkv HKV --n N --d D   shape: q [B, H, N, D], k and v [B, HKV, N, D]\n");
  std::printf("  --dtype bf16|f16|f32                 element type (default bf16)\n");
  std::printf("  --small                              the small shape (B=1 H=2 N=256 D=64) even with a GPU\n");
  std::printf("  --interpret                          run through the IR interpreter even with a GPU\n");
  std::printf("  --require-gpu                        exit %d (skipped) when there is no GPU\n", kSkipped);
  std::printf("  --reps R                             timed runs on the GPU (median; default 20)\n");
  std::printf("  --seed S                             random seed (default: fresh, printed)\n");
  for (const ParamInfo& p : params) std::printf("  --%-34s %s\n", (p.name + " V").c_str(), p.help.c_str());
  std::printf("\nWith a GPU the default shape is B=2 H=16 N=8192 D=128 bf16 (the DESIGN.md yardstick), checked on\n"
              "a subset of heads and rows and timed; without one, the small shape through the interpreter,\n"
              "checked everywhere. Exits 1 when the check fails.\n");
}

// Parses the command line. Exits on --help (0), a usage error (2) or
// --require-gpu without a GPU (kSkipped).
inline Options parseOptions(int argc, char** argv, const char* example, const std::string& summary,
                            const std::vector<ParamInfo>& params = {}) {
  Options o;
  o.example = example;
  std::map<std::string, std::string> given;
  bool small = false, interpret = false, requireGpu = false;
  auto usageError = [&](const std::string& message) {
    std::fprintf(stderr, "attention_%s: %s (--help lists the options)\n", example, message.c_str());
    std::exit(2);
  };
  std::set<std::string> valued{"b", "h", "hkv", "n", "d", "dtype", "reps", "seed"};
  for (const ParamInfo& p : params) valued.insert(p.name);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      printUsage(example, summary, params);
      std::exit(0);
    }
    if (arg.rfind("--", 0) != 0) usageError("unexpected argument '" + arg + "'");
    std::string key = arg.substr(2), value;
    if (auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (valued.count(key)) {
      if (i + 1 >= argc) usageError("--" + key + " needs a value");
      value = argv[++i];
    }
    if (key == "small") small = true;
    else if (key == "interpret") interpret = true;
    else if (key == "require-gpu") requireGpu = true;
    else if (!valued.count(key)) usageError("unknown option --" + key);
    else given[key] = value;
  }

  std::string whyNot;
  const bool haveGpu = dsl::deviceAvailable(&whyNot);
  if (requireGpu && !haveGpu) {
    std::printf("attention_%s: skipped, no GPU (%s)\n", example, whyNot.c_str());
    std::exit(kSkipped);
  }
  o.gpu = haveGpu && !interpret;
  if (o.gpu) o.where = "the GPU (" + runtime::Device::current().name() + ")";
  else if (haveGpu) o.where = "the IR interpreter (--interpret)";
  else o.where = "the IR interpreter (no GPU: " + whyNot + ")";
  if (o.gpu && !small) o.B = 2, o.H = 16, o.N = 8192, o.D = 128;

  auto integer = [&](const char* key, int64_t& into) {
    auto it = given.find(key);
    if (it == given.end()) return;
    char* end = nullptr;
    long long v = std::strtoll(it->second.c_str(), &end, 10);
    if (*end != '\0' || v < 1)
      usageError(std::string("--") + key + " expects a positive integer, got '" + it->second + "'");
    into = v;
    given.erase(it);
  };
  integer("b", o.B);
  integer("h", o.H);
  o.Hkv = o.H;
  integer("hkv", o.Hkv);
  integer("n", o.N);
  integer("d", o.D);
  int64_t reps = o.reps;
  integer("reps", reps);
  o.reps = int(reps);
  if (auto it = given.find("seed"); it != given.end()) {
    o.seed = std::strtoull(it->second.c_str(), nullptr, 10);
    given.erase(it);
  } else {
    o.seed = std::random_device{}();
  }
  if (auto it = given.find("dtype"); it != given.end()) {
    if (it->second == "bf16") o.dtype = DType::BF16;
    else if (it->second == "f16") o.dtype = DType::F16;
    else if (it->second == "f32") o.dtype = DType::F32;
    else usageError("--dtype expects bf16, f16 or f32, got '" + it->second + "'");
    given.erase(it);
  }
  o.params = std::move(given);
  // flex_attention checks these too; saying so here names the option.
  if (o.H % o.Hkv != 0) usageError("--h must be a multiple of --hkv (GQA)");
  if (o.D % 16 != 0 || o.D > 256) usageError("--d must be a multiple of 16 up to 256");
  return o;
}

inline void printHeader(const Options& o, const std::string& summary, const std::string& parameters = "") {
  std::printf("attention example '%s': %s\n", o.example.c_str(), summary.c_str());
  std::printf("  shape: B=%lld Hq=%lld Hkv=%lld N=%lld D=%lld %s on %s; seed %llu\n", (long long)o.B,
              (long long)o.H, (long long)o.Hkv, (long long)o.N, (long long)o.D,
              std::string(ir::dtypeName(o.dtype)).c_str(), o.where.c_str(), (unsigned long long)o.seed);
  if (!parameters.empty()) std::printf("  parameters: %s\n", parameters.c_str());
}

// ---- inputs ------------------------------------------------------------------

struct Inputs {
  Tensor q, k, v;                 // q [B, H, N, D], k and v [B, Hkv, N, D], where the run happens
  Tensor qHost, kHost, vHost;     // the same values on the host, for the reference
};

namespace detail {
template <class E>
Tensor randomHostTensor(std::mt19937_64& rng, dsl::Shape shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<E> data(static_cast<size_t>(n));
  for (E& x : data) x = E(u(rng));
  return Tensor::fromHost(data, std::move(shape), MemorySpace::Host);
}
inline Tensor randomHostTensor(std::mt19937_64& rng, DType dtype, dsl::Shape shape) {
  switch (dtype) {
    case DType::BF16: return randomHostTensor<Eigen::bfloat16>(rng, std::move(shape));
    case DType::F16: return randomHostTensor<Eigen::half>(rng, std::move(shape));
    default: return randomHostTensor<float>(rng, std::move(shape));
  }
}
}  // namespace detail

// Uniform in [-1, 1): fresh values every run (the seed is printed).
inline Inputs randomInputs(const Options& o, std::mt19937_64& rng) {
  Inputs in;
  in.qHost = detail::randomHostTensor(rng, o.dtype, {o.B, o.H, o.N, o.D});
  in.kHost = detail::randomHostTensor(rng, o.dtype, {o.B, o.Hkv, o.N, o.D});
  in.vHost = detail::randomHostTensor(rng, o.dtype, {o.B, o.Hkv, o.N, o.D});
  if (o.gpu) {
    in.q = in.qHost.to(MemorySpace::Device);
    in.k = in.kHost.to(MemorySpace::Device);
    in.v = in.vHost.to(MemorySpace::Device);
  } else {
    in.q = in.qHost, in.k = in.kHost, in.v = in.vHost;
  }
  return in;
}

// ---- timing --------------------------------------------------------------------

inline double millisecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `build` twice and prints both wall times: the first call traces and
// compiles (the generic builder's kernel), the second is the cost of a new
// mask for the same mod. Returns the second result.
template <class F>
auto buildTwice(const char* what, F&& build) {
  auto t0 = std::chrono::steady_clock::now();
  build();
  const double first = millisecondsSince(t0);
  t0 = std::chrono::steady_clock::now();
  auto mask = build();
  const double second = millisecondsSince(t0);
  std::printf("  %-44s %9.3f ms (first call %.1f ms)\n", what, second, first);
  return mask;
}

// ---- BlockMask cross-checks ------------------------------------------------------

// The generic builder (mask_mod evaluated block by block) and a structural
// one (interval end-points) must list exactly the same blocks.
inline void expectSameBlocks(const BlockMask& generic, const BlockMask& structural) {
  auto geometry = [](const BlockMask& m) {
    return std::vector<int64_t>{m.batch(), m.heads(), m.qLen(), m.kvLen(), m.qBlockSize(), m.kvBlockSize()};
  };
  if (geometry(generic) != geometry(structural))
    throw Error("the two BlockMasks differ in shape:\n  " + generic.describe() + "\n  " + structural.describe());
  const std::vector<uint8_t> a = generic.toDenseBlocks(), b = structural.toDenseBlocks();
  const char* names[] = {"empty", "partial", "full"};
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      const int64_t nQ = generic.numQBlocks(), nKv = generic.numKvBlocks();
      const int64_t kb = int64_t(i) % nKv, qb = int64_t(i) / nKv % nQ, bh = int64_t(i) / (nKv * nQ);
      throw Error("the generic and structural BlockMasks disagree at b=" + std::to_string(bh / generic.heads()) +
                  " h=" + std::to_string(bh % generic.heads()) + " q block " + std::to_string(qb) + ", kv block " +
                  std::to_string(kb) + ": " + names[a[i]] + " vs " + names[b[i]]);
    }
  std::printf("  the generic and structural builders list the same blocks (%lld partial, %lld full)\n",
              (long long)generic.numPartialBlocks(), (long long)generic.numFullBlocks());
}

// On small shapes: the BlockMask's element mask (full blocks, empty blocks,
// mask_mod on partial blocks) against the plain C++ mask, pair by pair.
inline void expectDenseMatches(const BlockMask& mask, const RefMaskFn& refMask) {
  const std::vector<uint8_t> dense = mask.toDense();
  const int64_t B = mask.batch(), H = mask.heads(), L = mask.qLen(), S = mask.kvLen();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < S; ++j) {
          const bool have = dense[size_t(((b * H + h) * L + i) * S + j)] != 0;
          const bool want = refMask(b, h, i + mask.qOffset(), j);
          if (have != want)
            throw Error("BlockMask::toDense() and the reference mask disagree at b=" + std::to_string(b) + " h=" +
                        std::to_string(h) + " q=" + std::to_string(i) + " kv=" + std::to_string(j) + ": " +
                        (have ? "allowed" : "masked") + " vs " + (want ? "allowed" : "masked"));
        }
  std::printf("  BlockMask::toDense() equals the reference mask on all %lld pairs\n", (long long)(B * H * L * S));
}

// Allowed (query, key) pairs over all B x H heads of the inputs, counted
// exactly: full blocks by their in-range size, partial blocks pair by pair
// with the reference mask, empty blocks not at all. A mask that broadcasts
// over B or H is counted once per distinct row and multiplied.
inline int64_t countAllowedPairs(const std::optional<BlockMask>& mask, const RefMaskFn& refMask, int64_t B,
                                 int64_t H, int64_t L, int64_t S) {
  if (!mask) return B * H * L * S;
  const BlockMask& m = *mask;
  const int64_t BQ = m.qBlockSize(), BKV = m.kvBlockSize();
  int64_t total = 0;
  for (int64_t mb = 0; mb < m.batch(); ++mb)
    for (int64_t mh = 0; mh < m.heads(); ++mh) {
      int64_t pairs = 0;
      for (int64_t qb = 0; qb < m.numQBlocks(); ++qb) {
        const int64_t q0 = qb * BQ - m.qPhase(), q1 = std::min(q0 + BQ, L);
        const int64_t rows = q1 - std::max<int64_t>(q0, 0);
        for (int32_t kb : m.fullKvBlocks(mb, mh, qb)) pairs += rows * (std::min(int64_t(kb + 1) * BKV, S) - kb * BKV);
        for (int32_t kb : m.partialKvBlocks(mb, mh, qb))
          for (int64_t i = std::max<int64_t>(q0, 0); i < q1; ++i)
            for (int64_t j = int64_t(kb) * BKV; j < std::min(int64_t(kb + 1) * BKV, S); ++j)
              pairs += refMask(mb, mh, i + m.qOffset(), j) ? 1 : 0;
      }
      total += pairs * (m.batch() == 1 ? B : 1) * (m.heads() == 1 ? H : 1);
    }
  return total;
}

// ---- the check -------------------------------------------------------------------

inline double tolerance(DType dtype) {
  // bf16 keeps 8 bits (P is rounded to bf16 before P·V): 2e-2 leaves room
  // for the sum; f16 keeps 11; f32 runs Q·Kᵀ and P·V as tf32 on the GPU.
  return dtype == DType::BF16 ? 2e-2 : 4e-3;
}

// Compares out and lse with referenceAttention (float64). Small problems are
// checked everywhere; large ones on a few heads — the first, the last and a
// random one — and, for each, rows at the start, at the end and at a random
// place, 128 rows each (a dense float64 reference of 8192 x 8192 per head is
// slow). Returns whether the check passed, after printing the errors.
inline bool checkAgainstReference(const Options& o, const Inputs& in, const FlexAttentionResult& result, double scale,
                                  const RefScoreFn& refScore, const RefMaskFn& refMask,
                                  std::optional<int64_t> expectedPairs, std::mt19937_64& rng) {
  using flextile::attention::referenceAttention;
  using flextile::attention::toDoubles;
  const int64_t B = o.B, H = o.H, Hkv = o.Hkv, L = o.N, S = o.N, D = o.D;
  const Tensor out = result.out.to(MemorySpace::Host), lse = result.lse.to(MemorySpace::Host);
  const bool everything = B * H * L * S <= (int64_t(1) << 24);

  struct Slice { int64_t b, h, row0, rows; };
  std::vector<Slice> slices;
  if (everything) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) slices.push_back({b, h, 0, L});
  } else {
    std::set<std::pair<int64_t, int64_t>> heads{{0, 0}, {B - 1, H - 1}, {int64_t(rng() % B), int64_t(rng() % H)}};
    const int64_t w = std::min<int64_t>(128, L);
    for (auto [b, h] : heads) {
      std::set<int64_t> starts{0, L - w, int64_t(rng() % uint64_t(L - w + 1))};
      for (int64_t r : starts) slices.push_back({b, h, r, w});
    }
  }

  // FLEXTILE_EXAMPLE_WRONG_REFERENCE=1 adds 1 to every third reference score,
  // so the check must fail: ctest runs one example so to prove that a failed
  // check gives a non-zero exit.
  const bool wrongReference = std::getenv("FLEXTILE_EXAMPLE_WRONG_REFERENCE") != nullptr;
  if (wrongReference) std::printf("  FLEXTILE_EXAMPLE_WRONG_REFERENCE is set: the reference is wrong on purpose\n");

  const int bytes = ir::byteWidth(o.dtype);
  auto view = [&](const Tensor& t, int64_t offsetElements, dsl::Shape shape) {
    return Tensor::hostView(static_cast<char*>(t.hostData()) + offsetElements * bytes, t.dtype(), std::move(shape));
  };
  double num = 0, den = 0, lseErr = 0, worstRow = 0;
  int64_t rowsChecked = 0, pairs = 0;
  std::string firstProblem;
  for (const Slice& s : slices) {
    const int64_t hk = s.h / (H / Hkv);
    // One query head's rows, and its kv head, as [1, 1, rows, D] views; the
    // reference mods see the real (b, h) and global query positions.
    Tensor q = view(in.qHost, ((s.b * H + s.h) * L + s.row0) * D, {1, 1, s.rows, D});
    Tensor k = view(in.kHost, (s.b * Hkv + hk) * S * D, {1, 1, S, D});
    Tensor v = view(in.vHost, (s.b * Hkv + hk) * S * D, {1, 1, S, D});
    RefScoreFn score;
    if (refScore || wrongReference)
      score = [&, b = s.b, h = s.h](double x, int64_t, int64_t, int64_t i, int64_t j) {
        const double y = refScore ? refScore(x, b, h, i, j) : x;
        return wrongReference && (i + j) % 3 == 0 ? y + 1 : y;
      };
    RefMaskFn mask;
    if (refMask) mask = [&, b = s.b, h = s.h](int64_t, int64_t, int64_t i, int64_t j) { return refMask(b, h, i, j); };
    const auto ref = referenceAttention(q, k, v, score, mask, scale, s.row0);
    pairs += ref.allowedPairs;
    const std::vector<double> got = toDoubles(view(out, ((s.b * H + s.h) * L + s.row0) * D, {s.rows, D}));
    const float* gotLse = static_cast<const float*>(lse.hostData()) + (s.b * H + s.h) * L + s.row0;
    for (int64_t i = 0; i < s.rows; ++i) {
      const std::string row = std::to_string(s.b) + ", " + std::to_string(s.h) + ", " + std::to_string(s.row0 + i);
      double rowNum = 0, rowDen = 0;
      for (int64_t d = 0; d < D; ++d) {
        const double g = got[size_t(i * D + d)], r = ref.out[size_t(i * D + d)];
        if (!std::isfinite(g) && firstProblem.empty())
          firstProblem = "out[" + row + ", " + std::to_string(d) + "] = " + std::to_string(g);
        rowNum += (g - r) * (g - r);
        rowDen += r * r;
      }
      num += rowNum;
      den += rowDen;
      // One bad row (a tail, a fully masked row) hides in the norm over all
      // rows, so each row is held to a looser bound of its own; a row whose
      // reference is 0 (no allowed key) must be exactly 0.
      const double rowRel = rowDen > 0 ? std::sqrt(rowNum / rowDen) : (rowNum == 0 ? 0 : INFINITY);
      worstRow = std::max(worstRow, rowRel);
      if (!(rowRel <= 2 * tolerance(o.dtype)) && firstProblem.empty())
        firstProblem = "row [" + row + "] of out has relative error " + std::to_string(rowRel);
      const double want = ref.lse[size_t(i)], have = gotLse[i];
      const bool lseOk = std::isinf(want) ? std::isinf(have) && have < 0
                                          : std::isfinite(have) && std::abs(have - want) <= 2e-2 + 1e-3 * std::abs(want);
      if (std::isfinite(want) && std::isfinite(have)) lseErr = std::max(lseErr, std::abs(have - want));
      if (!lseOk && firstProblem.empty())
        firstProblem = "lse[" + std::to_string(s.b) + ", " + std::to_string(s.h) + ", " + std::to_string(s.row0 + i) +
                       "] = " + std::to_string(have) + ", reference " + std::to_string(want);
    }
    rowsChecked += s.rows;
  }
  const double rel = std::sqrt(num / std::max(den, 1e-300));
  const bool outOk = std::isfinite(rel) && rel <= tolerance(o.dtype);
  if (!outOk && firstProblem.empty()) firstProblem = "relative error of out above the tolerance";
  if (everything && expectedPairs && *expectedPairs != pairs && firstProblem.empty())
    firstProblem = "the BlockMask allows " + std::to_string(*expectedPairs) + " pairs, the reference mask " +
                   std::to_string(pairs);
  const std::string scope =
      everything ? "every head and row" : std::to_string(slices.size()) + " windows of rows in up to 3 heads";
  std::printf("  check against the float64 reference (%s, %lld rows): out relative error %.2e (tolerance %.0e), "
              "worst row %.2e, lse max error %.2e: %s\n",
              scope.c_str(), (long long)rowsChecked, rel,
              tolerance(o.dtype), worstRow, lseErr, firstProblem.empty() ? "ok" : "FAILED");
  if (!firstProblem.empty()) std::printf("  FAILED: %s\n", firstProblem.c_str());
  return firstProblem.empty();
}

// ---- performance -------------------------------------------------------------------

// On the GPU: the median of o.reps timed calls (CUDA events around each, after
// 3 warm-up calls) and TFLOP/s counted as DESIGN.md does, 4 * D * allowed
// pairs. The call writes into a preallocated output and skips the LSE, like a
// forward pass in training would not; flex_attention's host work per call is
// in the time.
inline void reportPerformance(const Options& o, const Inputs& in, const ScoreMod& score,
                              const std::optional<BlockMask>& mask, int64_t allowedPairs) {
  const double density = double(allowedPairs) / (double(o.B * o.H) * double(o.N) * double(o.N));
  const double flops = flextile::attention::flexAttentionFlops(1, 1, o.D, double(allowedPairs));
  if (!o.gpu) {
    std::printf("  %lld allowed pairs (%.1f%% of the plane), %.3g GFLOP; no timing through the interpreter\n",
                (long long)allowedPairs, 100 * density, flops * 1e-9);
    return;
  }
  Tensor out = Tensor::empty(o.dtype, {o.B, o.H, o.N, o.D}, MemorySpace::Device);
  auto call = [&] { flextile::attention::flex_attention_into(in.q, in.k, in.v, score, mask, out, nullptr); };
  runtime::TimingOptions timing;
  timing.reps = o.reps;
  const double ms = runtime::median(runtime::timeKernel(call, timing));
  std::printf("  time: %.3f ms (median of %d), %.1f TFLOP/s (4 * D * %lld allowed pairs, %.1f%% of the plane)\n", ms,
              o.reps, flops / (ms * 1e-3) * 1e-12, (long long)allowedPairs, 100 * density);
}

// Prints the mask's one-line description, and its block picture for
// (b = 0, h = 0) when that is small enough to read.
inline void printMask(const BlockMask& mask) {
  if (mask.numQBlocks() > 16 || mask.numKvBlocks() > 64) {
    std::printf("  %s\n", mask.describe().c_str());
    return;
  }
  std::string picture = "  " + mask.picture(0, 0);
  for (size_t at = picture.find('\n'); at != std::string::npos && at + 1 < picture.size();
       at = picture.find('\n', at + 1))
    picture.insert(at + 1, "  ");
  std::printf("%s%s", picture.c_str(), picture.ends_with('\n') ? "" : "\n");
}

// Runs flex_attention once (the first call traces and compiles) with the LSE,
// and prints how long that took.
inline FlexAttentionResult firstCall(const Options& o, const std::function<FlexAttentionResult()>& call) {
  auto t0 = std::chrono::steady_clock::now();
  FlexAttentionResult r = call();
  if (o.gpu) runtime::synchronize();
  std::printf("  first flex_attention call (trace, compile, run%s): %.1f ms\n", o.gpu ? "" : " in the interpreter",
              millisecondsSince(t0));
  return r;
}

inline int finish(const Options& o, bool ok) {
  std::printf("attention example '%s': %s\n", o.example.c_str(), ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}

// The end of every example: on small shapes the BlockMask's element mask
// against the plain C++ mask; the output and LSE (computed with the default
// scale 1/sqrt(D)) against float64; the time where a GPU ran it; the verdict.
// `alsoOk` carries an example's own extra checks. Returns the exit status.
inline int checkReportAndFinish(const Options& o, const Inputs& in, const FlexAttentionResult& result,
                                const ScoreMod& score, const std::optional<BlockMask>& mask,
                                const RefScoreFn& refScore, const RefMaskFn& refMask, std::mt19937_64& rng,
                                bool alsoOk = true) {
  if (!o.gpu && mask && refMask) expectDenseMatches(*mask, refMask);
  // No reference mask: every pair counts (the mask, if any, lists every block as full).
  const int64_t pairs = countAllowedPairs(refMask ? mask : std::nullopt, refMask, o.B, o.H, o.N, o.N);
  const double scale = 1.0 / std::sqrt(double(o.D));
  const bool ok = checkAgainstReference(o, in, result, scale, refScore, refMask, pairs, rng);
  reportPerformance(o, in, score, mask, pairs);
  return finish(o, ok && alsoOk);
}

}  // namespace flextile::examples::attention
