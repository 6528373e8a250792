// The runtime layer on a real GPU: device query, memory, JIT of hand-written PTX, launches,
// shared memory limits and event timing.
#include "GpuTest.h"

#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/DriverError.h"
#include "runtime/Event.h"
#include "runtime/Module.h"
#include "runtime/Stream.h"
#include "tests/ThrownMessage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

namespace flextile::runtime {
namespace {

using flextile::testing::SeededRandom;

// out[i] = a * x[i] + y[i] for i < n; one thread per element, blocks along x.
// reverse_block: each block stages its inputs in dynamic shared memory, starting `offset`
// bytes in, and writes them back reversed within the block (0 where the mirror is past n).
// static_tile: uses 1024 bytes of static shared memory. spin: busy-waits `ns` nanoseconds.
constexpr const char* kPtx = R"(
.version 8.0
.target sm_80
.address_size 64

.extern .shared .align 16 .b8 dynamic_smem[];

.visible .entry axpy(.param .u64 p_out, .param .u64 p_x, .param .u64 p_y, .param .f32 p_a, .param .u32 p_n)
{
  .reg .pred %p<2>;
  .reg .b32 %r<6>;
  .reg .f32 %f<5>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [p_out];
  ld.param.u64 %rd2, [p_x];
  ld.param.u64 %rd3, [p_y];
  ld.param.f32 %f1, [p_a];
  ld.param.u32 %r1, [p_n];
  mov.u32 %r2, %ctaid.x;
  mov.u32 %r3, %ntid.x;
  mov.u32 %r4, %tid.x;
  mad.lo.u32 %r5, %r2, %r3, %r4;
  setp.ge.u32 %p1, %r5, %r1;
  @%p1 bra DONE;
  mul.wide.u32 %rd4, %r5, 4;
  add.u64 %rd5, %rd2, %rd4;
  ld.global.f32 %f2, [%rd5];
  add.u64 %rd6, %rd3, %rd4;
  ld.global.f32 %f3, [%rd6];
  fma.rn.f32 %f4, %f1, %f2, %f3;
  add.u64 %rd7, %rd1, %rd4;
  st.global.f32 [%rd7], %f4;
DONE:
  ret;
}

.visible .entry reverse_block(.param .u64 p_out, .param .u64 p_in, .param .u32 p_n, .param .u32 p_offset)
{
  .reg .pred %p<3>;
  .reg .b32 %r<16>;
  .reg .f32 %f<3>;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [p_out];
  ld.param.u64 %rd2, [p_in];
  ld.param.u32 %r1, [p_n];
  ld.param.u32 %r2, [p_offset];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.u32 %r6, %r3, %r4, %r5;
  mov.f32 %f1, 0f00000000;
  setp.lt.u32 %p1, %r6, %r1;
  mul.wide.u32 %rd3, %r6, 4;
  @!%p1 bra STAGE;
  add.u64 %rd4, %rd2, %rd3;
  ld.global.f32 %f1, [%rd4];
STAGE:
  mov.u32 %r7, dynamic_smem;
  add.u32 %r8, %r7, %r2;
  shl.b32 %r9, %r5, 2;
  add.u32 %r10, %r8, %r9;
  st.shared.f32 [%r10], %f1;
  bar.sync 0;
  sub.u32 %r11, %r4, %r5;
  sub.u32 %r11, %r11, 1;
  shl.b32 %r12, %r11, 2;
  add.u32 %r13, %r8, %r12;
  ld.shared.f32 %f2, [%r13];
  @!%p1 bra FINISH;
  add.u64 %rd5, %rd1, %rd3;
  st.global.f32 [%rd5], %f2;
FINISH:
  ret;
}

.visible .entry static_tile(.param .u64 p_out)
{
  .shared .align 4 .b8 tile[1024];
  .reg .b32 %r<8>;
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p_out];
  mov.u32 %r1, %tid.x;
  and.b32 %r2, %r1, 255;
  shl.b32 %r3, %r2, 2;
  mov.u32 %r4, tile;
  add.u32 %r5, %r4, %r3;
  st.shared.u32 [%r5], %r1;
  bar.sync 0;
  ld.shared.u32 %r6, [%r5];
  mul.wide.u32 %rd2, %r1, 4;
  add.u64 %rd3, %rd1, %rd2;
  st.global.u32 [%rd3], %r6;
  ret;
}

.visible .entry spin(.param .u64 p_ns)
{
  .reg .pred %p<2>;
  .reg .b64 %rd<5>;
  ld.param.u64 %rd1, [p_ns];
  mov.u64 %rd2, %globaltimer;
WAIT:
  mov.u64 %rd3, %globaltimer;
  sub.u64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p1, %rd4, %rd1;
  @%p1 bra WAIT;
  ret;
}
)";

