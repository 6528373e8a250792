// Captured tensors: data that a mod (or any traced helper) reads without
// being a parameter of the callable that reads it.
//
//   CapturedTensor docs = capture(docIds, "doc_ids");           // docIds: Tensor i32[B, L]
//   auto sameDoc = [docs](Tile b, Tile h, Tile q, Tile kv) { return docs(b, q) == docs(b, kv); };
//
// Using `docs` inside a kernel trace makes it extra parameters of whatever
// kernel is being traced — created on first use in that trace, appended after
// the kernel's own parameters: the data pointer, then the sizes and the
// strides (i32 each, in elements). So
//   * the IR never holds the tensor's values, addresses or sizes: new values
//     (or a new tensor bound with rebind()) never retrace or recompile, and
//     the kernel's identity (its structural hash) does not depend on them;
//   * Kernel::run / Kernel::interpret pass the captured tensors themselves,
//     after the arguments the caller gives: a device tensor to run, a host
//     tensor to interpret;
//   * a trace depends only on the dtype and rank, which a capture keeps for
//     life (rebind() checks them).
// Reading is bounds-safe: `docs(i, j)` loads the elements at the broadcast
// index tiles and gives `other` (0) where an index is outside [0, size) —
// attention templates call mods on whole tiles whose tail lanes lie past the
// sequence, and those lanes must not touch memory.
//
// A CapturedTensor is a handle: copies share one binding, so a mod copied
// into a kernel sees a later rebind().
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "dsl/Ops.h"
#include "dsl/Tensor.h"
#include "dsl/Tile.h"

namespace flextile::dsl {

class KernelArg;

// The binding behind CapturedTensor handles.
// How a tensor is captured.
struct CaptureOptions {
  // A trainable tensor: flex_attention_backward returns the gradient of the loss with respect to
  // it (f32, its shape), summed over every read of it in the score_mod. Float dtypes only.
  bool requires_grad = false;
};

class CaptureSlot {
 public:
  CaptureSlot(Tensor tensor, std::string name, CaptureOptions options = {});
  const std::string& name() const { return name_; }
  bool requiresGrad() const { return options_.requires_grad; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  Tensor tensor() const;
  void rebind(Tensor tensor);

 private:
  mutable std::mutex mutex_;
  Tensor tensor_;
  std::string name_;
  CaptureOptions options_;
  DType dtype_;
  int rank_;
};

class CapturedTensor {
 public:
  CapturedTensor() = default;
  CapturedTensor(Tensor tensor, std::string name, CaptureOptions options = {});
  // Another handle to an existing binding (a trace's Kernel::captures() lists slots).
  static CapturedTensor fromSlot(std::shared_ptr<CaptureSlot> slot);

  bool defined() const { return slot_ != nullptr; }
  const std::string& name() const;
  bool requiresGrad() const;
  DType dtype() const;
  int rank() const;
  Tensor tensor() const;  // the current binding
  // Binds another tensor of the same dtype and rank (sizes, strides and
  // memory may differ); kernels traced with this capture need no retrace.
  void rebind(Tensor tensor) const;
  const std::shared_ptr<CaptureSlot>& slot() const { return slot_; }

  // While tracing: elements at one index per dimension (tiles or numbers,
  // broadcast together); indices outside [0, size) read `other`.
  Tile operator()(Operand i0) const;
  Tile operator()(Operand i0, Operand i1) const;
  Tile operator()(Operand i0, Operand i1, Operand i2) const;
  Tile operator()(Operand i0, Operand i1, Operand i2, Operand i3) const;
  Tile at(const std::vector<Operand>& index, double other = 0, SourceLoc loc = SourceLoc::current()) const;
  // While tracing: size(dim) as an i32 scalar kernel parameter.
  Tile size(int dim, SourceLoc loc = SourceLoc::current()) const;

 private:
  const CaptureParams& params(const SourceLoc& loc, const char* op) const;
  std::shared_ptr<CaptureSlot> slot_;
};

// capture(tensor, name): a new capture of `tensor`; `name` appears in the
// IR's parameter names and in errors.
//   capture(bias, "bias", {.requires_grad = true})   // a trainable tensor (see CaptureOptions)
CapturedTensor capture(Tensor tensor, std::string name, CaptureOptions options = {});

// The launch arguments of a trace's captured tensors (data, sizes, strides
// each), for a launch on `space`. Throws, naming the capture, when a tensor
// is in the other memory space, has changed dtype or rank, or is too large
// for i32 indexing.
std::vector<KernelArg> captureArguments(const std::vector<std::shared_ptr<CaptureSlot>>& slots,
                                        std::optional<MemorySpace> space, const std::string& kernelName);
// How many kernel parameters one capture adds: 1 + 2 * rank.
inline size_t captureParamCount(const CaptureSlot& s) { return 1 + 2 * size_t(s.rank()); }

}  // namespace flextile::dsl
