#include "TestPrograms.h"

#include "ir/SharedLayout.h"

#include <functional>

namespace flextile::ir::testing {

std::unique_ptr<Function> everyOpProgram() {
  auto f = std::make_unique<Function>("every_op");
  f->attrs()["num_warps"] = int64_t(4);
  f->attrs()["arg_divisibility"] = std::vector<int64_t>{16, 16, 16, 1, 16};
  f->attrs()["scale"] = 0.5;
  f->attrs()["template"] = std::string("test \"quoted\"");
  Value* a = f->addParam(Type::pointer(DType::F32), "a");
  Value* bp = f->addParam(Type::pointer(DType::F16), "b");
  Value* out = f->addParam(Type::pointer(DType::F32), "out");
  Value* n = f->addParam(Type(DType::I32), "n");
  Value* words = f->addParam(Type::pointer(DType::I64), "words");
  Builder b(*f);
  b.setLoc({"every_op.cpp", 10});
  const Shape tile = {64, 32};
  Value* pid = b.programId(0);
  Value* nprog = b.numPrograms(1);
  Value* rowsPerProgram = b.constantInt(Type(DType::I32), 64);
  Value* base = b.binary(OpKind::Mul, pid, rowsPerProgram);
  base = b.binary(OpKind::Add, base, b.binary(OpKind::Sub, nprog, nprog));
  Value* rows = b.binary(OpKind::Add, b.splat(base, {64}), b.arange(0, 64));
  Value* inBounds = b.cmp("lt", rows, b.splat(n, {64}));
  Value* rows2 = b.broadcast(b.expandDims(rows, 1), tile);
  Value* cols2 = b.broadcast(b.expandDims(b.arange(0, 32), 0), tile);
  Value* offsets = b.binary(OpKind::Add, b.binary(OpKind::Mul, rows2, b.constantInt(Type(DType::I32, tile), 32)), cols2);
  Value* mask = b.broadcast(b.expandDims(inBounds, 1), tile);
  b.setLoc({"every_op.cpp", 20});
  Value* x = b.load(b.addptr(b.splat(a, tile), offsets), mask, b.constant(Type(DType::F32, tile), 0.0));
  // Unary math.
  Value* y = x;
  for (OpKind k : {OpKind::Abs, OpKind::Neg, OpKind::Exp, OpKind::Exp2, OpKind::Log, OpKind::Log2, OpKind::Tanh,
                   OpKind::Sqrt, OpKind::Rsqrt})
    y = b.unary(k, y);
  // Binary arithmetic.
  for (OpKind k : {OpKind::Add, OpKind::Sub, OpKind::Mul, OpKind::Div, OpKind::Rem, OpKind::Maximum, OpKind::Minimum})
    y = b.binary(k, y, x);
  // Integer ops on the offsets.
  Value* bits = offsets;
  for (OpKind k : {OpKind::And, OpKind::Or, OpKind::Xor, OpKind::Shl, OpKind::Shr}) bits = b.binary(k, bits, offsets);
  bits = b.unary(OpKind::Not, bits);
  Value* z = b.select(b.cmp("ge", bits, offsets), y, x);
  z = b.cast(b.cast(z, DType::F16), DType::F32);
  z = b.trans(b.reshape(z, {32, 64}), {1, 0});
  // dot: [64,32] x [32,16] + [64,16], B loaded from the f16 parameter.
  Value* kIdx = b.broadcast(b.expandDims(b.arange(0, 32), 1), {32, 16});
  Value* nIdx = b.broadcast(b.expandDims(b.arange(0, 16), 0), {32, 16});
  Value* bOff = b.binary(OpKind::Add, b.binary(OpKind::Mul, kIdx, b.constantInt(Type(DType::I32, {32, 16}), 16)), nIdx);
  Value* bTile = b.load(b.addptr(b.splat(bp, {32, 16}), bOff));
  // The memory/async level: B staged again through a two-slot shared ring.
  Value* ring = b.create1(OpKind::LocalAlloc, {},
                          Type::sharedBuffer(DType::F16, 2, std::make_shared<const SharedLayout>(
                                                               SharedLayout::forDotOperand({32, 16}, 2, 1, false))));
  Value* slot = b.constantInt(Type(DType::I32), 1);
  b.create(OpKind::Barrier, {}, {});
  b.create(OpKind::AsyncCopy, {ring, slot, b.addptr(b.splat(bp, {32, 16}), bOff), b.cmp("lt", kIdx, b.splat(n, {32, 16}))},
           {}, {{"vec", int64_t(4)}});
  b.create(OpKind::AsyncCommit, {}, {});
  b.create(OpKind::AsyncWait, {}, {}, {{"pending", int64_t(0)}});
  // Barriers in shared memory: the copy tracked on slot 1 of a buffer of two as well.
  Value* bars = b.create1(OpKind::LocalAlloc, {},
                          Type::sharedBuffer(DType::I64, 2, std::make_shared<const SharedLayout>(SharedLayout({1}, {0}, 1, 1, 1, 8))));
  b.create(OpKind::MbarrierInit, {bars}, {});
  b.create(OpKind::AsyncCopyArrive, {bars, slot}, {});
  b.create(OpKind::MbarrierWait, {bars, slot, b.constantInt(Type(DType::I32), 0)}, {});
  b.create(OpKind::MbarrierArrive, {bars, slot}, {});
  b.create(OpKind::MbarrierInval, {bars}, {});
  // A TMA copy of the same tile of B (a [32, 16] box of the [32, n] tensor, row stride 16) on a one-arrival barrier.
  b.create(OpKind::MbarrierInit, {bars}, {}, {{"arrivals", int64_t(1)}});
  Value* on = b.constantInt(Type(DType::I1), 1);
  b.create(OpKind::MbarrierExpectTx, {bars, slot, on}, {}, {{"bytes", int64_t(32 * 16 * 2)}});
  // A stage that does not exist, on shared rings: no arrival at all ({only_on = 1}).
  b.create(OpKind::MbarrierExpectTx, {bars, slot, b.constantInt(Type(DType::I1), 0)}, {},
           {{"bytes", int64_t(32 * 16 * 2)}, {"only_on", int64_t(1)}});
  Value* zero = b.constantInt(Type(DType::I32), 0);
  b.create(OpKind::TmaCopy, {ring, slot, bars, slot, on, bp, b.constantInt(Type(DType::I32), 32), n,
                             b.constantInt(Type(DType::I32), 16), zero, zero}, {});
  b.create(OpKind::MbarrierInval, {bars}, {});
  // Warpgroup turns, in the order a loop has them (the lowering needs 8 warps; the IR does not).
  for (const char* step : {"open", "begin", "end", "close"})
    b.create(OpKind::WarpgroupTurn, {}, {}, {{"step", std::string(step)}});
  b.create(OpKind::FenceAsyncShared, {}, {});
  b.create(OpKind::Barrier, {}, {});
  Value* staged = b.create1(OpKind::LocalLoad, {ring, slot}, Type(DType::F16, {32, 16}));
  b.create(OpKind::LocalStore, {ring, b.constantInt(Type(DType::I32), 0), staged}, {});
  bTile = b.binary(OpKind::Add, bTile, staged);
  Value* prod = b.dot(b.cast(z, DType::F16), bTile, b.constant(Type(DType::F32, {64, 16}), 0.0));
  // wgmma_wait passes the accumulator through (the "wgmma" pass writes it after an async dot).
  prod = b.create(OpKind::WgmmaWait, {prod}, {prod->type()}, {{"pending", int64_t(0)}})->result();
  Value* rowMax = b.reduce(prod, 1, "max");
  b.setLoc({"every_op.cpp", 30});
  auto results = b.forLoop(b.constantInt(Type(DType::I32), 0), n, b.constantInt(Type(DType::I32), 1),
                           {b.constant(Type(DType::F32, {64}), 0.0), b.constantInt(Type(DType::I32), 0)},
                           [&](Value* iv, std::vector<Value*> carried) -> std::vector<Value*> {
                             Value* sum = b.reduce(z, 1, "sum");
                             Value* acc = b.binary(OpKind::Add, carried[0], b.binary(OpKind::Add, sum, rowMax));
                             return {acc, b.binary(OpKind::Add, carried[1], iv)};
                           });
  b.setLoc({"every_op.cpp", 40});
  Value* scaled = b.binary(OpKind::Mul, results[0], b.splat(b.cast(results[1], DType::F32), {64}));
  b.store(b.addptr(b.splat(out, {64}), rows), scaled, inBounds);
  // atomic_add on a tile under a mask, and on a scalar; results unused (the
  // side effect alone keeps them).
  b.atomicAdd(b.addptr(b.splat(out, {64}), rows), scaled, inBounds);
  b.atomicAdd(out, b.cast(results[1], DType::F32));
  // The cluster of 2 along axis 0 hands each program the other's row and trip count.
  std::vector<Value*> gathered = b.clusterAllGather({scaled, results[1]}, 2);
  b.store(b.addptr(b.splat(out, {64}), rows), b.binary(OpKind::Add, gathered[0], gathered[1]), inBounds);
  // Tagged words: the row handed over with the trip count as its tag, and waited for.
  Value* wordPtrs = b.addptr(b.splat(words, {64}), rows);
  b.storeTagged(wordPtrs, scaled, results[1], inBounds);
  b.store(b.addptr(b.splat(out, {64}), rows), b.loadTagged(wordPtrs, results[1], inBounds), inBounds);
  // ... and two tiles waited for at once (one wait for both).
  std::vector<Value*> both = b.loadTagged({wordPtrs, wordPtrs}, results[1], {});
  b.store(b.addptr(b.splat(out, {64}), rows), b.binary(OpKind::Add, both[0], both[1]), inBounds);
  b.fence();  // orders the stores and atomics above for other programs
  b.globalTimer();  // unused: its side effect (reading the clock where it stands) keeps it
  b.smId();  // unused, kept like the clock read above
  b.gridDependency("release");  // the stream's next grid may start launching
  b.ret();
  return f;
}

LayoutPtr otherLayout(const Layout& l) {
  for (int64_t vector : {2, 4, 8, 1}) {
    Layout c = Layout::defaultBlocked(l.shape(), l.numWarps(), vector);
    if (c != l) return makeLayout(c);
  }
  // Swap the first two lane bases: a different but valid thread order.
  Layout::Bases lanes = l.laneBases();
  for (size_t i = 1; i < lanes.size(); ++i)
    if (lanes[i] != lanes[0]) {
      std::swap(lanes[0], lanes[i]);
      return makeLayout(Layout(l.shape(), l.regBases(), lanes, l.warpBases()));
    }
  return nullptr;
}

Op* firstOp(Function& f, OpKind k) {
  Op* found = nullptr;
  f.walk([&](Op& op) {
    if (!found && op.kind() == k) found = &op;
  });
  return found;
}

void assignTestLayouts(Function& f) {
  const int warps = f.numWarps();
  auto defaultFor = [&](const Type& t) { return makeLayout(Layout::defaultBlocked(t.shape(), warps)); };
  auto set = [](Value* v, LayoutPtr l) { v->setType(v->type().withLayout(std::move(l))); };
  auto layoutOf = [](Value* v) -> const Layout& { return *v->type().layout(); };
  auto fit = [&](Op& op, size_t i, const Layout& want) {
    Value* v = op.operand(i);
    if (!v->type().isTile() || layoutOf(v) == want) return;
    Builder b(f);
    b.setInsertionPointBefore(&op);
    op.setOperand(i, b.create1(OpKind::ConvertLayout, {v}, v->type().withLayout(makeLayout(want))));
  };
  std::function<void(Block&)> block = [&](Block& blk) {
    for (auto& owned : blk.ops()) {
      Op& op = *owned;
      Value* r = op.numResults() ? op.result() : nullptr;
      bool tileResult = r && r->type().isTile();
      switch (op.kind()) {
        case OpKind::For: {
          Block& body = op.region();
          for (size_t i = 0; i < op.numResults(); ++i) {
            Value* init = op.operand(3 + i);
            if (!init->type().isTile()) continue;
            set(body.arg(1 + i), init->type().layout());
            set(op.result(i), init->type().layout());
          }
          block(body);
          Op* yield = body.terminator();
          for (size_t i = 0; i < yield->numOperands(); ++i)
            if (body.arg(1 + i)->type().isTile()) fit(*yield, i, layoutOf(body.arg(1 + i)));
          break;
        }
        case OpKind::Broadcast:
          set(r, defaultFor(r->type()));
          fit(op, 0, layoutOf(r).projected(op.operand(0)->type().shape()));
          break;
        case OpKind::ExpandDims:
          set(r, defaultFor(r->type()));
          fit(op, 0, layoutOf(r).sliced(int(op.intAttr("axis"))));
          break;
        case OpKind::Reshape: set(r, makeLayout(layoutOf(op.operand(0)).reshaped(r->type().shape()))); break;
        case OpKind::Trans: {
          const auto& perm = op.intsAttr("perm");
          set(r, makeLayout(layoutOf(op.operand(0)).transposed(std::vector<int>(perm.begin(), perm.end()))));
          break;
        }
        case OpKind::Reduce:
          if (tileResult) set(r, makeLayout(layoutOf(op.operand(0)).sliced(int(op.intAttr("axis")))));
          break;
        case OpKind::Dot: set(r, op.operand(2)->type().layout()); break;
        case OpKind::LoadTagged: {  // pointers, the tag, a mask per pointer: result t as pointer t
          const size_t tiles = op.numResults();
          for (size_t t = 0; t < tiles; ++t) {
            if (!op.operand(t)->type().isTile()) continue;
            if (const size_t m = loadTaggedMaskIndex(op, t)) fit(op, m, layoutOf(op.operand(t)));
            set(op.result(t), op.operand(t)->type().layout());
          }
          break;
        }
        case OpKind::Load:
        case OpKind::Store:
        case OpKind::StoreTagged:
        case OpKind::AtomicAdd:
          if (!op.operand(0)->type().isTile()) break;
          for (size_t i = 1; i < op.numOperands(); ++i) fit(op, i, layoutOf(op.operand(0)));
          if (r) set(r, op.operand(0)->type().layout());
          break;
        case OpKind::ConvertLayout: break;
        case OpKind::WgmmaWait:
          for (size_t i = 0; i < op.numResults(); ++i) set(op.result(i), op.operand(i)->type().layout());
          break;
        case OpKind::ClusterAllGather:  // operand i's copies are results i * size .. i * size + size - 1
          for (size_t i = 0; i < op.numResults(); ++i) {
            const Value* x = op.operand(i / size_t(op.intAttr("size")));
            if (x->type().isTile()) set(op.result(i), x->type().layout());
          }
          break;
        case OpKind::AsyncCopy:  // 4 contiguous elements per thread: the op's vec
          fit(op, 2, Layout::defaultBlocked(op.operand(2)->type().shape(), warps, 4));
          for (size_t i = 3; i < op.numOperands(); ++i) fit(op, i, layoutOf(op.operand(2)));
          break;
        default:
          if (!tileResult) break;
          if (op.hasTrait(kElementwise)) {
            set(r, op.operand(0)->type().layout());
            for (size_t i = 1; i < op.numOperands(); ++i) fit(op, i, layoutOf(r));
          } else {
            set(r, defaultFor(r->type()));
          }
      }
    }
  };
  block(f.body());
}

}  // namespace flextile::ir::testing
