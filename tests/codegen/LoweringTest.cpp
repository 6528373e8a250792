// Lowering tests: kernels built with the Builder (tests/codegen/LoweringKernels.h)
// compile to PTX that ptxas assembles for sm_80 and sm_90a, with structural
// checks on the PTX. No GPU here: numerical checks run where one exists.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>

#include "codegen/Compiler.h"
#include "codegen/Exp2Emulation.h"
#include "codegen/LowerToLLVM.h"
#include "codegen/Ptxas.h"
#include "tests/codegen/LoweringKernels.h"
#include "tests/gpu/TestBudget.h"

namespace flextile::codegen {
namespace {

using namespace flextile::testkernels;

const Target kTargets[] = {Target::sm80(), Target::sm90a()};

bool havePtxas() { return findPtxas().has_value(); }

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

// The lowering of a kernel whose layouts the test gave (compile() would
// assign its own): LLVM IR, PTX and the plan's shared memory.
struct Lowered {
  std::string llvmIR, ptx;
  int64_t sharedBytes = 0;
};

// Lowers for sm_80 and sm_90a under the plan of SharedMemory.h and
// AxisInfo.h; assembles with ptxas when present, except in the sanitizer build (ptxas is not
// instrumented, and was most of this file's time there). Returns the sm_90a result.
Lowered compileAndAssemble(const Function& f) {
  Lowered last;
  for (const Target& t : kTargets) {
    LoweringPlan plan = planLowering(f);
    LoweredKernel k = lowerAndEmit(f, t, plan);
    last = {k.llvmIR, k.ptx, plan.sharedBytes};
    EXPECT_NE(k.ptx.find(".target " + t.smName()), std::string::npos) << k.ptx;
    EXPECT_NE(k.ptx.find(".maxntid " + std::to_string(32 * f.numWarps())), std::string::npos);
    if (flextile::testing::assemblesInThisBuild()) {
      PtxasReport r = runPtxas(k.ptx, t);
      EXPECT_GT(r.registers, 0) << r.log;
      EXPECT_EQ(r.spillStoreBytes, 0) << f.name() << " spills on " << t.smName() << ":\n" << r.log;
    }
  }
  return last;
}

#define REQUIRE_PTXAS_NOTE()                                                              \
  do {                                                                                    \
    if (!havePtxas()) std::cerr << "note: ptxas not found; PTX is checked but not assembled\n"; \
  } while (0)

TEST(Lowering, VectorAddWithMask) {
  REQUIRE_PTXAS_NOTE();
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    auto f = vectorAdd(1024, 4, t);
    Lowered k = compileAndAssemble(*f);
    EXPECT_EQ(k.sharedBytes, 0);
    EXPECT_NE(k.ptx.find(".visible .entry vector_add("), std::string::npos);
    // Predicated loads and stores, one per register: n may be odd, so the mask
    // varies element by element.
    EXPECT_GE(count(k.ptx, "ld.global"), 2 * 8) << k.ptx;
    EXPECT_GE(count(k.ptx, "st.global"), 8) << k.ptx;
    EXPECT_NE(k.ptx.find("@%p"), std::string::npos);
    EXPECT_NE(k.ptx.find("%ctaid.x"), std::string::npos);
  }
}

TEST(Lowering, VectorizedAccessesWithAPlan) {
  // A plan that allows 4-wide accesses (what the axis analysis proves for
  // contiguous, aligned rows) gives ld.global.v4 / st.global.v4 for f32 and
  // 8 halves in one v4.b32 for f16.
  for (DType t : {DType::F32, DType::F16}) {
    int64_t vec = t == DType::F32 ? 4 : 8;
    auto f = vectorAdd(2048, 4, t, vec);
    LoweringPlan plan = planLowering(*f);
    f->walk([&](const Op& op) {
      if (op.kind() == OpKind::Load || op.kind() == OpKind::Store) plan.vectorWidth[&op] = int(vec);
    });
    for (const Target& target : kTargets) {
      LoweredKernel k = lowerAndEmit(*f, target, plan);
      EXPECT_EQ(count(k.ptx, "ld.global.v4.b32"), 2 * 2048 / (128 * vec)) << k.ptx;
      EXPECT_EQ(count(k.ptx, "st.global.v4.b32"), 2048 / (128 * vec)) << k.ptx;
      if (havePtxas()) {
        EXPECT_NO_THROW(runPtxas(k.ptx, target));
      }
    }
  }
  // A plan wider than the layout's contiguous registers is cut down to them.
  auto f = vectorAdd(256, 4, DType::F32, 2);
  LoweringPlan plan;
  f->walk([&](const Op& op) {
    if (op.kind() == OpKind::Load) plan.vectorWidth[&op] = 8;
  });
  LoweredKernel k = lowerAndEmit(*f, Target::sm90a(), plan);
  EXPECT_EQ(count(k.ptx, "ld.global.v2.b32"), 2) << k.ptx;
  EXPECT_EQ(count(k.ptx, "ld.global.v4"), 0);
}

TEST(Lowering, FusedRowSoftmaxAcrossWarpCounts) {
  REQUIRE_PTXAS_NOTE();
  for (int warps : {1, 2, 4, 8, 16}) {
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      SCOPED_TRACE("num_warps=" + std::to_string(warps) + " dtype=" + std::string(dtypeName(t)));
      // Lanes along the row (axis 1): the row max and sum use butterflies.
      auto f = rowSoftmax(Layout::defaultBlocked({2 * warps, 128}, warps, 4), t);
      Lowered k = compileAndAssemble(*f);
      EXPECT_GE(count(k.ptx, "shfl.sync.bfly.b32"), 2) << k.ptx;
      EXPECT_NE(k.ptx.find("ex2.approx"), std::string::npos);
      EXPECT_NE(k.ptx.find("div.rn.f32"), std::string::npos) << "f32 division is correctly rounded";
    }
  }
  // Warps along the row as well: partial results meet in shared memory.
  Layout wide = Layout::blocked({4, 512}, {1, 4}, {1, 32}, {1, 4}, {1, 0});
  auto f = rowSoftmax(wide, DType::F32);
  Lowered k = compileAndAssemble(*f);
  EXPECT_EQ(k.sharedBytes, 4 * 4 * 4);  // 4 rows x 4 warp partials x f32
  EXPECT_GE(count(k.ptx, "bar.sync"), 4) << "write/read barriers for each reduction";
  EXPECT_NE(k.ptx.find("st.shared"), std::string::npos);
  EXPECT_NE(k.ptx.find("ld.shared"), std::string::npos);
  EXPECT_GE(count(k.ptx, "shfl.sync.bfly.b32"), 2 * 5);
}

