#include "autotune/cli/Pictures.h"

#include <png.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

namespace flextile::cli {

// ---- canvas ------------------------------------------------------------------

Canvas::Canvas(int width, int height) : width_(width), height_(height) {
  if (width < 1 || height < 1 || int64_t(width) * height > (int64_t(1) << 28))
    throw Error("picture: a canvas of " + std::to_string(width) + " x " + std::to_string(height) +
                " pixels is outside 1 .. 2^28 pixels");
}

void Canvas::fill(int x, int y, int w, int h, Rgb c) {
  if (w > 0 && h > 0) rects_.push_back({x, y, w, h, c});
}

void Canvas::text(int x, int y, std::string s, int size, bool vertical) {
  labels_.push_back({x, y, size, vertical, std::move(s)});
}

void Canvas::writePng(const std::string& path) const {
  std::vector<uint8_t> rgb(size_t(width_) * size_t(height_) * 3);
  for (size_t i = 0; i < rgb.size(); i += 3) {
    rgb[i] = colour::background.r;
    rgb[i + 1] = colour::background.g;
    rgb[i + 2] = colour::background.b;
  }
  for (const Rect& r : rects_)
    for (int y = std::max(r.y, 0); y < std::min(r.y + r.h, height_); ++y)
      for (int x = std::max(r.x, 0); x < std::min(r.x + r.w, width_); ++x) {
        uint8_t* p = &rgb[(size_t(y) * size_t(width_) + size_t(x)) * 3];
        p[0] = r.c.r;
        p[1] = r.c.g;
        p[2] = r.c.b;
      }
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = png_uint_32(width_);
  image.height = png_uint_32(height_);
  image.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&image, path.c_str(), 0, rgb.data(), 0, nullptr))
    throw Error("cannot write the PNG file '" + path + "': " + image.message);
}

namespace {
std::string escapeXml(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '&') out += "&amp;";
    else if (ch == '<') out += "&lt;";
    else if (ch == '>') out += "&gt;";
    else if (ch == '"') out += "&quot;";
    else out += ch;
  }
  return out;
}

std::string hex(Rgb c) {
  char s[8];
  std::snprintf(s, sizeof s, "#%02x%02x%02x", c.r, c.g, c.b);
  return s;
}
}  // namespace

std::string Canvas::svg() const {
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width_) + "\" height=\"" +
                  std::to_string(height_) + "\" viewBox=\"0 0 " + std::to_string(width_) + " " + std::to_string(height_) +
                  "\" shape-rendering=\"crispEdges\" font-family=\"sans-serif\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"" + hex(colour::background) + "\"/>\n";
  for (const Rect& r : rects_)
    s += "<rect x=\"" + std::to_string(r.x) + "\" y=\"" + std::to_string(r.y) + "\" width=\"" + std::to_string(r.w) +
         "\" height=\"" + std::to_string(r.h) + "\" fill=\"" + hex(r.c) + "\"/>\n";
  for (const Label& l : labels_) {
    s += "<text x=\"" + std::to_string(l.x) + "\" y=\"" + std::to_string(l.y) + "\" font-size=\"" +
         std::to_string(l.size) + "\" fill=\"" + hex(colour::text) + "\"";
    if (l.vertical) s += " transform=\"rotate(-90 " + std::to_string(l.x) + " " + std::to_string(l.y) + ")\"";
    s += ">" + escapeXml(l.s) + "</text>\n";
  }
  return s + "</svg>\n";
}

void Canvas::writeSvg(const std::string& path) const {
  std::ofstream f(path, std::ios::binary);
  f << svg();
  f.close();
  if (!f) throw Error("cannot write the SVG file '" + path + "'");
}

void writePicture(const Canvas& canvas, const std::string& path) {
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".svg") == 0) canvas.writeSvg(path);
  else canvas.writePng(path);
}

namespace {
// A swatch and its label in a row of legend entries; returns the x after the entry.
int legendEntry(Canvas& c, int x, int y, Rgb colourOf, const std::string& label) {
  c.fill(x, y, 14, 14, colour::frame);
  c.fill(x + 1, y + 1, 12, 12, colourOf);
  c.text(x + 20, y + 12, label);
  return x + 28 + 7 * int(label.size());
}
}  // namespace

// ---- the block classification of a BlockMask ---------------------------------------

