// dsl::Tensor (owned, views, strides, copies, errors) and captured tensors:
// extra kernel parameters made on first use, passed by the launcher, read with
// bounds masks, rebound without retracing.
#include <gtest/gtest.h>

#include <Eigen/Core>
#include <numeric>

#include "dsl/DSL.h"
#include "gpu/GpuTest.h"
#include "ir/Hash.h"
#include "MaskTestUtil.h"

using namespace flextile;
using namespace flextile::dsl;
using flextile::testing::expectError;
using flextile::testing::SeededRandom;

namespace {

TEST(Tensor, OwnedHostRoundTrip) {
  SeededRandom rng;
  std::vector<float> data(6 * 7);
  for (auto& x : data) x = std::uniform_real_distribution<float>(-1, 1)(rng);
  Tensor t = Tensor::fromHost(data, {6, 7});
  EXPECT_EQ(t.dtype(), DType::F32);
  EXPECT_EQ(t.shape(), (Shape{6, 7}));
  EXPECT_EQ(t.strides(), (std::vector<int64_t>{7, 1}));
  EXPECT_TRUE(t.isContiguous());
  EXPECT_TRUE(t.owned());
  EXPECT_TRUE(t.isHost());
  EXPECT_EQ(t.numel(), 42);
  EXPECT_EQ(t.extentBytes(), 42u * 4);
  EXPECT_EQ(t.toHost<float>(), data);
  // Copies share storage, like a framework tensor handle.
  Tensor alias = t;
  std::vector<float> other(42, 2.5f);
  alias.copyFromHost(other);
  EXPECT_EQ(t.toHost<float>(), other);
  EXPECT_EQ(t.describe(), "f32[6, 7] host, owned");
}

// float data in and out of bf16 and f16 tensors, without Eigen's types: rounded to nearest even on
// the way in, exact on the way out; strided views too; counts still checked.
TEST(Tensor, FloatDataFillsAndReadsHalfTensors) {
  const std::vector<float> data{1.0f, 1.00390625f, -2.5f, 3.0e-3f, 65504.0f, 1.0f / 3.0f};
  for (DType dt : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dt)));
    Tensor t = Tensor::fromHost(data, dt, {2, 3});
    EXPECT_EQ(t.dtype(), dt);
    const std::vector<float> back = t.toHost<float>();
    ASSERT_EQ(back.size(), data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      const float want = dt == DType::BF16 ? float(Eigen::bfloat16(data[i])) : float(Eigen::half(data[i]));
      EXPECT_EQ(back[i], want) << i;
    }
    EXPECT_EQ(back[0], 1.0f);
    // 1 + 2^-8 is a tie for bf16 (8 bits): rounds to even, 1.0; f16 keeps it.
    EXPECT_EQ(back[1], dt == DType::BF16 ? 1.0f : 1.00390625f);
    std::vector<uint8_t> storage(32 * 2);
    Tensor view = Tensor::hostView(storage.data(), dt, {2, 3}, {8, 2});
    view.copyFromHost(data);
    EXPECT_EQ(view.toHost<float>(), back);
    try {
      t.copyFromHost(std::vector<float>(5, 1.0f));
      ADD_FAILURE() << "no error for 5 elements into 6";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot copy 5 elements"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(Tensor::fromHost(data, DType::I32, {6}), Error);  // no silent float -> int conversion
}

