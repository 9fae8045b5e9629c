// Line charts (see plot.h): a 5x7 bitmap font, Bresenham lines, nice ticks, panel layout.
#include "io/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace ska::io {

namespace {

struct Glyph {
  char c;
  uint8_t rows[7];  // 5 bits per row, the most significant bit on the left
};

// Upper case, digits and the punctuation of axis labels; '?' stands for anything else.
constexpr Glyph kFont[] = {
    {' ', {0, 0, 0, 0, 0, 0, 0}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1E}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'.', {0, 0, 0, 0, 0, 0x0C, 0x0C}},                {'-', {0, 0, 0, 0x1F, 0, 0, 0}},
    {'+', {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0}},       {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'/', {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0}},       {':', {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0}},
    {'_', {0, 0, 0, 0, 0, 0, 0x1F}},                   {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04}},
};

const Glyph& glyph(char c) {
  if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  for (const Glyph& g : kFont) {
    if (g.c == c) return g;
  }
  return glyph('?');
}

constexpr Rgb kAxis{60, 60, 60}, kGrid{225, 225, 225}, kText{30, 30, 30};
constexpr int kMarginLeft = 64, kMarginRight = 16, kMarginTop = 30, kMarginBottom = 44;

int text_width(const std::string& text, int scale) { return static_cast<int>(text.size()) * 6 * scale; }

// Ticks covering [lo, hi] at 1, 2 or 5 times a power of ten, about four intervals.
std::vector<double> nice_ticks(double lo, double hi, bool integer) {
  double raw = (hi - lo) / 4;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double norm = raw / mag;
  double step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
  if (integer) step = std::max(step, 1.0);
  std::vector<double> ticks;
  for (double t = std::floor(lo / step) * step; t <= hi + step * 0.5; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
    if (t >= hi - step * 1e-9) break;
  }
  return ticks;
}

std::string tick_label(double v, double step) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// The data ranges of a panel (padded when flat), and whether every x is a whole number.
void data_range(const PlotPanel& p, double r[4], bool* integer_x) {
  r[0] = r[2] = INFINITY;
  r[1] = r[3] = -INFINITY;
  *integer_x = true;
  for (const PlotSeries& s : p.series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      r[0] = std::min(r[0], s.x[i]), r[1] = std::max(r[1], s.x[i]);
      r[2] = std::min(r[2], s.y[i]), r[3] = std::max(r[3], s.y[i]);
      *integer_x = *integer_x && s.x[i] == std::round(s.x[i]);
    }
  }
  if (!std::isfinite(r[0])) r[0] = 0, r[1] = 1, r[2] = 0, r[3] = 1;
  for (int a = 0; a < 4; a += 2) {
    if (r[a + 1] - r[a] < 1e-12) {
      const double pad = std::max(std::abs(r[a]) * 0.05, 0.5);
      r[a] -= pad, r[a + 1] += pad;
    }
  }
}

void draw_axes(RgbImage& img, const PlotFrame& f, const std::vector<double>& xt,
               const std::vector<double>& yt) {
  for (double t : yt) {
    draw_line(img, f.left, f.py(t), f.right, f.py(t), kGrid);
    const std::string s = tick_label(t, yt.size() > 1 ? yt[1] - yt[0] : 1);
    draw_text(img, f.left - 6 - text_width(s, 1), f.py(t) - 3, s, kText);
  }
  for (double t : xt) {
    draw_line(img, f.px(t), f.top, f.px(t), f.bottom, kGrid);
    const std::string s = tick_label(t, xt.size() > 1 ? xt[1] - xt[0] : 1);
    draw_text(img, f.px(t) - text_width(s, 1) / 2, f.bottom + 6, s, kText);
  }
  draw_line(img, f.left, f.top, f.right, f.top, kAxis);
  draw_line(img, f.left, f.bottom, f.right, f.bottom, kAxis);
  draw_line(img, f.left, f.top, f.left, f.bottom, kAxis);
  draw_line(img, f.right, f.top, f.right, f.bottom, kAxis);
}

