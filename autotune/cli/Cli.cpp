#include "autotune/cli/Cli.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/Reference.h"
#include "attention_templates/Variants.h"
#include "autotune/Autotune.h"
#include "autotune/Json.h"
#include "autotune/TuneCache.h"
#include "autotune/cli/Pictures.h"
#include "ir/Printer.h"
#include "codegen/CompileCache.h"
#include "runtime/Device.h"
#include "runtime/Event.h"

namespace flextile::cli {

namespace {

using attention::FlexAttentionConfig;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

// A bad command line: exit status 2 with the message and the command's usage.
struct UsageError {
  std::string message;
};

const char* kUsage =
    "usage: flextile <command> [options]\n"
    "\n"
    "commands:\n"
    "  list                       the registered attention variants and templates\n"
    "  run VARIANT                run flex_attention once, time it, optionally check it\n"
    "  autotune VARIANT           sweep configs, print a table, store the winner for this GPU\n"
    "  compile VARIANT            print the kernel at a stage (--emit ir|traced|llvm|ptx)\n"
    "  bench                      time every variant (the yardstick table; needs a GPU)\n"
    "  blockmask [VARIANT]        the BlockMask's statistics and block picture (PNG/SVG on request)\n"
    "\n"
    "`flextile <command> --help` describes each command's options.\n";

struct Command {
  const char* name;
  const char* usage;
  std::set<std::string> valueFlags, boolFlags;
  bool needsVariant;
  std::set<std::string> optionalValueFlags = {};  // `--flag` alone or `--flag=value`
  bool takesVariant = false;                      // a VARIANT may be given (needsVariant: must be)
};

const std::vector<Command>& commands() {
  static const std::vector<Command> c{
      {"list", "usage: flextile list\n  Lists the registered variants (built-in and user) and the templates.\n", {}, {},
       false},
      {"run",
       "usage: flextile run VARIANT --shape B,H,N,D [--dtype bf16|f16|f32] [--gqa G] [--dv DV] [--config BM,BN,W,S[,ws|,no-ws][,turns|,no-turns][,defer|,no-defer][,persistent|,no-persistent][,skew|,no-skew][,overlap|,no-overlap]]\n"
       "                    [--check[=all]] [--max-scores] [--sinks] [--backward [--atomic-dq]] [--host] [--seed S]\n"
       "                    [--document-offsets FILE]\n"
       "  Runs flex_attention once on random inputs (q: B x H x N x D; k, v: H/G heads; v's head dim DV with\n"
       "  --dv, as MLA's 192 / 128), prints the time and\n"
       "  TFLOP/s. On the GPU when one is present, else (or with --host) through the IR interpreter, which\n"
       "  suits small shapes only. --check compares with the float64 reference (exit 1 when it differs) on a\n"
       "  seeded sample of rows: every batch and head, first and last rows, both sides of every block\n"
       "  boundary, rows the mask leaves without keys, and random rows (seconds at any shape);\n"
       "  --check=all compares every row, on every core.\n"
       "  --max-scores also asks for each row's largest score (return_max_scores), prints the largest\n"
       "  and the rows without a key, and --check compares them too.\n"
       "  --sinks adds attention sinks (FlexAttentionOptions::sinks): a seeded random logit per head near\n"
       "  log(N), which --check gives the reference too.\n"
       "  --backward also runs flex_attention_backward (dout random) and prints its time and TFLOP/s (2.5\n"
       "  forwards; on a GPU a training step's too); --check then compares dQ on the rows above and dK, dV on a sample of keys (first and\n"
       "  last, both sides of every 128-key boundary, random ones; --check=all: every key) with float64\n"
       "  from the forward's out and lse. --atomic-dq: dQ summed by the dkdv programs (not reproducible).\n"
       "  Without --config the tuned config for this GPU is used when there is one, else the default.\n"
       "  --document-offsets FILE: the document variant's cuts, JSON {\"offsets\": [[0, .., N], ..]} (one\n"
       "  list per batch); default: 8 documents per sequence at seeded random cuts.\n",
       {"--shape", "--dtype", "--gqa", "--dv", "--config", "--seed", "--document-offsets"},
       {"--host", "--max-scores", "--sinks", "--backward", "--atomic-dq"},
       true,
       {"--check"}},
      {"autotune",
       "usage: flextile autotune VARIANT --shape B,H,N,D [--dtype ..] [--gqa G] [--dv DV] [--budget SECONDS] [--threads N]\n"
       "                         [--target sm_80|sm_90a] [--no-store] [--document-offsets FILE] [--plot FILE]\n"
       "                         [--kernel forward|decode|backward] [--queries L] [--min-speedup X]\n"
       "  Compiles every config of the space in parallel (pruned configs show why), checks each against the\n"
       "  default config and times it on the GPU, prints the table and stores the winner in the per-GPU\n"
       "  cache, which flex_attention then uses. Without a GPU: a dry run (compile and prune for --target).\n"
       "  --kernel decode tunes the decode template instead: L queries (--queries, default 1) at the end of\n"
       "  a cache of N keys, the mask sliced to them, over BLOCK_N x warps x stages x the programs an SM\n"
       "  its split count aims at; the rate is TB/s of the K and V in the blocks the mask lists. Its\n"
       "  winner serves decode calls of the same mods, dtype, head dim, GQA, queries (power of two), KV\n"
       "  length bucket and B x KV heads (power of two). Default shape 8,32,32768,128.\n"
       "  --kernel backward tunes flex_attention_backward's (dkdv, dq) tile pairs, each timed as the whole\n"
       "  backward (TFLOP/s at 2.5 forwards) and checked on dQ, dK and dV against the default pair; its\n"
       "  winner serves backward calls of the same mods, dtype, head dims, GQA and length bucket.\n"
       "  --min-speedup X: a config must run X times as fast as the default to win (default 1.02: below\n"
       "  that the default stays, so run-to-run noise does not pick the winner).\n"
       "  --plot FILE draws the sweep (TFLOP/s per config; pruned, failed, wrong and skipped configs marked):\n"
       "  SVG when FILE ends in .svg, else PNG (forward only).\n",
       {"--shape", "--dtype", "--gqa", "--dv", "--budget", "--threads", "--target", "--document-offsets", "--plot",
        "--kernel", "--queries", "--min-speedup"},
       {"--no-store"}, true},
      {"compile",
       "usage: flextile compile VARIANT [--shape B,H,N,D] [--dtype ..] [--gqa G] [--dv DV] [--config BM,BN,W,S[,ws|,no-ws][,turns|,no-turns][,defer|,no-defer][,persistent|,no-persistent][,skew|,no-skew][,overlap|,no-overlap]]\n"
       "                        [--target sm_80|sm_90a] [--kernel forward|last-round-merge|preprocess|dkdv|dq|decode] [--queries L]\n"
       "                        [--atomic-dq] [--max-scores] [--sinks] --emit traced|ir|llvm|ptx [--locations]\n"
       "  Prints one stage of the kernel: traced (tile IR as traced; --locations: each op's template or\n"
       "  mod source line), ir (after the passes, with layouts),\n"
       "  llvm (LLVM IR after O3), ptx. Needs no GPU. Default shape 1,2,1024,128, target sm_90a.\n"
       "  --kernel picks a kernel of the backward or the decode kernel (default: the forward). For the\n"
       "  backward, --config is that kernel's tile (dkdv: BM queries per step, BN keys per program), the\n"
       "  other keeps its default; the backward's kernels have no traced stage here; --atomic-dq: dkdv\n"
       "  adds dQ itself (DqAccumulation::Atomic, no dq kernel); --max-scores: the forward's, merge's or\n"
       "  decode's kernel that also writes each row's largest score (return_max_scores); --sinks: theirs\n"
       "  with attention sinks (FlexAttentionOptions::sinks). decode: L queries\n"
       "  (--queries, default 1) at the end of a cache of N keys, the mask sliced to them; --config is\n"
       "  then BN,W,S[,SPLITS][,per-sm=N][,cluster|,no-cluster][,ws|,no-ws] (SPLITS 0 or absent: chosen\n"
       "  for the target's GPU, aiming at N programs an SM, default 2; cluster: the splits merge through\n"
       "  thread block clusters; ws: the full blocks by TMA from a producer warpgroup). last-round-merge: the\n"
       "  kernel that folds the pieces of a forward that splits its last round (no mask, more tiles than\n"
       "  the target's SMs, not a whole number of rounds), no traced stage.\n",
       {"--shape", "--dtype", "--gqa", "--dv", "--config", "--target", "--emit", "--kernel", "--queries"},
       {"--locations", "--atomic-dq", "--max-scores", "--sinks"},
       true},
      {"bench",
       "usage: flextile bench [--shape B,H,N,D] [--dtype ..] [--dv DV] [--variants a,b,..] [--document-offsets FILE]\n"
       "  Times every variant (or those listed) with its tuned or default config; needs a GPU.\n"
       "  Default shape 2,16,8192,128 (DESIGN.md's yardstick).\n",
       {"--shape", "--dtype", "--dv", "--variants", "--document-offsets"}, {}, false},
      {"blockmask",
       "usage: flextile blockmask [VARIANT] --shape B,H,N[,D] [--block Q[,KV]] [--tile BM[,BN]] [--png FILE]\n"
       "                          [--svg FILE] [--document-offsets FILE]\n"
       "  Builds the variant's BlockMask on the host and prints its block picture (full, partial and\n"
       "  empty blocks) and its statistics per (b, h) of the mask and overall: live blocks per query-block\n"
       "  row (mean, P50, P95, max), full and partial blocks, rows without keys, allowed pairs, the\n"
       "  amplification gamma = computed / allowed pairs of a kernel with BM x BN tiles (--tile; default\n"
       "  the mask's blocks) and the lists' bytes. Without VARIANT: the statistics of the seven yardstick\n"
       "  variants. --png / --svg FILE draw the block classification of every (b, h) (without VARIANT,\n"
       "  one file per masked variant: FILE with -VARIANT before its extension).\n",
       {"--shape", "--block", "--tile", "--png", "--svg", "--document-offsets"}, {}, false, {}, true},
  };
  return c;
}

struct Args {
  const Command* command = nullptr;
  std::string variant;
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  bool has(const std::string& f) const { return flags.count(f) || values.count(f); }
  std::string get(const std::string& f, const std::string& fallback) const {
    auto it = values.find(f);
    return it == values.end() ? fallback : it->second;
  }
};

std::vector<int64_t> parseInts(const std::string& flag, const std::string& text, size_t minCount, size_t maxCount) {
  std::vector<int64_t> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != item.size() || x < 1)
      throw UsageError{flag + " expects positive integers separated by commas, got '" + text + "'"};
    v.push_back(x);
  }
  if (v.size() < minCount || v.size() > maxCount)
    throw UsageError{flag + " expects " + std::to_string(minCount) +
                     (maxCount != minCount ? " to " + std::to_string(maxCount) : "") + " values, got '" + text + "'"};
  return v;
}

