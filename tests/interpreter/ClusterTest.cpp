// cluster_all_gather in the interpreter (ir/Ops.def, ir/Interpreter.h): the programs of a cluster
// run at once and each receives every rank's operands; a program that returns while its cluster
// waits at a gather, a cluster mate's failure, and a grid that clusters do not divide are errors
// that name what went wrong — never a hang.
#include "ir/Parser.h"
#include "ir/Printer.h"
#include "tests/interpreter/TestUtil.h"

namespace flextile::test {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Program (p, y) loads its 8 values x[(y * P + p) * 8 ..] (P = grid x), gathers them and its
// program id p over its cluster of SIZE, and stores sum_r (r + 1) * values_r + sum_r pid_r to
// out[(y * P + p) * 8 ..]: weights by rank, so a rank given another's values shows.
std::string gatherProgram(int64_t size, const std::string& gatherTrips = "") {
  std::string results, types, weighted;
  for (int64_t r = 0; r < size; ++r) {
    results += "%v" + std::to_string(r) + ", ";
    types += "f32[8], ";
  }
  std::string pidResults, pidTypes;
  for (int64_t r = 0; r < size; ++r) {
    pidResults += std::string(r ? ", " : "") + "%q" + std::to_string(r);
    pidTypes += std::string(r ? ", " : "") + "i32";
  }
  std::string sum = "  %acc0 = constant {value = 0.0} : f32[8]\n  %pacc0 = constant {value = 0} : i32\n";
  for (int64_t r = 0; r < size; ++r) {
    const std::string s = std::to_string(r), n = std::to_string(r + 1);
    sum += "  %w" + s + " = constant {value = " + n + ".0} : f32[8]\n";
    sum += "  %m" + s + " = mul %v" + s + ", %w" + s + " : f32[8]\n";
    sum += "  %acc" + n + " = add %acc" + s + ", %m" + s + " : f32[8]\n";
    sum += "  %pacc" + n + " = add %pacc" + s + ", %q" + s + " : i32\n";
  }
  const std::string last = std::to_string(size);
  std::string gather = "  " + results + pidResults + " = cluster_all_gather %v, %pid {size = " + std::to_string(size) +
                       "} : " + types + pidTypes + "\n" + sum +
                       "  %pf = cast %pacc" + last + " : f32\n  %ps = splat %pf : f32[8]\n  %o = add %acc" + last +
                       ", %ps : f32[8]\n  store %po, %o\n";
  if (!gatherTrips.empty())  // the gather inside a loop of `gatherTrips` trips (an `if`)
    gather = "  %zero = constant {value = 0} : i32\n  %one = constant {value = 1} : i32\n  for %zero, " + gatherTrips +
             ", %one {\n  ^bb(%it: i32):\n" + gather + "    yield\n  }\n";
  return R"(
func @gather(%x: ptr<f32>, %out: ptr<f32>, %n: i32) {
  %pid = program_id {axis = 0} : i32
  %y = program_id {axis = 1} : i32
  %np = num_programs {axis = 0} : i32
  %row0 = mul %y, %np : i32
  %row = add %row0, %pid : i32
  %c8 = constant {value = 8} : i32
  %base = mul %row, %c8 : i32
  %b = splat %base : i32[8]
  %r = arange {start = 0, end = 8} : i32[8]
  %i = add %b, %r : i32[8]
  %xs = splat %x : ptr<f32>[8]
  %px = addptr %xs, %i : ptr<f32>[8]
  %ns = splat %n : i32[8]
  %ok = cmp %i, %ns {pred = "lt"} : i1[8]
  %v = load %px, %ok : f32[8]
  %outs = splat %out : ptr<f32>[8]
  %po = addptr %outs, %i : ptr<f32>[8]
)" + gather + "  return\n}\n";
}

TEST(InterpreterCluster, EveryRankReceivesEveryRanksOperands) {
  FT_SEEDED_RNG(rng);
  for (int64_t size : {2, 3, 6, 8}) {
    auto f = parseFunction(gatherProgram(size), "gather.ftir");
    EXPECT_EQ(printFunction(*parseFunction(printFunction(*f))), printFunction(*f));
    const int64_t clusters = uniformInt(rng, 1, 3), P = size * clusters, Y = uniformInt(rng, 1, 3);
    const int64_t threads = uniformInt(rng, 1, 4);  // one host thread still runs a cluster at once
    SCOPED_TRACE("size " + std::to_string(size) + ", grid " + std::to_string(P) + " x " + std::to_string(Y) +
                 ", threads " + std::to_string(threads));
    std::vector<float> x(size_t(P * Y * 8)), out(x.size(), std::nanf(""));
    for (float& v : x) v = float(uniform(rng, -2, 2));
    interpret(*f, {InterpArg::buffer(x.data(), x.size() * 4), InterpArg::buffer(out.data(), out.size() * 4),
                   InterpArg::integer(int64_t(x.size()))},
              {P, Y, 1}, InterpOptions{.threads = int(threads)});
    for (int64_t y = 0; y < Y; ++y)
      for (int64_t p = 0; p < P; ++p)
        for (int64_t e = 0; e < 8; ++e) {
          const int64_t first = p - p % size;  // rank 0 of p's cluster
          double want = 0, pids = 0;
          for (int64_t r = 0; r < size; ++r) {
            want += double(r + 1) * double(x[size_t(((y * P) + first + r) * 8 + e)]);
            pids += double(first + r);
          }
          EXPECT_NEAR(out[size_t((y * P + p) * 8 + e)], want + pids, 1e-4 * (1 + std::abs(want + pids)))
              << "program (" << p << ", " << y << ") element " << e;
        }
  }
}

