#include "dsl/Capture.h"

#include <climits>

#include "dsl/Kernel.h"

namespace flextile::dsl {

CaptureSlot::CaptureSlot(Tensor tensor, std::string name, CaptureOptions options)
    : tensor_(std::move(tensor)), name_(std::move(name)), options_(options) {
  if (!tensor_.defined()) throw Error("capture '" + name_ + "': cannot capture an empty Tensor");
  if (tensor_.rank() < 1 || tensor_.rank() > 4)
    throw Error("capture '" + name_ + "': captured tensors have rank 1 to 4, got " + tensor_.describe());
  if (options_.requires_grad && !ir::isFloat(tensor_.dtype()))
    throw Error("capture '" + name_ + "': requires_grad needs a float tensor (a gradient of integer data is "
                "meaningless), got " + tensor_.describe());
  dtype_ = tensor_.dtype();
  rank_ = tensor_.rank();
}

Tensor CaptureSlot::tensor() const {
  std::lock_guard lock(mutex_);
  return tensor_;
}

void CaptureSlot::rebind(Tensor tensor) {
  if (!tensor.defined()) throw Error("capture '" + name_ + "': cannot rebind to an empty Tensor");
  if (tensor.dtype() != dtype_ || tensor.rank() != rank_)
    throw Error("capture '" + name_ + "': rebind needs a " + std::string(ir::dtypeName(dtype_)) + " tensor of rank " +
                std::to_string(rank_) + " (kernels were traced for that), got " + tensor.describe());
  std::lock_guard lock(mutex_);
  tensor_ = std::move(tensor);
}

CapturedTensor::CapturedTensor(Tensor tensor, std::string name, CaptureOptions options)
    : slot_(std::make_shared<CaptureSlot>(std::move(tensor), std::move(name), options)) {}

CapturedTensor CapturedTensor::fromSlot(std::shared_ptr<CaptureSlot> slot) {
  if (!slot) throw Error("CapturedTensor::fromSlot: an empty slot");
  CapturedTensor c;
  c.slot_ = std::move(slot);
  return c;
}

CapturedTensor capture(Tensor tensor, std::string name, CaptureOptions options) {
  return CapturedTensor(std::move(tensor), std::move(name), options);
}

namespace {
const CaptureSlot& need(const std::shared_ptr<CaptureSlot>& s) {
  if (!s) throw Error("capture: use of an empty CapturedTensor (default-constructed, never assigned)");
  return *s;
}
}  // namespace

const std::string& CapturedTensor::name() const { return need(slot_).name(); }
DType CapturedTensor::dtype() const { return need(slot_).dtype(); }
int CapturedTensor::rank() const { return need(slot_).rank(); }
bool CapturedTensor::requiresGrad() const { return need(slot_).requiresGrad(); }
Tensor CapturedTensor::tensor() const { return need(slot_).tensor(); }
void CapturedTensor::rebind(Tensor tensor) const {
  need(slot_);
  slot_->rebind(std::move(tensor));
}

const CaptureParams& CapturedTensor::params(const SourceLoc& loc, const char* op) const {
  if (!slot_) traceError(loc, op, "use of an empty CapturedTensor (default-constructed, never assigned)");
  TraceContext& ctx = TraceContext::current(loc, op);
  for (const CaptureParams& p : ctx.captures())
    if (p.slot == slot_) return p;
  // First use in this trace: new parameters after everything made so far.
  ir::Function& f = ctx.function();
  CaptureParams p;
  p.slot = slot_;
  const std::string& n = slot_->name();
  p.data = f.addParam(ir::Type::pointer(slot_->dtype()), n);
  for (int d = 0; d < slot_->rank(); ++d) p.sizes.push_back(f.addParam(ir::Type(DType::I32), n + "_size" + std::to_string(d)));
  for (int d = 0; d < slot_->rank(); ++d)
    p.strides.push_back(f.addParam(ir::Type(DType::I32), n + "_stride" + std::to_string(d)));
  ctx.captures().push_back(std::move(p));
  return ctx.captures().back();
}

Tile CapturedTensor::operator()(Operand i0) const { return at({i0}, 0, i0.loc); }
Tile CapturedTensor::operator()(Operand i0, Operand i1) const { return at({i0, i1}, 0, i0.loc); }
Tile CapturedTensor::operator()(Operand i0, Operand i1, Operand i2) const { return at({i0, i1, i2}, 0, i0.loc); }
Tile CapturedTensor::operator()(Operand i0, Operand i1, Operand i2, Operand i3) const {
  return at({i0, i1, i2, i3}, 0, i0.loc);
}

Tile CapturedTensor::at(const std::vector<Operand>& index, double other, SourceLoc loc) const {
  const CaptureParams& p = params(loc, "captured tensor");
  const std::string what = "captured tensor '" + slot_->name() + "'";
  if (index.size() != p.sizes.size())
    traceError(loc, what.c_str(),
               "has rank " + std::to_string(p.sizes.size()) + " but " + std::to_string(index.size()) +
                   " indices were given");
  Tile offset, inside;
  for (size_t d = 0; d < index.size(); ++d) {
    Operand idx = index[d];
    idx.loc = loc;
    if (idx.isTile() && (!ir::isInteger(idx.tile().dtype()) || idx.tile().dtype() == DType::I1))
      traceError(loc, what.c_str(), "index " + std::to_string(d) + " must be an integer tile, got " + idx.tile().type().str());
    Tile i = idx.isTile() ? idx.tile() : scalar(double(std::get<int64_t>(idx.v)), DType::I32, loc);
    Tile size(p.sizes[d]), stride(p.strides[d]);
    Tile term = Operand(i, loc) * Operand(stride, loc);
    Tile ok = Operand(Operand(i, loc) >= Operand(0, loc), loc) & Operand(Operand(i, loc) < Operand(size, loc), loc);
    offset = offset.valid() ? Operand(offset, loc) + Operand(term, loc) : term;
    inside = inside.valid() ? Operand(inside, loc) & Operand(ok, loc) : ok;
  }
  Tile base(p.data);
  return load(Operand(base, loc) + Operand(offset, loc), Operand(inside, loc), Operand(other, loc), loc);
}

Tile CapturedTensor::size(int dim, SourceLoc loc) const {
  const CaptureParams& p = params(loc, "captured tensor size");
  if (dim < 0) dim += int(p.sizes.size());
  if (dim < 0 || dim >= int(p.sizes.size()))
    traceError(loc, "captured tensor size", "dimension out of range for '" + slot_->name() + "' of rank " +
                                                std::to_string(p.sizes.size()));
  return Tile(p.sizes[size_t(dim)]);
}

std::vector<KernelArg> captureArguments(const std::vector<std::shared_ptr<CaptureSlot>>& slots,
                                        std::optional<MemorySpace> space, const std::string& kernelName) {
  std::vector<KernelArg> args;
  for (const auto& slot : slots) {
    Tensor t = slot->tensor();
    auto fail = [&](const std::string& why) {
      throw Error("kernel '" + kernelName + "': captured tensor '" + slot->name() + "' (" + t.describe() + ") " + why);
    };
    if (space && t.space() != *space)
      fail(*space == MemorySpace::Device ? "is in host memory, but run() launches on the GPU (capture a device tensor)"
                                         : "is in device memory, but interpret() runs on the host (capture a host tensor)");
    int64_t reach = 1;
    for (int d = 0; d < t.rank(); ++d) {
      if (t.shape()[size_t(d)] > INT32_MAX || t.strides()[size_t(d)] > INT32_MAX) fail("is too large for i32 indexing");
      reach += (t.shape()[size_t(d)] - 1) * t.strides()[size_t(d)];
    }
    if (reach > INT32_MAX) fail("is too large for i32 indexing");
    args.push_back(KernelArg(t));
    for (int d = 0; d < t.rank(); ++d) args.push_back(KernelArg(int64_t(t.shape()[size_t(d)])));
    for (int d = 0; d < t.rank(); ++d) args.push_back(KernelArg(int64_t(t.strides()[size_t(d)])));
  }
  return args;
}

}  // namespace flextile::dsl
