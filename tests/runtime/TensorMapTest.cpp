// TMA tensor maps (runtime/TensorMap.h) against the recording fake driver (RecordingCuda.cpp): what
// cuTensorMapEncodeTiled receives, that the map's bytes are the driver's, that a refusal by the
// driver reads as a DriverError, and that every argument the driver documents a rule for is refused
// here first, naming it and its value, without the driver being called. No GPU is needed
// (tests/gpu/TensorMapGpuTest.cpp encodes real maps).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "dsl/Kernel.h"
#include "runtime/DriverError.h"
#include <algorithm>
#include "runtime/TensorMap.h"
#include "tests/runtime/RecordingDriverLog.h"
#include "tests/ThrownMessage.h"

namespace flextile::runtime {
namespace {

namespace fs = std::filesystem;

// Before anything loads the driver: this process's fake driver and its log.
const flextile::testing::RecordingDriverLog kDriver("tensor-map");

// The tensor-map calls logged since the last take().
std::vector<std::string> takeEncodes() { return kDriver.take("tensormap"); }

std::string errorOf(const TensorMapDesc& desc) {
  return testing::thrownMessage<DriverError>([&] { TensorMap map(desc); }, "(encoded)");
}

bool contains(const std::string& s, const std::string& piece) { return s.find(piece) != std::string::npos; }

// A bf16 [B*H*S, D] tensor (row-major: D contiguous) and a [128, 64] tile of it, swizzled 128B:
// the shape the attention forward's K/V loads will use. S is no multiple of the box.
TensorMapDesc attentionTile() {
  const uint64_t rows = 2 * 3 * 1000, d = 64;
  TensorMapDesc desc;
  desc.globalAddress = 0x7f0000001000;
  desc.dtype = TensorMapDType::BF16;
  desc.globalDims = {d, rows};
  desc.globalStrides = {d * 2};
  desc.boxDims = {64, 128};
  desc.swizzle = TensorMapSwizzle::Bytes128;
  return desc;
}

TEST(TensorMap, TheDriverReceivesExactlyTheArgumentsGiven) {
  takeEncodes();
  TensorMapDesc desc;  // rank 3, with element strides and every enum off its default
  desc.globalAddress = 0x7f00000a0040;
  desc.dtype = TensorMapDType::F16;
  desc.globalDims = {96, 1000, 7};
  desc.globalStrides = {208, 208 * 1000};
  desc.boxDims = {32, 16, 1};
  desc.elementStrides = {1, 2, 1};
  desc.swizzle = TensorMapSwizzle::Bytes64;
  desc.l2Promotion = TensorMapL2Promotion::Bytes256;
  TensorMap map(desc);
  std::vector<std::string> calls = takeEncodes();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0],
            "tensormap dtype 6 rank 3 address 0x7f00000a0040 dims 96,1000,7 strides 208,208000 box 32,16,1 "
            "elementstrides 1,2,1 interleave 0 swizzle 2 l2 3 oobfill 0");

  // Element strides left out are all 1; bf16 is CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 (9), 128B swizzle 3.
  TensorMap attention(attentionTile());
  calls = takeEncodes();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0],
            "tensormap dtype 9 rank 2 address 0x7f0000001000 dims 64,6000 strides 128 box 64,128 elementstrides 1,1 "
            "interleave 0 swizzle 3 l2 0 oobfill 0");
  EXPECT_EQ(attention.desc().boxDims, (std::vector<uint32_t>{64, 128}));
}

TEST(TensorMap, TheBytesAreTheDriversAndAlignedForIt) {
  // The fake refuses a map that is not 64-byte aligned, as the driver does: maps in a vector too.
  std::vector<TensorMap> maps;
  for (int i = 0; i < 3; ++i) maps.emplace_back(attentionTile());
  takeEncodes();
  for (const TensorMap& map : maps) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(map.data()) % 64, 0u);
    ASSERT_EQ(map.bytes().size(), 128u);
    const auto* words = static_cast<const uint64_t*>(map.data());
    for (uint64_t i = 0; i < 16; ++i) EXPECT_EQ(words[i], 0x7E45000000000000ull + i + 1) << "word " << i;
  }
  TensorMap copy = maps[1];  // a value: copies keep the bytes
  EXPECT_EQ(std::memcmp(copy.data(), maps[1].data(), TensorMap::kBytes), 0);
}

TEST(TensorMap, ADriverRefusalIsADriverErrorDescribingTheMap) {
  takeEncodes();
  setenv("FLEXTILE_FAKE_CUDA_TENSOR_MAP_FAILS", "1", 1);
  std::string msg;
  int result = 0;
  try {
    TensorMap map(attentionTile());
  } catch (const DriverError& e) {
    msg = e.what();
    result = e.result();
  }
  unsetenv("FLEXTILE_FAKE_CUDA_TENSOR_MAP_FAILS");
  EXPECT_EQ(result, 1);
  EXPECT_TRUE(contains(msg, "cuTensorMapEncodeTiled failed: CUDA_ERROR_FAKE")) << msg;
  EXPECT_TRUE(contains(msg, "encoding the tensor map bf16 dims [64, 6000] strides [128] box [64, 128] swizzle 128B at "
                            "0x7f0000001000"))
      << msg;
  EXPECT_EQ(takeEncodes().size(), 1u);  // it was the driver that refused
}

