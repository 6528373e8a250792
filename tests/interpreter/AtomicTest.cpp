// atomic_add on host memory: contention (every lane of every program on one
// address, programs on several threads), a histogram, i64 fixed-point sums,
// masked lanes that touch nothing and read 0, scalars, and the errors.
#include <algorithm>
#include <numeric>

#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every lane of every 64-lane program adds `one` to target[0]; the old values
// go to old[pid * 64 + lane].
std::unique_ptr<Function> contentionKernel(DType t) {
  auto f = std::make_unique<Function>("contention");
  Value* target = f->addParam(Type::pointer(t), "target");
  Value* old = f->addParam(Type::pointer(t), "old");
  Builder b(*f);
  Value* offs = blockOffsets(b, 64);
  Value* zeros = b.constantInt(Type(DType::I32, {64}), 0);
  Value* one = ir::isFloat(t) ? b.constant(Type(t, {64}), 1.0) : b.constantInt(Type(t, {64}), 1);
  Value* got = b.atomicAdd(ptrTile(b, target, zeros), one);
  b.store(ptrTile(b, old, offs), got);
  b.ret();
  return f;
}

TEST(InterpreterAtomic, ManyLanesOnOneAddressAddEveryOne) {
  for (DType t : {DType::F32, DType::I32, DType::I64}) {
    for (int threads : {1, 4}) {
      SCOPED_TRACE(std::string(dtypeName(t)) + ", threads " + std::to_string(threads));
      auto f = contentionKernel(t);
      const int programs = 32;
      HostBuf target(t, 1), old(t, 64 * programs);
      target.set(0, 0);
      interpret(*f, {target.arg(), old.arg()}, {programs, 1, 1}, InterpOptions{threads});
      EXPECT_EQ(target.get(0), 64.0 * programs);
      // Each add saw a different count: the old values are 0 .. 2047 in some order.
      std::vector<double> seen;
      for (size_t i = 0; i < old.size(); ++i) seen.push_back(old.get(i));
      std::sort(seen.begin(), seen.end());
      for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], double(i));
      // Within one program the lanes add in row-major order: lane i sees lane 0's count + i.
      if (threads == 1) {
        for (int p = 0; p < programs; ++p)
          for (int i = 0; i < 64; ++i) ASSERT_EQ(old.get(size_t(p * 64 + i)), old.get(size_t(p * 64)) + i);
      }
    }
  }
}

// counts[keys[i]] += 1 for i < n, 128 keys per program, masked at the end.
std::unique_ptr<Function> histogramKernel() {
  auto f = std::make_unique<Function>("histogram");
  Value* keys = f->addParam(Type::pointer(DType::I32), "keys");
  Value* counts = f->addParam(Type::pointer(DType::I32), "counts");
  Value* n = f->addParam(Type(DType::I32), "n");
  Builder b(*f);
  Value* offs = blockOffsets(b, 128);
  Value* ok = b.cmp("lt", offs, b.splat(n, {128}));
  Value* k = b.load(ptrTile(b, keys, offs), ok);
  b.atomicAdd(ptrTile(b, counts, k), b.constantInt(Type(DType::I32, {128}), 1), ok);
  b.ret();
  return f;
}

TEST(InterpreterAtomic, HistogramOfRandomKeys) {
  FT_SEEDED_RNG(rng);
  const int n = 1000, bins = 37;  // not a multiple of the block: the last program is masked
  HostBuf keys(DType::I32, n), counts(DType::I32, bins);
  std::vector<int64_t> want(bins, 0);
  for (int i = 0; i < n; ++i) {
    int64_t k = uniformInt(rng, 0, bins - 1);
    keys.setInt(size_t(i), k);
    ++want[size_t(k)];
  }
  for (int i = 0; i < bins; ++i) counts.setInt(size_t(i), 0);
  auto f = histogramKernel();
  interpret(*f, {keys.arg(), counts.arg(), InterpArg::integer(n)}, {(n + 127) / 128, 1, 1});
  for (int i = 0; i < bins; ++i) EXPECT_EQ(counts.getInt(size_t(i)), want[size_t(i)]) << "bin " << i;
}

// sums[i % 4] += values[i] (i64), 64 per program: fixed-point accumulation is
// exact in any order, beyond 32 bits too.
TEST(InterpreterAtomic, I64SumsAreExactInAnyOrder) {
  FT_SEEDED_RNG(rng);
  auto f = std::make_unique<Function>("fixed_point");
  Value* values = f->addParam(Type::pointer(DType::I64), "values");
  Value* sums = f->addParam(Type::pointer(DType::I64), "sums");
  Builder b(*f);
  Value* offs = blockOffsets(b, 64);
  Value* v = b.load(ptrTile(b, values, offs));
  Value* slot = b.binary(OpKind::And, offs, b.constantInt(Type(DType::I32, {64}), 3));
  b.atomicAdd(ptrTile(b, sums, slot), v);
  b.ret();
  const int programs = 16;
  HostBuf in(DType::I64, 64 * programs), out(DType::I64, 4);
  int64_t want[4] = {0, 0, 0, 0};
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t x = uniformInt(rng, -(int64_t(1) << 40), int64_t(1) << 40);
    in.setInt(i, x);
    want[i % 4] += x;
  }
  for (int s = 0; s < 4; ++s) out.setInt(size_t(s), 0);
  interpret(*f, {in.arg(), out.arg()}, {programs, 1, 1}, InterpOptions{4});
  for (int s = 0; s < 4; ++s) EXPECT_EQ(out.getInt(size_t(s)), want[s]);
}

