// Layouts and convert_layout must not change what a program computes: the
// interpreter (ir/Interpreter.h, the semantic oracle) runs each kernel before
// and after layout assignment on the same random inputs, and every output
// byte must match.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cstring>
#include <random>

#include "LayoutTestUtil.h"
#include "codegen/Passes.h"
#include "ir/Interpreter.h"
#include "ir/Verifier.h"

namespace flextile::codegen {
namespace {

using namespace flextile::ir;
using namespace flextile::testing;

// One kernel argument: a buffer of `count` elements of `dtype` filled with
// random values, or an integer.
struct Arg {
  DType dtype = DType::F32;
  size_t count = 0;  // 0: an integer argument
  int64_t value = 0;
};

using Memory = std::vector<std::vector<unsigned char>>;

Memory randomMemory(const std::vector<Arg>& args, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 2.0f);
  Memory mem;
  for (const Arg& a : args) {
    std::vector<unsigned char> bytes(a.count * size_t(byteWidth(a.dtype)));
    for (size_t i = 0; i < a.count; ++i) {
      float v = dist(rng);
      if (a.dtype == DType::F32) {
        std::memcpy(bytes.data() + i * 4, &v, 4);
      } else {
        Eigen::half h(v);
        std::memcpy(bytes.data() + i * 2, &h, 2);
      }
    }
    mem.push_back(std::move(bytes));
  }
  return mem;
}

Memory run(const Function& f, const std::vector<Arg>& args, Memory mem, std::array<int64_t, 3> grid) {
  std::vector<InterpArg> iargs;
  for (size_t i = 0; i < args.size(); ++i)
    iargs.push_back(args[i].count ? InterpArg::buffer(mem[i].data(), mem[i].size()) : InterpArg::integer(args[i].value));
  interpret(f, iargs, grid);
  return mem;
}

// Runs `f` as given and after assignLayouts; returns the number of
// conversions the pass inserted.
int expectSameResults(const Function& f, const std::vector<Arg>& args, std::array<int64_t, 3> grid, std::mt19937& rng) {
  auto laidOut = f.clone();
  assignLayouts(*laidOut, Target::sm80());
  EXPECT_NO_THROW(verify(*laidOut)) << dump(*laidOut);
  Memory inputs = randomMemory(args, rng);
  Memory before = run(f, args, inputs, grid);
  Memory after = run(*laidOut, args, inputs, grid);
  for (size_t i = 0; i < args.size(); ++i)
    EXPECT_TRUE(before[i] == after[i]) << f.name() << ": buffer " << i << " differs after layout assignment\n"
                                       << dump(*laidOut);
  bool changedSomething = false;
  for (size_t i = 0; i < args.size(); ++i) changedSomething |= before[i] != inputs[i];
  EXPECT_TRUE(changedSomething) << f.name() << " wrote nothing: the comparison would prove nothing";
  return countOps(*laidOut, OpKind::ConvertLayout);
}

TEST(AssignLayoutsSemantics, Kernels) {
  const unsigned seed = testSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> sixteens(1, 12);
  for (int nw : {1, 4, 8}) {
    SCOPED_TRACE("num_warps " + std::to_string(nw));
    {
      int64_t n = 16 * sixteens(rng) + 1024;  // not a multiple of the block
      std::vector<Arg> args{{DType::F32, size_t(n)}, {DType::F32, size_t(n)}, {DType::F32, size_t(n)}, {DType::I32, 0, n}};
      expectSameResults(*vectorAdd(1024, nw, 16), args, {(n + 1023) / 1024, 1, 1}, rng);
    }
    {
      int64_t m = 37 + int64_t(rng() % 40), n = 16 * sixteens(rng);
      n -= 16 * int64_t(rng() % 2);  // a draw of its own: the same on every compiler
      n = std::max<int64_t>(16, std::min<int64_t>(n, 128));
      std::vector<Arg> args{{DType::F32, size_t(m * n)}, {DType::F32, size_t(m * n)}, {DType::I32, 0, m}, {DType::I32, 0, n}};
      expectSameResults(*rowSoftmax(32, 128, nw, 16), args, {(m + 31) / 32, 1, 1}, rng);
    }
    for (bool carried : {false, true}) {
      int64_t M = 20 + int64_t(rng() % 50), N = 16 * sixteens(rng), K = 16 * sixteens(rng);
      std::vector<Arg> args{{DType::F16, size_t(M * K)}, {DType::F16, size_t(K * N)}, {DType::F32, size_t(M * N)},
                            {DType::I32, 0, M},           {DType::I32, 0, N},           {DType::I32, 0, K}};
      expectSameResults(*matmul(32, 32, 16, nw, carried), args, {(M + 31) / 32, (N + 31) / 32, 1}, rng);
    }
    for (bool online : {false, true}) {
      int64_t M = 20 + int64_t(rng() % 50), N = 16 * sixteens(rng);
      std::vector<Arg> args{{DType::F32, size_t(M * N)}, {DType::F32, size_t(M)}, {DType::I32, 0, M}, {DType::I32, 0, N}};
      expectSameResults(*rowSumLoop(16, 32, nw, online), args, {(M + 15) / 16, 1, 1}, rng);
    }
  }
}

}  // namespace
}  // namespace flextile::codegen