// Each case breaks one rule; the message names the argument and its value, and the driver is never
// called.
TEST(TensorMap, EveryDocumentedRuleIsCheckedBeforeTheDriver) {
  struct Case {
    const char* rule;
    std::function<void(TensorMapDesc&)> breakIt;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"rank 0", [](TensorMapDesc& d) { d.globalDims.clear(); d.globalStrides.clear(); d.boxDims.clear(); },
       "rank 0 (the number of globalDims) is outside 1..5"},
      {"rank 6",
       [](TensorMapDesc& d) {
         d.globalDims = {64, 2, 2, 2, 2, 2};
         d.globalStrides = {128, 256, 512, 1024, 2048};
         d.boxDims = {64, 1, 1, 1, 1, 1};
       },
       "rank 6 (the number of globalDims) is outside 1..5"},
      {"strides count", [](TensorMapDesc& d) { d.globalStrides = {128, 128}; },
       "globalStrides has 2 entries; rank 2 needs 1"},
      {"box count", [](TensorMapDesc& d) { d.boxDims = {64}; }, "boxDims has 1 entries; rank 2 needs 2"},
      {"element strides count", [](TensorMapDesc& d) { d.elementStrides = {1, 1, 1}; },
       "elementStrides has 3 entries; rank 2 needs 2"},
      {"null address", [](TensorMapDesc& d) { d.globalAddress = 0; }, "globalAddress is null"},
      {"misaligned address", [](TensorMapDesc& d) { d.globalAddress = 0x7f0000001008; },
       "globalAddress 0x7f0000001008 is not 16-byte aligned"},
      {"zero dim", [](TensorMapDesc& d) { d.globalDims[1] = 0; }, "globalDims[1] = 0 is outside 1..2^32"},
      {"huge dim", [](TensorMapDesc& d) { d.globalDims[1] = (uint64_t(1) << 32) + 1; },
       "globalDims[1] = 4294967297 is outside 1..2^32"},
      {"stride not 16-byte", [](TensorMapDesc& d) { d.globalStrides[0] = 136; },
       "globalStrides[0] = 136 bytes is not a multiple of 16"},
      {"stride 2^40", [](TensorMapDesc& d) { d.globalStrides[0] = uint64_t(1) << 40; },
       "globalStrides[0] = 1099511627776 bytes is not below 2^40"},
      {"zero box", [](TensorMapDesc& d) { d.boxDims[1] = 0; }, "boxDims[1] = 0 is outside 1..256"},
      {"box 257", [](TensorMapDesc& d) { d.boxDims[1] = 257; }, "boxDims[1] = 257 is outside 1..256"},
      {"inner box bytes", [](TensorMapDesc& d) { d.boxDims[0] = 20; d.swizzle = TensorMapSwizzle::None; },
       "boxDims[0] = 20 bf16 elements = 40 bytes, not a multiple of 16 bytes"},
      {"zero element stride", [](TensorMapDesc& d) { d.elementStrides = {1, 0}; },
       "elementStrides[1] = 0 is outside 1..8"},
      {"element stride 9", [](TensorMapDesc& d) { d.elementStrides = {9, 1}; }, "elementStrides[0] = 9 is outside 1..8"},
      {"box wider than the 64B swizzle", [](TensorMapDesc& d) { d.swizzle = TensorMapSwizzle::Bytes64; },
       "boxDims[0] = 64 bf16 elements = 128 bytes, more than the 64-byte span of the swizzle"},
      {"box wider than the 128B swizzle", [](TensorMapDesc& d) { d.boxDims[0] = 128; },
       "boxDims[0] = 128 bf16 elements = 256 bytes, more than the 128-byte span of the swizzle"},
      {"unknown swizzle", [](TensorMapDesc& d) { d.swizzle = TensorMapSwizzle(7); },
       "swizzle 7 is not a CUtensorMapSwizzle FlexTile knows"},
      {"unknown L2 promotion", [](TensorMapDesc& d) { d.l2Promotion = TensorMapL2Promotion(4); },
       "l2Promotion 4 is not a CUtensorMapL2promotion FlexTile knows"},
      {"unknown dtype", [](TensorMapDesc& d) { d.dtype = TensorMapDType(12); },
       "dtype 12 is not a CUtensorMapDataType FlexTile knows"},
  };
  takeEncodes();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rule);
    TensorMapDesc desc = attentionTile();
    c.breakIt(desc);
    std::string msg = errorOf(desc);
    EXPECT_TRUE(contains(msg, "tensor map (")) << msg;
    EXPECT_TRUE(contains(msg, c.message)) << msg;
    EXPECT_TRUE(takeEncodes().empty()) << "the driver was called for a map refused before it";
  }
  // The limits themselves are allowed: each boundary value encodes.
  TensorMapDesc edge = attentionTile();
  edge.globalDims[1] = uint64_t(1) << 32;
  edge.globalStrides[0] = (uint64_t(1) << 40) - 16;
  edge.boxDims[1] = 256;
  edge.elementStrides = {1, 8};
  EXPECT_EQ(errorOf(edge), "(encoded)");
  TensorMapDesc narrow = attentionTile();  // 8 bf16 = 16 bytes: the narrowest inner box
  narrow.boxDims[0] = 8;
  narrow.swizzle = TensorMapSwizzle::Bytes32;
  EXPECT_EQ(errorOf(narrow), "(encoded)");
  TensorMapDesc rank1;
  rank1.globalAddress = 0x7f0000000100;
  rank1.dtype = TensorMapDType::F32;
  rank1.globalDims = {1000};
  rank1.boxDims = {256};
  EXPECT_EQ(errorOf(rank1), "(encoded)");
  EXPECT_EQ(takeEncodes().size(), 3u);
}