double parseNumber(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    double d = std::stod(text, &used);
    if (used == text.size() && d >= 0) return d;
  } catch (...) {
  }
  throw UsageError{flag + " expects a non-negative number, got '" + text + "'"};
}

DType parseDType(const std::string& s) {
  if (s == "bf16") return DType::BF16;
  if (s == "f16" || s == "fp16") return DType::F16;
  if (s == "f32" || s == "fp32") return DType::F32;
  throw UsageError{"--dtype must be bf16, f16 or f32, got '" + s + "'"};
}

codegen::Target parseTarget(const std::string& s) {
  if (auto target = codegen::Target::fromName(s); target && s.rfind("sm_", 0) == 0) return *target;
  throw UsageError{"--target must be one of " + codegen::supportedTargetNames() + ", got '" + s + "'"};
}

void parse(int argc, const char* const* argv, Args& a) {
  if (argc < 2) throw UsageError{"no command given"};
  const std::string name = argv[1];
  for (const Command& c : commands())
    if (name == c.name) a.command = &c;
  if (!a.command) throw UsageError{"unknown command '" + name + "'"};
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      a.flags.insert("--help");
    } else if (arg.rfind("--", 0) == 0) {
      std::string flag = arg, value;
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) flag = arg.substr(0, eq), value = arg.substr(eq + 1);
      if (a.command->boolFlags.count(flag)) {
        if (eq != std::string::npos) throw UsageError{flag + " takes no value"};
        a.flags.insert(flag);
      } else if (a.command->optionalValueFlags.count(flag)) {
        if (eq == std::string::npos) a.flags.insert(flag);
        else a.values[flag] = value;
      } else if (a.command->valueFlags.count(flag)) {
        if (eq == std::string::npos) {
          if (i + 1 >= argc) throw UsageError{flag + " needs a value"};
          value = argv[++i];
        }
        a.values[flag] = value;
      } else {
        throw UsageError{"unknown option '" + flag + "' for '" + name + "'"};
      }
    } else if ((a.command->needsVariant || a.command->takesVariant) && a.variant.empty()) {
      a.variant = arg;
    } else {
      throw UsageError{"unexpected argument '" + arg + "'"};
    }
  }
  if (!a.flags.count("--help") && a.command->needsVariant && a.variant.empty())
    throw UsageError{"'" + name + "' needs a VARIANT (see `flextile list`)"};
}

int coreCount() { return std::max(1, int(std::thread::hardware_concurrency())); }

// N(0, 1) inputs of element type T, reproducible from (seed, which tensor) alone: each chunk of
// elements has its own generator, so chunks fill (and round to T) in parallel — one generator took
// 3.5 s for q, k and v at 2,32,4096,128 — and the values do not depend on the thread count.
template <class T>
Tensor randomTensorOf(uint64_t seed, uint64_t which, dsl::Shape shape, MemorySpace space) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<T> values(static_cast<size_t>(n));
  constexpr int64_t kChunk = int64_t(1) << 20;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::atomic<int64_t> next{0};
  auto fill = [&] {
    for (int64_t c; (c = next++) < chunks;) {
      std::seed_seq seq{uint64_t(seed), which, uint64_t(c)};
      std::mt19937_64 rng(seq);
      std::normal_distribution<float> g(0, 1);
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) values[size_t(i)] = T(g(rng));
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min<int64_t>(coreCount(), chunks); ++t) pool.emplace_back(fill);
  fill();
  for (std::thread& t : pool) t.join();
  return Tensor::fromHost(values, std::move(shape), space);
}

Tensor randomTensor(uint64_t seed, uint64_t which, DType dt, dsl::Shape shape, MemorySpace space) {
  switch (dt) {
    case DType::BF16: return randomTensorOf<Eigen::bfloat16>(seed, which, std::move(shape), space);
    case DType::F16: return randomTensorOf<Eigen::half>(seed, which, std::move(shape), space);
    default: return randomTensorOf<float>(seed, which, std::move(shape), space);
  }
}

// The document variant's cuts from --document-offsets: JSON {"offsets": [[0, .., N], ..]}, one list
// per batch (what bench/torch_document_cuts.py writes, so both sides run the same documents).
std::vector<std::vector<int64_t>> readDocumentOffsets(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw UsageError{"--document-offsets: cannot read " + path};
  std::stringstream text;
  text << file.rdbuf();
  autotune::Json root;
  try {
    root = autotune::parseJson(text.str());
  } catch (const Error& e) {
    throw UsageError{"--document-offsets: " + path + " is not JSON: " + e.what()};
  }
  const autotune::Json* lists = root.find("offsets");
  if (!lists || lists->kind != autotune::Json::Kind::Array || lists->array.empty())
    throw UsageError{"--document-offsets: " + path + " needs a non-empty array \"offsets\" of offset lists"};
  std::vector<std::vector<int64_t>> out;
  for (const autotune::Json& list : lists->array) {
    if (list.kind != autotune::Json::Kind::Array)
      throw UsageError{"--document-offsets: every entry of \"offsets\" in " + path + " must be a list of integers"};
    out.emplace_back();
    for (const autotune::Json& x : list.array) {
      if (x.kind != autotune::Json::Kind::Number || x.number != std::floor(x.number) || x.number < 0)
        throw UsageError{"--document-offsets: " + path + " holds a value that is not a non-negative integer"};
      out.back().push_back(int64_t(x.number));
    }
  }
  return out;
}

