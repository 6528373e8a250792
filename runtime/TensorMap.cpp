#include "runtime/TensorMap.h"

#include "runtime/Driver.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"

#include <cstdio>
#include <cstring>

namespace flextile::runtime {

namespace {

// The public enums list the driver's values in the driver's order.
static_assert(int(TensorMapDType::U8) == cu::kTensorMapUInt8 && int(TensorMapDType::U16) == cu::kTensorMapUInt16 &&
              int(TensorMapDType::U32) == cu::kTensorMapUInt32 && int(TensorMapDType::I32) == cu::kTensorMapInt32 &&
              int(TensorMapDType::U64) == cu::kTensorMapUInt64 && int(TensorMapDType::I64) == cu::kTensorMapInt64 &&
              int(TensorMapDType::F16) == cu::kTensorMapFloat16 && int(TensorMapDType::F32) == cu::kTensorMapFloat32 &&
              int(TensorMapDType::F64) == cu::kTensorMapFloat64 && int(TensorMapDType::BF16) == cu::kTensorMapBFloat16);
static_assert(int(TensorMapSwizzle::None) == cu::kSwizzleNone && int(TensorMapSwizzle::Bytes32) == cu::kSwizzle32B &&
              int(TensorMapSwizzle::Bytes64) == cu::kSwizzle64B && int(TensorMapSwizzle::Bytes128) == cu::kSwizzle128B);
static_assert(int(TensorMapL2Promotion::None) == cu::kL2PromotionNone &&
              int(TensorMapL2Promotion::Bytes64) == cu::kL2Promotion64B &&
              int(TensorMapL2Promotion::Bytes128) == cu::kL2Promotion128B &&
              int(TensorMapL2Promotion::Bytes256) == cu::kL2Promotion256B);

constexpr size_t kMaxRank = 5;
constexpr uint64_t kMaxGlobalDim = uint64_t(1) << 32;
constexpr uint64_t kStrideLimit = uint64_t(1) << 40;  // strides are below it
constexpr uint32_t kMaxBoxDim = 256;
constexpr uint32_t kMaxElementStride = 8;

[[noreturn]] void refuse(const TensorMapDesc& desc, const std::string& what) {
  throw DriverError("tensor map (" + describeTensorMap(desc) + "): " + what);
}

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

template <class T>
std::string list(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string at(const char* array, size_t i) { return std::string(array) + "[" + std::to_string(i) + "]"; }

}  // namespace

int tensorMapElementBytes(TensorMapDType type) {
  switch (type) {
    case TensorMapDType::U8: return 1;
    case TensorMapDType::U16:
    case TensorMapDType::F16:
    case TensorMapDType::BF16: return 2;
    case TensorMapDType::U32:
    case TensorMapDType::I32:
    case TensorMapDType::F32: return 4;
    case TensorMapDType::U64:
    case TensorMapDType::I64:
    case TensorMapDType::F64: return 8;
  }
  return 0;
}

const char* tensorMapDTypeName(TensorMapDType type) {
  switch (type) {
    case TensorMapDType::U8: return "u8";
    case TensorMapDType::U16: return "u16";
    case TensorMapDType::U32: return "u32";
    case TensorMapDType::I32: return "i32";
    case TensorMapDType::U64: return "u64";
    case TensorMapDType::I64: return "i64";
    case TensorMapDType::F16: return "f16";
    case TensorMapDType::F32: return "f32";
    case TensorMapDType::F64: return "f64";
    case TensorMapDType::BF16: return "bf16";
  }
  return "unknown dtype";
}

int tensorMapSwizzleBytes(TensorMapSwizzle swizzle) {
  switch (swizzle) {
    case TensorMapSwizzle::None: return 0;
    case TensorMapSwizzle::Bytes32: return 32;
    case TensorMapSwizzle::Bytes64: return 64;
    case TensorMapSwizzle::Bytes128: return 128;
  }
  return -1;
}

std::string describeTensorMap(const TensorMapDesc& desc) {
  std::string out = std::string(tensorMapDTypeName(desc.dtype)) + " dims " + list(desc.globalDims) + " strides " +
                    list(desc.globalStrides) + " box " + list(desc.boxDims);
  if (!desc.elementStrides.empty()) out += " element strides " + list(desc.elementStrides);
  if (desc.swizzle != TensorMapSwizzle::None) out += " swizzle " + std::to_string(tensorMapSwizzleBytes(desc.swizzle)) + "B";
  return out + " at " + hex(desc.globalAddress);
}

void validateTensorMap(const TensorMapDesc& desc) {
  const int elementBytes = tensorMapElementBytes(desc.dtype);
  if (elementBytes == 0) refuse(desc, "dtype " + std::to_string(int(desc.dtype)) + " is not a CUtensorMapDataType FlexTile knows");
  const size_t rank = desc.globalDims.size();
  if (rank < 1 || rank > kMaxRank)
    refuse(desc, "rank " + std::to_string(rank) + " (the number of globalDims) is outside 1.." + std::to_string(kMaxRank));
  if (desc.globalStrides.size() != rank - 1)
    refuse(desc, "globalStrides has " + std::to_string(desc.globalStrides.size()) + " entries; rank " +
                     std::to_string(rank) + " needs " + std::to_string(rank - 1) +
                     " (the innermost dimension's stride is the element size)");
  if (desc.boxDims.size() != rank)
    refuse(desc, "boxDims has " + std::to_string(desc.boxDims.size()) + " entries; rank " + std::to_string(rank) +
                     " needs " + std::to_string(rank));
  if (!desc.elementStrides.empty() && desc.elementStrides.size() != rank)
    refuse(desc, "elementStrides has " + std::to_string(desc.elementStrides.size()) + " entries; rank " +
                     std::to_string(rank) + " needs " + std::to_string(rank) + " (or none, for all 1)");
  if (desc.globalAddress == 0) refuse(desc, "globalAddress is null");
  if (desc.globalAddress % 16 != 0) refuse(desc, "globalAddress " + hex(desc.globalAddress) + " is not 16-byte aligned");
  for (size_t i = 0; i < rank; ++i)
    if (desc.globalDims[i] < 1 || desc.globalDims[i] > kMaxGlobalDim)
      refuse(desc, at("globalDims", i) + " = " + std::to_string(desc.globalDims[i]) + " is outside 1..2^32");
  for (size_t i = 0; i + 1 < rank; ++i) {
    const uint64_t stride = desc.globalStrides[i];
    if (stride % 16 != 0)
      refuse(desc, at("globalStrides", i) + " = " + std::to_string(stride) + " bytes is not a multiple of 16");
    if (stride >= kStrideLimit)
      refuse(desc, at("globalStrides", i) + " = " + std::to_string(stride) + " bytes is not below 2^40");
  }
  for (size_t i = 0; i < rank; ++i)
    if (desc.boxDims[i] < 1 || desc.boxDims[i] > kMaxBoxDim)
      refuse(desc, at("boxDims", i) + " = " + std::to_string(desc.boxDims[i]) + " is outside 1.." + std::to_string(kMaxBoxDim));
  const uint64_t innerBoxBytes = uint64_t(desc.boxDims[0]) * uint64_t(elementBytes);
  const std::string inner = "boxDims[0] = " + std::to_string(desc.boxDims[0]) + " " + tensorMapDTypeName(desc.dtype) +
                            " elements = " + std::to_string(innerBoxBytes) + " bytes";
  if (innerBoxBytes % 16 != 0) refuse(desc, inner + ", not a multiple of 16 bytes");
  for (size_t i = 0; i < desc.elementStrides.size(); ++i)
    if (desc.elementStrides[i] < 1 || desc.elementStrides[i] > kMaxElementStride)
      refuse(desc, at("elementStrides", i) + " = " + std::to_string(desc.elementStrides[i]) + " is outside 1.." +
                       std::to_string(kMaxElementStride));
  const int span = tensorMapSwizzleBytes(desc.swizzle);
  if (span < 0) refuse(desc, "swizzle " + std::to_string(int(desc.swizzle)) + " is not a CUtensorMapSwizzle FlexTile knows");
  if (span > 0 && innerBoxBytes > uint64_t(span))
    refuse(desc, inner + ", more than the " + std::to_string(span) + "-byte span of the swizzle");
  const int l2 = int(desc.l2Promotion);
  if (l2 < cu::kL2PromotionNone || l2 > cu::kL2Promotion256B)
    refuse(desc, "l2Promotion " + std::to_string(l2) + " is not a CUtensorMapL2promotion FlexTile knows");
}

TensorMap::TensorMap(TensorMapDesc desc) : desc_(std::move(desc)) {
  validateTensorMap(desc_);
  const Driver& driver = Driver::get();
  const cu::Api& api = driver.api();
  if (!api.tensorMapEncodeTiled)
    throw DriverError("cuTensorMapEncodeTiled is missing from the CUDA driver " + driver.libraryPath() + " (version " +
                      driver.versionString() + "): TMA tensor maps need the driver of CUDA 12.0 or newer");
  std::vector<uint32_t> elementStrides = desc_.elementStrides;
  if (elementStrides.empty()) elementStrides.assign(desc_.globalDims.size(), 1);
  cu::TensorMapWords encoded{};
  cu::Result result = api.tensorMapEncodeTiled(
      &encoded, int(desc_.dtype), uint32_t(desc_.globalDims.size()),
      reinterpret_cast<void*>(static_cast<uintptr_t>(desc_.globalAddress)), desc_.globalDims.data(),
      desc_.globalStrides.data(), desc_.boxDims.data(), elementStrides.data(), cu::kTensorMapInterleaveNone,
      int(desc_.swizzle), int(desc_.l2Promotion), cu::kTensorMapOobFillNone);
  cu::checkLazy(result, "cuTensorMapEncodeTiled", [&] { return "encoding the tensor map " + describeTensorMap(desc_); });
  static_assert(sizeof encoded == sizeof words_);
  std::memcpy(words_, encoded.words, sizeof words_);
}

TensorMap TensorMapCache::get(size_t slot, const TensorMapDesc& desc) {
  std::lock_guard lock(mutex_);
  if (last_.size() <= slot) last_.resize(slot + 1);
  if (!last_[slot] || !(last_[slot]->desc() == desc)) last_[slot].emplace(desc);
  return *last_[slot];
}

}  // namespace flextile::runtime