TEST(TensorMap, ElementSizesAndNames) {
  EXPECT_EQ(tensorMapElementBytes(TensorMapDType::U8), 1);
  EXPECT_EQ(tensorMapElementBytes(TensorMapDType::BF16), 2);
  EXPECT_EQ(tensorMapElementBytes(TensorMapDType::F16), 2);
  EXPECT_EQ(tensorMapElementBytes(TensorMapDType::I32), 4);
  EXPECT_EQ(tensorMapElementBytes(TensorMapDType::F64), 8);
  EXPECT_STREQ(tensorMapDTypeName(TensorMapDType::BF16), "bf16");
  EXPECT_EQ(tensorMapSwizzleBytes(TensorMapSwizzle::Bytes128), 128);
  EXPECT_EQ(tensorMapSwizzleBytes(TensorMapSwizzle::None), 0);
}

// A compiled kernel's recipe (codegen/TensorMaps.h) becomes the map dsl::Kernel passes: dims and
// strides read from the launch arguments or the recipe's constants, turned innermost first, strides
// in bytes; an argument TMA cannot describe is an error naming the kernel and the map.
TEST(TensorMap, AKernelsRecipeIsEncodedFromItsArguments) {
  takeEncodes();
  codegen::TensorMapRecipe r;
  r.baseParam = 0;
  r.dtype = ir::DType::BF16;
  r.dims = {{1, 0}, {2, 0}, {3, 0}, {-1, 128}};  // [B, H, S, 128]
  r.strides = {{4, 0}, {5, 0}, {6, 0}};
  r.box = {1, 1, 64, 64};
  r.swizzleBytes = 128;
  std::vector<dsl::KernelArg> args{dsl::KernelArg::deviceAddress(0x7f0000002000, 1 << 24), 2, 3, 1000,
                                   3 * 1024 * 136, 1024 * 136, 136};
  TensorMap map = dsl::encodeTensorMap("fwd", r, args);
  std::vector<std::string> calls = takeEncodes();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0],
            "tensormap dtype 9 rank 4 address 0x7f0000002000 dims 128,1000,3,2 strides 272,278528,835584 box 64,64,1,1 "
            "elementstrides 1,1,1,1 interleave 0 swizzle 3 l2 3 oobfill 0");
  args[6] = 129;  // 258 bytes between rows: not a multiple of 16
  const std::string msg = [&] {
    try {
      dsl::encodeTensorMap("fwd", r, args);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("(encoded)");
  }();
  EXPECT_TRUE(contains(msg, "kernel 'fwd'")) << msg;
  EXPECT_TRUE(contains(msg, "bf16 base %0 dims [%1, %2, %3, 128]")) << msg;
  EXPECT_TRUE(contains(msg, "258")) << msg;
}

// A kernel's maps are encoded again only when their description changes (dsl::Kernel::runArgs keeps
// one TensorMapCache per compiled kernel): the same buffers launch after launch cost one encode
// per map; a new address, or another slot, encodes; a refused description leaves no map behind.
TEST(TensorMap, TheCacheEncodesAMapOnlyWhenItsDescriptionChanges) {
  takeEncodes();
  TensorMapCache cache;
  TensorMapDesc desc = attentionTile();
  TensorMap first = cache.get(0, desc);
  TensorMap again = cache.get(0, desc);
  EXPECT_EQ(takeEncodes().size(), 1u);
  EXPECT_TRUE(std::equal(first.bytes().begin(), first.bytes().end(), again.bytes().begin()));
  cache.get(1, desc);  // another map of the kernel
  EXPECT_EQ(takeEncodes().size(), 1u);
  desc.globalAddress += 1024;
  EXPECT_EQ(cache.get(0, desc).desc().globalAddress, desc.globalAddress);
  EXPECT_EQ(takeEncodes().size(), 1u);
  cache.get(1, attentionTile());
  EXPECT_EQ(takeEncodes().size(), 0u);
  desc.globalAddress += 8;  // not 16-byte aligned: refused before the driver
  EXPECT_THROW(cache.get(0, desc), DriverError);
  desc.globalAddress -= 8;
  cache.get(0, desc);
  EXPECT_EQ(takeEncodes().size(), 1u);  // the refused map was not kept, nor the one before it
}

}  // namespace
}  // namespace flextile::runtime
