#include "codegen/Target.h"

#include <array>

#include "ir/IR.h"

namespace flextile::codegen {

namespace {

constexpr uint32_t bit(Feature f) { return uint32_t(1) << unsigned(f); }

constexpr uint32_t kTuring = bit(Feature::Ldmatrix);
constexpr uint32_t kAmpere = kTuring | bit(Feature::MmaSync) | bit(Feature::CpAsync);
constexpr uint32_t kHopper =
    kAmpere | bit(Feature::TensorMemoryAccelerator) | bit(Feature::BulkReduce) | bit(Feature::GridDependencyControl) |
    bit(Feature::ThreadBlockClusters);
constexpr uint32_t kHopperArchSpecific = kHopper | bit(Feature::Wgmma) | bit(Feature::SetMaxNReg);

constexpr int64_t KiB = 1024;

// The figures are the CUDA C Programming Guide's "technical specifications per compute capability"
// (and cudaDeviceProp of those parts: sharedMemPerBlockOptin, sharedMemPerMultiprocessor,
// reservedSharedMemPerBlock). PTX ISA 8.0 for all: the least that sm_90a accepts, so the PTX loads
// on any driver of CUDA 12.0 or later; LLVM 22 emits up to PTX 9.0, and a lower version only widens
// the set of drivers that can JIT the result.
//
// sm_75 has no mma.sync of the shapes FlexTile uses (Turing's is m16n8k8 f16 only) and no cp.async:
// its dots run on FMAs, which is what the FMA path's tests compile for.
constexpr std::array kTargets{
    //                  name      cap  a      ptx  features             smem/block  smem/SM     rsv    regs/SM regs/thr thr/SM part
    TargetDescription{"sm_75", 75, false, 80, kTuring, 64 * KiB, 64 * KiB, 0, 65536, 255, 1024, {"T4", 40}},
    TargetDescription{"sm_80", 80, false, 80, kAmpere, 163 * KiB, 164 * KiB, 1 * KiB, 65536, 255, 2048, {"A100", 108}},
    TargetDescription{"sm_86", 86, false, 80, kAmpere, 99 * KiB, 100 * KiB, 1 * KiB, 65536, 255, 1536, {"A40", 84}},
    TargetDescription{"sm_89", 89, false, 80, kAmpere, 99 * KiB, 100 * KiB, 1 * KiB, 65536, 255, 1536, {"L40S", 142}},
    TargetDescription{"sm_90", 90, false, 80, kHopper, 227 * KiB, 228 * KiB, 1 * KiB, 65536, 255, 2048,
                      {"H100 SXM / H200", 132}},
    TargetDescription{"sm_90a", 90, true, 80, kHopperArchSpecific, 227 * KiB, 228 * KiB, 1 * KiB, 65536, 255, 2048,
                      {"H100 SXM / H200", 132}},
};

const TargetDescription* find(int capability, bool archSpecific) {
  for (const TargetDescription& d : kTargets)
    if (d.capability == capability && d.archSpecific == archSpecific) return &d;
  return nullptr;
}

}  // namespace

const char* featureName(Feature feature) {
  switch (feature) {
    case Feature::Ldmatrix: return "ldmatrix";
    case Feature::MmaSync: return "mma.sync";
    case Feature::CpAsync: return "cp.async";
    case Feature::TensorMemoryAccelerator: return "cp.async.bulk.tensor (TMA)";
    case Feature::BulkReduce: return "cp.reduce.async.bulk";
    case Feature::Wgmma: return "wgmma";
    case Feature::SetMaxNReg: return "setmaxnreg";
    case Feature::GridDependencyControl: return "griddepcontrol";
    case Feature::ThreadBlockClusters: return "thread block clusters";
  }
  return "?";
}

std::optional<MmaShape> TargetDescription::mmaSyncShape(int operandBits) const {
  if (!has(Feature::MmaSync)) return std::nullopt;
  if (operandBits == 16) return MmaShape{16, 8, 16};
  if (operandBits == 32) return MmaShape{16, 8, 8};  // tf32
  return std::nullopt;
}

bool TargetDescription::wgmmaTakesN(int64_t n) const { return has(Feature::Wgmma) && n >= 8 && n <= 256 && n % 8 == 0; }

std::optional<MmaShape> TargetDescription::wgmmaShape(int64_t n) const {
  if (!wgmmaTakesN(n)) return std::nullopt;
  return MmaShape{64, int(n), 16};
}

std::span<const TargetDescription> supportedTargets() { return kTargets; }

std::string supportedTargetNames() {
  std::string out;
  for (const TargetDescription& d : kTargets) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

Target Target::fromCapability(int major, int minor) {
  const int capability = major * 10 + minor;
  return Target{capability, find(capability, true) != nullptr};
}

std::optional<Target> Target::fromName(std::string_view name) {
  if (name.substr(0, 3) == "sm_") name.remove_prefix(3);
  for (const TargetDescription& d : kTargets)
    if (d.name.substr(3) == name) return Target{d.capability, d.archSpecific};
  return std::nullopt;
}

const TargetDescription& Target::description() const {
  if (const TargetDescription* d = find(capability, archSpecific)) return *d;
  throw Error("codegen: FlexTile has no description of target " + smName() + " (compute capability " +
                  std::to_string(capability / 10) + "." + std::to_string(capability % 10) +
                  "); it compiles for " + supportedTargetNames(),
              ErrorKind::Unsupported);
}

}  // namespace flextile::codegen
