// The tile language: tracing builds the IR it should, and mistakes are
// reported while tracing with the op, the operands and the user's line.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <regex>

#include "codegen/Ptxas.h"
#include "dsl/DSL.h"
#include "examples/kernels.h"
#include "tests/dsl/AtomicKernels.h"
#include "ir/Hash.h"
#include "ir/Printer.h"
#include "tests/ThrownMessage.h"

using namespace flextile;
using namespace flextile::dsl;

namespace {

// Traces `body` into a fresh function and returns it.
template <class F>
std::unique_ptr<ir::Function> traceBody(F body) {
  auto f = std::make_unique<ir::Function>("t");
  TraceContext ctx(*f);
  body(*f);
  return f;
}

int countOps(const ir::Function& f, ir::OpKind k) {
  int n = 0;
  f.walk([&](const ir::Op& op) { n += op.kind() == k; });
  return n;
}

// The message of the flextile::Error `fn` throws ("" when none).
template <class F>
std::string errorOf(F fn) { return flextile::testing::thrownMessage<Error>(fn); }

TEST(Dsl, BroadcastingFollowsNumpyRules) {
  auto f = traceBody([](ir::Function&) {
    Tile rows = arange(0, 64).expand(1);  // [64, 1]
    Tile cols = arange(0, 32).expand(0);  // [1, 32]
    Tile sum = rows * 32 + cols;
    EXPECT_EQ(sum.shape(), (Shape{64, 32}));
    EXPECT_EQ(sum.dtype(), DType::I32);
    Tile s = arange(0, 32) + zeros({4, 32}, DType::I32);  // rank extension
    EXPECT_EQ(s.shape(), (Shape{4, 32}));
  });
  EXPECT_EQ(countOps(*f, ir::OpKind::Broadcast), 3);
}

TEST(Dsl, DtypePromotion) {
  traceBody([](ir::Function&) {
    Tile i = arange(0, 16);
    EXPECT_EQ((i + 1).dtype(), DType::I32);
    EXPECT_EQ((i * 0.5).dtype(), DType::F32);  // a float literal makes an integer tile f32
    Tile h = zeros({16}, DType::F16);
    EXPECT_EQ((h + 1).dtype(), DType::F16);    // literals adopt the tile's dtype
    EXPECT_EQ((h + zeros({16}, DType::BF16)).dtype(), DType::F32);
    EXPECT_EQ((h + zeros({16}, DType::F32)).dtype(), DType::F32);
    EXPECT_EQ((i + zeros({16}, DType::I64)).dtype(), DType::I64);
    EXPECT_EQ((i < 3).dtype(), DType::I1);
    EXPECT_EQ(sum(i < 3, 0).dtype(), DType::I32);
  });
}

TEST(Dsl, ShapeMismatchNamesOpShapesAndLine) {
  int line = 0;
  std::string msg = errorOf([&] {
    traceBody([&](ir::Function&) {
      Tile a = arange(0, 64), b = arange(0, 32);
      line = __LINE__ + 1;
      [[maybe_unused]] Tile c = a + b;
    });
  });
  EXPECT_NE(msg.find("dsl_test.cpp:" + std::to_string(line)), std::string::npos) << msg;
  EXPECT_NE(msg.find("add"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32]"), std::string::npos) << msg;
}

TEST(Dsl, DtypeErrorsNameTheOperands) {
  std::string msg = errorOf([] { traceBody([](ir::Function&) { exp(arange(0, 8)); }); });
  EXPECT_NE(msg.find("exp"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i32[8]"), std::string::npos) << msg;
  msg = errorOf([] { traceBody([](ir::Function&) { zeros({8}, DType::F32) & 1; }); });
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;
  msg = errorOf([] {
    traceBody([](ir::Function&) { dot(zeros({16, 32}, DType::F16), zeros({16, 16}, DType::F16)); });
  });
  EXPECT_NE(msg.find("dot"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f16[16,32]"), std::string::npos) << msg;
}

// unpipelined() marks a load's op no_ring (the pipeline pass then leaves it); any other tile is an
// error naming the op, its operand and the user's line.
TEST(Dsl, UnpipelinedMarksALoadAndRefusesAnythingElse) {
  auto f = kernel("k", [](Ptr<f32> p) {
              Tile x = unpipelined(load(p + arange(0, 16)));
              store(p + arange(0, 16), x + 1);
            }).trace();
  int marked = 0;
  f->walk([&](const ir::Op& op) {
    marked += op.kind() == ir::OpKind::Load && op.hasAttr("no_ring") && op.intAttr("no_ring") == 1;
  });
  EXPECT_EQ(marked, 1);
  int line = 0;
  std::string msg = errorOf([&] {
    traceBody([&](ir::Function&) {
      line = __LINE__ + 1;
      unpipelined(arange(0, 16));
    });
  });
  EXPECT_NE(msg.find("unpipelined"), std::string::npos) << msg;
  EXPECT_NE(msg.find("i32[16]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dsl_test.cpp:" + std::to_string(line)), std::string::npos) << msg;
}

TEST(Dsl, NonPowerOfTwoTilesAreRejected) {
  std::string msg = errorOf([] { traceBody([](ir::Function&) { arange(0, 100); }); });
  EXPECT_NE(msg.find("power of two"), std::string::npos) << msg;
  msg = errorOf([] { traceBody([](ir::Function&) { zeros({3, 4}, DType::F32); }); });
  EXPECT_NE(msg.find("[3, 4]"), std::string::npos) << msg;
}

TEST(Dsl, ReductionAxisOutOfRange) {
  std::string msg = errorOf([] { traceBody([](ir::Function&) { max(zeros({4, 8}, DType::F32), 2); }); });
  EXPECT_NE(msg.find("axis 2"), std::string::npos) << msg;
  traceBody([](ir::Function&) { EXPECT_EQ(max(zeros({4, 8}, DType::F32), -1).shape(), (Shape{4})); });
}

TEST(Dsl, TilesOutsideATraceAreAnError) {
  std::string msg = errorOf([] { arange(0, 8); });
  EXPECT_NE(msg.find("outside a kernel trace"), std::string::npos) << msg;
}

TEST(Dsl, ForRangeCarriesValuesAndChecksTheirTypes) {
  auto f = traceBody([](ir::Function&) {
    auto [a, b] = for_range(0, 10, 2, std::tuple{zeros({8}, DType::F32), zeros({8}, DType::I32)},
                            [](Tile i, Tile a, Tile b) { return std::tuple{a + 1.0, b + i}; });
    EXPECT_EQ(a.dtype(), DType::F32);
    EXPECT_EQ(b.dtype(), DType::I32);
  });
  EXPECT_EQ(countOps(*f, ir::OpKind::For), 1);
  EXPECT_EQ(countOps(*f, ir::OpKind::Yield), 1);
  int line = 0;
  std::string msg = errorOf([&] {
    traceBody([&](ir::Function&) {
      line = __LINE__ + 1;
      for_range(0, 10, 1, zeros({8}, DType::F32), [](Tile i, Tile a) { return a.to(DType::F16); });
    });
  });
  EXPECT_NE(msg.find("dsl_test.cpp:" + std::to_string(line)), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[8]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f16[8]"), std::string::npos) << msg;
}

TEST(Dsl, LoadStoreCheckPointersMasksAndValues) {
  auto k = kernel("k", [](Ptr<f16> p, Int n) {
    auto offs = arange(0, 16);
    auto v = load(p + offs, offs < n, 0);
    EXPECT_EQ(v.dtype(), DType::F16);
    store(p + offs, v.to(f32{}) * 2, offs < n);  // the value is cast to the pointee type
  });
  auto f = k.trace();
  EXPECT_EQ(f->params().size(), 2u);
  EXPECT_TRUE(f->params()[0]->type().isPointer());
  EXPECT_EQ(f->params()[0]->type().pointee(), DType::F16);
  EXPECT_EQ(f->params()[1]->type().dtype(), DType::I32);
  std::string msg = errorOf([] {
    kernel("bad", [](Ptr<f32> p) { load(p + arange(0, 16), arange(0, 16)); }).trace();
  });
  EXPECT_NE(msg.find("mask must be i1"), std::string::npos) << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<f32> p) { load(p + zeros({16}, DType::F32)); }).trace(); });
  EXPECT_NE(msg.find("pointer offsets"), std::string::npos) << msg;
}

TEST(Dsl, ConstantsFoldIntoTheTraceAndAreChecked) {
  Kernel add = examples::vectorAdd();
  EXPECT_EQ(add.numConstants(), 1u);
  auto a = add.trace({{128}, 4});
  auto b = add.trace({{256}, 4});
  EXPECT_NE(ir::printFunction(*a), ir::printFunction(*b));
  EXPECT_NE(ir::printFunction(*a).find("i32[128]"), std::string::npos);
  std::string msg = errorOf([&] { add.trace({{}, 4}); });
  EXPECT_NE(msg.find("Const<> values"), std::string::npos) << msg;
  msg = errorOf([&] { add.trace({{128}, 3}); });
  EXPECT_NE(msg.find("num_warps"), std::string::npos) << msg;
}

TEST(Dsl, ExampleKernelsTraceToVerifiedIR) {
  EXPECT_NO_THROW(examples::rowSoftmax<bf16>().trace({{1, 1024}, 4}));
  EXPECT_NO_THROW(examples::rowSoftmax<f32>().trace({{4, 256}, 4}));
  EXPECT_NO_THROW(examples::matmul<f16>().trace({{64, 64, 32}, 4}));
  auto mm = examples::matmul<f32>().trace({{32, 32, 16}, 2});
  EXPECT_EQ(countOps(*mm, ir::OpKind::Dot), 1);
  EXPECT_EQ(countOps(*mm, ir::OpKind::For), 1);
}

}  // namespace

namespace {

TEST(Dsl, LaunchArgumentsAreCheckedByName) {
  Kernel add = flextile::examples::vectorAdd();
  std::vector<float> x(10), y(10), out(10);
  LaunchOptions o{{1, 1, 1}, {16}, 4};
  std::string msg = errorOf([&] { add.interpret(o, x, y, out); });
  EXPECT_NE(msg.find("expects 4 run-time arguments, got 3"), std::string::npos) << msg;
  msg = errorOf([&] { add.interpret(o, x, y, 5, 10); });
  EXPECT_NE(msg.find("argument 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("host buffer"), std::string::npos) << msg;
  msg = errorOf([&] { add.interpret(o, x, y, out, 1.5); });
  EXPECT_NE(msg.find("argument 3 (i32) expects an integer"), std::string::npos) << msg;
  msg = errorOf([&] { add.interpret(o, x, y, out, int64_t(1) << 40); });
  EXPECT_NE(msg.find("i32 value"), std::string::npos) << msg;
}

TEST(Dsl, AKernelsIdentityIsItsStructureNotItsObject) {
  // Two kernel objects from the same source trace to the same IR, hence one compiled kernel.
  auto a = flextile::examples::rowSoftmax<bf16>().trace({{2, 128}, 4});
  auto b = flextile::examples::rowSoftmax<bf16>().trace({{2, 128}, 4});
  EXPECT_EQ(ir::structuralHash(*a), ir::structuralHash(*b));
  auto c = flextile::examples::rowSoftmax<f16>().trace({{2, 128}, 4});
  EXPECT_NE(ir::structuralHash(*a), ir::structuralHash(*c));
}

}  // namespace

namespace {

TEST(Dsl, DotInputPrecisionIsRecordedOnTheOp) {
  traceBody([](ir::Function&) {
    Tile a = zeros({16, 16}, DType::F32), b = zeros({16, 16}, DType::F32), c = zeros({16, 16}, DType::F32);
    const ir::Op* exact = dot(a, b, c, InputPrecision::IEEE).value()->definingOp();
    ASSERT_TRUE(exact->hasAttr("input_precision"));
    EXPECT_EQ(exact->strAttr("input_precision"), "ieee");
    EXPECT_FALSE(dot(a, b, c, InputPrecision::TF32).value()->definingOp()->hasAttr("input_precision"));
    EXPECT_FALSE(dot(a, b, c).value()->definingOp()->hasAttr("input_precision"));
  });
}

}  // namespace

// ---- atomic_add --------------------------------------------------------------

// global_timer: one op per read, kept where it was traced (its reads around a loop of loads stay
// on either side of it), and on the interpreter the host's steady clock: every program's first
// read comes no later than its second, and both lie inside the launch's own interval.
TEST(Dsl, GlobalTimerReadsTheClockWhereItIsTraced) {
  auto timed = kernel("timed_sum", [](Ptr<f32> x, Ptr<f32> out, Ptr<i64> stamps, Int n, Const<int> BLOCK) {
    Tile t0 = global_timer();
    Tile sum = for_range(0, n, BLOCK, zeros({BLOCK}, DType::F32),
                         [&](Tile i, Tile acc) { return acc + load(x + (i + arange(0, BLOCK)), i + arange(0, BLOCK) < n, 0.0f); });
    store(out + program_id(0), flextile::dsl::sum(sum, 0));
    Tile t1 = global_timer();
    store(stamps + program_id(0) * 2, t0);
    store(stamps + (program_id(0) * 2 + 1), t1);
  });
  const auto f = timed.trace({.constants = {64}});
  EXPECT_EQ(countOps(*f, ir::OpKind::GlobalTimer), 2);
  const std::string text = ir::printFunction(*f);
  const size_t first = text.find("global_timer"), loop = text.find(" for "), second = text.rfind("global_timer");
  EXPECT_TRUE(first < loop && loop != std::string::npos && loop < second) << text;
  std::vector<float> x(1000, 1.0f), out(4, -1.0f);
  std::vector<int64_t> stamps(8, -1);
  auto now = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  const int64_t before = now();
  timed.interpret({{4, 1, 1}, {64}}, x, out, stamps, 1000);
  const int64_t after = now();
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(out[size_t(p)], 1000.0f);
    EXPECT_LE(before, stamps[size_t(2 * p)]) << p;
    EXPECT_LE(stamps[size_t(2 * p)], stamps[size_t(2 * p + 1)]) << p;
    EXPECT_LE(stamps[size_t(2 * p + 1)], after) << p;
  }
}

TEST(DslAtomic, TracesOneOpAndBroadcastsTheValue) {
  auto k = kernel("k", [](Ptr<f32> p, Int n) {
    auto offs = arange(0, 16).expand(0) + arange(0, 8).expand(1) * 16;  // [8, 16]
    auto old = atomic_add(p + offs, arange(0, 16).expand(0).to(f32{}), offs < n);  // [1, 16] value
    EXPECT_EQ(old.dtype(), DType::F32);
    EXPECT_EQ(old.shape(), (Shape{8, 16}));
    atomic_add(p, 2);  // a number adopts the pointee's dtype; a scalar atomic
  });
  auto f = k.trace();
  EXPECT_EQ(countOps(*f, ir::OpKind::AtomicAdd), 2);
  std::string text = ir::printFunction(*f);
  EXPECT_NE(text.find("atomic_add %"), std::string::npos) << text;
  EXPECT_NE(text.find(": f32[8,16]"), std::string::npos) << text;
}

TEST(DslAtomic, MistakesNameTheOpTypesAndLine) {
  int line = 0;
  std::string msg = errorOf([&] {
    kernel("bad", [&](Ptr<f16> p) {
      line = __LINE__ + 1;
      atomic_add(p + arange(0, 16), 1.0);
    }).trace();
  });
  EXPECT_NE(msg.find("dsl_test.cpp:" + std::to_string(line)), std::string::npos) << msg;
  EXPECT_NE(msg.find("atomic_add: adds f32, i32 or i64 atomically, but the pointer is ptr<f16>[16]"), std::string::npos)
      << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<i32> p) { atomic_add(p + arange(0, 16), zeros({16}, DType::F32)); }).trace(); });
  EXPECT_NE(msg.find("atomic_add: value f32[16] does not match the pointee of ptr<i32>[16] (cast it first)"),
            std::string::npos)
      << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<f32> p) { atomic_add(p + arange(0, 16), zeros({32}, DType::F32)); }).trace(); });
  EXPECT_NE(msg.find("atomic_add: shapes [32] and [16] cannot broadcast"), std::string::npos) << msg;
  msg = errorOf([] {
    kernel("bad", [](Ptr<f32> p) { atomic_add(p + arange(0, 16).expand(0), zeros({4, 16}, DType::F32)); }).trace();
  });
  EXPECT_NE(msg.find("atomic_add: value f32[4,16] does not fit pointer tile ptr<f32>[1,16]"), std::string::npos) << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<f32> p) { atomic_add(p + arange(0, 16), 1.0, arange(0, 16)); }).trace(); });
  EXPECT_NE(msg.find("atomic_add: mask must be i1 (a comparison), got i32[16]"), std::string::npos) << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<i32> p) { atomic_add(p, 0.5); }).trace(); });
  EXPECT_NE(msg.find("atomic_add: cannot add number 0.500000 to the integers of ptr<i32>"), std::string::npos) << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<f32> p) { atomic_add(arange(0, 16), 1.0); }).trace(); });
  EXPECT_NE(msg.find("atomic_add: expects a pointer"), std::string::npos) << msg;
  msg = errorOf([] {
    kernel("bad", [](Ptr<i32> p) { atomic_add(p + arange(0, 16), 1, MemoryOrder::AcqRel); }).trace();
  });
  EXPECT_NE(msg.find("atomic_add: MemoryOrder::AcqRel takes the program's one ticket, a scalar pointer, not ptr<i32>[16]"),
            std::string::npos)
      << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<f32> p) { store_tagged(p + arange(0, 16), 1.0, 7); }).trace(); });
  EXPECT_NE(msg.find("store_tagged: tagged words are i64 (tag << 32 | value bits), but the pointer is ptr<f32>[16]"),
            std::string::npos)
      << msg;
  msg = errorOf([] { kernel("bad", [](Ptr<i64> p) { load_tagged(p + arange(0, 16), arange(0, 16)); }).trace(); });
  EXPECT_NE(msg.find("load_tagged: the tag must be an i32 scalar, got i32[16]"), std::string::npos) << msg;
  msg = errorOf([] {
    kernel("bad", [](Ptr<i64> p) {
      Tile a = p + arange(0, 16);
      load_tagged({a, a}, 7, {arange(0, 16) < 8});
    }).trace();
  });
  EXPECT_NE(msg.find("load_tagged: takes a mask for every pointer or none, got 1 masks for 2 pointers"), std::string::npos)
      << msg;
  msg = errorOf([] {
    kernel("bad", [](Ptr<i64> p) { store_tagged(p + arange(0, 16), arange(0, 16), 7); }).trace();
  });
  EXPECT_NE(msg.find("store_tagged: stores f32 values, got i32[16] (cast it first)"), std::string::npos) << msg;
  // The scalar ticket traces to one op carrying the order.
  auto f = kernel("ticket", [](Ptr<i32> p) { atomic_add(p, 1, MemoryOrder::AcqRel); }).trace();
  int tickets = 0;
  f->walk([&](const ir::Op& op) {
    tickets += op.kind() == ir::OpKind::AtomicAdd && op.hasAttr("order") && op.strAttr("order") == "acq_rel";
  });
  EXPECT_EQ(tickets, 1);
}

