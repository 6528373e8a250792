// flex_attention forward throughput on the yardstick variants (DESIGN.md):
// B=2, H=16, N=8192, D=128, bf16 by default. For each variant:
//   * the BlockMask built with the same broadcast PyTorch's bench uses (B and H
//     broadcast, B per batch for documents), timed with the generic builder
//     (mask_mod on the GPU), the generic builder without host lists (compacted and
//     transposed on the device, nothing read back) and the structural one, lists on the device;
//   * every config of a small sweep checked on sampled rows against float64,
//     then timed (median of many runs, inputs random, never zeros);
//   * FLOPs = 4 * D * allowed pairs, counted exactly from the mask.
// Prints a table and one JSON line per variant (bench/compare_attention.py
// joins them with torch_reference.py's JSON).
//
//   flextile_attention_bench [--variants a,b] [--b 2] [--h 16] [--n 8192] [--d 128] [--dv DV] [--quick]
//     (--dv: v's head dim, when it differs from q's and k's, as MLA's 192 / 128; FLOPs then
//      2 * (D + DV) * allowed pairs: Q·Kᵀ at D and P·V at DV)
//                            [--config BM,BN,W,S[,ws][,turns][,defer]]...   (timed too, after the default and the sweep)
//                            [--max-scores] [--sinks]   (every call also writes the rows' largest scores; has
//                                                        attention sinks, a logit per head near log N)
//                            [--document-offsets FILE]   (JSON {"offsets": [[0, ..., N], ...]} per batch,
//                                                         from bench/torch_document_cuts.py: PyTorch's cuts)
//   flextile_attention_bench --program-cost [--h 16] [--d 128]
//     What a program costs besides its steps: the no-mask forward (default config) at B x N =
//     16 x 1024, 8 x 2048, 4 x 4096 and 2 x 8192 (the same number of programs, of 8 to 64 steps of
//     BLOCK_N keys), each checked, then the time of one program (call time x SMs / programs) fitted
//     as start + steps x step: the intercept is what a short-row variant pays per program.
#include <Eigen/Core>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "BenchUtil.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/Variants.h"
#include "runtime/Device.h"
#include "runtime/Event.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

using flextile::bench::split;

