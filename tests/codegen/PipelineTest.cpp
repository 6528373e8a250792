// Software pipelining (codegen/passes/Pipeline.cpp, codegen/LowerAsync.cpp)
// on examples::matmul: which loads the pass turns into rings and the schedule
// it writes in the async level of the IR, the cp.async schedule and wait
// counts in the PTX per num_stages, the shared-memory rings and the refusal of
// a ring that does not fit, the interpreter's results unchanged by the pass
// (the interpreter runs the async ops), and ptxas over a grid of (BLOCK_M,
// BLOCK_N, BLOCK_K, warps, stages). tests/lit/codegen/pipeline.ftir has the
// pass's output as a golden file.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cstring>
#include <random>

#include "tests/TextCount.h"
#include "codegen/Compiler.h"
#include "codegen/LowerToLLVM.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "codegen/passes/LoopValues.h"
#include "dsl/Kernel.h"
#include "examples/kernels.h"
#include "ir/Interpreter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::codegen {
namespace {

using ir::DType;

std::unique_ptr<ir::Function> tracedMatmul(int bm, int bn, int bk, int warps, int stages) {
  dsl::Kernel mm = examples::matmul<dsl::bf16>();
  auto f = mm.trace({.constants = {bm, bn, bk}, .num_warps = warps, .num_stages = stages});
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16, 16, 16};
  return f;
}

using flextile::testing::count;

int countOps(const ir::Function& f, ir::OpKind kind) {
  int n = 0;
  f.walk([&](const ir::Op& op) { n += op.kind() == kind; });
  return n;
}

TEST(Pipeline, BothOperandLoadsBecomeRingsInTheAsyncLevel) {
  auto f = tracedMatmul(128, 128, 32, 4, 3);
  EXPECT_EQ(f->intAttrOr("num_stages", 0), 3);
  assignLayouts(*f, Target::sm90a());
  const int tileLoads = [&] {
    int n = 0;
    f->walk([&](const ir::Op& op) { n += op.kind() == ir::OpKind::Load && op.result()->type().isTile(); });
    return n;
  }();
  pipelineLoads(*f, Target::sm90a());
  ir::verify(*f);
  const std::string text = ir::printFunction(*f);
  // Two rings of 3 slots; the prologue's 2 stages and the loop's issue copy into both; the
  // loop reads each once; waits for 1 pending group in the loop and for none after it.
  EXPECT_EQ(countOps(*f, ir::OpKind::LocalAlloc), 2) << text;
  EXPECT_EQ(count(text, "local_alloc : smem<3 x bf16\\[128,32\\]"), 1) << text;
  EXPECT_EQ(count(text, "local_alloc : smem<3 x bf16\\[32,128\\]"), 1) << text;
  EXPECT_EQ(countOps(*f, ir::OpKind::AsyncCopy), 2 * 3);
  EXPECT_EQ(countOps(*f, ir::OpKind::AsyncCommit), 3);
  EXPECT_EQ(countOps(*f, ir::OpKind::LocalLoad), 2);
  EXPECT_EQ(count(text, "async_wait \\{pending = 1\\}"), 1) << text;
  EXPECT_EQ(count(text, "async_wait \\{pending = 0\\}"), 1) << text;
  EXPECT_EQ(countOps(*f, ir::OpKind::Barrier), 2);
  EXPECT_EQ(countOps(*f, ir::OpKind::FenceAsyncShared), 0);  // mma.sync: ldmatrix reads the rings
  // The two tile loads are gone (what is left loads nothing, or something else).
  int left = 0;
  f->walk([&](const ir::Op& op) { left += op.kind() == ir::OpKind::Load && op.result()->type().isTile(); });
  EXPECT_EQ(left, tileLoads - 2) << text;
  // The rings: 3 slots of 128x32 and of 32x128 bf16, 8 KB each.
  SharedPlan plan = planSharedMemory(*f);
  EXPECT_EQ(plan.totalBytes, 2 * 3 * 8192);
}

