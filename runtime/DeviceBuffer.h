// Device memory owned by one object (cuMemAlloc / cuMemFree).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flextile::runtime {

class Device;
class Stream;

// A block of global memory on one device, freed when the buffer is destroyed. Move-only.
// Copies check the range against bytes(). Without a stream they are the synchronous copies of the
// legacy default stream; with one they are queued on it, in order with its launches (the host
// source may be reused on return; a copy to the host returns once the data is there, having
// waited for that stream's earlier work only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;  // empty: no device memory, address() == 0
  // Allocates `bytes` (0 is allowed and allocates nothing) on `device` (Device::current() when null).
  // Throws DriverError without a driver or when the device is out of memory.
  explicit DeviceBuffer(size_t bytes, Device* device = nullptr);
  ~DeviceBuffer();

  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  uint64_t address() const { return address_; }  // the CUdeviceptr, to pass as a kernel argument
  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }
  Device* device() const { return device_; }

  // Copies `bytes` between host memory and this buffer starting `offset` bytes in.
  void copyFromHost(const void* source, size_t bytes, size_t offset = 0, Stream* stream = nullptr);
  void copyToHost(void* destination, size_t bytes, size_t offset = 0, Stream* stream = nullptr) const;
  // Sets every byte to `value`: poison outputs before a launch (0xFF makes NaN floats) so a kernel
  // that skips a store is caught.
  void fillBytes(uint8_t value, Stream* stream = nullptr);

  // Frees the memory now (the buffer becomes empty).
  void reset();

 private:
  uint64_t address_ = 0;
  size_t bytes_ = 0;
  Device* device_ = nullptr;
};

// Throws DriverError unless [offset, offset + bytes) lies inside a buffer of `capacity` bytes and
// `hostPointer` is not null when bytes > 0. `operation` names the caller in the message.
void checkCopyRange(const char* operation, const void* hostPointer, size_t bytes, size_t offset, size_t capacity);

// Copies between host memory and device memory FlexTile does not own (a view
// over another framework's allocation), on the current device. `what` names
// the destination or source in error messages.
void copyHostToDevice(uint64_t deviceAddress, const void* source, size_t bytes, const std::string& what,
                      Stream* stream = nullptr);
void copyDeviceToHost(void* destination, uint64_t deviceAddress, size_t bytes, const std::string& what,
                      Stream* stream = nullptr);
// Sets `bytes` bytes at a device address to `value`, on `stream` (the legacy default stream when null).
void fillDeviceBytes(uint64_t deviceAddress, uint8_t value, size_t bytes, const std::string& what,
                     Stream* stream = nullptr);
// Copies `bytes` from one device address to another on the current device (cuMemcpyDtoD: queued
// on the legacy default stream, the host does not wait). `what` names the copy in errors.
void copyDeviceToDevice(uint64_t destination, uint64_t source, size_t bytes, const std::string& what);

}  // namespace flextile::runtime
