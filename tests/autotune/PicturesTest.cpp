// The tool's pictures (autotune/cli/Pictures.h): the PNG files it writes decode with libpng, have
// the canvas's size, and show each block's state (and each sweep candidate's status) in its colour
// at the places the drawing says; the SVG holds the labels; the CLI writes both.
#include <gtest/gtest.h>
#include <png.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "attention_templates/BlockMask.h"
#include "attention_templates/Variants.h"
#include "autotune/cli/Cli.h"
#include "autotune/cli/Pictures.h"

namespace flextile {
namespace {

using attention::BlockMask;
using attention::BlockSizes;
using attention::BlockState;
using cli::Rgb;

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  Rgb at(int x, int y) const {
    const uint8_t* p = &rgb[(size_t(y) * size_t(width) + size_t(x)) * 3];
    return {p[0], p[1], p[2]};
  }
};

Decoded readPng(const std::string& path) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  Decoded d;
  if (!png_image_begin_read_from_file(&image, path.c_str())) {
    ADD_FAILURE() << path << " does not decode: " << image.message;
    return d;
  }
  image.format = PNG_FORMAT_RGB;
  d.width = int(image.width);
  d.height = int(image.height);
  d.rgb.resize(PNG_IMAGE_SIZE(image));
  if (!png_image_finish_read(&image, nullptr, d.rgb.data(), 0, nullptr)) ADD_FAILURE() << path << ": " << image.message;
  return d;
}

std::string tempPath(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("flextile_pictures_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::filesystem::remove(path);
  return path;
}

Rgb stateColour(BlockState s) {
  return s == BlockState::Full ? cli::colour::full : s == BlockState::Partial ? cli::colour::partial : cli::colour::empty;
}

std::string text(Rgb c) {
  return "(" + std::to_string(c.r) + ", " + std::to_string(c.g) + ", " + std::to_string(c.b) + ")";
}

// Every block of every panel has its state's colour at its centre, in the decoded file.
void expectBlocksDrawn(const BlockMask& m, const std::string& path) {
  const cli::BlockMaskPicture pic = cli::drawBlockMask(m, m.describe());
  pic.canvas.writePng(path);
  const Decoded d = readPng(path);
  ASSERT_EQ(d.width, pic.canvas.width());
  ASSERT_EQ(d.height, pic.canvas.height());
  ASSERT_EQ(pic.panelOrigin.size(), size_t(m.batch() * m.heads()));
  for (int64_t b = 0; b < m.batch(); ++b)
    for (int64_t h = 0; h < m.heads(); ++h)
      for (int64_t r = 0; r < m.numQBlocks(); ++r)
        for (int64_t c = 0; c < m.numKvBlocks(); ++c) {
          const auto [x, y] = pic.blockCentre(size_t(b * m.heads() + h), r, c);
          const Rgb want = stateColour(m.state(b, h, r, c)), got = d.at(x, y);
          ASSERT_EQ(got, want) << "block (b " << b << ", h " << h << ", q " << r << ", kv " << c << ") at pixel (" << x
                               << ", " << y << ") is " << text(got) << ", want " << text(want) << "\n"
                               << m.picture(b, h);
        }
}

TEST(Pictures, BlockMaskPngDecodesWithEveryBlockInItsColour) {
  // 300 positions in 64 x 32 blocks: 5 x 10 blocks, tails of 44 and 12.
  expectBlocksDrawn(attention::causalBlockMask(1, 1, 300, 300, {64, 32}, dsl::MemorySpace::Host), tempPath("causal.png"));
  // Per-batch documents and per-head windows: one panel per (b, h) of the mask.
  expectBlocksDrawn(attention::documentBlockMask(2, 1, 200, 200, {{0, 50, 130, 200}, {0, 10, 200}}, true, {16, 16},
                                                 dsl::MemorySpace::Host),
                    tempPath("documents.png"));
  expectBlocksDrawn(attention::slidingWindowBlockMask(1, 3, 129, 100, {1, 20, 64}, {8, 16}, dsl::MemorySpace::Host),
                    tempPath("windows.png"));
}

TEST(Pictures, LargeMasksAreRefusedWithAReason) {
  const BlockMask m = attention::causalBlockMask(1, 1, 4096, 4096 * 2 + 1, {1, 4}, dsl::MemorySpace::Host);
  try {
    (void)cli::drawBlockMask(m, "big");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("too many to draw"), std::string::npos) << e.what();
  }
}

