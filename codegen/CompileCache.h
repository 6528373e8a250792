// The on-disk compile cache: compiled kernels (PTX, and the cubin when ptxas
// ran) persist across processes, so a program compiles a kernel once per
// machine, not once per run. dsl::Kernel keeps its in-memory cache above it.
//
// Where: $FLEXTILE_CACHE_DIR, else $XDG_CACHE_HOME/flextile, else
// $HOME/.cache/flextile; kernels live in its `kernels/` folder, one file per
// kernel. FLEXTILE_CACHE=0 turns the disk layer off (as does a dump request:
// FLEXTILE_DUMP=ir/passes/llvm/ptx wants to see the stages being produced).
//
// Key: the structural hash of the specialized IR (the traced program with its
// constants, num_warps, num_stages and argument divisibility), the target, and
// the compiler identity: FlexTile's version, LLVM's version and the build of
// libflextile itself (its size and modification time), so a rebuilt compiler
// never reads the kernels of another build. The whole key text is stored in
// the entry and compared on load; a file name clash is a miss, not a wrong hit.
//
// Driver cubins: the first launch of a kernel in a process JIT-compiles its PTX through the
// driver's linker and stores the cubin it made in the entry (CompiledKernel::driverCubins), tagged
// with runtime::Device::codeIdentity() — the GPU's name, compute capability and the driver's
// version. A later process on the same GPU and driver loads that cubin (milliseconds) instead of
// JIT-compiling (hundreds of milliseconds on an H200 for an attention kernel). Up to
// kMaxDriverCubins GPUs are kept per entry, newest first; another GPU or driver simply JITs and
// adds its own. A cubin the driver refuses falls back to the PTX with one warning and is replaced.
//
// Entries are written to a temporary file and renamed into place (readers
// never see half an entry; concurrent writers of one key both write the same
// bytes). An entry that does not parse or whose checksum fails gives one
// warning on stderr, is recompiled and overwritten; an intact entry that
// another build or entry format wrote is a miss, with one warning per cache.
// A folder that cannot be written (read-only, full) warns once and leaves
// the kernels in memory only (docs/reliability.md tests each case).
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>

#include "codegen/Compiler.h"

namespace flextile::codegen {

// "flextile 0.1.0; LLVM 22.1.8; build <size>-<mtime>", plus the settings
// that change the code (no fp fusion, skipped passes, FLEXTILE_WGMMA=0,
// FLEXTILE_WGMMA_SMEM_A=0, FLEXTILE_BULK_REDUCE=0, FLEXTILE_BULK_TENSOR=0): part of every key.
std::string compilerVersion();
// The environment switches that change the generated code and are read on
// every compile (FLEXTILE_WGMMA=0, FLEXTILE_WGMMA_SMEM_A=0, FLEXTILE_BULK_REDUCE=0,
// FLEXTILE_BULK_TENSOR=0) as text, "" at their defaults: part of compilerVersion(), and of the in-memory caches'
// keys (dsl::Kernel). The reference stays valid until this thread calls again.
const std::string& codegenSwitches();
// A number that stays the same while the process environment does and changes once it may have
// (per thread): setenv, unsetenv and putenv each leave an entry of `environ` pointing at another
// string or change their count, which this compares pointer by pointer (~3 instructions an entry,
// nothing allocated). What reads FLEXTILE_ switches on every launch keeps its answer under it. A
// string edited in place after putenv goes unseen.
uint64_t environmentGeneration();
// A value a thread keeps while the environment stays (what it read of the switches): `get` gives
// it emptied (T{}) once environmentGeneration() moved since the last call. Hold it thread_local.
template <class T>
class KeptWhileEnvironmentStays {
 public:
  T& get() {
    if (const uint64_t now = environmentGeneration(); now != readAt_) {
      value_ = T{};
      readAt_ = now;
    }
    return value_;
  }

 private:
  T value_{};
  uint64_t readAt_ = 0;
};

// The user's FlexTile cache folder (see above); nullopt when neither variable
// nor HOME is set.
std::optional<std::filesystem::path> userCacheDirectory();

struct CompileCacheKey {
  uint64_t irHash = 0;  // ir::structuralHash of the specialized function
  Target target;
  std::string compiler = compilerVersion();

  std::string text() const;      // every field, as stored in the entry
  std::string fileName() const;  // 16 hex digits of the hash of text(), ".ftk"
};

class CompileCache {
 public:
  struct Stats {
    // foreign: intact entries of another key or entry format (another compiler build), counted
    // in misses too.
    size_t hits = 0, misses = 0, corrupt = 0, foreign = 0, stores = 0, storeFailures = 0;
  };

  // A cache in `dir` (created on the first store). An empty path disables it.
  explicit CompileCache(std::filesystem::path dir);
  // The process-wide cache in userCacheDirectory()/kernels, or disabled when
  // FLEXTILE_CACHE=0 or there is no cache folder.
  static CompileCache& global();

  bool enabled() const { return !dir_.empty(); }
  const std::filesystem::path& directory() const { return dir_; }
  std::filesystem::path pathOf(const CompileCacheKey& key) const { return dir_ / key.fileName(); }

  // The stored kernel, or nullopt (absent, another key, or corrupt: then a
  // warning names the file).
  std::optional<CompiledKernel> load(const CompileCacheKey& key);
  // Writes the entry atomically; a failure (read-only folder, full disk) is a
  // warning, never an error: the cache is an optimization.
  void store(const CompileCacheKey& key, const CompiledKernel& kernel);

  // Adds `cubin` to the stored entry of `key` whose PTX is `ptx` (dsl::Kernel, after a JIT);
  // false when there is no such entry or the write failed (a warning, as for store).
  bool storeDriverCubin(const CompileCacheKey& key, const std::string& ptx, DriverCubin cubin);

  Stats stats() const;

 private:
  std::filesystem::path dir_;
  mutable std::mutex mutex_;
  Stats stats_;
  bool warnedStore_ = false;
  bool warnedForeign_ = false;
};

// compile() through `cache`: a hit returns the stored kernel (fromCache set,
// compileMs the time the lookup took); a miss compiles and stores. With
// options.runPtxas, an entry stored without ptxas output is completed and
// stored again.
CompiledKernel compileCached(const ir::Function& f, uint64_t irHash, const CompileOptions& options,
                             CompileCache& cache);

// Serialization of one entry (exposed for tests).
std::string serializeCompiledKernel(const CompileCacheKey& key, const CompiledKernel& kernel);
// Throws flextile::Error naming what is wrong; nullopt when the entry is
// intact but belongs to another key.
std::optional<CompiledKernel> parseCompiledKernel(const CompileCacheKey& key, std::string_view bytes);

}  // namespace flextile::codegen
