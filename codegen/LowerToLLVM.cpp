#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include "codegen/LowerToLLVM.h"

#include <llvm/IR/InlineAsm.h>
#include <llvm/IR/IntrinsicsNVPTX.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include "codegen/LowerToLLVMImpl.h"
#include "codegen/TensorCores.h"
#include "codegen/AxisInfo.h"
#include "codegen/NVPTXTarget.h"
#include "codegen/Passes.h"
#include "codegen/SharedMemory.h"

#include <algorithm>

namespace flextile::codegen {

using ir::DType;
using ir::Layout;
using ir::OpKind;

Lowering::Lowering(const ir::Function& f, const Target& t, const LoweringPlan& p, llvm::LLVMContext& c)
    : func(f), target(t), plan(p), ctx(c), b(c) {}

// ---- types and values ------------------------------------------------------

llvm::Type* Lowering::llvmType(DType t) {
  switch (t) {
    case DType::I1: return b.getInt1Ty();
    case DType::I8: return b.getInt8Ty();
    case DType::I32: return b.getInt32Ty();
    case DType::I64: return b.getInt64Ty();
    case DType::F16: return b.getHalfTy();
    case DType::BF16: return b.getBFloatTy();
    case DType::F32: return b.getFloatTy();
    case DType::F64: return b.getDoubleTy();
    case DType::Ptr: return b.getPtrTy(1);
  }
  return nullptr;
}

llvm::Type* Lowering::memoryType(DType t) { return t == DType::I1 ? b.getInt8Ty() : llvmType(t); }

llvm::Type* Lowering::llvmType(const ir::Type& t) { return llvmType(t.dtype()); }

const Regs& Lowering::get(const ir::Value* v) const {
  auto it = values_.find(v);
  if (it == values_.end())
    throw Error("lowering: value %" + std::to_string(v->id()) + " is used before it is defined");
  return it->second;
}

void Lowering::set(const ir::Value* v, Regs regs) { values_[v] = std::move(regs); }

void Lowering::fail(const ir::Op& op, const std::string& what) const {
  throw Error("lowering " + op.describe() + " in kernel '" + func.name() + "': " + what);
}

const Layout& Lowering::layoutOf(const ir::Value* v, const ir::Op& user) const {
  const ir::Type& t = v->type();
  if (!t.hasLayout())
    fail(user, "tile " + t.str() + " has no layout (run layout assignment before lowering)");
  const Layout& l = *t.layout();
  if (l.shape() != t.shape())
    fail(user, "layout " + l.str() + " does not match the shape " + ir::shapeString(t.shape()));
  if (l.numWarps() != func.numWarps())
    fail(user, "layout " + l.str() + " is for " + std::to_string(l.numWarps()) + " warps but the kernel has num_warps=" +
                   std::to_string(func.numWarps()));
  return l;
}

// ---- thread coordinates ----------------------------------------------------

const std::vector<llvm::Value*>& Lowering::threadCoordinate(const Layout& l) {
  auto key = l.str();
  auto it = threadCoords_.find(key);
  if (it != threadCoords_.end()) return it->second;
  // Computed in the entry block so that it dominates every use.
  llvm::IRBuilder<> eb(entry->getTerminator());
  std::vector<llvm::Value*> coord;
  for (int d = 0; d < l.rank(); ++d) {
    llvm::Value* c = eb.getInt32(0);
    auto addBits = [&](llvm::Value* index, const Layout::Bases& bases) {
      for (size_t i = 0; i < bases.size(); ++i) {
        if (bases[i][d] == 0) continue;
        llvm::Value* bit = eb.CreateAnd(eb.CreateLShr(index, uint64_t(i)), 1);
        c = eb.CreateXor(c, eb.CreateMul(bit, eb.getInt32(uint32_t(bases[i][d]))));
      }
    };
    addBits(lane, l.laneBases());
    addBits(warp, l.warpBases());
    coord.push_back(c);
  }
  return threadCoords_.emplace(key, std::move(coord)).first->second;
}

std::vector<llvm::Value*> Lowering::coordinate(const Layout& l, int64_t reg) {
  const auto& thread = threadCoordinate(l);
  Layout::Coord rc = l.regCoord(reg);
  std::vector<llvm::Value*> out;
  for (int d = 0; d < l.rank(); ++d)
    out.push_back(rc[d] == 0 ? thread[d] : b.CreateXor(thread[d], i32(rc[d])));
  return out;
}

llvm::Value* Lowering::threadsWithBitsClear(uint32_t laneMask, uint32_t warpMask) {
  if (laneMask == 0 && warpMask == 0) return nullptr;
  std::string key = std::to_string(laneMask) + "/" + std::to_string(warpMask);
  if (auto it = ownerPreds_.find(key); it != ownerPreds_.end()) return it->second;
  llvm::IRBuilder<> eb(entry->getTerminator());
  llvm::Value* bits = eb.CreateOr(eb.CreateAnd(lane, laneMask), eb.CreateShl(eb.CreateAnd(warp, warpMask), 5));
  llvm::Value* p = eb.CreateICmpEQ(bits, eb.getInt32(0), "owner");
  ownerPreds_[key] = p;
  return p;
}

void Lowering::asmStatement(const std::string& text, const std::string& constraints,
                            const std::vector<llvm::Value*>& args) {
  std::vector<llvm::Type*> types;
  for (llvm::Value* a : args) types.push_back(a->getType());
  auto* ty = llvm::FunctionType::get(b.getVoidTy(), types, false);
  b.CreateCall(ty, llvm::InlineAsm::get(ty, text, constraints, /*hasSideEffects=*/true), args);
}

llvm::Value* Lowering::asmValue(llvm::Type* result, const std::string& text, const std::string& constraints,
                                const std::vector<llvm::Value*>& args) {
  std::vector<llvm::Type*> types;
  for (llvm::Value* a : args) types.push_back(a->getType());
  auto* ty = llvm::FunctionType::get(result, types, false);
  return b.CreateCall(ty, llvm::InlineAsm::get(ty, text, constraints, /*hasSideEffects=*/true), args);
}

llvm::Value* Lowering::flatIndex(const ir::Shape& shape, const std::vector<llvm::Value*>& coord) {
  llvm::Value* idx = i32(0);
  for (size_t d = 0; d < shape.size(); ++d) idx = b.CreateAdd(b.CreateMul(idx, i32(shape[d])), coord[d]);
  return idx;
}

// ---- f16/bf16 compute in f32 ----------------------------------------------

llvm::Value* Lowering::toCompute(llvm::Value* v, DType t) {
  return (t == DType::F16 || t == DType::BF16) ? b.CreateFPExt(v, b.getFloatTy()) : v;
}

llvm::Value* Lowering::fromCompute(llvm::Value* v, DType t) {
  return (t == DType::F16 || t == DType::BF16) ? b.CreateFPTrunc(v, llvmType(t)) : v;
}

llvm::Value* Lowering::combine(const std::string& kind, llvm::Value* x, llvm::Value* y, DType t) {
  if (ir::isFloat(t)) {
    llvm::Value* a = toCompute(x, t);
    llvm::Value* c = toCompute(y, t);
    llvm::Value* r = kind == "sum" ? b.CreateFAdd(a, c)
                     : kind == "max" ? b.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, a, c)
                                     : b.CreateBinaryIntrinsic(llvm::Intrinsic::minimum, a, c);
    return fromCompute(r, t);
  }
  if (kind == "sum") return b.CreateAdd(x, y);
  bool isBool = t == DType::I1;  // i1 is unsigned: max is or, min is and
  if (kind == "max") return b.CreateBinaryIntrinsic(isBool ? llvm::Intrinsic::umax : llvm::Intrinsic::smax, x, y);
  return b.CreateBinaryIntrinsic(isBool ? llvm::Intrinsic::umin : llvm::Intrinsic::smin, x, y);
}

