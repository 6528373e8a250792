// Kernels: a C++ callable over tile parameters, traced into tile IR, compiled
// to PTX and launched on the GPU — or run on the host by the IR interpreter.
//
//   auto add = kernel("add", [](Ptr<f32> x, Ptr<f32> y, Ptr<f32> out, Int n, Const<int> BLOCK) {
//     auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
//     auto ok = offs < n;
//     store(out + offs, load(x + offs, ok) + load(y + offs, ok), ok);
//   });
//   add.run({.grid = {cdiv(n, 1024)}, .constants = {1024}}, dx, dy, dout, n);      // GPU buffers
//   add.interpret({.grid = {cdiv(n, 1024)}, .constants = {1024}}, hx, hy, hout, n); // host vectors
//
// Parameters: Ptr<T> (a pointer to elements of T), Int (i32), Long (i64),
// Float (f32) are run-time arguments; Const<int> parameters take the values
// of LaunchOptions::constants in order at trace time.
//
// Identity: a compiled kernel is keyed by the structural hash of its traced IR
// (which includes the constants and num_warps), the argument specialization
// (pointer alignment, integers divisible by 16) and the target — never by a
// C++ type name or an address.
#pragma once

#include <array>
#include <boost/hana.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "codegen/Compiler.h"
#include "dsl/Ops.h"
#include "dsl/Tensor.h"
#include "dsl/Tile.h"
#include "runtime/TensorMap.h"

namespace flextile::runtime {
class Device;
class DeviceBuffer;
class Stream;
}

namespace flextile::dsl {

class CaptureSlot;

template <class T>
struct Ptr : Tile {
  using element = T;
  explicit Ptr(Tile t) : Tile(t) {}
};
struct Int : Tile {
  explicit Int(Tile t) : Tile(t) {}
};
struct Long : Tile {
  explicit Long(Tile t) : Tile(t) {}
};
struct Float : Tile {
  explicit Float(Tile t) : Tile(t) {}
};

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct LaunchOptions {
  std::array<int64_t, 3> grid{1, 1, 1};
  std::vector<int64_t> constants;  // values of the Const<> parameters, in order
  int num_warps = 4;
  // Software-pipelining depth of dot-operand loads in for loops (1..4): loads
  // run num_stages - 1 iterations ahead through a ring of cp.async shared
  // tiles (codegen/passes/Pipeline.cpp). 1 disables it. Default 3: two copies
  // in flight hide the global latency at 128x128x32 tiles (bench/RESULTS.md)
  // with 48 KB of shared memory.
  int num_stages = 3;
  // Hopper's asynchronous copies and roles, for pipelined loops whose loads name their tiles as
  // tensor boxes (dsl/Ops.h TensorBox): `tma` fills their rings by TMA on a target that has it
  // (sm_90a; elsewhere ignored), `warp_specialize` adds a producer warpgroup that issues those
  // copies while the num_warps warps compute (needs tma, setmaxnreg and 4 or 8 warps; otherwise
  // the kernel compiles unspecialized). The function attributes `tma` and `warp_specialize`
  // (codegen/passes/Pipeline.cpp, WarpSpecialize.cpp). The tensors' bases must then be 16-byte
  // aligned and their strides multiples of 16 bytes: a launch that breaks that is refused with the
  // kernel's name and the tensor map.
  bool tma = false;
  bool warp_specialize = false;
  // Lets the compiler reassociate f32 arithmetic (function attribute `reassociate`: the passes
  // fold-scales and regroup-sums, docs/ir-reference.md): uniform factors fold into the sums they
  // scale, broadcasts of one shape are summed on that shape, integer positions convert to f32 term
  // by term. Results may differ in the last bits from the program as written, as under a C
  // compiler's -ffast-math reassociation. The attention templates set it.
  bool reassociate = false;
  // Where run() queues the launch: null is the legacy default stream (the behaviour before streams
  // were an option); runtime::Stream::borrow wraps another framework's CUstream. interpret()
  // ignores it (the interpreter runs on the calling thread, synchronously).
  runtime::Stream* stream = nullptr;
};

// One argument of a launch: a device buffer or address (run), a host buffer
// (interpret), or a scalar.
class KernelArg {
 public:
  enum class Kind { Device, Host, Integer, Real };
  KernelArg(const runtime::DeviceBuffer& b);
  // A host tensor (interpret) or a device tensor (run): its first element.
  KernelArg(const Tensor& t);
  template <class T>
  KernelArg(std::vector<T>& v) : kind_(Kind::Host), host_(v.data()), bytes_(v.size() * sizeof(T)) {}
  template <class T>
  KernelArg(std::span<T> v) : kind_(Kind::Host), host_((void*)v.data()), bytes_(v.size_bytes()) {}
  KernelArg(int v) : kind_(Kind::Integer), integer_(v) {}
  KernelArg(long v) : kind_(Kind::Integer), integer_(v) {}
  KernelArg(long long v) : kind_(Kind::Integer), integer_(v) {}
  KernelArg(float v) : kind_(Kind::Real), real_(v) {}
  KernelArg(double v) : kind_(Kind::Real), real_(v) {}
  static KernelArg deviceAddress(uint64_t address, size_t bytes);

