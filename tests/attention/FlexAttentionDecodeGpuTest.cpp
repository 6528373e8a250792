// The decode template on the GPU against the float64 reference and the prefill template: every
// variant at the issue's shapes (L 1, 2, 5, 16; GQA 1:1, 4:1, 8:1, MQA; KV lengths 1, 127, 128,
// 129, 4097 with the default 128-blocks), one split and many, and a serving-like sequence of steps.
#include <gtest/gtest.h>

#include "FlexAttentionDecodeCheck.h"
#include "MaskTestUtil.h"
#include "gpu/GpuTest.h"

#include <chrono>
#include <cstdio>

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;

namespace {
constexpr MemorySpace kDevice = MemorySpace::Device;
const DecodeCheck kDefaultBlocks{.splits = {0, 1, 5}, .blocks = {128, 128}, .prefillConfig = {64, 64, 4, 2}};
}  // namespace

TEST(FlexDecodeGpu, EveryVariantAtTheIssueShapes) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  const std::vector<AttentionCase> cases = {
      {.B = 1, .Hq = 2, .Hkv = 2, .L = 1, .S = 1, .D = 128, .dtype = DType::BF16},
      {.B = 2, .Hq = 8, .Hkv = 2, .L = 2, .S = 127, .D = 64, .dtype = DType::F16},
      {.B = 1, .Hq = 8, .Hkv = 1, .L = 5, .S = 128, .D = 128, .dtype = DType::BF16},
      {.B = 2, .Hq = 4, .Hkv = 4, .L = 16, .S = 129, .D = 64, .dtype = DType::BF16},
      {.B = 2, .Hq = 16, .Hkv = 2, .L = 1, .S = 4097, .D = 128, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 1, .L = 16, .S = 4097, .D = 64, .dtype = DType::F16},
      {.B = 1, .Hq = 4, .Hkv = 2, .L = 3, .S = 300, .D = 256, .dtype = DType::BF16},
      {.B = 1, .Hq = 4, .Hkv = 4, .L = 2, .S = 300, .D = 64, .dtype = DType::F32},
  };
  for (const AttentionCase& c : cases)
    for (const Variant& v : variants()) {
      const auto start = std::chrono::steady_clock::now();
      const bool ok = checkDecodeVariant(rng, v, c, kDevice, kDefaultBlocks);
      // Progress, so a slow or stuck case shows in the log.
      std::printf("  %-16s %s: %.2f s\n", v.name.c_str(), c.describe().c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      std::fflush(stdout);
      if (!ok) return;
    }
}

TEST(FlexDecodeGpu, ManySplitsOverALongCache) {
  FLEXTILE_REQUIRE_GPU();
  SeededRandom rng;
  AttentionCase c{.B = 2, .Hq = 32, .Hkv = 8, .L = 1, .S = 20000, .D = 128, .dtype = DType::BF16};
  for (const char* name : {"full", "sliding_window", "document"})
    if (!checkDecodeVariant(rng, variant(name), c, kDevice, {.splits = {0, 64, 128}, .blocks = {128, 128},
                                                                 .prefillConfig = {64, 64, 4, 2}}))
      return;
}
