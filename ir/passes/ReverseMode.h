#pragma once
#include <functional>
#include <vector>
#include "ir/Builder.h"
namespace flextile::ir {
struct ReverseModeRequest {
  std::vector<Op*> ops; Value* output; Value* seed; std::vector<Value*> wrt;
  std::function<bool(const Op& load)> isDifferentiableLoad;
  std::function<void(Builder&, const Op& load, Value* adjoint)> onLoadAdjoint;
};
inline std::vector<Value*> emitReverseMode(Builder&, const ReverseModeRequest&) { throw flextile::Error("TEMP stub"); }
}
namespace flextile::dsl {
inline Tile atomic_add(Operand, Operand, SourceLoc = SourceLoc::current()) { throw flextile::Error("TEMP"); }
inline Tile atomic_add(Operand, Operand, Operand, SourceLoc = SourceLoc::current()) { throw flextile::Error("TEMP"); }
}