// The schedule is all in the IR: printed and parsed back, it lowers to the same PTX (the
// lowering has no state of its own about rings), on mma.sync and on wgmma (the slot read by
// the dot through a descriptor, with the proxy fence after the copies land).
TEST(Pipeline, TheScheduleLowersTheSameAfterPrintingAndParsing) {
  for (auto [target, bn] : {std::pair{Target::sm80(), 128}, std::pair{Target::sm90a(), 16}}) {
    SCOPED_TRACE(target.smName());
    auto f = tracedMatmul(128, bn, 32, 8, 3);
    assignLayouts(*f, target);
    pipelineLoads(*f, target);
    ir::verify(*f);
    const std::string text = ir::printFunction(*f);
    auto g = ir::parseFunction(text);
    ir::verify(*g);
    EXPECT_EQ(ir::printFunction(*g), text);
    const std::string direct = lowerAndEmit(*f, target, planLowering(*f)).ptx;
    const std::string parsed = lowerAndEmit(*g, target, planLowering(*g)).ptx;
    EXPECT_EQ(direct, parsed);
    EXPECT_EQ(count(text, "fence_async_shared"), target.has(Feature::Wgmma) ? 1 : 0) << text;
    EXPECT_EQ(count(direct, "wgmma\\.mma_async"), target.has(Feature::Wgmma) ? 2 : 0);
    EXPECT_GT(count(direct, "cp\\.async\\.cg"), 0);
  }
}

// The trip bound the pipeline reads off a loop's bounds (codegen/passes/LoopValues.h
// staticTripBound): lb + d, constants, minimum with one bounded side, a select of two bounded
// sides, a step that divides the distance; none where the bounds prove nothing.
TEST(Pipeline, StaticTripBoundsComeFromTheBoundsOps) {
  const char* text = R"(
func @trips(%n: i32, %lo: i32) {
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c2 = constant {value = 2} : i32
  %c5 = constant {value = 5} : i32
  %lo1 = add %lo, %c1 : i32
  %lo5 = add %c5, %lo : i32
  %m = minimum %n, %lo1 : i32
  %mc = minimum %n, %c1 : i32
  %gt = cmp %n, %lo {pred = "gt"} : i1
  %s = select %gt, %lo1, %lo : i32
  %s2 = select %gt, %lo5, %n : i32
  for %lo, %m, %c1 {
  ^bb(%i0: i32):
    yield
  }
  for %c0, %mc, %c1 {
  ^bb(%i1: i32):
    yield
  }
  for %lo, %s, %c1 {
  ^bb(%i2: i32):
    yield
  }
  for %lo, %lo5, %c2 {
  ^bb(%i3: i32):
    yield
  }
  for %lo, %lo, %c1 {
  ^bb(%i4: i32):
    yield
  }
  for %lo, %n, %c1 {
  ^bb(%i5: i32):
    yield
  }
  for %lo, %s2, %c1 {
  ^bb(%i6: i32):
    yield
  }
  for %lo, %lo1, %n {
  ^bb(%i7: i32):
    yield
  }
  return
}
)";
  auto f = ir::parseFunction(text);
  ir::verify(*f);
  std::vector<std::optional<int64_t>> bounds;
  for (const auto& op : f->body().ops())
    if (op->kind() == ir::OpKind::For) bounds.push_back(staticTripBound(*op));
  const std::vector<std::optional<int64_t>> expected = {1, 1, 1, 3, 0, std::nullopt, std::nullopt, std::nullopt};
  EXPECT_EQ(bounds, expected);
}

TEST(Pipeline, OneStageMakesNoRing) {
  auto f = tracedMatmul(64, 64, 32, 4, 1);
  assignLayouts(*f, Target::sm90a());
  pipelineLoads(*f, Target::sm90a());
  EXPECT_EQ(countOps(*f, ir::OpKind::LocalAlloc), 0);
  EXPECT_EQ(countOps(*f, ir::OpKind::AsyncCopy), 0);
}

TEST(Pipeline, PtxHasCpAsyncCommitGroupsAndTheWaitCountPerStage) {
  for (int stages = 1; stages <= 4; ++stages) {
    SCOPED_TRACE("stages " + std::to_string(stages));
    auto k = compile(*tracedMatmul(128, 128, 32, 8, stages), CompileOptions{Target::sm90a(), false});
    if (stages == 1) {
      EXPECT_EQ(count(k.ptx, "cp\\.async"), 0);
      continue;
    }
    // 16-byte copies (rows of 32 or 128 bf16, 16-byte aligned).
    EXPECT_GT(count(k.ptx, "cp\\.async\\.cg\\.shared\\.global \\[[^\\]]+\\], \\[[^\\]]+\\], 16, %r"), 0);
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.ca"), 0);
    // Prologue: stages-1 commits; the loop: one (the body is one block after O3, or a few).
    EXPECT_GE(count(k.ptx, "cp\\.async\\.commit_group"), stages);
    // One wait in the loop for S-2 pending groups, one for none after it.
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.wait_group \t" + std::to_string(stages - 2) + ";"), stages == 2 ? 2 : 1) << k.ptx;
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.wait_group \t0;"), stages == 2 ? 2 : 1) << k.ptx;
    EXPECT_GT(count(k.ptx, "ldmatrix"), 0);
    EXPECT_EQ(k.sharedBytes, stages * 2 * 8192);
  }
}

