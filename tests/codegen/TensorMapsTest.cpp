#include <gtest/gtest.h>

#include "codegen/Compiler.h"
#include "codegen/TensorMaps.h"
#include "ir/Parser.h"
#include "tests/ThrownMessage.h"

namespace flextile::codegen {
namespace {

// Two copies of one [rows, 128] bf16 tensor (one map) and one of a 4-D tensor with a constant
// dim (a second map), into 128-byte-swizzled wgmma slots of two 64-column panels.
const char* kCopies = R"(
func @copies(%x: ptr<bf16>, %rows: i32, %stride: i32, %y: ptr<bf16>, %b: i32, %h: i32, %sb: i32, %sh: i32) attributes {arg_divisibility = [16, 1, 8, 16, 1, 1, 8, 8], num_warps = 4} {
  %ring = local_alloc : smem<2 x bf16[64, 128], #ft.shared<[64, 128], order=[1, 0], vec=8, perPhase=1, maxPhase=8, bytes=2, panel=64>>
  %bars = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>
  %s0 = constant {value = 0} : i32
  %s1 = constant {value = 1} : i32
  %cols = constant {value = 128} : i32
  %on = constant {value = 1} : i1
  mbarrier_init %bars {arrivals = 1}
  barrier
  mbarrier_expect_tx %bars, %s0, %on {bytes = 16384}
  tma_copy %ring, %s0, %bars, %s0, %on, %x, %rows, %cols, %stride, %s0, %s0
  mbarrier_expect_tx %bars, %s1, %on {bytes = 32768}
  tma_copy %ring, %s1, %bars, %s1, %on, %x, %rows, %cols, %stride, %s1, %s0
  tma_copy %ring, %s1, %bars, %s1, %on, %y, %b, %h, %rows, %cols, %sb, %sh, %stride, %s0, %s1, %s0, %s0
  mbarrier_wait %bars, %s0, %s0
  mbarrier_wait %bars, %s1, %s0
  barrier
  mbarrier_inval %bars
  return
}
)";

std::string errorOf(const std::function<void()>& fn) { return flextile::testing::thrownMessage(fn); }

TEST(TensorMaps, CopiesOfOneTensorShareAMapAndTheTextRoundTrips) {
  auto f = ir::parseFunction(kCopies, "copies.ftir");
  const auto recipes = tensorMapRecipes(*f);
  ASSERT_EQ(recipes.size(), 2u);
  EXPECT_EQ(recipes[0].str(), "bf16 base %0 dims [%1, 128] strides [%2] box [64, 64] swizzle 128");
  EXPECT_EQ(recipes[1].str(), "bf16 base %3 dims [%4, %5, %1, 128] strides [%6, %7, %2] box [1, 1, 64, 64] swizzle 128");
  EXPECT_EQ(parseTensorMapRecipesText(tensorMapRecipesText(recipes)), recipes);
  EXPECT_TRUE(errorOf([] { parseTensorMapRecipesText("bf16 0 2 p1 c128\n"); }).find("malformed tensor map recipe") !=
              std::string::npos);

  // The compiled kernel lists them, and its PTX takes one 128-byte grid constant per map after its own parameters.
  const CompiledKernel k = compile(*f, {.target = Target::sm90a()});
  EXPECT_EQ(k.tensorMaps, recipes);
  EXPECT_EQ(k.params.size(), 8u);
  EXPECT_NE(k.ptx.find(".param .align 64 .b8 copies_param_8[128],"), std::string::npos) << k.ptx;
  EXPECT_NE(k.ptx.find(".param .align 64 .b8 copies_param_9[128]"), std::string::npos);
  EXPECT_NE(k.ptx.find("cp.async.bulk.tensor.4d"), std::string::npos);
}

TEST(TensorMaps, CopiesTheHostCannotDescribeAreErrorsNamingTheOp) {
  auto fails = [](const std::string& from, const std::string& to, const std::string& message) {
    std::string t = kCopies;
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    auto f = ir::parseFunction(t, "copies.ftir");
    const std::string msg = errorOf([&] { tensorMapRecipes(*f); });
    EXPECT_NE(msg.find(message), std::string::npos) << to << ": " << msg;
    EXPECT_NE(msg.find("tma_copy"), std::string::npos) << msg;
  };
  // A dim computed in the kernel: the host cannot know it.
  fails("tma_copy %ring, %s0, %bars, %s0, %on, %x, %rows,",
        "%twice = add %rows, %rows : i32\n  tma_copy %ring, %s0, %bars, %s0, %on, %x, %twice,",
        "dim 0 (operand 6) must be a kernel parameter or an integer constant");
  // A base moved in the kernel.
  fails("tma_copy %ring, %s0, %bars, %s0, %on, %x,",
        "%moved = addptr %x, %rows : ptr<bf16>\n  tma_copy %ring, %s0, %bars, %s0, %on, %moved,",
        "the tensor's base (operand 5) must be a kernel parameter");
  // Layouts TMA does not write: a swizzle that is not the span's, column-major order.
  fails("maxPhase=8, bytes=2, panel=64", "maxPhase=4, bytes=2, panel=64", "TMA cannot write the slot layout");
  fails("order=[1, 0], vec=8", "order=[0, 1], vec=8", "its order must be row-major");
}

}  // namespace
}  // namespace flextile::codegen