// ---- register renamings ----------------------------------------------------

std::vector<int64_t> Lowering::registerRenaming(const Layout& from, const Layout& to,
                                                const std::function<Layout::Coord(const Layout::Coord&)>& coordMap) {
  // The maps used here (projection, dropping a unit dim, bit relabelling,
  // permutation) are linear over the coordinate bits, so the thread parts
  // agree iff every lane and warp basis maps onto the operand's.
  if (to.laneBases().size() != from.laneBases().size() || to.warpBases().size() != from.warpBases().size()) return {};
  for (size_t i = 0; i < to.laneBases().size(); ++i)
    if (coordMap(to.laneBases()[i]) != from.laneBases()[i]) return {};
  for (size_t i = 0; i < to.warpBases().size(); ++i)
    if (coordMap(to.warpBases()[i]) != from.warpBases()[i]) return {};
  std::vector<int64_t> map(size_t(to.numRegisters()));
  for (int64_t r = 0; r < to.numRegisters(); ++r) {
    map[size_t(r)] = from.registerOf(coordMap(to.regCoord(r)));
    if (map[size_t(r)] < 0) return {};
  }
  return map;
}

// ---- shape ops -------------------------------------------------------------

namespace {

int64_t flattenCoord(const ir::Shape& s, const Layout::Coord& c) {
  int64_t idx = 0;
  for (size_t d = 0; d < s.size(); ++d) idx = idx * s[d] + c[d];
  return idx;
}

Layout::Coord unflattenCoord(const ir::Shape& s, int64_t idx) {
  Layout::Coord c(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    c[d] = idx % s[d];
    idx /= s[d];
  }
  return c;
}

}  // namespace