void draw_series(RgbImage& img, const PlotFrame& f, const PlotSeries& s) {
  bool have_last = false;
  int lx = 0, ly = 0;
  const size_t n = std::min(s.x.size(), s.y.size());
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
      have_last = false;
      continue;
    }
    const int x = f.px(s.x[i]), y = f.py(s.y[i]);
    if (have_last) draw_line(img, lx, ly, x, y, s.color, 2);
    if (n <= 60) draw_line(img, x - 2, y, x + 2, y, s.color, 5);  // a 5x5 marker
    lx = x, ly = y, have_last = true;
  }
}

void draw_panel(RgbImage& img, int x0, int width, int height, const PlotPanel& p, PlotFrame* frame) {
  double r[4];
  bool integer_x = false;
  data_range(p, r, &integer_x);
  const std::vector<double> xt = nice_ticks(r[0], r[1], integer_x), yt = nice_ticks(r[2], r[3], false);
  PlotFrame f;
  f.left = x0 + kMarginLeft, f.right = x0 + width - kMarginRight;
  f.top = kMarginTop, f.bottom = height - kMarginBottom;
  f.x_min = std::min(xt.front(), r[0]), f.x_max = std::max(xt.back(), r[1]);
  f.y_min = std::min(yt.front(), r[2]), f.y_max = std::max(yt.back(), r[3]);
  draw_axes(img, f, xt, yt);
  draw_text(img, f.left, 8, p.title, kText, 2);
  draw_text(img, (f.left + f.right - text_width(p.x_label, 1)) / 2, f.bottom + 22, p.x_label, kText);
  // The legend goes in the top-right corner, or the bottom-right where the first curve ends high.
  const PlotSeries* first = p.series.empty() ? nullptr : &p.series.front();
  const bool ends_high = first && !first->y.empty() && std::isfinite(first->y.back()) &&
                         f.py(first->y.back()) < (f.top + f.bottom) / 2;
  int legend_y = ends_high ? f.bottom - 8 - 12 * static_cast<int>(p.series.size()) : f.top + 8;
  for (const PlotSeries& s : p.series) {
    draw_series(img, f, s);
    const int lx = f.right - 8 - text_width(s.label, 1) - 18;
    draw_line(img, lx, legend_y + 3, lx + 12, legend_y + 3, s.color, 2);
    draw_text(img, lx + 18, legend_y, s.label, s.color);
    legend_y += 12;
  }
  if (frame) *frame = f;
}

}  // namespace

int PlotFrame::px(double x) const {
  return left + static_cast<int>(std::lround((x - x_min) / (x_max - x_min) * (right - left)));
}

int PlotFrame::py(double y) const {
  return bottom - static_cast<int>(std::lround((y - y_min) / (y_max - y_min) * (bottom - top)));
}

void draw_text(RgbImage& image, int x, int y, const std::string& text, Rgb color, int scale) {
  for (size_t i = 0; i < text.size(); ++i) {
    const Glyph& g = glyph(text[i]);
    for (int row = 0; row < 7; ++row) {
      for (int col = 0; col < 5; ++col) {
        if (!(g.rows[row] & (0x10 >> col))) continue;
        for (int dy = 0; dy < scale; ++dy) {
          for (int dx = 0; dx < scale; ++dx) {
            image.set(x + (static_cast<int>(i) * 6 + col) * scale + dx, y + row * scale + dy, color);
          }
        }
      }
    }
  }
}

void draw_line(RgbImage& image, int x0, int y0, int x1, int y1, Rgb color, int thickness) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  for (int err = dx + dy;;) {
    for (int oy = lo; oy <= hi; ++oy) {
      for (int ox = lo; ox <= hi; ++ox) image.set(x0 + ox, y0 + oy, color);
    }
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

RgbImage plot_panels(const std::vector<PlotPanel>& panels, int panel_width, int height,
                     std::vector<PlotFrame>* frames) {
  const int count = std::max<int>(1, static_cast<int>(panels.size()));
  RgbImage image(panel_width * count, height, kPlotBackground);
  if (frames) frames->assign(panels.size(), PlotFrame{});
  for (size_t i = 0; i < panels.size(); ++i) {
    draw_panel(image, static_cast<int>(i) * panel_width, panel_width, height, panels[i],
               frames ? &(*frames)[i] : nullptr);
  }
  return image;
}

}  // namespace ska::io