TEST(DslAtomic, InterpretedKernelsCountExactly) {
  std::mt19937 gen(12345);
  // Histogram of i32 keys.
  const int n = 3001, bins = 50;
  std::vector<int32_t> keys(n), counts(bins, 0), want(bins, 0);
  for (auto& k : keys) ++want[size_t(k = int32_t(gen() % bins))];
  flextile::testing::atomicHistogram().interpret({{cdiv(n, 256), 1, 1}, {256}}, keys, counts, n);
  EXPECT_EQ(counts, want);
  // f32 sums of small integers.
  std::vector<float> values(n), sums(7, 0.0f), wantSums(7, 0.0f);
  for (int i = 0; i < n; ++i) wantSums[size_t(i % 7)] += values[size_t(i)] = float(int(gen() % 9) - 4);
  flextile::testing::atomicBinnedSum().interpret({{cdiv(n, 128), 1, 1}, {128, 7}}, values, sums, n);
  EXPECT_EQ(sums, wantSums);
  // A scalar ticket per program of a 2-D grid.
  std::vector<int32_t> counter{0}, seen(6 * 5 * 32, -1);
  flextile::testing::atomicTicket().interpret({{6, 5, 1}, {32}}, counter, seen);
  EXPECT_EQ(counter[0], 30);
  std::vector<int32_t> tickets;
  for (int p = 0; p < 30; ++p) {
    for (int i = 0; i < 32; ++i) ASSERT_EQ(seen[size_t(p * 32 + i)], seen[size_t(p * 32)]) << p;
    tickets.push_back(seen[size_t(p * 32)]);
  }
  std::sort(tickets.begin(), tickets.end());
  for (int p = 0; p < 30; ++p) EXPECT_EQ(tickets[size_t(p)], p);
  // The last of 40 programs sums everyone's partials (on the interpreter's threads), three launches
  // on one counter that the last program of each resets.
  {
    const int programs = 40, block = 64;
    std::vector<int32_t> partials(size_t(programs * block), -1), counter{0}, last{-1};
    for (int launch = 0; launch < 3; ++launch) {
      std::vector<int32_t> in(size_t(programs * block)), sums(size_t(block), -1), want(size_t(block), 0);
      for (size_t i = 0; i < in.size(); ++i) want[i % size_t(block)] += 3 * (in[i] = int32_t(gen() % 2001) - 1000);
      flextile::testing::fencedLastProgramSum().interpret({{programs, 1, 1}, {block}}, in, partials, counter, sums, last);
      EXPECT_EQ(sums, want) << "launch " << launch;
      EXPECT_EQ(counter[0], 0) << "launch " << launch;
      EXPECT_TRUE(last[0] >= 0 && last[0] < programs) << last[0];
    }
  }
  // The same through tagged words: the tag changes each launch, the words stay (a stale word is the
  // previous launch's value, so a wait that took one shows in the sum).
  {
    const int programs = 41, block = 64;  // odd: a pair a wait, then the last alone
    std::vector<int64_t> words(size_t(programs * block), 0);
    std::vector<int32_t> counter{0};
    for (int launch = 1; launch <= 3; ++launch) {
      std::vector<float> in(size_t(programs * block)), sums(size_t(block), NAN), want(size_t(block), 0.0f);
      for (size_t i = 0; i < in.size(); ++i) want[i % size_t(block)] += 3 * (in[i] = float(int(gen() % 21) - 10));
      flextile::testing::taggedLastProgramSum().interpret({{programs, 1, 1}, {block}}, in, words, counter, sums, launch);
      EXPECT_EQ(sums, want) << "launch " << launch;
      EXPECT_EQ(counter[0], 0) << "launch " << launch;
      EXPECT_EQ(uint64_t(words[0]) >> 32, uint64_t(launch));
    }
  }
  // A writer that fails before it stores: the program waiting for its words gives up at once (it
  // does not wait out its minute) and the writer's own error is the one reported.
  {
    auto waitsForProgramZero = kernel("waits_for_program_zero", [](Ptr<f32> values, Ptr<i64> words, Int tag) {
      auto program = program_id(0);
      for_range(0, (program == 0).to(i32{}), 1, [&](Tile) {
        store_tagged(words, load(values + 1000000), tag);  // out of bounds: program 0 fails here
      });
      for_range(0, (program == 1).to(i32{}), 1, [&](Tile) { store(values, load_tagged(words, tag)); });
    });
    std::vector<float> values(4, 1.0f);
    std::vector<int64_t> words(1, 0);
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = errorOf([&] { waitsForProgramZero.interpret({{2, 1, 1}, {}}, values, words, 9); });
    EXPECT_NE(msg.find("in program (0, 0, 0): out-of-bounds load"), std::string::npos) << msg;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << msg;
  }
  // Whole rows shared by programs and steps, the last rows masked (the GPU's bulk-reduce path), and
  // the same tiles named as boxes (whose mask and pointers the interpreter checks against the box).
  for (int box : {0, 1})
  for (int dot : {0, 1}) {
    const int programs = 5, steps = 3, BM = 16, W = 32, rows = (programs + steps) * BM / 2 - 5;
    std::vector<float> rowValues(size_t(programs * steps * BM * W)), acc(size_t(rows * W), 0.0f),
        wantAcc(size_t(rows * W), 0.0f);
    for (float& x : rowValues) x = float(int(gen() % 9) - 4);
    for (int p = 0; p < programs; ++p)
      for (int st = 0; st < steps; ++st)
        for (int i = 0; i < BM; ++i)
          for (int j = 0; j < W; ++j)
            if (const int r = (p + st) * (BM / 2) + i; r < rows)
              wantAcc[size_t(r * W + j)] += rowValues[size_t(((p * steps + st) * BM + i) * W + (dot ? j % 16 : j))];
    flextile::testing::atomicRowSums().interpret({{programs, 1, 1}, {BM, W, dot, box}}, rowValues, acc, rows, steps);
    EXPECT_EQ(acc, wantAcc) << "dot " << dot << " box " << box;
  }
  // Replicated rows and columns, masked.
  for (int row : {1, 0}) {
    std::vector<float> acc(16, 0.0f), old(9 * 16, -1.0f);
    flextile::testing::atomicReplicated().interpret({{9, 1, 1}, {16, row}}, acc, old, 11);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(acc[size_t(j)], j < 11 ? 9.0f : 0.0f) << "row " << row << " j " << j;
  }
}

