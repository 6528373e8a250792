// Loads and stores: bounds and alignment errors with their messages, masked
// accesses outside buffers, i1/f16 memory formats; arguments, grids, loops and
// malformed programs.
#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// out[i] = x[i] over a grid of 64-element blocks with optional masks on the
// load and the store.
std::unique_ptr<Function> copyKernel(bool maskLoad, bool maskStore) {
  auto f = std::make_unique<Function>("copy");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Value* n = f->addParam(Type(DType::I32), "n");
  Builder b(*f);
  b.setLoc({"copy_kernel.cpp", 7});
  Value* offs = blockOffsets(b, 64);
  Value* mask = b.cmp("lt", offs, b.splat(n, {64}));
  Value* v = b.load(ptrTile(b, x, offs), maskLoad ? mask : nullptr);
  b.setLoc({"copy_kernel.cpp", 9});
  b.store(ptrTile(b, out, offs), v, maskStore ? mask : nullptr);
  b.ret();
  return f;
}

TEST(InterpreterMemory, OutOfBoundsLoadNamesOpProgramElementBufferOffset) {
  auto f = copyKernel(false, true);
  HostBuf x(DType::F32, 100), out(DType::F32, 100);
  for (int threads : {1, 4}) {
    // Programs 1, 2 and 3 all read past x; the lowest is reported whatever the scheduling.
    std::string msg = errorOf([&] {
      interpret(*f, {x.arg("x_buf"), out.arg(), InterpArg::integer(100)}, {4, 1, 1}, InterpOptions{threads});
    });
    EXPECT_TRUE(contains(msg, "op 'load' (copy_kernel.cpp:7)")) << msg;
    EXPECT_TRUE(contains(msg, "program (1, 0, 0)")) << msg;
    EXPECT_TRUE(contains(msg, "out-of-bounds")) << msg;
    EXPECT_TRUE(contains(msg, "[36]")) << msg;  // element 64 + 36 = 100 is the first outside
    EXPECT_TRUE(contains(msg, "byte offset 400")) << msg;
    EXPECT_TRUE(contains(msg, "'x_buf'")) << msg;
    EXPECT_TRUE(contains(msg, "400 bytes")) << msg;
  }
}

TEST(InterpreterMemory, OutOfBoundsStoreUsesTheParameterNameByDefault) {
  auto f = copyKernel(true, false);
  HostBuf x(DType::F32, 70), out(DType::F32, 70);
  std::string msg = errorOf([&] { interpret(*f, {x.arg(), out.arg(), InterpArg::integer(70)}, {2, 1, 1}); });
  EXPECT_TRUE(contains(msg, "op 'store' (copy_kernel.cpp:9)")) << msg;
  EXPECT_TRUE(contains(msg, "program (1, 0, 0)")) << msg;
  EXPECT_TRUE(contains(msg, "[6]")) << msg;
  EXPECT_TRUE(contains(msg, "byte offset 280")) << msg;
  EXPECT_TRUE(contains(msg, "'out'")) << msg;
}

TEST(InterpreterMemory, MaskedOffAccessesFarOutsideAreNeverTouched) {
  // Pointers start a million elements before the buffer; only in-range lanes are active.
  auto f = std::make_unique<Function>("far");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Builder b(*f);
  Value* offs = b.binary(OpKind::Add, b.arange(0, 128), b.constantInt(Type(DType::I32, {128}), -1000000));
  Value* real = b.binary(OpKind::Add, offs, b.constantInt(Type(DType::I32, {128}), 1000000));
  Value* ok = b.cmp("lt", real, b.constantInt(Type(DType::I32, {128}), 3));
  Value* v = b.load(b.addptr(ptrTile(b, x, offs), b.constantInt(Type(DType::I32, {128}), 1000000)), ok,
                    b.constant(Type(DType::F32, {128}), 7.0));
  Value* far = ptrTile(b, out, offs);
  b.store(b.addptr(far, b.constantInt(Type(DType::I32, {128}), 1000000)), v, ok);
  b.store(far, v, b.cmp("lt", real, b.constantInt(Type(DType::I32, {128}), 0)));  // all lanes off
  b.ret();
  HostBuf xb(DType::F32, 3), ob(DType::F32, 3);
  for (size_t i = 0; i < 3; ++i) xb.set(i, double(i) + 0.5);
  ob.poison();
  interpret(*f, {xb.arg(), ob.arg()}, {1, 1, 1});
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ob.get(i), double(i) + 0.5);
}