TEST(Pictures, SweepShowsBarsAndStatuses) {
  using S = autotune::Candidate::Status;
  autotune::TuneReport r;
  r.timed = true;
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<S> statuses{S::Timed, S::Pruned, S::Timed, S::Failed, S::Wrong, S::Skipped, S::Timed, S::Compiled};
  for (size_t i = 0; i < statuses.size(); ++i) {
    autotune::Candidate c;
    c.config = {int64_t(16) << (i % 4), 64, 4, 2};
    c.status = statuses[i];
    c.rate = c.status == S::Timed ? 10.0 + double(rng() % 500) / 10.0 : 0;
    r.candidates.push_back(c);
  }
  r.best = 2;
  r.defaultIndex = 6;
  r.candidates[2].rate = 100;  // the winner is the tallest bar
  const cli::SweepPicture pic = cli::drawSweep(r, "sweep");
  const std::string path = tempPath("sweep.png");
  pic.canvas.writePng(path);
  const Decoded d = readPng(path);
  ASSERT_EQ(d.width, pic.canvas.width());
  ASSERT_EQ(d.height, pic.canvas.height());
  ASSERT_EQ(pic.columnX.size(), statuses.size());
  const Rgb statusWant[] = {cli::colour::timed,  cli::colour::pruned,  cli::colour::best,  cli::colour::failed,
                            cli::colour::wrong,  cli::colour::skipped, cli::colour::timed, cli::colour::compiled};
  for (size_t i = 0; i < statuses.size(); ++i) {
    const int x = pic.columnX[i] + pic.columnWidth / 2;
    EXPECT_EQ(d.at(x, pic.statusY + pic.statusHeight / 2), statusWant[i]) << "status of candidate " << i;
    const int barTop = pic.baselineY - 1;  // the bar's lowest row
    if (statuses[i] == S::Timed) {
      const int height = int(r.candidates[i].rate / 100.0 * pic.plotHeight + 0.5);
      EXPECT_EQ(d.at(x, pic.baselineY - height), statusWant[i]) << "top of bar " << i;
      EXPECT_EQ(d.at(x, pic.baselineY - height - 1), cli::colour::background) << "above bar " << i;
    } else {
      EXPECT_EQ(d.at(x, barTop), cli::colour::background) << "candidate " << i << " has no bar";
    }
    EXPECT_EQ(d.at(x, pic.defaultY + 2), i == 6 ? cli::colour::defaultMarker : cli::colour::background)
        << "default marker of candidate " << i;
  }
  EXPECT_EQ(d.at(pic.columnX[2] + 1, pic.baselineY - pic.plotHeight), cli::colour::best) << "the winner fills the plot";
  const std::string svg = pic.canvas.svg();
  EXPECT_NE(svg.find(r.candidates[0].config.describe()), std::string::npos);
  EXPECT_NE(svg.find("pruned"), std::string::npos);
  EXPECT_NE(svg.find("default config"), std::string::npos);
}

struct Result {
  int status;
  std::string out, err;
};

Result run(std::vector<const char*> args) {
  args.insert(args.begin(), "flextile");
  std::ostringstream out, err;
  const int status = cli::flextileMain(int(args.size()), args.data(), out, err);
  return {status, out.str(), err.str()};
}

TEST(Pictures, BlockmaskCommandWritesPngAndSvg) {
  const std::string png = tempPath("cli.png"), svg = tempPath("cli.svg");
  const Result r = run({"blockmask", "document", "--shape", "2,4,1000", "--block", "64", "--png", png.c_str(), "--svg",
                        svg.c_str()});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("wrote " + png), std::string::npos) << r.out;
  const Decoded d = readPng(png);
  EXPECT_GT(d.width, 2 * 16 * 1);
  const BlockMask m = *attention::variant("document")
                           .make({2, 4, 1000, 1000, dsl::MemorySpace::Host, {64, 64}, 1})
                           .mask;
  const cli::BlockMaskPicture pic = cli::drawBlockMask(m, m.describe());
  EXPECT_EQ(d.width, pic.canvas.width());
  EXPECT_EQ(d.height, pic.canvas.height());
  const auto [x, y] = pic.blockCentre(1, 15, 15);  // batch 1's last diagonal block: partial
  EXPECT_EQ(d.at(x, y), cli::colour::partial);
  std::ifstream f(svg);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_NE(text.str().find("<svg"), std::string::npos);
  EXPECT_NE(text.str().find("partial (mask_mod applied)"), std::string::npos);
  EXPECT_NE(text.str().find("b=1 h=0 (every head)"), std::string::npos);
}

TEST(Pictures, BlockmaskWithoutAVariantTabulatesTheYardstick) {
  const std::string png = tempPath("all.png");
  const Result r = run({"blockmask", "--shape", "1,2,1000", "--tile", "64,32", "--png", png.c_str()});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* v : {"full", "causal", "sliding_window", "document", "prefix_lm", "alibi", "softcap"})
    EXPECT_NE(r.out.find(std::string("\n") + v + " "), std::string::npos) << v << " missing:\n" << r.out;
  EXPECT_NE(r.out.find("for a 64 x 32 kernel tile"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("P95"), std::string::npos);
  EXPECT_EQ(readPng(png.substr(0, png.size() - 4) + "-causal.png").height > 0, true);
  EXPECT_FALSE(std::filesystem::exists(png.substr(0, png.size() - 4) + "-full.png")) << "full has no BlockMask";
  const Result bad = run({"blockmask", "causal", "--shape", "1,1,100", "--tile", "0"});
  EXPECT_EQ(bad.status, 2) << bad.err;
}

// A plot that cannot be written is refused before the sweep starts (a sweep takes many seconds).
TEST(Pictures, AutotunePlotToAnUnwritablePathFailsFirst) {
  const Result r = run({"autotune", "causal", "--shape", "1,1,128,64", "--plot", "/nonexistent-folder/sweep.png"});
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--plot: cannot write '/nonexistent-folder/sweep.png'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("BM"), std::string::npos) << "no config was compiled:\n" << r.out;
}

}  // namespace
}  // namespace flextile
