// TMA tensor maps on a real driver: cuTensorMapEncodeTiled accepts the maps FlexTile's attention
// kernels will use: a bf16 [B*H*S, D] tensor (D = 64 and 128) in boxes of 64 or 128 rows by 64
// columns, swizzled 128B as the shared layouts are, and a rank-3 [B*H, S, D] view. No kernel reads
// the maps yet (issue 13): this proves the descriptor side against the driver.
#include "GpuTest.h"

#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/TensorMap.h"

#include <algorithm>
#include <cstddef>

namespace flextile::runtime {
namespace {

TEST(TensorMapGpu, TheDriverEncodesAttentionTileMaps) {
  FLEXTILE_REQUIRE_GPU();
  Device& device = Device::current();
  const uint64_t batch = 2, heads = 3, seq = 1000;  // 6000 rows: no multiple of any box
  for (uint64_t d : {64u, 128u}) {
    SCOPED_TRACE("D = " + std::to_string(d));
    DeviceBuffer tensor(size_t(batch * heads * seq * d * 2), &device);
    for (uint32_t rows : {64u, 128u}) {
      TensorMapDesc desc;
      desc.globalAddress = tensor.address();
      desc.dtype = TensorMapDType::BF16;
      desc.globalDims = {d, batch * heads * seq};
      desc.globalStrides = {d * 2};
      // A 128-byte swizzle holds 64 bf16 per row: D = 128 is two boxes side by side.
      desc.boxDims = {64, rows};
      desc.swizzle = TensorMapSwizzle::Bytes128;
      desc.l2Promotion = TensorMapL2Promotion::Bytes128;
      TensorMap map(desc);
      auto bytes = map.bytes();
      EXPECT_TRUE(std::any_of(bytes.begin(), bytes.end(), [](std::byte b) { return b != std::byte{0}; }))
          << "the driver wrote an all-zero map for " << describeTensorMap(desc);
    }
  }
}

TEST(TensorMapGpu, UnswizzledAndRank3MapsEncode) {
  FLEXTILE_REQUIRE_GPU();
  DeviceBuffer tensor(size_t(2 * 3 * 1000 * 64 * 2), &Device::current());
  // The same tensor as [B*H, S, D]: a box of one head's 128 rows.
  TensorMapDesc desc;
  desc.globalAddress = tensor.address();
  desc.dtype = TensorMapDType::BF16;
  desc.globalDims = {64, 1000, 6};
  desc.globalStrides = {128, 128 * 1000};
  desc.boxDims = {64, 128, 1};
  EXPECT_NO_THROW(TensorMap{desc}) << describeTensorMap(desc);
}

}  // namespace
}  // namespace flextile::runtime
