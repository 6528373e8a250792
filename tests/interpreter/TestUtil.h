// Shared helpers of the interpreter tests: seeded randomness, typed host
// buffers with poisoning, independent rounding references, and a few kernel
// skeletons built with ir::Builder.
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Core>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ir/Builder.h"
#include "ir/Interpreter.h"

namespace flextile::test {

using namespace flextile::ir;

// Fresh randomness every run; the seed is printed with any failure of the test.
#define FT_SEEDED_RNG(rng)                                     \
  const uint64_t rng##Seed = std::random_device{}();           \
  SCOPED_TRACE("random seed " + std::to_string(rng##Seed));    \
  std::mt19937_64 rng(rng##Seed)

inline double uniform(std::mt19937_64& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}
inline int64_t uniformInt(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// ---- an independent rounding reference -------------------------------------

// The bits of a finite non-negative value in a 16-bit format, and back.
inline double halfBitsToDouble(uint16_t b, DType t) {
  return t == DType::F16 ? double(float(Eigen::numext::bit_cast<Eigen::half>(b)))
                         : double(float(Eigen::numext::bit_cast<Eigen::bfloat16>(b)));
}

// Rounds x to nearest even in dtype t by bracketing it between neighbouring
// representable values (compared exactly in long double), not by converting
// through float: the reference for the interpreter's single roundings.
inline long double roundRef(long double x, DType t) {
  if (std::isnan(x)) return x;
  if (t == DType::F64) return (long double)(double)x;  // the hardware's conversion rounds once
  if (t == DType::F32) return (long double)(float)x;
  bool neg = std::signbit(x);
  long double a = neg ? -x : x;
  long double maxv = t == DType::F16 ? 65504.0L : (long double)std::ldexp(0xFF, 120);  // bf16 max = 0x7F7F
  long double maxUlp = t == DType::F16 ? 32.0L : (long double)std::ldexp(1.0, 120);
  long double r;
  if (a >= maxv + maxUlp / 2) {
    r = std::numeric_limits<long double>::infinity();
  } else {
    // Binary search the largest bit pattern whose value is <= a.
    uint16_t lo = 0, hi = t == DType::F16 ? 0x7BFF : 0x7F7F;
    while (lo < hi) {
      uint16_t mid = uint16_t((lo + hi + 1) / 2);
      if ((long double)halfBitsToDouble(mid, t) <= a) lo = mid;
      else hi = uint16_t(mid - 1);
    }
    long double below = halfBitsToDouble(lo, t);
    if (below == a || lo == (t == DType::F16 ? 0x7BFF : 0x7F7F)) {
      r = below;  // exact, or between max and the overflow threshold
    } else {
      long double above = halfBitsToDouble(uint16_t(lo + 1), t);
      long double dBelow = a - below, dAbove = above - a;
      r = dBelow < dAbove ? below : dAbove < dBelow ? above : ((lo & 1) ? above : below);
    }
  }
  return neg ? -r : r;
}

inline double roundTo(double x, DType t) { return double(roundRef(x, t)); }

// ---- typed host buffers -----------------------------------------------------

class HostBuf {
 public:
  HostBuf(DType t, size_t n) : dtype_(t), n_(n), words_((n * size_t(byteWidth(t)) + 7) / 8 + 1) {}

  DType dtype() const { return dtype_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * size_t(byteWidth(dtype_)); }
  void* data() { return words_.data(); }
  char* bytePtr() { return reinterpret_cast<char*>(words_.data()); }
  const char* bytePtr() const { return reinterpret_cast<const char*>(words_.data()); }
  InterpArg arg(std::string name = "") { return InterpArg::buffer(data(), bytes(), std::move(name)); }

  // Floats: set rounds to the dtype (test inputs are normally exact already).
  void set(size_t i, double v) {
    char* p = bytePtr() + i * size_t(byteWidth(dtype_));
    switch (dtype_) {
      case DType::F32: { float f = float(v); std::memcpy(p, &f, 4); break; }
      case DType::F64: std::memcpy(p, &v, 8); break;
      case DType::F16: {
        uint16_t b = Eigen::numext::bit_cast<uint16_t>(Eigen::half(float(roundTo(v, DType::F16))));
        std::memcpy(p, &b, 2);
        break;
      }
      case DType::BF16: {
        uint16_t b = Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(float(roundTo(v, DType::BF16))));
        std::memcpy(p, &b, 2);
        break;
      }
      default: setInt(i, int64_t(v));
    }
  }
  double get(size_t i) const {
    const char* p = bytePtr() + i * size_t(byteWidth(dtype_));
    switch (dtype_) {
      case DType::F32: { float f; std::memcpy(&f, p, 4); return f; }
      case DType::F64: { double d; std::memcpy(&d, p, 8); return d; }
      case DType::F16: { uint16_t b; std::memcpy(&b, p, 2); return halfBits(b, DType::F16); }
      case DType::BF16: { uint16_t b; std::memcpy(&b, p, 2); return halfBits(b, DType::BF16); }
      default: return double(getInt(i));
    }
  }
  void setInt(size_t i, int64_t v) {
    char* p = bytePtr() + i * size_t(byteWidth(dtype_));
    switch (dtype_) {
      case DType::I1: *reinterpret_cast<uint8_t*>(p) = uint8_t(v); break;
      case DType::I8: *reinterpret_cast<int8_t*>(p) = int8_t(v); break;
      case DType::I32: { int32_t w = int32_t(v); std::memcpy(p, &w, 4); break; }
      case DType::I64: std::memcpy(p, &v, 8); break;
      default: set(i, double(v));
    }
  }
  int64_t getInt(size_t i) const {
    const char* p = bytePtr() + i * size_t(byteWidth(dtype_));
    switch (dtype_) {
      case DType::I1: return *reinterpret_cast<const uint8_t*>(p);
      case DType::I8: return *reinterpret_cast<const int8_t*>(p);
      case DType::I32: { int32_t w; std::memcpy(&w, p, 4); return w; }
      case DType::I64: { int64_t w; std::memcpy(&w, p, 8); return w; }
      default: return int64_t(get(i));
    }
  }
  // Floats become NaN, integers `pattern` bytes: an element never written shows.
  void poison(uint8_t pattern = 0xAB) {
    pattern_ = pattern;
    unwritten_.clear();
    if (isFloat(dtype_))
      for (size_t i = 0; i < n_; ++i) set(i, std::numeric_limits<double>::quiet_NaN());
    else
      std::memset(bytePtr(), pattern, bytes());
  }
  // Still holds the poison. For a 1-byte dtype a written value can equal the
  // pattern, so runMap runs such kernels twice under two patterns and marks
  // only elements that kept both.
  bool poisoned(size_t i) const {
    if (!unwritten_.empty()) return unwritten_[i];
    if (isFloat(dtype_)) return std::isnan(get(i));
    for (int b = 0; b < byteWidth(dtype_); ++b)
      if (uint8_t(bytePtr()[i * size_t(byteWidth(dtype_)) + size_t(b)]) != pattern_) return false;
    return true;
  }
  void markUnwritten(std::vector<bool> u) { unwritten_ = std::move(u); }

 private:
  static double halfBits(uint16_t b, DType t) {
    return t == DType::F16 ? double(float(Eigen::numext::bit_cast<Eigen::half>(b)))
                           : double(float(Eigen::numext::bit_cast<Eigen::bfloat16>(b)));
  }
  DType dtype_;
  size_t n_;
  std::vector<uint64_t> words_;
  uint8_t pattern_ = 0xAB;
  std::vector<bool> unwritten_;
};

// A random value exactly representable in t, in [lo, hi].
inline double randomIn(std::mt19937_64& rng, DType t, double lo, double hi) {
  double v = uniform(rng, lo, hi);
  return isFloat(t) ? roundTo(v, t) : std::floor(v);
}

// ---- kernel skeletons -------------------------------------------------------

// pid * block + arange(block), and the mask offs < n.
inline Value* blockOffsets(Builder& b, int64_t block) {
  Value* start = b.binary(OpKind::Mul, b.programId(0), b.constantInt(Type(DType::I32), block));
  return b.binary(OpKind::Add, b.splat(start, {block}), b.arange(0, block));
}

inline Value* ptrTile(Builder& b, Value* base, Value* offsets) {
  return b.addptr(b.splat(base, offsets->type().shape()), offsets);
}

// out[i] = body(in0[i], in1[i], ...) for i < n, `block` elements per program.
// Parameters: in0.., out, n. Masked-off lanes load `other` (a divisor needs 1:
// an integer division by zero is an error even in a lane never stored).
inline std::unique_ptr<Function> mapKernel(const std::vector<DType>& ins, DType out,
                                           const std::function<Value*(Builder&, const std::vector<Value*>&)>& body,
                                           int64_t block = 64, double other = 0) {
  auto f = std::make_unique<Function>("map");
  std::vector<Value*> inPtrs;
  for (size_t i = 0; i < ins.size(); ++i) inPtrs.push_back(f->addParam(Type::pointer(ins[i]), "in" + std::to_string(i)));
  Value* outPtr = f->addParam(Type::pointer(out), "out");
  Value* n = f->addParam(Type(DType::I32), "n");
  Builder b(*f);
  Value* offs = blockOffsets(b, block);
  Value* mask = b.cmp("lt", offs, b.splat(n, {block}));
  std::vector<Value*> loaded;
  for (Value* p : inPtrs) {
    Value* fill = other != 0 ? b.constant(Type(p->type().pointee(), {block}), other) : nullptr;
    loaded.push_back(b.load(ptrTile(b, p, offs), mask, fill));
  }
  b.store(ptrTile(b, outPtr, offs), body(b, loaded), mask);
  b.ret();
  return f;
}

inline void runMap(const Function& f, std::vector<HostBuf*> ins, HostBuf& out, int threads = 0) {
  std::vector<InterpArg> args;
  for (HostBuf* h : ins) args.push_back(h->arg());
  args.push_back(out.arg());
  args.push_back(InterpArg::integer(int64_t(out.size())));
  const int64_t block = 64;
  const std::array<int64_t, 3> grid{int64_t((out.size() + size_t(block) - 1) / size_t(block)), 1, 1};
  if (byteWidth(out.dtype()) == 1) {
    out.poison(0x5A);
    interpret(f, args, grid, InterpOptions{threads});
    std::vector<bool> first(out.size());
    for (size_t i = 0; i < out.size(); ++i) first[i] = out.poisoned(i);
    out.poison(0xAB);
    interpret(f, args, grid, InterpOptions{threads});
    std::vector<bool> both(out.size());
    for (size_t i = 0; i < out.size(); ++i) both[i] = first[i] && out.poisoned(i);
    out.markUnwritten(std::move(both));
    return;
  }
  out.poison();
  interpret(f, args, grid, InterpOptions{threads});
}

// Runs `fn` and returns the message of the flextile::Error it throws ("" if none).
inline std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace flextile::test
