// Builder: creates ops at an insertion point with their result types
// inferred. It checks nothing about the user's intent: the DSL validates
// shapes and dtypes first (with the user's source line), and the verifier
// checks whatever the builder produced.
#pragma once

#include <functional>

#include "ir/IR.h"

namespace flextile::ir {

class Builder {
 public:
  explicit Builder(Function& f) : func_(&f), block_(&f.body()), pos_(f.body().ops().end()) {}

  Function& function() const { return *func_; }
  Block* block() const { return block_; }
  void setInsertionPointToEnd(Block* b) { block_ = b; pos_ = b->ops().end(); }
  void setInsertionPoint(Block* b, Block::OpList::iterator pos) { block_ = b; pos_ = pos; }
  // Inserts before `op`.
  void setInsertionPointBefore(Op* op);
  void setInsertionPointAfter(Op* op);
  void setLoc(Location l) { loc_ = std::move(l); }
  const Location& loc() const { return loc_; }

  // Generic creation at the insertion point.
  Op* create(OpKind kind, std::vector<Value*> operands, std::vector<Type> resultTypes, Attrs attrs = {});
  Value* create1(OpKind kind, std::vector<Value*> operands, Type resultType, Attrs attrs = {}) {
    return create(kind, std::move(operands), {std::move(resultType)}, std::move(attrs))->result();
  }

  Value* programId(int axis);
  Value* numPrograms(int axis);
  Value* constant(Type t, double value);   // ints are stored as int64 attrs
  Value* constantInt(Type t, int64_t value);
  Value* arange(int64_t start, int64_t end);
  Value* splat(Value* scalar, const Shape& shape);
  Value* broadcast(Value* x, const Shape& shape);
  Value* expandDims(Value* x, int axis);
  Value* reshape(Value* x, const Shape& shape);
  Value* trans(Value* x, const std::vector<int64_t>& perm);
  Value* unary(OpKind k, Value* x);
  Value* binary(OpKind k, Value* a, Value* b);  // a and b have equal types
  Value* cmp(std::string_view pred, Value* a, Value* b);
  Value* select(Value* c, Value* a, Value* b);
  Value* cast(Value* x, DType to);
  Value* addptr(Value* p, Value* offset);
  Value* load(Value* ptr, Value* mask = nullptr, Value* other = nullptr);
  // A load that also names its elements as a box of a tensor (ir/Ops.def: load {tensor_rank});
  // mask and other are required (other must be zero where the box leaves the tensor).
  Value* load(Value* ptr, Value* mask, Value* other, const TensorBox& box);
  void store(Value* ptr, Value* value, Value* mask = nullptr);
  // *ptr += value where mask, atomically; gives the old values.
  Value* atomicAdd(Value* ptr, Value* value, Value* mask = nullptr);
  // The same where the tile is also one box of a tensor (atomic_add {tensor_rank}); `mask` holds
  // exactly inside the tensor.
  Value* atomicAdd(Value* ptr, Value* value, Value* mask, const TensorBox& box);
  // The same with {order = "acq_rel"} (a scalar ticket that releases and acquires; ir/Ops.def).
  Value* atomicAddAcqRel(Value* ptr, Value* value);
  // Tagged words (ir/Ops.def): each element its f32 value and a 32-bit tag in one i64.
  void storeTagged(Value* ptr, Value* value, Value* tag, Value* mask = nullptr);
  Value* loadTagged(Value* ptr, Value* tag, Value* mask = nullptr);  // waits for the tag
  // Several tiles, one wait (masks: empty, or one per pointer).
  std::vector<Value*> loadTagged(const std::vector<Value*>& ptrs, Value* tag, const std::vector<Value*>& masks);
  // An acq_rel fence at GPU scope over the whole program (ir/Ops.def).
  void fence();
  void gridDependency(const std::string& kind);  // "wait" or "release" (ir/Ops.def)
  Value* globalTimer();                          // i64 nanoseconds (ir/Ops.def)
  Value* smId();                                 // i32 multiprocessor index (ir/Ops.def)
  // Every program of a cluster of `size` hands `values` to all of them: result i * size + r is
  // values[i] of the cluster's program r (ir/Ops.def cluster_all_gather); with `to`, only that rank
  // receives, and with `rows` > 0 only the tiles' first rows cross.
  std::vector<Value*> clusterAllGather(const std::vector<Value*>& values, int64_t size,
                                       std::optional<int64_t> to = std::nullopt, int64_t rows = 0);
  Value* reduce(Value* x, int axis, std::string_view kind);
  Value* dot(Value* a, Value* b, Value* acc);
  void ret();

  // for iv in [lb, ub) step: body(iv, carried) returns the next carried
  // values. Returns the loop's results (the final carried values).
  std::vector<Value*> forLoop(Value* lb, Value* ub, Value* step, std::vector<Value*> inits,
                              const std::function<std::vector<Value*>(Value* iv, std::vector<Value*> carried)>& body);

 private:
  Function* func_;
  Block* block_;
  Block::OpList::iterator pos_;
  Location loc_;
};

}  // namespace flextile::ir
