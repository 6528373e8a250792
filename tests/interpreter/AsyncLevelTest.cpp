// The memory/async level in the interpreter (ir/Ops.def): a shared buffer's slots are written
// by async_copy (zero where the mask is off, nothing read there) and read by local_load; waits,
// commits, barriers and fences order nothing on the host. Bad slots are run-time errors naming
// the op; malformed async ops are the verifier's errors.
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A two-slot ring per program p: rows [4p, 4p + 4) of x (8 f16 each) copied into slot 1 under
// `row < n`, rows [4p + 4, 4p + 8) into slot 0 without a mask; slot `first` is stored to
// out[64p .. 64p + 32), the other to out[64p + 32 .. 64p + 64).
const char* kRing = R"(
func @ring(%x: ptr<f16>, %out: ptr<f16>, %n: i32, %first: i32) {
  %pid = program_id {axis = 0} : i32
  %rows = arange {start = 0, end = 4} : i32[4]
  %cols = arange {start = 0, end = 8} : i32[8]
  %c4 = constant {value = 4} : i32
  %c8 = constant {value = 8} : i32
  %c64 = constant {value = 64} : i32
  %rbase = mul %pid, %c4 : i32
  %rb = splat %rbase : i32[4]
  %r = add %rb, %rows : i32[4]
  %r2 = expand_dims %r {axis = 1} : i32[4,1]
  %r3 = broadcast %r2 : i32[4,8]
  %c2 = expand_dims %cols {axis = 0} : i32[1,8]
  %c3 = broadcast %c2 : i32[4,8]
  %eight = splat %c8 : i32[4,8]
  %roff = mul %r3, %eight : i32[4,8]
  %off = add %roff, %c3 : i32[4,8]
  %xs = splat %x : ptr<f16>[4,8]
  %p = addptr %xs, %off : ptr<f16>[4,8]
  %ns = splat %n : i32[4,8]
  %ok = cmp %r3, %ns {pred = "lt"} : i1[4,8]
  %next = constant {value = 32} : i32[4,8]
  %p2 = addptr %p, %next : ptr<f16>[4,8]
  %buf = local_alloc : smem<2 x f16[4,8], #ft.shared<[4, 8], order=[1,0], vec=8, perPhase=1, maxPhase=1, bytes=2>>
  %s0 = constant {value = 0} : i32
  %s1 = constant {value = 1} : i32
  barrier
  async_copy %buf, %s1, %p, %ok {vec = 2}
  async_commit
  async_copy %buf, %s0, %p2 {vec = 8}
  async_commit
  async_wait {pending = 0}
  fence_async_shared
  barrier
  %a = local_load %buf, %first : f16[4,8]
  %other = sub %s1, %first : i32
  %b = local_load %buf, %other : f16[4,8]
  %obase = mul %pid, %c64 : i32
  %os = splat %obase : i32[4,8]
  %o1 = add %os, %off : i32[4,8]
  %lo = constant {value = 0} : i32[4,8]
  %o = sub %o1, %roff : i32[4,8]
  %rowsOut = arange {start = 0, end = 4} : i32[4]
  %ro2 = expand_dims %rowsOut {axis = 1} : i32[4,1]
  %ro3 = broadcast %ro2 : i32[4,8]
  %ro = mul %ro3, %eight : i32[4,8]
  %oo = add %o, %ro : i32[4,8]
  %outs = splat %out : ptr<f16>[4,8]
  %q = addptr %outs, %oo : ptr<f16>[4,8]
  store %q, %a
  %half = constant {value = 32} : i32[4,8]
  %q2 = addptr %q, %half : ptr<f16>[4,8]
  store %q2, %b
  return
}
)";

std::vector<Eigen::half> runRing(const std::string& text, int64_t first);

