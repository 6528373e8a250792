// How a general convert_layout (neither a register renaming nor an ldmatrix
// staging) moves a tile through shared memory: the swizzled SharedLayout of
// the scratch tile and the vector width of each side's accesses, chosen by
// measuring bank conflicts rather than by a fixed rule.
//
// Both sides address the scratch linearly: element (reg, lane, warp) of a
// layout lives at offsetOf(coordinate), and since both Layout and SharedLayout
// are linear over GF(2), that offset is the XOR of offsetOf of each set
// basis. A side that can access `v` elements at once (its v leading registers
// are consecutive along the shared row, v <= smem.vec, every other basis keeps
// the offset a multiple of v) issues one vector access per v registers.
//
// Cost model: one access instruction of a warp is served in phases of
// 128 / accessBytes lanes, each phase taking 1 + its extra wavefronts
// (ir::sharedBankConflicts). Every instruction of a side differs from the
// first one by XOR with a constant (the register and warp terms), and XOR
// with a constant maps banks to banks one-to-one, so all instructions of a
// side have the conflicts of the first one; the chooser measures that
// pattern (the 32 lanes of warp 0, register 0) and multiplies.
// conversionConflicts() counts every instruction of every warp, for tests.
//
// chooseConversionPlan enumerates order (each dimension as the contiguous
// one, the rest from the last dimension down), vec (1 .. 16 bytes), perPhase
// and maxPhase (powers of two that fit), and keeps the candidate with the
// fewest wavefronts of both sides together, then the fewest instructions,
// then the smallest swizzle; the unswizzled row-major layout is a candidate,
// so the plan is never worse than it.
#pragma once

#include <cstdint>

#include "ir/Layout.h"
#include "ir/SharedLayout.h"

namespace flextile::codegen {

struct ConversionPlan {
  ir::SharedLayout smem;
  int64_t storeVec = 1;  // elements per store of the source side
  int64_t loadVec = 1;   // elements per load of the destination side
  // Extra wavefronts, summed over every access instruction of every warp.
  int64_t storeConflicts = 0, loadConflicts = 0;
  // Wavefronts of both sides together (instructions x phases + conflicts).
  int64_t wavefronts = 0;
};

// Widest vector (elements) in which `l` can access `smem`: a power of two, at
// most `maxVec`, 1 when none wider fits.
int64_t sharedAccessVector(const ir::Layout& l, const ir::SharedLayout& smem, int64_t maxVec);

// Extra wavefronts of all of `l`'s accesses of `vec` elements to `smem`
// (every register group of every warp). Throws flextile::Error when `vec`
// does not fit (sharedAccessVector).
int64_t layoutAccessConflicts(const ir::Layout& l, const ir::SharedLayout& smem, int64_t vec);

// The plan with both sides' numbers filled in, for a given shared layout
// (vectors as wide as they fit, at most 16 bytes; 1 when !vectorize).
ConversionPlan evaluateConversion(const ir::Layout& from, const ir::Layout& to, const ir::SharedLayout& smem,
                                  bool vectorize);

// The measured best plan for converting `from` to `to` (same shape) with
// elements of elemBytes (1, 2, 4 or 8). !vectorize keeps one element per
// access (i1 and pointer tiles). Throws flextile::Error when the shapes differ.
ConversionPlan chooseConversionPlan(const ir::Layout& from, const ir::Layout& to, int64_t elemBytes,
                                    bool vectorize = true);

// The unswizzled row-major plan (the last dimension contiguous, one element
// per access): the baseline the chooser must beat or match.
ConversionPlan rowMajorConversionPlan(const ir::Layout& from, const ir::Layout& to, int64_t elemBytes);

}  // namespace flextile::codegen
