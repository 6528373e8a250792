// The pass pipeline (verification after each pass, errors naming the pass,
// timings), FLEXTILE_DUMP-style dumps, and the structural hash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "TestPrograms.h"
#include "ir/Dump.h"
#include "ir/Hash.h"
#include "ir/Parser.h"
#include "ir/Passes.h"
#include "ir/Printer.h"
#include "ir/Verifier.h"
#include "tests/ThrownMessage.h"

namespace flextile::ir {
namespace {

// Restores the dump configuration (tests change it) when a test ends.
struct DumpGuard {
  ~DumpGuard() { setDumpConfig("", ""); }
};

std::string errorOf(const std::function<void()>& f) { return flextile::testing::thrownMessage<Error>(f, "(no error)"); }

TEST(PassPipeline, RunsPassesInOrderAndTimesThem) {
  auto f = testing::everyOpProgram();
  std::vector<std::string> order;
  PassPipeline p;
  p.add({"first", [&](Function&) { order.push_back("first"); }})
      .add(canonicalizePass())
      .add({"last", [&](Function&) { order.push_back("last"); }});
  auto timings = p.run(*f);
  EXPECT_EQ(order, (std::vector<std::string>{"first", "last"}));
  ASSERT_EQ(timings.size(), 3u);
  EXPECT_EQ(timings[1].pass, "canonicalize");
  for (const auto& t : timings) EXPECT_GE(t.ms, 0.0);
}

TEST(PassPipeline, VerifiesAfterEveryPassAndNamesTheCulprit) {
  auto f = testing::everyOpProgram();
  PassPipeline p;
  p.add(csePass()).add({"break-types", [](Function& g) {
    Op* add = testing::firstOp(g, OpKind::Add);
    add->result()->setType(Type(DType::F64));
  }});
  p.add(dcePass());
  std::string msg = errorOf([&] { p.run(*f); });
  EXPECT_NE(msg.find("pass 'break-types' produced invalid IR"), std::string::npos) << msg;
  EXPECT_NE(msg.find("op 'add' (every_op.cpp:10)"), std::string::npos) << msg;
}

TEST(PassPipeline, ErrorsThrownByAPassNameIt) {
  auto f = testing::everyOpProgram();
  PassPipeline p;
  p.add({"explode", [](Function&) { throw Error("cannot do it"); }});
  EXPECT_EQ(errorOf([&] { p.run(*f); }), "pass 'explode' failed on @every_op: cannot do it");
}

// The pipeline adds its context to a pass's error and keeps what kind of error it is; the IR a pass
// breaks is the pass's bug (Internal); an error's kind defaults to InvalidArgument.
TEST(PassPipeline, ErrorsKeepTheirKind) {
  EXPECT_EQ(Error("bad input").kind(), ErrorKind::InvalidArgument);
  EXPECT_STREQ(errorKindName(ErrorKind::ResourceLimit), "resource limit");
  for (ErrorKind kind : {ErrorKind::ResourceLimit, ErrorKind::Unsupported, ErrorKind::Compile}) {
    auto f = testing::everyOpProgram();
    PassPipeline p;
    p.add({"explode", [kind](Function&) { throw Error("cannot do it", kind); }});
    try {
      p.run(*f);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), kind) << e.what();
      EXPECT_EQ(std::string(e.what()), "pass 'explode' failed on @every_op: cannot do it");
    }
  }
  auto f = testing::everyOpProgram();
  PassPipeline p;
  p.add({"break-types", [](Function& g) { testing::firstOp(g, OpKind::Add)->result()->setType(Type(DType::F64)); }});
  try {
    p.run(*f);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Internal) << e.what();
  }
}

TEST(PassPipeline, RejectsInvalidInputBeforeAnyPass) {
  auto f = parseFunction("func @bad(%x: f32) {\n  %0 = exp2 %x : f64\n  return\n}\n");
  bool ran = false;
  PassPipeline p;
  p.add({"never", [&](Function&) { ran = true; }});
  std::string msg = errorOf([&] { p.run(*f); });
  EXPECT_FALSE(ran);
  EXPECT_EQ(msg.rfind("pass pipeline input: invalid IR in function @bad", 0), 0u) << msg;
}

TEST(PassPipeline, StandardPassesOnTheEveryOpProgram) {
  for (bool layouts : {false, true}) {
    auto f = testing::everyOpProgram();
    if (layouts) testing::assignTestLayouts(*f);
    PassPipeline p;
    p.add(canonicalizePass()).add(csePass()).add(dcePass());
    EXPECT_NO_THROW(p.run(*f)) << printFunction(*f);
  }
  EXPECT_TRUE(targetIndependentPass("cse"));
  EXPECT_EQ(targetIndependentPass("dce")->name, "dce");
  EXPECT_FALSE(targetIndependentPass("inline"));
}

TEST(Dump, StagesComeFromACommaList) {
  DumpGuard guard;
  setDumpConfig("ir, llvm", "");
  EXPECT_TRUE(dumpEnabled("ir"));
  EXPECT_TRUE(dumpEnabled("llvm"));
  EXPECT_FALSE(dumpEnabled("ptx"));
  EXPECT_FALSE(dumpEnabled("passes"));
  setDumpConfig("all", "");
  EXPECT_TRUE(dumpEnabled("ptx"));
  setDumpConfig("", "");
  EXPECT_FALSE(dumpEnabled("ir"));
}