TEST(InterpreterAsync, CopiesLandInTheirSlotsZeroFilledWhereMaskedAndPrintParseRoundTrips) {
  FT_SEEDED_RNG(rng);
  auto f = parseFunction(kRing, "ring.ftir");
  EXPECT_EQ(printFunction(*parseFunction(printFunction(*f))), printFunction(*f));
  const int programs = 3;
  const int n = int(uniformInt(rng, 1, 4 * programs - 1));  // slot 1's rows at or past n read nothing
  for (int first : {0, 1}) {
    SCOPED_TRACE("first slot " + std::to_string(first) + ", n " + std::to_string(n));
    std::vector<Eigen::half> x(size_t(programs) * 64 + 32), out(size_t(programs) * 64, Eigen::half(-7.0f));
    for (auto& v : x) v = Eigen::half(float(uniform(rng, -4, 4)));
    interpret(*f, {InterpArg::buffer(x.data(), x.size() * 2), InterpArg::buffer(out.data(), out.size() * 2),
                   InterpArg::integer(n), InterpArg::integer(first)},
              {programs, 1, 1});
    for (int p = 0; p < programs; ++p)
      for (int i = 0; i < 32; ++i) {
        const int row = 4 * p + i / 8;  // slot 1 holds rows [4p, 4p + 4), slot 0 the four after them
        const size_t src = size_t(row) * 8 + size_t(i % 8);
        const float slot1 = row < n ? float(x[src]) : 0.0f;
        const float slot0 = float(x[src + 32]);
        const float wantA = first == 1 ? slot1 : slot0, wantB = first == 1 ? slot0 : slot1;
        EXPECT_EQ(float(out[size_t(p) * 64 + size_t(i)]), wantA) << "program " << p << " element " << i;
        EXPECT_EQ(float(out[size_t(p) * 64 + 32 + size_t(i)]), wantB) << "program " << p << " element " << i;
      }
  }
  // A copy is in flight until an async_wait covers its group: waiting for all but the last group
  // leaves slot 0's copy in flight when it is read (on a GPU it may not have landed).
  std::string early = kRing;
  early.replace(early.find("async_wait {pending = 0}"), 24, "async_wait {pending = 1}");
  const std::string msg = errorOf([&] { runRing(early, 0); });
  EXPECT_TRUE(contains(msg, "reads slot 0 of %") && contains(msg, "while op 'async_copy'") &&
              contains(msg, "no async_wait covers its group"))
      << msg;
}

// The ring of kRing with its copies tracked by barriers in shared memory instead of commit groups:
// each slot's copies arrive on its barrier (async_copy_arrive) and the reads wait for phase 0 of
// it. Same results; waits on phases that never complete, barriers used before mbarrier_init or
// initialized twice are run-time errors naming the op, malformed ones the verifier's.
std::string barrierRing() {
  std::string text = kRing;
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  replace("  barrier\n  async_copy %buf, %s1, %p, %ok {vec = 2}\n  async_commit\n  async_copy %buf, %s0, %p2 {vec = 8}\n"
          "  async_commit\n  async_wait {pending = 0}\n",
          "  %bars = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>\n"
          "  mbarrier_init %bars\n  barrier\n"
          "  async_copy %buf, %s1, %p, %ok {vec = 2}\n  async_copy_arrive %bars, %s1\n"
          "  async_copy %buf, %s0, %p2 {vec = 8}\n  async_copy_arrive %bars, %s0\n"
          "  mbarrier_wait %bars, %s1, %s0\n  mbarrier_wait %bars, %s0, %s0\n");
  replace("  return\n}", "  mbarrier_arrive %bars, %s0\n  mbarrier_wait %bars, %s0, %s1\n  barrier\n  mbarrier_inval %bars\n  return\n}");
  return text;
}

std::vector<Eigen::half> runRing(const std::string& text, int64_t first) {
  auto f = parseFunction(text, "ring.ftir");
  std::vector<Eigen::half> x(96), out(64, Eigen::half(-7.0f));
  for (size_t i = 0; i < x.size(); ++i) x[i] = Eigen::half(float(i % 13) - 6.0f);
  interpret(*f, {InterpArg::buffer(x.data(), x.size() * 2), InterpArg::buffer(out.data(), out.size() * 2),
                 InterpArg::integer(3), InterpArg::integer(first)},
            {1, 1, 1});
  return out;
}