TEST(Lowering, MatmulWithForLoopAndDot) {
  REQUIRE_PTXAS_NOTE();
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    SCOPED_TRACE(std::string(dtypeName(t)));
    auto f = matmul(32, 32, 16, 4, t);
    Lowered k = compileAndAssemble(*f);
    EXPECT_EQ(k.sharedBytes, (32 * 16 + 16 * 32) * byteWidth(t));
    EXPECT_NE(k.ptx.find("fma.rn.f32"), std::string::npos) << k.ptx;
    EXPECT_GE(count(k.ptx, "bar.sync"), 2) << "staging barrier and reuse barrier";
    EXPECT_NE(k.ptx.find("st.shared"), std::string::npos);
    EXPECT_NE(k.ptx.find("ld.shared"), std::string::npos);
    // The K loop over tiles and the k loop of the dot stay loops (backward branches).
    EXPECT_GE(count(k.ptx, "bra"), 2) << k.ptx;
  }
}

TEST(Lowering, ReduceAlongEachAxisWithWarpsAlongIt) {
  REQUIRE_PTXAS_NOTE();
  for (int axis : {0, 1}) {
    for (std::string kind : {"sum", "max", "min"}) {
      for (DType t : {DType::F32, DType::F16, DType::I32}) {
        SCOPED_TRACE("axis " + std::to_string(axis) + " " + kind + " " + std::string(dtypeName(t)));
        // Lanes and warps both split the reduced axis.
        Layout p = axis == 1 ? Layout::blocked({8, 64}, {1, 2}, {4, 8}, {1, 4}, {1, 0})
                             : Layout::blocked({64, 8}, {2, 1}, {8, 4}, {4, 1}, {0, 1});
        auto f = reduceTile(p, axis, kind, t);
        Lowered k = compileAndAssemble(*f);
        // 3 lane bits along the axis on both layouts.
        EXPECT_GE(count(k.ptx, "shfl.sync.bfly.b32"), 3) << k.ptx;
        EXPECT_GE(count(k.ptx, "bar.sync"), 2) << k.ptx;
        EXPECT_EQ(k.sharedBytes, 8 * 4 * byteWidth(t));
      }
    }
  }
  // Lanes only along the axis: no shared memory, no barrier.
  auto f = reduceTile(Layout::blocked({8, 64}, {1, 2}, {1, 32}, {4, 1}, {1, 0}), 1, "sum", DType::F32);
  Lowered k = compileAndAssemble(*f);
  EXPECT_EQ(k.sharedBytes, 0);
  EXPECT_EQ(count(k.ptx, "bar.sync"), 0);
  EXPECT_EQ(count(k.ptx, "shfl.sync.bfly.b32"), 5 * 2);  // 5 lane bits x 2 rows per thread
}

