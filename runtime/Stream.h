// A CUDA stream: an ordered queue of launches and event records on one device.
#pragma once

namespace flextile::runtime {

class Device;

// Move-only. Created blocking with respect to the legacy default stream, so the synchronous
// copies of DeviceBuffer (which use that stream) stay ordered after work queued here.
class Stream {
 public:
  explicit Stream(Device* device = nullptr);  // Device::current() when null
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Waits for everything queued; throws DriverError naming an error a kernel left.
  void synchronize();

  void* handle() const { return handle_; }  // the CUstream
  Device* device() const { return device_; }

 private:
  void destroy();
  void* handle_ = nullptr;
  Device* device_ = nullptr;
};

}  // namespace flextile::runtime
