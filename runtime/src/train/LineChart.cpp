// Rasterizing a line chart and encoding it with libpng.
#include "train/LineChart.h"

#include "core/Error.h"
#include "train/PixelFont.h"

#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>

namespace mtrt::train {

namespace {

constexpr int kLeft = 90, kRight = 24, kTop = 36, kBottom = 56;
constexpr int kTicks = 5;

class Canvas {
public:
  Canvas() : pixels_(kChartWidth * kChartHeight * 3, 255) {}
  void set(int x, int y, const uint8_t rgb[3]) {
    if (x < 0 || y < 0 || x >= kChartWidth || y >= kChartHeight)
      return;
    std::memcpy(&pixels_[(static_cast<size_t>(y) * kChartWidth + x) * 3], rgb,
                3);
  }
  void hline(int x0, int x1, int y, const uint8_t rgb[3]) {
    for (int x = x0; x <= x1; ++x)
      set(x, y, rgb);
  }
  void vline(int x, int y0, int y1, const uint8_t rgb[3]) {
    for (int y = y0; y <= y1; ++y)
      set(x, y, rgb);
  }
  /// Bresenham, two pixels wide.
  void line(int x0, int y0, int x1, int y1, const uint8_t rgb[3]) {
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    while (true) {
      set(x0, y0, rgb);
      set(x0 + 1, y0, rgb);
      set(x0, y0 + 1, rgb);
      if (x0 == x1 && y0 == y1)
        break;
      int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  /// Text with its top-left corner at (x, y); `vertical` runs bottom-up.
  void text(int x, int y, const std::string &s, const uint8_t rgb[3],
            bool vertical = false) {
    for (size_t i = 0; i < s.size(); ++i) {
      const uint8_t *rows = glyphRows(s[i]);
      for (int r = 0; r < kGlyphHeight; ++r)
        for (int c = 0; c < kGlyphWidth; ++c)
          if (rows[r] & (0x10 >> c)) {
            int along = static_cast<int>(i) * (kGlyphWidth + 1) + c;
            if (vertical)
              set(x + r, y - along, rgb);
            else
              set(x + along, y + r, rgb);
          }
    }
  }
  std::vector<uint8_t> take() { return std::move(pixels_); }

private:
  std::vector<uint8_t> pixels_;
};

int textWidth(const std::string &s) {
  return static_cast<int>(s.size()) * (kGlyphWidth + 1) - 1;
}

std::string formatTick(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.4g", value);
  return buffer;
}

} // namespace

std::vector<uint8_t> renderChart(const LineChart &chart) {
  const uint8_t black[3] = {0, 0, 0}, grid[3] = {225, 225, 225};
  Canvas canvas;
  double xMin = INFINITY, xMax = -INFINITY, yMin = INFINITY, yMax = -INFINITY;
  for (size_t i = 0; i < chart.x.size() && i < chart.y.size(); ++i) {
    if (!std::isfinite(chart.x[i]) || !std::isfinite(chart.y[i]))
      continue;
    xMin = std::min(xMin, chart.x[i]);
    xMax = std::max(xMax, chart.x[i]);
    yMin = std::min(yMin, chart.y[i]);
    yMax = std::max(yMax, chart.y[i]);
  }
  if (!(xMin <= xMax)) {
    xMin = 0, xMax = 1, yMin = 0, yMax = 1;
  }
  if (xMax == xMin)
    xMax = xMin + 1;
  if (yMax == yMin) {
    double pad = yMin == 0 ? 1 : std::abs(yMin) * 0.1;
    yMin -= pad;
    yMax += pad;
  }
  int plotW = kChartWidth - kLeft - kRight, plotH = kChartHeight - kTop - kBottom;
  auto px = [&](double x) {
    return kLeft + static_cast<int>(std::lround((x - xMin) / (xMax - xMin) *
                                                plotW));
  };
  auto py = [&](double y) {
    return kTop + plotH -
           static_cast<int>(std::lround((y - yMin) / (yMax - yMin) * plotH));
  };
  for (int t = 0; t < kTicks; ++t) {
    double fx = xMin + (xMax - xMin) * t / (kTicks - 1);
    double fy = yMin + (yMax - yMin) * t / (kTicks - 1);
    int gx = px(fx), gy = py(fy);
    canvas.vline(gx, kTop, kTop + plotH, grid);
    canvas.hline(kLeft, kLeft + plotW, gy, grid);
    canvas.vline(gx, kTop + plotH, kTop + plotH + 4, black);
    canvas.hline(kLeft - 4, kLeft, gy, black);
    std::string xs = formatTick(fx), ys = formatTick(fy);
    canvas.text(gx - textWidth(xs) / 2, kTop + plotH + 8, xs, black);
    canvas.text(kLeft - 8 - textWidth(ys), gy - kGlyphHeight / 2, ys, black);
  }
  canvas.hline(kLeft, kLeft + plotW, kTop + plotH, black);
  canvas.vline(kLeft, kTop, kTop + plotH, black);
  canvas.text((kChartWidth - textWidth(chart.title)) / 2, 12, chart.title,
              black);
  canvas.text(kLeft + (plotW - textWidth(chart.xLabel)) / 2,
              kChartHeight - 18, chart.xLabel, black);
  canvas.text(8, kTop + (plotH + textWidth(chart.yLabel)) / 2, chart.yLabel,
              black, /*vertical=*/true);
  bool havePrevious = false;
  int lastX = 0, lastY = 0;
  for (size_t i = 0; i < chart.x.size() && i < chart.y.size(); ++i) {
    if (!std::isfinite(chart.x[i]) || !std::isfinite(chart.y[i]))
      continue;
    int x = px(chart.x[i]), y = py(chart.y[i]);
    if (havePrevious)
      canvas.line(lastX, lastY, x, y, kLineRgb);
    else
      canvas.line(x, y, x, y, kLineRgb);
    havePrevious = true;
    lastX = x;
    lastY = y;
  }
  return canvas.take();
}

namespace {

/// libpng reports errors by longjmp; this keeps the message.
struct PngErrorState {
  std::jmp_buf jump;
  char message[256] = "";
};

void onPngError(png_structp png, png_const_charp message) {
  auto *state = static_cast<PngErrorState *>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  std::longjmp(state->jump, 1);
}

void onPngWarning(png_structp, png_const_charp) {}

/// Returns an empty string on success, the error otherwise. No C++ object
/// with a destructor lives across setjmp here.
std::string encodePng(std::FILE *file, int width, int height,
                      const uint8_t *rgb) {
  PngErrorState state;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &state,
                                            onPngError, onPngWarning);
  if (!png)
    return "libpng could not start";
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    return "libpng could not start";
  }
  if (setjmp(state.jump)) {
    png_destroy_write_struct(&png, &info);
    return state.message[0] ? state.message : "libpng failed";
  }
  png_init_io(png, file);
  png_set_IHDR(png, info, static_cast<png_uint_32>(width),
               static_cast<png_uint_32>(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int row = 0; row < height; ++row)
    png_write_row(png, rgb + static_cast<size_t>(row) * width * 3);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return "";
}

} // namespace

void writePng(const std::string &path, int width, int height,
              const std::vector<uint8_t> &rgb) {
  if (rgb.size() != static_cast<size_t>(width) * height * 3)
    throw Error(MTRT_STATUS_INVALID_ARGUMENT,
                "'" + path + "': " + std::to_string(rgb.size()) +
                    " bytes are not a " + std::to_string(width) + " x " +
                    std::to_string(height) + " RGB image");
  std::string temporary = path + ".tmp";
  std::FILE *file = std::fopen(temporary.c_str(), "wb");
  if (!file)
    throw Error(MTRT_STATUS_PERMISSION_DENIED,
                "cannot create '" + temporary + "' (" + std::strerror(errno) +
                    ")");
  std::string error = encodePng(file, width, height, rgb.data());
  if (std::fclose(file) != 0 && error.empty())
    error = std::strerror(errno);
  if (error.empty() && std::rename(temporary.c_str(), path.c_str()) != 0)
    error = std::string("cannot rename it into place: ") +
            std::strerror(errno);
  if (!error.empty()) {
    std::remove(temporary.c_str());
    throw Error(MTRT_STATUS_DATA_LOSS,
                "writing '" + path + "' failed: " + error);
  }
}

} // namespace mtrt::train