TEST(Tensor, HostViewWithStridesGathersAndScatters) {
  // A column slice of a caller's [4, 5] i32 matrix: columns 1..3, no copy.
  std::vector<int32_t> owner(20);
  std::iota(owner.begin(), owner.end(), 0);
  Tensor v = Tensor::hostView(owner.data() + 1, DType::I32, {4, 3}, {5, 1});
  EXPECT_FALSE(v.isContiguous());
  EXPECT_FALSE(v.owned());
  EXPECT_EQ(v.toHost<int32_t>(), (std::vector<int32_t>{1, 2, 3, 6, 7, 8, 11, 12, 13, 16, 17, 18}));
  v.copyFromHost(std::vector<int32_t>(12, -1));
  EXPECT_EQ(owner[0], 0);
  EXPECT_EQ(owner[1], -1);
  EXPECT_EQ(owner[4], 4);
  EXPECT_EQ(owner[18], -1);
  EXPECT_EQ(owner[19], 19);
  EXPECT_EQ(v.extentBytes(), size_t(3 * 5 + 2 + 1) * 4);
  EXPECT_NE(v.describe().find("strides [5, 1] host view"), std::string::npos) << v.describe();
}

TEST(Tensor, ViewOfSharesAndKeepsTheStorage) {
  std::vector<int32_t> values(24);
  std::iota(values.begin(), values.end(), 0);
  Tensor view;
  std::weak_ptr<const int> lease;
  {
    Tensor base = Tensor::fromHost(values, {2, 3, 4});
    auto token = std::make_shared<const int>(7);
    lease = token;
    // Row 1 of the [2, 3, 4] tensor, as a [3, 4] tensor of its own.
    view = Tensor::viewOf(base, 12, {3, 4}, {}, token);
    EXPECT_EQ(static_cast<int32_t*>(view.hostData()), static_cast<int32_t*>(base.hostData()) + 12);
    EXPECT_FALSE(view.owned());
    expectError([&] { (void)Tensor::viewOf(base, 13, {3, 4}); }, {"from element 13", "reaches past", "96 bytes"});
    expectError([&] { (void)Tensor::viewOf(base, -1, {1}); }, {"from element -1"});
  }
  // The base handle and the token are gone; the view keeps both alive.
  EXPECT_FALSE(lease.expired());
  EXPECT_EQ(view.toHost<int32_t>(), std::vector<int32_t>(values.begin() + 12, values.end()));
  view = Tensor();
  EXPECT_TRUE(lease.expired());
}

TEST(Tensor, HalfAndBfloatElements) {
  std::vector<Eigen::half> h{Eigen::half(1.5f), Eigen::half(-2.0f)};
  Tensor t = Tensor::fromHost(h, {2});
  EXPECT_EQ(t.dtype(), DType::F16);
  EXPECT_EQ(float(t.toHost<Eigen::half>()[1]), -2.0f);
  std::vector<Eigen::bfloat16> b{Eigen::bfloat16(3.0f)};
  EXPECT_EQ(Tensor::fromHost(b, {1}).dtype(), DType::BF16);
}

TEST(Tensor, BooleansAreBytes) {
  const bool flags[3] = {true, false, true};
  Tensor t = Tensor::fromHost(std::span<const bool>(flags), {3});
  EXPECT_EQ(t.dtype(), DType::I1);
  EXPECT_EQ(t.toHost<uint8_t>(), (std::vector<uint8_t>{1, 0, 1}));
}

TEST(Tensor, ErrorsNameTheMismatch) {
  Tensor t = Tensor::zeros(DType::I32, {2, 3}, MemorySpace::Host);
  expectError([&] { t.copyFromHost(std::vector<float>(6)); }, {"cannot copy f32", "i32[2, 3]"});
  expectError([&] { t.copyFromHost(std::vector<int32_t>(5)); }, {"5 elements", "(6 elements)"});
  expectError([&] { (void)t.toHost<int64_t>(); }, {"i32[2, 3]", "i64"});
  expectError([&] { t.expect("document ids", DType::I32, {2, 4}); }, {"document ids", "[2, 4]", "i32[2, 3]"});
  expectError([&] { t.expectDType("slopes", DType::F32); }, {"slopes", "f32", "i32[2, 3]"});
  expectError([&] { (void)Tensor::zeros(DType::F32, {-1, 2}, MemorySpace::Host); }, {"negative dimension"});
  expectError([&] { (void)Tensor::hostView(t.hostData(), DType::I32, {2, 3}, {3}); }, {"rank 2", "1 strides"});
  expectError([&] { (void)Tensor::hostView(nullptr, DType::F32, {4}); }, {"null pointer"});
  expectError([&] { (void)t.deviceAddress(); }, {"not in device memory"});
  expectError([&] { (void)t.size(2); }, {"dimension 2"});
  expectError([&] { (void)Tensor().space(); }, {"empty Tensor"});
}