std::string errorOf(const std::function<void()>& call) { return flextile::testing::requiredMessage<DriverError>(call); }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

template <class T>
DeviceBuffer upload(const std::vector<T>& values) {
  DeviceBuffer buffer(values.size() * sizeof(T));
  buffer.copyFromHost(values.data(), buffer.bytes());
  return buffer;
}

template <class T>
std::vector<T> download(const DeviceBuffer& buffer) {
  std::vector<T> values(buffer.bytes() / sizeof(T));
  buffer.copyToHost(values.data(), values.size() * sizeof(T));
  return values;
}

unsigned blocksFor(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

TEST(RuntimeGpu, DeviceQuery) {
  FLEXTILE_REQUIRE_GPU();
  Device& device = Device::current();
  std::printf("%s\n", device.describe().c_str());
  EXPECT_FALSE(device.name().empty());
  EXPECT_GE(device.capabilityMajor(), 8) << "the test PTX targets sm_80";
  EXPECT_GE(device.capabilityMinor(), 0);
  EXPECT_GT(device.multiprocessorCount(), 0);
  EXPECT_EQ(device.warpSize(), 32);
  EXPECT_GE(device.maxThreadsPerBlock(), 1024);
  EXPECT_EQ(device.maxSharedBytesPerBlock(), 48u * 1024);
  EXPECT_GT(device.maxSharedBytesPerBlockOptin(), device.maxSharedBytesPerBlock());
  EXPECT_GE(device.maxSharedBytesPerMultiprocessor(), device.maxSharedBytesPerBlockOptin());
  EXPECT_GT(device.l2CacheBytes(), 1u << 20);
  EXPECT_GT(device.totalMemoryBytes(), 4ull << 30);
  EXPECT_GT(device.clockRateKHz(), 100000);
  EXPECT_GE(device.driverVersion(), 12000);
  EXPECT_EQ(device.driverVersion(), Driver::get().version());
  auto [freeBytes, totalBytes] = device.memoryInfo();
  EXPECT_LE(freeBytes, totalBytes);
  EXPECT_EQ(totalBytes, device.totalMemoryBytes());
  EXPECT_EQ(&Device::get(device.ordinal()), &device);
  EXPECT_GE(Device::count(), 1);
  EXPECT_TRUE(contains(errorOf([] { Device::get(Device::count()); }), "no CUDA device"));
}

TEST(RuntimeGpu, AllocationShowsInFreeMemory) {
  FLEXTILE_REQUIRE_GPU();
  Device& device = Device::current();
  // The card's free memory is shared with every other process on it (the GPU suite runs in
  // parallel shards), whose allocations move it too: an attempt counts only if nothing else moved
  // it by more than the slack, and one of five such attempts must see our gigabyte come and go.
  const size_t gigabyte = size_t(1) << 30, slack = 64u << 20;
  std::string seen;
  bool shown = false;
  for (int attempt = 0; attempt < 5 && !shown; ++attempt) {
    const size_t before = device.memoryInfo()[0];
    size_t during = 0;
    {
      DeviceBuffer big(gigabyte);
      ASSERT_NE(big.address(), 0u);
      during = device.memoryInfo()[0];
    }
    const size_t after = device.memoryInfo()[0];
    shown = during + gigabyte <= before + slack && after + slack >= before;
    seen += " (free before " + std::to_string(before) + ", with 1 GiB held " + std::to_string(during) + ", after " +
            std::to_string(after) + ")";
  }
  EXPECT_TRUE(shown) << "no attempt saw the allocation in the free memory:" << seen;
  // Far more than the device holds: the driver's error is reported by name with the size.
  size_t tooMuch = device.totalMemoryBytes() * 4;
  std::string message = errorOf([&] { DeviceBuffer buffer(tooMuch); });
  EXPECT_TRUE(contains(message, "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY")) << message;
  EXPECT_TRUE(contains(message, std::to_string(tooMuch) + " bytes")) << message;
}

TEST(RuntimeGpu, CopyRoundTripOfRandomBytes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom random;
  size_t bytes = 1000003 + random() % 4096;  // odd sizes: nothing is a multiple of anything
  std::vector<uint8_t> host(bytes);
  for (auto& byte : host) byte = uint8_t(random());
  DeviceBuffer buffer(bytes);
  EXPECT_EQ(buffer.bytes(), bytes);
  buffer.copyFromHost(host.data(), bytes);
  std::vector<uint8_t> back(bytes, 0);
  buffer.copyToHost(back.data(), bytes);
  EXPECT_TRUE(back == host);

  // A partial copy at an odd offset changes exactly that range.
  size_t offset = 1 + random() % 1000, length = 1 + random() % 5000;
  std::vector<uint8_t> patch(length);
  for (auto& byte : patch) byte = uint8_t(random());
  buffer.copyFromHost(patch.data(), length, offset);
  std::copy(patch.begin(), patch.end(), host.begin() + offset);
  buffer.copyToHost(back.data(), bytes);
  EXPECT_TRUE(back == host);
  std::vector<uint8_t> slice(length);
  buffer.copyToHost(slice.data(), length, offset);
  EXPECT_TRUE(slice == patch);

  // Moving hands the memory over; the moved-from buffer is empty.
  uint64_t address = buffer.address();
  DeviceBuffer moved = std::move(buffer);
  EXPECT_EQ(moved.address(), address);
  EXPECT_TRUE(buffer.empty());

  std::string message = errorOf([&] { moved.copyFromHost(host.data(), bytes, 1); });
  EXPECT_TRUE(contains(message, std::to_string(bytes) + " bytes at offset 1 do not fit in a device buffer of " +
                                    std::to_string(bytes) + " bytes"))
      << message;
  EXPECT_THROW(moved.copyToHost(back.data(), bytes + 1), DriverError);
}

// copyDeviceToDevice (the decode bench's yardstick): an odd range between odd offsets lands
// exactly there, and nothing else changes; a zero-byte copy does nothing.
TEST(RuntimeGpu, DeviceToDeviceCopyMovesExactlyItsRange) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom random;
  const size_t bytes = 200003 + random() % 4096, from = 1 + random() % 1000, to = 3 + random() % 1000,
               length = bytes / 2 + random() % 1000;
  std::vector<uint8_t> source(bytes), destination(bytes);
  for (auto& byte : source) byte = uint8_t(random());
  for (auto& byte : destination) byte = uint8_t(random());
  DeviceBuffer a(bytes), b(bytes);
  a.copyFromHost(source.data(), bytes);
  b.copyFromHost(destination.data(), bytes);
  copyDeviceToDevice(b.address() + to, a.address() + from, length, "a test range");
  std::copy_n(source.begin() + std::ptrdiff_t(from), length, destination.begin() + std::ptrdiff_t(to));
  std::vector<uint8_t> back(bytes);
  b.copyToHost(back.data(), bytes);
  EXPECT_TRUE(back == destination);
  copyDeviceToDevice(b.address(), a.address(), 0, "nothing");  // a no-op
}

