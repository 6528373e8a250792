// Pictures of the `flextile` tool (docs/cli.md): the block classification of a BlockMask and the
// autotuner's sweep, as PNG (libpng) or SVG. A picture is a list of filled rectangles and text
// labels; PNG draws the rectangles (the colours carry the meaning, see the constants below), SVG
// draws both. Internal to the CLI: no installed header includes this one, and only Pictures.cpp
// includes libpng.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention_templates/BlockMask.h"
#include "autotune/Autotune.h"

namespace flextile::cli {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb&) const = default;
};

namespace colour {
constexpr Rgb background{255, 255, 255};
constexpr Rgb frame{80, 80, 80};
constexpr Rgb text{30, 30, 30};
// Block states.
constexpr Rgb full{33, 102, 172};
constexpr Rgb partial{244, 165, 40};
constexpr Rgb empty{232, 232, 232};
// Sweep candidates: bars for timed configs, a status square under the axis for every config.
constexpr Rgb timed{120, 160, 220};
constexpr Rgb best{40, 160, 70};
constexpr Rgb compiled{190, 215, 245};  // compiled, not timed (a dry run)
constexpr Rgb pruned{150, 150, 150};
constexpr Rgb failed{215, 50, 40};
constexpr Rgb wrong{160, 60, 180};
constexpr Rgb skipped{250, 210, 60};
constexpr Rgb defaultMarker{0, 0, 0};
}  // namespace colour

class Canvas {
 public:
  Canvas(int width, int height);
  int width() const { return width_; }
  int height() const { return height_; }
  // Later rectangles cover earlier ones; parts outside the canvas are dropped.
  void fill(int x, int y, int w, int h, Rgb c);
  // A label at (x, y) (its baseline's left end; rotated -90 degrees if `vertical`). SVG only.
  void text(int x, int y, std::string s, int size = 12, bool vertical = false);
  void writePng(const std::string& path) const;
  std::string svg() const;
  void writeSvg(const std::string& path) const;

 private:
  struct Rect { int x, y, w, h; Rgb c; };
  struct Label { int x, y, size; bool vertical; std::string s; };
  int width_, height_;
  std::vector<Rect> rects_;
  std::vector<Label> labels_;
};

// The block states of each (b, h) of the mask (at most kMaxPanels of them, b-major), one square of
// `cell` pixels per block, rows = query blocks from the top, columns = kv blocks; a legend below.
struct BlockMaskPicture {
  static constexpr int kMaxPanels = 32;
  Canvas canvas;
  int cell = 0;
  std::vector<std::pair<int, int>> panelOrigin;  // top-left pixel of block (0, 0) of each panel drawn
  std::pair<int, int> blockCentre(size_t panel, int64_t qBlock, int64_t kvBlock) const;
};
// Masks over 2048 blocks a side are an error (use larger blocks).
BlockMaskPicture drawBlockMask(const attention::BlockMask& mask, const std::string& title);

// One column per candidate, in the report's order: a bar of its TFLOP/s when timed (the winner in
// the `best` colour), a status square under the axis, and a black square under that for the
// default config.
struct SweepPicture {
  Canvas canvas;
  std::vector<int> columnX;  // left pixel of each candidate's column
  int columnWidth = 0, baselineY = 0, statusY = 0, statusHeight = 0, defaultY = 0, plotHeight = 0;
};
SweepPicture drawSweep(const autotune::TuneReport& report, const std::string& title);

// Writes `canvas` as SVG when `path` ends in .svg, else as PNG.
void writePicture(const Canvas& canvas, const std::string& path);

}  // namespace flextile::cli