TEST(InterpreterAsync, BarriersInSharedMemoryTrackTheCopiesOfEachSlot) {
  const std::string text = barrierRing();
  auto f = parseFunction(text, "ring.ftir");
  EXPECT_EQ(printFunction(*parseFunction(printFunction(*f), "again")), printFunction(*f));
  for (int64_t first : {0, 1}) {
    const auto want = runRing(kRing, first), got = runRing(text, first);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(float(got[i]), float(want[i])) << "element " << i;
  }
  auto fails = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string t = text;
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    const std::string msg = errorOf([&] { runRing(t, 0); });
    EXPECT_TRUE(contains(msg, message)) << to << ": " << msg;
  };
  // Phase 0 of slot 1 completed; phase 1 never does.
  fails("mbarrier_wait %bars, %s1, %s0", "mbarrier_wait %bars, %s1, %s1",
        "waits on slot 1 for the phase of parity 1, which has not completed (1 completed so far)");
  fails("  mbarrier_init %bars\n", "", "slot 1 is not an initialized barrier (mbarrier_init first)");
  fails("  mbarrier_init %bars\n", "  mbarrier_init %bars\n  mbarrier_init %bars\n", "is already a barrier");
  fails("mbarrier_wait %bars, %s1, %s0", "mbarrier_wait %bars, %s1, %c4", "the phase parity must be 0 or 1, got 4");
  fails("mbarrier_arrive %bars, %s0", "mbarrier_arrive %buf, %s0", "must be a buffer of barriers");
  fails("mbarrier_wait %bars, %s0, %s1", "mbarrier_wait %bars, %s0, %r", "the phase parity");
  // Slot 1's copy is in flight until a wait on its barrier's phase: read without it, an error.
  fails("  mbarrier_wait %bars, %s1, %s0\n", "", "while op 'async_copy'");
}

