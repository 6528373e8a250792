// The tile IR: SSA values, operations with optional regions, blocks and
// functions. A Function owns every Value and Op in it.
//
// Structure:
//   Function  name, parameters (block args of the body), attributes
//     Block   arguments + an ordered list of Ops, ending in a terminator
//       Op    kind, operands, results, attributes, source location, regions
//
// Values have no use lists; passes that need uses compute them (the programs
// are small: an attention kernel is a few hundred ops).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ir/Layout.h"
#include "ir/Types.h"

namespace flextile {

// What kind of failure an Error is, for code that must react differently to
// different failures (the autotuner prunes a config that needs more shared
// memory than the GPU has and reports any other failure; the CLI treats an
// unknown name as a usage error). Set where the error is thrown; code never
// reads the kind from the message.
enum class ErrorKind : uint8_t {
  InvalidArgument,  // the caller's input is wrong: shapes, dtypes, values, what a mod returns, IR text
  UnknownName,      // a name that names nothing known: an attention variant
  Unsupported,      // well-formed, but FlexTile does not do it: a head dim, a strided device copy, a GPU
  ResourceLimit,    // the kernel needs more of the GPU than the target has: shared memory
  Compile,          // the compilers below FlexTile (LLVM, ptxas) failed or are missing
  Io,               // a file or folder could not be read or written
  Internal,         // a FlexTile bug: something that must hold did not
};
// "invalid argument", "resource limit", ...
const char* errorKindName(ErrorKind kind);

// Every compile-side error (tracing, verification, parsing, codegen) is a
// flextile::Error whose message names what is wrong and, where known, the
// user's source line. Failures of the CUDA driver are runtime::DriverError
// (runtime/ stands alone and has its own type).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, ErrorKind kind = ErrorKind::InvalidArgument)
      : std::runtime_error(message), kind_(kind) {}
  // A new message for `cause`, of its kind: what a wrapper that adds context throws.
  Error(const std::string& message, const Error& cause) : Error(message, cause.kind()) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace flextile

namespace flextile::ir {

enum class OpKind : uint16_t {
#define FT_OP(Enum, name, nops, nres, traits) Enum,
#include "ir/Ops.def"
};

enum OpTrait : uint32_t {
  kPure = 1u << 0,          // no side effects: CSE and DCE may touch it
  kElementwise = 1u << 1,   // same shape in and out, per element
  kCommutative = 1u << 2,
  kConstantLike = 1u << 3,
  kSideEffect = 1u << 4,
  kHasRegion = 1u << 5,
  kTerminator = 1u << 6,
  kFloatOnly = 1u << 7,
  kIntOnly = 1u << 8,
  // Element-wise arithmetic (FT_ARITHMETIC_OP in Ops.def): operands and result
  // of one dtype, the scalar semantics in ir/Elementwise.h.
  kArithmetic = 1u << 9,
  // An op of the memory/async level (docs/ir-reference.md §6): shared buffers, async copies and
  // their waits, barriers, proxy fences, wgmma waits. IR with one is laid out as written.
  kMemoryAsyncLevel = 1u << 10,
};

struct OpInfo {
  OpKind kind;
  std::string_view name;
  int numOperands;  // -1: variadic
  int numResults;   // -1: variadic
  uint32_t traits;
};
const OpInfo& opInfo(OpKind k);
std::optional<OpKind> parseOpKind(std::string_view name);
inline std::string_view opName(OpKind k) { return opInfo(k).name; }

// Where an op came from in the user's C++ source (file and line), if known.
struct Location {
  std::string file;
  int line = 0;
  bool known() const { return line > 0; }
  std::string str() const;  // "file.cpp:12" or ""
};

using Attr = std::variant<int64_t, double, std::string, std::vector<int64_t>>;
using Attrs = std::map<std::string, Attr>;
std::string attrString(const Attr& a);

class Op;
class Block;
class Function;

class Value {
 public:
  int id() const { return id_; }
  const Type& type() const { return type_; }
  void setType(Type t) { type_ = std::move(t); }
  Op* definingOp() const { return def_; }   // null for block arguments
  Block* ownerBlock() const { return block_; }  // set for block arguments
  int resultIndex() const { return index_; }
  const std::string& nameHint() const { return name_; }
  void setNameHint(std::string n) { name_ = std::move(n); }

