#include "dsl/Tensor.h"

#include <algorithm>
#include <Eigen/Core>
#include <cstring>
#include <vector>

#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/Driver.h"

namespace flextile::dsl {

struct Tensor::Storage {
  MemorySpace space = MemorySpace::Host;
  bool owned = false;
  std::vector<std::byte> hostBytes;  // owned host memory
  runtime::DeviceBuffer deviceBuffer;  // owned device memory
  void* host = nullptr;                // first byte (owned or viewed)
  uint64_t device = 0;
  // What a view made by viewOf keeps alive: the storage it points into, and the caller's object.
  std::shared_ptr<const Storage> base;
  std::shared_ptr<const void> keepAlive;
};

bool deviceAvailable(std::string* whyNot) { return runtime::Driver::available(whyNot); }

std::vector<int64_t> contiguousStrides(const Shape& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

namespace {
void checkShape(const Shape& shape, const std::vector<int64_t>& strides) {
  for (auto d : shape)
    if (d < 0) throw Error("tensor: negative dimension in shape " + ir::shapeString(shape));
  if (strides.size() != shape.size())
    throw Error("tensor: shape " + ir::shapeString(shape) + " has rank " + std::to_string(shape.size()) + " but " +
                std::to_string(strides.size()) + " strides were given " + ir::shapeString(strides));
  for (auto s : strides)
    if (s < 0) throw Error("tensor: negative strides are not supported, got " + ir::shapeString(strides), ErrorKind::Unsupported);
  // Element counts, extents and byte sizes are int64 everywhere (numel, extentBytes, copies): a
  // shape past that range is refused here rather than wrapping later.
  int64_t count = 1, last = 0;
  bool overflow = false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    int64_t span = 0;
    overflow |= __builtin_mul_overflow(count, shape[d], &count);
    overflow |= __builtin_mul_overflow(shape[d] - 1, strides[d], &span);
    overflow |= __builtin_add_overflow(last, span, &last);
  }
  int64_t bytes = 0;
  overflow |= __builtin_mul_overflow(std::max(count, last + 1), int64_t(16), &bytes);
  if (overflow)
    throw Error("tensor: shape " + ir::shapeString(shape) + " with strides " + ir::shapeString(strides) +
                " holds or spans more elements than a 64-bit byte offset can address");
}

// Calls f(elementOffset) for every element in row-major order.
template <class F>
void forEachOffset(const Shape& shape, const std::vector<int64_t>& strides, F&& f) {
  int64_t n = ir::numElements(shape);
  if (n == 0) return;
  std::vector<int64_t> index(shape.size(), 0);
  int64_t offset = 0;
  for (int64_t e = 0; e < n; ++e) {
    f(offset);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) {
        offset += strides[d];
        break;
      }
      offset -= strides[d] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}
}  // namespace

Tensor Tensor::make(std::shared_ptr<Storage> storage, DType dtype, Shape shape, std::vector<int64_t> strides) {
  if (dtype == DType::Ptr) throw Error("tensor: a tensor of pointers is not supported", ErrorKind::Unsupported);
  if (strides.empty() && !shape.empty()) strides = contiguousStrides(shape);
  checkShape(shape, strides);
  Tensor t;
  t.storage_ = std::move(storage);
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  return t;
}

Tensor Tensor::empty(DType dtype, Shape shape, MemorySpace space) {
  auto s = std::make_shared<Storage>();
  s->space = space;
  s->owned = true;
  Tensor t = make(s, dtype, std::move(shape), {});
  size_t bytes = size_t(t.numel()) * size_t(t.elementBytes());
  if (space == MemorySpace::Host) {
    s->hostBytes.assign(bytes, std::byte{0});
    s->host = s->hostBytes.data();
  } else {
    s->deviceBuffer = runtime::DeviceBuffer(bytes);
    s->device = s->deviceBuffer.address();
  }
  return t;
}

Tensor Tensor::zeros(DType dtype, Shape shape, MemorySpace space, runtime::Stream* stream) {
  Tensor t = empty(dtype, std::move(shape), space);
  if (space == MemorySpace::Device) t.storage_->deviceBuffer.fillBytes(0, stream);
  return t;
}

void Tensor::fillBytes(uint8_t value, runtime::Stream* stream) {
  if (!defined()) throw Error("tensor: fill of an empty Tensor");
  if (!isContiguous()) throw Error("tensor: fillBytes needs a contiguous tensor, got " + describe());
  const size_t bytes = size_t(numel()) * size_t(elementBytes());
  if (isDevice()) runtime::fillDeviceBytes(deviceAddress(), value, bytes, describe(), stream);
  else if (bytes) std::memset(hostData(), value, bytes);
}

Tensor Tensor::hostView(void* data, DType dtype, Shape shape, std::vector<int64_t> strides) {
  auto s = std::make_shared<Storage>();
  s->space = MemorySpace::Host;
  s->host = data;
  Tensor t = make(s, dtype, std::move(shape), std::move(strides));
  if (!data && t.numel() > 0) throw Error("tensor: host view of " + t.describe() + " over a null pointer");
  if (data && reinterpret_cast<uintptr_t>(data) % uintptr_t(t.elementBytes()) != 0)
    throw Error("tensor: host view of " + t.describe() + " is not aligned to its element size");
  return t;
}

Tensor Tensor::deviceView(uint64_t address, DType dtype, Shape shape, std::vector<int64_t> strides) {
  auto s = std::make_shared<Storage>();
  s->space = MemorySpace::Device;
  s->device = address;
  Tensor t = make(s, dtype, std::move(shape), std::move(strides));
  if (!address && t.numel() > 0) throw Error("tensor: device view of " + t.describe() + " at address 0");
  if (address % uint64_t(t.elementBytes()) != 0)
    throw Error("tensor: device view of " + t.describe() + " is not aligned to its element size");
  return t;
}

Tensor Tensor::viewOf(const Tensor& base, int64_t offset, Shape shape, std::vector<int64_t> strides,
                      std::shared_ptr<const void> keepAlive) {
  if (!base.defined()) throw Error("tensor: a view of an empty Tensor");
  auto s = std::make_shared<Storage>();
  s->space = base.storage_->space;
  s->base = base.storage_;
  s->keepAlive = std::move(keepAlive);
  Tensor t = make(s, base.dtype_, std::move(shape), std::move(strides));
  const size_t begin = size_t(offset) * size_t(t.elementBytes());
  if (offset < 0 || (t.numel() > 0 && begin + t.extentBytes() > base.extentBytes()))
    throw Error("tensor: a view of " + t.describe() + " from element " + std::to_string(offset) +
                " reaches past " + base.describe() + " (" + std::to_string(base.extentBytes()) + " bytes)");
  if (s->space == MemorySpace::Host) s->host = static_cast<std::byte*>(base.storage_->host) + begin;
  else s->device = base.storage_->device + begin;
  return t;
}

int64_t Tensor::size(int dim) const {
  int d = dim < 0 ? dim + rank() : dim;
  if (d < 0 || d >= rank())
    throw Error("tensor: dimension " + std::to_string(dim) + " is out of range for " + describe());
  return shape_[size_t(d)];
}

int64_t Tensor::numel() const { return defined() ? ir::numElements(shape_) : 0; }

bool Tensor::isContiguous() const {
  // Asked on every launch (the templates' output checks): compared in place, not against a new
  // vector of contiguous strides.
  int64_t expected = 1;
  for (size_t i = shape_.size(); i-- > 0;) {
    if (strides_[i] != expected) return numel() <= 1;
    expected *= shape_[i];
  }
  return true;
}

MemorySpace Tensor::space() const {
  if (!storage_) throw Error("tensor: use of an empty Tensor");
  return storage_->space;
}

bool Tensor::owned() const { return storage_ && storage_->owned; }

size_t Tensor::extentBytes() const {
  // Every launch asks it of each tensor argument: one pass, no numel().
  if (!defined()) return 0;
  int64_t last = 0;
  for (size_t d = 0; d < shape_.size(); ++d) {
    if (shape_[d] == 0) return 0;
    last += (shape_[d] - 1) * strides_[d];
  }
  return size_t(last + 1) * size_t(elementBytes());
}

void* Tensor::hostData() const {
  if (!isHost()) throw Error("tensor: " + describe() + " is not in host memory");
  return storage_->host;
}

uint64_t Tensor::deviceAddress() const {
  if (!isDevice()) throw Error("tensor: " + describe() + " is not in device memory");
  return storage_->device;
}

void Tensor::expectDType(const std::string& what, DType dtype) const {
  if (!defined()) throw Error(what + ": expected a " + std::string(ir::dtypeName(dtype)) + " tensor, got an empty Tensor");
  if (dtype_ != dtype)
    throw Error(what + ": expected dtype " + std::string(ir::dtypeName(dtype)) + ", got " + describe());
}

void Tensor::expect(const std::string& what, DType dtype, const Shape& shape) const {
  expectDType(what, dtype);
  if (shape_ != shape)
    throw Error(what + ": expected shape " + ir::shapeString(shape) + ", got " + describe());
}

std::string Tensor::describe() const {
  if (!defined()) return "an empty Tensor";
  std::string s = std::string(ir::dtypeName(dtype_)) + ir::shapeString(shape_);
  if (!isContiguous()) s += " strides " + ir::shapeString(strides_);
  s += storage_->space == MemorySpace::Host ? " host" : " device";
  s += storage_->owned ? ", owned" : " view";
  return s;
}

namespace {
// float host data for a 16-bit float tensor: rounded to nearest even, as a cast in a kernel does.
template <class Half>
std::vector<Half> narrow(const void* data, size_t count) {
  const float* f = static_cast<const float*>(data);
  std::vector<Half> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = Half(f[i]);
  return out;
}
bool isHalf(DType t) { return t == DType::BF16 || t == DType::F16; }
}  // namespace

void Tensor::copyFromHostBytes(DType type, const void* data, size_t count, runtime::Stream* stream) {
  if (!defined()) throw Error("tensor: copy into an empty Tensor");
  if (type == DType::F32 && isHalf(dtype_)) {
    if (int64_t(count) != numel())
      throw Error("tensor: cannot copy " + std::to_string(count) + " elements into " + describe() + " (" +
                  std::to_string(numel()) + " elements)");
    if (dtype_ == DType::BF16) copyFromHostBytes(dtype_, narrow<Eigen::bfloat16>(data, count).data(), count, stream);
    else copyFromHostBytes(dtype_, narrow<Eigen::half>(data, count).data(), count, stream);
    return;
  }
  if (type != dtype_)
    throw Error("tensor: cannot copy " + std::string(ir::dtypeName(type)) + " host data into " + describe());
  if (int64_t(count) != numel())
    throw Error("tensor: cannot copy " + std::to_string(count) + " elements into " + describe() + " (" +
                std::to_string(numel()) + " elements)");
  const size_t eb = size_t(elementBytes());
  if (isDevice()) {
    if (!isContiguous()) throw Error("tensor: copying into a strided device tensor is not supported: " + describe(), ErrorKind::Unsupported);
    if (storage_->owned) {
      storage_->deviceBuffer.copyFromHost(data, count * eb, 0, stream);
    } else {
      runtime::copyHostToDevice(storage_->device, data, count * eb, describe(), stream);
    }
    return;
  }
  auto* base = static_cast<std::byte*>(storage_->host);
  auto* src = static_cast<const std::byte*>(data);
  if (isContiguous()) {
    if (count) std::memcpy(base, src, count * eb);
    return;
  }
  forEachOffset(shape_, strides_, [&](int64_t off) {
    std::memcpy(base + off * int64_t(eb), src, eb);
    src += eb;
  });
}

void Tensor::copyToHostBytes(DType type, void* data, size_t count, runtime::Stream* stream) const {
  if (!defined()) throw Error("tensor: copy out of an empty Tensor");
  if (type == DType::F32 && isHalf(dtype_)) {  // widened exactly
    if (int64_t(count) != numel())
      throw Error("tensor: cannot copy " + describe() + " into " + std::to_string(count) + " elements");
    float* out = static_cast<float*>(data);
    if (dtype_ == DType::BF16) {
      std::vector<Eigen::bfloat16> h(count);
      copyToHostBytes(dtype_, h.data(), count, stream);
      for (size_t i = 0; i < count; ++i) out[i] = float(h[i]);
    } else {
      std::vector<Eigen::half> h(count);
      copyToHostBytes(dtype_, h.data(), count, stream);
      for (size_t i = 0; i < count; ++i) out[i] = float(h[i]);
    }
    return;
  }
  if (type != dtype_)
    throw Error("tensor: cannot copy " + describe() + " into " + std::string(ir::dtypeName(type)) + " host memory");
  if (int64_t(count) != numel())
    throw Error("tensor: cannot copy " + describe() + " into " + std::to_string(count) + " elements");
  const size_t eb = size_t(elementBytes());
  if (isDevice()) {
    if (!isContiguous()) {
      // A strided view: the bytes its strides reach come over in one copy, then are gathered.
      std::vector<std::byte> extent(extentBytes());
      runtime::copyDeviceToHost(extent.data(), storage_->device, extent.size(), describe(), stream);
      auto* dst = static_cast<std::byte*>(data);
      forEachOffset(shape_, strides_, [&](int64_t off) {
        std::memcpy(dst, extent.data() + off * int64_t(eb), eb);
        dst += eb;
      });
      return;
    }
    if (storage_->owned) {
      storage_->deviceBuffer.copyToHost(data, count * eb, 0, stream);
    } else {
      runtime::copyDeviceToHost(data, storage_->device, count * eb, describe(), stream);
    }
    return;
  }
  const auto* base = static_cast<const std::byte*>(storage_->host);
  auto* dst = static_cast<std::byte*>(data);
  if (isContiguous()) {
    if (count) std::memcpy(dst, base, count * eb);
    return;
  }
  forEachOffset(shape_, strides_, [&](int64_t off) {
    std::memcpy(dst, base + off * int64_t(eb), eb);
    dst += eb;
  });
}

Tensor Tensor::to(MemorySpace space) const {
  if (!defined()) throw Error("tensor: cannot copy an empty Tensor");
  Tensor out = empty(dtype_, shape_, space);
  const size_t bytes = size_t(numel()) * size_t(elementBytes());
  std::vector<std::byte> staging(bytes);
  copyToHostBytes(dtype_, staging.data(), size_t(numel()), nullptr);
  out.copyFromHostBytes(dtype_, staging.data(), size_t(numel()), nullptr);
  return out;
}

}  // namespace flextile::dsl
