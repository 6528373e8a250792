#include "runtime/DeviceBuffer.h"

#include "runtime/Device.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"

#include <cstdio>
#include <utility>

namespace flextile::runtime {

namespace {

std::string onDevice(const Device* device) { return " on device " + std::to_string(device->ordinal()); }

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

void DeviceBuffer::copyFromHost(const void* source, size_t bytes, size_t offset) {
  checkCopyRange("DeviceBuffer::copyFromHost", source, bytes, offset, bytes_);
  if (bytes == 0) return;
  device_->makeCurrent();
  cu::check(cu::api().memcpyHtoD(address_ + offset, source, bytes), "cuMemcpyHtoD_v2",
            "copying " + std::to_string(bytes) + " bytes to offset " + std::to_string(offset) + onDevice(device_));
}

void DeviceBuffer::copyToHost(void* destination, size_t bytes, size_t offset) const {
  checkCopyRange("DeviceBuffer::copyToHost", destination, bytes, offset, bytes_);
  if (bytes == 0) return;
  device_->makeCurrent();
  // A failure here is often a kernel's error surfacing at the next synchronous call.
  cu::check(cu::api().memcpyDtoH(destination, address_ + offset, bytes), "cuMemcpyDtoH_v2",
            "copying " + std::to_string(bytes) + " bytes from offset " + std::to_string(offset) + onDevice(device_) +
                " (an earlier kernel may have failed)");
}

void DeviceBuffer::fillBytes(uint8_t value) {
  if (bytes_ == 0) return;
  device_->makeCurrent();
  cu::check(cu::api().memsetD8(address_, value, bytes_), "cuMemsetD8_v2",
            "filling " + std::to_string(bytes_) + " bytes" + onDevice(device_));
}

void copyDeviceToDevice(uint64_t destination, uint64_t source, size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(cu::api().memcpyDtoD(destination, source, bytes), "cuMemcpyDtoD_v2",
            "copying " + std::to_string(bytes) + " bytes: " + what);
}

void copyHostToDevice(uint64_t deviceAddress, const void* source, size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(cu::api().memcpyHtoD(deviceAddress, source, bytes), "cuMemcpyHtoD_v2",
            "copying " + std::to_string(bytes) + " bytes into " + what);
}

void copyDeviceToHost(void* destination, uint64_t deviceAddress, size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  Device::current().makeCurrent();
  cu::check(cu::api().memcpyDtoH(destination, deviceAddress, bytes), "cuMemcpyDtoH_v2",
            "copying " + std::to_string(bytes) + " bytes out of " + what + " (an earlier kernel may have failed)");
}

}  // namespace flextile::runtime