namespace {

using H = Eigen::bfloat16;

// n normal samples, rounded to bf16 (random inputs: never time or test on zeros).
std::vector<H> randomHost(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<float> g(0, 1);
  std::vector<H> v(n);
  for (auto& x : v) x = H(g(rng));
  return v;
}

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Largest |out - ref| / max|ref row| over sampled rows (float64 reference).
double sampledError(const std::vector<H>& q, const std::vector<H>& k, const std::vector<H>& v,
                    const std::vector<H>& out, int64_t B, int64_t Hq, int64_t N, int64_t D, int64_t DV,
                    const VariantInstance& var, std::mt19937_64& rng, const std::vector<float>& sinks = {}) {
  double worst = 0;
  std::uniform_int_distribution<int64_t> pb(0, B - 1), ph(0, Hq - 1), pi(0, N - 1);
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> s(static_cast<size_t>(N));
  for (int sample = 0; sample < 24; ++sample) {
    const int64_t b = sample == 0 ? B - 1 : pb(rng), h = sample == 0 ? Hq - 1 : ph(rng), i = sample == 0 ? N - 1 : pi(rng);
    const H* qi = &q[size_t(((b * Hq + h) * N + i) * D)];
    const H* kb = &k[size_t((b * Hq + h) * N * D)];
    const H* vb = &v[size_t((b * Hq + h) * N * DV)];
    double m = -INFINITY;
    for (int64_t j = 0; j < N; ++j) {
      if (var.refMask && !var.refMask(b, h, i, j)) {
        s[size_t(j)] = -INFINITY;
        continue;
      }
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += double(float(qi[d])) * double(float(kb[j * D + d]));
      s[size_t(j)] = var.refScore ? var.refScore(dot * scale, b, h, i, j) : dot * scale;
      m = std::max(m, s[size_t(j)]);
    }
    std::vector<double> o(size_t(DV), 0.0);
    double l = 0;
    if (!sinks.empty()) {  // one more key of score sinks[h] and value 0
      const double sink = sinks[size_t(h)];
      m = std::max(m, sink);
      if (m > -INFINITY) l += std::exp(sink - m);
    }
    for (int64_t j = 0; j < N; ++j) {
      if (s[size_t(j)] == -INFINITY) continue;
      const double p = std::exp(s[size_t(j)] - m);
      l += p;
      for (int64_t d = 0; d < DV; ++d) o[size_t(d)] += p * double(float(vb[j * DV + d]));
    }
    double mag = 1e-6, err = 0;
    for (int64_t d = 0; d < DV; ++d) {
      const double want = l > 0 ? o[size_t(d)] / l : 0.0;
      const double got = double(float(out[size_t(((b * Hq + h) * N + i) * DV + d)]));
      if (!std::isfinite(got)) return INFINITY;
      mag = std::max(mag, std::abs(want));
      err = std::max(err, std::abs(got - want));
    }
    worst = std::max(worst, err / mag);
  }
  return worst;
}

// --program-cost (see the header): per-program time against steps, least squares.
int programCost(int64_t Hq, int64_t D, std::mt19937_64& rng) {
  const int sms = runtime::Device::current().multiprocessorCount();
  std::printf("%-10s %8s %8s %10s %12s %14s\n", "B x N", "steps", "programs", "ms", "TFLOP/s", "us a program");
  std::vector<double> xs, ys;
  for (auto [B, N] : {std::pair<int64_t, int64_t>{16, 1024}, {8, 2048}, {4, 4096}, {2, 8192}}) {
    const size_t elems = size_t(B * Hq * N * D);
    const std::vector<H> hq = randomHost(rng, elems), hk = randomHost(rng, elems), hv = randomHost(rng, elems);
    Tensor q = Tensor::fromHost(hq, {B, Hq, N, D}, MemorySpace::Device);
    Tensor k = Tensor::fromHost(hk, {B, Hq, N, D}, MemorySpace::Device);
    Tensor v = Tensor::fromHost(hv, {B, Hq, N, D}, MemorySpace::Device);
    Tensor out = Tensor::empty(DType::BF16, {B, Hq, N, D}, MemorySpace::Device);
    const FlexAttentionConfig c = untunedFlexAttentionConfig(q, ScoreMod(), std::nullopt);
    out.copyFromHost(std::vector<H>(elems, H(NAN)));
    flex_attention_into(q, k, v, ScoreMod(), std::nullopt, out, nullptr, {.config = c});
    runtime::synchronize();
    const double err = sampledError(hq, hk, hv, out.toHost<H>(), B, Hq, N, D, D, VariantInstance{}, rng);
    if (!(err < 2e-2)) {
      std::printf("%2lld x %-5lld WRONG (error %.2e): not timed\n", (long long)B, (long long)N, err);
      return 1;
    }
    const double ms = runtime::median(
        runtime::timeKernel([&] { flex_attention_into(q, k, v, ScoreMod(), std::nullopt, out, nullptr, {.config = c}); }, 3, 20));
    const int64_t programs = B * Hq * ((N + c.block_m - 1) / c.block_m), steps = (N + c.block_n - 1) / c.block_n;
    const double perProgramUs = ms * 1e3 * double(sms) / double(programs);
    std::printf("%2lld x %-5lld %8lld %8lld %10.3f %12.1f %14.2f   (%s)\n", (long long)B, (long long)N, (long long)steps,
                (long long)programs, ms, flexAttentionFlops(B, Hq, D, double(N) * double(N)) / ms / 1e9, perProgramUs,
                c.describe().c_str());
    xs.push_back(double(steps));
    ys.push_back(perProgramUs);
  }
  const double n = double(xs.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) sx += xs[i], sy += ys[i], sxx += xs[i] * xs[i], sxy += xs[i] * ys[i];
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), start = (sy - slope * sx) / n;
  std::printf("\none program = %.2f us + %.3f us a step (least squares over %zu shapes, %d SMs)\n", start, slope,
              xs.size(), sms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t B = 2, Hq = 16, N = 8192, D = 128, DV = 0;
  std::vector<std::string> names{"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"};
  bool quick = false;
  std::vector<std::vector<int64_t>> documentOffsets;
  std::vector<FlexAttentionConfig> extraConfigs;  // --config, after the default (and the sweep)
  bool programCostOnly = false;
  bool maxScores = false;  // --max-scores: every call also writes each row's largest score
  bool withSinks = false;  // --sinks: every call has attention sinks (a logit per head near log N)
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("flextile_attention_bench: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--variants") names = split(next());
    else if (a == "--b") B = std::stoll(next());
    else if (a == "--h") Hq = std::stoll(next());
    else if (a == "--n") N = std::stoll(next());
    else if (a == "--d") D = std::stoll(next());
    else if (a == "--dv") DV = std::stoll(next());
    else if (a == "--quick") quick = true;
    else if (a == "--config") extraConfigs.push_back(FlexAttentionConfig::parse(next()));
    else if (a == "--document-offsets") documentOffsets = flextile::bench::readOffsets(next(), "flextile_attention_bench");
    else if (a == "--program-cost") programCostOnly = true;
    else if (a == "--max-scores") maxScores = true;
    else if (a == "--sinks") withSinks = true;
    else throw Error("flextile_attention_bench: unknown argument '" + a + "'");
  }
  std::string why;
  if (!dsl::deviceAvailable(&why)) {
    std::fprintf(stderr, "flextile_attention_bench: needs a GPU (%s)\n", why.c_str());
    return 2;
  }
  if (programCostOnly) {
    std::mt19937_64 rng(std::random_device{}());
    return programCost(Hq, D, rng);
  }
  if (DV <= 0) DV = D;
  std::printf("device: %s   B=%lld H=%lld N=%lld D=%lld%s bf16\n", runtime::Device::current().name().c_str(),
              (long long)B, (long long)Hq, (long long)N, (long long)D,
              DV != D ? (" DV=" + std::to_string(DV)).c_str() : "");
  std::mt19937_64 rng(std::random_device{}());
  const size_t elems = size_t(B * Hq * N * D), valueElems = size_t(B * Hq * N * DV);
  std::vector<H> hq = randomHost(rng, elems), hk = randomHost(rng, elems), hv = randomHost(rng, valueElems),
                 hout(valueElems);
  Tensor q = Tensor::fromHost(hq, {B, Hq, N, D}, MemorySpace::Device);
  Tensor k = Tensor::fromHost(hk, {B, Hq, N, D}, MemorySpace::Device);
  Tensor v = Tensor::fromHost(hv, {B, Hq, N, DV}, MemorySpace::Device);
  Tensor out = Tensor::empty(DType::BF16, {B, Hq, N, DV}, MemorySpace::Device);
  std::vector<float> sinkValues;
  std::optional<Tensor> sinks;
  if (withSinks) {
    sinkValues = flextile::bench::sinksNear(rng, Hq, N);
    sinks = Tensor::fromHost(sinkValues, {Hq}, MemorySpace::Device);
  }

