// The on-disk compile cache (codegen/CompileCache.h): keys, round trip,
// corrupt entries, atomic writes, and the dsl::Kernel path through it.
#include <cstdlib>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "codegen/CompileCache.h"
#include "dsl/DSL.h"
#include "gpu/GpuTest.h"
#include "ir/Dump.h"
#include "ir/Hash.h"

namespace flextile {
namespace {

namespace fs = std::filesystem;
using namespace flextile::dsl;

// A fresh folder per test, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("flextile-cache-test-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A small kernel whose block size (a Const<>) changes its IR.
Kernel scaleKernel() {
  return kernel("scale", [](Ptr<f32> x, Ptr<f32> y, Int n, Float a, Const<int> BLOCK) {
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto ok = offs < n;
    store(y + offs, load(x + offs, ok) * a, ok);
  });
}

std::unique_ptr<ir::Function> specialized(int block) {
  Kernel k = scaleKernel();
  auto f = k.trace({.constants = {block}});
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 1, 1};
  return f;
}

std::string readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeAll(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

TEST(CompileCache, SameInputsHitAndGiveTheSameKernel) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  auto f = specialized(256);
  const uint64_t hash = ir::structuralHash(*f);
  codegen::CompiledKernel cold = codegen::compileCached(*f, hash, {codegen::Target::sm80()}, cache);
  EXPECT_FALSE(cold.fromCache);
  // A second trace of the same program hashes equal and hits.
  auto again = specialized(256);
  ASSERT_EQ(ir::structuralHash(*again), hash);
  codegen::CompiledKernel warm = codegen::compileCached(*again, hash, {codegen::Target::sm80()}, cache);
  EXPECT_TRUE(warm.fromCache);
  EXPECT_EQ(warm.ptx, cold.ptx);
  EXPECT_EQ(warm.llvmIR, cold.llvmIR);
  EXPECT_EQ(warm.ir, cold.ir);
  EXPECT_EQ(warm.name, cold.name);
  EXPECT_EQ(warm.numWarps, cold.numWarps);
  EXPECT_EQ(warm.sharedBytes, cold.sharedBytes);
  EXPECT_EQ(warm.params, cold.params);
  EXPECT_TRUE(warm.target == cold.target);
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().stores, 1u);
  // Only the entry is left: the temporary file was renamed into place.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    ++files;
    EXPECT_EQ(e.path().extension(), ".ftk") << e.path();
  }
  EXPECT_EQ(files, 1u);
}

TEST(CompileCache, AnyKeyFieldChangeMisses) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  auto f = specialized(128);
  const codegen::CompileCacheKey key{ir::structuralHash(*f), codegen::Target::sm90a()};
  cache.store(key, codegen::compile(*f, {key.target}));
  ASSERT_TRUE(cache.load(key));

  codegen::CompileCacheKey otherIr = key;
  otherIr.irHash = ir::structuralHash(*specialized(64));  // another constant
  ASSERT_NE(otherIr.irHash, key.irHash);
  EXPECT_FALSE(cache.load(otherIr));

  auto spec = specialized(128);  // another argument specialization
  spec->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 8, 1, 1};
  codegen::CompileCacheKey otherSpec = key;
  otherSpec.irHash = ir::structuralHash(*spec);
  EXPECT_NE(otherSpec.irHash, key.irHash);
  EXPECT_FALSE(cache.load(otherSpec));

  codegen::CompileCacheKey otherTarget = key;
  otherTarget.target = codegen::Target::sm80();
  EXPECT_FALSE(cache.load(otherTarget));
  otherTarget.target = codegen::Target{90, false};  // sm_90 rather than sm_90a
  EXPECT_FALSE(cache.load(otherTarget));

  codegen::CompileCacheKey otherCompiler = key;
  otherCompiler.compiler += " (another build)";
  EXPECT_FALSE(cache.load(otherCompiler));

  EXPECT_EQ(cache.stats().corrupt, 0u);
  EXPECT_TRUE(cache.load(key)) << "the original key still hits";
}

