// The template layer: kernel parameters and constants declared once, as a
// struct, and bound by name on both sides.
//
//   template <template <class> class P>
//   struct PreprocessParams {
//     BOOST_HANA_DEFINE_STRUCT(PreprocessParams, (P<Data>, out), (P<F32Ptr>, lse), (P<I32>, q_len));
//   };
//
//   // trace side: one IR parameter per member, in declaration order, named after it
//   auto p = declareParams<PreprocessParams>(f, dtype);        // p.out, p.lse, p.q_len are Tiles
//   // host side: designated initializers name each argument; a member left out is an error
//   auto args = bindParams<PreprocessParams>({.out = out, .lse = lse, .q_len = L}, "flex_bwd_preprocess");
//
// Before this, every template kept two positional lists (addParam calls in the tracer, KernelArg
// lists on the host) that had to agree by position; a swap of two i32 strides compiled and ran.
// Boost.Hana's struct reflection gives both sides one declaration: the order, the names and the
// kinds come from the struct, and the compiler checks the names.
#pragma once

#include <boost/hana.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dsl/DSL.h"

namespace flextile::attention::tmpl {

// What a parameter is. Data points to the template's element dtype (q, k, v and their gradients).
struct Data {};
struct F32Ptr {};
struct I32Ptr {};
struct I64Ptr {};
struct I32 {};
struct F32 {};

template <class Kind>
ir::Type irType(dsl::DType data) {
  if constexpr (std::is_same_v<Kind, Data>) return ir::Type::pointer(data);
  else if constexpr (std::is_same_v<Kind, F32Ptr>) return ir::Type::pointer(dsl::DType::F32);
  else if constexpr (std::is_same_v<Kind, I32Ptr>) return ir::Type::pointer(dsl::DType::I32);
  else if constexpr (std::is_same_v<Kind, I64Ptr>) return ir::Type::pointer(dsl::DType::I64);
  else if constexpr (std::is_same_v<Kind, I32>) return ir::Type(dsl::DType::I32);
  else return ir::Type(dsl::DType::F32);
}

// The trace side of a member: the parameter's tile.
template <class Kind>
struct Traced : dsl::Tile {
  using kind = Kind;
};

// The host side of a member: the argument bound to it, if any.
template <class Kind>
struct Bound {
  using kind = Kind;
  std::optional<dsl::KernelArg> arg;
  Bound() = default;
  template <class T>
  Bound(const T& value) : arg(dsl::KernelArg(value)) {}
};

// Adds one IR parameter per member of P, in declaration order.
template <template <template <class> class> class P>
P<Traced> declareParams(ir::Function& f, dsl::DType data) {
  namespace hana = boost::hana;
  P<Traced> params;
  hana::for_each(hana::accessors<P<Traced>>(), [&](auto accessor) {
    auto& member = hana::second(accessor)(params);
    using Kind = typename std::decay_t<decltype(member)>::kind;
    static_cast<dsl::Tile&>(member) =
        dsl::Tile(f.addParam(irType<Kind>(data), hana::to<const char*>(hana::first(accessor))));
  });
  return params;
}

// The arguments in parameter order; a member without an argument is an error naming it.
template <template <template <class> class> class P>
std::vector<dsl::KernelArg> bindParams(const P<Bound>& bound, const std::string& kernelName) {
  namespace hana = boost::hana;
  std::vector<dsl::KernelArg> args;
  args.reserve(hana::length(hana::accessors<P<Bound>>()));  // bound on every launch: no regrowth
  hana::for_each(hana::accessors<P<Bound>>(), [&](auto accessor) {
    const auto& member = hana::second(accessor)(bound);
    if (!member.arg)
      throw Error(kernelName + ": template parameter '" + std::string(hana::to<const char*>(hana::first(accessor))) +
                  "' was not bound");
    args.push_back(*member.arg);
  });
  return args;
}

// Compile-time constants declared the same way: a struct of int64_t members, listed in order for
// LaunchOptions::constants and read back by the tracer.
template <class C>
std::vector<int64_t> constantList(const C& c) {
  namespace hana = boost::hana;
  std::vector<int64_t> out;
  out.reserve(hana::length(hana::accessors<C>()));
  hana::for_each(hana::members(c), [&](int64_t v) { out.push_back(v); });
  return out;
}
template <class C>
C constantsFrom(const std::vector<int64_t>& list) {
  namespace hana = boost::hana;
  C c{};
  size_t i = 0;
  hana::for_each(hana::accessors<C>(), [&](auto accessor) { hana::second(accessor)(c) = list.at(i++); });
  return c;
}
template <class C>
constexpr size_t constantCount() {
  return boost::hana::length(boost::hana::accessors<C>());
}

// One kernel launch of a template: the kernels of a template run in order on one stream.
struct Launch {
  dsl::Kernel* kernel;
  dsl::LaunchOptions options;
  std::vector<dsl::KernelArg> args;
};
// On the device all go to `stream` (the legacy default stream when null), whatever their options
// say; the interpreter ignores it.
inline void runInOrder(const std::vector<Launch>& launches, dsl::MemorySpace space, runtime::Stream* stream = nullptr) {
  for (const Launch& l : launches) {
    if (space == dsl::MemorySpace::Device) {
      dsl::LaunchOptions options = l.options;
      options.stream = stream;
      l.kernel->runArgs(options, l.args);
    } else {
      l.kernel->interpretArgs(l.options, l.args);
    }
  }
}

}  // namespace flextile::attention::tmpl
