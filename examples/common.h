// Helpers the example programs share: random inputs, float64 comparisons,
// and running a kernel on the GPU when there is one, otherwise through the
// IR interpreter.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dsl/DSL.h"
#include "runtime/Driver.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/Device.h"

namespace flextile::examples {

// Element types on the host, as Eigen spells them.
template <class T> struct HostType;
template <> struct HostType<dsl::f32> { using type = float; };
template <> struct HostType<dsl::f16> { using type = Eigen::half; };
template <> struct HostType<dsl::bf16> { using type = Eigen::bfloat16; };
template <class T> using host_t = typename HostType<T>::type;

template <class H>
std::vector<H> randomVector(size_t n, std::mt19937& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<H> v(n);
  for (auto& x : v) x = H(float(d(rng)));
  return v;
}

// ||out - ref|| / ||ref|| in float64, and whether any output is not finite.
template <class H>
double relativeError(const std::vector<H>& out, const std::vector<double>& ref, bool* nonFinite = nullptr) {
  double num = 0, den = 0;
  bool bad = false;
  for (size_t i = 0; i < ref.size(); ++i) {
    double o = double(float(out[i]));
    if (!std::isfinite(o)) bad = true;
    num += (o - ref[i]) * (o - ref[i]);
    den += ref[i] * ref[i];
  }
  if (nonFinite) *nonFinite = bad;
  return bad ? INFINITY : std::sqrt(num / (den > 0 ? den : 1));
}

// softmax along each row of a row-major [rows, cols] matrix, in float64.
template <class H>
std::vector<double> softmaxReference(const std::vector<H>& x, int rows, int cols) {
  std::vector<double> ref(x.size());
  for (int r = 0; r < rows; ++r) {
    const size_t base = size_t(r) * size_t(cols);
    double m = -INFINITY, sum = 0;
    for (int c = 0; c < cols; ++c) m = std::max(m, double(float(x[base + c])));
    for (int c = 0; c < cols; ++c) sum += ref[base + c] = std::exp(double(float(x[base + c])) - m);
    for (int c = 0; c < cols; ++c) ref[base + c] /= sum;
  }
  return ref;
}

inline bool gpuAvailable(std::string* why = nullptr) { return runtime::Driver::available(why); }

// A device copy of a host vector.
template <class H>
runtime::DeviceBuffer toDevice(const std::vector<H>& v) {
  runtime::DeviceBuffer b(v.size() * sizeof(H));
  b.copyFromHost(v.data(), b.bytes());
  return b;
}

template <class H>
void fromDevice(const runtime::DeviceBuffer& b, std::vector<H>& v) {
  b.copyToHost(v.data(), v.size() * sizeof(H));
}

inline double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace flextile::examples