TEST(RuntimeGpu, PoisonFillSetsEveryByte) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom random;
  size_t bytes = 4097 + random() % 100000;
  DeviceBuffer buffer(bytes);
  for (uint8_t poison : {uint8_t(0xFF), uint8_t(random() | 1), uint8_t(0)}) {
    buffer.fillBytes(poison);
    std::vector<uint8_t> back(bytes, uint8_t(~poison));
    buffer.copyToHost(back.data(), bytes);
    EXPECT_EQ(size_t(std::count(back.begin(), back.end(), poison)), bytes) << "poison " << int(poison);
  }
  // 0xFF poison reads back as NaN floats, which is what makes a skipped store visible.
  buffer.fillBytes(0xFF);
  float value = 0;
  buffer.copyToHost(&value, sizeof value);
  EXPECT_TRUE(std::isnan(value));
}

TEST(RuntimeGpu, HandWrittenPtxLaunchesOverARaggedSize) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom random;
  Module module(kPtx, "runtime_test");
  EXPECT_EQ(module.entryNames(), (std::vector<std::string>{"axpy", "reverse_block", "static_tile", "spin"}));
  Kernel axpy = module.function("axpy");
  EXPECT_EQ(axpy.name(), "axpy");
  EXPECT_GT(axpy.attributes().registersPerThread, 0);
  EXPECT_EQ(axpy.attributes().localBytesPerThread, 0);
  EXPECT_EQ(axpy.attributes().staticSharedBytes, 0);
  EXPECT_GE(axpy.attributes().maxThreadsPerBlock, 256);
  EXPECT_EQ(axpy.attributes().ptxVersion, 80);
  EXPECT_EQ(axpy.attributes().binaryVersion, Device::current().capability());

  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  for (unsigned threads : {128u, 256u}) {
    uint32_t n = uint32_t(100000 + random() % 50000);
    if (n % threads == 0) ++n;
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = uniform(random);
    for (auto& v : y) v = uniform(random);
    float a = uniform(random);
    DeviceBuffer dx = upload(x), dy = upload(y), dout(size_t(n + 64) * sizeof(float));
    dout.fillBytes(0xFF);  // NaN: any element the kernel skips stays NaN
    uint64_t outAddress = dout.address(), xAddress = dx.address(), yAddress = dy.address();
    void* args[] = {&outAddress, &xAddress, &yAddress, &a, &n};
    axpy.launch({blocksFor(n, threads), 1, 1}, threads, 0, args);
    synchronize();
    std::vector<float> out = download<float>(dout);
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i) {
      double reference = double(a) * double(x[i]) + double(y[i]);
      // fma rounds once; the float64 reference rounded to float may differ by one ulp.
      if (!(std::abs(out[i] - reference) <= 1e-6 * std::abs(reference) + 1e-30) && wrong++ < 5)
        ADD_FAILURE() << "threads " << threads << ": out[" << i << "] = " << out[i] << ", expected " << reference;
    }
    EXPECT_EQ(wrong, 0u);
    // Past n the poison is untouched: the kernel's mask held.
    for (uint32_t i = n; i < n + 64; ++i) EXPECT_TRUE(std::isnan(out[i])) << "out[" << i << "] written past n";
  }

  std::string message = errorOf([&] { module.function("axpby"); });
  EXPECT_TRUE(contains(message, "cuModuleGetFunction failed: CUDA_ERROR_NOT_FOUND")) << message;
  EXPECT_TRUE(contains(message, "no kernel 'axpby' in module 'runtime_test' (its entries: axpy, reverse_block, "
                                "static_tile, spin)"))
      << message;
}

