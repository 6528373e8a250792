// The defer-accumulation pass (codegen/passes/DeferAccumulation.cpp) on the forward's loop shape,
// the kernel of tests/lit/codegen/defer_accumulation.ftir: the interpreter gives the same bits
// before the pass, after it and after the whole tile pipeline (rings, async wgmma), for loops of
// 0, 1, 2 and 5 iterations; loops it must not rotate stay as they were.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "codegen/Compiler.h"
#include "codegen/Passes.h"
#include "ir/Interpreter.h"
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"

namespace flextile::codegen {
namespace {

std::string kernelText() {
  std::ifstream in(std::string(FLEXTILE_SOURCE_DIR) + "/tests/lit/codegen/defer_accumulation.ftir");
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  return text.substr(text.find("\nfunc @attention(") + 1);
}

std::unique_ptr<ir::Function> parsed(const std::string& text) {
  ir::Module m = ir::parseModule(text);
  return std::move(m.functions.at(0));
}

int countOps(const ir::Function& f, ir::OpKind kind) {
  int n = 0;
  f.walk([&](const ir::Op& op) { n += op.kind() == kind; });
  return n;
}

const ir::Op* firstLoop(const ir::Function& f) {
  const ir::Op* loop = nullptr;
  f.walk([&](const ir::Op& op) {
    if (!loop && op.kind() == ir::OpKind::For) loop = &op;
  });
  return loop;
}

struct Outputs {
  std::vector<float> o, l;
};

Outputs run(const ir::Function& f, int n, const std::vector<Eigen::bfloat16>& q, const std::vector<Eigen::bfloat16>& k,
            const std::vector<Eigen::bfloat16>& v) {
  Outputs out{std::vector<float>(64 * 64, std::nanf("")), std::vector<float>(64, std::nanf(""))};
  // The interpreter checks real arguments: these host buffers need not be 16-byte aligned.
  auto g = f.clone();
  g->attrs().erase("arg_divisibility");
  ir::interpret(*g,
                {ir::InterpArg::buffer(const_cast<Eigen::bfloat16*>(q.data()), q.size() * 2),
                 ir::InterpArg::buffer(const_cast<Eigen::bfloat16*>(k.data()), k.size() * 2),
                 ir::InterpArg::buffer(const_cast<Eigen::bfloat16*>(v.data()), v.size() * 2),
                 ir::InterpArg::buffer(out.o.data(), out.o.size() * 4), ir::InterpArg::buffer(out.l.data(), out.l.size() * 4),
                 ir::InterpArg::integer(n)},
                {1, 1, 1});
  return out;
}

bool sameBits(const Outputs& a, const Outputs& b) {
  return std::memcmp(a.o.data(), b.o.data(), a.o.size() * 4) == 0 && std::memcmp(a.l.data(), b.l.data(), a.l.size() * 4) == 0;
}

TEST(DeferAccumulation, InterpreterResultsAreUnchangedForEveryTripCount) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  const std::string text = kernelText();
  auto laidOut = parsed(text);
  assignLayouts(*laidOut, Target::sm90a());
  auto deferred = laidOut->clone();
  deferAccumulation(*deferred, Target::sm90a());
  ir::verify(*deferred);
  ASSERT_EQ(firstLoop(*deferred)->region(0).args().size(), firstLoop(*laidOut)->region(0).args().size() + 3)
      << ir::printFunction(*deferred);
  auto compiled = parsed(text);
  runTilePasses(*compiled, Target::sm90a());
  ASSERT_GT(countOps(*compiled, ir::OpKind::WgmmaWait), 0) << ir::printFunction(*compiled);
  const auto traced = parsed(text);
  for (int n : {0, 1, 2, 5}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<Eigen::bfloat16> q(64 * 64), k(size_t(std::max(n, 1)) * 64 * 64), v(k.size());
    for (auto* t : {&q, &k, &v})
      for (auto& x : *t) x = Eigen::bfloat16(dist(rng));
    const Outputs before = run(*traced, n, q, k, v);
    EXPECT_TRUE(sameBits(before, run(*laidOut, n, q, k, v)));
    EXPECT_TRUE(sameBits(before, run(*deferred, n, q, k, v)));
    EXPECT_TRUE(sameBits(before, run(*compiled, n, q, k, v)));
    // No iteration: the inits come back (the epilogue's garbage product is not selected).
    double sum = 0;
    for (float x : before.o) sum += std::abs(x);
    if (n == 0) {
      EXPECT_EQ(sum, 0.0);
      for (float x : before.l) EXPECT_EQ(x, 0.0f);
    } else {
      EXPECT_GT(sum, 0.0);
    }
  }
}

// Loops whose rotation would not pay or would be wrong are left as they were.
TEST(DeferAccumulation, LeavesOtherLoopsAlone) {
  auto unchanged = [](const std::string& text, const Target& target) {
    auto f = parsed(text);
    assignLayouts(*f, target);
    const std::string before = ir::printFunction(*f);
    deferAccumulation(*f, target);
    return ir::printFunction(*f) == before;
  };
  const std::string text = kernelText();
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  EXPECT_FALSE(unchanged(text, Target::sm90a()));
  // Not asked for.
  EXPECT_TRUE(unchanged(edited("defer_accumulation = 1, ", ""), Target::sm90a()));
  // mma.sync products are synchronous: nothing to overlap.
  EXPECT_TRUE(unchanged(text, Target::sm80()));
  // The accumulator is read by something other than its rescale.
  EXPECT_TRUE(unchanged(edited("yield %mnew, %lnew, %anew", "%peek = reduce %ai {axis = 1, kind = \"max\"} : f32[64]\n"
                                                            "    %m2 = maximum %mnew, %peek : f32[64]\n"
                                                            "    yield %m2, %lnew, %anew"),
                        Target::sm90a()));
  // The loop stores.
  EXPECT_TRUE(unchanged(edited("yield %mnew, %lnew, %anew", "%ps1 = splat %lo : ptr<f32>[64]\n"
                                                            "    %r64 = arange {start = 0, end = 64} : i32[64]\n"
                                                            "    %pl = addptr %ps1, %r64 : ptr<f32>[64]\n"
                                                            "    store %pl, %lnew\n"
                                                            "    yield %mnew, %lnew, %anew"),
                        Target::sm90a()));
  // No other product to issue first.
  EXPECT_TRUE(unchanged(edited("%s = dot %qt, %ktt, %zero : f32[64,64]", "%kf = cast %ktt : f32[64,64]\n"
                                                                         "    %s = exp2 %kf : f32[64,64]"),
                        Target::sm90a()));
}

}  // namespace
}  // namespace flextile::codegen
