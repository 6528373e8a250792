// Shapes past the kernels' 32-bit offsets are refused before anything is allocated or launched,
// with an error naming the tensor, the shape and the limit. The kernels offset by batch and head
// in 64 bits; within one head (row * row stride + d), the (batch, head) numbering (b * Hq + h)
// and the BlockMask lists they stay 32-bit, which is what these checks guard. The inputs are
// views over a few bytes (zero strides, or a device address no one reads), so nothing of their
// nominal size exists.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attention_templates/FlexAttention.h"
#include "attention_templates/FlexAttentionCommon.h"
#include "tests/ThrownMessage.h"

namespace flextile {
namespace {

using namespace flextile::attention;
using dsl::DType;
using dsl::Tensor;

std::string errorOf(const std::function<void()>& f) { return testing::thrownMessage(f); }

constexpr uint64_t kNowhere = 0x7f0000000000;  // never dereferenced: the checks come first

TEST(Limits, OneHeadSpanningMoreThan2To31ElementsIsRefusedBeforeLaunch) {
  // 2^24 + 1 rows of D = 128: the last row starts 2^31 elements after the first.
  const int64_t L = (int64_t(1) << 24) + 1, D = 128;
  // Zero batch and head strides (broadcast), so that the row span alone passes the limit.
  Tensor q = Tensor::deviceView(kNowhere, DType::BF16, {1, 1, L, D}, {0, 0, D, 1});
  Tensor small = Tensor::deviceView(kNowhere, DType::BF16, {1, 1, 64, D});
  // flex_attention checks before it allocates its outputs or asks the GPU anything, so this runs
  // without one; plan_flex_attention runs the same checks.
  for (auto run : {std::function<void()>([&] { flex_attention(q, small, small, noop_score(), std::nullopt); }),
                   std::function<void()>([&] { flex_attention(small, q, q, noop_score(), std::nullopt); }),
                   std::function<void()>([&] {
                     plan_flex_attention(q, small, small, noop_score(), std::nullopt, {}, true, codegen::Target::sm90a());
                   }),
                   std::function<void()>([&] {
                     plan_flex_attention(small, q, q, noop_score(), std::nullopt, {}, true, codegen::Target::sm80());
                   })}) {
    const std::string e = errorOf(run);
    EXPECT_NE(e.find("one head's rows span 2147483776 elements"), std::string::npos) << e;
    EXPECT_NE(e.find("2^31 - 1"), std::string::npos) << e;
    EXPECT_NE(e.find("[1, 1, 16777217, 128]"), std::string::npos) << "names the shape: " << e;
  }
  // One row fewer fits.
  Tensor fits = Tensor::deviceView(kNowhere, DType::BF16, {1, 1, L - 1, D}, {0, 0, D, 1});
  EXPECT_EQ(errorOf([&] { detail::expectAttentionInput("flex_attention", "q", fits); }), "");
}

TEST(Limits, APaddedRowStrideCountsTowardTheHeadSpan) {
  // 2^20 rows of 64 elements stored 4096 apart: 2^32 elements from first row to last.
  Tensor q = Tensor::deviceView(kNowhere, DType::F16, {2, 4, int64_t(1) << 20, 64},
                                {int64_t(1) << 30, int64_t(1) << 28, 4096, 1});
  const std::string e = errorOf([&] { detail::expectAttentionInput("flex_attention", "q", q); });
  EXPECT_NE(e.find("one head's rows span"), std::string::npos) << e;
}

TEST(Limits, BatchTimesHeadsPast2To31IsRefused) {
  // 2^16 x 2^16 (batch, head) pairs over one 64 x 32 block of memory (zero strides).
  std::vector<uint16_t> data(64 * 32);
  const int64_t B = int64_t(1) << 16, H = int64_t(1) << 16;
  Tensor q = Tensor::hostView(data.data(), DType::BF16, {B, H, 64, 32}, {0, 0, 32, 1});
  // flex_attention would allocate an output of 2^32 * 64 * 32 elements (512 GiB) before this check
  // existed; it is refused first.
  for (auto run : {std::function<void()>([&] { flex_attention(q, q, q, noop_score(), std::nullopt); }),
                   std::function<void()>([&] {
                     plan_flex_attention(q, q, q, noop_score(), std::nullopt, {}, true, codegen::Target::sm80());
                   })}) {
    const std::string e = errorOf(run);
    EXPECT_NE(e.find("B * Hq = 65536 * 65536"), std::string::npos) << e;
    EXPECT_NE(e.find("2^31 - 1"), std::string::npos) << e;
  }
}

TEST(Limits, StridesPastInt32AreRefused) {
  Tensor q = Tensor::deviceView(kNowhere, DType::BF16, {2, 1, 64, 64}, {int64_t(1) << 31, 4096, 64, 1});
  const std::string e = errorOf([&] { flex_attention(q, q, q, noop_score(), std::nullopt); });
  EXPECT_NE(e.find("strides exceed int32"), std::string::npos) << e;
}

TEST(Limits, AnOutputTheKernelsCannotAddressIsRefused) {
  std::vector<uint16_t> in(2 * 64 * 32), outData(2 * 2 * 64 * 32);
  Tensor q = Tensor::hostView(in.data(), DType::BF16, {1, 2, 64, 32});
  // Every other element: the kernels write D contiguous elements per row.
  Tensor out = Tensor::hostView(outData.data(), DType::BF16, {1, 2, 64, 32}, {2 * 2 * 64 * 32, 2 * 64 * 32, 64, 2});
  const std::string e = errorOf([&] { flex_attention_into(q, q, q, noop_score(), std::nullopt, out, nullptr); });
  EXPECT_NE(e.find("the last dim of out must be contiguous"), std::string::npos) << e;
}

TEST(Limits, BlockMaskListsPast2To31EntriesAreRefusedBeforeAllocating) {
  // 2^8 x 2^8 (batch, head) pairs of 2^10 x 2^10 blocks: 2^36 list entries (256 GB) never allocated.
  const std::string e = errorOf([] { causalBlockMask(256, 256, 1 << 17, 1 << 17, {128, 128}, dsl::MemorySpace::Host); });
  EXPECT_NE(e.find("blocks is too many"), std::string::npos) << e;
}

TEST(Limits, TensorsPastA64BitByteOffsetAreRefused) {
  std::vector<float> data(4);
  const int64_t huge = int64_t(1) << 40;
  const std::string e = errorOf([&] { Tensor::hostView(data.data(), DType::F32, {huge, huge}, {huge, 1}); });
  EXPECT_NE(e.find("more elements than a 64-bit byte offset can address"), std::string::npos) << e;
  EXPECT_NE(e.find("[1099511627776, 1099511627776]"), std::string::npos) << e;
}

}  // namespace
}  // namespace flextile