// A host tensor of `shape` for compiling only (shapes, strides and alignment are all a compile
// reads): a contiguous view over one small aligned block, so a yardstick shape allocates and
// clears nothing (three empty 64 MB tensors took 250 ms of a warm `flextile compile`).
Tensor shapeOnly(DType dtype, const dsl::Shape& shape) {
  alignas(1024) static std::byte block[1024];
  return Tensor::hostView(block, dtype, shape);
}

// The inputs of one variant at one shape.
struct Problem {
  int64_t B, H, N, D, Hkv;
  DType dtype;
  MemorySpace space;
  attention::VariantInstance instance;
  Tensor q, k, v;
  int64_t DV = 0;  // v's head dim (--dv; D unless given)
};

Problem makeProblem(const Args& a, const std::string& variantName, const std::string& defaultShape, MemorySpace space,
                    uint64_t seed, bool needTensors = true) {
  const std::vector<int64_t> s = parseInts("--shape", a.get("--shape", defaultShape), 4, 4);
  Problem p{s[0], s[1], s[2], s[3], s[1], parseDType(a.get("--dtype", "bf16")), space, {}, {}, {}, {}};
  const int64_t gqa = parseInts("--gqa", a.get("--gqa", "1"), 1, 1)[0];
  if (p.H % gqa != 0)
    throw UsageError{"--gqa " + std::to_string(gqa) + " must divide the heads H = " + std::to_string(p.H)};
  p.Hkv = p.H / gqa;
  p.DV = parseInts("--dv", a.get("--dv", std::to_string(p.D)), 1, 1)[0];
  if (space == MemorySpace::Host && needTensors &&
      double(p.B * p.H) * double(p.N) * double(p.N) * double(p.D) > 64.0 * 1024 * 1024)
    throw UsageError{"the interpreter is meant for small shapes: B*H*N*N*D must be at most 64M (try --shape 1,2,256,64)"};
  const attention::Variant& var = attention::variant(variantName);
  attention::VariantInputs inputs{p.B, p.H, p.N, p.N, space, {128, 128}, seed};
  if (a.has("--document-offsets") && (variantName == "document" || a.command->needsVariant)) {
    if (variantName != "document")
      throw UsageError{"--document-offsets applies to the document variant, not '" + variantName + "'"};
    inputs.documentOffsets = readDocumentOffsets(a.get("--document-offsets", ""));
  }
  p.instance = var.make(inputs);
  if (needTensors) {
    p.q = randomTensor(seed, 0, p.dtype, {p.B, p.H, p.N, p.D}, space);
    p.k = randomTensor(seed, 1, p.dtype, {p.B, p.Hkv, p.N, p.D}, space);
    p.v = randomTensor(seed, 2, p.dtype, {p.B, p.Hkv, p.N, p.DV}, space);
  }
  return p;
}

std::optional<FlexAttentionConfig> parseConfig(const Args& a) {
  if (!a.values.count("--config")) return std::nullopt;
  try {
    return FlexAttentionConfig::parse(a.values.at("--config"));
  } catch (const Error& e) {
    throw UsageError{std::string("--config: ") + e.what()};
  }
}

// The pairs a head attends, counted exactly from the problem's mask.
double allowedPairsPerHead(const Problem& p) {
  const double pairs = p.instance.mask ? attention::countAllowedPairs(*p.instance.mask, p.instance.refMask, p.B, p.H)
                                       : double(p.B * p.H) * double(p.N) * double(p.N);
  return pairs / double(p.B * p.H);
}

// FLOPs of one forward call on the problem.
double forwardFlops(const Problem& p) {
  return attention::flexAttentionFlops(p.B, p.H, p.D, allowedPairsPerHead(p), p.DV);
}

bool gpuPresent(std::string* why = nullptr) { return dsl::deviceAvailable(why); }

int cmdList(const Args&, std::ostream& out) {
  out << "variants:\n";
  for (const attention::Variant& v : attention::variants()) {
    char line[512];
    std::snprintf(line, sizeof line, "  %-16s %s\n", v.name.c_str(), v.description.c_str());
    out << line;
  }
  out << "templates:\n  flex_attention_fwd  the fused forward template (attention_templates/FlexAttentionForward.cpp)\n";
  return 0;
}

// What `run --check` compares.
enum class CheckScope { None, Sample, All };

CheckScope parseCheck(const Args& a) {
  if (!a.has("--check")) return CheckScope::None;
  const std::string value = a.get("--check", "sample");
  if (value == "sample") return CheckScope::Sample;
  if (value == "all") return CheckScope::All;
  throw UsageError{"--check=" + value + ": use --check (a sample of rows) or --check=all (every row)"};
}

// FLEXTILE_CLI_WRONG_REFERENCE=1 adds 1 to every third reference score, so that a check must fail:
// the test suite runs it so to prove that a failed check is reported and exits non-zero.
bool wrongReference() { return std::getenv("FLEXTILE_CLI_WRONG_REFERENCE") != nullptr; }
// The problem's reference score_mod, or with wrongReference() that one made wrong.
attention::RefScoreFn referenceScore(const Problem& p) {
  if (!wrongReference()) return p.instance.refScore;
  return [base = p.instance.refScore](double x, int64_t b, int64_t h, int64_t i, int64_t j) {
    const double y = base ? base(x, b, h, i, j) : x;
    return (i + j) % 3 == 0 ? y + 1 : y;
  };
}