// Regression: programs run one after another on one host thread, each with its own barriers: a
// program's local_alloc is fresh, not an initialized barrier, whatever bytes it got (the
// interpreter once kept "initialized" by the buffer's address, and a reused address failed a later
// program's mbarrier_init), and no program sees another's phases.
TEST(InterpreterAsync, EachProgramInitializesItsOwnBarriers) {
  auto f = parseFunction(barrierRing(), "ring.ftir");
  auto g = parseFunction(kRing, "ring.ftir");
  std::vector<Eigen::half> x(3 * 32 + 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = Eigen::half(float(i % 11) - 5.0f);
  auto run = [&](const Function& fn) {
    std::vector<Eigen::half> out(3 * 64, Eigen::half(-7.0f));
    interpret(fn, {InterpArg::buffer(x.data(), x.size() * 2), InterpArg::buffer(out.data(), out.size() * 2),
                   InterpArg::integer(9), InterpArg::integer(1)},
              {3, 1, 1}, {.threads = 1});
    return out;
  };
  const auto want = run(*g), got = run(*f);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(float(got[i]), float(want[i])) << "element " << i;
}

TEST(InterpreterAsync, ASlotOutsideTheBufferIsAnErrorNamingTheOp) {
  auto f = parseFunction(kRing, "ring.ftir");
  std::vector<Eigen::half> x(64 + 32), out(64);
  for (int64_t bad : {2, -1}) {
    const std::string msg = errorOf([&] {
      interpret(*f, {InterpArg::buffer(x.data(), x.size() * 2), InterpArg::buffer(out.data(), out.size() * 2),
                     InterpArg::integer(4), InterpArg::integer(bad)},
                {1, 1, 1});
    });
    EXPECT_TRUE(contains(msg, "op 'local_load'")) << msg;
    EXPECT_TRUE(contains(msg, "slot " + std::to_string(bad) + " is outside the buffer's 2 slots")) << msg;
  }
}

TEST(InterpreterAsync, MalformedAsyncOpsAreVerifierErrors) {
  struct Case {
    std::string from, to, message;
  };
  const std::vector<Case> cases = {
      {"async_copy %buf, %s1, %p, %ok {vec = 2}", "async_copy %buf, %s1, %p, %ok {vec = 1}",
       "copies 2 bytes per instruction"},
      {"async_copy %buf, %s0, %p2 {vec = 8}", "async_copy %buf, %s0, %p2", "vec"},
      {"%a = local_load %buf, %first : f16[4,8]", "%a = local_load %buf, %first : f32[4,8]", "one slot of"},
      {"async_wait {pending = 0}", "async_wait {pending = -1}", "pending"},
      {"%b = local_load %buf, %other : f16[4,8]", "%b = local_load %p, %other : f16[4,8]", "must be a shared buffer"},
      {"bytes=2>>", "bytes=4>>", "4-byte elements"},
      {"smem<2 x", "smem<0 x", "1 to 64 slots"},
  };
  for (const Case& c : cases) {
    std::string text = kRing;
    const size_t at = text.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    text.replace(at, c.from.size(), c.to);
    const std::string msg = errorOf([&] {
      auto f = parseFunction(text, "ring.ftir");
      std::vector<Eigen::half> x(96), out(64);
      interpret(*f, {InterpArg::buffer(x.data(), x.size() * 2), InterpArg::buffer(out.data(), out.size() * 2),
                     InterpArg::integer(4), InterpArg::integer(0)},
                {1, 1, 1});
    });
    EXPECT_TRUE(contains(msg, c.message)) << c.to << ": " << msg;
  }
}

// A TMA copy of a [4, 8] box at (batch, row0, col0) of a [2, rows, 8] f32 tensor with padded
// strides into slot 1: elements outside the tensor (rows below 0 or past `rows`, the 4 columns past
// 8 when col0 = 4) land as 0, the rest are the tensor's; the one-arrival barrier's phase completes
// with the program's mbarrier_expect_tx. Program p copies for row0 = 3p - 2.
const char* kTma = R"(
func @tma(%x: ptr<f32>, %out: ptr<f32>, %rows: i32, %bstride: i32, %rstride: i32, %batch: i32, %col0: i32) {
  %pid = program_id {axis = 0} : i32
  %c3 = constant {value = 3} : i32
  %c2 = constant {value = 2} : i32
  %c8 = constant {value = 8} : i32
  %c32 = constant {value = 32} : i32
  %two = constant {value = 2} : i32
  %p3 = mul %pid, %c3 : i32
  %row0 = sub %p3, %c2 : i32
  %buf = local_alloc : smem<2 x f32[4,8], #ft.shared<[4, 8], order=[1,0], vec=4, perPhase=1, maxPhase=1, bytes=4>>
  %bars = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>
  %s0 = constant {value = 0} : i32
  %s1 = constant {value = 1} : i32
  %on = constant {value = 1} : i1
  %off = constant {value = 0} : i1
  mbarrier_init %bars {arrivals = 1}
  barrier
  mbarrier_expect_tx %bars, %s1, %on {bytes = 128}
  tma_copy %buf, %s1, %bars, %s1, %on, %x, %two, %rows, %c8, %bstride, %rstride, %batch, %row0, %col0
  tma_copy %buf, %s1, %bars, %s1, %off, %x, %two, %rows, %c8, %bstride, %rstride, %s0, %s0, %s0
  mbarrier_wait %bars, %s1, %s0
  %t = local_load %buf, %s1 : f32[4,8]
  barrier
  mbarrier_inval %bars
  %r = arange {start = 0, end = 4} : i32[4]
  %c = arange {start = 0, end = 8} : i32[8]
  %r2 = expand_dims %r {axis = 1} : i32[4,1]
  %r3 = broadcast %r2 : i32[4,8]
  %cc = expand_dims %c {axis = 0} : i32[1,8]
  %c3b = broadcast %cc : i32[4,8]
  %eight = splat %c8 : i32[4,8]
  %ro = mul %r3, %eight : i32[4,8]
  %o1 = add %ro, %c3b : i32[4,8]
  %base = mul %pid, %c32 : i32
  %bs = splat %base : i32[4,8]
  %o = add %o1, %bs : i32[4,8]
  %os = splat %out : ptr<f32>[4,8]
  %po = addptr %os, %o : ptr<f32>[4,8]
  store %po, %t
  return
}
)";

