// The host's own work in an eager flex_attention call: checks, plan, lists, constants, kernel
// lookup, argument binding, launch. A decode call whose kernel is short (B=1 over 2048 keys: ~6.5
// µs on the GPU) is the host's when the host takes longer, so this is where a serving loop that
// does not replay a CUDA graph loses its time.
//
//   flextile_host_path_bench [--calls N] [--only CASE]...
//
// Against the real driver it times the calls as the GPU machine's host makes them (the kernels run
// too; the host never waits for them inside a batch). Against the recording stand-in driver
// (kernels do not run, so the figure is the host's alone) and under callgrind it counts the
// instructions of exactly the measured calls:
//
//   FLEXTILE_CUDA_LIBRARY=build/tests/runtime/libflextile_recording_cuda.so
//     valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*timedCalls*'
//     build/bench/flextile_host_path_bench --calls 2000 --only decode_causal   (one command)
//   callgrind_annotate callgrind.out.<pid>      # total over --calls calls (warm-up excluded)
//
// scripts/host_path_instructions.sh does that for every case and prints instructions a call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "BenchUtil.h"
#include "attention_templates/FlexAttention.h"
#include "dsl/DSL.h"
#include "runtime/Device.h"

using namespace flextile;
using namespace flextile::attention;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using bench::randomBf16;

namespace {

// The calls callgrind's --toggle-collect counts: kept out of line under this name.
[[gnu::noinline]] void timedCalls(const std::function<void()>& call, int calls) {
  for (int i = 0; i < calls; ++i) call();
}

struct Case {
  std::string name;
  int64_t B, Hq, Hkv, S;
  enum class Mask { None, Causal, WindowOnDeviceLists } mask;
  int64_t D = 128;
};

}  // namespace

int main(int argc, char** argv) try {
  int calls = 200;
  std::vector<std::string> only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--calls") && i + 1 < argc) calls = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only.push_back(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--calls N] [--only CASE]...\n", argv[0]);
      return 2;
    }
  }
  if (calls < 1) {
    std::fprintf(stderr, "flextile_host_path_bench: --calls must be at least 1\n");
    return 2;
  }
  std::string why;
  if (!dsl::deviceAvailable(&why)) {
    std::fprintf(stderr, "flextile_host_path_bench: needs a GPU, or FLEXTILE_CUDA_LIBRARY naming the recording driver (%s)\n",
                 why.c_str());
    return 2;
  }
  std::printf("host path bench on %s\n", runtime::Device::current().name().c_str());
  const std::vector<Case> cases = {
      {"decode", 1, 32, 8, 2048, Case::Mask::None},
      {"decode_causal", 1, 32, 8, 2048, Case::Mask::Causal},
      {"window_devlists", 1, 32, 8, 32768, Case::Mask::WindowOnDeviceLists},
      {"decode_d256", 1, 32, 8, 2048, Case::Mask::None, 256},
  };
  std::mt19937_64 rng(7);
  for (const Case& c : cases) {
    if (!only.empty() && std::find(only.begin(), only.end(), c.name) == only.end()) continue;
    const int64_t D = c.D;
    Tensor q = randomBf16(rng, {c.B, c.Hq, 1, D});
    Tensor k = randomBf16(rng, {c.B, c.Hkv, c.S, D}), v = randomBf16(rng, {c.B, c.Hkv, c.S, D});
    Tensor out = Tensor::empty(DType::BF16, q.shape(), MemorySpace::Device);
    Tensor lse = Tensor::empty(DType::F32, {c.B, c.Hq, 1}, MemorySpace::Device);
    std::optional<BlockMask> mask;
    if (c.mask == Case::Mask::Causal) mask = causalBlockMask(1, 1, c.S, c.S, {128, 128}, MemorySpace::Device);
    if (c.mask == Case::Mask::WindowOnDeviceLists) {
      const BlockMask host = slidingWindowBlockMask(1, 1, c.S, c.S, {4096}, {128, 128}, MemorySpace::Device);
      const BlockMaskTensors& t = host.kvTensors(MemorySpace::Device);
      BlockMaskTensors lists{t.kvNum.to(MemorySpace::Device), t.kvIndices.to(MemorySpace::Device),
                             t.fullKvNum.to(MemorySpace::Device), t.fullKvIndices.to(MemorySpace::Device)};
      mask = BlockMask::fromListTensors(host.maskMod(), 1, 1, c.S, c.S, {128, 128}, lists);
    }
    FlexAttentionOptions options;
    options.kernel = AttentionTemplate::Decode;
    if (mask) options.query_offset = c.S - 1;
    auto call = [&] { flex_attention_into(q, k, v, noop_score(), mask, out, &lse, options); };
    for (int i = 0; i < 20; ++i) call();  // compiles, fills the caches
    runtime::synchronize();
    timedCalls(call, calls);  // what callgrind counts
    runtime::synchronize();
    // Wall time: the median of nine batches (noisy on a shared host; callgrind's count is not).
    std::vector<double> us;
    for (int batch = 0; batch < 9; ++batch) {
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) call();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls);
      runtime::synchronize();
    }
    std::nth_element(us.begin(), us.begin() + 4, us.end());
    std::printf("%-16s B=%lld Hq=%lld Hkv=%lld S=%lld D=%lld: host %.2f us a call (median of 9 batches of %d)\n",
                c.name.c_str(), (long long)c.B, (long long)c.Hq, (long long)c.Hkv, (long long)c.S, (long long)D, us[4],
                calls);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flextile_host_path_bench: %s\n", e.what());
  return 1;
}
