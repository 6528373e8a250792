// Tensor-core policy shared by layout assignment, shared-memory planning and
// the lowering: which dots run on mma.sync, how their warps are split, and
// how an operand is staged through shared memory for ldmatrix. The layouts
// themselves (pure GF(2) maps) live in ir/Layout.h and ir/SharedLayout.h;
// this file only decides and recognises.
//
// A dot runs on tensor cores ("mma dot") when
//   * the target has Feature::MmaSync (mma.sync m16n8k16 / m16n8k8; Target.h),
//   * a and b are rank 2 and both f16, or both bf16 (m16n8k16), or both f32
//     (tf32 m16n8k8; the inputs are rounded to tf32, 10 mantissa bits, as
//     Triton's default input precision does: opt out per dot with the
//     attribute input_precision = "ieee"), the accumulator is f32,
//   * M >= 16, N >= 8 and K >= the instruction's K (16, or 8 for tf32).
// Everything else keeps the FMA lowering (LowerDot.cpp).
//
// Warp split (mmaWarpsPerCTA). The accumulator tile [M, N] is divided among
// num_warps warps as {wm, wn} (wm * wn = num_warps), in doubling steps:
//   * a chained dot (its result feeds, through element-wise ops and loops,
//     the A operand of another dot, or its own A comes from a dot's result,
//     as S = Q K^T and O += P V in attention) puts every warp along M while
//     M allows (wn = 1): then the accumulator of the first dot *is* the A
//     operand layout of the second, and P feeds P.V from registers;
//   * otherwise each step halves the larger side of the per-warp tile
//     (M / wm vs N / wn, M on ties), which keeps warp tiles square-ish and
//     balances the A and B fragments each warp reads;
//   * a side that is down to one instruction tile (16 rows or 8 columns) is
//     not split; when neither can be, the surplus warps go along M and
//     replicate (Layout::mmaAccumulator gives them zero bases).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/Target.h"
#include "ir/IR.h"
#include "ir/SharedLayout.h"