TEST(RuntimeGpu, LaunchShapesAreChecked) {
  FLEXTILE_REQUIRE_GPU();
  Module module(kPtx, "runtime_test");
  Kernel axpy = module.function("axpy");
  void* noArgs[] = {nullptr};
  EXPECT_TRUE(contains(errorOf([&] { axpy.launch({0, 1, 1}, 128, 0, noArgs); }), "has no blocks along x"));
  EXPECT_TRUE(contains(errorOf([&] { axpy.launch({1, 1, 1}, 0, 0, noArgs); }), "a block of 0 threads"));
  unsigned tooMany = unsigned(axpy.attributes().maxThreadsPerBlock) + 1;
  EXPECT_TRUE(contains(errorOf([&] { axpy.launch({1, 1, 1}, tooMany, 0, noArgs); }),
                       std::to_string(tooMany) + " threads per block, but it can run at most " +
                           std::to_string(axpy.attributes().maxThreadsPerBlock)));
  unsigned maxY = unsigned(Device::current().maxGrid()[1]);
  EXPECT_TRUE(contains(errorOf([&] { axpy.launch({1, maxY + 1, 1}, 128, 0, noArgs); }),
                       "over the limit of " + std::to_string(maxY)));
  // Nothing reached the GPU: the context is still healthy.
  EXPECT_NO_THROW(synchronize());
}