// Compares the result with the float64 reference on the rows `scope` asks for and prints what
// was checked and how it went; true when it passed. Each row is held to a bound of its own (one
// bad row — a tail, a block boundary, a row without keys — hides in a norm over thousands) as well
// as the whole to the dtype's tolerance; a row whose reference has no key must be exactly 0 with
// lse -inf.
bool checkAgainstReference(const Problem& p, const attention::FlexAttentionResult& r, CheckScope scope, uint64_t seed,
                           int64_t blockM, const std::vector<double>* sinks, std::ostream& out) {
  const int threads = coreCount();
  const int64_t totalRows = p.B * p.H * p.N;
  const attention::BlockMask* mask = p.instance.mask ? &*p.instance.mask : nullptr;
  const std::vector<attention::QueryRow> rows =
      scope == CheckScope::All
          ? attention::allQueryRows(p.B, p.H, p.N)
          : attention::sampleQueryRows(p.B, p.H, p.N, mask, p.instance.refMask,
                                       {.boundaryBlock = blockM, .seed = seed, .threads = threads});
  char what[160];
  if (scope == CheckScope::All)
    std::snprintf(what, sizeof what, "%lld of %lld rows (all)", (long long)rows.size(), (long long)totalRows);
  else
    std::snprintf(what, sizeof what, "%lld of %lld rows (sample, seed %llu)", (long long)rows.size(),
                  (long long)totalRows, (unsigned long long)seed);
  out << "checking " << what << " against the float64 reference on " << threads << " threads\n";

  if (wrongReference()) out << "FLEXTILE_CLI_WRONG_REFERENCE is set: the reference is wrong on purpose\n";
  const attention::RefScoreFn score = referenceScore(p);
  const double scale = 1.0 / std::sqrt(double(p.D));
  const attention::ReferenceRows ref =
      attention::referenceAttentionRows(p.q, p.k, p.v, score, p.instance.refMask, scale, rows, 0, threads, sinks);

  const Tensor outHost = r.out.to(MemorySpace::Host), lseHost = r.lse.to(MemorySpace::Host);
  const float* lse = static_cast<const float*>(lseHost.hostData());
  const std::vector<float> best = r.max_scores.defined() ? r.max_scores.toHost<float>() : std::vector<float>{};
  double bestErr = 0;
  const double tol = p.dtype == DType::BF16 ? 2e-2 : 4e-3;
  double num = 0, den = 0, worstRow = 0, lseErr = 0;
  std::string firstProblem;
  for (size_t n = 0; n < rows.size(); ++n) {
    const attention::QueryRow& row = rows[n];
    const int64_t flat = (row.b * p.H + row.h) * p.N + row.i;
    const Tensor rowView = Tensor::hostView(static_cast<char*>(outHost.hostData()) + flat * p.DV * outHost.elementBytes(),
                                            p.dtype, {p.DV});
    const std::vector<double> got = attention::toDoubles(rowView);
    const std::string where = std::to_string(row.b) + ", " + std::to_string(row.h) + ", " + std::to_string(row.i);
    double rowNum = 0, rowDen = 0;
    for (int64_t d = 0; d < p.DV; ++d) {
      const double g = got[size_t(d)], want = ref.out[n * size_t(p.DV) + size_t(d)];
      if (!std::isfinite(g) && firstProblem.empty()) firstProblem = "out[" + where + ", " + std::to_string(d) + "] is " + std::to_string(g);
      rowNum += (g - want) * (g - want);
      rowDen += want * want;
    }
    num += rowNum;
    den += rowDen;
    const double rowRel = rowDen > 0 ? std::sqrt(rowNum / rowDen) : (rowNum == 0 ? 0 : INFINITY);
    worstRow = std::max(worstRow, rowRel);
    if (!(rowRel <= 2 * tol) && firstProblem.empty())
      firstProblem = "row [" + where + "] of out has relative error " + std::to_string(rowRel);
    // A value a row (lse, max scores): -inf exactly where the reference's row has no live score,
    // else within `absolute` + 1e-3 relative; the largest error into `worst`.
    auto checkRowValue = [&](const char* name, double want, double have, double absolute, double& worst) {
      const bool ok = std::isinf(want)
                          ? std::isinf(have) && have < 0
                          : std::isfinite(have) && std::abs(have - want) <= absolute + 1e-3 * std::abs(want);
      if (std::isfinite(want) && std::isfinite(have)) worst = std::max(worst, std::abs(have - want));
      if (!ok && firstProblem.empty())
        firstProblem = std::string(name) + "[" + where + "] is " + std::to_string(have) + ", reference " +
                       std::to_string(want);
    };
    checkRowValue("lse", ref.lse[n], lse[flat], 2e-2, lseErr);
    if (!best.empty()) checkRowValue("max_scores", ref.maxScores[n], best[size_t(flat)], 5e-3, bestErr);
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  char bestText[64] = "";
  if (!best.empty()) std::snprintf(bestText, sizeof bestText, ", max |max score error| %.2e", bestErr);
  if (!(rel <= tol) && firstProblem.empty()) firstProblem = "the relative error of out is above the tolerance";
  char line[512];
  std::snprintf(line, sizeof line,
                "check vs float64 reference, %s: relative error %.2e (tolerance %.0e), worst row %.2e, "
                "max |lse error| %.2e%s: %s\n",
                what, rel, tol, worstRow, lseErr, bestText, firstProblem.empty() ? "PASS" : "FAIL");
  out << line;
  if (!firstProblem.empty()) out << "  first problem: " << firstProblem << "\n";
  return firstProblem.empty();
}

// The keys a backward check reads in each (batch, kv head): the first and last, both sides of every
// 128-key boundary (the tiles' and the mask's blocks) dealt round-robin over the (b, h), and
// `randomPerHead` seeded random keys. Sorted, without duplicates.
std::vector<attention::KeyRow> sampleKeyRows(int64_t B, int64_t Hkv, int64_t S, uint64_t seed, int64_t randomPerHead) {
  std::vector<attention::KeyRow> keys;
  std::mt19937_64 rng(seed ^ 0x6b657973u);
  int64_t turn = 0;
  for (int64_t j = 128; j < S; j += 128, ++turn)
    for (int64_t side : {j - 1, j}) keys.push_back({(turn / Hkv) % B, turn % Hkv, side});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h) {
      keys.push_back({b, h, 0});
      keys.push_back({b, h, S - 1});
      for (int64_t n = 0; n < randomPerHead; ++n) keys.push_back({b, h, int64_t(rng() % uint64_t(S))});
    }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// `run --backward`: the backward of the forward `r` on a random dout (seeded), timed, and with a
// check its dQ rows and dK, dV keys against float64 (referenceAttentionBackwardRows, from the
// forward's out and lse, which the forward's check compared). True unless the check failed.
// `forwardMs`: the forward's time, for the training step's TFLOP/s.
bool runBackward(const Args& a, const Problem& p, const attention::FlexAttentionResult& r,
                 const attention::FlexAttentionOptions& forward, double forwardMs, CheckScope check, uint64_t seed,
                 bool device, std::ostream& out) {
  const Tensor dout = randomTensor(seed, 3, p.dtype, {p.B, p.H, p.N, p.DV}, p.q.space());
  attention::FlexAttentionBackwardOptions options;
  if (a.has("--atomic-dq")) options.dq_accumulation = attention::DqAccumulation::Atomic;
  options.sinks = forward.sinks;
  attention::FlexAttentionGrads g;
  g.dq = Tensor::empty(p.dtype, {p.B, p.H, p.N, p.D}, p.q.space());
  g.dk = Tensor::empty(p.dtype, {p.B, p.Hkv, p.N, p.D}, p.q.space());
  g.dv = Tensor::empty(p.dtype, {p.B, p.Hkv, p.N, p.DV}, p.q.space());
  auto t0 = std::chrono::steady_clock::now();
  attention::flex_attention_backward_into(p.q, p.k, p.v, r.out, r.lse, dout, p.instance.score, p.instance.mask, g,
                                          options);
  if (device) runtime::synchronize();
  const double firstMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The config the call ran (the plan compiles for the GPU: not on the interpreter).
  std::string config = "(the interpreter's default config)";
  if (device)
    config = attention::plan_flex_attention_backward(p.q, p.k, p.v, r.out, r.lse, dout, p.instance.score,
                                                     p.instance.mask, options)
                 .config.describe();
  char line[512];
  std::snprintf(line, sizeof line, "backward %s%s; first call %.1f ms\n", config.c_str(),
                options.dq_accumulation == attention::DqAccumulation::Atomic ? " (atomic dQ)" : "", firstMs);
  out << line;
  double ms = firstMs;
  if (device) {
    ms = runtime::median(runtime::timeKernel(
        [&] {
          attention::flex_attention_backward_into(p.q, p.k, p.v, r.out, r.lse, dout, p.instance.score,
                                                  p.instance.mask, g, options);
        },
        3, 20));
  }
  std::snprintf(line, sizeof line, "backward %s %.3f ms, %.2f TFLOP/s\n", device ? "median of 20 calls" : "interpreted",
                ms, 2.5 * forwardFlops(p) / ms / 1e9);
  out << line;
  if (device) {  // forward + backward: 3.5 forwards' FLOPs over both times (DESIGN.md's count)
    std::snprintf(line, sizeof line, "training step (forward + backward) %.3f ms, %.2f TFLOP/s\n", forwardMs + ms,
                  3.5 * forwardFlops(p) / (forwardMs + ms) / 1e9);
    out << line;
  }
  if (check == CheckScope::None) return true;

  const int threads = coreCount();
  const attention::BlockMask* mask = p.instance.mask ? &*p.instance.mask : nullptr;
  const std::vector<attention::QueryRow> rows =
      check == CheckScope::All ? attention::allQueryRows(p.B, p.H, p.N)
                               : attention::sampleQueryRows(p.B, p.H, p.N, mask, p.instance.refMask,
                                                            {.boundaryBlock = 128, .seed = seed, .threads = threads});
  std::vector<attention::KeyRow> keys;
  if (check == CheckScope::All) {
    for (int64_t b = 0; b < p.B; ++b)
      for (int64_t h = 0; h < p.Hkv; ++h)
        for (int64_t j = 0; j < p.N; ++j) keys.push_back({b, h, j});
  } else {
    keys = sampleKeyRows(p.B, p.Hkv, p.N, seed, 16);
  }
  const attention::RefScoreFn score = referenceScore(p);  // (wrong on purpose as the forward's, when asked)
  const double scale = 1.0 / std::sqrt(double(p.D));
  const attention::ReferenceGradRows ref = attention::referenceAttentionBackwardRows(
      p.q, p.k, p.v, r.out, r.lse, dout, score, p.instance.refScoreGrad, p.instance.refMask, scale, rows, keys, 0,
      threads);
  // Each gradient's sampled elements against the reference: the largest error over the largest
  // reference magnitude (what testing::gradMismatch bounds), per dtype.
  const double tol = p.dtype == DType::BF16 ? 3e-2 : 6e-3;
  std::string firstProblem;
  auto compare = [&](const char* what, const Tensor& got, const std::vector<double>& want, int64_t width,
                     const auto& flatOf, size_t count) {
    const std::vector<double> all = attention::toDoubles(got);
    double maxRef = 1e-6, err = 0;
    for (double x : want) maxRef = std::max(maxRef, std::abs(x));
    for (size_t n = 0; n < count; ++n)
      for (int64_t d = 0; d < width; ++d) {
        const double have = all[size_t(flatOf(n)) * size_t(width) + size_t(d)], w = want[n * size_t(width) + size_t(d)];
        const double e = std::isfinite(have) ? std::abs(have - w) : INFINITY;
        err = std::max(err, e);
        if (!(e <= tol * maxRef) && firstProblem.empty())
          firstProblem = std::string(what) + " element " + std::to_string(d) + " of sample " + std::to_string(n) +
                         " is " + std::to_string(have) + ", reference " + std::to_string(w);
      }
    return err / maxRef;
  };
  const double dqErr = compare("dq", g.dq, ref.dq, p.D, [&](size_t n) {
    return (rows[n].b * p.H + rows[n].h) * p.N + rows[n].i;
  }, rows.size());
  auto keyOf = [&](size_t n) { return (keys[n].b * p.Hkv + keys[n].h) * p.N + keys[n].j; };
  const double dkErr = compare("dk", g.dk, ref.dk, p.D, keyOf, keys.size());
  const double dvErr = compare("dv", g.dv, ref.dv, p.DV, keyOf, keys.size());
  std::snprintf(line, sizeof line,
                "backward check vs float64 reference, %zu dq rows and %zu dk/dv keys%s: largest error over the "
                "largest reference dq %.2e, dk %.2e, dv %.2e (tolerance %.0e): %s\n",
                rows.size(), keys.size(), check == CheckScope::All ? " (all)" : " (sample)", dqErr, dkErr, dvErr, tol,
                firstProblem.empty() ? "PASS" : "FAIL");
  out << line;
  if (!firstProblem.empty()) out << "  first problem: " << firstProblem << "\n";
  return firstProblem.empty();
}

int cmdRun(const Args& a, std::ostream& out, std::ostream& err) {
  const CheckScope check = parseCheck(a);
  if (a.has("--atomic-dq") && !a.has("--backward")) throw UsageError{"--atomic-dq applies to --backward"};
  std::string why;
  const bool device = !a.has("--host") && gpuPresent(&why);
  if (!device && !a.has("--host")) err << "flextile run: no GPU (" << why << "); running on the interpreter\n";
  const uint64_t seed = a.has("--seed") ? uint64_t(parseInts("--seed", a.get("--seed", "1"), 1, 1)[0]) : std::random_device{}();
  Problem p = makeProblem(a, a.variant, "1,2,256,64", device ? MemorySpace::Device : MemorySpace::Host, seed);
  attention::FlexAttentionOptions options;
  options.config = parseConfig(a);
  options.return_lse = check != CheckScope::None || a.has("--backward");
  options.return_max_scores = a.has("--max-scores");
  std::vector<double> sinks;
  if (a.has("--sinks")) {
    std::mt19937_64 rng(seed ^ 0x5157u);
    std::uniform_real_distribution<double> near(std::log(double(p.N)) - 2, std::log(double(p.N)) + 2);
    std::vector<float> values(static_cast<size_t>(p.H));
    for (float& x : values) x = float(near(rng));
    options.sinks = Tensor::fromHost(values, {p.H}, p.q.space());
    sinks.assign(values.begin(), values.end());
  }
  char line[512];
  // Each line is printed as soon as it is known (the streams flush per write: flextileMain), so a
  // run stopped during a long step shows how far it got.
  const std::string dv = p.DV != p.D ? " DV=" + std::to_string(p.DV) : std::string();
  std::snprintf(line, sizeof line, "%s B=%lld H=%lld Hkv=%lld N=%lld D=%lld%s %s on %s, seed %llu\n", a.variant.c_str(),
                (long long)p.B, (long long)p.H, (long long)p.Hkv, (long long)p.N, (long long)p.D, dv.c_str(),
                std::string(ir::dtypeName(p.dtype)).c_str(),
                device ? runtime::Device::current().name().c_str() : "the interpreter", (unsigned long long)seed);
  out << line;
  // The first call traces and compiles (or reads the compile cache).
  auto t0 = std::chrono::steady_clock::now();
  attention::FlexAttentionResult r = attention::flex_attention(p.q, p.k, p.v, p.instance.score, p.instance.mask, options);
  if (device) runtime::synchronize();
  const double firstMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const attention::FlexAttentionPlan plan =
      attention::plan_flex_attention(p.q, p.k, p.v, p.instance.score, p.instance.mask, options);
  std::snprintf(line, sizeof line, "config %s%s; first call %.1f ms (trace + compile or cache + run)\n",
                plan.config.describe().c_str(), options.config ? "" : " (tuned or default)", firstMs);
  out << line;
  double ms = firstMs;
  if (options.return_max_scores) options.max_scores = r.max_scores;  // the timed calls write them again
  if (device) {
    auto samples = runtime::timeKernel(
        [&] { attention::flex_attention_into(p.q, p.k, p.v, p.instance.score, p.instance.mask, r.out, nullptr, options); },
        3, 20);
    ms = runtime::median(samples);
  }
  const double flops = forwardFlops(p);
  std::snprintf(line, sizeof line, "%s %.3f ms, %.2f TFLOP/s\n", device ? "median of 20 calls" : "interpreted", ms,
                flops / ms / 1e9);
  out << line;
  if (options.return_max_scores) {
    const std::vector<float> best = r.max_scores.toHost<float>();
    float top = -INFINITY;
    int64_t blind = 0;
    for (float x : best) top = std::max(top, x), blind += std::isinf(x) && x < 0;
    std::snprintf(line, sizeof line, "max scores: the largest %.4g; %lld of %lld rows without a key\n", double(top),
                  (long long)blind, (long long)best.size());
    out << line;
  }
  bool ok = check == CheckScope::None ||
            checkAgainstReference(p, r, check, seed, plan.config.block_m, options.sinks ? &sinks : nullptr, out);
  if (a.has("--backward")) ok = runBackward(a, p, r, options, ms, check, seed, device, out) && ok;
  return ok ? 0 : 1;
}

// The sweep's options from the command line (budget, threads, target, store, progress on err).
autotune::TuneOptions tuneOptions(const Args& a, std::ostream& err) {
  autotune::TuneOptions o;
  o.budgetSeconds = parseNumber("--budget", a.get("--budget", "0"));
  if (a.has("--min-speedup")) {
    o.minSpeedup = parseNumber("--min-speedup", a.get("--min-speedup", ""));
    if (!(o.minSpeedup >= 1)) throw UsageError{"--min-speedup must be at least 1 (the default's own speed)"};
  }
  if (a.has("--threads")) o.threads = int(parseInts("--threads", a.get("--threads", ""), 1, 1)[0]);
  if (a.has("--target")) o.target = parseTarget(a.get("--target", ""));
  o.store = !a.has("--no-store");
  o.progress = [&err](const std::string& line) { err << line << "\n" << std::flush; };
  return o;
}

// Bytes of K and V in the blocks a decode of the queries ending at `last` reads: the keys of the
// listed blocks that start at or before it (the mask's row for those queries), every key without a
// mask.
double decodeBytes(const Problem& p, int64_t last) {
  const double perKey = double(p.Hkv) * double(p.D + p.DV) * double(ir::byteWidth(p.dtype));  // K and V
  const std::optional<attention::BlockMask>& mask = p.instance.mask;
  if (!mask) return perKey * double(p.B) * double(p.N);
  const int64_t row = (last - mask->qOffset()) / mask->qBlockSize(), kvbs = mask->kvBlockSize();
  double keys = 0;
  for (int64_t b = 0; b < p.B; ++b)  // (a mask of batch 1 serves every batch)
    for (auto list : {mask->fullKvBlocks(b % mask->batch(), 0, row), mask->partialKvBlocks(b % mask->batch(), 0, row)})
      for (int32_t j : list)
        if (j * kvbs <= last) keys += double(std::min<int64_t>(kvbs, p.N - j * kvbs));
  return perKey * keys;
}

// `flextile autotune --kernel decode`: the decode template's sweep (autotune::tuneFlexDecode).
int autotuneDecode(const Args& a, bool device, std::ostream& out, std::ostream& err) {
  if (a.has("--plot")) throw UsageError{"--plot draws the forward's sweep; the decode's is the table"};
  Problem p = makeProblem(a, a.variant, "8,32,32768,128", device ? MemorySpace::Device : MemorySpace::Host, 7, false);
  const int64_t L = parseInts("--queries", a.get("--queries", "1"), 1, 1)[0];
  if (L < 1 || L > std::min<int64_t>(p.N, attention::kDecodeMaxQueries))
    throw UsageError{"--queries " + std::to_string(L) + " must be in [1, min(N, " +
                     std::to_string(attention::kDecodeMaxQueries) + ")]"};
  if (device) {
    p.q = randomTensor(7, 0, p.dtype, {p.B, p.H, L, p.D}, MemorySpace::Device);
    p.k = randomTensor(7, 1, p.dtype, {p.B, p.Hkv, p.N, p.D}, MemorySpace::Device);
    p.v = randomTensor(7, 2, p.dtype, {p.B, p.Hkv, p.N, p.DV}, MemorySpace::Device);
  } else {
    p.q = shapeOnly(p.dtype, {p.B, p.H, L, p.D});
    p.k = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.D});
    p.v = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.DV});
  }
  attention::FlexAttentionOptions base{.kernel = attention::AttentionTemplate::Decode};
  if (p.instance.mask) base.query_offset = p.N - L;
  autotune::TuneOptions o = tuneOptions(a, err);
  o.bytes = decodeBytes(p, p.N - 1);
  autotune::DecodeTuneReport r = autotune::tuneFlexDecode(p.q, p.k, p.v, p.instance.score, p.instance.mask, base,
                                                          autotune::defaultDecodeSpace(p.dtype, std::max(p.D, p.DV)), o);
  out << formatReport(r);
  return r.timed && r.best < 0 ? 1 : 0;
}

