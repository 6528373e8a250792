#include "runtime/Event.h"

#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/DriverApi.h"
#include "runtime/DriverError.h"
#include "runtime/Stream.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace flextile::runtime {

Event::Event(Device* device, bool timing) : device_(device ? device : &Device::current()) {
  device_->makeCurrent();
  cu::Event event = nullptr;
  cu::check(cu::api().eventCreate(&event, timing ? cu::kEventDefault : cu::kEventDisableTiming), "cuEventCreate",
            "device " + std::to_string(device_->ordinal()));
  handle_ = event;
}

Event::~Event() { destroy(); }

Event::Event(Event&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    destroy();
    handle_ = std::exchange(other.handle_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Event::destroy() {
  if (!handle_) return;
  cu::Result result = cu::api().ctxSetCurrent(static_cast<cu::Context>(device_->context()));
  if (result == cu::kSuccess) result = cu::api().eventDestroy(static_cast<cu::Event>(handle_));
  if (result != cu::kSuccess && result != cu::kErrorDeinitialized)
    std::fprintf(stderr, "flextile: %s\n", DriverError::format("cuEventDestroy_v2", result, "").c_str());
  handle_ = nullptr;
}

void Event::record(Stream* stream) {
  if (!handle_) throw DriverError("Event::record: the event was moved from");
  device_->makeCurrent();
  cu::check(cu::api().eventRecord(static_cast<cu::Event>(handle_),
                                  stream ? static_cast<cu::Stream>(stream->handle()) : nullptr),
            "cuEventRecord");
}

void Event::synchronize() {
  if (!handle_) throw DriverError("Event::synchronize: the event was moved from");
  device_->makeCurrent();
  cu::check(cu::api().eventSynchronize(static_cast<cu::Event>(handle_)), "cuEventSynchronize",
            "waiting for an event (an earlier kernel launch or copy failed)");
}

double elapsedMs(Event& start, Event& stop) {
  stop.synchronize();
  float milliseconds = 0;
  cu::check(cu::api().eventElapsedTime(&milliseconds, static_cast<cu::Event>(start.handle()),
                                       static_cast<cu::Event>(stop.handle())),
            "cuEventElapsedTime", "both events must be recorded, with timing enabled");
  return milliseconds;
}

Timer::Timer(Stream* stream, Device* device)
    : stream_(stream), start_(device ? device : stream ? stream->device() : nullptr),
      stop_(device ? device : stream ? stream->device() : nullptr) {}

void Timer::start() { start_.record(stream_); }

double Timer::stopMs() {
  stop_.record(stream_);
  return elapsedMs(start_, stop_);
}

std::vector<double> timeKernel(const std::function<void()>& fn, const TimingOptions& options) {
  if (options.warmup < 0 || options.reps < 1)
    throw DriverError("timeKernel: needs warmup >= 0 and reps >= 1, got warmup " + std::to_string(options.warmup) +
                      " and reps " + std::to_string(options.reps));
  Device* device = options.stream ? options.stream->device() : &Device::current();
  DeviceBuffer flush;
  if (options.flushL2) flush = DeviceBuffer(std::max<size_t>(2 * device->l2CacheBytes(), 1 << 20), device);

  for (int i = 0; i < options.warmup; ++i) fn();
  std::vector<Event> starts, stops;
  starts.reserve(options.reps);
  stops.reserve(options.reps);
  for (int i = 0; i < options.reps; ++i) {
    starts.emplace_back(device);
    stops.emplace_back(device);
  }
  for (int i = 0; i < options.reps; ++i) {
    // cuMemsetD8 runs on the legacy stream, which our (blocking) streams wait for.
    if (options.flushL2) flush.fillBytes(uint8_t(i));
    starts[i].record(options.stream);
    fn();
    stops[i].record(options.stream);
  }
  std::vector<double> samples;
  samples.reserve(options.reps);
  for (int i = 0; i < options.reps; ++i) samples.push_back(elapsedMs(starts[i], stops[i]));
  return samples;
}

std::vector<double> timeKernel(const std::function<void()>& fn, int warmup, int reps, Stream* stream) {
  TimingOptions options;
  options.warmup = warmup;
  options.reps = reps;
  options.stream = stream;
  return timeKernel(fn, options);
}

double median(std::vector<double> samples) {
  if (samples.empty()) throw DriverError("median: no samples");
  size_t middle = samples.size() / 2;
  std::nth_element(samples.begin(), samples.begin() + middle, samples.end());
  double upper = samples[middle];
  if (samples.size() % 2 == 1) return upper;
  double lower = *std::max_element(samples.begin(), samples.begin() + middle);
  return (lower + upper) / 2;
}

}  // namespace flextile::runtime
