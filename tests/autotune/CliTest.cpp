// The `flextile` tool in process (autotune/cli/Cli.h): argument errors,
// list, compile --emit for a variant without a GPU, run --check on the
// interpreter at a tiny shape.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/Variants.h"
#include "TextCount.h"
#include "autotune/cli/Cli.h"

using namespace flextile::attention;

// Queries before 40 see no key: rows a check must compare exactly (out 0, lse -inf).
FLEXTILE_REGISTER_VARIANT(test_first_rows_blind, "causal, queries < 40 see nothing (a test variant)",
                          [](const VariantInputs& in) {
                            VariantInstance v;
                            MaskMod mod("first_40_rows_blind", [](const Tile&, const Tile&, const Tile& q,
                                                                  const Tile& kv) { return (q >= 40) & (kv <= q); });
                            v.mask = createBlockMask(mod, 1, 1, in.L, in.S, in.blocks, in.space);
                            v.refMask = [](int64_t, int64_t, int64_t q, int64_t kv) { return q >= 40 && kv <= q; };
                            return v;
                          });

namespace flextile {
namespace {

struct Result {
  int status;
  std::string out, err;
};

Result run(std::vector<const char*> args) {
  args.insert(args.begin(), "flextile");
  std::ostringstream out, err;
  const int status = cli::flextileMain(int(args.size()), args.data(), out, err);
  return {status, out.str(), err.str()};
}

TEST(Cli, BadArgumentsExitTwoWithAMessageThatNamesTheProblem) {
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases{
      {{}, "no command"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
      {{"run"}, "needs a VARIANT"},
      {{"run", "causal", "--bogus"}, "unknown option '--bogus'"},
      {{"run", "causal", "--shape"}, "--shape needs a value"},
      {{"run", "causal", "--shape", "1,2,x,4"}, "positive integers"},
      {{"run", "causal", "--shape", "1,2,3"}, "expects 4 values"},
      {{"run", "causal", "--shape", "1,2,64,16", "--dtype", "int8"}, "--dtype must be"},
      {{"run", "causal", "--shape", "1,4,64,16", "--gqa", "3", "--host"}, "must divide the heads"},
      {{"run", "no_such_variant", "--host"}, "unknown attention variant 'no_such_variant'"},
      {{"run", "causal", "--host", "--shape", "8,16,4096,128"}, "small shapes"},
      {{"compile", "causal"}, "--emit must be"},
      {{"compile", "causal", "--emit", "sass"}, "got 'sass'"},
      {{"compile", "causal", "--emit", "ptx", "--target", "sm_70"}, "--target must be"},
      {{"compile", "causal", "--emit", "ptx", "--locations"}, "--locations applies to --emit traced"},
      {{"list", "extra"}, "unexpected argument 'extra'"},
      {{"run", "causal", "--host=yes"}, "takes no value"},
      {{"run", "causal", "--host", "--check=yes"}, "--check=all (every row)"},
      {{"autotune", "causal", "--budget", "-3"}, "non-negative number"},
      {{"autotune", "causal", "--kernel", "dq"}, "--kernel must be forward, decode or backward, got 'dq'"},
      {{"autotune", "causal", "--kernel", "backward", "--queries", "2"}, "--queries applies to --kernel decode"},
      {{"autotune", "causal", "--kernel", "backward", "--plot", "x.png"}, "--plot draws the forward's sweep"},
      {{"autotune", "causal", "--min-speedup", "0.9"}, "--min-speedup must be at least 1"},
      {{"autotune", "causal", "--queries", "2"}, "--queries applies to --kernel decode"},
      {{"autotune", "causal", "--kernel", "decode", "--queries", "17"}, "--queries 17 must be in [1, min(N, 16)]"},
      {{"autotune", "causal", "--kernel", "decode", "--plot", "x.png"}, "--plot draws the forward's sweep"},
  };
  for (const auto& [args, message] : cases) {
    Result r = run(args);
    std::string line;
    for (auto a : args) line += std::string(a) + " ";
    EXPECT_EQ(r.status, 2) << line << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << line << "\n" << r.err;
  }
}

TEST(Cli, HelpOnEveryCommand) {
  Result top = run({"--help"});
  EXPECT_EQ(top.status, 0);
  for (const char* c : {"list", "run", "autotune", "compile", "bench", "blockmask"}) {
    EXPECT_NE(top.out.find(c), std::string::npos) << c;
    Result r = run({c, "--help"});
    EXPECT_EQ(r.status, 0) << c;
    EXPECT_NE(r.out.find(std::string("usage: flextile ") + c), std::string::npos) << r.out;
  }
}

TEST(Cli, ListShowsTheBuiltInVariantsAndTheTemplate) {
  Result r = run({"list"});
  EXPECT_EQ(r.status, 0);
  for (const char* v : {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap", "bias"})
    EXPECT_NE(r.out.find(std::string("  ") + v + " "), std::string::npos) << v << "\n" << r.out;
  EXPECT_NE(r.out.find("flex_attention_fwd"), std::string::npos);
}

TEST(Cli, CompileEmitsPtxAndIrWithoutAGpu) {
  Result ptx = run({"compile", "softcap", "--shape", "1,2,256,64", "--emit", "ptx", "--target", "sm_80"});
  ASSERT_EQ(ptx.status, 0) << ptx.err;
  EXPECT_NE(ptx.out.find(".target sm_80"), std::string::npos);
  EXPECT_NE(ptx.out.find(".entry flex_fwd_soft_cap"), std::string::npos) << ptx.out.substr(0, 2000);
  EXPECT_NE(ptx.out.find("mma.sync"), std::string::npos);
  EXPECT_NE(ptx.out.find("tanh.approx"), std::string::npos) << "the soft-cap score mod is in the kernel";
  Result traced = run({"compile", "causal", "--shape", "1,2,256,64", "--emit", "traced", "--config", "64,32,4,1"});
  ASSERT_EQ(traced.status, 0) << traced.err;
  EXPECT_NE(traced.out.find("num_warps = 4"), std::string::npos) << traced.out.substr(0, 600);
  EXPECT_EQ(traced.out.find("loc("), std::string::npos) << "source lines only when asked";
  // --locations: each traced op names its line, the forward template's and the mask's own.
  Result located = run({"compile", "causal", "--shape", "1,2,256,64", "--emit", "traced", "--locations"});
  ASSERT_EQ(located.status, 0) << located.err;
  EXPECT_NE(located.out.find("FlexAttentionForward.cpp\":"), std::string::npos) << located.out.substr(0, 2000);
  EXPECT_NE(located.out.find("Mods.cpp\":"), std::string::npos) << located.out.substr(0, 2000);
  // A fifth number of --config picks warp specialization (1) or not (0) over the template's choice.
  for (const char* config : {"128,128,8,2,no-ws", "128,128,8,2,ws"}) {
    Result ir = run({"compile", "causal", "--shape", "1,2,1024,128", "--emit", "ir", "--config", config});
    ASSERT_EQ(ir.status, 0) << ir.err;
    EXPECT_EQ(ir.out.find("producer_warps = 4") != std::string::npos, std::string(config).ends_with(",ws")) << config;
  }
  EXPECT_EQ(run({"compile", "causal", "--emit", "ir", "--config", "128,128,8,2,yes"}).status, 2);
}

// --kernel prints one kernel of the backward; --config then sets that kernel's tile only.
TEST(Cli, CompileEmitsTheBackwardsKernels) {
  Result dkdv = run({"compile", "causal", "--shape", "1,2,512,64", "--kernel", "dkdv", "--config", "32,64,4,2",
                     "--emit", "ir"});
  ASSERT_EQ(dkdv.status, 0) << dkdv.err;
  EXPECT_NE(dkdv.out.find("flex_bwd_dkdv_"), std::string::npos) << dkdv.out.substr(0, 600);
  EXPECT_NE(dkdv.out.find(": f32[64,32]"), std::string::npos) << "scores of 64 keys by 32 queries";
  Result dq = run({"compile", "alibi", "--shape", "1,2,512,64", "--kernel", "dq", "--emit", "ptx"});
  ASSERT_EQ(dq.status, 0) << dq.err;
  EXPECT_NE(dq.out.find(".entry flex_bwd_dq_"), std::string::npos) << dq.out.substr(0, 2000);
  Result pre = run({"compile", "causal", "--kernel", "preprocess", "--emit", "ptx"});
  ASSERT_EQ(pre.status, 0) << pre.err;
  EXPECT_NE(pre.out.find(".entry flex_bwd_preprocess_"), std::string::npos);
  Result wrong = run({"compile", "causal", "--kernel", "dkv", "--emit", "ptx"});
  EXPECT_EQ(wrong.status, 2);
  EXPECT_NE(wrong.err.find("--kernel must be forward, last-round-merge, preprocess, dkdv, dq or decode, got 'dkv'"),
            std::string::npos)
      << wrong.err;
  Result traced = run({"compile", "causal", "--kernel", "dq", "--emit", "traced"});
  EXPECT_EQ(traced.status, 2);
  EXPECT_NE(traced.err.find("ask for ir, llvm or ptx"), std::string::npos) << traced.err;
  EXPECT_EQ(run({"compile", "causal", "--kernel", "preprocess", "--config", "64,64,4,2", "--emit", "ir"}).status, 2);
}

// --atomic-dq compiles the dkdv kernel that adds dQ itself (DqAccumulation::Atomic): its IR has the
// atomic_add into the f32 dQ buffer, the separate form's has none. Any other kernel is a usage error.
TEST(Cli, CompileAtomicDqDkdv) {
  Result separate = run({"compile", "causal", "--shape", "1,2,512,64", "--kernel", "dkdv", "--emit", "ir"});
  ASSERT_EQ(separate.status, 0) << separate.err;
  EXPECT_EQ(separate.out.find("atomic_add"), std::string::npos);
  Result atomic =
      run({"compile", "causal", "--shape", "1,2,512,64", "--kernel", "dkdv", "--atomic-dq", "--emit", "ir"});
  ASSERT_EQ(atomic.status, 0) << atomic.err;
  EXPECT_NE(atomic.out.find("atomic_add"), std::string::npos) << atomic.out.substr(0, 600);
  for (const char* kernel : {"dq", "forward", "decode"}) {
    Result wrong = run({"compile", "causal", "--kernel", kernel, "--atomic-dq", "--emit", "ir"});
    EXPECT_EQ(wrong.status, 2) << kernel;
    EXPECT_NE(wrong.err.find("--atomic-dq applies to --kernel dkdv"), std::string::npos) << wrong.err;
  }
}

// --kernel decode prints the decode kernel of L queries at the end of the cache; --config is its
// BN,W,S[,SPLITS].
TEST(Cli, CompileEmitsTheDecodeKernel) {
  Result ptx = run({"compile", "sliding_window", "--shape", "2,8,4096,128", "--gqa", "4", "--kernel", "decode",
                    "--emit", "ptx"});
  ASSERT_EQ(ptx.status, 0) << ptx.err;
  EXPECT_NE(ptx.out.find(".entry flex_decode_"), std::string::npos) << ptx.out.substr(0, 2000);
  Result ir = run({"compile", "causal", "--shape", "1,8,1024,64", "--gqa", "2", "--kernel", "decode", "--queries", "3",
                   "--config", "32,4,2,1", "--emit", "ir"});
  ASSERT_EQ(ir.status, 0) << ir.err;
  EXPECT_NE(ir.out.find(": f32[16,32]"), std::string::npos) << "2 heads x 3 queries padded to 16 rows, 32 keys a step";
  Result traced = run({"compile", "full", "--shape", "1,4,512,64", "--kernel", "decode", "--emit", "traced"});
  ASSERT_EQ(traced.status, 0) << traced.err;
  EXPECT_EQ(run({"compile", "full", "--kernel", "decode", "--queries", "0", "--emit", "ir"}).status, 2);
  EXPECT_EQ(run({"compile", "full", "--kernel", "decode", "--config", "64,4", "--emit", "ir"}).status, 2);
  // The split count's aim (what the decode's autotuner tunes).
  EXPECT_EQ(run({"compile", "full", "--shape", "1,4,512,64", "--kernel", "decode", "--config", "64,4,2,0,per-sm=1",
                 "--emit", "ir"}).status, 0);
  Result aim = run({"compile", "full", "--kernel", "decode", "--config", "64,4,2,0,per-sm=0", "--emit", "ir"});
  EXPECT_EQ(aim.status, 2);
  EXPECT_NE(aim.err.find("per-sm=N (1 to 8)"), std::string::npos) << aim.err;
  Result stray = run({"compile", "full", "--queries", "2", "--emit", "ir"});
  EXPECT_EQ(stray.status, 2);
  EXPECT_NE(stray.err.find("--queries applies to --kernel decode"), std::string::npos) << stray.err;
}

// --kernel last-round-merge prints the kernel that folds a split last round's pieces (no mask, 256
// tiles on sm_90a's 132 SMs); a call that does not split is refused by name.
// `autotune --kernel decode` without a GPU: the decode's sweep planned and compiled for the target,
// the configs whose plan the default already runs pruned as such, nothing timed or stored.
TEST(Cli, AutotuneDecodeDryRunPlansTheDecodesConfigs) {
  Result r = run({"autotune", "sliding_window", "--kernel", "decode", "--shape", "2,8,4096,64", "--gqa", "4",
                  "--queries", "2", "--target", "sm_80", "--threads", "2"});
  if (r.err.find("no GPU") == std::string::npos) GTEST_SKIP() << "a GPU is present: this is the dry run's test";
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("BN64 w4 s2 splits auto "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("default"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("runs as BN64 w4 s2 splits auto ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dry run"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("failed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("stored"), std::string::npos) << r.out;
}

// `autotune --kernel backward` without a GPU: (dkdv, dq) pairs compiled for the target, the default
// pair first, nothing timed or stored.
TEST(Cli, AutotuneBackwardDryRunCompilesTheBackwardsPairs) {
  Result r =
      run({"autotune", "causal", "--kernel", "backward", "--shape", "1,4,640,64", "--gqa", "2", "--threads", "2"});
  if (r.err.find("no GPU") == std::string::npos) GTEST_SKIP() << "a GPU is present: this is the dry run's test";
  ASSERT_EQ(r.status, 0) << r.err;
  const size_t header = r.out.find('\n'), firstEnd = r.out.find('\n', header + 1);
  ASSERT_NE(firstEnd, std::string::npos) << r.out;
  const std::string firstRow = r.out.substr(header + 1, firstEnd - header - 1);
  EXPECT_NE(firstRow.find("dkdv BM"), std::string::npos) << r.out;
  EXPECT_NE(firstRow.find(" / dq BM"), std::string::npos) << r.out;
  EXPECT_NE(firstRow.find("default"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("compile: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("for 36 configs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dry run"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("failed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("stored"), std::string::npos) << r.out;
}

// The bias variant's table is materialized on the host: at a decode yardstick shape it once died of
// std::bad_alloc ("flextile: std::bad_alloc"); now the error names the table and its size.
TEST(Cli, AVariantTooLargeToMaterializeSaysWhy) {
  Result r = run({"compile", "bias", "--kernel", "decode", "--shape", "8,32,32768,128", "--gqa", "4", "--emit", "ptx"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("variant 'bias': its table [H, L, S] = [32, 32768, 32768] of f32 would take 128.0 GiB, over "
                       "the variant's 4 GiB"),
            std::string::npos)
      << r.err;
}

TEST(Cli, CompileEmitsTheLastRoundMergeKernel) {
  Result ptx = run({"compile", "full", "--shape", "1,16,2048,128", "--config", "128,128,8,2", "--kernel",
                    "last-round-merge", "--emit", "ptx"});
  ASSERT_EQ(ptx.status, 0) << ptx.err;
  EXPECT_NE(ptx.out.find(".entry flex_fwd_last_round_merge_bf16"), std::string::npos) << ptx.out.substr(0, 2000);
  Result causal = run({"compile", "causal", "--shape", "1,16,2048,128", "--config", "128,128,8,2", "--kernel",
                       "last-round-merge", "--emit", "ir"});
  EXPECT_NE(causal.status, 0);
  EXPECT_NE(causal.err.find("does not split its last round"), std::string::npos) << causal.err;
  Result traced = run({"compile", "full", "--shape", "1,16,2048,128", "--kernel", "last-round-merge", "--emit", "traced"});
  EXPECT_EQ(traced.status, 2);
  EXPECT_NE(traced.err.find("ask for ir, llvm or ptx"), std::string::npos) << traced.err;
}

TEST(Cli, RunCheckPassesOnTheInterpreterAtATinyShape) {
  for (const char* variant : {"causal", "alibi"}) {
    Result r = run({"run", variant, "--host", "--shape", "1,4,70,32", "--gqa", "2", "--check"});
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Hkv=2"), std::string::npos) << r.out;
  }
}

// --dv gives V its own head dim: run checks the output's DV columns (a check that compared D of
// them failed on a correct output), compile plans the forward, the backward and the decode with it.
TEST(Cli, ValuesOfTheirOwnHeadDim) {
  for (const char* dv : {"128", "48"}) {
    Result r = run({"run", "causal", "--host", "--shape", "1,4,70,64", "--gqa", "2", "--dv", dv, "--check=all"});
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("D=64 DV=") + dv), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  }
  for (const char* kernel : {"forward", "dkdv", "dq", "decode"}) {
    Result r = run({"compile", "causal", "--shape", "1,4,512,192", "--dv", "128", "--kernel", kernel, "--emit", "ptx"});
    EXPECT_EQ(r.status, 0) << kernel << "\n" << r.err;
    EXPECT_NE(r.out.find(".entry"), std::string::npos) << kernel;
  }
  Result bad = run({"run", "causal", "--host", "--shape", "1,2,64,64", "--dv", "40"});
  EXPECT_EQ(bad.status, 1) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("DV = 40"), std::string::npos) << bad.err;
}

// --check reads a seeded sample of rows and says so; --check=all reads every row. Both compare a
// row the mask leaves without keys exactly (out 0, lse -inf).
TEST(Cli, RunCheckSaysWhichRowsItChecked) {
  Result sample = run({"run", "causal", "--host", "--shape", "2,2,300,32", "--check", "--seed", "9"});
  EXPECT_EQ(sample.status, 0) << sample.out << sample.err;
  EXPECT_NE(sample.out.find("of 1200 rows (sample, seed 9)"), std::string::npos) << sample.out;
  EXPECT_NE(sample.out.find("PASS"), std::string::npos) << sample.out;
  EXPECT_NE(sample.out.find("seed 9"), std::string::npos) << "the first line names the inputs' seed";

  Result all = run({"run", "causal", "--host", "--shape", "2,2,300,32", "--gqa", "2", "--check=all", "--seed", "9"});
  EXPECT_EQ(all.status, 0) << all.out << all.err;
  EXPECT_NE(all.out.find("1200 of 1200 rows (all)"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("PASS"), std::string::npos) << all.out;

  Result blind = run({"run", "test_first_rows_blind", "--host", "--shape", "1,2,200,32", "--check"});
  EXPECT_EQ(blind.status, 0) << blind.out << blind.err;
  EXPECT_NE(blind.out.find("PASS"), std::string::npos) << blind.out;
}

// --max-scores asks for each row's largest score: run prints the largest and the rows without a key,
// and --check compares them with the reference's (exactly -inf on the blind rows).
TEST(Cli, RunMaxScores) {
  Result r = run({"run", "test_first_rows_blind", "--host", "--shape", "1,2,200,32", "--max-scores", "--check=all"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("max scores: the largest "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(" 0 of 400 rows without a key"), std::string::npos) << "its first rows see no key: " << r.out;
  EXPECT_NE(r.out.find("max |max score error|"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  Result plain = run({"run", "causal", "--host", "--shape", "1,2,100,32", "--check"});
  EXPECT_EQ(plain.out.find("max score"), std::string::npos) << "only when asked: " << plain.out;
}

// compile --max-scores prints the kernel that also writes the rows' largest scores: the forward's
// and the decode's traced IR then use the parameter (without, it is only declared); the backward's
// kernels take no such option.
TEST(Cli, CompileMaxScores) {
  auto uses = [](const std::string& text) { return testing::count(text, "%max_scores"); };
  for (const char* kernel : {"forward", "decode"}) {
    Result plain = run({"compile", "causal", "--shape", "1,2,256,64", "--kernel", kernel, "--emit", "traced"});
    Result asked =
        run({"compile", "causal", "--shape", "1,2,256,64", "--kernel", kernel, "--max-scores", "--emit", "traced"});
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(asked.status, 0) << asked.err;
    EXPECT_EQ(uses(plain.out), 1) << kernel;
    EXPECT_GT(uses(asked.out), 1) << kernel;
  }
  Result backward = run({"compile", "causal", "--kernel", "dkdv", "--max-scores", "--emit", "ptx"});
  EXPECT_EQ(backward.status, 2);
  EXPECT_NE(backward.err.find("--max-scores applies to the forward"), std::string::npos) << backward.err;
}

// --sinks: run with seeded attention sinks, which --check gives the reference too (a row the mask
// leaves blind then has the sink's lse); compile prints the kernels that read them.
TEST(Cli, RunAndCompileWithSinks) {
  Result r = run({"run", "test_first_rows_blind", "--host", "--shape", "1,4,200,32", "--gqa", "2", "--sinks",
                  "--check=all"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("800 of 800 rows (all)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;
  for (const char* kernel : {"forward", "decode"}) {
    Result plain = run({"compile", "causal", "--shape", "1,2,256,64", "--kernel", kernel, "--emit", "traced"});
    Result asked =
        run({"compile", "causal", "--shape", "1,2,256,64", "--kernel", kernel, "--sinks", "--emit", "traced"});
    ASSERT_EQ(plain.status, 0) << plain.err;
    ASSERT_EQ(asked.status, 0) << asked.err;
    EXPECT_EQ(testing::count(plain.out, "%sinks"), 0) << kernel;
    EXPECT_GT(testing::count(asked.out, "%sinks"), 1) << kernel;
  }
  Result backward = run({"compile", "causal", "--kernel", "dq", "--sinks", "--emit", "ptx"});
  EXPECT_EQ(backward.status, 2);
  EXPECT_NE(backward.err.find("--sinks applies to the forward"), std::string::npos) << backward.err;
}

// --backward runs the backward on the forward's out and lse and checks dQ rows and dK, dV keys
// against float64 (every one with --check=all; a sample, with sinks and atomic dQ, otherwise), and a
// reference wrong on purpose fails it; --atomic-dq belongs to it.
TEST(Cli, RunBackwardChecksTheGradients) {
  Result all = run({"run", "softcap", "--host", "--shape", "1,4,200,32", "--gqa", "2", "--backward", "--check=all"});
  EXPECT_EQ(all.status, 0) << all.out << all.err;
  EXPECT_NE(all.out.find("800 dq rows and 400 dk/dv keys (all)"), std::string::npos) << all.out;
  EXPECT_NE(all.out.find("tolerance 3e-02): PASS"), std::string::npos) << all.out;
  Result sample = run({"run", "document", "--host", "--shape", "2,4,300,32", "--gqa", "4", "--backward", "--sinks",
                       "--atomic-dq", "--check", "--seed", "5"});
  EXPECT_EQ(sample.status, 0) << sample.out << sample.err;
  EXPECT_NE(sample.out.find("(atomic dQ); first call"), std::string::npos) << sample.out;
  EXPECT_NE(sample.out.find("dk/dv keys (sample)"), std::string::npos) << sample.out;
  ::setenv("FLEXTILE_CLI_WRONG_REFERENCE", "1", 1);
  Result wrong = run({"run", "causal", "--host", "--shape", "1,2,200,32", "--backward", "--check"});
  ::unsetenv("FLEXTILE_CLI_WRONG_REFERENCE");
  EXPECT_EQ(wrong.status, 1) << wrong.out << wrong.err;
  EXPECT_NE(wrong.out.find("dk/dv keys (sample): largest error"), std::string::npos) << wrong.out;
  EXPECT_NE(wrong.out.find("FAIL\n  first problem: dq"), std::string::npos) << wrong.out;
  Result stray = run({"run", "causal", "--host", "--shape", "1,2,100,32", "--atomic-dq"});
  EXPECT_EQ(stray.status, 2);
  EXPECT_NE(stray.err.find("--atomic-dq applies to --backward"), std::string::npos) << stray.err;
}

// The check can fail: with a reference that is wrong on purpose (FLEXTILE_CLI_WRONG_REFERENCE), both
// the sample and the whole check report FAIL and exit 1.
TEST(Cli, RunCheckFailsWhenTheResultDisagrees) {
  ::setenv("FLEXTILE_CLI_WRONG_REFERENCE", "1", 1);
  for (const char* check : {"--check", "--check=all"}) {
    Result r = run({"run", "causal", "--host", "--shape", "1,2,300,32", check});
    EXPECT_EQ(r.status, 1) << check << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("FAIL"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("first problem:"), std::string::npos) << r.out;
  }
  ::unsetenv("FLEXTILE_CLI_WRONG_REFERENCE");
}

// The document variant runs on cuts read from a file (what bench/torch_document_cuts.py writes), so
// the CLI and PyTorch can time the same documents; a bad file is a usage error naming the problem.
TEST(Cli, DocumentOffsetsFromAFile) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << text;
    return path;
  };
  const std::string good = write("cuts_good.json", "{\"offsets\": [[0, 5, 33, 70], [0, 69, 70]]}");
  Result r = run({"run", "document", "--host", "--shape", "2,2,70,32", "--check", "--document-offsets", good.c_str()});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("PASS"), std::string::npos) << r.out;

  const std::string notJson = write("cuts_bad.json", "{\"offsets\": [[0, 5,");
  const std::string noKey = write("cuts_nokey.json", "{\"cuts\": [[0, 70]]}");
  const std::string negative = write("cuts_neg.json", "{\"offsets\": [[0, -5, 70]]}");
  const std::vector<std::pair<std::vector<const char*>, std::string>> cases{
      {{"run", "document", "--host", "--shape", "1,1,70,32", "--document-offsets", "/no/such/file"}, "cannot read"},
      {{"run", "document", "--host", "--shape", "1,1,70,32", "--document-offsets", notJson.c_str()}, "is not JSON"},
      {{"run", "document", "--host", "--shape", "1,1,70,32", "--document-offsets", noKey.c_str()}, "\"offsets\""},
      {{"run", "document", "--host", "--shape", "1,1,70,32", "--document-offsets", negative.c_str()}, "non-negative"},
      {{"run", "causal", "--host", "--shape", "1,1,70,32", "--document-offsets", good.c_str()}, "not 'causal'"},
  };
  for (const auto& [args, message] : cases) {
    Result bad = run(args);
    EXPECT_EQ(bad.status, 2) << message << "\n" << bad.err;
    EXPECT_NE(bad.err.find(message), std::string::npos) << bad.err;
  }
  // Lists that do not fit the batch or the length are the variant's error, not a crash.
  Result wrongBatch = run({"run", "document", "--host", "--shape", "3,1,70,32", "--document-offsets", good.c_str()});
  EXPECT_NE(wrongBatch.status, 0);
  EXPECT_NE(wrongBatch.err.find("2 offset lists for a batch of 3"), std::string::npos) << wrongBatch.err;
}

// Regression: `compile` allocated q, k and v (64 MB each at the yardstick shape); it reads shapes
// only, so a shape whose tensors could not exist here compiles.
TEST(Cli, CompileAllocatesNoTensors) {
  Result r = run({"compile", "causal", "--shape", "64,64,131072,128", "--emit", "ptx"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(".entry"), std::string::npos);
}

TEST(Cli, BlockmaskPrintsCountsAndSparsity) {
  Result r = run({"blockmask", "causal", "--shape", "1,1,1000"});
  ASSERT_EQ(r.status, 0) << r.err;
  // 8 x 8 blocks of 128: 8 diagonal partial blocks, 28 full below.
  EXPECT_NE(r.out.find("full blocks 28, partial blocks 8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sparsity"), std::string::npos);
}

TEST(Cli, BenchAndTimingNeedAGpuAndSayWhy) {
  Result r = run({"bench", "--variants", "causal", "--shape", "1,1,128,64"});
  if (r.status == 2) EXPECT_NE(r.err.find("needs a GPU"), std::string::npos) << r.err;
  else EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace flextile