TEST(RuntimeGpu, DynamicSharedMemoryAboveTheDefaultIsRaised) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom random;
  Device& device = Device::current();
  Module module(kPtx, "runtime_test");
  Kernel reverse = module.function("reverse_block");
  const unsigned threads = 256;
  uint32_t n = uint32_t(50000 + random() % 20000);
  if (n % threads == 0) ++n;
  std::vector<float> in(n);
  for (auto& v : in) v = float(random() % 1000000) + 0.5f;
  DeviceBuffer din = upload(in), dout(n * sizeof(float));
  uint64_t outAddress = dout.address(), inAddress = din.address();

  // 48 KiB, then ~100 KiB (needs the opt-in), then the most the device allows; the staging area
  // sits at the very end, so a limit that was not raised would fault or fail the launch.
  for (size_t shared : {size_t(48 * 1024), size_t(100 * 1024), device.maxSharedBytesPerBlockOptin()}) {
    dout.fillBytes(0xFF);
    uint32_t offset = uint32_t(shared - threads * sizeof(float));
    void* args[] = {&outAddress, &inAddress, &n, &offset};
    reverse.launch({blocksFor(n, threads), 1, 1}, threads, unsigned(shared), args);
    synchronize();
    std::vector<float> out = download<float>(dout);
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t blockStart = i / threads * threads, mirror = blockStart + (threads - 1 - i % threads);
      float expected = mirror < n ? in[mirror] : 0.0f;
      if (out[i] != expected && wrong++ < 5)
        ADD_FAILURE() << "shared " << shared << ": out[" << i << "] = " << out[i] << ", expected " << expected;
    }
    EXPECT_EQ(wrong, 0u) << "with " << shared << " bytes of dynamic shared memory";
  }
}

TEST(RuntimeGpu, OversizeSharedMemoryIsRefusedNamingNeedAndLimit) {
  FLEXTILE_REQUIRE_GPU();
  Device& device = Device::current();
  Module module(kPtx, "runtime_test");
  Kernel tile = module.function("static_tile");
  EXPECT_EQ(tile.attributes().staticSharedBytes, 1024);
  size_t limit = device.maxSharedBytesPerBlockOptin();
  unsigned dynamic = unsigned(limit - 1024 + 1);  // one byte too many with the static tile
  DeviceBuffer out(256 * sizeof(uint32_t));
  uint64_t address = out.address();
  void* args[] = {&address};
  std::string message = errorOf([&] { tile.launch({1, 1, 1}, 256, dynamic, args); });
  EXPECT_TRUE(contains(message, "kernel 'static_tile': needs " + std::to_string(limit + 1) +
                                    " bytes of shared memory per block (1024 static + " + std::to_string(dynamic) +
                                    " dynamic)"))
      << message;
  EXPECT_TRUE(contains(message, "allows at most " + std::to_string(limit) + " bytes per block")) << message;

  // The largest that fits runs, and the static tile works.
  out.fillBytes(0xFF);
  tile.launch({1, 1, 1}, 256, dynamic - 1, args);
  synchronize();
  std::vector<uint32_t> values = download<uint32_t>(out);
  for (uint32_t i = 0; i < 256; ++i) EXPECT_EQ(values[i], i);
}