std::string runTma(const std::string& text, std::vector<float>& x, int64_t col0, std::vector<float>* result = nullptr) {
  auto f = parseFunction(text, "tma.ftir");
  std::vector<float> out(4 * 32, -7.0f);
  const std::string msg = errorOf([&] {
    interpret(*f, {InterpArg::buffer(x.data(), x.size() * 4), InterpArg::buffer(out.data(), out.size() * 4),
                   InterpArg::integer(7), InterpArg::integer(100), InterpArg::integer(12), InterpArg::integer(1),
                   InterpArg::integer(col0)},
              {4, 1, 1}, {.threads = 1});
  });
  if (result) *result = out;
  return msg;
}

TEST(InterpreterAsync, TmaCopiesABoxZeroFilledOutsideTheTensor) {
  auto f = parseFunction(kTma, "tma.ftir");
  EXPECT_EQ(printFunction(*parseFunction(printFunction(*f), "again")), printFunction(*f));
  FT_SEEDED_RNG(rng);
  // [2, 7, 8] with batch stride 100 and row stride 12 (padding between rows and batches).
  std::vector<float> x(200);
  for (float& v : x) v = float(uniform(rng, -4, 4));
  for (int64_t col0 : {0, 4}) {
    std::vector<float> out;
    ASSERT_EQ(runTma(kTma, x, col0, &out), "");
    for (int p = 0; p < 4; ++p)
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 8; ++c) {
          const int64_t row = 3 * p - 2 + r, col = col0 + c;
          const float want = row >= 0 && row < 7 && col < 8 ? x[size_t(100 + row * 12 + col)] : 0.0f;
          EXPECT_EQ(out[size_t(32 * p + 8 * r + c)], want) << "program " << p << " row " << r << " col " << c << " col0 " << col0;
        }
  }
  auto fails = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string t = kTma;
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    const std::string msg = runTma(t, x, 0);
    EXPECT_TRUE(contains(msg, message)) << to << ": " << msg;
  };
  // A barrier counting every thread's arrival never completes with one expect_tx, and the reverse.
  fails("mbarrier_init %bars {arrivals = 1}", "mbarrier_init %bars", "arrives once for the program on a barrier that counts every thread's");
  fails("mbarrier_expect_tx %bars, %s1, %on {bytes = 128}", "mbarrier_arrive %bars, %s1", "every thread arrives on a barrier that counts one arrival");
  fails("mbarrier_expect_tx %bars, %s1, %on {bytes = 128}\n", "", "on which no mbarrier_expect_tx announced bytes");
  fails("mbarrier_wait %bars, %s1, %s0", "mbarrier_wait %bars, %s1, %s1", "which has not completed");
  // The copy is in flight until the wait: a read of its slot before it, or an inval, is an error.
  fails("mbarrier_wait %bars, %s1, %s0\n", "", "while op 'tma_copy'");
  // A refill of a slot read since the last barrier (no wait for its release either) races with
  // the warps still reading it; after a barrier it is the next phase's copy.
  const std::string refill =
      "  mbarrier_expect_tx %bars, %s1, %on {bytes = 128}\n"
      "  tma_copy %buf, %s1, %bars, %s1, %on, %x, %two, %rows, %c8, %bstride, %rstride, %batch, %row0, %col0\n"
      "  mbarrier_wait %bars, %s1, %s1\n";
  fails("  %t = local_load %buf, %s1 : f32[4,8]\n", "  %t = local_load %buf, %s1 : f32[4,8]\n" + refill,
        "which op 'local_load' read, with no barrier or wait for the slot's release between");
  {
    std::string t = kTma;
    const std::string read = "  %t = local_load %buf, %s1 : f32[4,8]\n";
    t.replace(t.find(read), read.size(), read + "  barrier\n" + refill);
    EXPECT_EQ(runTma(t, x, 0), "");
  }
  fails("tma_copy %buf, %s1, %bars, %s1, %on,", "tma_copy %buf, %s1, %bars, %c3, %on,", "barrier slot 3 is outside the buffer's 2 slots");
  // Malformed copies are the verifier's errors.
  fails("%rstride, %batch, %row0, %col0", "%rstride, %batch, %row0", "then R dims, R-1 strides and R coords");
  fails("tma_copy %buf, %s1, %bars, %s1, %on, %x,", "tma_copy %buf, %s1, %buf, %s1, %on, %x,", "must be a buffer of barriers");
  fails("tma_copy %buf, %s1, %bars, %s1, %on,", "tma_copy %buf, %s1, %bars, %s1, %s1,", "the issue predicate");
  fails("{bytes = 128}", "{bytes = -1}", "bytes");
}