// What the GPU test launches compiles here, with the atomics it expects: one
// per element a thread adds, the scalar one under the thread-0 branch, and
// PTX that ptxas accepts (where ptxas is installed).
TEST(DslAtomic, TheGpuTestsKernelsCompileAndAssemble) {
  auto ptr = [](size_t bytes) { return KernelArg::deviceAddress(uint64_t(1) << 20, bytes); };
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const bool havePtxas = codegen::findPtxas().has_value();
  Kernel histogram = flextile::testing::atomicHistogram(), sum = flextile::testing::atomicBinnedSum(),
         ticket = flextile::testing::atomicTicket(), replicated = flextile::testing::atomicReplicated(),
         lastSum = flextile::testing::fencedLastProgramSum();
  for (codegen::Target target : {codegen::Target::sm90a(), codegen::Target::sm80()}) {
    for (int warps : {1, 4, 8}) {
      SCOPED_TRACE("sm_" + std::to_string(target.capability) + ", warps " + std::to_string(warps));
      std::vector<const codegen::CompiledKernel*> built;
      built.push_back(&histogram.compile({{4, 1, 1}, {512}, warps}, {ptr(4096), ptr(4096), KernelArg(1000)}, target));
      EXPECT_EQ(count(built.back()->ptx, "atom.global.add.u32"), 512 / (32 * warps)) << built.back()->ptx;
      built.push_back(&sum.compile({{4, 1, 1}, {1024, 3}, warps}, {ptr(4096), ptr(12), KernelArg(1000)}, target));
      EXPECT_EQ(count(built.back()->ptx, "atom.global.add.f32"), 1024 / (32 * warps));
      built.push_back(&ticket.compile({{4, 1, 1}, {256}, warps}, {ptr(4), ptr(4096)}, target));
      EXPECT_EQ(count(built.back()->ptx, "atom.global.add.u32"), 1);
      EXPECT_EQ(count(built.back()->ptx, "bar.sync"), 2) << "the ticket reaches every thread through shared memory";
      built.push_back(&lastSum.compile({{4, 1, 1}, {256}, warps}, {ptr(4096), ptr(4096), ptr(4), ptr(1024), ptr(4)},
                                       target));
      EXPECT_EQ(count(built.back()->ptx, "atom.global.add.u32"), 1) << "one ticket per program";
      EXPECT_EQ(count(built.back()->ptx, "fence.acq_rel.gpu"), 2) << built.back()->ptx;
      EXPECT_EQ(count(built.back()->ptx, "ld.global.nc"), 0);
      for (int row : {1, 0})
        for (int N : {1, 16, 64}) {
          built.push_back(&replicated.compile({{4, 1, 1}, {N, row}, warps}, {ptr(256), ptr(4096), KernelArg(N)}, target));
          // Each thread adds at most one element (N <= the threads of one warp group's rows).
          EXPECT_EQ(count(built.back()->ptx, "atom.global.add.f32"), std::max(1, N / (32 * warps))) << N;
        }
      // Whole rows: one bulk reduction per row where the target has them (the bulk-reduce pass),
      // one atomic per element elsewhere.
      Kernel rowSums = flextile::testing::atomicRowSums();
      for (int dot : {0, 1}) {
        const int BM = 64, W = 128;
        built.push_back(&rowSums.compile({{4, 1, 1}, {BM, W, dot, 0}, warps},
                                         {ptr(1 << 20), ptr(1 << 20), KernelArg(200), KernelArg(3)}, target));
        const bool bulk = target.has(codegen::Feature::BulkReduce);
        // Each thread issues at most one row a round: a program of fewer threads than rows goes round twice.
        EXPECT_EQ(count(built.back()->ptx, "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32"),
                  bulk ? cdiv(BM, 32 * warps) : 0);
        // The engine's reads are waited for before the op writes its rows again and at the return.
        EXPECT_EQ(count(built.back()->ptx, "cp.async.bulk.wait_group.read 0"), bulk ? 2 : 0);
        EXPECT_EQ(count(built.back()->ptx, "atom.global.add.f32"), bulk ? 0 : BM * W / (32 * warps)) << "dot " << dot;
        // Named as a box: on sm_90a one TMA reduction per panel of the staged tile, issued by one
        // thread (128-byte panels for a blocked tile, 32-byte ones for the mma accumulator, whose
        // stores meet no bank twice only there: codegen::bulkTensorStaging); elsewhere as before.
        built.push_back(&rowSums.compile({{4, 1, 1}, {BM, W, dot, 1}, warps},
                                         {ptr(1 << 20), ptr(1 << 20), KernelArg(200), KernelArg(3)}, target));
        const bool tma = target.has(codegen::Feature::TensorMemoryAccelerator);
        const int panels = dot ? W / 8 : W / 32;
        EXPECT_EQ(count(built.back()->ptx, "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group"),
                  tma ? panels : 0)
            << "dot " << dot << " warps " << warps;
        EXPECT_EQ(count(built.back()->ptx, "cp.reduce.async.bulk.global"), !tma && bulk ? cdiv(BM, 32 * warps) : 0);
        EXPECT_EQ(count(built.back()->ptx, "cp.async.bulk.commit_group"), bulk ? 1 : 0);
      }
      if (havePtxas) {
        for (const auto* k : built) EXPECT_NO_THROW(codegen::runPtxas(k->ptx, target)) << k->name;
      }
    }
  }
}

