// Several processes on one FlexTile cache folder while entries are written: this binary starts
// copies of itself (posix_spawn of /proc/self/exe) that run ConcurrencyProcessChild.* against one
// FLEXTILE_CACHE_DIR — compiling the same kernels to PTX, running flex_attention through the
// interpreter against the float64 reference, and storing autotune entries — then one more copy
// that must find every kernel in the folder. No child may fail, hang (each is killed after a
// deadline), leave a temporary file, tear or lose an entry.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "FlexAttentionCheck.h"
#include "attention_templates/Variants.h"
#include "autotune/TuneCache.h"
#include "codegen/CompileCache.h"
#include "gpu/GpuTest.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

extern char** environ;

namespace flextile {
namespace {

namespace fs = std::filesystem;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

constexpr int kChildren = 4;
constexpr int kTuneEntriesPerChild = 6;
const autotune::GpuIdentity kTestGpu{"Test GPU", 90, 12080};

const char* childRole() { return std::getenv("FLEXTILE_TEST_CHILD_ROLE"); }

// The kernels every child compiles: two mods, two configs, two targets.
std::vector<const codegen::CompiledKernel*> compileTheSharedKernels() {
  const int64_t L = 200, D = 64;
  Tensor q = Tensor::empty(DType::F16, {1, 2, L, D}, MemorySpace::Host);
  static const VariantInstance causal = variant("causal").make({1, 2, L, L, MemorySpace::Host, {64, 64}, 1});
  static const VariantInstance alibi = variant("alibi").make({1, 2, L, L, MemorySpace::Host, {64, 64}, 1});
  std::vector<const codegen::CompiledKernel*> out;
  for (const VariantInstance* mods : {&causal, &alibi})
    for (FlexAttentionConfig c : {FlexAttentionConfig{64, 64, 4, 2}, FlexAttentionConfig{64, 32, 4, 1}})
      for (codegen::Target t : {codegen::Target::sm80(), codegen::Target::sm90a()})
        out.push_back(plan_flex_attention(q, q, q, mods->score, mods->mask, {.config = c}, true, t).compiled);
  return out;
}

// A child's work, on two threads so that threads and processes race together.
TEST(ConcurrencyProcessChild, CompileCheckAndTune) {
  const char* role = childRole();
  if (!role) GTEST_SKIP() << "started by ConcurrencyProcesses.* with FLEXTILE_TEST_CHILD_ROLE set";
  const std::string who = role;
  if (who == "verify") {
    // Every kernel the writers stored is found intact: all hits, nothing corrupt or foreign.
    for (const codegen::CompiledKernel* k : compileTheSharedKernels()) {
      ASSERT_NE(k, nullptr);
      EXPECT_TRUE(k->fromCache) << k->name << " was not in the shared folder";
    }
    const codegen::CompileCache::Stats s = codegen::CompileCache::global().stats();
    EXPECT_EQ(s.corrupt, 0u);
    EXPECT_EQ(s.foreign, 0u);
    EXPECT_EQ(s.misses, 0u);
    return;
  }
  SeededRandom rng;
  std::thread other([&] {
    for (const codegen::CompiledKernel* k : compileTheSharedKernels()) EXPECT_FALSE(k->ptx.empty());
  });
  VariantInstance inst = variant("sliding_window").make({1, 2, 61, 61, MemorySpace::Host, {32, 32}, rng()});
  AttentionCase c{.B = 1, .Hq = 2, .Hkv = 1, .L = 61, .S = 61, .D = 32, .dtype = DType::BF16, .context = who};
  EXPECT_TRUE(checkFlexAttention(rng, c, MemorySpace::Host, inst.score, inst.mask, inst.refScore, inst.refMask,
                                 {.config = FlexAttentionConfig{32, 16, 4, 2}}));
  autotune::TuneCache tune(codegen::userCacheDirectory().value() / "autotune" / "test.json", kTestGpu);
  for (int i = 0; i < kTuneEntriesPerChild; ++i)
    EXPECT_TRUE(tune.put("child " + who + " entry " + std::to_string(i), {{64, 32, 4, 1 + i % 3}, 1.0, 2.0, who}));
  other.join();
  const codegen::CompileCache::Stats s = codegen::CompileCache::global().stats();
  EXPECT_EQ(s.corrupt, 0u) << "a torn entry was read";
  EXPECT_EQ(s.storeFailures, 0u);
}

struct Child {
  pid_t pid = -1;
};

Child spawnChild(const fs::path& cacheDir, const std::string& role) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view v = *e;
    if (!v.starts_with("FLEXTILE_CACHE_DIR=") && !v.starts_with("FLEXTILE_TEST_CHILD_ROLE=") &&
        !v.starts_with("GTEST_"))
      env.emplace_back(v);
  }
  env.push_back("FLEXTILE_CACHE_DIR=" + cacheDir.string());
  env.push_back("FLEXTILE_TEST_CHILD_ROLE=" + role);
  std::vector<std::string> args{self, "--gtest_filter=ConcurrencyProcessChild.CompileCheckAndTune"};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  Child c;
  const int rc = ::posix_spawn(&c.pid, self.c_str(), nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) c.pid = -1;
  return c;
}

