// flex_attention_backward throughput on the yardstick variants (DESIGN.md): B=2, H=16, N=8192,
// D=128, bf16 by default (--dv gives v its own head dim, DeepSeek's MLA: --d 192 --dv 128). For each variant:
//   * the forward (untuned default) gives out and lse; dout is random (never zeros);
//   * every backward config of a small sweep is checked on sampled rows of dq and sampled keys of
//     dk and dv against float64 (delta from out and dout, p from the saved lse), then timed
//     (median of many runs);
//   * FLOPs: backward = 2.5 x forward = 10 * D * allowed pairs (5 * (D + DV) where v's differs); a
//     training step (forward + backward) = 3.5 x forward over the sum of both times. Pairs are
//     counted exactly.
// Prints a table and one JSON line per variant (bench/compare_attention.py joins them with
// torch_reference.py's JSON by variant).
//
//   flextile_attention_backward_bench [--variants a,b] [--b 2] [--h 16] [--n 8192] [--d 128] [--dv DV]
//                                     [--quick] [--document-offsets FILE] [--deterministic] [--atomic-dq] [--sinks]
//                                     [--dkdv BM,BN,W,S[,ws|,no-ws]] [--dq BM,BN,W,S[,ws|,no-ws]]
//                                     [--dkdv-sweep C;C;...] [--dq-sweep C;C;...]
// --atomic-dq times dq_accumulation = Atomic (dQ summed by the dkdv programs) instead of the dq kernel.
// --sinks: the forward and the backward with attention sinks (a logit per head near log N); the
// backward then also computes dsinks (its rows' check reads the forward's lse, which holds them).
// --dkdv / --dq replace that kernel's tile in the config timed first (the default otherwise; dkdv's
// BM is the queries per step, BN the keys per program); "ws" asks for warp specialization.
// --dkdv-sweep / --dq-sweep replace the sweep's list of that kernel's tiles (configs split by ';').
#include <Eigen/Core>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <map>
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

// The host copies the sampled check reads.
// q, k, dq and dk have D columns; v, out, dout and dv have DV.
struct HostData {
  int64_t B, Hq, N, D, DV;
  std::vector<H> q, k, v, out, dout;
  std::vector<float> lse;
  double at(const std::vector<H>& t, int64_t b, int64_t h, int64_t i, int64_t d) const {
    return double(float(t[size_t(((b * Hq + h) * N + i) * D + d)]));
  }
  double atV(const std::vector<H>& t, int64_t b, int64_t h, int64_t i, int64_t d) const {
    return double(float(t[size_t(((b * Hq + h) * N + i) * DV + d)]));
  }
};

// ds_ij / scale-free pieces of one (b, h, i, j): p_ij and dS_ij = p (dP - delta_i) * score'(s).
struct PairGrad {
  double p = 0, ds = 0;
};
PairGrad pairGrad(const HostData& x, const VariantInstance& var, int64_t b, int64_t h, int64_t i, int64_t j,
                  double scale, double delta) {
  if (var.refMask && !var.refMask(b, h, i, j)) return {};
  const double lse = x.lse[size_t((b * x.Hq + h) * x.N + i)];
  if (std::isinf(lse)) return {};
  double s = 0, dp = 0;
  for (int64_t d = 0; d < x.D; ++d) s += x.at(x.q, b, h, i, d) * x.at(x.k, b, h, j, d);
  for (int64_t d = 0; d < x.DV; ++d) dp += x.atV(x.dout, b, h, i, d) * x.atV(x.v, b, h, j, d);
  s *= scale;
  const double z = var.refScore ? var.refScore(s, b, h, i, j) : s;
  PairGrad g;
  g.p = std::exp(z - lse);
  g.ds = g.p * (dp - delta) * (var.refScoreGrad ? var.refScoreGrad(s, b, h, i, j) : 1.0);
  return g;
}

