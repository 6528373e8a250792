// Streams and the driver-cubin cache against the recording fake driver (RecordingCuda.cpp): which
// stream every launch and copy of a call went to, and which code a launch loaded (PTX through the
// driver's linker, a cached cubin, or the PTX again after a refused cubin). No GPU is needed; the
// kernels do not run, so only where work goes is checked here (tests/attention/*GpuTest.cpp check
// results on streams on a real GPU).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "attention_templates/DecodeLists.h"
#include "attention_templates/FlexAttention.h"
#include "attention_templates/PagedKVCache.h"
#include "codegen/CompileCache.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"
#include "runtime/Graph.h"
#include "runtime/Stream.h"
#include "tests/runtime/RecordingDriverLog.h"
#include "tests/ThrownMessage.h"

namespace flextile {
namespace {

namespace fs = std::filesystem;
using namespace flextile::dsl;
using namespace flextile::attention;

// Before anything loads the driver or opens the cache: this process's fake driver, log and cache.
const flextile::testing::RecordingDriverLog kDriver("fake-driver", /*withCache=*/true);

// The calls logged since the last take().
std::vector<std::string> take() { return kDriver.take(); }

std::string handleText(const runtime::Stream& s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", s.handle());
  return s.handle() ? buf : "0";
}

std::vector<std::string> matching(const std::vector<std::string>& lines, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& l : lines)
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

// The message of what `fn` throws ("" if nothing).
std::string messageOf(const std::function<void()>& fn) { return testing::thrownMessage(fn); }

// Every launch and copy in `lines` went to `stream`, and there were at least `minLaunches` launches
// (launches with attributes, "launchex NAME stream S grid ...", count too).
void expectAllOn(const std::vector<std::string>& lines, const runtime::Stream& stream, size_t minLaunches) {
  const std::string suffix = " stream " + handleText(stream);
  size_t launches = 0;
  for (const std::string& l : lines) {
    if (l.rfind("launchex ", 0) == 0) {
      EXPECT_NE(l.find(suffix + " grid "), std::string::npos)
          << "'" << l << "' is not on stream " << handleText(stream) << "; all calls:\n" << joined(lines);
      ++launches;
      continue;
    }
    if (l.rfind("launch ", 0) != 0 && l.rfind("htod ", 0) != 0 && l.rfind("dtoh ", 0) != 0 && l.rfind("memset ", 0) != 0)
      continue;
    EXPECT_TRUE(l.size() >= suffix.size() && l.compare(l.size() - suffix.size(), suffix.size(), suffix) == 0)
        << "'" << l << "' is not on stream " << handleText(stream) << "; all calls:\n" << joined(lines);
    launches += l.rfind("launch ", 0) == 0;
  }
  EXPECT_GE(launches, minLaunches) << joined(lines);
}

Kernel scaleKernel(const std::string& name) {
  return kernel(name, [](Ptr<f32> x, Ptr<f32> y, Int n, Float a, Const<int> BLOCK) {
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto ok = offs < n;
    store(y + offs, load(x + offs, ok) * a, ok);
  });
}

TEST(FakeDriver, IsTheOneLoaded) {
  ASSERT_TRUE(deviceAvailable());
  EXPECT_EQ(runtime::Device::current().codeIdentity(), "Fake GPU sm_90; driver 12080");
}

TEST(Streams, KernelRunGoesToTheGivenStreamAndBorrowedStreamsAreNeverDestroyed) {
  Tensor x = Tensor::empty(DType::F32, {1000}, MemorySpace::Device), y = Tensor::empty(DType::F32, {1000}, MemorySpace::Device);
  Kernel k = scaleKernel("scale_on_streams");
  k.run({.grid = {8, 1, 1}, .constants = {128}}, x, y, 1000, 2.0f);  // compile and load first
  take();
  {
    runtime::Stream owned;
    runtime::Stream borrowed = runtime::Stream::borrow(reinterpret_cast<void*>(uintptr_t(0xabc0)));
    EXPECT_TRUE(owned.owned());
    EXPECT_FALSE(borrowed.owned());
    k.run({.grid = {8, 1, 1}, .constants = {128}, .stream = &owned}, x, y, 1000, 2.0f);
    k.run({.grid = {8, 1, 1}, .constants = {128}, .stream = &borrowed}, x, y, 1000, 2.0f);
    k.run({.grid = {8, 1, 1}, .constants = {128}}, x, y, 1000, 2.0f);
    const auto launches = matching(take(), "launch ");
    ASSERT_EQ(launches.size(), 3u);
    EXPECT_EQ(launches[0], "launch scale_on_streams stream " + handleText(owned));
    EXPECT_EQ(launches[1], "launch scale_on_streams stream 0xabc0");
    EXPECT_EQ(launches[2], "launch scale_on_streams stream 0");
    runtime::Stream moved = std::move(borrowed);  // a moved borrowed stream stays borrowed
    EXPECT_FALSE(moved.owned());
  }
  const auto destroyed = matching(take(), "destroy stream");
  ASSERT_EQ(destroyed.size(), 1u) << "only the owned stream is destroyed";
  EXPECT_NE(destroyed[0], "destroy stream 0xabc0");
}

// A kernel that waits for its prior grids (wait_for_prior_grids) is launched through
// cuLaunchKernelEx with programmatic stream serialization (attribute 6 = 1), on its stream, with
// its geometry; one without the wait keeps cuLaunchKernel.
TEST(Streams, AKernelThatWaitsForItsPriorGridsIsLaunchedForProgrammaticOverlap) {
  Tensor x = Tensor::empty(DType::F32, {1000}, MemorySpace::Device), y = Tensor::empty(DType::F32, {1000}, MemorySpace::Device);
  Kernel waits = kernel("scale_after_prior_grids", [](Ptr<f32> x, Ptr<f32> y, Int n, Float a, Const<int> BLOCK) {
    wait_for_prior_grids();
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto ok = offs < n;
    auto v = load(x + offs, ok) * a;
    release_dependent_grids();
    store(y + offs, v, ok);
  });
  Kernel plain = scaleKernel("scale_without_waiting");
  take();
  runtime::Stream stream;
  waits.run({.grid = {8, 1, 1}, .constants = {128}, .stream = &stream}, x, y, 1000, 2.0f);
  plain.run({.grid = {8, 1, 1}, .constants = {128}, .stream = &stream}, x, y, 1000, 2.0f);
  const auto lines = take();
  const auto ex = matching(lines, "launchex ");
  ASSERT_EQ(ex.size(), 1u) << joined(lines);
  EXPECT_EQ(ex[0], "launchex scale_after_prior_grids stream " + handleText(stream) + " grid 8,1,1 block 128,1,1 smem " +
                       ex[0].substr(ex[0].find(" smem ") + 6, ex[0].find(" attrs") - ex[0].find(" smem ") - 6) +
                       " attrs 6=1");
  const auto plainLaunches = matching(lines, "launch ");
  ASSERT_EQ(plainLaunches.size(), 1u) << joined(lines);
  EXPECT_EQ(plainLaunches[0], "launch scale_without_waiting stream " + handleText(stream));
}

// A launch like a recent one takes its compiled kernel from the kernel's recent launches
// (Kernel::runArgs) by the launch key's values; every value that makes another specialization —
// a pointer's alignment, an integer equal to 1, the constants, a code generator switch — must
// still find its own kernel, alternating with the others and past the recent list's length.
TEST(Launches, EachSpecializationCompilesOnceAndRepeatsFindTheirOwn) {
  Tensor x = Tensor::empty(DType::F32, {1000}, MemorySpace::Device), y = Tensor::empty(DType::F32, {1000}, MemorySpace::Device);
  const Tensor xOff = Tensor::deviceView(x.deviceAddress() + 4, DType::F32, {999});  // 4-byte aligned
  Kernel k = scaleKernel("scale_specializations");
  const auto aligned = [&] { k.run({.grid = {8, 1, 1}, .constants = {128}}, x, y, 1000, 2.0f); };
  const auto offset = [&] { k.run({.grid = {8, 1, 1}, .constants = {128}}, xOff, y, 999, 2.0f); };
  const auto unitLength = [&] { k.run({.grid = {1, 1, 1}, .constants = {128}}, x, y, 1, 2.0f); };
  const auto otherBlock = [&] { k.run({.grid = {16, 1, 1}, .constants = {64}}, x, y, 1000, 2.0f); };
  auto loads = [&] {
    const auto lines = take();
    return matching(lines, "load ").size();
  };
  take();
  for (int round = 0; round < 2; ++round) {
    aligned(), offset(), unitLength(), otherBlock();
    EXPECT_EQ(k.numCompiled(), 4u) << "round " << round;
    EXPECT_EQ(loads(), round == 0 ? 4u : 0u) << "round " << round;
  }
  // A switch of the code generator (codegen::codegenSwitches) is another kernel, and unset again
  // the first one.
  ASSERT_EQ(setenv("FLEXTILE_EXP2_FTZ", "0", 1), 0);
  aligned();
  EXPECT_EQ(k.numCompiled(), 5u);
  EXPECT_EQ(loads(), 1u);
  ASSERT_EQ(unsetenv("FLEXTILE_EXP2_FTZ"), 0);
  aligned();
  EXPECT_EQ(k.numCompiled(), 5u);
  EXPECT_EQ(loads(), 0u);
  // More specializations than the recent list holds (ten), twice round: each compiled and loaded
  // once.
  for (int round = 0; round < 2; ++round)
    for (int64_t block = 4; block <= 2048; block *= 2)
      k.run({.grid = {cdiv(1000, block), 1, 1}, .constants = {block}}, x, y, 1000, 2.0f);
  EXPECT_EQ(k.numCompiled(), 5u + 8u);  // blocks 64 and 128 were compiled already
  EXPECT_EQ(loads(), 8u);
  offset();
  EXPECT_EQ(loads(), 0u);
}

TEST(Streams, TensorCopiesAndFillsGoToTheGivenStream) {
  runtime::Stream s;
  take();
  std::vector<int32_t> values{1, 2, 3, 4, 5};
  Tensor t = Tensor::fromHost(values, {5}, MemorySpace::Device, &s);
  EXPECT_EQ(t.toHost<int32_t>(&s), values);
  t.fillBytes(0, &s);
  Tensor z = Tensor::zeros(DType::F32, {7}, MemorySpace::Device, &s);
  std::vector<std::string> lines;
  for (const std::string& l : take())
    if (l.rfind("alloc ", 0) != 0) lines.push_back(l);
  EXPECT_EQ(lines, (std::vector<std::string>{"htod 20 stream " + handleText(s), "dtoh 20 stream " + handleText(s),
                                             "memset 20 stream " + handleText(s), "memset 28 stream " + handleText(s)}));
  (void)t.toHost<int32_t>();  // no stream: the legacy synchronous copy, as before
  EXPECT_EQ(take(), std::vector<std::string>{"dtoh 20 stream sync"});
}

TEST(DriverCubin, TheFirstRunKeepsTheJitsCubinAndAFreshKernelLoadsItWithoutAJit) {
  Tensor x = Tensor::empty(DType::F32, {300}, MemorySpace::Device), y = Tensor::empty(DType::F32, {300}, MemorySpace::Device);
  take();
  Kernel first = scaleKernel("scale_cubin_kept");
  first.run({.grid = {3, 1, 1}, .constants = {128}}, x, y, 300, 1.5f);
  std::vector<std::string> lines = take();
  EXPECT_EQ(matching(lines, "link ").size(), 1u) << joined(lines);
  EXPECT_EQ(matching(lines, "load cubin").size(), 1u) << joined(lines);
  EXPECT_TRUE(matching(lines, "load ptx").empty()) << joined(lines);

  const codegen::CompiledKernel& code = first.compile({.grid = {3, 1, 1}, .constants = {128}}, {x, y, 300, 1.5f});
  std::optional<codegen::CompiledKernel> entry =
      codegen::CompileCache::global().load(codegen::CompileCacheKey{code.irHash, code.target});
  ASSERT_TRUE(entry);
  ASSERT_EQ(entry->driverCubins.size(), 1u);
  EXPECT_EQ(entry->driverCubins[0].identity, "Fake GPU sm_90; driver 12080");
  EXPECT_EQ(entry->driverCubins[0].image, "FAKECUBIN " + std::to_string(code.ptx.size()));

  // What a second process does: a kernel with an empty in-memory cache reads the disk entry.
  Kernel second = scaleKernel("scale_cubin_kept");
  second.run({.grid = {3, 1, 1}, .constants = {128}}, x, y, 300, 1.5f);
  lines = take();
  EXPECT_TRUE(matching(lines, "link ").empty()) << "a kept cubin must not JIT again:\n" << joined(lines);
  EXPECT_EQ(matching(lines, "load cubin").size(), 1u) << joined(lines);
}

TEST(DriverCubin, ARefusedCubinFallsBackToThePtxWithAWarningAndIsReplaced) {
  Tensor x = Tensor::empty(DType::F32, {300}, MemorySpace::Device), y = Tensor::empty(DType::F32, {300}, MemorySpace::Device);
  Kernel first = scaleKernel("scale_cubin_refused");
  first.run({.grid = {3, 1, 1}, .constants = {64}}, x, y, 300, 1.5f);
  const codegen::CompiledKernel& code = first.compile({.grid = {3, 1, 1}, .constants = {64}}, {x, y, 300, 1.5f});
  const codegen::CompileCacheKey key{code.irHash, code.target};
  const std::string identity = runtime::Device::current().codeIdentity();
  // A cubin the driver will not load (stale, or damaged in a way the checksum cannot see).
  ASSERT_TRUE(codegen::CompileCache::global().storeDriverCubin(key, code.ptx, {identity, "GARBAGE"}));
  take();

  Kernel second = scaleKernel("scale_cubin_refused");
  ::testing::internal::CaptureStderr();
  second.run({.grid = {3, 1, 1}, .constants = {64}}, x, y, 300, 1.5f);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  const auto lines = take();
  EXPECT_EQ(matching(lines, "refuse image").size(), 1u) << joined(lines);
  EXPECT_EQ(matching(lines, "link ").size(), 1u) << joined(lines);
  EXPECT_EQ(matching(lines, "launch ").size(), 1u) << "the launch still happens:\n" << joined(lines);
  EXPECT_NE(warning.find("the driver refused the cached cubin of kernel 'scale_cubin_refused'"), std::string::npos)
      << warning;
  std::optional<codegen::CompiledKernel> entry = codegen::CompileCache::global().load(key);
  ASSERT_TRUE(entry);
  ASSERT_NE(entry->driverCubinFor(identity), nullptr);
  EXPECT_EQ(entry->driverCubinFor(identity)->image, "FAKECUBIN " + std::to_string(code.ptx.size()));
}

TEST(DriverCubin, AFailingLinkerFallsBackToThePlainJitWithAWarning) {
  Tensor x = Tensor::empty(DType::F32, {300}, MemorySpace::Device), y = Tensor::empty(DType::F32, {300}, MemorySpace::Device);
  Kernel k = scaleKernel("scale_linker_fails");
  take();
  setenv("FLEXTILE_FAKE_CUDA_LINK_FAILS", "1", 1);
  ::testing::internal::CaptureStderr();
  k.run({.grid = {3, 1, 1}, .constants = {32}}, x, y, 300, 1.5f);
  const std::string warning = ::testing::internal::GetCapturedStderr();
  unsetenv("FLEXTILE_FAKE_CUDA_LINK_FAILS");
  const auto lines = take();
  EXPECT_EQ(matching(lines, "link fails").size(), 1u) << joined(lines);
  EXPECT_EQ(matching(lines, "load ptx").size(), 1u) << "the plain JIT:\n" << joined(lines);
  EXPECT_EQ(matching(lines, "launch ").size(), 1u) << joined(lines);
  EXPECT_NE(warning.find("kernel 'scale_linker_fails': the driver's linker failed"), std::string::npos) << warning;
  const codegen::CompiledKernel& code = k.compile({.grid = {3, 1, 1}, .constants = {32}}, {x, y, 300, 1.5f});
  std::optional<codegen::CompiledKernel> entry =
      codegen::CompileCache::global().load(codegen::CompileCacheKey{code.irHash, code.target});
  ASSERT_TRUE(entry);
  EXPECT_TRUE(entry->driverCubins.empty()) << "nothing to keep";
}

// q, k, v in fake device memory: the kernels do not run, so any values do.
struct Inputs {
  Tensor q, k, v;
  Inputs(int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t S, int64_t D)
      : q(Tensor::zeros(DType::BF16, {B, Hq, L, D}, MemorySpace::Device)),
        k(Tensor::zeros(DType::BF16, {B, Hkv, S, D}, MemorySpace::Device)),
        v(Tensor::zeros(DType::BF16, {B, Hkv, S, D}, MemorySpace::Device)) {}
};

TEST(Streams, FlexAttentionPrefillDecodeAndBackwardLaunchOnlyOnTheGivenStream) {
  runtime::Stream s;
  Inputs prefill(1, 4, 2, 100, 300, 64);
  BlockMask mask = causalBlockMask(1, 1, 100, 300, {64, 64}, {MemorySpace::Device, &s});
  take();
  auto fwd = flex_attention(prefill.q, prefill.k, prefill.v, noop_score(), mask, {.return_lse = true, .stream = &s});
  expectAllOn(take(), s, 1);

  Tensor dout = Tensor::zeros(DType::BF16, prefill.q.shape(), MemorySpace::Device);
  take();
  FlexAttentionGrads g = flex_attention_backward(prefill.q, prefill.k, prefill.v, fwd.out, fwd.lse, dout, noop_score(),
                                                 mask, {.stream = &s});
  expectAllOn(take(), s, 3);  // preprocess, dkdv, dq

  Inputs decode(1, 8, 2, 1, 4096, 64);
  BlockMask decodeMask = causalBlockMask(1, 1, 4096, 4096, {128, 128}, {MemorySpace::Device, &s});
  BlockMask row = decodeMask.sliceRows(31, 1, 4095, 1);
  Tensor out = Tensor::empty(DType::BF16, decode.q.shape(), MemorySpace::Device);
  take();
  flex_attention_into(decode.q, decode.k, decode.v, noop_score(), row, out, nullptr, {.stream = &s});
  const auto lines = take();
  expectAllOn(lines, s, 1);
  // (launchex: the decode is a programmatic dependent launch by default)
  EXPECT_FALSE(matching(lines, "launch flex_decode").empty() && matching(lines, "launchex flex_decode").empty())
      << "L = 1 takes the decode template:\n" << joined(lines);
}

TEST(Streams, BlockMaskBuilderDecodeListsAndPagedWritesUseTheGivenStream) {
  runtime::Stream s;
  std::vector<int32_t> ids(200, 0);
  MaskMod docs = document_mask(capture(Tensor::fromHost(ids, {200}, MemorySpace::Device), "ids"));
  take();
  BlockMask built = createBlockMask(docs, 1, 1, 200, 200, {64, 64}, {MemorySpace::Device, &s});
  expectAllOn(take(), s, 1);  // the state kernel, its zeroing and the read of its states

  BlockMask causal = causalBlockMask(1, 1, 512, 512, {64, 64}, {MemorySpace::Device, &s});
  take();
  DecodeBlockLists lists = decodeBlockLists(causal, 60, 8, MemorySpace::Device, &s);  // straddles two rows
  expectAllOn(take(), s, 1);

  PagedKVCache cache(DType::BF16, 2, 64, 16, 16, 2, 8, MemorySpace::Device);
  cache.setStream(&s);
  Tensor kNew = Tensor::zeros(DType::BF16, {2, 2, 5, 64}, MemorySpace::Device);
  take();
  cache.append(kNew, kNew);
  expectAllOn(take(), s, 1);
  EXPECT_EQ(cache.stream(), &s);
  cache.setStream(nullptr);
}

// A training loop's backward must not allocate or free per call: each call's cuMemFree of its own
// scratch synchronized the device, so no backward overlapped host work or other streams. After
// the first call on a stream, a call with caller-owned gradients makes no allocation and no free.
TEST(Streams, RepeatedBackwardCallsNeitherAllocateNorFree) {
  runtime::Stream s;
  Inputs in(1, 4, 2, 100, 300, 64);
  BlockMask mask = causalBlockMask(1, 1, 100, 300, {64, 64}, {MemorySpace::Device, &s});
  auto fwd = flex_attention(in.q, in.k, in.v, noop_score(), mask, {.return_lse = true, .stream = &s});
  Tensor dout = Tensor::zeros(DType::BF16, in.q.shape(), MemorySpace::Device);
  FlexAttentionGrads g = flex_attention_backward(in.q, in.k, in.v, fwd.out, fwd.lse, dout, noop_score(), mask,
                                                 {.stream = &s});  // the first call sizes the scratch
  take();
  for (int call = 0; call < 3; ++call)
    flex_attention_backward_into(in.q, in.k, in.v, fwd.out, fwd.lse, dout, noop_score(), mask, g, {.stream = &s});
  const auto lines = take();
  expectAllOn(lines, s, 9);  // three calls of preprocess, dkdv, dq
  EXPECT_TRUE(matching(lines, "alloc ").empty() && matching(lines, "free ").empty()) << joined(lines);
}

// compute-sanitizer's memcheck (H200, 2026-12-01) found the decode-lists pool's buffers still
// allocated at exit: the pool was never destroyed. A child process that leases pool buffers, lets
// the lists go and exits must free every device allocation it made by the time it is gone (the
// last lines of its log are the static destructors' frees).
TEST(DeviceMemory, EveryAllocationOfADecodeStepIsFreedByExit) {
  // Outside the scratch folder, which the child's static destructors remove.
  const fs::path log = fs::path(kDriver.dir().string() + "-exit.log");
  EXPECT_EXIT(
      {
        setenv("FLEXTILE_FAKE_CUDA_LOG", log.c_str(), 1);
        {
          BlockMask causal = causalBlockMask(1, 1, 512, 512, {64, 64}, MemorySpace::Device);
          for (int64_t start : {60, 120, 250}) {  // straddling rows: the lists come from the pool
            DecodeBlockLists lists = decodeBlockLists(causal, start, 8, MemorySpace::Device);
            if (decodeListsPoolStats().inUse == 0) std::_Exit(3);  // not from the pool: no test
          }
        }
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  std::map<std::string, std::string> live;  // address -> its alloc line
  size_t allocations = 0;
  std::ifstream in(log);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string what, address;
    words >> what >> address;
    if (what == "alloc") live[address] = line, ++allocations;
    if (what == "free") live.erase(address);
  }
  in.close();
  std::error_code ec;
  fs::remove(log, ec);
  EXPECT_GE(allocations, 2u) << "the child made no device allocation: nothing was tested";
  for (const auto& [address, line] : live) ADD_FAILURE() << "never freed: " << line;
}

// ---- CUDA graphs (runtime/Graph.h) ----------------------------------------------

// A decode step with its positions in device memory, captured after one eager call: the capture
// holds the step's launches and nothing else (no upload, allocation or wait), and each replay is
// one graph launch on the stream.
TEST(Graphs, ADecodeStepCapturedAfterOneEagerCallReplaysWithOneLaunch) {
  runtime::Stream s;
  Inputs decode(2, 8, 2, 1, 4096, 64);
  BlockMask mask = causalBlockMask(1, 1, 4096, 4096, {128, 128}, {MemorySpace::Device, &s});
  Tensor positions = Tensor::fromHost(std::vector<int32_t>{4000, 4095}, {2}, MemorySpace::Device);
  Tensor out = Tensor::empty(DType::BF16, decode.q.shape(), MemorySpace::Device);
  const FlexAttentionOptions o{.query_offsets = positions, .stream = &s};
  auto step = [&] { flex_attention_into(decode.q, decode.k, decode.v, noop_score(), mask, out, nullptr, o); };
  step();  // compiles and loads the kernel, makes the scratch
  take();
  runtime::Graph graph = runtime::Graph::capture(s, step);
  std::vector<std::string> lines = take();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.front(), "begin capture stream " + handleText(s)) << joined(lines);
  size_t launches = 0;
  for (const std::string& l : lines) {
    EXPECT_TRUE(l.rfind("htod", 0) != 0 && l.rfind("dtoh", 0) != 0 && l.rfind("alloc", 0) != 0 &&
                l.rfind("refused", 0) != 0)
        << "a captured step only launches: " << joined(lines);
    if (l.rfind("launch", 0) == 0) {
      EXPECT_NE(l.find(" (captured)"), std::string::npos) << l;
      ++launches;
    }
  }
  EXPECT_GE(launches, 1u) << joined(lines);
  const std::string nodes = " nodes " + std::to_string(launches);
  EXPECT_EQ(matching(lines, "end capture stream " + handleText(s) + nodes).size(), 1u) << joined(lines);
  EXPECT_EQ(matching(lines, "instantiate" + nodes).size(), 1u) << joined(lines);

  graph.launch(s);
  graph.launch(s);
  lines = take();
  EXPECT_EQ(matching(lines, "graph launch stream " + handleText(s) + nodes).size(), 2u) << joined(lines);
  EXPECT_TRUE(matching(lines, "launch").empty()) << "replays launch nothing one by one:\n" << joined(lines);
  step();  // the stream works eagerly again
  EXPECT_FALSE(matching(take(), "launch").empty());
}

// A call that would upload or wait inside a capture (here the first call on a mask whose lists are
// still on the host) is refused by the driver; the error says what a capture may hold and how to
// get there, and the stream leaves capture mode.
TEST(Graphs, ACaptureThatWouldUploadSaysToRunTheCallsOnceFirst) {
  runtime::Stream s;
  Inputs decode(1, 8, 2, 1, 1000, 64);
  BlockMask mask = causalBlockMask(1, 1, 1000, 1000, {128, 128});  // host lists: the first device call uploads them
  Tensor out = Tensor::empty(DType::BF16, decode.q.shape(), MemorySpace::Device);
  const FlexAttentionOptions o{.query_offset = 999, .stream = &s};
  auto step = [&] { flex_attention_into(decode.q, decode.k, decode.v, noop_score(), mask, out, nullptr, o); };
  take();
  const std::string message = messageOf([&] { runtime::Graph::capture(s, step); });
  EXPECT_NE(message.find("while capturing a graph"), std::string::npos) << message;
  EXPECT_NE(message.find("run the same calls once before capturing them"), std::string::npos) << message;
  const std::vector<std::string> lines = take();
  EXPECT_FALSE(matching(lines, "refused").empty()) << joined(lines);
  EXPECT_FALSE(matching(lines, "end capture stream " + handleText(s) + ": capture broken").empty()) << joined(lines);
  step();  // eager again: uploads, launches
  runtime::Graph graph = runtime::Graph::capture(s, step);  // and now it captures
  EXPECT_FALSE(graph.empty());
}

// A graph keeps the addresses of the scratch its captured calls used: a later call on the stream
// that outgrows that scratch must not free it (detail::replaceSlot keeps it once a graph exists).
TEST(Graphs, ScratchAGraphHoldsIsNotFreedWhenALaterCallOutgrowsIt) {
  runtime::Stream s;
  auto decodeCall = [&](int64_t B, int64_t Hq) {
    Inputs in(B, Hq, 2, 1, 4096, 64);
    BlockMask mask = causalBlockMask(1, 1, 4096, 4096, {128, 128}, {MemorySpace::Device, &s});
    Tensor out = Tensor::empty(DType::BF16, in.q.shape(), MemorySpace::Device);
    const FlexAttentionOptions o{.decode_config = FlexDecodeConfig{.splits = 8}, .query_offset = 4095, .stream = &s};
    return [in, mask, out, o]() mutable { flex_attention_into(in.q, in.k, in.v, noop_score(), mask, out, nullptr, o); };
  };
  auto small = decodeCall(1, 8);
  take();
  small();
  std::vector<std::string> scratch;  // what the first call allocated: its scratch among it
  for (const std::string& l : matching(take(), "alloc ")) scratch.push_back(l.substr(6, l.find(' ', 6) - 6));
  ASSERT_FALSE(scratch.empty());
  runtime::Graph graph = runtime::Graph::capture(s, small);
  auto large = decodeCall(256, 64);  // 8 splits of 16384 rows: far more partials than the small call's
  large();
  const std::vector<std::string> lines = take();
  ASSERT_FALSE(matching(lines, "alloc ").empty()) << "the large call should have grown the scratch:\n" << joined(lines);
  for (const std::string& address : scratch)
    EXPECT_TRUE(matching(lines, "free " + address).empty()) << "freed " << address << ", which the graph replays";
  graph.launch(s);
}

// A training step — forward with its lse, then the backward — into caller-owned outputs and
// gradients, captured after one eager step: the capture holds launches (and the backward's
// stream-ordered zeroing of its dQ accumulator) only. The allocating forms (flex_attention,
// flex_attention_backward returning their tensors) cannot be captured: a graph cannot own what a
// call allocates, and the driver refuses allocations and frees inside a capture.
TEST(Graphs, ATrainingStepIntoCallerOwnedTensorsCapturesAfterOneEagerStep) {
  runtime::Stream s;
  Inputs in(1, 4, 2, 200, 300, 64);
  BlockMask mask = causalBlockMask(1, 1, 200, 300, {64, 64}, {MemorySpace::Device, &s});
  Tensor dout = Tensor::zeros(DType::BF16, in.q.shape(), MemorySpace::Device);
  Tensor out = Tensor::empty(DType::BF16, in.q.shape(), MemorySpace::Device);
  Tensor lse = Tensor::empty(DType::F32, {1, 4, 200}, MemorySpace::Device);
  FlexAttentionGrads grads{.dq = Tensor::empty(DType::BF16, in.q.shape(), MemorySpace::Device),
                           .dk = Tensor::empty(DType::BF16, in.k.shape(), MemorySpace::Device),
                           .dv = Tensor::empty(DType::BF16, in.v.shape(), MemorySpace::Device)};
  auto trainingStep = [&] {
    flex_attention_into(in.q, in.k, in.v, noop_score(), mask, out, &lse, {.stream = &s});
    flex_attention_backward_into(in.q, in.k, in.v, out, lse, dout, noop_score(), mask, grads, {.stream = &s});
  };
  trainingStep();
  take();
  runtime::Graph graph = runtime::Graph::capture(s, trainingStep);
  const std::vector<std::string> lines = take();
  EXPECT_TRUE(matching(lines, "refused").empty()) << joined(lines);
  EXPECT_EQ(matching(lines, "end capture stream " + handleText(s) + " nodes").size(), 1u) << joined(lines);
  graph.launch(s);

  // The allocating forms: refused, with the advice.
  auto allocating = [&] {
    auto fwd = flex_attention(in.q, in.k, in.v, noop_score(), mask, {.return_lse = true, .stream = &s});
    flex_attention_backward(in.q, in.k, in.v, fwd.out, fwd.lse, dout, noop_score(), mask, {.stream = &s});
  };
  const std::string message = messageOf([&] { runtime::Graph::capture(s, allocating); });
  EXPECT_NE(message.find("while capturing a graph"), std::string::npos) << message;
}

TEST(Graphs, TheLegacyStreamCannotBeCapturedAndAnEmptyGraphCannotLaunch) {
  runtime::Stream legacy = runtime::Stream::borrow(nullptr);
  const std::string legacyMessage = messageOf([&] { runtime::Graph::capture(legacy, [] {}); });
  EXPECT_NE(legacyMessage.find("legacy default stream cannot be captured"), std::string::npos) << legacyMessage;
  runtime::Graph empty;
  runtime::Stream s;
  const std::string emptyMessage = messageOf([&] { empty.launch(s); });
  EXPECT_NE(emptyMessage.find("an empty graph"), std::string::npos) << emptyMessage;
}

// What `record` throws reaches the caller unchanged, and the stream is not left capturing.
TEST(Graphs, AnExceptionInsideACaptureEndsIt) {
  runtime::Stream s;
  take();
  EXPECT_THROW(runtime::Graph::capture(s, [] { throw std::invalid_argument("the user's own error"); }),
               std::invalid_argument);
  const std::vector<std::string> lines = take();
  EXPECT_EQ(matching(lines, "begin capture").size(), 1u) << joined(lines);
  EXPECT_EQ(matching(lines, "end capture").size(), 1u) << joined(lines);
  runtime::Graph again = runtime::Graph::capture(s, [] {});
  EXPECT_FALSE(again.empty());
}

}  // namespace
}  // namespace flextile