// `flextile autotune --kernel backward`: the backward's (dkdv, dq) pairs (autotune::tuneFlexAttentionBackward),
// on the forward's out and lse for random inputs and a random dout.
int autotuneBackward(const Args& a, bool device, std::ostream& out, std::ostream& err) {
  if (a.has("--plot")) throw UsageError{"--plot draws the forward's sweep; the backward's is the table"};
  Problem p = makeProblem(a, a.variant, "2,16,8192,128", device ? MemorySpace::Device : MemorySpace::Host, 7, device);
  Tensor fwdOut, lse, dout;
  if (device) {
    attention::FlexAttentionResult fwd = attention::flex_attention(p.q, p.k, p.v, p.instance.score, p.instance.mask,
                                                                   {.return_lse = true});
    fwdOut = fwd.out;
    lse = fwd.lse;
    dout = randomTensor(7, 3, p.dtype, {p.B, p.H, p.N, p.DV}, MemorySpace::Device);
  } else {  // dry run: shapes only (nothing is computed)
    p.q = shapeOnly(p.dtype, {p.B, p.H, p.N, p.D});
    p.k = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.D});
    p.v = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.DV});
    fwdOut = dout = shapeOnly(p.dtype, {p.B, p.H, p.N, p.DV});
    lse = shapeOnly(DType::F32, {p.B, p.H, p.N});
  }
  autotune::TuneOptions o = tuneOptions(a, err);
  o.flops = device ? attention::flexAttentionBackwardFlops(p.B, p.H, p.D, allowedPairsPerHead(p), p.DV) : 0;
  autotune::BackwardTuneReport r =
      autotune::tuneFlexAttentionBackward(p.q, p.k, p.v, fwdOut, lse, dout, p.instance.score, p.instance.mask,
                                          autotune::defaultBackwardSpace(p.dtype, std::max(p.D, p.DV)), o);
  out << formatReport(r);
  return r.timed && r.best < 0 ? 1 : 0;
}

