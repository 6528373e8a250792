// The GPU a kernel is compiled for, and what that GPU has. Owned by codegen; no LLVM (or IR) types
// here so that every layer may name a target.
//
// A Target is a small value (compute capability and whether the architecture-specific "a" variant
// is meant); everything the compiler, the templates' defaults and the tuner need to know about the
// architecture is asked of its TargetDescription, one entry per architecture in Target.cpp's table.
// Supporting a new GPU (sm_100a, say) is one new entry there; no code compares capabilities.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace flextile::codegen {

// Instructions and hardware units FlexTile's code generation may use, by the PTX they need.
enum class Feature : uint8_t {
  Ldmatrix,    // ldmatrix(.trans).sync.aligned .x1/.x2/.x4 (sm_75)
  MmaSync,     // mma.sync.aligned m16n8k16 f16/bf16 and m16n8k8 tf32, f32 accumulators (sm_80)
  CpAsync,     // cp.async.ca/.cg with commit_group / wait_group (sm_80)
  TensorMemoryAccelerator,  // cp.async.bulk.tensor (TMA) and mbarrier expect_tx (sm_90)
  BulkReduce,  // cp.reduce.async.bulk from shared to global, bulk_group completion (sm_90)
  Wgmma,       // wgmma.mma_async m64nNk16 from shared memory (sm_90a)
  SetMaxNReg,  // setmaxnreg: warpgroup register reallocation (sm_90a)
  GridDependencyControl,  // griddepcontrol.wait / .launch_dependents: programmatic dependent launch (sm_90)
  ThreadBlockClusters,    // .reqnctapercluster, barrier.cluster, mapa and ld.shared::cluster (sm_90)
};
// "wgmma", for messages.
const char* featureName(Feature feature);

// One tensor-core instruction shape: M x N x K per instruction.
struct MmaShape {
  int m = 0, n = 0, k = 0;
  bool operator==(const MmaShape&) const = default;
};

// A GPU that one named part stands for when planning without the GPU at hand (a dry run, a plan for
// a target): the split heuristics need a number of SMs, nothing else does.
struct ReferencePart {
  std::string_view name;  // "H100 SXM / H200"
  int multiprocessors = 0;
};

struct TargetDescription {
  std::string_view name;  // "sm_90a": ptxas -arch, LLVM's NVPTX CPU and the PTX .target
  int capability = 0;     // major * 10 + minor
  bool archSpecific = false;
  int ptxVersion = 0;     // the PTX ISA the kernels declare: 80 = 8.0
  uint32_t features = 0;  // bit (1 << Feature)
  int64_t sharedBytesPerBlock = 0;          // the most one block may use, after opting in
  int64_t sharedBytesPerSm = 0;             // the SM's whole shared memory (the L1 carve-out at most)
  int64_t reservedSharedBytesPerBlock = 0;  // what the system takes of an SM's shared memory per resident block
  int registersPerSm = 0;                   // 32-bit registers
  int registersPerThread = 0;               // the most ptxas gives one thread
  int maxThreadsPerSm = 0;
  ReferencePart part;

  bool has(Feature f) const { return (features >> unsigned(f)) & 1u; }
  // mma.sync's shape for operands of `operandBits` (16: f16/bf16, 32: tf32), or nullopt without
  // Feature::MmaSync.
  std::optional<MmaShape> mmaSyncShape(int operandBits) const;
  // wgmma's shape for 16-bit operands (m64nNk16), or nullopt without Feature::Wgmma.
  std::optional<MmaShape> wgmmaShape(int64_t n) const;
  // Whether wgmma m64nNk16 takes this N (a multiple of 8 up to 256).
  bool wgmmaTakesN(int64_t n) const;
};

// Every architecture FlexTile compiles for, oldest first.
std::span<const TargetDescription> supportedTargets();
// "sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a", for messages.
std::string supportedTargetNames();

struct Target {
  int capability = 90;       // major * 10 + minor: 80, 86, 89, 90
  bool archSpecific = true;  // sm_90a rather than sm_90 (wgmma, setmaxnreg)

  static Target sm80() { return Target{80, false}; }
  static Target sm90a() { return Target{90, true}; }
  // The GPU of this capability at its most capable: the architecture-specific variant where the table
  // has one (9.0 -> sm_90a, whose code runs on that GPU only), else the plain one. Not checked here;
  // an unknown capability fails where its description is asked for.
  static Target fromCapability(int major, int minor);
  // "sm_90a", "sm_80", "90a", "86": one of supportedTargets(), or nullopt.
  static std::optional<Target> fromName(std::string_view name);

  // What the architecture has. Throws flextile::Error (ErrorKind::Unsupported) naming the target and
  // the supported ones when the table has no entry for it.
  const TargetDescription& description() const;
  bool has(Feature f) const { return description().has(f); }

  // "sm_80", "sm_90a": the name ptxas and LLVM's NVPTX backend use (spelled from the two fields, so
  // that an error about an unknown target can name it).
  std::string smName() const { return "sm_" + std::to_string(capability) + (archSpecific ? "a" : ""); }
  // Shared memory one block may use after opting in (bytes).
  int64_t maxSharedBytesPerBlock() const { return description().sharedBytesPerBlock; }
  int64_t sharedBytesPerSm() const { return description().sharedBytesPerSm; }
  bool operator==(const Target&) const = default;
};

}  // namespace flextile::codegen
