// Bad input to flex_attention: each case throws flextile::Error whose message
// names what is wrong (asserted on substrings), before anything runs.
#include <gtest/gtest.h>

#include "FlexAttentionCheck.h"
#include "MaskTestUtil.h"
#include "gpu/GpuTest.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"  // designated initializers leave members default

using namespace flextile;
using namespace flextile::attention;
using namespace flextile::testing;
using dsl::DType;
using dsl::MemorySpace;
using dsl::Tensor;
using dsl::Tile;

namespace {

constexpr MemorySpace kHost = MemorySpace::Host;
const FlexAttentionOptions kSmall{.config = FlexAttentionConfig{32, 16, 4, 2}};

Tensor hostTensor(DType dt, dsl::Shape shape) { return Tensor::zeros(dt, std::move(shape), kHost); }

// A device view at a made-up (aligned) address: never dereferenced, since
// validation must reject the mix before any launch; no GPU needed.
Tensor fakeDeviceTensor(DType dt, dsl::Shape shape) {
  return Tensor::deviceView(uint64_t(1) << 40, dt, std::move(shape));
}

// Runs flex_attention_into with outputs of the right shape.
void run(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<BlockMask>& mask = std::nullopt,
         const FlexAttentionOptions& options = kSmall, const ScoreMod& score = noop_score()) {
  Tensor out = Tensor::empty(q.dtype(), q.shape(), q.space());
  Tensor lse = Tensor::empty(DType::F32, {q.size(0), q.size(1), q.size(2)}, q.space());
  flex_attention_into(q, k, v, score, mask, out, &lse, options);
}

}  // namespace

TEST(FlexAttentionErrors, Ranks) {
  Tensor good = hostTensor(DType::BF16, {1, 2, 16, 64});
  expectError([&] { run(hostTensor(DType::BF16, {2, 16, 64}), good, good); }, {"q must be [B, H, len, D]", "[2, 16, 64]"});
  expectError([&] { run(good, hostTensor(DType::BF16, {1, 2, 16, 64, 1}), good); }, {"k must be [B, H, len, D]"});
  expectError([&] { run(good, good, Tensor()); }, {"v is an empty tensor"});
}

TEST(FlexAttentionErrors, ShapesThatDisagree) {
  Tensor q = hostTensor(DType::BF16, {2, 4, 16, 64});
  Tensor k = hostTensor(DType::BF16, {2, 2, 20, 64});
  expectError([&] { run(q, hostTensor(DType::BF16, {1, 2, 20, 64}), k); }, {"batch sizes differ"});
  expectError([&] { run(q, k, hostTensor(DType::BF16, {2, 2, 21, 64})); }, {"k and v must have the same heads and length"});
  expectError([&] { run(q, k, hostTensor(DType::BF16, {2, 1, 20, 64})); }, {"k and v must have the same heads and length"});
  expectError([&] { run(q, hostTensor(DType::BF16, {2, 2, 20, 128}), hostTensor(DType::BF16, {2, 2, 20, 128})); },
              {"same head dim D"});
  expectError([&] { run(q, k, hostTensor(DType::BF16, {2, 2, 20, 40})); }, {"v's head dim DV = 40"});
  expectError([&] { run(hostTensor(DType::BF16, {2, 4, 0, 64}), k, k); }, {"empty input"});
}

TEST(FlexAttentionErrors, Dtypes) {
  Tensor q = hostTensor(DType::BF16, {1, 2, 16, 64});
  expectError([&] { run(q, hostTensor(DType::F16, {1, 2, 16, 64}), hostTensor(DType::F16, {1, 2, 16, 64})); },
              {"one dtype", "f16"});
  expectError([&] { run(q, q, hostTensor(DType::F32, {1, 2, 16, 64})); }, {"one dtype"});
  Tensor i = hostTensor(DType::I32, {1, 2, 16, 64});
  expectError([&] { run(i, i, i); }, {"dtype must be bf16, f16 or f32"});
  Tensor d = hostTensor(DType::F64, {1, 2, 16, 64});
  expectError([&] { run(d, d, d); }, {"dtype must be bf16, f16 or f32"});
}