TEST(InterpreterMemory, MisalignedAccessIsAnError) {
  // A buffer one byte past an f32 boundary: inside it, but misaligned (pointer casts, the other way
  // to a misaligned address, are refused by the verifier; see MalformedProgramsAreErrorsNamingTheOp).
  auto f = std::make_unique<Function>("misaligned");
  Value* x = f->addParam(Type::pointer(DType::F32), "x");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Builder b(*f);
  b.store(out, b.load(b.addptr(x, b.constantInt(Type(DType::I32), 1))));
  b.ret();
  HostBuf xb(DType::F32, 4), ob(DType::F32, 1);
  ob.poison();
  char* shifted = static_cast<char*>(xb.arg().base()) + 1;
  std::string msg = errorOf([&] { interpret(*f, {InterpArg::buffer(shifted, 12, "x"), ob.arg()}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "op 'load'")) << msg;
  EXPECT_TRUE(contains(msg, "misaligned")) << msg;
  EXPECT_TRUE(contains(msg, "byte offset 4")) << msg;
  EXPECT_TRUE(contains(msg, "(scalar)")) << msg;
  EXPECT_TRUE(ob.poisoned(0)) << "the misaligned load stored something";
}

TEST(InterpreterMemory, MemoryFormatsOfBoolAndHalf) {
  // i1 loads read any nonzero byte as true and stores write 0/1; f16 round-trips bits.
  auto f = std::make_unique<Function>("formats");
  Value* in1 = f->addParam(Type::pointer(DType::I1), "in1");
  Value* out1 = f->addParam(Type::pointer(DType::I1), "out1");
  Value* outI = f->addParam(Type::pointer(DType::I32), "outI");
  Builder b(*f);
  Value* offs = b.arange(0, 4);
  Value* v = b.load(ptrTile(b, in1, offs));
  b.store(ptrTile(b, out1, offs), v);
  b.store(ptrTile(b, outI, offs), b.cast(v, DType::I32));
  b.ret();
  HostBuf i1(DType::I1, 4), o1(DType::I1, 4), oi(DType::I32, 4);
  const uint8_t bytes[4] = {0, 1, 2, 255};
  std::memcpy(i1.bytePtr(), bytes, 4);
  o1.poison();
  oi.poison();
  interpret(*f, {i1.arg(), o1.arg(), oi.arg()}, {1, 1, 1});
  const int want[4] = {0, 1, 1, 1};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(uint8_t(o1.bytePtr()[k]), want[k]);
    EXPECT_EQ(oi.getInt(k), want[k]);
  }
}

// ---- arguments, grids, loops -----------------------------------------------