// Largest error relative to the sampled vector's magnitude over sampled rows of dq and keys of
// dk and dv (K/V heads equal the query heads here).
double sampledError(const HostData& x, const std::vector<H>& dq, const std::vector<H>& dk, const std::vector<H>& dv,
                    const VariantInstance& var, std::mt19937_64& rng) {
  const double scale = 1.0 / std::sqrt(double(x.D));
  std::vector<double> delta(size_t(x.B * x.Hq * x.N), -1);
  auto deltaOf = [&](int64_t b, int64_t h, int64_t i) {
    double& d = delta[size_t((b * x.Hq + h) * x.N + i)];
    if (d == -1) {
      d = 0;
      for (int64_t c = 0; c < x.DV; ++c) d += x.atV(x.out, b, h, i, c) * x.atV(x.dout, b, h, i, c);
    }
    return d;
  };
  std::uniform_int_distribution<int64_t> pb(0, x.B - 1), ph(0, x.Hq - 1), pi(0, x.N - 1);
  double worst = 0;
  auto relErr = [&](const std::vector<double>& want, const std::vector<H>& got, size_t base) {
    double mag = 1e-6, err = 0;
    for (size_t d = 0; d < want.size(); ++d) {
      const double g = double(float(got[base + size_t(d)]));
      if (!std::isfinite(g)) return double(INFINITY);
      mag = std::max(mag, std::abs(want[size_t(d)]));
      err = std::max(err, std::abs(g - want[size_t(d)]));
    }
    return err / mag;
  };
  for (int sample = 0; sample < 6; ++sample) {
    const int64_t b = sample == 0 ? x.B - 1 : pb(rng), h = sample == 0 ? x.Hq - 1 : ph(rng);
    const int64_t i = sample == 0 ? x.N - 1 : pi(rng);
    std::vector<double> wantDq(size_t(x.D), 0), wantDk(size_t(x.D), 0), wantDv(size_t(x.DV), 0);
    for (int64_t j = 0; j < x.N; ++j) {  // row i of dq
      PairGrad g = pairGrad(x, var, b, h, i, j, scale, deltaOf(b, h, i));
      if (g.ds != 0)
        for (int64_t d = 0; d < x.D; ++d) wantDq[size_t(d)] += scale * g.ds * x.at(x.k, b, h, j, d);
    }
    for (int64_t r = 0; r < x.N; ++r) {  // key i of dk and dv
      PairGrad g = pairGrad(x, var, b, h, r, i, scale, deltaOf(b, h, r));
      if (g.p == 0) continue;
      for (int64_t d = 0; d < x.D; ++d) wantDk[size_t(d)] += scale * g.ds * x.at(x.q, b, h, r, d);
      for (int64_t d = 0; d < x.DV; ++d) wantDv[size_t(d)] += g.p * x.atV(x.dout, b, h, r, d);
    }
    const size_t row = size_t((b * x.Hq + h) * x.N + i);
    worst = std::max({worst, relErr(wantDq, dq, row * size_t(x.D)), relErr(wantDk, dk, row * size_t(x.D)),
                      relErr(wantDv, dv, row * size_t(x.DV))});
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t B = 2, Hq = 16, N = 8192, D = 128, DV = 0;
  std::vector<std::string> names{"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"};
  bool quick = false, deterministic = false, atomicDq = false, withSinks = false;
  std::optional<FlexAttentionConfig> dkdvTile, dqTile;
  std::optional<std::vector<FlexAttentionConfig>> dkdvSweep, dqSweep;
  auto parseConfigs = [](const std::string& list) {
    std::vector<FlexAttentionConfig> configs;
    for (const std::string& c : split(list, ';')) configs.push_back(FlexAttentionConfig::parse(c));
    return configs;
  };
  std::vector<std::vector<int64_t>> documentOffsets;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error("flextile_attention_backward_bench: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--variants") names = split(next());
    else if (a == "--b") B = std::stoll(next());
    else if (a == "--h") Hq = std::stoll(next());
    else if (a == "--n") N = std::stoll(next());
    else if (a == "--d") D = std::stoll(next());
    else if (a == "--dv") DV = std::stoll(next());
    else if (a == "--quick") quick = true;
    else if (a == "--deterministic") deterministic = true;
    else if (a == "--atomic-dq") atomicDq = true;
    else if (a == "--sinks") withSinks = true;
    else if (a == "--dkdv") dkdvTile = FlexAttentionConfig::parse(next());
    else if (a == "--dq") dqTile = FlexAttentionConfig::parse(next());
    else if (a == "--dkdv-sweep") dkdvSweep = parseConfigs(next());
    else if (a == "--dq-sweep") dqSweep = parseConfigs(next());
    else if (a == "--document-offsets") documentOffsets = flextile::bench::readOffsets(next(), "flextile_attention_backward_bench");
    else throw Error("flextile_attention_backward_bench: unknown argument '" + a + "'");
  }
  if (DV == 0) DV = D;
  std::string why;
  if (!dsl::deviceAvailable(&why)) {
    std::fprintf(stderr, "flextile_attention_backward_bench: needs a GPU (%s)\n", why.c_str());
    return 2;
  }
  std::printf("device: %s   B=%lld H=%lld N=%lld D=%lld DV=%lld bf16 backward%s\n",
              runtime::Device::current().name().c_str(), (long long)B, (long long)Hq, (long long)N, (long long)D,
              (long long)DV, deterministic ? " (deterministic)" : atomicDq ? " (atomic dQ)" : "");
  std::mt19937_64 rng(std::random_device{}());
  auto randomHost = [&](size_t n) {
    std::normal_distribution<float> g(0, 1);
    std::vector<H> v(n);
    for (auto& x : v) x = H(g(rng));
    return v;
  };
  const size_t elems = size_t(B * Hq * N * D), elemsV = size_t(B * Hq * N * DV);
  HostData x{B, Hq, N, D, DV, randomHost(elems), randomHost(elems), randomHost(elemsV), {}, randomHost(elemsV), {}};
  Tensor q = Tensor::fromHost(x.q, {B, Hq, N, D}, MemorySpace::Device);
  Tensor k = Tensor::fromHost(x.k, {B, Hq, N, D}, MemorySpace::Device);
  Tensor v = Tensor::fromHost(x.v, {B, Hq, N, DV}, MemorySpace::Device);
  Tensor dout = Tensor::fromHost(x.dout, {B, Hq, N, DV}, MemorySpace::Device);
  Tensor out = Tensor::empty(DType::BF16, {B, Hq, N, DV}, MemorySpace::Device);
  Tensor lse = Tensor::empty(DType::F32, {B, Hq, N}, MemorySpace::Device);
  FlexAttentionOptions forwardOptions;
  if (withSinks)
    forwardOptions.sinks = Tensor::fromHost(flextile::bench::sinksNear(rng, Hq, N), {Hq}, MemorySpace::Device);
  FlexAttentionGrads grads;
  grads.dq = Tensor::empty(DType::BF16, {B, Hq, N, D}, MemorySpace::Device);
  grads.dk = Tensor::empty(DType::BF16, {B, Hq, N, D}, MemorySpace::Device);
  grads.dv = Tensor::empty(DType::BF16, {B, Hq, N, DV}, MemorySpace::Device);

  // Two one-axis sweeps around the default (dkdv tiles with the default dq, then dq tiles with the
  // default dkdv), so each kernel's best tile shows on its own; the best of each axis is then timed
  // together. The default is per variant (a score_mod narrows dkdv's query step).
  constexpr auto ws = WarpSpecialization::On;
  constexpr auto turns = LoopSchedule::On;  // the specialized tiles' warpgroups taking turns
  const std::vector<FlexAttentionConfig> dkdvTiles = dkdvSweep ? *dkdvSweep : std::vector<FlexAttentionConfig>{{32, 64, 4, 2},  {32, 64, 4, 3},      {16, 64, 4, 2},
                                                   {32, 128, 8, 2}, {32, 128, 8, 3},     {64, 128, 8, 2},
                                                   {64, 64, 4, 2},  {64, 128, 8, 2, ws}, {64, 128, 8, 2, ws, turns}};
  const std::vector<FlexAttentionConfig> dqTiles = dqSweep ? *dqSweep : std::vector<FlexAttentionConfig>{{64, 64, 4, 2},      {64, 64, 4, 3},      {128, 64, 8, 2},
                                                 {128, 64, 8, 3},     {128, 32, 8, 2},     {64, 32, 4, 2},
                                                 {128, 64, 8, 2, ws}, {128, 64, 8, 3, ws}, {128, 32, 8, 2, ws},
                                                 {128, 64, 8, 2, ws, turns}};
  struct Row {
    std::string variant, config;
    double fwdMs = 0, bwdMs = INFINITY, tflops = 0, defaultTflops = 0, stepTflops = 0;
  };
  std::vector<Row> rows;
  for (const std::string& name : names) {
    Row row{name};
    VariantInputs in{B, Hq, N, N, MemorySpace::Device, {128, 128}, 7, documentOffsets};
    VariantInstance inst = variant(name).make(in);
    const double pairs = inst.mask ? countAllowedPairs(*inst.mask, inst.refMask, B, Hq) : double(B * Hq) * N * N;
    const double fwdFlops = flexAttentionFlops(B, Hq, D, pairs / double(B * Hq), DV);
    const double bwdFlops = flexAttentionBackwardFlops(B, Hq, D, pairs / double(B * Hq), DV);
    flex_attention_into(q, k, v, inst.score, inst.mask, out, &lse, forwardOptions);
    runtime::synchronize();
    row.fwdMs = runtime::median(runtime::timeKernel(
        [&] { flex_attention_into(q, k, v, inst.score, inst.mask, out, &lse, forwardOptions); }, 3, 20));
    x.out = out.toHost<H>();
    x.lse = lse.toHost<float>();
    auto isGathering = [](const auto& mod) { return mod.defined() && mod.gathersPerElement(); };
    FlexAttentionBackwardConfig dflt = defaultFlexAttentionBackwardConfig(
        DType::BF16, D,
        codegen::Target::fromCapability(runtime::Device::current().capabilityMajor(),
                                        runtime::Device::current().capabilityMinor()),
        isGathering(inst.score) || (inst.mask && isGathering(inst.mask->maskMod())),
        atomicDq ? DqAccumulation::Atomic : DqAccumulation::Separate, DV);
    if (dkdvTile) dflt.dkdv = *dkdvTile;
    if (dqTile) dflt.dq = *dqTile;
    std::vector<FlexAttentionBackwardConfig> configs{dflt};
    if (!quick) {
      for (const FlexAttentionConfig& t : dkdvTiles) configs.push_back({t, dflt.dq});
      if (!atomicDq)  // atomic dQ has no dq kernel: its tiles change nothing
        for (const FlexAttentionConfig& t : dqTiles) configs.push_back({dflt.dkdv, t});
    }
    std::map<std::string, double> seen;  // by describe(): each config timed once
    FlexAttentionConfig bestDkdv = dflt.dkdv, bestDq = dflt.dq;
    double bestDkdvMs = INFINITY, bestDqMs = INFINITY;
    auto timeConfig = [&](const FlexAttentionBackwardConfig& c) -> double {
      if (auto it = seen.find(c.describe()); it != seen.end()) return it->second;
      double& result = seen[c.describe()] = INFINITY;
      FlexAttentionBackwardOptions opt{
          .dq_accumulation = atomicDq ? DqAccumulation::Atomic : DqAccumulation::Separate,
          .deterministic = deterministic,
          .config = c};
      opt.sinks = forwardOptions.sinks;
      double err = 0;
      try {
        for (Tensor* t : {&grads.dq, &grads.dk}) t->copyFromHost(std::vector<H>(elems, H(NAN)));
        grads.dv.copyFromHost(std::vector<H>(elemsV, H(NAN)));
        flex_attention_backward_into(q, k, v, out, lse, dout, inst.score, inst.mask, grads, opt);
        runtime::synchronize();
        err = sampledError(x, grads.dq.toHost<H>(), grads.dk.toHost<H>(), grads.dv.toHost<H>(), inst, rng);
      } catch (const std::exception& e) {
        std::printf("%-15s %-40s refused: %s\n", name.c_str(), c.describe().c_str(), e.what());
        return result;
      }
      if (!(err < 3e-2)) {
        std::printf("%-15s %-40s WRONG (error %.2e): not timed\n", name.c_str(), c.describe().c_str(), err);
        return result;
      }
      auto samples = runtime::timeKernel(
          [&] { flex_attention_backward_into(q, k, v, out, lse, dout, inst.score, inst.mask, grads, opt); }, 3, 15);
      const double ms = runtime::median(samples), tflops = bwdFlops / ms / 1e9;
      std::printf("%-15s %-40s %9.3f ms %7.1f TFLOP/s (error %.1e)\n", name.c_str(), c.describe().c_str(), ms, tflops,
                  err);
      std::fflush(stdout);
      if (&c == &configs[0]) row.defaultTflops = tflops;
      if (ms < row.bwdMs) {
        row.bwdMs = ms;
        row.tflops = tflops;
        row.config = c.describe();
      }
      return result = ms;
    };
    for (size_t i = 0; i < configs.size(); ++i) {
      const double ms = timeConfig(configs[i]);
      if (i == 0) row.defaultTflops = std::isfinite(ms) ? bwdFlops / ms / 1e9 : 0;
      if (configs[i].dq == dflt.dq && ms < bestDkdvMs) bestDkdvMs = ms, bestDkdv = configs[i].dkdv;
      if (configs[i].dkdv == dflt.dkdv && ms < bestDqMs) bestDqMs = ms, bestDq = configs[i].dq;
    }
    if (!quick) timeConfig({bestDkdv, bestDq});
    row.stepTflops = (fwdFlops + bwdFlops) / (row.fwdMs + row.bwdMs) / 1e9;
    rows.push_back(row);
  }
  // What determinism costs: learnable ALiBi slopes (a trainable capture: every dkdv step adds its
  // tile's slope gradient with an atomic), f32 atomics against 64-bit fixed point, default config.
  std::vector<std::pair<std::string, double>> trainableRows;
  if (std::find(names.begin(), names.end(), "alibi") != names.end()) {
    std::vector<float> slopes(static_cast<size_t>(Hq));
    for (int64_t h = 0; h < Hq; ++h) slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(Hq));
    dsl::CapturedTensor slopesT =
        dsl::capture(Tensor::fromHost(slopes, {Hq}, MemorySpace::Device), "slopes", {.requires_grad = true});
    ScoreMod learnable = alibi(slopesT);
    BlockMask mask = causalBlockMask(1, 1, N, N);
    const double bwdFlops = flexAttentionBackwardFlops(B, Hq, D, double(N) * double(N + 1) / 2, DV);  // causal
    flex_attention_into(q, k, v, learnable, mask, out, &lse);
    std::vector<float> first;
    for (bool det : {false, true}) {
      FlexAttentionBackwardOptions opt{.deterministic = det};
      FlexAttentionGrads g = grads;
      flex_attention_backward_into(q, k, v, out, lse, dout, learnable, mask, g, opt);
      runtime::synchronize();
      std::vector<float> grad = g.grad(slopesT).toHost<float>();
      double worst = 0;  // the two modes agree to f32 rounding
      if (!first.empty())
        for (size_t i = 0; i < grad.size(); ++i)
          worst = std::max(worst, double(std::abs(grad[i] - first[i])) / (std::abs(first[i]) + 1e-6));
      first = grad;
      const double ms = runtime::median(runtime::timeKernel(
          [&] { flex_attention_backward_into(q, k, v, out, lse, dout, learnable, mask, g, opt); }, 3, 15));
      std::printf("alibi, learnable slopes, %-13s %9.3f ms %7.1f TFLOP/s%s\n", det ? "deterministic" : "f32 atomics",
                  ms, bwdFlops / ms / 1e9,
                  det ? (" (slope gradients within " + std::to_string(worst) + " of the atomic run)").c_str() : "");
      trainableRows.push_back({det ? "deterministic" : "atomics", ms});
    }
  }
  std::printf("\n%-15s %-40s %9s %9s %9s %9s %10s\n", "variant", "best backward config", "fwd ms", "bwd ms",
              "bwd TF/s", "default", "step TF/s");
  for (const Row& r : rows) {
    std::printf("%-15s %-40s %9.3f %9.3f %9.1f %9.1f %10.1f\n", r.variant.c_str(), r.config.c_str(), r.fwdMs, r.bwdMs,
                r.tflops, r.defaultTflops, r.stepTflops);
    std::printf("{\"impl\": \"flextile\", \"variant\": \"%s\", \"B\": %lld, \"H\": %lld, \"N\": %lld, \"D\": %lld, \"DV\": %lld, "
                "\"fwd_ms\": %.6f, \"bwd_ms\": %.6f, \"bwd_tflops\": %.2f, \"default_bwd_tflops\": %.2f, "
                "\"step_tflops\": %.2f, \"config\": \"%s\", \"deterministic\": %s, \"atomic_dq\": %s}\n",
                r.variant.c_str(), (long long)B, (long long)Hq, (long long)N, (long long)D, (long long)DV, r.fwdMs, r.bwdMs, r.tflops,
                r.defaultTflops, r.stepTflops, r.config.c_str(), deterministic ? "true" : "false",
                atomicDq ? "true" : "false");
  }
  if (trainableRows.size() == 2)
    std::printf("learnable ALiBi backward: %.3f ms with f32 atomics, %.3f ms deterministic (%.3fx)\n",
                trainableRows[0].second, trainableRows[1].second, trainableRows[1].second / trainableRows[0].second);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_attention_backward_bench: %s\n", e.what());
  return 1;
}