TEST(Tensor, DeviceWithoutGpuSaysSo) {
  std::string why;
  if (deviceAvailable(&why)) GTEST_SKIP() << "a GPU is present; the GPU suite covers device tensors";
  EXPECT_FALSE(why.empty());
  EXPECT_THROW((void)Tensor::zeros(DType::F32, {4}, MemorySpace::Device), std::exception);
  // A view needs no driver until it is copied.
  Tensor v = Tensor::deviceView(0x10000, DType::F32, {4});
  EXPECT_TRUE(v.isDevice());
  EXPECT_EQ(v.deviceAddress(), 0x10000u);
}

// ---- captured tensors ------------------------------------------------------

// out[i] = captured(i) for i < n, over a BLOCK tile: indices past the
// captured tensor read 0 (the bounds mask), past n nothing is stored.
Kernel gatherKernel(CapturedTensor c) {
  return kernel("gather", [c](Ptr<i32> out, Int n, Const<int> BLOCK) {
    auto i = arange(0, BLOCK);
    store(out + i, c(i), i < n);
  });
}

TEST(Capture, ParametersFollowTheKernelsOwnAndTheLauncherPassesThem) {
  SeededRandom rng;
  std::vector<int32_t> values(13);
  for (auto& v : values) v = int32_t(rng() % 1000) + 1;
  CapturedTensor c = capture(Tensor::fromHost(values, {13}), "table");
  Kernel k = gatherKernel(c);
  auto f = k.trace({.constants = {16}});
  // out, n, then the capture: data, size0, stride0.
  ASSERT_EQ(f->params().size(), 5u);
  EXPECT_EQ(f->params()[2]->type().str(), "ptr<i32>");
  EXPECT_EQ(f->params()[2]->nameHint(), "table");
  EXPECT_EQ(f->params()[3]->nameHint(), "table_size0");
  EXPECT_EQ(f->params()[4]->nameHint(), "table_stride0");
  std::vector<int32_t> out(16, -7);
  k.interpret({.grid = {1, 1, 1}, .constants = {16}}, out, 15);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[size_t(i)], i < 13 ? values[size_t(i)] : i < 15 ? 0 : -7) << "i=" << i;
}

TEST(Capture, NewValuesAndRebindingNeverRetrace) {
  SeededRandom rng;
  CapturedTensor c = capture(Tensor::fromHost(std::vector<int32_t>(8, 1), {8}), "t");
  Kernel k = gatherKernel(c);
  std::vector<int32_t> values;
  auto randomValues = [&](size_t n) {
    values.resize(n);
    for (auto& v : values) v = int32_t(rng() % 100);
  };
  auto expectGathered = [&](const char* round) {
    std::vector<int32_t> out(32, -1);
    k.interpret({.grid = {1, 1, 1}, .constants = {32}}, out, 32);
    for (size_t i = 0; i < 32; ++i) EXPECT_EQ(out[i], i < values.size() ? values[i] : 0) << round << " i=" << i;
  };
  randomValues(8);
  c.tensor().copyFromHost(values);  // new values in the same memory
  expectGathered("new values");
  randomValues(5);
  c.rebind(Tensor::fromHost(values, {5}));  // another tensor, another size
  expectGathered("rebound to 5");
  randomValues(19);
  c.rebind(Tensor::fromHost(values, {19}));
  expectGathered("rebound to 19");
  EXPECT_EQ(k.numTraces(), 1u);
  expectError([&] { c.rebind(Tensor::zeros(DType::F32, {8}, MemorySpace::Host)); }, {"capture 't'", "i32", "rank 1"});
  expectError([&] { c.rebind(Tensor::zeros(DType::I32, {2, 4}, MemorySpace::Host)); }, {"rank 1", "i32[2, 4]"});
}