TEST(RuntimeGpu, BadPtxReportsTheJitLog) {
  FLEXTILE_REQUIRE_GPU();
  const std::string bad = R"(
.version 8.0
.target sm_80
.address_size 64
.visible .entry broken(.param .u64 p_out)
{
  .reg .b32 %r<2>;
  mov.u32 %r1, %tid.x;
  add.u32 %r1, %r1, %undeclared_register;
  ret;
}
)";
  std::string message = errorOf([&] { Module module(bad, "broken.ptx"); });
  EXPECT_TRUE(contains(message, "cuModuleLoadDataEx failed: CUDA_ERROR_INVALID_PTX")) << message;
  EXPECT_TRUE(contains(message, "loading PTX module 'broken.ptx'")) << message;
  EXPECT_TRUE(contains(message, "JIT error log:\n")) << message;
  EXPECT_TRUE(contains(message, "undeclared_register")) << message;
  EXPECT_TRUE(contains(message, "line 9")) << message;
  // A JIT failure leaves the context usable.
  EXPECT_NO_THROW(synchronize());
  EXPECT_NO_THROW(Module(kPtx, "after_failure").function("axpy"));
}

#if FLEXTILE_HAVE_CUBIN_TEST_IMAGE
#include "CubinTestImage.inc"
#endif

// Module::fromCompiled loads a ptxas cubin as it is (no JIT), and falls back to the PTX, saying why,
// when the driver refuses the image. Both run the same axpy correctly.
TEST(RuntimeGpu, CubinLoadsAsItIsAndFallsBackToPtx) {
  FLEXTILE_REQUIRE_GPU();
#if !FLEXTILE_HAVE_CUBIN_TEST_IMAGE
  GTEST_SKIP() << "built without ptxas: no cubin was embedded in this test";
#else
  auto runAxpy = [](const Module& module) {
    SeededRandom random;
    uint32_t n = uint32_t(5000 + random() % 3000);
    std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
    std::vector<float> x(n), y(n);
    for (auto& v : x) v = uniform(random);
    for (auto& v : y) v = uniform(random);
    float a = uniform(random);
    DeviceBuffer dx = upload(x), dy = upload(y), dout(size_t(n) * sizeof(float));
    dout.fillBytes(0xFF);
    uint64_t outAddress = dout.address(), xAddress = dx.address(), yAddress = dy.address();
    void* args[] = {&outAddress, &xAddress, &yAddress, &a, &n};
    module.function("axpy").launch({blocksFor(n, 128), 1, 1}, 128, 0, args);
    synchronize();
    std::vector<float> out = download<float>(dout);
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const double reference = double(a) * double(x[i]) + double(y[i]);
      if (!(std::abs(out[i] - reference) <= 1e-6 * std::abs(reference) + 1e-30)) ++wrong;
    }
    return wrong;
  };
  const std::string image(reinterpret_cast<const char*>(kCubinTestImage), kCubinTestImageSize);
  ASSERT_EQ(image.substr(0, 4), std::string("\x7f" "ELF"));
  if (Device::current().capability() == 90) {
    Module cubin = Module::fromCompiled(kCubinTestPtx, image, "axpy.cubin");
    EXPECT_TRUE(cubin.loadedFromCubin()) << cubin.cubinFallbackReason();
    EXPECT_TRUE(cubin.cubinFallbackReason().empty());
    EXPECT_EQ(runAxpy(cubin), 0u);
  }
  // A damaged image: the driver refuses it and the PTX is JIT-compiled instead.
  std::string damaged = image;
  damaged[damaged.size() / 2] ^= 0x5A;
  damaged.resize(damaged.size() / 3);
  Module fallback = Module::fromCompiled(kCubinTestPtx, damaged, "damaged.cubin");
  EXPECT_FALSE(fallback.loadedFromCubin());
  EXPECT_TRUE(contains(fallback.cubinFallbackReason(), "cuModuleLoadDataEx")) << fallback.cubinFallbackReason();
  EXPECT_TRUE(contains(fallback.cubinFallbackReason(), "damaged.cubin")) << fallback.cubinFallbackReason();
  EXPECT_EQ(runAxpy(fallback), 0u);
  // Without a cubin it is the plain PTX module.
  Module plain = Module::fromCompiled(kCubinTestPtx, "", "axpy.ptx");
  EXPECT_FALSE(plain.loadedFromCubin());
  EXPECT_TRUE(plain.cubinFallbackReason().empty());
  EXPECT_EQ(runAxpy(plain), 0u);