void Lowering::lowerShapeOp(const ir::Op& op) {
  const ir::Value* res = op.result();
  const ir::Type& rt = res->type();
  const size_t n = rt.isTile() ? size_t(layoutOf(res, op).numRegisters()) : 1;

  switch (op.kind()) {
    case OpKind::Constant: {
      llvm::Type* ty = llvmType(rt);
      llvm::Value* c = nullptr;
      if (ir::isFloat(rt.dtype())) {
        c = llvm::ConstantFP::get(ty, op.floatAttr("value"));
      } else if (ir::isInteger(rt.dtype())) {
        const auto& a = op.attrs().at("value");
        int64_t v = std::holds_alternative<int64_t>(a) ? std::get<int64_t>(a) : int64_t(op.floatAttr("value"));
        c = llvm::ConstantInt::get(ty, uint64_t(v), /*isSigned=*/true);
      } else {
        fail(op, "constants of type " + rt.str() + " are not supported");
      }
      set(res, Regs(n, c));
      return;
    }
    case OpKind::Arange: {
      if (!rt.isTile() || rt.rank() != 1) fail(op, "arange must produce a 1-d tile, got " + rt.str());
      const Layout& l = layoutOf(res, op);
      int64_t start = op.intAttr("start");
      set(res, mapRegs(n, [&](size_t r) { return b.CreateAdd(coordinate(l, int64_t(r))[0], i32(start)); }));
      return;
    }
    case OpKind::Splat: {
      const ir::Value* s = op.operand(0);
      if (!s->type().isScalar()) fail(op, "splat operand must be a scalar, got " + s->type().str());
      set(res, Regs(n, get(s)[0]));
      return;
    }
    default: break;
  }

  // broadcast, expand_dims, reshape, trans: renamings of registers.
  const ir::Value* x = op.operand(0);
  const Regs& xs = get(x);
  if (x->type().isScalar()) {  // e.g. expand_dims of a scalar: every element is that scalar
    set(res, Regs(n, xs[0]));
    return;
  }
  const Layout& from = layoutOf(x, op);
  if (rt.isScalar()) {  // reshape of a one-element tile to a scalar: every thread holds it
    if (x->type().numElements() != 1) fail(op, "cannot reshape " + x->type().str() + " to a scalar");
    set(res, {xs[0]});
    return;
  }
  const Layout& to = layoutOf(res, op);
  const ir::Shape& xShape = x->type().shape();
  std::function<Layout::Coord(const Layout::Coord&)> coordMap;
  switch (op.kind()) {
    case OpKind::Broadcast:
      if (x->type().rank() != rt.rank())
        fail(op, "broadcast from " + x->type().str() + " to " + rt.str() + " changes the rank");
      coordMap = [&](const Layout::Coord& c) {
        Layout::Coord o = c;
        for (size_t d = 0; d < o.size(); ++d)
          if (xShape[d] == 1) o[d] = 0;
        return o;
      };
      break;
    case OpKind::ExpandDims: {
      int64_t axis = op.intAttr("axis");
      coordMap = [axis](const Layout::Coord& c) {
        Layout::Coord o = c;
        o.erase(o.begin() + axis);
        return o;
      };
      break;
    }
    case OpKind::Reshape:
      if (x->type().numElements() != rt.numElements())
        fail(op, "reshape from " + x->type().str() + " to " + rt.str() + " changes the element count");
      coordMap = [&](const Layout::Coord& c) { return unflattenCoord(xShape, flattenCoord(rt.shape(), c)); };
      break;
    case OpKind::Trans: {
      const auto& perm = op.intsAttr("perm");
      coordMap = [perm](const Layout::Coord& c) {
        Layout::Coord o(c.size());
        for (size_t i = 0; i < perm.size(); ++i) o[size_t(perm[i])] = c[i];
        return o;
      };
      break;
    }
    default: fail(op, "not a shape op");
  }
  std::vector<int64_t> map = registerRenaming(from, to, coordMap);
  if (map.empty())
    fail(op, "result layout " + to.str() + " is not a register renaming of the operand layout " + from.str() +
                 " (layout assignment must make " + std::string(op.name()) + " register-local)");
  set(res, mapRegs(n, [&](size_t r) { return xs[size_t(map[r])]; }));
}