TEST(Lowering, ReduceToScalar) {
  for (int warps : {1, 4, 8}) {
    auto f = reduceToScalar(512, warps, DType::F32);
    Lowered k = compileAndAssemble(*f);
    EXPECT_EQ(count(k.ptx, "shfl.sync.bfly.b32"), 5);
    EXPECT_EQ(k.sharedBytes, warps > 1 ? 4 * warps : 0);
  }
}

TEST(Lowering, ConvertLayoutBetweenBlockedLayouts) {
  REQUIRE_PTXAS_NOTE();
  Layout rowMajor = Layout::blocked({32, 64}, {1, 4}, {2, 16}, {4, 1}, {1, 0});
  Layout colMajor = Layout::blocked({32, 64}, {4, 1}, {8, 4}, {1, 4}, {0, 1});
  for (DType t : {DType::F32, DType::F16, DType::I8, DType::I64}) {
    auto f = convertCopy(rowMajor, colMajor, t);
    Lowered k = compileAndAssemble(*f);
    EXPECT_EQ(k.sharedBytes, 32 * 64 * byteWidth(t));
    EXPECT_EQ(count(k.ptx, "bar.sync"), 2);
    EXPECT_NE(k.ptx.find("st.shared"), std::string::npos);
  }
  // The 64x64 f32 transpose goes through a swizzled tile with vector accesses.
  {
    auto f = convertCopy(Layout::blocked({64, 64}, {1, 4}, {2, 16}, {4, 1}, {1, 0}),
                         Layout::blocked({64, 64}, {4, 1}, {16, 2}, {1, 4}, {0, 1}), DType::F32);
    Lowered k = compileAndAssemble(*f);
    EXPECT_EQ(k.sharedBytes, 64 * 64 * 4);
    EXPECT_EQ(count(k.ptx, "bar.sync"), 2);
    EXPECT_TRUE(k.ptx.find("st.shared.v4") != std::string::npos || k.ptx.find("st.shared.v2") != std::string::npos ||
                k.ptx.find("ld.shared.v4") != std::string::npos || k.ptx.find("ld.shared.v2") != std::string::npos)
        << k.ptx;
  }
  // Same layout: a renaming of registers, no shared-memory traffic.
  auto same = convertCopy(rowMajor, rowMajor, DType::F32);
  Lowered k = compileAndAssemble(*same);
  EXPECT_EQ(count(k.ptx, "bar.sync"), 0);
  EXPECT_EQ(count(k.ptx, "st.shared"), 0);
}

