// A CUDA stream: an ordered queue of launches, copies and event records on one device.
#pragma once

namespace flextile::runtime {

class Device;

// Move-only. Either owned — created here, blocking with respect to the legacy default stream so
// the synchronous copies of DeviceBuffer (which use that stream) stay ordered after work queued
// here, and destroyed with the object — or borrowed (Stream::borrow): a CUstream that another
// framework created and will destroy, used as it is and never destroyed here.
//
// Every FlexTile call that launches work takes an optional Stream* (LaunchOptions::stream,
// FlexAttentionOptions::stream, ...): null is the legacy default stream, as before streams were an
// option; a given stream receives all of the call's launches and copies in order, and a host read
// of a device result waits for that stream only (docs/architecture.md, "Streams").
class Stream {
 public:
  explicit Stream(Device* device = nullptr);  // Device::current() when null
  // An owned stream that does not synchronize with the legacy default stream (CU_STREAM_NON_BLOCKING),
  // as the side streams of frameworks such as PyTorch are: work on it is ordered only by its own
  // queue, so a call on it must keep every copy it depends on in that queue too.
  static Stream nonBlocking(Device* device = nullptr);
  // A stream FlexTile does not own: `cuStream` (a CUstream; null is the legacy default stream) on
  // `device` (Device::current() when null), which must be the device whose context made it.
  static Stream borrow(void* cuStream, Device* device = nullptr);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Waits for everything queued; throws DriverError naming an error a kernel left.
  void synchronize();

  void* handle() const { return handle_; }  // the CUstream
  Device* device() const { return device_; }
  bool owned() const { return owned_; }

 private:
  struct BorrowTag {};
  Stream(BorrowTag, void* handle, Device* device);
  Stream(Device* device, unsigned flags);
  void destroy();
  void* handle_ = nullptr;
  Device* device_ = nullptr;
  bool owned_ = true;
};

// The CUstream of `stream`: null (the legacy default stream) for a null stream.
inline void* streamHandle(const Stream* stream) { return stream ? stream->handle() : nullptr; }

}  // namespace flextile::runtime