// ---- driver ----------------------------------------------------------------

void Lowering::lowerOp(const ir::Op& op) {
  if (clusterWaitPending && clusterWaitNeededBefore(op)) {
    clusterWait();
    clusterWaitPending = false;
  }
  switch (op.kind()) {
    case OpKind::ProgramId:
    case OpKind::NumPrograms: {
      static const llvm::Intrinsic::ID ids[2][3] = {
          {llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_y,
           llvm::Intrinsic::nvvm_read_ptx_sreg_ctaid_z},
          {llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_x, llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_y,
           llvm::Intrinsic::nvvm_read_ptx_sreg_nctaid_z}};
      int64_t axis = op.intAttr("axis");
      if (axis < 0 || axis > 2) fail(op, "grid axis " + std::to_string(axis) + " is not 0, 1 or 2");
      set(op.result(), {b.CreateIntrinsic(ids[op.kind() == OpKind::NumPrograms][axis], llvm::ArrayRef<llvm::Value*>{})});
      return;
    }
    case OpKind::Constant:
    case OpKind::Arange:
    case OpKind::Splat:
    case OpKind::Broadcast:
    case OpKind::ExpandDims:
    case OpKind::Reshape:
    case OpKind::Trans:
      if (op.kind() == OpKind::Trans && get(op.operand(0)).empty()) {
        set(op.result(), {});  // a wgmma operand: read from shared memory by the dot (TensorCores.h)
        return;
      }
      lowerShapeOp(op);
      return;
#define FT_OP(Enum, name, nops, nres, traits)
#define FT_ARITHMETIC_OP(Enum, name, nops, traits) case OpKind::Enum:
#include "ir/Ops.def"
    case OpKind::Cmp:
    case OpKind::Select:
    case OpKind::Cast:
    case OpKind::AddPtr: lowerElementwise(op); return;
    case OpKind::Load: lowerLoad(op); return;
    case OpKind::Store: lowerStore(op); return;
    case OpKind::AtomicAdd: lowerAtomicAdd(op); return;
    case OpKind::StoreTagged: lowerStoreTagged(op); return;
    case OpKind::LoadTagged: lowerLoadTagged(op); return;
    case OpKind::Fence: lowerFence(op); return;
    case OpKind::GridDependency: lowerGridDependency(op); return;
    case OpKind::GlobalTimer:
      // Volatile asm with a memory clobber: never merged, hoisted or moved across memory accesses.
      set(op.result(), {asmValue(b.getInt64Ty(), "mov.u64 $0, %globaltimer;", "=l,~{memory}")});
      return;
    case OpKind::SmId:
      // Volatile like global_timer's read: a program may move between SMs (preemption), so two
      // reads are two instructions.
      set(op.result(), {asmValue(b.getInt32Ty(), "mov.u32 $0, %smid;", "=r,~{memory}")});
      return;
    case OpKind::ClusterAllGather: lowerClusterAllGather(op); return;
    case OpKind::Reduce: lowerReduce(op); return;
    case OpKind::Dot: lowerDot(op); return;
    case OpKind::For: lowerFor(op); return;
    case OpKind::Yield: return;  // read by lowerFor
    case OpKind::Return: returnFromKernel(); return;
    case OpKind::ConvertLayout: lowerConvertLayout(op); return;
    case OpKind::LocalAlloc:
    case OpKind::AsyncCopy:
    case OpKind::AsyncCommit:
    case OpKind::AsyncWait:
    case OpKind::LocalLoad:
    case OpKind::LocalStore:
    case OpKind::Barrier:
    case OpKind::FenceAsyncShared:
    case OpKind::MbarrierInit:
    case OpKind::MbarrierArrive:
    case OpKind::AsyncCopyArrive:
    case OpKind::MbarrierWait:
    case OpKind::MbarrierInval:
    case OpKind::MbarrierExpectTx:
    case OpKind::TmaCopy:
    case OpKind::WarpgroupTurn: lowerAsyncOp(op); return;
    case OpKind::WgmmaWait: lowerWgmmaWait(op); return;
  }
  fail(op, "unknown op");
}