// kTma with a release barrier and an async dot reading the slot: the slot is released (arrive on
// `empty`) once the wgmma_wait covers the dot, since the tensor cores read it until then. Released
// before the wait, the next copy into the slot (which waits on `empty`) could overwrite it: an
// error naming the arrive and the dot.
TEST(InterpreterAsync, ASlotIsReleasedOnlyAfterItsAsyncDotsComplete) {
  std::string text = kTma;
  auto replace = [&](std::string& t, const std::string& from, const std::string& to) {
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
  };
  const std::string bars =
      "  %bars = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>\n";
  replace(text, bars, bars + "  %empty = local_alloc : smem<2 x i64[1], #ft.shared<[1], order=[0], vec=1, perPhase=1, maxPhase=1, bytes=8>>\n");
  replace(text, "  mbarrier_init %bars {arrivals = 1}\n  barrier\n",
          "  mbarrier_init %bars {arrivals = 1}\n  mbarrier_init %empty\n  barrier\n  mbarrier_arrive %empty, %s1\n"
          "  mbarrier_wait %empty, %s1, %s0 {issuer = 1}\n");
  replace(text, "  %t = local_load %buf, %s1 : f32[4,8]\n",
          "  %t = local_load %buf, %s1 : f32[4,8]\n  %ones = constant {value = 1.0} : f32[4,4]\n"
          "  %zero = constant {value = 0.0} : f32[4,8]\n  %d = dot %ones, %t, %zero {async = 1} : f32[4,8]\n"
          "  %w = wgmma_wait %d {pending = 0} : f32[4,8]\n  mbarrier_arrive %empty, %s1\n");
  replace(text, "  mbarrier_inval %bars\n", "  mbarrier_inval %bars\n  mbarrier_inval %empty\n");
  replace(text, "  store %po, %t\n", "  store %po, %w\n");
  FT_SEEDED_RNG(rng);
  std::vector<float> x(200);
  for (float& v : x) v = float(uniform(rng, -4, 4));
  ASSERT_EQ(runTma(text, x, 0), "");
  std::string early = text;
  replace(early, "  %w = wgmma_wait %d {pending = 0} : f32[4,8]\n  mbarrier_arrive %empty, %s1\n",
          "  mbarrier_arrive %empty, %s1\n  %w = wgmma_wait %d {pending = 0} : f32[4,8]\n");
  const std::string msg = runTma(early, x, 0);
  EXPECT_TRUE(contains(msg, "releases slot 1 while op 'dot'") && contains(msg, "no wgmma_wait covers it")) << msg;
}

