#include "edit_figures.h"

// The implementation of stb_image_write (libstb-dev) lives in this file:
// header-only, so the demo needs no libstb.so where it runs.
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "models/edit_data.h"

namespace figures {

namespace {

using tg::toy::kImageSize;
using Rgb = std::array<uint8_t, 3>;

constexpr int kScale = 4;  // each image pixel becomes kScale x kScale
constexpr int kGap = 4;
constexpr int kCell = static_cast<int>(kImageSize) * kScale;
constexpr int kColumns = 4;
constexpr Rgb kGapColour = {48, 48, 48};

uint8_t to_byte(double v) { return static_cast<uint8_t>(std::lround((std::clamp(v, -1.0, 1.0) + 1) * 127.5)); }

// An RGB picture of rows x kColumns cells of kCell pixels, kGap apart.
class Grid {
 public:
  explicit Grid(int rows)
      : width_(kColumns * (kCell + kGap) + kGap), height_(rows * (kCell + kGap) + kGap), pixels_(width_ * height_) {
    std::fill(pixels_.begin(), pixels_.end(), kGapColour);
  }

  // Fills cell (row, column) with pixel(x, y) for the image's 32x32 pixels.
  void draw(int row, int column, const std::function<Rgb(int64_t x, int64_t y)>& pixel) {
    const int left = kGap + column * (kCell + kGap), top = kGap + row * (kCell + kGap);
    for (int y = 0; y < kCell; ++y)
      for (int x = 0; x < kCell; ++x) pixels_[(top + y) * width_ + left + x] = pixel(x / kScale, y / kScale);
  }

  void save(const std::string& path) const {
    TG_CHECK(stbi_write_png(path.c_str(), width_, height_, 3, pixels_.data(), width_ * 3) != 0,
             "write_sample_grid: cannot write '", path, "'");
  }

 private:
  int width_, height_;
  std::vector<Rgb> pixels_;
};

// Pixel (x, y) of image b of a [n,3,32,32] batch held as a flat vector.
Rgb image_pixel(const std::vector<double>& images, int64_t b, int64_t x, int64_t y) {
  Rgb rgb;
  for (int64_t c = 0; c < 3; ++c) rgb[c] = to_byte(images[((b * 3 + c) * kImageSize + y) * kImageSize + x]);
  return rgb;
}

// A path inside a gnuplot single-quoted string, where '' stands for '. A
// line break would end gnuplot's command (and start another): refused.
std::string gnuplot_quoted(const std::string& s) {
  TG_CHECK(s.find_first_of("\n\r") == std::string::npos, "plot_loss: the path '", s,
           "' holds a line break, which a gnuplot command cannot");
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? "''" : std::string(1, ch);
  return out + "'";
}

bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream folders(path ? path : "");
  for (std::string folder; std::getline(folders, folder, ':');)
    if (!folder.empty() && ::access((std::filesystem::path(folder) / program).c_str(), X_OK) == 0) return true;
  return false;
}

}  // namespace

void write_sample_grid(const std::string& path, const tg::Tensor& source, const tg::Tensor& edit_mask,
                       const std::vector<int64_t>& colour, const tg::Tensor& edited, const tg::Tensor& target) {
  const int64_t n = static_cast<int64_t>(colour.size());
  const tg::Shape images{n, 3, kImageSize, kImageSize};
  TG_CHECK(source.shape() == images && edited.shape() == images && target.shape() == images &&
               edit_mask.shape() == tg::Shape({n, tg::toy::kTokens}),
           "write_sample_grid: for ", n, " colours, source, edited and target must be ", images, " and edit_mask [",
           n, ",", tg::toy::kTokens, "], got ", source.shape(), ", ", edited.shape(), ", ", target.shape(), " and ",
           edit_mask.shape());
  const std::vector<double> src = source.to_vector(), mask = edit_mask.to_vector(), out = edited.to_vector(),
                            tgt = target.to_vector();
  Grid grid(static_cast<int>(n));
  for (int64_t b = 0; b < n; ++b) {
    const std::vector<double> k = tg::toy::palette_colour(colour[b]);
    const Rgb requested = {to_byte(k[0]), to_byte(k[1]), to_byte(k[2])};
    const int row = static_cast<int>(b);
    grid.draw(row, 0, [&](int64_t x, int64_t y) { return image_pixel(src, b, x, y); });
    grid.draw(row, 1, [&](int64_t x, int64_t y) {
      const int64_t patch = (y / tg::toy::kPatchSize) * tg::toy::kGridSize + x / tg::toy::kPatchSize;
      return mask[b * tg::toy::kTokens + patch] != 0 ? requested : Rgb{0, 0, 0};
    });
    grid.draw(row, 2, [&](int64_t x, int64_t y) { return image_pixel(out, b, x, y); });
    grid.draw(row, 3, [&](int64_t x, int64_t y) { return image_pixel(tgt, b, x, y); });
  }
  grid.save(path);
}

bool plot_loss(const std::string& csv_path, const std::string& png_path) {
  if (!on_path("gnuplot")) return false;
  const std::string png = gnuplot_quoted(png_path), csv = gnuplot_quoted(csv_path);
  FILE* gnuplot = ::popen("gnuplot", "w");
  TG_CHECK(gnuplot != nullptr, "plot_loss: cannot start gnuplot");
  // The second curve is an exponential moving average, s <- 0.9 s + 0.1 loss.
  std::fprintf(gnuplot,
               "set terminal pngcairo size 800,450 font 'sans,10'\n"
               "set output %s\n"
               "set datafile separator ','\n"
               "set logscale y\n"
               "set autoscale yfix\n"
               "set grid\n"
               "set xlabel 'step'\n"
               "set ylabel 'loss (velocity MSE inside the edit region)'\n"
               "set title 'train\\_edit\\_diffusion: flow-matching loss'\n"
               "plot %s skip 1 using 1:2 with lines lc rgb '#b8c8e0' title 'per step', \\\n"
               "     '' skip 1 using 1:(s = ($0 == 0 ? $2 : 0.9 * s + 0.1 * $2)) with lines lw 2 lc rgb '#1f4e9a' "
               "title 'moving average'\n",
               png.c_str(), csv.c_str());
  const int status = ::pclose(gnuplot);
  TG_CHECK(status == 0, "plot_loss: gnuplot failed (status ", status, ") plotting '", csv_path, "'");
  return true;
}

}  // namespace figures