namespace flextile::codegen {

// Bits per operand element of an mma dot: 16 (f16, bf16) or 32 (tf32).
int mmaOperandBits(ir::DType t);

// Whether `dot` (shapes and dtypes only; layouts are ignored) runs on tensor
// cores for `target` (the rules above).
bool mmaEligible(const ir::Op& dot, const Target& target);

// {wm, wn} for an [M, N] accumulator over numWarps warps (the rule above).
std::vector<int64_t> mmaWarpsPerCTA(int64_t M, int64_t N, int numWarps, bool chained);

// Whether a dot that already carries layouts is an mma dot: its result is an
// mma accumulator layout and a, b are Layout::dotOperand of it. The lowering
// and shared-memory planning key on this, so hand-written IR with those
// layouts takes the tensor-core path too.
bool isMmaDot(const ir::Op& dot);

// How convert_layout(from -> to) of 16-bit elements is lowered through
// ldmatrix, when it can be. The source tile is stored in `smem`, the swizzled
// SharedLayout::forDotOperand whose rows run along the source's fastest
// dimension (so a thread writes up to 16 contiguous bytes per store); each
// warp then issues the ldmatrix accesses of ir::ldmatrixAccesses. Row
// addresses are linear over GF(2) in the lane and warp bits (both layouts
// are), so the plan keeps them in that form: lane l of warp w supplies, for
// access q, the element offset
//     accessBase[q] ^ XOR_{bit i of l} laneTerm[i] ^ XOR_{bit i of w} warpTerm[i]
// (checked against ldmatrixAccesses for every lane, warp and access).
struct LdmatrixPlan {
  ir::SharedLayout smem;
  int numMatrices = 4;  // the .x1/.x2/.x4 suffix
  bool trans = false;   // ldmatrix .trans
  std::vector<int64_t> accessBase;              // per access: offset for lane 0 of warp 0
  std::vector<std::vector<int64_t>> registers;  // per access: 2 * numMatrices registers of `to`
  std::vector<int64_t> laneTerm, warpTerm;      // per lane bit / warp bit
};
// Empty when `to` is not ldmatrix-readable (not a 16-bit dot-operand-like
// layout, or a plan that does not validate); such converts take the generic
// row-major path.
std::optional<LdmatrixPlan> ldmatrixPlan(const ir::Layout& from, const ir::Layout& to, ir::DType t);
// The ldmatrix accesses that fill `to` from a tile already stored in `stored`
// (a shared buffer's layout: the local_load of the async level); empty when
// ldmatrix cannot read `to` from that layout.
std::optional<LdmatrixPlan> ldmatrixReadPlan(const ir::SharedLayout& stored, const ir::Layout& to, ir::DType t);

// Elements per cp.async when a tile in layout `from` (global accesses of
// `globalWidth` elements) is copied into `smem`: the largest power of two
// that is contiguous in registers, within one 16-byte chunk of the swizzled
// tile and aligned there for every thread. Below 2 (4 bytes) cp.async cannot
// copy it and the load is not pipelined.
int64_t asyncCopyWidth(const ir::Layout& from, const ir::SharedLayout& smem, int64_t globalWidth, ir::DType t);

// ---------------------------------------------------------------------------
// Hopper warpgroup MMA. On a target with Feature::Wgmma (sm_90a) an mma dot runs as
//   wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}.{bf16,f16}
// (A from registers, B read by the tensor cores straight from shared memory
// through a matrix descriptor) when
//   * its B operand is a slot of a shared buffer: b = local_load(buf, slot)
//     or trans(local_load(buf, slot)), used by this dot only, the buffer
//     stored in wgmmaSharedLayout; the slot then *is* the operand, and no
//     ldmatrix or B register exists. (While the pipeline pass decides, before
//     it makes the buffers, the same holds of convert_layout(load) with the
//     load marked async_stages: its ring then takes wgmmaSharedLayout.);
//   * every warp holds exactly 16 accumulator rows, warp w rows [16w, 16w+16)
//     (the chained-dot split with M = 16 * num_warps, num_warps a multiple of
//     4): warpgroup g is then the m64 block [64g, 64g+64), and the wgmma
//     accumulator fragment of each warp is the mma.sync one repeated along N
//     (d[4i..4i+3] of n-block i at the m16n8 positions), so layouts, softmax
//     and the P operand are the same as on mma.sync;
//     or, where M is smaller than 16 * num_warps (a 64-row product on 8
//     warps), the warpgroups split N as well (Layout::wgmmaAccumulator,
//     wgmmaGroupsAlongN): each issues an m64 x N/groups wgmma on its share of
//     B, found at a byte offset into B's tile (WgmmaTile::mnByteOffset), and
//     its A is the whole of its rows (replicated over the N groups);
//   * N is a multiple of 8 up to 256 and K a multiple of 16.
// Other layout conversions in the loop (through shared memory) are allowed: the
// wrong rows they once gave on the H200 were ptxas losing a register A operand
// in a loop whose blocks LLVM had rotated, which the backend now prevents
// (NVPTXTarget::EmitOptions::keepBlockOrder).
// The B tile is K-major when its contiguous dimension is B's K (the K of
// attention's Q K^T) and MN-major (imm-trans-b) when it is N (V of P V).
// FLEXTILE_WGMMA=0 in the environment turns the path off (for comparisons).
//
// A from shared memory ("SS" wgmma; wgmmaResidentA). A loop-invariant A
// operand (Q in the forward's Q K^T, K and V in the dkdv kernel, Q and dO in
// the dq kernel) would otherwise hold 32-64 registers per thread for the
// whole loop, which is what limits those tiles at ptxas's 255. It is kept in
// shared memory instead, as FlashAttention-3 and Triton do, when
//   * a = convert_layout(x) with the convert outside the dot's loop (the dot
//     sits in a for body, the convert in an enclosing block), x a 16-bit
//     [M, K] tile whose contiguous dimension is K (K-major A; an M-major x
//     keeps registers);
//   * every user of the convert is operand 0 of a dot that wgmmaPlan accepts
//     (B from a ring as above) under this same rule, so no register copy of
//     the operand is needed anywhere;
//   * the kernel does not ask for register A (function attribute
//     wgmma_register_a = 1: the forward, which measured 3-6 % slower with Q
//     resident on the H200, while the backward is 15-18 % faster with K, V,
//     Q and dO resident);
//   * the shared-memory plan, which gives the tile a buffer live from the
//     convert to the end of the last loop that reads it, still fits the
//     target (else the kernel keeps register A; SharedMemory.h
//     residentAConverts decides).
// The "wgmma" pass (codegen/passes/Wgmma.cpp) then replaces the convert by a
// one-slot shared buffer in wgmmaSharedLayout (the layout of a K-major B):
// local_alloc, barrier, local_store of x, fence_async_shared (generic-proxy
// stores that the async proxy reads), barrier, and a local_load that produces
// no registers (wgmmaResidentATile); each k-step of the dot passes a second
// descriptor (same encoding as a K-major B) instead of the four A words,
// warpgroup g's starting at row 64g. Loops whose A is computed
// in the loop (P of P V, dS^T of dS^T Q) keep register A.
// A = trans(convert(x)) with x [K, M] contiguous along M is kept the same way and read M-major
// (imm-trans-a; warpgroup g's rows are x's columns [64g, 64g+64)): the atomic dQ's Kᵀ dSᵀ in the
// specialized dkdv, whose K is already resident for K·Qᵀ, so both read one buffer. Its B (dSᵀ,
// computed in the loop) is then staged every iteration (wgmmaStagedB).
// FLEXTILE_WGMMA_SMEM_A=0 keeps register A everywhere.

// A tile that wgmma reads through a matrix descriptor.
struct WgmmaTile {
  ir::SharedLayout smem;  // wgmmaSharedLayout of the tile
  bool mnMajor = false;   // the operand's M/N dimension is the contiguous one (imm-trans)
  int kDim = 0;           // the dimension of the stored tile that is the product's K
  int swizzleMode = 1;    // descriptor bits 62-63: 1 = 128 B, 2 = 64 B, 3 = 32 B
  int64_t leadingByteOffset = 0, strideByteOffset = 0;
  // Byte offset, from the tile's start, of the sub-matrix of k-step s (16 of K).
  int64_t kStepByteOffset(int64_t s) const;
  // Byte offset, from the tile's start, of the sub-tile whose M (A) or N (B) index starts at
  // `start`, and whether sub-tiles `step` apart start where a descriptor can (a warpgroup's share
  // of a product whose warpgroups split N: Layout::wgmmaAccumulator).
  int64_t mnByteOffset(int64_t start) const;
  bool mnBlockAligned(int64_t step) const;
  // Descriptor bits 16-63 (leading and stride byte offsets, swizzle); the start address goes in 0-13.
  uint64_t descriptorFixedBits() const;
};
// The descriptor view of a [rows, cols] tile stored in wgmmaSharedLayout with
// `contiguousDim` fastest, whose K dimension (of the product) is `kDim`;
// empty when wgmma cannot read that layout (rows narrower than 32 bytes, or
// fewer than 8 lines per panel).
std::optional<WgmmaTile> wgmmaTile(const ir::Shape& shape, int contiguousDim, int kDim, int64_t elemBytes);

struct WgmmaPlan {
  const ir::Op* load = nullptr;  // the local_load whose slot is B (a marked load inside the pipeline pass)
  WgmmaTile b;                   // B in the ring slot
  int64_t N = 0, K = 0;
};

// The tile layout wgmma reads: the contiguous dimension `contiguousDim` cut
// into panels as wide as the swizzle (128 bytes, or the whole row when it is
// 64 or 32 bytes), rows swizzled in 16-byte chunks (SharedLayout panels).
ir::SharedLayout wgmmaSharedLayout(const ir::Shape& shape, int contiguousDim, int64_t elemBytes);

// The local_load (or, inside the pipeline pass, the marked load behind a
// convert) that feeds `dot`'s B operand, through a trans or not; else null.
const ir::Op* wgmmaSource(const ir::Op& dot);
// The plan when `dot` runs on wgmma for `target` (rules above), else empty.
// Needs layouts.
std::optional<WgmmaPlan> wgmmaPlan(const ir::Op& dot, const Target& target);
// Whether `dot`'s operands and accumulator split suit wgmma on `target` (16-bit operands, every
// warp 16 rows of a warpgroup's m64 tile, an N wgmma has), whatever feeds its B: the question a
// pass before "pipeline" can ask (wgmmaPlan also needs B in a ring slot).
bool wgmmaAccumulatorFits(const ir::Op& dot, const Target& target);
// The shape half of wgmmaAccumulator's rules, before layouts exist: an M x N x K product on
// numWarps warps (a multiple of 4) with every warp on shape.m / 4 rows, an N wgmma has, and K a
// multiple of its k step.
bool wgmmaShapeFits(int64_t M, int64_t N, int64_t K, int numWarps, const Target& target);
// How many ways a chained product's warpgroups split N (Layout::wgmmaAccumulator) when M gives
// the warps fewer than 16 rows each: a 64-row product on 8 warps runs as two m64 x N / 2 wgmma
// shares, where the mma.sync split would interleave the warps along N by 8 columns. 1 (the warps
// along M, or the mma.sync split) when the target has no wgmma, the operands are not 16-bit, M
// is not a multiple of 64, N / groups is no wgmma N, or FLEXTILE_WGMMA_SPLIT_N=0.
int64_t wgmmaGroupsAlongN(int64_t M, int64_t N, int64_t K, int numWarps, ir::DType operands, const Target& target);
// Whether any dot of `f` runs on wgmma for `target` (the PTX backend then keeps its block order:
// NVPTXTarget::EmitOptions::keepBlockOrder).
bool hasWgmmaDots(const ir::Function& f, const Target& target);

// A convert whose tile the dots read from shared memory, as A (the SS rule above) or as B
// (below), except the fit, which the shared-memory plan checks: the resident tile and the
// dots that read it.
struct WgmmaResident {
  WgmmaTile tile;
  std::vector<const ir::Op*> readers;  // the dots, in program order
};
std::optional<WgmmaResident> wgmmaResidentA(const ir::Op& convert, const Target& target);
// The descriptor view of the tile a local_load reads, when its buffer has one
// slot stored as a K-major wgmma A (what the "wgmma" pass makes of a resident
// A tile); else empty. (Rings of the pipeline keep ldmatrix for A.)
std::optional<WgmmaTile> wgmmaResidentATile(const ir::Op& localLoad);
// How a dot reads a resident A operand `a`: the local_load of its one-slot buffer, the
// descriptor view, and the buffer dimension that is A's M — 0 when a is that local_load (K-major),
// 1 when a is trans(local_load) (M-major, imm-trans-a: the buffer holds Aᵀ with M contiguous, the
// atomic dQ's Kᵀ). Empty when `a` is neither.
struct WgmmaResidentAView {
  const ir::Op* load;
  WgmmaTile tile;
  int mDim;
};
std::optional<WgmmaResidentAView> wgmmaResidentAView(const ir::Value* a);

// B from shared memory, loop-invariant. A convert outside a loop whose every user
// is operand 1 of a dot in a loop below it, each with wgmma's accumulator split
// (wgmmaAccumulator's rules) and A of the same dtype: the "wgmma" pass writes the
// tile once into a one-slot buffer in the B layout of its orientation (K-major
// when its K, dimension 0, is contiguous, else MN-major), and wgmmaPlan then
// accepts the dots with that local_load as B (wgmmaResidentBTile). The backward's
// atomic dQ reads K so in dS·K. Subject to the same fit as resident A
// (SharedMemory.h residentAConverts) and to FLEXTILE_WGMMA_SMEM_A=0.
std::optional<WgmmaResident> wgmmaResidentB(const ir::Op& convert, const Target& target);
std::optional<WgmmaTile> wgmmaResidentBTile(const ir::Op& localLoad);

// B of a product outside every loop (the prologue and the epilogue of a loop that
// defer-accumulation rotated), or inside one when the dot's A is resident M-major (the
// atomic dQ; the "wgmma" pass then puts the buffer before the outermost loop and stores the
// tile every iteration): a convert whose only reader is operand 1 of one dot in the
// same block, directly or through a trans, with wgmma's accumulator split and A of the same
// dtype. The "wgmma" pass stores the tile once into a one-slot buffer in the layout of its
// orientation (K-major when B's K is the tile's contiguous dimension) and the dot reads the
// slot, as it reads a ring slot, instead of holding B's fragments in registers (which a
// 16-rows-per-warp split would need for all of B in every warp).
std::optional<WgmmaResident> wgmmaStagedB(const ir::Op& convert, const Target& target);

// A computed in a loop, read from shared memory: a convert in a for body whose readers are all
// operand 0 of wgmma dots (in its block) whose warpgroups split N or replicate the tile
// (Layout::wgmmaAccumulator; the backward's dV += Pᵀ·dO and each chunk's dK += dSᵀ·Q with 64 keys
// on 8 warps). Each warpgroup holds only its share of the tile's columns while each needs all of
// its rows, so the tile crosses shared memory either way:
// the "wgmma" pass stores it every iteration into a one-slot buffer made before the outermost loop
// (K-major, as a resident A), and the dot reads it through a descriptor instead of ldmatrix
// fragments after a conversion. Subject to FLEXTILE_WGMMA_SMEM_A=0 and to the shared-memory fit
// (SharedMemory.h stagedAConverts).
std::optional<WgmmaResident> wgmmaStagedA(const ir::Op& convert, const Target& target);

// Whether wgmma's B descriptors of k-steps 1.. are added to k-step 0's inside the product's asm
// (the default) rather than built one by one; FLEXTILE_WGMMA_B_STEPS=0 builds them one by one, to
// measure the difference.
bool wgmmaBStepsAdded();

// The environment switches above as text for the compile cache's compiler
// identity ("" when both are at their defaults).
std::string wgmmaSettingsIdentity();

}  // namespace flextile::codegen