TEST(FlexAttentionErrors, HeadCountsThatDoNotDivide) {
  Tensor k = hostTensor(DType::BF16, {1, 2, 16, 64});
  expectError([&] { run(hostTensor(DType::BF16, {1, 3, 16, 64}), k, k); },
              {"query heads (3) must be a multiple of the kv heads (2)"});
  Tensor k4 = hostTensor(DType::BF16, {1, 4, 16, 64});
  expectError([&] { run(hostTensor(DType::BF16, {1, 2, 16, 64}), k4, k4); }, {"query heads (2)", "kv heads (4)"});
}

// The API takes D a multiple of 16 in [16, 256] (the template pads D to a
// power of two inside); anything else is refused up front.
TEST(FlexAttentionErrors, UnsupportedHeadDims) {
  for (int64_t D : {8, 24, 40, 100, 272, 300, 512}) {
    Tensor t = hostTensor(DType::BF16, {1, 1, 16, D});
    expectError([&] { run(t, t, t); }, {"head dim D = " + std::to_string(D) + " is not supported",
                                        "multiple of 16 up to 256"});
    try {
      run(t, t, t);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Unsupported) << e.what();
    }
  }
  // An ordinary mistake in the input is the default kind, and an unknown variant says so.
  try {
    run(hostTensor(DType::BF16, {2, 16, 64}), hostTensor(DType::BF16, {1, 1, 16, 64}), hostTensor(DType::BF16, {1, 1, 16, 64}));
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
  }
  try {
    (void)variant("no_such_variant");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UnknownName) << e.what();
  }
}

TEST(FlexAttentionErrors, BlockMaskLengthsThatDoNotMatch) {
  Tensor q = hostTensor(DType::BF16, {1, 2, 100, 64});
  Tensor k = hostTensor(DType::BF16, {1, 2, 120, 64});
  expectError([&] { run(q, k, k, causalBlockMask(1, 1, 101, 120, {32, 32})); },
              {"was built for", "101", "100", "never cropped"});
  expectError([&] { run(q, k, k, causalBlockMask(1, 1, 100, 128, {32, 32})); }, {"was built for", "128", "120"});
  // A one-row slice holds that row's queries, not the whole sequence.
  BlockMask slice = causalBlockMask(1, 1, 100, 120, {32, 32}).sliceRows(1, 1);
  expectError([&] { run(q, k, k, slice); }, {"was built for"});
}

TEST(FlexAttentionErrors, BlockMaskBatchAndHeadsThatDoNotBroadcast) {
  Tensor q = hostTensor(DType::BF16, {3, 4, 64, 64});
  Tensor k = hostTensor(DType::BF16, {3, 2, 64, 64});
  expectError([&] { run(q, k, k, causalBlockMask(2, 1, 64, 64, {32, 32})); },
              {"has batch 2", "inputs have batch 3"});
  expectError([&] { run(q, k, k, causalBlockMask(1, 3, 64, 64, {32, 32})); }, {"has 3 heads", "4 query heads"});
  // Under GQA a per-head mask has one row per query head, not per kv head.
  expectError([&] { run(q, k, k, causalBlockMask(1, 2, 64, 64, {32, 32})); }, {"has 2 heads", "4 query heads"});
}

TEST(FlexAttentionErrors, ConfigsThatDoNotTileTheMask) {
  Tensor t = hostTensor(DType::BF16, {1, 1, 64, 64});
  BlockMask m = causalBlockMask(1, 1, 64, 64, {32, 32});
  expectError([&] { run(t, t, t, m, {.config = FlexAttentionConfig{64, 16, 4, 2}}); },
              {"BM64 BN16 w4 s2", "does not tile", "32 x 32"});
  expectError([&] { run(t, t, t, m, {.config = FlexAttentionConfig{32, 64, 4, 2}}); }, {"does not tile"});
  // The default config shrinks to the mask's blocks instead (a given config is never changed).
  EXPECT_NO_THROW(run(t, t, t, m, {}));
}