TEST(Capture, StridedViewsAndTwoDimensions) {
  // A transposed view of a caller's [3, 5] matrix, read as [5, 3] through its strides.
  std::vector<float> owner(15);
  for (int i = 0; i < 15; ++i) owner[size_t(i)] = float(i) * 0.5f;
  CapturedTensor c = capture(Tensor::hostView(owner.data(), DType::F32, {5, 3}, {1, 5}), "transposed");
  Kernel k = kernel("read2d", [c](Ptr<f32> out) {
    auto r = arange(0, 8).expand(1), col = arange(0, 4).expand(0);
    store(out + r * 4 + col, c(r, col));
  });
  std::vector<float> out(32, -1);
  k.interpret({.grid = {1, 1, 1}}, out);
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 4; ++col)
      EXPECT_EQ(out[size_t(r * 4 + col)], r < 5 && col < 3 ? owner[size_t(col * 5 + r)] : 0.0f) << r << "," << col;
}

TEST(Capture, IdentityDoesNotDependOnTheData) {
  auto make = [](std::vector<int32_t> v) {
    return gatherKernel(capture(Tensor::fromHost(v, {int64_t(v.size())}), "t")).trace({.constants = {16}});
  };
  EXPECT_EQ(ir::structuralHash(*make({1, 2, 3})), ir::structuralHash(*make({9, 8, 7, 6, 5, 4})));
}

TEST(Capture, OneCaptureUsedTwiceIsOneSetOfParameters) {
  CapturedTensor c = capture(Tensor::fromHost(std::vector<int32_t>{5, 6}, {2}), "t");
  Kernel k = kernel("twice", [c](Ptr<i32> out) {
    auto i = arange(0, 2);
    store(out + i, c(i) + c(1 - i) + c.size(0));
  });
  auto f = k.trace();
  EXPECT_EQ(f->params().size(), 4u);
  std::vector<int32_t> out(2);
  k.interpret({}, out);
  EXPECT_EQ(out, (std::vector<int32_t>{13, 13}));
}

TEST(Capture, LaunchErrorsNameTheCapture) {
  CapturedTensor c = capture(Tensor::fromHost(std::vector<int32_t>{1}, {1}), "doc_ids");
  Kernel k = gatherKernel(c);
  std::vector<int32_t> out(16);
  expectError([&] { k.interpret({.constants = {16}}, out); },
              {"expects 2 run-time arguments", "captured tensors are passed automatically", "got 1"});
  // A host capture cannot go to a GPU launch (checked before the driver is needed).
  expectError([&] { k.run({.constants = {16}}, KernelArg::deviceAddress(0x1000, 64), 16); },
              {"captured tensor 'doc_ids'", "host memory", "run()"});
  CapturedTensor device = capture(Tensor::deviceView(0x2000, DType::I32, {4}), "on_gpu");
  expectError([&] { gatherKernel(device).interpret({.constants = {16}}, out, 16); },
              {"captured tensor 'on_gpu'", "device memory", "interpret()"});
  expectError([&] {
    CapturedTensor empty;
    kernel("empty", [empty](Ptr<i32> out) { store(out + arange(0, 4), empty(arange(0, 4))); }).trace();
  }, {"TensorCaptureTest.cpp:", "empty CapturedTensor"});
  expectError([&] {
    kernel("bad", [c](Ptr<i32> out) { store(out + arange(0, 4), c(arange(0, 4), 0)); }).trace();
  }, {"doc_ids", "rank 1", "2 indices"});
  expectError([&] { (void)c(1); }, {"outside a kernel trace"});
  expectError([&] { (void)capture(Tensor(), "x"); }, {"capture 'x'", "empty"});
}

}  // namespace