TEST(CompileCache, KeyNamesTheCompilerAndTarget) {
  const codegen::CompileCacheKey key{0x1234, codegen::Target::sm90a()};
  EXPECT_NE(key.text().find("sm_90a"), std::string::npos) << key.text();
  EXPECT_NE(key.text().find("LLVM 22"), std::string::npos) << key.text();
  EXPECT_NE(key.text().find(std::string("flextile ") + FLEXTILE_VERSION), std::string::npos) << key.text();
  EXPECT_NE(key.text().find("0000000000001234"), std::string::npos) << key.text();
  // The LLVM pipeline and the passes it leaves out change the PTX, so they are part of the identity.
  if (!std::getenv("FLEXTILE_LLVM_SKIP_PASSES") && !std::getenv("FLEXTILE_LLVM_PIPELINE")) {
    EXPECT_NE(key.text().find("skips slsr; o3-lean"), std::string::npos) << key.text();
  }
}

// Regression: a kernel compiled under FLEXTILE_PINGPONG=1 (or FLEXTILE_TMA) was found again by a
// compile without it, since the switches that change what the passes write were not in the key.
TEST(CompileCache, TheSwitchesOfThePassesArePartOfTheKey) {
  for (const char* name : {"FLEXTILE_TMA", "FLEXTILE_PINGPONG", "FLEXTILE_DEFER_ACCUMULATION", "FLEXTILE_RING_BARRIERS",
                           "FLEXTILE_WARP_SPECIALIZE", "FLEXTILE_HOIST_INVARIANT_LOADS", "FLEXTILE_STAGE_AT_FIRST_USE",
                           "FLEXTILE_SHARE_RINGS", "FLEXTILE_EXP2_FTZ"}) {
    SCOPED_TRACE(name);
    const char* old = std::getenv(name);
    const std::string keep = old ? old : "";
    ::unsetenv(name);
    const std::string unset = codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
    ::setenv(name, "1", 1);
    const std::string on = codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
    ::setenv(name, "0", 1);
    const std::string off = codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
    if (old) ::setenv(name, keep.c_str(), 1);
    else ::unsetenv(name);
    EXPECT_NE(unset, on);
    EXPECT_NE(unset, off);
    EXPECT_NE(on, off);
  }
}

// The launches keep what they read of the FLEXTILE_ switches while the environment's generation
// stays (codegen::environmentGeneration): it must stay without a change and move with every kind
// of change — a value set anew, a variable added, removed, or put with putenv — or a launch would
// run the kernel of a switch no longer set.
TEST(CompileCache, TheEnvironmentsGenerationMovesWithEveryChangeAndOnlyThen) {
  using codegen::environmentGeneration;
  ::unsetenv("FLEXTILE_TEST_GENERATION");
  ::unsetenv("FLEXTILE_TEST_GENERATION_PUT");
  uint64_t g = environmentGeneration();
  EXPECT_EQ(environmentGeneration(), g);
  EXPECT_EQ(environmentGeneration(), g);
  auto moved = [&](const char* what) {
    const uint64_t now = environmentGeneration();
    EXPECT_NE(now, g) << what;
    EXPECT_EQ(environmentGeneration(), now) << what << ", asked again";
    g = now;
  };
  ASSERT_EQ(::setenv("FLEXTILE_TEST_GENERATION", "1", 1), 0);
  moved("a variable added");
  ASSERT_EQ(::setenv("FLEXTILE_TEST_GENERATION", "0", 1), 0);
  moved("a value set anew");
  ASSERT_EQ(::setenv("FLEXTILE_TEST_GENERATION", "1", 1), 0);
  moved("the first value set back");
  static char put[] = "FLEXTILE_TEST_GENERATION_PUT=1";
  ASSERT_EQ(::putenv(put), 0);
  moved("putenv");
  ASSERT_EQ(::unsetenv("FLEXTILE_TEST_GENERATION"), 0);
  moved("a variable removed");
  ASSERT_EQ(::unsetenv("FLEXTILE_TEST_GENERATION_PUT"), 0);
  moved("the put one removed");
  // The switches the launches key by follow (a switch of the code generator, set and unset).
  const std::string before = codegen::codegenSwitches();
  ASSERT_EQ(::setenv("FLEXTILE_EXP2_FTZ", "0", 1), 0);
  EXPECT_NE(codegen::codegenSwitches(), before);
  ASSERT_EQ(::unsetenv("FLEXTILE_EXP2_FTZ"), 0);
  EXPECT_EQ(codegen::codegenSwitches(), before);
}