 private:
  friend class Function;
  friend class Op;
  friend class Block;
  int id_ = 0;
  Type type_;
  Op* def_ = nullptr;
  Block* block_ = nullptr;
  int index_ = 0;
  std::string name_;
};

class Block {
 public:
  using OpList = std::list<std::unique_ptr<Op>>;
  const std::vector<Value*>& args() const { return args_; }
  Value* arg(size_t i) const { return args_.at(i); }
  OpList& ops() { return ops_; }
  const OpList& ops() const { return ops_; }
  Op* parentOp() const { return parent_; }
  Function* function() const { return func_; }
  Op* terminator() const;

  Value* addArg(Type t, std::string nameHint = "");
  // Inserts before `pos` (end() appends) and returns the op.
  Op* insert(OpList::iterator pos, std::unique_ptr<Op> op);
  Op* append(std::unique_ptr<Op> op) { return insert(ops_.end(), std::move(op)); }
  OpList::iterator find(const Op* op);
  void erase(const Op* op);

 private:
  friend class Function;
  friend class Op;
  std::vector<Value*> args_;
  OpList ops_;
  Op* parent_ = nullptr;
  Function* func_ = nullptr;
};

class Op {
 public:
  OpKind kind() const { return kind_; }
  const OpInfo& info() const { return opInfo(kind_); }
  std::string_view name() const { return opName(kind_); }
  bool hasTrait(OpTrait t) const { return (info().traits & t) != 0; }

  const std::vector<Value*>& operands() const { return operands_; }
  Value* operand(size_t i) const { return operands_.at(i); }
  size_t numOperands() const { return operands_.size(); }
  void setOperand(size_t i, Value* v) { operands_.at(i) = v; }
  void setOperands(std::vector<Value*> v) { operands_ = std::move(v); }
  void addOperand(Value* v) { operands_.push_back(v); }
  // Appends a fresh result (a pass that gives a loop one more carried value).
  Value* addResult(Type t);

  const std::vector<Value*>& results() const { return results_; }
  Value* result(size_t i = 0) const { return results_.at(i); }
  size_t numResults() const { return results_.size(); }

  Attrs& attrs() { return attrs_; }
  const Attrs& attrs() const { return attrs_; }
  bool hasAttr(const std::string& k) const { return attrs_.count(k) != 0; }
  int64_t intAttr(const std::string& k) const;
  double floatAttr(const std::string& k) const;  // accepts an int attr too
  const std::string& strAttr(const std::string& k) const;
  const std::vector<int64_t>& intsAttr(const std::string& k) const;
  void setAttr(const std::string& k, Attr v) { attrs_[k] = std::move(v); }

  std::vector<std::unique_ptr<Block>>& regions() { return regions_; }
  const std::vector<std::unique_ptr<Block>>& regions() const { return regions_; }
  Block& region(size_t i = 0) const { return *regions_.at(i); }
  Block* addRegion();

  const Location& loc() const { return loc_; }
  void setLoc(Location l) { loc_ = std::move(l); }
  Block* parentBlock() const { return parent_; }
  Function* function() const { return func_; }

  // "op 'add' (user.cpp:12)": how errors refer to this op.
  std::string describe() const;

 private:
  friend class Function;
  friend class Block;
  OpKind kind_ = OpKind::Return;
  std::vector<Value*> operands_;
  std::vector<Value*> results_;
  Attrs attrs_;
  std::vector<std::unique_ptr<Block>> regions_;
  Location loc_;
  Block* parent_ = nullptr;
  Function* func_ = nullptr;
};

// The attributes for an op that a pass inserts right before `at` to compute part of what `at`
// computes: `attrs` plus `at`'s warp-specialization role (its "ws" attribute, set by
// codegen/passes/WarpSpecialize.cpp), so the new op runs in every role that runs `at` and the
// verifier's producer slice still holds after a local rewrite.
Attrs withRoleOf(const Op& at, Attrs attrs);

// A kernel. Its parameters are the body block's arguments: pointers and
// scalars. Function-level attributes hold codegen facts such as num_warps and
// per-parameter specializations (e.g. "divisibility" of integer arguments).
class Function {
 public:
  explicit Function(std::string name);
  Function(const Function&) = delete;
  Function& operator=(const Function&) = delete;

  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }
  Block& body() { return body_; }
  const Block& body() const { return body_; }
  const std::vector<Value*>& params() const { return body_.args(); }
  Value* addParam(Type t, std::string nameHint = "") { return body_.addArg(std::move(t), std::move(nameHint)); }