  // The first config is what flex_attention runs untuned on this GPU at this shape (for the wider
  // of D and DV where v's head dim differs).
  std::vector<FlexAttentionConfig> configs{plan_flex_attention(q, k, v, ScoreMod(), std::nullopt).config};
  if (!quick)
    for (FlexAttentionConfig c : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{64, 64, 4, 3}, FlexAttentionConfig{64, 64, 4, 4},
                                  FlexAttentionConfig{64, 32, 4, 3}, FlexAttentionConfig{64, 128, 4, 2},
                                  FlexAttentionConfig{128, 64, 8, 2}, FlexAttentionConfig{128, 64, 8, 3},
                                  FlexAttentionConfig{128, 128, 8, 2}, FlexAttentionConfig{128, 128, 8, 3}})
      if (!(c == configs[0])) configs.push_back(c);
  for (const FlexAttentionConfig& c : extraConfigs)
    if (!(c == configs[0])) configs.push_back(c);

  struct Row {
    std::string variant, config;
    double ms = INFINITY, tflops = 0, defaultTflops = 0, maskGenericMs = NAN, maskStructuralMs = NAN, compileMs = 0,
           sparsity = 0, maskDeviceListsMs = NAN;
  };
  std::vector<Row> rows;
  for (const std::string& name : names) {
    const Variant& var = variant(name);
    Row row{name};
    VariantInputs in{B, Hq, N, N, MemorySpace::Device, {128, 128}, 7, documentOffsets};
    // Structural builders (through the variant) and the generic builder, each
    // with the lists uploaded, as PyTorch's create_block_mask leaves them on the GPU.
    auto t0 = std::chrono::steady_clock::now();
    VariantInstance inst = var.make(in);
    if (inst.mask) {
      std::vector<double> structural, generic, deviceLists;
      BlockMaskPlacement onDevice{MemorySpace::Device};
      onDevice.hostLists = false;  // compacted on the device, transposes derived there: nothing read back
      for (int rep = 0; rep < 6; ++rep) {
        t0 = std::chrono::steady_clock::now();
        VariantInstance again = var.make(in);
        again.mask->tensors(MemorySpace::Device);
        runtime::synchronize();
        structural.push_back(msSince(t0));
        t0 = std::chrono::steady_clock::now();
        BlockMask g = createBlockMask(inst.mask->maskMod(), inst.mask->batch(), inst.mask->heads(), N, N, {128, 128},
                                      MemorySpace::Device);
        g.tensors(MemorySpace::Device);
        runtime::synchronize();
        generic.push_back(msSince(t0));
        t0 = std::chrono::steady_clock::now();
        BlockMask d = createBlockMask(inst.mask->maskMod(), inst.mask->batch(), inst.mask->heads(), N, N, {128, 128},
                                      onDevice);
        d.tensors(MemorySpace::Device);
        runtime::synchronize();
        deviceLists.push_back(msSince(t0));
      }
      deviceLists.erase(deviceLists.begin());
      row.maskDeviceListsMs = runtime::median(deviceLists);
      structural.erase(structural.begin());  // the first call traces and compiles
      generic.erase(generic.begin());
      row.maskStructuralMs = runtime::median(structural);
      row.maskGenericMs = runtime::median(generic);
      row.sparsity = inst.mask->sparsity();
    }
    const double pairs = inst.mask ? countAllowedPairs(*inst.mask, inst.refMask, B, Hq) : double(B * Hq) * N * N;
    const double flops = flexAttentionFlops(B, Hq, D, pairs / double(B * Hq), DV);
    for (const FlexAttentionConfig& c : configs) {
      FlexAttentionOptions opt{.config = c};
      if (maxScores) opt.max_scores = Tensor::empty(DType::F32, {B, Hq, N}, MemorySpace::Device);
      opt.sinks = sinks;
      double err = 0;
      try {
        out.copyFromHost(std::vector<H>(valueElems, H(NAN)));
        t0 = std::chrono::steady_clock::now();
        flex_attention_into(q, k, v, inst.score, inst.mask, out, nullptr, opt);
        runtime::synchronize();
        const double firstMs = msSince(t0);
        if (c == configs[0]) row.compileMs = firstMs;
        hout = out.toHost<H>();
        err = sampledError(hq, hk, hv, hout, B, Hq, N, D, DV, inst, rng, sinkValues);
      } catch (const std::exception& e) {
        std::printf("%-15s %-16s refused: %s\n", name.c_str(), c.describe().c_str(), e.what());
        continue;
      }
      if (!(err < 2e-2)) {
        std::printf("%-15s %-16s WRONG (error %.2e): not timed\n", name.c_str(), c.describe().c_str(), err);
        continue;
      }
      auto samples =
          runtime::timeKernel([&] { flex_attention_into(q, k, v, inst.score, inst.mask, out, nullptr, opt); }, 3, 20);
      const double ms = runtime::median(samples), tflops = flops / ms / 1e9;
      // The rule's persistent programs show, so that a table says which schedule ran.
      const FlexAttentionPlan plan = plan_flex_attention(q, k, v, inst.score, inst.mask, opt);
      const bool persistent = plan.persistentPrograms > 0;
      const std::string label =
          c.describe() + (persistent && c.persistent == LoopSchedule::Auto
                              ? (plan.lastRoundSplit ? " (persistent, split)" : " (persistent)")
                              : "") + (maxScores ? " +max" : "") + (withSinks ? " +sinks" : "");
      std::printf("%-15s %-16s %9.3f ms %7.1f TFLOP/s (error %.1e)\n", name.c_str(), label.c_str(), ms, tflops, err);
      if (c == configs[0]) row.defaultTflops = tflops;
      if (ms < row.ms) {
        row.ms = ms;
        row.tflops = tflops;
        row.config = label;
      }
    }
    rows.push_back(row);
    std::fflush(stdout);
  }
  std::printf("\n%-15s %-16s %9s %9s %9s %12s %12s %12s %10s\n", "variant", "best config", "ms", "TFLOP/s", "default",
              "mask gen ms", "mask dev ms", "mask str ms", "1st call ms");
  for (const Row& r : rows) {
    std::printf("%-15s %-16s %9.3f %9.1f %9.1f %12.3f %12.3f %12.3f %10.1f\n", r.variant.c_str(), r.config.c_str(), r.ms,
                r.tflops, r.defaultTflops, r.maskGenericMs, r.maskDeviceListsMs, r.maskStructuralMs, r.compileMs);
    std::printf("{\"impl\": \"flextile\", \"variant\": \"%s\", \"B\": %lld, \"H\": %lld, \"N\": %lld, \"D\": %lld, "
                "\"DV\": %lld, \"fwd_ms\": %.6f, \"fwd_tflops\": %.2f, \"default_tflops\": %.2f, \"config\": \"%s\", "
                "\"blockmask_generic_ms\": %.4f, \"blockmask_device_lists_ms\": %.4f, \"blockmask_structural_ms\": %.4f, "
                "\"first_call_ms\": %.1f, \"sparsity\": %.4f}\n",
                r.variant.c_str(), (long long)B, (long long)Hq, (long long)N, (long long)D, (long long)DV, r.ms, r.tflops,
                r.defaultTflops, r.config.c_str(), std::isnan(r.maskGenericMs) ? -1.0 : r.maskGenericMs,
                std::isnan(r.maskDeviceListsMs) ? -1.0 : r.maskDeviceListsMs,
                std::isnan(r.maskStructuralMs) ? -1.0 : r.maskStructuralMs, r.compileMs, r.sparsity);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_attention_bench: %s\n", e.what());
  return 1;
}
