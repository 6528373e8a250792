// What the forward and backward templates share on the host side (not part of the public API).
#pragma once

#include <optional>
#include <string>

#include "attention_templates/BlockMask.h"
#include "attention_templates/FlexAttention.h"
#include "dsl/Tensor.h"

namespace flextile::attention::detail {

// Throws unless `t` is a rank-4 [B, H, len, D] tensor whose last dim is contiguous and whose
// strides fit the kernels' i32 parameters; `op` and `what` name the call and the tensor.
void expectAttentionInput(const char* op, const char* what, const dsl::Tensor& t);

// Throws unless q [B, Hq, L, D], k and v [B, Hkv, S, D] are inputs both attention templates take:
// one float dtype, agreeing shapes, Hq a multiple of Hkv, D a multiple of 16 up to 256, one memory
// space, and the score mod's captures in that space.
void checkAttentionInputs(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v,
                          const ScoreMod& scoreMod);

// The mask that lists every block as full (no BlockMask given), kept per lengths and block sizes.
BlockMask denseBlockMask(int64_t L, int64_t S, BlockSizes sizes);

// The head dim a template's tiles use: D rounded up to a power of two (aranges are powers of two).
inline int64_t paddedHeadDim(int64_t D) {
  int64_t p = 1;
  while (p < D) p *= 2;
  return p;
}

// Why `config` cannot run an attention template over `mask` (nullptr: no mask), or nullopt: the
// one check of a tile config that the forward, its config resolver and both backward kernels use.
// BLOCK_M and BLOCK_N powers of two in [16, 256], num_warps 1-16 (a power of two), num_stages 1-4,
// and the tiles dividing the mask's blocks (BLOCK_M | Q_BLOCK_SIZE, BLOCK_N | KV_BLOCK_SIZE).
std::optional<std::string> configProblem(const FlexAttentionConfig& config, const BlockMask* mask);

// The compute capability a call's defaults are chosen for: the target's, else the current
// device's for device tensors, else 0 (host tensors run on the interpreter: the portable default).
int defaultsCapability(dsl::MemorySpace space, const std::optional<codegen::Target>& target);

// Whether a mod of the call reads a captured tensor once per score (ScoreMod/MaskMod::
// gathersPerElement). A mod the probe tiles do not fit counts as gathering: the smaller tile is the
// safe guess, and the real trace reports anything truly wrong with it.
bool modsGatherPerElement(const ScoreMod& scoreMod, const std::optional<BlockMask>& blockMask);

// Whether a call runs the decode template (options.kernel, else L <= kDecodeMaxQueries or a
// query_offset, which only decode takes).
bool usesDecodeTemplate(const dsl::Tensor& q, const FlexAttentionOptions& options);
// flex_attention_into's decode path (FlexAttentionDecode.cpp); out and lse already checked.
void flexDecodeInto(const dsl::Tensor& q, const dsl::Tensor& k, const dsl::Tensor& v, const ScoreMod& scoreMod,
                    const std::optional<BlockMask>& blockMask, dsl::Tensor& out, dsl::Tensor* lse,
                    const FlexAttentionOptions& options);

// A kernel name from a template's and the mods' names: anything but letters and digits becomes '_'.
std::string kernelName(const std::string& name);

}  // namespace flextile::attention::detail