bool Lowering::runsInThisRole(const ir::Op& op) const {
  if (!specialized) return true;
  const WarpRole role = warpRole(op);
  if (role == WarpRole::All) return false;  // lowered once, before the roles part (lowerSpecialized)
  return producerRole ? role != WarpRole::Consumer : role != WarpRole::Producer;
}

void Lowering::lowerBlock(const ir::Block& block) {
  for (const auto& op : block.ops()) {
    if (!runsInThisRole(*op)) continue;
    try {
      lowerOp(*op);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {  // an internal mistake: say where it happened
      throw Error("lowering " + op->describe() + ": internal error: " + e.what(), ErrorKind::Internal);
    }
  }
}

std::unique_ptr<llvm::Module> Lowering::run() {
  module = std::make_unique<llvm::Module>(func.name(), ctx);
  module->setTargetTriple(llvm::Triple("nvptx64-nvidia-cuda"));

  // Kernel ABI (codegen/Compiler.h): pointers are global addresses, f16/bf16
  // scalars arrive as f32. Pointer parameters are not noalias: a kernel may
  // be given overlapping tensors (in-place updates).
  std::vector<llvm::Type*> paramTypes;
  for (const ir::Value* p : func.params()) {
    const ir::Type& t = p->type();
    if (!t.isScalar())
      throw Error("lowering kernel '" + func.name() + "': parameter %" + std::to_string(p->id()) + " of type " +
                  t.str() + " is a tile; kernel parameters are scalars or pointers");
    switch (t.dtype()) {
      case DType::Ptr: paramTypes.push_back(b.getPtrTy(1)); break;
      case DType::I32: paramTypes.push_back(b.getInt32Ty()); break;
      case DType::I64: paramTypes.push_back(b.getInt64Ty()); break;
      case DType::F16:
      case DType::BF16:
      case DType::F32: paramTypes.push_back(b.getFloatTy()); break;
      case DType::F64: paramTypes.push_back(b.getDoubleTy()); break;
      default:
        throw Error("lowering kernel '" + func.name() + "': parameter %" + std::to_string(p->id()) + " has type " +
                    t.str() + ", which the kernel ABI does not pass (use i32)");
    }
  }
  // The TMA copies' tensor maps follow, each a 128-byte grid constant (TensorMaps.h).
  tensorMaps_ = tensorMapRecipes(func);
  if (!tensorMaps_.empty() && !target.has(Feature::TensorMemoryAccelerator))
    throw Error("lowering kernel '" + func.name() + "': it has TMA copies, which " + target.smName() + " does not have");
  auto* mapType = llvm::ArrayType::get(b.getInt8Ty(), 128);
  for (size_t i = 0; i < tensorMaps_.size(); ++i) paramTypes.push_back(b.getPtrTy(0));
  auto* fnTy = llvm::FunctionType::get(b.getVoidTy(), paramTypes, false);
  kernel = llvm::Function::Create(fnTy, llvm::GlobalValue::ExternalLinkage, func.name(), module.get());
  for (size_t i = 0; i < tensorMaps_.size(); ++i) {
    const unsigned a = unsigned(func.params().size() + i);
    kernel->addParamAttr(a, llvm::Attribute::getWithByValType(ctx, mapType));
    kernel->addParamAttr(a, llvm::Attribute::getWithAlignment(ctx, llvm::Align(64)));
    kernel->addParamAttr(a, llvm::Attribute::get(ctx, "nvvm.grid_constant"));
    kernel->getArg(a)->setName("tensor_map" + std::to_string(i));
    tensorMapArgs_.push_back(kernel->getArg(a));
  }
  kernel->setCallingConv(llvm::CallingConv::PTX_Kernel);
  const int producers = producerWarps(func);
  specialized = producers > 0;
  func.walk([&](const ir::Op& op) {
    bulkReductions = bulkReductions || (op.kind() == OpKind::AtomicAdd && addsInBulk(op));
  });
  const int threads = 32 * (func.numWarps() + producers);
  kernel->addFnAttr("nvvm.maxntid", std::to_string(threads));
  // A residency the template sized its shared memory for: without it the driver's JIT may take
  // registers that leave fewer programs per SM than the shared memory allows. A warp-specialized
  // program states it always (one by default), so that ptxas caps the registers that setmaxnreg
  // then moves from the producer to the consumers.
  const int64_t programs = func.intAttrOr("min_programs_per_sm", 0);
  if (programs > 0 || specialized) kernel->addFnAttr("nvvm.minctasm", std::to_string(std::max<int64_t>(1, programs)));
  kernel->addFnAttr(llvm::Attribute::NoUnwind);
  // A kernel that gathers across a cluster declares its cluster shape (.explicitcluster
  // .reqnctapercluster): the driver then launches it in clusters without a launch attribute and
  // refuses a grid that does not divide.
  if (const int64_t cluster = ir::clusterSize(func); cluster > 1)
    kernel->addFnAttr("nvvm.cluster_dim", std::to_string(cluster) + ",1,1");

  // Dynamic shared memory: one extern array, sized at launch.
  sharedBase = new llvm::GlobalVariable(*module, llvm::ArrayType::get(b.getInt8Ty(), 0), false,
                                        llvm::GlobalValue::ExternalLinkage, nullptr, "global_smem", nullptr,
                                        llvm::GlobalValue::NotThreadLocal, 3);
  sharedBase->setAlignment(llvm::Align(1024));  // see SharedMemory.cpp: swizzles by absolute address

  entry = llvm::BasicBlock::Create(ctx, "entry", kernel);
  auto* body = llvm::BasicBlock::Create(ctx, "body", kernel);
  b.SetInsertPoint(entry);
  tid = b.CreateIntrinsic(llvm::Intrinsic::nvvm_read_ptx_sreg_tid_x, llvm::ArrayRef<llvm::Value*>{}, nullptr, "tid");
  lane = b.CreateAnd(tid, 31, "lane");
  warp = b.CreateLShr(tid, 5, "warp");
  for (size_t i = 0; i < func.params().size(); ++i) {
    const ir::Value* p = func.params()[i];
    llvm::Value* a = kernel->getArg(unsigned(i));
    a->setName(p->nameHint().empty() ? "arg" + std::to_string(i) : p->nameHint());
    DType t = p->type().dtype();
    if (t == DType::F16 || t == DType::BF16) a = b.CreateFPTrunc(a, llvmType(t));
    set(p, {a});
  }
  b.CreateBr(body);
  b.SetInsertPoint(body);

  // The local_loads that wgmma reads through descriptors: B slots, and A tiles all of whose
  // readers are wgmma dots taking them as A in the layout wgmma reads (TensorCores.h).
  std::map<const ir::Op*, bool> onlyWgmmaA;  // per local_load read by some op: every reader is such a dot
  func.walk([&](const ir::Op& op) {
    const bool wgmma = op.kind() == OpKind::Dot && [&] {
      auto w = wgmmaPlan(op, target);
      if (w && w->load->kind() == OpKind::LocalLoad) localLoadsReadByWgmma_.insert(w->load);
      return w.has_value();
    }();
    // A trans of a local_load counts as its reader only through the dot that reads it M-major.
    if (op.kind() == OpKind::Trans) return;
    for (size_t i = 0; i < op.numOperands(); ++i) {
      const std::optional<WgmmaResidentAView> view = wgmmaResidentAView(op.operand(i));
      const ir::Op* d = view ? view->load : op.operand(i)->definingOp();
      if (d && d->kind() == OpKind::LocalLoad) {
        const bool asA = wgmma && i == 0 && view.has_value();
        auto [it, fresh] = onlyWgmmaA.emplace(d, asA);
        if (!fresh) it->second = it->second && asA;
      } else if (const ir::Op* t = op.operand(i)->definingOp(); t && t->kind() == OpKind::Trans) {
        // A trans of a local_load that this op reads otherwise: the load needs its registers.
        if (const ir::Op* l = t->operand(0)->definingOp(); l && l->kind() == OpKind::LocalLoad) onlyWgmmaA[l] = false;
      }
    }
  });
  for (const auto& [load, onlyA] : onlyWgmmaA)
    if (onlyA) localLoadsReadByWgmma_.insert(load);
  if (!specialized) {
    lowerBlock(func.body());
    if (!b.GetInsertBlock()->getTerminator()) returnFromKernel();
  } else {
    lowerSpecialized(std::max<int64_t>(1, programs));
  }

  std::string err;
  llvm::raw_string_ostream os(err);
  if (llvm::verifyModule(*module, &os))
    throw Error("lowering kernel '" + func.name() + "' produced invalid LLVM IR: " + err, ErrorKind::Internal);
  return std::move(module);
}

// A warp-specialized program (codegen/passes/WarpSpecialize.cpp): warps 0 .. num_warps-1 run the
// consumers' copy of the body, the producer warpgroup after them the producer's, each behind one
// branch on the thread index. Both copies start from the parameters and the entry block's thread
// coordinates; no value crosses from one copy to the other. The issuer ops (threadsWithBitsClear
// of lane and of the warp bits below num_warps, a power of two) thus run on thread 0 in the
// consumers' copy and on the producer's first thread, thread num_warps * 32, in the producer's.
//
// Registers: ptxas caps the launch at L = 65536 / (programs * threads) per thread (a multiple of 8).
// Below 256, the producer gives its registers back (setmaxnreg.dec to 24) and the consumers take
// them (setmaxnreg.inc to L + (L - 24) * producer threads / consumer threads): one program of 8
// consumer warps gets 240, two of 4 get 232. The same registers move, so the inc never waits.
RegisterSplit registerSplit(int consumerWarps, int producerWarps, int64_t programsPerSm, int producerRegisters) {
  const int64_t threads = 32 * int64_t(consumerWarps + producerWarps);
  const int64_t launch = 65536 / (std::max<int64_t>(1, programsPerSm) * threads) / 8 * 8;
  if (launch >= 256) return {};
  if (producerRegisters < 24 || producerRegisters % 8 != 0 || producerRegisters >= launch)
    throw Error("producer_registers must be a multiple of 8 from 24 to below the launch's " + std::to_string(launch) +
                " registers a thread (" + std::to_string(consumerWarps + producerWarps) + " warps, " +
                std::to_string(programsPerSm) + " programs per SM), got " + std::to_string(producerRegisters));
  RegisterSplit split;
  split.launch = int(launch);
  split.producer = producerRegisters;
  split.consumer = int(std::min<int64_t>(
      256, (launch + (launch - producerRegisters) * producerWarps / consumerWarps) / 8 * 8));
  return split;
}

int producerRegisters(const ir::Function& f) {
  if (const char* e = std::getenv("FLEXTILE_PRODUCER_REGISTERS"); e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end != 0) throw Error(std::string("FLEXTILE_PRODUCER_REGISTERS must be a number, got '") + e + "'");
    return int(v);
  }
  return int(f.intAttrOr("producer_registers", 24));
}