// FLEXTILE_PRODUCER_REGISTERS takes a count: each count keys its own kernels (the setmaxnreg
// split is the lowering's).
TEST(CompileCache, TheProducerRegistersAreKeyed) {
  flextile::testing::ScopedSetenv unset("FLEXTILE_PRODUCER_REGISTERS", "");
  const std::string none = codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
  flextile::testing::ScopedSetenv at32("FLEXTILE_PRODUCER_REGISTERS", "32");
  const std::string with32 = codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
  flextile::testing::ScopedSetenv at40("FLEXTILE_PRODUCER_REGISTERS", "40");
  const std::string with40 = codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
  EXPECT_NE(none, with32);
  EXPECT_NE(with32, with40);
}

// FLEXTILE_REDUCE_TREE takes words, not just 0/1: each setting that changes the lowering has its own
// key, and a value the lowering does not know (it lowers the default) keys as the default.
TEST(CompileCache, TheReductionTreeSwitchKeysWhatTheLoweringDoes) {
  const char* old = std::getenv("FLEXTILE_REDUCE_TREE");
  const std::string keep = old ? old : "";
  auto keyWith = [](const char* value) {
    if (value) ::setenv("FLEXTILE_REDUCE_TREE", value, 1);
    else ::unsetenv("FLEXTILE_REDUCE_TREE");
    return codegen::CompileCacheKey{0x1234, codegen::Target::sm90a()}.text();
  };
  const std::string unset = keyWith(nullptr);
  EXPECT_EQ(keyWith("sum"), unset);
  EXPECT_EQ(keyWith(""), unset);
  EXPECT_EQ(keyWith("chains"), unset);
  const std::string all = keyWith("1"), none = keyWith("0"), maxOnly = keyWith("max");
  EXPECT_EQ(keyWith("chains4"), unset) << "a word the lowering no longer knows";
  EXPECT_NE(all, unset);
  EXPECT_NE(none, unset);
  EXPECT_NE(maxOnly, unset);
  EXPECT_NE(all, none);
  EXPECT_NE(all, maxOnly);
  EXPECT_NE(none, maxOnly);
  if (old) ::setenv("FLEXTILE_REDUCE_TREE", keep.c_str(), 1);
  else ::unsetenv("FLEXTILE_REDUCE_TREE");
}

TEST(CompileCache, RoundTripKeepsEveryFieldIncludingBinaryCubin) {
  flextile::testing::SeededRandom rng;
  codegen::CompiledKernel k;
  k.name = "kernel_x";
  k.ir = "func @kernel_x() {}\n";
  k.llvmIR = "; llvm\n";
  k.ptx = ".version 8.0\n// some ptx with a line 'end 0123456789abcdef'\n";
  k.target = codegen::Target::sm80();
  k.numWarps = 8;
  k.sharedBytes = int(rng() % 100000);
  k.params = {ir::Type::pointer(ir::DType::BF16), ir::Type(ir::DType::I32), ir::Type(ir::DType::F32),
              ir::Type(ir::DType::I64)};
  k.ptxasInfo = "ptxas info : Used 40 registers";
  for (int i = 0; i < 1000; ++i) k.cubin.push_back(char(rng() % 256));  // zeros and newlines included
  const codegen::CompileCacheKey key{rng(), k.target};
  const std::string bytes = codegen::serializeCompiledKernel(key, k);
  std::optional<codegen::CompiledKernel> back = codegen::parseCompiledKernel(key, bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->name, k.name);
  EXPECT_EQ(back->ir, k.ir);
  EXPECT_EQ(back->llvmIR, k.llvmIR);
  EXPECT_EQ(back->ptx, k.ptx);
  EXPECT_TRUE(back->target == k.target);
  EXPECT_EQ(back->numWarps, 8);
  EXPECT_EQ(back->sharedBytes, k.sharedBytes);
  EXPECT_EQ(back->params, k.params);
  EXPECT_EQ(back->ptxasInfo, k.ptxasInfo);
  EXPECT_EQ(back->cubin, k.cubin);
  // Another key: intact, but not this entry.
  codegen::CompileCacheKey other = key;
  other.irHash ^= 1;
  EXPECT_FALSE(codegen::parseCompiledKernel(other, bytes));
}