  Kind kind() const { return kind_; }
  uint64_t deviceAddress() const { return device_; }
  void* hostPointer() const { return host_; }
  size_t bytes() const { return bytes_; }
  int64_t integer() const { return integer_; }
  double real() const { return real_; }
  std::string describe() const;

 private:
  KernelArg() = default;
  Kind kind_ = Kind::Integer;
  uint64_t device_ = 0;
  void* host_ = nullptr;
  size_t bytes_ = 0;
  int64_t integer_ = 0;
  double real_ = 0;
};

// The tensor map of a compiled kernel's TMA recipe (codegen/TensorMaps.h) for these launch
// arguments (the kernel's parameters, in order): what runArgs passes after them. Throws Error
// naming the kernel and the map when the arguments break a TMA rule (an unaligned base or stride).
runtime::TensorMap encodeTensorMap(const std::string& kernel, const codegen::TensorMapRecipe& recipe,
                                   const std::vector<KernelArg>& args);

struct TraceOptions {
  std::vector<int64_t> constants;
  int num_warps = 4;
  int num_stages = 3;  // LaunchOptions::num_stages
  bool tma = false, warp_specialize = false;  // LaunchOptions::tma, warp_specialize
  bool reassociate = false;                   // LaunchOptions::reassociate
};

class Kernel {
 public:
  using Tracer = std::function<void(ir::Function&, const std::vector<int64_t>& constants)>;
  Kernel(std::string name, Tracer tracer, size_t numConstants);
  ~Kernel();
  Kernel(Kernel&&) noexcept;

  const std::string& name() const { return name_; }
  size_t numConstants() const { return numConstants_; }

  // The traced IR (verified, before any pass).
  std::unique_ptr<ir::Function> trace(const TraceOptions& options = {}) const;
  // The same, traced once per options and kept: the function run and compile use.
  const ir::Function& cachedTrace(const TraceOptions& options = {});
  // Compiles for the current GPU (or `target`) with the specialization the
  // given arguments imply; cached.
  const codegen::CompiledKernel& compile(const LaunchOptions& options, const std::vector<KernelArg>& args,
                                         std::optional<codegen::Target> target = std::nullopt);

  void runArgs(const LaunchOptions& options, const std::vector<KernelArg>& args);
  void interpretArgs(const LaunchOptions& options, const std::vector<KernelArg>& args);

  template <class... A>
  void run(const LaunchOptions& options, A&&... args) {
    runArgs(options, {KernelArg(args)...});
  }
  template <class... A>
  void interpret(const LaunchOptions& options, A&&... args) {
    interpretArgs(options, {KernelArg(args)...});
  }

  // Tensors captured by the trace for these options (dsl/Capture.h), in
  // parameter order; run/interpret pass them after the given arguments.
  std::vector<std::shared_ptr<CaptureSlot>> captures(const TraceOptions& options = {});
  // Cache sizes, for tests that assert what did (not) retrace or recompile.
  size_t numTraces() const;
  size_t numCompiled() const;