// A load that names its tile as a box of a tensor (load {tensor_rank}): its pointers and mask are
// the box's elements and the tensor's bounds (rows 3p - 2 .. 3p + 1 of [2, 7, 8] at batch 1, cols
// col0 .. col0 + 7), the value it reads is the pointer load's, and every way the box can disagree
// with them is an error naming the op: another element, a mask on outside the tensor, a nonzero
// `other` there (TMA fills 0). Malformed boxes are the verifier's.
const char* kBoxLoad = R"(
func @box(%x: ptr<f32>, %out: ptr<f32>, %rows: i32, %bstride: i32, %rstride: i32, %batch: i32, %col0: i32) {
  %pid = program_id {axis = 0} : i32
  %c3 = constant {value = 3} : i32
  %c2 = constant {value = 2} : i32
  %c8 = constant {value = 8} : i32
  %c32 = constant {value = 32} : i32
  %two = constant {value = 2} : i32
  %p3 = mul %pid, %c3 : i32
  %row0 = sub %p3, %c2 : i32
  %r = arange {start = 0, end = 4} : i32[4]
  %c = arange {start = 0, end = 8} : i32[8]
  %row0s = splat %row0 : i32[4]
  %rr = add %row0s, %r : i32[4]
  %rr2 = expand_dims %rr {axis = 1} : i32[4,1]
  %rr3 = broadcast %rr2 : i32[4,8]
  %col0s = splat %col0 : i32[8]
  %cc = add %col0s, %c : i32[8]
  %cc2 = expand_dims %cc {axis = 0} : i32[1,8]
  %cc3 = broadcast %cc2 : i32[4,8]
  %rs = splat %rstride : i32[4,8]
  %ro = mul %rr3, %rs : i32[4,8]
  %off0 = add %ro, %cc3 : i32[4,8]
  %bo = mul %batch, %bstride : i32
  %bos = splat %bo : i32[4,8]
  %off = add %off0, %bos : i32[4,8]
  %xs = splat %x : ptr<f32>[4,8]
  %p = addptr %xs, %off : ptr<f32>[4,8]
  %zero = constant {value = 0} : i32[4,8]
  %nrows = splat %rows : i32[4,8]
  %geq = cmp %rr3, %zero {pred = "ge"} : i1[4,8]
  %lt = cmp %rr3, %nrows {pred = "lt"} : i1[4,8]
  %ccap = constant {value = 8} : i32[4,8]
  %clt = cmp %cc3, %ccap {pred = "lt"} : i1[4,8]
  %m0 = and %geq, %lt : i1[4,8]
  %m = and %m0, %clt : i1[4,8]
  %z = constant {value = 0.0} : f32[4,8]
  %t = load %p, %m, %z, %x, %two, %rows, %c8, %bstride, %rstride, %batch, %row0, %col0 {tensor_rank = 3} : f32[4,8]
  %r4 = arange {start = 0, end = 4} : i32[4]
  %r5 = expand_dims %r4 {axis = 1} : i32[4,1]
  %r6 = broadcast %r5 : i32[4,8]
  %c4 = expand_dims %c {axis = 0} : i32[1,8]
  %c5 = broadcast %c4 : i32[4,8]
  %eight = splat %c8 : i32[4,8]
  %o0 = mul %r6, %eight : i32[4,8]
  %o1 = add %o0, %c5 : i32[4,8]
  %ob = mul %pid, %c32 : i32
  %obs = splat %ob : i32[4,8]
  %o = add %o1, %obs : i32[4,8]
  %os = splat %out : ptr<f32>[4,8]
  %po = addptr %os, %o : ptr<f32>[4,8]
  store %po, %t
  return
}
)";

TEST(InterpreterAsync, ALoadsTensorBoxMustNameItsOwnElements) {
  auto f = parseFunction(kBoxLoad, "box.ftir");
  EXPECT_EQ(printFunction(*parseFunction(printFunction(*f), "again")), printFunction(*f));
  FT_SEEDED_RNG(rng);
  std::vector<float> x(200);
  for (float& v : x) v = float(uniform(rng, -4, 4));
  auto run = [&](const std::string& text, int64_t col0, std::vector<float>* result = nullptr) {
    auto g = parseFunction(text, "box.ftir");
    std::vector<float> out(4 * 32, -7.0f);
    const std::string msg = errorOf([&] {
      interpret(*g, {InterpArg::buffer(x.data(), x.size() * 4), InterpArg::buffer(out.data(), out.size() * 4),
                     InterpArg::integer(7), InterpArg::integer(100), InterpArg::integer(12), InterpArg::integer(1),
                     InterpArg::integer(col0)},
                {4, 1, 1}, {.threads = 1});
    });
    if (result) *result = out;
    return msg;
  };
  for (int64_t col0 : {0, 4}) {
    std::vector<float> out;
    ASSERT_EQ(run(kBoxLoad, col0, &out), "");
    for (int p = 0; p < 4; ++p)
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 8; ++c) {
          const int64_t row = 3 * p - 2 + r, col = col0 + c;
          const float want = row >= 0 && row < 7 && col < 8 ? x[size_t(100 + row * 12 + col)] : 0.0f;
          EXPECT_EQ(out[size_t(32 * p + 8 * r + c)], want) << "program " << p << " row " << r << " col " << c;
        }
  }
  auto fails = [&](const std::string& from, const std::string& to, int64_t col0, const std::string& message) {
    std::string t = kBoxLoad;
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    const std::string msg = run(t, col0);
    EXPECT_TRUE(contains(msg, message)) << to << ": " << msg;
  };
  fails("%bo = mul %batch, %bstride", "%bo = mul %batch, %rstride", 0, "is not the tensor box's element there (byte offset");
  fails("%batch, %row0, %col0 {tensor_rank", "%batch, %p3, %col0 {tensor_rank", 0, "its mask is off at tile element");
  fails("%m = and %m0, %clt", "%m = and %m0, %m0", 4, "its mask is on at tile element");
  fails("%z = constant {value = 0.0}", "%z = constant {value = 1.0}", 0, "reads a nonzero `other`");
  fails("%batch, %row0, %col0 {tensor_rank", "%batch, %row0 {tensor_rank", 0, "with tensor_rank = 3 takes");
  fails("{tensor_rank = 3}", "{tensor_rank = 6}", 0, "'tensor_rank' must be an integer from 1 to 5");
  fails("%t = load %p, %m, %z, %x,", "%t = load %p, %m, %z, %out,", 0, "another buffer than the box's base");
  fails("%two, %rows, %c8,", "%two, %rows, %z,", 0, "a dim, stride or coordinate of the tensor box");
}

