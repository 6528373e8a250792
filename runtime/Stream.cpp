#include "runtime/Stream.h"

#include "runtime/Device.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"

#include <cstdio>
#include <utility>

namespace flextile::runtime {

Stream::Stream(Device* device) : Stream(device, cu::kStreamDefault) {}

Stream Stream::nonBlocking(Device* device) { return Stream(device, cu::kStreamNonBlocking); }

Stream::Stream(Device* device, unsigned flags) : device_(device ? device : &Device::current()) {
  device_->makeCurrent();
  cu::Stream stream = nullptr;
  cu::check(cu::api().streamCreate(&stream, flags), "cuStreamCreate",
            "device " + std::to_string(device_->ordinal()));
  handle_ = stream;
}

Stream::Stream(BorrowTag, void* handle, Device* device)
    : handle_(handle), device_(device ? device : &Device::current()), owned_(false) {}

Stream Stream::borrow(void* cuStream, Device* device) { return Stream(BorrowTag{}, cuStream, device); }

Stream::~Stream() { destroy(); }

Stream::Stream(Stream&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_), owned_(other.owned_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    destroy();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
    owned_ = other.owned_;
  }
  return *this;
}

void Stream::destroy() {
  if (!owned_) {  // the framework that made it destroys it
    handle_ = nullptr;
    return;
  }
  if (!handle_) return;
  cu::Result result = cu::api().ctxSetCurrent(static_cast<cu::Context>(device_->context()));
  if (result == cu::kSuccess) result = cu::api().streamDestroy(static_cast<cu::Stream>(handle_));
  if (result != cu::kSuccess && result != cu::kErrorDeinitialized)
    std::fprintf(stderr, "flextile: %s\n", DriverError::format("cuStreamDestroy_v2", result, "").c_str());
  handle_ = nullptr;
}

void Stream::synchronize() {
  device_->makeCurrent();
  cu::check(cu::api().streamSynchronize(static_cast<cu::Stream>(handle_)), "cuStreamSynchronize",
            "waiting for a stream on device " + std::to_string(device_->ordinal()) +
                " (an earlier kernel launch or copy failed)");
}

}  // namespace flextile::runtime