// FLEXTILE_PTXAS (read once per process; ctest runs each test in its own). Unset, the offline
// ptxas assembles the warp-specialized kernels (a launch loads that cubin: the driver JIT spills
// their consumers) and leaves the others to the JIT; "1" assembles every kernel.
namespace {
const codegen::CompiledKernel& compileMatmulInFreshCache(Kernel& mm, bool producer) {
  std::string cacheDir = ::testing::TempDir() + "flextile-ptxas-XXXXXX";
  EXPECT_NE(::mkdtemp(cacheDir.data()), nullptr);
  ::setenv("FLEXTILE_CACHE_DIR", cacheDir.c_str(), 1);  // a fresh cache: nothing assembled before
  auto ptr = [](size_t bytes) { return KernelArg::deviceAddress(uint64_t(1) << 20, bytes); };
  const codegen::CompiledKernel& code =
      mm.compile({{1, 1, 1}, {128, 128, 64}, 8, 3, true, producer},
                 {ptr(1 << 20), ptr(1 << 20), ptr(1 << 20), KernelArg(256), KernelArg(256), KernelArg(256)},
                 codegen::Target::sm90a());
  ::unsetenv("FLEXTILE_CACHE_DIR");
  return code;
}
}  // namespace

TEST(DslPtxas, WarpSpecializedKernelsAreAssembledOfflineByDefault) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found (PATH or /usr/local/cuda/bin)";
  ::unsetenv("FLEXTILE_PTXAS");
  ASSERT_EQ(codegen::offlineAssembly(), codegen::OfflineAssembly::WarpSpecialized);
  Kernel mm = examples::matmul<bf16>();
  const codegen::CompiledKernel& specialized = compileMatmulInFreshCache(mm, true);
  EXPECT_EQ(specialized.producerWarps, 4);
  EXPECT_FALSE(specialized.cubin.empty());
  EXPECT_NE(specialized.ptxasInfo.find("registers"), std::string::npos) << specialized.ptxasInfo;
  const codegen::CompiledKernel& plain = compileMatmulInFreshCache(mm, false);
  EXPECT_EQ(plain.producerWarps, 0);
  EXPECT_TRUE(plain.cubin.empty()) << "a kernel without a producer warpgroup is left to the driver's JIT";
}