TEST(Lowering, EveryElementwiseOpAndCast) {
  REQUIRE_PTXAS_NOTE();
  const DType floats[] = {DType::F16, DType::BF16, DType::F32};
  const DType ints[] = {DType::I8, DType::I32, DType::I64};
  struct Expect {
    OpKind kind;
    const char* ptx;
  };
  const Expect expectations[] = {{OpKind::Exp2, "ex2.approx.ftz.f32"}, {OpKind::Exp, "ex2.approx.ftz.f32"},
                                 {OpKind::Log2, "lg2.approx"}, {OpKind::Log, "lg2.approx"},
                                 {OpKind::Tanh, "tanh.approx.f32"}, {OpKind::Rsqrt, "rsqrt.approx"},
                                 {OpKind::Sqrt, "sqrt.rn"}};
  int compiled = 0;
#define FT_OP(Enum, name, nops, nres, traits)                                                       \
  if ((traits) & kElementwise && OpKind::Enum != OpKind::Cast && OpKind::Enum != OpKind::AddPtr) {   \
    for (int family = 0; family < 2; ++family) {                                                    \
      if (family == 0 && ((traits) & kIntOnly)) continue;                                           \
      if (family == 1 && ((traits) & kFloatOnly)) continue;                                         \
      for (DType t : family == 0 ? std::vector<DType>(std::begin(floats), std::end(floats))          \
                                 : std::vector<DType>(std::begin(ints), std::end(ints))) {          \
        if (OpKind::Enum == OpKind::Not && family == 0) continue;                                   \
        SCOPED_TRACE(std::string(name) + " " + std::string(dtypeName(t)));                         \
        auto f = elementwise(OpKind::Enum, t, t, 256, 4);                                           \
        Lowered k = compileAndAssemble(*f);                                                  \
        ++compiled;                                                                                 \
        for (const Expect& e : expectations)                                                        \
          if (e.kind == OpKind::Enum) {                                                             \
            EXPECT_NE(k.ptx.find(e.ptx), std::string::npos) << k.ptx;                               \
          }                                                                                         \
      }                                                                                             \
    }                                                                                               \
  }
#include "ir/Ops.def"
  EXPECT_GT(compiled, 40);

  const DType all[] = {DType::I1, DType::I8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64};
  for (DType from : all)
    for (DType to : all) {
      if (from == to) continue;
      SCOPED_TRACE("cast " + std::string(dtypeName(from)) + " -> " + std::string(dtypeName(to)));
      auto f = elementwise(OpKind::Cast, from, to, 128, 2);
      compileAndAssemble(*f);
    }
}

// Walks the arithmetic ops of the table (FT_ARITHMETIC_OP in ir/Ops.def) over
// every dtype: the lowering takes each op on each dtype its traits allow, and
// refuses the others with an error naming the op. exp, exp2, log, log2 and
// tanh have no f64 form (approximate f32 instructions only).
TEST(Lowering, EveryArithmeticOpOfTheTableOnEveryDType) {
  const DType all[] = {DType::I1, DType::I8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64};
  const OpKind approximateOnly[] = {OpKind::Exp, OpKind::Exp2, OpKind::Log, OpKind::Log2, OpKind::Tanh};
  int accepted = 0, refused = 0;
  auto check = [&](OpKind k, uint32_t traits) {
    for (DType t : all) {
      SCOPED_TRACE(std::string(opName(k)) + " " + std::string(dtypeName(t)));
      bool allowed = !((traits & ir::kIntOnly) && !ir::isInteger(t)) && !((traits & ir::kFloatOnly) && !ir::isFloat(t));
      if (t == DType::F64 && std::find(std::begin(approximateOnly), std::end(approximateOnly), k) != std::end(approximateOnly))
        allowed = false;
      auto f = elementwise(k, t, t, 128, 4);
      if (allowed) {
        EXPECT_NO_THROW(compile(*f));
        ++accepted;
        continue;
      }
      try {
        compile(*f);
        ADD_FAILURE() << "compiled an op its traits do not allow";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'" + std::string(opName(k)) + "'"), std::string::npos) << e.what();
      }
      ++refused;
    }
  };
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) check(OpKind::Enum, uint32_t((traits) | ir::kArithmetic));
#include "ir/Ops.def"
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 30);
}

TEST(Lowering, F64TranscendentalsAreRejected) {
  auto f = elementwise(OpKind::Exp2, DType::F64, DType::F64, 128, 4);
  try {
    compile(*f);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op 'exp2'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("f64"), std::string::npos) << e.what();
  }
}