int cmdAutotune(const Args& a, std::ostream& out, std::ostream& err) {
  std::string why;
  const bool device = gpuPresent(&why);
  if (!device) err << "flextile autotune: no GPU (" << why << "): a dry run (compile and prune only), nothing is timed\n";
  const std::string kernel = a.get("--kernel", "forward");
  if (kernel != "forward" && kernel != "decode" && kernel != "backward")
    throw UsageError{"--kernel must be forward, decode or backward, got '" + kernel + "'"};
  if (kernel != "decode" && a.has("--queries")) throw UsageError{"--queries applies to --kernel decode"};
  if (kernel != "forward") {
    const int status = kernel == "decode" ? autotuneDecode(a, device, out, err) : autotuneBackward(a, device, out, err);
    if (status != 0) err << "flextile autotune: no config ran correctly\n";
    return status;
  }
  // A plot that cannot be written should say so before a sweep of many seconds, not after it.
  if (a.has("--plot") && !std::ofstream(a.get("--plot", "")))
    throw UsageError{"--plot: cannot write '" + a.get("--plot", "") + "'"};
  Problem p = makeProblem(a, a.variant, "2,16,8192,128", device ? MemorySpace::Device : MemorySpace::Host, 7, device);
  if (!device) {  // dry run: shapes only (nothing is computed)
    p.q = shapeOnly(p.dtype, {p.B, p.H, p.N, p.D});
    p.k = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.D});
    p.v = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.DV});
  }
  autotune::TuneOptions o = tuneOptions(a, err);
  o.flops = device ? forwardFlops(p) : 0;
  autotune::TuneReport r = autotune::tuneFlexAttention(p.q, p.k, p.v, p.instance.score, p.instance.mask,
                                                       autotune::defaultSpace(p.dtype, std::max(p.D, p.DV)), o);
  out << formatReport(r);
  if (a.has("--plot")) {
    const std::string path = a.get("--plot", "");
    const SweepPicture pic = drawSweep(r, "flextile autotune " + a.variant + " " + a.get("--shape", "2,16,8192,128"));
    writePicture(pic.canvas, path);
    out << "wrote " << path << " (" << pic.canvas.width() << " x " << pic.canvas.height() << " pixels, "
        << r.candidates.size() << " configs)\n";
  }
  if (r.timed && r.best < 0) {
    err << "flextile autotune: no config ran correctly\n";
    return 1;
  }
  return 0;
}

// `flextile compile --kernel preprocess|dkdv|dq`: one kernel of the backward, planned on shape-only
// tensors like the forward.
int compileBackwardKernel(const Args& a, const Problem& p, const std::string& kernel, const std::string& emit,
                          const codegen::Target& target, std::ostream& out) {
  if (kernel != "preprocess" && kernel != "dkdv" && kernel != "dq")
    throw UsageError{"--kernel must be forward, last-round-merge, preprocess, dkdv, dq or decode, got '" + kernel + "'"};
  if (emit == "traced")
    throw UsageError{"--emit traced: the backward's kernels (--kernel " + kernel +
                     ") are traced inside the compile; ask for ir, llvm or ptx"};
  const dsl::Tensor lse = shapeOnly(dsl::DType::F32, {p.B, p.H, p.N});
  const dsl::Tensor rows = shapeOnly(p.dtype, {p.B, p.H, p.N, p.DV});  // out and dout: v's head dim
  attention::FlexAttentionBackwardOptions options;
  if (a.has("--atomic-dq")) options.dq_accumulation = attention::DqAccumulation::Atomic;
  if (std::optional<FlexAttentionConfig> tile = parseConfig(a)) {
    if (kernel == "preprocess") throw UsageError{"--config: the preprocess kernel has no tile to choose"};
    // The other kernel keeps the tile the call would pick (the default, narrowed to the mask's
    // blocks), which only a plan resolves.
    attention::FlexAttentionBackwardConfig c =
        attention::plan_flex_attention_backward(p.q, p.k, p.v, rows, lse, rows, p.instance.score, p.instance.mask,
                                                options, target)
            .config;
    (kernel == "dkdv" ? c.dkdv : c.dq) = *tile;
    options.config = c;
  }
  const attention::FlexAttentionBackwardPlan plan = attention::plan_flex_attention_backward(
      p.q, p.k, p.v, rows, lse, rows, p.instance.score, p.instance.mask, options, target);
  const auto at = std::find_if(plan.kernelNames.begin(), plan.kernelNames.end(),
                               [&](const std::string& name) { return name.starts_with("flex_bwd_" + kernel + "_"); });
  if (at == plan.kernelNames.end()) throw Error("flextile compile: the backward plan has no " + kernel + " kernel");
  const codegen::CompiledKernel& compiled = *plan.compiled[size_t(at - plan.kernelNames.begin())];
  if (emit == "ir") out << compiled.ir;
  else if (emit == "llvm") out << compiled.llvmIR;
  else out << compiled.ptx;
  return 0;
}

