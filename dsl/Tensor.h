// A small host-side tensor: what the attention API and captured mod tensors
// take. It is a handle (copies share the storage, like a PyTorch tensor) with
//   * an element dtype (ir::DType), a shape and strides in elements;
//   * storage in one memory space, host or device, that is either
//       owned  — a runtime::DeviceBuffer or a host byte vector, freed with the
//                last handle, or
//       a view — caller-owned memory (a device address or a host pointer), so
//                buffers of another framework pass without a copy; the caller
//                keeps that memory alive while any handle or kernel uses it.
// Host tensors are what Kernel::interpret reads, device tensors what
// Kernel::run reads; a Tensor converts to a KernelArg of the right kind.
//
//   Tensor ids = Tensor::fromHost<int32_t>(hostIds, {B, L}, MemorySpace::Device);
//   std::vector<int32_t> back = ids.toHost<int32_t>();
//   Tensor v = Tensor::deviceView(torchPtr, DType::BF16, {B, H, L, D});   // no copy
//
// Mistakes (a dtype or element count that does not match, a negative dim, a
// device copy of a strided view) throw flextile::Error naming the tensor's
// description ("i32[2, 128] host view") and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/IR.h"
#include "ir/Types.h"

namespace flextile::runtime {
class Stream;
}

namespace Eigen {
struct half;
struct bfloat16;
}  // namespace Eigen

namespace flextile::dsl {

using ir::DType;
using ir::Shape;

enum class MemorySpace { Host, Device };

// The DType of a C++ element type. i1 is stored as one byte: bool or uint8_t
// host data (use uint8_t to read i1 back, std::vector<bool> has no storage).
template <class T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::F64; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::I32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::I64; };
template <> struct DTypeOf<int8_t> { static constexpr DType value = DType::I8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::I1; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::I1; };
template <> struct DTypeOf<Eigen::half> { static constexpr DType value = DType::F16; };
template <> struct DTypeOf<Eigen::bfloat16> { static constexpr DType value = DType::BF16; };

class Tensor {
 public:
  Tensor() = default;  // empty: no storage, rank 0, numel() == 0

  // Owned storage of a contiguous (row-major) tensor: host memory is zeroed,
  // device memory is left as cuMemAlloc gives it.
  //
  // `stream` (here and in every copy below): device copies and fills are queued on it, in order
  // with the launches of a call on that stream, and a copy to the host waits for that stream only;
  // null is the legacy default stream's synchronous copy. Host tensors ignore it.
  static Tensor empty(DType dtype, Shape shape, MemorySpace space);
  static Tensor zeros(DType dtype, Shape shape, MemorySpace space, runtime::Stream* stream = nullptr);
  // Owned and filled from `data` (row-major, exactly numel(shape) elements).
  template <class T>
  static Tensor fromHost(std::span<const T> data, Shape shape, MemorySpace space = MemorySpace::Host,
                         runtime::Stream* stream = nullptr) {
    Tensor t = empty(DTypeOf<T>::value, std::move(shape), space);
    t.copyFromHost(data, stream);
    return t;
  }
  template <class T>
  static Tensor fromHost(const std::vector<T>& data, Shape shape, MemorySpace space = MemorySpace::Host,
                         runtime::Stream* stream = nullptr) {
    return fromHost(std::span<const T>(data), std::move(shape), space, stream);
  }
  // float data for a tensor of another float dtype: bf16 and f16 round to nearest even (as a
  // cast does), f32 copies. toHost<float>() and copyFromHost(float data) convert the same way on
  // bf16/f16 tensors, so filling and reading a tensor needs no Eigen types.
  static Tensor fromHost(const std::vector<float>& data, DType dtype, Shape shape,
                         MemorySpace space = MemorySpace::Host, runtime::Stream* stream = nullptr) {
    Tensor t = empty(dtype, std::move(shape), space);
    t.copyFromHost(data, stream);
    return t;
  }
  // Views over memory the caller owns. Empty `strides` means row-major.
  static Tensor hostView(void* data, DType dtype, Shape shape, std::vector<int64_t> strides = {});
  static Tensor deviceView(uint64_t address, DType dtype, Shape shape, std::vector<int64_t> strides = {});
  // A view of part of `base` (its dtype; `shape` and `strides` in elements, empty strides: row-major),
  // from element `offset` past base's first element, that shares base's storage: the memory lives
  // as long as any handle to either does, so a slice needs no copy and cannot dangle. `keepAlive`,
  // when given, is held as long as the view (a pool's lease, say). The view must lie inside base's
  // extent.
  static Tensor viewOf(const Tensor& base, int64_t offset, Shape shape, std::vector<int64_t> strides = {},
                       std::shared_ptr<const void> keepAlive = nullptr);

  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }  // in elements
  int rank() const { return int(shape_.size()); }
  int64_t size(int dim) const;  // negative counts from the end
  int64_t numel() const;
  int elementBytes() const { return ir::byteWidth(dtype_); }
  bool isContiguous() const;
  MemorySpace space() const;
  bool isHost() const { return defined() && space() == MemorySpace::Host; }
  bool isDevice() const { return defined() && space() == MemorySpace::Device; }
  bool owned() const;
  // Bytes from the first element to one past the last one the strides reach.
  size_t extentBytes() const;

  // The first element: a host pointer (host tensors) or a device address.
  void* hostData() const;
  uint64_t deviceAddress() const;

  // Row-major copies between this tensor and host memory of element type T
  // (T must be this tensor's dtype, or float for a bf16/f16 tensor, converted; the element count
  // must match). Strided
  // host tensors are gathered/scattered element by element; device tensors
  // must be contiguous.
  template <class T>
  void copyFromHost(std::span<const T> data, runtime::Stream* stream = nullptr) {
    copyFromHostBytes(DTypeOf<T>::value, data.data(), data.size(), stream);
  }
  template <class T>
  void copyFromHost(const std::vector<T>& data, runtime::Stream* stream = nullptr) {
    copyFromHost(std::span<const T>(data), stream);
  }
  template <class T>
  std::vector<T> toHost(runtime::Stream* stream = nullptr) const {
    std::vector<T> out(static_cast<size_t>(numel()));
    copyToHostBytes(DTypeOf<T>::value, out.data(), out.size(), stream);
    return out;
  }
  // Sets every byte of a contiguous tensor to `value`.
  void fillBytes(uint8_t value, runtime::Stream* stream = nullptr);

  // A contiguous owned copy in `space`.
  Tensor to(MemorySpace space) const;

  // Throws unless this tensor has `dtype` and `shape`; `what` names it
  // ("q", "document ids").
  void expect(const std::string& what, DType dtype, const Shape& shape) const;
  void expectDType(const std::string& what, DType dtype) const;

  // "i32[2, 128] host, owned" or "bf16[2, 16, 8192, 128] strides [..] device view".
  std::string describe() const;

 private:
  struct Storage;
  void copyFromHostBytes(DType type, const void* data, size_t count, runtime::Stream* stream);
  void copyToHostBytes(DType type, void* data, size_t count, runtime::Stream* stream) const;
  static Tensor make(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides);

  std::shared_ptr<Storage> storage_;
  DType dtype_ = DType::F32;
  Shape shape_;
  std::vector<int64_t> strides_;
};

// True when a CUDA driver and device are present (Kernel::run and device
// tensors work); otherwise false with a one-line reason in *whyNot.
bool deviceAvailable(std::string* whyNot = nullptr);

// Row-major strides of `shape`, in elements.
std::vector<int64_t> contiguousStrides(const Shape& shape);

}  // namespace flextile::dsl