TEST(InterpreterAtomic, I32SumsWrap) {
  auto f = contentionKernel(DType::I32);
  HostBuf target(DType::I32, 1), old(DType::I32, 64);
  target.setInt(0, INT32_MAX - 10);
  interpret(*f, {target.arg(), old.arg()}, {1, 1, 1});
  EXPECT_EQ(target.getInt(0), int64_t(INT32_MIN) + 53);
  EXPECT_EQ(old.getInt(11), int64_t(INT32_MIN));
}

// Lanes i >= n point past the end of `target` (n elements): masked off, they
// must touch nothing (no bounds error) and give 0, while the active lanes see
// the old values.
TEST(InterpreterAtomic, MaskedLanesTouchNothingAndGiveZero) {
  auto f = std::make_unique<Function>("masked");
  Value* target = f->addParam(Type::pointer(DType::F32), "target");
  Value* old = f->addParam(Type::pointer(DType::F32), "old");
  Value* n = f->addParam(Type(DType::I32), "n");
  Builder b(*f);
  b.setLoc({"masked.cpp", 5});
  Value* offs = b.arange(0, 64);
  Value* ok = b.cmp("lt", offs, b.splat(n, {64}));
  Value* got = b.atomicAdd(ptrTile(b, target, offs), b.constant(Type(DType::F32, {64}), 0.5), ok);
  b.store(ptrTile(b, old, offs), got);
  b.ret();
  const int live = 21;
  HostBuf t(DType::F32, live), o(DType::F32, 64);
  for (int i = 0; i < live; ++i) t.set(size_t(i), 2.0 + i);
  interpret(*f, {t.arg(), o.arg(), InterpArg::integer(live)}, {1, 1, 1});
  for (int i = 0; i < 64; ++i) EXPECT_EQ(o.get(size_t(i)), i < live ? 2.0 + i : 0.0) << i;
  for (int i = 0; i < live; ++i) EXPECT_EQ(t.get(size_t(i)), 2.5 + i) << i;
  // Unmasked, lane `live` is out of bounds, and the error says so.
  std::string msg = errorOf([&] { interpret(*f, {t.arg("target"), o.arg(), InterpArg::integer(64)}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "op 'atomic_add' (masked.cpp:5)")) << msg;
  EXPECT_TRUE(contains(msg, "out-of-bounds atomic_add of 4 bytes at tile element [21]")) << msg;
  EXPECT_TRUE(contains(msg, "'target'")) << msg;
}

// Every program of a 3-D grid adds 1 to one scalar and records what it saw.
TEST(InterpreterAtomic, AScalarFromEveryProgram) {
  auto f = std::make_unique<Function>("ticket");
  Value* counter = f->addParam(Type::pointer(DType::I32), "counter");
  Value* tickets = f->addParam(Type::pointer(DType::I32), "tickets");
  Builder b(*f);
  Value* x = b.programId(0);
  Value* y = b.programId(1);
  Value* z = b.programId(2);
  Value* id = b.binary(OpKind::Add, x,
                       b.binary(OpKind::Mul, b.constantInt(Type(DType::I32), 3),
                                b.binary(OpKind::Add, y, b.binary(OpKind::Mul, z, b.constantInt(Type(DType::I32), 4)))));
  Value* got = b.atomicAdd(counter, b.constantInt(Type(DType::I32), 1));
  b.store(b.addptr(tickets, id), got);
  b.ret();
  HostBuf c(DType::I32, 1), tk(DType::I32, 60);
  c.setInt(0, 0);
  interpret(*f, {c.arg(), tk.arg()}, {3, 4, 5}, InterpOptions{4});
  EXPECT_EQ(c.getInt(0), 60);
  std::vector<int64_t> seen;
  for (size_t i = 0; i < 60; ++i) seen.push_back(tk.getInt(i));
  std::sort(seen.begin(), seen.end());
  for (size_t i = 0; i < 60; ++i) EXPECT_EQ(seen[i], int64_t(i));
}

TEST(InterpreterAtomic, MalformedAtomicsAreRejectedBeforeRunning) {
  auto f = std::make_unique<Function>("bad");
  Value* p = f->addParam(Type::pointer(DType::F16), "p");
  Builder b(*f);
  b.atomicAdd(p, b.constant(Type(DType::F16), 1.0));
  b.ret();
  HostBuf buf(DType::F16, 1);
  std::string msg = errorOf([&] { interpret(*f, {buf.arg()}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "op 'atomic_add'")) << msg;
  EXPECT_TRUE(contains(msg, "adds f32, i32 or i64 atomically")) << msg;
}

}  // namespace
}  // namespace flextile::test