// The same box on an atomic_add (atomic_add {tensor_rank}: what lets the bulk-reduce pass add the
// tile by TMA): the elements inside the tensor get one each per program that covers them, and the
// same disagreements are errors naming the op.
TEST(InterpreterAsync, AnAtomicAddsTensorBoxMustNameItsOwnElements) {
  std::string atomic = kBoxLoad;
  const std::string load = "%t = load %p, %m, %z, %x,";
  atomic.replace(atomic.find(load), load.size(),
                 "%one = constant {value = 1.0} : f32[4,8]\n  %t = atomic_add %p, %one, %m, %x,");
  auto run = [&](const std::string& text, std::vector<float>& x) {
    auto g = parseFunction(text, "box.ftir");
    std::vector<float> out(4 * 32, -7.0f);
    return errorOf([&] {
      interpret(*g, {InterpArg::buffer(x.data(), x.size() * 4), InterpArg::buffer(out.data(), out.size() * 4),
                     InterpArg::integer(7), InterpArg::integer(100), InterpArg::integer(12), InterpArg::integer(1),
                     InterpArg::integer(0)},
                {4, 1, 1}, {.threads = 1});
    });
  };
  std::vector<float> x(200, 0.0f);
  ASSERT_EQ(run(atomic, x), "");
  for (int64_t row = 0; row < 7; ++row)
    for (int64_t col = 0; col < 12; ++col) {
      int64_t programs = 0;
      for (int64_t p = 0; p < 4; ++p) programs += col < 8 && row >= 3 * p - 2 && row <= 3 * p + 1;
      EXPECT_EQ(x[size_t(100 + row * 12 + col)], float(programs)) << "row " << row << " col " << col;
    }
  auto fails = [&](const std::string& from, const std::string& to, const std::string& message) {
    std::string t = atomic;
    const size_t at = t.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    std::vector<float> y(200, 0.0f);
    const std::string msg = run(t, y);
    EXPECT_TRUE(contains(msg, "atomic_add") && contains(msg, message)) << to << ": " << msg;
  };
  fails("%bo = mul %batch, %bstride", "%bo = mul %batch, %rstride",
        "is not the tensor box's element there (byte offset");
  fails("%batch, %row0, %col0 {tensor_rank", "%batch, %p3, %col0 {tensor_rank", "its mask is off at tile element");
  fails("%lt = cmp %rr3, %nrows {pred = \"lt\"}", "%lt = cmp %rr3, %nrows {pred = \"le\"}",
        "its mask is on at tile element");
  fails("%batch, %row0, %col0 {tensor_rank", "%batch, %row0 {tensor_rank", "with tensor_rank = 3 takes p, value, mask");
  fails("%one, %m, %x,", "%one, %m, %out,", "another buffer than the box's base");
}

}  // namespace
}  // namespace flextile::test
