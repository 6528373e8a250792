#include "runtime/DeviceBuffer.h"

#include "runtime/Device.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"
#include "runtime/Stream.h"

#include <cstdio>
#include <utility>

namespace flextile::runtime {

namespace {

std::string onDevice(const Device* device) { return " on device " + std::to_string(device->ordinal()); }

cu::Stream cuStream(Stream* stream) { return static_cast<cu::Stream>(streamHandle(stream)); }

// The copies and fills of this file: the synchronous call without a stream (what they were before
// streams were an option), the stream-ordered one with it.
cu::Result copyIn(cu::DevicePtr to, const void* from, size_t bytes, Stream* stream) {
  if (!stream) return cu::api().memcpyHtoD(to, from, bytes);
  stream->device()->makeCurrent();
  return cu::api().memcpyHtoDAsync(to, from, bytes, cuStream(stream));
}
cu::Result copyOut(void* to, cu::DevicePtr from, size_t bytes, Stream* stream) {
  if (!stream) return cu::api().memcpyDtoH(to, from, bytes);
  stream->device()->makeCurrent();
  // To pageable memory the driver returns only once the bytes have arrived; a pinned destination
  // would return at once, so wait for the stream as well: the caller reads the data next.
  cu::Result result = cu::api().memcpyDtoHAsync(to, from, bytes, cuStream(stream));
  if (result == cu::kSuccess) result = cu::api().streamSynchronize(cuStream(stream));
  return result;
}
cu::Result fill(cu::DevicePtr to, uint8_t value, size_t bytes, Stream* stream) {
  if (!stream) return cu::api().memsetD8(to, value, bytes);
  stream->device()->makeCurrent();
  return cu::api().memsetD8Async(to, value, bytes, cuStream(stream));
}
const char* copyInName(Stream* stream) { return stream ? "cuMemcpyHtoDAsync_v2" : "cuMemcpyHtoD_v2"; }
const char* copyOutName(Stream* stream) { return stream ? "cuMemcpyDtoHAsync_v2" : "cuMemcpyDtoH_v2"; }
const char* fillName(Stream* stream) { return stream ? "cuMemsetD8Async" : "cuMemsetD8_v2"; }

}  // namespace

void checkCopyRange(const char* operation, const void* hostPointer, size_t bytes, size_t offset, size_t capacity) {
  if (bytes > 0 && hostPointer == nullptr)
    throw DriverError(std::string(operation) + ": the host pointer is null for a copy of " + std::to_string(bytes) +
                      " bytes");
  // Written so that offset + bytes cannot overflow.
  if (offset > capacity || bytes > capacity - offset)
    throw DriverError(std::string(operation) + ": " + std::to_string(bytes) + " bytes at offset " +
                      std::to_string(offset) + " do not fit in a device buffer of " + std::to_string(capacity) +
                      " bytes");
}

DeviceBuffer::DeviceBuffer(size_t bytes, Device* device) : device_(device ? device : &Device::current()) {
  if (bytes == 0) return;
  device_->makeCurrent();
  cu::DevicePtr pointer = 0;
  cu::check(cu::api().memAlloc(&pointer, bytes), "cuMemAlloc_v2",
            "allocating " + std::to_string(bytes) + " bytes" + onDevice(device_));
  address_ = pointer;
  bytes_ = bytes;
}

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : address_(std::exchange(other.address_, 0)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    address_ = std::exchange(other.address_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (address_ == 0) return;
  // Destructors cannot throw: report a failed free instead. At process exit the driver may
  // already be shutting down (CUDA_ERROR_DEINITIALIZED); its memory goes with it then.
  cu::Result result = cu::api().ctxSetCurrent(static_cast<cu::Context>(device_->context()));
  if (result == cu::kSuccess) result = cu::api().memFree(address_);
  if (result != cu::kSuccess && result != cu::kErrorDeinitialized)
    std::fprintf(stderr, "flextile: %s\n",
                 DriverError::format("cuMemFree_v2", result,
                                     "freeing " + std::to_string(bytes_) + " bytes" + onDevice(device_))
                     .c_str());
  address_ = 0;
  bytes_ = 0;
}

void DeviceBuffer::copyFromHost(const void* source, size_t bytes, size_t offset, Stream* stream) {
  checkCopyRange("DeviceBuffer::copyFromHost", source, bytes, offset, bytes_);
  if (bytes == 0) return;
  device_->makeCurrent();
  cu::check(copyIn(address_ + offset, source, bytes, stream), copyInName(stream),
            "copying " + std::to_string(bytes) + " bytes to offset " + std::to_string(offset) + onDevice(device_));
}

void DeviceBuffer::copyToHost(void* destination, size_t bytes, size_t offset, Stream* stream) const {
  checkCopyRange("DeviceBuffer::copyToHost", destination, bytes, offset, bytes_);
  if (bytes == 0) return;
  device_->makeCurrent();
  // A failure here is often a kernel's error surfacing at the next synchronous call.
  cu::check(copyOut(destination, address_ + offset, bytes, stream), copyOutName(stream),
            "copying " + std::to_string(bytes) + " bytes from offset " + std::to_string(offset) + onDevice(device_) +
                " (an earlier kernel may have failed)");
}

void DeviceBuffer::fillBytes(uint8_t value, Stream* stream) {
  if (bytes_ == 0) return;
  device_->makeCurrent();
  cu::check(fill(address_, value, bytes_, stream), fillName(stream),
            "filling " + std::to_string(bytes_) + " bytes" + onDevice(device_));
}

void copyDeviceToDevice(uint64_t destination, uint64_t source, size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(cu::api().memcpyDtoD(destination, source, bytes), "cuMemcpyDtoD_v2",
            "copying " + std::to_string(bytes) + " bytes: " + what);
}

void copyHostToDevice(uint64_t deviceAddress, const void* source, size_t bytes, const std::string& what,
                      Stream* stream) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(copyIn(deviceAddress, source, bytes, stream), copyInName(stream),
            "copying " + std::to_string(bytes) + " bytes into " + what);
}

void copyDeviceToHost(void* destination, uint64_t deviceAddress, size_t bytes, const std::string& what,
                      Stream* stream) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(copyOut(destination, deviceAddress, bytes, stream), copyOutName(stream),
            "copying " + std::to_string(bytes) + " bytes out of " + what + " (an earlier kernel may have failed)");
}

void fillDeviceBytes(uint64_t deviceAddress, uint8_t value, size_t bytes, const std::string& what, Stream* stream) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(fill(deviceAddress, value, bytes, stream), fillName(stream),
            "filling " + std::to_string(bytes) + " bytes of " + what);
}

}  // namespace flextile::runtime