  Attrs& attrs() { return attrs_; }
  const Attrs& attrs() const { return attrs_; }
  int64_t intAttrOr(const std::string& k, int64_t dflt) const;
  int numWarps() const { return int(intAttrOr("num_warps", 4)); }

  // Creates a detached op with fresh result values; insert it into a block.
  std::unique_ptr<Op> createOp(OpKind kind, std::vector<Value*> operands,
                               std::vector<Type> resultTypes, Attrs attrs = {}, Location loc = {});
  Value* newValue(Type t);

  // Replaces every use of `from` (in every op of the function) by `to`.
  void replaceAllUsesWith(Value* from, Value* to);
  // Whether any op of the function (regions included) takes `v` as an operand. A walk: for one-off
  // questions, not in a loop over the function's values.
  bool hasUses(const Value* v) const;
  // Calls f on every op, in order, descending into regions before moving on.
  void walk(const std::function<void(Op&)>& f);
  void walk(const std::function<void(const Op&)>& f) const;
  // A deep copy (same value ids, fresh objects).
  std::unique_ptr<Function> clone() const;
  int numValues() const { return int(values_.size()); }

 private:
  friend class Block;
  std::string name_;
  Block body_;
  Attrs attrs_;
  std::vector<std::unique_ptr<Value>> values_;
};

// The value a pointer tile is computed from through addptr and shape ops (splat, broadcast,
// expand_dims, reshape, trans): a function parameter, or null when another op computes it.
// Passes and templates use it to ask which buffer a load, store or atomic touches.
Value* pointerBase(Value* ptr);
inline const Value* pointerBase(const Value* ptr) { return pointerBase(const_cast<Value*>(ptr)); }

// The tensor box of a load or an atomic_add (ir/Ops.def, "load ... {tensor_rank = R}", "atomic_add
// ... {tensor_rank = R}"): the operands after (p, mask, other), or (p, value, mask), that name the
// same elements as one box of a rank-R tensor, so that a pass may copy the load with TMA, or add
// the tile with one TMA reduction. Absent (nullopt) on an op without the attribute.
struct TensorBox {
  Value* base = nullptr;        // scalar pointer: element (i0, .., iR-1) at base + sum i_k * strides_k
  std::vector<Value*> dims;     // R i32 scalars, outermost first
  std::vector<Value*> strides;  // R-1 i32 scalars, in elements (the last dim is contiguous)
  std::vector<Value*> coords;   // R i32 scalars: the box's first element
  size_t firstOperand = 3;      // base's operand index
};
std::optional<TensorBox> tensorBoxOf(const Op& op);
// The operands a load reads through, (p [, mask [, other]]), or an atomic_add adds through,
// (p, value [, mask]): all of them but a tensor box's.
size_t operandsBeforeBox(const Op& op);
// Whether `op` writes global memory through its pointer operand 0 (store, atomic_add,
// store_tagged): what a pass asks before it moves a load across the op or reads ahead of it.
bool writesGlobalMemory(const Op& op);
// The operand index of load_tagged's mask for its tile t (pointers, tag, then a mask per pointer
// or none), or 0 when it has no masks.
size_t loadTaggedMaskIndex(const Op& op, size_t t);
// The programs a launch of `f` groups into one thread block cluster along grid axis 0: the size of
// its cluster_all_gathers (all alike, ir::verify), else 1.
int64_t clusterSize(const Function& f);

// A module is what gets compiled together: one or more kernels.
struct Module {
  std::vector<std::unique_ptr<Function>> functions;
  Function* lookup(std::string_view name) const;
};

}  // namespace flextile::ir
