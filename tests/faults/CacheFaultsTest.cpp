// The disk caches under faults: a read-only folder, a full disk, a path that cannot be a folder,
// a truncated entry and an entry another compiler build wrote. Each gives a clear warning and the
// same kernel (or tuned config) a healthy cache gives; none crashes, throws or hands back a wrong
// or partial entry.
#include <gtest/gtest.h>

#include <filesystem>

#include "FaultTestUtil.h"
#include "autotune/TuneCache.h"
#include "codegen/CompileCache.h"
#include "gpu/GpuTest.h"
#include "ir/Hash.h"

namespace flextile {
namespace {

namespace fs = std::filesystem;
using namespace flextile::testing;

struct Compiled {
  std::string ptx, warnings;
  bool fromCache = false;
};

Compiled compileThrough(codegen::CompileCache& cache, const ir::Function& f) {
  ::testing::internal::CaptureStderr();
  const codegen::CompiledKernel k = codegen::compileCached(f, ir::structuralHash(f), {codegen::Target::sm80()}, cache);
  return {k.ptx, ::testing::internal::GetCapturedStderr(), k.fromCache};
}

std::string uncachedPtx(const ir::Function& f) { return codegen::compile(f, {codegen::Target::sm80()}).ptx; }

bool onlyEntries(const fs::path& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() != ".ftk") return false;
  return true;
}

TEST(CacheFaults, ReadOnlyCompileCacheFolderWarnsOnceAndStillCompiles) {
  if (!permissionsBindUs()) GTEST_SKIP() << "running as root, which writes into a folder whatever its mode says; "
                                           "CacheFaults.CompileCacheOnAFileWarns covers an unwritable folder";
  TempDir dir;
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  codegen::CompileCache cache(dir.path);
  auto f = scaleFunction(128);
  for (int i = 0; i < 2; ++i) {
    const Compiled c = compileThrough(cache, *f);
    EXPECT_EQ(c.ptx, uncachedPtx(*f));
    EXPECT_FALSE(c.fromCache);
    if (i == 0) {
      EXPECT_NE(c.warnings.find("warning: compile cache: cannot write"), std::string::npos) << c.warnings;
    } else {
      EXPECT_EQ(c.warnings, "") << "one warning per cache";
    }
  }
  EXPECT_EQ(cache.stats().storeFailures, 2u);
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(CacheFaults, CompileCacheOnAFileWarnsAndStillCompiles) {
  TempDir dir;
  writeAll(dir.path / "file", "x");
  codegen::CompileCache cache(dir.path / "file" / "kernels");
  auto f = scaleFunction(256);
  const Compiled c = compileThrough(cache, *f);
  EXPECT_EQ(c.ptx, uncachedPtx(*f));
  EXPECT_NE(c.warnings.find("cannot create"), std::string::npos) << c.warnings;
}

TEST(CacheFaults, FullDiskLeavesNoPartialEntryAndStillCompiles) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  auto f = scaleFunction(64);
  const std::string want = uncachedPtx(*f);
  Compiled c;
  {
    FileSizeLimit full(512);  // an entry is several KB: its write fails part-way
    ASSERT_TRUE(full.active());
    c = compileThrough(cache, *f);
  }
  EXPECT_EQ(c.ptx, want);
  EXPECT_NE(c.warnings.find("warning: compile cache: cannot write"), std::string::npos) << c.warnings;
  EXPECT_TRUE(fs::is_empty(dir.path)) << "the partial temporary file is removed, no entry is renamed into place";
  EXPECT_EQ(cache.stats().storeFailures, 1u);
  // With space again the next compile stores, and the one after hits.
  EXPECT_FALSE(compileThrough(cache, *f).fromCache);
  const Compiled hit = compileThrough(cache, *f);
  EXPECT_TRUE(hit.fromCache);
  EXPECT_EQ(hit.ptx, want);
  EXPECT_TRUE(onlyEntries(dir.path));
}

TEST(CacheFaults, TruncatedEntryAtAnyLengthWarnsAndIsReplaced) {
  SeededRandom rng;
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  auto f = scaleFunction(512);
  const std::string want = compileThrough(cache, *f).ptx;
  const fs::path entry = cache.pathOf({ir::structuralHash(*f), codegen::Target::sm80()});
  const std::string bytes = readAll(entry);
  for (size_t cut : {size_t(0), size_t(1), size_t(rng() % bytes.size()), bytes.size() - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut) + " of " + std::to_string(bytes.size()));
    writeAll(entry, bytes.substr(0, cut));
    const Compiled c = compileThrough(cache, *f);
    EXPECT_FALSE(c.fromCache);
    EXPECT_EQ(c.ptx, want);
    if (cut > 0) {
      EXPECT_NE(c.warnings.find("is corrupt"), std::string::npos) << c.warnings;
    }
    EXPECT_EQ(readAll(entry), bytes) << "overwritten with the good entry";
  }
}