 private:
  struct Compiled;
  // What a parameter takes at a launch, read once from its IR type (runArgs checks and keys every
  // argument by it without going back to the function).
  enum class ParamKind : uint8_t { Pointer, I32, OtherInteger, Number };
  struct Traced {
    std::unique_ptr<ir::Function> function;
    std::vector<std::shared_ptr<CaptureSlot>> captures;
    size_t ownParams = 0;  // parameters of the callable; the captured ones follow
    std::vector<ParamKind> paramKinds;  // one a parameter of `function`
  };
  Traced traceWithCaptures(const TraceOptions& options) const;
  const Traced& tracedEntry(const LaunchOptions& options);
  // The same with the options' key (constantsKey) formed already: a launch forms it once.
  const Traced& tracedEntry(const LaunchOptions& options, const std::string& key);
  // The caller's arguments followed by those of the captured tensors.
  std::vector<KernelArg> withCaptures(const Traced& t, const std::vector<KernelArg>& args,
                                      std::optional<MemorySpace> space);
  const ir::Function& traced(const LaunchOptions& options);
  Compiled& compiled(const LaunchOptions& options, const std::vector<KernelArg>& args,
                     std::optional<codegen::Target> target);
  // The same for a trace and key the caller already has (runArgs).
  Compiled& compiled(const LaunchOptions& options, const std::vector<KernelArg>& args,
                     std::optional<codegen::Target> target, const ir::Function& f, const std::string& key);
  void loadModule(Compiled& c);  // with mutex_ held
  // The last launches' keys as values (runArgs): a launch like a recent one finds its trace and
  // its compiled kernel by comparing a few integers, not by forming the string keys and looking
  // them up (a fifth of a decode step's host time).
  struct RecentLaunch;
  const Traced* recentTrace(const LaunchOptions& options) const;  // with mutex_ held
  Compiled* recentCompiled(const Traced& traced, std::span<const int64_t> divisibility,
                           std::span<const int64_t> ones, const runtime::Device* device,
                           const std::string& settings) const;  // with mutex_ held

  std::string name_;
  Tracer tracer_;
  size_t numConstants_;
  mutable std::mutex mutex_;
  std::map<std::string, Traced> traces_;                           // by constants and num_warps
  std::map<std::string, std::unique_ptr<Compiled>> cache_;        // by IR structural hash and target
  std::map<std::string, Compiled*> launches_;                      // by constants, specialization, target
  std::vector<RecentLaunch> recent_;                               // most recent first (kRecentLaunches)
};

namespace detail {
template <class P>
struct Param;
template <class T>
struct Param<Ptr<T>> {
  static constexpr bool runtime = true;
  static ir::Type type() { return ir::Type::pointer(T::dtype); }
};
template <>
struct Param<Int> {
  static constexpr bool runtime = true;
  static ir::Type type() { return ir::Type(DType::I32); }
};
template <>
struct Param<Long> {
  static constexpr bool runtime = true;
  static ir::Type type() { return ir::Type(DType::I64); }
};
template <>
struct Param<Float> {
  static constexpr bool runtime = true;
  static ir::Type type() { return ir::Type(DType::F32); }
};
template <class T>
struct Param<Const<T>> {
  static constexpr bool runtime = false;
};

template <class F>
struct Signature : Signature<decltype(&F::operator())> {};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...) const> {
  static constexpr auto params = boost::hana::tuple_t<std::decay_t<A>...>;
};
template <class C, class R, class... A>
struct Signature<R (C::*)(A...)> {
  static constexpr auto params = boost::hana::tuple_t<std::decay_t<A>...>;
};

// Makes the argument of one parameter: a new IR parameter for run-time
// parameters, the next constant for Const<>.
template <class P>
P makeArgument(ir::Function& f, const std::vector<int64_t>& constants, size_t& nextConstant) {
  if constexpr (Param<P>::runtime) {
    return P(Tile(f.addParam(Param<P>::type(), "arg" + std::to_string(f.params().size()))));
  } else {
    return P{static_cast<decltype(P::value)>(constants.at(nextConstant++))};
  }
}
}  // namespace detail

// Defines a kernel from a callable whose parameters are Ptr<T>, Int, Long,
// Float and Const<T>.
template <class F>
Kernel kernel(std::string name, F fn) {
  namespace hana = boost::hana;
  constexpr auto params = detail::Signature<F>::params;
  constexpr size_t numConstants = hana::count_if(params, [](auto t) {
    return hana::bool_c<!detail::Param<typename decltype(t)::type>::runtime>;
  });
  auto tracer = [fn](ir::Function& f, const std::vector<int64_t>& constants) {
    size_t next = 0;
    // Arguments are made left to right, so IR parameters keep the C++ order.
    // (a braced initializer evaluates in order; a function call's arguments need not).
    auto args = hana::unpack(detail::Signature<F>::params, [&](auto... t) {
      return hana::tuple<typename decltype(t)::type...>{
          detail::makeArgument<typename decltype(t)::type>(f, constants, next)...};
    });
    hana::unpack(args, fn);
  };
  return Kernel(std::move(name), tracer, numConstants);
}

}  // namespace flextile::dsl