// Waits for every child up to a deadline (a deadlock fails the test instead of hanging it);
// returns a description of each child that did not exit with status 0.
std::vector<std::string> waitAll(std::vector<Child>& children, std::chrono::seconds deadline) {
  std::vector<std::string> problems;
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (size_t i = 0; i < children.size(); ++i) {
    if (children[i].pid < 0) {
      problems.push_back("child " + std::to_string(i) + " did not start");
      continue;
    }
    int status = 0;
    for (;;) {
      const pid_t r = ::waitpid(children[i].pid, &status, WNOHANG);
      if (r == children[i].pid) break;
      if (std::chrono::steady_clock::now() > until) {
        ::kill(children[i].pid, SIGKILL);
        ::waitpid(children[i].pid, &status, 0);
        problems.push_back("child " + std::to_string(i) + " still ran after " + std::to_string(deadline.count()) +
                           " s (a deadlock?); killed");
        status = 0;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
      problems.push_back("child " + std::to_string(i) + " exited with status " + std::to_string(WEXITSTATUS(status)));
    if (WIFSIGNALED(status)) problems.push_back("child " + std::to_string(i) + " died of signal " + std::to_string(WTERMSIG(status)));
  }
  return problems;
}

TEST(ConcurrencyProcesses, SharedCacheFolderKeepsEveryEntryIntact) {
  if (childRole()) GTEST_SKIP() << "a child runs ConcurrencyProcessChild.* only";
  std::random_device rd;
  const fs::path dir = fs::temp_directory_path() / ("flextile-processes-" + std::to_string(rd()) + std::to_string(rd()));
  fs::create_directories(dir);
  // Sanitizers slow the children several times over; a deadlock still fails well within ctest's limit.
  const std::chrono::seconds deadline(600);
  std::vector<Child> writers;
  for (int i = 0; i < kChildren; ++i) writers.push_back(spawnChild(dir, std::to_string(i)));
  for (const std::string& p : waitAll(writers, deadline)) ADD_FAILURE() << "writer " << p;

  size_t entries = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << "a temporary file was left behind: " << e.path();
    if (e.path().extension() == ".ftk") ++entries;
  }
  EXPECT_GE(entries, 8u) << "the eight shared kernels (plus the checked ones) are in the folder";

  std::vector<Child> verifier{spawnChild(dir, "verify")};
  for (const std::string& p : waitAll(verifier, deadline)) ADD_FAILURE() << "verifier " << p;

  autotune::TuneCache tune(dir / "autotune" / "test.json", kTestGpu);
  EXPECT_EQ(tune.size(), size_t(kChildren * kTuneEntriesPerChild)) << "an autotune entry was lost";
  for (int c = 0; c < kChildren; ++c)
    for (int i = 0; i < kTuneEntriesPerChild; ++i)
      EXPECT_TRUE(tune.find("child " + std::to_string(c) + " entry " + std::to_string(i))) << c << "/" << i;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace flextile