// sm_90a with every warp on 16 rows of M (128 x 16 tiles, 8 warps): B is the
// pipelined ring slot, read by wgmma through a descriptor (MN-major: B [K, N]
// is stored N-contiguous), A from registers; no ldmatrix for B, a proxy fence
// after the copies land. sm_80 and FLEXTILE_WGMMA=0 keep mma.sync.
TEST(Pipeline, HopperReadsTheRingSlotWithWgmma) {
  auto k = compile(*tracedMatmul(128, 16, 32, 8, 3), CompileOptions{Target::sm90a(), false});
  EXPECT_EQ(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n16k16\\.f32\\.bf16\\.bf16"), 2) << k.ptx;
  EXPECT_EQ(count(k.ptx, "p, 1, 1, 1;"), 2);  // imm-trans-b: MN-major
  EXPECT_EQ(count(k.ptx, "wgmma\\.wait_group\\.sync\\.aligned 0"), 1);
  EXPECT_EQ(count(k.ptx, "fence\\.proxy\\.async\\.shared::cta"), 1);
  EXPECT_EQ(count(k.ptx, "mma\\.sync"), 0);
  EXPECT_EQ(count(k.ptx, "\\.align 1024 \\.b8 global_smem"), 1);
  auto old = compile(*tracedMatmul(128, 16, 32, 8, 3), CompileOptions{Target::sm80(), false});
  EXPECT_EQ(count(old.ptx, "wgmma"), 0);
  EXPECT_GT(count(old.ptx, "mma\\.sync"), 0);
  ::setenv("FLEXTILE_WGMMA", "0", 1);
  auto off = compile(*tracedMatmul(128, 16, 32, 8, 3), CompileOptions{Target::sm90a(), false});
  ::unsetenv("FLEXTILE_WGMMA");
  EXPECT_EQ(count(off.ptx, "wgmma"), 0);
  EXPECT_GT(count(off.ptx, "mma\\.sync"), 0);
  if (findPtxas()) {
    for (const auto* code : {&k, &off}) {
      PtxasReport r = runPtxas(code->ptx, Target::sm90a());  // throws on an assembly error
      EXPECT_EQ(r.spillStoreBytes, 0) << r.log;
    }
  }
}

TEST(Pipeline, RefusesARingThatDoesNotFitNamingTheNeedAndTheLimit) {
  auto f = tracedMatmul(256, 256, 128, 8, 4);  // 4 * (64 + 64) KB
  try {
    compile(*f, CompileOptions{Target::sm80(), false});
    FAIL() << "compiled a kernel needing 512 KB of shared memory";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("shared memory"), std::string::npos) << m;
    EXPECT_NE(m.find("524288"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(163 * 1024)), std::string::npos) << m;
    EXPECT_NE(m.find("pipeline stages"), std::string::npos) << m;
    // Both rings are named, the larger first (A's and B's are equal: 4 x 256 x 128 x 2 bytes each), so
    // the message says where all of the bytes go, not only where the largest buffer is.
    EXPECT_NE(m.find("the largest user is op 'local_alloc'"), std::string::npos) << m;
    EXPECT_NE(m.find("with 262144 bytes (4 pipeline stages: lower num_stages or the tile sizes); then op "
                     "'local_alloc'"),
              std::string::npos)
        << m;
    EXPECT_EQ(flextile::testing::count(m, "lower num_stages"), 1) << "the advice once: " << m;
    EXPECT_EQ(flextile::testing::count(m, "with 262144 bytes"), 2) << m;
  }
}