// A minimal entry of the given PTX (what the driver-cubin tests below store and read).
codegen::CompiledKernel minimalKernel(const std::string& ptx) {
  codegen::CompiledKernel k;
  k.name = "kernel_y";
  k.ptx = ptx;
  k.target = codegen::Target::sm90a();
  return k;
}

std::string randomBytes(flextile::testing::SeededRandom& rng, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out.push_back(char(rng() % 256));
  return out;
}

TEST(CompileCache, DriverCubinsRoundTripPerGpuAndAnEntryWithoutThemHasNone) {
  flextile::testing::SeededRandom rng;
  codegen::CompiledKernel k = minimalKernel(".version 8.0\n.entry kernel_y\n");
  const codegen::CompileCacheKey key{rng(), k.target};
  std::optional<codegen::CompiledKernel> plain = codegen::parseCompiledKernel(key, codegen::serializeCompiledKernel(key, k));
  ASSERT_TRUE(plain);
  EXPECT_TRUE(plain->driverCubins.empty());
  EXPECT_EQ(plain->driverCubinFor("NVIDIA H200 sm_90; driver 13000"), nullptr);

  const codegen::DriverCubin h200{"NVIDIA H200 sm_90; driver 13000", randomBytes(rng, 777)};
  const codegen::DriverCubin h100{"NVIDIA H100 80GB HBM3 sm_90; driver 12080", randomBytes(rng, 513)};
  codegen::addDriverCubin(k, h100);
  codegen::addDriverCubin(k, h200);
  std::optional<codegen::CompiledKernel> back = codegen::parseCompiledKernel(key, codegen::serializeCompiledKernel(key, k));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->driverCubins, (std::vector<codegen::DriverCubin>{h200, h100}));  // newest first
  ASSERT_NE(back->driverCubinFor(h100.identity), nullptr);
  EXPECT_EQ(back->driverCubinFor(h100.identity)->image, h100.image);
  // Another driver version of the same GPU is another identity: its JIT may make other code.
  EXPECT_EQ(back->driverCubinFor("NVIDIA H200 sm_90; driver 13010"), nullptr);
}

TEST(CompileCache, AddDriverCubinReplacesTheSameGpuAndKeepsTheNewestFew) {
  flextile::testing::SeededRandom rng;
  codegen::CompiledKernel k = minimalKernel(".entry kernel_y");
  for (size_t i = 0; i < codegen::kMaxDriverCubins + 2; ++i)
    codegen::addDriverCubin(k, {"gpu " + std::to_string(i), randomBytes(rng, 16)});
  ASSERT_EQ(k.driverCubins.size(), codegen::kMaxDriverCubins);
  EXPECT_EQ(k.driverCubins.front().identity, "gpu " + std::to_string(codegen::kMaxDriverCubins + 1));
  EXPECT_EQ(k.driverCubinFor("gpu 0"), nullptr) << "the oldest goes first";
  const std::string fresh = randomBytes(rng, 32);
  codegen::addDriverCubin(k, {"gpu 3", fresh});
  EXPECT_EQ(k.driverCubins.size(), codegen::kMaxDriverCubins);
  EXPECT_EQ(k.driverCubins.front().image, fresh);
  int copies = 0;
  for (const auto& c : k.driverCubins) copies += c.identity == "gpu 3";
  EXPECT_EQ(copies, 1);
}