TEST(FlexAttentionErrors, BlockSizesThatAreNotPowersOfTwo) {
  Tensor t = hostTensor(DType::BF16, {1, 1, 96, 64});
  BlockMask m = causalBlockMask(1, 1, 96, 96, {128, 128});
  for (FlexAttentionConfig c : {FlexAttentionConfig{48, 16, 4, 2}, FlexAttentionConfig{32, 24, 4, 2},
                                FlexAttentionConfig{8, 16, 4, 2}, FlexAttentionConfig{512, 64, 8, 2},
                                FlexAttentionConfig{0, 64, 8, 2}})
    expectError([&] { run(t, t, t, m, {.config = c}); }, {c.describe(), "powers of two in [16, 256]"});
}

TEST(FlexAttentionErrors, HostAndDeviceMixed) {
  Tensor h = hostTensor(DType::BF16, {1, 2, 16, 64});
  Tensor d = fakeDeviceTensor(DType::BF16, {1, 2, 16, 64});
  expectError([&] { run(h, d, h); }, {"one memory space"});
  expectError([&] { run(h, h, d); }, {"one memory space"});
  // out in the other space.
  Tensor lse = Tensor::empty(DType::F32, {1, 2, 16}, kHost);
  expectError([&] { flex_attention_into(h, h, h, noop_score(), std::nullopt, d, &lse, kSmall); },
              {"out is in another memory space"});
  // lse in the other space.
  Tensor out = Tensor::empty(DType::BF16, {1, 2, 16, 64}, kHost);
  Tensor dLse = fakeDeviceTensor(DType::F32, {1, 2, 16});
  expectError([&] { flex_attention_into(h, h, h, noop_score(), std::nullopt, out, &dLse, kSmall); },
              {"lse must be contiguous and in q's memory space"});
  // Mods that capture device tensors, with host inputs.
  ScoreMod deviceSlopes = alibi(dsl::capture(fakeDeviceTensor(DType::F32, {2}), "slopes"));
  expectError([&] { run(h, h, h, std::nullopt, kSmall, deviceSlopes); },
              {"score_mod", "captures tensors in the other memory space"});
  dsl::CapturedTensor ids = dsl::capture(fakeDeviceTensor(DType::I32, {16}), "document_ids");
  BlockMask structural = causalBlockMask(1, 1, 16, 16, {32, 32});
  BlockMask deviceMod = BlockMask::fromKvLists(document_mask(ids), 1, 1, 16, 16, {32, 32}, structural.partialKv(),
                                               structural.fullKv());
  expectError([&] { run(h, h, h, deviceMod); }, {"mask_mod", "captures tensors in the other memory space"});
}

TEST(FlexAttentionErrors, OutputsOfTheWrongShapeOrKind) {
  Tensor t = hostTensor(DType::BF16, {2, 2, 16, 64});
  Tensor lse = Tensor::empty(DType::F32, {2, 2, 16}, kHost);
  auto into = [&](Tensor out, Tensor* l) { flex_attention_into(t, t, t, noop_score(), std::nullopt, out, l, kSmall); };
  expectError([&] { into(hostTensor(DType::BF16, {2, 2, 17, 64}), &lse); }, {"out must be [2, 2, 16, 64]", "17"});
  expectError([&] { into(hostTensor(DType::BF16, {1, 2, 16, 64}), &lse); }, {"out must be [2, 2, 16, 64]"});
  expectError([&] { into(hostTensor(DType::F32, {2, 2, 16, 64}), &lse); }, {"out: expected dtype bf16", "f32"});
  expectError([&] { into(hostTensor(DType::BF16, {2, 2, 16, 64, 1}), &lse); }, {"out must be [B, H, len, D]"});
  Tensor out = hostTensor(DType::BF16, {2, 2, 16, 64});
  Tensor badLse = Tensor::empty(DType::F32, {2, 2, 15}, kHost);
  expectError([&] { into(out, &badLse); }, {"lse: expected shape [2, 2, 16]"});
  Tensor bf16Lse = Tensor::empty(DType::BF16, {2, 2, 16}, kHost);
  expectError([&] { into(out, &bf16Lse); }, {"lse: expected dtype f32"});
  // A strided lse (a view that skips every other element) is refused, not written past.
  std::vector<float> buf(2 * 2 * 16 * 2);
  Tensor stridedLse = Tensor::hostView(buf.data(), DType::F32, {2, 2, 16}, {64, 32, 2});
  expectError([&] { into(out, &stridedLse); }, {"lse must be contiguous"});
}