// The rings compute what the loads did: the interpreter (running the async ops
// in order) gives bit-identical results before and after the pass (and after
// layout assignment), on a ragged problem whose last stages copy nothing.
TEST(Pipeline, InterpreterResultsAreUnchangedByThePass) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  const int M = 70, N = 40, K = 100;
  std::vector<Eigen::bfloat16> a(size_t(M) * K), b(size_t(K) * N);
  for (auto& x : a) x = Eigen::bfloat16(dist(rng));
  for (auto& x : b) x = Eigen::bfloat16(dist(rng));
  auto run = [&](const ir::Function& f) {
    std::vector<float> c(size_t(M) * N, -1.0f);
    ir::interpret(f,
                  {ir::InterpArg::buffer(a.data(), a.size() * 2), ir::InterpArg::buffer(b.data(), b.size() * 2),
                   ir::InterpArg::buffer(c.data(), c.size() * 4), ir::InterpArg::integer(M), ir::InterpArg::integer(N),
                   ir::InterpArg::integer(K)},
                  {(M + 31) / 32, (N + 31) / 32, 1});
    return c;
  };
  auto f = tracedMatmul(32, 32, 16, 4, 3);
  f->attrs().erase("arg_divisibility");  // the interpreter checks real arguments; these host buffers are not aligned
  auto before = run(*f);
  // The pass needs the 16-element divisibility to copy whole vectors; the copies the
  // interpreter runs read element by element, so the host buffers need not be aligned.
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16, 16, 16};
  assignLayouts(*f, Target::sm90a());
  pipelineLoads(*f, Target::sm90a());
  f->attrs().erase("arg_divisibility");
  ASSERT_EQ(countOps(*f, ir::OpKind::LocalAlloc), 2) << ir::printFunction(*f);
  auto after = run(*f);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * 4), 0);
  double sum = 0;
  for (float x : before) sum += std::abs(x);
  EXPECT_GT(sum, 0);
}

// A DSL launch asks for TMA and a producer warpgroup (LaunchOptions::tma, warp_specialize): the
// matmul example names its tiles as boxes, so on sm_90a its rings are filled by TMA, and with
// warp_specialize by a producer warpgroup (setmaxnreg); sm_80 keeps cp.async. After the tile
// passes, the interpreter still computes the float64 product (ragged M, N, K; the boxes' last
// rows and columns zero-filled).
TEST(Pipeline, MatmulLaunchOptionsAskForTmaAndAProducer) {
  dsl::Kernel mm = examples::matmul<dsl::bf16>();
  auto traced = [&](bool tma, bool ws) {
    auto f = mm.trace({.constants = {128, 128, 64}, .num_warps = 8, .num_stages = 3, .tma = tma, .warp_specialize = ws});
    f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16, 16, 16};
    return f;
  };
  for (auto [tma, ws] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
    SCOPED_TRACE(std::string(tma ? "tma" : "cp.async") + (ws ? ", warp-specialized" : ""));
    const CompiledKernel k = compile(*traced(tma, ws), CompileOptions{Target::sm90a(), codegen::findPtxas().has_value()});
    EXPECT_EQ(count(k.ir, "tma_copy") > 0, tma);
    EXPECT_EQ(k.tensorMaps.size(), tma ? 2u : 0u);
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.bulk\\.tensor\\.2d") > 0, tma);
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.cg") > 0, !tma);
    EXPECT_EQ(k.producerWarps, ws ? 4 : 0);
    EXPECT_EQ(count(k.ptx, "setmaxnreg") > 0, ws);
    // 16 rows a warp: the warps lie along M and the product runs on wgmma (B from the ring slot).
    EXPECT_GT(count(k.ptx, "wgmma\\.mma_async\\.sync\\.aligned\\.m64n128k16"), 0);
    EXPECT_EQ(count(k.ptx, "mma\\.sync\\.aligned"), 0);
    const CompiledKernel old = compile(*traced(tma, ws), CompileOptions{Target::sm80(), false});
    EXPECT_EQ(count(old.ptx, "cp\\.async\\.bulk"), 0);
    EXPECT_GT(count(old.ptx, "mma\\.sync\\.aligned\\.m16n8k16"), 0);
    EXPECT_EQ(old.producerWarps, 0);
  }

  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  const int M = 200, N = 136, K = 328;  // rows of 16-byte multiples, as TMA needs; no dim a multiple of the tile
  std::vector<Eigen::bfloat16> a(size_t(M) * K), b(size_t(K) * N);
  for (auto& x : a) x = Eigen::bfloat16(dist(rng));
  for (auto& x : b) x = Eigen::bfloat16(dist(rng));
  std::vector<float> c(size_t(M) * N, NAN);
  ::setenv("FLEXTILE_INTERPRET_AFTER_PASSES", "sm_90a", 1);
  mm.interpret({{2, 2, 1}, {128, 128, 64}, 8, 3, true, true}, a, b, c, M, N, K);
  ::unsetenv("FLEXTILE_INTERPRET_AFTER_PASSES");
  double worst = 0, scale = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double want = 0;
      for (int l = 0; l < K; ++l) want += double(float(a[size_t(i) * K + l])) * double(float(b[size_t(l) * N + j]));
      worst = std::max(worst, std::abs(double(c[size_t(i) * N + j]) - want));
      scale = std::max(scale, std::abs(want));
    }
  EXPECT_LT(worst, 1e-4 * scale) << "worst |error| " << worst << " of products up to " << scale;
}