// {to = t, rows = 4}: only rank t receives, and only the first 4 of the 8 values a program holds
// (the rest arrive as 0); every other program sees its own values as every rank's.
TEST(InterpreterCluster, OnlyTheReceivingRankGetsOnlyTheCrossingRows) {
  FT_SEEDED_RNG(rng);
  const int64_t size = 4, to = uniformInt(rng, 0, size - 1), P = 2 * size;
  std::string text = gatherProgram(size);
  const std::string attr = "{size = 4}";
  text.replace(text.find(attr), attr.size(), "{rows = 4, size = 4, to = " + std::to_string(to) + "}");
  auto f = parseFunction(text, "to.ftir");
  EXPECT_EQ(printFunction(*parseFunction(printFunction(*f))), printFunction(*f));
  std::vector<float> x(size_t(P * 8)), out(x.size(), std::nanf(""));
  for (float& v : x) v = float(uniform(rng, -2, 2));
  interpret(*f, {InterpArg::buffer(x.data(), x.size() * 4), InterpArg::buffer(out.data(), out.size() * 4),
                 InterpArg::integer(int64_t(x.size()))},
            {P, 1, 1});
  for (int64_t p = 0; p < P; ++p)
    for (int64_t e = 0; e < 8; ++e) {
      const int64_t first = p - p % size;
      double want = 0, pids = 0;
      for (int64_t r = 0; r < size; ++r) {
        const bool receives = p % size == to;
        const int64_t from = receives ? first + r : p;  // the others see only themselves
        want += receives && e >= 4 ? 0.0 : double(r + 1) * double(x[size_t(from * 8 + e)]);
        pids += double(receives ? first + r : p);
      }
      EXPECT_NEAR(out[size_t(p * 8 + e)], want + pids, 1e-4 * (1 + std::abs(want + pids)))
          << "program " << p << " element " << e << " (to " << to << ")";
    }
}

TEST(InterpreterCluster, AProgramThatSkipsTheGatherIsAnErrorNotAHang) {
  // Only rank 0 of each cluster gathers (a loop of pid == 0 trips): the others return.
  std::string text = gatherProgram(4, "%first");
  text.replace(text.find("  %outs"), 0, "  %z = constant {value = 0} : i32\n  %isFirst = cmp %pid, %z {pred = \"eq\"} : i1\n"
                                          "  %first = cast %isFirst : i32\n");
  auto f = parseFunction(text, "skip.ftir");
  std::vector<float> x(64, 1.0f), out(64, 0.0f);
  try {
    interpret(*f, {InterpArg::buffer(x.data(), 256), InterpArg::buffer(out.data(), 256), InterpArg::integer(64)},
              {4, 2, 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "op 'cluster_all_gather'")) << msg;
    EXPECT_TRUE(contains(msg, "program (0, 0, 0) waits at its cluster_all_gather number 1, but program (")) << msg;
    EXPECT_TRUE(contains(msg, "of its cluster returned after 0: every program of a cluster must run the same gathers"))
        << msg;
  }
}

TEST(InterpreterCluster, AMatesFailureIsTheErrorReported) {
  // x holds fewer values than the programs read without a mask: rank 2's load is out of bounds
  // while its mates wait at the gather.
  std::string text = gatherProgram(4);
  text.replace(text.find("%v = load %px, %ok"), std::string("%v = load %px, %ok").size(), "%v = load %px");
  auto f = parseFunction(text, "oob.ftir");
  std::vector<float> x(20, 1.0f), out(32, 0.0f);
  try {
    interpret(*f, {InterpArg::buffer(x.data(), x.size() * 4), InterpArg::buffer(out.data(), 128), InterpArg::integer(32)},
              {4, 1, 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(contains(msg, "op 'load'")) << msg;
    EXPECT_TRUE(contains(msg, "program (2, 0, 0)")) << msg;
    EXPECT_FALSE(contains(msg, "cluster_all_gather")) << msg;
  }
}

TEST(InterpreterCluster, AGridThatClustersDoNotDivideIsAnError) {
  auto f = parseFunction(gatherProgram(4), "gather.ftir");
  std::vector<float> x(48, 1.0f), out(48, 0.0f);
  try {
    interpret(*f, {InterpArg::buffer(x.data(), 192), InterpArg::buffer(out.data(), 192), InterpArg::integer(48)},
              {6, 1, 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "grid axis 0 is 6, not a multiple of the cluster size 4")) << e.what();
  }
  EXPECT_EQ(clusterSize(*f), 4);
}

}  // namespace
}  // namespace flextile::test