#endif
}

TEST(RuntimeGpu, EventsTimeAKernel) {
  FLEXTILE_REQUIRE_GPU();
  Module module(kPtx, "runtime_test");
  Kernel spin = module.function("spin");
  Stream stream;
  auto spinFor = [&](uint64_t nanoseconds) {
    void* args[] = {&nanoseconds};
    spin.launch({1, 1, 1}, 32, 0, args, &stream);
  };
  // The kernel waits on the GPU's own clock, so the events must measure at least that long.
  std::vector<double> samples = timeKernel([&] { spinFor(2000000); }, 2, 7, &stream);
  ASSERT_EQ(samples.size(), 7u);
  for (double sample : samples) {
    EXPECT_GE(sample, 1.99) << "a 2 ms spin measured " << sample << " ms";
    EXPECT_LT(sample, 50.0) << "a 2 ms spin measured " << sample << " ms";
  }
  double shortSpin = median(timeKernel([&] { spinFor(100000); }, 1, 5, &stream));
  EXPECT_GE(shortSpin, 0.099);
  EXPECT_LT(shortSpin, median(samples));

  Timer timer(&stream);
  timer.start();
  spinFor(3000000);
  double milliseconds = timer.stopMs();
  EXPECT_GE(milliseconds, 2.99);
  EXPECT_LT(milliseconds, 50.0);

  // Cold-cache timing works on the default stream too.
  TimingOptions options;
  options.warmup = 1;
  options.reps = 3;
  options.flushL2 = true;
  std::vector<double> cold = timeKernel([&] {
    uint64_t nanoseconds = 500000;
    void* args[] = {&nanoseconds};
    spin.launch({1, 1, 1}, 32, 0, args);
  }, options);
  ASSERT_EQ(cold.size(), 3u);
  for (double sample : cold) EXPECT_GE(sample, 0.499);
  stream.synchronize();
}

TEST(RuntimeGpu, ThreadsLaunchOnTheirOwnStreams) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom random;
  // Loaded on this thread, used on others: each runtime call makes the context current itself.
  Module module(kPtx, "runtime_test");
  Kernel axpy = module.function("axpy");
  constexpr int kWorkers = 4;
  std::vector<uint32_t> sizes(kWorkers);
  for (auto& n : sizes) n = uint32_t(20000 + random() % 30000);
  std::vector<std::string> errors(kWorkers);
  std::vector<size_t> wrong(kWorkers, 0);
  std::vector<std::thread> workers;
  for (int worker = 0; worker < kWorkers; ++worker) {
    workers.emplace_back([&, worker] {
      try {
        uint32_t n = sizes[worker];
        float a = float(worker + 1);
        std::vector<float> x(n), y(n);
        for (uint32_t i = 0; i < n; ++i) {
          x[i] = float(i % 1000) * 0.25f;
          y[i] = float(worker) - float(i % 7);
        }
        Stream stream;
        DeviceBuffer dx = upload(x), dy = upload(y), dout(n * sizeof(float));
        dout.fillBytes(0xFF);
        uint64_t outAddress = dout.address(), xAddress = dx.address(), yAddress = dy.address();
        void* args[] = {&outAddress, &xAddress, &yAddress, &a, &n};
        for (int rep = 0; rep < 20; ++rep) axpy.launch({blocksFor(n, 128), 1, 1}, 128, 0, args, &stream);
        stream.synchronize();
        std::vector<float> out = download<float>(dout);
        for (uint32_t i = 0; i < n; ++i) wrong[worker] += out[i] != a * x[i] + y[i];  // exact: small integers
      } catch (const std::exception& error) {
        errors[worker] = error.what();
      }
    });
  }
  for (auto& thread : workers) thread.join();
  for (int worker = 0; worker < kWorkers; ++worker) {
    EXPECT_EQ(errors[worker], "") << "worker " << worker;
    EXPECT_EQ(wrong[worker], 0u) << "worker " << worker << " of " << sizes[worker] << " elements";
  }
}

}  // namespace
}  // namespace flextile::runtime
