// CUDA events and GPU timing.
#pragma once

#include <functional>
#include <vector>

namespace flextile::runtime {

class Device;
class Stream;

// A marker recorded into a stream; two timing events give the GPU time between them. Move-only.
class Event {
 public:
  explicit Event(Device* device = nullptr, bool timing = true);  // Device::current() when null
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // Records the event into `stream` (the legacy default stream when null).
  void record(Stream* stream = nullptr);
  // Waits until the GPU reaches the event.
  void synchronize();

  void* handle() const { return handle_; }  // the CUevent
  Device* device() const { return device_; }

 private:
  void destroy();
  void* handle_ = nullptr;
  Device* device_ = nullptr;
};

// Milliseconds of GPU time from `start` to `stop`, both recorded; waits for `stop` first.
double elapsedMs(Event& start, Event& stop);

// Times one region on a stream: start(), queue work, stopMs() waits and returns milliseconds.
class Timer {
 public:
  explicit Timer(Stream* stream = nullptr, Device* device = nullptr);
  void start();
  double stopMs();

 private:
  Stream* stream_;
  Event start_, stop_;
};

struct TimingOptions {
  int warmup = 3;              // untimed calls first (JIT, caches, clocks)
  int reps = 20;               // timed calls, one sample each
  Stream* stream = nullptr;    // where `fn` queues its work (the legacy default stream when null)
  bool flushL2 = false;        // overwrite a buffer twice the L2 size before each timed call (cold cache)
};

// Runs fn() `warmup` times, then `reps` times each between two events, and returns every
// sample in milliseconds in call order; take the median (see median()). fn must only queue
// GPU work on options.stream; the samples are read after one final wait, so the GPU is never
// idle between reps waiting for the host.
std::vector<double> timeKernel(const std::function<void()>& fn, const TimingOptions& options);
std::vector<double> timeKernel(const std::function<void()>& fn, int warmup, int reps, Stream* stream = nullptr);

// The median of `samples` (the mean of the middle two for an even count); throws on empty input.
double median(std::vector<double> samples);

}  // namespace flextile::runtime