TEST(FlexAttentionErrors, NonContiguousLastDim) {
  std::vector<float> buf(1 * 2 * 16 * 64 * 2);
  Tensor q = Tensor::hostView(buf.data(), DType::F32, {1, 2, 16, 64}, {2 * 16 * 128, 16 * 128, 128, 2});
  Tensor k = hostTensor(DType::F32, {1, 2, 16, 64});
  expectError([&] { run(q, k, k); }, {"last dim of q must be contiguous"});
  expectError([&] { run(k, q, k); }, {"last dim of k must be contiguous"});
}

// Strides are kernel arguments of 32 bits: a view whose strides do not fit is
// refused (the view is never read: validation comes first).
TEST(FlexAttentionErrors, StridesPastInt32) {
  std::vector<float> buf(16 * 64);
  Tensor q = Tensor::hostView(buf.data(), DType::F32, {2, 1, 16, 64}, {int64_t(1) << 32, 16 * 64, 64, 1});
  Tensor k = hostTensor(DType::F32, {2, 1, 16, 64});
  expectError([&] { run(q, k, k); }, {"q's strides exceed int32"});
}

// Mods that return the wrong kind of tile are refused at trace time with the
// mod's name.
TEST(FlexAttentionErrors, ModsOfTheWrongType) {
  Tensor t = hostTensor(DType::BF16, {1, 1, 32, 64});
  const int first = __LINE__ + 1;  // the statement that makes intScore (compilers name its first or last line)
  ScoreMod intScore("int_score", [](const Tile&, const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return q + kv;
  });
  const int last = __LINE__ - 1;
  // The error points at the user's line where the mod is made, then names the template's call.
  expectError([&] { run(t, t, t, std::nullopt, kSmall, intScore); },
              {"FlexAttentionErrorsTest.cpp:", "int_score", "floating-point score", "called from FlexAttentionForward.cpp"});
  try {
    run(t, t, t, std::nullopt, kSmall, intScore);
  } catch (const Error& e) {
    const std::string what = e.what();
    const int line = std::stoi(what.substr(what.find(':') + 1));
    EXPECT_TRUE(line >= first && line <= last) << what << " (expected a line in " << first << "-" << last << ")";
  }
  MaskMod floatMask("float_mask", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (q + kv).to(DType::F32);
  });
  BlockMask structural = causalBlockMask(1, 1, 32, 32, {32, 32});
  BlockMask m =
      BlockMask::fromKvLists(floatMask, 1, 1, 32, 32, {32, 32}, structural.partialKv(), structural.fullKv());
  expectError([&] { run(t, t, t, m); }, {"float_mask", "must return i1", "FlexAttentionErrorsTest.cpp:"});
}

namespace {
// Runs `f`, which must throw an Error that starts at this file's line in [first, last] (where the
// user made the mod; compilers name a multi-line statement's first or last line) and contains
// every one of `parts`.
void expectErrorAtUsersLine(const std::function<void()>& f, int first, int last, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one at FlexAttentionErrorsTest.cpp:" << first << "-" << last;
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string file = "FlexAttentionErrorsTest.cpp:";
    ASSERT_EQ(what.rfind(file, 0), 0u) << "the error does not start at the user's file: " << what;
    const int line = std::stoi(what.substr(file.size()));
    EXPECT_TRUE(line >= first && line <= last) << what << " (expected a line in " << first << "-" << last << ")";
    for (const std::string& part : parts) EXPECT_NE(what.find(part), std::string::npos) << "'" << part << "' not in: " << what;
  }
}
}  // namespace

