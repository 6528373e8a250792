// Runs one tile-IR function both on the GPU (codegen::compile, then the driver)
// and through the interpreter, on identical copies of the same inputs, so a
// test can compare the two element by element.
#pragma once

#include <cstring>
#include <variant>
#include <vector>

#include "codegen/Compiler.h"
#include "ir/IR.h"
#include "ir/Interpreter.h"
#include "runtime/Device.h"
#include "runtime/DeviceBuffer.h"
#include "runtime/Module.h"
#include "dsl/Kernel.h"

namespace flextile::testing {

using Bytes = std::vector<uint8_t>;
// One argument per function parameter: a buffer (initial contents; outputs
// should be poisoned by the caller), an integer or a real.
using IrArg = std::variant<Bytes, int64_t, double>;

struct BothRuns {
  std::vector<Bytes> gpu, interpreter;  // final buffer contents, one per buffer argument
  codegen::CompiledKernel code;
};

inline codegen::Target currentTarget() {
  auto& d = runtime::Device::current();
  return codegen::Target::fromCapability(d.capabilityMajor(), d.capabilityMinor());
}

inline BothRuns runBoth(const ir::Function& f, const std::vector<IrArg>& args, std::array<int64_t, 3> grid) {
  BothRuns out;
  out.code = codegen::compile(f, codegen::CompileOptions{currentTarget()});
  // GPU
  std::vector<runtime::DeviceBuffer> buffers;
  std::vector<uint64_t> slots(args.size());
  std::vector<void*> params(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const ir::Type& t = f.params()[i]->type();
    if (auto* b = std::get_if<Bytes>(&args[i])) {
      buffers.emplace_back(std::max<size_t>(b->size(), 1));
      buffers.back().copyFromHost(b->data(), b->size());
      slots[i] = buffers.back().address();
    } else if (auto* v = std::get_if<int64_t>(&args[i])) {
      if (t.dtype() == ir::DType::I32) {
        int32_t x = int32_t(*v);
        std::memcpy(&slots[i], &x, 4);
      } else {
        std::memcpy(&slots[i], v, 8);
      }
    } else {
      float x = float(std::get<double>(args[i]));
      std::memcpy(&slots[i], &x, 4);
    }
    params[i] = &slots[i];
  }
  // TMA tensor maps after the parameters (codegen/TensorMaps.h), encoded as dsl::Kernel does.
  std::vector<dsl::KernelArg> launchArgs;
  for (size_t i = 0, bi = 0; i < args.size(); ++i) {
    if (std::get_if<Bytes>(&args[i])) {
      launchArgs.push_back(dsl::KernelArg::deviceAddress(buffers[bi].address(), buffers[bi].bytes()));
      ++bi;
    } else if (auto* v = std::get_if<int64_t>(&args[i])) {
      launchArgs.push_back(dsl::KernelArg((long long)*v));
    } else {
      launchArgs.push_back(dsl::KernelArg(std::get<double>(args[i])));
    }
  }
  std::vector<runtime::TensorMap> maps;
  maps.reserve(out.code.tensorMaps.size());
  for (const auto& recipe : out.code.tensorMaps) {
    maps.push_back(dsl::encodeTensorMap(out.code.name, recipe, launchArgs));
    params.push_back(const_cast<void*>(maps.back().data()));
  }
  runtime::Module module(out.code.ptx, out.code.name);
  module.function(out.code.name)
      .launch({unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2])}, unsigned(out.code.threadsPerProgram()),
              unsigned(out.code.sharedBytes), params.data());
  runtime::synchronize();
  size_t bi = 0;
  for (const auto& a : args)
    if (auto* b = std::get_if<Bytes>(&a)) {
      out.gpu.emplace_back(b->size());
      buffers[bi++].copyToHost(out.gpu.back().data(), b->size());
    }
  // Interpreter on fresh copies.
  std::vector<Bytes> host;
  for (const auto& a : args)
    if (auto* b = std::get_if<Bytes>(&a)) host.push_back(*b);
  std::vector<ir::InterpArg> iargs;
  size_t hi = 0;
  for (const auto& a : args) {
    if (std::holds_alternative<Bytes>(a)) {
      iargs.push_back(ir::InterpArg::buffer(host[hi].data(), host[hi].size()));
      ++hi;
    } else if (auto* v = std::get_if<int64_t>(&a)) {
      iargs.push_back(ir::InterpArg::integer(*v));
    } else {
      iargs.push_back(ir::InterpArg::real(std::get<double>(a)));
    }
  }
  ir::interpret(f, iargs, grid);
  out.interpreter = std::move(host);
  return out;
}

}  // namespace flextile::testing
