// Line charts drawn into an RgbImage: panels with axes, "nice" ticks, tick labels in a built-in
// 5x7 bitmap font, one polyline per series and a legend. Used for the run folder's curves.png.
#pragma once

#include <string>
#include <vector>

#include "io/png.h"

namespace ska::io {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;  // same length; non-finite points are left out
  Rgb color;
};

struct PlotPanel {
  std::string title, x_label;
  std::vector<PlotSeries> series;
};

// Where a panel's data landed: the plot area in pixels and the axis ranges it shows.
struct PlotFrame {
  int left = 0, top = 0, right = 0, bottom = 0;
  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  int px(double x) const;  // pixel column of data x
  int py(double y) const;  // pixel row of data y
};

constexpr Rgb kPlotBackground{255, 255, 255};
constexpr Rgb kPlotBlue{31, 119, 180}, kPlotOrange{255, 127, 14};

// The panels side by side, each `panel_width` x `height` pixels; `frames` (if given) receives
// each panel's frame.
RgbImage plot_panels(const std::vector<PlotPanel>& panels, int panel_width, int height,
                     std::vector<PlotFrame>* frames = nullptr);

// Text in the 5x7 font (6 pixels per character at scale 1; lower case drawn as upper case,
// unknown characters as '?'), its top-left corner at (x, y).
void draw_text(RgbImage& image, int x, int y, const std::string& text, Rgb color, int scale = 1);
// A line `thickness` pixels wide from (x0, y0) to (x1, y1).
void draw_line(RgbImage& image, int x0, int y0, int x1, int y1, Rgb color, int thickness = 1);

}  // namespace ska::io