// Every path that traces a user's mod (the forward, the decode template, the generic BlockMask
// builder, BlockMask::toDense) reports what the mod returns wrongly at the user's line, whatever
// the mistake: a boolean score, a score of the wrong shape, a float mask, a mask of the wrong shape.
TEST(FlexAttentionErrors, ModErrorsPointAtTheUsersLine) {
  Tensor t = hostTensor(DType::F32, {1, 2, 40, 32});
  const int boolFirst = __LINE__ + 1;
  ScoreMod boolScore("bool_score", [](const Tile& s, const Tile&, const Tile&, const Tile&, const Tile&) {
    return s > 0.0;
  });
  const int boolLast = __LINE__ - 1;
  expectErrorAtUsersLine([&] { run(t, t, t, std::nullopt, kSmall, boolScore); }, boolFirst, boolLast,
                         {"score_mod 'bool_score'", "floating-point score, got i1", "called from FlexAttentionForward.cpp"});
  FlexAttentionOptions decode = kSmall;
  decode.config.reset();
  Tensor oneQuery = hostTensor(DType::F32, {1, 2, 1, 32});
  expectErrorAtUsersLine([&] { run(oneQuery, t, t, std::nullopt, decode, boolScore); }, boolFirst, boolLast,
                         {"bool_score", "floating-point score", "called from FlexAttentionDecode.cpp"});

  const int shapeFirst = __LINE__ + 1;
  ScoreMod rowScore("row_score", [](const Tile& s, const Tile&, const Tile&, const Tile& q, const Tile&) {
    return dsl::zeros({q.shape()[0], 2}, s.dtype());
  });
  const int shapeLast = __LINE__ - 1;
  expectErrorAtUsersLine([&] { run(t, t, t, std::nullopt, kSmall, rowScore); }, shapeFirst, shapeLast,
                         {"row_score", "does not broadcast to the score"});

  const int floatFirst = __LINE__ + 1;
  MaskMod floatMask("float_mask", [](const Tile&, const Tile&, const Tile& q, const Tile& kv) {
    return (q - kv).to(DType::F32);
  });
  const int floatLast = __LINE__ - 1;
  expectErrorAtUsersLine([&] { (void)createBlockMask(floatMask, 1, 1, 40, 40, {32, 32}, kHost); }, floatFirst,
                         floatLast, {"mask_mod 'float_mask'", "must return i1", "called from BlockMask.cpp"});
  // A mask built from lists traces the mod first where the template meets a partial block.
  BlockMask structural = causalBlockMask(1, 1, 40, 40, {32, 32});
  BlockMask listed =
      BlockMask::fromKvLists(floatMask, 1, 1, 40, 40, {32, 32}, structural.partialKv(), structural.fullKv());
  expectErrorAtUsersLine([&] { run(t, t, t, listed); }, floatFirst, floatLast,
                         {"float_mask", "called from FlexAttentionForward.cpp"});
  expectErrorAtUsersLine([&] { (void)listed.toDense(); }, floatFirst, floatLast, {"float_mask", "must return i1"});

  const int wideFirst = __LINE__ + 1;
  MaskMod wideMask("wide_mask", [](const Tile&, const Tile&, const Tile& q, const Tile&) {
    return dsl::zeros({q.shape()[0], 2}, DType::I1);
  });
  const int wideLast = __LINE__ - 1;
  expectErrorAtUsersLine([&] { (void)createBlockMask(wideMask, 1, 1, 40, 40, {32, 32}, kHost); }, wideFirst, wideLast,
                         {"wide_mask", "does not broadcast to the index tiles' shape"});
}

// A NaN, infinite or zero scale is an error, not a NaN output.
TEST(FlexAttentionErrors, ScalesThatAreNotFiniteOrZero) {
  Tensor t = hostTensor(DType::F32, {1, 1, 8, 16});
  for (double scale : {double(NAN), double(INFINITY), 0.0}) {
    FlexAttentionOptions o = kSmall;
    o.scale = scale;
    expectError([&] { run(t, t, t, std::nullopt, o); }, {"scale must be finite and non-zero"});
  }
}
