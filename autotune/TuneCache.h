// The per-GPU cache of tuned configs: one JSON file per GPU under the user's
// cache folder (codegen::userCacheDirectory()/autotune/<gpu>-sm<cc>.json).
//
// An entry is keyed by everything that changes the answer: the GPU (name and
// capability), the driver version, FlexTile's version, the template, the mods
// (the structural hash of what they trace to, so a renamed or edited mod is
// told apart; their names and captured dtypes/ranks are shown too), the dtype, head dim, GQA ratio and a length bucket (the next power
// of two of max(L, S)). Once this file is loaded, flex_attention calls without
// a config use the tuned one (installResolver; done when libflextile loads,
// FLEXTILE_AUTOTUNE_CACHE=0 turns it off).
//
// A file that does not parse, or that another GPU or driver wrote, gives a
// warning and is rebuilt from empty on the next store; nothing else is lost.
// Processes tuning at once share the file: each store re-reads it under a
// lock file (<file>.lock) and adds its entry, so none is lost.
#pragma once

#include <atomic>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>

#include "attention_templates/FlexAttention.h"
#include "autotune/Json.h"

namespace flextile::autotune {

struct GpuIdentity {
  std::string name;  // "NVIDIA H200"
  int capability = 0;  // 90
  int driver = 0;      // cuDriverGetVersion: 12080
};
// The current device; nullopt without a GPU.
std::optional<GpuIdentity> currentGpu();

// The next power of two of max(L, S), at least 128.
int64_t lengthBucket(int64_t L, int64_t S);

// The key text of a problem on a GPU (readable, stored as the JSON key).
std::string tuneKey(const attention::FlexAttentionProblem& problem, const GpuIdentity& gpu);

// The decode template's key: the same fields under "flex_attention_decode", with the call's queries
// L (its next power of two) in place of the forward's and the programs of one split, B x KV heads
// (next power of two): the split count a config aims at pays off by how many groups fill the GPU
// (H100: one program an SM best for B = 1, two for B = 8 over the same keys).
std::string decodeTuneKey(const attention::FlexAttentionProblem& problem, const GpuIdentity& gpu);

// The backward's key: the same fields under "flex_attention_bwd", with the forward's length bucket.
std::string backwardTuneKey(const attention::FlexAttentionProblem& problem, const GpuIdentity& gpu);

struct TunedConfig {
  attention::FlexAttentionConfig config;
  double ms = 0, defaultMs = 0;  // median times at tuning
  std::string shape;             // "B=2 H=16 L=8192 S=8192 D=128", the shape it was tuned at
};

struct TunedDecodeConfig {
  attention::FlexDecodeConfig config;
  double ms = 0, defaultMs = 0;
  std::string shape;  // "B=8 Hq=32 Hkv=8 L=1 S=32768 D=128"
};

struct TunedBackwardConfig {
  attention::FlexAttentionBackwardConfig config;  // the (dkdv, dq) pair
  double ms = 0, defaultMs = 0;                   // the whole backward (preprocess, dkdv, dq)
  std::string shape;                              // "B=2 H=16 L=8192 S=8192 D=128"
};

class TuneCache {
 public:
  explicit TuneCache(std::filesystem::path file, GpuIdentity gpu);
  // The cache of the current GPU (nullopt without one or without a cache folder).
  static TuneCache* forCurrentGpu();
  static std::filesystem::path defaultFile(const GpuIdentity& gpu);

  const std::filesystem::path& file() const { return file_; }
  std::optional<TunedConfig> find(const std::string& key);
  // Stores (replacing) an entry and rewrites the file atomically, merged with the entries other
  // processes stored since this one loaded it (under a lock file next to it). False, with one
  // warning per cache, when the file cannot be written: the entry is then kept in memory only.
  bool put(const std::string& key, const TunedConfig& entry);
  std::optional<TunedDecodeConfig> findDecode(const std::string& key);
  bool putDecode(const std::string& key, const TunedDecodeConfig& entry);
  std::optional<TunedBackwardConfig> findBackward(const std::string& key);
  bool putBackward(const std::string& key, const TunedBackwardConfig& entry);
  // Changes whenever the entries may have (a load, a store): what a memo of lookups checks.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  size_t size();

 private:
  void loadLocked();
  std::optional<Json> entry(const std::string& key);
  bool store(const std::string& key, Json entry);
  Json readEntries(std::string& problem) const;
  std::filesystem::path file_;
  GpuIdentity gpu_;
  std::mutex mutex_;
  bool loaded_ = false;
  bool warnedStore_ = false;
  Json entries_ = Json::obj();
  std::atomic<uint64_t> generation_{0};
};

// Makes flex_attention consult TuneCache::forCurrentGpu() when it is given no
// config (attention::setFlexAttentionConfigResolver), its decode template when it is given no
// decode config (attention::setFlexDecodeConfigResolver), and flex_attention_backward when it is
// given no config (attention::setFlexAttentionBackwardConfigResolver).
void installResolver();

}  // namespace flextile::autotune
