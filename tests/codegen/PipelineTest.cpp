// Software pipelining (codegen/passes/Pipeline.cpp, codegen/LowerPipeline.cpp)
// on examples::matmul: which loads the pass marks, the cp.async schedule and
// wait counts in the PTX per num_stages, the shared-memory rings and the
// refusal of a ring that does not fit, the interpreter's results unchanged by
// the pass, and ptxas over a grid of (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages).
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cstring>
#include <random>
#include <regex>

#include "codegen/Compiler.h"
#include "codegen/Passes.h"
#include "codegen/Ptxas.h"
#include "codegen/SharedMemory.h"
#include "dsl/Kernel.h"
#include "examples/kernels.h"
#include "ir/Interpreter.h"
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

int count(const std::string& text, const std::string& re) {
  std::regex r(re);
  return int(std::distance(std::sregex_iterator(text.begin(), text.end(), r), std::sregex_iterator()));
}

TEST(Pipeline, MarksBothOperandLoadsAndTheFunctionCarriesNumStages) {
  auto f = tracedMatmul(128, 128, 32, 4, 3);
  EXPECT_EQ(f->intAttrOr("num_stages", 0), 3);
  assignLayouts(*f, Target::sm90a());
  pipelineLoads(*f);
  ir::verify(*f);
  int marked = 0;
  f->walk([&](const ir::Op& op) {
    if (op.kind() == ir::OpKind::Load && op.hasAttr("async_stages")) {
      ++marked;
      EXPECT_EQ(op.intAttr("async_stages"), 3);
    }
  });
  EXPECT_EQ(marked, 2) << ir::printFunction(*f);
  // The rings: 3 slots of 128x32 and of 32x128 bf16, 8 KB each.
  SharedPlan plan = planSharedMemory(*f);
  EXPECT_EQ(plan.totalBytes, 2 * 3 * 8192);
}

TEST(Pipeline, OneStageMarksNothing) {
  auto f = tracedMatmul(64, 64, 32, 4, 1);
  assignLayouts(*f, Target::sm90a());
  pipelineLoads(*f);
  f->walk([&](const ir::Op& op) { EXPECT_FALSE(op.hasAttr("async_stages")) << op.describe(); });
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
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.wait_group \t" + std::to_string(stages - 2) + ";"), 1) << k.ptx;
    EXPECT_EQ(count(k.ptx, "cp\\.async\\.wait_all"), 1);
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
  }
}

// The pass only annotates: the interpreter gives bit-identical results before
// and after it (and after layout assignment), on a ragged problem.
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
  assignLayouts(*f, Target::sm90a());
  pipelineLoads(*f);
  int marked = 0;
  f->walk([&](const ir::Op& op) { marked += op.hasAttr("async_stages"); });
  auto after = run(*f);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size() * 4), 0);
  double sum = 0;
  for (float x : before) sum += std::abs(x);
  EXPECT_GT(sum, 0);
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
}  // namespace flextile::codegen