TEST(InterpreterArgs, WrongCountOrKindNamesTheParameter) {
  auto f = copyKernel(true, true);
  HostBuf x(DType::F32, 8), out(DType::F32, 8);
  std::string msg = errorOf([&] { interpret(*f, {x.arg(), out.arg()}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "2 arguments for 3 parameters")) << msg;
  EXPECT_TRUE(contains(msg, "'n'")) << msg;
  msg = errorOf([&] { interpret(*f, {x.arg(), InterpArg::integer(3), InterpArg::integer(8)}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "parameter 1 'out'")) << msg;
  EXPECT_TRUE(contains(msg, "expects a buffer")) << msg;
  msg = errorOf([&] { interpret(*f, {x.arg(), out.arg(), InterpArg::real(8)}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "'n'") && contains(msg, "expects an integer")) << msg;
  msg = errorOf([&] { interpret(*f, {x.arg(), out.arg(), InterpArg::integer(int64_t(1) << 40)}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "'n'") && contains(msg, "does not fit")) << msg;
  msg = errorOf([&] { interpret(*f, {x.arg(), out.arg(), InterpArg::integer(8)}, {-1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "grid")) << msg;
}

TEST(InterpreterArgs, RealParametersRoundToTheirDType) {
  auto f = std::make_unique<Function>("scale");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Value* s16 = f->addParam(Type(DType::F16), "s16");
  Value* s32 = f->addParam(Type(DType::F32), "s32");
  Builder b(*f);
  b.store(out, b.cast(s16, DType::F32));
  b.store(b.addptr(out, b.constantInt(Type(DType::I32), 1)), s32);
  b.ret();
  HostBuf o(DType::F32, 2);
  o.poison();
  interpret(*f, {o.arg(), InterpArg::real(0.3), InterpArg::real(0.3)}, {1, 1, 1});
  EXPECT_EQ(o.get(0), roundTo(0.3, DType::F16));
  EXPECT_EQ(o.get(1), double(0.3f));
  std::string msg = errorOf([&] { interpret(*f, {o.arg(), InterpArg::integer(1), InterpArg::real(1)}, {1, 1, 1}); });
  EXPECT_TRUE(contains(msg, "'s16'") && contains(msg, "expects a real")) << msg;
}

TEST(InterpreterGrid, EveryProgramRunsOnceWithItsIds) {
  // out[linear] = pid0 + 10 pid1 + 100 pid2 + 1000 (np0 + 10 np1 + 100 np2)
  auto f = std::make_unique<Function>("ids");
  Value* out = f->addParam(Type::pointer(DType::I32), "out");
  Builder b(*f);
  auto c = [&](int64_t v) { return b.constantInt(Type(DType::I32), v); };
  auto mul = [&](Value* a, Value* x) { return b.binary(OpKind::Mul, a, x); };
  auto add = [&](Value* a, Value* x) { return b.binary(OpKind::Add, a, x); };
  Value *p0 = b.programId(0), *p1 = b.programId(1), *p2 = b.programId(2);
  Value *n0 = b.numPrograms(0), *n1 = b.numPrograms(1), *n2 = b.numPrograms(2);
  Value* linear = add(p0, mul(n0, add(p1, mul(n1, p2))));
  Value* ids = add(add(p0, mul(c(10), p1)), mul(c(100), p2));
  Value* nps = add(add(n0, mul(c(10), n1)), mul(c(100), n2));
  b.store(b.addptr(out, linear), add(ids, mul(c(1000), nps)));
  b.ret();
  const std::array<int64_t, 3> grid{3, 2, 5};
  HostBuf o(DType::I32, 30);
  for (int threads : {1, 2, 7}) {
    o.poison();
    interpret(*f, {o.arg()}, grid, InterpOptions{threads});
    for (int64_t z = 0; z < 5; ++z)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t x = 0; x < 3; ++x)
          ASSERT_EQ(o.getInt(size_t(x + 3 * (y + 2 * z))), x + 10 * y + 100 * z + 1000 * (3 + 20 + 500));
  }
  o.poison();
  interpret(*f, {o.arg()}, {0, 2, 5});  // an empty grid runs nothing
  for (size_t i = 0; i < 30; ++i) EXPECT_TRUE(o.poisoned(i));
}

TEST(InterpreterFor, CarriedValuesInductionVariableAndNesting) {
  // s = sum over i in [lb, ub) step st of (i + sum over j in [0, i) of 1), carried in a scalar and a tile.
  auto f = std::make_unique<Function>("loops");
  Value* out = f->addParam(Type::pointer(DType::I64), "out");
  Value* lb = f->addParam(Type(DType::I32), "lb");
  Value* ub = f->addParam(Type(DType::I32), "ub");
  Value* st = f->addParam(Type(DType::I32), "st");
  Builder b(*f);
  Value* zero = b.constantInt(Type(DType::I64), 0);
  Value* zeros = b.constantInt(Type(DType::I64, {4}), 0);
  auto res = b.forLoop(lb, ub, st, {zero, zeros}, [&](Value* i, std::vector<Value*> c) -> std::vector<Value*> {
    auto inner = b.forLoop(b.constantInt(Type(DType::I32), 0), i, b.constantInt(Type(DType::I32), 1), {c[0]},
                           [&](Value*, std::vector<Value*> d) -> std::vector<Value*> {
                             return {b.binary(OpKind::Add, d[0], b.constantInt(Type(DType::I64), 1))};
                           });
    Value* i64 = b.cast(i, DType::I64);
    Value* tile = b.binary(OpKind::Add, c[1], b.binary(OpKind::Mul, b.splat(i64, {4}), b.cast(b.arange(0, 4), DType::I64)));
    return {b.binary(OpKind::Add, inner[0], i64), tile};
  });
  b.store(out, res[0]);
  b.store(ptrTile(b, b.addptr(out, b.constantInt(Type(DType::I32), 1)), b.arange(0, 4)), res[1]);
  b.ret();
  for (auto [l, u, s] : std::vector<std::array<int64_t, 3>>{{3, 17, 4}, {0, 10, 1}, {5, 5, 1}, {9, 2, 3}, {-7, 6, 5}}) {
    HostBuf o(DType::I64, 5);
    o.poison();
    interpret(*f, {o.arg(), InterpArg::integer(l), InterpArg::integer(u), InterpArg::integer(s)}, {1, 1, 1});
    int64_t sum = 0, ivSum = 0;
    for (int64_t i = l; i < u; i += s) {
      sum += std::max<int64_t>(i, 0) + i;
      ivSum += i;
    }
    EXPECT_EQ(o.getInt(0), sum) << l << " " << u << " " << s;
    for (size_t k = 0; k < 4; ++k) EXPECT_EQ(o.getInt(1 + k), ivSum * int64_t(k));
  }
  HostBuf o(DType::I64, 5);
  std::string msg = errorOf([&] {
    interpret(*f, {o.arg(), InterpArg::integer(0), InterpArg::integer(4), InterpArg::integer(0)}, {1, 1, 1});
  });
  EXPECT_TRUE(contains(msg, "op 'for'") && contains(msg, "step 0")) << msg;
}

TEST(InterpreterChecks, MalformedProgramsAreErrorsNamingTheOp) {
  {
    auto f = std::make_unique<Function>("bad_add");
    Builder b(*f);
    b.setLoc({"bad.cpp", 3});
    Value* a = b.constant(Type(DType::F32, {4}), 1.0);
    Value* c = b.constant(Type(DType::F32, {8}), 1.0);
    b.create1(OpKind::Add, {a, c}, Type(DType::F32, {4}));
    b.ret();
    std::string msg = errorOf([&] { interpret(*f, {}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "op 'add' (bad.cpp:3)") && contains(msg, "[8]")) << msg;
  }
  {
    auto f = std::make_unique<Function>("bad_exp");
    Builder b(*f);
    b.unary(OpKind::Exp, b.constantInt(Type(DType::I32, {4}), 1));
    b.ret();
    std::string msg = errorOf([&] { interpret(*f, {}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "op 'exp'") && contains(msg, "float")) << msg;
  }
  {
    auto f = std::make_unique<Function>("bad_dot");
    Builder b(*f);
    Value* a = b.constant(Type(DType::F32, {4, 8}), 1.0);
    Value* c = b.constant(Type(DType::F32, {4, 4}), 1.0);
    b.dot(a, a, c);
    b.ret();
    std::string msg = errorOf([&] { interpret(*f, {}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "op 'dot'") && contains(msg, "f32[4,8], f32[4,8], f32[4,4]")) << msg;
  }
  {
    // Batched (rank-3) dots are not tile IR: the interpreter refuses what the compiler refuses.
    auto f = std::make_unique<Function>("batched_dot");
    Builder b(*f);
    Value* a = b.constant(Type(DType::F32, {2, 4, 4}), 1.0);
    b.dot(a, a, a);
    b.ret();
    std::string msg = errorOf([&] { interpret(*f, {}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "op 'dot'") && contains(msg, "needs a[M,K] b[K,N] acc[M,N]")) << msg;
  }
  {
    // Pointer casts, a scalar broadcast (splat is the op for that) and an integer constant that does
    // not fit its dtype: all problems are listed, each naming its op and source line.
    auto f = std::make_unique<Function>("several");
    Value* x = f->addParam(Type::pointer(DType::F32), "x");
    Builder b(*f);
    b.setLoc({"several.cpp", 7});
    b.create1(OpKind::Cast, {x}, Type::pointer(DType::I8));
    b.setLoc({"several.cpp", 8});
    b.broadcast(b.constant(Type(DType::F32), 1.0), {4, 8});
    b.setLoc({"several.cpp", 9});
    b.constantInt(Type(DType::I32), (int64_t(1) << 32) + 5);
    b.ret();
    HostBuf xb(DType::F32, 4);
    std::string msg = errorOf([&] { interpret(*f, {xb.arg()}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "3 problems")) << msg;
    EXPECT_TRUE(contains(msg, "op 'cast' (several.cpp:7)") && contains(msg, "no pointer casts")) << msg;
    EXPECT_TRUE(contains(msg, "op 'broadcast' (several.cpp:8)") && contains(msg, "cannot broadcast f32 to f32[4,8]")) << msg;
    EXPECT_TRUE(contains(msg, "op 'constant' (several.cpp:9)") && contains(msg, "does not fit in i32")) << msg;
  }
  {
    // Pointers have no order: only eq and ne compare them.
    auto f = std::make_unique<Function>("ptr_lt");
    Value* x = f->addParam(Type::pointer(DType::F32), "x");
    Builder b(*f);
    b.cmp("lt", x, x);
    b.ret();
    HostBuf xb(DType::F32, 4);
    std::string msg = errorOf([&] { interpret(*f, {xb.arg()}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "op 'cmp'") && contains(msg, "pointers compare only with eq or ne")) << msg;
  }
  {
    // A value of a loop body used after the loop.
    auto f = std::make_unique<Function>("escape");
    Builder b(*f);
    Value* leaked = nullptr;
    Value* zero = b.constantInt(Type(DType::I32), 0);
    b.forLoop(zero, zero, b.constantInt(Type(DType::I32), 1), {}, [&](Value* iv, std::vector<Value*>) {
      leaked = b.binary(OpKind::Add, iv, iv);
      return std::vector<Value*>{};
    });
    b.binary(OpKind::Mul, leaked, leaked);
    b.ret();
    std::string msg = errorOf([&] { interpret(*f, {}, {1, 1, 1}); });
    EXPECT_TRUE(contains(msg, "op 'mul'") && contains(msg, "not defined")) << msg;
  }
}

}  // namespace
}  // namespace flextile::test
