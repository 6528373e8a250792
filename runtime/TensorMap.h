// TMA tensor maps: the 128-byte descriptor a Hopper kernel's cp.async.bulk.tensor reads to copy a
// tile (a "box") of a global tensor into shared memory. The host builds it once per tensor and
// tile shape with the driver's cuTensorMapEncodeTiled, and passes its bytes to the kernel as a
// `const __grid_constant__` parameter (in PTX a `.param .align 64 .b8 name[128]`).
//
// Dimensions are listed innermost first, as the driver wants them: a row-major [rows, cols]
// matrix has globalDims {cols, rows} and globalStrides {cols * elementBytes}. The map describes
// the tensor's full extent; boxes that reach past it read zeros (OOB fill none) and their
// out-of-range writes are dropped, so tiles need not divide the tensor.
//
// Every rule cuTensorMapEncodeTiled documents for these arguments is checked here first (see
// validateTensorMap), so a bad argument is a DriverError naming it and its value instead of the
// driver's bare CUDA_ERROR_INVALID_VALUE. Only what FlexTile uses is offered: tiled maps (no
// im2col), no interleave, zero fill.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <mutex>
#include <optional>
#include <vector>

namespace flextile::runtime {

// The element types (the driver's CUtensorMapDataType of the same name).
enum class TensorMapDType { U8, U16, U32, I32, U64, I64, F16, F32, F64, BF16 };
int tensorMapElementBytes(TensorMapDType type);
const char* tensorMapDTypeName(TensorMapDType type);  // "bf16", "u8", ...

// How the box lands in shared memory: 16-byte chunks of each box row permuted within a span of
// 32, 64 or 128 bytes, to match a swizzled shared layout (ir/SharedLayout.h) without bank conflicts.
enum class TensorMapSwizzle { None, Bytes32, Bytes64, Bytes128 };
int tensorMapSwizzleBytes(TensorMapSwizzle swizzle);  // 0, 32, 64, 128

// How far the L2 cache promotes each of the copy's requests.
enum class TensorMapL2Promotion { None, Bytes64, Bytes128, Bytes256 };

// What a tensor map describes. rank = globalDims.size().
struct TensorMapDesc {
  uint64_t globalAddress = 0;  // device address of element [0, ..., 0] (DeviceBuffer::address())
  TensorMapDType dtype = TensorMapDType::BF16;
  std::vector<uint64_t> globalDims;      // rank entries, innermost first
  std::vector<uint64_t> globalStrides;   // rank - 1 entries: bytes between steps of dims 1 .. rank-1
  std::vector<uint32_t> boxDims;         // rank entries: the tile one copy moves
  std::vector<uint32_t> elementStrides;  // rank entries, or empty for all 1 (every element)
  TensorMapSwizzle swizzle = TensorMapSwizzle::None;
  TensorMapL2Promotion l2Promotion = TensorMapL2Promotion::None;
  bool operator==(const TensorMapDesc&) const = default;
};

// Throws DriverError naming the first argument of `desc` that breaks a documented rule of
// cuTensorMapEncodeTiled, with its value. Needs no driver. The rules (CUDA Driver API, "Tensor Map
// Object Management"), for interleave none:
//   rank 1..5; globalAddress non-null and 16-byte aligned; each globalDim 1..2^32; each
//   globalStride a multiple of 16 and below 2^40; each boxDim 1..256, and boxDims[0] times the
//   element size a multiple of 16 bytes; each elementStride 1..8; with a swizzle, boxDims[0]
//   times the element size at most the swizzle's span (32, 64 or 128 bytes).
void validateTensorMap(const TensorMapDesc& desc);

// One encoded map: a value (copyable), its bytes 64-byte aligned as the driver requires.
class TensorMap {
 public:
  static constexpr size_t kBytes = 128;

  // Validates `desc` (validateTensorMap), then encodes it with cuTensorMapEncodeTiled. Throws
  // DriverError for a bad argument, without a driver, when the driver is older than CUDA 12.0
  // (it has no cuTensorMapEncodeTiled), or when the driver refuses the map (its error name and
  // the map described).
  explicit TensorMap(TensorMapDesc desc);

  const TensorMapDesc& desc() const { return desc_; }
  // The descriptor, to pass by pointer as a kernel argument (cuLaunchKernel copies the bytes).
  const void* data() const { return words_; }
  std::span<const std::byte, kBytes> bytes() const {
    return std::span<const std::byte, kBytes>(reinterpret_cast<const std::byte*>(words_), kBytes);
  }

 private:
  TensorMapDesc desc_;
  alignas(64) uint64_t words_[kBytes / 8] = {};
};

// The maps one kernel passes, one slot per map: each encoded again only when its description
// changes, so that a loop launching over the same buffers encodes once (cuTensorMapEncodeTiled is
// host work on every launch otherwise). Thread-safe; a map is returned by value (128 bytes).
class TensorMapCache {
 public:
  TensorMap get(size_t slot, const TensorMapDesc& desc);

 private:
  std::mutex mutex_;
  std::vector<std::optional<TensorMap>> last_;
};

// "bf16 dims [128, 6000] strides [256] box [64, 128] swizzle 128B at 0x7f0000000000": for messages.
std::string describeTensorMap(const TensorMapDesc& desc);

}  // namespace flextile::runtime