TEST(CompileCache, StoreDriverCubinAddsToTheStoredEntryOfThatPtxOnly) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  flextile::testing::SeededRandom rng;
  const codegen::CompiledKernel k = minimalKernel(".entry kernel_y // " + std::to_string(rng()));
  const codegen::CompileCacheKey key{rng(), k.target};
  const codegen::DriverCubin cubin{"Some GPU sm_90; driver 12080", randomBytes(rng, 300)};
  EXPECT_FALSE(cache.storeDriverCubin(key, k.ptx, cubin)) << "no entry yet";
  cache.store(key, k);
  EXPECT_FALSE(cache.storeDriverCubin(key, k.ptx + " ", cubin)) << "the cubin of other PTX";
  EXPECT_TRUE(cache.storeDriverCubin(key, k.ptx, cubin));
  std::optional<codegen::CompiledKernel> back = cache.load(key);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->driverCubins, std::vector<codegen::DriverCubin>{cubin});
  EXPECT_EQ(back->ptx, k.ptx);
}

TEST(CompileCache, ADriverCubinWithoutItsIdentityMakesTheEntryCorruptNotAFailure) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  flextile::testing::SeededRandom rng;
  codegen::CompiledKernel k = minimalKernel(".entry kernel_y");
  codegen::addDriverCubin(k, {"gpu", "image"});
  const codegen::CompileCacheKey key{rng(), k.target};
  std::string bytes = codegen::serializeCompiledKernel(key, k);
  // A damaged identity field: the checksum names the damage, and the cache treats it as a miss.
  const size_t at = bytes.find("driver_cubin_identity.0");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 23, "driver_cubin_identitx.0");
  try {
    (void)codegen::parseCompiledKernel(key, bytes);  // the checksum fails first
    ADD_FAILURE() << "an altered entry parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  writeAll(cache.pathOf(key), bytes);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.load(key)) << "a corrupt entry is a miss (recompiled), never an error";
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("is corrupt"), std::string::npos);
}

TEST(CompileCache, CorruptEntriesWarnRecompileAndAreOverwritten) {
  flextile::testing::SeededRandom rng;
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  auto f = specialized(512);
  const uint64_t hash = ir::structuralHash(*f);
  const codegen::CompileOptions options{codegen::Target::sm80()};
  const codegen::CompiledKernel good = codegen::compileCached(*f, hash, options, cache);
  const fs::path entry = cache.pathOf({hash, options.target});
  const std::string bytes = readAll(entry);
  ASSERT_FALSE(bytes.empty());

  std::string flipped = bytes;
  flipped[size_t(rng() % (flipped.size() - 40)) + 20] ^= 0x20;
  const std::vector<std::pair<std::string, std::string>> damages{
      {"truncated", bytes.substr(0, bytes.size() / 2)},
      {"one byte flipped", flipped},
      {"garbage", "this is not a kernel\n"},
      {"empty", ""},
      {"header only", "FLEXTILE-KERNEL 2\n"},
  };
  size_t corrupt = 0;
  for (const auto& [what, damaged] : damages) {
    SCOPED_TRACE(what);
    writeAll(entry, damaged);
    ::testing::internal::CaptureStderr();
    const codegen::CompiledKernel k = codegen::compileCached(*f, hash, options, cache);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_FALSE(k.fromCache);
    EXPECT_EQ(k.ptx, good.ptx);
    EXPECT_NE(err.find("corrupt"), std::string::npos) << err;
    EXPECT_NE(err.find(entry.filename().string()), std::string::npos) << "the warning names the file: " << err;
    EXPECT_EQ(cache.stats().corrupt, ++corrupt);
    // Overwritten with a good entry: the next lookup hits.
    EXPECT_EQ(readAll(entry), bytes);
    EXPECT_TRUE(codegen::compileCached(*f, hash, options, cache).fromCache);
  }
  // An entry written by another version of the format is not damage: a miss with one warning
  // saying who wrote it, then rewritten (faults/CacheFaultsTest.cpp: other compiler builds).
  writeAll(entry, "FLEXTILE-KERNEL 1\nkey 3\nold\nend 0000000000000000\n");
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(codegen::compileCached(*f, hash, options, cache).fromCache);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("written by another FlexTile build or format (header 'FLEXTILE-KERNEL 1')"), std::string::npos)
      << err;
  EXPECT_EQ(cache.stats().corrupt, corrupt);
  EXPECT_EQ(cache.stats().foreign, 1u);
  EXPECT_EQ(readAll(entry), bytes);
}

