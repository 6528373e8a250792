// Masks whose lists are tensors only (BlockMask::fromListTensors): the decode and prefill templates
// on such a mask against the same mask with host lists and against the float64 reference, in one
// memory space (the host tests interpret, the GPU tests run on the device). The list tensors are
// fresh copies, so nothing the original mask keeps can leak in.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"

namespace flextile::testing {

// The forward lists of `m` copied into fresh tensors of `space`.
inline attention::BlockMaskTensors copiedLists(const attention::BlockMask& m, dsl::MemorySpace space) {
  const attention::BlockMaskTensors& t = m.kvTensors(space);
  attention::BlockMaskTensors out;
  out.kvNum = t.kvNum.to(space);
  out.kvIndices = t.kvIndices.to(space);
  out.fullKvNum = t.fullKvNum.to(space);
  out.fullKvIndices = t.fullKvIndices.to(space);
  return out;
}

// Sliding-window decode (B = 2, GQA 4:2, a window of 70 keys, S = 301 keys, queries at several
// positions of a mask pre-built for S + 3): query_offset into the list-tensor mask and its
// one-row slices, with no bounds (every split sees blocks it may not need) and with the exact
// bound (the same kernel and split count as the host-list mask, so the outputs are bitwise equal);
// then a causal prefill (L = S = 200) through the forward template, bitwise equal too.
inline bool checkListTensorMask(std::mt19937_64& rng, dsl::MemorySpace space) {
  using namespace attention;
  using dsl::DType;
  using dsl::Tensor;
  const int64_t B = 2, Hq = 4, Hkv = 2, S = 301, D = 64, window = 70;
  const BlockSizes blocks{32, 32};
  BlockMask hostMask = slidingWindowBlockMask(B, 1, S + 3, S, {window}, blocks, space);
  const ListBounds exact{hostMask.maxLiveBlocksPerRow(), hostMask.numFullBlocks() > 0, hostMask.numPartialBlocks() > 0};
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, space), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, space);
  for (const ListBounds& bounds : {ListBounds{}, exact}) {
    BlockMask listMask = BlockMask::fromListTensors(hostMask.maskMod(), B, 1, S + 3, S, blocks, copiedLists(hostMask, space), bounds);
    if (listMask.hasHostLists()) {
      ADD_FAILURE() << "fromListTensors kept host lists";
      return false;
    }
    const bool bitwise = bounds.maxLiveBlocksPerRow >= 0;
    for (int64_t pos : {int64_t(0), int64_t(37), int64_t(160), S - 1}) {
      SCOPED_TRACE("position " + std::to_string(pos) + (bitwise ? ", exact bounds" : ", no bounds"));
      Tensor q = randomTensor(rng, DType::BF16, {B, Hq, 1, D}, space);
      const ReferenceResult ref = referenceAttention(q, k, v, nullptr, refWindow({window}), 0.125, pos);
      FlexAttentionOptions o{.kernel = AttentionTemplate::Decode, .query_offset = pos};
      Tensor out = Tensor::empty(DType::BF16, q.shape(), space), lse = Tensor::empty(DType::F32, {B, Hq, 1}, space);
      Tensor want = Tensor::empty(DType::BF16, q.shape(), space), wantLse = Tensor::empty(DType::F32, {B, Hq, 1}, space);
      poison(out);
      poison(lse);
      flex_attention_into(q, k, v, noop_score(), listMask, out, &lse, o);
      if (!compareWithReference(out, lse, ref, D, DType::BF16)) return false;
      flex_attention_into(q, k, v, noop_score(), hostMask, want, &wantLse, o);
      if (bitwise && (toDoubles(out) != toDoubles(want) || toDoubles(lse) != toDoubles(wantLse))) {
        ADD_FAILURE() << "the list-tensor mask with exact bounds differs from the host-list mask";
        return false;
      }
      // The step's row as a slice of the list-tensor mask (views of its tensors, no host lists).
      BlockMask slice = listMask.sliceRows(pos / blocks.q, 1, pos, 1);
      if (slice.hasHostLists()) {
        ADD_FAILURE() << "a slice of a list-tensor mask made host lists";
        return false;
      }
      poison(out);
      poison(lse);
      flex_attention_into(q, k, v, noop_score(), slice, out, &lse, {.kernel = AttentionTemplate::Decode});
      if (!compareWithReference(out, lse, ref, D, DType::BF16)) return false;
    }
  }
  // Prefill through the forward template: the kernels see the same lists and the same flags.
  const int64_t L = 200;
  BlockMask causal = causalBlockMask(1, 1, L, L, blocks, space);
  BlockMask listCausal = BlockMask::fromListTensors(causal.maskMod(), 1, 1, L, L, blocks, copiedLists(causal, space));
  Tensor q = randomTensor(rng, DType::BF16, {1, Hq, L, D}, space);
  Tensor kp = randomTensor(rng, DType::BF16, {1, Hkv, L, D}, space), vp = randomTensor(rng, DType::BF16, {1, Hkv, L, D}, space);
  Tensor out = Tensor::empty(DType::BF16, q.shape(), space), want = Tensor::empty(DType::BF16, q.shape(), space);
  poison(out);
  const FlexAttentionOptions prefill{.kernel = AttentionTemplate::Prefill};
  flex_attention_into(q, kp, vp, noop_score(), listCausal, out, nullptr, prefill);
  flex_attention_into(q, kp, vp, noop_score(), causal, want, nullptr, prefill);
  if (toDoubles(out) != toDoubles(want)) {
    ADD_FAILURE() << "the prefill on the list-tensor causal mask differs from the host-list mask";
    return false;
  }
  return true;
}

// The backward on `withoutHostLists` gives the same gradients as on `hostMask`, bit for bit (the
// same kernels walk the same lists), on fresh random inputs in `space`.
inline void expectSameGradients(std::mt19937_64& rng, const attention::BlockMask& hostMask,
                                const attention::BlockMask& withoutHostLists, int64_t B, int64_t Hq, int64_t Hkv,
                                int64_t L, int64_t S, int64_t D, dsl::MemorySpace space) {
  using namespace attention;
  using dsl::DType;
  using dsl::Tensor;
  Tensor q = randomTensor(rng, DType::BF16, {B, Hq, L, D}, space), dout = randomTensor(rng, DType::BF16, {B, Hq, L, D}, space);
  Tensor k = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, space), v = randomTensor(rng, DType::BF16, {B, Hkv, S, D}, space);
  FlexAttentionResult fwd = flex_attention(q, k, v, noop_score(), hostMask, {.return_lse = true});
  FlexAttentionGrads want = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), hostMask);
  FlexAttentionGrads got = flex_attention_backward(q, k, v, fwd.out, fwd.lse, dout, noop_score(), withoutHostLists);
  EXPECT_EQ(toDoubles(got.dq), toDoubles(want.dq)) << "dq";
  EXPECT_EQ(toDoubles(got.dk), toDoubles(want.dk)) << "dk";
  EXPECT_EQ(toDoubles(got.dv), toDoubles(want.dv)) << "dv";
}

}  // namespace flextile::testing
