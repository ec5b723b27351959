// A line chart drawn into an RGB image and written as PNG (libpng).
#ifndef MTRT_SRC_TRAIN_LINECHART_H
#define MTRT_SRC_TRAIN_LINECHART_H

#include <cstdint>
#include <string>
#include <vector>

namespace mtrt::train {

/// One curve y(x) with a title and axis names, drawn on a white canvas:
/// axes, five labelled ticks on each, light grid lines, the points joined
/// by a blue line two pixels wide. Non-finite points are skipped.
struct LineChart {
  std::string title, xLabel, yLabel;
  std::vector<double> x, y;
};

constexpr int kChartWidth = 640, kChartHeight = 400;
/// The line's colour (tests look for it).
constexpr uint8_t kLineRgb[3] = {31, 119, 180};

/// Renders to kChartWidth x kChartHeight RGB, row-major, 3 bytes a pixel.
std::vector<uint8_t> renderChart(const LineChart &chart);

/// Writes 8-bit RGB pixels as a PNG file. Throws Error
/// (PERMISSION_DENIED, DATA_LOSS) naming the file.
void writePng(const std::string &path, int width, int height,
              const std::vector<uint8_t> &rgb);

} // namespace mtrt::train

#endif // MTRT_SRC_TRAIN_LINECHART_H