// `flextile compile --kernel decode`: the decode kernel for L queries at the end of a cache of N
// keys, planned on shape-only tensors like the forward.
int compileDecodeKernel(const Args& a, const Problem& p, const std::string& emit, const codegen::Target& target,
                        std::ostream& out) {
  const int64_t L = parseInts("--queries", a.get("--queries", "1"), 1, 1)[0];
  if (L < 1 || L > p.N)
    throw UsageError{"--queries " + std::to_string(L) + " must be in [1, N = " + std::to_string(p.N) + "]"};
  attention::FlexAttentionOptions options{.kernel = attention::AttentionTemplate::Decode};
  if (p.instance.mask) options.query_offset = p.N - L;
  if (a.has("--max-scores")) options.max_scores = shapeOnly(DType::F32, {p.B, p.H, L});
  if (a.has("--sinks")) options.sinks = shapeOnly(DType::F32, {p.H});
  if (a.values.count("--config")) {
    try {
      options.decode_config = attention::FlexDecodeConfig::parse(a.values.at("--config"));
    } catch (const Error& e) {
      throw UsageError{std::string("--config: ") + e.what()};
    }
  }
  const attention::FlexDecodePlan plan = attention::plan_flex_decode(
      shapeOnly(p.dtype, {p.B, p.H, L, p.D}), p.k, p.v, p.instance.score, p.instance.mask, options, target);
  if (emit == "traced") out << ir::printFunction(*plan.traced, {.locations = a.has("--locations")});
  else if (emit == "ir") out << plan.compiled[0]->ir;
  else if (emit == "llvm") out << plan.compiled[0]->llvmIR;
  else out << plan.compiled[0]->ptx;
  return 0;
}

int cmdCompile(const Args& a, std::ostream& out) {
  const std::string emit = a.get("--emit", "");
  if (emit != "traced" && emit != "ir" && emit != "llvm" && emit != "ptx")
    throw UsageError{"--emit must be traced, ir, llvm or ptx" + (emit.empty() ? std::string() : ", got '" + emit + "'")};
  if (a.has("--locations") && emit != "traced")
    throw UsageError{"--locations applies to --emit traced (the later stages print no source lines)"};
  Problem p = makeProblem(a, a.variant, "1,2,1024,128", MemorySpace::Host, 1, false);
  // Compiling reads only shapes, strides and alignment.
  p.q = shapeOnly(p.dtype, {p.B, p.H, p.N, p.D});
  p.k = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.D});
  p.v = shapeOnly(p.dtype, {p.B, p.Hkv, p.N, p.DV});
  const codegen::Target target = parseTarget(a.get("--target", "sm_90a"));
  const std::string kernel = a.get("--kernel", "forward");
  if (a.has("--atomic-dq") && kernel != "dkdv")
    throw UsageError{"--atomic-dq applies to --kernel dkdv (dQ is then added by the dkdv kernel; there is no dq "
                     "kernel), got --kernel " + kernel};
  if (kernel == "decode") return compileDecodeKernel(a, p, emit, target, out);
  const bool merge = kernel == "last-round-merge";
  if (merge && emit == "traced")
    throw UsageError{"--emit traced: the last round's merge kernel is traced inside the compile; ask for ir, llvm or ptx"};
  if (kernel != "forward" && !merge) {
    if (a.has("--max-scores")) throw UsageError{"--max-scores applies to the forward, its merge and the decode"};
    if (a.has("--sinks"))
      throw UsageError{"--sinks applies to the forward, its merge and the decode (the backward's gradient kernels "
                       "are the same with sinks)"};
    return compileBackwardKernel(a, p, kernel, emit, target, out);
  }
  if (a.has("--queries")) throw UsageError{"--queries applies to --kernel decode"};
  attention::FlexAttentionOptions options;
  options.config = parseConfig(a);
  if (a.has("--max-scores")) options.max_scores = shapeOnly(DType::F32, {p.B, p.H, p.N});
  if (a.has("--sinks")) options.sinks = shapeOnly(DType::F32, {p.H});
  attention::FlexAttentionPlan plan = attention::plan_flex_attention(p.q, p.k, p.v, p.instance.score, p.instance.mask,
                                                                     options, emit != "traced", target);
  const codegen::CompiledKernel* compiled = plan.compiled;
  if (merge) {
    if (!plan.lastRoundSplit)
      throw Error("flextile compile --kernel last-round-merge: this call does not split its last round (it "
                  "needs persistent programs whose tiles all walk the same steps, more tiles than programs and "
                  "not a whole number of rounds; config " + plan.config.describe() + ")");
    compiled = plan.mergeCompiled;
  }
  if (emit == "traced") out << ir::printFunction(*plan.traced, {.locations = a.has("--locations")});
  else if (emit == "ir") out << compiled->ir;
  else if (emit == "llvm") out << compiled->llvmIR;
  else out << compiled->ptx;
  return 0;
}

int cmdBench(const Args& a, std::ostream& out, std::ostream& err) {
  std::string why;
  if (!gpuPresent(&why)) {
    err << "flextile bench: needs a GPU (" << why << "); skipped\n";
    return 2;
  }
  std::vector<std::string> names;
  if (a.has("--variants")) {
    std::stringstream ss(a.get("--variants", ""));
    for (std::string n; std::getline(ss, n, ',');)
      if (!n.empty()) names.push_back(n);
  } else {
    names = {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"};
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-18s %10s %9s %10s\n", "variant", "config", "ms", "TFLOP/s", "1st call ms");
  out << line;
  for (const std::string& name : names) {
    Problem p = makeProblem(a, name, "2,16,8192,128", MemorySpace::Device, 7);
    Tensor o = Tensor::empty(p.dtype, {p.B, p.H, p.N, p.DV}, MemorySpace::Device);
    auto t0 = std::chrono::steady_clock::now();
    attention::flex_attention_into(p.q, p.k, p.v, p.instance.score, p.instance.mask, o, nullptr);
    runtime::synchronize();
    const double first = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto samples = runtime::timeKernel(
        [&] { attention::flex_attention_into(p.q, p.k, p.v, p.instance.score, p.instance.mask, o, nullptr); }, 3, 20);
    const double ms = runtime::median(samples);
    const auto plan = attention::plan_flex_attention(p.q, p.k, p.v, p.instance.score, p.instance.mask);
    std::snprintf(line, sizeof line, "%-16s %-18s %10.3f %9.1f %10.1f\n", name.c_str(), plan.config.describe().c_str(),
                  ms, forwardFlops(p) / ms / 1e9, first);
    out << line << std::flush;
  }
  return 0;
}

// "12.3K" for byte counts in the statistics table.
std::string bytesText(int64_t bytes) {
  char s[32];
  if (bytes < 10 * 1024) std::snprintf(s, sizeof s, "%lld", (long long)bytes);
  else if (bytes < 10 * 1024 * 1024) std::snprintf(s, sizeof s, "%.1fK", double(bytes) / 1024);
  else if (bytes < int64_t(10) * 1024 * 1024 * 1024) std::snprintf(s, sizeof s, "%.1fM", double(bytes) / 1048576);
  else std::snprintf(s, sizeof s, "%.1fG", double(bytes) / 1073741824);
  return s;
}

std::string gammaText(double gamma) {
  if (std::isnan(gamma)) return "n/a";  // nothing allowed, nothing computed
  if (std::isinf(gamma)) return "inf";  // work for no allowed pair
  char s[32];
  std::snprintf(s, sizeof s, "%.3f", gamma);
  return s;
}

void statsHeader(std::ostream& out) {
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-7s %7s %8s %8s | %8s %5s %5s %5s | %6s %14s %7s | %8s %8s %8s\n", "variant",
                "b,h", "rows", "full", "partial", "live/row", "P50", "P95", "max", "no-key", "allowed pairs", "gamma",
                "fwd B", "live B", "bwd B");
  out << line;
}

// One line of the table: an entry of BlockMask::stats(); metadata only on the overall line.
void statsLine(std::ostream& out, const std::string& name, const std::string& bh, const attention::BlockMaskHeadStats& s,
               const attention::BlockMaskMetadataBytes* metadata) {
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-7s %7lld %8lld %8lld | %8.2f %5lld %5lld %5lld | %6lld %14lld %7s | %8s %8s %8s\n",
                name.c_str(), bh.c_str(), (long long)s.rows, (long long)s.fullBlocks, (long long)s.partialBlocks,
                s.live.mean, (long long)s.live.p50, (long long)s.live.p95, (long long)s.live.max, (long long)s.emptyRows,
                (long long)s.allowedPairs, gammaText(s.gamma).c_str(),
                metadata ? bytesText(metadata->forward).c_str() : "", metadata ? bytesText(metadata->liveForward).c_str() : "",
                metadata ? bytesText(metadata->transposes).c_str() : "");
  out << line;
}