void Lowering::lowerSpecialized(int64_t programsPerSm) {
  RegisterSplit split;
  try {
    split = registerSplit(func.numWarps(), producerWarps(func), programsPerSm, producerRegisters(func));
  } catch (const Error& e) {
    throw Error("function '" + func.name() + "': " + e.what());
  }
  // The common prefix (ws = "all": the rings' barriers, their inits by thread 0 and a barrier):
  // one instruction stream for every thread, so its barrier is the aligned bar.sync 0.
  for (const auto& op : func.body().ops()) {
    if (!op->hasAttr("ws") || warpRole(*op) != WarpRole::All) continue;
    if (op->kind() == ir::OpKind::Barrier)
      b.CreateIntrinsic(llvm::Intrinsic::nvvm_barrier_cta_sync_aligned_all, llvm::ArrayRef<llvm::Value*>{i32(0)});
    else
      lowerOp(*op);
  }
  auto* consumers = llvm::BasicBlock::Create(ctx, "consumers", kernel);
  auto* producer = llvm::BasicBlock::Create(ctx, "producer", kernel);
  // The warp index taken from lane 0 (shfl.sync.idx): ptxas then knows the branch is the same for
  // every thread of a warp, so the wgmma and barriers behind it stay warp-uniform code (CUTLASS
  // does the same with its warpgroup index).
  llvm::Value* uniformWarp = b.CreateIntrinsic(llvm::Intrinsic::nvvm_shfl_sync_idx_i32,
                                               {b.getInt32(0xffffffffu), warp, i32(0), i32(31)});
  b.CreateCondBr(b.CreateICmpULT(uniformWarp, i32(func.numWarps())), consumers, producer);
  const auto parameters = values_;
  for (bool producing : {false, true}) {
    producerRole = producing;
    values_ = parameters;
    b.SetInsertPoint(producing ? producer : consumers);
    if (split.launch > 0)
      asmStatement(std::string("setmaxnreg.") + (producing ? "dec" : "inc") + ".sync.aligned.u32 " +
                   std::to_string(producing ? split.producer : split.consumer) + ";");
    lowerBlock(func.body());
    if (!b.GetInsertBlock()->getTerminator()) returnFromKernel();
  }
  producerRole = false;
}