TEST(Dump, PassesToStderrHeadedByThePassName) {
  DumpGuard guard;
  setDumpConfig("passes", "");
  auto f = testing::everyOpProgram();
  PassPipeline p;
  p.add(canonicalizePass()).add(dcePass());
  ::testing::internal::CaptureStderr();
  p.run(*f);
  std::string err = ::testing::internal::GetCapturedStderr();
  size_t a = err.find("// ===== passes: IR after canonicalize (@every_op) =====\nfunc @every_op(");
  size_t b = err.find("// ===== passes: IR after dce (@every_op) =====\nfunc @every_op(");
  EXPECT_NE(a, std::string::npos) << err;
  EXPECT_NE(b, std::string::npos);
  EXPECT_LT(a, b);
  // Nothing for stages that are off.
  setDumpConfig("llvm", "");
  ::testing::internal::CaptureStderr();
  p.run(*f);
  dump("ptx", "kernel", "PTX TEXT");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(Dump, IntoFilesWhenADirectoryIsSet) {
  DumpGuard guard;
  testing::Random rng;
  auto dir = std::filesystem::temp_directory_path() / ("flextile-dump-" + std::to_string(rng.gen()));
  setDumpConfig("passes,ptx", dir.string());
  auto f = testing::everyOpProgram();
  PassPipeline p;
  p.add(csePass()).add(dcePass());
  p.run(*f);
  dump("ptx", "every_op kernel", "// ptx text\n");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 3u);
  EXPECT_EQ(names[0].substr(4), "-passes-IR_after_cse___every_op_.ftir");
  EXPECT_EQ(names[1].substr(4), "-passes-IR_after_dce___every_op_.ftir");
  EXPECT_EQ(names[2].substr(4), "-ptx-every_op_kernel.ptx");
  // A dumped IR file parses back to the function it shows.
  std::ifstream in(dir / names[1]);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(printFunction(*parseFunction(text.str())), printFunction(*f));
  std::filesystem::remove_all(dir);
}

// ---- structural hash ----

TEST(StructuralHash, EqualForTwoTracesOfOneProgram) {
  auto a = testing::everyOpProgram();
  auto b = testing::everyOpProgram();
  EXPECT_EQ(structuralHash(*a), structuralHash(*b));
  // Value ids differ (dead values created and dropped), locations differ: same hash.
  Function c("every_op");
  for (int i = 0; i < 5; ++i) c.newValue(Type(DType::I32));
  auto d = parseFunction(printFunction(*a));
  d->walk([](Op& op) { op.setLoc({"elsewhere.cpp", 99}); });
  EXPECT_EQ(structuralHash(*d), structuralHash(*a));
  EXPECT_EQ(structuralHash(*a->clone()), structuralHash(*a));
  testing::assignTestLayouts(*a);
  testing::assignTestLayouts(*b);
  EXPECT_EQ(structuralHash(*a), structuralHash(*b));
}

TEST(StructuralHash, ChangesWithEveryIngredient) {
  auto base = testing::everyOpProgram();
  testing::assignTestLayouts(*base);
  const uint64_t h = structuralHash(*base);
  std::vector<std::pair<std::string, std::function<void(Function&)>>> edits = {
      {"op kind", [](Function& f) {
         Op* op = testing::firstOp(f, OpKind::Exp);
         auto repl = f.createOp(OpKind::Exp2, op->operands(), {op->result()->type()});
         Value* r = repl->result();
         op->parentBlock()->insert(op->parentBlock()->find(op), std::move(repl));
         f.replaceAllUsesWith(op->result(), r);
         op->parentBlock()->erase(op);
       }},
      {"int attr", [](Function& f) { testing::firstOp(f, OpKind::ProgramId)->setAttr("axis", int64_t(1)); }},
      {"float attr", [](Function& f) {
         f.walk([](Op& op) {
           if (op.kind() == OpKind::Constant && op.attrs().count("value") &&
               std::holds_alternative<double>(op.attrs().at("value")))
             op.setAttr("value", std::nextafter(op.floatAttr("value"), 1.0));
         });
       }},
      {"string attr", [](Function& f) { testing::firstOp(f, OpKind::Cmp)->setAttr("pred", std::string("le")); }},
      {"list attr", [](Function& f) { testing::firstOp(f, OpKind::Trans)->setAttr("perm", std::vector<int64_t>{0, 1}); }},
      {"type", [](Function& f) { f.params()[3]->setType(Type(DType::I64)); }},
      {"layout", [](Function& f) {
         Value* r = testing::firstOp(f, OpKind::Arange)->result();
         r->setType(r->type().withLayout(testing::otherLayout(*r->type().layout())));
       }},
      {"function attr", [](Function& f) { f.attrs()["num_warps"] = int64_t(8); }},
      {"function name", [](Function& f) { f.setName("other"); }},
      {"operand order", [](Function& f) {
         Op* div = testing::firstOp(f, OpKind::Div);
         Value* a = div->operand(0);
         div->setOperand(0, div->operand(1));
         div->setOperand(1, a);
       }},
  };
  std::set<uint64_t> seen{h};
  for (const auto& [what, edit] : edits) {
    auto g = base->clone();
    edit(*g);
    uint64_t hg = structuralHash(*g);
    EXPECT_NE(hg, h) << what;
    EXPECT_TRUE(seen.insert(hg).second) << what << " collides with another edit";
  }
}

TEST(StructuralHash, HashTextSpreadsSmallChanges) {
  EXPECT_NE(hashText("a"), hashText("b"));
  EXPECT_NE(hashText("abc"), hashText("abc", 1));
  EXPECT_EQ(hashText("same"), hashText("same"));
  // Flipping one input bit flips about half of the output bits.
  int total = 0;
  for (int i = 0; i < 64; ++i) {
    std::string s = "kernel-" + std::to_string(i);
    std::string t = s;
    t.back() ^= 1;
    total += __builtin_popcountll(hashText(s) ^ hashText(t));
  }
  EXPECT_GT(total / 64, 20);
  EXPECT_LT(total / 64, 44);
}

}  // namespace
}  // namespace flextile::ir