std::pair<int, int> BlockMaskPicture::blockCentre(size_t panel, int64_t qBlock, int64_t kvBlock) const {
  const auto [x, y] = panelOrigin.at(panel);
  return {x + int(kvBlock) * cell + cell / 2, y + int(qBlock) * cell + cell / 2};
}

BlockMaskPicture drawBlockMask(const attention::BlockMask& m, const std::string& title) {
  constexpr int64_t kMaxBlocks = 2048;
  const int64_t nQ = m.numQBlocks(), nKv = m.numKvBlocks();
  if (nQ > kMaxBlocks || nKv > kMaxBlocks)
    throw Error("picture: " + std::to_string(nQ) + " x " + std::to_string(nKv) + " blocks is too many to draw (at most " +
                std::to_string(kMaxBlocks) + " a side); use larger blocks (--block)");
  const int64_t heads = m.batch() * m.heads();
  const int panels = int(std::min<int64_t>(heads, BlockMaskPicture::kMaxPanels));
  const int columns = std::min(panels, m.heads() <= 8 ? int(m.heads()) : 8);
  const int rows = (panels + columns - 1) / columns;
  const int64_t side = std::max(nQ, nKv);
  const int target = panels == 1 ? 640 : 320;  // pixels of a panel's longer side
  const int cell = int(std::clamp<int64_t>(target / side, 1, 24));
  const int margin = 16, titleHeight = 28, labelHeight = 18, gap = 16, legendHeight = 40;
  const int panelW = int(nKv) * cell + 2, panelH = int(nQ) * cell + 2;  // with a 1-pixel frame
  const int width = std::max(2 * margin + columns * panelW + (columns - 1) * gap, 560);
  const int height = titleHeight + rows * (labelHeight + panelH) + (rows - 1) * gap + legendHeight + margin;
  BlockMaskPicture pic{Canvas(width, height), cell, {}};
  Canvas& c = pic.canvas;
  c.text(margin, 20, title, 14);
  // Cells of 5 pixels or more keep a 1-pixel gap, so single blocks stay countable.
  const bool gaps = cell >= 5;
  const std::vector<uint8_t> states = m.toDenseBlocks();
  for (int p = 0; p < panels; ++p) {
    const int64_t b = p / m.heads(), h = p % m.heads();
    const int px = margin + (p % columns) * (panelW + gap), py = titleHeight + (p / columns) * (labelHeight + panelH + gap);
    c.text(px, py + 13, "b=" + std::to_string(b) + " h=" + std::to_string(h) + (m.batch() == 1 ? " (every batch)" : "") +
                            (m.heads() == 1 ? " (every head)" : ""));
    const int ox = px + 1, oy = py + labelHeight + 1;
    c.fill(ox - 1, oy - 1, panelW, panelH, colour::frame);
    c.fill(ox, oy, panelW - 2, panelH - 2, colour::background);
    pic.panelOrigin.push_back({ox, oy});
    // One rectangle per run of equal states in a block row (an SVG of a long mask stays small).
    const uint8_t* row = &states[size_t((b * m.heads() + h) * nQ * nKv)];
    for (int64_t r = 0; r < nQ; ++r, row += nKv)
      for (int64_t k = 0; k < nKv;) {
        int64_t end = k + 1;
        while (end < nKv && row[end] == row[k]) ++end;
        const auto s = attention::BlockState(row[k]);
        const Rgb col = s == attention::BlockState::Full ? colour::full
                        : s == attention::BlockState::Partial ? colour::partial
                                                              : colour::empty;
        c.fill(ox + int(k) * cell, oy + int(r) * cell, int(end - k) * cell, cell, col);
        k = end;
      }
    if (gaps) {  // drawn over the runs
      for (int64_t k = 1; k <= nKv; ++k) c.fill(ox + int(k) * cell - 1, oy, 1, int(nQ) * cell, colour::background);
      for (int64_t r = 1; r <= nQ; ++r) c.fill(ox, oy + int(r) * cell - 1, int(nKv) * cell, 1, colour::background);
    }
  }
  const int legendY = height - margin - 20;
  int x = legendEntry(c, margin, legendY, colour::full, "full (no mask_mod)");
  x = legendEntry(c, x, legendY, colour::partial, "partial (mask_mod applied)");
  x = legendEntry(c, x, legendY, colour::empty, "empty (never loaded)");
  if (panels < heads)
    c.text(margin, legendY - 6, "first " + std::to_string(panels) + " of " + std::to_string(heads) + " (b, h) drawn");
  return pic;
}