TEST(CompileCache, UnwritableFolderWarnsOnceAndStillCompiles) {
  TempDir dir;
  const fs::path blocker = dir.path / "file";
  writeAll(blocker, "x");  // a file where the folder should be
  codegen::CompileCache cache(blocker / "kernels");
  auto f = specialized(64);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(codegen::compileCached(*f, ir::structuralHash(*f), {}, cache).ptx.empty());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("compile cache"), std::string::npos) << err;
  EXPECT_EQ(err.find("compile cache", err.find("compile cache") + 1), std::string::npos) << "one warning: " << err;
  EXPECT_EQ(cache.stats().storeFailures, 2u);
}

TEST(CompileCache, DisabledCacheNeverTouchesTheDisk) {
  codegen::CompileCache cache{fs::path()};
  EXPECT_FALSE(cache.enabled());
  auto f = specialized(64);
  EXPECT_FALSE(codegen::compileCached(*f, ir::structuralHash(*f), {}, cache).fromCache);
  EXPECT_FALSE(codegen::compileCached(*f, ir::structuralHash(*f), {}, cache).fromCache);
  EXPECT_EQ(cache.stats().stores, 0u);
}

TEST(CompileCache, EveryDumpStageBypassesTheDiskSoTheDumpIsWritten) {
  TempDir dir;
  codegen::CompileCache cache{dir.path};
  auto f = specialized(64);
  const uint64_t hash = ir::structuralHash(*f);
  ASSERT_FALSE(codegen::compileCached(*f, hash, {}, cache).fromCache);
  ASSERT_TRUE(codegen::compileCached(*f, hash, {}, cache).fromCache) << "the entry is on disk";
  const fs::path dumps = dir.path / "dumps";
  for (const char* stage : {"ir", "passes", "llvm-lowered", "llvm", "ptx"}) {
    fs::remove_all(dumps);
    ir::setDumpConfig(stage, dumps.string());
    const bool hit = codegen::compileCached(*f, hash, {}, cache).fromCache;
    ir::setDumpConfig("", "");
    EXPECT_FALSE(hit) << stage << ": a disk hit would produce no dump";
    EXPECT_TRUE(fs::exists(dumps) && !fs::is_empty(dumps)) << stage << ": nothing was dumped";
  }
}

TEST(CompileCache, UserCacheDirectoryFollowsTheEnvironment) {
  const char* saved = std::getenv("FLEXTILE_CACHE_DIR");
  const std::string keep = saved ? saved : "";
  ::setenv("FLEXTILE_CACHE_DIR", "/some/where", 1);
  EXPECT_EQ(codegen::userCacheDirectory(), fs::path("/some/where"));
  ::unsetenv("FLEXTILE_CACHE_DIR");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const std::string keepXdg = xdg ? xdg : "";
  ::setenv("XDG_CACHE_HOME", "/xdg", 1);
  EXPECT_EQ(codegen::userCacheDirectory(), fs::path("/xdg/flextile"));
  ::unsetenv("XDG_CACHE_HOME");
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(codegen::userCacheDirectory(), fs::path(home) / ".cache/flextile");
  }
  if (saved) ::setenv("FLEXTILE_CACHE_DIR", keep.c_str(), 1);
  if (xdg) ::setenv("XDG_CACHE_HOME", keepXdg.c_str(), 1);
}

}  // namespace
}  // namespace flextile