TEST(CacheFaults, EntryOfAnotherCompilerBuildWarnsAndIsReplaced) {
  TempDir dir;
  codegen::CompileCache cache(dir.path);
  auto f = scaleFunction(1024);
  const uint64_t hash = ir::structuralHash(*f);
  const codegen::CompileCacheKey key{hash, codegen::Target::sm80()};
  // What an older FlexTile, on another LLVM, stored for the same program: wrong code for this
  // build, under the file name this build looks up (a name clash, or a copied cache folder).
  codegen::CompileCacheKey old = key;
  old.compiler = "flextile 0.0.9; LLVM 21.1.0; build 1234-5678.9";
  codegen::CompiledKernel stale = codegen::compile(*f, {codegen::Target::sm80()});
  stale.ptx = "// stale PTX of another build\n";
  fs::create_directories(dir.path);
  writeAll(cache.pathOf(key), codegen::serializeCompiledKernel(old, stale));
  const Compiled c = compileThrough(cache, *f);
  EXPECT_FALSE(c.fromCache);
  EXPECT_EQ(c.ptx, uncachedPtx(*f));
  EXPECT_NE(c.warnings.find("written by another FlexTile build or format"), std::string::npos) << c.warnings;
  EXPECT_NE(c.warnings.find("flextile 0.0.9; LLVM 21.1.0"), std::string::npos) << "names who wrote it: " << c.warnings;
  EXPECT_EQ(cache.stats().foreign, 1u);
  const Compiled hit = compileThrough(cache, *f);
  EXPECT_TRUE(hit.fromCache);
  EXPECT_EQ(hit.ptx, c.ptx);
}

const autotune::GpuIdentity kGpu{"Test GPU", 90, 12080};
const autotune::TunedConfig kTuned{{64, 32, 4, 2}, 1.0, 2.0, "B=1"};

TEST(CacheFaults, UnwritableAutotuneCacheWarnsOnceAndKeepsTheEntryInMemory) {
  TempDir dir;
  writeAll(dir.path / "file", "x");
  autotune::TuneCache cache(dir.path / "file" / "autotune" / "gpu.json", kGpu);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.put("a", kTuned));
  EXPECT_FALSE(cache.put("b", kTuned));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: autotune cache: cannot create"), std::string::npos) << err;
  EXPECT_EQ(err.find("autotune cache", err.find("autotune cache") + 1), std::string::npos) << "one warning: " << err;
  ASSERT_TRUE(cache.find("a"));
  EXPECT_EQ(cache.find("b")->config, kTuned.config);
}

TEST(CacheFaults, ReadOnlyAutotuneCacheWarnsAndKeepsTheOldFile) {
  if (!permissionsBindUs()) GTEST_SKIP() << "running as root, which writes into a folder whatever its mode says; "
                                           "CacheFaults.UnwritableAutotuneCache... and FullDisk... cover the failure";
  TempDir dir;
  const fs::path file = dir.path / "gpu.json";
  ASSERT_TRUE(autotune::TuneCache(file, kGpu).put("old", kTuned));
  const std::string before = readAll(file);
  fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec);
  autotune::TuneCache cache(file, kGpu);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(cache.put("new", kTuned));
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("warning: autotune cache"), std::string::npos);
  EXPECT_EQ(readAll(file), before);
  EXPECT_TRUE(cache.find("new"));
  EXPECT_TRUE(cache.find("old"));
}

TEST(CacheFaults, FullDiskKeepsTheAutotuneFileIntact) {
  TempDir dir;
  const fs::path file = dir.path / "gpu.json";
  ASSERT_TRUE(autotune::TuneCache(file, kGpu).put("old", kTuned));
  const std::string before = readAll(file);
  autotune::TuneCache cache(file, kGpu);
  bool stored = true;
  std::string err;
  {
    FileSizeLimit full(before.size() + 16);  // the rewritten file, one entry longer, does not fit
    ASSERT_TRUE(full.active());
    ::testing::internal::CaptureStderr();
    stored = cache.put("new", kTuned);
    err = ::testing::internal::GetCapturedStderr();
  }
  EXPECT_FALSE(stored);
  EXPECT_NE(err.find("warning: autotune cache: cannot write"), std::string::npos) << err;
  EXPECT_EQ(readAll(file), before) << "the old file stays whole";
  for (const auto& e : fs::directory_iterator(dir.path))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "left behind: " << e.path();
  autotune::TuneCache reader(file, kGpu);
  EXPECT_TRUE(reader.find("old"));
  EXPECT_TRUE(cache.find("new")) << "kept in memory";
}

}  // namespace
}  // namespace flextile
