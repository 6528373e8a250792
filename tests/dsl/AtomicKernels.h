// Kernels of the atomic_add tests, written in the DSL; run by the
// interpreter in tests/dsl and on the GPU in tests/gpu/AtomicGpuTest.cpp,
// which check the same exact counts.
#pragma once

#include "dsl/DSL.h"

namespace flextile::testing {

using namespace flextile::dsl;

// counts[keys[i]] += 1 for i < n (i32 atomics); BLOCK keys per program.
inline Kernel atomicHistogram() {
  return kernel("atomic_histogram", [](Ptr<i32> keys, Ptr<i32> counts, Int n, Const<int> BLOCK) {
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto ok = offs < n;
    atomic_add(counts + load(keys + offs, ok), 1, ok);
  });
}

// sums[i % BINS] += values[i] for i < n (f32 atomics): with small integer
// values every partial sum is exact in f32, so any order gives the same total.
inline Kernel atomicBinnedSum() {
  return kernel("atomic_binned_sum", [](Ptr<f32> values, Ptr<f32> sums, Int n, Const<int> BLOCK, Const<int> BINS) {
    auto offs = program_id(0) * BLOCK + arange(0, BLOCK);
    auto ok = offs < n;
    atomic_add(sums + offs % BINS, load(values + offs, ok), ok);
  });
}

// Every program takes one ticket from a scalar counter and writes it to
// its BLOCK slots of `seen`: the counter ends at the number of programs, the
// tickets are a permutation of 0..programs-1, and every thread of a program
// got the same old value.
inline Kernel atomicTicket() {
  return kernel("atomic_ticket", [](Ptr<i32> counter, Ptr<i32> seen, Const<int> BLOCK) {
    auto program = program_id(0) + program_id(1) * num_programs(0);
    auto ticket = atomic_add(counter, 1);
    store(seen + program * BLOCK + arange(0, BLOCK), ticket);
  });
}

// acc[j] += 1 for j < N from a [1, N] tile (ROW = 1) or an [N, 1] tile
// (ROW = 0), N smaller than the threads of the program, so lanes or warps
// replicate every element; each program records the old values in
// old[program * N + j]. After P programs acc[j] == P exactly, and the old
// values of each j are 0..P-1: a replica that added too would show as more.
// Only j < live add (the mask).
inline Kernel atomicReplicated() {
  return kernel("atomic_replicated", [](Ptr<f32> acc, Ptr<f32> old, Int live, Const<int> N, Const<int> ROW) {
    auto j = arange(0, N).expand(ROW ? 0 : 1);
    auto got = atomic_add(acc + j, 1.0f, j < live);
    store(old + program_id(0) * N + j, got);
  });
}

// Whole rows, as the backward's atomic dQ adds them: each program walks `steps` tiles [BM, W] of
// f32 (values[program, step]) and adds tile s into rows (program + s) * BM / 2 ... of acc [rows, W]
// (consecutive programs and steps overlap by half a tile), rows past `rows` masked off. DOT = 1
// adds dot(a, b) of two bf16 tiles instead (an mma or wgmma accumulator layout, as dQ has):
// a = values' first 16 columns, b = an identity-like [16, W] of ones on its diagonal. With small
// integer values every sum is exact in f32, so the order of the adds cannot matter. On sm_90 the
// bulk-reduce pass lowers the atomic_add to one cp.reduce.async.bulk per row; with BOX = 1 the tile
// is also named as a box of acc [rows, W], and on sm_90a it is TMA reductions of its panels instead.
inline Kernel atomicRowSums() {
  return kernel("atomic_row_sums", [](Ptr<f32> values, Ptr<f32> acc, Int rows, Int steps, Const<int> BM, Const<int> W,
                                      Const<int> DOT, Const<int> BOX) {
    auto program = program_id(0);
    auto r = arange(0, BM);
    auto c = arange(0, W);
    for_range(0, steps, 1, [&](Tile s) {
      Tile row = (program + s) * (BM / 2) + r;
      Tile tile = (program * steps + s) * BM + r;
      Tile v = load(values + (tile.expand(1) * W + c.expand(0)));
      if (DOT) {
        Tile k = arange(0, 16);
        Tile a = load(values + (tile.expand(1) * W + k.expand(0))).to(DType::BF16);
        Tile eye = where(k.expand(1) == c.expand(0) % 16, 1.0f, 0.0f).to(DType::BF16);
        v = dot(a, eye);
      }
      Tile ptrs = acc + (row.expand(1) * W + c.expand(0));
      Tile inside = (row < rows).expand(1) & (c < W).expand(0);
      if (BOX)
        atomic_add(ptrs, v, inside, TensorBox{acc, {rows, W}, {W}, {(program + s) * (BM / 2), 0}});
      else
        atomic_add(ptrs, v, inside);
    });
  });
}

// The fused decode merge's pattern, alone: every program writes a BLOCK-wide partial (3 x its
// values, stored by all of its threads), fences, and takes a ticket; the program that draws the
// last one fences, adds every program's partial into sums, records its id in `last` and resets
// the counter. sums[i] == 3 * sum over programs of values[p * BLOCK + i] exactly when every
// partial was visible to the last program, and the counter ends at 0, launch after launch.
inline Kernel fencedLastProgramSum() {
  return kernel("fenced_last_program_sum", [](Ptr<i32> values, Ptr<i32> partials, Ptr<i32> counter, Ptr<i32> sums,
                                              Ptr<i32> last, Const<int> BLOCK) {
    auto program = program_id(0);
    auto programs = num_programs(0);
    auto offs = arange(0, BLOCK);
    store(partials + program * BLOCK + offs, load(values + program * BLOCK + offs) * 3);
    fence();
    auto ticket = atomic_add(counter, 1);
    for_range(0, (ticket == programs - 1).to(i32{}), 1, [&](Tile) {
      fence();
      Tile total = for_range(0, programs, 1, zeros({int64_t(BLOCK)}, DType::I32),
                             [&](Tile p, Tile acc) { return acc + load(partials + p * BLOCK + offs); });
      store(sums + offs, total);
      store(last, program);
      store(counter, 0);
    });
  });
}

// The same hand-off through tagged words (store_tagged / load_tagged): no fence anywhere, a relaxed
// ticket, and the last ticket's program waits for each word of each program to carry `tag` — two
// programs' words a wait (load_tagged of two tiles), the odd one out alone. The words of the
// previous launch carry the previous tag and other values, so one taken too early shows as a wrong
// sum.
inline Kernel taggedLastProgramSum() {
  return kernel("tagged_last_program_sum", [](Ptr<f32> values, Ptr<i64> words, Ptr<i32> counter, Ptr<f32> sums,
                                              Int tag, Const<int> BLOCK) {
    auto program = program_id(0);
    auto programs = num_programs(0);
    auto offs = arange(0, BLOCK);
    store_tagged(words + program * BLOCK + offs, load(values + program * BLOCK + offs) * 3.0, tag);
    auto ticket = atomic_add(counter, 1);
    for_range(0, (ticket == programs - 1).to(i32{}), 1, [&](Tile) {
      Tile pairs = for_range(0, programs / 2, 1, zeros({int64_t(BLOCK)}, DType::F32), [&](Tile p, Tile acc) {
        std::vector<Tile> two = load_tagged({words + 2 * p * BLOCK + offs, words + (2 * p + 1) * BLOCK + offs}, tag);
        return acc + two[0] + two[1];
      });
      Tile total = for_range(0, programs % 2, 1, pairs, [&](Tile, Tile acc) {
        return acc + load_tagged(words + (programs - 1) * BLOCK + offs, tag);
      });
      store(sums + offs, total);
      store(counter, 0);
    });
  });
}

}  // namespace flextile::testing