// ---- the autotuner's sweep ------------------------------------------------------------

namespace {
Rgb statusColour(const autotune::Candidate& cand, bool isBest) {
  using S = autotune::Candidate::Status;
  if (isBest) return colour::best;
  switch (cand.status) {
    case S::Timed: return colour::timed;
    case S::Compiled: return colour::compiled;
    case S::Pruned: return colour::pruned;
    case S::Failed: return colour::failed;
    case S::Wrong: return colour::wrong;
    case S::Skipped: return colour::skipped;
  }
  return colour::pruned;
}
}  // namespace

SweepPicture drawSweep(const autotune::TuneReport& r, const std::string& title) {
  const int n = int(r.candidates.size());
  SweepPicture pic{Canvas(1, 1)};
  pic.columnWidth = 14;
  const int gap = 6, left = 56, right = 16, top = 40, labelHeight = 130, legendHeight = 64;
  pic.plotHeight = 240;
  pic.baselineY = top + pic.plotHeight;
  pic.statusY = pic.baselineY + 4;
  pic.statusHeight = 10;
  pic.defaultY = pic.statusY + pic.statusHeight + 3;
  const int width = std::max(left + n * (pic.columnWidth + gap) + right, 640);
  const int height = pic.defaultY + 6 + labelHeight + legendHeight;
  pic.canvas = Canvas(width, height);
  Canvas& c = pic.canvas;
  double maxTflops = 0;
  for (const auto& cand : r.candidates)
    if (cand.status == autotune::Candidate::Status::Timed) maxTflops = std::max(maxTflops, cand.rate);
  c.text(left, 22, title + (r.timed ? "" : " (dry run: compiled and pruned, nothing timed)"), 14);
  // Axes: the TFLOP/s scale on the left, the baseline under the bars.
  c.fill(left - 2, top, 1, pic.plotHeight + 1, colour::frame);
  c.fill(left - 2, pic.baselineY, n * (pic.columnWidth + gap) + 2, 1, colour::frame);
  c.text(8, top + pic.plotHeight / 2 + 30, "TFLOP/s", 12, true);
  char tick[32];
  std::snprintf(tick, sizeof tick, "%.1f", maxTflops);
  c.text(left - 40, top + 10, maxTflops > 0 ? tick : "-");
  c.text(left - 16, pic.baselineY, "0");
  for (int i = 0; i < n; ++i) {
    const autotune::Candidate& cand = r.candidates[size_t(i)];
    const int x = left + i * (pic.columnWidth + gap);
    pic.columnX.push_back(x);
    const Rgb col = statusColour(cand, i == r.best);
    if (cand.status == autotune::Candidate::Status::Timed && maxTflops > 0) {
      const int h = std::max(1, int(cand.rate / maxTflops * pic.plotHeight + 0.5));
      c.fill(x, pic.baselineY - h, pic.columnWidth, h, col);
    }
    c.fill(x, pic.statusY, pic.columnWidth, pic.statusHeight, col);
    if (i == r.defaultIndex) c.fill(x + 3, pic.defaultY, pic.columnWidth - 6, 6, colour::defaultMarker);
    c.text(x + pic.columnWidth - 3, pic.defaultY + 10, cand.config.describe(), 10, true);
  }
  int y = height - legendHeight + 8, x = left;
  x = legendEntry(c, x, y, colour::best, "winner");
  x = legendEntry(c, x, y, colour::timed, "timed");
  x = legendEntry(c, x, y, colour::compiled, "compiled, not timed");
  x = legendEntry(c, x, y, colour::skipped, "skipped (budget)");
  y += 24;
  x = left;
  x = legendEntry(c, x, y, colour::pruned, "pruned");
  x = legendEntry(c, x, y, colour::failed, "failed");
  x = legendEntry(c, x, y, colour::wrong, "wrong result");
  c.fill(x, y + 4, 8, 6, colour::defaultMarker);
  c.text(x + 14, y + 12, "default config");
  return pic;
}

}  // namespace flextile::cli