TEST(DslPtxas, EveryKernelAssembledOfflineWhenAskedFor) {
  if (!codegen::findPtxas()) GTEST_SKIP() << "ptxas not found (PATH or /usr/local/cuda/bin)";
  ::setenv("FLEXTILE_PTXAS", "1", 1);
  ASSERT_EQ(codegen::offlineAssembly(), codegen::OfflineAssembly::Always);
  ::unsetenv("FLEXTILE_PTXAS");
  Kernel mm = examples::matmul<bf16>();
  const codegen::CompiledKernel& plain = compileMatmulInFreshCache(mm, false);
  EXPECT_FALSE(plain.cubin.empty());
  EXPECT_NE(plain.ptxasInfo.find("registers"), std::string::npos) << plain.ptxasInfo;
}

TEST(DslPtxas, PolicyFromTheEnvironmentValue) {
  using codegen::OfflineAssembly;
  bool unknown = true;
  EXPECT_EQ(codegen::offlineAssemblyFor(nullptr, true, &unknown), OfflineAssembly::WarpSpecialized);
  EXPECT_FALSE(unknown);
  EXPECT_EQ(codegen::offlineAssemblyFor("auto", true), OfflineAssembly::WarpSpecialized);
  EXPECT_EQ(codegen::offlineAssemblyFor("0", true), OfflineAssembly::Never);
  EXPECT_EQ(codegen::offlineAssemblyFor("off", true), OfflineAssembly::Never);
  EXPECT_EQ(codegen::offlineAssemblyFor("1", true), OfflineAssembly::Always);
  EXPECT_EQ(codegen::offlineAssemblyFor("all", true), OfflineAssembly::Always);
  EXPECT_EQ(codegen::offlineAssemblyFor("1", false), OfflineAssembly::Never) << "no ptxas: the JIT, whatever is asked";
  EXPECT_EQ(codegen::offlineAssemblyFor(nullptr, false), OfflineAssembly::Never);
  EXPECT_EQ(codegen::offlineAssemblyFor("yes please", true, &unknown), OfflineAssembly::WarpSpecialized);
  EXPECT_TRUE(unknown);
}