TEST(Lowering, MissingOrMismatchedLayoutsAreErrors) {
  auto f = vectorAdd(256, 4, DType::F32);
  // Drop one layout: compile names the op.
  f->walk([&](Op& op) {
    if (op.kind() == OpKind::Add && op.result()->type().isTile())
      op.result()->setType(op.result()->type().withLayout(nullptr));
  });
  try {
    lowerAndEmit(*f, Target::sm90a(), LoweringPlan{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op 'add'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no layout"), std::string::npos) << e.what();
  }
  // Element-wise operands in different layouts.
  auto g = vectorAdd(256, 4, DType::F32);
  g->walk([&](Op& op) {
    if (op.kind() == OpKind::Add && op.result()->type().isTile())
      lay(op.result(), Layout::defaultBlocked({256}, 4, 1));
  });
  try {
    lowerAndEmit(*g, Target::sm90a(), LoweringPlan{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differs from the result layout"), std::string::npos) << e.what();
  }
  // A layout for the wrong number of warps.
  auto h = vectorAdd(256, 4, DType::F32);
  h->attrs()["num_warps"] = int64_t(8);
  EXPECT_THROW(lowerAndEmit(*h, Target::sm90a(), LoweringPlan{}), Error);
}

TEST(Ptxas, ReportsFailuresWithARepro) {
  if (!havePtxas()) GTEST_SKIP() << "ptxas not found on PATH or in /usr/local/cuda/bin";
  const std::string bad = ".version 8.0\n.target sm_90a\n.address_size 64\n.visible .entry k() { bogus; }\n";
  try {
    runPtxas(bad, Target::sm90a());
    FAIL() << "expected ptxas to fail";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("repro:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("-arch=sm_90a"), std::string::npos) << msg;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(msg, m, std::regex("'([^']+kernel\\.ptx)'"))) << msg;
    EXPECT_TRUE(std::filesystem::exists(m[1].str())) << "the repro PTX is kept";
    std::filesystem::remove_all(std::filesystem::path(m[1].str()).parent_path());
  }
}

TEST(Ptxas, ParsesVerboseOutput) {
  PtxasReport r = parsePtxasLog(
      "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
      "ptxas info    : Function properties for k\n"
      "    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
      "ptxas info    : Used 42 registers, used 1 barriers, 256 bytes smem, 380 bytes cmem[0]\n");
  EXPECT_EQ(r.registers, 42);
  EXPECT_EQ(r.spillStoreBytes, 8);
  EXPECT_EQ(r.spillLoadBytes, 12);
  EXPECT_EQ(r.stackBytes, 24);
  EXPECT_EQ(r.staticSharedBytes, 256);
}

// Drops every layout: the IR the DSL produces, for compile() end to end.
void stripLayouts(Function& f) {
  auto strip = [](Value* v) { v->setType(v->type().withLayout(nullptr)); };
  for (Value* p : f.params()) strip(p);
  f.walk([&](Op& op) {
    for (Value* r : op.results()) strip(r);
    for (auto& region : op.regions())
      for (Value* a : region->args()) strip(a);
  });
}

TEST(Compile, EndToEndWithLayoutAssignment) {
  std::vector<std::unique_ptr<Function>> kernels;
  kernels.push_back(vectorAdd(1024, 4, DType::F32));
  kernels.push_back(rowSoftmax(Layout::defaultBlocked({4, 256}, 4, 4), DType::BF16));
  kernels.push_back(matmul(64, 64, 32, 4, DType::F16));
  kernels.push_back(reduceTile(Layout::defaultBlocked({32, 64}, 8), 0, "max", DType::F32));
  kernels.push_back(reduceToScalar(1024, 8, DType::F32));
  for (auto& f : kernels) {
    SCOPED_TRACE(f->name());
    stripLayouts(*f);
    for (const Target& t : kTargets) {
      CompileOptions o;
      o.target = t;
      o.runPtxas = havePtxas();
      CompiledKernel k = compile(*f, o);
      EXPECT_EQ(k.name, f->name());
      EXPECT_EQ(k.params.size(), f->params().size());
      EXPECT_NE(k.ir.find("#ft.linear"), std::string::npos) << "the IR text carries the assigned layouts";
      EXPECT_NE(k.llvmIR.find("ptx_kernel"), std::string::npos);
      if (o.runPtxas) {
        EXPECT_EQ(parsePtxasLog(k.ptxasInfo).spillStoreBytes, 0) << k.ptxasInfo;
      }
    }
  }
  // Given aligned pointers and n divisible by 16, the axis analysis allows
  // 4-wide f32 accesses even under the mask.
  auto f = vectorAdd(1024, 4, DType::F32);
  stripLayouts(*f);
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 16};
  CompiledKernel k = compile(*f);
  EXPECT_GE(count(k.ptx, "ld.global.v4.b32"), 2) << k.ptx;
  EXPECT_GE(count(k.ptx, "st.global.v4.b32"), 1) << k.ptx;
}

TEST(Compile, RejectsUnknownTargetsAndReportsTime) {
  auto f = vectorAdd(128, 4, DType::F32);
  CompileOptions o;
  o.target = Target{61, false};
  EXPECT_THROW(compile(*f, o), Error);
  CompiledKernel k = compile(*f);
  EXPECT_GT(k.compileMs, 0);
  EXPECT_EQ(k.numWarps, 4);
  EXPECT_EQ(k.target, Target::sm90a());
}


// exp2 off the SFU (codegen/Exp2Emulation.h): the host mirror of the lowered sequence within
// exp2 is ex2.approx.ftz.f32: the non-ftz form makes ptxas wrap every MUFU.EX2 in a compare and
// two predicated multiplies (the forward's cubin is 6 KB larger with it). FLEXTILE_EXP2_FTZ=0
// gives that form back, for measurement.
TEST(Lowering, Exp2FlushesSubnormalsUnlessAskedNotTo) {
  auto f = elementwise(OpKind::Exp2, DType::F32, DType::F32, 256, 4);
  EXPECT_GT(count(compileAndAssemble(*f).ptx, "ex2.approx.ftz.f32"), 0);
  ::setenv("FLEXTILE_EXP2_FTZ", "0", 1);
  const std::string ptx = compileAndAssemble(*f).ptx;
  ::unsetenv("FLEXTILE_EXP2_FTZ");
  EXPECT_EQ(count(ptx, "ex2.approx.ftz"), 0) << ptx;
  EXPECT_GT(count(ptx, "ex2.approx.f32"), 0) << ptx;
}

// 3e-6 of exp2 over every f32 the softmax feeds it (a sweep of [-130, 130] and the f32 bit
// patterns around the integers), exact at the ends: -inf and anything at or below -127 give 0,
// 0 gives 1, 128 and above inf, NaN NaN. The lowering emits the sequence for every N-th register
// of an exp2 tile (FLEXTILE_EXP2_EMULATION=N) and ex2.approx for the rest.
TEST(Lowering, Exp2OffTheSfuStaysWithinItsBound) {
  double worst = 0;
  auto check = [&](float x) {
    const double want = std::exp2(double(x)), got = double(exp2Emulated(x));
    if (want < 1e-37 || want > 1e38) return;  // the ends, checked below (f32 denormals flush)
    worst = std::max(worst, std::abs(got - want) / want);
  };
  for (int i = -1300000; i <= 1300000; ++i) check(float(i) * 1e-4f);
  for (int j = -126; j <= 127; ++j)
    for (float d : {-0.5f, -1e-6f, 0.0f, 1e-6f, 0.5f}) check(std::nextafter(float(j) + d, 0.0f));
  EXPECT_LT(worst, 3e-6);
  EXPECT_EQ(exp2Emulated(-INFINITY), 0.0f);
  EXPECT_EQ(exp2Emulated(-127.0f), 0.0f);
  EXPECT_EQ(exp2Emulated(-1000.0f), 0.0f);
  EXPECT_EQ(exp2Emulated(0.0f), 1.0f);
  EXPECT_EQ(exp2Emulated(1.0f), 2.0f);
  EXPECT_EQ(exp2Emulated(128.0f), INFINITY);
  EXPECT_EQ(exp2Emulated(1000.0f), INFINITY);
  EXPECT_TRUE(std::isnan(exp2Emulated(NAN)));

  auto f = elementwise(OpKind::Exp2, DType::F32, DType::F32, 256, 4);
  for (const char* period : {"2", "0"}) {
    ::setenv("FLEXTILE_EXP2_EMULATION", period, 1);
    const std::string ptx = compileAndAssemble(*f).ptx;
    ::unsetenv("FLEXTILE_EXP2_EMULATION");
    const bool on = period[0] == '2';
    EXPECT_EQ(count(ptx, "0f4B400000") > 0, on) << ptx;  // the rounding constant
    EXPECT_GT(count(ptx, "ex2.approx"), 0) << "the other registers keep the SFU";
    if (on) EXPECT_GT(count(ptx, "max.NaN.f32"), 0) << "the clamp keeps NaN";
  }
}

}  // namespace
}  // namespace flextile::codegen