// "masks.png" -> "masks-causal.png" (one picture per variant).
std::string pathFor(const std::string& path, const std::string& variant) {
  const size_t slash = path.find_last_of('/'), dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return path + "-" + variant;
  return path.substr(0, dot) + "-" + variant + path.substr(dot);
}

// A mask listing every block full: what the attention templates walk without a BlockMask.
attention::BlockMask everyBlockFull(int64_t L, int64_t S, attention::BlockSizes sizes) {
  const int64_t nQ = (L + sizes.q - 1) / sizes.q, nKv = (S + sizes.kv - 1) / sizes.kv;
  attention::BlockLists partial{std::vector<int32_t>(size_t(nQ), 0), std::vector<int32_t>(size_t(nQ * nKv), 0)};
  attention::BlockLists full{std::vector<int32_t>(size_t(nQ), int32_t(nKv)), std::vector<int32_t>(size_t(nQ * nKv))};
  for (int64_t i = 0; i < nQ; ++i)
    for (int64_t j = 0; j < nKv; ++j) full.indices[size_t(i * nKv + j)] = int32_t(j);
  return attention::BlockMask::fromKvLists(attention::noop_mask(), 1, 1, L, S, sizes, std::move(partial), std::move(full));
}

int cmdBlockmask(const Args& a, std::ostream& out) {
  const std::vector<int64_t> s = parseInts("--shape", a.get("--shape", ""), 3, 4);
  const std::vector<int64_t> block = parseInts("--block", a.get("--block", "128"), 1, 2);
  const attention::BlockSizes sizes{block[0], block.size() > 1 ? block[1] : block[0]};
  std::optional<attention::BlockSizes> tile;
  if (a.has("--tile")) {
    const std::vector<int64_t> t = parseInts("--tile", a.get("--tile", ""), 1, 2);
    tile = attention::BlockSizes{t[0], t.size() > 1 ? t[1] : t[0]};
  }
  const bool all = a.variant.empty();
  const std::vector<std::string> names =
      all ? std::vector<std::string>{"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"}
          : std::vector<std::string>{a.variant};
  if (a.has("--document-offsets") && std::find(names.begin(), names.end(), "document") == names.end())
    throw UsageError{"--document-offsets applies to the document variant, not '" + a.variant + "'"};
  const attention::BlockSizes shownTile = tile.value_or(sizes);
  char line[512];
  std::snprintf(line, sizeof line,
                "BlockMask statistics at B=%lld H=%lld N=%lld, blocks %lld x %lld; gamma = computed / allowed pairs "
                "for a %lld x %lld kernel tile\n",
                (long long)s[0], (long long)s[1], (long long)s[2], (long long)sizes.q, (long long)sizes.kv,
                (long long)shownTile.q, (long long)shownTile.kv);
  out << line;
  bool headerShown = false;
  for (const std::string& name : names) {
    attention::VariantInputs inputs{s[0], s[1], s[2], s[2], MemorySpace::Host, sizes, 1};
    if (name == "document" && a.has("--document-offsets")) inputs.documentOffsets = readDocumentOffsets(a.get("--document-offsets", ""));
    attention::VariantInstance inst = attention::variant(name).make(inputs);
    const bool masked = inst.mask.has_value();
    const attention::BlockMask m = masked ? *inst.mask : everyBlockFull(s[2], s[2], sizes);
    if (!all) {
      if (masked) out << m.picture() << "\n";
      else out << name << ": no BlockMask (every pair allowed); the template walks every block full\n";
      std::snprintf(line, sizeof line, "full blocks %lld, partial blocks %lld, sparsity %.1f%%\n",
                    (long long)m.numFullBlocks(), (long long)m.numPartialBlocks(), 100.0 * m.sparsity());
      out << line;
    }
    const attention::BlockMaskStats st = m.stats(tile);
    if (!headerShown) statsHeader(out), headerShown = true;
    // The mask's own (b, h): a broadcast dimension is one entry for every batch or head.
    auto label = [&](int64_t b, int64_t h) {
      return (m.batch() == 1 ? std::string("*") : std::to_string(b)) + "," + (m.heads() == 1 ? "*" : std::to_string(h));
    };
    const size_t shown = st.heads.size() == 1 ? 0 : std::min<size_t>(st.heads.size(), all ? 8 : 64);
    for (size_t i = 0; i < shown; ++i) statsLine(out, name, label(st.heads[i].b, st.heads[i].h), st.heads[i], nullptr);
    if (shown < st.heads.size() && shown > 0)
      out << "  ... " << st.heads.size() - shown << " more (b, h) of the mask\n";
    statsLine(out, name, st.heads.size() == 1 ? label(0, 0) : "all", st.overall, &st.metadata);
    for (const char* flag : {"--png", "--svg"}) {
      if (!a.has(flag) || !masked) continue;
      const std::string path = all ? pathFor(a.get(flag, ""), name) : a.get(flag, "");
      const BlockMaskPicture pic = drawBlockMask(m, m.describe());
      if (std::string(flag) == "--png") pic.canvas.writePng(path);
      else pic.canvas.writeSvg(path);
      out << "wrote " << path << " (" << pic.canvas.width() << " x " << pic.canvas.height() << " pixels, "
          << pic.panelOrigin.size() << " (b, h))\n";
    }
  }
  out << "rows: query-block rows; live/row, P50, P95, max: full + partial blocks per row; no-key: rows without a\n"
         "live block; b,h '*': one entry serves every batch or head (broadcast); fwd/live/bwd B: bytes of the\n"
         "forward lists as stored, of what the forward loop reads (counts + live indices), of the transposes\n";
  return 0;
}

}  // namespace

namespace {
// Every write to the tool's streams reaches the terminal (or the pipe, or the log) at once: std::cout
// is fully buffered on a pipe, and a run killed during a long step printed nothing. The caller's
// stream flags come back when the command ends.
class FlushEachWrite {
 public:
  explicit FlushEachWrite(std::ostream& s) : stream_(s), flags_(s.flags()) { stream_ << std::unitbuf; }
  ~FlushEachWrite() { stream_.flags(flags_); }
  FlushEachWrite(const FlushEachWrite&) = delete;
  FlushEachWrite& operator=(const FlushEachWrite&) = delete;

 private:
  std::ostream& stream_;
  std::ios_base::fmtflags flags_;
};
}  // namespace

int flextileMain(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  const FlushEachWrite flushOut(out), flushErr(err);
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" || std::string(argv[1]) == "help")) {
    out << kUsage;
    return 0;
  }
  Args args;
  try {
    parse(argc, argv, args);
    if (args.flags.count("--help")) {
      out << args.command->usage;
      return 0;
    }
    const std::string name = args.command->name;
    if (name == "list") return cmdList(args, out);
    if (name == "run") return cmdRun(args, out, err);
    if (name == "autotune") return cmdAutotune(args, out, err);
    if (name == "compile") return cmdCompile(args, out);
    if (name == "bench") return cmdBench(args, out, err);
    if (name == "blockmask") return cmdBlockmask(args, out);
  } catch (const UsageError& e) {
    err << "flextile: " << e.message << "\n\n" << (args.command ? args.command->usage : kUsage);
    return 2;
  } catch (const Error& e) {
    err << "flextile: " << e.what() << "\n";
    // An unknown name (a variant) is a usage problem too.
    return e.kind() == ErrorKind::UnknownName ? 2 : 1;
  } catch (const std::exception& e) {
    err << "flextile: " << e.what() << "\n";
    return 1;
  }
  return 2;
}

}  // namespace flextile::cli