// LaunchOptions::reassociate lets fold-scales and regroup-sums rewrite a kernel's f32 arithmetic:
// (s * 0.125 + slope * (kv - q)) * log2 e, with kv and q positions converted from integers, keeps
// one full-tile product and no per-element conversion, and computes what the program as written
// does within f32 rounding (interpreted both ways on random inputs). Without it nothing moves.
TEST(DslReassociate, LaunchOptionLetsTheCompilerFoldScales) {
  Kernel k = kernel("alibi_like", [](Ptr<f32> s, Ptr<f32> out, Float slope, Int base) {
    Tile rows = arange(0, 16), cols = arange(0, 32);
    Tile offsets = rows.expand(1) * 32 + cols.expand(0);
    Tile scores = load(s + offsets);
    Tile kv = (cols + base).to(DType::F32).expand(0), q = rows.to(DType::F32).expand(1);
    store(out + offsets, (scores * 0.125 + slope * (kv - q)) * 1.4426950408889634);
  });
  auto ptr = [](size_t bytes) { return KernelArg::deviceAddress(uint64_t(1) << 20, bytes); };
  const std::vector<KernelArg> args{ptr(16 * 32 * 4), ptr(16 * 32 * 4), KernelArg(0.5), KernelArg(1000)};
  auto ops = [](const std::string& ir, const char* op, const char* shape) {
    std::regex r(std::string("= ") + op + " [^\\n]*: f32\\[" + shape + "\\]");
    return int(std::distance(std::sregex_iterator(ir.begin(), ir.end(), r), std::sregex_iterator()));
  };
  auto fullTileOps = [&](const std::string& ir, const char* op) { return ops(ir, op, "16,32"); };
  LaunchOptions plain{{1, 1, 1}, {}, 4, 1};
  LaunchOptions fast = plain;
  fast.reassociate = true;
  const std::string asWritten = k.compile(plain, args, codegen::Target::sm90a()).ir;
  const std::string folded = k.compile(fast, args, codegen::Target::sm90a()).ir;
  EXPECT_EQ(fullTileOps(asWritten, "mul"), 3) << asWritten;
  EXPECT_EQ(fullTileOps(folded, "mul"), 1) << folded;
  // The key positions: one conversion per element as written, a scalar one and a range's after.
  EXPECT_EQ(ops(asWritten, "cast", "32"), 1) << asWritten;
  EXPECT_EQ(ops(folded, "cast", "32"), 1) << folded;
  EXPECT_EQ(ops(folded, "add", "32"), 1) << folded;

  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal(0, 3);
  std::vector<float> scores(16 * 32), a(16 * 32, NAN), b(16 * 32, NAN);
  for (float& v : scores) v = normal(rng);
  k.interpret(plain, scores, a, 0.5f, 1000);
  k.interpret(fast, scores, b, 0.5f, 1000);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(b[i], a[i], 1e-5 * (1 + std::fabs(a[i]))) << i;
}