TEST(Pipeline, PtxasAssemblesAGridOfStagesAndTiles) {
  std::string spills;
  int configs = 0;
  for (const Target& t : {Target::sm80(), Target::sm90a()})
    for (auto [bm, bn, bk, warps] : std::vector<std::array<int, 4>>{
             {64, 64, 32, 4}, {128, 128, 32, 4}, {128, 128, 32, 8}, {128, 256, 32, 8}, {256, 128, 32, 8},
             {128, 128, 64, 8}, {64, 128, 16, 2}})
      for (int stages = 1; stages <= 4; ++stages) {
        if ((bm + bn) * bk * 2 * stages > t.maxSharedBytesPerBlock()) continue;
        if ((bm * bn / 64 + stages + (t == Target::sm80())) % 2 && !(bm == 128 && bn == 128 && bk == 32)) continue;
        SCOPED_TRACE(t.smName() + " " + std::to_string(bm) + "x" + std::to_string(bn) + "x" + std::to_string(bk) +
                     " w" + std::to_string(warps) + " s" + std::to_string(stages));
        CompiledKernel k;
        ASSERT_NO_THROW(k = compile(*tracedMatmul(bm, bn, bk, warps, stages), CompileOptions{t, true}));
        PtxasReport r = parsePtxasLog(k.ptxasInfo);
        ++configs;
        std::printf("%s %dx%dx%d w%d s%d: %d registers, spills %d/%d B, smem %d B\n", t.smName().c_str(), bm, bn, bk,
                    warps, stages, r.registers, r.spillStoreBytes, r.spillLoadBytes, k.sharedBytes);
        if (r.spillStoreBytes || r.spillLoadBytes) spills += "  spills: " + t.smName() + "\n";
      }
  std::printf("ptxas assembled %d pipelined configs\n%s", configs, spills.c_str());
  EXPECT_GT(configs, 10);
}

}  // namespace

// How a warp-specialized program shares the register file (codegen/LowerToLLVM.h registerSplit):
// the launch cap of 65536 registers over the program's threads, and the producer's registers above
// 24 moved to the consumers.
TEST(WarpSpecialize, RegisterSplitMovesTheProducersRegistersToTheConsumers) {
  const RegisterSplit two = registerSplit(8, 4, 1);  // 384 threads, one program per SM
  EXPECT_EQ(two.launch, 168);
  EXPECT_EQ(two.producer, 24);
  EXPECT_EQ(two.consumer, 240);
  EXPECT_LE(128 * two.producer + 256 * two.consumer, 384 * two.launch);
  const RegisterSplit one = registerSplit(4, 4, 2);  // 256 threads, two programs per SM
  EXPECT_EQ(one.launch, 128);
  EXPECT_EQ(one.consumer, 232);
  EXPECT_LE(128 * one.producer + 128 * one.consumer, 256 * one.launch);
  EXPECT_EQ(registerSplit(4, 4, 1).launch, 0);  // 255 registers each already: nothing to move
  // A producer that keeps 32 (the peeled skewed walks): the consumers get 8 fewer.
  const RegisterSplit kept = registerSplit(8, 4, 1, 32);
  EXPECT_EQ(kept.producer, 32);
  EXPECT_EQ(kept.consumer, 232);
  EXPECT_LE(128 * kept.producer + 256 * kept.consumer, 384 * kept.launch);
  for (int bad : {16, 30, 168, 200}) {
    try {
      registerSplit(8, 4, 1, bad);
      ADD_FAILURE() << bad << " producer registers accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("producer_registers must be a multiple of 8 from 24 to below the launch's 168"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("got " + std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}


// Why the warp-specialize pass leaves a function as it is: a target without TMA and setmaxnreg, a
// warp count other than 4 or 8, no TMA copy (a cp.async ring).
TEST(WarpSpecialize, TheRefusalsSayWhy) {
  auto f = tracedMatmul(64, 64, 32, 4, 2);
  runTilePasses(*f, Target::sm90a());
  EXPECT_EQ(warpSpecializeRefusal(*f, Target::sm90a()), "it issues no TMA copy");
  EXPECT_EQ(producerWarps(*f), 0);
  EXPECT_NE(warpSpecializeRefusal(*f, Target::sm80()).find("sm_80 has no TMA or no setmaxnreg"), std::string::npos);
  auto two = tracedMatmul(32, 64, 32, 2, 2);
  runTilePasses(*two, Target::sm90a());
  EXPECT_NE(warpSpecializeRefusal(*two, Target::sm90a()).find("it has 2 warps"), std::string::npos);
}

}  // namespace flextile::codegen