// ---- plan helpers ----------------------------------------------------------

LoweringPlan planLowering(const ir::Function& f) {
  LoweringPlan plan;
  SharedPlan shared = planSharedMemory(f);
  for (const auto& [op, offset] : shared.offset) plan.scratchOffset[op] = offset;
  plan.sharedBytes = shared.totalBytes;
  AxisInfoAnalysis axis(f);
  f.walk([&](const ir::Op& op) {
    if ((op.kind() == OpKind::Load || op.kind() == OpKind::Store) && op.operand(0)->type().isTile())
      plan.vectorWidth[&op] = int(memoryAccessWidth(op, axis).width);
    if (op.kind() == OpKind::AtomicAdd && addsRowsInBulk(op))
      if (std::string why = bulkReduceRefusal(op, axis); !why.empty())
        throw Error(op.describe() + ": has bulk_rows = 1, but " + why);
  });
  return plan;
}

int64_t Lowering::scratchOffset(const ir::Op& op, int64_t needed) {
  auto it = plan.scratchOffset.find(&op);
  if (it == plan.scratchOffset.end()) fail(op, "the shared-memory plan has no scratch for this op");
  if (it->second < 0 || it->second + needed > plan.sharedBytes)
    fail(op, "the shared-memory plan gives scratch at byte " + std::to_string(it->second) + " of " +
                 std::to_string(plan.sharedBytes) + " but the op needs " + std::to_string(needed) + " bytes");
  return it->second;
}

LoweredKernel lowerAndEmit(const ir::Function& f, const Target& target, const LoweringPlan& plan) {
  NVPTXTarget nvptx(target);
  llvm::LLVMContext ctx;
  std::unique_ptr<llvm::Module> module = lowerToLLVM(f, target, plan, ctx);
  nvptx.optimize(*module);
  LoweredKernel out;
  llvm::raw_string_ostream os(out.llvmIR);
  module->print(os, nullptr);
  out.ptx = nvptx.emitPTX(*module, {.keepBlockOrder = hasWgmmaDots(f, target)});
  return out;
}

std::unique_ptr<llvm::Module> lowerToLLVM(const ir::Function& f, const Target& target, const LoweringPlan& plan,
                                          llvm::LLVMContext& ctx) {
  Lowering lowering(f, target, plan, ctx);
  return lowering.run();
}

}  // namespace flextile::codegen