// An integer argument equal to 1 specializes the kernel as the constant 1 (Triton's rule): a
// gather through a captured-style stride then has contiguous addresses and loads vectors; another
// value compiles its own specialization with the stride kept. The parameter stays in the ABI.
TEST(DslSpecialization, IntegerArgumentsEqualToOneBecomeConstants) {
  Kernel k = kernel("strided_gather", [](Ptr<f32> src, Ptr<f32> out, Int stride) {
    Tile i = arange(0, 512);  // four elements a thread
    store(out + i, load(src + i * stride));
  });
  auto ptr = [](size_t bytes) { return KernelArg::deviceAddress(uint64_t(1) << 20, bytes); };
  LaunchOptions o{{1, 1, 1}, {}, 4, 1};
  const codegen::CompiledKernel& unit = k.compile(o, {ptr(1 << 12), ptr(1 << 12), KernelArg(1)}, codegen::Target::sm90a());
  const codegen::CompiledKernel& two = k.compile(o, {ptr(1 << 12), ptr(1 << 12), KernelArg(2)}, codegen::Target::sm90a());
  EXPECT_NE(&unit, &two);
  EXPECT_NE(unit.ir.find("arg_equal_to_one = [2]"), std::string::npos) << unit.ir;
  EXPECT_EQ(two.ir.find("arg_equal_to_one"), std::string::npos) << two.ir;
  EXPECT_NE(unit.ptx.find("ld.global.v4"), std::string::npos) << unit.ptx;
  EXPECT_EQ(two.ptx.find("ld.global.v4"), std::string::npos) << two.ptx;
  EXPECT_EQ(unit.params.size(), 3u);
  // Launching again with 1 finds the same specialization.
  EXPECT_EQ(&k.compile(o, {ptr(1 << 12), ptr(1 << 12), KernelArg(1)}, codegen::Target::sm90a()), &unit);
}
